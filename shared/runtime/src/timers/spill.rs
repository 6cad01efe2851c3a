//! Where a timer queue keeps the timers beyond its memory budget.

/// A store of spilled timers, in firing order and by key and name: the
/// task's RocksDB ([`TimerSpill`](super::TimerSpill)), or a map in tests. Local to the
/// task's life: the queue is rebuilt, and the store cleared, whenever the
/// task loads its timers from committed state.
pub trait SpillStore: Send {
    /// The time of the spilled timer `name` of `key`, if it is spilled: the
    /// index by key is the truth.
    fn get(&self, key: &str, name: &str) -> anyhow::Result<Option<i64>>;

    /// Spills timer `name` of `key` at `time`. If it was spilled at another
    /// time, that entry in firing order is left behind, stale (see
    /// [`take_earliest`](Self::take_earliest)).
    fn put(&mut self, time: i64, key: &str, name: &str) -> anyhow::Result<()>;

    /// Removes the spilled timer `name` of `key`, which is at `time`.
    fn delete(&mut self, time: i64, key: &str, name: &str) -> anyhow::Result<()>;

    /// Removes the spilled timer `name` of `key` from the index by key only,
    /// without reading its time: its entry in firing order is left stale.
    fn forget(&mut self, key: &str, name: &str) -> anyhow::Result<()>;

    /// Calls `each` with the key and name of every spilled timer (the
    /// index by key), in no particular order; a store that holds writes
    /// back applies them first.
    fn for_each_spilled(&mut self, each: &mut dyn FnMut(&str, &str)) -> anyhow::Result<()>;

    /// Offers the spilled timers to `take` in firing order (time, key, name),
    /// removing each it accepts; stops at the first it declines. Entries in
    /// firing order that the index by key no longer has at that time (stale)
    /// are removed unoffered. Returns how many entries in firing order were
    /// removed, stale ones included.
    fn take_earliest(
        &mut self,
        take: &mut dyn FnMut(i64, &str, &str) -> bool,
    ) -> anyhow::Result<usize>;

    /// Begins a bulk load into an empty store: until [`end_bulk_load`](Self::end_bulk_load),
    /// only blind writes ([`put`](Self::put), [`forget`](Self::forget)) and
    /// [`for_each_spilled`](Self::for_each_spilled) may be called, and a
    /// store may gather them to write them at once (a store that does not
    /// writes each as it comes).
    fn begin_bulk_load(&mut self) -> anyhow::Result<()> {
        Ok(())
    }

    /// Ends a bulk load: every write gathered since its beginning is in the store.
    fn end_bulk_load(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod memory {
    use std::collections::{BTreeSet, HashMap};

    use super::SpillStore;

    /// Spilled timers in maps, for tests of the queue.
    #[derive(Default)]
    pub struct MemorySpill {
        by_time: BTreeSet<(i64, String, String)>,
        by_key: HashMap<(String, String), i64>,
    }

    impl SpillStore for MemorySpill {
        fn get(&self, key: &str, name: &str) -> anyhow::Result<Option<i64>> {
            Ok(self.by_key.get(&(key.into(), name.into())).copied())
        }

        fn put(&mut self, time: i64, key: &str, name: &str) -> anyhow::Result<()> {
            self.by_key.insert((key.into(), name.into()), time);
            self.by_time.insert((time, key.into(), name.into()));
            Ok(())
        }

        fn forget(&mut self, key: &str, name: &str) -> anyhow::Result<()> {
            self.by_key.remove(&(key.into(), name.into()));
            Ok(())
        }

        fn delete(&mut self, time: i64, key: &str, name: &str) -> anyhow::Result<()> {
            let known = self.by_key.remove(&(key.into(), name.into()));
            anyhow::ensure!(known == Some(time), "{key}/{name} is not spilled at {time}");
            self.by_time.remove(&(time, key.into(), name.into()));
            Ok(())
        }

        fn for_each_spilled(&mut self, each: &mut dyn FnMut(&str, &str)) -> anyhow::Result<()> {
            for (key, name) in self.by_key.keys() {
                each(key, name);
            }
            Ok(())
        }

        fn take_earliest(
            &mut self,
            take: &mut dyn FnMut(i64, &str, &str) -> bool,
        ) -> anyhow::Result<usize> {
            let mut removed = 0;
            while let Some((time, key, name)) = self.by_time.first().cloned() {
                let live = self.by_key.get(&(key.clone(), name.clone())) == Some(&time);
                if live && !take(time, &key, &name) {
                    break;
                }
                self.by_time.pop_first();
                removed += 1;
                if live {
                    self.by_key.remove(&(key, name));
                }
            }
            Ok(removed)
        }
    }
}
