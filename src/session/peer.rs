//! What this rank keeps about each peer.

use super::demux::Inbox;
use shmbroker_allocator::PeerOutbox;
use shmbroker_bindings::Message;
use std::collections::VecDeque;

/// Everything one session keeps about one peer: what it sent that no call has taken, the
/// point-to-point numbers in each direction, its outbox, and what each side owes the other.
/// A session holds one per rank of the world (its own rank's stays unused), so that a rank
/// indexes it.
#[derive(Debug)]
pub(super) struct Peer {
    /// What it sent that no call has taken yet, framed into messages (see `demux`).
    pub(super) inbox: Inbox,
    /// The number of the next point-to-point message to send it.
    pub(super) send_tag: u64,
    /// The number of the next point-to-point message due from it.
    pub(super) recv_tag: u64,
    /// Its outbox, mapped read-only when first needed.
    pub(super) outbox: Option<PeerOutbox>,
    /// Chunks sent to it that it has not acknowledged yet (a transfer's window).
    pub(super) chunks_owed: usize,
    /// Acknowledgements owed to it, not sent yet because the ring to it was full.
    pub(super) acks_due: VecDeque<Message>,
    /// Whether it departed and the blocks it owed were given back: acknowledgements still in its
    /// ring then free nothing, and are no fault of its.
    pub(super) forgotten: bool,
    /// Messages sent to it, and received from it, to make groups (see `groups`).
    pub(super) setup_sent: u64,
    pub(super) setup_received: u64,
    /// A setup message from a later attempt than the one it was read in, kept for the next (see
    /// `agree`).
    pub(super) setup_stash: Option<Box<super::setup::Setup>>,
    /// Which process of its rank this rank's links lead to (see `agree`), once read from its
    /// outbox.
    pub(super) incarnation: Option<u32>,
    /// Typed channels made to it, and from it: the number of the next each way (see
    /// `channel`).
    pub(super) channels_to: u64,
    pub(super) channels_from: u64,
}

impl Peer {
    pub(super) fn new(rank: u32) -> Self {
        Self {
            inbox: Inbox::new(rank),
            send_tag: 0,
            recv_tag: 0,
            outbox: None,
            chunks_owed: 0,
            acks_due: VecDeque::new(),
            forgotten: false,
            setup_sent: 0,
            setup_received: 0,
            setup_stash: None,
            incarnation: None,
            channels_to: 0,
            channels_from: 0,
        }
    }
}
