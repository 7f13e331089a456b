//! `shmbroker demo`: a broker and worker processes logging on and greeting each other, then two
//! processes streaming messages over a pair of rings.

use crate::process::spawn_with_fds;
use shmbroker::handshake::{Config, Listener};
use shmbroker::queues::{Consumer, HEADER_SIZE, Producer, create};
use shmbroker_sys::TempDir;
use std::io::Write;
use std::os::fd::AsFd;
use std::process::Command;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(30);
const CAPACITY: usize = 1024;

/// `shmbroker demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Worker processes that log on to the broker.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    workers: u32,
    /// Messages streamed over the ring.
    #[arg(long, default_value_t = 100_000)]
    messages: u64,
    /// Ping-pong round trips timed over the pair of rings.
    #[arg(long, default_value_t = 10_000)]
    round_trips: usize,
}

pub fn run(args: &Args) -> Result<(), String> {
    let Args {
        workers,
        messages,
        round_trips,
    } = *args;
    let shm_before = dev_shm_entries();
    broker_and_workers(workers)?;
    ring_stream(messages, round_trips)?;
    let me = std::process::id();
    let shm_after = dev_shm_entries();
    if shm_after == shm_before {
        println!(
            "[demo   pid {me}] /dev/shm is as it was: every ring and region was a memfd, gone with its fds"
        );
    } else {
        println!(
            "[demo   pid {me}] note: /dev/shm changed meanwhile (another program?): {shm_before:?} -> {shm_after:?}"
        );
    }
    Ok(())
}

/// Part 1: a broker on a thread of this process, `workers` worker processes logging on to it.
fn broker_and_workers(workers: u32) -> Result<(), String> {
    let me = std::process::id();
    println!(
        "shmbroker demo, part 1: a broker and {workers} worker processes running every collective\n"
    );
    let dir = TempDir::new("demo").map_err(|e| e.to_string())?;
    let socket = dir.path().join("broker.sock");
    let config = Config {
        world_size: workers,
        ..Config::default()
    };
    let mut listener = Listener::bind(&socket, config.clone()).map_err(|e| e.to_string())?;
    println!(
        "[broker pid {me}] listening on {} (mode 0600): {workers} ranks, rings of {} slots",
        socket.display(),
        config.ring_capacity,
    );
    let stop = listener.stop_handle();
    let broker = std::thread::spawn(move || {
        listener.serve(|event| println!("[broker pid {me}] {}", crate::serve::describe(event)))
    });
    let exe = std::env::current_exe().map_err(|e| format!("finding my own binary: {e}"))?;
    let mut children = Vec::new();
    for _ in 0..workers {
        let mut command = Command::new(&exe);
        command.arg("worker").arg("--socket").arg(&socket);
        command.args(["--selftest", "--repeat", "3", "--table", "2000"]);
        std::io::stdout().flush().ok();
        children.push(
            spawn_with_fds(&mut command, &[]).map_err(|e| format!("starting a worker: {e}"))?,
        );
    }
    let mut failures = Vec::new();
    for child in children {
        let pid = child.id();
        match child.wait_or_kill(TIMEOUT) {
            Ok(status) if status.success() => {}
            Ok(status) => failures.push(format!("worker {pid}: {status}")),
            Err(error) => failures.push(format!("worker {pid}: {error}")),
        }
    }
    stop.stop();
    broker
        .join()
        .map_err(|_| "the broker thread panicked".to_string())?
        .map_err(|e| e.to_string())?;
    if !failures.is_empty() {
        return Err(failures.join("; "));
    }
    println!("[broker pid {me}] all {workers} workers done; socket removed\n");
    Ok(())
}

/// Part 2: two processes, two rings, no broker: the raw ring between processes.
fn ring_stream(messages: u64, round_trips: usize) -> Result<(), String> {
    let me = std::process::id();
    println!("shmbroker demo, part 2: two processes streaming over a pair of rings\n");
    let ring_a = create::<[u64; 2]>(CAPACITY).map_err(|e| e.to_string())?;
    let ring_b = create::<[u64; 2]>(CAPACITY).map_err(|e| e.to_string())?;
    let bytes = HEADER_SIZE + CAPACITY * 24;
    println!(
        "[parent pid {me}] created ring A (parent -> child) and ring B (child -> parent): \
         sealed memfds of {bytes} bytes, {CAPACITY} slots of 16-byte messages each"
    );

    let exe = std::env::current_exe().map_err(|e| format!("finding my own binary: {e}"))?;
    let mut command = Command::new(exe);
    command.args(["ring-peer", "echo"]);
    std::io::stdout().flush().ok();
    let child = spawn_with_fds(&mut command, &[ring_a.as_fd(), ring_b.as_fd()])
        .map_err(|e| format!("starting the child: {e}"))?;
    println!(
        "[parent pid {me}] started child pid {} with ring A at fd 3 and ring B at fd 4",
        child.id()
    );
    let mut tx = Producer::<[u64; 2]>::join(ring_a.as_fd()).map_err(|e| e.to_string())?;
    let mut rx = Consumer::<[u64; 2]>::join(ring_b.as_fd()).map_err(|e| e.to_string())?;
    drop((ring_a, ring_b));

    // Streaming: keep the ring full in both directions, check every answer.
    let start = Instant::now();
    let mut sent = 0u64;
    let mut checked = 0u64;
    while checked < messages {
        while sent < messages && tx.try_send([sent, sent + 3]).is_ok() {
            sent += 1;
        }
        let [index, square] = rx
            .recv_timeout(TIMEOUT)
            .map_err(|e| format!("waiting for answer {checked}: {e}"))?;
        let value = checked + 3;
        if index != checked || square != value.wrapping_mul(value) {
            return Err(format!("answer {checked} is wrong: [{index}, {square}]"));
        }
        checked += 1;
    }
    let elapsed = start.elapsed();
    println!(
        "[parent pid {me}] streamed {messages} messages; the child squared each and sent it back; \
         all {checked} answers checked in {:.1} ms ({:.1} M round trips/s, pipelined)",
        elapsed.as_secs_f64() * 1e3,
        messages as f64 / elapsed.as_secs_f64() / 1e6
    );

    // Ping-pong: one message in flight, time each round trip.
    let mut samples = Vec::with_capacity(round_trips);
    for i in 0..round_trips as u64 {
        let start = Instant::now();
        tx.send_timeout([i, 2], TIMEOUT)
            .map_err(|e| format!("ping {i}: {e}"))?;
        rx.recv_timeout(TIMEOUT)
            .map_err(|e| format!("pong {i}: {e}"))?;
        samples.push(start.elapsed().as_nanos() as u64);
    }
    samples.sort_unstable();
    let percentile = |p: usize| samples[(samples.len() * p / 100).min(samples.len() - 1)];
    if !samples.is_empty() {
        println!(
            "[parent pid {me}] ping-pong, one message in flight: {round_trips} round trips, \
             p50 {} ns, p99 {} ns",
            percentile(50),
            percentile(99)
        );
    }

    drop(tx);
    println!("[parent pid {me}] closed ring A; waiting for the child to drain it and exit");
    std::io::stdout().flush().ok();
    let status = child
        .wait_or_kill(TIMEOUT)
        .map_err(|e| format!("waiting for the child: {e}"))?;
    if !status.success() {
        return Err(format!("child failed: {status}"));
    }
    println!("[parent pid {me}] child exited cleanly ({status})");
    Ok(())
}

/// The names in /dev/shm, sorted; empty if it cannot be read.
fn dev_shm_entries() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok())
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}
