//! The session's state and the deadline every call runs under: what the session's modules
//! share. Nothing here imports them; they import it (see the module map in `session`).

use super::publisher::{Publisher, Seen};
use super::teams::{Team, rank_below};
use super::{engine, membership, numbers, teams};
use crate::error::Error;
use std::time::{Duration, Instant};

/// A worker's session: its rank, its links to every peer, and the collectives over them.
#[derive(Debug)]
pub struct Session {
    pub(super) inner: shmbroker_handshake::Connection,
    pub(super) timeout: Duration,
    /// The world's team and every group this rank is in, by stream (see `teams`).
    pub(super) groups: teams::Groups,
    /// Departures and rejoins as this session has taken them in (see `membership`).
    pub(super) membership: membership::Membership,
    /// The transport's state: links, outbox, waiting, buffers kept between calls (see `engine`).
    pub(super) engine: engine::Engine,
    /// What the calls number per peer, indexed by rank (see `numbers`).
    pub(super) numbers: Vec<numbers::PeerNumbers>,
    /// The broker this worker hosts (local rank 0 under a launcher). Last, so that it stops
    /// only after this session has said goodbye to it.
    pub(super) embedded: Option<EmbeddedBroker>,
}

/// A broker on a thread of this process, stopped and joined when dropped.
#[derive(Debug)]
pub(super) struct EmbeddedBroker {
    pub(super) stop: shmbroker_handshake::StopHandle,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for EmbeddedBroker {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One call's deadline. It starts when the call first has to wait past spinning: a receive hands
/// the ring its whole timeout and starts this deadline from the moment the ring started its own
/// clock ([`shmbroker_queues::Consumer::clock_started`]), so a call whose messages arrive while
/// it spins reads no clock at all; other waits read the clock when they begin.
///
/// `pub` in a private module, as [`Team`] is, so that the sealed `Communicator` trait can name
/// it: nothing outside this crate can.
#[derive(Debug)]
pub struct Deadline {
    pub(super) op: &'static str,
    pub(super) at: std::cell::Cell<Option<Instant>>,
    pub(super) timeout: Duration,
    /// A collective's: it needs every rank, so a death anywhere ends it (see "When a peer dies").
    pub(super) collective: bool,
    /// The stream of the team this call runs among, whose departures name its failures: a
    /// collective's (0: the world's), or the setup stream while making a group (see `groups`).
    /// A stream, not a copy of the team, which keeps a `Deadline` small: it is moved as a call
    /// is entered. [`Session::call_team`] finds the team.
    stream: std::cell::Cell<u32>,
    /// The interrupt count at the call's first look for an interrupt (see
    /// `Session::check_interrupted`).
    pub(super) interrupts_at: std::cell::Cell<Option<u64>>,
    /// Where the call is published and in which slot, when it is (see `status`).
    pub(super) published: Option<(std::ptr::NonNull<Publisher>, usize)>,
    /// With no deadline: when the wait started and when its watchdog next speaks (see
    /// `status::Session::watchdog`).
    pub(super) watch: std::cell::Cell<Option<(Instant, Duration)>>,
    /// A peer seen in another collective at this call's number, or as having failed this one:
    /// `(peer, what was seen, the number, when first seen)`, to be seen again a while later
    /// before the call fails (see `status::Session::look_for_mismatch`).
    pub(super) mismatch_seen: std::cell::Cell<Option<(u32, Seen, u64, Instant)>>,
    /// How the call ended, for its status words: `status::NONE` until [`Self::settle`] sees it
    /// fail (then the rank its error names, or `u32::MAX`).
    pub(super) failed: std::cell::Cell<u64>,
}

impl Deadline {
    pub(super) fn new(op: &'static str, timeout: Duration) -> Self {
        Self {
            op,
            at: std::cell::Cell::new(None),
            timeout,
            collective: false,
            stream: std::cell::Cell::new(0),
            interrupts_at: std::cell::Cell::new(None),
            published: None,
            watch: std::cell::Cell::new(None),
            mismatch_seen: std::cell::Cell::new(None),
            failed: std::cell::Cell::new(crate::status::NONE),
        }
    }

    /// `result`, the call's, noted for its status words when it is an error: the call has left
    /// its collective, and a peer waiting for it there fails at once, naming this rank and the
    /// rank this error names (see `status::Session::look_for_mismatch`). Every public collective
    /// (and `group`, `shrink`) returns through here; point-to-point calls do not (no peer waits
    /// for them in a collective). A call cut short by a panic counts as failed (see `Drop`).
    pub(super) fn settle<T>(&self, result: Result<T, Error>) -> Result<T, Error> {
        if let Err(error) = &result {
            self.failed.set(u64::from(error.rank().unwrap_or(u32::MAX)));
        }
        result
    }

    /// The same deadline, for a call that started when the interrupt count was `count`: an
    /// interrupt since then ends it, even one another call's look took first (a receive of a
    /// split session that was held up behind the other half, say).
    pub(super) fn noting_interrupts(self, count: u64) -> Self {
        self.interrupts_at.set(Some(count));
        self
    }

    /// The deadline of a collective among `team`: its waits also end when any rank dies.
    pub(super) fn collective(op: &'static str, timeout: Duration, team: &Team) -> Self {
        let mut deadline = Self::new(op, timeout);
        deadline.collective = true;
        deadline.stream = std::cell::Cell::new(team.stream());
        deadline
    }

    /// The session error for a handshake call about `peer` that failed within this deadline.
    pub(super) fn handshake_failed(&self, peer: u32, error: shmbroker_handshake::Error) -> Error {
        use membership::{departure_error, lost};
        use shmbroker_handshake::{Departure, Error as Handshake};
        match error {
            Handshake::Timeout { .. } => self.timed_out(vec![peer]),
            Handshake::PeerLost { rank, .. }
            | Handshake::PeerGone {
                rank, left: false, ..
            } => lost(rank),
            Handshake::PeerGone {
                rank, left: true, ..
            } => departure_error(Departure::Left { rank, after: None }),
            Handshake::BrokerLost { .. } => Error::BrokerLost,
            Handshake::PeerNeverJoined {
                rank,
                after,
                after_left,
                ..
            } => departure_error(Departure::NeverJoined {
                rank,
                after,
                after_left,
            }),
            other => Error::Logon(other),
        }
    }

    /// Runs among the team of `stream` from now on, as the attempts of making a group do (on
    /// the setup stream); returns the stream it ran among.
    pub(super) fn among(&self, stream: u32) -> u32 {
        self.stream.replace(stream)
    }

    pub(super) fn left(&self) -> Duration {
        let now = Instant::now();
        let at = self.at.get().unwrap_or_else(|| {
            let at = shmbroker_handshake::deadline_from(now, self.timeout);
            self.at.set(Some(at));
            at
        });
        at.saturating_duration_since(now)
    }

    /// What a wait may take now without reading the clock: the whole timeout while the deadline
    /// has not started, what is left otherwise. A wait given the whole timeout must hand its own
    /// clock's start to [`Self::started_at`].
    pub(super) fn budget(&self) -> Duration {
        if self.forever() {
            return self.watch_slice();
        }
        if self.at.get().is_none() {
            self.timeout
        } else {
            self.left()
        }
    }

    /// Whether the call has no deadline (`Duration::MAX`): its waits are cut into slices that
    /// end when its watchdog is due.
    pub(super) fn forever(&self) -> bool {
        self.timeout == Duration::MAX
    }

    /// `slice`, cut to end when the watchdog of a call with no deadline is next due.
    pub(super) fn watched(&self, slice: Duration) -> Duration {
        if self.forever() {
            slice.min(self.watch_slice())
        } else {
            slice
        }
    }

    /// The time until the watchdog is next due (starting it on the first call).
    pub(super) fn watch_slice(&self) -> Duration {
        let now = Instant::now();
        let (since, next) = self.watch_from(|| now);
        (since + next)
            .saturating_duration_since(now)
            .max(Duration::from_millis(1))
    }

    /// The watchdog's clock: since when the call has waited, and after how long it warns next.
    /// The first wait that asks starts it, at `now()`.
    fn watch_from(&self, now: impl FnOnce() -> Instant) -> (Instant, Duration) {
        self.watch.get().unwrap_or_else(|| {
            let start = (now(), warn_after());
            self.watch.set(Some(start));
            start
        })
    }

    /// How long the call has waited, when its watchdog is due (then due again after twice as
    /// long); `None` otherwise, and always for a call with a deadline.
    pub(super) fn watchdog_due(&self) -> Option<Duration> {
        if !self.forever() {
            return None;
        }
        let (since, next) = self.watch_from(Instant::now);
        let waited = since.elapsed();
        (waited >= next).then(|| {
            self.watch.set(Some((since, next.saturating_mul(2))));
            waited
        })
    }

    /// Starts the deadline at `start`, when a wait given [`Self::budget`] started its clock
    /// then and this deadline had not started yet.
    pub(super) fn started_at(&self, start: Option<Instant>) {
        if let (None, Some(start)) = (self.at.get(), start) {
            self.at.set(Some(shmbroker_handshake::deadline_from(
                start,
                self.timeout,
            )));
        }
    }

    pub(super) fn timed_out(&self, mut waiting_for: Vec<u32>) -> Error {
        waiting_for.sort_unstable();
        waiting_for.dedup();
        Error::Timeout {
            op: self.op,
            waiting_for,
            timeout: self.timeout,
            diagnosis: Vec::new(),
            stopped: None,
        }
    }
}

impl Session {
    /// Every other rank of the world.
    pub(super) fn peers(&self) -> impl Iterator<Item = u32> + use<> {
        let rank = self.rank();
        (0..self.world_size()).filter(move |&peer| peer != rank)
    }

    /// The rings to and from `peer` (a rank other than this one; callers check).
    pub(super) fn link(&mut self, peer: u32) -> Result<&mut shmbroker_handshake::Link, Error> {
        self.inner
            .link(peer)
            .ok_or_else(|| Error::Misuse(format!("rank {peer} has no link to this rank")))
    }

    pub(super) fn check_rank(&self, rank: u32) -> Result<(), Error> {
        rank_below(rank, self.world_size())
    }

    pub(super) fn check_peer(&self, rank: u32) -> Result<(), Error> {
        self.check_rank(rank)?;
        if rank == self.rank() {
            return Err(Error::Misuse(format!("rank {rank} cannot message itself")));
        }
        Ok(())
    }

    /// The ranks `deadline`'s call runs among (see [`Deadline::among`]), given to `read`: the
    /// team of its stream, found in [`teams::Groups`]. A group's stays there through its calls.
    pub(super) fn call_team<R>(&self, deadline: &Deadline, read: impl FnOnce(&Team) -> R) -> R {
        read(self.groups.of_stream(deadline.stream.get()))
    }

    /// The tag of the next collective of `team`: its stream and its sequence number
    /// (see `groups`). `kind` is the message kind of the collective, published with its number
    /// so that a peer waiting in a collective of another kind at the same number sees the
    /// mismatch.
    ///
    /// # Errors
    ///
    /// [`Error::PeerLost`] when a member was replaced after the team was formed: its
    /// collectives are over (see `rejoin`), and nothing is sent. The same, or the departure
    /// that closed it, when the team's stream is closed (see `departures`): what is queued of
    /// its messages may be gone, and a receive would find a later collective's message where the
    /// dropped one was and report a mismatch instead of the departure (the chaos soak found that).
    /// [`Error::Misuse`] for a closed stream whose departed member cannot be found (which no
    /// path leads to).
    pub(super) fn next_seq(&mut self, team: &Team, kind: u32) -> Result<u64, Error> {
        if let Some(rank) = self.team_replaced(team) {
            // A member dead now is the better name: the team's first reason to be over.
            let mut dead = self.inner.dead_ranks().into_iter();
            if let Some(dead) = dead.find(|&r| team.contains(r)) {
                return Err(self.collective_lost(dead));
            }
            return Err(self.replaced_error(rank));
        }
        if self.membership.is_closed(team.stream()) {
            return Err(self.closed_team_error(team));
        }
        let stream = team.stream();
        let (seq, tag) = self.groups.next_tag(stream).ok_or_else(|| {
            Error::Misuse(format!("stream {stream} has no collectives of its own"))
        })?;
        self.engine.publisher().collective(stream, seq, kind);
        Ok(tag)
    }
}

impl Deadline {
    /// This deadline, publishing its call in `publisher` until it is dropped.
    pub(super) fn tracked_by(mut self, publisher: &Publisher) -> Self {
        let slot = publisher.enter(self.op);
        self.published = Some((std::ptr::NonNull::from(publisher), slot));
        self
    }

    /// Publishes that this deadline's call waits for `rank` (one store: the slot is known).
    pub(super) fn waits_for(&self, rank: u32) {
        if let Some((publisher, slot)) = self.published {
            // SAFETY: as in `drop`: the publisher outlives every deadline of its session.
            let publisher = unsafe { publisher.as_ref() };
            publisher.waits_for(slot, rank);
        }
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        if let Some((publisher, slot)) = self.published {
            // SAFETY: the publisher is the session's, in an `Arc` the session (or its receiving
            // half) holds for its whole life; a deadline is a local of one call on that session
            // and is dropped before the call returns, so the publisher outlives it.
            let publisher = unsafe { publisher.as_ref() };
            // A call cut short by a panic (which the C ABI catches, and a caller may) failed.
            let failed = match self.failed.get() {
                crate::status::NONE if std::thread::panicking() => u64::from(u32::MAX),
                failed => failed,
            };
            publisher.leave(slot, failed);
        }
    }
}

/// How long a wait with no deadline goes before its watchdog first logs a warning:
/// `SHMBROKER_WARN_AFTER` seconds (default 60), then twice as long each time.
pub(super) fn warn_after() -> Duration {
    static AFTER: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *AFTER.get_or_init(|| {
        std::env::var("SHMBROKER_WARN_AFTER")
            .ok()
            .and_then(|value| value.trim().parse::<f64>().ok())
            .filter(|secs| secs.is_finite() && *secs > 0.0)
            .map_or(Duration::from_secs(60), Duration::from_secs_f64)
    })
}
