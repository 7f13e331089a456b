//! `bench bulk`: large messages between two processes, against a UNIX socket and Open
//! MPI (shared memory with CMA), alternating in one run.
//!
//! | bench | ours | baselines |
//! |---|---|---|
//! | `bulk_pingpong` | `send` + `recv_into` of N bytes each way, each message written first and checked on arrival; `send_loan` + `recv_loan` (`shmbroker loan`, the hand-off alone) | the same over a UNIX stream socket pair; `MPI_Send`/`MPI_Recv` (`open-mpi`) |
//! | `bulk_throughput` | N-byte `send`s one way, each written first and checked, then a 1-byte answer | the same over a UNIX socket and with MPI |
//! | `loan_handoff` | the loan ping-pong at 64 B to 16 MiB: what a hand-off costs by size | |
//! | `outbox_alloc` | allocating and freeing a 256 KiB block (a chunk) in an outbox | allocating and freeing a 4 KiB block, the largest there is, with rts-alloc (the shared payload region's allocator before outboxes) |
//!
//! Open MPI runs when `mpicc` and `mpirun` are on `PATH`: a small C program (`mpi/bulk.c`) is built
//! at run time and run once per round for every size; its per-sample output is pooled like ours.

use super::workers::{time_loop, warmup, with_broker};
use super::{Comparison, Measure, Plan, Report, Size, cpu_pair, fork_pair, mpi, pin_to};
use shmbroker::Collectives;
use shmbroker::session::Session;
use shmbroker_sys::TempDir;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Outboxes big enough for a 64 MiB loan (address space: only touched pages cost memory).
const OUTBOX_BYTES: u64 = 80 << 20;

/// Bytes moved one way per throughput measurement (fewer messages for larger sizes).
const THROUGHPUT_BYTES: usize = 256 << 20;

pub fn run(plan: Plan<'_>, report: &mut Report) -> Result<(), String> {
    let dir = TempDir::new("bench-bulk").map_err(|e| e.to_string())?;
    let sizes: Vec<usize> = if plan.quick {
        vec![4 << 10, 1 << 20]
    } else {
        vec![4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
    };
    let mpi = match mpi::available().and_then(|()| mpi::build("bulk", mpi::BULK_C)) {
        Ok(program) => Some(program),
        Err(why) => {
            eprintln!("bench bulk: no Open MPI baseline ({why})");
            None
        }
    };
    if plan.wants("bulk_pingpong") || plan.wants("bulk_throughput") {
        let mut ours: HashMap<usize, (Vec<u64>, Vec<f64>)> = HashMap::new();
        let mut loans: HashMap<usize, Vec<u64>> = HashMap::new();
        let mut unix: HashMap<usize, (Vec<u64>, Vec<f64>)> = HashMap::new();
        let mut open_mpi: HashMap<usize, (Vec<u64>, Vec<f64>)> = HashMap::new();
        for round in 0..plan.rounds {
            let mut order: Vec<u8> = vec![0, 1, 2, 3];
            order.rotate_left(round % 4);
            for contender in order {
                for &size in &sizes {
                    let rounds = pingpong_rounds(plan, size);
                    let socket = dir
                        .path()
                        .join(format!("bulk-{contender}-{size}-{round}.sock"));
                    match contender {
                        0 => {
                            report.progress(&format!("bulk, shmbroker, {size} bytes"));
                            let (pingpong, rate) = ours_bulk(&socket, size, rounds)?;
                            let entry = ours.entry(size).or_default();
                            entry.0.extend(pingpong);
                            entry.1.push(rate);
                        }
                        1 => {
                            report.progress(&format!("bulk, shmbroker loan, {size} bytes"));
                            let samples = ours_loan_pingpong(&socket, size, rounds)?;
                            loans.entry(size).or_default().extend(samples);
                        }
                        2 => {
                            report.progress(&format!("bulk, unix socket, {size} bytes"));
                            let (pingpong, rate) = unix_bulk(size, rounds)?;
                            let entry = unix.entry(size).or_default();
                            entry.0.extend(pingpong);
                            entry.1.push(rate);
                        }
                        _ => {}
                    }
                }
                if contender == 3
                    && let Some(program) = &mpi
                {
                    report.progress("bulk, open-mpi, every size");
                    mpi_bulk(program, plan, &sizes, &mut open_mpi)?;
                }
            }
        }
        for &size in &sizes {
            let take = |map: &mut HashMap<usize, (Vec<u64>, Vec<f64>)>| {
                map.remove(&size).unwrap_or_default()
            };
            let (ours_pp, ours_rate) = take(&mut ours);
            let (unix_pp, unix_rate) = take(&mut unix);
            let mpi_results = open_mpi.remove(&size);
            let mut pingpong = vec![
                ("shmbroker", Measure::latency(ours_pp)),
                (
                    "shmbroker loan",
                    Measure::latency(loans.remove(&size).unwrap_or_default()),
                ),
                ("unix socket", Measure::latency(unix_pp)),
            ];
            let mut throughput = vec![
                ("shmbroker", Measure::Throughput(ours_rate)),
                ("unix socket", Measure::Throughput(unix_rate)),
            ];
            if let Some((mpi_pp, mpi_rate)) = mpi_results {
                pingpong.push(("open-mpi", Measure::latency(mpi_pp)));
                throughput.push(("open-mpi", Measure::Throughput(mpi_rate)));
            }
            report.add(Comparison {
                bench: "bulk_pingpong".into(),
                size: Size::Bytes(size),
                contenders: pingpong,
            });
            report.add(Comparison {
                bench: "bulk_throughput".into(),
                size: Size::Bytes(size),
                contenders: throughput,
            });
        }
    }
    if plan.wants("loan_handoff") {
        let handoff_sizes: &[usize] = if plan.quick {
            &[64, 16 << 20]
        } else {
            &[64, 4 << 10, 1 << 20, 16 << 20]
        };
        for &size in handoff_sizes {
            report.progress(&format!("loan_handoff, {size} bytes"));
            let mut samples = Vec::new();
            for round in 0..plan.rounds {
                let socket = dir.path().join(format!("handoff-{size}-{round}.sock"));
                samples.extend(ours_loan_pingpong(&socket, size, plan.size(5_000, 500))?);
            }
            report.add(Comparison {
                bench: "loan_handoff".into(),
                size: Size::Bytes(size),
                contenders: vec![("shmbroker loan round trip", Measure::latency(samples))],
            });
        }
    }
    if plan.wants("outbox_alloc") {
        report.progress("outbox_alloc");
        let rounds = plan.size(200_000, 20_000);
        let mut ours = Vec::new();
        let mut rts = Vec::new();
        for round in 0..plan.rounds {
            if round % 2 == 0 {
                ours.extend(outbox_alloc(rounds)?);
                rts.extend(rts_alloc(rounds)?);
            } else {
                rts.extend(rts_alloc(rounds)?);
                ours.extend(outbox_alloc(rounds)?);
            }
        }
        report.add(Comparison {
            bench: "outbox_alloc".into(),
            size: Size::Bytes(4096),
            contenders: vec![
                (
                    "shmbroker outbox, 256 KiB block (private first fit)",
                    Measure::latency(ours),
                ),
                (
                    "rts-alloc, 4 KiB block (its largest; shared metadata)",
                    Measure::latency(rts),
                ),
            ],
        });
    }
    Ok(())
}

/// Round trips per size and round: fewer for the largest.
fn pingpong_rounds(plan: Plan<'_>, size: usize) -> usize {
    let full = (256 << 20) / size;
    plan.size(full.clamp(20, 2_000), (full / 10).clamp(5, 200))
}

/// Messages one way per throughput measurement.
fn throughput_count(size: usize) -> usize {
    (THROUGHPUT_BYTES / size).clamp(4, 20_000)
}

fn connect(socket: &Path, rank: u32) -> Result<Session, String> {
    let mut session = Session::connect_with_outbox(socket, Some(rank), TIMEOUT, OUTBOX_BYTES)
        .map_err(|e| e.to_string())?;
    session.set_timeout(TIMEOUT);
    Ok(session)
}

/// Runs `worker` as rank 1 in a forked process and `measure` as rank 0 here, with a broker on
/// a thread; reaps the worker whichever way `measure` ends. The two ranks are pinned to two
/// CPUs, as the other two-process benches are: left to the scheduler, a pair that wakes each
/// other through futexes can end up sharing one CPU for a whole run (wake-up placement), and a
/// run then measures the scheduler rather than the transport.
pub(super) fn two_ranks<R>(
    socket: &Path,
    worker: impl Fn(&mut Session) -> Result<(), String>,
    measure: impl FnOnce(&mut Session) -> Result<R, String>,
) -> Result<R, String> {
    let cpus = cpu_pair();
    with_broker(
        socket,
        2,
        |rank| {
            if let Some((_, cpu)) = cpus {
                pin_to(cpu);
            }
            worker(&mut connect(socket, rank)?)
        },
        || {
            let original = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok();
            if let Some((cpu, _)) = cpus {
                pin_to(cpu);
            }
            let measured = connect(socket, 0).and_then(|mut session| measure(&mut session));
            if let Some(original) = original {
                let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &original);
            }
            measured
        },
    )
}

/// `send` + `recv_into` ping-pong samples, then one-way throughput in messages per second.
fn ours_bulk(socket: &Path, size: usize, rounds: usize) -> Result<(Vec<u64>, f64), String> {
    let count = throughput_count(size);
    let total = warmup(rounds) + rounds;
    let e = |e: shmbroker::Error| e.to_string();
    two_ranks(
        socket,
        |session| {
            let mut data = vec![1u8; size];
            let mut buffer = vec![0u8; size];
            for round in 0..total as u64 {
                session.recv_into(0, &mut buffer).map_err(e)?;
                check(&buffer, 2 * round)?;
                stamp(&mut data, 2 * round + 1);
                session.send(0, &data).map_err(e)?;
            }
            for n in 0..count as u64 {
                session.recv_into(0, &mut buffer).map_err(e)?;
                check(&buffer, n)?;
            }
            session.send(0, &[1]).map_err(e)
        },
        |session| {
            let mut data = vec![0u8; size];
            let mut buffer = vec![0u8; size];
            let mut round = 0u64;
            let samples = time_loop(rounds, || {
                stamp(&mut data, 2 * round);
                session.send(1, &data).map_err(e)?;
                session.recv_into(1, &mut buffer).map_err(e)?;
                round += 1;
                check(&buffer, 2 * round - 1)
            })?;
            let start = Instant::now();
            for n in 0..count as u64 {
                stamp(&mut data, n);
                session.send(1, &data).map_err(e)?;
            }
            session.recv_into(1, &mut buffer).map_err(e)?;
            Ok((samples, count as f64 / start.elapsed().as_secs_f64()))
        },
    )
}

/// Writes message `n` into `data`: every byte [`stamp_of`]`(n)`, as the C baseline's `memset`.
/// Every contender writes each message before sending it, as a program does: a buffer sent again
/// unchanged stays in the receiver's cache after its first read, which favours a single copy
/// from the sender's memory (Open MPI's CMA) beyond what a program sees. With the buffer
/// unchanged, Open MPI's 64 KiB round trip took 9.5 µs here, and 30.4 µs with it rewritten.
fn stamp(data: &mut [u8], n: u64) {
    data.fill(stamp_of(n));
}

/// The byte message `n` is made of: 1 to 255, never the 0 a receive buffer starts with.
fn stamp_of(n: u64) -> u8 {
    (n % 255) as u8 + 1
}

/// Whether `got` is message `n`: one byte of every 4 KiB, and the last.
fn check(got: &[u8], n: u64) -> Result<(), String> {
    let want = stamp_of(n);
    let sampled = got.iter().step_by(4096).chain(got.last());
    match sampled.enumerate().find(|&(_, &byte)| byte != want) {
        Some((at, &byte)) => Err(format!(
            "message {n} of {} bytes: sampled byte {at} is {byte}, expected {want}",
            got.len()
        )),
        None => Ok(()),
    }
}

/// Loan ping-pong samples: each side lends a buffer of `size` bytes, the other takes a view and
/// lets go of it. The bytes are not touched: this is the hand-off alone.
fn ours_loan_pingpong(socket: &Path, size: usize, rounds: usize) -> Result<Vec<u64>, String> {
    let total = warmup(rounds) + rounds;
    let e = |e: shmbroker::Error| e.to_string();
    two_ranks(
        socket,
        |session| {
            for _ in 0..total {
                drop(session.recv_loan(0).map_err(e)?);
                let loan = session.loan(size).map_err(e)?;
                session.send_loan(0, loan).map_err(e)?;
            }
            session.barrier().map_err(e)
        },
        |session| {
            let samples = time_loop(rounds, || {
                let loan = session.loan(size).map_err(e)?;
                session.send_loan(1, loan).map_err(e)?;
                let view = session.recv_loan(1).map_err(e)?;
                if view.len() == size {
                    Ok(())
                } else {
                    Err(format!("a loan of {} bytes, expected {size}", view.len()))
                }
            })?;
            session.barrier().map_err(e)?;
            Ok(samples)
        },
    )
}

/// The same ping-pong and throughput over a UNIX stream socket pair.
fn unix_bulk(size: usize, rounds: usize) -> Result<(Vec<u64>, f64), String> {
    let count = throughput_count(size);
    let total = warmup(rounds) + rounds;
    let (ours, theirs) = UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
    for stream in [&ours, &theirs] {
        stream
            .set_read_timeout(Some(TIMEOUT))
            .map_err(|e| e.to_string())?;
    }
    let io = |e: std::io::Error| e.to_string();
    fork_pair(
        || {
            let mut stream = &theirs;
            let mut data = vec![1u8; size];
            let mut buffer = vec![0u8; size];
            for round in 0..total as u64 {
                stream.read_exact(&mut buffer).map_err(io)?;
                check(&buffer, 2 * round)?;
                stamp(&mut data, 2 * round + 1);
                stream.write_all(&data).map_err(io)?;
            }
            for n in 0..count as u64 {
                stream.read_exact(&mut buffer).map_err(io)?;
                check(&buffer, n)?;
            }
            stream.write_all(&[1]).map_err(io)
        },
        || {
            let mut stream = &ours;
            let mut data = vec![0u8; size];
            let mut buffer = vec![0u8; size];
            let mut round = 0u64;
            let samples = time_loop(rounds, || {
                stamp(&mut data, 2 * round);
                stream.write_all(&data).map_err(io)?;
                stream.read_exact(&mut buffer).map_err(io)?;
                round += 1;
                check(&buffer, 2 * round - 1)
            })?;
            let start = Instant::now();
            for n in 0..count as u64 {
                stamp(&mut data, n);
                stream.write_all(&data).map_err(io)?;
            }
            stream.read_exact(&mut buffer[..1]).map_err(io)?;
            Ok((samples, count as f64 / start.elapsed().as_secs_f64()))
        },
    )
}

/// One run of the MPI program at every size: its ping-pong samples and throughput (messages per
/// second) added to `into`.
fn mpi_bulk(
    program: &mpi::Program,
    plan: Plan<'_>,
    sizes: &[usize],
    into: &mut HashMap<usize, (Vec<u64>, Vec<f64>)>,
) -> Result<(), String> {
    // One round count for every size: the program takes one.
    let rounds = sizes
        .iter()
        .map(|&size| pingpong_rounds(plan, size))
        .min()
        .unwrap_or(20);
    let mut args = vec![rounds.to_string(), warmup(rounds).to_string()];
    args.extend(sizes.iter().map(ToString::to_string));
    let stdout = program.run(2, &args, Duration::from_secs(300))?;
    for fields in mpi::parse_lines(&stdout, "pingpong_sample") {
        if let [size, ns] = fields[..] {
            into.entry(size as usize).or_default().0.push(ns);
        }
    }
    for fields in mpi::parse_lines(&stdout, "throughput") {
        if let [size, bytes_per_s] = fields[..]
            && size > 0
        {
            into.entry(size as usize)
                .or_default()
                .1
                .push(bytes_per_s as f64 / size as f64);
        }
    }
    Ok(())
}

/// Nanoseconds per allocate-and-free of a 256 KiB block (a chunk) in an outbox, in batches of
/// 100. First fit over the private free map costs the same whatever the size.
fn outbox_alloc(rounds: usize) -> Result<Vec<u64>, String> {
    use shmbroker::allocator::Outbox;
    let mut outbox = Outbox::create(0, 16 << 20).map_err(|e| e.to_string())?;
    batched(rounds, 100, || {
        let block = outbox
            .try_alloc(256 << 10)
            .map_err(|e| e.to_string())?
            .ok_or("outbox full")?;
        outbox.release(block);
        Ok(())
    })
}

/// The same with rts-alloc (its largest block is 4 KiB, so 4 KiB blocks), in one process.
fn rts_alloc(rounds: usize) -> Result<Vec<u64>, String> {
    let fd =
        shmbroker::queues::memfd::create_unsealed(c"bench-rts-alloc").map_err(|e| e.to_string())?;
    let file = std::fs::File::from(fd);
    // SAFETY: the memfd was created just now and nothing else has it, so this is the only
    // `create` for this file.
    let allocator = unsafe { rts_alloc::Allocator::create(&file, 16 << 20, 2, 64 << 10) }
        .map_err(|e| e.to_string())?;
    batched(rounds, 100, || {
        let block = allocator.allocate(4096).ok_or("rts-alloc full")?;
        // SAFETY: `block` was just allocated by this allocator and is freed once.
        unsafe { allocator.free(block) };
        Ok(())
    })
}

/// Nanoseconds per call of `op` over `rounds` calls, timed in batches of `batch` (one sample, the
/// mean, per batch): for calls too short to time one at a time.
pub(super) fn batched(
    rounds: usize,
    batch: usize,
    mut op: impl FnMut() -> Result<(), String>,
) -> Result<Vec<u64>, String> {
    let batch = batch.max(1);
    let mut samples = Vec::with_capacity(rounds / batch + 1);
    for _ in 0..rounds.div_ceil(batch) {
        let start = Instant::now();
        for _ in 0..batch {
            op()?;
        }
        samples.push(start.elapsed().as_nanos() as u64 / batch as u64);
    }
    Ok(samples)
}
