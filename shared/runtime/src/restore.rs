//! Restoring a task's state from its changelog topics.
//!
//! Local RocksDB only ever holds committed changes plus, per store, the
//! changelog offset they reach. Restoring a store therefore reads its
//! changelog partition from that checkpoint (or from the beginning when there
//! is no local state) up to the end, and writes it in large batches.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::state::store::TaskStore;

/// Records written to RocksDB per batch while restoring.
const RESTORE_BATCH: usize = 10_000;
/// How long a restore waits without progress before taking the end as reached
/// (transaction markers and aborted records at the tail are never delivered).
const IDLE_END: Duration = Duration::from_secs(2);

/// Reads changelog partitions into task stores.
pub(crate) struct Restorer {
    consumer: BaseConsumer,
}

impl Restorer {
    /// A restorer using a group-less, read_committed consumer.
    pub fn new(base: &ClientConfig, application_id: &str) -> anyhow::Result<Self> {
        let mut config = base.clone();
        config
            .set("group.id", format!("{application_id}-restore"))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "false")
            .set("fetch.max.bytes", "52428800");
        crate::startup::prefetch_eagerly(&mut config);
        let consumer = config
            .create()
            .map_err(|e| anyhow::anyhow!("cannot create the restore consumer: {e}"))?;
        Ok(Restorer { consumer })
    }

    /// Brings every store of `store` up to the end of its changelog partition.
    /// Returns the number of changelog records applied.
    pub fn restore(
        &self,
        store: &mut TaskStore,
        changelogs: &[String],
        partition: i32,
    ) -> anyhow::Result<u64> {
        let mut restored = 0;
        for (index, topic) in changelogs.iter().enumerate() {
            let start = match store.checkpoint(index)? {
                Some(offset) => Offset::Offset(offset + 1),
                None => Offset::Beginning,
            };
            restored += self.restore_one(store, index, topic, partition, start)?;
        }
        Ok(restored)
    }

    /// Whether the consumer's position has reached `end` (it moves past
    /// transaction markers, which are never delivered as messages).
    fn reached(&self, topic: &str, partition: i32, end: i64) -> bool {
        let Ok(positions) = self.consumer.position() else {
            return false;
        };
        positions.find_partition(topic, partition).is_some_and(
            |element| matches!(element.offset(), Offset::Offset(offset) if offset >= end),
        )
    }

    fn restore_one(
        &self,
        store: &mut TaskStore,
        index: usize,
        topic: &str,
        partition: i32,
        start: Offset,
    ) -> anyhow::Result<u64> {
        let (low, high) = self
            .consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(10))
            .map_err(|e| {
                anyhow::anyhow!("cannot read the end of changelog {topic}-{partition}: {e}")
            })?;
        let first = match start {
            Offset::Offset(offset) => offset.max(low),
            _ => low,
        };
        if first >= high {
            return Ok(0);
        }
        let started = Instant::now();
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset(topic, partition, Offset::Offset(first))?;
        self.consumer.assign(&assignment)?;
        let mut batch: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::with_capacity(RESTORE_BATCH);
        let mut last_offset = None;
        let mut restored = 0u64;
        let mut last_progress = Instant::now();
        loop {
            match self.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(message)) => {
                    last_progress = Instant::now();
                    let key = message.key().unwrap_or_default().to_vec();
                    batch.push((key, message.payload().map(<[u8]>::to_vec)));
                    last_offset = Some(message.offset());
                    if batch.len() >= RESTORE_BATCH {
                        restored += batch.len() as u64;
                        store.write_restored(index, &batch, message.offset())?;
                        batch.clear();
                    }
                    if message.offset() + 1 >= high {
                        break;
                    }
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, topic, partition, "error while restoring; retrying");
                }
                None if self.reached(topic, partition, high) => break,
                None if last_progress.elapsed() >= IDLE_END => break,
                None => {}
            }
        }
        if let Some(offset) = last_offset {
            restored += batch.len() as u64;
            store.write_restored(index, &batch, offset)?;
        }
        self.consumer.unassign()?;
        tracing::info!(
            topic,
            partition,
            records = restored,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "restored changelog"
        );
        Ok(restored)
    }
}
