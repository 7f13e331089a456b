//! `all_reduce`, `reduce_scatter` and `all_to_all`: shmbroker's calls on floats (sums for the
//! first two) against Open MPI's `MPI_Allreduce`, `MPI_Reduce_scatter_block` and `MPI_Alltoall`,
//! at 2 and 4 ranks, and a one-core `memcpy` of the same bytes in the same run: the memory
//! bandwidth the large sizes are held against. All-reduce runs from 8 B to 16 MiB (64 MiB outside
//! `--quick`); the other two from 4 KiB to 16 MiB of input per rank.
//!
//! Fair to both: each round every rank writes new data (untimed), all ranks meet in a barrier
//! (untimed), the call is timed on rank 0, and every element of the result is checked (untimed).
//! The values are small integers, so every sum is exact whatever order anyone adds in.
//!
//! `reduce_kernel` times the kernel alone, in this process: the sum (and an f32 max) of 2 and 4
//! inputs of 512 KiB each into 512 KiB, all in L2 once warm, for f32, f64, i32, bf16 and f16,
//! against one core's `memcpy` of the output's 512 KiB from one input, alternately.

use super::workers::{connect, connect_with_outbox, open_mpi, warmup, with_broker};
use super::{Comparison, Measure, Plan, Report, Size};
use shmbroker::Collectives;
use shmbroker::{ReduceOp, Session};
use std::path::Path;
use std::time::{Duration, Instant};

/// The call a row measures; its name is the bench's and the MPI program's `OP`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    AllReduce,
    ReduceScatter,
    AllToAll,
}

impl Call {
    /// What a row of this call measures, for the report.
    fn note(self) -> &'static str {
        match self {
            Self::AllReduce => {
                "f32 sum, in place; each round new data, a barrier, the timed call on rank 0, \
                 every element checked (both sides). algbw = bytes / p50; busbw = algbw * 2 \
                 (n - 1) / n. \"shmbroker symmetric\": the data is a symmetric buffer \
                 (Session::symmetric), read by the peers in place. The memcpy row is one core \
                 copying the same bytes in the same run"
            }
            Self::ReduceScatter => {
                "f32 sum of BYTES of input per rank into BYTES / n on each \
                 (MPI_Reduce_scatter_block); new data, a barrier, the timed call on rank 0, \
                 every element checked (both sides)"
            }
            Self::AllToAll => {
                "BYTES of f32 per rank, BYTES / n to each rank (MPI_Alltoall); new data, a \
                 barrier, the timed call on rank 0, every element checked (both sides)"
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::AllReduce => "all_reduce",
            Self::ReduceScatter => "reduce_scatter",
            Self::AllToAll => "all_to_all",
        }
    }
}

/// Rank `rank`'s input element `i` in round `round`.
fn value(rank: u32, round: usize, i: usize) -> f32 {
    ((i + round) % 13 + rank as usize) as f32
}

/// One round of ours: new data, a barrier, the timed call, the check. Nanoseconds of the call.
fn one_round(
    session: &mut Session,
    call: Call,
    (input, output): (&mut [f32], &mut [f32]),
    round: usize,
) -> Result<u64, String> {
    let (rank, world) = (session.rank(), session.world_size() as usize);
    for (i, x) in input.iter_mut().enumerate() {
        *x = value(rank, round, i);
    }
    session.barrier().map_err(|e| e.to_string())?;
    let block = input.len() / world;
    let start = Instant::now();
    match call {
        Call::AllReduce => session.all_reduce(input, ReduceOp::Sum),
        Call::ReduceScatter => session.reduce_scatter(input, &mut output[..block], ReduceOp::Sum),
        Call::AllToAll => session.all_to_all(
            bytemuck::cast_slice(input),
            bytemuck::cast_slice_mut(output),
        ),
    }
    .map_err(|e| e.to_string())?;
    let took = start.elapsed().as_nanos() as u64;
    let ranks_sum = (world * (world - 1) / 2) as f32;
    let sum_at = |i: usize| (world * ((i + round) % 13)) as f32 + ranks_sum;
    let (got, want): (&[f32], Box<dyn Fn(usize) -> f32>) = match call {
        Call::AllReduce => (input, Box::new(sum_at)),
        Call::ReduceScatter => (
            &output[..block],
            Box::new(move |i| sum_at(rank as usize * block + i)),
        ),
        Call::AllToAll => (
            output,
            Box::new(move |i| value((i / block) as u32, round, rank as usize * block + i % block)),
        ),
    };
    for (i, &x) in got.iter().enumerate() {
        if x != want(i) {
            return Err(format!(
                "{}: element {i} is {x}, expected {}",
                call.name(),
                want(i)
            ));
        }
    }
    Ok(took)
}

/// Rank 0's nanoseconds per `call` of `bytes` bytes of input among `workers` forked ranks; with
/// `symmetric`, every rank's input is a symmetric buffer (`Session::symmetric`), and each checks
/// that its all-reduces were read in place.
fn ours(
    socket: &Path,
    (call, symmetric): (Call, bool),
    workers: u32,
    rounds: usize,
    bytes: usize,
) -> Result<Vec<u64>, String> {
    let total = warmup(rounds) + rounds;
    let count = bytes / 4;
    let run = move |rank: u32, keep: bool| -> Result<Vec<u64>, String> {
        let mut session = if symmetric {
            // Room for the buffer beside the call's own loans (64 MiB fills the default).
            let outbox = shmbroker::session::DEFAULT_OUTBOX_BYTES.max(2 * bytes as u64);
            connect_with_outbox(socket, rank, outbox)?
        } else {
            connect(socket, rank, None)?
        };
        let (mut plain, mut output) = (vec![0f32; count], vec![0f32; count]);
        let mut held = if symmetric {
            Some(session.symmetric::<f32>(count).map_err(|e| e.to_string())?)
        } else {
            None
        };
        let mut samples = Vec::with_capacity(rounds);
        for round in 0..total {
            let input: &mut [f32] = match held.as_mut() {
                Some(buffer) => buffer,
                None => &mut plain,
            };
            let took = one_round(&mut session, call, (input, &mut output), round)?;
            if keep && round >= total - rounds {
                samples.push(took);
            }
        }
        // One shot (copied) up to the thresholds every rank shares; two shots read in place.
        let one_shot = bytes <= shmbroker::session::tuning::ONE_SHOT_MAX_BYTES
            || bytes * workers as usize <= shmbroker::session::tuning::LENT_ONE_SHOT_MAX_BYTES;
        if symmetric && !one_shot && session.reductions_read_in_place() < total as u64 {
            return Err(format!(
                "rank {rank}: {} of {total} symmetric all-reduces were read in place",
                session.reductions_read_in_place()
            ));
        }
        // Nobody leaves while another rank is still in the last call: a rank that finished a
        // pipelined all-to-all and left made a peer still in it fail with PeerLeft (about half
        // the runs at 4 ranks and 64 KiB; not understood yet, see the closing note of this stop).
        session.barrier().map_err(|e| e.to_string())?;
        Ok(samples)
    };
    with_broker(
        socket,
        workers,
        |rank| run(rank, false).map(drop),
        || run(0, true),
    )
}

/// Rank 0's nanoseconds per `call` of `bytes` bytes among `workers` ranks, in Open MPI.
fn open_mpi_samples(
    program: &super::mpi::Program,
    call: Call,
    workers: u32,
    rounds: usize,
    bytes: usize,
) -> Result<Vec<u64>, String> {
    let numbers = [rounds, warmup(rounds), bytes].map(|n| n.to_string());
    let mut args = vec![call.name().to_string()];
    args.extend(numbers);
    let stdout = program.run(workers, &args, Duration::from_secs(300))?;
    Ok(
        super::mpi::parse_lines(&stdout, &format!("{}_sample", call.name()))
            .into_iter()
            .filter_map(|fields| fields.get(2).copied())
            .collect(),
    )
}

/// Nanoseconds per copy of `bytes` bytes by one core, into a buffer copied into before.
fn memcpy_samples(rounds: usize, bytes: usize) -> Vec<u64> {
    let source = vec![1u8; bytes];
    let mut target = vec![0u8; bytes];
    (0..warmup(rounds) + rounds)
        .map(|_| {
            let start = Instant::now();
            target.copy_from_slice(std::hint::black_box(&source));
            std::hint::black_box(&mut target);
            start.elapsed().as_nanos() as u64
        })
        .skip(warmup(rounds))
        .collect()
}

/// Bytes of output (and of each input) per `reduce_kernel` call.
const KERNEL_BYTES: usize = 512 << 10;

/// Nanoseconds per `shmbroker::reduce::combine` of `inputs` inputs of [`KERNEL_BYTES`] each of
/// `T` (from `one`) with `op`, then per `memcpy` of the same output bytes, each `calls` times.
fn kernel_samples<T: shmbroker::Element>(
    op: ReduceOp,
    inputs: usize,
    one: T,
    calls: usize,
) -> Result<(Vec<u64>, Vec<u64>), String> {
    let len = KERNEL_BYTES / size_of::<T>();
    let data: Vec<Vec<T>> = (0..inputs).map(|_| vec![one; len]).collect();
    let views: Vec<&[T]> = data.iter().map(Vec::as_slice).collect();
    let mut out = vec![one; len];
    let mut kernel = Vec::with_capacity(calls);
    let mut copy = Vec::with_capacity(calls);
    for _ in 0..warmup(calls) + calls {
        let start = Instant::now();
        shmbroker::reduce::combine(op, std::hint::black_box(&views), &mut out)
            .map_err(|e| e.to_string())?;
        kernel.push(start.elapsed().as_nanos() as u64);
        let start = Instant::now();
        out.copy_from_slice(std::hint::black_box(&data[0]));
        copy.push(start.elapsed().as_nanos() as u64);
        std::hint::black_box(&mut out);
    }
    let skip = warmup(calls);
    Ok((kernel.split_off(skip), copy.split_off(skip)))
}

/// The `reduce_kernel` rows: each type and input count, the kernel against a memcpy.
fn kernel_rows(plan: Plan<'_>, report: &mut Report) -> Result<(), String> {
    type Run = fn(ReduceOp, usize, usize) -> Result<(Vec<u64>, Vec<u64>), String>;
    let runs: [(&str, ReduceOp, Run); 6] = [
        ("f32 sum", ReduceOp::Sum, |op, n, calls| {
            kernel_samples(op, n, 1.0f32, calls)
        }),
        ("f32 max", ReduceOp::Max, |op, n, calls| {
            kernel_samples(op, n, 1.0f32, calls)
        }),
        ("f64 sum", ReduceOp::Sum, |op, n, calls| {
            kernel_samples(op, n, 1.0f64, calls)
        }),
        ("i32 sum", ReduceOp::Sum, |op, n, calls| {
            kernel_samples(op, n, 1i32, calls)
        }),
        ("bf16 sum", ReduceOp::Sum, |op, n, calls| {
            kernel_samples(op, n, shmbroker::half::bf16::ONE, calls)
        }),
        ("f16 sum", ReduceOp::Sum, |op, n, calls| {
            kernel_samples(op, n, shmbroker::half::f16::ONE, calls)
        }),
    ];
    let calls = plan.size(200, 20);
    for inputs in [2usize, 4] {
        for (name, op, run) in runs {
            report.progress(&format!("reduce_kernel, {name}, {inputs} inputs"));
            let (mut ours, mut copies) = (Vec::new(), Vec::new());
            for _ in 0..plan.rounds {
                let (kernel, copy) = run(op, inputs, calls)?;
                ours.extend(kernel);
                copies.extend(copy);
            }
            report.add(Comparison {
                bench: format!("reduce_kernel_{}", name.replace(' ', "_")),
                size: Size::Tasks {
                    workers: inputs as u32,
                    bytes: KERNEL_BYTES,
                },
                contenders: vec![
                    ("shmbroker::reduce::combine", Measure::latency(ours)),
                    ("memcpy of the output's bytes", Measure::latency(copies)),
                ],
            });
        }
    }
    report.note(
        "reduce_kernel",
        "the reduction kernel alone, in one process: N inputs (the NxB column) of B bytes each \
         combined into B bytes, all in L2 once warm; the baseline copies B bytes",
    );
    Ok(())
}

/// Every row of `bench collectives` these calls have (those `--only` picks).
pub fn reductions(plan: Plan<'_>, report: &mut Report, dir: &Path) -> Result<(), String> {
    if plan.wants("reduce_kernel") {
        kernel_rows(plan, report)?;
    }
    let calls: Vec<Call> = [Call::AllReduce, Call::ReduceScatter, Call::AllToAll]
        .into_iter()
        .filter(|call| plan.wants(call.name()))
        .collect();
    if calls.is_empty() {
        return Ok(());
    }
    let mpi = open_mpi("reductions", super::mpi::REDUCTIONS_C);
    for call in calls {
        // Inputs of whole blocks of f32 per rank at 4 ranks: 4 KiB and up, but 8 B for the
        // all-reduce (its latency floor).
        let mut sizes = vec![4 << 10, 64 << 10, 1 << 20, 16 << 20];
        if call == Call::AllReduce {
            sizes.insert(0, 8);
            if !plan.quick {
                sizes.push(64 << 20);
            }
        }
        for workers in [2u32, 4] {
            for &bytes in &sizes {
                measure(plan, report, dir, (mpi.as_ref(), call), workers, bytes)?;
            }
        }
        report.note(call.name(), call.note());
    }
    Ok(())
}

/// One row: `call` of `bytes` bytes at `workers` ranks, ours and Open MPI's alternately.
fn measure(
    plan: Plan<'_>,
    report: &mut Report,
    dir: &Path,
    (mpi, call): (Option<&super::mpi::Program>, Call),
    workers: u32,
    bytes: usize,
) -> Result<(), String> {
    let name = call.name();
    report.progress(&format!("{name}, {workers} workers, {bytes} bytes"));
    // Fewer rounds where one takes milliseconds.
    let rounds = match bytes {
        0..=65_536 => plan.size(2_000, 200),
        65_537..=1_048_576 => plan.size(300, 50),
        _ => plan.size(30, 8),
    };
    // The all-reduce also runs on symmetric buffers, from 8 B up (below the one-shot limit it
    // takes the same path as without).
    let symmetric = call == Call::AllReduce;
    let (mut ours_ns, mut mpi_ns, mut copy_ns) = (Vec::new(), Vec::new(), Vec::new());
    let mut symmetric_ns = Vec::new();
    for round in 0..plan.rounds {
        let socket = dir.join(format!("{name}-{workers}-{bytes}-{round}.sock"));
        // Alternate who goes first.
        let mpi_first = round % 2 == 1;
        if mpi_first && let Some(program) = mpi {
            mpi_ns.extend(open_mpi_samples(program, call, workers, rounds, bytes)?);
        }
        ours_ns.extend(ours(&socket, (call, false), workers, rounds, bytes)?);
        if symmetric {
            let socket = dir.join(format!("{name}-{workers}-{bytes}-{round}-symmetric.sock"));
            symmetric_ns.extend(ours(&socket, (call, true), workers, rounds, bytes)?);
        }
        if !mpi_first && let Some(program) = mpi {
            mpi_ns.extend(open_mpi_samples(program, call, workers, rounds, bytes)?);
        }
        copy_ns.extend(memcpy_samples(rounds, bytes));
    }
    let mut contenders = vec![("shmbroker", Measure::latency(ours_ns))];
    if symmetric {
        contenders.push(("shmbroker symmetric", Measure::latency(symmetric_ns)));
    }
    if mpi.is_some() {
        contenders.push(("open-mpi", Measure::latency(mpi_ns)));
    }
    contenders.push(("memcpy, one core", Measure::latency(copy_ns)));
    report.add(Comparison {
        bench: name.into(),
        size: Size::Tasks { workers, bytes },
        contenders,
    });
    Ok(())
}
