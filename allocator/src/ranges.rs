//! Which byte ranges of an outbox are free: the owner's private first-fit allocator.
//!
//! Nothing here is shared: the free map lives in the owner's heap, so no peer can corrupt it.
//! Blocks are multiples of [`ALIGN`] bytes and start on [`ALIGN`]-byte boundaries (a cache line, so
//! two blocks never share one). Freed neighbours are merged at once, so the map holds one entry per
//! hole; with the few blocks a session keeps in flight (chunks of a transfer, loans), first fit
//! over it costs a handful of comparisons.

use std::collections::BTreeMap;

/// Granularity and alignment of every block, in bytes.
pub const ALIGN: u64 = 64;

/// The free ranges of `[start, end)`.
#[derive(Debug, Clone)]
pub struct Ranges {
    /// Free ranges: start offset -> length. Never adjacent, never overlapping, never empty.
    free: BTreeMap<u64, u64>,
    start: u64,
    end: u64,
    /// Bytes in blocks handed out and not yet freed.
    used: u64,
}

impl Ranges {
    /// All of `[start, end)` free; `start` is rounded up to [`ALIGN`].
    #[must_use]
    pub fn new(start: u64, end: u64) -> Self {
        let start = start.next_multiple_of(ALIGN).min(end);
        let mut free = BTreeMap::new();
        if end > start {
            free.insert(start, end - start);
        }
        Self {
            free,
            start,
            end,
            used: 0,
        }
    }

    /// The block length `len` bytes take: rounded up to [`ALIGN`], at least [`ALIGN`].
    #[must_use]
    pub fn block_len(len: u64) -> u64 {
        len.max(1).saturating_add(ALIGN - 1) / ALIGN * ALIGN
    }

    /// The most bytes one block can ever have.
    #[must_use]
    pub fn capacity(&self) -> u64 {
        (self.end - self.start) / ALIGN * ALIGN
    }

    /// A free block of [`Self::block_len`]`(len)` bytes: `(offset, block length)`, or `None` when
    /// no hole is large enough now.
    pub fn alloc(&mut self, len: u64) -> Option<(u64, u64)> {
        let want = Self::block_len(len);
        let (&offset, &hole) = self.free.iter().find(|&(_, &hole)| hole >= want)?;
        self.free.remove(&offset);
        if hole > want {
            self.free.insert(offset + want, hole - want);
        }
        self.used += want;
        Some((offset, want))
    }

    /// Returns the block at `offset` of `len` bytes (as [`Self::alloc`] gave it), merging it with
    /// free neighbours. The caller's own records say the block is allocated: this is never called
    /// with anything a peer sent.
    pub fn free(&mut self, offset: u64, len: u64) {
        self.used = self.used.saturating_sub(len);
        let (mut start, mut end) = (offset, offset + len);
        if let Some((&before, &before_len)) = self.free.range(..start).next_back()
            && before + before_len == start
        {
            self.free.remove(&before);
            start = before;
        }
        if let Some(after_len) = self.free.remove(&end) {
            end += after_len;
        }
        self.free.insert(start, end - start);
    }

    /// Whether `offset..offset + len` lies in `[start, end)` with no byte of it free (so in blocks
    /// handed out).
    #[must_use]
    pub fn is_held(&self, offset: u64, len: u64) -> bool {
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        if offset < self.start || end > self.end {
            return false;
        }
        // Free ranges never overlap: only the last one starting before `end` can reach into it.
        self.free
            .range(..end)
            .next_back()
            .is_none_or(|(&start, &hole)| start + hole <= offset)
    }

    /// Bytes in blocks handed out and not yet freed.
    #[must_use]
    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    /// Bytes free in all.
    #[must_use]
    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_disjoint_and_merge_back() {
        let mut ranges = Ranges::new(64, 64 + 1024);
        let a = ranges.alloc(1).unwrap();
        let b = ranges.alloc(65).unwrap();
        let c = ranges.alloc(64).unwrap();
        assert_eq!(a, (64, 64));
        assert_eq!(b, (128, 128));
        assert_eq!(c, (256, 64));
        assert_eq!(ranges.free_bytes(), 1024 - 256);
        ranges.free(b.0, b.1);
        ranges.free(a.0, a.1);
        assert_eq!(
            ranges.alloc(192),
            Some((64, 192)),
            "a and b merged into one hole"
        );
        ranges.free(64, 192);
        ranges.free(c.0, c.1);
        assert_eq!(ranges.free_bytes(), 1024);
        assert_eq!(ranges.alloc(1024), Some((64, 1024)));
        assert_eq!(ranges.alloc(1), None);
    }

    #[test]
    fn a_request_larger_than_any_hole_fails() {
        let mut ranges = Ranges::new(0, 256);
        assert_eq!(ranges.capacity(), 256);
        assert!(ranges.alloc(257).is_none());
        assert!(ranges.alloc(u64::MAX).is_none());
    }
}
