//! Acknowledgements: a receiver gives a block of the sender's outbox back once it has copied a
//! chunk out of it, or dropped its view of a loan.
//!
//! Acknowledgements travel on the rings like any message, but they are never queued for a
//! receive: [`Session::pull`] hands each one to this rank's outbox ledger as it arrives, which
//! refuses (naming the sender) one this rank did not expect. Those this rank owes go out at once
//! when the ring back has room, and otherwise wait in the peer's `acks_due` for the next call to
//! flush them, in order and ahead of any new message to that peer.

use crate::error::Error;
use crate::session::demux::with_ref;
use crate::session::state::Session;
use shmbroker_bindings::{PayloadRef, kind};
use shmbroker_queues::TrySendError;

impl Session {
    /// Handles `peer`'s acknowledgement of a block of this rank's outbox.
    pub(super) fn acknowledged(&mut self, peer: u32, acked: PayloadRef) -> Result<(), Error> {
        // What a departed peer acknowledged before it went was given back when it went.
        if self.engine.peers[peer as usize].forgotten {
            return Ok(());
        }
        let freed = self
            .engine
            .outbox
            .ack(peer, acked)
            .map_err(|source| Error::Protocol {
                peer,
                detail: source.to_string(),
            })?;
        if self.engine.chunk_blocks.contains(&acked.offset) {
            let owed = &mut self.engine.peers[peer as usize].chunks_owed;
            *owed = owed.saturating_sub(1);
        }
        if freed {
            self.engine.chunk_blocks.remove(&acked.offset);
        }
        Ok(())
    }

    /// Acknowledges `payload` to its owner `peer`: queued, and sent as soon as the ring has room.
    pub(in crate::session) fn queue_ack(
        &mut self,
        peer: u32,
        payload: PayloadRef,
    ) -> Result<(), Error> {
        self.engine.peers[peer as usize]
            .acks_due
            .push_back(with_ref(kind::PAYLOAD_ACK, 0, payload));
        self.flush_acks(peer)
    }

    pub(super) fn owes_acks(&self) -> bool {
        self.engine
            .peers
            .iter()
            .any(|peer| !peer.acks_due.is_empty())
    }

    pub(super) fn flush_all_acks(&mut self) -> Result<(), Error> {
        for peer in self.peers() {
            self.flush_acks(peer)?;
        }
        Ok(())
    }

    /// Sends the acknowledgements owed to `peer` that fit, in order, without waiting. A peer that
    /// has left needs none: they are dropped (a session that died says so on the next call).
    pub(in crate::session) fn flush_acks(&mut self, peer: u32) -> Result<(), Error> {
        let due = &mut self.engine.peers[peer as usize].acks_due;
        if due.is_empty() {
            return Ok(());
        }
        let link = self
            .inner
            .link(peer)
            .ok_or_else(|| Error::Misuse(format!("rank {peer} has no link to this rank")))?;
        match link.to.try_send_batch(due.make_contiguous()) {
            Ok(count) => {
                due.drain(..count);
                Ok(())
            }
            Err(TrySendError::Full(())) => Ok(()),
            Err(TrySendError::Disconnected(())) => {
                due.clear();
                Ok(())
            }
            Err(TrySendError::Corrupted((), corruption)) => Err(self.corrupted(peer, corruption)),
        }
    }

    /// Queues the acknowledgements of loan views dropped since the last call.
    pub(in crate::session) fn flush_view_acks(&mut self) -> Result<(), Error> {
        // Every acknowledgement is queued before any is sent, so a peer whose ring fails loses
        // none of the others'.
        let mut peers = Vec::new();
        for (peer, process, payload) in self.engine.view_acks.take() {
            // A view of a process since replaced: its blocks went with it (see `rejoin`).
            if peer < self.world_size()
                && peer != self.rank()
                && process == self.membership.adopted_at(peer)
            {
                self.engine.peers[peer as usize]
                    .acks_due
                    .push_back(with_ref(kind::PAYLOAD_ACK, 0, payload));
                if !peers.contains(&peer) {
                    peers.push(peer);
                }
            }
        }
        let mut failed = None;
        for peer in peers {
            if let Err(error) = self.flush_acks(peer) {
                failed.get_or_insert(error);
            }
        }
        failed.map_or(Ok(()), Err)
    }
}
