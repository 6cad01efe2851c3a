//! Tasks coming and going: opening a task over its (restored) store, and
//! forgetting the partitions a stage no longer owns.

use super::Engine;
use crate::clock::Clock;
use crate::processor::Processor;
use crate::state::open_stores::StoreRole;
use crate::state::store::TaskStore;
use crate::task::{stored_positions, InputKind, Task};

/// Opens tasks of one engine, on whichever thread: a clone of its
/// processor, its inputs' kinds and its clock.
pub(crate) struct TaskOpener<P: Processor> {
    processor: P,
    kinds: Vec<InputKind>,
    clock: Clock,
}

impl<P: Processor> TaskOpener<P> {
    /// Task `partition` over `store`, which holds its committed state, with
    /// its timers and clocks loaded from it; its store answers queries as
    /// the active one from now on.
    pub fn open(&self, partition: i32, store: TaskStore) -> anyhow::Result<Task<P>> {
        store.serve_queries_as(StoreRole::Active);
        Task::open(
            partition,
            self.processor.clone(),
            store,
            &self.kinds,
            self.clock.now(),
        )
    }
}

impl<P: Processor> Engine<P> {
    /// The topics (subscription index, name) whose partition *p* belongs to task *p*.
    pub fn task_topics(&self) -> Vec<(usize, String)> {
        self.subscriptions()
            .iter()
            .enumerate()
            .filter(|(_, subscription)| subscription.route.feeds_task())
            .map(|(index, subscription)| (index, subscription.topic.clone()))
            .collect()
    }

    /// The tasks open, by partition.
    pub fn open_tasks(&self) -> impl Iterator<Item = i32> + '_ {
        self.tasks.keys().copied()
    }

    /// Whether task `partition` is open.
    pub fn has_task(&self, partition: i32) -> bool {
        self.tasks.contains_key(&partition)
    }

    /// The memory the records of `subscription`'s partition `partition`
    /// consumed into its task and not yet handled are counted as (0 for a
    /// topic that feeds no task).
    pub fn buffered_bytes(&self, subscription: usize, partition: i32) -> usize {
        let Some(slot) = self.intake.task_slot(subscription) else {
            return 0;
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

    /// What opens this engine's tasks, to be sent to another thread: loading
    /// a task's timers from a large state takes long, and is done off the
    /// processing thread (see [`TaskOpener::open`]).
    pub fn task_opener(&self) -> TaskOpener<P> {
        TaskOpener {
            processor: self.processor.clone(),
            kinds: self.intake.kinds().to_vec(),
            clock: self.clock.clone(),
        }
    }

    /// Runs `task`, opened by this engine's [`TaskOpener`].
    pub fn install_task(&mut self, task: Task<P>) {
        self.tasks.insert(task.partition, task);
    }

    /// Sets every open task aside, just after a commit, for an eager
    /// rebalance: the group takes every partition back and hands out a new
    /// assignment, which gives most tasks back to the instance that had
    /// them. A task given back runs again at once ([`Self::resume_task`]),
    /// with no restore and no reloading of its timers; the others close
    /// when the assignment comes ([`Self::close_suspended`]). Returns the
    /// tasks set aside; a task that cannot be (jobs in flight) stays, and
    /// closes with its partitions.
    pub fn suspend_tasks(&mut self) -> Vec<i32> {
        let suspendable: Vec<i32> = self
            .tasks
            .iter_mut()
            .filter_map(|(partition, task)| task.suspend().then_some(*partition))
            .collect();
        for partition in &suspendable {
            let task = self.tasks.remove(partition).expect("an open task");
            self.suspended.insert(*partition, task);
        }
        suspendable
    }

    /// Runs suspended task `partition` again; false if there is none.
    pub fn resume_task(&mut self, partition: i32) -> bool {
        match self.suspended.remove(&partition) {
            Some(task) => {
                self.tasks.insert(partition, task);
                true
            }
            None => false,
        }
    }

    /// Whether task `partition` is suspended.
    pub fn is_suspended(&self, partition: i32) -> bool {
        self.suspended.contains_key(&partition)
    }

    /// Whether suspended task `partition` committed its inputs `topics` up
    /// to `committed`, the group's committed offsets of them. Not if the
    /// group gave the task to another member while it was set aside (this
    /// one's assignment was lost) and that one went on and committed: its
    /// state is then stale.
    pub fn suspended_task_is_current(
        &mut self,
        partition: i32,
        topics: &[&str],
        committed: &[Option<i64>],
    ) -> anyhow::Result<bool> {
        match self.suspended.get_mut(&partition) {
            Some(task) => Ok(stored_positions(&mut task.store, topics)? == committed),
            None => Ok(false),
        }
    }

    /// The offset of input `topic` that open task `partition` committed
    /// with its state, if it records one (`topic` feeds the task).
    pub fn committed_position(
        &mut self,
        partition: i32,
        topic: &str,
    ) -> anyhow::Result<Option<i64>> {
        match self.tasks.get_mut(&partition) {
            Some(task) => Ok(stored_positions(&mut task.store, &[topic])?.pop().flatten()),
            None => Ok(None),
        }
    }

    /// Closes suspended task `partition`, if there is one.
    pub fn close_suspended_task(&mut self, partition: i32) {
        if self.suspended.remove(&partition).is_some() {
            tracing::info!(partition, "task closed");
        }
    }

    /// Closes every suspended task (the assignment gave them to others) and
    /// returns them.
    pub fn close_suspended(&mut self) -> Vec<i32> {
        let closed: Vec<i32> = self.suspended.keys().copied().collect();
        for partition in &closed {
            self.suspended.remove(partition);
            tracing::info!(partition, "task closed");
        }
        closed
    }

    /// Skips records of `subscription`'s `partition` below `offset`: they are
    /// already in the state (at-least-once restarts).
    pub fn skip_below(&mut self, subscription: usize, partition: i32, offset: i64) {
        self.intake.skip_below(subscription, partition, offset);
    }

    /// Forgets `subscription`'s `partition`, closing its task if it feeds one.
    pub fn release(&mut self, subscription: usize, partition: i32) {
        if self.intake.release(subscription, partition).feeds_task() {
            if let Some(task) = self.tasks.remove(&partition) {
                tracing::info!(partition = task.partition, "task closed");
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

    /// Counts changelog records replayed into local state.
    pub fn count_restored(&mut self, records: u64) {
        self.counters.restored_records += records;
    }
}
