//! The fd rows: `exchange_fds` and the batches by `pidfd_getfd`, against a raw `pidfd_getfd` and an
//! `SCM_RIGHTS` ping-pong.

use super::ours_timed;
use crate::workers::{TIMEOUT, fork_workers, reap, time_loop, warmup};
use crate::{Comparison, Measure, Plan, Report, Size};
use shmbroker::queues::memfd::create_sealed;
use shmbroker::sys::pidfd;
use std::path::Path;
use std::time::Instant;

/// `fd_exchange_per_fd` and the batches of 16.
pub(super) fn fd_exchange(plan: Plan<'_>, report: &mut Report, dir: &Path) -> Result<(), String> {
    report.progress("fd_exchange, 2 workers");
    let rounds = plan.size(2_000, 200);
    let mut ours = Vec::new();
    let mut pidfd = Vec::new();
    let mut rights = Vec::new();
    let (mut batched, mut broadcast) = (Vec::new(), Vec::new());
    for round in 0..plan.rounds {
        let socket = dir.join(format!("fds-{round}.sock"));
        let mut order: Vec<u8> = vec![0, 1, 2, 3, 4];
        order.rotate_left(round % 5);
        let calls = (rounds / FD_BATCH).max(1);
        for contender in order {
            match contender {
                0 => ours.extend(ours_fd_exchange(&socket, rounds)?),
                1 => pidfd.extend(raw_pidfd_getfd(rounds)?),
                2 => rights.extend(raw_scm_rights(rounds)?),
                3 => batched.extend(ours_fd_batch(&socket, calls, false)?),
                _ => broadcast.extend(ours_fd_batch(&socket, calls, true)?),
            }
        }
    }
    let batches = [
        (
            "exchange",
            "shmbroker exchange_fd_batch (pidfd), per fd",
            batched,
        ),
        (
            "broadcast",
            "shmbroker broadcast_fd_batch (pidfd), per fd",
            broadcast,
        ),
    ];
    for (call, ours_label, samples) in batches {
        report.add(Comparison {
            bench: format!("fd_{call}_batch{FD_BATCH}_per_fd"),
            size: Size::Workers(2),
            contenders: vec![
                (ours_label, Measure::latency(samples)),
                ("raw pidfd_getfd", Measure::latency(pidfd.clone())),
            ],
        });
    }
    report.add(Comparison {
        bench: "fd_exchange_per_fd".into(),
        size: Size::Workers(2),
        contenders: vec![
            ("shmbroker exchange_fds (pidfd)", Measure::latency(ours)),
            ("raw pidfd_getfd", Measure::latency(pidfd)),
            ("raw SCM_RIGHTS ping-pong, per fd", Measure::latency(rights)),
        ],
    });
    Ok(())
}

/// Nanoseconds per fd for `exchange_fds` between 2 workers (each imports one fd per call).
fn ours_fd_exchange(socket: &Path, rounds: usize) -> Result<Vec<u64>, String> {
    // One file for the whole run, as the raw baselines use: this measures moving it.
    let file = create_sealed(c"bench-fd", 4096).map_err(|e| e.to_string())?;
    ours_timed(socket, 2, rounds, Some(u32::MAX), |session| {
        session
            .exchange_fds(std::os::fd::AsFd::as_fd(&file))
            .map(drop)
            .map_err(|e| e.to_string())
    })
}

/// Fds per call of the batched fd exchange benchmark.
const FD_BATCH: usize = 16;

/// Nanoseconds per fd for `exchange_fd_batch` of [`FD_BATCH`] fds between 2 workers (each
/// imports that many per call), or for `broadcast_fd_batch` of as many from rank 0 (rank 1
/// imports them), one sample per call.
fn ours_fd_batch(socket: &Path, calls: usize, broadcast: bool) -> Result<Vec<u64>, String> {
    let files = (0..FD_BATCH)
        .map(|_| create_sealed(c"bench-fd", 4096).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, String>>()?;
    let fds: Vec<_> = files.iter().map(std::os::fd::AsFd::as_fd).collect();
    let per_call = ours_timed(socket, 2, calls, Some(u32::MAX), |session| {
        let moved = if broadcast {
            let offered = if session.rank() == 0 { &fds[..] } else { &[] };
            session.broadcast_fd_batch(0, offered, FD_BATCH).map(drop)
        } else {
            session.exchange_fd_batch(&fds).map(drop)
        };
        moved.map_err(|e| e.to_string())
    })?;
    Ok(per_call
        .into_iter()
        .map(|ns| ns / FD_BATCH as u64)
        .collect())
}

/// Nanoseconds of one `pidfd_getfd` of a child's fd (the pidfd opened once), and the close.
fn raw_pidfd_getfd(rounds: usize) -> Result<Vec<u64>, String> {
    use std::os::fd::AsRawFd;
    let target = create_sealed(c"bench-fd", 4096).map_err(|e| e.to_string())?;
    let (done_reader, done_writer) = std::io::pipe().map_err(|e| e.to_string())?;
    let writer = std::cell::Cell::new(Some(done_writer));
    let pids = fork_workers(2, |_| {
        drop(writer.take());
        // Hold the fd until the parent is done (its end of the pipe closes).
        let mut byte = [0u8; 1];
        let _ = std::io::Read::read(&mut &done_reader, &mut byte);
        Ok(())
    })?;
    let measured = (|| {
        let pidfd = pidfd::open(pids[0].as_raw()).map_err(|e| format!("pidfd_open: {e}"))?;
        let mut samples = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let start = Instant::now();
            let fd = pidfd::getfd(std::os::fd::AsFd::as_fd(&pidfd), target.as_raw_fd())
                .map_err(|e| format!("pidfd_getfd: {e}"))?;
            drop(fd);
            samples.push(start.elapsed().as_nanos() as u64);
        }
        Ok::<_, String>(samples)
    })();
    // Closing the last write end lets the child go.
    drop((writer.take(), done_reader));
    let reaped = reap(&pids);
    let samples = measured?;
    reaped?;
    Ok(samples)
}

/// Nanoseconds per fd of an `SCM_RIGHTS` ping-pong: one fd to the child, one back.
fn raw_scm_rights(rounds: usize) -> Result<Vec<u64>, String> {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;
    let (parent_end, child_end) = UnixStream::pair().map_err(|e| e.to_string())?;
    let file = create_sealed(c"bench-fd", 4096).map_err(|e| e.to_string())?;
    let pass = |stream: &UnixStream| -> Result<(), String> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match shmbroker::sys::fdpass::send_with_fds(stream.as_fd(), &[b"f"], &[file.as_fd()]) {
                Ok(_) => return Ok(()),
                Err(nix::errno::Errno::EAGAIN) if Instant::now() < deadline => {
                    std::thread::yield_now()
                }
                Err(error) => return Err(format!("sendmsg: {error}")),
            }
        }
    };
    let take = |stream: &UnixStream| -> Result<(), String> {
        let deadline = Instant::now() + TIMEOUT;
        let mut byte = [0u8; 1];
        let mut fds = Vec::new();
        loop {
            match shmbroker::sys::fdpass::recv_with_fds(stream.as_fd(), &mut byte, &mut fds) {
                Ok(received) if received.bytes == 1 && fds.len() == 1 => return Ok(()),
                Ok(_) => return Err("lost the passed fd".into()),
                Err(nix::errno::Errno::EAGAIN) if Instant::now() < deadline => {
                    let mut poll = [nix::poll::PollFd::new(
                        stream.as_fd(),
                        nix::poll::PollFlags::POLLIN,
                    )];
                    let _ = nix::poll::poll(&mut poll, nix::poll::PollTimeout::from(100u16));
                }
                Err(error) => return Err(format!("recvmsg: {error}")),
            }
        }
    };
    let warmup = warmup(rounds);
    let pids = fork_workers(2, |_| {
        for _ in 0..warmup + rounds {
            take(&child_end)?;
            pass(&child_end)?;
        }
        Ok(())
    })?;
    let measured = time_loop(rounds, || {
        pass(&parent_end).and_then(|()| take(&parent_end))
    });
    drop((parent_end, child_end));
    let reaped = reap(&pids);
    // Two fds moved per round: report the time per fd.
    let samples = measured?.into_iter().map(|ns| ns / 2).collect();
    reaped?;
    Ok(samples)
}
