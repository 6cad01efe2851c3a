//! How records flow through the driver: appended to the in-memory topics,
//! collected from what a stage wrote, and fed to every stage in append order.

use super::{StoredRecord, TestDriver};
use crate::engine::{Incoming, Subscription};
use crate::partitioner::murmur2_partition;

impl TestDriver {
    pub(super) fn partition_for(&self, topic: &str, key: Option<&[u8]>) -> anyhow::Result<i32> {
        let count = self
            .topics
            .get(topic)
            .map(|t| t.partitions.len())
            .ok_or_else(|| anyhow::anyhow!("unknown topic {topic}"))?;
        Ok(key.map_or(0, |key| murmur2_partition(key, count)))
    }

    pub(super) fn append(
        &mut self,
        topic: &str,
        partition: Option<i32>,
        mut record: StoredRecord,
    ) -> anyhow::Result<()> {
        let partition = match partition {
            Some(partition) => partition,
            None => self.partition_for(topic, record.key.as_deref())?,
        };
        let memory = self
            .topics
            .get_mut(topic)
            .ok_or_else(|| anyhow::anyhow!("unknown topic {topic}"))?;
        let log = memory
            .partitions
            .get_mut(partition as usize)
            .ok_or_else(|| anyhow::anyhow!("{topic} has no partition {partition}"))?;
        self.sequence += 1;
        record.sequence = self.sequence;
        log.push(record);
        Ok(())
    }

    /// Appends what stage `index` collected to the topics.
    pub(super) fn collect(&mut self, index: usize) -> anyhow::Result<()> {
        let mut written = Vec::new();
        self.stages[index].drain(&mut |topic, partition, record| {
            written.push((topic.to_string(), partition, record));
        });
        for (topic, partition, record) in written {
            self.append(&topic, partition, record)?;
        }
        Ok(())
    }

    /// Feeds every stage the records it has not read, oldest append first,
    /// until none is left.
    pub(super) fn run(&mut self) -> anyhow::Result<()> {
        let subscriptions: Vec<Vec<Subscription>> = self
            .stages
            .iter()
            .map(|stage| stage.subscriptions())
            .collect();
        loop {
            let mut next: Option<(u64, usize, usize, i32, usize)> = None;
            for (stage, subscribed) in subscriptions.iter().enumerate() {
                for (subscription, Subscription { topic, .. }) in subscribed.iter().enumerate() {
                    let Some(memory) = self.topics.get(topic) else {
                        continue;
                    };
                    for (partition, records) in memory.partitions.iter().enumerate() {
                        let cursor = self.cursors[stage]
                            .entry((subscription, partition as i32))
                            .or_insert(0);
                        while records.get(*cursor).is_some_and(|r| r.aborted) {
                            *cursor += 1;
                        }
                        if let Some(record) = records.get(*cursor) {
                            if next.is_none_or(|(sequence, ..)| record.sequence < sequence) {
                                next = Some((
                                    record.sequence,
                                    stage,
                                    subscription,
                                    partition as i32,
                                    *cursor,
                                ));
                            }
                        }
                    }
                }
            }
            let Some((_, stage, subscription, partition, offset)) = next else {
                return Ok(());
            };
            let topic = &subscriptions[stage][subscription].topic;
            let record = self.topics[topic].partitions[partition as usize][offset].clone();
            self.cursors[stage].insert((subscription, partition), offset + 1);
            self.stages[stage].handle(Incoming {
                subscription,
                partition,
                offset: offset as i64,
                key: record.key.as_deref(),
                value: record.value.as_deref(),
                announcement: record.announcement,
                // The driver's records carry event time, not when they
                // were written: no end-to-end latency to measure.
                timestamp: None,
            })?;
            self.collect(stage)?;
        }
    }
}
