//! Who is where, read back: what a rank's status words say it is doing, and
//! [`query`], which asks a running broker for every rank of its job (`shmbroker status`).
//!
//! Each rank publishes its calls in its outbox's status words (see "Who is where" in the
//! [`Session`](crate::Session) docs and `shmbroker_bindings::status_word`). The words are
//! whatever that rank wrote: [`Activity::read`] believes a name only if it is an ASCII word and a
//! time only if it is not in the future, and reads anything else as unreadable.

use shmbroker_allocator::Snapshot;
use shmbroker_bindings::{STATUS_SLOTS, status_word as w};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

pub use shmbroker_bindings::{FILL_UNKNOWN, RankState, RankStatus, StatusReplyHeader};
pub use shmbroker_handshake::wire::StatusReport;

/// The slot receives publish in (slot 0 holds everything else).
pub(crate) const RECEIVE_SLOT: usize = 1;

/// No sequence number, group, peer or rank, in a status word.
pub(crate) const NONE: u64 = u64::MAX;

/// Asks the broker listening at `path` what every rank of its job is doing, within `timeout`.
/// Only the broker's uid and the uids it admits may ask; the broker answers at once, without
/// waiting for anything a rank does.
///
/// # Errors
///
/// What connecting or the answer failed on: no broker there, a refusal, a cut answer.
pub fn query(
    path: impl AsRef<Path>,
    timeout: Duration,
) -> Result<StatusReport, shmbroker_handshake::Error> {
    shmbroker_handshake::status(path, timeout)
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds, the clock status words are stamped with: the same in
/// every process and PID namespace of a machine.
#[must_use]
pub fn now() -> u64 {
    shmbroker_handshake::clock::read()
}

/// A call named in a rank's status words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// Its name: `barrier`, `recv`, `all_reduce` (cut at 16 bytes).
    pub name: String,
    /// A collective's number in its group.
    pub seq: Option<u64>,
    /// A collective's group (its stream number; 0 is the whole world).
    pub group: Option<u32>,
    /// A point-to-point call's peer.
    pub peer: Option<u32>,
    /// Whether it is a receive (published in the receive slot).
    pub receive: bool,
    /// How long it has been going on (for the last call: since it finished), when known.
    pub age: Option<Duration>,
    /// Whom it waits for, once it has had to wait (for a message, an acknowledgement or room
    /// in a ring).
    pub waiting_for: Option<u32>,
    /// For the last call, when a collective: whether it failed after taking its number (rather
    /// than returning its result).
    pub failed: bool,
    /// For a call that failed: the rank its error named, if it named one.
    pub failed_naming: Option<u32>,
}

impl Call {
    /// As the diagnosis names it: `all_reduce #11 (group 2)`, `recv from rank 1`.
    #[must_use]
    pub fn text(&self) -> String {
        let mut text = self.name.clone();
        if let Some(seq) = self.seq {
            text.push_str(&format!(" #{seq}"));
        }
        if let Some(peer) = self.peer {
            let direction = if self.receive { "from" } else { "to" };
            text.push_str(&format!(" {direction} rank {peer}"));
        } else if let Some(group) = self.group.filter(|&group| group != 0) {
            text.push_str(&format!(" (group {group})"));
        }
        text
    }
}

/// What a rank's status words say it is doing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Activity {
    /// The calls it is in: none, one, or two (a split session's sending and receiving halves).
    pub calls: Vec<Call>,
    /// The last call it finished, with how long ago in [`Call::age`].
    pub last: Option<Call>,
    /// Bytes of its outbox in blocks (sent and not given back, loaned, being filled).
    pub outbox_used: u64,
    /// How long ago its watcher thread last ran (it runs every
    /// [`TICK`](shmbroker_handshake::clock::TICK) while the process runs), when it has said: for
    /// a stopped process, about how long it has been stopped.
    pub last_ran: Option<Duration>,
}

impl Activity {
    /// Reads `status` (a copy of a rank's status words) at `now` ([`now`]), or `None` when the
    /// words hold something no rank of this library writes (a name that is not an ASCII word,
    /// a time in the future).
    #[must_use]
    pub fn read(status: &Snapshot, now: u64) -> Option<Self> {
        let mut activity = Self {
            outbox_used: status[0][w::OUTBOX_USED],
            // A time in the future says nothing, and makes nothing else unreadable.
            last_ran: age(status[w::ALIVE_SLOT][w::ALIVE], now).flatten(),
            ..Self::default()
        };
        let mut last_done = 0;
        for (slot, words) in status.iter().enumerate().take(STATUS_SLOTS) {
            let receive = slot == RECEIVE_SLOT;
            if words[w::CALL] != 0 || words[w::CALL + 1] != 0 {
                let mut call = call(words, w::CALL, w::SEQ, w::GROUP_PEER, receive)?;
                call.age = age(words[w::SINCE], now)?;
                let waiting = words[w::WAITING_FOR];
                call.waiting_for = u32::try_from(waiting).ok().filter(|_| waiting != NONE);
                activity.calls.push(call);
            }
            if words[w::LAST_CALL] != 0 || words[w::LAST_CALL + 1] != 0 {
                let mut last = call(
                    words,
                    w::LAST_CALL,
                    w::LAST_SEQ,
                    w::LAST_GROUP_PEER,
                    receive,
                )?;
                let done = words[w::LAST_DONE];
                last.age = age(done, now)?;
                // The last collective that failed (slot 0 only) is this one: the same first
                // number and group.
                let record = failed_record(words).filter(|r| {
                    !receive && last.seq == Some(r.seq) && last.group == Some(r.stream)
                });
                last.failed = record.is_some();
                last.failed_naming = record.and_then(|record| record.named);
                if activity.last.is_none() || done > last_done {
                    (activity.last, last_done) = (Some(last), done);
                }
            }
        }
        Some(activity)
    }
}

/// A rank's record of the last collective it failed (see `status_word::FAILED_SEQ`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FailedRecord {
    /// The collective's first number.
    pub seq: u64,
    /// Its group's stream (0: the world).
    pub stream: u32,
    /// The rank its error named, the rank's word (`None`: it named none).
    pub named: Option<u32>,
}

/// The failed-collective record in a rank's slot-0 status `words`, if they hold one (its bit,
/// `status_word::FAILED_RECORD`, set: zeroed or half-written words record nothing).
pub(crate) fn failed_record(words: &[u64]) -> Option<FailedRecord> {
    let stream_named = words[w::FAILED_STREAM_NAMED];
    (stream_named & w::FAILED_RECORD != 0).then(|| FailedRecord {
        seq: words[w::FAILED_SEQ],
        stream: (stream_named >> 32) as u32 & 0x7fff_ffff,
        named: Some(stream_named as u32).filter(|&rank| rank != u32::MAX),
    })
}

/// The call named at `name`, `seq`, `group_peer` of `words`, if its name is an ASCII word.
fn call(words: &[u64], name: usize, seq: usize, group_peer: usize, receive: bool) -> Option<Call> {
    let name = name_of(words[name], words[name + 1])?;
    let seq = Some(words[seq]).filter(|&seq| seq != NONE);
    let group_peer = words[group_peer];
    let (mut group, mut peer) = (None, None);
    if group_peer != NONE {
        let (low, high) = (group_peer as u32, (group_peer >> 32) as u32);
        if high == u32::MAX {
            group = Some(low);
        } else {
            peer = Some(high);
        }
    }
    Some(Call {
        name,
        seq,
        group,
        peer,
        receive,
        age: None,
        waiting_for: None,
        failed: false,
        failed_naming: None,
    })
}

/// How long ago coarse-clock time `then` was at `now`: `Some(None)` for 0 (never stamped: no
/// watcher had ticked the coarse clock yet, as in a world of one), `None` for a time in the
/// future (more than a second: the clock is coarse).
#[allow(clippy::option_option)]
fn age(then: u64, now: u64) -> Option<Option<Duration>> {
    if then == 0 {
        return Some(None);
    }
    (then <= now.saturating_add(1_000_000_000))
        .then(|| Some(Duration::from_nanos(now.saturating_sub(then))))
}

/// The name two words hold, if it is one (lowercase ASCII letters, digits and `_`).
pub(crate) fn name_of(first: u64, second: u64) -> Option<String> {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&first.to_le_bytes());
    bytes[8..].copy_from_slice(&second.to_le_bytes());
    let len = bytes.iter().position(|&b| b == 0).unwrap_or(16);
    let name = &bytes[..len];
    let word = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_';
    (!name.is_empty() && name.iter().all(word) && bytes[len..].iter().all(|&b| b == 0))
        .then(|| String::from_utf8_lossy(name).into_owned())
}

/// `duration` as the diagnosis writes it: `3.1 s`, `850 ms`.
#[must_use]
pub fn seconds_text(duration: Duration) -> String {
    if duration >= Duration::from_secs(1) {
        format!("{:.1} s", duration.as_secs_f64())
    } else {
        format!("{} ms", duration.as_millis())
    }
}

/// What rank `rank`'s status words say it is doing, at `now` ([`now`]):
/// `rank R is in <call> for <time>` (one clause per call, with whom it waits for when it said
/// so), or `rank R is in no call (its last, <call>, finished <time> ago)` (`failed <time> ago
/// naming rank Q` for a collective that failed), or `rank R has published an unreadable state`.
#[must_use]
pub fn describe(rank: u32, status: &Snapshot, now: u64) -> String {
    let Some(activity) = Activity::read(status, now) else {
        return format!("rank {rank} has published an unreadable state");
    };
    if !activity.calls.is_empty() {
        let calls: Vec<String> = activity
            .calls
            .iter()
            .map(|call| {
                let mut text = call.text();
                if let Some(age) = call.age {
                    text.push_str(&format!(" for {}", seconds_text(age)));
                }
                if let Some(waiting) = call.waiting_for {
                    text.push_str(&format!(", waiting for rank {waiting}"));
                }
                text
            })
            .collect();
        return format!("rank {rank} is in {}", calls.join(" and in "));
    }
    match activity.last {
        Some(last) => {
            let ended = if last.failed { "failed" } else { "finished" };
            let when = last
                .age
                .map(|age| format!(" {} ago", seconds_text(age)))
                .unwrap_or_default();
            let naming = last
                .failed_naming
                .map(|named| format!(" naming rank {named}"))
                .unwrap_or_default();
            if last.age.is_none() && !last.failed {
                format!("rank {rank} is in no call (its last, {})", last.text())
            } else {
                format!(
                    "rank {rank} is in no call (its last, {}, {ended}{when}{naming})",
                    last.text()
                )
            }
        }
        None => format!("rank {rank} is in no call (it has finished none yet)"),
    }
}

/// [`describe`] for a rank whose process is stopped: `rank R is stopped (it has not run for
/// <time>): it was in <call> ...`, with what its status words said when it stopped.
#[must_use]
pub fn describe_stopped(rank: u32, status: &Snapshot, now: u64) -> String {
    let ran = Activity::read(status, now)
        .and_then(|activity| activity.last_ran)
        .map(|ago| format!(" (it has not run for {})", seconds_text(ago)))
        .unwrap_or_default();
    let said = describe(rank, status, now);
    let was = said
        .strip_prefix(&format!("rank {rank} is "))
        .map_or(said.clone(), |rest| format!("it was {rest}"));
    format!("rank {rank} is stopped{ran}: {was}")
}

/// `stopped` and, when known, for how long (`stopped 2.1 s`), for a stopped rank's state cell.
fn stopped_cell(activity: Option<&Activity>) -> String {
    match activity.and_then(|activity| activity.last_ran) {
        Some(ago) => format!("stopped {}", seconds_text(ago)),
        None => "stopped".into(),
    }
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
        let activity = (record.outbox_bytes != 0)
            .then(|| Activity::read(&record.status, now))
            .flatten();
        let state_cell = match state {
            RankState::Stopped => stopped_cell(activity.as_ref()),
            other => other.name().into(),
        };
        let mut row = [
            record.rank.to_string(),
            pid,
            state_cell,
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
            match activity {
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
                        if last.failed {
                            row[6].push_str(", failed");
                        }
                        if let Some(named) = last.failed_naming {
                            row[6].push_str(&format!(" naming rank {named}"));
                        }
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
        let stopped_seconds = if state == RankState::Stopped {
            seconds(activity.last_ran)
        } else {
            null()
        };
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
             \"last_failed\":{},\"last_failed_naming\":{},\"stopped_seconds\":{},\
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
            activity
                .last
                .as_ref()
                .map_or_else(null, |c| c.failed.to_string()),
            activity
                .last
                .as_ref()
                .and_then(|c| c.failed_naming)
                .map_or_else(null, |r| r.to_string()),
            stopped_seconds,
            record.outbox_bytes,
            activity.outbox_used,
            fill.join(","),
            !unreadable,
        );
    }
    text
}
