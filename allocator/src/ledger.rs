//! Which ranks still owe an acknowledgement for which block: the owner's private record.
//!
//! A block sent to some ranks is recorded with the exact [`PayloadRef`] that went out and the set
//! of ranks that must acknowledge it. It is handed back for reuse only when that set is empty. An
//! acknowledgement that names no recorded block, differs from what was sent, or comes from a rank
//! that owes none for it (a second acknowledgement, or one from a rank the block never went to) is
//! refused with an [`AckFault`] and changes nothing. A rank that dies or leaves is
//! [`Ledger::forget`]-ed: dropped from every set.
//!
//! A range lent *in place* ([`Ledger::insert_kept`]: bytes of a buffer its owner keeps, such as a
//! symmetric buffer an all-reduce reads where it lies) is recorded the same way, but frees
//! nothing when its last acknowledgement comes: the buffer was never the ledger's.

use crate::offsets::OffsetMap;
use shmbroker_bindings::PayloadRef;

/// The most ranks a ledger tracks (the owed set is a 64-bit mask).
pub const MAX_RANKS: u32 = 64;

/// Why an acknowledgement was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckFault {
    /// No block was sent at that offset (or it was freed already).
    UnknownBlock,
    /// The block is recorded, but this rank owes no acknowledgement for it: it acknowledged it
    /// already, or it was never sent to this rank.
    NotOwed,
    /// The reference differs from the one sent (length or padding).
    Mismatch {
        /// The length that was sent.
        sent_len: u32,
    },
}

impl std::fmt::Display for AckFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownBlock => f.write_str("no block was sent at that offset"),
            Self::NotOwed => f.write_str("that rank owes no acknowledgement for the block"),
            Self::Mismatch { sent_len } => {
                write!(
                    f,
                    "the block was sent as {sent_len} bytes with zero padding"
                )
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    sent: PayloadRef,
    /// The block freed with the last acknowledgement; `None` for a range lent in place.
    block_len: Option<u64>,
    owed: u64,
}

impl Entry {
    /// The bytes the entry covers: its block, or the range lent in place.
    fn end(&self) -> u64 {
        self.sent.offset + self.block_len.unwrap_or(u64::from(self.sent.len))
    }
}

/// Blocks sent and not yet acknowledged by every receiver.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    entries: OffsetMap<Entry>,
}

/// The bit of `rank` in an owed set; ranks at or above [`MAX_RANKS`] have none.
#[must_use]
pub fn rank_bit(rank: u32) -> u64 {
    if rank < MAX_RANKS { 1 << rank } else { 0 }
}

impl Ledger {
    /// Records that `sent` (a block of `block_len` bytes) went to every rank in `owed`.
    /// Returns `false`, recording nothing, when `owed` is empty: the block can be reused at once.
    ///
    /// # Panics
    ///
    /// When a block at that offset is already recorded: the owner's allocator handed out one block
    /// twice, which is a bug in this process, not something a peer can cause.
    pub fn insert(&mut self, sent: PayloadRef, block_len: u64, owed: u64) -> bool {
        self.record(sent, Some(block_len), owed)
    }

    /// Records that `sent`, a range of a buffer its owner keeps, was lent in place to every rank
    /// in `owed`: acknowledged as a block is, it frees nothing. Returns `false`, recording
    /// nothing, when `owed` is empty.
    ///
    /// # Panics
    ///
    /// When an entry at that offset is already recorded (see [`Self::insert`]); callers check
    /// [`Self::overlaps`] first.
    pub fn insert_kept(&mut self, sent: PayloadRef, owed: u64) -> bool {
        self.record(sent, None, owed)
    }

    fn record(&mut self, sent: PayloadRef, block_len: Option<u64>, owed: u64) -> bool {
        if owed == 0 {
            return false;
        }
        let previous = self.entries.insert(
            sent.offset,
            Entry {
                sent,
                block_len,
                owed,
            },
        );
        assert!(previous.is_none(), "block {} recorded twice", sent.offset);
        true
    }

    /// Whether any entry (a block sent, or a range lent in place) covers a byte of
    /// `offset..offset + len`.
    #[must_use]
    pub fn overlaps(&self, offset: u64, len: u64) -> bool {
        let end = offset.saturating_add(len);
        self.entries
            .values()
            .any(|entry| entry.sent.offset < end && offset < entry.end())
    }

    /// Takes `rank`'s acknowledgement of `acked`. Returns the block `(offset, block_len)` once
    /// nobody owes one any more (never for a range lent in place, which frees nothing).
    ///
    /// # Errors
    ///
    /// An [`AckFault`]; nothing changes then.
    pub fn ack(&mut self, rank: u32, acked: PayloadRef) -> Result<Option<(u64, u64)>, AckFault> {
        let entry = self
            .entries
            .get_mut(&acked.offset)
            .ok_or(AckFault::UnknownBlock)?;
        if acked != entry.sent {
            return Err(AckFault::Mismatch {
                sent_len: entry.sent.len,
            });
        }
        let bit = rank_bit(rank);
        if entry.owed & bit == 0 {
            return Err(AckFault::NotOwed);
        }
        entry.owed &= !bit;
        if entry.owed != 0 {
            return Ok(None);
        }
        let block_len = entry.block_len;
        self.entries.remove(&acked.offset);
        Ok(block_len.map(|block_len| (acked.offset, block_len)))
    }

    /// Drops `rank` from every owed set; returns the blocks nobody owes for any more.
    pub fn forget(&mut self, rank: u32) -> Vec<(u64, u64)> {
        let bit = rank_bit(rank);
        let mut freed = Vec::new();
        self.entries.retain(|&offset, entry| {
            entry.owed &= !bit;
            if entry.owed == 0 {
                if let Some(block_len) = entry.block_len {
                    freed.push((offset, block_len));
                }
                false
            } else {
                true
            }
        });
        freed
    }

    /// Blocks still owed for.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no block is owed for.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The ranks that still owe an acknowledgement of `sent` (a bit each, see [`rank_bit`]); 0
    /// once none does, or for a reference this ledger does not hold.
    #[must_use]
    pub fn owed_for(&self, sent: PayloadRef) -> u64 {
        self.entries
            .get(&sent.offset)
            .filter(|entry| entry.sent == sent)
            .map_or(0, |entry| entry.owed)
    }

    /// How many blocks `rank` still owes an acknowledgement for.
    #[must_use]
    pub fn owed_by(&self, rank: u32) -> usize {
        let bit = rank_bit(rank);
        self.entries.values().filter(|e| e.owed & bit != 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(offset: u64, len: u32) -> PayloadRef {
        PayloadRef {
            offset,
            len,
            _pad0: 0,
        }
    }

    #[test]
    fn a_block_is_freed_only_when_every_receiver_acked_once() {
        let mut ledger = Ledger::default();
        assert!(ledger.insert(sent(64, 100), 128, 0b110));
        assert_eq!(ledger.ack(1, sent(64, 100)), Ok(None));
        assert_eq!(ledger.ack(1, sent(64, 100)), Err(AckFault::NotOwed));
        assert_eq!(ledger.ack(0, sent(64, 100)), Err(AckFault::NotOwed));
        assert_eq!(
            ledger.ack(2, sent(64, 99)),
            Err(AckFault::Mismatch { sent_len: 100 })
        );
        assert_eq!(ledger.ack(2, sent(128, 100)), Err(AckFault::UnknownBlock));
        assert_eq!(ledger.ack(2, sent(64, 100)), Ok(Some((64, 128))));
        assert_eq!(ledger.ack(2, sent(64, 100)), Err(AckFault::UnknownBlock));
        assert!(ledger.is_empty());
    }

    #[test]
    fn forgetting_a_rank_frees_what_only_it_owed() {
        let mut ledger = Ledger::default();
        ledger.insert(sent(64, 1), 64, 0b10);
        ledger.insert(sent(128, 1), 64, 0b110);
        assert_eq!(ledger.owed_by(1), 2);
        assert_eq!(ledger.forget(1), vec![(64, 64)]);
        assert_eq!(ledger.len(), 1);
        assert_eq!(ledger.ack(2, sent(128, 1)), Ok(Some((128, 64))));
        assert!(
            !ledger.insert(sent(192, 1), 64, 0),
            "owed by nobody: not recorded"
        );
    }

    #[test]
    fn a_range_lent_in_place_is_acknowledged_as_a_block_and_frees_nothing() {
        let mut ledger = Ledger::default();
        assert!(ledger.insert_kept(sent(1000, 100), 0b110));
        assert!(ledger.overlaps(1099, 1) && ledger.overlaps(900, 101));
        assert!(!ledger.overlaps(1100, 64) && !ledger.overlaps(900, 100));
        assert_eq!(ledger.ack(1, sent(1000, 100)), Ok(None));
        assert_eq!(ledger.ack(1, sent(1000, 100)), Err(AckFault::NotOwed));
        assert_eq!(ledger.ack(2, sent(1000, 100)), Ok(None));
        assert!(ledger.is_empty());
        ledger.insert_kept(sent(1000, 100), 0b10);
        assert_eq!(ledger.forget(1), vec![], "nothing to free");
        assert!(ledger.is_empty());
    }
}
