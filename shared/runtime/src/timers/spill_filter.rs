//! A bloom filter of the timers a queue has spilled, by key and name.
//!
//! Most timer lookups of a state larger than memory are for keys with no
//! timer at all (a new user: the sessionizer asks before it opens a
//! session), and each would otherwise be a point read of
//! the spill store that finds nothing, through every level of RocksDB. The
//! filter answers most of them: "not spilled" is certain, "maybe" goes to
//! the store.

use crate::bloom::{hash_of, Bloom};

/// The fewest timers a filter is sized for: small filters are rebuilt often.
const MIN_CAPACITY: usize = 1 << 12;

/// The (key, name) pairs put into the spill store since the filter was last
/// built. A timer that leaves the store leaves its bits behind (a bloom
/// filter cannot remove), so the filter is rebuilt from the store's index
/// by key once more pairs were put than it was sized for, at twice what
/// the store then holds: the scans cost at most one read per put.
#[derive(Default)]
pub(super) struct SpillFilter {
    bloom: Bloom,
}

impl SpillFilter {
    /// An empty filter sized for `timers` (at least [`MIN_CAPACITY`]).
    pub(super) fn with_capacity(timers: usize) -> Self {
        SpillFilter {
            bloom: Bloom::with_capacity(timers.max(MIN_CAPACITY)),
        }
    }

    /// The filter's memory, counted in the timers' budget.
    pub(super) fn bytes(&self) -> usize {
        self.bloom.bytes()
    }

    /// Whether more pairs were put than the filter was sized for.
    pub(super) fn needs_rebuild(&self) -> bool {
        self.bloom.is_over_capacity()
    }

    pub(super) fn insert(&mut self, key: &str, name: &str) {
        if self.bloom.is_empty() {
            *self = SpillFilter::with_capacity(0);
        }
        self.bloom.insert(pair_hash(key, name));
    }

    /// False if timer `name` of `key` is certainly not spilled.
    pub(super) fn may_contain(&self, key: &str, name: &str) -> bool {
        self.bloom.may_contain(pair_hash(key, name))
    }

    /// Forgets every pair: the store holds no timer.
    pub(super) fn clear(&mut self) {
        self.bloom.clear();
    }
}

fn pair_hash(key: &str, name: &str) -> u64 {
    hash_of(&[key.as_bytes(), name.as_bytes()])
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
