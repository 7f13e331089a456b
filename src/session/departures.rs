//! Why a wait ended without its message: every way a peer can go (died, left, never joined,
//! the broker lost, its rings corrupted), a deadline, or an interrupt, mapped to one [`Error`].
//!
//! # Who is named
//!
//! Who is gone is what this worker's watcher established from the kernel (see the handshake's
//! `liveness` module), never what a peer wrote into a ring header. A collective needs every rank,
//! so once any rank died, a collective fails naming the *first* rank that died: a survivor that
//! gave up on the collective because of that death and left is not the cause. A peer that left
//! says what it gave up on ([`Error::PeerLeft`]'s `after`). A timeout names every rank the call
//! was still waiting for, under the name of the call the user made, and never names nobody.
//!
//! # What an interrupted transfer leaves
//!
//! A call that fails in the middle of a transfer because a rank departed leaves nothing in the
//! way. After a death, every stream the dead rank was in is closed (`close_departed_streams`),
//! so the survivors' leftovers of its collectives are dropped and acknowledged (see the
//! `groups` module), whichever departure error the collective failed with
//! (`collective_receives_ended`);
//! and a death this rank learnt of in no collective closes them as its next call begins
//! (`catch_up_on_departures`). After a collective fails because a member left (no death), only
//! that collective's stream is closed: another group's last message from the leaver may still
//! be on its way to a slower member (`collective_ended_by_a_leaver`). A collective of a closed
//! stream fails at once, naming the departure (`closed_team_error`). Any collective that fails
//! drops what its receives leave between two chunks (`demux::Inbox::abandon`), and any transfer
//! given up on gives back the blocks of the chunks it wrote but never sent to a peer (which
//! could never acknowledge them).
//!
//! A collective that fails for another reason (`Timeout`, `Interrupted`) leaves no chunk in the
//! way either, but it still leaves its team out of step: its peers may be in that collective
//! yet, their messages for it may still come (and stay queued until a collective on that team
//! fails on them), and this rank's next collective of the team has the next number. Make a new
//! group, or drop the session, after such an error. A rank that leaves or dies is dropped from
//! every owed set, so its blocks are reused even if a `LoanView` of them outlives its session
//! there: a view must not outlive the session that received it.

use super::membership::{departure_error, lost};
use super::state::Deadline;
use super::state::Session;
use super::teams::Team;
use crate::error::Error;
use crate::status::now as status_now;
use shmbroker_handshake::Departure;
use shmbroker_queues::Corruption;

impl Session {
    /// The error for a link to `peer` that closed: who is gone, as this worker's watcher
    /// established it. Blocks `peer` owed acknowledgements for are freed: none can arrive any
    /// more.
    pub(super) fn lost_from(&mut self, peer: u32) -> Error {
        let mut error = match self.inner.departure(peer) {
            Some(departure) => departure_error(departure),
            None => lost(peer),
        };
        self.with_last_words(&mut error);
        self.engine.forget_peer(peer);
        error
    }

    /// Adds to a [`Error::PeerLost`] what the lost rank last published: what it was doing when
    /// it died, with ages as of now (from its outbox, mapped now if its fd has arrived: this
    /// never waits).
    /// Notes why a call failed when a departure made it fail: the death (or, for a peer that
    /// left or gave up, what it cited), cited in turn if this worker then leaves.
    pub(super) fn note_cause(&self, error: &Error) {
        use shmbroker_handshake::LeftAfter;
        match *error {
            Error::PeerLost { rank, .. }
            | Error::PeerLeft {
                after: Some(LeftAfter::Died(rank)),
                ..
            } => self.inner.note_failed_on_death(rank),
            // A peer that gave up over a rank, or left after timing out on one: that rank, so
            // that a chain of ranks giving up keeps naming it.
            Error::PeerLeft {
                after: Some(LeftAfter::TimedOut(rank)),
                ..
            }
            | Error::PeerGaveUp {
                named: Some(rank), ..
            } => self.inner.note_gave_up_on(rank),
            _ => {}
        }
    }

    /// For a peer that left after timing out on a rank whose process is stopped: a sentence
    /// naming that rank as stopped, as a timeout's diagnosis would (see `status`).
    pub(super) fn with_stopped_cause(&mut self, error: &mut Error) {
        use shmbroker_handshake::LeftAfter;
        use std::os::fd::AsFd;
        let Error::PeerLeft {
            after: Some(LeftAfter::TimedOut(cause)),
            diagnosis,
            ..
        } = error
        else {
            return;
        };
        let cause = *cause;
        if !diagnosis.is_empty() || cause == self.rank() {
            return;
        }
        let Ok((_, pidfd)) = self.inner.peer_process(cause, std::time::Duration::ZERO) else {
            return;
        };
        if !shmbroker_sys::pidfd::stopped(pidfd.as_fd()) {
            return;
        }
        let quick = Deadline::new("diagnosis", std::time::Duration::ZERO);
        let said = match self.peer_outbox(cause, &quick) {
            Ok(outbox) => crate::status::describe_stopped(cause, &outbox.status(), status_now()),
            Err(_) => format!("rank {cause} is stopped"),
        };
        if let Error::PeerLeft { diagnosis, .. } = error {
            diagnosis.push(said);
        }
    }

    /// Also notes the death as why this call failed ([`Self::note_cause`]), and names a stopped
    /// rank a leaver timed out on ([`Self::with_stopped_cause`]).
    fn with_last_words(&mut self, error: &mut Error) {
        self.note_cause(error);
        self.with_stopped_cause(error);
        if let Error::PeerLost { rank, diagnosis } = error
            && diagnosis.is_empty()
        {
            let quick = Deadline::new("diagnosis", std::time::Duration::ZERO);
            if let Ok(outbox) = self.peer_outbox(*rank, &quick) {
                let now = crate::status::now();
                let said = crate::status::describe(*rank, &outbox.status(), now);
                diagnosis.push(said.replacen(" is in ", " was in ", 1));
            }
        }
    }

    /// [`Self::lost_from`] for a ring with `peer` found closed by a call. In a collective (the
    /// deadline of which `collective` holds) it names the first rank of the call's team that
    /// died, if any did (see [`Self::call_team`]); a collective that ends this way without a
    /// death (the peer left) closes its own stream (see [`Self::collective_ended_by_a_leaver`]).
    pub(super) fn closed(&mut self, peer: u32, collective: Option<&Deadline>) -> Error {
        let error = self.lost_from(peer);
        let Some(deadline) = collective else {
            return error;
        };
        let (lost, stream) =
            self.call_team(deadline, |team| (self.team_lost_rank(team), team.stream()));
        match lost {
            Some(rank) => self.collective_lost(rank),
            None => {
                self.collective_ended_by_a_leaver(stream);
                error
            }
        }
    }

    /// After a collective on `stream` failed because a member left (no member died):
    /// the stream is closed in every inbox, so that what its messages leave in the links
    /// does not stand in the way of the next ones. Only that stream: another group's last
    /// collective may still hold a message the leaver sent before it went, which a slower
    /// member is yet to take (a rank may finish its calls and leave while others finish
    /// theirs).
    pub(super) fn collective_ended_by_a_leaver(&mut self, stream: u32) {
        self.close_streams(&[stream]);
    }

    /// The error for a ring with `peer` found corrupted: if `peer` is known to have died
    /// meanwhile (a dying peer may scribble on its way out), its death; otherwise the corruption.
    pub(super) fn corrupted(&self, peer: u32, corruption: Corruption) -> Error {
        match self.inner.departure(peer) {
            Some(Departure::Lost { rank }) => lost(rank),
            _ => Error::Corrupted { peer, corruption },
        }
    }

    /// The first rank recorded dead that `team` needs: the first to die of all when
    /// it is a member (always, for the world), otherwise the lowest dead member. One atomic load
    /// while nobody has died.
    ///
    /// A member replaced after the team was formed counts as dead for it (see `rejoin`).
    pub(super) fn team_lost_rank(&self, team: &Team) -> Option<u32> {
        let first = self.inner.recorded_lost_rank()?;
        if team.contains(first) && self.gone_for_team(first, team) {
            return Some(first);
        }
        self.inner
            .dead_ranks()
            .into_iter()
            .find(|&rank| team.contains(rank))
            .or_else(|| self.team_replaced(team))
    }

    /// The error for a collective that cannot finish because `rank` (the first rank recorded
    /// dead) died. Blocks the dead ranks owed acknowledgements for are given back: none can
    /// arrive any more.
    ///
    /// The streams of the teams the dead ranks were in are closed in every inbox (see
    /// `demux::Inbox::close_stream`): their collectives are over, and what their messages leave
    /// in the links, down to a message cut off between its chunks, must not stand in the way of
    /// other streams' (a group's after `shrink`). The blocks of the messages dropped are
    /// acknowledged, so their senders free them.
    pub(super) fn collective_lost(&mut self, rank: u32) -> Error {
        for dead in self.inner.dead_ranks() {
            self.engine.forget_peer(dead);
        }
        self.close_departed_streams();
        let mut error = lost(rank);
        self.with_last_words(&mut error);
        error
    }

    /// Closes, in every inbox, the streams whose collectives are over because a member has
    /// departed: the world's, and every group's with a departed member (see
    /// `demux::Inbox::close_stream`). What their messages leave in the links, down to a message
    /// cut off between its chunks, must not stand in the way of other streams' (a group's after
    /// `shrink`). The blocks of the messages dropped are acknowledged, so their senders free
    /// them. Does nothing when no rank has departed since the last time.
    ///
    /// Only where no receive is under way, since it rebuilds the queues and ends any receive
    /// between chunks: when a collective ends because of a death (its receives end with it),
    /// and before making a group or shrinking. Not on every departure seen: a group's
    /// collective goes on when a rank outside it dies, and its receive between chunks holds a
    /// place in a queue.
    pub(super) fn close_departed_streams(&mut self) {
        let departed = self
            .peers()
            .filter(|&rank| self.inner.departure(rank).is_some())
            .fold(0u64, |set, rank| set | 1 << rank);
        if self.membership.close_for(departed) {
            self.close_streams_hit_by(departed);
        }
    }

    /// Closes the world's stream and every group's with a member in `departed` (a set of ranks,
    /// bit `rank`), in every inbox.
    fn close_streams_hit_by(&mut self, departed: u64) {
        let hit = |team: &Team| (0..team.size()).any(|rank| departed & 1 << team.member(rank) != 0);
        let mut streams = vec![0];
        streams.extend(self.groups.streams_where(hit));
        self.close_streams(&streams);
    }

    /// Closes the streams of the ranks this worker's watcher recorded dead since the last look
    /// (see [`Self::close_departed_streams`]), so that nothing the collectives they were in
    /// left in the links is in the way when a call looks at a queue, however this rank learnt
    /// of the death: a collective that failed naming it, one that failed otherwise (a
    /// replacement's outbox that never came, a deadline), or none at all (a rank that was not
    /// receiving when its group broke, while a peer still sends it that group's messages). One
    /// atomic load while nobody has died. Returns whether it closed any.
    ///
    /// Only where no receive is under way: as a call begins (`track`), as `sender_ready` looks,
    /// and where a point-to-point receive at its header finds a collective message cut off
    /// ahead of its own (`caught_up_after_a_cut_off`).
    ///
    /// Deaths only: a rank that left may have finished its last collective and gone before a
    /// slower member took what it sent (its last broadcast as the root, say), which must still
    /// arrive; a collective that needs more from a leaver fails when it finds its link closed.
    pub(super) fn catch_up_on_departures(&mut self) -> bool {
        let dead = self.inner.recorded_dead();
        if !self.membership.catch_up(dead) {
            return false;
        }
        self.close_streams_hit_by(dead);
        true
    }

    /// Closes `streams` in every inbox (see `demux::Inbox::close_stream`), acknowledging the
    /// blocks of the messages dropped.
    ///
    /// Never the setup stream, whatever the call: making groups and shrinking number
    /// their messages per pair, which stay in step through a failed `group` or `shrink` (see
    /// `groups`), so a live member's queued proposal must stay queued for the rest of the call
    /// and the next one.
    pub(super) fn close_streams(&mut self, streams: &[u32]) {
        let streams: Vec<u32> = streams
            .iter()
            .copied()
            .filter(|&stream| stream != crate::tag::SETUP_STREAM)
            .collect();
        self.membership.record_closed(&streams);
        for peer in self.peers() {
            for &stream in &streams {
                self.engine.close_stream(peer, stream);
            }
            // An acknowledgement that cannot go (the peer is gone too) is nobody's loss.
            let _ = self.ack_dropped(peer);
        }
    }

    /// The error for a collective of `team` after its stream was closed: the death of a
    /// member (the first, as any collective names it), or else the departure of one.
    pub(super) fn closed_team_error(&mut self, team: &Team) -> Error {
        let _ = self.inner.lost_rank();
        if let Some(rank) = self.team_lost_rank(team) {
            return self.collective_lost(rank);
        }
        let departed = team.peers().find_map(|rank| self.inner.departure(rank));
        match departed {
            Some(departure) => departure_error(departure),
            // A stream is closed only for a departed member (or a replaced one, which
            // `team_replaced` names first); kept as an error all the same.
            None => Error::Misuse(format!(
                "the collectives of group stream {} ended when a member departed; make a new \
                 group (Session::group) of the ranks there now",
                team.stream()
            )),
        }
    }

    /// Acknowledges the blocks of `peer`'s outbox that dropped messages referred to.
    pub(super) fn ack_dropped(&mut self, peer: u32) -> Result<(), Error> {
        for piece in self.engine.take_dropped(peer) {
            self.queue_ack(peer, piece)?;
        }
        Ok(())
    }

    /// Whether a wait under `deadline` must end: an `Interrupter` asked (the request is taken),
    /// or, for a collective, a rank died.
    ///
    /// An interrupt ends every call that was waiting when it came, not only the first to look:
    /// the call notes the interrupt count at its first look, and any later count ends it. At that
    /// first look, a request no wait has taken (it came while no call was waiting) ends it too.
    pub(super) fn check_interrupted(&mut self, deadline: &Deadline) -> Result<(), Error> {
        if self.interrupt_requested(deadline) {
            return Err(Error::Interrupted);
        }
        if deadline.collective
            && let Some(rank) = self.call_team(deadline, |team| self.team_lost_rank(team))
        {
            return Err(self.collective_lost(rank));
        }
        Ok(())
    }

    /// Whether an `Interrupter` asked the waits under `deadline` to end (see
    /// [`Self::check_interrupted`]; the request is taken).
    pub(super) fn interrupt_requested(&mut self, deadline: &Deadline) -> bool {
        let count = self.inner.interrupt_count();
        match deadline.interrupts_at.get() {
            None => {
                deadline.interrupts_at.set(Some(count));
                self.inner.take_interrupt()
            }
            Some(at) if at != count => {
                // Taken, if no other call has yet: it was meant for the waits in progress.
                let _ = self.inner.take_interrupt();
                true
            }
            // A request from before this call began that no wait has taken.
            Some(_) => self.inner.take_interrupt(),
        }
    }

    /// The error for a call whose deadline passed waiting for `peer`: who is gone if someone is
    /// (a departure that raced the deadline), otherwise the timeout.
    pub(super) fn timed_out(&mut self, deadline: &Deadline, peer: u32) -> Error {
        self.timed_out_waiting(deadline, vec![peer])
    }

    /// [`Self::timed_out`] for a call still waiting for every rank of `waiting_for`, saying what
    /// each of them is doing (see `status`).
    pub(super) fn timed_out_waiting(
        &mut self,
        deadline: &Deadline,
        waiting_for: Vec<u32>,
    ) -> Error {
        match waiting_for
            .iter()
            .find_map(|&peer| self.inner.departure(peer))
        {
            Some(departure) => {
                let mut error = departure_error(departure);
                self.with_last_words(&mut error);
                error
            }
            None => {
                let mut error = deadline.timed_out(waiting_for);
                if let Error::Timeout {
                    waiting_for,
                    diagnosis,
                    stopped,
                    ..
                } = &mut error
                {
                    (*diagnosis, *stopped) = self.diagnose(waiting_for, deadline);
                }
                // Cited if this worker now leaves: the peers still waiting on it then learn
                // whom it gave up on, not only that it left.
                if let Some(rank) = error.rank() {
                    self.inner.note_gave_up_on(rank);
                }
                error
            }
        }
    }
}
