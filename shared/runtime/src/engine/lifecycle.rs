//! Tasks coming and going: opening a task over its (restored) store, and
//! forgetting the partitions a stage no longer owns.

use super::{Engine, Route};
use crate::processor::Processor;
use crate::state::open_stores::StoreRole;
use crate::state::store::TaskStore;
use crate::task::Task;

impl<P: Processor> Engine<P> {
    /// The topics (subscription index, name) whose partition *p* belongs to task *p*.
    pub fn task_topics(&self) -> Vec<(usize, String)> {
        self.subscriptions
            .iter()
            .enumerate()
            .filter(|(_, subscription)| subscription.route.feeds_task())
            .map(|(index, subscription)| (index, subscription.topic.clone()))
            .collect()
    }

    /// Whether task `partition` is open.
    pub fn has_task(&self, partition: i32) -> bool {
        self.tasks.contains_key(&partition)
    }

    /// The memory the records of `subscription`'s partition `partition`
    /// consumed into its task and not yet handled are counted as (0 for a
    /// topic that feeds no task).
    pub fn buffered_bytes(&self, subscription: usize, partition: i32) -> usize {
        let slot = match self.subscriptions[subscription].route {
            Route::Task { slot } | Route::Shuffled { slot } => slot,
            Route::Rekey { .. } => return 0,
        };
        self.tasks
            .get(&partition)
            .map_or(0, |task| task.buffered_bytes(slot))
    }

    /// Records consumed and no longer waiting in a task's buffer: processed,
    /// or set aside (late, dead-lettered, re-keyed, skipped).
    pub fn handled_records(&self) -> u64 {
        let waiting: usize = self.tasks.values().map(Task::buffered_total).sum();
        self.consumed_records().saturating_sub(waiting as u64)
    }

    /// Opens task `partition` over `store`, which holds its committed state.
    pub fn open_task(&mut self, partition: i32, store: TaskStore) -> anyhow::Result<()> {
        store.serve_queries_as(StoreRole::Active);
        let task = Task::open(
            partition,
            self.processor.clone(),
            store,
            &self.kinds,
            self.clock.now(),
        )?;
        self.tasks.insert(partition, task);
        Ok(())
    }

    /// Skips records of `subscription`'s `partition` below `offset`: they are
    /// already in the state (at-least-once restarts).
    pub fn skip_below(&mut self, subscription: usize, partition: i32, offset: i64) {
        self.skip_below.insert((subscription, partition), offset);
    }

    /// Forgets `subscription`'s `partition`, closing its task if it feeds one.
    pub fn release(&mut self, subscription: usize, partition: i32) {
        self.positions.remove(&(subscription, partition));
        self.skip_below.remove(&(subscription, partition));
        match self.subscriptions[subscription].route {
            Route::Rekey { slot } => {
                self.upstream.remove(&(slot, partition));
            }
            Route::Task { .. } | Route::Shuffled { .. } => {
                if let Some(task) = self.tasks.remove(&partition) {
                    tracing::info!(partition = task.partition, "task closed");
                }
            }
        }
    }

    /// The task store names, by index.
    pub fn store_names(&self) -> &[String] {
        &self.settings.store_names
    }

    /// The changelog topic of each store, by store index.
    pub fn changelog_topics(&self) -> Vec<String> {
        self.side
            .changelogs
            .iter()
            .map(|id| self.collector.topic_name(*id).to_string())
            .collect()
    }

    /// Whether the service has been asked to stop.
    pub fn shutdown_requested(&self) -> bool {
        self.shutdown.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The flag a signal sets, for waits that must give up on it.
    pub fn shutdown_flag(&self) -> &std::sync::atomic::AtomicBool {
        &self.shutdown
    }

    /// Counts changelog records replayed into local state.
    pub fn count_restored(&mut self, records: u64) {
        self.counters.restored_records += records;
    }
}
