//! Hash tables keyed by outbox offsets, with a hash made for them.
//!
//! The standard library's SipHash guards a table against keys chosen to collide. These tables
//! hold only offsets this process's own allocator handed out (a peer's acknowledgement is only
//! looked up, and an unknown one ends the link after that one lookup), so a fast hash is enough:
//! SplitMix64's finalizer of the 64-byte line number, two multiplies and three shifts. It must
//! mix well all the same: a plain multiply keeps its input's trailing zeros, so blocks a power
//! of two apart (256 KiB chunks allocated one after the other) would all land in the same
//! bucket, which the table picks from the hash's low bits. A table operation is on the path of
//! every chunk, loan and acknowledgement.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A map from outbox offsets.
pub type OffsetMap<V> = HashMap<u64, V, BuildHasherDefault<OffsetHasher>>;

/// A set of outbox offsets.
pub type OffsetSet = HashSet<u64, BuildHasherDefault<OffsetHasher>>;

/// The hasher of [`OffsetMap`] and [`OffsetSet`]: for `u64` keys only.
#[derive(Debug, Default, Clone, Copy)]
pub struct OffsetHasher(u64);

impl Hasher for OffsetHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, offset: u64) {
        // SplitMix64's finalizer: every bit of the line number reaches every bit of the hash.
        let mut x = offset >> 6;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        self.0 = x ^ (x >> 31);
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed (`write_u64`); this keeps any other key correct, if slow.
        for &byte in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(byte) << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(offset: u64) -> u64 {
        let mut hasher = OffsetHasher::default();
        hasher.write_u64(offset);
        hasher.finish()
    }

    /// How many of a 4096-bucket table's buckets (the low 12 bits) and of the 128 tags (the top
    /// 7 bits) 4096 blocks `stride` bytes apart use.
    fn spread(stride: u64) -> (usize, usize) {
        let hashes: Vec<u64> = (0..4096u64).map(|block| hash(block * stride)).collect();
        let buckets: HashSet<u64> = hashes.iter().map(|h| h & 4095).collect();
        let tags: HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        (buckets.len(), tags.len())
    }

    #[test]
    fn blocks_of_every_power_of_two_size_spread_over_buckets_and_tags() {
        // 4096 keys thrown at random into 4096 buckets fill about 63% of them.
        for stride in (6..=30).map(|shift| 1u64 << shift) {
            let (buckets, tags) = spread(stride);
            assert!(
                buckets > 2400,
                "{stride}-byte blocks: {buckets} buckets of 4096"
            );
            assert_eq!(tags, 128, "{stride}-byte blocks");
        }
    }

    #[test]
    fn a_set_and_a_map_keep_what_goes_in() {
        let mut set = OffsetSet::default();
        let mut map = OffsetMap::default();
        for line in 0..10_000u64 {
            assert!(set.insert(line * 64));
            map.insert(line * 4096, line);
        }
        for line in (0..10_000u64).step_by(2) {
            assert!(set.remove(&(line * 64)));
            assert_eq!(map.remove(&(line * 4096)), Some(line));
        }
        assert_eq!(set.len(), 5_000);
        assert!(set.contains(&64) && !set.contains(&0));
        assert_eq!(map.get(&4096), Some(&1));
    }
}
