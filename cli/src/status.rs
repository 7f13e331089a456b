//! `shmbroker status --socket PATH [--json] [--watch [SECS]]`: what a running job's ranks are
//! doing, asked of its broker (see `shmbroker::status`).

use shmbroker::status::{Activity, FILL_UNKNOWN, RankState, StatusReport, now, seconds_text};
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `shmbroker status`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = AFTER_HELP)]
pub struct Args {
    /// The broker's socket: a `serve` socket, or the `SHMBROKER_SOCKET` a `run` gave its copies.
    #[arg(long, value_name = "PATH", env = "SHMBROKER_SOCKET")]
    socket: PathBuf,
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
Columns: each rank's pid; its state (running, left, dead, never joined); the call it is in and for
how long (a split session shows both halves), and the rank it waits for once it has waited long
enough to park; the last call it finished and how long ago; messages waiting in its rings to each
peer (only rings that are not empty: ->PEER:COUNT); bytes of its outbox in use.

What a rank is doing is what it published in its own outbox: a rank that publishes garbage is
shown as 'unreadable', and SHMBROKER_STATUS=0 turns publishing off. Only the broker's uid and
the uids it admits may ask. The broker answers at once, whatever the job is doing.

--json fields: job, rank, pid, state, call, seconds, waiting_for, calls, last_call,
last_seconds_ago, outbox_bytes, outbox_used, ring_fill (per peer, null where there is no ring)
and readable. Times are seconds; a field that is not known is null.";

/// Runs `shmbroker status`.
///
/// # Errors
///
/// Why the broker could not be asked.
pub fn run(args: &Args) -> Result<(), String> {
    let terminal = std::io::stdout().is_terminal();
    loop {
        let report = ask(&args.socket, args.timeout)?;
        let text = if args.json {
            json_lines(&report)
        } else {
            table(&report)
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

/// Asks the broker at `socket`, with the error as text.
///
/// # Errors
///
/// Why the broker could not be asked.
pub fn ask(socket: &Path, timeout: Duration) -> Result<StatusReport, String> {
    shmbroker::status::query(socket, timeout)
        .map_err(|error| format!("asking the broker at {}: {error}", socket.display()))
}

/// The job's id as text: `0x…`, or `-` when none was given.
fn job_text(report: &StatusReport) -> String {
    match report.header.job_id {
        0 => "-".into(),
        id => format!("{id:#x}"),
    }
}

/// The table `shmbroker status` prints.
#[must_use]
pub fn table(report: &StatusReport) -> String {
    let header = &report.header;
    let now = now();
    let mut text = format!(
        "broker pid {}, job {} ({} ended before it), {} ranks, rings of {} slots",
        header.broker_pid,
        job_text(report),
        header.jobs_ended,
        header.world_size,
        header.ring_capacity
    );
    let first = |rank: u32, what| (rank != u32::MAX).then(|| format!(", rank {rank} {what} first"));
    text.extend(first(header.first_dead, "died"));
    text.extend(first(header.first_left, "left"));
    text.push('\n');
    let mut rows = vec![
        [
            "RANK",
            "PID",
            "STATE",
            "CALL",
            "FOR",
            "WAITING FOR",
            "LAST CALL",
            "RINGS",
            "OUTBOX",
        ]
        .map(String::from),
    ];
    for record in &report.ranks {
        let state = StatusReport::state(record);
        let pid = if state == RankState::NeverJoined {
            "-".into()
        } else {
            record.pid.to_string()
        };
        let mut row = [
            record.rank.to_string(),
            pid,
            state.name().into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            rings_text(
                record
                    .ring_fill
                    .get(..header.world_size as usize)
                    .unwrap_or(&[]),
            ),
            "-".into(),
        ];
        if record.outbox_bytes != 0 {
            match Activity::read(&record.status, now) {
                None => row[3] = "unreadable".into(),
                Some(activity) => {
                    if !activity.calls.is_empty() {
                        let calls: Vec<String> = activity.calls.iter().map(|c| c.text()).collect();
                        row[3] = calls.join(" + ");
                        let ages: Vec<String> = activity
                            .calls
                            .iter()
                            .map(|c| c.age.map_or("?".into(), seconds_text))
                            .collect();
                        row[4] = ages.join(" + ");
                        let waits: Vec<String> = activity
                            .calls
                            .iter()
                            .filter_map(|c| c.waiting_for.map(|r| format!("rank {r}")))
                            .collect();
                        if !waits.is_empty() {
                            row[5] = waits.join(", ");
                        }
                    }
                    if let Some(last) = &activity.last {
                        row[6] = match last.age {
                            Some(age) => format!("{}, {} ago", last.text(), seconds_text(age)),
                            None => last.text(),
                        };
                    }
                    row[8] = format!(
                        "{} / {}",
                        bytes_text(activity.outbox_used),
                        bytes_text(record.outbox_bytes)
                    );
                }
            }
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|column| rows.iter().map(|row| row[column].len()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            let _ = write!(line, "{cell:width$}  ");
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// The rings that are not empty: `->1:3 ->2:1024`, or `-`.
fn rings_text(fill: &[u32]) -> String {
    let waiting: Vec<String> = (0..)
        .zip(fill)
        .filter(|&(_, &n)| n != 0 && n != FILL_UNKNOWN)
        .map(|(peer, n)| format!("->{peer}:{n}"))
        .collect();
    if waiting.is_empty() {
        "-".into()
    } else {
        waiting.join(" ")
    }
}

/// `bytes` in B, KiB, MiB or GiB.
fn bytes_text(bytes: u64) -> String {
    let units = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in units {
        if bytes >= size {
            return format!("{:.1} {unit}", bytes as f64 / size as f64);
        }
    }
    format!("{bytes} B")
}

/// `shmbroker status --json`: one object per rank, one per line.
#[must_use]
pub fn json_lines(report: &StatusReport) -> String {
    let now = now();
    let world = report.header.world_size as usize;
    let mut text = String::new();
    let null = || "null".to_string();
    let string = |s: &str| format!("\"{}\"", s.escape_default());
    let seconds =
        |age: Option<Duration>| age.map_or_else(null, |a| format!("{:.3}", a.as_secs_f64()));
    for record in &report.ranks {
        let state = StatusReport::state(record);
        let activity = (record.outbox_bytes != 0)
            .then(|| Activity::read(&record.status, now))
            .flatten();
        let unreadable = record.outbox_bytes != 0 && activity.is_none();
        let activity = activity.unwrap_or_default();
        let first = activity.calls.first();
        let calls: Vec<String> = activity.calls.iter().map(|c| string(&c.text())).collect();
        let fill: Vec<String> = record.ring_fill[..world.min(record.ring_fill.len())]
            .iter()
            .map(|&n| {
                if n == FILL_UNKNOWN {
                    null()
                } else {
                    n.to_string()
                }
            })
            .collect();
        let job = match report.header.job_id {
            0 => null(),
            id => string(&format!("{id:#x}")),
        };
        let _ = writeln!(
            text,
            "{{\"job\":{job},\"rank\":{},\"pid\":{},\"state\":{},\"call\":{},\"seconds\":{},\
             \"waiting_for\":{},\"calls\":[{}],\"last_call\":{},\"last_seconds_ago\":{},\
             \"outbox_bytes\":{},\"outbox_used\":{},\"ring_fill\":[{}],\"readable\":{}}}",
            record.rank,
            if state == RankState::NeverJoined {
                null()
            } else {
                record.pid.to_string()
            },
            string(state.name()),
            first.map_or_else(null, |c| string(&c.text())),
            seconds(first.and_then(|c| c.age)),
            activity
                .calls
                .iter()
                .find_map(|c| c.waiting_for)
                .map_or_else(null, |r| r.to_string()),
            calls.join(","),
            activity
                .last
                .as_ref()
                .map_or_else(null, |c| string(&c.text())),
            seconds(activity.last.as_ref().and_then(|c| c.age)),
            record.outbox_bytes,
            activity.outbox_used,
            fill.join(","),
            !unreadable,
        );
    }
    text
}
