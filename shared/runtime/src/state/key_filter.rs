//! A filter of the keys a store may hold, in front of RocksDB.
//!
//! RocksDB answers a read of a key it does not hold from its own bloom
//! filters, but only after looking through every memtable and, per level,
//! a filter partition found through an index: about a microsecond, where
//! a record's other work takes a few. A processor that mostly reads keys a
//! store does not have (the joiner reads the other side of every new order
//! id, and its own side before it buffers) pays that on most records. This
//! filter answers those reads from memory.
//!
//! It holds every key the store may have: built from a scan of the store
//! when its task opens, it takes each key a write gives a value. A key
//! deleted keeps its bits, and a write rolled back leaves its key behind;
//! both only make the filter answer "maybe" where "no" was true, never the
//! reverse, so it needs nothing on a rollback. Once it has taken as many
//! keys as it was sized for (twice the store's keys at its build), false
//! positives grow, and it is built again from the store.

use crate::bloom::{hash_of, Bloom};

/// The fewest keys a filter is sized for: small filters are rebuilt often.
const MIN_KEYS: usize = 1 << 14;

pub(crate) struct KeyFilter {
    bloom: Bloom,
}

impl KeyFilter {
    /// A filter of the keys whose hashes are `hashes`, with room for as
    /// many again.
    pub fn of(hashes: &[u64]) -> Self {
        let mut bloom = Bloom::with_capacity(Self::capacity(hashes.len()));
        for &hash in hashes {
            bloom.insert(hash);
        }
        KeyFilter { bloom }
    }

    /// The memory of a filter of `keys` keys.
    pub fn bytes_for(keys: usize) -> usize {
        Bloom::bytes_for(Self::capacity(keys))
    }

    fn capacity(keys: usize) -> usize {
        (2 * keys).max(MIN_KEYS)
    }

    pub fn hash(key: &[u8]) -> u64 {
        hash_of(&[key])
    }

    pub fn bytes(&self) -> usize {
        self.bloom.bytes()
    }

    pub fn insert(&mut self, key: &[u8]) {
        self.bloom.insert(Self::hash(key));
    }

    /// False if the store certainly does not hold `key`.
    pub fn may_contain(&self, key: &[u8]) -> bool {
        self.bloom.may_contain(Self::hash(key))
    }

    /// Whether it has taken more keys than it was sized for, and should be
    /// built again.
    pub fn is_full(&self) -> bool {
        self.bloom.is_over_capacity()
    }
}
