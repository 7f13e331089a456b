//! The `all_gather_*` rows: `all_gather_into` against shared-memory slots, a star relay over UNIX
//! sockets and Open MPI.

use super::barriers::{SharedBarrier, Wait};
use super::ours_timed;
use crate::workers::{TIMEOUT, fork_workers, open_mpi, reap, time_loop, warmup};
use crate::{Comparison, Measure, Plan, Report, Size};
use shmbroker::Collectives;
use shmbroker::queues::memfd::{Mapping, create_sealed};
use std::path::Path;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// `all_gather_{hot,parked,crowded}_{8,64,1024}B`.
pub(super) fn all_gather(plan: Plan<'_>, report: &mut Report, dir: &Path) -> Result<(), String> {
    let mpi = open_mpi("allgather", crate::mpi::ALLGATHER_C);
    // 2 workers spinning, then 2, 4 and 8 parked, at each size; outside --quick, 16 workers
    // crowded (the session's own waiting, Bruck's algorithm) against Open MPI alone.
    let mut setups = vec![
        (2u32, Some(u32::MAX), "hot"),
        (2, Some(0), "parked"),
        (4, Some(0), "parked"),
        (8, Some(0), "parked"),
    ];
    if !plan.quick {
        setups.push((16, None, "crowded"));
    }
    for (workers, spin_limit, mode) in setups {
        for bytes in [8usize, 64, 1024] {
            report.progress(&format!(
                "all_gather_{mode}, {workers} workers, {bytes} bytes"
            ));
            let rounds = if mode == "hot" {
                plan.size(3_000, 300)
            } else {
                plan.size(1_000, 100)
            };
            let mut ours = Vec::new();
            let mut shared = Vec::new();
            let mut star = Vec::new();
            let mut open_mpi = Vec::new();
            // Open MPI always spins: it is compared with the spinning figures, at the sizes
            // the payload issue names.
            let with_mpi = mpi
                .as_ref()
                .filter(|_| (mode == "hot" && bytes != 8) || mode == "crowded");
            let crowded = mode == "crowded";
            for round in 0..plan.rounds {
                let socket = dir.join(format!("gather-{mode}-{workers}-{bytes}-{round}.sock"));
                let mut order: Vec<u8> = vec![0, 1, 2, 3];
                order.rotate_left(round % 4);
                for contender in order {
                    match contender {
                        0 => ours.extend(ours_all_gather(
                            &socket, workers, rounds, bytes, spin_limit,
                        )?),
                        1 if !crowded => {
                            shared.extend(shared_all_gather(workers, rounds, bytes)?);
                        }
                        2 if !crowded => star.extend(star_relay(workers, rounds, bytes)?),
                        1 | 2 => {}
                        _ => {
                            if let Some(program) = with_mpi {
                                open_mpi.extend(mpi_all_gather(program, workers, rounds, bytes)?);
                            }
                        }
                    }
                }
            }
            let mut contenders = vec![("shmbroker", Measure::latency(ours))];
            if !crowded {
                contenders.push((
                    "shared memory slots, futex barriers",
                    Measure::latency(shared),
                ));
                contenders.push(("star relay over UNIX sockets", Measure::latency(star)));
            }
            if with_mpi.is_some() {
                contenders.push(("open-mpi", Measure::latency(open_mpi)));
            }
            report.add(Comparison {
                bench: format!("all_gather_{mode}_{bytes}B"),
                size: Size::Workers(workers),
                contenders,
            });
        }
    }
    Ok(())
}

/// Nanoseconds of each of `rounds` all-gathers of `bytes` bytes on rank 0.
pub(super) fn ours_all_gather(
    socket: &Path,
    workers: u32,
    rounds: usize,
    bytes: usize,
    spin_limit: Option<u32>,
) -> Result<Vec<u64>, String> {
    // Into buffers made once, as MPI_Allgather and the other baselines do; the first byte of
    // every rank's part is checked.
    let buffers = std::cell::RefCell::new((Vec::new(), Vec::new()));
    ours_timed(socket, workers, rounds, spin_limit, |session| {
        let mut buffers = buffers.borrow_mut();
        let (data, out) = &mut *buffers;
        if data.len() != bytes {
            *data = vec![session.rank() as u8; bytes];
            *out = vec![0u8; bytes * workers as usize];
        }
        session
            .all_gather_into(data, out)
            .map_err(|e| e.to_string())?;
        for (peer, part) in out.chunks(bytes.max(1)).enumerate() {
            if part.first().is_some_and(|&b| b != peer as u8) {
                return Err(format!("all_gather_into: rank {peer}'s part is wrong"));
            }
        }
        Ok(())
    })
}

/// Rank 0's nanoseconds per `MPI_Allgather` of `bytes` bytes among `workers` ranks.
pub(super) fn mpi_all_gather(
    program: &crate::mpi::Program,
    workers: u32,
    rounds: usize,
    bytes: usize,
) -> Result<Vec<u64>, String> {
    let args = [rounds, warmup(rounds), bytes].map(|n| n.to_string());
    let stdout = program.run(workers, &args, Duration::from_secs(120))?;
    Ok(crate::mpi::parse_lines(&stdout, "allgather_sample")
        .into_iter()
        .filter_map(|fields| fields.get(2).copied())
        .collect())
}

/// A hand-written shared-memory all-gather: each rank writes its slot, a futex barrier, every
/// rank copies all slots out, a second barrier before the slots are written again.
pub(super) fn shared_all_gather(
    workers: u32,
    rounds: usize,
    bytes: usize,
) -> Result<Vec<u64>, String> {
    let warmup = warmup(rounds);
    let size = 4096 + workers as usize * 1024;
    let fd = create_sealed(c"bench-gather", size as u64).map_err(|e| e.to_string())?;
    let page = Mapping::map(&fd, size as u64).map_err(|e| e.to_string())?;
    // SAFETY: the mapping is `size` bytes and page-aligned; offsets 0 and 128 hold atomics.
    let count = unsafe { page.at(0).cast::<AtomicU32>().as_ref() };
    // SAFETY: as above.
    let sense = unsafe { page.at(128).cast::<AtomicU32>().as_ref() };
    let barrier = SharedBarrier {
        count,
        sense,
        workers,
        wait: Wait::Futex,
    };
    let round_trip = |rank: u32, local: &mut u32, out: &mut Vec<u8>| -> Result<(), String> {
        let mine = vec![rank as u8; bytes];
        // SAFETY: slot `rank` lies inside the mapping (4096 + rank * 1024 + bytes <= size), and
        // between the barriers only this rank writes it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                mine.as_ptr(),
                page.at(4096 + rank as usize * 1024).as_ptr(),
                bytes,
            );
        }
        barrier.arrive(local)?;
        out.clear();
        for peer in 0..workers as usize {
            // SAFETY: every slot lies inside the mapping; no rank writes until the next barrier.
            let slot =
                unsafe { std::slice::from_raw_parts(page.at(4096 + peer * 1024).as_ptr(), bytes) };
            out.extend_from_slice(slot);
        }
        barrier.arrive(local)
    };
    let pids = fork_workers(workers, |rank| {
        let (mut local, mut out) = (0, Vec::new());
        for _ in 0..warmup + rounds {
            round_trip(rank, &mut local, &mut out)?;
        }
        Ok(())
    })?;
    let (mut local, mut out) = (0, Vec::new());
    let measured = time_loop(rounds, || round_trip(0, &mut local, &mut out));
    let reaped = reap(&pids);
    let samples = measured?;
    reaped?;
    Ok(samples)
}

/// A star relay over UNIX sockets: every worker writes its `bytes` (one byte for a barrier) to
/// rank 0, which answers each with everything gathered.
pub(super) fn star_relay(workers: u32, rounds: usize, bytes: usize) -> Result<Vec<u64>, String> {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    let warmup = warmup(rounds);
    let each = bytes.max(1);
    let mut hub_ends = Vec::new();
    let mut worker_ends = Vec::new();
    for _ in 1..workers {
        let (hub, worker) = UnixStream::pair().map_err(|e| e.to_string())?;
        for end in [&hub, &worker] {
            end.set_read_timeout(Some(TIMEOUT))
                .map_err(|e| e.to_string())?;
        }
        hub_ends.push(hub);
        worker_ends.push(worker);
    }
    let pids = fork_workers(workers, |rank| {
        let mut stream = &worker_ends[rank as usize - 1];
        let mine = vec![rank as u8; each];
        let mut all = vec![0u8; each * workers as usize];
        for _ in 0..warmup + rounds {
            stream.write_all(&mine).map_err(|e| e.to_string())?;
            stream.read_exact(&mut all).map_err(|e| e.to_string())?;
        }
        Ok(())
    })?;
    drop(worker_ends);
    let mut all = vec![0u8; each * workers as usize];
    let measured = time_loop(rounds, || {
        for (i, mut stream) in hub_ends.iter().enumerate() {
            let at = (i + 1) * each;
            stream
                .read_exact(&mut all[at..at + each])
                .map_err(|e| e.to_string())?;
        }
        for mut stream in &hub_ends {
            stream.write_all(&all).map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    drop(hub_ends);
    let reaped = reap(&pids);
    let samples = measured?;
    reaped?;
    Ok(samples)
}
