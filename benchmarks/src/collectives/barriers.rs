//! The barrier rows: `barrier` against `MPI_Barrier`, `barrier_hot` and `barrier_parked` against
//! hand-written shared-memory barriers, and what publishing status costs (`status_cost_*`).

use super::gathers::star_relay;
use super::{cpus, ours_timed};
use crate::workers::{TIMEOUT, fork_workers, open_mpi, reap, time_loop, warmup};
use crate::{Comparison, Measure, Plan, Report, Run, Size, alternate};
use shmbroker::Collectives;
use shmbroker::queues::memfd::{Mapping, create_sealed};
use shmbroker::session::Error;
use shmbroker::sys::futex;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// `barrier_hot`: 2 workers spinning, against the hand-written shared-memory barriers.
pub(super) fn hot(plan: Plan<'_>, report: &mut Report, dir: &Path) -> Result<(), String> {
    let rounds = plan.size(5_000, 500);
    report.progress("barrier_hot, 2 workers");
    let contenders = barrier_contenders(plan, dir, 2, rounds, u32::MAX)?;
    report.add(Comparison {
        bench: "barrier_hot".into(),
        size: Size::Workers(2),
        contenders,
    });
    Ok(())
}

/// `barrier_parked`: 2, 4 and 8 workers parking at once, against the same.
pub(super) fn parked(plan: Plan<'_>, report: &mut Report, dir: &Path) -> Result<(), String> {
    for workers in [2u32, 4, 8] {
        report.progress(&format!("barrier_parked, {workers} workers"));
        let rounds = plan.size(1_000, 100);
        let contenders = barrier_contenders(plan, dir, workers, rounds, 0)?;
        report.add(Comparison {
            bench: "barrier_parked".into(),
            size: Size::Workers(workers),
            contenders,
        });
    }
    Ok(())
}

/// `Session::barrier` with its default waiting against `MPI_Barrier`, at 2, 4 and 8 workers (and
/// 16 outside `--quick`), alternating, whatever the number of CPUs: past it both oversubscribe.
/// Spinning (hot) barriers too, at every world size the CPUs can hold without oversubscribing.
pub(super) fn barrier_against_mpi(
    plan: Plan<'_>,
    report: &mut Report,
    dir: &Path,
) -> Result<(), String> {
    let mpi = open_mpi("barrier", crate::mpi::BARRIER_C);
    let mut worlds = vec![2u32, 4, 8];
    if !plan.quick {
        worlds.push(16);
    }
    for workers in worlds {
        report.progress(&format!("barrier, {workers} workers"));
        // Oversubscribed barriers take microseconds each: fewer rounds keep the run short.
        let rounds = if workers as usize > cpus() {
            plan.size(2_000, 200)
        } else {
            plan.size(5_000, 500)
        };
        let hot = workers > 2 && workers as usize <= cpus();
        let sockets = std::cell::Cell::new(0u32);
        let socket = || {
            sockets.set(sockets.get() + 1);
            dir.join(format!("barrier-{workers}-{}.sock", sockets.get()))
        };
        let ours = || ours_barrier(&socket(), workers, rounds, None).map(Measure::latency);
        let spinning =
            || ours_barrier(&socket(), workers, rounds, Some(u32::MAX)).map(Measure::latency);
        let mut runs: Vec<(&'static str, Run<'_>)> = vec![("shmbroker", &ours)];
        if hot {
            runs.push(("shmbroker, spinning", &spinning));
        }
        let open_mpi = mpi
            .as_ref()
            .map(|program| move || mpi_barrier(program, workers, rounds).map(Measure::latency));
        if let Some(open_mpi) = &open_mpi {
            runs.push(("open-mpi", open_mpi));
        }
        let contenders = alternate(plan, &runs)?;
        report.add(Comparison {
            bench: "barrier".into(),
            size: Size::Workers(workers),
            contenders,
        });
    }
    Ok(())
}

/// Rank 0's nanoseconds per `MPI_Barrier` among `workers` ranks.
fn mpi_barrier(
    program: &crate::mpi::Program,
    workers: u32,
    rounds: usize,
) -> Result<Vec<u64>, String> {
    let args = [rounds, warmup(rounds)].map(|n| n.to_string());
    let stdout = program.run(workers, &args, Duration::from_secs(120))?;
    Ok(crate::mpi::parse_lines(&stdout, "barrier_sample")
        .into_iter()
        .filter_map(|fields| fields.get(1).copied())
        .collect())
}

/// What publishing each rank's status costs (issue 29's budget: 5 %): the 2-rank spinning
/// barrier and the 8 B send/recv round trip with publishing on and off
/// (`Session::set_publishing`), alternating over the plan's rounds.
pub(super) fn status_cost(plan: Plan<'_>, report: &mut Report, dir: &Path) -> Result<(), String> {
    let rounds = plan.size(20_000, 2_000);
    let runs = std::cell::Cell::new(0u32);
    let socket = || {
        runs.set(runs.get() + 1);
        dir.join(format!("status-{}.sock", runs.get()))
    };
    let error = |e: Error| e.to_string();
    let barrier = |on: bool| {
        ours_timed(&socket(), 2, rounds, Some(u32::MAX), |session| {
            session.set_publishing(on);
            session.barrier().map_err(error)
        })
        .map(Measure::latency)
    };
    let pingpong = |on: bool| {
        ours_timed(&socket(), 2, rounds, Some(u32::MAX), |session| {
            session.set_publishing(on);
            let (peer, mut buffer) = (1 - session.rank(), [0u8; 8]);
            if session.rank() == 0 {
                session.send(peer, &[7; 8]).map_err(error)?;
                session.recv_into(peer, &mut buffer).map_err(error)?;
            } else {
                session.recv_into(peer, &mut buffer).map_err(error)?;
                session.send(peer, &buffer).map_err(error)?;
            }
            Ok(())
        })
        .map(Measure::latency)
    };
    report.progress("status_cost, barrier, 2 workers");
    let (on, off) = (|| barrier(true), || barrier(false));
    let contenders: Vec<(&'static str, Run<'_>)> = vec![
        ("barrier, publishing", &on),
        ("barrier, not publishing", &off),
    ];
    report.add(Comparison {
        bench: "status_cost_barrier".into(),
        size: Size::Workers(2),
        contenders: alternate(plan, &contenders)?,
    });
    report.progress("status_cost, send/recv 8 B");
    let (on, off) = (|| pingpong(true), || pingpong(false));
    let contenders: Vec<(&'static str, Run<'_>)> = vec![
        ("send/recv 8 B, publishing", &on),
        ("send/recv 8 B, not publishing", &off),
    ];
    report.add(Comparison {
        bench: "status_cost_sendrecv".into(),
        size: Size::Bytes(8),
        contenders: alternate(plan, &contenders)?,
    });
    report.note(
        "status_cost",
        "each rank publishes what it is doing in its outbox's status words (a few relaxed stores \
         and a coarse clock read per call); the baseline is the same loop with publishing \
         switched off (Session::set_publishing), alternating in one run; issue 29's budget is 5%",
    );
    Ok(())
}

/// Ours and both hand-written barriers, alternating over the plan's rounds.
fn barrier_contenders(
    plan: Plan<'_>,
    dir: &Path,
    workers: u32,
    rounds: usize,
    spin_limit: u32,
) -> Result<Vec<(&'static str, Measure)>, String> {
    let mut ours = Vec::new();
    let mut polling = Vec::new();
    let mut futex = Vec::new();
    let mut star = Vec::new();
    for round in 0..plan.rounds {
        let socket = dir.join(format!("barrier-{workers}-{spin_limit}-{round}.sock"));
        let mut order: Vec<u8> = vec![0, 1, 2, 3];
        order.rotate_left(round % 4);
        for contender in order {
            match contender {
                0 => ours.extend(ours_barrier(&socket, workers, rounds, Some(spin_limit))?),
                1 => polling.extend(shared_barrier(workers, rounds, Wait::Usleep)?),
                2 => futex.extend(shared_barrier(workers, rounds, Wait::Futex)?),
                _ => star.extend(star_relay(workers, rounds, 0)?),
            }
        }
    }
    Ok(vec![
        ("shmbroker", Measure::latency(ours)),
        (
            "shared memory, polls with usleep(1)",
            Measure::latency(polling),
        ),
        ("star relay over UNIX sockets", Measure::latency(star)),
        ("shared memory, futex wait/wake", Measure::latency(futex)),
    ])
}

/// Nanoseconds of each of `rounds` barriers on rank 0.
fn ours_barrier(
    socket: &Path,
    workers: u32,
    rounds: usize,
    spin_limit: Option<u32>,
) -> Result<Vec<u64>, String> {
    ours_timed(socket, workers, rounds, spin_limit, |session| {
        session.barrier().map_err(|e| e.to_string())
    })
}

#[derive(Clone, Copy)]
pub(super) enum Wait {
    Usleep,
    Futex,
}

/// A sense-reversing barrier in a shared page: the last to arrive resets the count and flips the
/// sense; the others wait for the flip, polling with `usleep(1)` or sleeping in `FUTEX_WAIT`.
pub(super) struct SharedBarrier<'a> {
    pub(super) count: &'a AtomicU32,
    pub(super) sense: &'a AtomicU32,
    pub(super) workers: u32,
    pub(super) wait: Wait,
}

impl SharedBarrier<'_> {
    pub(super) fn arrive(&self, local_sense: &mut u32) -> Result<(), String> {
        *local_sense ^= 1;
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.workers {
            self.count.store(0, Ordering::Relaxed);
            self.sense.store(*local_sense, Ordering::Release);
            if let Wait::Futex = self.wait {
                futex::wake(self.sense, u32::MAX);
            }
            return Ok(());
        }
        let deadline = Instant::now() + TIMEOUT;
        while self.sense.load(Ordering::Acquire) != *local_sense {
            match self.wait {
                // SAFETY: usleep has no memory effects on this process.
                Wait::Usleep => unsafe {
                    nix::libc::usleep(1);
                },
                Wait::Futex => futex::wait(
                    self.sense,
                    *local_sense ^ 1,
                    Some(Duration::from_millis(100)),
                ),
            }
            if Instant::now() > deadline {
                return Err("barrier partner silent".into());
            }
        }
        Ok(())
    }
}

/// Nanoseconds of each of `rounds` shared-memory barriers on rank 0.
fn shared_barrier(workers: u32, rounds: usize, wait: Wait) -> Result<Vec<u64>, String> {
    let warmup = warmup(rounds);
    let fd = create_sealed(c"bench-barrier", 4096).map_err(|e| e.to_string())?;
    let page = Mapping::map(&fd, 4096).map_err(|e| e.to_string())?;
    // SAFETY: the mapping is 4096 bytes, page-aligned and outlives every use below (children
    // inherit it); offsets 0 and 128 hold 4-byte atomics, which may alias shared memory.
    let count = unsafe { page.at(0).cast::<AtomicU32>().as_ref() };
    // SAFETY: as above.
    let sense = unsafe { page.at(128).cast::<AtomicU32>().as_ref() };
    let barrier = SharedBarrier {
        count,
        sense,
        workers,
        wait,
    };
    let pids = fork_workers(workers, |_| {
        let mut local = 0;
        for _ in 0..warmup + rounds {
            barrier.arrive(&mut local)?;
        }
        Ok(())
    })?;
    let mut local = 0;
    let measured = time_loop(rounds, || barrier.arrive(&mut local));
    let reaped = reap(&pids);
    let samples = measured?;
    reaped?;
    Ok(samples)
}
