//! Which algorithm each collective runs, and every threshold behind the choice, in one place:
//! the algorithms live with their calls, the choice here (as Open MPI keeps
//! `coll_tuned_*_decision_fixed.c` apart from `coll_tuned_allreduce.c`).
//!
//! Every rank of a call chooses from what all of them share (the team's size, the lengths every
//! rank passes, the element type), so they all choose alike without a word.
//!
//! | Call | Algorithms | Chosen by |
//! |---|---|---|
//! | barrier | flat; dissemination | `barrier`: [`FLAT_BARRIER_MAX`] |
//! | broadcast | flat; binomial tree | `broadcast`: [`FLAT_BROADCAST_MAX`] |
//! | gather | flat; binomial tree | `gather`: [`FLAT_GATHER_MAX`], [`TREE_PART_MAX`] |
//! | all-gather into a buffer | flat; Bruck | `all_gather`: [`FLAT_GATHER_MAX`], [`BRUCK_MAX_BYTES`] |
//! | its flat parts | ring slots; lent | `all_gather_lends`: [`ALL_GATHER_SLOTS_MAX_BYTES`], [`ALL_GATHER_LEND_MAX_RANKS`] |
//! | all-to-all | pairwise; lent | `all_to_all`: [`LEND_MIN_BLOCK_BYTES`], [`LEND_MAX_BLOCK_BYTES`] |
//! | all-reduce, reduce | slots; one shot read in place; two shots | `reduction`: [`ALL_REDUCE_SLOTS_MAX_BYTES`], [`ONE_SHOT_MAX_BYTES`], [`LENT_ONE_SHOT_MAX_BYTES`] |
//! | reduce-scatter | block exchange; two shots | `reduce_scatter_exchanges`: [`ONE_SHOT_MAX_BYTES`] |
//! | two shots | pieces | `piece_bytes`: [`PIECE_MAX_BYTES`] |
//!
//! **Unstable:** public only for shmbroker's own tests and benchmarks, hidden from the
//! documentation and outside the API's stability promise; the thresholds change as
//! measurements do. [`FLAT_BROADCAST_MAX`] is part of the split session's thread rules, and
//! stays public as `shmbroker::session::FLAT_BROADCAST_MAX`.
//!
//! The figures in the thresholds' docs come from `bench collectives` on the 2-vCPU guests the
//! project is built on; `docs/bench/results.md` has the runs.

/// The largest world whose barrier is flat: every rank tells every other rank it arrived and
/// waits for all of them at once (one hop; at most 56 messages in all). Larger worlds
/// disseminate, in ceil(log2(world)) rounds of one message each way: O(n log n) messages instead
/// of O(n²), but one hop per round. Crowded on 2 CPUs both take about as long at 4 and 8 ranks;
/// parked, the hops are wake-ups in a row (8 ranks: 86 µs disseminating, 63 µs flat), hence 8.
pub const FLAT_BARRIER_MAX: u32 = 8;

/// The largest world whose broadcast is flat (the root sends to every rank); larger worlds
/// broadcast down a binomial tree, so the root sends ceil(log2(n)) messages instead of n - 1.
/// Part of the split session's thread rules: the root's side of a flat broadcast waits for a
/// slow rank's room without holding the session.
pub const FLAT_BROADCAST_MAX: u32 = 8;

/// The largest world whose gather is flat, and whose all-gather of a small part is flat (every
/// rank sends its part to every other). Larger worlds gather up a binomial tree, and all-gather
/// by Bruck's algorithm in ceil(log2(n)) rounds when each part is at most [`BRUCK_MAX_BYTES`]
/// (parts are forwarded, so large ones are cheaper sent once into the outbox, flat).
pub const FLAT_GATHER_MAX: u32 = 8;

/// The largest part an all-gather into a buffer gathers by Bruck's algorithm.
pub const BRUCK_MAX_BYTES: usize = 1024;

/// The largest part a tree gather forwards up the tree; larger parts go straight to the root.
/// Also a bound every receiver checks on the wire, so every rank must have the same.
pub const TREE_PART_MAX: usize = BRUCK_MAX_BYTES;

/// The largest part an all-gather into a buffer sends in ring slots (one per 64 bytes); a larger
/// one, up to the eager limit, is copied into the outbox and lent to every peer, one slot each,
/// in teams of up to [`ALL_GATHER_LEND_MAX_RANKS`]. Measured 2026-11-27 (slots and lent in turn,
/// p50): 1 KiB between 2 hot ranks 1.66-1.79 µs in slots, 1.04-1.22 µs lent (1.57-1.64x Open
/// MPI, against 1.01-1.21x).
pub const ALL_GATHER_SLOTS_MAX_BYTES: usize = 512;

/// The largest team whose all-gather lends parts above [`ALL_GATHER_SLOTS_MAX_BYTES`]: the
/// largest measured where lending did not lose. With 8 ranks parked on 2 cores, 1 KiB lent took
/// 74-78 µs against 60-72 µs in slots (four runs each; every lent part brings an
/// acknowledgement back, which wakes a parked sender); 4 ranks took the same time either way
/// (34-40 µs), and 2 ranks were faster lent.
pub const ALL_GATHER_LEND_MAX_RANKS: u32 = 4;

/// All-to-all blocks from this many bytes up to [`LEND_MAX_BLOCK_BYTES`] are lent from the
/// outboxes to every peer at once; others go pairwise through the rings. Measured at 2 and 4
/// ranks on 2 cores, each way in turn: lent, 1-2 KiB blocks took 0.65-0.75 of the pairwise time
/// and 16-32 KiB blocks 0.6-0.8; no smaller block was measured.
pub const LEND_MIN_BLOCK_BYTES: usize = 1 << 10;

/// The largest all-to-all block that is lent: from 512 KiB blocks up the pairwise exchange was
/// as fast or faster (8 MiB blocks: 0.83-0.91x Open MPI pairwise, 0.92-0.99x lent, 2 ranks), as
/// its chunks let a sender copy the next while its receiver copies the last, where lending
/// copies every block twice in a row.
pub const LEND_MAX_BLOCK_BYTES: usize = 256 << 10;

/// The largest contribution an all-reduce (and a reduce-scatter, a reduce) combines in one
/// shot; larger ones take two (see the `reductions` module). One shot sends each contribution to
/// every peer slot by slot through the rings, two shots lend it at once: 4 KiB at 2 ranks took
/// 2.4-3.7 µs in one shot and 1.7 µs in two (three runs each), and at 4 ranks on 2 CPUs both
/// between 12 and 18 µs.
pub const ONE_SHOT_MAX_BYTES: usize = 2 << 10;

/// The largest contribution an all-reduce sends through the ring slots; a larger one, up to
/// [`LENT_ONE_SHOT_MAX_BYTES`] of all contributions together, is lent (one shot read in place),
/// which files one slot per peer instead of a slot per 64 bytes. Measured 2026-11-27 (this bound
/// and [`ONE_SHOT_MAX_BYTES`] in turn, twice, p50): 2 ranks, 1 KiB 1.22-1.57 µs lent against
/// 1.60-1.65 µs in slots, 2 KiB 1.44-1.89 against 1.99-2.13; 4 ranks on 2 cores, 1 KiB 2.3-8.0
/// against 7.4-8.6, 2 KiB 7.0-8.3 against 4.0-11.7. Lent was slower below it: 64 B took 1.07 µs
/// against 0.50, 256 B 1.02 against 0.74.
pub const ALL_REDUCE_SLOTS_MAX_BYTES: usize = 512;

/// An all-reduce whose contributions, all together, take at most this many bytes (and one
/// contribution more than [`ALL_REDUCE_SLOTS_MAX_BYTES`]) is combined in one shot read in place:
/// every rank combines every peer's lent contribution itself. Larger ones take two shots.
/// Measured 2026-11-26 (each way in turn, p50 over Open MPI): 2 ranks, 4 KiB 0.81-0.92x against
/// 1.01-1.21x in two shots, 64 KiB 0.85x against 1.09-1.12x; 4 ranks on 2 cores, 4 KiB
/// 0.23-0.65x against 0.69-1.01x, but 64 KiB 1.88-1.93x against 0.64-0.84x, where every rank
/// combining all four contributions costs more than a second exchange. Measured again with the
/// faster kernels (2026-11-27): with this bound at 1 MiB, the one shot took 1.15x the two shots'
/// time between 2 ranks at 128 and 256 KiB, and 2.5x at 4 ranks and 64 KiB.
pub const LENT_ONE_SHOT_MAX_BYTES: usize = 128 << 10;

/// The most bytes of a contribution the two-shot algorithm lends at once: a piece in flight
/// stays in the last-level cache between the owner's copy and the peers' reads.
pub const PIECE_MAX_BYTES: usize = 1 << 20;

/// How a barrier runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Barrier {
    Flat,
    Dissemination,
}

/// The barrier of a team of `world` ranks.
pub(crate) fn barrier(world: u32) -> Barrier {
    if world <= FLAT_BARRIER_MAX {
        Barrier::Flat
    } else {
        Barrier::Dissemination
    }
}

/// How a collective with a root runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rooted {
    Flat,
    Tree,
}

/// The broadcast of a team of `world` ranks.
pub(crate) fn broadcast(world: u32) -> Rooted {
    if world <= FLAT_BROADCAST_MAX {
        Rooted::Flat
    } else {
        Rooted::Tree
    }
}

/// The gather of a team of `world` ranks.
pub(crate) fn gather(world: u32) -> Rooted {
    if world <= FLAT_GATHER_MAX {
        Rooted::Flat
    } else {
        Rooted::Tree
    }
}

/// How an all-gather into a buffer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllGather {
    Flat,
    Bruck,
}

/// The all-gather of `part` bytes a rank in a team of `world`.
pub(crate) fn all_gather(world: u32, part: usize) -> AllGather {
    if world > FLAT_GATHER_MAX && part <= BRUCK_MAX_BYTES {
        AllGather::Bruck
    } else {
        AllGather::Flat
    }
}

/// Whether a flat all-gather's part of `part` bytes is lent from the outbox rather than sent in
/// ring slots, in a team of `world`, when parts up to `eager_limit` bytes go eagerly.
pub(crate) fn all_gather_lends(world: u32, part: usize, eager_limit: usize) -> bool {
    part > ALL_GATHER_SLOTS_MAX_BYTES && part <= eager_limit && world <= ALL_GATHER_LEND_MAX_RANKS
}

/// How an all-to-all runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllToAll {
    Pairwise,
    Lent,
}

/// The all-to-all of blocks of `block` bytes in a team of `world`.
pub(crate) fn all_to_all(world: usize, block: usize) -> AllToAll {
    if world > 1 && (LEND_MIN_BLOCK_BYTES..=LEND_MAX_BLOCK_BYTES).contains(&block) {
        AllToAll::Lent
    } else {
        AllToAll::Pairwise
    }
}

/// How an all-reduce or a reduce runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reduction {
    /// Every contribution sent to every peer through the ring slots (one shot).
    Slots,
    /// Every contribution lent to every peer, each combining them all (one shot read in place).
    LentOneShot,
    /// A reduce-scatter and a gather, lent, piece by piece.
    TwoShots,
}

/// The most bytes a rank's contribution goes through the slots with: an all-reduce (`all`) lends
/// from a smaller size, but for elements outbox blocks are not aligned for (not `lendable`).
pub(crate) fn reduction_slots_max(all: bool, lendable: bool) -> usize {
    if all && lendable {
        ALL_REDUCE_SLOTS_MAX_BYTES
    } else {
        ONE_SHOT_MAX_BYTES
    }
}

/// The reduction of a contribution of `bytes` a rank, in a team of `world`: an all-reduce
/// (`all`) or a reduce, of elements outbox blocks can hold (`lendable`) or not. A contribution
/// past the slots that is not lendable is refused by the caller, alike on every rank.
pub(crate) fn reduction(all: bool, lendable: bool, bytes: usize, world: usize) -> Reduction {
    if bytes <= reduction_slots_max(all, lendable) {
        Reduction::Slots
    } else if all && bytes * world <= LENT_ONE_SHOT_MAX_BYTES {
        Reduction::LentOneShot
    } else {
        Reduction::TwoShots
    }
}

/// Whether a reduce-scatter of `bytes` a rank exchanges blocks through the rings (one shot)
/// rather than taking two lent shots.
pub(crate) fn reduce_scatter_exchanges(bytes: usize) -> bool {
    bytes <= ONE_SHOT_MAX_BYTES
}

/// The most bytes one piece of a two-shot reduction lends: [`PIECE_MAX_BYTES`], or a quarter
/// of an outbox whose largest loan is `max_loan` bytes, when four pieces do not fit (a piece,
/// its result slice and the previous piece's blocks not yet given back must fit together).
pub(crate) fn piece_bytes(max_loan: usize) -> usize {
    PIECE_MAX_BYTES.min(max_loan / 4).max(64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_choice_turns_at_its_threshold() {
        assert_eq!(barrier(FLAT_BARRIER_MAX), Barrier::Flat);
        assert_eq!(barrier(FLAT_BARRIER_MAX + 1), Barrier::Dissemination);
        assert_eq!(broadcast(FLAT_BROADCAST_MAX + 1), Rooted::Tree);
        assert_eq!(gather(FLAT_GATHER_MAX), Rooted::Flat);
        assert_eq!(
            all_gather(FLAT_GATHER_MAX + 1, BRUCK_MAX_BYTES),
            AllGather::Bruck
        );
        assert_eq!(
            all_gather(FLAT_GATHER_MAX + 1, BRUCK_MAX_BYTES + 1),
            AllGather::Flat
        );
        assert!(!all_gather_lends(2, ALL_GATHER_SLOTS_MAX_BYTES, 1 << 20));
        assert!(all_gather_lends(2, ALL_GATHER_SLOTS_MAX_BYTES + 1, 1 << 20));
        assert!(!all_gather_lends(
            ALL_GATHER_LEND_MAX_RANKS + 1,
            1024,
            1 << 20
        ));
        assert_eq!(all_to_all(2, LEND_MIN_BLOCK_BYTES - 1), AllToAll::Pairwise);
        assert_eq!(all_to_all(2, LEND_MAX_BLOCK_BYTES), AllToAll::Lent);
        assert_eq!(all_to_all(1, LEND_MAX_BLOCK_BYTES), AllToAll::Pairwise);
        assert_eq!(
            reduction(true, true, ALL_REDUCE_SLOTS_MAX_BYTES, 4),
            Reduction::Slots
        );
        assert_eq!(
            reduction(true, true, ALL_REDUCE_SLOTS_MAX_BYTES + 1, 4),
            Reduction::LentOneShot
        );
        assert_eq!(
            reduction(false, true, ALL_REDUCE_SLOTS_MAX_BYTES + 1, 4),
            Reduction::Slots
        );
        assert_eq!(
            reduction(true, true, LENT_ONE_SHOT_MAX_BYTES / 4 + 1, 4),
            Reduction::TwoShots
        );
        assert_eq!(piece_bytes(1 << 30), PIECE_MAX_BYTES);
        assert_eq!(piece_bytes(0), 64);
    }
}
