//! `shmbroker serve`: a broker in the foreground, job after job, until SIGINT or SIGTERM.

use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
use shmbroker::handshake::{Config, Event, Listener};
use std::io::Write;
use std::time::Duration;

/// `shmbroker serve`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = AFTER_HELP)]
pub struct Args {
    /// The socket to listen on (created; removed again on the way out).
    #[arg(long, value_name = "PATH")]
    socket: String,
    /// Workers in each job.
    #[arg(long, value_name = "N", env = "SHMBROKER_WORLD_SIZE", value_parser = clap::value_parser!(u32).range(1..))]
    workers: u32,
    /// Exit after the first job instead of taking the next one.
    #[arg(long)]
    once: bool,
    /// Slots in each ring.
    #[arg(long, value_name = "SLOTS", default_value_t = Config::default().ring_capacity)]
    ring_capacity: u32,
    /// How long a connection may take to send its logon frame.
    #[arg(long, value_name = "MS", default_value_t = millis(Config::default().logon_timeout))]
    logon_timeout_ms: u64,
    /// Another uid that may log on (repeat for several); only the broker's own uid may otherwise.
    #[arg(long, value_name = "UID")]
    allow_uid: Vec<u32>,
    /// The socket file's permission bits, in octal.
    #[arg(long, value_name = "OCTAL", default_value = "0600", value_parser = parse_mode)]
    socket_mode: u32,
    /// The socket file's group: a name or a number.
    #[arg(long, value_name = "NAME|GID", value_parser = resolve_group)]
    group: Option<u32>,
    /// Connections logging on at once, at most; past it the oldest silent one makes room.
    #[arg(long, value_name = "N", default_value_t = Config::default().max_pending)]
    max_pending: usize,
    /// Connections logging on at once from one uid, at most.
    #[arg(long, value_name = "N", default_value_t = Config::default().max_pending_per_uid)]
    max_pending_per_uid: usize,
}

const AFTER_HELP: &str = "\
A job starts when its first worker logs on. Every worker of a job names the same job id
(SHMBROKER_JOB), or none does. Once a worker has died or left, the job goes on and admits, while
some worker is still there, only a replacement for a rank that died or a rank that had not
logged on yet, each naming the job's id (a job whose workers named none admits neither), one
replacement per death and a bounded number per rank. A rank still there, one that left, and a
logon of another job are refused. Once every worker that logged on is gone, the broker forgets
the job and takes the next one on the same socket.

Access: the socket is mode 0600 and only the broker's uid may log on. To let other uids in, name
each with --allow-uid and open the socket to them: --group GROUP --socket-mode 0660 (the uids
must be in GROUP), or --socket-mode 0666.

Limits: past --max-pending or --max-pending-per-uid, the oldest connection that has sent nothing
makes room. The broker raises its fd limit to the hard limit and refuses to start (exit code 1)
if a job of N workers could not fit in it.

Logs go to standard error through `tracing`, never blocking the broker (lines it cannot write in
time are dropped and counted); RUST_LOG or SHMBROKER_LOG sets the level (info).";

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Octal permission bits, with or without a leading `0o`.
fn parse_mode(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text.trim_start_matches("0o"), 8)
        .ok()
        .filter(|mode| mode & !0o777 == 0)
        .ok_or_else(|| format!("expected octal permission bits such as 0660, not {text:?}"))
}

impl Args {
    fn config(&self) -> Config {
        Config {
            world_size: self.workers,
            ring_capacity: self.ring_capacity,
            logon_timeout: Duration::from_millis(self.logon_timeout_ms),
            allowed_uids: self.allow_uid.clone(),
            max_pending: self.max_pending,
            max_pending_per_uid: self.max_pending_per_uid,
            socket_mode: self.socket_mode,
            socket_group: self.group,
        }
    }
}

/// A group name or number.
fn resolve_group(group: &str) -> Result<u32, String> {
    if let Ok(gid) = group.parse() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(found)) => Ok(found.gid.as_raw()),
        Ok(None) => Err(format!("no group named {group:?}")),
        Err(e) => Err(format!("looking up {group:?}: {e}")),
    }
}

pub fn describe(event: &Event) -> String {
    match event {
        Event::LoggedOn {
            rank,
            pid,
            uid,
            rejoins: 0,
        } => format!("rank {rank} logged on (pid {pid}, uid {uid})"),
        Event::LoggedOn {
            rank,
            pid,
            uid,
            rejoins,
        } => format!(
            "rank {rank} rejoined (pid {pid}, uid {uid}) in place of its process that died \
             (replacement {rejoins})"
        ),
        Event::Rejected {
            reason,
            pid,
            detail,
        } => match pid {
            Some(pid) => format!("refused pid {pid} ({reason:?}): {detail}"),
            None => format!("refused a connection ({reason:?}): {detail}"),
        },
        Event::Leaving { rank } => format!("rank {rank} said goodbye"),
        Event::WorkerLeft {
            rank,
            pid,
            clean: true,
        } => format!("rank {rank} (pid {pid}) left"),
        Event::WorkerLeft {
            rank,
            pid,
            clean: false,
        } => format!("rank {rank} (pid {pid}) died: the job is over"),
        Event::JobEnded { job, workers, lost } => match lost {
            Some(rank) => format!("job {job} ended ({workers} workers; rank {rank} died)"),
            None => format!("job {job} ended ({workers} workers)"),
        },
        Event::BadNotice {
            rank,
            detail,
            suppressed: 0,
        } => format!("rank {rank} sent a bad notice: {detail}"),
        Event::BadNotice {
            rank,
            detail,
            suppressed,
        } => format!("rank {rank} sent a bad notice: {detail} ({suppressed} more suppressed)"),
        Event::Stopped => "stopping".into(),
    }
}

pub fn run(args: Args, log_format: crate::logging::Format) -> Result<(), String> {
    let config = args.config();
    let (socket, once) = (args.socket, args.once);
    // Block the stop signals here, before any thread exists (the log writer's included), so
    // every thread inherits the mask and only the waiter below receives them.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&signals), None)
        .map_err(|e| format!("blocking signals: {e}"))?;
    crate::logging::init(tracing_subscriber::filter::LevelFilter::INFO, log_format)?;

    let mut listener = Listener::bind(&socket, config.clone()).map_err(|e| e.to_string())?;
    // Not println!: a closed standard output must not take the broker down.
    let _ = writeln!(
        std::io::stdout(),
        "broker listening on {socket} (mode {:04o}): jobs of {} ranks, rings of {} slots{}",
        config.socket_mode,
        config.world_size,
        config.ring_capacity,
        if once { ", one job" } else { "" }
    );
    let stop = listener.stop_handle();
    std::thread::spawn(move || {
        if let Ok(signal) = signals.wait() {
            tracing::info!(%signal, "shutting down");
        }
        stop.stop();
    });
    let stop = listener.stop_handle();
    listener
        .serve(|event| {
            if once && matches!(event, Event::JobEnded { .. }) {
                stop.stop();
            }
        })
        .map_err(|e| e.to_string())?;
    drop(listener);
    tracing::info!(socket, "socket removed");
    crate::logging::drain(Duration::from_millis(500));
    Ok(())
}
