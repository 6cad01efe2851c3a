//! A bloom filter of 64-bit hashes, sized for a number of entries: the
//! core of the timers' spill filter and of the stores' key filters.

use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;

/// Bits per entry the filter is sized for (with [`PROBES`]: under 1 %
/// false positives at its capacity).
const BITS_PER_ENTRY: usize = 10;
const PROBES: u64 = 7;

#[derive(Default)]
pub(crate) struct Bloom {
    bits: Vec<u64>,
    /// Entries inserted since the filter was built.
    inserted: usize,
    /// Entries the filter was sized for; past it, false positives grow.
    capacity: usize,
}

impl Bloom {
    /// An empty filter sized for `entries`.
    pub fn with_capacity(entries: usize) -> Self {
        Bloom {
            bits: vec![0; (entries * BITS_PER_ENTRY).div_ceil(64).max(1)],
            inserted: 0,
            capacity: entries,
        }
    }

    /// What a filter sized for `entries` takes in memory.
    pub fn bytes_for(entries: usize) -> usize {
        (entries * BITS_PER_ENTRY).div_ceil(64).max(1) * 8
    }

    /// The filter's memory.
    pub fn bytes(&self) -> usize {
        self.bits.len() * 8
    }

    /// Whether more entries were inserted than the filter was sized for.
    pub fn is_over_capacity(&self) -> bool {
        self.inserted > self.capacity
    }

    pub fn is_empty(&self) -> bool {
        self.bits.is_empty()
    }

    pub fn insert(&mut self, hash: u64) {
        let words = self.bits.len() as u64;
        for bit in probes(hash, words * 64) {
            self.bits[(bit / 64) as usize] |= 1 << (bit % 64);
        }
        self.inserted += 1;
    }

    /// False if `hash` was certainly not inserted.
    pub fn may_contain(&self, hash: u64) -> bool {
        let words = self.bits.len() as u64;
        words > 0
            && probes(hash, words * 64)
                .all(|bit| self.bits[(bit / 64) as usize] & (1 << (bit % 64)) != 0)
    }

    /// Forgets every entry.
    pub fn clear(&mut self) {
        self.bits.fill(0);
        self.inserted = 0;
    }
}

/// The hash of `parts`, with a separator between them: the same in every
/// build of a filter (SipHash with fixed keys).
pub(crate) fn hash_of(parts: &[&[u8]]) -> u64 {
    let mut hasher = DefaultHasher::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            hasher.write_u8(0xff);
        }
        hasher.write(part);
    }
    hasher.finish()
}

/// The bit positions of `hash` among `bits` (double hashing of one 64-bit
/// hash: Kirsch and Mitzenmacher).
fn probes(hash: u64, bits: u64) -> impl Iterator<Item = u64> {
    let (first, step) = (hash & 0xffff_ffff, (hash >> 32) | 1);
    (0..PROBES).map(move |i| first.wrapping_add(i.wrapping_mul(step)) % bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inserted_hash_is_always_found_and_few_others_are() {
        let entries = 4096;
        let mut bloom = Bloom::with_capacity(entries);
        assert_eq!(bloom.bytes(), Bloom::bytes_for(entries));
        let hash = |n: usize| hash_of(&[b"key", n.to_string().as_bytes()]);
        assert!(!bloom.may_contain(hash(1)));
        for n in 0..entries {
            bloom.insert(hash(n));
        }
        assert!((0..entries).all(|n| bloom.may_contain(hash(n))));
        let false_positives = (entries..2 * entries)
            .filter(|&n| bloom.may_contain(hash(n)))
            .count();
        assert!(
            false_positives < entries / 50,
            "{false_positives} false positives of {entries}"
        );
        assert!(!bloom.is_over_capacity());
        bloom.insert(hash(entries));
        assert!(bloom.is_over_capacity());
        bloom.clear();
        assert!(!bloom.may_contain(hash(1)));
    }

    #[test]
    fn parts_are_hashed_apart() {
        assert_ne!(hash_of(&[b"ab", b"c"]), hash_of(&[b"a", b"bc"]));
    }
}
