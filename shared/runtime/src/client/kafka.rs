//! What every librdkafka client of a stage is configured with beyond the
//! shared properties, and how each is named: group consumers, changelog
//! readers, client ids, member ids, instance ids and transactional ids. (The producer's
//! settings are `Delivery`'s.)

use std::path::Path;

use clap::ValueEnum;
use rdkafka::consumer::BaseConsumer;
use rdkafka::ClientConfig;

/// Which consumer group protocol the stages' consumers speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GroupProtocol {
    /// Eager rebalancing, librdkafka's range assignor.
    Classic,
    /// KIP-848 incremental rebalancing, the broker's range assignor.
    Consumer,
}

/// How a member of the stage's group is named, so that every instance can
/// tell which process a member belongs to and sort members as the range
/// assignor does. `client.id` is `<instance>/<thread>`.
pub(crate) fn client_id(instance: &str, thread: usize) -> String {
    format!("{instance}/{thread}")
}

/// The instance and thread of a [`client_id`]; `None` for a client id of
/// another form.
pub(crate) fn parse_client_id(client_id: &str) -> Option<(&str, usize)> {
    let (instance, thread) = client_id.rsplit_once('/')?;
    Some((instance, thread.parse().ok()?))
}

/// A stable id for this instance's state directory, used in the
/// transactional id (without `--instance-id`) so that a restarted instance
/// fences its predecessor.
pub(crate) fn instance_id(state_dir: &Path) -> anyhow::Result<String> {
    let path = state_dir.join("instance.id");
    if let Ok(existing) = std::fs::read_to_string(&path) {
        return Ok(existing.trim().to_string());
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let id = format!("{:x}{:x}", nanos, std::process::id());
    std::fs::write(&path, &id)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    Ok(id)
}

/// The name of processing thread `index` of instance `base`, for what must
/// be unique per client of the group (see `StreamThread::member_id`).
pub(crate) fn member_id(base: &str, index: usize) -> String {
    match index {
        0 => base.to_string(),
        index => format!("{base}-{index}"),
    }
}

/// The transactional id of processing thread `thread` of `instance` in the
/// stage whose group is `group`: unique per member of the group, and the
/// same across the instance's restarts, so that a restarted instance fences
/// its predecessor's transactions.
pub(crate) fn transactional_id(group: &str, instance: &str, thread: usize) -> String {
    member_id(&format!("{group}-{instance}"), thread)
}

/// The settings of a stage's group consumer (one per processing thread).
pub(crate) fn group_consumer_config(
    base: &ClientConfig,
    protocol: GroupProtocol,
    source_topics: usize,
    application_id: &str,
    client_id: &str,
    group_instance_id: Option<&str>,
) -> ClientConfig {
    let mut config = base.clone();
    config
        .set("group.id", application_id)
        .set("client.id", client_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "false");
    prefetch_eagerly(&mut config);
    // One fetch request is in flight per broker, and its response is decoded
    // and queued partition after partition: with librdkafka's 1 MiB per
    // partition a two-input task gets tens of thousands of records of one
    // input before the first of the other, and the prefetch holds more.
    // A quarter of that lowers peak RSS at no cost in records/s. (A broker still returns a whole record batch larger than this; the
    // changelog readers, which read in bulk, keep 1 MiB.)
    if config.get("max.partition.fetch.bytes").is_none() {
        config.set("max.partition.fetch.bytes", "262144");
    }
    // The prefetch queue is refilled below this many records (librdkafka:
    // 100 000), and refilled within `fetch.queue.backoff.ms` (below): 10 000
    // records take far longer to process than that refill, so the stage never
    // finds the queue empty, and the queue holds a fraction of the default's
    // memory. Smaller bounds saved no more (bench/results/2026-12-01-diary.md,
    // "late night", step 1).
    if config.get("queued.min.messages").is_none() {
        config.set("queued.min.messages", "10000");
    }
    // And the prefetch of all partitions together stays within
    // CONSUMER_PREFETCH_KIB (librdkafka: 64 MiB), a memory limit of its own
    // beside `--state-memory-limit` (docs/architecture.md, "Memory").
    if config.get("queued.max.messages.kbytes").is_none() {
        config.set("queued.max.messages.kbytes", CONSUMER_PREFETCH_KIB);
    }
    match protocol {
        // Range hands out equal-numbered partitions of co-partitioned topics
        // together: the co-location every task needs. Its rebalances are
        // eager, but the tasks given back run on as they were. For a stage
        // of one topic `cooperative-sticky` would do, and was measured
        // (`make bench-pause`, 2026-12-06): the tasks that kept their owner
        // stopped for 0.46-0.49 s while a fourth instance joined, against
        // 0.08-0.10 s eager, so it is not used.
        GroupProtocol::Classic => {
            config.set("partition.assignment.strategy", "range");
        }
        // The broker's `range` re-derives the ranges from the sorted members
        // and moves tasks that need not move (a fourth sessionizer moved 5
        // of 6 tasks); its `uniform` is sticky (it moved 1) but spreads each
        // topic on its own, which only a stage of one topic can take.
        GroupProtocol::Consumer => {
            config.set("group.protocol", "consumer");
            if config.get("group.remote.assignor").is_none() {
                let remote = if source_topics == 1 {
                    "uniform"
                } else {
                    "range"
                };
                config.set("group.remote.assignor", remote);
            }
        }
    }
    if let Some(instance) = group_instance_id {
        config.set("group.instance.id", instance);
    }
    config
}

/// A consumer that only describes `group` (it joins no group; its own
/// group id, `<group>-<role>`, only names it), for the threads that watch
/// a stage's members.
pub(crate) fn group_describer(
    base: &ClientConfig,
    group: &str,
    role: &str,
) -> anyhow::Result<BaseConsumer> {
    base.clone()
        .set("group.id", format!("{group}-{role}"))
        .set("enable.auto.commit", "false")
        .create()
        .map_err(|e| anyhow::anyhow!("cannot create the {role} client of group {group}: {e}"))
}

/// The settings of a consumer that reads changelogs by assignment (its
/// group id only names it): committed records only, no offsets of its own,
/// prefetching eagerly. Used by restores and standby replicas.
pub(crate) fn changelog_reader_config(base: &ClientConfig, group_id: String) -> ClientConfig {
    let mut config = base.clone();
    config
        .set("group.id", group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "false");
    prefetch_eagerly(&mut config);
    config
}

/// The settings of a restore's consumer: a changelog reader whose fetches
/// are large and short, named `<group>-restore`. Public so that the restore
/// benchmark's ceiling (`loadgen read-all`) reads exactly as a restore does.
pub fn restore_reader_config(base: &ClientConfig, group: &str) -> ClientConfig {
    let mut config = changelog_reader_config(base, format!("{group}-restore"));
    config
        .set("fetch.max.bytes", "52428800")
        // A consumer has one fetch per broker in flight. At the end of a
        // task's changelogs that fetch waits at the broker for new data
        // (`fetch.wait.max.ms`, 500 ms by default), and the next task's
        // changelogs, assigned meanwhile, are fetched only after it: most
        // of that wait per task opened after the first, even with nothing
        // to restore.
        .set("fetch.wait.max.ms", "10");
    config
}

/// What librdkafka may hold prefetched for one consumer, in KiB: a few
/// thousand records per partition for a handful of partitions.
const CONSUMER_PREFETCH_KIB: &str = "16384";

/// librdkafka stops fetching a partition once its prefetch queue holds
/// `queued.min.messages` records, and by default then waits a whole second
/// (`fetch.queue.backoff.ms`) before it looks again. A stage that processes
/// faster than that drains the queue and sits idle for the rest of the
/// second (for sensor-fusion, most of the idle time measured). Looking again after
/// a few milliseconds keeps the queue filled. A value set with `--kafka` wins.
///
/// Likewise `fetch.wait.max.ms`: a partition resumed after a pause (see
/// `MERGE_BUFFER_BYTES` in `engine/kafka_stage/run_loop.rs`) is fetched only by the next
/// fetch request to its broker, and the one in flight may be parked there
/// for that long when the other partitions have nothing new (the joiner's
/// repartition topic between two upstream commits); with small pause bounds
/// the joiner lost a measurable share of its records/s to such waits
/// (bench/results/2026-12-01-diary.md, "evening", step 3). The price: an
/// idle consumer sends a fetch
/// request every `fetch.wait.max.ms` per broker.
pub(crate) fn prefetch_eagerly(config: &mut ClientConfig) {
    if config.get("fetch.queue.backoff.ms").is_none() {
        config.set("fetch.queue.backoff.ms", "5");
    }
    if config.get("fetch.wait.max.ms").is_none() {
        config.set("fetch.wait.max.ms", "20");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_id_names_its_instance_and_thread() {
        assert_eq!(parse_client_id(&client_id("pod-0", 2)), Some(("pod-0", 2)));
        assert_eq!(parse_client_id(&client_id("a/b", 0)), Some(("a/b", 0)));
        assert_eq!(parse_client_id("rdkafka"), None);
        assert_eq!(parse_client_id("x/y"), None);
    }

    #[test]
    fn thread_zero_keeps_the_base_id_and_the_others_add_their_index() {
        assert_eq!(member_id("pod-0", 0), "pod-0");
        assert_eq!(member_id("pod-0", 2), "pod-0-2");
    }

    #[test]
    fn a_setting_given_by_the_user_wins_over_the_eager_prefetch() {
        let mut config = ClientConfig::new();
        config.set("fetch.wait.max.ms", "500");
        prefetch_eagerly(&mut config);
        assert_eq!(config.get("fetch.wait.max.ms"), Some("500"));
        assert_eq!(config.get("fetch.queue.backoff.ms"), Some("5"));
    }
}
