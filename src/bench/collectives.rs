//! `shmbroker bench collectives`: barriers against the barriers people write by hand, and how
//! fast a dead worker is noticed.
//!
//! | bench | ours | baselines |
//! |---|---|---|
//! | `barrier_hot` (2 workers) | `Session::barrier`, spinning | a shared-memory sense-reversing barrier that polls with `usleep(1)` (as KittensBroker's does); the same with waiters parked in `FUTEX_WAIT` |
//! | `barrier_parked` (2, 4, 8 workers) | `Session::barrier`, parking at once | the same two |
//! | `dead_peer` (3 workers) | from `kill -9` of one worker to the survivor's `PeerLost` in a barrier | none: the target is an absolute bound |
//!
//! Every worker is its own process, forked before any thread exists; worker processes log on
//! while the broker (started after the fork, on a thread) comes up, as `connect` retries.

use super::{Comparison, Measure, Plan, Report, Size};
use crate::tempdir::TempDir;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};
use shmbroker::handshake::{Config, Listener};
use shmbroker::queues::memfd::{Mapping, create_sealed};
use shmbroker::session::{Error, Session};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);

pub fn run(plan: Plan<'_>, report: &mut Report) -> Result<(), String> {
    let dir = TempDir::new("bench-collectives")?;
    let rounds = plan.size(5_000, 500);
    if plan.wants("barrier_hot") {
        report.progress("barrier_hot, 2 workers");
        let contenders = barrier_contenders(plan, dir.path(), 2, rounds, u32::MAX)?;
        report.add(Comparison {
            bench: "barrier_hot".into(),
            size: Size::Workers(2),
            contenders,
        });
    }
    if plan.wants("barrier_parked") {
        for workers in [2u32, 4, 8] {
            report.progress(&format!("barrier_parked, {workers} workers"));
            let rounds = plan.size(1_000, 100);
            let contenders = barrier_contenders(plan, dir.path(), workers, rounds, 0)?;
            report.add(Comparison {
                bench: "barrier_parked".into(),
                size: Size::Workers(workers),
                contenders,
            });
        }
    }
    if plan.wants("dead_peer") {
        report.progress("dead_peer, 3 workers");
        let mut samples = Vec::new();
        for repeat in 0..plan.size(20, 3) {
            samples.push(dead_peer(&dir.path().join(format!("dead-{repeat}.sock")))?);
        }
        report.add(Comparison {
            bench: "dead_peer_detection".into(),
            size: Size::Workers(3),
            contenders: vec![("shmbroker: kill -9 to PeerLost", Measure::Latency(samples))],
        });
    }
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
    for round in 0..plan.rounds {
        let socket = dir.join(format!("barrier-{workers}-{spin_limit}-{round}.sock"));
        let mut order: Vec<u8> = vec![0, 1, 2];
        order.rotate_left(round % 3);
        for contender in order {
            match contender {
                0 => ours.extend(ours_barrier(&socket, workers, rounds, spin_limit)?),
                1 => polling.extend(shared_barrier(workers, rounds, Wait::Usleep)?),
                _ => futex.extend(shared_barrier(workers, rounds, Wait::Futex)?),
            }
        }
    }
    Ok(vec![
        ("shmbroker", Measure::Latency(ours)),
        (
            "shared memory, polls with usleep(1)",
            Measure::Latency(polling),
        ),
        ("shared memory, futex wait/wake", Measure::Latency(futex)),
    ])
}

/// Forks `workers - 1` children running `child(rank)`; returns their pids. The caller is rank 0.
fn fork_workers(
    workers: u32,
    child: impl Fn(u32) -> Result<(), String>,
) -> Result<Vec<Pid>, String> {
    use std::io::Write;
    std::io::stdout().flush().ok();
    std::io::stderr().flush().ok();
    let mut pids = Vec::new();
    for rank in 1..workers {
        // SAFETY: called before this measurement starts any thread (the broker thread comes
        // after the forks), so each child gets a consistent copy of every lock and allocator.
        match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
            ForkResult::Child => {
                let code = match child(rank) {
                    Ok(()) => 0,
                    Err(error) => {
                        eprintln!("bench worker {rank}: {error}");
                        1
                    }
                };
                // SAFETY: ends this forked child without running the parent's exit handlers.
                unsafe { nix::libc::_exit(code) }
            }
            ForkResult::Parent { child } => pids.push(child),
        }
    }
    Ok(pids)
}

/// Waits for `pids` with a deadline, killing stragglers.
fn reap(pids: &[Pid]) -> Result<(), String> {
    let deadline = Instant::now() + TIMEOUT;
    let mut failed = false;
    for &pid in pids {
        loop {
            match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(WaitStatus::StillAlive) => {
                    let _ = kill(pid, Signal::SIGKILL);
                    let _ = waitpid(pid, None);
                    failed = true;
                    break;
                }
                Ok(WaitStatus::Exited(_, 0)) => break,
                Ok(_) | Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
    }
    if failed {
        Err("a bench worker failed or hung".into())
    } else {
        Ok(())
    }
}

/// A broker on a thread for `workers` ranks.
fn start_broker(
    socket: &Path,
    workers: u32,
) -> Result<
    (
        shmbroker::handshake::StopHandle,
        std::thread::JoinHandle<()>,
    ),
    String,
> {
    let config = Config {
        world_size: workers,
        ..Config::default()
    };
    let mut listener = Listener::bind(socket, config).map_err(|e| e.to_string())?;
    let stop = listener.stop_handle();
    let thread = std::thread::spawn(move || {
        let _ = listener.serve(|_| {});
    });
    Ok((stop, thread))
}

fn connect(socket: &Path, rank: u32, spin_limit: u32) -> Result<Session, String> {
    let mut session = Session::connect(socket, Some(rank), TIMEOUT).map_err(|e| e.to_string())?;
    session.set_timeout(TIMEOUT);
    session.set_spin_limit(spin_limit);
    Ok(session)
}

/// Nanoseconds of each of `rounds` barriers on rank 0, after as many warm-up barriers / 10.
fn ours_barrier(
    socket: &Path,
    workers: u32,
    rounds: usize,
    spin_limit: u32,
) -> Result<Vec<u64>, String> {
    let warmup = rounds / 10 + 10;
    let pids = fork_workers(workers, |rank| {
        let mut session = connect(socket, rank, spin_limit)?;
        for _ in 0..warmup + rounds {
            session.barrier().map_err(|e| e.to_string())?;
        }
        Ok(())
    })?;
    let (stop, broker) = start_broker(socket, workers)?;
    let measured = (|| {
        let mut session = connect(socket, 0, spin_limit)?;
        let mut samples = Vec::with_capacity(rounds);
        for round in 0..warmup + rounds {
            let start = Instant::now();
            session.barrier().map_err(|e| e.to_string())?;
            if round >= warmup {
                samples.push(start.elapsed().as_nanos() as u64);
            }
        }
        Ok::<_, String>(samples)
    })();
    let reaped = reap(&pids);
    stop.stop();
    let _ = broker.join();
    let samples = measured?;
    reaped?;
    Ok(samples)
}

#[derive(Clone, Copy)]
enum Wait {
    Usleep,
    Futex,
}

/// A sense-reversing barrier in a shared page: the last to arrive resets the count and flips the
/// sense; the others wait for the flip, polling with `usleep(1)` or sleeping in `FUTEX_WAIT`.
struct SharedBarrier<'a> {
    count: &'a AtomicU32,
    sense: &'a AtomicU32,
    workers: u32,
    wait: Wait,
}

impl SharedBarrier<'_> {
    fn arrive(&self, local_sense: &mut u32) -> Result<(), String> {
        *local_sense ^= 1;
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.workers {
            self.count.store(0, Ordering::Relaxed);
            self.sense.store(*local_sense, Ordering::Release);
            if let Wait::Futex = self.wait {
                futex(self.sense, nix::libc::FUTEX_WAKE, i32::MAX as u32);
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
                Wait::Futex => futex(self.sense, nix::libc::FUTEX_WAIT, *local_sense ^ 1),
            }
            if Instant::now() > deadline {
                return Err("barrier partner silent".into());
            }
        }
        Ok(())
    }
}

fn futex(word: &AtomicU32, op: i32, value: u32) {
    let timeout = nix::libc::timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    let timeout_ptr = if op == nix::libc::FUTEX_WAIT {
        &timeout as *const nix::libc::timespec
    } else {
        std::ptr::null()
    };
    // SAFETY: FUTEX_WAIT/FUTEX_WAKE on a live, aligned word of a shared mapping; the timespec
    // lives on this frame. The caller re-checks after every return.
    unsafe { nix::libc::syscall(nix::libc::SYS_futex, word.as_ptr(), op, value, timeout_ptr) };
}

/// Nanoseconds of each of `rounds` shared-memory barriers on rank 0.
fn shared_barrier(workers: u32, rounds: usize, wait: Wait) -> Result<Vec<u64>, String> {
    let warmup = rounds / 10 + 10;
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
    let mut samples = Vec::with_capacity(rounds);
    let mut outcome = Ok(());
    for round in 0..warmup + rounds {
        let start = Instant::now();
        if let Err(error) = barrier.arrive(&mut local) {
            outcome = Err(error);
            break;
        }
        if round >= warmup {
            samples.push(start.elapsed().as_nanos() as u64);
        }
    }
    let reaped = reap(&pids);
    outcome?;
    reaped?;
    Ok(samples)
}

/// Nanoseconds from `kill -9` of rank 2 to rank 0's `PeerLost` in a barrier loop.
fn dead_peer(socket: &Path) -> Result<u64, String> {
    let pids = fork_workers(3, |rank| {
        let mut session = connect(socket, rank, shmbroker::queues::DEFAULT_SPIN_LIMIT)?;
        loop {
            if let Err(error) = session.barrier() {
                // Rank 1 survives; rank 2 is killed before it gets here.
                return match error {
                    Error::PeerLost { rank: 2 } => Ok(()),
                    other => Err(other.to_string()),
                };
            }
        }
    })?;
    let (stop, broker) = start_broker(socket, 3)?;
    let measured = (|| {
        let mut session = connect(socket, 0, shmbroker::queues::DEFAULT_SPIN_LIMIT)?;
        for _ in 0..100 {
            session.barrier().map_err(|e| e.to_string())?;
        }
        let victim = pids[1];
        let killed = Instant::now();
        kill(victim, Signal::SIGKILL).map_err(|e| format!("kill: {e}"))?;
        loop {
            match session.barrier() {
                Ok(()) => {}
                Err(Error::PeerLost { rank: 2 }) => return Ok(killed.elapsed().as_nanos() as u64),
                Err(other) => return Err(other.to_string()),
            }
        }
    })();
    let _ = waitpid(pids[1], None);
    let reaped = reap(&pids[..1]);
    stop.stop();
    let _ = broker.join();
    let elapsed = measured?;
    reaped?;
    Ok(elapsed)
}
