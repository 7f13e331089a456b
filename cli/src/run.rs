//! `shmbroker run -n N [--tag-output] [--timeout SECS] -- PROGRAM ARGS...`: a broker and N copies
//! of a program, the way `mpirun` and `torchrun` start a job.
//!
//! # What it does
//!
//! - A broker for N workers listens on a socket in a private directory (mode 0700) of its own,
//!   on a thread of this process, for as long as the job runs.
//! - Each copy gets `SHMBROKER_SOCKET`, `SHMBROKER_RANK`, `SHMBROKER_WORLD_SIZE` and
//!   `SHMBROKER_BROKER=external`, so `Session::from_env` (or `shmbroker_from_env`,
//!   `shmbroker.connect()`) finds the job with no argument and no rank hosts a second broker.
//! - Each copy also gets what `torchrun` gives, so that `torch.distributed.init_process_group`
//!   (with the `shmbroker` backend, or gloo) works unchanged: `RANK`, `LOCAL_RANK`,
//!   `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, and `MASTER_ADDR=127.0.0.1` with a `MASTER_PORT` that
//!   was free when the job started (both kept as they are when the launcher's environment
//!   already sets them).
//! - Each copy runs in a process group of its own, with standard input from `/dev/null` and no
//!   signal blocked (the launcher blocks SIGINT, SIGTERM and SIGQUIT for its signalfd), and is
//!   killed by the kernel if this process dies (`PR_SET_PDEATHSIG`), even by `SIGKILL`.
//! - SIGINT and SIGTERM sent to this process are sent on to every copy still running, once each
//!   (a Ctrl-C reaches the copies only this way, since they are not in the terminal's group).
//! - SIGQUIT (Ctrl-\\) prints the `shmbroker status` table of the job on standard error, and the
//!   job goes on; so does `--timeout` running out, before it stops the copies.
//! - Every copy gets `SHMBROKER_JOB`, an id of this job no other shares, so that a copy started
//!   again can rejoin it (a rejoin must name its job).
//! - When a copy fails (a non-zero exit, or a signal), the others get SIGTERM, and SIGKILL
//!   [`GRACE`] later (only the SIGKILL when a signal was passed on to them already); with
//!   `--on-failure continue` they are left to run to their end instead. `--timeout` stops all
//!   of them when it runs out. The broker is told these departures are expected, so it logs the
//!   copies it stops as stopped, not as deaths.
//!
//! # Restarts
//!
//! With `--restart N`, a copy killed by a signal (or, with `--restart-on-error`, one that exits
//! with a non-zero status) is started again with the same rank, up to N times per rank, with
//! `SHMBROKER_RESTART_COUNT` set to how many times that rank has been restarted. The new process
//! rejoins the job in the dead one's place (see `Session::rejoined`): the survivors hear
//! `PeerLost` and then `PeerRejoined`, and carry on. While its rank has restarts left, a death is
//! no failure: the others are not stopped and the exit status does not count it. A copy is
//! restarted only while another copy is still running (a job with nobody left has nobody to
//! rejoin), never once the job is being stopped (a failure, a signal, `--timeout`), and never
//! for a clean exit (status 0: it left). A rank out of restarts fails as any copy fails:
//! `--on-failure` then decides whether the others are stopped, and the exit status is its.
//!
//! # Which failure is reported
//!
//! The first copy that failed, by its real cause: `rank 2 was killed by SIGKILL`. Copies fail
//! in a cascade (a peer's death makes the survivors' calls fail, and they exit too), and
//! several may be found ended at one look, so the launcher does not go by rank order: of the
//! copies found failed together, it blames the first its broker saw die (gone without a
//! goodbye; a survivor says goodbye as it exits), then the first it saw leave, then one ended
//! by a signal (a survivor exits with a code), then the lowest rank. The broker's order wins
//! over the order in which exits are seen: a copy the broker saw go before the one to blame,
//! still running, is waited for (up to `BLAME_GRACE`), and blamed if it then fails. So a copy
//! that left cleanly and then exited non-zero is named, not the copies its leaving made fail.
//!
//! # Exit status
//!
//! The first failing copy's (as above): its exit code, or 128 + the signal that ended it. 0 when
//! every copy succeeds; 124 when `--timeout` ran out first; 127 when the program cannot be
//! started.
//!
//! # What is left behind
//!
//! Nothing: every copy is reaped (a [`ChildGuard`] kills and reaps one on any path out), the
//! broker thread is stopped and joined, and the directory with the socket is removed.

use crate::process::{ChildGuard, spawn_with_fds};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, pthread_sigmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::Pid;
use shmbroker::handshake::{Config, Event, Listener};
use shmbroker::launch::BROKER_VAR;
use shmbroker_sys::TempDir;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Set for a copy started again (see "Restarts"): how many times its rank has been.
pub const RESTART_COUNT_VAR: &str = "SHMBROKER_RESTART_COUNT";

/// How long copies told to stop (SIGTERM) have before they get SIGKILL.
pub const GRACE: Duration = Duration::from_secs(3);

/// How long a failure's report waits for a copy that its broker saw go earlier and that has not
/// exited yet: a copy that left cleanly and then exits non-zero is the cause, not the copies its
/// leaving made fail, which may exit first.
const BLAME_GRACE: Duration = Duration::from_secs(2);

/// How long a failure's report waits in any case, for the broker to record the departures of
/// the same moment (a death's socket closing, say) that order the failures.
const BLAME_SETTLE: Duration = Duration::from_millis(50);

/// How often the launcher looks at its copies and its signals.
const TICK: Duration = Duration::from_millis(10);

/// Exit status when `--timeout` ran out (as `timeout(1)`).
const TIMED_OUT: u8 = 124;

/// Exit status when the program could not be started (as a shell's).
const CANNOT_START: u8 = 127;

/// `shmbroker run`.
#[derive(Debug, clap::Args)]
#[command(after_help = "For example: shmbroker run -n 4 --tag-output -- python3 train.py")]
pub struct Args {
    /// Copies of the program to start: the world size.
    #[arg(short = 'n', long = "np", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    copies: u32,
    /// Prefix each line a copy writes (standard output and error) with `[rank] `.
    #[arg(long)]
    tag_output: bool,
    /// Stop every copy after SECS seconds and exit with 124.
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    timeout: Option<Duration>,
    /// What a failing copy does to the others: `stop` them (SIGTERM, then SIGKILL), or let them
    /// `continue` to their end; the exit status is the first failure's either way.
    #[arg(long, value_enum, default_value_t = OnFailure::Stop)]
    on_failure: OnFailure,
    /// Start a copy killed by a signal again, with the same rank, up to N times per rank: it
    /// rejoins the job in the dead one's place, and the others go on (see "Restarts" in the
    /// docs). A rank out of restarts fails as `--on-failure` says.
    #[arg(long, value_name = "N", default_value_t = 0)]
    restart: u32,
    /// With `--restart`: also start again a copy that exits with a non-zero status.
    #[arg(long, requires = "restart")]
    restart_on_error: bool,
    /// Say at the start where the job's broker listens and the job's id (`SHMBROKER_JOB`), which
    /// a program started apart from the launcher needs to take over a rank that died.
    #[arg(long, short = 'v')]
    verbose: bool,
    /// The program and its arguments, after `--`.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM ARGS"
    )]
    command: Vec<OsString>,
}

/// `--on-failure`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum OnFailure {
    /// Stop the other copies.
    Stop,
    /// Let them run to their end.
    Continue,
}

pub(crate) fn parse_seconds(text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .filter(|secs| secs.is_finite() && *secs > 0.0 && *secs < 1e9)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{text:?} is not a number of seconds above 0"))
}

/// Blocks SIGINT, SIGTERM and SIGQUIT in this thread, and returns them. The launcher takes them from a
/// signalfd, so they must be blocked in every thread: `main` calls this before any thread
/// exists (the log writer's included), and threads started later inherit the mask. Each copy
/// unblocks them before it runs the program.
///
/// # Errors
///
/// The OS error, described.
pub fn block_stop_signals() -> Result<SigSet, String> {
    let mut stop_signals = SigSet::empty();
    stop_signals.add(Signal::SIGINT);
    stop_signals.add(Signal::SIGTERM);
    stop_signals.add(Signal::SIGQUIT);
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&stop_signals), None)
        .map_err(|e| format!("blocking SIGINT, SIGTERM and SIGQUIT: {e}"))?;
    Ok(stop_signals)
}

/// Writes `text` on standard error in one `write` (stderr is unbuffered, and `eprintln!` writes
/// each piece of its format on its own): the copies share the launcher's standard error, and a
/// line of theirs must never land inside one of the launcher's.
fn say(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// [`say`] of a formatted line.
macro_rules! say_line {
    ($($arg:tt)*) => {
        say(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// How long the launcher waits for its own broker's status answer.
const STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// One copy of the program.
struct Copy {
    rank: u32,
    child: ChildGuard,
    status: Option<ExitStatus>,
    /// How many times this rank has been started again (see "Restarts").
    restarts: u32,
}

/// Runs the job; the exit status is the job's (see the module docs).
pub fn run(args: &Args) -> ExitCode {
    match Job::start(args) {
        Ok(job) => job.wait(args),
        Err((code, error)) => {
            say_line!("shmbroker run: {error}");
            ExitCode::from(code)
        }
    }
}

/// Starts `shmbroker sweep-after DIR` in a process group of its own (a Ctrl-C at the terminal
/// does not reach it), its standard input a pipe whose write end only this process holds (it is
/// close-on-exec, so no copy inherits it). `None`, with a warning, if it cannot start: the
/// directory is then removed only on a clean exit.
fn start_sweeper(dir: &std::path::Path) -> Option<std::process::ChildStdin> {
    use std::os::unix::process::CommandExt;
    let started = std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe)
            .arg("sweep-after")
            .arg(dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
    });
    match started {
        // Not waited for: it outlives this process by design, and init reaps it.
        Ok(mut child) => child.stdin.take(),
        Err(error) => {
            say_line!(
                "shmbroker run: warning: no sweeper for {}: {error}; it stays if this process \
                 is killed",
                dir.display()
            );
            None
        }
    }
}

/// `shmbroker sweep-after DIR`: waits until standard input closes (the `run` that started it
/// has ended), then removes `DIR` and what it holds, if it is a `run` socket directory.
///
/// # Errors
///
/// `DIR` is not a `run` socket directory.
pub fn sweep_after(dir: &std::path::Path) -> Result<(), String> {
    let ours = dir
        .file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with("shmbroker-run-"));
    if !ours {
        return Err(format!("{} is not a run socket directory", dir.display()));
    }
    let mut sink = [0u8; 64];
    loop {
        match std::io::Read::read(&mut std::io::stdin(), &mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    match std::fs::remove_dir_all(dir) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("removing {}: {error}", dir.display()))
        }
        _ => Ok(()),
    }
}

/// A running job: the broker, the copies and what their output goes through.
struct Job {
    _dir: TempDir,
    /// The write end of the sweeper's standard input: it closes when this process ends, however
    /// it ends, and the sweeper then removes the socket directory (see [`sweep_after`]).
    _sweeper: Option<std::process::ChildStdin>,
    /// The broker's socket, for the status table (`--timeout`, SIGQUIT).
    socket: std::path::PathBuf,
    broker_stop: shmbroker::handshake::StopHandle,
    broker: Option<std::thread::JoinHandle<()>>,
    copies: Vec<Copy>,
    signals: SignalFd,
    /// One message per output stream when it reaches its end (`--tag-output`).
    output_done: mpsc::Receiver<()>,
    output_streams: usize,
    /// Ranks in the order the broker saw them go, and whether each said goodbye (left) or not
    /// (died).
    departures: std::sync::Arc<std::sync::Mutex<Vec<(u32, bool)>>>,
    /// What starting a copy again needs: torch's rendezvous, this job's id, and where tagged
    /// output reports its end.
    torch: TorchEnv,
    job: String,
    done_tx: mpsc::Sender<()>,
}

impl Job {
    fn start(args: &Args) -> Result<Self, (u8, String)> {
        fn failed(what: &'static str) -> impl Fn(&dyn std::fmt::Display) -> (u8, String) {
            move |e| (1, format!("{what}: {e}"))
        }
        let stop_signals = block_stop_signals().map_err(|e| (1, e))?;
        let signals = SignalFd::with_flags(
            &stop_signals,
            SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC,
        )
        .map_err(|e| failed("signalfd")(&e))?;
        let dir = TempDir::new("run").map_err(|e| failed("creating the socket directory")(&e))?;
        let sweeper = start_sweeper(dir.path());
        let socket = dir.path().join("broker.sock");
        let config = Config {
            world_size: args.copies,
            ..Config::default()
        };
        let mut listener =
            Listener::bind(&socket, config).map_err(|e| failed("starting the broker")(&e))?;
        let broker_stop = listener.stop_handle();
        let departures: std::sync::Arc<std::sync::Mutex<Vec<(u32, bool)>>> =
            std::sync::Arc::default();
        let seen = std::sync::Arc::clone(&departures);
        let broker = std::thread::Builder::new()
            .name("shmbroker-broker".into())
            .spawn(move || {
                // A leave counts from its goodbye, which comes before any peer can see it go; a
                // death from its socket's close.
                // A replacement's logon (which comes after its predecessor's death) starts its
                // rank afresh.
                let on_event = |event: &Event| {
                    let mut seen = seen
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let (rank, clean) = match *event {
                        Event::Leaving { rank } => (rank, true),
                        Event::WorkerLeft { rank, clean, .. } => (rank, clean),
                        Event::LoggedOn { rank, .. } => {
                            seen.retain(|&(gone, _)| gone != rank);
                            return;
                        }
                        _ => return,
                    };
                    if !seen.iter().any(|&(gone, _)| gone == rank) {
                        seen.push((rank, clean));
                    }
                };
                if let Err(error) = listener.serve(on_event) {
                    say_line!("shmbroker run: the broker stopped: {error}");
                }
            })
            .map_err(|e| failed("starting the broker thread")(&e))?;
        let (done_tx, output_done) = mpsc::channel();
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let mut job = Job {
            socket,
            _dir: dir,
            _sweeper: sweeper,
            broker_stop,
            broker: Some(broker),
            copies: Vec::new(),
            signals,
            output_done,
            output_streams: 0,
            departures,
            torch: TorchEnv::new(),
            job: format!("run-{}-{started}", std::process::id()),
            done_tx,
        };
        if args.verbose {
            say_line!(
                "shmbroker run: job {} (SHMBROKER_JOB), broker on {} (SHMBROKER_SOCKET); \
                 `shmbroker status --pid {}` shows it",
                job.job,
                job.socket.display(),
                std::process::id()
            );
        }
        for rank in 0..args.copies {
            let copy = job.start_copy(args, rank, 0).map_err(|error| {
                let program = args.command[0].to_string_lossy();
                (
                    CANNOT_START,
                    format!("cannot start {program:?} as rank {rank}: {error}"),
                )
            })?;
            job.copies.push(copy);
        }
        Ok(job)
    }

    /// Starts copy `rank` (for the `restarts`th time again), its output tagged if asked.
    fn start_copy(&mut self, args: &Args, rank: u32, restarts: u32) -> std::io::Result<Copy> {
        let child = spawn_copy(args, &self.socket, &self.torch, &self.job, rank, restarts)?;
        let mut copy = Copy {
            rank,
            child,
            status: None,
            restarts,
        };
        if args.tag_output {
            if let Some(stdout) = copy.child.take_stdout() {
                tag_lines(rank, stdout, std::io::stdout, self.done_tx.clone());
                self.output_streams += 1;
            }
            if let Some(stderr) = copy.child.take_stderr() {
                tag_lines(rank, stderr, std::io::stderr, self.done_tx.clone());
                self.output_streams += 1;
            }
        }
        Ok(copy)
    }

    /// Starts the copy at `at` again if it may be (see "Restarts"): whether it was.
    fn restart(&mut self, args: &Args, at: usize, status: ExitStatus) -> bool {
        let copy = &self.copies[at];
        let others_running = self
            .copies
            .iter()
            .enumerate()
            .any(|(other, copy)| other != at && copy.status.is_none());
        let restartable = status.signal().is_some() || args.restart_on_error;
        if !restartable || copy.restarts >= args.restart || !others_running {
            return false;
        }
        let (rank, restarts) = (copy.rank, copy.restarts + 1);
        match self.start_copy(args, rank, restarts) {
            Ok(new) => {
                say_line!(
                    "shmbroker run: rank {rank} {}; starting it again ({restarts} of {})",
                    describe(status),
                    args.restart
                );
                self.copies[at] = new;
                true
            }
            Err(error) => {
                say_line!("shmbroker run: cannot start rank {rank} again: {error}");
                false
            }
        }
    }

    /// Prints the `shmbroker status` table of this job on standard error.
    fn print_status(&self) {
        match crate::status::ask(&self.socket, STATUS_TIMEOUT) {
            Ok(report) => say(&shmbroker::status::table(&report)),
            Err(error) => say_line!("shmbroker run: no status: {error}"),
        }
    }

    /// Waits for every copy, stopping the others at the first failure (unless `on_failure` says
    /// to let them run), a forwarded signal's aftermath or the timeout; returns the job's exit
    /// status.
    fn wait(mut self, args: &Args) -> ExitCode {
        let (timeout, on_failure) = (args.timeout, args.on_failure);
        let started = Instant::now();
        let mut first_failure: Option<u8> = None;
        // Failures not yet reported, and since when: see `blame`.
        let mut unreported: Vec<usize> = Vec::new();
        let mut unreported_since: Option<Instant> = None;
        let mut timed_out = false;
        // When the copies still running were told to stop: SIGKILL follows GRACE later.
        let mut stopping: Option<Instant> = None;
        // Whether a signal was passed on: copies told to stop are not sent SIGTERM again when
        // the first of them fails (each gets one signal), only SIGKILL after GRACE.
        let mut forwarded = false;
        loop {
            while let Ok(Some(info)) = self.signals.read_signal() {
                let signal = Signal::try_from(info.ssi_signo as i32).unwrap_or(Signal::SIGTERM);
                if signal == Signal::SIGQUIT {
                    // Ctrl-\: who is where, and the job goes on.
                    self.print_status();
                    continue;
                }
                self.broker_stop.expect_departures();
                self.signal_running(signal);
                forwarded = true;
            }
            // Every copy that ended since the last look, then which failure came first.
            let mut failed = Vec::new();
            for (at, copy) in self.copies.iter_mut().enumerate() {
                if copy.status.is_some() {
                    continue;
                }
                match copy.child.wait_timeout(Duration::ZERO) {
                    Ok(Some(status)) => {
                        copy.status = Some(status);
                        if failure_code(status).is_some() {
                            failed.push(at);
                        }
                    }
                    Ok(None) => {}
                    Err(error) => {
                        say_line!("shmbroker run: waiting for rank {}: {error}", copy.rank);
                        copy.child.kill();
                        copy.status = Some(ExitStatus::from_raw(Signal::SIGKILL as i32));
                        first_failure.get_or_insert(1);
                    }
                }
            }
            // A copy with restarts left is started again, and is no failure (see "Restarts").
            if stopping.is_none() && !timed_out && !forwarded {
                failed.retain(|&at| {
                    let status = self.copies[at]
                        .status
                        .unwrap_or_else(|| ExitStatus::from_raw(0));
                    !self.restart(args, at, status)
                });
            }
            unreported.extend(failed);
            if !unreported.is_empty() {
                unreported_since.get_or_insert_with(Instant::now);
            }
            // Once every copy has ended, nothing more is to be learnt: report now.
            let waited = if self.copies.iter().all(|copy| copy.status.is_some()) {
                Duration::MAX
            } else {
                unreported_since.map_or(Duration::ZERO, |since| since.elapsed())
            };
            if first_failure.is_none()
                && !timed_out
                && let Some(at) = self.blame(&unreported, waited)
            {
                let copy = &self.copies[at];
                let (rank, status, restarts) = (copy.rank, copy.status, copy.restarts);
                let status = status.unwrap_or_else(|| ExitStatus::from_raw(0));
                first_failure = failure_code(status);
                let then = match on_failure {
                    OnFailure::Stop => "stopping the others",
                    OnFailure::Continue => "the others go on",
                };
                let spent = if args.restart > 0 && restarts >= args.restart {
                    format!(" (started again {restarts} times: no restarts left)")
                } else {
                    String::new()
                };
                say_line!(
                    "shmbroker run: rank {rank} {}{spent}; {then}",
                    describe(status)
                );
            }
            if self.copies.iter().all(|copy| copy.status.is_some()) {
                break;
            }
            let now = Instant::now();
            if !timed_out && timeout.is_some_and(|limit| now.duration_since(started) >= limit) {
                timed_out = true;
                self.print_status();
                say_line!(
                    "shmbroker run: timed out after {:?}; stopping ranks {}",
                    timeout.unwrap_or_default(),
                    self.running_ranks()
                );
            }
            let stop = timed_out || first_failure.is_some() && on_failure == OnFailure::Stop;
            if stop && stopping.is_none() {
                self.broker_stop.expect_departures();
                if !forwarded || timed_out {
                    self.signal_running(Signal::SIGTERM);
                }
                stopping = Some(now);
            }
            if stopping.is_some_and(|since| now.duration_since(since) >= GRACE) {
                say_line!(
                    "shmbroker run: ranks {} still running {GRACE:?} after SIGTERM; killing them",
                    self.running_ranks()
                );
                for copy in self.copies.iter_mut().filter(|copy| copy.status.is_none()) {
                    copy.child.kill();
                    copy.status = Some(ExitStatus::from_raw(Signal::SIGKILL as i32));
                }
                break;
            }
            let mut fds = [nix::poll::PollFd::new(
                std::os::fd::AsFd::as_fd(&self.signals),
                nix::poll::PollFlags::POLLIN,
            )];
            let _ = nix::poll::poll(
                &mut fds,
                nix::poll::PollTimeout::from(TICK.as_millis() as u16),
            );
        }
        self.finish_output();
        if timed_out {
            ExitCode::from(TIMED_OUT)
        } else {
            ExitCode::from(first_failure.unwrap_or(0))
        }
    }

    /// Of the copies at `failed` (indices of copies found failed), the one to report, once it
    /// can be told (see "Which failure is reported" in the module docs): `None` while a copy the
    /// broker saw go before it still runs and `waited` is below [`BLAME_GRACE`].
    fn blame(&self, failed: &[usize], waited: Duration) -> Option<usize> {
        // The broker's records of the same moments may be a moment behind the exits.
        if waited < BLAME_SETTLE {
            return None;
        }
        let first = self.first_of(failed)?;
        let before = self.gone_at(first);
        let earlier_running = (0..self.copies.len())
            .any(|at| self.copies[at].status.is_none() && self.gone_at(at) < before);
        (!earlier_running || waited >= BLAME_GRACE).then_some(first)
    }

    /// Where the broker saw the copy at `at` go, for ordering: deaths (no goodbye) before
    /// departures, each in the broker's order; a copy it has not seen go last.
    fn gone_at(&self, at: usize) -> (usize, usize) {
        let departures = self
            .departures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        departures
            .iter()
            .position(|&(rank, _)| rank == self.copies[at].rank)
            .map_or((2, usize::MAX), |position| {
                (usize::from(departures[position].1), position)
            })
    }

    /// Of the copies at `failed` (indices, found ended), the one that failed first (see "Which
    /// failure is reported" in the module docs).
    fn first_of(&self, failed: &[usize]) -> Option<usize> {
        // Deaths (no goodbye) before departures: a survivor a death made fail says goodbye as
        // it goes, and the broker may see the two at one look, in any order.
        let by_signal = |at: &usize| {
            self.copies[*at]
                .status
                .is_none_or(|status| status.signal().is_none())
        };
        failed
            .iter()
            .copied()
            .min_by_key(|&at| (self.gone_at(at), by_signal(&at), self.copies[at].rank))
    }

    /// Sends `signal` to every copy not yet reaped (a reaped one's pid may belong to another
    /// process by now).
    fn signal_running(&self, signal: Signal) {
        for copy in self.copies.iter().filter(|copy| copy.status.is_none()) {
            let _ = kill(Pid::from_raw(copy.child.id() as i32), signal);
        }
    }

    fn running_ranks(&self) -> String {
        let ranks: Vec<String> = self
            .copies
            .iter()
            .filter(|copy| copy.status.is_none())
            .map(|copy| copy.rank.to_string())
            .collect();
        ranks.join(", ")
    }

    /// Waits (briefly) for the tagged output to be written out: a stream stays open past its
    /// copy's exit only if something the copy started still holds it, which is not waited for.
    fn finish_output(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(1);
        for _ in 0..self.output_streams {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.output_done.recv_timeout(left).is_err() {
                break;
            }
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // Copies still running (an early return) are killed and reaped by their guards.
        self.copies.clear();
        self.broker_stop.stop();
        if let Some(broker) = self.broker.take() {
            let _ = broker.join();
        }
    }
}

/// Where torch.distributed's `env://` rendezvous meets: the launcher's `MASTER_ADDR` and
/// `MASTER_PORT` when it has both, or 127.0.0.1 and a port free now.
struct TorchEnv {
    master: Option<(String, String)>,
}

impl TorchEnv {
    fn new() -> Self {
        if std::env::var_os("MASTER_ADDR").is_some() && std::env::var_os("MASTER_PORT").is_some() {
            return Self { master: None };
        }
        // The port is released before rank 0's torch binds it: another process could take it
        // in between, as with torchrun's own free-port choice. A machine with no loopback TCP
        // (a sandbox) still runs every program that does not need it.
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|listener| listener.local_addr())
            .map(|address| address.port());
        match port {
            Ok(port) => Self {
                master: Some(("127.0.0.1".into(), port.to_string())),
            },
            Err(error) => {
                say_line!(
                    "shmbroker run: no free TCP port on 127.0.0.1 ({error}); MASTER_ADDR and \
                     MASTER_PORT are not set"
                );
                Self { master: None }
            }
        }
    }

    fn apply(&self, command: &mut Command, rank: u32, copies: u32) {
        for name in ["RANK", "LOCAL_RANK"] {
            command.env(name, rank.to_string());
        }
        for name in ["WORLD_SIZE", "LOCAL_WORLD_SIZE"] {
            command.env(name, copies.to_string());
        }
        if let Some((addr, port)) = &self.master {
            command.env("MASTER_ADDR", addr).env("MASTER_PORT", port);
        }
    }
}

/// Starts copy `rank` of the program.
fn spawn_copy(
    args: &Args,
    socket: &std::path::Path,
    torch: &TorchEnv,
    job: &str,
    rank: u32,
    restarts: u32,
) -> std::io::Result<ChildGuard> {
    let mut command = Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("SHMBROKER_SOCKET", socket)
        .env("SHMBROKER_RANK", rank.to_string())
        .env("SHMBROKER_WORLD_SIZE", args.copies.to_string())
        .env(shmbroker::session::JOB_VAR, job)
        .env(BROKER_VAR, "external")
        .stdin(Stdio::null())
        .process_group(0);
    if restarts > 0 {
        command.env(RESTART_COUNT_VAR, restarts.to_string());
    } else {
        command.env_remove(RESTART_COUNT_VAR);
    }
    torch.apply(&mut command, rank, args.copies);
    if args.tag_output {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    let launcher = std::process::id();
    let mut blocked = SigSet::empty();
    blocked.add(Signal::SIGINT);
    blocked.add(Signal::SIGTERM);
    blocked.add(Signal::SIGQUIT);
    let prepare = move || {
        // The launcher blocks these to read them from its signalfd; a copy must not inherit that.
        pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&blocked), None)?;
        // SAFETY: prctl(PR_SET_PDEATHSIG) takes plain integers and only changes this (forked)
        // process's own death signal; it is async-signal-safe.
        let set = unsafe {
            nix::libc::prctl(
                nix::libc::PR_SET_PDEATHSIG,
                nix::libc::SIGKILL as nix::libc::c_ulong,
            )
        };
        if set != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // The launcher may have died before the line above: then nothing would kill this copy.
        if std::os::unix::process::parent_id() != launcher {
            return Err(std::io::Error::other("the launcher is gone"));
        }
        Ok(())
    };
    // SAFETY: the closure runs in the forked child before exec and calls only pthread_sigmask,
    // prctl and getppid, all async-signal-safe; it allocates nothing on its success path and
    // takes no lock.
    let command = unsafe { command.pre_exec(prepare) };
    spawn_with_fds(command, &[])
}

/// Copies `stream` to `out` line by line, each line prefixed with `[rank] `, on a thread; says
/// on `done` when the stream ends.
fn tag_lines<W: Write + 'static>(
    rank: u32,
    stream: impl Read + Send + 'static,
    out: fn() -> W,
    done: mpsc::Sender<()>,
) {
    let spawned = std::thread::Builder::new()
        .name(format!("rank-{rank}-output"))
        .spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut line = Vec::new();
            let prefix = format!("[{rank}] ");
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if !line.ends_with(b"\n") {
                            line.push(b'\n');
                        }
                        // One write per line, so lines of different ranks never interleave.
                        let mut tagged = prefix.clone().into_bytes();
                        tagged.extend_from_slice(&line);
                        let _ = out().write_all(&tagged);
                    }
                }
            }
            let _ = done.send(());
        });
    if let Err(error) = spawned {
        say_line!("shmbroker run: no thread for rank {rank}'s output: {error}");
    }
}

/// The exit code a failed copy gives the job, or `None` when it succeeded.
fn failure_code(status: ExitStatus) -> Option<u8> {
    match (status.code(), status.signal()) {
        (Some(0), _) => None,
        (Some(code), _) => Some(u8::try_from(code & 0xff).unwrap_or(1).max(1)),
        (None, Some(signal)) => Some(u8::try_from(128 + signal).unwrap_or(255)),
        (None, None) => Some(1),
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with {code}"),
        (None, Some(signal)) => match Signal::try_from(signal) {
            Ok(signal) => format!("was killed by {signal}"),
            Err(_) => format!("was killed by signal {signal}"),
        },
        (None, None) => format!("ended with {status}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_map_to_exit_codes_as_a_shell_does() {
        assert_eq!(failure_code(ExitStatus::from_raw(0)), None);
        assert_eq!(failure_code(ExitStatus::from_raw(7 << 8)), Some(7));
        assert_eq!(failure_code(ExitStatus::from_raw(9)), Some(137));
        assert_eq!(failure_code(ExitStatus::from_raw(2)), Some(130));
    }

    #[test]
    fn timeouts_are_positive_seconds() {
        assert_eq!(parse_seconds("1.5").unwrap(), Duration::from_millis(1500));
        for bad in ["0", "-1", "x", "inf", "NaN"] {
            assert!(parse_seconds(bad).is_err(), "{bad}");
        }
    }
}
