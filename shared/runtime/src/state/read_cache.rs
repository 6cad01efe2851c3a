//! The read cache in front of a task's RocksDB: committed values read or
//! written recently, counted in bytes within the process's budget.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::resources::MemoryShares;
use super::StoreIndex;

/// Committed values read or written recently, per store: two generations of
/// hash maps give an approximate LRU with O(1) operations and no per-entry
/// bookkeeping — a key not touched for two generations falls out. Maps are
/// keyed by the key bytes alone (one map per store), so a lookup borrows the
/// key instead of allocating a copy, and a retired generation's map is
/// cleared and reused rather than grown again from empty.
///
/// A generation holds up to half the task's share of the read caches'
/// budget, in bytes (keys, values and [`CACHE_ENTRY_OVERHEAD`]), so large
/// values mean fewer entries, not more memory.
pub(super) struct ReadCache {
    recent: Vec<FxHashMap<Vec<u8>, Option<Vec<u8>>>>,
    older: Vec<FxHashMap<Vec<u8>, Option<Vec<u8>>>>,
    /// Bytes in `recent`, over all stores.
    recent_bytes: usize,
    budget: Arc<MemoryShares>,
}

/// What a cached entry costs beyond its key and value: the map's slot, the
/// two vectors' headers and the allocator's rounding, roughly.
const CACHE_ENTRY_OVERHEAD: usize = 64;

impl ReadCache {
    pub(super) fn new(stores: usize, budget: Arc<MemoryShares>) -> Self {
        budget.tasks.fetch_add(1, Ordering::Relaxed);
        ReadCache {
            recent: vec![FxHashMap::default(); stores],
            older: vec![FxHashMap::default(); stores],
            recent_bytes: 0,
            budget,
        }
    }

    /// This task's share of the budget, per generation.
    fn generation_bytes(&self) -> usize {
        self.budget.per_task(self.budget.read_cache_bytes) / 2
    }

    pub(super) fn get(&mut self, store: StoreIndex, key: &[u8]) -> Option<&Option<Vec<u8>>> {
        if !self.recent[store].contains_key(key) {
            let (key, value) = self.older[store].remove_entry(key)?;
            self.insert(store, key, value);
        }
        self.recent[store].get(key)
    }

    /// Whether the cache holds `key` as absent from committed state. Unlike
    /// [`Self::get`], this does not count as a use of the entry.
    pub(super) fn knows_absent(&self, store: StoreIndex, key: &[u8]) -> bool {
        match self.recent[store].get(key) {
            Some(value) => value.is_none(),
            None => matches!(self.older[store].get(key), Some(None)),
        }
    }

    pub(super) fn insert(&mut self, store: StoreIndex, key: Vec<u8>, value: Option<Vec<u8>>) {
        if self.recent_bytes >= self.generation_bytes() {
            std::mem::swap(&mut self.recent, &mut self.older);
            self.recent.iter_mut().for_each(FxHashMap::clear);
            self.recent_bytes = 0;
        }
        // A replaced entry is counted again: the estimate errs high.
        self.recent_bytes += key.len() + value.as_ref().map_or(0, Vec::len) + CACHE_ENTRY_OVERHEAD;
        self.recent[store].insert(key, value);
    }

    pub(super) fn clear(&mut self) {
        self.recent.iter_mut().for_each(FxHashMap::clear);
        self.older.iter_mut().for_each(FxHashMap::clear);
        self.recent_bytes = 0;
    }
}

impl Drop for ReadCache {
    fn drop(&mut self) {
        self.budget.tasks.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn the_read_cache_keeps_recent_keys_and_forgets_old_ones_within_its_share() {
        // Room for 100 entries of an 8-byte key per generation.
        let entry = 8 + CACHE_ENTRY_OVERHEAD;
        let budget = Arc::new(MemoryShares {
            read_cache_bytes: 2 * 100 * entry,
            timer_bytes: 0,
            tasks: AtomicUsize::new(0),
        });
        let mut cache = ReadCache::new(2, budget.clone());
        cache.insert(0, b"hot".to_vec(), Some(b"1".to_vec()));
        for i in 0..1_000u64 {
            cache.insert(0, i.to_be_bytes().to_vec(), None);
            // Touching a key moves it to the recent generation.
            assert!(cache.get(0, b"hot").is_some());
        }
        let held: usize = cache
            .recent
            .iter()
            .chain(&cache.older)
            .map(|map| map.len())
            .sum();
        assert!(held <= 2 * 101, "{held} entries held");
        for i in 0..200u64 {
            cache.insert(1, i.to_be_bytes().to_vec(), None);
        }
        assert!(
            cache.get(0, b"hot").is_none(),
            "two generations untouched: evicted"
        );
        // Another task's cache halves each one's share.
        let other = ReadCache::new(1, budget.clone());
        assert_eq!(cache.generation_bytes(), 50 * entry);
        drop(other);
        assert_eq!(cache.generation_bytes(), 100 * entry);
    }
}
