//! Collectives: barrier, all-gather, broadcast and gather, flat in small worlds and by
//! dissemination, Bruck's algorithm and binomial trees in large ones.

use super::demux::{Expect, Incoming, Sink, message};
use super::engine::outgoing::Targets;
use super::state::Deadline;
use super::state::Session;
use super::teams::Team;
use super::tuning::{self, ALL_GATHER_LEND_MAX_RANKS};
use crate::error::Error;
use shmbroker_bindings::kind;

/// A barrier message's inline bytes in dissemination round `round`.
fn round_inline(round: u32) -> [u8; shmbroker_bindings::INLINE_BYTES] {
    let mut inline = [0; shmbroker_bindings::INLINE_BYTES];
    inline[..4].copy_from_slice(&round.to_le_bytes());
    inline
}

/// Checks that `incoming` brought exactly `due` bytes (a part of an `all_gather_into`).
pub(super) fn check_part(incoming: Incoming<'_>, due: usize) -> Result<(), Error> {
    let peer = incoming.peer;
    let (len, _) = incoming.finish().map_err(|error| match error {
        Error::BufferTooSmall { needed, .. } => wrong_size(peer, needed, due),
        other => other,
    })?;
    if len == due as u64 {
        Ok(())
    } else {
        Err(wrong_size(peer, len, due))
    }
}

pub(super) fn wrong_size(peer: u32, found: u64, due: usize) -> Error {
    Error::Protocol {
        peer,
        detail: format!("gave {found} bytes where {due} were due"),
    }
}

impl Session {
    // -----------------------------------------------------------------------------------------
    // Collectives

    /// [`Collectives::barrier`](crate::Collectives::barrier) by telling every peer and hearing
    /// from every peer (small worlds).
    #[inline]
    pub(super) fn flat_barrier(
        &mut self,
        team: &Team,
        seq: u64,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let arrival = message(kind::BARRIER, seq, 0, [0; shmbroker_bindings::INLINE_BYTES]);
        for peer in team.peers() {
            self.send_message(peer, arrival, deadline)?;
        }
        let peers: Vec<u32> = team.peers().collect();
        for (at, &peer) in peers.iter().enumerate() {
            if let Err(error) = self.recv_collective(peer, kind::BARRIER, seq, deadline) {
                let expect = Expect::Collective {
                    op: kind::BARRIER,
                    seq,
                };
                return Err(self.still_missing(error, &peers[at + 1..], expect, deadline));
            }
        }
        Ok(())
    }

    /// [`Collectives::barrier`](crate::Collectives::barrier) by dissemination (larger worlds).
    pub(super) fn dissemination_barrier(
        &mut self,
        team: &Team,
        seq: u64,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let world = team.size();
        // Dissemination: in round k, tell rank + 2^k and hear from rank - 2^k (mod the world).
        // After round k every rank has heard, directly or through others, from the 2^(k+1) ranks
        // before it, so after ceil(log2(world)) rounds from all of them. 2^k < world in every
        // round, so each round has a peer of its own, and the round travels in the message's
        // inline bytes (`round_inline`).
        let rank = team.me();
        let mut distance = 1;
        let mut round = 0;
        while distance < world {
            let to = team.member((rank + distance) % world);
            let from = team.member((rank + world - distance) % world);
            let arrival = message(kind::BARRIER, seq, 0, round_inline(round));
            self.send_message(to, arrival, deadline)?;
            let heard = self.recv_collective(from, kind::BARRIER, seq, deadline)?;
            if heard.inline != arrival.inline {
                return Err(Error::Protocol {
                    peer: from,
                    detail: format!(
                        "barrier #{seq}: expected the message of dissemination round {round}, \
                         found another"
                    ),
                });
            }
            distance *= 2;
            round += 1;
        }
        Ok(())
    }

    /// [`Collectives::all_gather`](crate::Collectives::all_gather) within an existing deadline,
    /// whose name a timeout gives (for collectives built on it).
    pub(super) fn all_gather_with(
        &mut self,
        team: &Team,
        data: &[u8],
        deadline: &Deadline,
    ) -> Result<Vec<Vec<u8>>, Error> {
        let seq = self.next_seq(team, kind::ALL_GATHER)?;
        let mut incoming = self.receive_from_every_peer(team, kind::ALL_GATHER, seq);
        self.send_while_receiving(
            kind::ALL_GATHER,
            seq,
            (data, Targets::Peers),
            &mut incoming,
            deadline,
        )?;
        self.gathered(team, data, incoming)
    }

    /// A receive into a vector from every peer, of collective `op` number `seq`.
    pub(super) fn receive_from_every_peer(
        &self,
        team: &Team,
        op: u32,
        seq: u64,
    ) -> Vec<Incoming<'static>> {
        let expect = Expect::Collective { op, seq };
        team.peers()
            .map(|peer| Incoming::new(peer, expect, Sink::Vec(Vec::new())))
            .collect()
    }

    /// Every rank's data by rank: this rank's `data` and what each of `incoming` received.
    pub(super) fn gathered(
        &self,
        team: &Team,
        data: &[u8],
        incoming: Vec<Incoming<'_>>,
    ) -> Result<Vec<Vec<u8>>, Error> {
        let mut gathered = vec![Vec::new(); team.size() as usize];
        gathered[team.me() as usize] = data.to_vec();
        for incoming in incoming {
            let rank = team.rank_of(incoming.peer);
            if let (_, Sink::Vec(bytes)) = incoming.finish()? {
                gathered[rank as usize] = bytes;
            }
        }
        Ok(gathered)
    }

    /// [`Collectives::all_gather_into`](crate::Collectives::all_gather_into) as collective `op`
    /// number `seq` (an all-reduce's first shot gathers this way too), with `out` of the right
    /// length.
    pub(super) fn gather_parts_into(
        &mut self,
        team: &Team,
        op: u32,
        seq: u64,
        data: &[u8],
        out: &mut [u8],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let expect = Expect::Collective { op, seq };
        let rank = team.me();
        if tuning::all_gather(team.size(), data.len()) == tuning::AllGather::Bruck {
            return self.bruck_all_gather(team, op, data, out, seq, deadline);
        }
        // Small: sent at once (in ring slots, or lent from the outbox above
        // [`ALL_GATHER_SLOTS_MAX_BYTES`](super::tuning::ALL_GATHER_SLOTS_MAX_BYTES)), then each peer's part received in turn.
        if self.send_small_part(team, op, seq, data, deadline)? {
            let mut rest = out;
            for peer in 0..team.size() {
                let (slot, tail) = std::mem::take(&mut rest).split_at_mut(data.len());
                rest = tail;
                if peer == rank {
                    slot.copy_from_slice(data);
                    continue;
                }
                let mut incoming = Incoming::new(team.member(peer), expect, Sink::Slice(slot));
                // The part straight from the ring when it is next there and whole, else
                // through the inbox.
                self.take_direct(&mut incoming, deadline)?;
                if !incoming.is_done() {
                    self.complete(&mut incoming, deadline)?;
                }
                check_part(incoming, data.len())?;
            }
            return Ok(());
        }
        let mut incoming = Vec::with_capacity(team.size() as usize);
        let mut rest = out;
        for peer in 0..team.size() {
            let (slot, tail) = std::mem::take(&mut rest).split_at_mut(data.len());
            rest = tail;
            if peer == rank {
                slot.copy_from_slice(data);
            } else {
                incoming.push(Incoming::new(team.member(peer), expect, Sink::Slice(slot)));
            }
        }
        self.send_while_receiving(op, seq, (data, Targets::Peers), &mut incoming, deadline)?;
        for incoming in incoming {
            check_part(incoming, data.len())?;
        }
        Ok(())
    }

    /// Sends this rank's `data` to every peer as collective `op` number `seq` when it is small
    /// enough to go at once: in ring slots, or, for an all-gather's part above
    /// [`ALL_GATHER_SLOTS_MAX_BYTES`](super::tuning::ALL_GATHER_SLOTS_MAX_BYTES) in a team of up to [`ALL_GATHER_LEND_MAX_RANKS`], copied
    /// into this rank's outbox and lent to every peer (one slot each, where slots take one per
    /// 64 bytes). A part the outbox has no room for at once (full of symmetric buffers, say)
    /// goes in slots: a receiver takes either form the same way. Returns `false`, having sent
    /// nothing, above the eager limit.
    ///
    /// Only the all-gather lends: the reductions that gather their first shot here (a reduce
    /// and a reduce-scatter to [`ONE_SHOT_MAX_BYTES`](super::tuning::ONE_SHOT_MAX_BYTES)) were measured
    /// in slots.
    fn send_small_part(
        &mut self,
        team: &Team,
        op: u32,
        seq: u64,
        data: &[u8],
        deadline: &Deadline,
    ) -> Result<bool, Error> {
        if op != kind::ALL_GATHER
            || !tuning::all_gather_lends(team.size(), data.len(), self.eager_limit())
        {
            return self.send_if_eager(op, seq, data, Targets::Peers, deadline);
        }
        self.flush_view_acks()?;
        let Some(mut loan) = self.engine.try_loan(data.len()).map_err(Error::OwnOutbox)? else {
            return self.send_if_eager(op, seq, data, Targets::Peers, deadline);
        };
        loan.copy_from_slice(data);
        // On the stack: a team this small has at most this many peers.
        let mut peers = [0u32; ALL_GATHER_LEND_MAX_RANKS as usize - 1];
        let mut count = 0;
        for (slot, peer) in peers.iter_mut().zip(team.peers()) {
            *slot = peer;
            count += 1;
        }
        debug_assert_eq!(count, team.size() as usize - 1, "every peer has a place");
        self.lend(op, seq, loan, &peers[..count], deadline)?;
        Ok(true)
    }

    /// [`Collectives::all_gather_into`](crate::Collectives::all_gather_into) by Bruck's algorithm:
    /// ceil(log2(world)) rounds, in round k sending the 2^k parts gathered so far (at most what is
    /// still missing) to rank - 2^k and receiving as many from rank + 2^k, so each rank sends O(log
    /// n) messages instead of n - 1. Parts are gathered in `out` in rotated order (this rank's
    /// first), then rotated into rank order. Every round has a peer of its own (2^k < world), so
    /// the collective's sequence number tells its messages apart; each round's length is checked.
    fn bruck_all_gather(
        &mut self,
        team: &Team,
        op: u32,
        data: &[u8],
        out: &mut [u8],
        seq: u64,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let (rank, world) = (team.me(), team.size());
        let part = data.len();
        let expect = Expect::Collective { op, seq };
        // Gathered into `out` rotated, with no allocation: part i is rank (rank + i) % world's.
        let rotated = out;
        rotated[..part].copy_from_slice(data);
        let mut have = 1u32;
        while have < world {
            let count = have.min(world - have);
            let to = team.member((rank + world - have) % world);
            let from = team.member((rank + have) % world);
            let (gathered, missing) = rotated.split_at_mut(have as usize * part);
            let bytes = count as usize * part;
            let mut incoming = [Incoming::new(
                from,
                expect,
                Sink::Slice(&mut missing[..bytes]),
            )];
            self.send_while_receiving(
                op,
                seq,
                (&gathered[..bytes], Targets::One(to)),
                &mut incoming,
                deadline,
            )?;
            let [incoming] = incoming;
            check_part(incoming, bytes)?;
            have += count;
        }
        // Part i moves to (rank + i) % world: rank order.
        rotated.rotate_right(rank as usize * part);
        Ok(())
    }

    /// Every rank's `value`, indexed by rank.
    ///
    /// # Errors
    ///
    /// As for [`Collectives::all_gather`](crate::Collectives::all_gather), and [`Error::Protocol`]
    /// if a peer's value has another size.
    pub fn all_gather_pod<T: bytemuck::Pod>(&mut self, value: &T) -> Result<Vec<T>, Error> {
        self.collective("all_gather", |session, team, deadline| {
            session.all_gather_pod_with(team, value, deadline)
        })
    }

    /// [`Self::all_gather_pod`] within an existing deadline (for collectives built on it).
    pub(super) fn all_gather_pod_with<T: bytemuck::Pod>(
        &mut self,
        team: &Team,
        value: &T,
        deadline: &Deadline,
    ) -> Result<Vec<T>, Error> {
        let gathered = self.all_gather_with(team, bytemuck::bytes_of(value), deadline)?;
        (0..)
            .zip(gathered)
            .map(|(rank, bytes)| {
                bytemuck::try_pod_read_unaligned(&bytes)
                    .map_err(|_| wrong_size(team.member(rank), bytes.len() as u64, size_of::<T>()))
            })
            .collect()
    }
}
