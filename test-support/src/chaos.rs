//! `chaos`: kills and corrupts workers at random moments and checks that nothing hangs,
//! nothing leaks, and every survivor names the right rank.
//!
//! One `shmbroker serve` broker (`chaos serve`, the same code) serves every trial, job after job
//! (a new one after a trial that kills it). Each trial starts `--workers` processes
//! (`chaos worker`) that run one
//! operation in a loop: barrier, all-gather, broadcast, fd exchange, bulk (1 MiB broadcasts,
//! pipelined through the outbox), all-reduce (small and large in turn), all-reduce of a
//! symmetric buffer (`symmetric`: lengths from one short piece to several, see
//! `SYMMETRIC_LENGTHS`), or point to point (`sendrecv`: 64 KiB to the next rank round a ring,
//! then a receive from the previous one). A random moment after they are all running, one of
//! them (the victim) is killed with SIGKILL, and, by scenario:
//!
//! * `kill`: nothing else;
//! * `broker`: the broker is killed first, then the victim (survivors must notice without it);
//! * `scribble`: the victim fills every shared region it can write (its ends of the rings, its
//!   outbox) with random bytes for a few milliseconds before it is killed;
//! * `fork`: the victim forks a child that keeps its socket and every fd, then is killed;
//! * `leave`: nobody is killed: the victim drops its session on purpose between two calls. The
//!   first survivor to fail must name it as having left; the others, it or a survivor that left
//!   before them (each survivor leaves once its call fails). Detection counts from the leave.
//!
//! `--rejoin TRIALS` runs other trials: deaths and rejoins while every rank recovers the
//! world's group (see the `rejoin_chaos` module).
//!
//! Each survivor reports the monotonic time its pending call failed, and what it named; then it
//! drops its session and reports its fd count against the one it had before logging on. The
//! trial records, per survivor, the time from the kill to its error (an error that came first,
//! from bytes the scribbler wrote, counts as 0), a hang when a survivor has not failed 1 s after
//! the kill, a misnaming when the error does not name the victim, the survivors' and the broker's
//! fds before and after, and any process ended by a signal the trial did not send.

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use shmbroker::Collectives;
use shmbroker::Session;
use shmbroker_cli::process::{ChildGuard, spawn_with_fds};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

/// `chaos`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = AFTER_HELP)]
pub struct Args {
    /// Trials to run.
    #[arg(long, value_name = "N", default_value_t = 30)]
    trials: u32,
    /// Workers in each trial.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..))]
    workers: u32,
    /// Seed of the random moments and choices, to reproduce a run (default: the clock).
    #[arg(long, value_name = "S")]
    seed: Option<u64>,
    /// Only this scenario.
    #[arg(long, value_name = "NAME", value_parser = clap::builder::PossibleValuesParser::new(SCENARIOS))]
    scenario: Option<String>,
    /// Only this operation.
    #[arg(long, value_name = "NAME", value_parser = clap::builder::PossibleValuesParser::new(OPS))]
    op: Option<String>,
    /// A survivor still running this long after the kill hangs.
    #[arg(long, value_name = "MS", default_value_t = millis(HANG))]
    hang_ms: u64,
    /// Print every trial as JSON before the summary.
    #[arg(long)]
    json: bool,
    /// Instead of trials: one job for SECONDS, every operation at random sizes, with kills and
    /// rejoins at random moments, failing on a wrong result, a hang, or memory or fds growing
    /// beyond the bounds below (see the `soak` module).
    #[arg(long, value_name = "SECONDS")]
    soak: Option<u64>,
    /// The soak's bound on a process's private memory (RssAnon) growth after its warm-up.
    #[arg(long, value_name = "KIB", default_value_t = 8192)]
    soak_rss_kib: u64,
    /// The soak's bound on a process's fd count growth after its warm-up.
    #[arg(long, value_name = "N", default_value_t = 2)]
    soak_fds: i64,
    /// Instead of these trials: TRIALS jobs under `shmbroker run --restart` in which ranks die
    /// at random moments (inside `regroup`, collectives, logons and rejoins) while every rank
    /// recovers the world's group (see the `rejoin_chaos` module).
    #[arg(long, value_name = "TRIALS")]
    rejoin: Option<u32>,
    /// With `--rejoin`: the `shmbroker` command that launches each job (default: `shmbroker`
    /// beside this executable).
    #[arg(long, value_name = "PATH")]
    launcher: Option<std::path::PathBuf>,
}

const AFTER_HELP: &str = "\
Kills and corrupts workers at random moments (SIGKILL during barrier, all-gather, broadcast, fd
exchange and bulk transfers; the broker killed first; the victim scribbling on its shared memory;
the victim's socket held by a forked child; the victim leaving on purpose; the victim killed and
the survivors shrinking to a group of their own, running the operation on it) and reports, over
all trials: detection time from kill to every survivor's error (p50, p99, max), hangs (a survivor
still running --hang-ms after the kill), survivors naming another rank than the victim, survivors
that could not carry on after shrinking, fds leaked by the broker and the survivors, and
processes killed by a signal the trial did not send.
Exits 1 if any of those is not zero. Trials cycle through the scenarios and operations unless
--scenario or --op picks one. --rejoin TRIALS runs jobs under `shmbroker run --restart` instead,
whose ranks die at random moments while every rank recovers the world's group with regroup, and
exits 1 on a hang, a failed job or ranks that end in different groups.";

/// `chaos worker`: one worker of a trial.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    socket: String,
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(OPS))]
    op: String,
    /// Start scribbling on its own shared memory this long after READY.
    #[arg(long, value_name = "MS")]
    scribble_after_ms: Option<u64>,
    /// Fork a child that holds the socket and every fd.
    #[arg(long)]
    fork: bool,
    /// Drop the session on purpose this long after READY.
    #[arg(long, value_name = "MS")]
    leave_after_ms: Option<u64>,
    /// After the error, shrink to the ranks still there and run the operation among them.
    #[arg(long)]
    shrink: bool,
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A survivor still running this long after the kill hangs (`--hang-ms` changes it).
const HANG: Duration = Duration::from_secs(1);

/// The deadline of every call in a chaos worker: far beyond [`HANG`].
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

const OPS: [&str; 8] = [
    "barrier",
    "all_gather",
    "broadcast",
    "fds",
    "bulk",
    "sendrecv",
    "all_reduce",
    "symmetric",
];

/// The lengths, in `f32`s, that the `symmetric` operation all-reduces in turn, all in two shots
/// (past `LENT_ONE_SHOT_MAX_BYTES` from 3 ranks on), lent where they lie: one piece of 48 KiB,
/// one of 256 KiB, one whole piece (`PIECE_MAX_BYTES`), two of 768 KiB, and five of a little
/// over 819 KiB, whose slices differ in length.
const SYMMETRIC_LENGTHS: [usize; 5] = [12 << 10, 64 << 10, 256 << 10, 384 << 10, (1 << 20) + 3];
const SCENARIOS: [&str; 6] = ["kill", "broker", "scribble", "fork", "leave", "shrink"];

/// Nanoseconds on `CLOCK_MONOTONIC`, the same clock in every process.
pub(crate) fn monotonic_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
    });
    now.max(1)
}

/// Open fds of process `pid` (`None`: this one).
pub(crate) fn fd_count(pid: Option<u32>) -> Option<usize> {
    let dir = pid.map_or("/proc/self/fd".to_string(), |pid| format!("/proc/{pid}/fd"));
    // Reading the directory opens one fd of our own, listed too when reading our own.
    let count = std::fs::read_dir(dir).ok()?.count();
    Some(if pid.is_none() { count - 1 } else { count })
}

/// A small xorshift generator: trials are reproducible from `--seed`.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

// ---------------------------------------------------------------------------------------------
// The worker

/// `chaos worker --socket PATH --op OP [--scribble-after-ms MS] [--fork]
/// [--leave-after-ms MS]`.
pub fn worker(args: &WorkerArgs) -> Result<(), String> {
    let WorkerArgs {
        socket,
        op,
        scribble_after_ms: scribble_after,
        fork,
        leave_after_ms,
        shrink,
    } = args;
    let (scribble_after, fork) = (*scribble_after, *fork);
    let leave_after = leave_after_ms.map(Duration::from_millis);
    let before = fd_count(None).unwrap_or(0);
    let mut session = Session::connect(socket, None, CALL_TIMEOUT).map_err(|e| e.to_string())?;
    session.set_timeout(CALL_TIMEOUT);
    // Everyone is in, and everything the broker passes on has arrived, before anyone counts as
    // running: a broker killed right after READY must not take an outbox still on its way.
    session.barrier().map_err(|e| e.to_string())?;
    session
        .await_peers(CALL_TIMEOUT)
        .map_err(|e| e.to_string())?;
    // And every rank has mapped every outbox before any victim starts scribbling on its own: a
    // rank still joining a scribbled outbox would (rightly) refuse it before the trial began.
    session.barrier().map_err(|e| e.to_string())?;
    if fork {
        fork_holder()?;
    }
    if let Some(after) = scribble_after {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(after));
            crate::hostile::scribble_until_killed();
        });
    }
    say(&format!("READY {before} {}", session.rank()));
    let memfd = shmbroker_cli::selftest::memfd_with(&[session.rank() as u8; 32])?;
    let bulk = vec![session.rank() as u8; 1 << 20];
    let pipelined = vec![session.rank() as u8; 64 << 10];
    let mut symmetric = match op.as_str() {
        "symmetric" => {
            let longest = SYMMETRIC_LENGTHS.iter().max().copied().unwrap_or(0);
            Some(
                session
                    .symmetric::<f32>(longest)
                    .map_err(|e| e.to_string())?,
            )
        }
        _ => None,
    };
    let mut round = 0u64;
    let started = Instant::now();
    let error = loop {
        if leave_after.is_some_and(|after| started.elapsed() >= after) {
            say(&format!("LEFT {}", monotonic_ns()));
            drop(session);
            return Ok(());
        }
        let world = session.world_size();
        let root = (round % u64::from(world)) as u32;
        let outcome = match op.as_str() {
            "barrier" => session.barrier(),
            // Both forms: past 8 ranks all_gather_into goes by Bruck's algorithm.
            "all_gather" if round.is_multiple_of(2) => session.all_gather(&[1u8; 64]).map(drop),
            "all_gather" => {
                let mut out = vec![0u8; 64 * world as usize];
                session.all_gather_into(&[1u8; 64], &mut out)
            }
            // Broadcasts alternate with gathers: past 8 ranks both go by a binomial tree.
            "broadcast" if round.is_multiple_of(2) => {
                let data = (root == session.rank()).then_some(&[7u8; 256][..]);
                session.broadcast(root, data).map(drop)
            }
            "broadcast" => session.gather(root, &[3u8; 256]).map(drop),
            "fds" => {
                use std::os::fd::AsFd;
                session.exchange_fds(memfd.as_fd()).map(drop)
            }
            "bulk" => {
                let data = (root == session.rank()).then_some(&bulk[..]);
                session.broadcast(root, data).map(drop)
            }
            // Point to point around the ring of ranks: 64 KiB to the next (pipelined through the
            // outbox), then whatever the previous one sent.
            "sendrecv" => {
                let (rank, world) = (session.rank(), session.world_size());
                session
                    .send((rank + 1) % world, &pipelined)
                    .and_then(|()| session.recv((rank + world - 1) % world).map(drop))
            }
            // Sums, small (one shot) and large (two shots through loans), in turn.
            "all_reduce" => {
                let len = if round.is_multiple_of(2) { 16 } else { 1 << 17 };
                let mut data = vec![1.0f32; len];
                session.all_reduce(&mut data, shmbroker::ReduceOp::Sum)
            }
            // Sums of a symmetric buffer, read by the peers where it lies, at every piece size.
            "symmetric" => {
                let len = SYMMETRIC_LENGTHS[round as usize % SYMMETRIC_LENGTHS.len()];
                let buffer = symmetric.as_deref_mut().unwrap_or_default();
                let data = &mut buffer[..len];
                data.fill(1.0);
                session.all_reduce(data, shmbroker::ReduceOp::Sum)
            }
            other => return Err(format!("--op: unknown operation {other:?}")),
        };
        if let Err(error) = outcome {
            break error;
        }
        round += 1;
    };
    let at = monotonic_ns();
    let (kind, rank) = named(&error);
    say(&format!("ERR {at} {kind} {rank} {error}"));
    if *shrink {
        let buffer = symmetric.as_deref_mut();
        say(&format!("SHRUNK {}", carry_on(&mut session, op, buffer)));
    }
    if scribble_after.is_some() {
        // The scribbler thread writes into this session's mappings until the driver kills this
        // process: unmapping them under it would crash it (the attacker's own fault, but not
        // the signal the trial sends).
        std::mem::forget(session);
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    drop(symmetric);
    drop(session);
    drop(memfd);
    say(&format!("FDS {}", fd_count(None).unwrap_or(0)));
    Ok(())
}

/// After a death: shrinks to the ranks still there and runs `op` on them three times, checking
/// every result (`symmetric`: on `symmetric`, the buffer the failed call was on, which every
/// survivor may write again once the shrink is done). Says how it went: `ok` with the group's
/// size, or what was wrong.
fn carry_on(session: &mut Session, op: &str, mut symmetric: Option<&mut [f32]>) -> String {
    let world = session.world_size();
    let group = match session.shrink() {
        Ok(group) => group,
        Err(error) => return format!("bad: shrink: {error}"),
    };
    let size = group.size();
    if size != world - 1 {
        return format!("bad: shrank to {:?} of {world}", group.ranks());
    }
    let me = group.rank();
    let mut on = session.on(&group);
    for round in 0..3u32 {
        let root = round % size;
        let checked = match op {
            "barrier" => on.barrier().map(|()| true),
            "all_gather" => on
                .all_gather(&[me as u8; 64])
                .map(|parts| (0..).zip(&parts).all(|(q, part)| *part == [q as u8; 64])),
            "broadcast" | "bulk" => {
                let len = if op == "bulk" { 1 << 20 } else { 256 };
                let data = vec![root as u8 + 1; len];
                on.broadcast(root, (me == root).then_some(&data[..]))
                    .map(|got| got == data)
            }
            "symmetric" => {
                let buffer = symmetric.as_deref_mut().unwrap_or_default();
                let data = &mut buffer[..SYMMETRIC_LENGTHS[round as usize]];
                data.fill(1.0);
                on.all_reduce(data, shmbroker::ReduceOp::Sum)
                    .map(|()| data.iter().all(|&x| x == size as f32))
            }
            // fds, sendrecv (a ring through the dead rank) and all_reduce: sums.
            _ => {
                let len = if round == 1 { 1 << 17 } else { 16 };
                let mut data = vec![1.0f32; len];
                on.all_reduce(&mut data, shmbroker::ReduceOp::Sum)
                    .map(|()| data.iter().all(|&x| x == size as f32))
            }
        };
        match checked {
            Ok(true) => {}
            Ok(false) => return format!("bad: {op} round {round} gave wrong data"),
            Err(error) => return format!("bad: {op} round {round}: {error}"),
        }
    }
    format!("ok {size}")
}

/// What kind of error, and the rank it names (`-` for none).
fn named(error: &shmbroker::Error) -> (&'static str, String) {
    use shmbroker::Error as E;
    match error {
        E::PeerLost { rank, .. } => ("lost", rank.to_string()),
        // A peer that left because it saw a death: the death is the cause.
        E::PeerLeft {
            after: Some(shmbroker::session::LeftAfter::Died(dead)),
            ..
        } => ("left-after-death", dead.to_string()),
        E::PeerLeft { rank, .. } => ("left", rank.to_string()),
        E::Corrupted { peer, .. } => ("corrupted", peer.to_string()),
        E::Protocol { peer, .. } => ("protocol", peer.to_string()),
        E::Outbox { peer, .. } => ("outbox", peer.to_string()),
        E::CollectiveMismatch { peer, .. } => ("mismatch", peer.to_string()),
        E::Timeout { waiting_for, .. } => (
            "timeout",
            waiting_for
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ),
        E::BrokerLost => ("broker", "-".into()),
        _ => ("other", "-".into()),
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Forks a child that keeps every fd of this process (the broker socket included) and sleeps;
/// prints `CHILD <pid>` so the driver can end it.
fn fork_holder() -> Result<(), String> {
    // SAFETY: the child calls only `pause` (async-signal-safe) and never returns into Rust code
    // that could touch locks or allocations another thread held at the fork.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => loop {
            // SAFETY: pause(2) takes nothing and only sleeps until a signal arrives.
            unsafe { nix::libc::pause() };
        },
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            say(&format!("CHILD {child}"));
            Ok(())
        }
        Err(e) => Err(format!("fork: {e}")),
    }
}

// ---------------------------------------------------------------------------------------------
// The driver

/// The broker every trial uses, restarted after a trial kills it.
struct Broker {
    socket: PathBuf,
    workers: u32,
    child: Option<ChildGuard>,
    /// Its fd count with no job, once started.
    idle_fds: usize,
}

impl Broker {
    fn ensure_running(&mut self, exe: &Path) -> Result<(), String> {
        if self.child.is_some() {
            return Ok(());
        }
        let _ = std::fs::remove_file(&self.socket);
        let mut command = Command::new(exe);
        command
            .arg("serve")
            .arg("--socket")
            .arg(&self.socket)
            .args(["--workers", &self.workers.to_string()])
            .env("SHMBROKER_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn_with_fds(&mut command, &[]).map_err(|e| format!("broker: {e}"))?;
        let until = Instant::now() + Duration::from_secs(10);
        while !self.socket.exists() {
            if Instant::now() > until {
                return Err("the broker never created its socket".into());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        self.idle_fds = fd_count(Some(child.id())).unwrap_or(0);
        self.child = Some(child);
        Ok(())
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(ChildGuard::id)
    }

    /// Fds the broker holds beyond its idle count, once it has caught up (up to 2 s).
    fn leaked_fds(&self) -> i64 {
        let Some(pid) = self.pid() else { return 0 };
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            let now = fd_count(Some(pid)).unwrap_or(0) as i64 - self.idle_fds as i64;
            if now == 0 || Instant::now() > until {
                return now;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// One worker process and its output lines as they arrive (with when they arrived).
struct Running {
    child: ChildGuard,
    lines: Receiver<String>,
    forked: Option<i32>,
}

/// What one trial found.
#[derive(Debug, Default)]
struct Trial {
    scenario: &'static str,
    op: &'static str,
    victim: u32,
    /// Per survivor, the time from the kill to its error.
    detections: Vec<Duration>,
    hangs: u32,
    misnamed: Vec<String>,
    survivor_fds_leaked: i64,
    broker_fds_leaked: i64,
    signalled: Vec<String>,
    /// Survivors that could not shrink and carry on (the shrink scenario).
    unshrunk: Vec<String>,
}

/// Everything the trials found.
#[derive(Debug, Default)]
struct Report {
    trials: Vec<Trial>,
}

pub fn run(args: &Args) -> Result<(), String> {
    let (trials, workers, json) = (args.trials, args.workers, args.json);
    let seed = args.seed.unwrap_or_else(monotonic_ns);
    if let Some(trials) = args.rejoin {
        let launcher = match &args.launcher {
            Some(path) => path.clone(),
            None => std::env::current_exe()
                .map_err(|e| format!("finding my own binary: {e}"))?
                .with_file_name("shmbroker"),
        };
        return crate::rejoin_chaos::run(&launcher, trials, workers, seed);
    }
    if let Some(seconds) = args.soak {
        let exe = std::env::current_exe().map_err(|e| format!("finding my own binary: {e}"))?;
        let soak = crate::soak::Soak {
            seconds,
            workers,
            seed,
            rss_kib: args.soak_rss_kib,
            fds: args.soak_fds,
        };
        return crate::soak::run(&exe, soak);
    }
    // clap checked the names; these are the 'static ones.
    let pick = |names: &[&'static str], only: &Option<String>| -> Vec<&'static str> {
        names
            .iter()
            .copied()
            .filter(|name| only.as_deref().is_none_or(|only| only == *name))
            .collect()
    };
    let scenarios = pick(&SCENARIOS, &args.scenario);
    let ops = pick(&OPS, &args.op);
    let hang = Duration::from_millis(args.hang_ms);
    let exe = std::env::current_exe().map_err(|e| format!("finding my own binary: {e}"))?;
    let dir = shmbroker_sys::TempDir::new("chaos").map_err(|e| e.to_string())?;
    let mut broker = Broker {
        socket: dir.path().join("broker.sock"),
        workers,
        child: None,
        idle_fds: 0,
    };
    let mut rng = Rng(seed | 1);
    let mut report = Report::default();
    eprintln!("chaos: {trials} trials of {workers} workers, seed {seed}");
    for index in 0..trials {
        let scenario = scenarios[index as usize % scenarios.len()];
        let op = ops[(index as usize / scenarios.len() + rng.below(2) as usize) % ops.len()];
        // Shrinking needs every survivor to notice the death: a ring of point-to-point
        // messages tells only the victim's neighbours, so the shrink scenario sums instead.
        let op = if scenario == "shrink" && op == "sendrecv" {
            "all_reduce"
        } else {
            op
        };
        let trial = run_trial(&exe, &mut broker, &mut rng, (scenario, op), workers, hang)?;
        if !trial.misnamed.is_empty()
            || trial.hangs > 0
            || !trial.signalled.is_empty()
            || !trial.unshrunk.is_empty()
        {
            eprintln!("chaos: trial {index}: {trial:?}");
        }
        report.trials.push(trial);
    }
    drop(broker);
    let summary = report.summary();
    if json {
        println!("{}", report.json(seed));
    }
    println!("{summary}");
    if report.failed() {
        return Err("chaos: some trial hung, leaked, misnamed a rank or died of a signal".into());
    }
    Ok(())
}

fn run_trial(
    exe: &Path,
    broker: &mut Broker,
    rng: &mut Rng,
    (scenario, op): (&'static str, &'static str),
    workers: u32,
    hang: Duration,
) -> Result<Trial, String> {
    broker.ensure_running(exe)?;
    let victim_index = rng.below(u64::from(workers)) as usize;
    // Each trial is its own job: a worker of an ended trial could never join the next one.
    let job = format!("chaos-{}-{}", std::process::id(), rng.next());
    let delay = Duration::from_micros(rng.below(30_000));
    let scribble_for = Duration::from_millis(3);
    let mut running = Vec::new();
    for index in 0..workers as usize {
        let mut command = Command::new(exe);
        command
            .arg("worker")
            .arg("--socket")
            .arg(&broker.socket)
            .args(["--op", op])
            .env(shmbroker::session::JOB_VAR, &job)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if index == victim_index {
            match scenario {
                "scribble" => {
                    let after = (delay.as_millis() as u64).max(1);
                    command.args(["--scribble-after-ms", &after.to_string()]);
                }
                "fork" => {
                    command.arg("--fork");
                }
                "leave" => {
                    let after = (delay.as_millis() as u64).max(1);
                    command.args(["--leave-after-ms", &after.to_string()]);
                }
                _ => {}
            }
        }
        if scenario == "shrink" {
            command.arg("--shrink");
        }
        let mut child = spawn_with_fds(&mut command, &[]).map_err(|e| format!("worker: {e}"))?;
        let stdout = child.take_stdout();
        let (tx, lines) = channel();
        if let Some(stdout) = stdout {
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        running.push(Running {
            child,
            lines,
            forked: None,
        });
    }
    // Everyone running: READY from each (and the fork's child from the victim).
    let mut ready_fds = vec![0usize; running.len()];
    let mut ranks = vec![String::new(); running.len()];
    for (index, worker) in running.iter_mut().enumerate() {
        loop {
            let line = worker
                .lines
                .recv_timeout(Duration::from_secs(20))
                .map_err(|_| format!("worker {index} never became ready"))?;
            if let Some(pid) = line.strip_prefix("CHILD ") {
                worker.forked = pid.trim().parse().ok();
            } else if let Some(ready) = line.strip_prefix("READY ") {
                let mut fields = ready.split_whitespace();
                ready_fds[index] = fields.next().and_then(|f| f.parse().ok()).unwrap_or(0);
                ranks[index] = fields.next().unwrap_or("?").to_string();
                break;
            }
        }
    }
    std::thread::sleep(
        delay
            + if scenario == "scribble" {
                scribble_for
            } else {
                Duration::ZERO
            },
    );
    let victim_pid = running[victim_index].child.id() as i32;
    if scenario == "broker"
        && let Some(mut child) = broker.child.take()
    {
        child.kill();
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed_at = if scenario == "leave" {
        // Nobody is killed: the victim says when it left.
        let line = running[victim_index]
            .lines
            .recv_timeout(Duration::from_secs(20))
            .map_err(|_| "the leaving worker never left".to_string())?;
        line.strip_prefix("LEFT ")
            .and_then(|at| at.trim().parse().ok())
            .ok_or_else(|| format!("the leaving worker said {line:?}"))?
    } else {
        let at = monotonic_ns();
        let _ = kill(Pid::from_raw(victim_pid), Signal::SIGKILL);
        at
    };
    let mut trial = Trial {
        scenario,
        op,
        victim: ranks[victim_index].parse().unwrap_or(u32::MAX),
        ..Trial::default()
    };
    let hang_at = Instant::now() + hang;
    let mut named = Vec::new();
    for (index, worker) in running.iter_mut().enumerate() {
        if index == victim_index {
            continue;
        }
        let mut errored = false;
        loop {
            let left = hang_at.saturating_duration_since(Instant::now());
            let Ok(line) = worker
                .lines
                .recv_timeout(left.max(Duration::from_millis(1)))
            else {
                break;
            };
            if let Some(rest) = line.strip_prefix("ERR ") {
                let mut fields = rest.splitn(4, ' ');
                let at: u64 = fields
                    .next()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(killed_at);
                let kind = fields.next().unwrap_or("?").to_string();
                let rank = fields.next().unwrap_or("-").to_string();
                let text = fields.next().unwrap_or("").to_string();
                trial
                    .detections
                    .push(Duration::from_nanos(at.saturating_sub(killed_at)));
                named.push((at, ranks[index].clone(), kind, rank, text));
                errored = true;
                break;
            }
        }
        if !errored {
            trial.hangs += 1;
        }
    }
    // After a shrink, how each survivor carried on; then survivors' fds after dropping their
    // sessions, and how everyone ended.
    for (index, worker) in running.iter_mut().enumerate() {
        if index != victim_index && scenario == "shrink" {
            let line = worker.lines.recv_timeout(Duration::from_secs(5));
            match line.as_deref().map(|line| line.strip_prefix("SHRUNK ")) {
                Ok(Some(how)) if how == format!("ok {}", workers - 1) => {}
                Ok(Some(how)) => trial.unshrunk.push(format!("rank {}: {how}", ranks[index])),
                _ => trial
                    .unshrunk
                    .push(format!("rank {}: never said", ranks[index])),
            }
        }
        if index != victim_index
            && let Ok(line) = worker.lines.recv_timeout(Duration::from_secs(5))
            && let Some(after) = line.strip_prefix("FDS ")
        {
            let after: i64 = after.trim().parse().unwrap_or(0);
            trial.survivor_fds_leaked += (after - ready_fds[index] as i64).max(0);
        }
        match worker.child.wait_timeout(Duration::from_secs(5)) {
            Ok(Some(status)) => {
                use std::os::unix::process::ExitStatusExt;
                let sent = index == victim_index && scenario != "leave";
                if let Some(signal) = status.signal()
                    && !(sent && signal == Signal::SIGKILL as i32)
                {
                    trial.signalled.push(format!(
                        "{} (rank {}) ended by signal {signal}",
                        if index == victim_index {
                            "the victim"
                        } else {
                            "a survivor"
                        },
                        ranks[index]
                    ));
                }
            }
            _ => worker.child.kill(),
        }
        if let Some(pid) = worker.forked {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    // Every survivor must name the victim's rank; after a leave, survivors leave in turn, so
    // each may name the victim or a survivor that failed before it.
    let victim_rank = &ranks[victim_index];
    named.sort_unstable_by_key(|(at, ..)| *at);
    let mut departed = vec![victim_rank.clone()];
    for (_, me, kind, rank, text) in &named {
        let names_victim = rank == victim_rank;
        let acceptable = match kind.as_str() {
            "lost" => scenario != "leave" && names_victim,
            // A survivor that gave up on the victim's death and left (point to point: the
            // next rank round the ring was waiting on it) is named with the death it cites.
            "left-after-death" => scenario != "leave" && names_victim,
            // After a leave, survivors leave in turn: each may name the victim or a survivor
            // that failed before it. A scribbler's survivors fail before the kill and leave
            // too, and the scribbler may forge its own "I closed my end" flags.
            "left" => (scenario == "leave" || scenario == "scribble") && departed.contains(rank),
            // What a scribbler wrote before it died may be found first: it must name the victim.
            "corrupted" | "protocol" | "outbox" | "mismatch" => {
                scenario == "scribble" && names_victim
            }
            _ => false,
        };
        if !acceptable {
            trial.misnamed.push(format!("{kind} {rank}: {text}"));
        }
        departed.push(me.clone());
    }
    if scenario == "broker" {
        broker.child = None;
    } else {
        trial.broker_fds_leaked = broker.leaked_fds();
    }
    Ok(trial)
}

impl Report {
    fn detections(&self) -> Vec<Duration> {
        let mut all: Vec<Duration> = self
            .trials
            .iter()
            .flat_map(|t| t.detections.iter().copied())
            .collect();
        all.sort_unstable();
        all
    }

    fn totals(&self) -> (u32, usize, i64, i64, usize) {
        let hangs = self.trials.iter().map(|t| t.hangs).sum();
        // A survivor that could not carry on after shrinking counts with the misnamed: it did
        // not get what the trial claims.
        let misnamed = self
            .trials
            .iter()
            .map(|t| t.misnamed.len() + t.unshrunk.len())
            .sum();
        let survivor = self.trials.iter().map(|t| t.survivor_fds_leaked).sum();
        let broker = self.trials.iter().map(|t| t.broker_fds_leaked).sum();
        let signalled = self.trials.iter().map(|t| t.signalled.len()).sum();
        (hangs, misnamed, survivor, broker, signalled)
    }

    fn failed(&self) -> bool {
        let (hangs, misnamed, survivor, broker, signalled) = self.totals();
        hangs > 0 || misnamed > 0 || survivor != 0 || broker != 0 || signalled > 0
    }

    fn summary(&self) -> String {
        let all = self.detections();
        let at = |q: f64| {
            all.get(((all.len() as f64 - 1.0) * q).round() as usize)
                .map_or(0.0, |d| d.as_secs_f64() * 1e3)
        };
        let (hangs, misnamed, survivor, broker, signalled) = self.totals();
        format!(
            "chaos: {} trials, {} survivors: detection p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; \
             hangs {hangs}; misnamed or not carrying on after a shrink {misnamed}; fds leaked: \
             broker {broker}, survivors {survivor}; killed by another signal {signalled}",
            self.trials.len(),
            all.len(),
            at(0.5),
            at(0.99),
            all.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
        )
    }

    fn json(&self, seed: u64) -> String {
        let trials: Vec<String> = self
            .trials
            .iter()
            .map(|t| {
                let ms: Vec<String> = t
                    .detections
                    .iter()
                    .map(|d| format!("{:.3}", d.as_secs_f64() * 1e3))
                    .collect();
                format!(
                    "{{\"scenario\":\"{}\",\"op\":\"{}\",\"victim\":{},\"detection_ms\":[{}],\
                     \"hangs\":{},\"misnamed\":{},\"survivor_fds_leaked\":{},\
                     \"broker_fds_leaked\":{},\"signalled\":{}}}",
                    t.scenario,
                    t.op,
                    t.victim,
                    ms.join(","),
                    t.hangs,
                    t.misnamed.len(),
                    t.survivor_fds_leaked,
                    t.broker_fds_leaked,
                    t.signalled.len()
                )
            })
            .collect();
        let (hangs, misnamed, survivor, broker, signalled) = self.totals();
        let all = self.detections();
        let at = |q: f64| {
            all.get(((all.len() as f64 - 1.0) * q).round() as usize)
                .map_or(0.0, |d| d.as_secs_f64() * 1e3)
        };
        format!(
            "{{\"seed\":{seed},\"trials\":{},\"detection_p50_ms\":{:.3},\"detection_p99_ms\":{:.3},\
             \"hangs\":{hangs},\"misnamed\":{misnamed},\"broker_fds_leaked\":{broker},\
             \"survivor_fds_leaked\":{survivor},\"signalled\":{signalled},\"per_trial\":[{}]}}",
            self.trials.len(),
            at(0.5),
            at(0.99),
            trials.join(",")
        )
    }
}
