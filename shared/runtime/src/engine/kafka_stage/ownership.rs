//! Which task input partitions the stage owns: what assignments give and
//! revocations take, which tasks are held only in part, and which
//! partitions are paused for back-pressure.

use std::collections::{BTreeSet, HashSet};

/// A task input partition: (subscription index, partition).
pub(super) type InputPartition = (usize, i32);

#[derive(Default)]
pub(super) struct Ownership {
    /// Owned partitions of the topics that feed tasks.
    owned: HashSet<InputPartition>,
    /// Tasks of which only some partitions are owned (paused).
    incomplete: BTreeSet<i32>,
    /// Task input partitions paused because their task has its part of
    /// [`MERGE_BUFFER_BYTES`](super::run_loop::MERGE_BUFFER_BYTES) waiting.
    backpressured: HashSet<InputPartition>,
    /// Assignments received (see [`crate::metrics::REBALANCES`]).
    rebalances: u64,
    /// Whether an assignment has come since the start, or since the last
    /// revocation that took every partition.
    assigned: bool,
}

impl Ownership {
    /// An assignment begins.
    pub fn assignment(&mut self) {
        self.rebalances += 1;
        self.assigned = true;
    }

    pub fn take(&mut self, input: InputPartition) {
        self.owned.insert(input);
    }

    /// Gives `input` up; whether it was owned.
    pub fn give_up(&mut self, input: InputPartition) -> bool {
        self.owned.remove(&input)
    }

    /// A revocation ended: with nothing owned, the stage waits for an
    /// assignment.
    pub fn revocation_done(&mut self) {
        if self.owned.is_empty() {
            self.assigned = false;
        }
    }

    /// The topics of `task_topics` (subscription index, name) whose
    /// partition `partition` is owned.
    pub fn owned_of<'a>(&self, task_topics: &'a [(usize, String)], partition: i32) -> Vec<&'a str> {
        task_topics
            .iter()
            .filter(|(index, _)| self.owned.contains(&(*index, partition)))
            .map(|(_, topic)| topic.as_str())
            .collect()
    }

    /// Marks task `partition` held in part; whether it was not before.
    pub fn held_in_part(&mut self, partition: i32) -> bool {
        self.incomplete.insert(partition)
    }

    /// Task `partition` is held whole; whether it was held in part.
    pub fn held_whole(&mut self, partition: i32) -> bool {
        self.incomplete.remove(&partition)
    }

    /// Forgets that task `partition` is held in part if none of its
    /// partitions is owned any more.
    pub fn forget_if_gone(&mut self, partition: i32) {
        if !self.owned.iter().any(|(_, p)| *p == partition) {
            self.incomplete.remove(&partition);
        }
    }

    pub fn owned(&self) -> &HashSet<InputPartition> {
        &self.owned
    }

    pub fn is_backpressured(&self, input: &InputPartition) -> bool {
        self.backpressured.contains(input)
    }

    pub fn backpressure(&mut self, inputs: impl IntoIterator<Item = InputPartition>) {
        self.backpressured.extend(inputs);
    }

    pub fn relieve(&mut self, input: &InputPartition) {
        self.backpressured.remove(input);
    }

    /// Takes every back-pressured partition out, to be resumed.
    pub fn relieve_all(&mut self) -> Vec<InputPartition> {
        self.backpressured.drain().collect()
    }

    pub fn rebalances(&self) -> u64 {
        self.rebalances
    }

    /// Tasks held in part.
    pub fn incomplete(&self) -> usize {
        self.incomplete.len()
    }

    /// Whether the stage waits for partitions: none assigned yet, or a task
    /// held in part.
    pub fn waits_for_partitions(&self) -> bool {
        !self.assigned || !self.incomplete.is_empty()
    }
}
