//! `shmbroker status [--socket PATH | --pid LAUNCHER] [--json] [--watch [SECS]]`: what a
//! running job's ranks are doing, asked of its broker (see `shmbroker::status`); with neither,
//! every job of this user that a launcher hosts.

use shmbroker::status::{StatusReport, json_lines, table};
use std::io::{IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `shmbroker status`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = AFTER_HELP)]
pub struct Args {
    /// The broker's socket: a `serve` socket, or the `SHMBROKER_SOCKET` a `run` gave its copies.
    #[arg(long, value_name = "PATH", env = "SHMBROKER_SOCKET")]
    socket: Option<PathBuf>,
    /// The pid of a `shmbroker run` launcher: ask its job's broker (its socket is found in the
    /// launcher's temp directory).
    #[arg(long, value_name = "PID", conflicts_with = "socket")]
    pid: Option<u32>,
    /// One JSON object per rank, one per line, instead of the table.
    #[arg(long)]
    json: bool,
    /// Ask again every SECS seconds (1 if not given) until interrupted.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "1",
          value_parser = crate::run::parse_seconds)]
    watch: Option<Duration>,
    /// How long to wait for the broker's answer.
    #[arg(long, value_name = "SECS", default_value = "2", value_parser = crate::run::parse_seconds)]
    timeout: Duration,
}

const AFTER_HELP: &str = "\
Without --socket or --pid: every job of this user that answers, found where launchers put their
sockets (the shmbroker-run-* directories of `shmbroker run` under TMPDIR or /tmp, and
shmbroker-UID/*.sock under XDG_RUNTIME_DIR or the temp directory, for jobs under mpirun,
torchrun and srun), each under a line naming its socket.

Columns: each rank's pid; its state (running, stopped with how long since it last ran, left,
dead, never joined); the call it is in and for
how long (a split session shows both halves), and the rank it waits for once it has waited long
enough to park; the last call it finished and how long ago; messages waiting in its rings to each
peer (only rings that are not empty: ->PEER:COUNT); bytes of its outbox in use.

What a rank is doing is what it published in its own outbox: a rank that publishes garbage is
shown as 'unreadable', and SHMBROKER_STATUS=0 turns publishing off. Only the broker's uid and
the uids it admits may ask. The broker answers at once, whatever the job is doing.

--json fields: job, rank, pid, state, call, seconds, waiting_for, calls, last_call,
last_seconds_ago, last_failed, last_failed_naming (the rank a failed collective's error named),
stopped_seconds (a stopped rank's time since it last ran), outbox_bytes, outbox_used, ring_fill (per peer, null where there is no ring) and readable. Times are seconds; a field that is not known is null.";

/// Runs `shmbroker status`.
///
/// # Errors
///
/// Why the broker could not be asked.
pub fn run(args: &Args) -> Result<(), String> {
    let terminal = std::io::stdout().is_terminal();
    let socket = match (&args.socket, args.pid) {
        (_, Some(pid)) => Some(run_socket(pid)?),
        (Some(socket), None) => Some(socket.clone()),
        (None, None) => None,
    };
    loop {
        let text = match &socket {
            Some(socket) => {
                let report = ask(socket, args.timeout)?;
                if args.json {
                    json_lines(&report)
                } else {
                    table(&report)
                }
            }
            None => my_jobs(args)?,
        };
        let mut out = std::io::stdout().lock();
        if args.watch.is_some() && terminal && !args.json {
            // Home, then clear: the table redrawn in place.
            let _ = write!(out, "\x1b[H\x1b[2J");
        }
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
        drop(out);
        match args.watch {
            Some(every) => std::thread::sleep(every),
            None => return Ok(()),
        }
    }
}

/// Every job of this user that answers, each under a line naming its socket (see
/// `AFTER_HELP`).
///
/// # Errors
///
/// None found.
fn my_jobs(args: &Args) -> Result<String, String> {
    let uid = nix::unistd::geteuid().as_raw();
    let temp = std::env::var_os("TMPDIR")
        .filter(|dir| !dir.is_empty())
        .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute())
        .unwrap_or_else(std::env::temp_dir);
    let mine = |path: &Path| {
        std::fs::symlink_metadata(path)
            .is_ok_and(|meta| std::os::unix::fs::MetadataExt::uid(&meta) == uid)
    };
    let entries = |dir: &Path| -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|entries| entries.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        paths.sort();
        paths
    };
    let mut sockets: Vec<PathBuf> = entries(&temp)
        .into_iter()
        .filter(|dir| {
            dir.file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("shmbroker-run-"))
                && mine(dir)
        })
        .map(|dir| dir.join("broker.sock"))
        .collect();
    let private = runtime.join(format!("shmbroker-{uid}"));
    if mine(&private) {
        sockets.extend(
            entries(&private)
                .into_iter()
                .filter(|path| path.extension().is_some_and(|ext| ext == "sock")),
        );
    }
    let mut text = String::new();
    for socket in sockets.iter().filter(|socket| socket.exists()) {
        // A socket left by a job that ended answers nothing: it is no job.
        let Ok(report) = ask(socket, args.timeout) else {
            continue;
        };
        if args.json {
            text.push_str(&json_lines(&report));
        } else {
            text.push_str(&format!("{}:\n{}\n", socket.display(), table(&report)));
        }
    }
    if text.is_empty() {
        return Err(format!(
            "no job of this user answers in {} or {}; give --socket PATH or --pid LAUNCHER_PID",
            temp.display(),
            private.display()
        ));
    }
    Ok(text)
}

/// The socket of the job the `shmbroker run` of pid `pid` serves: `broker.sock` in its
/// `shmbroker-run-PID-N` directory, under the temp directory of its environment (`TMPDIR`, else
/// `/tmp`).
///
/// # Errors
///
/// No such launcher, or none that this user may look at.
fn run_socket(pid: u32) -> Result<PathBuf, String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ"))
        .map_err(|e| format!("reading the environment of pid {pid}: {e}"))?;
    let tmp = environ
        .split(|&b| b == 0)
        .find_map(|var| var.strip_prefix(b"TMPDIR="))
        .filter(|dir| !dir.is_empty())
        .map_or_else(
            || PathBuf::from("/tmp"),
            |dir| PathBuf::from(std::ffi::OsStr::from_bytes(dir)),
        );
    let prefix = format!("shmbroker-run-{pid}-");
    let found = std::fs::read_dir(&tmp)
        .map_err(|e| format!("reading {}: {e}", tmp.display()))?
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .map(|entry| entry.path().join("broker.sock"))
        .find(|socket| socket.exists());
    found.ok_or_else(|| {
        format!(
            "no job of a `shmbroker run` of pid {pid} in {} (is it one, and running?)",
            tmp.display()
        )
    })
}

/// Asks the broker at `socket`, with the error as text.
///
/// # Errors
///
/// Why the broker could not be asked.
pub fn ask(socket: &Path, timeout: Duration) -> Result<StatusReport, String> {
    shmbroker::status::query(socket, timeout)
        .map_err(|error| format!("asking the broker at {}: {error}", socket.display()))
}
