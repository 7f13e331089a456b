//! Sending: eager slots, and pipelined chunks through this rank's outbox.
//!
//! # Eager
//!
//! Up to the session's eager limit, a message is a header slot plus continuation slots, written to
//! each receiver's ring back to back: nothing else is sent on that ring until the last slot is in,
//! so the receiver reads the continuation as raw bytes right behind its header.
//!
//! # Pipelined
//!
//! Larger data is *pipelined*: a header with the total length, then chunks (a quarter of the
//! message, from [`MIN_CHUNK_BYTES`] to [`CHUNK_BYTES`]) written into this rank's outbox one after
//! the other, each announced as soon as it is written with a `CHUNK` message carrying its
//! [`PayloadRef`](shmbroker_bindings::PayloadRef); receivers copy each chunk out and acknowledge
//! it, which frees the block for the next chunk. At most
//! [`CHUNKS_IN_FLIGHT`](super::outgoing::CHUNKS_IN_FLIGHT) chunks are unacknowledged by any one
//! receiver at once (counted per receiver, so a rank feeding several workers keeps that many in
//! flight to each), so the sender's copy of chunk `n + 1` overlaps the receivers' copies of chunk
//! `n`, the chunks stay warm in cache, a slow receiver holds the sender back, and a message larger
//! than the outbox goes through. A transfer that stalls widens its window up to the whole outbox: a
//! message that fits is then buffered there even when its receiver is not receiving yet (two ranks
//! sending to each other first, say); a larger one waits for its receiver, as `MPI_Send` does.
//!
//! # Progress without deadlock
//!
//! A collective whose own data is pipelined drives its outgoing transfer and its incoming
//! transfers together ([`Session::send_while_receiving`]), one non-blocking step at a time, so two
//! ranks that each send more than their outbox holds to the other both make progress. While
//! nothing moves it spins, then yields, then sleeps (the receive module's `idle_wait`), so a
//! stopped peer costs its waiters almost no CPU.

use super::outgoing::{Outgoing, Targets, transfer_progress, waiting};
use super::receive::{SEND_SLICE, idle_wait};
use crate::error::Error;
use crate::session::demux::{Incoming, message, read_ref, with_ref};
use crate::session::state::Deadline;
use crate::session::state::Session;
use crate::session::teams::Team;
use shmbroker_bindings::{INLINE_BYTES, Message, kind};
use shmbroker_queues::TrySendError;
use std::time::{Duration, Instant};

/// Bytes per chunk of a pipelined transfer: small enough to stay in a core's L2 cache between the
/// sender's copy and the receivers' copy, large enough that a message costs few ring messages.
pub const CHUNK_BYTES: usize = 256 << 10;

/// The smallest chunk a message is cut into (unless the outbox is smaller still).
pub const MIN_CHUNK_BYTES: usize = 16 << 10;

/// How long a pipelined transfer may make no progress before it widens its window.
pub(super) const STALL: Duration = Duration::from_millis(1);

/// Slots of the largest eager message: a header and [`kind::continuation_slots`] of
/// [`kind::EAGER_MAX`].
const MAX_EAGER_SLOTS: usize = 1 + kind::continuation_slots(kind::EAGER_MAX);

/// Writes `data` as operation `op` with `tag` into `slots`, zeroed, exactly as many as it takes:
/// a header and [`kind::continuation_slots`] of its length.
fn fill_eager(slots: &mut [Message], op: u32, tag: u64, data: &[u8]) {
    let head = data.len().min(INLINE_BYTES);
    slots[0].kind = op;
    slots[0].len = data.len() as u32;
    slots[0].tag = tag;
    slots[0].inline[..head].copy_from_slice(&data[..head]);
    let body: &mut [u8] = bytemuck::cast_slice_mut(&mut slots[1..]);
    body[..data.len() - head].copy_from_slice(&data[head..]);
}

/// The slots of an eager message, on the heap (for a send that outlives a step, see the
/// `stepwise` module).
pub(super) fn eager_slots(op: u32, tag: u64, data: &[u8]) -> Vec<Message> {
    let mut slots =
        vec![message(0, 0, 0, [0; INLINE_BYTES]); 1 + kind::continuation_slots(data.len())];
    fill_eager(&mut slots, op, tag, data);
    slots
}

/// The slots of an eager message: a header and its continuation, in a stack buffer of `N`.
struct EagerSlots<const N: usize> {
    slots: [Message; N],
    count: usize,
}

impl<const N: usize> EagerSlots<N> {
    /// `data` as operation `op` with `tag`; `data` must take at most `N` slots.
    fn new(op: u32, tag: u64, data: &[u8]) -> Self {
        let mut slots = [message(0, 0, 0, [0; INLINE_BYTES]); N];
        let count = 1 + kind::continuation_slots(data.len());
        fill_eager(&mut slots[..count], op, tag, data);
        Self { slots, count }
    }

    fn as_slice(&self) -> &[Message] {
        &self.slots[..self.count]
    }
}

impl Session {
    /// The most bytes this session sends eagerly: what fits in half a ring, up to
    /// [`kind::EAGER_MAX`].
    pub(in crate::session) fn eager_limit(&self) -> usize {
        let half = (self.inner.ring_capacity() as usize / 2).max(1);
        (INLINE_BYTES + (half - 1) * size_of::<Message>()).min(kind::EAGER_MAX)
    }

    /// Bytes per chunk of a `total`-byte message: [`CHUNK_BYTES`], but at most a quarter of the
    /// message (at least [`MIN_CHUNK_BYTES`]), so that even a message of a few chunks overlaps the
    /// sender's copy with the receivers', and at most a quarter of the outbox, so that several
    /// chunks are always in flight.
    fn chunk_bytes(&self, total: usize) -> usize {
        let quarter_outbox = (self.engine.outbox.capacity() / 4 / 64 * 64).max(64);
        let quarter_message = (total / 4).next_multiple_of(4096).max(MIN_CHUNK_BYTES);
        CHUNK_BYTES
            .min(quarter_message)
            .min(usize::try_from(quarter_outbox).unwrap_or(usize::MAX))
    }

    /// Sends one single-slot message to `peer` (fd tickets, barrier arrivals).
    pub(in crate::session) fn send_message(
        &mut self,
        peer: u32,
        outgoing: Message,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        self.send_slots(peer, std::slice::from_ref(&outgoing), deadline)
    }

    /// Sends `slots` (one message) to `peer` as one unit. While the ring is full, takes in what
    /// `peer` sent meanwhile (but sends nothing else on this ring until the message is whole): a
    /// peer blocked on a full ring back to us stops reading, and two ranks each waiting for the
    /// other would otherwise wait out their deadlines.
    fn send_slots(
        &mut self,
        peer: u32,
        slots: &[Message],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        self.finish_set_aside(deadline)?;
        self.flush_acks(peer)?;
        if slots.len() > 1 {
            return self.send_whole(peer, slots, deadline);
        }
        let mut sent = 0;
        while sent < slots.len() {
            match self.link(peer)?.to.try_send_batch(&slots[sent..]) {
                Ok(count) => {
                    sent += count;
                    continue;
                }
                Err(TrySendError::Full(())) => {}
                Err(TrySendError::Disconnected(())) => {
                    return Err(self.closed(peer, deadline.collective.then_some(deadline)));
                }
                Err(TrySendError::Corrupted((), corruption)) => {
                    return Err(self.corrupted(peer, corruption));
                }
            }
            // Full: wait a slice for room, then take in what the peer sent.
            let slice = deadline.left().min(SEND_SLICE);
            match self
                .link(peer)?
                .to
                .send_batch_timeout(&slots[sent..sent + 1], slice)
            {
                Ok(()) => sent += 1,
                Err(shmbroker_queues::SendTimeoutError::Timeout(_)) => {
                    self.check_interrupted(deadline)?;
                    if deadline.left().is_zero() {
                        return Err(self.timed_out(deadline, peer));
                    }
                    // Every peer, not only this one: in a ring of ranks each sending to the next,
                    // the rank this one waits for is itself waiting on a third.
                    for other in self.peers() {
                        self.drain_from(other)?;
                    }
                }
                Err(shmbroker_queues::SendTimeoutError::Disconnected(_)) => {
                    return Err(self.closed(peer, deadline.collective.then_some(deadline)));
                }
                Err(shmbroker_queues::SendTimeoutError::Corrupted(_, corruption)) => {
                    return Err(self.corrupted(peer, corruption));
                }
            }
        }
        Ok(())
    }

    /// [`Self::send_slots`] for a message of several slots: written only once the ring has room
    /// for all of them, in one publication. A call that ends while it waits (an interrupt, a
    /// death, its deadline) so leaves nothing of it behind: half an eager message in the ring
    /// would make the peer read the next message's header as its missing continuation, and
    /// misframe the link for good (the chaos suite's shrink scenario found that at 10 ranks: a
    /// tree broadcast cut short by a death, then the survivors' shrink). While the ring is full
    /// this waits by looking again (spinning, yielding, then sleeping in short steps), taking in
    /// what every peer sent meanwhile.
    fn send_whole(
        &mut self,
        peer: u32,
        slots: &[Message],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let mut full_since: Option<Instant> = None;
        loop {
            match self.link(peer)?.to.try_send_whole(slots) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Full(())) => {}
                Err(TrySendError::Disconnected(())) => {
                    return Err(self.closed(peer, deadline.collective.then_some(deadline)));
                }
                Err(TrySendError::Corrupted((), corruption)) => {
                    return Err(self.corrupted(peer, corruption));
                }
            }
            self.check_interrupted(deadline)?;
            deadline.waits_for(peer);
            if deadline.left().is_zero() {
                return Err(self.timed_out(deadline, peer));
            }
            if let Some(waited) = deadline.watchdog_due() {
                self.warn_waiting(deadline, waited, &[peer]);
            }
            // As in `send_slots`: every peer, the one this waits for may wait on a third.
            for other in self.peers() {
                self.drain_from(other)?;
            }
            let now = Instant::now();
            super::receive::idle_wait(now.duration_since(*full_since.get_or_insert(now)));
        }
    }

    /// Sends `data` to every rank in `targets` as operation `op` with `tag`, receiving every
    /// `incoming` meanwhile: eagerly when it is small (then the receives follow), otherwise
    /// pipelined, driving the send and the receives together (see the module docs).
    pub(in crate::session) fn send_while_receiving(
        &mut self,
        op: u32,
        tag: u64,
        (data, targets): (&[u8], Targets),
        incoming: &mut [Incoming<'_>],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        if self.send_if_eager(op, tag, data, targets, deadline)? {
            return self.receive_all(incoming, deadline);
        }
        let targets: Vec<u32> = match targets {
            Targets::Peers => self.call_team(deadline, |team| team.peers().collect()),
            Targets::One(peer) => vec![peer],
        };
        // A world of one: nobody to send to.
        if targets.is_empty() {
            return self.receive_all(incoming, deadline);
        }
        self.finish_set_aside(deadline)?;
        let mut outgoing = Outgoing::new(op, tag, data, targets);
        match self.drive(&mut outgoing, incoming, deadline) {
            Ok(()) => Ok(()),
            Err(error) => self.transfer_failed(outgoing, incoming, error, deadline),
        }
    }

    /// What a pipelined transfer that ended with `error` leaves behind, and what its call
    /// returns.
    pub(super) fn transfer_failed(
        &mut self,
        outgoing: Outgoing<'_>,
        incoming: &[Incoming<'_>],
        error: Error,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        match error {
            // A point-to-point message that has started going out cannot be called back: it is
            // set aside, and reported sent (see `set_aside_send`).
            Error::Interrupted if !outgoing.collective && !outgoing.untouched() => {
                self.set_aside_send(outgoing);
                Ok(())
            }
            // Whichever wait ran out (a full ring, a silent sender), name every rank the
            // transfer still waits for.
            Error::Timeout {
                mut waiting_for, ..
            } => {
                self.release_undelivered(&outgoing);
                waiting_for.extend(waiting(&outgoing, incoming, &self.engine.peers));
                Err(self.timed_out_waiting(deadline, waiting_for))
            }
            other => {
                self.release_undelivered(&outgoing);
                Err(other)
            }
        }
    }

    /// Gives back, on behalf of each target, the blocks of the chunks of `outgoing` (a transfer
    /// given up on) that were written for it but never sent to it: it never learns of them, so
    /// it can never acknowledge them, and they would be held for the rest of the session. (The
    /// chaos suite's transfers cut short by a death left up to a window of chunks behind a
    /// full ring this way, each time.) What a target was sent, it acknowledges as it takes or
    /// drops it.
    fn release_undelivered(&mut self, outgoing: &Outgoing<'_>) {
        for (index, &peer) in outgoing.targets.iter().enumerate() {
            for message in &outgoing.messages[outgoing.delivered[index]..] {
                if message.kind == kind::CHUNK
                    && let Ok(piece) = read_ref(self.rank(), message)
                {
                    // Refused only for a block not awaiting `peer`, which cannot be: ours.
                    let _ = self.acknowledged(peer, piece);
                }
            }
        }
    }

    /// Sets aside a point-to-point send ended by an interrupt after part of it went out: it owns
    /// a copy of its data from now on, and the session's next calls finish it before anything
    /// else goes on a ring or any wait parks ([`Self::finish_set_aside`]), so it is delivered
    /// once, whole, and in order. The send is reported done, as `MPI_Bsend` reports a buffered
    /// message; the interrupt is left pending, so that the next call ends with
    /// [`Error::Interrupted`] (a Ctrl-C still stops the program at once). A session dropped
    /// before then leaves the message cut off: its receiver fails with [`Error::PeerLeft`].
    fn set_aside_send(&mut self, outgoing: Outgoing<'_>) {
        self.engine.set_aside = Some(outgoing.into_owned());
        self.inner.keep_interrupt();
    }

    /// Finishes the send set aside by an interrupt, if there is one, within `deadline`. A
    /// receiver that has died or left needs it no more: it is dropped. Ended again (an interrupt,
    /// the deadline), it stays set aside and this call fails.
    pub(super) fn finish_set_aside(&mut self, deadline: &Deadline) -> Result<(), Error> {
        let Some(mut outgoing) = self.engine.set_aside.take() else {
            return Ok(());
        };
        match self.drive(&mut outgoing, &mut [], deadline) {
            Ok(()) => Ok(()),
            Err(
                Error::PeerLost { .. }
                | Error::PeerLeft { .. }
                | Error::PeerNeverJoined { .. }
                | Error::BrokerLost,
            ) => {
                self.release_undelivered(&outgoing);
                Ok(())
            }
            Err(error) => {
                self.engine.set_aside = Some(outgoing);
                Err(error)
            }
        }
    }

    /// [`Self::send_while_receiving`] with nothing to receive.
    pub(in crate::session) fn send_to(
        &mut self,
        op: u32,
        tag: u64,
        data: &[u8],
        targets: Targets,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        self.send_while_receiving(op, tag, (data, targets), &mut [], deadline)
    }

    /// The hot path of a small point-to-point send: `data` fits one slot, nothing is owed to
    /// `rank` (acknowledgements go first, in order), and the ring has room. Then it is sent as
    /// message `tag` and this returns `true`; otherwise it sends nothing and returns `false`, for
    /// the general path (which waits, and names whatever went wrong).
    pub(in crate::session) fn send_one_slot(
        &mut self,
        rank: u32,
        tag: u64,
        data: &[u8],
    ) -> Result<bool, Error> {
        if data.len() > INLINE_BYTES
            || !self.engine.peers[rank as usize].acks_due.is_empty()
            || self.engine.set_aside.is_some()
        {
            return Ok(false);
        }
        self.flush_view_acks()?;
        if !self.engine.peers[rank as usize].acks_due.is_empty() {
            return Ok(false);
        }
        let mut inline = [0u8; INLINE_BYTES];
        inline[..data.len()].copy_from_slice(data);
        let slot = message(kind::SEND, tag, data.len() as u32, inline);
        Ok(self.link(rank)?.to.try_send(slot).is_ok())
    }

    /// Sends `data` eagerly to `targets` if it is small enough (then `true`), from a stack buffer
    /// no larger than the message needs; `false`, sending nothing, for a pipelined message.
    pub(in crate::session) fn send_if_eager(
        &mut self,
        op: u32,
        tag: u64,
        data: &[u8],
        targets: Targets,
        deadline: &Deadline,
    ) -> Result<bool, Error> {
        self.flush_view_acks()?;
        if data.len() > self.eager_limit() {
            return Ok(false);
        }
        match kind::continuation_slots(data.len()) {
            0 => self.send_each(&EagerSlots::<1>::new(op, tag, data), targets, deadline)?,
            1 => self.send_each(&EagerSlots::<2>::new(op, tag, data), targets, deadline)?,
            2..8 => self.send_each(&EagerSlots::<8>::new(op, tag, data), targets, deadline)?,
            // Up to 16, then 32 continuation slots (1072 and 2096 bytes, 1 and 2 KiB with room
            // to spare): the stack buffer is filled whole on every call.
            8..17 => self.send_each(&EagerSlots::<17>::new(op, tag, data), targets, deadline)?,
            17..33 => self.send_each(&EagerSlots::<33>::new(op, tag, data), targets, deadline)?,
            _ => self.send_each(
                &EagerSlots::<MAX_EAGER_SLOTS>::new(op, tag, data),
                targets,
                deadline,
            )?,
        }
        Ok(true)
    }

    fn send_each<const N: usize>(
        &mut self,
        slots: &EagerSlots<N>,
        targets: Targets,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        match targets {
            Targets::One(peer) => self.send_slots(peer, slots.as_slice(), deadline),
            Targets::Peers => {
                // A copy, not a list: no allocation on this path (the world's copies no list).
                let team = self.call_team(deadline, Team::clone);
                for peer in team.peers() {
                    self.send_slots(peer, slots.as_slice(), deadline)?;
                }
                Ok(())
            }
        }
    }

    /// Runs `outgoing` and every `incoming` to completion together, a non-blocking step of each
    /// at a time; spins, then yields, then sleeps (see [`idle_wait`]) while nothing moves. A
    /// collective that fails leaves nothing of its receives in the links (see
    /// [`Session::collective_receives_ended`]).
    fn drive(
        &mut self,
        outgoing: &mut Outgoing<'_>,
        incoming: &mut [Incoming<'_>],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let driven = self.drive_to_end(outgoing, incoming, deadline);
        if let Err(error) = &driven
            && outgoing.collective
        {
            self.collective_receives_ended(incoming, error, deadline);
        }
        driven
    }

    fn drive_to_end(
        &mut self,
        outgoing: &mut Outgoing<'_>,
        incoming: &mut [Incoming<'_>],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let mut idle = 0u32;
        let mut turns = 0u32;
        let mut stalled_since = None;
        // Since when this transfer's own bytes have not advanced: acknowledgements and messages
        // from third parties move something without bringing it closer to its end, and must not
        // keep a wait whose peer stopped from sleeping.
        let mut idle_since: Option<Instant> = None;
        let mut progress = transfer_progress(outgoing, incoming);
        loop {
            // Between chunks: an interrupt ends the transfer here (two atomic loads a turn).
            self.check_interrupted(deadline)?;
            let mut moved = self.step_out(outgoing, usize::MAX, deadline)?;
            for incoming in incoming.iter_mut() {
                // What is queued first: `step_out` may have taken the whole message into the
                // inbox already, and its sender may have finished its call and left since, its
                // ring closed and empty, which `pull` reports as its departure.
                moved |= self.step_in(incoming, deadline)?;
                if !incoming.is_done() {
                    moved |= self.pull(incoming.peer, None)?;
                    moved |= self.step_in(incoming, deadline)?;
                }
            }
            if outgoing.is_done() {
                break;
            }
            turns = turns.wrapping_add(1);
            if moved && (!turns.is_multiple_of(1024) || !deadline.left().is_zero()) {
                idle = 0;
                stalled_since = None;
                let now = transfer_progress(outgoing, incoming);
                if now != progress {
                    progress = now;
                    idle_since = None;
                }
                continue;
            }
            if moved {
                return Err(self
                    .timed_out_waiting(deadline, waiting(outgoing, incoming, &self.engine.peers)));
            }
            idle += 1;
            if idle < 64 {
                std::hint::spin_loop();
                continue;
            }
            // Nothing moves: the clock is read only here.
            let now = Instant::now();
            if deadline.left().is_zero() {
                return Err(self
                    .timed_out_waiting(deadline, waiting(outgoing, incoming, &self.engine.peers)));
            }
            if let Some(waited) = deadline.watchdog_due() {
                let waiting_for = waiting(outgoing, incoming, &self.engine.peers);
                self.warn_waiting(deadline, waited, &waiting_for);
            }
            if idle_since.is_none() {
                // Published, so that a peer whose own wait on this rank times out can say whom
                // this rank waits for (see `status`): of the ranks it still waits for, the one
                // holding most of its outbox, or else the first.
                let waiting_for = waiting(outgoing, incoming, &self.engine.peers);
                let most = self.most_owing(waiting_for.iter().copied());
                if let Some(rank) = most.or(waiting_for.first().copied()) {
                    deadline.waits_for(rank);
                }
            }
            let since = *stalled_since.get_or_insert(now);
            if now.duration_since(since) >= STALL {
                outgoing.widen();
                stalled_since = Some(now);
            }
            idle_wait(now.duration_since(*idle_since.get_or_insert(now)));
        }
        for incoming in incoming.iter_mut() {
            self.complete(incoming, deadline)?;
        }
        Ok(())
    }

    /// Writes the next chunks `outgoing` has room for (at most `max_chunks`) and delivers every
    /// message its targets have room for, without waiting. Returns whether anything moved.
    pub(super) fn step_out(
        &mut self,
        outgoing: &mut Outgoing<'_>,
        max_chunks: usize,
        deadline: &Deadline,
    ) -> Result<bool, Error> {
        let mut chunks = 0;
        let mut moved = false;
        // Acknowledgements from every peer, not only the targets: blocks of earlier transfers
        // that another peer still holds count against the window.
        for peer in self.peers() {
            self.drain_from(peer)?;
            self.flush_acks(peer)?;
        }
        while chunks < max_chunks
            && outgoing.written < outgoing.data.len()
            && self.chunks_in_window(outgoing)
        {
            chunks += 1;
            let len = self
                .chunk_bytes(outgoing.data.len())
                .min(outgoing.data.len() - outgoing.written);
            let Some(block) = self
                .engine
                .outbox
                .try_alloc(len as u64)
                .map_err(Error::OwnOutbox)?
            else {
                break;
            };
            let piece = &outgoing.data[outgoing.written..outgoing.written + len];
            self.engine
                .outbox
                .write(&block, 0, piece)
                .map_err(Error::OwnOutbox)?;
            let sent = self
                .engine
                .outbox
                .send(block, len as u64, outgoing.receivers)
                .map_err(Error::OwnOutbox)?;
            if outgoing.receivers != 0 {
                self.engine.chunk_blocks.insert(sent.offset);
                for &peer in &outgoing.targets {
                    self.engine.peers[peer as usize].chunks_owed += 1;
                }
            }
            outgoing
                .messages
                .push(with_ref(kind::CHUNK, outgoing.tag, sent));
            outgoing.written += len;
            moved = true;
            // Announced at once, so that the receivers copy this chunk out while the next one
            // is copied in.
            self.deliver(outgoing, deadline)?;
        }
        Ok(self.deliver(outgoing, deadline)? || moved)
    }

    /// Sends each target of `outgoing` every message of it the target's ring has room for.
    /// Returns whether any went.
    fn deliver(&mut self, outgoing: &mut Outgoing<'_>, deadline: &Deadline) -> Result<bool, Error> {
        let mut moved = false;
        for (index, &peer) in outgoing.targets.iter().enumerate() {
            let from = outgoing.delivered[index];
            if from == outgoing.messages.len() {
                continue;
            }
            match self
                .link(peer)?
                .to
                .try_send_batch(&outgoing.messages[from..])
            {
                Ok(count) => {
                    outgoing.delivered[index] += count;
                    moved = true;
                }
                Err(TrySendError::Full(())) => {}
                Err(TrySendError::Disconnected(())) => {
                    return Err(self.closed(peer, outgoing.collective.then_some(deadline)));
                }
                Err(TrySendError::Corrupted((), corruption)) => {
                    return Err(self.corrupted(peer, corruption));
                }
            }
        }
        Ok(moved)
    }

    /// Whether `outgoing` may write another chunk: every one of its targets holds fewer
    /// unacknowledged chunks (of this transfer or earlier ones) than its window. Counted per
    /// receiver, so a slow receiver holds back only what is sent to it: a rank feeding several
    /// workers keeps a window in flight to each.
    fn chunks_in_window(&self, outgoing: &Outgoing<'_>) -> bool {
        outgoing
            .targets
            .iter()
            .all(|&peer| self.engine.peers[peer as usize].chunks_owed < outgoing.window)
    }
}
