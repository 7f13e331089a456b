//! Hash tables keyed by outbox offsets, with a hash made for them.
//!
//! The standard library's SipHash guards a table against keys chosen to collide. These tables
//! hold only offsets this process's own allocator handed out (a peer's acknowledgement is only
//! looked up, and a lookup cannot lengthen a probe sequence), so a multiplicative hash of the
//! 64-byte line number is enough: distinct blocks have distinct line numbers, and the multiply
//! spreads them over the hash's high bits, which the table's tags take, as well as its low bits,
//! which pick its buckets. A table operation is on the path of every chunk, loan and
//! acknowledgement.

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
        // Fibonacci hashing of the line number: an odd multiplier maps the low k bits of the
        // line number one to one onto the low k bits of the hash, and mixes them all into its
        // high bits.
        self.0 = (offset >> 6).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not reached for `u64` keys; any other key still hashes, byte by byte.
        for &byte in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(byte) << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_a_line_apart_spread_over_buckets_and_tags() {
        let hashes: Vec<u64> = (0..4096u64)
            .map(|line| {
                let mut hasher = OffsetHasher::default();
                hasher.write_u64(line * 64);
                hasher.finish()
            })
            .collect();
        // Every low 12 bits (a 4096-bucket table's index) different...
        let buckets: HashSet<u64> = hashes.iter().map(|h| h & 4095).collect();
        assert_eq!(buckets.len(), 4096);
        // ...and the top 7 bits (the tags) all used.
        let tags: HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert_eq!(tags.len(), 128);
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
