//! Receiving: reading a peer's ring into its [`Inbox`](crate::session::demux::Inbox), and waiting
//! for messages to arrive whole.
//!
//! # Reading a peer's ring
//!
//! Everything a peer sends goes through one function, [`Session::pull`]: acknowledgements are
//! handed to this rank's outbox ledger at once; every other message (with the continuation slots
//! of an eager message, read in the same breath) is filed in that peer's inbox, whose framing is
//! the `demux` module's. The hot path of a lock-step exchange, an eager message that is the next
//! thing in the ring (one slot, or several all there already), skips the inbox
//! ([`Session::take_direct`], [`Session::recv_collective`]): `demux`'s [`Incoming`] checks it as
//! the inbox would, and anything it does not take goes to the inbox after all.
//!
//! # Waiting
//!
//! A receive waits on the ring it needs: parked while waiting for a message to start, spinning
//! and then yielding between the chunks of one (a wake-up per chunk would cost more than the
//! chunk). A transfer in which nothing has moved for [`PARK_AFTER`] (its peer stopped, say)
//! sleeps in short steps instead of yielding, so a stopped peer costs its waiters almost no CPU.
//! Every loop looks at the deadline now and then even while messages keep coming, and a peer may
//! have at most [`MAX_UNREAD`](crate::session::demux::MAX_UNREAD) messages queued that no call has
//! taken: a peer that floods cannot hold a call past its deadline or grow this process's memory
//! without bound.

use crate::error::Error;
use crate::session::demux::{Expect, Incoming, Payloads, message, message_len};
use crate::session::state::Deadline;
use crate::session::state::Session;
use shmbroker_allocator::PeerOutbox;
use shmbroker_bindings::{INLINE_BYTES, Message, PayloadRef, kind};
use shmbroker_queues::{RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

/// How long nothing may move in a transfer before its wait sleeps instead of yielding the core.
/// A peer copying the next chunk, or sharing this core, moves well within it; one that is
/// stopped (SIGSTOP, a debugger) or descheduled for long does not, and must not cost its waiters
/// a core each.
const PARK_AFTER: Duration = Duration::from_millis(2);

/// The longest sleep of a stalled transfer's wait: the most it adds to noticing that the peer
/// moved again, and 500 look-ups a second at most while it does not (well under 1% of a core).
const PARK_MAX: Duration = Duration::from_millis(2);

/// How long a receive that owes acknowledgements waits before trying to send them again, and a
/// send on a full ring before taking in what the peer sent meanwhile.
pub(super) const SEND_SLICE: Duration = Duration::from_millis(1);

/// How often a collective's wait looks at the peer it waits for (see
/// `status::Session::look_for_mismatch`).
pub(in crate::session) const MISMATCH_LOOK: Duration = Duration::from_millis(100);

/// Gives the core away while a transfer has made no progress for `stalled`: yields at first;
/// past [`PARK_AFTER`], sleeps an eighth of the time waited so far (at most [`PARK_MAX`]), so a
/// long stall costs almost no CPU and a short one little latency.
pub(in crate::session) fn idle_wait(stalled: Duration) {
    match idle_pause(stalled) {
        None => std::thread::yield_now(),
        Some(nap) => std::thread::sleep(nap),
    }
}

/// How [`idle_wait`] gives the core away after `stalled`: `None` to yield, or how long to sleep.
pub(super) fn idle_pause(stalled: Duration) -> Option<Duration> {
    (stalled >= PARK_AFTER).then(|| (stalled / 8).clamp(Duration::from_micros(50), PARK_MAX))
}

/// The bytes of one peer's outbox, for the demultiplexer: read from its mapping (made when
/// first needed), and acknowledged on the ring back to it.
struct PeerPayloads<'s> {
    session: &'s mut Session,
    peer: u32,
    deadline: &'s Deadline,
}

impl Payloads for PeerPayloads<'_> {
    fn read_into(&mut self, payload: PayloadRef, out: &mut [u8]) -> Result<(), Error> {
        let peer = self.peer;
        self.session
            .peer_outbox(peer, self.deadline)?
            .read_into(payload, out)
            .map_err(|source| Error::Outbox { peer, source })
    }

    fn ack(&mut self, payload: PayloadRef) -> Result<(), Error> {
        self.session.queue_ack(self.peer, payload)
    }
}

impl Session {
    /// `peer`'s outbox, mapped read-only the first time it is needed.
    pub(in crate::session) fn peer_outbox(
        &mut self,
        peer: u32,
        deadline: &Deadline,
    ) -> Result<&PeerOutbox, Error> {
        let slot = &mut self.engine.peers[peer as usize].outbox;
        if slot.is_none() {
            let fd = self
                .inner
                .take_peer_outbox(peer, deadline.left())
                .map_err(|error| deadline.handshake_failed(peer, error))?;
            let outbox = PeerOutbox::join(std::os::fd::AsFd::as_fd(&fd), peer)
                .map_err(|source| Error::Outbox { peer, source })?;
            *slot = Some(outbox);
        }
        Ok(slot.as_ref().unwrap_or_else(|| unreachable!("set above")))
    }

    /// Takes in what `peer` sent next: an acknowledgement is handled, anything else is filed in
    /// its inbox. An eager message's continuation slots are taken as they come, never waited for
    /// here: a message whose slots are still owed stays invisible to [`Self::find`] until it is
    /// whole. With `wait`, waits up to its deadline (parked) for something to arrive; without,
    /// returns `false` at once when nothing is there.
    pub(super) fn pull(&mut self, peer: u32, wait: Option<&Deadline>) -> Result<bool, Error> {
        let inbox = &self.engine.peers[peer as usize].inbox;
        inbox.check_room()?;
        let want = inbox.wants(8);
        if want == 1 {
            // The hot path: one header (no 512-byte buffer to clear for it).
            let mut one = [message(0, 0, 0, [0; INLINE_BYTES])];
            let got = self.receive(peer, &mut one, wait)?;
            if got == 1 {
                self.file(peer, one[0])?;
            }
            return Ok(got > 0);
        }
        // Continuation slots, as many as are owed (up to 8): raw bytes, filed in one batch.
        let mut slots = [message(0, 0, 0, [0; INLINE_BYTES]); 8];
        let got = self.receive(peer, &mut slots[..want], wait)?;
        self.engine.peers[peer as usize]
            .inbox
            .push_owed(&slots[..got]);
        Ok(got > 0)
    }

    /// Files one slot from `peer` in its inbox; an acknowledgement goes to the outbox ledger.
    fn file(&mut self, peer: u32, slot: Message) -> Result<(), Error> {
        let inbox = &mut self.engine.peers[peer as usize].inbox;
        match inbox.push(slot)? {
            Some(acked) => self.acknowledged(peer, acked),
            // A message of a closed stream, dropped: its blocks go back to the peer.
            None if inbox.has_dropped() => self.ack_dropped(peer),
            None => Ok(()),
        }
    }

    /// Up to `buffer.len()` messages from `peer`'s ring: those already there (no clock read), or
    /// with `wait` the first ones to arrive before its deadline. 0 when nothing is there and
    /// there is no `wait`, or after a slice spent waiting while acknowledgements are owed (they
    /// are sent meanwhile: a peer may be waiting for them to free blocks before it sends more).
    fn receive(
        &mut self,
        peer: u32,
        buffer: &mut [Message],
        wait: Option<&Deadline>,
    ) -> Result<usize, Error> {
        let collective = wait.is_some_and(|deadline| deadline.collective);
        match self.link(peer)?.from.try_recv_batch(buffer) {
            Ok(got) => return Ok(got),
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => {
                return Err(self.closed(peer, wait.filter(|deadline| deadline.collective)));
            }
            Err(TryRecvError::Corrupted(corruption)) => {
                return Err(self.corrupted(peer, corruption));
            }
        }
        let Some(deadline) = wait else {
            return Ok(0);
        };
        // A send set aside by an interrupt goes first: its receiver may be what this waits for.
        self.finish_set_aside(deadline)?;
        // The ring's own wait replaces a readiness registration: take them back first.
        self.disarm();
        let owing = self.owes_acks();
        // No clock read here: the ring's own wait reads it once it goes past its spin phase.
        let slice = if owing {
            deadline.budget().min(SEND_SLICE)
        } else {
            deadline.budget()
        };
        // A collective's long wait looks at the peer's published call now and then: a
        // collective of another kind at the same number will never send what this one waits for.
        let slice = if collective {
            slice.min(MISMATCH_LOOK)
        } else {
            slice
        };
        // Every wait ends on an `Interrupter`'s request, and a collective's when any rank dies:
        // the generation is read before looking for either, so one made after the look
        // interrupts the wait (see the queues crate's `interrupt` module). Atomic loads, no
        // system call.
        let seen = self.inner.interrupt_generation();
        self.check_interrupted(deadline)?;
        deadline.waits_for(peer);
        let from = &mut self.link(peer)?.from;
        let received = from.recv_batch_interruptible(buffer, slice, seen);
        deadline.started_at(from.clock_started());
        match received {
            Ok(got) => Ok(got),
            Err(RecvTimeoutError::Timeout) if owing && !deadline.left().is_zero() => {
                self.flush_all_acks()?;
                if collective {
                    self.look_for_mismatch(peer, deadline)?;
                }
                Ok(0)
            }
            Err(RecvTimeoutError::Timeout) if collective && !deadline.left().is_zero() => {
                self.look_for_mismatch(peer, deadline)?;
                if let Some(waited) = deadline.watchdog_due() {
                    self.warn_waiting(deadline, waited, &[peer]);
                }
                Ok(0)
            }
            // A death or an interrupt was recorded: the next call looks again (and fails if it
            // must).
            Err(RecvTimeoutError::Interrupted) => {
                self.check_interrupted(deadline)?;
                Ok(0)
            }
            // With no deadline, the slice ended for the watchdog: it speaks if due, and the
            // caller waits again.
            Err(RecvTimeoutError::Timeout) if deadline.forever() => {
                if let Some(waited) = deadline.watchdog_due() {
                    self.warn_waiting(deadline, waited, &[peer]);
                }
                Ok(0)
            }
            Err(RecvTimeoutError::Timeout) => Err(self.timed_out(deadline, peer)),
            Err(RecvTimeoutError::Disconnected) => {
                Err(self.closed(peer, wait.filter(|deadline| deadline.collective)))
            }
            Err(RecvTimeoutError::Corrupted(corruption)) => Err(self.corrupted(peer, corruption)),
        }
    }

    /// The next message from `peer` other than an acknowledgement, taken straight from its ring
    /// (waiting up to `deadline`), when nothing from `peer` is queued; `None`, taking nothing,
    /// when something is (the caller then takes the queue's path). Acknowledgements that come
    /// first are handled on the way. This is the hot path of a lock-step exchange: no queue is
    /// touched.
    fn next_direct(&mut self, peer: u32, deadline: &Deadline) -> Result<Option<Message>, Error> {
        loop {
            if !self.engine.peers[peer as usize].inbox.is_empty() {
                return Ok(None);
            }
            let mut one = [message(0, 0, 0, [0; INLINE_BYTES])];
            if self.receive(peer, &mut one, Some(deadline))? == 0 {
                continue;
            }
            if one[0].kind == kind::PAYLOAD_ACK {
                self.file(peer, one[0])?;
                continue;
            }
            return Ok(Some(one[0]));
        }
    }

    /// Receives `incoming` at once if the next message from its peer, straight from the ring, is
    /// the eager message it expects (one slot, or several all there already); otherwise files
    /// that message for the queue's path and leaves `incoming` as it was.
    pub(in crate::session) fn take_direct(
        &mut self,
        incoming: &mut Incoming<'_>,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let peer = incoming.peer;
        if !incoming.at_header() {
            return Ok(());
        }
        let Some(next) = self.next_direct(peer, deadline)? else {
            return Ok(());
        };
        match incoming.take_slot(&next) {
            Ok(true) => Ok(()),
            Ok(false) => match incoming.eager_direct(&next) {
                Some(slots) => self.take_eager_direct(incoming, next, slots),
                None => self.file(peer, next),
            },
            Err(too_long @ Error::BufferTooSmall { .. }) => {
                // Nothing is queued from `peer` (`next_direct` took this from the ring only
                // then): queued, it is the next message again.
                self.engine.peers[peer as usize].inbox.put_back(next);
                Err(too_long)
            }
            Err(other) => {
                // Queued, as the inbox's path would leave it.
                self.file(peer, next)?;
                Err(other)
            }
        }
    }

    /// Receives the eager message `header` (taken from the ring, with `slots` continuation
    /// slots) straight from the ring when all of them are there already, as a correct sender
    /// publishes them together with the header. A peer that does not (or slots that are not
    /// what `header` says) makes the inbox take the message: the header and what came are
    /// filed, the rest are owed, and a bad message is named there.
    fn take_eager_direct(
        &mut self,
        incoming: &mut Incoming<'_>,
        header: Message,
        slots: usize,
    ) -> Result<(), Error> {
        let peer = incoming.peer;
        // Kept between calls (at most `kind::EAGER_MAX` bytes' worth): no allocation or zeroing
        // per message.
        let mut buffer = std::mem::take(&mut self.engine.direct_slots);
        if buffer.len() < slots {
            buffer.resize(slots, message(0, 0, 0, [0; INLINE_BYTES]));
        }
        let outcome = match self.receive(peer, &mut buffer[..slots], None) {
            Ok(got) if got == slots && incoming.finish_eager(&header, &buffer[..slots]) => Ok(()),
            Ok(got) => {
                self.file(peer, header)?;
                buffer[..got]
                    .iter()
                    .try_for_each(|&slot| self.file(peer, slot))
            }
            Err(error) => {
                // The link failed; the header stays where it would have been.
                self.engine.peers[peer as usize].inbox.put_back(header);
                Err(error)
            }
        };
        self.engine.direct_slots = buffer;
        outcome
    }

    /// Reads whatever has arrived from `peer` without waiting (acknowledgements, and messages
    /// for later), for a call that does not itself need `peer`. At most a ringful, so that a peer
    /// that keeps sending cannot keep this rank here. A peer that left or died (its ring read to
    /// the end), or never logged on before the broker went, has nothing more to send: only calls
    /// that need it say so. Bad bytes end this call too.
    pub(in crate::session) fn drain_from(&mut self, peer: u32) -> Result<(), Error> {
        for _ in 0..self.inner.ring_capacity() {
            match self.pull(peer, None) {
                Ok(true) => {}
                // A peer that is gone has nothing more to take in; a call that needs it says so.
                Ok(false)
                | Err(Error::PeerLeft { .. } | Error::PeerNeverJoined { .. } | Error::BrokerLost) =>
                {
                    break;
                }
                Err(Error::PeerLost { rank, .. }) if rank == peer => break,
                Err(other) => return Err(other),
            }
        }
        Ok(())
    }

    /// The first queued group from `peer` that `expect` selects: its index, or `None`.
    pub(super) fn find(&self, peer: u32, expect: Expect) -> Result<Option<usize>, Error> {
        self.engine.peers[peer as usize].inbox.find(expect)
    }

    /// [`Self::find`] for a point-to-point receive. A collective message cut off ahead of the
    /// one it looks for (its sender gave up on it because a member of its group died while this
    /// rank was not receiving in that group) is dropped with its stream once the death is seen
    /// (see `catch_up_on_departures`), and the queue looked at again; no receive is under way.
    pub(super) fn find_send(&mut self, peer: u32, expect: Expect) -> Result<Option<usize>, Error> {
        loop {
            match self.find(peer, expect) {
                Err(error @ Error::Protocol { .. }) if !self.caught_up_after_a_cut_off() => {
                    return Err(error);
                }
                Err(Error::Protocol { .. }) => {}
                found => return found,
            }
        }
    }

    /// For a point-to-point receive at its header that met a malformed group ahead of its
    /// message: looks for deaths now (the sender may have given up on a collective because of
    /// one this rank's watcher has not recorded yet) and closes their streams. Whether it closed
    /// any, so that looking again may find the queue clear: each `true` uses up a new death, so
    /// a caller that loops on it stops.
    fn caught_up_after_a_cut_off(&mut self) -> bool {
        let _ = self.inner.lost_rank();
        self.catch_up_on_departures()
    }

    /// Advances `incoming` with what is queued, without waiting. Returns whether it moved.
    pub(super) fn step_in(
        &mut self,
        incoming: &mut Incoming<'_>,
        deadline: &Deadline,
    ) -> Result<bool, Error> {
        let peer = incoming.peer;
        if incoming.at_header() && !self.engine.peers[peer as usize].inbox.has_queued() {
            // Nothing to take (the hot path of a wait for the next message).
            return Ok(false);
        }
        // The inbox leaves the session while it steps, so that the payloads it reads may use the
        // session (map the peer's outbox, send acknowledgements). Moving it moves a few words.
        let mut inbox = std::mem::replace(
            &mut self.engine.peers[peer as usize].inbox,
            crate::session::demux::Inbox::new(peer),
        );
        let stepped = inbox.step(
            incoming,
            &mut PeerPayloads {
                session: self,
                peer,
                deadline,
            },
        );
        self.engine.peers[peer as usize].inbox = inbox;
        match stepped {
            // A collective message cut off between its chunks, or the like: its sender gave up on
            // the collective, which a member's death ends for everyone. If one has died (looked
            // for now: the sender may have seen it first), that is the error.
            Err(Error::Protocol { .. }) if deadline.collective => {
                let _ = self.inner.lost_rank();
                match self.call_team(deadline, |team| self.team_lost_rank(team)) {
                    Some(rank) => Err(self.collective_lost(rank)),
                    None => stepped,
                }
            }
            // The same, ahead of the point-to-point message this waits for (see `find_send`):
            // nothing of this receive has been taken, so no receive is under way.
            Err(Error::Protocol { .. })
                if incoming.at_header()
                    && matches!(incoming.expect, Expect::Send { .. })
                    && self.caught_up_after_a_cut_off() =>
            {
                self.step_in(incoming, deadline)
            }
            stepped => stepped,
        }
    }

    /// Receives `incoming` to the end, waiting parked on its ring.
    ///
    /// An interrupt ends it between the chunks of a pipelined message too (a look at two atomics
    /// per step). Ended there by an interrupt or the deadline, a point-to-point receive is set
    /// aside (see [`crate::session::demux::Inbox::set_aside`]): the next receive of the message
    /// starts where this one stopped, so nothing is lost and nothing delivered twice.
    pub(in crate::session) fn complete(
        &mut self,
        incoming: &mut Incoming<'_>,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let completed = self.complete_or_stop(incoming, deadline);
        if let Err(error) = &completed {
            match incoming.expect {
                // A point-to-point message only: a collective cut short cannot be called again
                // (its sequence number has moved on), so its rest has no receive to resume it.
                Expect::Send { .. } => {
                    if matches!(error, Error::Interrupted | Error::Timeout { .. }) {
                        self.engine.peers[incoming.peer as usize]
                            .inbox
                            .set_aside(incoming);
                    }
                }
                Expect::Collective { .. } => {
                    self.collective_receives_ended(std::slice::from_mut(incoming), error, deadline);
                }
            }
        }
        completed
    }

    /// After a collective failed with `error`: what its receives leave in the links goes (see
    /// `demux::Inbox::abandon`; the blocks are acknowledged). When a death ended it, every
    /// stream the dead ranks were in is closed (see `close_departed_streams`), as
    /// [`Self::collective_lost`] does, whichever error the death came as (a closed link, a
    /// replacement's outbox that can no longer come); when a member left, only the failed
    /// collective's stream (see `collective_ended_by_a_leaver`). Then nothing of the collective
    /// stands in the way of the next receive from any peer.
    pub(super) fn collective_receives_ended(
        &mut self,
        incoming: &mut [Incoming<'_>],
        error: &Error,
        deadline: &Deadline,
    ) {
        for incoming in incoming {
            let peer = incoming.peer;
            let inbox = &mut self.engine.peers[peer as usize].inbox;
            inbox.abandon(incoming);
            if inbox.has_dropped() {
                // An acknowledgement that cannot go (the peer is gone too) is nobody's loss.
                let _ = self.ack_dropped(peer);
            }
        }
        if matches!(
            error,
            Error::PeerLost { .. } | Error::PeerLeft { .. } | Error::PeerNeverJoined { .. }
        ) {
            let (lost, stream) =
                self.call_team(deadline, |team| (self.team_lost_rank(team), team.stream()));
            if lost.is_some() {
                self.close_departed_streams();
            } else {
                self.collective_ended_by_a_leaver(stream);
            }
        }
    }

    fn complete_or_stop(
        &mut self,
        incoming: &mut Incoming<'_>,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let mut idle = 0u32;
        let mut turns = 0u32;
        let mut idle_since: Option<Instant> = None;
        while !incoming.is_done() {
            if incoming.mid_transfer() {
                self.check_interrupted(deadline)?;
            }
            turns = turns.wrapping_add(1);
            // A peer that keeps sending what nobody waits for must not keep this call past its
            // deadline: look at the clock now and then even while things move.
            if turns.is_multiple_of(1024) && deadline.left().is_zero() {
                return Err(self.timed_out(deadline, incoming.peer));
            }
            if self.step_in(incoming, deadline)? {
                idle = 0;
                idle_since = None;
                continue;
            }
            if !incoming.mid_transfer() {
                self.pull(incoming.peer, Some(deadline))?;
                continue;
            }
            // Between chunks the sender is busy copying the next one: parking would add a
            // wake-up (tens of microseconds here) to every chunk, so spin, then yield the core
            // (to the sender, when both share it), and sleep only once the sender has stalled.
            if self.pull(incoming.peer, None)? {
                idle = 0;
                idle_since = None;
                continue;
            }
            idle += 1;
            if idle < 64 {
                std::hint::spin_loop();
            } else {
                if deadline.left().is_zero() {
                    return Err(self.timed_out(deadline, incoming.peer));
                }
                self.flush_all_acks()?;
                let now = Instant::now();
                idle_wait(now.duration_since(*idle_since.get_or_insert(now)));
            }
        }
        Ok(())
    }

    /// Receives every one of `incoming` to the end, in turn, sending nothing. A timeout names
    /// every rank not heard from yet, not only the one this call was waiting for.
    pub(in crate::session) fn receive_all(
        &mut self,
        incoming: &mut [Incoming<'_>],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        self.flush_view_acks()?;
        for at in 0..incoming.len() {
            if let Err(error) = self.complete(&mut incoming[at], deadline) {
                let later: Vec<u32> = incoming[at + 1..].iter().map(|i| i.peer).collect();
                let expect = incoming[at].expect;
                return Err(self.still_missing(error, &later, expect, deadline));
            }
        }
        Ok(())
    }

    /// The next collective message from `peer`, which must be one eager slot of `op` number `seq`.
    pub(in crate::session) fn recv_collective(
        &mut self,
        peer: u32,
        op: u32,
        seq: u64,
        deadline: &Deadline,
    ) -> Result<Message, Error> {
        self.recv_one_slot(peer, op, seq, deadline)?
            .map_err(|header| Error::Protocol {
                peer,
                detail: format!(
                    "{} travels in one slot; found kind {:#x} with {} bytes",
                    crate::error::op_text(op),
                    header.kind,
                    header.len
                ),
            })
    }

    /// The next collective message from `peer` of `op` number `seq` when it is one eager slot,
    /// taken; or the header of a longer one, left queued for an [`Incoming`] to take.
    pub(in crate::session) fn recv_one_slot(
        &mut self,
        peer: u32,
        op: u32,
        seq: u64,
        deadline: &Deadline,
    ) -> Result<Result<Message, Message>, Error> {
        let expect = Expect::Collective { op, seq };
        if let Some(next) = self.next_direct(peer, deadline)? {
            if next.kind == op && next.tag == seq && next.len as usize <= INLINE_BYTES {
                return Ok(Ok(next));
            }
            self.file(peer, next)?;
        }
        let at = self.await_group(peer, expect, deadline)?;
        let inbox = &mut self.engine.peers[peer as usize].inbox;
        let header = inbox.header(at);
        expect.check(peer, &header)?;
        if header.kind != op || header.len as usize > INLINE_BYTES {
            return Ok(Err(header));
        }
        inbox.remove(at);
        Ok(Ok(header))
    }

    /// `error`, and when it is a timeout, one that also names every rank of `later` (peers this
    /// call would have waited for next) with nothing of `expect` arrived yet: the ranks a
    /// collective was still missing when its deadline passed, not only the first.
    pub(in crate::session) fn still_missing(
        &mut self,
        error: Error,
        later: &[u32],
        expect: Expect,
        deadline: &Deadline,
    ) -> Error {
        let Error::Timeout {
            mut waiting_for, ..
        } = error
        else {
            return error;
        };
        for &peer in later {
            // Whatever the ring holds, without waiting; a peer whose bytes cannot be read counts
            // as missing (the call that reads them next will say what is wrong).
            let mut arrived = Ok(None);
            for _ in 0..crate::session::demux::MAX_UNREAD {
                arrived = self.find(peer, expect);
                if !matches!(arrived, Ok(None)) || !matches!(self.pull(peer, None), Ok(true)) {
                    break;
                }
            }
            if !matches!(arrived, Ok(Some(_))) {
                waiting_for.push(peer);
            }
        }
        self.timed_out_waiting(deadline, waiting_for)
    }

    /// The length of the next point-to-point message from `peer`, once its header (and, for an
    /// eager message, its whole body) is queued, waiting up to `deadline`; it stays queued.
    pub(in crate::session) fn probe_send(
        &mut self,
        peer: u32,
        deadline: &Deadline,
    ) -> Result<u64, Error> {
        let expect = Expect::Send {
            tag: self.numbers[peer as usize].recv_tag,
        };
        let at = self.await_group(peer, expect, deadline)?;
        let header = self.engine.peers[peer as usize].inbox.header(at);
        expect.check(peer, &header)?;
        message_len(peer, &header)
    }

    /// Waits until a whole group `expect` selects is queued from `peer`; returns its index.
    pub(super) fn await_group(
        &mut self,
        peer: u32,
        expect: Expect,
        deadline: &Deadline,
    ) -> Result<usize, Error> {
        let mut turns = 0u32;
        loop {
            let found = match expect {
                Expect::Send { .. } => self.find_send(peer, expect)?,
                Expect::Collective { .. } => self.find(peer, expect)?,
            };
            if let Some(at) = found {
                return Ok(at);
            }
            turns = turns.wrapping_add(1);
            if turns.is_multiple_of(1024) && deadline.left().is_zero() {
                return Err(self.timed_out(deadline, peer));
            }
            self.pull(peer, Some(deadline))?;
        }
    }
}
