//! Who is where, read back: what a rank's status words say it is doing, and
//! [`query`], which asks a running broker for every rank of its job (`shmbroker status`).
//!
//! Each rank publishes its calls in its outbox's status words (see "Who is where" in the
//! [`Session`](crate::Session) docs and `shmbroker_bindings::status_word`). The words are
//! whatever that rank wrote: [`Activity::read`] believes a name only if it is an ASCII word and a
//! time only if it is not in the future, and reads anything else as unreadable.

use shmbroker_allocator::Snapshot;
use shmbroker_bindings::{STATUS_SLOTS, status_word as w};
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
    /// Whom it waits for, once it has waited long enough to park.
    pub waiting_for: Option<u32>,
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
}

impl Activity {
    /// Reads `status` (a copy of a rank's status words) at `now` ([`now`]), or `None` when the
    /// words hold something no rank of this library writes (a name that is not an ASCII word,
    /// a time in the future).
    #[must_use]
    pub fn read(status: &Snapshot, now: u64) -> Option<Self> {
        let mut activity = Self {
            outbox_used: status[0][w::OUTBOX_USED],
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
                if activity.last.is_none() || done > last_done {
                    (activity.last, last_done) = (Some(last), done);
                }
            }
        }
        Some(activity)
    }
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
/// so), or `rank R is in no call (its last, <call>, finished <time> ago)`, or `rank R has
/// published an unreadable state`.
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
        Some(last) => match last.age {
            None => format!("rank {rank} is in no call (its last, {})", last.text()),
            Some(age) => format!(
                "rank {rank} is in no call (its last, {}, finished {} ago)",
                last.text(),
                seconds_text(age)
            ),
        },
        None => format!("rank {rank} is in no call (it has finished none yet)"),
    }
}
