//! A bloom filter of the timers a queue has spilled, by key and name.
//!
//! Most timer lookups of a state larger than memory are for keys with no
//! timer at all (a new user: the sessionizer asks before it opens a
//! session), and each would otherwise be a point read of
//! the spill store that finds nothing, through every level of RocksDB. The
//! filter answers most of them: "not spilled" is certain, "maybe" goes to
//! the store.

use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;

/// Bits per timer the filter is sized for (with [`PROBES`]: under 1 % false
/// positives at its capacity).
const BITS_PER_TIMER: usize = 10;
const PROBES: u64 = 7;
/// The fewest timers a filter is sized for: small filters are rebuilt often.
const MIN_CAPACITY: usize = 1 << 12;

/// The (key, name) pairs put into the spill store since the filter was last
/// built. A timer that leaves the store leaves its bits behind (a bloom
/// filter cannot remove), so the filter is rebuilt from the store's index
/// by key once more pairs were put than it was sized for, at twice what
/// the store then holds: the scans cost at most one read per put.
#[derive(Default)]
pub(super) struct SpillFilter {
    bits: Vec<u64>,
    /// Pairs put since the last build.
    inserted: usize,
    /// Pairs the filter was sized for; a build is due past it.
    capacity: usize,
}

impl SpillFilter {
    /// An empty filter sized for `timers` (at least [`MIN_CAPACITY`]).
    pub(super) fn with_capacity(timers: usize) -> Self {
        let capacity = timers.max(MIN_CAPACITY);
        SpillFilter {
            bits: vec![0; (capacity * BITS_PER_TIMER).div_ceil(64)],
            inserted: 0,
            capacity,
        }
    }

    /// The filter's memory, counted in the timers' budget.
    pub(super) fn bytes(&self) -> usize {
        self.bits.len() * 8
    }

    /// Whether more pairs were put than the filter was sized for.
    pub(super) fn needs_rebuild(&self) -> bool {
        self.inserted > self.capacity
    }

    pub(super) fn insert(&mut self, key: &str, name: &str) {
        if self.bits.is_empty() {
            *self = SpillFilter::with_capacity(0);
        }
        let words = self.bits.len() as u64;
        for bit in probes(key, name, words * 64) {
            self.bits[(bit / 64) as usize] |= 1 << (bit % 64);
        }
        self.inserted += 1;
    }

    /// False if timer `name` of `key` is certainly not spilled.
    pub(super) fn may_contain(&self, key: &str, name: &str) -> bool {
        let words = self.bits.len() as u64;
        words > 0
            && probes(key, name, words * 64)
                .all(|bit| self.bits[(bit / 64) as usize] & (1 << (bit % 64)) != 0)
    }

    /// Forgets every pair: the store holds no timer.
    pub(super) fn clear(&mut self) {
        self.bits.fill(0);
        self.inserted = 0;
    }
}

/// The bit positions of a pair among `bits` (double hashing of one 64-bit
/// hash: Kirsch and Mitzenmacher).
fn probes(key: &str, name: &str, bits: u64) -> impl Iterator<Item = u64> {
    // SipHash with fixed keys: the same bits in every build of the filter.
    let mut hasher = DefaultHasher::new();
    hasher.write(key.as_bytes());
    hasher.write_u8(0xff);
    hasher.write(name.as_bytes());
    let hash = hasher.finish();
    let (first, step) = (hash & 0xffff_ffff, (hash >> 32) | 1);
    (0..PROBES).map(move |i| first.wrapping_add(i.wrapping_mul(step)) % bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_pair_is_always_found_and_most_others_are_not() {
        let mut filter = SpillFilter::default();
        assert!(!filter.may_contain("order-1", "order-expiry"));
        for id in 0..MIN_CAPACITY {
            filter.insert(&format!("order-{id}"), "order-expiry");
        }
        assert!(
            (0..MIN_CAPACITY).all(|id| filter.may_contain(&format!("order-{id}"), "order-expiry"))
        );
        let false_positives = (0..MIN_CAPACITY)
            .filter(|id| filter.may_contain(&format!("order-{id}"), "shipment-expiry"))
            .count();
        assert!(
            false_positives < MIN_CAPACITY / 50,
            "{false_positives} false positives of {MIN_CAPACITY}"
        );
        assert!(!filter.needs_rebuild());
        filter.insert("one", "more");
        assert!(filter.needs_rebuild());
        filter.clear();
        assert!(!filter.may_contain("order-1", "order-expiry"));
    }
}
