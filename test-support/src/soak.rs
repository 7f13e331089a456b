//! `chaos --soak SECONDS`: one job that runs for that long, every operation at random sizes,
//! with workers killed at random moments and started again, rejoining the job each time. It
//! samples every long-lived process's memory and fds, and fails on growth beyond stated bounds.
//!
//! # The job
//!
//! A `chaos serve` broker, and `--workers` processes (`chaos soak-worker`). Rank 0 coordinates
//! and is never killed; the others are killed (SIGKILL) at random moments, 0.2 to 1.2 s apart,
//! and started again at once with the same rank, as `shmbroker run --restart` does.
//!
//! Rank 0 runs *epochs*. An epoch starts once every rank is there (`wait_for_rank`, which takes
//! on a replacement): rank 0 sends each worker `EPOCH e`, each answers `READY e` (after waiting
//! for every other rank the same way), and once all have, rank 0 sends `GO e` and every rank
//! makes a group of the whole world. Then rank 0 sends rounds (`ROUND e op size seed`): every
//! rank runs that operation on the group with inputs made from the seed and its rank, and
//! checks the result against what it computes itself, bit for bit. A death ends the epoch: the
//! collectives that needed the dead rank fail at once naming it (`PeerLost`), and rank 0 starts
//! the next epoch. Only `GO` makes anyone call `group`, so every rank makes the same groups in
//! the same order, whoever dies when.
//!
//! Operations: barrier, all-reduce (u32 sums), broadcast from a random root, all-gather and
//! all-to-all, with sizes from 0 to 1 MiB, log-uniform; and every `ROUND` order carries a
//! point-to-point payload of 0 to 256 KiB that each worker checks. (A ring of point-to-point
//! messages among the workers is left out: a worker whose group a death broke skips rounds, and
//! its neighbour would wait for its message to the deadline.)
//!
//! # What fails it
//!
//! - a wrong result, or any error other than a death's, in any rank (it exits non-zero);
//! - no round finished for 10 s (a hang);
//! - a long-lived process (the broker, rank 0, rank 1, which is never killed either when there
//!   are 3 ranks or more, and any worker that lived long enough since its last start) whose
//!   private memory (`RssAnon`) grew by more than `--soak-rss-kib` (default 8 MiB) or whose fd
//!   count grew by more than `--soak-fds` (default 2). Growth is the least value sampled (every
//!   0.5 s) in the last window minus the least in the first window after a warm-up; the warm-up
//!   and the windows are 5 s each, or a tenth of the soak if less. The least, because both
//!   swing with what is in flight: buffers of up to 1 MiB come and go, and a rejoin's four fds
//!   (and the newcomer's outbox) sit in the inbox until the session takes them on. Shared
//!   memory (`RssShmem`: rings and outboxes, fixed in size, touched as sizes vary) is
//!   reported, not bounded.

use crate::chaos::{Rng, fd_count, monotonic_ns};
use shmbroker::Collectives;
use shmbroker::ReduceOp;
use shmbroker::session::{Error, Group, Session};
use shmbroker_cli::process::{ChildGuard, spawn_with_fds};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

/// `chaos soak-worker`: one rank of the soak's job.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    socket: String,
    #[arg(long)]
    rank: u32,
}

/// The deadline of every call of a soak worker: a hang shows long before it.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// No progress for this long is a hang (half of a shorter soak).
const STALL: Duration = Duration::from_secs(10);

/// The bounds, and what the soak runs.
#[derive(Debug, Clone, Copy)]
pub struct Soak {
    pub seconds: u64,
    pub workers: u32,
    pub seed: u64,
    pub rss_kib: u64,
    pub fds: i64,
}

// ---------------------------------------------------------------------------------------------
// The commands rank 0 sends: a kind and four numbers, little-endian u64s.

const EPOCH: u64 = 1;
const READY: u64 = 2;
const GO: u64 = 3;
const ROUND: u64 = 4;

fn command(words: [u64; 5]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn words(bytes: &[u8]) -> Result<[u64; 5], String> {
    if bytes.len() < 40 {
        return Err(format!(
            "a command of {} bytes, not 40 or more",
            bytes.len()
        ));
    }
    let mut words = [0u64; 5];
    for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        *word = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
    }
    Ok(words)
}

const OPS: [&str; 5] = [
    "barrier",
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_to_all",
];

/// Bytes rank `rank` contributes to a round with `seed`.
fn input(seed: u64, rank: u32, len: usize) -> Vec<u8> {
    let mut rng = Rng(seed ^ (u64::from(rank) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    (0..len).map(|_| rng.next() as u8).collect()
}

/// Whether an error is a death's (or a departure's that a death caused): the epoch is over.
fn a_death(error: &Error) -> bool {
    matches!(
        error,
        Error::PeerLost { .. } | Error::PeerLeft { .. } | Error::PeerRejoined { .. }
    )
}

/// Runs one round's operation on `group`, checking the result; `Ok(false)` when a death cut it
/// short.
fn round(
    session: &mut Session,
    group: &Group,
    op: &str,
    len: usize,
    seed: u64,
) -> Result<bool, String> {
    let size = group.size();
    let me = session.rank();
    let outcome: Result<(), Error> = (|| {
        match op {
            "barrier" => session.on(group).barrier()?,
            "all_reduce" => {
                let count = len / 4;
                let mine = input(seed, me, count * 4);
                let mut data: Vec<u32> = mine
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().unwrap_or_default()))
                    .collect();
                session.on(group).all_reduce(&mut data, ReduceOp::Sum)?;
                let mut want = vec![0u32; count];
                for rank in 0..size {
                    for (w, c) in want
                        .iter_mut()
                        .zip(input(seed, rank, count * 4).chunks_exact(4))
                    {
                        *w = w.wrapping_add(u32::from_le_bytes(c.try_into().unwrap_or_default()));
                    }
                }
                if data != want {
                    return Err(Error::Misuse(format!(
                        "all_reduce of {count} u32: wrong sum"
                    )));
                }
            }
            "broadcast" => {
                let root = (seed % u64::from(size)) as u32;
                let mine = input(seed, root, len);
                let data = session
                    .on(group)
                    .broadcast(root, (me == root).then_some(&mine[..]))?;
                if data != input(seed, root, len) {
                    return Err(Error::Misuse(format!(
                        "broadcast of {len} B from {root}: wrong"
                    )));
                }
            }
            "all_gather" => {
                let parts = session.on(group).all_gather(&input(seed, me, len))?;
                for (rank, part) in (0..).zip(&parts) {
                    if *part != input(seed, rank, len) {
                        return Err(Error::Misuse(format!(
                            "all_gather of {len} B: rank {rank}'s part wrong"
                        )));
                    }
                }
            }
            _ => {
                let block = len / size as usize;
                let sent = input(seed, me, block * size as usize);
                let mut got = vec![0; sent.len()];
                session.on(group).all_to_all(&sent, &mut got)?;
                for rank in 0..size {
                    let theirs = input(seed, rank, block * size as usize);
                    let at = me as usize * block..(me as usize + 1) * block;
                    if got[rank as usize * block..(rank as usize + 1) * block] != theirs[at] {
                        return Err(Error::Misuse(format!(
                            "all_to_all of {block} B blocks: from {rank} wrong"
                        )));
                    }
                }
            }
        }
        Ok(())
    })();
    match outcome {
        Ok(()) => Ok(true),
        Err(error) if a_death(&error) => Ok(false),
        Err(error) => Err(format!("{op} of {len} B: {error}")),
    }
}

/// Waits until every other rank is there (taking on replacements).
fn everyone(session: &mut Session) -> Result<(), String> {
    for rank in 0..session.world_size() {
        if rank != session.rank() {
            session
                .with_timeout(CALL_TIMEOUT)
                .wait_for_rank(rank)
                .map_err(|e| format!("waiting for rank {rank}: {e}"))?;
        }
    }
    Ok(())
}

/// `chaos soak-worker`.
pub fn worker(args: &WorkerArgs) -> Result<(), String> {
    let mut session = Session::connect(&args.socket, Some(args.rank), CALL_TIMEOUT)
        .map_err(|e| format!("logon: {e}"))?;
    session.set_timeout(CALL_TIMEOUT);
    let all: Vec<u32> = (0..session.world_size()).collect();
    if args.rank == 0 {
        return coordinate(&mut session, &all);
    }
    let mut group: Option<(u64, Group)> = None;
    loop {
        let order_bytes = match session.recv(0) {
            Ok(order) => order,
            Err(error) => return Err(format!("waiting for rank 0: {error}")),
        };
        let order = words(&order_bytes)?;
        match order[0] {
            EPOCH => {
                group = None;
                everyone(&mut session)?;
                match session.send(0, &command([READY, order[1], 0, 0, 0])) {
                    Ok(()) => {}
                    Err(error) => return Err(format!("answering rank 0: {error}")),
                }
            }
            GO => {
                group = match session.group(&all) {
                    Ok(made) => Some((order[1], made)),
                    Err(error) if a_death(&error) => None,
                    Err(error) => return Err(format!("group: {error}")),
                };
            }
            ROUND => {
                let payload = &order_bytes[40..];
                if payload != input(order[4], 0, payload.len()) {
                    return Err(format!(
                        "a round's {} B from rank 0: wrong bytes",
                        payload.len()
                    ));
                }
                if let Some((epoch, made)) = &group
                    && *epoch == order[1]
                {
                    let made = made.clone();
                    let op = OPS[order[2] as usize % OPS.len()];
                    if !round(&mut session, &made, op, order[3] as usize, order[4])? {
                        group = None;
                    }
                }
            }
            other => return Err(format!("an order of kind {other}")),
        }
    }
}

/// Rank 0: epochs and rounds, forever (the driver ends it); a line on standard output every
/// 100 rounds so the driver sees progress.
fn coordinate(session: &mut Session, all: &[u32]) -> Result<(), String> {
    let mut rng = Rng(monotonic_ns() | 1);
    let (mut epoch, mut rounds) = (0u64, 0u64);
    let world = session.world_size();
    loop {
        everyone(session)?;
        epoch += 1;
        // Progress too: an epoch begins once every rank is there.
        println!("EPOCH {epoch} ROUNDS {rounds}");
        // Every worker must say it is ready for this epoch; a death meanwhile starts another.
        let mut ready = true;
        for rank in 1..world {
            if let Err(error) = session.send(rank, &command([EPOCH, epoch, 0, 0, 0])) {
                if !a_death(&error) {
                    return Err(format!("EPOCH to {rank}: {error}"));
                }
                ready = false;
            }
        }
        for rank in 1..world {
            if !ready {
                break;
            }
            // Answers of epochs given up on come first; they are passed over.
            loop {
                match session.recv(rank) {
                    Ok(answer) => {
                        let answer = words(&answer)?;
                        if answer[0] == READY && answer[1] == epoch {
                            break;
                        }
                    }
                    Err(error) if a_death(&error) => {
                        ready = false;
                        break;
                    }
                    Err(error) => return Err(format!("READY from {rank}: {error}")),
                }
            }
        }
        if !ready {
            continue;
        }
        let mut sent_go = true;
        for rank in 1..world {
            if let Err(error) = session.send(rank, &command([GO, epoch, 0, 0, 0])) {
                if !a_death(&error) {
                    return Err(format!("GO to {rank}: {error}"));
                }
                sent_go = false;
            }
        }
        let group = match session.group(all) {
            Ok(group) => group,
            Err(error) if a_death(&error) => continue,
            Err(error) => return Err(format!("group (sent GO to all: {sent_go}): {error}")),
        };
        loop {
            let op = rng.below(OPS.len() as u64);
            // 0 B to 1 MiB, log-uniform.
            let len = (1u64 << rng.below(21)) + rng.below(1 << 10) - 1;
            let len = len.min(1 << 20);
            let seed = rng.next();
            let mut order = command([ROUND, epoch, op, len, seed]);
            order.extend(input(seed, 0, rng.below(256 << 10) as usize));
            let mut sent = true;
            for rank in 1..world {
                if session.send(rank, &order).is_err() {
                    sent = false;
                }
            }
            if !sent || !round(session, &group, OPS[op as usize], len as usize, seed)? {
                break;
            }
            rounds += 1;
            if rounds % 10 == 0 {
                println!("ROUNDS {rounds} EPOCH {epoch}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The driver

/// One process's memory and fds, as sampled.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    anon_kib: u64,
    shmem_kib: u64,
    fds: i64,
}

fn sample(pid: u32) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    Some(Sample {
        anon_kib: field("RssAnon:"),
        shmem_kib: field("RssShmem:"),
        fds: fd_count(Some(pid))? as i64,
    })
}

/// A process being watched: when it started, and its samples.
struct Watched {
    name: String,
    started: Instant,
    samples: Vec<(Instant, Sample)>,
}

impl Watched {
    /// The least private memory and fds sampled within `[from, to)`, if any was.
    fn least(&self, from: Instant, to: Instant) -> Option<Sample> {
        let window: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|(at, _)| *at >= from && *at < to)
            .map(|(_, sample)| sample)
            .collect();
        Some(Sample {
            anon_kib: window.iter().map(|s| s.anon_kib).min()?,
            shmem_kib: window.iter().map(|s| s.shmem_kib).min()?,
            fds: window.iter().map(|s| s.fds).min()?,
        })
    }
}

/// Runs the soak (see the module docs).
pub fn run(exe: &Path, soak: Soak) -> Result<(), String> {
    let dir = shmbroker_sys::TempDir::new("soak").map_err(|e| e.to_string())?;
    let socket = dir.path().join("broker.sock");
    let job = format!("soak-{}", std::process::id());
    let mut broker = Command::new(exe);
    broker
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .args(["--workers", &soak.workers.to_string()])
        .env("SHMBROKER_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let broker = spawn_with_fds(&mut broker, &[]).map_err(|e| format!("broker: {e}"))?;
    let until = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        if Instant::now() > until {
            return Err("the broker never created its socket".into());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let start =
        |rank: u32, restarts: u32| -> Result<(ChildGuard, Option<Receiver<String>>), String> {
            let mut command = Command::new(exe);
            command
                .args(["soak-worker", "--socket"])
                .arg(&socket)
                .args(["--rank", &rank.to_string()])
                .env("SHMBROKER_JOB", &job)
                .env("SHMBROKER_LOG", "error")
                .stdout(if rank == 0 {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stderr(Stdio::piped());
            if restarts > 0 {
                command.env("SHMBROKER_RESTART_COUNT", restarts.to_string());
            }
            let mut child =
                spawn_with_fds(&mut command, &[]).map_err(|e| format!("rank {rank}: {e}"))?;
            let lines = child.take_stdout().map(|stdout| {
                let (tx, rx) = channel();
                std::thread::spawn(move || {
                    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                });
                rx
            });
            Ok((child, lines))
        };
    let (mut zero, lines) = start(0, 0)?;
    let lines = lines.ok_or("rank 0 has no standard output")?;
    let mut workers: Vec<(ChildGuard, u32)> = Vec::new();
    for rank in 1..soak.workers {
        workers.push((start(rank, 0)?.0, 0));
    }
    let began = Instant::now();
    let warm_up = Duration::from_secs(5).min(Duration::from_secs(soak.seconds) / 10);
    let window = warm_up;
    let mut watched: HashMap<u32, Watched> = HashMap::new();
    let watch = |watched: &mut HashMap<u32, Watched>, pid: u32, name: String| {
        watched.insert(
            pid,
            Watched {
                name,
                started: Instant::now(),
                samples: Vec::new(),
            },
        );
    };
    watch(&mut watched, broker.id(), "the broker".into());
    watch(&mut watched, zero.id(), "rank 0".into());
    for (rank, (child, _)) in (1..).zip(&workers) {
        watch(&mut watched, child.id(), format!("rank {rank}"));
    }
    let mut rng = Rng(soak.seed | 1);
    let mut next_kill = began + Duration::from_millis(200 + rng.below(1000));
    let mut next_sample = began;
    let (mut kills, mut rounds, mut last_round) = (0u64, 0u64, Instant::now());
    let mut failure = None;
    while began.elapsed() < Duration::from_secs(soak.seconds) {
        // Rank 0 says "ROUNDS n EPOCH e" every 10 rounds and "EPOCH e ROUNDS n" as an epoch
        // begins: either is progress.
        while let Ok(line) = lines.try_recv() {
            let count = line
                .strip_prefix("ROUNDS ")
                .and_then(|rest| rest.split(' ').next())
                .or_else(|| line.rsplit_once("ROUNDS ").map(|(_, n)| n));
            if let Some(count) = count {
                rounds = count.trim().parse().unwrap_or(rounds);
                last_round = Instant::now();
            }
        }
        let stall = STALL.min(Duration::from_secs(soak.seconds) / 2);
        if last_round.elapsed() > stall {
            failure = Some(format!(
                "no round finished and no epoch began for {stall:?} (a hang), after {rounds} \
                 rounds"
            ));
            break;
        }
        // A process that ended on its own failed (a wrong result, or an error no death explains).
        let mut ended = Vec::new();
        if let Ok(Some(status)) = zero.wait_timeout(Duration::ZERO) {
            ended.push(format!("rank 0 {status:?}"));
        }
        for (rank, (child, _)) in (1..).zip(workers.iter_mut()) {
            if let Ok(Some(status)) = child.wait_timeout(Duration::ZERO) {
                ended.push(format!("rank {rank} {status:?}"));
            }
        }
        if !ended.is_empty() {
            let mut said = String::new();
            if let Some(mut stderr) = zero.take_stderr() {
                let _ = std::io::Read::read_to_string(&mut stderr, &mut said);
            }
            for (child, _) in &mut workers {
                if let Ok(Some(_)) = child.wait_timeout(Duration::ZERO)
                    && let Some(mut stderr) = child.take_stderr()
                {
                    let _ = std::io::Read::read_to_string(&mut stderr, &mut said);
                }
            }
            failure = Some(format!("{} ended on their own: {said}", ended.join(", ")));
            break;
        }
        let now = Instant::now();
        if now >= next_kill && soak.workers > 1 {
            // Rank 1 stays too when another worker can die: a survivor of every rejoin, watched.
            let at = if soak.workers >= 3 {
                1 + rng.below(u64::from(soak.workers - 2)) as usize
            } else {
                0
            };
            let rank = at as u32 + 1;
            let (child, restarts) = &mut workers[at];
            watched.remove(&child.id());
            child.kill();
            let restarts = *restarts + 1;
            let (new, _) = start(rank, restarts)?;
            watch(
                &mut watched,
                new.id(),
                format!("rank {rank} (restart {restarts})"),
            );
            workers[at] = (new, restarts);
            kills += 1;
            next_kill = now + Duration::from_millis(200 + rng.below(1000));
        }
        if now >= next_sample {
            for (&pid, process) in &mut watched {
                if let Some(taken) = sample(pid) {
                    process.samples.push((now, taken));
                }
            }
            next_sample = now + Duration::from_millis(500);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // The verdict on every process that lived long enough to be measured.
    let mut grew = Vec::new();
    let mut lines_out = Vec::new();
    for process in watched.values() {
        // Up to its last sample: a process that ended (a failure) is judged on what it lived.
        let Some(&(end, _)) = process.samples.last() else {
            continue;
        };
        let from = process.started + warm_up;
        if end.saturating_duration_since(from) < 2 * window {
            continue;
        }
        let (Some(first), Some(last)) = (
            process.least(from, from + window),
            process.least(end - window, end + Duration::from_millis(1)),
        ) else {
            continue;
        };
        let (anon, fds) = (
            last.anon_kib as i64 - first.anon_kib as i64,
            last.fds - first.fds,
        );
        lines_out.push(format!(
            "  {}: private memory {} -> {} KiB ({anon:+}), shared {} -> {} KiB, fds {} -> {} ({fds:+}), over {:.0} s",
            process.name,
            first.anon_kib,
            last.anon_kib,
            first.shmem_kib,
            last.shmem_kib,
            first.fds,
            last.fds,
            process.started.elapsed().as_secs_f64(),
        ));
        if anon > soak.rss_kib as i64 || fds > soak.fds {
            grew.push(process.name.clone());
        }
    }
    lines_out.sort();
    eprintln!(
        "soak: {} s, {} ranks, seed {}: {rounds} rounds checked, {kills} kills and rejoins",
        soak.seconds, soak.workers, soak.seed
    );
    for line in &lines_out {
        eprintln!("{line}");
    }
    eprintln!(
        "soak: bounds: private memory +{} KiB, fds +{} per process (least in the last {window:?} \
         against the least in the first {window:?} after a {warm_up:?} warm-up)",
        soak.rss_kib, soak.fds
    );
    if let Some(failure) = failure {
        return Err(format!("soak failed: {failure}"));
    }
    if !grew.is_empty() {
        return Err(format!(
            "soak failed: {} grew beyond the bounds",
            grew.join(", ")
        ));
    }
    if rounds == 0 {
        return Err("soak failed: no round finished".into());
    }
    if kills == 0 && soak.workers > 1 && soak.seconds >= 2 {
        return Err("soak failed: nobody was killed (nothing rejoined)".into());
    }
    Ok(())
}
