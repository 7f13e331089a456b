//! `all_reduce`: `Session::all_reduce` of floats (sum) against Open MPI's `MPI_Allreduce`, at 2
//! and 4 ranks from 8 B to 16 MiB (64 MiB outside `--quick`), and a one-core `memcpy` of the
//! same bytes in the same run: the memory bandwidth the large sizes are held against.
//!
//! Fair to both: each round every rank writes new data (untimed), all ranks meet in a barrier
//! (untimed), the call is timed on rank 0, and every element of the result is checked (untimed).
//! The values are small integers, so every sum is exact whatever order anyone adds in.

use super::collectives::{connect, open_mpi, warmup, with_broker};
use super::{Comparison, Measure, Plan, Report, Size};
use shmbroker::{ReduceOp, Session};
use std::path::Path;
use std::time::{Duration, Instant};

/// Rank `rank`'s element `i` in round `round`.
fn value(rank: u32, round: usize, i: usize) -> f32 {
    ((i + round) % 13 + rank as usize) as f32
}

/// One round of ours: new data, a barrier, the timed call, the check. Nanoseconds of the call.
fn one_round(session: &mut Session, data: &mut [f32], round: usize) -> Result<u64, String> {
    let (rank, world) = (session.rank(), session.world_size() as usize);
    for (i, x) in data.iter_mut().enumerate() {
        *x = value(rank, round, i);
    }
    session.barrier().map_err(|e| e.to_string())?;
    let start = Instant::now();
    session
        .all_reduce(data, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    let took = start.elapsed().as_nanos() as u64;
    let ranks_sum = (world * (world - 1) / 2) as f32;
    for (i, &x) in data.iter().enumerate() {
        let want = (world * ((i + round) % 13)) as f32 + ranks_sum;
        if x != want {
            return Err(format!("all_reduce: element {i} is {x}, expected {want}"));
        }
    }
    Ok(took)
}

/// Rank 0's nanoseconds per all-reduce of `bytes` bytes among `workers` forked ranks.
fn ours(socket: &Path, workers: u32, rounds: usize, bytes: usize) -> Result<Vec<u64>, String> {
    let total = warmup(rounds) + rounds;
    let count = bytes / 4;
    with_broker(
        socket,
        workers,
        |rank| {
            let mut session = connect(socket, rank, None)?;
            let mut data = vec![0f32; count];
            for round in 0..total {
                one_round(&mut session, &mut data, round)?;
            }
            Ok(())
        },
        || {
            let mut session = connect(socket, 0, None)?;
            let mut data = vec![0f32; count];
            let mut samples = Vec::with_capacity(rounds);
            for round in 0..total {
                let took = one_round(&mut session, &mut data, round)?;
                if round >= total - rounds {
                    samples.push(took);
                }
            }
            Ok(samples)
        },
    )
}

/// Rank 0's nanoseconds per `MPI_Allreduce` of `bytes` bytes among `workers` ranks.
fn open_mpi_samples(
    program: &super::mpi::Program,
    workers: u32,
    rounds: usize,
    bytes: usize,
) -> Result<Vec<u64>, String> {
    let args = [rounds, warmup(rounds), bytes].map(|n| n.to_string());
    let stdout = program.run(workers, &args, Duration::from_secs(300))?;
    Ok(super::mpi::parse_lines(&stdout, "allreduce_sample")
        .into_iter()
        .filter_map(|fields| fields.get(2).copied())
        .collect())
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

pub fn all_reduce(plan: Plan<'_>, report: &mut Report, dir: &Path) -> Result<(), String> {
    let mpi = open_mpi("allreduce", super::mpi::ALLREDUCE_C);
    let mut sizes = vec![8usize, 4 << 10, 64 << 10, 1 << 20, 16 << 20];
    if !plan.quick {
        sizes.push(64 << 20);
    }
    for workers in [2u32, 4] {
        for &bytes in &sizes {
            report.progress(&format!("all_reduce, {workers} workers, {bytes} bytes"));
            // Fewer rounds where one takes milliseconds.
            let rounds = match bytes {
                0..=65_536 => plan.size(2_000, 200),
                65_537..=1_048_576 => plan.size(300, 50),
                _ => plan.size(30, 8),
            };
            let (mut ours_ns, mut mpi_ns, mut copy_ns) = (Vec::new(), Vec::new(), Vec::new());
            for round in 0..plan.rounds {
                let socket = dir.join(format!("reduce-{workers}-{bytes}-{round}.sock"));
                // Alternate who goes first.
                let mpi_first = round % 2 == 1;
                if mpi_first && let Some(program) = &mpi {
                    mpi_ns.extend(open_mpi_samples(program, workers, rounds, bytes)?);
                }
                ours_ns.extend(ours(&socket, workers, rounds, bytes)?);
                if !mpi_first && let Some(program) = &mpi {
                    mpi_ns.extend(open_mpi_samples(program, workers, rounds, bytes)?);
                }
                copy_ns.extend(memcpy_samples(rounds, bytes));
            }
            let mut contenders = vec![("shmbroker", Measure::latency(ours_ns))];
            if mpi.is_some() {
                contenders.push(("open-mpi", Measure::latency(mpi_ns)));
            }
            contenders.push(("memcpy, one core", Measure::latency(copy_ns)));
            report.add(Comparison {
                bench: "all_reduce".into(),
                size: Size::Tasks { workers, bytes },
                contenders,
            });
        }
    }
    report.note(
        "all_reduce",
        "f32 sum, in place; each round new data, a barrier, the timed call on rank 0, every \
         element checked (both sides). algbw = bytes / p50; busbw = algbw * 2 (n - 1) / n. The \
         memcpy row is one core copying the same bytes in the same run",
    );
    Ok(())
}
