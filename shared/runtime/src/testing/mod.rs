//! A test driver: a service's real topology and processor, run without a
//! broker or a schema registry — the counterpart of Kafka Streams'
//! `TopologyTestDriver`.
//!
//! The driver builds every stage of a [`Pipeline`](crate::Pipeline) exactly
//! as a service does (same routes, internal topics, stores and engine), on
//! RocksDB in a temporary directory, with in-memory topics, an in-memory
//! schema registry and a clock that moves only when told. What runs is the
//! real task code: decoding, dead letters, the merge of inputs by event time,
//! lateness, watermarks, timers of both time domains, state, repartitioning
//! between tasks of several partitions, stage links, commits and rollbacks.
//!
//! * [`pipe`](TestDriver::pipe) a record (key and JSON value, whose event-time
//!   field sets its event time) to an input topic, to the partition its key
//!   hashes to or to a [chosen one](TestDriver::pipe_to); or
//!   [raw bytes](TestDriver::pipe_raw), for dead-letter tests. Each record is
//!   processed at once, together with everything it causes downstream.
//! * [`advance_time`](TestDriver::advance_time) moves the wall clock:
//!   `--max-task-idle` waits, idle timeouts and wall-clock timers, and a
//!   commit once the commit interval has passed.
//! * [`commit`](TestDriver::commit) commits every stage (and lets later stages
//!   read the watermarks it announces); [`crash`](TestDriver::crash) drops all
//!   uncommitted work and restarts every stage from its committed state, which
//!   [`crash_losing_state`](TestDriver::crash_losing_state) first deletes, so
//!   that it is restored from the changelogs.
//! * [`read`](TestDriver::read) any topic (outputs, dead letters, late
//!   records) as JSON, [`state`](TestDriver::state) reads a store, and
//!   [`metrics`](TestDriver::metrics) every counter (of the work that
//!   stands: a crash takes them back to the last commit).
//!
//! Jobs a processor [submits](crate::Context::submit) run inline, at once.
//!
//! Records written by a stage are visible at once, also before a commit; a
//! crash removes those not committed, as an aborted transaction would for a
//! `read_committed` consumer.
//!
//! # Example
//!
//! ```
//! use serde::Serialize;
//! use streams_runtime::prelude::*;
//! use streams_runtime::testing::TestDriver;
//!
//! #[derive(Debug, serde::Deserialize)]
//! struct Click { user: String, at: i64 }
//!
//! #[derive(Serialize)]
//! struct Count { user: String, clicks: i64 }
//!
//! streams_runtime::stores! { CLICKS: ValueState<i64> = "clicks"; }
//!
//! /// Counts clicks per user; emits a user's count when the watermark passes
//! /// a minute after their first click.
//! #[derive(Clone)]
//! struct Counter;
//!
//! streams_runtime::timer_names! { enum CounterTimer { Report = "report" } }
//!
//! impl Processor for Counter {
//!     type Input = Click;
//!     type Output = Count;
//!     type Timers = CounterTimer;
//!     const STORES: &'static [streams_runtime::StoreSpec] = STORES;
//!
//!     fn process(&mut self, ctx: &mut Context<'_, Self>, record: Record<'_, Click>) -> anyhow::Result<()> {
//!         let user = record.value.user;
//!         let clicks = ctx.get(&CLICKS, &user)?.unwrap_or(0);
//!         if clicks == 0 {
//!             ctx.set_timer(&user, CounterTimer::Report, record.event_time + 60_000);
//!         }
//!         ctx.put(&CLICKS, &user, &(clicks + 1))
//!     }
//!
//!     fn on_timer(&mut self, ctx: &mut Context<'_, Self>, timer: Timer<'_, CounterTimer>) -> anyhow::Result<()> {
//!         let clicks = ctx.get(&CLICKS, timer.key)?.unwrap_or(0);
//!         ctx.delete(&CLICKS, timer.key);
//!         ctx.emit(Some(timer.key), &Count { user: timer.key.to_string(), clicks })
//!     }
//! }
//!
//! # fn main() -> anyhow::Result<()> {
//! let click_schema = r#"{"type": "record", "name": "Click", "fields": [
//!     {"name": "user", "type": "string"}, {"name": "at", "type": "long"}]}"#;
//! let count_schema = r#"{"type": "record", "name": "Count", "fields": [
//!     {"name": "user", "type": "string"}, {"name": "clicks", "type": "long"}]}"#;
//! let topology = Topology::new("click-counter", "counts", count_schema)
//!     .input(InputStream::new("clicks", click_schema, |c: &Click| c.at, |c| c)?);
//! let args = streams_runtime::testing::runtime_args(&[])?;
//! let mut driver = TestDriver::new(Pipeline::new(args, topology, Counter))?;
//!
//! driver.pipe("clicks", Some("ada"), serde_json::json!({"user": "ada", "at": 1_000}))?;
//! driver.pipe("clicks", Some("ada"), serde_json::json!({"user": "ada", "at": 2_000}))?;
//! assert!(driver.read("counts")?.is_empty(), "the watermark has not passed 61 s yet");
//!
//! driver.pipe("clicks", Some("bob"), serde_json::json!({"user": "bob", "at": 61_000}))?;
//! let counts = driver.read("counts")?;
//! assert_eq!(counts.len(), 1);
//! assert_eq!(counts[0].value, Some(serde_json::json!({"user": "ada", "clicks": 2})));
//! assert_eq!(driver.state(&CLICKS, "bob")?, Some(1));
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::avro::json::{format_line, parse_value};
use crate::avro::{split_wire_format, AvroEncoder, Registry};
use crate::clock::ManualTime;
use crate::metrics::{Metrics, Snapshot};
use crate::processor::{MapState, ValueState};
use crate::state::codec::{decode_value, map_prefix, MapKey};
use crate::state::format::WriteFormat;

mod builder;
mod flow;
mod stage;
mod topics;

pub use builder::TestDriverBuilder;
use stage::InputTopic;
pub(crate) use stage::{driver_stage, DriverEnv, DriverStage};
pub use topics::TopicRecord;
use topics::{MemoryTopic, StoredRecord};

/// The wall-clock time (epoch milliseconds) at which a driver starts:
/// 2024-01-01T00:00:00Z.
pub const START_EPOCH_MS: i64 = 1_704_067_200_000;

/// The common flags parsed from `flags` (say `["--late-topic", "late"]`),
/// for pipelines built in tests from a topology rather than from a
/// service's own settings.
pub fn runtime_args(flags: &[&str]) -> anyhow::Result<crate::config::RuntimeArgs> {
    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        runtime: crate::config::RuntimeArgs,
    }
    let argv = std::iter::once("test").chain(flags.iter().copied());
    Ok(<Flags as clap::Parser>::try_parse_from(argv)?.runtime)
}

/// Deletes the driver's state directory when the driver goes.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a pipeline on in-memory topics; see the [module documentation](self).
pub struct TestDriver {
    stages: Vec<Box<dyn DriverStage>>,
    topics: BTreeMap<String, MemoryTopic>,
    registry: Registry,
    inputs: HashMap<String, InputTopic>,
    time: Arc<ManualTime>,
    dir: TempDir,
    /// Global append order.
    sequence: u64,
    /// Per stage: next offset to read, by (subscription, partition).
    cursors: Vec<HashMap<(usize, i32), usize>>,
    /// Per stage: committed next offsets, by (subscription, partition).
    committed: Vec<HashMap<(usize, i32), usize>>,
}

impl TestDriver {
    /// The directory holding the stages' RocksDB databases.
    pub fn state_dir(&self) -> &Path {
        &self.dir.0
    }

    /// The in-memory schema registry the stages read and write with: a test
    /// can register another writer schema here and [`pipe_raw`](Self::pipe_raw)
    /// records written with it.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Pipes a record whose value is `value` (JSON as in the fixtures,
    /// written with the topic's reader schema) to `topic`, to the partition
    /// its key hashes to (murmur2, as the Java producer; keyless: 0), and
    /// processes it with everything it causes.
    pub fn pipe(
        &mut self,
        topic: &str,
        key: Option<&str>,
        value: serde_json::Value,
    ) -> anyhow::Result<()> {
        let partition = self.partition_for(topic, key.map(str::as_bytes))?;
        self.pipe_to(topic, partition, key, value)
    }

    /// Pipes a record to `partition` of `topic`; see [`pipe`](Self::pipe).
    pub fn pipe_to(
        &mut self,
        topic: &str,
        partition: i32,
        key: Option<&str>,
        value: serde_json::Value,
    ) -> anyhow::Result<()> {
        let input = self
            .inputs
            .get_mut(topic)
            .ok_or_else(|| anyhow::anyhow!("{topic} is not an input topic of this pipeline"))?;
        let value = parse_value(value, input.schema)?;
        let encoder = match &mut input.encoder {
            Some(encoder) => encoder,
            None => {
                // As written, logical types included (the canonical form
                // drops them): a producer registers the topic's schema file,
                // so the stages read piped records with the writer schema
                // equal to their reader schema, as in production.
                let written = serde_json::to_string(input.schema)?;
                let id = self
                    .registry
                    .register(&format!("{topic}-value"), &written)?;
                input.encoder.insert(AvroEncoder::new(input.schema, id)?)
            }
        };
        let mut bytes = Vec::new();
        encoder.encode_value(value, &mut bytes)?;
        self.pipe_raw(topic, partition, key.map(str::as_bytes), Some(&bytes))
    }

    /// Pipes a record of raw bytes (not necessarily valid) to `partition` of `topic`.
    pub fn pipe_raw(
        &mut self,
        topic: &str,
        partition: i32,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> anyhow::Result<()> {
        self.append(
            topic,
            Some(partition),
            StoredRecord {
                sequence: 0,
                key: key.map(<[u8]>::to_vec),
                value: value.map(<[u8]>::to_vec),
                announcement: None,
                headers: Vec::new(),
                pending: false,
                aborted: false,
            },
        )?;
        self.run()
    }

    /// Moves the wall clock forward by `by`, lets every stage act on it, and
    /// commits if the commit interval has passed.
    pub fn advance_time(&mut self, by: Duration) -> anyhow::Result<()> {
        self.time.advance(by);
        for index in 0..self.stages.len() {
            self.stages[index].tick()?;
            self.collect(index)?;
        }
        self.run()?;
        if self.stages.iter().any(|stage| stage.commit_due()) {
            self.commit()?;
        }
        Ok(())
    }

    /// Commits every stage, first to last, and lets later stages act on the
    /// watermarks the earlier ones announced.
    pub fn commit(&mut self) -> anyhow::Result<()> {
        for index in 0..self.stages.len() {
            let positions = self.stages[index].prepare_commit()?;
            self.collect(index)?;
            for (subscription, partition, next) in positions {
                self.committed[index].insert((subscription, partition), next as usize);
            }
            let mut checkpoints = HashMap::new();
            for (name, topic) in &mut self.topics {
                for (partition, records) in topic.partitions.iter_mut().enumerate() {
                    for record in records.iter_mut() {
                        record.pending = false;
                    }
                    if !records.is_empty() {
                        checkpoints
                            .insert((name.clone(), partition as i32), records.len() as i64 - 1);
                    }
                }
            }
            self.stages[index].commit_succeeded(&checkpoints)?;
        }
        self.run()
    }

    /// Simulates a crash of the whole pipeline and its restart: everything
    /// not committed is dropped (state, timers, clocks, and records written
    /// since the last commit), every task reopens from its committed state
    /// on disk, and inputs are read again from the committed offsets.
    ///
    /// The counters of records (consumed, late, dead-lettered, produced, and
    /// the processor's, which count committed work only) go back to their
    /// values at the last commit too, so that a record read again counts
    /// once: the driver keeps one account over its restarts, of the work
    /// that stands, where a real process would start again from zero.
    /// Commits and restored records are counted each time they happen.
    pub fn crash(&mut self) -> anyhow::Result<()> {
        self.crash_and_restart(false)
    }

    /// Like [`crash`](Self::crash), but the local state is lost too: every
    /// task is restored from its changelog topics.
    pub fn crash_losing_state(&mut self) -> anyhow::Result<()> {
        self.crash_and_restart(true)
    }

    /// Restarts like [`crash`](Self::crash) with task stores that write
    /// state format `format`: a step of an upgrade, or of its rollback
    /// (commit first to lose nothing).
    pub fn restart_writing(&mut self, format: WriteFormat) -> anyhow::Result<()> {
        for stage in &mut self.stages {
            stage.write(format);
        }
        self.crash_and_restart(false)
    }

    fn crash_and_restart(&mut self, lose_state: bool) -> anyhow::Result<()> {
        for topic in self.topics.values_mut() {
            for record in topic.partitions.iter_mut().flatten() {
                if record.pending {
                    record.pending = false;
                    record.aborted = true;
                }
            }
        }
        for index in 0..self.stages.len() {
            self.stages[index].restart(lose_state, &self.topics)?;
            self.cursors[index] = self.committed[index].clone();
        }
        self.run()
    }

    /// Every visible record of `topic`, partition by partition.
    pub fn read(&self, topic: &str) -> anyhow::Result<Vec<TopicRecord>> {
        let Some(memory) = self.topics.get(topic) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (partition, records) in memory.partitions.iter().enumerate() {
            for (offset, record) in records.iter().enumerate() {
                if record.aborted || (record.value.is_none() && record.announcement.is_some()) {
                    continue;
                }
                out.push(TopicRecord {
                    partition: partition as i32,
                    offset: offset as i64,
                    key: record
                        .key
                        .as_ref()
                        .map(|k| String::from_utf8_lossy(k).into_owned()),
                    value: record.value.as_ref().and_then(|v| self.decode_json(v)),
                    raw: record.value.clone(),
                    headers: record.headers.clone(),
                });
            }
        }
        Ok(out)
    }

    /// The values of every visible record of `topic`, in the order written
    /// within each partition, partitions in turn.
    pub fn read_values(&self, topic: &str) -> anyhow::Result<Vec<serde_json::Value>> {
        Ok(self
            .read(topic)?
            .into_iter()
            .filter_map(|record| record.value)
            .collect())
    }

    fn decode_json(&self, bytes: &[u8]) -> Option<serde_json::Value> {
        let (id, mut datum) = split_wire_format(bytes).ok()?;
        let schema = self.registry.schema_by_id(id).ok()?;
        let reader = apache_avro::reader::datum::GenericDatumReader::builder(schema)
            .build()
            .ok()?;
        let value = reader.read_value(&mut datum).ok()?;
        let line = format_line(None, &value);
        let json: serde_json::Value = serde_json::from_str(&line).ok()?;
        Some(json["value"].clone())
    }

    /// The value of `state` for `key`, committed or not.
    pub fn state<T: DeserializeOwned>(
        &mut self,
        state: &ValueState<T>,
        key: &str,
    ) -> anyhow::Result<Option<T>> {
        for stage in &mut self.stages {
            for (stored_key, value) in stage.scan(state.name(), key.as_bytes())? {
                if stored_key == key.as_bytes() {
                    return Ok(Some(decode_value(&value)?));
                }
            }
        }
        Ok(None)
    }

    /// The keys that have a value in `state`, over every task.
    pub fn state_keys<T>(&mut self, state: &ValueState<T>) -> anyhow::Result<Vec<String>> {
        let mut keys = Vec::new();
        for stage in &mut self.stages {
            for (key, _) in stage.scan(state.name(), &[])? {
                keys.push(String::from_utf8_lossy(&key).into_owned());
            }
        }
        keys.sort();
        Ok(keys)
    }

    /// Every entry of store `store` of stage `stage` (as `describe` names
    /// it: `main` for the first), committed or not, as its key's bytes and
    /// its value decoded as `T`.
    pub fn stage_entries<T: DeserializeOwned>(
        &mut self,
        stage: &str,
        store: &str,
    ) -> anyhow::Result<Vec<(Vec<u8>, T)>> {
        let stage = (self.stages.iter_mut())
            .find(|s| s.name().unwrap_or("main") == stage)
            .ok_or_else(|| anyhow::anyhow!("no stage {stage}"))?;
        stage
            .scan(store, &[])?
            .into_iter()
            .map(|(key, value)| Ok((key, decode_value(&value)?)))
            .collect()
    }

    /// Every entry of `key`'s map in `map`, in entry order.
    pub fn map_entries<K: MapKey, V: DeserializeOwned>(
        &mut self,
        map: &MapState<K, V>,
        key: &str,
    ) -> anyhow::Result<Vec<(K, V)>> {
        let mut prefix = Vec::new();
        map_prefix(key.as_bytes(), &mut prefix);
        let mut entries = Vec::new();
        for stage in &mut self.stages {
            for (bytes, value) in stage.scan(map.name(), &prefix)? {
                entries.push((
                    K::decode_key(&bytes[prefix.len()..])?,
                    decode_value(&value)?,
                ));
            }
        }
        Ok(entries)
    }

    /// Every stage's metrics, now, as the HTTP endpoint would show them: a
    /// later stage's series carry its name as label `stage`.
    pub fn metrics(&self) -> Snapshot {
        let metrics = Arc::new(Metrics::default());
        for stage in &self.stages {
            metrics.add_stage(stage.name()).publish(stage.snapshot());
        }
        metrics.snapshot()
    }

    /// Counter `name` of [`metrics`](Self::metrics), summed over every series
    /// whose labels include all of `labels` (see [`Snapshot::counter`]): say
    /// late records of one topic over every stage, or of every topic.
    pub fn counter(&self, name: &'static str, labels: &[(&'static str, &str)]) -> u64 {
        self.metrics().counter(name, labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partitioner::murmur2_partition;
    use crate::prelude::*;

    #[derive(Debug, serde::Deserialize)]
    struct Word {
        text: String,
        at: i64,
    }

    crate::stores! { SHOUTED: ValueState<u64> = "shouted"; }

    /// Shouts each word in a job; the completion emits it and counts it.
    #[derive(Clone)]
    struct Shouter;

    impl Processor for Shouter {
        type Input = Word;
        type Output = serde_json::Value;
        type Timers = NoTimers;
        const STORES: &'static [crate::processor::StoreSpec] = STORES;

        fn process(
            &mut self,
            ctx: &mut Context<'_, Self>,
            record: Record<'_, Word>,
        ) -> anyhow::Result<()> {
            let text = record.value.text;
            ctx.submit(move || {
                let loud = text.to_uppercase();
                Ok(
                    Box::new(move |_: &mut Shouter, ctx: &mut Context<'_, Shouter>| {
                        let count = ctx.get(&SHOUTED, "all")?.unwrap_or(0) + 1;
                        ctx.put(&SHOUTED, "all", &count)?;
                        ctx.emit(None, &serde_json::json!({"word": loud}))
                    }) as Completion<Shouter>,
                )
            });
            Ok(())
        }

        fn on_timer(
            &mut self,
            _: &mut Context<'_, Self>,
            _: Timer<'_, NoTimers>,
        ) -> anyhow::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn job_completions_emit_in_order_and_change_state() {
        let word = r#"{"type": "record", "name": "Word", "fields": [
            {"name": "text", "type": "string"}, {"name": "at", "type": "long"}]}"#;
        let loud = r#"{"type": "record", "name": "Loud", "fields": [
            {"name": "word", "type": "string"}]}"#;
        let topology = Topology::new("shouter", "loud", loud)
            .input(InputStream::new("words", word, |w: &Word| w.at, |w| w).unwrap())
            .job_workers(2);
        let args = runtime_args(&[]).unwrap();
        let mut driver = TestDriver::new(Pipeline::new(args, topology, Shouter)).unwrap();
        for (at, text) in ["one", "two", "three"].iter().enumerate() {
            driver
                .pipe("words", None, serde_json::json!({"text": text, "at": at}))
                .unwrap();
        }
        assert_eq!(
            driver.read_values("loud").unwrap(),
            vec![
                serde_json::json!({"word": "ONE"}),
                serde_json::json!({"word": "TWO"}),
                serde_json::json!({"word": "THREE"}),
            ]
        );
        assert_eq!(driver.state(&SHOUTED, "all").unwrap(), Some(3));
        let before = driver.read_values("loud").unwrap();
        driver.crash().unwrap();
        assert_eq!(
            driver.read_values("loud").unwrap(),
            before,
            "nothing was committed: the crash dropped it all and it was done again, once"
        );
        assert_eq!(driver.state(&SHOUTED, "all").unwrap(), Some(3));
    }

    #[derive(Debug, serde::Deserialize)]
    struct Step {
        text: String,
        at: i64,
        to: String,
    }

    crate::timer_names! { enum StepTimer { Soon = "soon", Later = "later" } }

    /// Re-keyed by `to`; each record sets two timers for its text, 200 and
    /// 700 ms after it, and every record and firing is written out, in order.
    #[derive(Clone)]
    struct Tracer;

    impl Processor for Tracer {
        type Input = Step;
        type Output = serde_json::Value;
        type Timers = StepTimer;
        const STORES: &'static [crate::processor::StoreSpec] = &[];

        fn process(
            &mut self,
            ctx: &mut Context<'_, Self>,
            record: Record<'_, Step>,
        ) -> anyhow::Result<()> {
            let text = &record.value.text;
            ctx.set_timer(text, StepTimer::Soon, record.event_time + 200);
            ctx.set_timer(text, StepTimer::Later, record.event_time + 700);
            ctx.emit(
                None,
                &serde_json::json!({"event": format!("record {text}")}),
            )
        }

        fn on_timer(
            &mut self,
            ctx: &mut Context<'_, Self>,
            timer: Timer<'_, StepTimer>,
        ) -> anyhow::Result<()> {
            let name = match timer.name {
                StepTimer::Soon => "soon",
                StepTimer::Later => "later",
            };
            let event = format!("timer {} {name} at {}", timer.key, timer.time);
            ctx.emit(None, &serde_json::json!({"event": event}))
        }
    }

    /// A key that the re-keyed records of `partition` (of 2) carry.
    fn key_of_partition(partition: i32) -> String {
        (0..)
            .map(|i| format!("k{i}"))
            .find(|key| murmur2_partition(key.as_bytes(), 2) == partition)
            .expect("some key hashes to every partition")
    }

    /// A re-keyed record's stamp (its source partition's watermark, 8.5 s
    /// here, for that partition has moved on with a record for task 1)
    /// counts before the record only as far as the record's own event time
    /// minus the out-of-orderness (1.5 s): the timer that advance makes due
    /// fires before the record, as on a direct input; the timers due by the
    /// rest of the stamp fire after it, including those it has just set.
    #[test]
    fn a_stamp_counts_before_its_record_only_as_far_as_the_record_explains_it() {
        let step = r#"{"type": "record", "name": "Step", "fields": [
            {"name": "text", "type": "string"}, {"name": "at", "type": "long"},
            {"name": "to", "type": "string"}]}"#;
        let event = r#"{"type": "record", "name": "Event", "fields": [
            {"name": "event", "type": "string"}]}"#;
        let topology = Topology::new("tracer", "events", event)
            .input(
                InputStream::new("steps", step, |s: &Step| s.at, |s| s)
                    .unwrap()
                    .repartition_by("by-to", |s: &Step| s.to.clone()),
            )
            .max_out_of_orderness(HumanDuration::from_millis(500));
        let args = runtime_args(&[]).unwrap();
        let mut driver = TestDriver::builder(Pipeline::new(args, topology, Tracer))
            .partitions(2)
            .build()
            .unwrap();
        let (task_0, task_1) = (key_of_partition(0), key_of_partition(1));
        let pipe = |driver: &mut TestDriver, partition, text: &str, at: i64, to: &str| {
            let value = serde_json::json!({"text": text, "at": at, "to": to});
            driver.pipe_to("steps", partition, None, value).unwrap();
        };
        // Source partition 1 moves on far ahead, and says so at the commit:
        // from then on only source partition 0 holds task 0 back.
        pipe(&mut driver, 1, "ahead", 100_000, &task_1);
        driver.commit().unwrap();
        pipe(&mut driver, 0, "a", 1_000, &task_0);
        pipe(&mut driver, 0, "far", 9_000, &task_1);
        pipe(&mut driver, 0, "b", 2_000, &task_0);
        let events: Vec<String> = driver
            .read_values("events")
            .unwrap()
            .into_iter()
            .map(|value| value["event"].as_str().unwrap().to_string())
            .filter(|event| !event.contains("ahead") && !event.contains("far"))
            .collect();
        assert_eq!(
            events,
            [
                "record a",
                "timer a soon at 1200",
                "record b",
                "timer a later at 1700",
                "timer b soon at 2200",
                "timer b later at 2700",
            ]
        );
    }
}
