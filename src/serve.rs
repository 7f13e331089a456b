//! `shmbroker serve`: a broker in the foreground until SIGINT or SIGTERM.

use crate::args::Args;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
use shmbroker::handshake::{Config, Event, Listener};
use std::time::Duration;

pub const USAGE: &str = "\
shmbroker serve --socket PATH --workers N [--ring-capacity SLOTS]
                [--logon-timeout-ms MS] [--allow-uid UID]...
    Run a broker on PATH (mode 0600) for a world of N workers until SIGINT or SIGTERM, then
    remove the socket file. Workers of another uid are refused unless allowed.";

/// Parses the options shared by `serve` and the demo's embedded broker.
pub fn config_from(args: &mut Args) -> Result<Config, String> {
    let defaults = Config::default();
    let mut allowed_uids = Vec::new();
    while let Some(uid) = args.value::<u32>("--allow-uid")? {
        allowed_uids.push(uid);
    }
    Ok(Config {
        world_size: args.value("--workers")?.unwrap_or(defaults.world_size),
        ring_capacity: args
            .value("--ring-capacity")?
            .unwrap_or(defaults.ring_capacity),
        logon_timeout: args
            .value::<u64>("--logon-timeout-ms")?
            .map_or(defaults.logon_timeout, Duration::from_millis),
        allowed_uids,
        ..defaults
    })
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
            rings_closed,
        } => format!("rank {rank} (pid {pid}) left; closed its {rings_closed} rings"),
        Event::WorkerLeft {
            rank,
            pid,
            clean: false,
            rings_closed,
        } => format!(
            "rank {rank} (pid {pid}) died; closed all {rings_closed} rings: the session is over"
        ),
        Event::BadNotice { rank, detail } => format!("rank {rank} sent a bad notice: {detail}"),
        Event::Stopped => "stopping".into(),
    }
}

pub fn run(rest: &[String]) -> Result<(), String> {
    let mut args = Args::new(rest);
    let socket = args
        .value::<String>("--socket")?
        .ok_or_else(|| format!("serve needs --socket\n{USAGE}"))?;
    let config = config_from(&mut args)?;
    args.finish()?;

    // Block the stop signals here, before any thread exists, so every thread inherits the mask
    // and only the waiter below receives them.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&signals), None)
        .map_err(|e| format!("blocking signals: {e}"))?;

    let mut listener = Listener::bind(&socket, config.clone()).map_err(|e| e.to_string())?;
    println!(
        "broker listening on {socket}: {} ranks, rings of {} slots",
        config.world_size, config.ring_capacity
    );
    let stop = listener.stop_handle();
    std::thread::spawn(move || {
        if let Ok(signal) = signals.wait() {
            eprintln!("broker: {signal}, shutting down");
        }
        stop.stop();
    });
    listener
        .serve(|event| println!("broker: {}", describe(event)))
        .map_err(|e| e.to_string())?;
    drop(listener);
    println!("broker: socket {socket} removed");
    Ok(())
}
