//! Who is where: each rank publishes what it is doing in its outbox's status words, which only
//! it can write and its peers (and the broker) can read, and a timeout reads them back to say
//! what each rank it waited for is doing.
//!
//! # Publishing (the hot path)
//!
//! Every call makes a [`Deadline`]; [`Session::track`] ties it to this rank's
//! [`Publisher`](super::publisher::Publisher), and the deadline says "in `op` since now" when it is
//! made and "last: `op`, finished now" when it is dropped. Only the outermost deadline of a slot
//! publishes (a call made of calls reports the outer one). The collective number and group come
//! from `Session::next_seq`, the peer of a point-to-point call from the call. Each is a handful of
//! relaxed stores, which are plain moves, and one `CLOCK_MONOTONIC_COARSE` read (vDSO, no system
//! call) each way: no fences, no read-modify-write.
//!
//! Two slots: receives publish in slot 1, everything else in slot 0, so that the two threads of
//! a split session each say what they are doing. A slot's nesting depth is this process's own
//! (an atomic used with plain loads and stores, by the one thread that uses the slot).
//!
//! # Reading (diagnosis)
//!
//! `crate::status::describe` turns a peer's status words into `rank R is in <call> ...` or `rank R is in no
//! call ...`. The words are whatever the peer wrote: names must be ASCII words, times must not
//! lie in the future; anything else reads as an unreadable state. Nothing is trusted beyond the
//! text it makes.

use super::state::Deadline;
use super::state::Session;
use crate::error::Error;
use shmbroker_bindings::status_word as w;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::publisher::{Seen, coarse_now};
use super::teams::Team;
use crate::status::{NONE, seconds_text};

/// How long a peer must be seen in another collective at the same number (or as having failed
/// this one) before the wait fails (see `Session::look_for_mismatch`).
const MISMATCH_SURE: Duration = Duration::from_millis(50);

impl Session {
    /// The watchdog of a call with no deadline that has waited `waited` (its
    /// `Deadline::watchdog_due`) and still waits for `waiting_for`: one warning with what each
    /// of them is doing (again at doubling intervals); the call goes on waiting.
    pub(super) fn warn_waiting(
        &mut self,
        deadline: &Deadline,
        waited: Duration,
        waiting_for: &[u32],
    ) {
        {
            let (diagnosis, _) = self.diagnose(waiting_for, deadline);
            tracing::warn!(
                rank = self.rank(),
                "{} has waited {} with no deadline for {}: {}; still waiting",
                deadline.op,
                seconds_text(waited),
                crate::error::ranks_text(waiting_for),
                diagnosis.join("; ")
            );
        }
    }

    /// Stops (or resumes) publishing what this rank is doing (see "Who is where" in the
    /// `Session` docs): its peers' timeouts and `shmbroker status` then say nothing about it.
    /// Publishing costs a few stores per call; this exists to measure them (as
    /// `SHMBROKER_STATUS=0` does for a whole process).
    ///
    /// **Unstable:** plumbing for shmbroker's own tests, benchmarks and bindings, hidden from the
    /// documentation and outside the API's stability promise; it may change or go without notice.
    #[doc(hidden)]
    pub fn set_publishing(&self, on: bool) {
        self.engine.publisher().set_on(on);
    }

    /// Runs one public call that settles (every collective, and the calls that agree, as
    /// `group` does), the way each is entered: `deadline` tracked ([`Self::track`]: published
    /// as this rank's call from now until it returns), `body` run under it, and its outcome
    /// settled ([`Self::settled`]). The deadline is the session's, or the one
    /// [`Session::with_timeout`] gave the call.
    #[inline]
    pub(super) fn call<R>(
        &mut self,
        deadline: Deadline,
        body: impl FnOnce(&mut Self, &Deadline) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let deadline = self.track(deadline);
        let result = body(self, &deadline);
        self.settled(&deadline, result)
    }

    /// [`Self::call`] for the collective `op` of the world, within the session's deadline.
    pub(super) fn collective<R>(
        &mut self,
        op: &'static str,
        body: impl FnOnce(&mut Self, &Team, &Deadline) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let world = self.groups.world().clone();
        self.collective_on(&world, op, body)
    }

    /// [`Self::call`] for the collective `op` among `team`, within the session's deadline:
    /// `body` runs among `team`, and its failures name `team`'s members.
    #[inline]
    pub(super) fn collective_on<R>(
        &mut self,
        team: &Team,
        op: &'static str,
        body: impl FnOnce(&mut Self, &Team, &Deadline) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let deadline = Deadline::collective(op, self.timeout, team);
        self.call(deadline, |session, deadline| body(session, team, deadline))
    }

    /// Runs one public call `op` that neither settles nor waits on one peer (`recv_any`,
    /// `loan`), the way each is entered: tracked ([`Self::track`]) within the session's
    /// deadline, `body` run under it.
    pub(super) fn tracked<R>(
        &mut self,
        op: &'static str,
        body: impl FnOnce(&mut Self, &Deadline) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let deadline = self.track(Deadline::new(op, self.timeout));
        body(self, &deadline)
    }

    /// Runs one public call `op` on `rank` alone, the way each is entered: `rank` checked, the
    /// call tracked ([`Self::track`]) and published as waiting for `rank`, `body` run under
    /// its deadline. Not settled: its failure names `rank` already, and no peer gives a
    /// point-to-point call up.
    pub(super) fn on_peer<R>(
        &mut self,
        op: &'static str,
        rank: u32,
        timeout: Duration,
        body: impl FnOnce(&mut Self, &Deadline) -> Result<R, Error>,
    ) -> Result<R, Error> {
        self.check_peer(rank)?;
        let deadline = self.track(Deadline::new(op, timeout));
        self.engine.publisher().peer(op, rank);
        body(self, &deadline)
    }

    /// `deadline`, publishing its call as this rank's (see the module docs). Every call that
    /// waits begins here, where no receive is under way: the streams of ranks recorded dead
    /// since the last call are closed first (see `departures::Session::catch_up_on_departures`).
    pub(super) fn track(&mut self, deadline: Deadline) -> Deadline {
        self.catch_up_on_departures();
        deadline.tracked_by(self.engine.publisher())
    }

    /// Fails a collective whose wait for `peer` can never end:
    ///
    /// - **`peer` called another collective** ([`Error::CollectiveMismatch`]): both are in the
    ///   same group at the same collective number, and `peer` published another message kind
    ///   for it (in the call it is in, or in the one it last finished or failed: the first of two
    ///   mismatched ranks to see it leaves its call). Matching calls use one kind per number, so
    ///   this is never a slow peer.
    /// - **`peer` gave this very collective up** ([`Error::PeerGaveUp`]): the last call it
    ///   published is this one, and it failed (its deadline passed, a peer sent it bad bytes, an
    ///   interrupt): it sends nothing more for it. This rank then fails now rather than at its
    ///   deadline (or never, with none), naming `peer` and, as `peer`'s word, the rank `peer`'s
    ///   error named, so a chain of ranks waiting on each other fails link by link, each within
    ///   a few hundred milliseconds, and the first names the cause. A death recorded by then is
    ///   named instead, as by every collective.
    ///
    /// Either must be seen twice, [`MISMATCH_SURE`] apart, because the words are read without
    /// ordering (a peer between two calls may show the new number with the old kind or outcome
    /// for a moment on a weakly ordered machine). A peer behind or ahead by some numbers is left
    /// to the deadline, whose diagnosis shows both numbers.
    pub(super) fn look_for_mismatch(
        &mut self,
        peer: u32,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let Some(mine) = self.engine.publisher().published() else {
            return Ok(());
        };
        let [seq, group, kind] =
            [w::SEQ, w::GROUP_PEER, w::KIND].map(|at| mine[at].load(Ordering::Relaxed));
        if seq == NONE || group == NONE || kind == NONE {
            return Ok(());
        }
        // Only a peer already mapped: this look never waits.
        let quick = Deadline::new("mismatch", Duration::ZERO);
        let Ok(outbox) = self.peer_outbox(peer, &quick) else {
            return Ok(());
        };
        let theirs = outbox.status()[0];
        let in_call = theirs[w::CALL] != 0 || theirs[w::CALL + 1] != 0;
        // The peer's call now, or the one it last finished (a peer that saw the mismatch first
        // has failed its call and left it).
        let other = |(at, in_group, of_kind): (usize, usize, usize)| {
            (theirs[at] == seq && theirs[in_group] == group && theirs[of_kind] != kind)
                .then_some(theirs[of_kind])
                // 0: a peer that publishes no kind (never a collective's).
                .and_then(|found| u32::try_from(found).ok().filter(|&found| found != 0))
        };
        let now_or_last = in_call
            .then(|| other((w::SEQ, w::GROUP_PEER, w::KIND)))
            .flatten()
            .or_else(|| other((w::LAST_SEQ, w::LAST_GROUP_PEER, w::LAST_KIND)));
        let gave_up = self.gave_up_on(&theirs, seq, group).map(Seen::GaveUp);
        let Some(found) = now_or_last.map(Seen::Kind).or(gave_up) else {
            deadline.mismatch_seen.set(None);
            return Ok(());
        };
        let now = std::time::Instant::now();
        match deadline.mismatch_seen.get() {
            Some((seen, kind_seen, at, since))
                if seen == peer && kind_seen == found && at == seq =>
            {
                if now.duration_since(since) < MISMATCH_SURE {
                    return Ok(());
                }
                // The tag the collective's messages carry: its group's stream and its number.
                let bits = crate::tag::SEQ_BITS;
                let tag = (u64::from(group as u32) << bits) | (seq & ((1 << bits) - 1));
                let found_kind = match found {
                    Seen::Kind(found_kind) => found_kind,
                    Seen::GaveUp(named) => {
                        // A peer that failed on a death (or an interrupt here): what every
                        // rank names is the death.
                        self.check_interrupted(deadline)?;
                        return Err(Error::PeerGaveUp {
                            rank: peer,
                            op: deadline.op,
                            seq: tag,
                            named,
                        });
                    }
                };
                Err(Error::CollectiveMismatch {
                    peer,
                    expected_kind: kind as u32,
                    expected_seq: tag,
                    found_kind,
                    found_seq: tag,
                })
            }
            _ => {
                deadline.mismatch_seen.set(Some((peer, found, seq, now)));
                Ok(())
            }
        }
    }

    /// Whether a peer whose status words (slot 0) are `theirs` has failed the collective of
    /// first number `seq` in group `group` (this rank's own published `SEQ` and `GROUP_PEER`):
    /// it has left it, and sends nothing more for it. `Some` with the rank its error named, its
    /// word, believed only as a rank of this world.
    #[allow(clippy::option_option)]
    fn gave_up_on(
        &self,
        theirs: &[u64; shmbroker_bindings::STATUS_SLOT_WORDS],
        seq: u64,
        group: u64,
    ) -> Option<Option<u32>> {
        crate::status::failed_record(theirs)
            .filter(|record| record.seq == seq && u64::from(record.stream) == group & 0xffff_ffff)
            .map(|record| record.named.filter(|&named| named < self.world_size()))
    }

    /// Whether a peer whose status words (slot 0) are `theirs` has gone past the collective of
    /// first number `seq` in group `group`: it is in, finished or failed one of a later number
    /// there. Collectives of a group run in order, so it is no longer in this one.
    fn moved_past(
        theirs: &[u64; shmbroker_bindings::STATUS_SLOT_WORDS],
        seq: u64,
        group: u64,
    ) -> bool {
        let in_call = theirs[w::CALL] != 0 || theirs[w::CALL + 1] != 0;
        let later = |at_seq: usize, at_group: usize| {
            theirs[at_group] == group && theirs[at_seq] != NONE && theirs[at_seq] > seq
        };
        let failed_later = crate::status::failed_record(theirs).is_some_and(|record| {
            u64::from(record.stream) == group & 0xffff_ffff
                && record.seq != NONE
                && record.seq > seq
        });
        (in_call && later(w::SEQ, w::GROUP_PEER))
            || later(w::LAST_SEQ, w::LAST_GROUP_PEER)
            || failed_later
    }

    /// `error`, a collective's, or [`Error::PeerGaveUp`] when it is a message of another number
    /// from a peer that has left this collective: it failed it, or has gone past it. Having
    /// left, the peer went on to its next call, whose message came in where this one's was due.
    /// A mismatch at the same number (two calls made side by side) is left as it is.
    fn gave_up_instead(&mut self, error: Error, op: &'static str) -> Error {
        let peer = match &error {
            Error::CollectiveMismatch {
                peer,
                expected_seq,
                found_seq,
                ..
            } if expected_seq != found_seq => *peer,
            _ => return error,
        };
        if peer >= self.world_size() {
            return error;
        }
        let Some(mine) = self.engine.publisher().published() else {
            return error;
        };
        let [seq, group] = [w::SEQ, w::GROUP_PEER].map(|at| mine[at].load(Ordering::Relaxed));
        let quick = Deadline::new("mismatch", Duration::ZERO);
        let Ok(outbox) = self.peer_outbox(peer, &quick) else {
            return error;
        };
        let theirs = outbox.status()[0];
        let bits = crate::tag::SEQ_BITS;
        let tag = (u64::from(group as u32) << bits) | (seq & ((1 << bits) - 1));
        let named = match self.gave_up_on(&theirs, seq, group) {
            Some(named) => named,
            None if Self::moved_past(&theirs, seq, group) => None,
            None => return error,
        };
        Error::PeerGaveUp {
            rank: peer,
            op,
            seq: tag,
            named,
        }
    }

    /// How a public collective returns: `result`, with a peer that gave it up named as such
    /// ([`Self::gave_up_instead`]), its cause noted for this worker's leaving
    /// ([`Self::note_cause`]), and noted by `deadline` for this rank's status words
    /// ([`Deadline::settle`]).
    #[inline]
    pub(super) fn settled<T>(
        &mut self,
        deadline: &Deadline,
        result: Result<T, Error>,
    ) -> Result<T, Error> {
        let result = result.map_err(|error| self.failed(error, deadline.op));
        deadline.settle(result)
    }

    /// The error a call `op` that failed with `error` returns (see [`Self::settled`]): out of
    /// line, so that the path of a call that succeeds stays short.
    #[cold]
    #[inline(never)]
    fn failed(&mut self, error: Error, op: &'static str) -> Error {
        let mut error = self.gave_up_instead(error, op);
        self.note_cause(&error);
        self.with_stopped_cause(&mut error);
        self.with_rejoin_advice(&mut error);
        error
    }

    /// What each rank of `ranks` is doing, read from its status words (mapping its outbox first
    /// if this rank has not yet, waiting at most a few milliseconds for it); then each stopped
    /// process that the waits of those ranks lead to, followed rank by rank; and the first rank
    /// found stopped, if any.
    ///
    /// A stopped rank's words still say what it was doing when it stopped ("waiting for rank
    /// 2"), and rank 2 may truly wait for it: only the kernel tells which of them is stuck. A
    /// rank in no call whose last collective failed is followed to the rank that failure named.
    /// When no chain leads to a stopped process, any stopped member of the call's team is named.
    pub(super) fn diagnose(
        &mut self,
        ranks: &[u32],
        deadline: &Deadline,
    ) -> (Vec<String>, Option<u32>) {
        let now = coarse_now();
        let mut sentences = Vec::with_capacity(ranks.len());
        let mut seen: Vec<u32> = ranks.to_vec();
        // (from, link, to): `from` waits for, or gave up on, `to`.
        let mut follow: Vec<(u32, &'static str, u32)> = Vec::new();
        let mut first_stopped = None;
        for &rank in ranks {
            let (sentence, links, stopped) = self.describe_rank(rank, now, None);
            sentences.push(sentence);
            first_stopped = first_stopped.or(stopped.then_some(rank));
            follow.extend(links.into_iter().map(|(link, next)| (rank, link, next)));
        }
        // Along the chains of waits, breadth first, each rank once.
        let mut at = 0;
        while let Some(&(from, link, rank)) = follow.get(at) {
            at += 1;
            if seen.contains(&rank) || rank >= self.world_size() {
                continue;
            }
            seen.push(rank);
            let (sentence, links, stopped) = self.describe_rank(rank, now, Some((from, link)));
            if !sentence.is_empty() {
                sentences.push(sentence);
            }
            first_stopped = first_stopped.or(stopped.then_some(rank));
            follow.extend(links.into_iter().map(|(link, next)| (rank, link, next)));
        }
        // A rank's words name only the last peer it had to wait for, so a chain can miss the
        // rank that holds everyone up: any other stopped process of the world is named too.
        if first_stopped.is_none() {
            // Members of the team whose call this is only: a stopped rank outside it holds
            // nobody here up, and must not be named.
            let others: Vec<u32> = self.call_team(deadline, |team| {
                self.peers()
                    .filter(|&rank| !seen.contains(&rank) && team.contains(rank))
                    .collect()
            });
            for rank in others {
                let stopped =
                    self.inner
                        .peer_process(rank, Duration::ZERO)
                        .is_ok_and(|(_, pidfd)| {
                            use std::os::fd::AsFd;
                            shmbroker_sys::pidfd::stopped(pidfd.as_fd())
                        });
                if stopped {
                    let (sentence, _, _) = self.describe_rank(rank, now, Some((rank, "")));
                    sentences.push(sentence);
                    first_stopped.get_or_insert(rank);
                }
            }
        }
        (sentences, first_stopped)
    }

    /// One rank's sentence for [`Self::diagnose`], whom it says it waits for or gave up on (with
    /// which of the two), and whether its process is stopped. A rank reached along a chain
    /// (`via`: the rank that waits for it or gave up on it, and which) gets a sentence only if
    /// it is stopped.
    fn describe_rank(
        &mut self,
        rank: u32,
        now: u64,
        via: Option<(u32, &'static str)>,
    ) -> (String, Vec<(&'static str, u32)>, bool) {
        let process = if rank == self.rank() {
            None
        } else {
            match self.inner.peer_process(rank, Duration::ZERO) {
                Ok((_, pidfd)) => Some(pidfd),
                Err(_) if via.is_some() => return (String::new(), Vec::new(), false),
                Err(_) => return (format!("rank {rank} has not logged on"), Vec::new(), false),
            }
        };
        let quick = Deadline::new("diagnosis", Duration::from_millis(20));
        let Ok(outbox) = self.peer_outbox(rank, &quick) else {
            let text = via.map_or_else(
                || format!("rank {rank}'s state is not known here"),
                |_| String::new(),
            );
            return (text, Vec::new(), false);
        };
        let status = outbox.status();
        // Whom it waits for; or, in no call after a collective it gave up, the rank that
        // collective's error named (it may have given up on a stopped rank).
        let waits = crate::status::Activity::read(&status, now)
            .map(|activity| {
                let mut waits: Vec<(&'static str, u32)> = activity
                    .calls
                    .iter()
                    .filter_map(|c| c.waiting_for)
                    .map(|next| ("waits for", next))
                    .collect();
                if activity.calls.is_empty() {
                    let named = activity.last.and_then(|last| last.failed_naming);
                    waits.extend(named.map(|next| ("gave up on", next)));
                }
                waits
            })
            .unwrap_or_default();
        let stopped = process.is_some_and(|pidfd| {
            use std::os::fd::AsFd;
            shmbroker_sys::pidfd::stopped(pidfd.as_fd())
        });
        let text = match (stopped, via) {
            (true, None) => crate::status::describe_stopped(rank, &status, now),
            // Found apart from any chain.
            (true, Some((from, _))) if from == rank => {
                crate::status::describe_stopped(rank, &status, now)
            }
            (true, Some((from, link))) => {
                let said = crate::status::describe_stopped(rank, &status, now);
                let rest = said.strip_prefix(&format!("rank {rank} ")).unwrap_or(&said);
                format!("rank {from} {link} rank {rank}, which {rest}")
            }
            (false, None) => crate::status::describe(rank, &status, now),
            (false, Some(_)) => String::new(),
        };
        (text, waits, stopped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::publisher::name_words;
    use crate::status::{describe, name_of};
    use shmbroker_bindings::STATUS_SLOT_WORDS;

    fn slot(call: &str, seq: u64, group_peer: u64, since: u64) -> [u64; STATUS_SLOT_WORDS] {
        let mut words = [NONE; STATUS_SLOT_WORDS];
        let [first, second] = name_words(call);
        (words[w::CALL], words[w::CALL + 1]) = (first, second);
        (words[w::SEQ], words[w::GROUP_PEER], words[w::SINCE]) = (seq, group_peer, since);
        (words[w::LAST_CALL], words[w::LAST_CALL + 1]) = (0, 0);
        words
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_stopped_rank_says_how_long_it_has_not_run_and_what_it_was_in() {
        let mut words = [
            slot("all_reduce", 4, u64::from(u32::MAX) << 32, S),
            [0; STATUS_SLOT_WORDS],
        ];
        words[0][w::WAITING_FOR] = 2;
        words[w::ALIVE_SLOT][w::ALIVE] = 3 * S;
        assert_eq!(
            crate::status::describe_stopped(3, &words, 5 * S + S / 10),
            "rank 3 is stopped (it has not run for 2.1 s): it was in all_reduce #4 for 4.1 s, \
             waiting for rank 2"
        );
        // No heartbeat yet, or one from the future: no time, nothing else unreadable.
        for alive in [0, 9 * S] {
            words[w::ALIVE_SLOT][w::ALIVE] = alive;
            let text = crate::status::describe_stopped(3, &words, 5 * S);
            assert!(
                text.starts_with("rank 3 is stopped: it was in all_reduce #4"),
                "{text}"
            );
        }
    }

    #[test]
    fn a_rank_in_a_call_and_one_in_none_are_described_so() {
        let idle = [[0; STATUS_SLOT_WORDS]; 2];
        assert_eq!(
            describe(2, &idle, 5 * S),
            "rank 2 is in no call (it has finished none yet)"
        );
        let mut done = idle;
        let [first, second] = name_words("all_reduce");
        (done[0][w::LAST_CALL], done[0][w::LAST_CALL + 1]) = (first, second);
        (done[0][w::LAST_SEQ], done[0][w::LAST_GROUP_PEER]) = (11, u64::from(u32::MAX) << 32);
        done[0][w::LAST_DONE] = S / 5;
        (done[0][w::FAILED_SEQ], done[0][w::FAILED_STREAM_NAMED]) = (NONE, NONE);
        assert_eq!(
            describe(2, &done, 10 * S),
            "rank 2 is in no call (its last, all_reduce #11, finished 9.8 s ago)"
        );
        // Failed: the last failed collective is this one (number 11, the world's stream 0).
        // Rank 0 is a rank like any other; `u32::MAX` names none. Another number or stream
        // is an earlier failure, not this call's.
        // A record needs its bit: zeroed words record nothing.
        for (seq, stream_named, ended) in [
            (11, w::FAILED_RECORD, "failed 9.8 s ago naming rank 0"),
            (
                11,
                w::FAILED_RECORD | u64::from(u32::MAX),
                "failed 9.8 s ago",
            ),
            (10, w::FAILED_RECORD, "finished 9.8 s ago"),
            (11, w::FAILED_RECORD | 1 << 32, "finished 9.8 s ago"),
            (11, 0, "finished 9.8 s ago"),
        ] {
            (done[0][w::FAILED_SEQ], done[0][w::FAILED_STREAM_NAMED]) = (seq, stream_named);
            assert_eq!(
                describe(2, &done, 10 * S),
                format!("rank 2 is in no call (its last, all_reduce #11, {ended})")
            );
        }
        let receiving = [[0; STATUS_SLOT_WORDS], slot("recv", NONE, 1 << 32, 2 * S)];
        assert_eq!(
            describe(3, &receiving, 5 * S + S / 10),
            "rank 3 is in recv from rank 1 for 3.1 s"
        );
        let mut grouped = [
            slot("barrier", 4, u64::from(u32::MAX) << 32 | 2, S),
            idle[1],
        ];
        grouped[0][w::WAITING_FOR] = 0;
        assert_eq!(
            describe(1, &grouped, S + S / 2),
            "rank 1 is in barrier #4 (group 2) for 500 ms, waiting for rank 0"
        );
    }

    #[test]
    fn an_unknown_time_is_left_out_rather_than_read_as_the_clocks_epoch() {
        let unticked = [slot("barrier", 3, NONE, 0), [0; STATUS_SLOT_WORDS]];
        assert_eq!(describe(1, &unticked, 50 * S), "rank 1 is in barrier #3");
    }

    #[test]
    fn forged_words_read_as_an_unreadable_state() {
        let mut forged = [[0; STATUS_SLOT_WORDS]; 2];
        forged[0][w::CALL] = u64::from_le_bytes(*b"\x1b[2Jevil");
        assert_eq!(
            describe(4, &forged, S),
            "rank 4 has published an unreadable state"
        );
        let future = [slot("barrier", 1, NONE, 100 * S), [0; STATUS_SLOT_WORDS]];
        assert_eq!(
            describe(4, &future, S),
            "rank 4 has published an unreadable state"
        );
    }

    #[test]
    fn names_round_trip_and_long_ones_are_cut() {
        let [a, b] = name_words("reduce_scatter");
        assert_eq!(name_of(a, b).as_deref(), Some("reduce_scatter"));
        let [a, b] = name_words("all_gather_gpu_handles");
        assert_eq!(name_of(a, b).as_deref(), Some("all_gather_gpu_h"));
    }
}
