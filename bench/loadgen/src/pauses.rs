//! `loadgen pauses`: how long each output partition goes without committed
//! output while a consumer group changes, and which member owns each input
//! partition meanwhile (`make bench-pause`).
//!
//! A read_committed consumer notes when each output record arrives; a
//! second client describes the group every [`SAMPLE_EVERY`] and notes each
//! change of an input partition's owner. The gaps between arrivals on a
//! partition, beside the owners before and after a change, tell the tasks
//! that kept running from those that moved.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;
use streams_runtime::admin::group_members;

use crate::kafka::Cluster;

/// How often the group's assignment is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// What to follow.
#[derive(Debug, clap::Args)]
pub struct PausesArgs {
    /// The output topic whose partitions' arrivals are timed.
    #[arg(long)]
    pub output: String,
    /// The consumer group of the system under test.
    #[arg(long)]
    pub group: String,
    /// The input topic whose partitions' owners are followed.
    #[arg(long)]
    pub input: String,
    /// How long to follow, in seconds.
    #[arg(long)]
    pub seconds: f64,
    /// Gaps between two arrivals on a partition at least this long are listed.
    #[arg(long, default_value_t = 250)]
    pub min_gap_ms: i64,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}

/// Follows the group for `args.seconds` and prints one JSON object: the
/// listed gaps per output partition (`from_ms`, `to_ms`), the records per
/// partition, and the owner (member id) of each input partition at each
/// sample where one changed.
pub fn follow(cluster: &Cluster, args: PausesArgs) -> anyhow::Result<()> {
    let consumer = cluster.committed_reader("loadgen-pauses")?;
    let metadata = consumer.fetch_metadata(Some(&args.output), Duration::from_secs(10))?;
    let partitions = metadata
        .topics()
        .first()
        .map_or(0, |topic| topic.partitions().len());
    anyhow::ensure!(partitions > 0, "topic {} has no partitions", args.output);
    let mut assignment = TopicPartitionList::new();
    for partition in 0..partitions as i32 {
        assignment.add_partition_offset(&args.output, partition, Offset::End)?;
    }
    consumer.assign(&assignment)?;

    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let describer = cluster.query_consumer("loadgen-pauses-describe")?;
        let (group, input, done) = (args.group.clone(), args.input.clone(), done.clone());
        std::thread::spawn(move || sample_owners(&describer, &group, &input, &done))
    };

    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let mut last_arrival: Vec<Option<i64>> = vec![None; partitions];
    let mut records = vec![0u64; partitions];
    let mut gaps = Vec::new();
    while Instant::now() < deadline {
        let Some(message) = consumer.poll(Duration::from_millis(5)) else {
            continue;
        };
        let partition = rdkafka::message::Message::partition(&message?) as usize;
        let arrived = now_ms();
        if let Some(previous) = last_arrival[partition] {
            if arrived - previous >= args.min_gap_ms {
                gaps.push(json!({"partition": partition, "from_ms": previous, "to_ms": arrived}));
            }
        }
        last_arrival[partition] = Some(arrived);
        records[partition] += 1;
    }
    // A partition silent at the end has a gap that is still open.
    let ended = now_ms();
    for (partition, last) in last_arrival.iter().enumerate() {
        if let Some(last) = last.filter(|last| ended - last >= args.min_gap_ms) {
            gaps.push(
                json!({"partition": partition, "from_ms": last, "to_ms": ended, "open": true}),
            );
        }
    }
    done.store(true, Ordering::Relaxed);
    let owners = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("the group sampler panicked"))??;
    println!(
        "{}",
        json!({"gaps": gaps, "records": records, "owners": owners, "ended_ms": ended})
    );
    Ok(())
}

/// Samples the owner of each partition of `input` in `group` until `done`;
/// returns the samples where some owner changed.
fn sample_owners(
    describer: &BaseConsumer,
    group: &str,
    input: &str,
    done: &AtomicBool,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut changes = Vec::new();
    let mut last: Option<BTreeMap<i32, String>> = None;
    while !done.load(Ordering::Relaxed) {
        let at = now_ms();
        // A failed description (the coordinator moving) is skipped, not fatal.
        if let Ok(mut described) = group_members(describer.client(), &[group], SAMPLE_EVERY * 10) {
            let owners: BTreeMap<i32, String> = (described.remove(group).unwrap_or_default())
                .into_iter()
                .flat_map(|member| {
                    (member.assignment.into_iter())
                        .filter(|(topic, _)| topic == input)
                        .map(move |(_, partition)| (partition, member.member_id.clone()))
                })
                .collect();
            if last.as_ref() != Some(&owners) {
                changes.push(json!({"at_ms": at, "owners": owners}));
                last = Some(owners);
            }
        }
        std::thread::sleep(SAMPLE_EVERY);
    }
    Ok(changes)
}
