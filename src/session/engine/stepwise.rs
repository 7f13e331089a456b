//! Sends and receives driven a step at a time, by a caller that gives the session up between
//! steps.
//!
//! A blocking send ([`Session::send`], a broadcast's root) loops inside the session until its
//! message is out, and waits for a slow peer's room there; a blocking receive waits there for
//! the next chunk. The halves of a split session must not wait that way, each needs the session
//! while the other waits. So a [`Sender`](crate::Sender) starts a send with
//! [`Session::begin_send`], which sends what goes at once and returns the rest as a
//! [`PendingSend`], then calls [`Session::advance_send`], which moves what can move without
//! waiting and says how long to pause when nothing can; it pauses without holding the session.
//! A [`Receiver`](crate::Receiver) does the same with [`Session::begin_receive`] and
//! [`Session::advance_receive`].
//!
//! Holding nothing while it waits is also what keeps split ranks from waiting on each other in a
//! cycle: a receive that held the session while its sender's next chunk was due would keep this
//! rank's own sender out, and that sender's receiver, on another rank, may be waiting for it.
//!
//! # Why giving the session up mid-message is sound
//!
//! Between two steps of a send, the other half may use the session (the sending half runs one
//! send at a time). A receive takes messages in and sends acknowledgements, and nothing else, on
//! the rings to its peers:
//! - an eager message is published whole (one slot, or `try_send_whole`), so an
//!   acknowledgement never lands inside it;
//! - a pipelined transfer's ring messages (its header and one `CHUNK` per chunk) already have
//!   acknowledgements between them: [`Session::step_out`] sends the ones due before each delivery;
//! - the acknowledgements the receive takes in free this transfer's chunks, which the next step
//!   counts, as it counts those it takes in itself.
//!
//! Between two steps of a receive, the sending half may take messages in from the same peer
//! (they queue behind the message under way), and close a stream when it learns of a death: the
//! inbox keeps a point-to-point message under way, and tells the receive where it moved (see
//! `demux::Inbox::close_stream`). No collective runs meanwhile: [`Sender::session`] waits for
//! the receive to end, since a collective takes messages out of the inbox.
//!
//! [`Sender::session`]: crate::Sender::session
//!
//! The rings stay single-producer and single-consumer: every ring end is touched only while the
//! session is held.

use super::outgoing::{Outgoing, Targets, transfer_progress};
use super::receive::idle_pause;
use super::send::{STALL, eager_slots};
use crate::error::Error;
use crate::session::demux::{Expect, Incoming, Sink};
use crate::session::state::Deadline;
use crate::session::state::Session;
use shmbroker_bindings::Message;
use shmbroker_queues::TrySendError;
use std::time::{Duration, Instant};

/// A send under way that its caller drives with [`Session::advance_send`].
#[derive(Debug)]
pub(in crate::session) struct PendingSend<'d> {
    what: Pending<'d>,
    /// Steps in a row in which nothing moved.
    idle: u32,
    /// Since when nothing of this send has moved.
    idle_since: Option<Instant>,
    /// Since when the window of a pipelined transfer last widened (see the `send` module).
    stalled_since: Option<Instant>,
    /// Whether its wait has been published (see `status`).
    published: bool,
}

#[derive(Debug)]
enum Pending<'d> {
    /// An eager message's slots, still due to `targets[next..]`, in that order.
    Eager {
        slots: Vec<Message>,
        targets: Vec<u32>,
        next: usize,
    },
    Pipelined(Outgoing<'d>),
}

/// What a step of a [`PendingSend`] left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::session) enum Step {
    /// The message is out.
    Done,
    /// Something moved: step again.
    Moved,
    /// Nothing could move: pause (yield the core for `None`, sleep `Some(d)`), then step again.
    Pause(Option<Duration>),
}

impl Step {
    /// Pauses as this step asks, holding nothing.
    pub(in crate::session) fn pause(self) {
        match self {
            Self::Done | Self::Moved => {}
            Self::Pause(None) => std::thread::yield_now(),
            Self::Pause(Some(nap)) => std::thread::sleep(nap),
        }
    }
}

/// Steps that find nothing to do before a pause gives the core away: spinning this long costs
/// less than a yield when the peer is about to make room.
const SPINS: u32 = 64;

impl Session {
    /// Starts sending `data` to `targets` as operation `op` with `tag`: sends all that goes
    /// without waiting, and returns the rest to drive with [`Self::advance_send`] (`None` once
    /// the whole message is out). Nothing else may be sent to `targets` until it is done.
    pub(in crate::session) fn begin_send<'d>(
        &mut self,
        op: u32,
        tag: u64,
        data: &'d [u8],
        targets: Targets,
        deadline: &Deadline,
    ) -> Result<Option<PendingSend<'d>>, Error> {
        self.flush_view_acks()?;
        self.finish_set_aside(deadline)?;
        let targets: Vec<u32> = match targets {
            Targets::Peers => self.call_team(deadline, |team| team.peers().collect()),
            Targets::One(peer) => vec![peer],
        };
        if targets.is_empty() {
            return Ok(None);
        }
        let what = if data.len() <= self.eager_limit() {
            Pending::Eager {
                slots: eager_slots(op, tag, data),
                targets,
                next: 0,
            }
        } else {
            Pending::Pipelined(Outgoing::new(op, tag, data, targets))
        };
        let mut pending = PendingSend {
            what,
            idle: 0,
            idle_since: None,
            stalled_since: None,
            published: false,
        };
        match self.advance_send(&mut pending, deadline) {
            Ok(Step::Done) => Ok(None),
            Ok(_) => Ok(Some(pending)),
            Err(error) => self.send_failed(pending, error, deadline).map(|()| None),
        }
    }

    /// Moves `pending` on as far as it goes without waiting. On an error, give it to
    /// [`Self::send_failed`].
    pub(in crate::session) fn advance_send(
        &mut self,
        pending: &mut PendingSend<'_>,
        deadline: &Deadline,
    ) -> Result<Step, Error> {
        self.check_interrupted(deadline)?;
        let moved = match &mut pending.what {
            Pending::Eager {
                slots,
                targets,
                next,
            } => {
                let mut moved = false;
                while let Some(&peer) = targets.get(*next) {
                    if !self.try_send_whole(peer, slots, deadline)? {
                        break;
                    }
                    *next += 1;
                    moved = true;
                }
                if *next == targets.len() {
                    return Ok(Step::Done);
                }
                if !moved {
                    // As a blocking send does: every peer, the one this waits for may wait on a
                    // third.
                    for other in self.peers() {
                        self.drain_from(other)?;
                    }
                }
                moved
            }
            Pending::Pipelined(outgoing) => {
                let before = transfer_progress(outgoing, &[]);
                // One chunk a step: a window of chunks copied at once (up to the whole outbox,
                // once a stalled window widened) would hold the session, and the receiving half
                // with it, for as long as the copy takes.
                self.step_out(outgoing, 1, deadline)?;
                if outgoing.is_done() {
                    return Ok(Step::Done);
                }
                transfer_progress(outgoing, &[]) != before
            }
        };
        if moved {
            pending.idle = 0;
            pending.idle_since = None;
            pending.stalled_since = None;
            // A new stall is published anew (the receiving half publishes its own meanwhile).
            pending.published = false;
            return Ok(Step::Moved);
        }
        pending.idle += 1;
        if pending.idle < SPINS {
            std::hint::spin_loop();
            return Ok(Step::Moved);
        }
        let now = Instant::now();
        let waiting_for = pending.waiting_for(self);
        if deadline.left().is_zero() {
            return Err(self.timed_out_waiting(deadline, waiting_for));
        }
        if let Some(waited) = deadline.watchdog_due() {
            self.warn_waiting(deadline, waited, &waiting_for);
        }
        if !pending.published {
            pending.published = true;
            let most = self.most_owing(waiting_for.iter().copied());
            if let Some(rank) = most.or(waiting_for.first().copied()) {
                deadline.waits_for(rank);
            }
        }
        if let Pending::Pipelined(outgoing) = &mut pending.what {
            let since = *pending.stalled_since.get_or_insert(now);
            if now.duration_since(since) >= STALL {
                outgoing.widen();
                pending.stalled_since = Some(now);
            }
        }
        let since = *pending.idle_since.get_or_insert(now);
        Ok(Step::Pause(idle_pause(now.duration_since(since))))
    }

    /// Ends `pending` after `error`: as a blocking send that failed so would, it gives back
    /// what the receivers can never acknowledge, and sets aside a point-to-point message cut
    /// off by an interrupt (which is then reported sent).
    pub(in crate::session) fn send_failed(
        &mut self,
        pending: PendingSend<'_>,
        error: Error,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        match pending.what {
            Pending::Eager { .. } => Err(error),
            Pending::Pipelined(outgoing) => {
                let incoming: [Incoming<'_>; 0] = [];
                let collective = outgoing.collective;
                let result = self.transfer_failed(outgoing, &incoming, error, deadline);
                if let (true, Err(error)) = (collective, &result) {
                    self.collective_receives_ended(&mut [], error, deadline);
                }
                result
            }
        }
    }

    /// Sends `slots` (one message) to `peer` whole if its ring has room now: `false` if not.
    fn try_send_whole(
        &mut self,
        peer: u32,
        slots: &[Message],
        deadline: &Deadline,
    ) -> Result<bool, Error> {
        self.flush_acks(peer)?;
        let link = self.link(peer)?;
        let sent = if let [slot] = slots {
            link.to.try_send(*slot).map_err(|error| match error {
                TrySendError::Full(_) => TrySendError::Full(()),
                TrySendError::Disconnected(_) => TrySendError::Disconnected(()),
                TrySendError::Corrupted(_, corruption) => TrySendError::Corrupted((), corruption),
            })
        } else {
            link.to.try_send_whole(slots)
        };
        match sent {
            Ok(()) => Ok(true),
            Err(TrySendError::Full(())) => Ok(false),
            Err(TrySendError::Disconnected(())) => {
                Err(self.closed(peer, deadline.collective.then_some(deadline)))
            }
            Err(TrySendError::Corrupted((), corruption)) => Err(self.corrupted(peer, corruption)),
        }
    }
}

impl PendingSend<'_> {
    /// The ranks this send waits for.
    fn waiting_for(&self, session: &Session) -> Vec<u32> {
        match &self.what {
            Pending::Eager { targets, next, .. } => targets[*next..].to_vec(),
            Pending::Pipelined(outgoing) => {
                super::outgoing::waiting(outgoing, &[], session.engine.peers.as_slice())
            }
        }
    }
}

/// A point-to-point receive under way that its caller drives with [`Session::advance_receive`].
#[derive(Debug)]
pub(in crate::session) struct PendingReceive<'a> {
    incoming: Incoming<'a>,
    /// Steps so far: the clock is read every 1024th even while things move.
    turns: u32,
    /// Steps in a row in which nothing moved.
    idle: u32,
    /// Since when nothing of this receive has moved.
    idle_since: Option<Instant>,
}

impl Session {
    /// Starts receiving the next point-to-point message from `peer` into `sink` (a message
    /// too long for it is kept), taking what is there without waiting. Drive it with
    /// [`Self::advance_receive`], and end it with [`Self::end_receive`].
    pub(in crate::session) fn begin_receive<'a>(
        &mut self,
        peer: u32,
        sink: Sink<'a>,
        deadline: &Deadline,
    ) -> Result<PendingReceive<'a>, Error> {
        self.check_peer(peer)?;
        self.catch_up_on_departures();
        let expect = Expect::Send {
            tag: self.numbers[peer as usize].recv_tag,
        };
        let mut incoming = Incoming::keeping_too_long(peer, expect, sink);
        self.flush_view_acks()?;
        self.take_direct(&mut incoming, deadline)?;
        Ok(PendingReceive {
            incoming,
            turns: 0,
            idle: 0,
            idle_since: None,
        })
    }

    /// Moves `pending` on as far as it goes without waiting: a step of the blocking receive's
    /// loop. On an error, give it to [`Self::end_receive`].
    pub(in crate::session) fn advance_receive(
        &mut self,
        pending: &mut PendingReceive<'_>,
        deadline: &Deadline,
    ) -> Result<Step, Error> {
        let incoming = &mut pending.incoming;
        if incoming.is_done() {
            return Ok(Step::Done);
        }
        if incoming.mid_transfer() {
            self.check_interrupted(deadline)?;
        }
        let peer = incoming.peer;
        pending.turns = pending.turns.wrapping_add(1);
        // A peer that keeps sending what this receive does not wait for (acknowledgements of
        // the sending half's chunks, later messages) must not keep it past its deadline.
        if pending.turns.is_multiple_of(1024) && deadline.left().is_zero() {
            return Err(self.timed_out(deadline, peer));
        }
        if self.step_in(incoming, deadline)? || self.pull(peer, None)? {
            pending.idle = 0;
            pending.idle_since = None;
            return Ok(if pending.incoming.is_done() {
                Step::Done
            } else {
                Step::Moved
            });
        }
        pending.idle += 1;
        if pending.idle < SPINS {
            std::hint::spin_loop();
            return Ok(Step::Moved);
        }
        if !incoming.mid_transfer() {
            self.check_interrupted(deadline)?;
        }
        if deadline.left().is_zero() {
            return Err(self.timed_out(deadline, peer));
        }
        // The sender may be waiting for these before it can send more.
        self.flush_all_acks()?;
        let now = Instant::now();
        if pending.idle_since.is_none() {
            deadline.waits_for(peer);
        }
        let since = *pending.idle_since.get_or_insert(now);
        Ok(Step::Pause(idle_pause(now.duration_since(since))))
    }

    /// Ends `pending` with `outcome` (its last step's): the message's length and its sink, or
    /// the error, after which a message cut off between its chunks is set aside for the next
    /// receive from its sender, as a blocking receive's is.
    pub(in crate::session) fn end_receive<'a>(
        &mut self,
        mut pending: PendingReceive<'a>,
        outcome: Result<(), Error>,
        deadline: &Deadline,
    ) -> Result<(u64, Sink<'a>), Error> {
        let peer = pending.incoming.peer;
        if let Err(error) = outcome {
            if matches!(error, Error::Interrupted | Error::Timeout { .. }) {
                self.engine.peers[peer as usize]
                    .inbox
                    .set_aside(&mut pending.incoming);
            }
            return Err(error);
        }
        // Finished as a blocking receive finishes (nothing is left to wait for).
        self.complete(&mut pending.incoming, deadline)?;
        self.numbers[peer as usize].recv_tag += 1;
        pending.incoming.finish()
    }
}
