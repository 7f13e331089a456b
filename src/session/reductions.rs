//! Reductions: all-reduce, reduce-scatter and reduce (scatter and all-to-all, which move blocks
//! without combining them, are the `exchange` module's).
//!
//! # Algorithms
//!
//! - **One shot** (up to [`ONE_SHOT_MAX_BYTES`](super::tuning::ONE_SHOT_MAX_BYTES), an all-reduce
//!   up to [`ALL_REDUCE_SLOTS_MAX_BYTES`](super::tuning::ALL_REDUCE_SLOTS_MAX_BYTES)): every rank
//!   sends its whole contribution to every other (in ring slots while it fits:
//!   [`Collectives::all_gather_into`](crate::Collectives::all_gather_into)'s path), and every rank
//!   combines all of them itself, in rank order.
//! - **One shot, read in place** (up to [`LENT_ONE_SHOT_MAX_BYTES`](super::tuning::LENT_ONE_SHOT_MAX_BYTES) of all contributions
//!   together, all-reduce only): every rank copies its contribution into its outbox, lends it to
//!   every peer, and combines every contribution itself straight from the peers' outboxes.
//! - **Two shots, in place** (larger): every rank copies its contribution once into its own
//!   outbox, but for its own slice, which only it reads (from where it lies), and lends it to
//!   every peer (a one-slot message each). Rank `r` then combines slice
//!   `r` of every contribution *straight from the peers' outboxes*, in rank order, lends its
//!   result slice, and copies every other rank's result slice out of that rank's outbox. Data
//!   moves once into an outbox and once out of one, with no staging copy of what peers read. A
//!   reduce-scatter is the first shot alone; a reduce sends the results to the root only. Data
//!   larger than [`PIECE_MAX_BYTES`](super::tuning::PIECE_MAX_BYTES) goes piece by piece, so that pieces stay in cache between
//!   the owner's copy and the peers' reads, and any size fits the outbox (an outbox under four
//!   pieces makes its pieces a quarter of its size; the ranks' outboxes must then be the same
//!   size).
//!
//! - **Symmetric buffers**: an all-reduce whose data already lies in this rank's outbox (a
//!   [`Symmetric`](super::Symmetric) buffer, or a loan) moves nothing into the outbox. Each
//!   peer `q` is lent slice `q` of a piece where it lies (a one-slot message each, a loan of just
//!   the bytes it reads), the rank combines its own slice *in place* (into scratch space and
//!   back, [`IN_PLACE_CHUNK_BYTES`] at a time), and lends that result where it lies too.
//!   Receivers take a loan of a peer's whole contribution or of just their part, so ranks with
//!   and without symmetric buffers meet in one call. The rank writes a byte its peers read only
//!   after they are done with it: slice `q` once rank `q`'s result slice has come (rank `q`
//!   combines only after reading), its own slice before any peer reads it (none reads it in the
//!   first shot), and the call returns only once every peer has given its result slice back
//!   (every rank gives the views of result slices back as soon as it has copied them). Against a
//!   result block copied back into the buffer, `bench collectives` put 2 ranks at 84 µs for
//!   1 MiB instead of 104, and 1.86 ms for 16 MiB instead of 2.11 (2026-11-27, p50).
//!
//! Both are deterministic: every result slice is combined by one rank in rank order and copied
//! bit for bit by the others (see [`crate::reduce`]).
//!
//! # Synchronisation
//!
//! No new cross-process atomics: contributions and results travel as loans, whose one-slot
//! messages, views and acknowledgements are the session's (a rank reuses a block only once
//! every peer has acknowledged its view). Two things are added to the messages: every lent piece
//! says how long its whole call is, and a loan may be a *part* of a contribution, which then
//! says how long the whole is (see `demux::frame::LoanNote`). And a symmetric all-reduce waits
//! at its end for its result slice to be given back, which every rank does as soon as it has
//! copied the result slices.
//!
//! A peer that dies mid-collective fails it, naming the first rank that died, as for every
//! collective, except in that last wait: a rank holding every result lets a peer that is gone
//! off, and fails there only at its deadline (naming a live peer still holding the slice) or on
//! an interrupt. It lets a gone peer off by forgetting it, as any departure does (see
//! `departures`). The peer may have given the slice back just before it went, its
//! acknowledgement still unread in its ring. From a forgotten rank, that acknowledgement frees
//! nothing and is no fault. Taken as a second one, it would be a protocol error naming an
//! honest rank. A peer that writes garbage into its own outbox meanwhile can only change the
//! values it contributes: reads are bounds-checked views of memory that stays mapped, so garbage
//! gives garbage values, never a fault (`tests/hostile.rs` scribbles over a rank's outbox during
//! reductions of every algorithm).
//!
//! # Trust
//!
//! A contribution's length (a part's too: the whole it says it is a part of, and the part's own
//! against what this rank reads of it), and the length of the call each piece says it belongs
//! to, are checked against the caller's (a mismatch is [`Error::Protocol`] naming the rank),
//! and a peer's bytes are read as elements only when they are aligned for them (also
//! [`Error::Protocol`] otherwise).

use super::collectives::wrong_size;
use super::demux::{Expect, LoanNote};
use super::engine::loans::LoanView;
use super::state::Deadline;
use super::state::Session;
use super::teams::Team;
use super::tuning;
use crate::error::Error;
use crate::reduce::{Element, ReduceOp, check_op, combine, combine_with};
use bytemuck::Pod;
use shmbroker_allocator::{Outbox, rank_bit};
use shmbroker_bindings::PayloadRef;
use shmbroker_bindings::kind;

/// How many bytes of its slice a rank combines at a time in two shots: each chunk of the result
/// is copied into the caller's data while it is still in the first-level cache (from scratch
/// space, for a symmetric buffer combined in place; from the result block otherwise). On
/// symmetric buffers between 2 ranks, 4 and 16 KiB measured alike (1 MiB in 81-83 µs, 16 MiB
/// in 1.64-1.69 ms), 64 KiB slower (88 µs, 1.76-1.80 ms). Without, copying each chunk back
/// while it is hot took 1 MiB from 125 to 119 µs (median of 5 runs each way, p50) and 16 MiB
/// from 2.63 to 2.55 ms, against one copy of the whole result slice after combining it.
const IN_PLACE_CHUNK_BYTES: usize = 16 << 10;

/// How long a symmetric all-reduce waits for its result slice to come back before it asks
/// whether the ranks still holding it are gone (see `Session::await_given_back`).
const DEPARTURES_AFTER: std::time::Duration = std::time::Duration::from_micros(100);

/// Rank `q`'s slice of `count` elements split over `world` ranks, as element indices: the first
/// `count % world` ranks get one more.
pub(super) fn slice_of(count: usize, world: usize, q: usize) -> std::ops::Range<usize> {
    count * q / world..count * (q + 1) / world
}

/// How a rank lends its parts of a collective and what it reads of its peers'
/// ([`Session::lend_to_every_peer`]): element ranges of the parts back to back, and the bytes of
/// the whole call, every piece together (every rank's loan says it, so that ranks that passed
/// other lengths cut into pieces of one length still tell).
pub(super) struct Shares {
    /// This rank's own elements, which it reads where they lie: not copied into the loan.
    pub(super) unread: std::ops::Range<usize>,
    /// The elements of each peer's loan this rank reads (a peer may lend just those).
    pub(super) read: std::ops::Range<usize>,
    /// The bytes of the whole call.
    pub(super) call: u64,
}

/// `bytes` (a peer's) as elements, or [`Error::Protocol`] naming `peer` when they are not
/// aligned for them.
fn elements<T: Pod>(peer: u32, bytes: &[u8]) -> Result<&[T], Error> {
    bytemuck::try_cast_slice(bytes).map_err(|_| Error::Protocol {
        peer,
        detail: format!(
            "lent {} bytes that are not whole, aligned elements of {} bytes",
            bytes.len(),
            size_of::<T>()
        ),
    })
}

/// How contributions combine: inputs (one per rank, in rank order) into an output slice.
type Combiner<'f, T> = &'f mut dyn FnMut(&[&[T]], &mut [T]) -> Result<(), Error>;

/// Which ranks get the result of a reduction.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Results {
    /// Every rank (all-reduce).
    All,
    /// The root alone (reduce).
    Root(u32),
}

impl Session {
    /// Combines every rank's `data` with `op` (a built-in operation), one shot or two (see the
    /// module docs), leaving the result where `results` says: the algorithm of
    /// [`Collectives::all_reduce`](crate::Collectives::all_reduce) and
    /// [`Collectives::reduce`](crate::Collectives::reduce).
    pub(super) fn reduce_among<T: Element>(
        &mut self,
        team: &Team,
        results: Results,
        data: &mut [T],
        op: ReduceOp,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        check_op::<T>(op)?;
        let kind = match results {
            Results::All => kind::ALL_REDUCE,
            Results::Root(_) => kind::REDUCE,
        };
        let mut combiner = |inputs: &[&[T]], out: &mut [T]| combine(op, inputs, out);
        self.reduce_with(team, kind, results, data, &mut combiner, deadline)
    }

    /// [`Collectives::all_reduce`](crate::Collectives::all_reduce) with a user operation.
    /// `op(acc, next)` folds `next` into `acc`, element by element, and is applied in rank order
    /// (`x0 ∘ x1 ∘ … ∘ x(n-1)`), so it need not be commutative. It is called on sub-slices of the data (the
    /// same ones on every rank), so it must act on each element alone: for a product of 2×2
    /// matrices, `T = [f64; 4]`.
    ///
    /// # Errors
    ///
    /// As for [`Collectives::all_reduce`](crate::Collectives::all_reduce), and [`Error::Misuse`]
    /// (on every rank, before anything is sent) for more than
    /// [`ONE_SHOT_MAX_BYTES`](super::tuning::ONE_SHOT_MAX_BYTES) a rank of elements aligned to more
    /// than 64 bytes: those are read from outbox blocks, which are aligned to 64.
    pub fn all_reduce_with<T: Pod>(
        &mut self,
        data: &mut [T],
        op: impl FnMut(&mut [T], &[T]),
    ) -> Result<(), Error> {
        self.collective("all_reduce", |session, team, deadline| {
            session.all_reduce_with_tracked(team, data, op, deadline)
        })
    }

    /// [`Self::all_reduce_with`] within its tracked deadline (which [`Deadline::settle`] then
    /// notes the outcome of).
    fn all_reduce_with_tracked<T: Pod>(
        &mut self,
        team: &Team,
        data: &mut [T],
        mut op: impl FnMut(&mut [T], &[T]),
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let mut combiner = |inputs: &[&[T]], out: &mut [T]| {
            combine_with(&mut op, inputs, out);
            Ok(())
        };
        self.reduce_with(
            team,
            kind::ALL_REDUCE,
            Results::All,
            data,
            &mut combiner,
            deadline,
        )
    }

    /// [`Collectives::reduce_scatter`](crate::Collectives::reduce_scatter) by exchanging the
    /// blocks (small inputs): block `r` of every contribution comes to rank `r`, which combines
    /// them.
    pub(super) fn reduce_scatter_exchanged<T: Element>(
        &mut self,
        team: &Team,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let mut blocks = vec![T::zeroed(); input.len()];
        let seq = self.next_seq(team, kind::REDUCE_SCATTER)?;
        self.exchange_blocks(
            team,
            kind::REDUCE_SCATTER,
            seq,
            bytemuck::cast_slice(input),
            bytemuck::cast_slice_mut(&mut blocks),
            deadline,
        )?;
        let inputs: Vec<&[T]> = blocks.chunks(output.len().max(1)).collect();
        combine(op, &inputs, output)
    }

    /// [`Collectives::reduce_scatter`](crate::Collectives::reduce_scatter) through loans (larger
    /// inputs): piece by piece along the blocks, each piece lends the same range of every block,
    /// back to back, so that any input goes through the outbox.
    pub(super) fn reduce_scatter_lent<T: Element>(
        &mut self,
        team: &Team,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let world = team.size() as usize;
        let rank = team.me() as usize;
        let len = output.len();
        let pieces = size_of_val(input).div_ceil(self.piece_bytes());
        for piece in 0..pieces {
            let range = slice_of(len, pieces, piece);
            let parts: Vec<&[T]> = (0..world)
                .map(|q| &input[q * len + range.start..q * len + range.end])
                .collect();
            let seq = self.next_seq(team, kind::REDUCE_SCATTER)?;
            // Block `rank`'s piece of every rank's lent parts, in elements: this rank reads its
            // own from `input`, so that one is not copied into its loan.
            let own = rank * range.len()..(rank + 1) * range.len();
            let shares = Shares {
                unread: own.clone(),
                read: own.clone(),
                call: size_of_val(input) as u64,
            };
            let views =
                self.lend_to_every_peer(team, kind::REDUCE_SCATTER, seq, &parts, shares, deadline)?;
            let size = size_of::<T>();
            let mine = own.start * size..own.end * size;
            let inputs = (0..)
                .zip(&views)
                .map(|(q, view)| match view {
                    None => Ok(parts[rank]),
                    Some(view) => elements(team.member(q), part_of(view, mine.clone())),
                })
                .collect::<Result<Vec<&[T]>, Error>>()?;
            combine(op, &inputs, &mut output[range])?;
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // Shared machinery

    /// The reductions' core: combines every rank's `data`, one shot or two (see the module
    /// docs), leaving the result in `data` where `results` says.
    fn reduce_with<T: Pod>(
        &mut self,
        team: &Team,
        op: u32,
        results: Results,
        data: &mut [T],
        combiner: Combiner<'_, T>,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let world = team.size() as usize;
        if world == 1 {
            let input = data.to_vec();
            return combiner(&[&input], data);
        }
        // An all-reduce lends from a smaller size, but for elements that outbox blocks are not
        // aligned for, which still go through the slots up to the one-shot limit.
        let lendable = align_of::<T>() as u64 <= shmbroker_allocator::ranges::ALIGN;
        let all = results == Results::All;
        let slots_max = tuning::reduction_slots_max(all, lendable);
        let algorithm = tuning::reduction(all, lendable, size_of_val(data), world);
        if algorithm == tuning::Reduction::Slots {
            let seq = self.next_seq(team, op)?;
            let me = team.me();
            return self.with_scratch(data.len() * world, |session, gathered: &mut [T]| {
                session.gather_parts_into(
                    team,
                    op,
                    seq,
                    bytemuck::cast_slice(data),
                    bytemuck::cast_slice_mut(gathered),
                    deadline,
                )?;
                if results == Results::All || results == Results::Root(me) {
                    combine_parts(world, gathered, data, combiner)?;
                }
                Ok(())
            });
        }
        // Larger contributions are read from outbox blocks, aligned to `ranges::ALIGN` only;
        // every rank has the same element type, so every rank refuses alike, before it sends.
        if !lendable {
            return Err(Error::Misuse(format!(
                "a reduction of more than {slots_max} bytes a rank takes elements \
                 aligned to at most {} bytes; these are aligned to {}",
                shmbroker_allocator::ranges::ALIGN,
                align_of::<T>()
            )));
        }
        // Every rank picks the algorithm from what they all share (the length and the world), so
        // a symmetric buffer here takes the one shot too, with a copy.
        if algorithm == tuning::Reduction::LentOneShot {
            return self.lent_one_shot(team, op, data, combiner, deadline);
        }
        // Pieces of about equal length, each at most `piece_bytes` (and, as the data is
        // larger than one shot takes, each with elements for every rank).
        let (call, len) = (size_of_val(data) as u64, data.len());
        let pieces = size_of_val(data).div_ceil(self.piece_bytes());
        let mut rest = data;
        for piece in 0..pieces {
            let (this, tail) =
                std::mem::take(&mut rest).split_at_mut(slice_of(len, pieces, piece).len());
            rest = tail;
            self.two_shots(team, op, results, (this, call), combiner, deadline)?;
        }
        Ok(())
    }

    /// The most bytes one piece of a large reduction lends: [`PIECE_MAX_BYTES`](super::tuning::PIECE_MAX_BYTES), or a quarter of
    /// an outbox smaller than four of them (a piece, its result slice and the previous piece's
    /// blocks not yet given back must fit together). Every rank of a reduction must then have
    /// the same outbox size, or their pieces differ and the call fails naming the rank.
    pub(super) fn piece_bytes(&self) -> usize {
        tuning::piece_bytes(self.max_loan_bytes())
    }

    /// An all-reduce in one shot, read in place: every rank lends a copy of its contribution to
    /// every peer and combines all of them itself from the peers' outboxes, in rank order, with
    /// the kernel every rank runs (so every rank holds the same bits). One exchange of one-slot
    /// messages where two shots take two; every rank reads every contribution whole.
    ///
    /// A copy, never `data` where it lies: this rank's call may return while a peer still reads
    /// its contribution, and the copy's block goes back to the outbox only once every peer has
    /// dropped its view.
    fn lent_one_shot<T: Pod>(
        &mut self,
        team: &Team,
        op: u32,
        data: &mut [T],
        combiner: Combiner<'_, T>,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let seq = self.next_seq(team, op)?;
        let shares = Shares {
            unread: 0..0,
            read: 0..data.len(),
            call: size_of_val(data) as u64,
        };
        let views = self.lend_to_every_peer(team, op, seq, &[&*data], shares, deadline)?;
        self.with_scratch(data.len(), |session, own: &mut [T]| {
            own.copy_from_slice(data);
            let inputs = session.inputs(team, own, &views, 0..data.len())?;
            combiner(&inputs, data)
        })
    }

    /// Runs `f` with `len` elements of scratch space: the session's own buffer, grown once and
    /// kept, so that small reductions do not allocate or zero one per call. It is aligned to 64
    /// bytes; an element type aligned to more gets a fresh buffer when the kept one happens not
    /// to suit it. What it holds on entry is whatever an earlier call left.
    fn with_scratch<T: Pod, R>(
        &mut self,
        len: usize,
        f: impl FnOnce(&mut Self, &mut [T]) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let mut lines = self.engine.take_scratch();
        let bytes = len * size_of::<T>();
        if lines.len() < bytes.div_ceil(64) {
            lines.resize(bytes.div_ceil(64), super::engine::ScratchLine([0; 64]));
        }
        let outcome = match bytemuck::try_cast_slice_mut(
            &mut bytemuck::cast_slice_mut::<super::engine::ScratchLine, u8>(&mut lines)[..bytes],
        ) {
            Ok(scratch) => f(self, scratch),
            Err(_) => f(self, &mut vec![T::zeroed(); len]),
        };
        self.engine.keep_scratch(lines);
        outcome
    }

    /// One piece, `data`, of a two-shot reduction of `call` bytes.
    fn two_shots<T: Pod>(
        &mut self,
        team: &Team,
        op: u32,
        results: Results,
        (data, call): (&mut [T], u64),
        combiner: Combiner<'_, T>,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let (rank, world) = (team.me(), team.size() as usize);
        let mine = slice_of(data.len(), world, rank as usize);
        // First shot: lend this contribution (each peer's slice where it lies, when it is a
        // symmetric buffer); combine this rank's slice of every one.
        let seq = self.next_seq(team, op)?;
        if results == Results::All
            && let Some(views) =
                self.lend_slices_where_they_lie(team, op, seq, (data, call), deadline)?
        {
            return self.two_shots_in_place(team, op, data, views, combiner, deadline);
        }
        let shares = Shares {
            unread: mine.clone(),
            read: mine.clone(),
            call,
        };
        let views = self.lend_to_every_peer(team, op, seq, &[&*data], shares, deadline)?;
        let root = match results {
            Results::All => None,
            Results::Root(root) => Some(root),
        };
        let mut result = self.loan_within(size_of_val(&data[mine.clone()]), deadline)?;
        {
            let theirs = self.peer_slices(team, &views, mine.clone())?;
            let out: &mut [T] = bytemuck::try_cast_slice_mut(&mut result).map_err(|_| {
                Error::Misuse("an outbox block is not aligned for the element type".into())
            })?;
            // The result slice goes into `data` too where it is due, chunk by chunk while each
            // is still in the first-level cache.
            let keep = root.is_none_or(|root| root == rank);
            combine_slice(rank as usize, data, &theirs, mine, combiner, out, keep)?;
        }
        // The views go back to their owners with the next message.
        drop(views);
        // Second shot: the result slices, to every rank or to the root.
        let seq = self.next_seq(team, op)?;
        let targets: Vec<u32> = match root {
            None => team.peers().collect(),
            Some(root) if root == rank => Vec::new(),
            Some(root) => vec![team.member(root)],
        };
        self.lend(op, seq, result, &targets, deadline)?;
        if root.is_some_and(|root| root != rank) {
            return Ok(());
        }
        self.take_result_slices(team, op, seq, data, deadline)
    }

    /// The rest of a two-shot all-reduce piece whose peers' slices this rank lent where they
    /// lie: it combines its own slice in place, lends the result where it lies, copies the
    /// others' result slices, and returns once every peer is done reading its result.
    fn two_shots_in_place<T: Pod>(
        &mut self,
        team: &Team,
        op: u32,
        data: &mut [T],
        views: Vec<Option<LoanView>>,
        combiner: Combiner<'_, T>,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let mine = slice_of(data.len(), team.size() as usize, team.me() as usize);
        self.combine_in_place(team, data, &views, mine.clone(), combiner)?;
        drop(views);
        let seq = self.next_seq(team, op)?;
        let peers: Vec<u32> = team.peers().collect();
        let result: &[u8] = bytemuck::cast_slice(&data[mine.clone()]);
        self.flush_view_acks()?;
        let lent = self
            .engine
            .lend_in_place(result, Outbox::receivers(peers.iter().copied()));
        match lent {
            Some(lent) => self.send_ref(op, seq, lent, &peers, deadline)?,
            // Not lent in the first shot, so it can be now; a copy all the same if not.
            None => {
                let mut loan = self.loan_within(result.len(), deadline)?;
                loan.copy_from_slice(result);
                self.lend(op, seq, loan, &peers, deadline)?;
            }
        }
        self.take_result_slices(team, op, seq, data, deadline)?;
        // The caller may write the result slice once every peer has copied it.
        match lent {
            Some(lent) => self.await_given_back(lent, deadline),
            None => Ok(()),
        }
    }

    /// Waits until every peer has given `lent` back (this rank's result slice, lent where it
    /// lies) or is gone: a rank that died or left reads nothing more, and is let off by
    /// forgetting it, as every departure is (see the module docs). Only an
    /// interrupt, the deadline, or a holder that gave this collective up (whose
    /// acknowledgement may never be sent: [`Error::PeerGaveUp`]) end the wait early, naming a
    /// rank that still holds it; a death elsewhere does not fail a call that already holds
    /// every result, as it would leave the caller free to write the buffer while live peers
    /// still copy out of it.
    ///
    /// Each peer's acknowledgement fits in its ring to this rank: this rank drained that ring
    /// up to the peer's result slice, after which the peer sends only acknowledgements.
    ///
    /// Whether a holder is gone is asked of the kernel (a `poll` of every peer's pidfd) only once
    /// the wait has lasted [`DEPARTURES_AFTER`]: a live peer gives the slice back within
    /// microseconds, and a death takes longer than that to show anyway.
    fn await_given_back(&mut self, lent: PayloadRef, deadline: &Deadline) -> Result<(), Error> {
        let mut since: Option<std::time::Instant> = None;
        loop {
            let holders = self.engine.owed_for(lent);
            let ranks = (0..self.world_size()).filter(|&rank| holders & rank_bit(rank) != 0);
            let Some(mut rank) = ranks.clone().next() else {
                return Ok(());
            };
            if since.is_some_and(|since| since.elapsed() >= DEPARTURES_AFTER) {
                let mut holding = None;
                for holder in ranks {
                    if self.inner.departure(holder).is_some() {
                        self.engine.forget_peer(holder);
                    } else {
                        holding.get_or_insert(holder);
                    }
                }
                let Some(live) = holding else {
                    return Ok(());
                };
                rank = live;
            }
            if self.interrupt_requested(deadline) {
                return Err(Error::Interrupted);
            }
            deadline.waits_for(rank);
            if deadline.left().is_zero() {
                return Err(self.timed_out(deadline, rank));
            }
            // A live holder that gave this collective up gives nothing back.
            if since.is_some_and(|since| since.elapsed() >= super::engine::receive::MISMATCH_LOOK) {
                self.look_for_mismatch(rank, deadline)?;
            }
            self.poll_acks()?;
            let now = std::time::Instant::now();
            super::engine::receive::idle_wait(now.duration_since(*since.get_or_insert(now)));
        }
    }

    /// Combines slice `mine` of every contribution (this rank's from `data`, the others' from
    /// their `views`) into `data[mine]`, where this rank's own lies, through a chunk of scratch
    /// space (see [`combine_slice`]).
    fn combine_in_place<T: Pod>(
        &mut self,
        team: &Team,
        data: &mut [T],
        views: &[Option<LoanView>],
        mine: std::ops::Range<usize>,
        combiner: Combiner<'_, T>,
    ) -> Result<(), Error> {
        let chunk = (IN_PLACE_CHUNK_BYTES / size_of::<T>()).max(1);
        let me = team.me() as usize;
        let theirs = self.peer_slices(team, views, mine.clone())?;
        self.with_scratch(chunk.min(mine.len()), |_, out: &mut [T]| {
            combine_slice(me, data, &theirs, mine, combiner, out, true)
        })
    }

    /// Elements `mine` of every peer's lent contribution, in rank order (empty for this rank).
    fn peer_slices<'v, T: Pod>(
        &self,
        team: &Team,
        views: &'v [Option<LoanView>],
        mine: std::ops::Range<usize>,
    ) -> Result<Vec<&'v [T]>, Error> {
        let size = size_of::<T>();
        let part = mine.start * size..mine.end * size;
        (0..)
            .zip(views)
            .map(|(q, view)| match view {
                None => Ok(&[][..]),
                Some(view) => elements(team.member(q), part_of(view, part.clone())),
            })
            .collect()
    }

    /// Copies every other rank's result slice of collective `op` number `seq` into its place in
    /// `data`, and gives the views back at once: a peer that lent its result where it lies
    /// waits for them.
    fn take_result_slices<T: Pod>(
        &mut self,
        team: &Team,
        op: u32,
        seq: u64,
        data: &mut [T],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let (rank, world) = (team.me(), team.size() as usize);
        let expect = Expect::Collective { op, seq };
        for q in (0..world as u32).filter(|&q| q != rank) {
            let slice = slice_of(data.len(), world, q as usize);
            let peer = team.member(q);
            let view = self.take_loan(peer, expect, deadline)?;
            let due = size_of_val(&data[slice.clone()]);
            if view.len() != due {
                return Err(wrong_size(peer, view.len() as u64, due));
            }
            bytemuck::cast_slice_mut(&mut data[slice]).copy_from_slice(&view);
        }
        self.flush_view_acks()
    }

    /// Copies `parts`, back to back, into this rank's outbox and lends them to every peer as
    /// collective `op` number `seq`; returns a view of each peer's, in rank order (`None` for
    /// this rank), as [`Self::views_of_every_peer`] checks them. The elements `shares.unread`
    /// (this rank's own slice or block, which it reads from where it lies, not from the loan)
    /// are not copied: the loan keeps its length and layout, and holds there whatever the
    /// outbox held before.
    pub(super) fn lend_to_every_peer<T: Pod>(
        &mut self,
        team: &Team,
        op: u32,
        seq: u64,
        parts: &[&[T]],
        shares: Shares,
        deadline: &Deadline,
    ) -> Result<Vec<Option<LoanView>>, Error> {
        let len: usize = parts.iter().map(|part| size_of_val(*part)).sum();
        let size = size_of::<T>();
        let unread = shares.unread.start * size..shares.unread.end * size;
        let mut loan = self.loan_within(len, deadline)?;
        let mut at = 0;
        for part in parts {
            let bytes: &[u8] = bytemuck::cast_slice(part);
            // This part's bytes before and after the unread range.
            let end = at + bytes.len();
            let skip = unread.start.clamp(at, end)..unread.end.clamp(at, end);
            loan[at..skip.start].copy_from_slice(&bytes[..skip.start - at]);
            loan[skip.end..end].copy_from_slice(&bytes[skip.end - at..]);
            at = end;
        }
        let bytes_len = loan.len();
        let peers: Vec<u32> = team.peers().collect();
        let note = LoanNote {
            part_of: 0,
            call: shares.call,
        };
        self.lend_noted(op, seq, loan, &peers, note, deadline)?;
        let read = shares.read.start * size..shares.read.end * size;
        self.views_of_every_peer(team, op, seq, (bytes_len, read), shares.call, deadline)
    }

    /// Lends each peer `q` slice `q` of `data` where it lies (a one-slot message each), when
    /// `data` is in a block of this rank's outbox that this rank holds (a
    /// [`Symmetric`](super::Symmetric) buffer or a loan) and every slice has elements; `None`
    /// otherwise, having sent nothing. Returns a view of every peer's contribution, as
    /// [`Self::views_of_every_peer`] checks them.
    ///
    /// Only an all-reduce may: it writes slice `q` of `data` only once rank `q`'s result slice
    /// has come, so after rank `q` has read it, and its own slice only after combining it (no
    /// peer reads that one in the first shot). A reduce's ranks other than the root, and a
    /// reduce-scatter, return without such a word from every peer, so they lend a copy.
    fn lend_slices_where_they_lie<T: Pod>(
        &mut self,
        team: &Team,
        op: u32,
        seq: u64,
        (data, call): (&[T], u64),
        deadline: &Deadline,
    ) -> Result<Option<Vec<Option<LoanView>>>, Error> {
        let (rank, world, size) = (team.me(), team.size() as usize, size_of::<T>());
        if data.len() < world {
            return Ok(None);
        }
        let bytes = |q: u32| {
            let slice = slice_of(data.len(), world, q as usize);
            slice.start * size..slice.end * size
        };
        let peers: Vec<u32> = (0..world as u32).filter(|&q| q != rank).collect();
        let parts: Vec<_> = peers
            .iter()
            .map(|&q| (bytes(q), Outbox::receivers([team.member(q)])))
            .collect();
        self.flush_view_acks()?;
        let Some(lent) = self
            .engine
            .lend_in_place_parts(bytemuck::cast_slice(data), parts)
        else {
            return Ok(None);
        };
        self.engine.note_read_in_place();
        let refs: Vec<(u32, PayloadRef)> =
            peers.iter().map(|&q| team.member(q)).zip(lent).collect();
        let note = LoanNote {
            part_of: size_of_val(data) as u64,
            call,
        };
        self.send_refs(op, seq, refs.iter().copied(), note, deadline)?;
        self.views_of_every_peer(
            team,
            op,
            seq,
            (size_of_val(data), bytes(rank)),
            call,
            deadline,
        )
        .map(Some)
    }

    /// A view of every peer's loan of collective `op` number `seq`, in rank order (`None` for
    /// this rank), each checked to be a loan of a whole contribution of `bytes_len` bytes, or of
    /// just the bytes `read` of one (see [`part_of`]), in a call of `call` bytes.
    fn views_of_every_peer(
        &mut self,
        team: &Team,
        op: u32,
        seq: u64,
        (bytes_len, read): (usize, std::ops::Range<usize>),
        call: u64,
        deadline: &Deadline,
    ) -> Result<Vec<Option<LoanView>>, Error> {
        let expect = Expect::Collective { op, seq };
        let mut views = Vec::with_capacity(team.size() as usize);
        for rank in 0..team.size() {
            if rank == team.me() {
                views.push(None);
                continue;
            }
            let peer = team.member(rank);
            let view = self.take_loan(peer, expect, deadline)?;
            let note = view.note;
            // A loan of the whole contribution, or of just the bytes this rank reads of one as
            // long as this rank's, in a call as long as this rank's.
            let whole = if note.part_of == 0 {
                view.len() as u64
            } else {
                note.part_of
            };
            if whole != bytes_len as u64 {
                return Err(wrong_size(peer, whole, bytes_len));
            }
            if note.part_of != 0 && view.len() != read.len() {
                return Err(Error::Protocol {
                    peer,
                    detail: format!(
                        "lent {} bytes of its contribution where this rank reads {}",
                        view.len(),
                        read.len()
                    ),
                });
            }
            if note.call != call {
                return Err(Error::Protocol {
                    peer,
                    detail: format!(
                        "lent a piece of a call of {} bytes where this rank's call has {call} \
                         (did it pass another length?)",
                        note.call
                    ),
                });
            }
            views.push(Some(view));
        }
        Ok(views)
    }

    /// Every rank's elements `range` in rank order: this rank's from `own`, the others' from
    /// their lent `views`.
    fn inputs<'v, T: Pod>(
        &self,
        team: &Team,
        own: &'v [T],
        views: &'v [Option<LoanView>],
        range: std::ops::Range<usize>,
    ) -> Result<Vec<&'v [T]>, Error> {
        let mut inputs = self.peer_slices(team, views, range.clone())?;
        inputs[team.me() as usize] = &own[range];
        Ok(inputs)
    }
}

/// Bytes `read` of a peer's lent contribution, from `view`: a loan of the whole contribution,
/// or of just those bytes ([`Session::views_of_every_peer`] checked which). A rank lending a
/// symmetric buffer lends each peer only the slice that peer reads.
fn part_of(view: &LoanView, read: std::ops::Range<usize>) -> &[u8] {
    if view.note.part_of == 0 {
        &view[read]
    } else {
        view
    }
}

/// Combines slice `mine` of every contribution into `out`, [`IN_PLACE_CHUNK_BYTES`] at a time:
/// rank `me`'s from `data`, the others' from `theirs` (their elements `mine`, in rank order).
/// `out` holds the whole slice, or one chunk reused for each (scratch). With `keep`, each chunk
/// of the result is then copied into `data[mine]`, while it is still in the first-level cache:
/// this rank's own elements of that chunk are read by then, and later chunks read others.
fn combine_slice<T: Pod>(
    me: usize,
    data: &mut [T],
    theirs: &[&[T]],
    mine: std::ops::Range<usize>,
    combiner: Combiner<'_, T>,
    out: &mut [T],
    keep: bool,
) -> Result<(), Error> {
    let chunk = (IN_PLACE_CHUNK_BYTES / size_of::<T>()).max(1);
    let whole = out.len() == mine.len();
    for at in (0..mine.len()).step_by(chunk) {
        let range = at..(at + chunk).min(mine.len());
        let own = mine.start + range.start..mine.start + range.end;
        let out = if whole {
            &mut out[range.clone()]
        } else {
            &mut out[..range.len()]
        };
        {
            let inputs: Vec<&[T]> = (0..)
                .zip(theirs)
                .map(|(q, input)| {
                    if q == me {
                        &data[own.clone()]
                    } else {
                        &input[range.clone()]
                    }
                })
                .collect();
            combiner(&inputs, out)?;
        }
        if keep {
            data[own].copy_from_slice(out);
        }
    }
    Ok(())
}

/// Combines `gathered` (the contributions of `world` ranks, `data.len()` elements each, in rank
/// order) into `data`, with the slices on the stack: 8 of them for up to 8 ranks (the common
/// case pays for no more), else as many as a world can have.
fn combine_parts<T: Pod>(
    world: usize,
    gathered: &[T],
    data: &mut [T],
    combiner: Combiner<'_, T>,
) -> Result<(), Error> {
    if world <= 8 {
        combine_parts_in::<T, 8>(world, gathered, data, combiner)
    } else {
        combine_parts_in::<T, { shmbroker_handshake::MAX_WORLD_SIZE as usize }>(
            world, gathered, data, combiner,
        )
    }
}

/// [`combine_parts`] with room for `N` slices (`world <= N`).
fn combine_parts_in<T: Pod, const N: usize>(
    world: usize,
    gathered: &[T],
    data: &mut [T],
    combiner: Combiner<'_, T>,
) -> Result<(), Error> {
    let mut inputs: [&[T]; N] = [&[]; N];
    for (input, part) in inputs.iter_mut().zip(gathered.chunks(data.len().max(1))) {
        *input = part;
    }
    combiner(&inputs[..world], data)
}
