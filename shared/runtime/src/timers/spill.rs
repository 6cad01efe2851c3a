//! Where a timer queue keeps the timers beyond its memory budget.

/// A store of spilled timers, in firing order and by key and name: the
/// task's RocksDB (`state::TimerSpill`), or a map in tests. Local to the
/// task's life: the queue is rebuilt, and the store cleared, whenever the
/// task loads its timers from committed state.
pub trait SpillStore: Send {
    /// The time of the spilled timer `name` of `key`, if it is spilled.
    fn get(&self, key: &str, name: &str) -> anyhow::Result<Option<i64>>;

    /// Adds timer `name` of `key` at `time` (not spilled yet).
    fn put(&mut self, time: i64, key: &str, name: &str) -> anyhow::Result<()>;

    /// Removes the spilled timer `name` of `key`, which is at `time`.
    fn delete(&mut self, time: i64, key: &str, name: &str) -> anyhow::Result<()>;

    /// Offers the spilled timers to `take` in firing order (time, key, name),
    /// removing each it accepts; stops at the first it declines.
    fn take_earliest(
        &mut self,
        take: &mut dyn FnMut(i64, &str, &str) -> bool,
    ) -> anyhow::Result<()>;
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
            let previous = self.by_key.insert((key.into(), name.into()), time);
            anyhow::ensure!(previous.is_none(), "{key}/{name} is spilled twice");
            self.by_time.insert((time, key.into(), name.into()));
            Ok(())
        }

        fn delete(&mut self, time: i64, key: &str, name: &str) -> anyhow::Result<()> {
            let known = self.by_key.remove(&(key.into(), name.into()));
            anyhow::ensure!(known == Some(time), "{key}/{name} is not spilled at {time}");
            self.by_time.remove(&(time, key.into(), name.into()));
            Ok(())
        }

        fn take_earliest(
            &mut self,
            take: &mut dyn FnMut(i64, &str, &str) -> bool,
        ) -> anyhow::Result<()> {
            while let Some((time, key, name)) = self.by_time.first().cloned() {
                if !take(time, &key, &name) {
                    break;
                }
                self.by_time.pop_first();
                self.by_key.remove(&(key, name));
            }
            Ok(())
        }
    }
}
