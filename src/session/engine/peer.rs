//! What the transport keeps about each peer (see `numbers` for what the calls number per peer).

use crate::session::demux::Inbox;
use shmbroker_allocator::PeerOutbox;
use shmbroker_bindings::Message;
use std::collections::VecDeque;

/// The transport's state about one peer: what it sent that no call has taken, its outbox, and
/// what each side owes the other. The engine holds one per rank of the world (its own rank's
/// stays unused), so that a rank indexes it.
#[derive(Debug)]
pub(super) struct Peer {
    /// What it sent that no call has taken yet, framed into messages (see `demux`).
    pub(super) inbox: Inbox,
    /// Its outbox, mapped read-only when first needed.
    pub(super) outbox: Option<PeerOutbox>,
    /// Chunks sent to it that it has not acknowledged yet (a transfer's window).
    pub(super) chunks_owed: usize,
    /// Acknowledgements owed to it, not sent yet because the ring to it was full.
    pub(super) acks_due: VecDeque<Message>,
    /// Whether it departed and the blocks it owed were given back: acknowledgements still in its
    /// ring then free nothing, and are no fault of its.
    pub(super) forgotten: bool,
}

impl Peer {
    pub(super) fn new(rank: u32) -> Self {
        Self {
            inbox: Inbox::new(rank),
            outbox: None,
            chunks_owed: 0,
            acks_due: VecDeque::new(),
            forgotten: false,
        }
    }
}
