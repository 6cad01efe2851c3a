//! `loadgen`: the benchmark's load generator and outside-the-process meters.
//!
//! * `fill`: writes N generated records per input topic at full speed;
//! * `rate`: writes records at a fixed rate, each stamped with the wall-clock
//!   time it is produced (event time and Kafka timestamp), for latency runs;
//! * `watch`: follows a running system from outside until all its input is
//!   processed and its output is final; reports the whole run's and the
//!   steady (10 % to 90 % of the input) rates, start-up and drain, CPU time
//!   and peak RSS (from `/proc`);
//! * `wait-ready`: waits until consumer groups are stable (joined);
//! * `latency`: reads an output topic as it is written and reports the
//!   end-to-end latency of its records;
//! * `topics`: creates topics (one partition, no retention limit);
//! * `read-all`: reads topics to their ends with one consumer and nothing
//!   else, the ceiling of a changelog restore.
//!
//! Every command prints one JSON object on standard output.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use bench_loadgen::generate::{generator, Clock, Spec};
use bench_loadgen::kafka::{
    create_topics, delete_topics, now_ms, partitions, runtime, Cluster, Encoders,
};
use bench_loadgen::pauses::{self, PausesArgs};
use bench_loadgen::read_all::{read_all, ReadAllArgs};
use bench_loadgen::{procfs, Shape, UseCase};
use clap::{Parser, Subcommand, ValueEnum};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use serde_json::json;
use streams_runtime::avro::{split_wire_format, Registry};

#[derive(Parser)]
#[command(name = "loadgen", about = "Benchmark load generator and meters")]
struct Cli {
    #[command(flatten)]
    cluster: Cluster,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fill the input topics with N records each, as fast as possible.
    Fill {
        #[arg(long, value_enum)]
        use_case: UseCase,
        /// The input topics, in the use case's order (orders,shipments;
        /// temperatures,humidities).
        #[arg(long, value_delimiter = ',', required = true)]
        topics: Vec<String>,
        /// Records per input topic.
        #[arg(long)]
        records: u64,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// The input's shape (bench/README.md, "Shapes").
        #[arg(long, value_enum, default_value_t)]
        shape: Shape,
        /// Partitions of the input topics when they are created (records go
        /// to them by key), for runs with several tasks (`--stream-threads`).
        #[arg(long, default_value_t = 1)]
        partitions: usize,
        /// A key space of this many keys that all stay in the service's
        /// state (instead of the shape's input): open sessions, orders
        /// waiting in the join window, window groups (`make bench-scale`).
        #[arg(long, default_value_t = 0)]
        keys: u64,
        /// With `--keys`: the event time of the first record, epoch ms.
        #[arg(long)]
        start_ms: Option<i64>,
    },
    /// Produce at a fixed rate for a while, event time = wall-clock time.
    Rate {
        #[arg(long, value_enum)]
        use_case: UseCase,
        #[arg(long, value_delimiter = ',', required = true)]
        topics: Vec<String>,
        /// Records per second, all inputs together.
        #[arg(long)]
        rate: f64,
        /// How long to produce, in seconds.
        #[arg(long)]
        seconds: f64,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// The input's shape (bench/README.md, "Shapes").
        #[arg(long, value_enum, default_value_t)]
        shape: Shape,
        /// The key space of a `fill --keys` before it: sessionizer events
        /// of those users, joiner orders with ids from there on.
        #[arg(long, default_value_t = 0)]
        keys: u64,
        /// Partitions of the input topics when they are created (as `fill`).
        #[arg(long, default_value_t = 1)]
        partitions: usize,
    },
    /// Follow a system until its input is processed and its output final.
    Watch(WatchArgs),
    /// Wait until every group (of the classic protocol) is stable with at
    /// least `--members` members.
    WaitReady {
        #[arg(long = "group", required = true)]
        groups: Vec<String>,
        #[arg(long, default_value_t = 1)]
        members: usize,
        /// Fail if this process exits meanwhile.
        #[arg(long)]
        pid: Option<u32>,
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
    /// Measure end-to-end latency on output topics.
    Latency(LatencyArgs),
    /// Time the gaps in a group's committed output while its members
    /// change, with each input partition's owner (`make bench-pause`).
    Pauses(PausesArgs),
    /// Read topics to their ends with one consumer and nothing else.
    ReadAll(ReadAllArgs),
    /// Create topics with one partition and no retention limit, or delete
    /// the topics of a finished run.
    Topics {
        #[arg(long, value_delimiter = ',', required_unless_present = "delete_prefix")]
        create: Vec<String>,
        /// Delete every topic whose name starts with one of these.
        #[arg(long, value_delimiter = ',')]
        delete_prefix: Vec<String>,
        /// Partitions of the topics created.
        #[arg(long, default_value_t = 1)]
        partitions: usize,
    },
}

/// Which use cases have a keyed input (`--keys`), in fill and rate mode.
fn check_keys(use_case: UseCase, keys: u64, live: bool) -> anyhow::Result<()> {
    let supported = match use_case {
        UseCase::Sessionizer | UseCase::OrderShipmentJoiner => true,
        UseCase::WindowAggregator => !live,
        UseCase::SensorFusion => false,
    };
    anyhow::ensure!(
        keys == 0 || supported,
        "--keys: no keyed {} input in {} mode",
        use_case.name(),
        if live { "rate" } else { "fill" }
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let checked = match &cli.command {
        Command::Fill { use_case, keys, .. } => check_keys(*use_case, *keys, false),
        Command::Rate { use_case, keys, .. } => check_keys(*use_case, *keys, true),
        _ => Ok(()),
    };
    if let Err(error) = checked {
        eprintln!("loadgen: {error:#}");
        return std::process::ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Fill {
            use_case,
            topics,
            records,
            seed,
            shape,
            partitions,
            keys,
            start_ms,
        } => fill(
            &cli.cluster,
            use_case,
            &topics,
            Spec {
                records,
                seed,
                live: false,
                shape,
                keys,
                start_ms,
            },
            partitions,
        ),
        Command::Rate {
            use_case,
            topics,
            rate,
            seconds,
            seed,
            shape,
            keys,
            partitions,
        } => produce_at_rate(
            &cli.cluster,
            use_case,
            &topics,
            partitions,
            rate,
            seconds,
            Spec {
                records: 0,
                seed,
                live: true,
                shape,
                keys,
                start_ms: None,
            },
        ),
        Command::Watch(args) => watch(&cli.cluster, args),
        Command::WaitReady {
            groups,
            members,
            pid,
            timeout_secs,
        } => wait_ready(&cli.cluster, &groups, members, pid, timeout_secs),
        Command::Pauses(args) => pauses::follow(&cli.cluster, args),
        Command::Latency(args) => latency(&cli.cluster, args),
        Command::ReadAll(args) => read_all(&cli.cluster, args),
        Command::Topics {
            create,
            delete_prefix,
            partitions,
        } => runtime().and_then(|rt| {
            create_topics(&cli.cluster, &rt, &create, partitions)?;
            if !delete_prefix.is_empty() {
                let deleted = delete_topics(&cli.cluster, &rt, &delete_prefix)?;
                println!("{}", json!({ "deleted": deleted }));
            }
            Ok(())
        }),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("loadgen: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

// ------------------------------------------------------------------ producing

/// Counts delivery failures.
#[derive(Default)]
struct Reports {
    failed: std::sync::atomic::AtomicU64,
    first: std::sync::Mutex<Option<String>>,
}

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((error, _)) = result {
            self.failed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.first
                .lock()
                .unwrap()
                .get_or_insert_with(|| error.to_string());
        }
    }
}

/// An idempotent producer with the runtime's settings (murmur2 partitioning,
/// lz4) and the given batching.
fn producer(cluster: &Cluster, linger_ms: u32) -> anyhow::Result<BaseProducer<Reports>> {
    let mut config = cluster.client_config();
    config
        .set("partitioner", "murmur2_random")
        .set("enable.idempotence", "true")
        .set("compression.type", "lz4")
        .set("linger.ms", linger_ms.to_string())
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000");
    Ok(config.create_with_context(Reports::default())?)
}

fn send(
    producer: &BaseProducer<Reports>,
    topic: &str,
    key: &[u8],
    payload: &[u8],
    timestamp: Option<i64>,
) -> anyhow::Result<()> {
    let mut record: BaseRecord<'_, [u8], [u8], ()> =
        BaseRecord::to(topic).key(key).payload(payload);
    if let Some(timestamp) = timestamp {
        record = record.timestamp(timestamp);
    }
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                record = returned;
                producer.poll(Duration::from_millis(5));
            }
            Err((error, _)) => anyhow::bail!("producing to {topic}: {error}"),
        }
    }
}

fn finish(producer: &BaseProducer<Reports>) -> anyhow::Result<()> {
    producer.flush(Duration::from_secs(120))?;
    let failed = producer
        .context()
        .failed
        .load(std::sync::atomic::Ordering::Relaxed);
    anyhow::ensure!(
        failed == 0,
        "{failed} records were not delivered: {}",
        producer
            .context()
            .first
            .lock()
            .unwrap()
            .clone()
            .unwrap_or_default()
    );
    Ok(())
}

fn fill(
    cluster: &Cluster,
    use_case: UseCase,
    topics: &[String],
    spec: Spec,
    partitions: usize,
) -> anyhow::Result<()> {
    let rt = runtime()?;
    create_topics(cluster, &rt, topics, partitions)?;
    let registry = cluster.registry(&rt)?;
    let encoders = Encoders::register(&registry, topics, use_case.input_schemas())?;
    let producer = producer(cluster, 20)?;
    let mut generator = generator(use_case, spec);
    let started = Instant::now();
    let mut payload = Vec::with_capacity(256);
    let mut counts = vec![0u64; topics.len()];
    while let Some(record) = generator.next(Clock::Simulated) {
        encoders.encode(record.input, &record.record, &mut payload)?;
        send(
            &producer,
            &topics[record.input],
            record.key.as_bytes(),
            &payload,
            None,
        )?;
        counts[record.input] += 1;
        if counts[record.input].is_multiple_of(4096) {
            producer.poll(Duration::ZERO);
        }
    }
    finish(&producer)?;
    let seconds = started.elapsed().as_secs_f64();
    let total: u64 = counts.iter().sum();
    println!(
        "{}",
        json!({"records": total, "per_topic": counts, "seconds": seconds,
               "records_per_s": total as f64 / seconds})
    );
    Ok(())
}

fn produce_at_rate(
    cluster: &Cluster,
    use_case: UseCase,
    topics: &[String],
    partitions: usize,
    rate: f64,
    seconds: f64,
    spec: Spec,
) -> anyhow::Result<()> {
    anyhow::ensure!(rate > 0.0 && seconds > 0.0, "rate and seconds must be > 0");
    let rt = runtime()?;
    create_topics(cluster, &rt, topics, partitions)?;
    let registry = cluster.registry(&rt)?;
    let encoders = Encoders::register(&registry, topics, use_case.input_schemas())?;
    // A short linger: the time a record waits in the client counts in its latency.
    let producer = producer(cluster, 1)?;
    let mut generator = generator(use_case, spec);
    let mut payload = Vec::with_capacity(256);
    let started = Instant::now();
    let start_ms = now_ms();
    let mut sent = 0u64;
    let mut max_behind = 0u64;
    loop {
        let elapsed = started.elapsed().as_secs_f64();
        if elapsed >= seconds {
            break;
        }
        let due = (elapsed * rate) as u64;
        max_behind = max_behind.max(due.saturating_sub(sent));
        while sent < due {
            let now = now_ms();
            let record = generator
                .next(Clock::Wall(now))
                .expect("live generators do not end");
            encoders.encode(record.input, &record.record, &mut payload)?;
            send(
                &producer,
                &topics[record.input],
                record.key.as_bytes(),
                &payload,
                Some(now),
            )?;
            sent += 1;
        }
        producer.poll(Duration::ZERO);
        std::thread::sleep(Duration::from_micros(500));
    }
    let end_ms = now_ms();
    finish(&producer)?;
    println!(
        "{}",
        json!({"records": sent, "seconds": seconds, "target_rate": rate,
               "achieved_rate": sent as f64 / seconds, "start_ms": start_ms,
               "end_ms": end_ms, "max_records_behind": max_behind})
    );
    Ok(())
}

// ------------------------------------------------------------------- watching

#[derive(clap::Args)]
struct WatchArgs {
    /// The process to measure.
    #[arg(long)]
    pid: u32,
    /// The consumer group that reads the inputs (the application id).
    #[arg(long)]
    group: String,
    /// The input topics (complete before the system starts).
    #[arg(long, value_delimiter = ',', required = true)]
    inputs: Vec<String>,
    /// The output topics.
    #[arg(long, value_delimiter = ',', required = true)]
    outputs: Vec<String>,
    /// Sampling period: a fraction of the systems' 100 ms commit interval,
    /// the steps in which committed offsets move, so that the steady rate's
    /// window is timed to within a sample.
    #[arg(long, default_value_t = 20)]
    poll_ms: u64,
    /// Done when the inputs are committed and the outputs' end offsets have
    /// not moved for this long.
    #[arg(long, default_value_t = 2000)]
    quiet_ms: u64,
    #[arg(long, default_value_t = 1200)]
    timeout_secs: u64,
    /// host:port of the service's /metrics, scraped at the end (ours only).
    #[arg(long)]
    metrics_addr: Option<String>,
    /// An input the system's last stage reads through an internal topic
    /// (`INPUT=INTERNAL@GROUP`): the steady rate follows that topic's
    /// reader, not a first stage that may run ahead of it.
    #[arg(long)]
    through: Vec<Through>,
    /// Transaction markers at the end of each input partition (`streamctl
    /// produce` writes its records in one transaction: 1). Committed
    /// offsets stop before them, so the input is complete that much earlier.
    #[arg(long, default_value_t = 0)]
    input_markers: i64,
}

/// An input that reaches the system's last stage through an internal topic:
/// `INPUT=INTERNAL@GROUP`, GROUP being the consumer group that reads INTERNAL.
#[derive(Clone)]
struct Through {
    input: String,
    internal: String,
    group: String,
}

impl std::str::FromStr for Through {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let parsed = text.split_once('=').and_then(|(input, rest)| {
            let (internal, group) = rest.split_once('@')?;
            Some(Through {
                input: input.to_string(),
                internal: internal.to_string(),
                group: group.to_string(),
            })
        });
        parsed.ok_or_else(|| format!("{text:?} is not INPUT=INTERNAL@GROUP"))
    }
}

/// One sample of the watched process.
#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    cpu: f64,
    processed: i64,
}

/// Committed offsets of the consumer's group on `partitions`, summed per
/// topic (nothing committed yet: 0); `None` when the query failed.
fn committed_per_topic(
    consumer: &BaseConsumer,
    partitions: &TopicPartitionList,
) -> Option<HashMap<String, i64>> {
    let committed = consumer
        .committed_offsets(partitions.clone(), Duration::from_secs(5))
        .ok()?;
    let mut sums = HashMap::new();
    for element in committed.elements() {
        let offset = match element.offset() {
            Offset::Offset(offset) => offset,
            _ => 0,
        };
        *sums.entry(element.topic().to_string()).or_insert(0) += offset;
    }
    Some(sums)
}

/// The reader of an internal topic, followed sample by sample.
struct InternalReader {
    topic: String,
    consumer: BaseConsumer,
    /// Unknown until the system under test has created the topic.
    partitions: Option<TopicPartitionList>,
    /// Records of the input that reaches the last stage through the topic.
    input_total: i64,
    /// Committed offsets, one per sample.
    committed: Vec<i64>,
}

impl InternalReader {
    fn sample(&mut self) {
        if self.partitions.is_none() {
            self.partitions = partitions(&self.consumer, &self.topic).ok().map(|count| {
                let mut list = TopicPartitionList::new();
                for partition in 0..count {
                    list.add_partition(&self.topic, partition);
                }
                list
            });
        }
        let previous = self.committed.last().copied().unwrap_or(0);
        let committed = self
            .partitions
            .as_ref()
            .and_then(|list| committed_per_topic(&self.consumer, list))
            .map_or(previous, |sums| sums.values().sum());
        self.committed.push(committed);
    }

    /// Whether the reader has committed the whole topic as it is now: one
    /// offset short per partition allowed, the transaction marker after the
    /// last records of a transactional writer.
    fn drained(&self) -> bool {
        let Some(list) = &self.partitions else {
            return false;
        };
        let mut end = 0i64;
        for element in list.elements() {
            match self.consumer.fetch_watermarks(
                &self.topic,
                element.partition(),
                Duration::from_secs(5),
            ) {
                Ok((_, high)) => end += high - 1,
                Err(_) => return false,
            }
        }
        self.committed
            .last()
            .is_some_and(|&committed| committed >= end)
    }

    /// The input records the last stage has taken in, per sample: the
    /// committed share of the topic (whose end is final once the system
    /// is done) times the input's records.
    fn input_processed(&self) -> anyhow::Result<Vec<f64>> {
        let mut end = 0i64;
        for element in self.partitions.iter().flat_map(|list| list.elements()) {
            end += self
                .consumer
                .fetch_watermarks(&self.topic, element.partition(), Duration::from_secs(5))?
                .1;
        }
        let share = |committed: i64| match end {
            0 => 0.0,
            end => committed as f64 / end as f64,
        };
        Ok(self
            .committed
            .iter()
            .map(|&committed| share(committed) * self.input_total as f64)
            .collect())
    }
}

/// The middle of a run, from the first sample with at least 10 % of the
/// input processed to the first with at least 90 % (`progress`: input
/// records the last stage has taken in, per sample): the steady rate, free
/// of the start-up and of the end of the input. The drain: how much longer
/// than that rate predicts the rest of the input took, from the 90 % sample
/// to `end` (input committed, output final). Nothing when one commit took
/// the whole middle: too short a run to tell.
fn middle(
    progress: &[(Instant, f64)],
    input_total: i64,
    end: Instant,
) -> serde_json::Map<String, serde_json::Value> {
    let total = input_total as f64;
    let first_at = |fraction: f64| {
        progress
            .iter()
            .position(|&(_, done)| done >= fraction * total)
    };
    let (Some(from), Some(to)) = (first_at(0.1), first_at(0.9)) else {
        return serde_json::Map::new();
    };
    if from == to {
        return serde_json::Map::new();
    }
    let ((from_at, from_done), (to_at, to_done)) = (progress[from], progress[to]);
    let seconds = to_at.duration_since(from_at).as_secs_f64();
    let rate = (to_done - from_done) / seconds;
    let commits = progress[from..=to]
        .windows(2)
        .filter(|pair| pair[1].1 != pair[0].1)
        .count();
    let serde_json::Value::Object(figures) = json!({
        "steady_records_per_s": rate,
        "steady_s": seconds,
        "steady_from": from_done / total,
        "steady_to": to_done / total,
        "steady_commits": commits,
        "drain_s": end.duration_since(to_at).as_secs_f64() - (total - to_done) / rate,
    }) else {
        unreachable!("an object literal")
    };
    figures
}

fn watch(cluster: &Cluster, args: WatchArgs) -> anyhow::Result<()> {
    let launched = Instant::now();
    let consumer = cluster.query_consumer(&args.group)?;
    let timeout = Duration::from_secs(5);
    let mut inputs = TopicPartitionList::new();
    let mut input_totals: HashMap<&str, i64> = HashMap::new();
    for topic in &args.inputs {
        for partition in 0..partitions(&consumer, topic)? {
            inputs.add_partition(topic, partition);
            let (low, high) = consumer.fetch_watermarks(topic, partition, timeout)?;
            anyhow::ensure!(low == 0, "{topic} has been truncated");
            *input_totals.entry(topic).or_default() += high - args.input_markers;
        }
    }
    let input_total: i64 = input_totals.values().sum();
    let mut readers = Vec::new();
    for through in &args.through {
        let Some(&input_total) = input_totals.get(through.input.as_str()) else {
            anyhow::bail!("--through {}: not one of the inputs", through.input);
        };
        readers.push(InternalReader {
            topic: through.internal.clone(),
            consumer: cluster.query_consumer(&through.group)?,
            partitions: None,
            input_total,
            committed: Vec::new(),
        });
    }
    let mut outputs = Vec::new();
    for topic in &args.outputs {
        for partition in 0..partitions(&consumer, topic)? {
            outputs.push((topic.clone(), partition));
        }
    }
    let fail = |error: String| -> anyhow::Result<()> {
        println!("{}", json!({"ok": false, "error": error}));
        anyhow::bail!(error)
    };
    let mut committed: HashMap<String, i64> = HashMap::new();
    // Per sample, the records of the inputs the last stage reads directly.
    let mut read_directly: Vec<(Instant, i64)> = Vec::new();
    let mut first: Option<Sample> = None;
    let mut inputs_done: Option<Sample> = None;
    let mut output_end = -1i64;
    let mut output_changed: Option<Sample> = None;
    let deadline = launched + Duration::from_secs(args.timeout_secs);
    loop {
        let Some(cpu) = procfs::cpu_seconds(args.pid) else {
            return fail(format!("process {} exited", args.pid));
        };
        let at = Instant::now();
        if let Some(sums) = committed_per_topic(&consumer, &inputs) {
            committed = sums;
        }
        let processed: i64 = committed.values().sum();
        let direct = committed
            .iter()
            .filter(|(topic, _)| !args.through.iter().any(|t| &t.input == *topic))
            .map(|(_, offset)| offset)
            .sum();
        read_directly.push((at, direct));
        for reader in &mut readers {
            reader.sample();
        }
        let mut end = 0i64;
        for (topic, partition) in &outputs {
            end += consumer.fetch_watermarks(topic, *partition, timeout)?.1;
        }
        let sample = Sample { at, cpu, processed };
        if first.is_none() && processed > 0 {
            first = Some(sample);
        }
        if inputs_done.is_none() && processed >= input_total {
            inputs_done = Some(sample);
        }
        if end != output_end {
            output_end = end;
            output_changed = Some(sample);
        }
        if let (Some(done), Some(changed)) = (inputs_done, output_changed) {
            let last = if changed.at > done.at { changed } else { done };
            // A last stage that stalls for the quiet time (a long commit,
            // a compaction) has not finished: its internal topic must be
            // read to its end too.
            if at.duration_since(last.at) >= Duration::from_millis(args.quiet_ms)
                && readers.iter().all(InternalReader::drained)
            {
                let first = first.expect("progress seen before completion");
                let timed = input_total - first.processed;
                let wall = last.at.duration_since(first.at).as_secs_f64();
                let cpu = last.cpu - first.cpu;
                let per = |value: f64| (timed > 0 && value > 0.0).then(|| timed as f64 / value);
                let metrics = args.metrics_addr.as_deref().map(scrape_metrics);
                let mut progress: Vec<(Instant, f64)> = read_directly
                    .iter()
                    .map(|&(at, direct)| (at, direct as f64))
                    .collect();
                for reader in &readers {
                    for (sample, through) in progress.iter_mut().zip(reader.input_processed()?) {
                        sample.1 += through;
                    }
                }
                let mut report = json!({
                    "ok": true,
                    "records": input_total,
                    "records_timed": timed,
                    "startup_s": first.at.duration_since(launched).as_secs_f64(),
                    "wall_s": wall,
                    "records_per_s": per(wall),
                    "cpu_s": cpu,
                    "records_per_cpu_s": per(cpu),
                    "cpu_total_s": last.cpu,
                    "total_wall_s": last.at.duration_since(launched).as_secs_f64(),
                    "rss_peak_mib": procfs::peak_rss_mib(args.pid),
                    "rss_end_mib": procfs::rss_mib(args.pid),
                    "output_end_offset": output_end,
                    "metrics": metrics,
                });
                report
                    .as_object_mut()
                    .expect("a JSON object")
                    .extend(middle(&progress, input_total, last.at));
                println!("{report}");
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return fail(format!(
                "timed out after {} s: {processed} of {input_total} input records committed",
                args.timeout_secs
            ));
        }
        // Every poll_ms from sample to sample, however long the queries took.
        std::thread::sleep(Duration::from_millis(args.poll_ms).saturating_sub(at.elapsed()));
    }
}

/// The thread-phase and commit series of a service's /metrics.
fn scrape_metrics(addr: &str) -> serde_json::Value {
    let text = (|| -> std::io::Result<String> {
        let mut stream = std::net::TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            stream,
            "GET /metrics HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut text = String::new();
        stream.read_to_string(&mut text)?;
        Ok(text)
    })();
    let Ok(text) = text else {
        return serde_json::Value::Null;
    };
    let mut series = serde_json::Map::new();
    for line in text.lines() {
        if line.starts_with("streams_thread_phase_seconds_total")
            || line.starts_with("streams_commits_total")
            || line.starts_with("streams_commit_duration_seconds_total")
            || line.starts_with("streams_records_consumed_total")
            || line.starts_with("streams_records_produced_total")
        {
            if let Some((name, value)) = line.rsplit_once(' ') {
                if let Ok(value) = value.parse::<f64>() {
                    series.insert(name.to_string(), json!(value));
                }
            }
        }
    }
    serde_json::Value::Object(series)
}

fn wait_ready(
    cluster: &Cluster,
    groups: &[String],
    members: usize,
    pid: Option<u32>,
    timeout_secs: u64,
) -> anyhow::Result<()> {
    let consumer = cluster.query_consumer("loadgen-query")?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(timeout_secs);
    loop {
        if let Some(pid) = pid {
            anyhow::ensure!(procfs::cpu_seconds(pid).is_some(), "process {pid} exited");
        }
        let mut ready = true;
        for group in groups {
            let stable = consumer
                .fetch_group_list(Some(group), Duration::from_secs(5))
                .map(|list| {
                    list.groups()
                        .iter()
                        .any(|g| g.state() == "Stable" && g.members().len() >= members.max(1))
                })
                .unwrap_or(false);
            ready &= stable;
        }
        if ready {
            println!(
                "{}",
                json!({"ready_after_s": started.elapsed().as_secs_f64()})
            );
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "groups {groups:?} not stable after {timeout_secs} s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

// -------------------------------------------------------------------- latency

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Kind {
    /// The output of a service (or its Kafka Streams peer).
    Service,
    /// The output of `rawcopy`: a copy of each input record.
    Copy,
}

#[derive(clap::Args)]
struct LatencyArgs {
    #[arg(long, value_enum)]
    use_case: UseCase,
    #[arg(long, value_enum)]
    kind: Kind,
    /// The output topics (for a copy: one per input, in input order).
    #[arg(long, value_delimiter = ',', required = true)]
    outputs: Vec<String>,
    /// The input topics (the joiner's are read to look up production times).
    #[arg(long, value_delimiter = ',', required = true)]
    inputs: Vec<String>,
    /// Count records whose trigger was produced at or after this time (epoch ms).
    #[arg(long)]
    from_ms: i64,
    /// ... and before this time.
    #[arg(long)]
    to_ms: i64,
    /// Stop reading at this time (epoch ms) or later: once nothing has
    /// arrived for `--idle-ms`, at most `--max-extra-ms` after it.
    #[arg(long)]
    stop_at_ms: i64,
    #[arg(long, default_value_t = 2_000)]
    idle_ms: i64,
    #[arg(long, default_value_t = 30_000)]
    max_extra_ms: i64,
}

/// What decides an output record's trigger time (the production time of the
/// input record that made it due).
enum Trigger {
    /// Known from the value.
    Time(i64),
    /// The production time of this order (by id) or shipment (by id): the
    /// later of the two when both are given.
    Lookup(Option<i32>, Option<String>),
}

fn field<'a>(value: &'a Value, name: &str) -> Option<&'a Value> {
    match value {
        Value::Record(fields) => fields.iter().find(|(n, _)| n == name).map(|(_, v)| v),
        _ => None,
    }
}

fn as_i64(value: &Value) -> Option<i64> {
    match value {
        Value::Long(x) | Value::TimestampMillis(x) => Some(*x),
        Value::Int(x) => Some(i64::from(*x)),
        Value::Union(_, inner) => as_i64(inner),
        _ => None,
    }
}

fn as_string(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Union(_, inner) => as_string(inner),
        _ => None,
    }
}

fn trigger(use_case: UseCase, kind: Kind, output: usize, value: &Value) -> Option<Trigger> {
    let time = |name| field(value, name).and_then(as_i64).map(Trigger::Time);
    match (kind, use_case) {
        (Kind::Service, UseCase::Sessionizer) => time("session_end"),
        (Kind::Service, UseCase::SensorFusion | UseCase::WindowAggregator) => time("window_end"),
        (Kind::Service, UseCase::OrderShipmentJoiner) => Some(Trigger::Lookup(
            field(value, "order_id")
                .and_then(as_i64)
                .map(|id| id as i32),
            field(value, "ship_id").and_then(as_string),
        )),
        (Kind::Copy, UseCase::Sessionizer | UseCase::SensorFusion) => time("event_time"),
        (Kind::Copy, UseCase::WindowAggregator) => time("order_time"),
        (Kind::Copy, UseCase::OrderShipmentJoiner) if output == 0 => Some(Trigger::Lookup(
            field(value, "id").and_then(as_i64).map(|id| id as i32),
            None,
        )),
        (Kind::Copy, UseCase::OrderShipmentJoiner) => Some(Trigger::Lookup(
            None,
            field(value, "id").and_then(as_string),
        )),
    }
}

/// Decodes values with their writer schema.
struct ValueDecoder {
    registry: Registry,
    readers: HashMap<u32, GenericDatumReader<'static>>,
}

impl ValueDecoder {
    fn decode(&mut self, bytes: &[u8]) -> anyhow::Result<Value> {
        let (id, mut datum) = split_wire_format(bytes)?;
        if !self.readers.contains_key(&id) {
            let schema = self.registry.schema_by_id(id)?;
            let reader = GenericDatumReader::builder(schema)
                .build()
                .map_err(|e| anyhow::anyhow!("schema id {id}: {e}"))?;
            self.readers.insert(id, reader);
        }
        self.readers[&id]
            .read_value(&mut datum)
            .map_err(|e| anyhow::anyhow!("Avro: {e}"))
    }
}

fn assign_from_beginning(consumer: &BaseConsumer, topics: &[String]) -> anyhow::Result<()> {
    let mut assignment = TopicPartitionList::new();
    for topic in topics {
        for partition in 0..partitions(consumer, topic)? {
            assignment.add_partition_offset(topic, partition, Offset::Beginning)?;
        }
    }
    consumer.assign(&assignment)?;
    Ok(())
}

fn latency(cluster: &Cluster, args: LatencyArgs) -> anyhow::Result<()> {
    let rt = runtime()?;
    let mut decoder = ValueDecoder {
        registry: cluster.registry(&rt)?,
        readers: HashMap::new(),
    };
    let consumer = cluster.committed_reader("loadgen-latency")?;
    assign_from_beginning(&consumer, &args.outputs)?;
    let mut seen: Vec<(i64, Trigger)> = Vec::new();
    let mut undecodable = 0u64;
    let mut last_arrival = now_ms();
    loop {
        let now = now_ms();
        if now >= args.stop_at_ms
            && (now - last_arrival >= args.idle_ms || now >= args.stop_at_ms + args.max_extra_ms)
        {
            break;
        }
        let Some(message) = consumer.poll(Duration::from_millis(20)) else {
            continue;
        };
        let message = message?;
        let consumed = now_ms();
        last_arrival = consumed;
        let output = args
            .outputs
            .iter()
            .position(|t| t == message.topic())
            .unwrap_or(0);
        let found = message
            .payload()
            .and_then(|payload| decoder.decode(payload).ok())
            .and_then(|value| trigger(args.use_case, args.kind, output, &value));
        match found {
            Some(trigger) => seen.push((consumed, trigger)),
            None => undecodable += 1,
        }
    }
    drop(consumer);

    // Production times of the joiner's inputs, from their Kafka timestamps.
    let mut orders: HashMap<i32, i64> = HashMap::new();
    let mut shipments: HashMap<String, i64> = HashMap::new();
    if seen.iter().any(|(_, t)| matches!(t, Trigger::Lookup(..))) {
        read_production_times(
            cluster,
            &mut decoder,
            &args.inputs,
            &mut orders,
            &mut shipments,
        )?;
    }
    let mut latencies = Vec::new();
    let (mut outside, mut unmatched) = (0u64, 0u64);
    for (consumed, trigger) in &seen {
        let time = match trigger {
            Trigger::Time(time) => Some(*time),
            Trigger::Lookup(order, ship) => {
                let order = order.map(|id| orders.get(&id).copied());
                let ship = ship.as_ref().map(|id| shipments.get(id).copied());
                match (order, ship) {
                    (Some(None), _) | (_, Some(None)) => None,
                    (order, ship) => order.flatten().max(ship.flatten()),
                }
            }
        };
        match time {
            None => unmatched += 1,
            Some(time) if time < args.from_ms || time >= args.to_ms => outside += 1,
            Some(time) => latencies.push(consumed - time),
        }
    }
    latencies.sort_unstable();
    let percentile = |p: f64| -> Option<i64> {
        (!latencies.is_empty())
            .then(|| latencies[((latencies.len() - 1) as f64 * p).round() as usize])
    };
    let mean = (!latencies.is_empty())
        .then(|| latencies.iter().sum::<i64>() as f64 / latencies.len() as f64);
    println!(
        "{}",
        json!({
            "outputs_read": seen.len() as u64 + undecodable,
            "count": latencies.len(),
            "p50_ms": percentile(0.50),
            "p90_ms": percentile(0.90),
            "p99_ms": percentile(0.99),
            "max_ms": latencies.last(),
            "mean_ms": mean,
            "outside_window": outside,
            "unmatched": unmatched,
            "undecodable": undecodable,
        })
    );
    Ok(())
}

/// Reads the joiner's inputs (orders, shipments) to their end and notes each
/// record's Kafka timestamp, which `loadgen rate` sets to its production time.
fn read_production_times(
    cluster: &Cluster,
    decoder: &mut ValueDecoder,
    inputs: &[String],
    orders: &mut HashMap<i32, i64>,
    shipments: &mut HashMap<String, i64>,
) -> anyhow::Result<()> {
    let mut config = cluster.client_config();
    config
        .set("group.id", "loadgen-latency")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true");
    let consumer: BaseConsumer = config.create()?;
    assign_from_beginning(&consumer, inputs)?;
    let mut open = 0;
    for topic in inputs {
        open += partitions(&consumer, topic)?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while open > 0 && Instant::now() < deadline {
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = match message {
            Err(KafkaError::PartitionEOF(_)) => {
                open -= 1;
                continue;
            }
            other => other?,
        };
        let Some(time) = message.timestamp().to_millis() else {
            continue;
        };
        let Some(value) = message.payload().and_then(|p| decoder.decode(p).ok()) else {
            continue;
        };
        let id = field(&value, "id");
        if message.topic() == inputs[0] {
            if let Some(id) = id.and_then(as_i64) {
                orders.insert(id as i32, time);
            }
        } else if let Some(id) = id.and_then(as_string) {
            shipments.insert(id, time);
        }
    }
    Ok(())
}
