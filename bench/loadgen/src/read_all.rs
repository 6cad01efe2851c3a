//! `loadgen read-all`: how fast one consumer alone reads topics from their
//! first offset to their end, doing nothing with the records: the ceiling
//! of a changelog restore on this machine (`make bench-restore` prints it
//! beside each restore).
//!
//! The consumer is a restore's (`streams_runtime::client::restore_reader_config`):
//! read_committed, assigned (no group), the same fetch and prefetch
//! settings. The clock starts at the assignment and stops at the last
//! record, as a restore's "restored changelog" time does.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;
use streams_runtime::client::{parse_key_value, restore_reader_config};

use crate::kafka::{partitions, Cluster};

/// What to read.
#[derive(Debug, clap::Args)]
pub struct ReadAllArgs {
    /// The topics, every partition of each, read together.
    #[arg(long, value_delimiter = ',', required = true)]
    pub topics: Vec<String>,
    /// Extra librdkafka properties of the consumer, to try a setting.
    #[arg(long = "kafka", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub properties: Vec<(String, String)>,
}

/// A partition still being read, up to its end offset when the read began.
struct Partition {
    topic: String,
    partition: i32,
    end: i64,
}

/// Reads `args.topics` to their ends and prints the records, the time and
/// the rate as one JSON object.
pub fn read_all(cluster: &Cluster, args: ReadAllArgs) -> anyhow::Result<()> {
    let mut config = restore_reader_config(&cluster.client_config(), "loadgen-read-all");
    for (key, value) in &args.properties {
        config.set(key, value);
    }
    let consumer: BaseConsumer = config.create()?;
    let mut pending = Vec::new();
    let mut assignment = TopicPartitionList::new();
    for topic in &args.topics {
        for partition in 0..partitions(&consumer, topic)? {
            let (low, end) =
                consumer.fetch_watermarks(topic, partition, Duration::from_secs(10))?;
            if low < end {
                assignment.add_partition_offset(topic, partition, Offset::Offset(low))?;
                pending.push(Partition {
                    topic: topic.clone(),
                    partition,
                    end,
                });
            }
        }
    }
    let started = Instant::now();
    consumer.assign(&assignment)?;
    let (mut records, mut bytes, mut last) = (0u64, 0u64, started);
    while !pending.is_empty() {
        match consumer.poll(Duration::from_millis(10)) {
            Some(Ok(message)) => {
                records += 1;
                bytes += (message.key_len() + message.payload_len()) as u64;
                last = Instant::now();
                let next = message.offset() + 1;
                let topic = message.topic();
                pending.retain(|p| {
                    !(p.partition == message.partition() && p.topic == topic && next >= p.end)
                });
            }
            Some(Err(error)) => anyhow::bail!("reading: {error}"),
            // Markers of transactions take the last offsets of a
            // read_committed partition: its position tells it is done.
            None => {
                let positions = consumer.position()?;
                pending.retain(|p| {
                    let position = positions.find_partition(&p.topic, p.partition);
                    !position
                        .is_some_and(|tp| matches!(tp.offset(), Offset::Offset(o) if o >= p.end))
                });
                anyhow::ensure!(
                    started.elapsed() < Duration::from_secs(600),
                    "not at the end after 10 minutes"
                );
            }
        }
    }
    let seconds = last.duration_since(started).as_secs_f64().max(1e-3);
    println!(
        "{}",
        json!({
            "records": records,
            "bytes": bytes,
            "elapsed_ms": (seconds * 1000.0).round() as u64,
            "records_per_s": (records as f64 / seconds).round() as u64,
        })
    );
    Ok(())
}
