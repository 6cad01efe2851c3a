//! Task lifecycle on rebalances: opening (and restoring) the tasks of
//! assigned partitions, committing and closing the tasks of revoked ones.

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

use super::{Engine, GroupConsumer, Route};
use crate::config::ProcessingGuarantee;
use crate::processor::Processor;
use crate::state::store::TaskStore;
use crate::task::{stored_positions, Task};

impl<P: Processor> Engine<P> {
    /// Opens (and restores) the tasks of newly assigned partitions.
    pub fn assign(
        &mut self,
        consumer: &GroupConsumer<P>,
        partitions: &TopicPartitionList,
    ) -> anyhow::Result<()> {
        self.metrics.set_ready(false);
        let mut task_partitions: Vec<i32> = partitions
            .elements()
            .iter()
            .filter(|e| {
                self.topic_index(e.topic())
                    .is_some_and(|i| Self::is_task_route(self.topics[i].1))
            })
            .map(|e| e.partition())
            .collect();
        task_partitions.sort_unstable();
        task_partitions.dedup();
        for partition in task_partitions {
            if self.tasks.contains_key(&partition) {
                continue;
            }
            let started = Instant::now();
            let store = self.open_store(consumer, partition)?;
            let task = Task::open(partition, self.processor.clone(), store, &self.kinds)?;
            tracing::info!(
                partition,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "task ready"
            );
            self.tasks.insert(partition, task);
        }
        self.publish_metrics();
        self.metrics.set_ready(true);
        Ok(())
    }

    /// The topics (engine index, name) whose partition *p* belongs to task *p*.
    fn task_topics(&self) -> Vec<(usize, &str)> {
        self.topics
            .iter()
            .enumerate()
            .filter(|(_, (_, route))| Self::is_task_route(*route))
            .map(|(index, (name, _))| (index, name.as_str()))
            .collect()
    }

    /// Opens task `partition`'s store and brings it up to date.
    ///
    /// Under exactly-once, local state is committed state: replay the
    /// changelog past its checkpoint. Under at-least-once, state, changelog
    /// and offsets are not committed atomically, so the local store (written
    /// in one batch with the input positions it reflects) is trusted as it is
    /// when no other instance has committed past it; records below its
    /// positions are then skipped instead of applied twice. Otherwise the
    /// local copy is stale: it is dropped and rebuilt from the changelog.
    fn open_store(
        &mut self,
        consumer: &GroupConsumer<P>,
        partition: i32,
    ) -> anyhow::Result<TaskStore> {
        let path = self.settings.state_dir.join(format!("task-{partition}"));
        let mut store = TaskStore::open(&path, &self.settings.store_names, &self.resources)?;
        let task_topics: Vec<(usize, String)> = self
            .task_topics()
            .into_iter()
            .map(|(index, name)| (index, name.to_string()))
            .collect();
        let names: Vec<&str> = task_topics.iter().map(|(_, name)| name.as_str()).collect();
        let at_least_once = self.settings.guarantee == ProcessingGuarantee::AtLeastOnce;
        let local = stored_positions(&mut store, &names)?;
        let mut replay = true;
        if at_least_once && local.iter().any(Option::is_some) {
            let committed = self.committed_for(consumer, &names, partition)?;
            let stale = local
                .iter()
                .zip(&committed)
                .any(|(local, committed)| committed.is_some_and(|c| local.is_none_or(|l| c > l)));
            if stale {
                tracing::info!(
                    partition,
                    "local state is behind the committed offsets; rebuilding it"
                );
                drop(store);
                std::fs::remove_dir_all(&path)?;
                store = TaskStore::open(&path, &self.settings.store_names, &self.resources)?;
            } else {
                replay = false;
            }
        }
        if replay {
            self.restored_records +=
                self.restorer
                    .restore(&mut store, &self.settings.changelog_topics, partition)?;
        }
        if at_least_once {
            for ((index, _), position) in task_topics
                .iter()
                .zip(stored_positions(&mut store, &names)?)
            {
                if let Some(position) = position {
                    self.skip_below.insert((*index, partition), position);
                }
            }
        }
        Ok(store)
    }

    /// The group's committed offsets of `topics` at `partition`.
    fn committed_for(
        &self,
        consumer: &GroupConsumer<P>,
        topics: &[&str],
        partition: i32,
    ) -> anyhow::Result<Vec<Option<i64>>> {
        let mut request = TopicPartitionList::new();
        for topic in topics {
            request.add_partition(topic, partition);
        }
        let committed = consumer.committed_offsets(request, Duration::from_secs(30))?;
        Ok(topics
            .iter()
            .map(|topic| {
                match committed
                    .find_partition(topic, partition)
                    .map(|e| e.offset())
                {
                    Some(Offset::Offset(offset)) => Some(offset),
                    _ => None,
                }
            })
            .collect())
    }

    /// Commits, then closes the tasks of revoked partitions.
    pub fn revoke(
        &mut self,
        consumer: &GroupConsumer<P>,
        partitions: &TopicPartitionList,
    ) -> anyhow::Result<()> {
        self.commit(consumer)?;
        for element in partitions.elements() {
            if let Some(index) = self.topic_index(element.topic()) {
                self.positions.remove(&(index, element.partition()));
                self.skip_below.remove(&(index, element.partition()));
                if let Route::Upstream { slot } = self.topics[index].1 {
                    self.upstream.remove(&(slot, element.partition()));
                }
                if Self::is_task_route(self.topics[index].1) {
                    if let Some(task) = self.tasks.remove(&element.partition()) {
                        tracing::info!(partition = task.partition, "task closed");
                    }
                }
            }
        }
        self.publish_metrics();
        Ok(())
    }
}
