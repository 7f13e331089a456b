//! `bench logon`: how long a world of workers takes to log on, against the floor.
//!
//! Ours, per round: bind a broker, serve it on a thread, and
//! log on N workers one after another from this thread; stop when the last has its session.
//!
//! The floor does the same system work with no protocol: bind a listening socket, then for each
//! worker a bare connect and accept, the
//! rings it is the first to need (create, size, seal, mmap of the same sizes), one `SCM_RIGHTS`
//! message carrying as many fds as a reply does, and the worker's `fstat` and mmap of each.
//!
//! Both report the time per worker (the round's time divided by N), alternating each round.

use super::{Comparison, Measure, Plan, Report, Size};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use shmbroker::bindings::{ANY_RANK, LogonFrame, Message};
use shmbroker::handshake::{Config, Listener, connect};
use shmbroker::queues::memfd::{Mapping, create_sealed, file_size};
use shmbroker_sys::{TempDir, fdpass};
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

const WORLDS: [u32; 5] = [1, 2, 4, 8, 16];
const TIMEOUT: Duration = Duration::from_secs(20);

pub fn run(plan: Plan<'_>, report: &mut Report) -> Result<(), String> {
    if !plan.wants("logon") {
        return Ok(());
    }
    let dir = TempDir::new("bench").map_err(|e| e.to_string())?;
    let repeats = plan.size(10, 2);
    for workers in WORLDS {
        report.progress(&format!("logon, {workers} workers"));
        let mut ours = Vec::new();
        let mut floor = Vec::new();
        for round in 0..plan.rounds * repeats {
            let path = dir.path().join(format!("bench-{workers}-{round}.sock"));
            // Alternate which goes first.
            if round % 2 == 0 {
                ours.push(ours_logon(&path, workers)?);
                floor.push(floor_logon(&path, workers)?);
            } else {
                floor.push(floor_logon(&path, workers)?);
                ours.push(ours_logon(&path, workers)?);
            }
        }
        report.add(Comparison {
            bench: "logon_per_worker".into(),
            size: Size::Workers(workers),
            contenders: vec![
                ("shmbroker", Measure::latency(ours)),
                ("floor: connect + fds + memfds", Measure::latency(floor)),
            ],
        });
    }
    Ok(())
}

fn config(workers: u32) -> Config {
    Config {
        world_size: workers,
        ..Config::default()
    }
}

/// Nanoseconds per worker for a whole world to log on through the broker.
fn ours_logon(path: &Path, workers: u32) -> Result<u64, String> {
    let start = Instant::now();
    let mut listener = Listener::bind(path, config(workers)).map_err(|e| e.to_string())?;
    let stop = listener.stop_handle();
    let broker = std::thread::spawn(move || listener.serve(|_| {}));
    let sessions = (0..workers)
        .map(|_| connect(path, LogonFrame::new(ANY_RANK), TIMEOUT))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string());
    let elapsed = start.elapsed();
    stop.stop();
    broker
        .join()
        .map_err(|_| "broker thread panicked")?
        .map_err(|e| e.to_string())?;
    drop(sessions?);
    Ok(elapsed.as_nanos() as u64 / u64::from(workers))
}

/// The same sizes the broker uses: its rings of `Message`.
fn ring_bytes() -> Result<u64, String> {
    let ring = shmbroker::queues::create::<Message>(config(1).ring_capacity as usize)
        .map_err(|e| e.to_string())?;
    file_size(ring.as_fd()).map_err(|e| e.to_string())
}

fn sealed_and_mapped(bytes: u64) -> Result<(OwnedFd, Mapping), String> {
    let fd = create_sealed(c"bench-floor", bytes).map_err(|e| e.to_string())?;
    let mapping = Mapping::map(&fd, bytes).map_err(|e| e.to_string())?;
    Ok((fd, mapping))
}

/// Nanoseconds per worker for the floor: the same sockets, fds and memfds, no protocol. As with
/// the broker, the serving side runs on a thread of its own, so both pay the same wake-ups.
fn floor_logon(path: &Path, workers: u32) -> Result<u64, String> {
    let ring_size = ring_bytes()?;
    let start = Instant::now();
    let listener = UnixListener::bind(path).map_err(|e| format!("bind: {e}"))?;
    let held = std::thread::scope(|scope| {
        let server = scope.spawn(move || serve_floor(listener, workers, ring_size));
        let mut held = Vec::new();
        for _ in 0..workers {
            let client = UnixStream::connect(path).map_err(|e| format!("connect: {e}"))?;
            for fd in receive_fds(&client, 136 + 24 * (2 * (workers as usize - 1)))? {
                let size = file_size(fd.as_fd()).map_err(|e| e.to_string())?;
                held.push(Mapping::map(&fd, size).map_err(|e| e.to_string())?);
            }
        }
        server.join().map_err(|_| "floor server panicked")??;
        Ok::<_, String>(held)
    })?;
    let elapsed = start.elapsed();
    drop(held);
    let _ = std::fs::remove_file(path);
    Ok(elapsed.as_nanos() as u64 / u64::from(workers))
}

/// The floor's serving side: accept each worker in turn and send it its fds, creating (and
/// mapping, as `create` does) the rings it is first to need.
fn serve_floor(listener: UnixListener, workers: u32, ring_size: u64) -> Result<(), String> {
    let mut rings: HashMap<(u32, u32), (OwnedFd, Mapping)> = HashMap::new();
    for rank in 0..workers {
        let (server, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
        for peer in (0..workers).filter(|&p| p != rank) {
            for key in [(rank, peer), (peer, rank)] {
                if let Entry::Vacant(slot) = rings.entry(key) {
                    slot.insert(sealed_and_mapped(ring_size)?);
                }
            }
        }
        let fds: Vec<BorrowedFd<'_>> = (0..workers)
            .filter(|&p| p != rank)
            .flat_map(|peer| {
                [
                    rings[&(rank, peer)].0.as_fd(),
                    rings[&(peer, rank)].0.as_fd(),
                ]
            })
            .collect();
        let reply = vec![0u8; 136 + 24 * fds.len()];
        // One message of a few KiB into an empty socket buffer: it never would block.
        fdpass::send_with_fds(server.as_fd(), &[&reply], &fds)
            .map_err(|e| format!("sendmsg: {e}"))?;
    }
    Ok(())
}

/// Receives one message of `len` bytes and the fds attached to it.
fn receive_fds(client: &UnixStream, len: usize) -> Result<Vec<OwnedFd>, String> {
    let mut buffer = vec![0u8; len];
    let mut received = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match fdpass::recv_with_fds(client.as_fd(), &mut buffer, &mut received) {
            Ok(_) => return Ok(received),
            Err(nix::errno::Errno::EAGAIN) if Instant::now() < deadline => {
                let mut poll = [PollFd::new(client.as_fd(), PollFlags::POLLIN)];
                let _ = nix::poll::poll(&mut poll, PollTimeout::from(100u16));
            }
            Err(e) => return Err(format!("recvmsg: {e}")),
        }
    }
}
