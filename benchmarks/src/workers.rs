//! What every suite that runs ranks uses: worker processes forked around a broker on a thread,
//! each logging on as its rank; the calls' warm-up and timing loop; the Open MPI baselines'
//! programs.
//!
//! Every worker is its own process, forked before any thread exists; worker processes log on
//! while the broker (started after the fork, on a thread) comes up, as `connect` retries.

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};
use shmbroker::handshake::{Config, Listener};
use shmbroker::queues::Waiting;
use shmbroker::session::Session;
use std::path::Path;
use std::time::{Duration, Instant};

/// Every deadline of the workers: logons, calls, reaping.
pub(super) const TIMEOUT: Duration = Duration::from_secs(20);

/// An Open MPI program built from `source`, or `None` (saying why) when Open MPI is missing.
pub(super) fn open_mpi(name: &str, source: &str) -> Option<super::mpi::Program> {
    match super::mpi::available().and_then(|()| super::mpi::build(name, source)) {
        Ok(program) => Some(program),
        Err(why) => {
            eprintln!("bench: no Open MPI baseline for {name} ({why})");
            None
        }
    }
}

/// Forks `workers - 1` children running `child(rank)`; returns their pids. The caller is rank 0.
pub(super) fn fork_workers(
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
pub(super) fn reap(pids: &[Pid]) -> Result<(), String> {
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
pub(super) fn start_broker(
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

/// Runs `worker(rank)` in a forked process for each of ranks 1 to `workers - 1`, and `measure`
/// here as rank 0, with a broker for `workers` ranks on a thread (started after the forks, as
/// [`fork_workers`] needs). Whichever way `measure` ends, the workers are reaped (killed past
/// their deadline) and the broker is stopped; a broker that cannot start kills the workers.
pub(super) fn with_broker<R>(
    socket: &Path,
    workers: u32,
    worker: impl Fn(u32) -> Result<(), String>,
    measure: impl FnOnce() -> Result<R, String>,
) -> Result<R, String> {
    let pids = fork_workers(workers, worker)?;
    let (stop, broker) = match start_broker(socket, workers) {
        Ok(started) => started,
        Err(error) => {
            for &pid in &pids {
                let _ = kill(pid, Signal::SIGKILL);
            }
            let _ = reap(&pids);
            return Err(error);
        }
    };
    let measured = measure();
    let reaped = reap(&pids);
    stop.stop();
    let _ = broker.join();
    let value = measured?;
    reaped?;
    Ok(value)
}

/// Logs on as `rank`; `spin_limit` replaces the session's own waiting when given.
pub(super) fn connect(
    socket: &Path,
    rank: u32,
    spin_limit: Option<u32>,
) -> Result<Session, String> {
    let mut session = Session::connect(socket, Some(rank), TIMEOUT).map_err(|e| e.to_string())?;
    session.set_timeout(TIMEOUT);
    if let Some(spins) = spin_limit {
        session.set_waiting(Waiting::Spin(spins));
    }
    Ok(session)
}

/// [`connect`] with an outbox of `outbox` bytes, and the default waiting.
pub(super) fn connect_with_outbox(
    socket: &Path,
    rank: u32,
    outbox: u64,
) -> Result<Session, String> {
    let mut session = Session::connect_with_outbox(socket, Some(rank), TIMEOUT, outbox)
        .map_err(|e| e.to_string())?;
    session.set_timeout(TIMEOUT);
    Ok(session)
}

/// Warm-up calls before the timed ones, on every side of a measurement.
pub(super) fn warmup(rounds: usize) -> usize {
    rounds / 10 + 10
}

/// Times `warmup(rounds) + rounds` calls of `op` and keeps the last `rounds` (nanoseconds);
/// stops at the first error. The caller reaps its children whichever way this ends.
pub(super) fn time_loop(
    rounds: usize,
    mut op: impl FnMut() -> Result<(), String>,
) -> Result<Vec<u64>, String> {
    let warmup = warmup(rounds);
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..warmup + rounds {
        let start = Instant::now();
        op()?;
        if round >= warmup {
            samples.push(start.elapsed().as_nanos() as u64);
        }
    }
    Ok(samples)
}
