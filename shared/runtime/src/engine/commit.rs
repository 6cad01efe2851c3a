//! Committing: watermark announcements, changelog records, the transaction
//! (or flush and offset commit), then local state; and rolling back when a
//! commit fails.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::{Offset, TopicPartitionList};

use super::{changelog_tag, Engine, GroupConsumer, SOURCE_HEADER, WATERMARK_HEADER};
use crate::delivery::{CommitError, Outgoing, UNTRACKED};
use crate::processor::Processor;

/// The headers of a watermark announcement.
fn announcement_headers(watermark: &[u8; 8], source: &[u8; 4]) -> OwnedHeaders {
    OwnedHeaders::new_with_capacity(2)
        .insert(Header {
            key: WATERMARK_HEADER,
            value: Some(&watermark[..]),
        })
        .insert(Header {
            key: SOURCE_HEADER,
            value: Some(&source[..]),
        })
}

impl<P: Processor> Engine<P> {
    /// Sends every upstream watermark that moved to every partition of its
    /// repartition topic.
    fn announce_watermarks(&mut self) -> anyhow::Result<()> {
        for ((slot, source), clock) in self.upstream.iter_mut() {
            let Some(max) = clock.max_event_time else {
                continue;
            };
            let watermark = max.saturating_sub(self.settings.event_time.max_out_of_orderness);
            let moved = clock
                .announced
                .is_none_or(|announced| announced < watermark);
            let heartbeat = clock.active && self.settings.event_time.idleness.is_on();
            if !moved && !heartbeat {
                continue;
            }
            let repartition = self.inputs[*slot]
                .repartition
                .as_ref()
                .expect("repartitioned input");
            let watermark_bytes = watermark.to_be_bytes();
            let source_bytes = (*source as u32).to_be_bytes();
            for partition in 0..repartition.downstream_partitions {
                self.output.delivery.send(Outgoing {
                    topic: &repartition.topic,
                    partition: Some(partition as i32),
                    key: None,
                    payload: None,
                    headers: Some(announcement_headers(&watermark_bytes, &source_bytes)),
                    tag: UNTRACKED,
                });
            }
            clock.announced = Some(watermark);
            clock.active = false;
        }
        Ok(())
    }

    /// Sends every task watermark that moved to every partition of the stage
    /// link the output writes. The announcement follows the task's results in
    /// each partition, so a reading task never sees a watermark before the
    /// results it covers. With an idle timeout, tasks that have a watermark
    /// re-announce it at every commit, so that the reading stage can tell them
    /// from tasks that never will (whose input received nothing).
    fn announce_task_watermarks(&mut self) {
        let Some(partitions) = self.settings.link_partitions else {
            return;
        };
        let heartbeat = self.settings.event_time.idleness.is_on();
        for task in self.tasks.values_mut() {
            let watermark = task.watermark();
            let moved = task.announced.is_none_or(|announced| announced < watermark);
            if watermark == crate::time::NO_WATERMARK || !(moved || heartbeat) {
                continue;
            }
            let watermark_bytes = watermark.to_be_bytes();
            let source_bytes = (task.partition as u32).to_be_bytes();
            for partition in 0..partitions {
                self.output.send_control(
                    partition as i32,
                    announcement_headers(&watermark_bytes, &source_bytes),
                );
            }
            task.announced = Some(watermark);
        }
    }

    fn offsets_to_commit(&self) -> anyhow::Result<TopicPartitionList> {
        let mut offsets = TopicPartitionList::new();
        for ((topic_index, partition), next) in &self.positions {
            offsets.add_partition_offset(
                &self.topics[*topic_index].0,
                *partition,
                Offset::Offset(*next),
            )?;
        }
        Ok(offsets)
    }

    /// Commits outputs, state changes and input offsets together.
    pub fn commit(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        let started = Instant::now();
        self.announce_watermarks()?;
        self.announce_task_watermarks();
        for task in self.tasks.values_mut() {
            task.stage_clocks();
            for ((topic_index, partition), next) in &self.positions {
                if *partition == task.partition && Self::is_task_route(self.topics[*topic_index].1)
                {
                    task.stage_position(&self.topics[*topic_index].0, *next);
                }
            }
            for store in 0..self.settings.store_names.len() {
                let topic = &self.settings.changelog_topics[store];
                for (key, value) in task.store.uncommitted(store) {
                    self.output.delivery.send(Outgoing {
                        topic,
                        partition: Some(task.partition),
                        key: Some(key),
                        payload: value,
                        headers: None,
                        tag: changelog_tag(store, task.partition),
                    });
                }
            }
        }
        let offsets = self.offsets_to_commit()?;
        let group = consumer.group_metadata();
        let result = self
            .output
            .delivery
            .commit(&offsets, group.as_ref())
            .and_then(|()| {
                if self.output.delivery.is_transactional() || offsets.count() == 0 {
                    return Ok(());
                }
                consumer
                    .commit(&offsets, CommitMode::Sync)
                    .map_err(|e| CommitError::Aborted(format!("committing offsets: {e}")))
            });
        match result {
            Ok(()) => {
                let delivered = self.output.delivery.take_offsets();
                for task in self.tasks.values_mut() {
                    let checkpoints: Vec<(usize, i64)> = (0..self.settings.store_names.len())
                        .filter_map(|store| {
                            delivered
                                .get(&changelog_tag(store, task.partition))
                                .map(|offset| (store, *offset))
                        })
                        .collect();
                    task.store.apply_overlay(&checkpoints)?;
                    for (name, count) in std::mem::take(&mut task.counters) {
                        *self.processor_counters.entry(name).or_default() += count;
                    }
                }
                self.commits += 1;
            }
            Err(CommitError::Aborted(reason)) => {
                tracing::warn!(%reason, "commit aborted; rolling back to the last commit");
                self.commits_aborted += 1;
                self.rollback(consumer)?;
            }
            Err(fatal @ CommitError::Fatal(_)) => return Err(fatal.into()),
        }
        self.commit_seconds += started.elapsed().as_secs_f64();
        self.publish_metrics();
        self.last_commit = Instant::now();
        Ok(())
    }

    /// Returns every task to its last committed state and rewinds the
    /// consumer to the committed offsets.
    fn rollback(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        for task in self.tasks.values_mut() {
            task.rollback()?;
        }
        self.upstream.clear();
        let committed = self.committed_offsets(consumer)?;
        for element in committed.elements() {
            let offset = match element.offset() {
                Offset::Offset(offset) => Offset::Offset(offset),
                _ => Offset::Beginning,
            };
            consumer.seek(
                element.topic(),
                element.partition(),
                offset,
                Duration::from_secs(10),
            )?;
        }
        self.positions.clear();
        Ok(())
    }

    /// The group's committed offsets, waiting while the broker is unreachable.
    fn committed_offsets(&self, consumer: &GroupConsumer<P>) -> anyhow::Result<TopicPartitionList> {
        loop {
            match consumer.committed(Duration::from_secs(10)) {
                Ok(offsets) => return Ok(offsets),
                Err(error) if !self.shutdown.load(Ordering::Relaxed) => {
                    tracing::warn!(%error, "cannot read committed offsets yet; retrying");
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err(error) => anyhow::bail!("reading committed offsets: {error}"),
            }
        }
    }
}
