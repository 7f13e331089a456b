//! What the calls number per peer, above the transport: point-to-point messages, typed
//! channels, the messages that make groups, and which process of its rank a peer is. The
//! transport's own state about a peer (its inbox, outbox and what each side owes the other) is
//! the engine's (see `engine`).

use super::setup::Setup;

/// The numbers this rank keeps about one peer. A session holds one per rank of the world (its
/// own rank's stays unused), so that a rank indexes it; a replacement of the peer starts afresh.
#[derive(Debug, Default)]
pub(super) struct PeerNumbers {
    /// The number of the next point-to-point message to send it.
    pub(super) send_tag: u64,
    /// The number of the next point-to-point message due from it.
    pub(super) recv_tag: u64,
    /// Messages sent to it, and received from it, to make groups (see `groups`).
    pub(super) setup_sent: u64,
    pub(super) setup_received: u64,
    /// A setup message from a later attempt than the one it was read in, kept for the next (see
    /// `agree`).
    pub(super) setup_stash: Option<Box<Setup>>,
    /// Which process of its rank this rank's links lead to (see `agree`), once read from its
    /// outbox.
    pub(super) incarnation: Option<u32>,
    /// Typed channels made to it, and from it: the number of the next each way (see
    /// `channel`).
    pub(super) channels_to: u64,
    pub(super) channels_from: u64,
}

impl PeerNumbers {
    /// One for each rank of a world of `world`.
    pub(super) fn world(world: usize) -> Vec<Self> {
        (0..world).map(|_| Self::default()).collect()
    }
}
