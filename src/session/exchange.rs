//! Moving blocks between ranks without combining them: scatter, all-to-all and all-to-all-v
//! (and the block exchange under a small reduce-scatter).
//!
//! Scatter: the root sends each rank its block. All-to-all with blocks under
//! [`LEND_MIN_BLOCK_BYTES`](super::tuning::LEND_MIN_BLOCK_BYTES) or over [`LEND_MAX_BLOCK_BYTES`](super::tuning::LEND_MAX_BLOCK_BYTES), and every all-to-all-v: `world - 1` rounds of pairwise exchange
//! through the rings, in round `k` sending to rank `rank + k` while receiving from rank
//! `rank - k`, so that no round waits on a third rank. All-to-all with blocks between: each rank
//! lends its blocks for the others once, piece by piece, and copies its own out of every peer's
//! outbox (the reduce-scatter's first shot, with a copy where it combines). A block whose
//! length is not what its receiver expects is [`Error::Protocol`] naming its sender.
//!
//! The lent path needs no new protocol: loans, their views and acknowledgements are the
//! session's (a rank reuses an outbox block only once every peer has dropped its view). All-to-all-v
//! stays pairwise: its ranks do not know each other's totals, so they cannot agree on pieces.

use super::collectives::check_part;
use super::demux::{Expect, Incoming, Sink};
use super::engine::outgoing::Targets;
use super::state::Deadline;
use super::state::Session;
use super::teams::Team;
use crate::error::Error;
use shmbroker_bindings::kind;

impl Session {
    /// [`Collectives::scatter`](crate::Collectives::scatter): the root sends each rank its
    /// block.
    pub(super) fn flat_scatter(
        &mut self,
        team: &Team,
        root: u32,
        input: Option<&[u8]>,
        output: &mut [u8],
        seq: u64,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let block = output.len();
        let Some(input) = input else {
            let expect = Expect::Collective {
                op: kind::SCATTER,
                seq,
            };
            let root = team.member(root);
            let mut incoming = [Incoming::new(root, expect, Sink::Slice(output))];
            self.receive_all(&mut incoming, deadline)?;
            let [incoming] = incoming;
            return check_part(incoming, block);
        };
        let world = team.size() as usize;
        if input.len() != block * world {
            return Err(Error::Misuse(format!(
                "scatter needs an input of {world} blocks of the output's {block} bytes, got {}",
                input.len()
            )));
        }
        for (rank, at) in (0..).zip((0..world).map(|q| q * block)) {
            let part = &input[at..at + block];
            if rank == root {
                output.copy_from_slice(part);
            } else {
                let to = team.member(rank);
                self.send_to(kind::SCATTER, seq, part, Targets::One(to), deadline)?;
            }
        }
        Ok(())
    }

    /// A large all-to-all read in place: piece by piece along the blocks, every rank copies the
    /// same range of each block it sends into its outbox (its own block stays home), lends that
    /// to every peer, and copies its own range out of each peer's loan. A block crosses memory
    /// twice (into the sender's outbox, out into the receiver's `output`), and every rank reads
    /// all its peers at once, where the pairwise exchange takes `world - 1` rounds.
    pub(super) fn lend_blocks(
        &mut self,
        team: &Team,
        input: &[u8],
        output: &mut [u8],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let (rank, world) = (team.me() as usize, team.size() as usize);
        let block = input.len() / world;
        output[rank * block..(rank + 1) * block]
            .copy_from_slice(&input[rank * block..(rank + 1) * block]);
        let pieces = (block * (world - 1)).div_ceil(self.piece_bytes());
        for piece in 0..pieces {
            let range = super::reductions::slice_of(block, pieces, piece);
            let at = |q: usize| q * block + range.start..q * block + range.end;
            let parts: Vec<&[u8]> = (0..world)
                .filter(|&q| q != rank)
                .map(|q| &input[at(q)])
                .collect();
            let seq = self.next_seq(team, kind::ALL_TO_ALL)?;
            // Every rank reads its own part of each loan, at an offset that depends on the
            // lender: the whole loan is due.
            let shares = super::reductions::Shares {
                unread: 0..0,
                read: 0..range.len() * (world - 1),
                call: input.len() as u64,
            };
            let views =
                self.lend_to_every_peer(team, kind::ALL_TO_ALL, seq, &parts, shares, deadline)?;
            for (q, view) in views.iter().enumerate() {
                let Some(view) = view else { continue };
                // Rank q's loan holds its parts for every rank but itself, in rank order.
                let index = if rank < q { rank } else { rank - 1 };
                let mine = index * range.len()..(index + 1) * range.len();
                output[at(q)].copy_from_slice(&view[mine]);
            }
        }
        Ok(())
    }

    /// [`Collectives::all_to_all_v`](crate::Collectives::all_to_all_v): its counts checked,
    /// then a pairwise exchange.
    pub(super) fn pairwise_v(
        &mut self,
        team: &Team,
        input: &[u8],
        send_counts: &[usize],
        output: &mut [u8],
        recv_counts: &[usize],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let world = team.size() as usize;
        let sent: usize = send_counts.iter().sum();
        let received: usize = recv_counts.iter().sum();
        if send_counts.len() != world
            || recv_counts.len() != world
            || sent != input.len()
            || received != output.len()
        {
            return Err(Error::Misuse(format!(
                "all_to_all_v needs {world} send and receive counts adding up to the buffers' \
                 lengths; got {} adding up to {sent} for {} bytes and {} adding up to {received} \
                 for {} bytes",
                send_counts.len(),
                input.len(),
                recv_counts.len(),
                output.len()
            )));
        }
        // What this rank sends itself is what it receives from itself: checked before anything
        // is sent (it was a panic in the copy).
        let me = team.me() as usize;
        if send_counts[me] != recv_counts[me] {
            return Err(Error::Misuse(format!(
                "all_to_all_v: this rank sends itself {} bytes but expects {} from itself",
                send_counts[me], recv_counts[me]
            )));
        }
        let seq = self.next_seq(team, kind::ALL_TO_ALL)?;
        let offsets = |counts: &[usize]| -> Vec<usize> {
            counts
                .iter()
                .scan(0, |at, &count| {
                    let start = *at;
                    *at += count;
                    Some(start)
                })
                .collect()
        };
        let (sends, receives) = (offsets(send_counts), offsets(recv_counts));
        let block = |q: usize| sends[q]..sends[q] + send_counts[q];
        let rank = team.me() as usize;
        output[receives[rank]..receives[rank] + recv_counts[rank]]
            .copy_from_slice(&input[block(rank)]);
        self.pairwise(
            team,
            kind::ALL_TO_ALL,
            seq,
            deadline,
            |q| (block(q), receives[q]..receives[q] + recv_counts[q]),
            input,
            output,
        )
    }

    // -----------------------------------------------------------------------------------------
    // Shared machinery

    /// Block `q` of `input` to rank `q` and block `q` of `output` from rank `q`, all blocks of
    /// one length, as collective `op` number `seq`.
    pub(super) fn exchange_blocks(
        &mut self,
        team: &Team,
        op: u32,
        seq: u64,
        input: &[u8],
        output: &mut [u8],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let world = team.size() as usize;
        let block = input.len() / world;
        let rank = team.me() as usize;
        output[rank * block..(rank + 1) * block]
            .copy_from_slice(&input[rank * block..(rank + 1) * block]);
        self.pairwise(
            team,
            op,
            seq,
            deadline,
            |q| (q * block..(q + 1) * block, q * block..(q + 1) * block),
            input,
            output,
        )
    }

    /// Pairwise exchange in `world - 1` rounds: in round `k` this rank sends `input[to]` to rank
    /// `rank + k` while it receives `output[from]` from rank `rank - k` (the ranges `ranges(q)`
    /// gives for each), so every rank has one peer to send to and one to hear from per round
    /// and no round waits on a third rank.
    #[allow(
        clippy::too_many_arguments,
        reason = "one collective's inputs, none to group"
    )]
    fn pairwise(
        &mut self,
        team: &Team,
        op: u32,
        seq: u64,
        deadline: &Deadline,
        ranges: impl Fn(usize) -> (std::ops::Range<usize>, std::ops::Range<usize>),
        input: &[u8],
        output: &mut [u8],
    ) -> Result<(), Error> {
        let (rank, world) = (team.me(), team.size());
        let expect = Expect::Collective { op, seq };
        for round in 1..world {
            let to = (rank + round) % world;
            let from = (rank + world - round) % world;
            let sending = ranges(to as usize).0;
            let receiving = ranges(from as usize).1;
            let due = receiving.len();
            let (to, from) = (team.member(to), team.member(from));
            let mut incoming = [Incoming::new(
                from,
                expect,
                Sink::Slice(&mut output[receiving]),
            )];
            self.send_while_receiving(
                op,
                seq,
                (&input[sending], Targets::One(to)),
                &mut incoming,
                deadline,
            )?;
            let [incoming] = incoming;
            check_part(incoming, due)?;
        }
        Ok(())
    }
}
