//! `shmbroker serve`: a broker in the foreground, job after job, until SIGINT or SIGTERM.

use crate::args::Args;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
use shmbroker::handshake::{Config, Event, Listener};
use std::io::Write;
use std::time::Duration;

pub const USAGE: &str = "\
shmbroker serve --socket PATH --workers N [--once] [--ring-capacity SLOTS]
                [--logon-timeout-ms MS] [--allow-uid UID]... [--socket-mode OCTAL]
                [--group NAME|GID] [--max-pending N] [--max-pending-per-uid N]
    Run a broker on PATH for jobs of N workers (N may come from SHMBROKER_WORLD_SIZE instead),
    job after job, until SIGINT or SIGTERM; then remove the socket file.

    A job starts when its first worker logs on. Once any worker has left or died, the job is
    winding down and logons are refused (a late rank would wait for a peer that is gone); once
    every worker that logged on is gone, the broker forgets the job and takes the next one on the
    same socket. --once exits after the first job instead.

    Access: the socket is mode 0600 and only the broker's uid may log on. To let other uids in,
    name each with --allow-uid and open the socket to them: --group GROUP --socket-mode 0660
    (the uids must be in GROUP), or --socket-mode 0666.

    Limits: at most --max-pending connections logging on at once (256), and
    --max-pending-per-uid from one uid (64); past either, the oldest connection that has sent
    nothing makes room. The broker raises its fd limit to the hard limit and refuses to start
    (exit code 1) if a job of N workers could not fit in it.

    Logs go to standard error through `tracing`, never blocking the broker (lines it cannot write
    in time are dropped and counted); RUST_LOG or SHMBROKER_LOG sets the level (info).";

/// The variable `--workers` falls back on.
const WORKERS_VAR: &str = "SHMBROKER_WORLD_SIZE";

/// Parses the options shared by `serve` and the demo's embedded broker.
pub fn config_from(args: &mut Args) -> Result<Config, String> {
    let defaults = Config::default();
    let mut allowed_uids = Vec::new();
    while let Some(uid) = args.value::<u32>("--allow-uid")? {
        allowed_uids.push(uid);
    }
    let socket_mode = match args.value::<String>("--socket-mode")? {
        None => defaults.socket_mode,
        Some(text) => u32::from_str_radix(text.trim_start_matches("0o"), 8)
            .ok()
            .filter(|mode| mode & !0o777 == 0)
            .ok_or_else(|| {
                format!("--socket-mode: expected octal permission bits, not {text:?}")
            })?,
    };
    let socket_group = args
        .value::<String>("--group")?
        .map(|group| resolve_group(&group))
        .transpose()?;
    Ok(Config {
        world_size: args.value("--workers")?.unwrap_or(defaults.world_size),
        ring_capacity: args
            .value("--ring-capacity")?
            .unwrap_or(defaults.ring_capacity),
        logon_timeout: args
            .value::<u64>("--logon-timeout-ms")?
            .map_or(defaults.logon_timeout, Duration::from_millis),
        allowed_uids,
        max_pending: args.value("--max-pending")?.unwrap_or(defaults.max_pending),
        max_pending_per_uid: args
            .value("--max-pending-per-uid")?
            .unwrap_or(defaults.max_pending_per_uid),
        socket_mode,
        socket_group,
    })
}

/// A group name or number.
fn resolve_group(group: &str) -> Result<u32, String> {
    if let Ok(gid) = group.parse() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(found)) => Ok(found.gid.as_raw()),
        Ok(None) => Err(format!("--group: no group named {group:?}")),
        Err(e) => Err(format!("--group: looking up {group:?}: {e}")),
    }
}

pub fn describe(event: &Event) -> String {
    match event {
        Event::LoggedOn { rank, pid, uid } => {
            format!("rank {rank} logged on (pid {pid}, uid {uid})")
        }
        Event::Rejected {
            reason,
            pid,
            detail,
        } => match pid {
            Some(pid) => format!("refused pid {pid} ({reason:?}): {detail}"),
            None => format!("refused a connection ({reason:?}): {detail}"),
        },
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

pub fn run(rest: &[String]) -> Result<(), String> {
    let mut args = Args::new(rest);
    if args.flag("--help") || args.flag("-h") {
        println!("{USAGE}");
        return Ok(());
    }
    let socket = args
        .value::<String>("--socket")?
        .ok_or_else(|| format!("serve needs --socket\n\n{USAGE}"))?;
    let once = args.flag("--once");
    let workers_given = rest.iter().any(|arg| arg == "--workers");
    let mut config = config_from(&mut args)?;
    args.finish()?;
    if !workers_given {
        let from_env = std::env::var(WORKERS_VAR).map_err(|_| {
            format!("serve needs --workers N (or {WORKERS_VAR} in the environment)\n\n{USAGE}")
        })?;
        config.world_size = from_env
            .trim()
            .parse()
            .map_err(|_| format!("{WORKERS_VAR} must be a number of workers, not {from_env:?}"))?;
    }
    // Block the stop signals here, before any thread exists (the log writer's included), so
    // every thread inherits the mask and only the waiter below receives them.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&signals), None)
        .map_err(|e| format!("blocking signals: {e}"))?;
    crate::logging::init(tracing_subscriber::filter::LevelFilter::INFO)?;

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
