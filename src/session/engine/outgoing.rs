//! A pipelined message on its way out: which targets have had which of its messages, and how
//! much of it is written into the outbox (see `send` for the protocol that steps it).

use super::peer::Peer;
use crate::session::demux::{Incoming, message};
use shmbroker_allocator::Outbox;
use shmbroker_bindings::{INLINE_BYTES, Message, kind};
use std::borrow::Cow;

/// Chunks a pipelined transfer keeps unacknowledged at once.
pub const CHUNKS_IN_FLIGHT: usize = 8;

/// Whom a message goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::session) enum Targets {
    /// Every other member of the call's team (the world, or a group; see `Session::call_team`).
    Peers,
    /// One rank.
    One(u32),
}

/// One pipelined message being sent to `targets`, step by step.
#[derive(Debug)]
pub(in crate::session) struct Outgoing<'d> {
    /// The message: borrowed from the caller, owned once set aside (see
    /// [`Session::set_aside_send`](crate::session::state::Session::set_aside_send)).
    pub(super) data: Cow<'d, [u8]>,
    pub(super) targets: Vec<u32>,
    pub(super) receivers: u64,
    pub(super) tag: u64,
    /// The header, then one `CHUNK` message per chunk written so far.
    pub(super) messages: Vec<Message>,
    /// Per target: how many of `messages` it has been sent.
    pub(super) delivered: Vec<usize>,
    /// Bytes of `data` written into the outbox so far.
    pub(super) written: usize,
    /// Chunks allowed unacknowledged: [`CHUNKS_IN_FLIGHT`], doubled each time the transfer
    /// stalls, so that a receiver that is not receiving yet (it is sending to this rank too, say)
    /// cannot hold this send up while the outbox has room.
    pub(super) window: usize,
    /// A collective's (any operation but `SEND`): a death anywhere ends it.
    pub(super) collective: bool,
}

impl<'d> Outgoing<'d> {
    pub(super) fn new(op: u32, tag: u64, data: &'d [u8], targets: Vec<u32>) -> Self {
        let mut inline = [0u8; INLINE_BYTES];
        inline[..8].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let header = message(op | kind::PIPELINED, tag, 0, inline);
        Self {
            data: Cow::Borrowed(data),
            receivers: Outbox::receivers(targets.iter().copied()),
            delivered: vec![0; targets.len()],
            targets,
            tag,
            messages: vec![header],
            written: 0,
            window: CHUNKS_IN_FLIGHT,
            collective: op & kind::OP_MASK != kind::SEND,
        }
    }

    pub(super) fn is_done(&self) -> bool {
        self.written == self.data.len() && self.delivered.iter().all(|&d| d == self.messages.len())
    }

    /// Whether nothing of the message has left this rank: no chunk written, no ring message sent.
    pub(super) fn untouched(&self) -> bool {
        self.written == 0 && self.delivered.iter().all(|&d| d == 0)
    }

    /// Doubles the chunks it may keep unacknowledged: its transfer stalled (see `window`).
    pub(super) fn widen(&mut self) {
        self.window = self.window.saturating_mul(2);
    }

    /// The same transfer, owning a copy of its data, to go on after its caller returned.
    pub(super) fn into_owned(self) -> Outgoing<'static> {
        Outgoing {
            data: Cow::Owned(self.data.into_owned()),
            targets: self.targets,
            receivers: self.receivers,
            tag: self.tag,
            messages: self.messages,
            delivered: self.delivered,
            written: self.written,
            window: self.window,
            collective: self.collective,
        }
    }

    /// The targets not yet sent the whole message: those a ring message is still due to, and
    /// while chunks are still to be written (the window is full), those whose acknowledgements
    /// the window waits for.
    pub(super) fn undelivered<'a>(&'a self, peers: &'a [Peer]) -> impl Iterator<Item = u32> + 'a {
        let unwritten = self.written < self.data.len();
        self.targets
            .iter()
            .zip(&self.delivered)
            .filter(move |&(&t, &d)| {
                d < self.messages.len() || (unwritten && peers[t as usize].chunks_owed > 0)
            })
            .map(|(&t, _)| t)
    }
}

/// How far `outgoing` and every `incoming` have come, as one number that grows with each byte
/// written, each message delivered and each byte received (and with nothing else).
pub(super) fn transfer_progress(outgoing: &Outgoing<'_>, incoming: &[Incoming<'_>]) -> u64 {
    let out = outgoing.written as u64 + outgoing.delivered.iter().sum::<usize>() as u64;
    incoming
        .iter()
        .fold(out, |sum, incoming| sum + incoming.progress())
}

/// The ranks a transfer still waits for: targets not yet sent the whole message, and senders not
/// yet received from. Never empty while the transfer is not done: if no target owes anything
/// (which no wait should end on), every target is named.
pub(super) fn waiting(
    outgoing: &Outgoing<'_>,
    incoming: &[Incoming<'_>],
    peers: &[Peer],
) -> Vec<u32> {
    let mut ranks: Vec<u32> = outgoing
        .undelivered(peers)
        .chain(incoming.iter().filter(|i| !i.is_done()).map(|i| i.peer))
        .collect();
    if ranks.is_empty() && !outgoing.is_done() {
        ranks.clone_from(&outgoing.targets);
    }
    ranks
}
