//! The processing loop: consume, route to tasks, produce, commit.
//!
//! One thread owns everything mutable. It polls one consumer (the application's
//! consumer group) and, per record, finds the route of its topic:
//!
//! * a **direct input**: partition *p* goes to task *p*;
//! * the **source of a repartitioning**: the record is re-keyed and forwarded
//!   unchanged (same wire-format bytes) to `<app-id>-<name>-repartition`;
//! * a **repartition topic**: data records go to task *p*; watermark
//!   announcements (records with a `streams.watermark` header) move the clock
//!   of the upstream task that sent them.
//!
//! Every commit interval the engine stages clocks into state, announces
//! upstream watermarks, writes every uncommitted state change to its changelog,
//! and commits outputs, changelogs and input offsets together — one Kafka
//! transaction under exactly-once — before applying the changes to RocksDB.
//!
//! Rebalances arrive as consumer callbacks on the same thread (inside `poll`),
//! which is why the engine lives in the consumer context behind a mutex that
//! is never held across `poll`.
//!
//! `commit.rs` holds the commit and rollback path, `lifecycle.rs` the opening
//! and closing of tasks on rebalances.

mod commit;
mod lifecycle;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::ClientContext;
use rustc_hash::FxHashMap;

use crate::avro::{DecodeError, Registry};
use crate::config::ProcessingGuarantee;
use crate::delivery::{Outgoing, UNTRACKED};
use crate::metrics::{self, Snapshot, StageMetrics};
use crate::output::Output;
use crate::processor::Processor;
use crate::restore::Restorer;
use crate::state::store::StateResources;
use crate::task::{EventTimeSettings, InputKind, Origin, Outcome, Pending, Task, TaskEnv};
use crate::topology::DecodeFn;

/// Header of a watermark announcement on a repartition topic (i64, big-endian).
pub const WATERMARK_HEADER: &str = "streams.watermark";
/// Header naming the upstream partition of an announcement (u32, big-endian).
pub const SOURCE_HEADER: &str = "streams.source";

/// Settings of the engine, resolved at startup.
pub(crate) struct EngineSettings {
    pub guarantee: ProcessingGuarantee,
    pub commit_interval: Duration,
    pub event_time: EventTimeSettings,
    pub max_task_idle: Duration,
    pub late_topic: Option<String>,
    pub dlq_topic: String,
    pub state_dir: PathBuf,
    pub store_names: Vec<String>,
    pub changelog_topics: Vec<String>,
    /// When the output is a stage link: its partition count. Every task then
    /// announces its watermark to each of them at commit, after the results
    /// it caused.
    pub link_partitions: Option<usize>,
}

/// What the engine does with records of one subscribed topic.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Route {
    /// Input `slot`, read directly.
    Direct { slot: usize },
    /// Source of input `slot`, forwarded to its repartition topic.
    Upstream { slot: usize },
    /// Repartition topic of input `slot`.
    Repartitioned { slot: usize },
}

/// Every subscribed topic with its route.
pub(crate) type Routes = Vec<(String, Route)>;

/// One input of the topology, as the engine runs it.
pub(crate) struct InputRuntime<I> {
    pub decode: DecodeFn<I>,
    pub kind: InputKind,
    pub repartition: Option<RepartitionRuntime<I>>,
}

/// A repartitioning: where to, by what key, and how many partitions it has.
pub(crate) struct RepartitionRuntime<I> {
    pub topic: String,
    pub key_of: fn(&I) -> String,
    pub downstream_partitions: usize,
}

/// Event-time progress of one upstream (source) partition of a repartitioning.
#[derive(Debug, Default)]
struct UpstreamClock {
    max_event_time: Option<i64>,
    announced: Option<i64>,
    /// Whether records were forwarded since the last announcement: with an
    /// idle timeout, an active upstream announces even an unchanged
    /// watermark, so that downstream does not take it for idle.
    active: bool,
}

/// Per-topic counts since startup.
#[derive(Debug, Default, Clone)]
struct TopicCounts {
    consumed: u64,
    late: u64,
    dead_lettered: u64,
}

pub(crate) struct Engine<P: Processor> {
    settings: EngineSettings,
    processor: P,
    inputs: Vec<InputRuntime<P::Input>>,
    topics: Routes,
    kinds: Vec<InputKind>,
    tasks: BTreeMap<i32, Task<P>>,
    output: Output,
    registry: Registry,
    resources: StateResources,
    restorer: Restorer,
    positions: FxHashMap<(usize, i32), i64>,
    /// At-least-once only: records below these offsets are already in the
    /// restored state and are skipped (see `assign`).
    skip_below: FxHashMap<(usize, i32), i64>,
    upstream: FxHashMap<(usize, i32), UpstreamClock>,
    topic_counts: Vec<TopicCounts>,
    produced: HashMap<String, u64>,
    restored_records: u64,
    commits: u64,
    commits_aborted: u64,
    commit_seconds: f64,
    processor_counters: BTreeMap<&'static str, u64>,
    last_commit: Instant,
    metrics: StageMetrics,
    shutdown: Arc<AtomicBool>,
    /// An error raised inside a rebalance callback, surfaced by the loop.
    pub(crate) fatal: Option<anyhow::Error>,
}

/// The consumer context: rebalance callbacks reach the engine through it.
pub(crate) struct EngineContext<P: Processor> {
    pub engine: Mutex<Option<Engine<P>>>,
}

pub(crate) type GroupConsumer<P> = BaseConsumer<EngineContext<P>>;

impl<P: Processor> ClientContext for EngineContext<P> {}

impl<P: Processor> ConsumerContext for EngineContext<P> {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(partitions) = rebalance {
            let mut guard = self.engine.lock().unwrap();
            if let Some(engine) = guard.as_mut() {
                if let Err(error) = engine.revoke(consumer, partitions) {
                    engine.fatal.get_or_insert(error);
                }
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(partitions) => {
                let mut guard = self.engine.lock().unwrap();
                if let Some(engine) = guard.as_mut() {
                    if let Err(error) = engine.assign(consumer, partitions) {
                        engine.fatal.get_or_insert(error);
                    }
                }
            }
            Rebalance::Error(error) => tracing::warn!(%error, "rebalance error"),
            Rebalance::Revoke(_) => {}
        }
    }
}

/// The delivery tag of a changelog record: which store, which partition.
fn changelog_tag(store: usize, partition: i32) -> usize {
    1 + store * 1_000_000 + partition as usize
}

/// The value of header `name`, if the record has it.
fn header<'m>(message: &'m BorrowedMessage<'_>, name: &str) -> Option<&'m [u8]> {
    message
        .headers()?
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
}

fn header_i64(message: &BorrowedMessage<'_>, name: &str) -> Option<i64> {
    header(message, name).and_then(|v| v.try_into().ok().map(i64::from_be_bytes))
}

fn header_u32(message: &BorrowedMessage<'_>, name: &str) -> Option<u32> {
    header(message, name).and_then(|v| v.try_into().ok().map(u32::from_be_bytes))
}

impl<P: Processor> Engine<P> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        settings: EngineSettings,
        processor: P,
        inputs: Vec<InputRuntime<P::Input>>,
        topics: Routes,
        output: Output,
        registry: Registry,
        resources: StateResources,
        restorer: Restorer,
        metrics: StageMetrics,
        shutdown: Arc<AtomicBool>,
    ) -> Self {
        let kinds = inputs.iter().map(|input| input.kind).collect();
        let topic_counts = vec![TopicCounts::default(); topics.len()];
        Engine {
            settings,
            processor,
            inputs,
            topics,
            kinds,
            tasks: BTreeMap::new(),
            output,
            registry,
            resources,
            restorer,
            positions: FxHashMap::default(),
            skip_below: FxHashMap::default(),
            upstream: FxHashMap::default(),
            topic_counts,
            produced: HashMap::new(),
            restored_records: 0,
            commits: 0,
            commits_aborted: 0,
            commit_seconds: 0.0,
            processor_counters: BTreeMap::new(),
            last_commit: Instant::now(),
            metrics,
            shutdown,
            fatal: None,
        }
    }

    fn topic_index(&self, topic: &str) -> Option<usize> {
        self.topics.iter().position(|(name, _)| name == topic)
    }

    fn is_task_route(route: Route) -> bool {
        matches!(route, Route::Direct { .. } | Route::Repartitioned { .. })
    }

    /// Handles one consumed record.
    pub fn handle(&mut self, message: &BorrowedMessage<'_>) -> anyhow::Result<()> {
        let Some(topic_index) = self.topic_index(message.topic()) else {
            return Ok(());
        };
        let partition = message.partition();
        self.topic_counts[topic_index].consumed += 1;
        let origin = Origin {
            topic_index,
            offset: message.offset(),
        };
        if self
            .skip_below
            .get(&(topic_index, partition))
            .is_some_and(|floor| message.offset() < *floor)
        {
            self.positions
                .insert((topic_index, partition), message.offset() + 1);
            return Ok(());
        }
        let (slot, entry) = match self.topics[topic_index].1 {
            Route::Upstream { slot } => {
                self.positions
                    .insert((topic_index, partition), message.offset() + 1);
                return self.forward_upstream(topic_index, slot, message);
            }
            Route::Repartitioned { slot } if header_i64(message, WATERMARK_HEADER).is_some() => {
                let watermark = header_i64(message, WATERMARK_HEADER).unwrap_or(i64::MIN);
                let source = header_u32(message, SOURCE_HEADER).unwrap_or(0) as usize;
                (
                    slot,
                    Pending::Announcement {
                        source,
                        watermark,
                        origin,
                    },
                )
            }
            Route::Direct { slot } | Route::Repartitioned { slot } => {
                match self.decode(slot, message) {
                    Ok((value, event_time)) => {
                        let key = message
                            .key()
                            .map(|k| String::from_utf8_lossy(k).into_owned());
                        let raw = self
                            .settings
                            .late_topic
                            .is_some()
                            .then(|| message.payload().unwrap_or_default().to_vec());
                        (
                            slot,
                            Pending::Record {
                                key,
                                value,
                                event_time,
                                origin,
                                raw,
                            },
                        )
                    }
                    Err(error) => {
                        self.dead_letter(topic_index, message, &error)?;
                        (slot, Pending::Skipped { origin })
                    }
                }
            }
        };
        let Some(task) = self.tasks.get_mut(&partition) else {
            anyhow::bail!("record from {}-{partition} has no task", message.topic());
        };
        task.enqueue(slot, entry);
        self.drain(partition)
    }

    fn decode(
        &mut self,
        slot: usize,
        message: &BorrowedMessage<'_>,
    ) -> Result<(P::Input, i64), DecodeError> {
        if let Some(key) = message.key() {
            std::str::from_utf8(key)
                .map_err(|_| DecodeError::NotWireFormat("record key is not UTF-8".into()))?;
        }
        let payload = message.payload().unwrap_or_default();
        let shutdown = &self.shutdown;
        (self.inputs[slot].decode)(&self.registry, payload, &|| {
            shutdown.load(Ordering::Relaxed)
        })
    }

    /// Handles every buffered entry of task `partition` that may go now.
    fn drain(&mut self, partition: i32) -> anyhow::Result<()> {
        let Some(task) = self.tasks.get_mut(&partition) else {
            return Ok(());
        };
        let now = Instant::now();
        let mut late = Vec::new();
        {
            let mut env = TaskEnv {
                output: &mut self.output,
                time: self.settings.event_time,
                now,
                shutdown: &self.shutdown,
            };
            while let Some((slot, entry)) = task.next_ready(self.settings.max_task_idle, now) {
                let origin = entry.origin();
                match entry {
                    Pending::Record {
                        key,
                        value,
                        event_time,
                        raw,
                        ..
                    } => {
                        let outcome =
                            task.handle_record(&mut env, slot, key.as_deref(), value, event_time)?;
                        if outcome == Outcome::Late {
                            self.topic_counts[origin.topic_index].late += 1;
                            late.push((key, raw));
                        }
                    }
                    Pending::Announcement {
                        source, watermark, ..
                    } => {
                        task.handle_announcement(&mut env, slot, source, watermark)?;
                    }
                    Pending::Skipped { .. } => {}
                }
                self.positions
                    .insert((origin.topic_index, partition), origin.offset + 1);
            }
        }
        if let Some(late_topic) = &self.settings.late_topic {
            for (key, raw) in late {
                self.output.delivery.send(Outgoing {
                    topic: late_topic,
                    partition: None,
                    key: key.as_deref().map(str::as_bytes),
                    payload: raw.as_deref(),
                    headers: None,
                    tag: UNTRACKED,
                });
                *self.produced.entry(late_topic.clone()).or_default() += 1;
            }
        }
        Ok(())
    }

    fn forward_upstream(
        &mut self,
        topic_index: usize,
        slot: usize,
        message: &BorrowedMessage<'_>,
    ) -> anyhow::Result<()> {
        let (value, event_time) = match self.decode(slot, message) {
            Ok(decoded) => decoded,
            Err(error) => return self.dead_letter(topic_index, message, &error),
        };
        let repartition = self.inputs[slot]
            .repartition
            .as_ref()
            .expect("upstream routes have a repartitioning");
        let key = (repartition.key_of)(&value);
        self.output.delivery.send(Outgoing {
            topic: &repartition.topic,
            partition: None,
            key: Some(key.as_bytes()),
            payload: message.payload(),
            headers: None,
            tag: UNTRACKED,
        });
        *self.produced.entry(repartition.topic.clone()).or_default() += 1;
        let clock = self
            .upstream
            .entry((slot, message.partition()))
            .or_default();
        clock.max_event_time = Some(
            clock
                .max_event_time
                .map_or(event_time, |m| m.max(event_time)),
        );
        clock.active = true;
        Ok(())
    }

    /// Copies an undecodable record to the dead-letter topic, with headers
    /// naming the error and where the record came from.
    fn dead_letter(
        &mut self,
        topic_index: usize,
        message: &BorrowedMessage<'_>,
        error: &DecodeError,
    ) -> anyhow::Result<()> {
        tracing::warn!(
            topic = message.topic(),
            partition = message.partition(),
            offset = message.offset(),
            %error,
            "undecodable record sent to the dead-letter topic"
        );
        let message_text = error.to_string();
        let partition_text = message.partition().to_string();
        let offset_text = message.offset().to_string();
        let fields = [
            ("dlq.error.kind", error.kind()),
            ("dlq.error.message", message_text.as_str()),
            ("dlq.source.topic", message.topic()),
            ("dlq.source.partition", partition_text.as_str()),
            ("dlq.source.offset", offset_text.as_str()),
        ];
        let headers = fields.into_iter().fold(
            OwnedHeaders::new_with_capacity(fields.len()),
            |headers, (key, value)| {
                headers.insert(Header {
                    key,
                    value: Some(value),
                })
            },
        );
        self.output.delivery.send(Outgoing {
            topic: &self.settings.dlq_topic,
            partition: None,
            key: message.key(),
            payload: message.payload(),
            headers: Some(headers),
            tag: UNTRACKED,
        });
        self.topic_counts[topic_index].dead_lettered += 1;
        *self
            .produced
            .entry(self.settings.dlq_topic.clone())
            .or_default() += 1;
        Ok(())
    }

    /// Lets idle partitions move watermarks; serves delivery reports; commits
    /// when the interval has passed.
    pub fn tick(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        self.output.delivery.poll();
        let partitions: Vec<i32> = self.tasks.keys().copied().collect();
        for partition in partitions {
            self.drain(partition)?;
        }
        if self.settings.event_time.idleness.is_on() {
            let now = Instant::now();
            let mut env = TaskEnv {
                output: &mut self.output,
                time: self.settings.event_time,
                now,
                shutdown: &self.shutdown,
            };
            for task in self.tasks.values_mut() {
                task.tick(&mut env)?;
            }
        }
        if self.commit_due() {
            self.commit(consumer)?;
        }
        Ok(())
    }

    /// Whether the commit interval has passed since the last commit ended.
    pub fn commit_due(&self) -> bool {
        self.last_commit.elapsed() >= self.settings.commit_interval
    }

    /// Final commit and flush on shutdown.
    pub fn close(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        self.commit(consumer)?;
        self.output.delivery.close();
        Ok(())
    }

    fn publish_metrics(&self) {
        let mut snapshot = Snapshot::default();
        for ((topic, _), counts) in self.topics.iter().zip(&self.topic_counts) {
            let label = || vec![("topic", topic.clone())];
            snapshot.add(metrics::RECORDS_CONSUMED, label(), counts.consumed);
            snapshot.add(metrics::RECORDS_LATE, label(), counts.late);
            snapshot.add(
                metrics::RECORDS_DEAD_LETTERED,
                label(),
                counts.dead_lettered,
            );
        }
        snapshot.add(
            metrics::RECORDS_PRODUCED,
            vec![("topic", self.output.topic().to_string())],
            self.output.produced,
        );
        for (topic, count) in &self.produced {
            snapshot.add(
                metrics::RECORDS_PRODUCED,
                vec![("topic", topic.clone())],
                *count,
            );
        }
        snapshot.add(metrics::RESTORED_RECORDS, vec![], self.restored_records);
        snapshot.add(metrics::COMMITS, vec![], self.commits);
        snapshot.add(metrics::COMMITS_ABORTED, vec![], self.commits_aborted);
        snapshot.set(metrics::COMMIT_SECONDS, vec![], self.commit_seconds);
        for (name, count) in &self.processor_counters {
            snapshot.add(
                metrics::PROCESSOR_EVENTS,
                vec![("name", name.to_string())],
                *count,
            );
        }
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        for task in self.tasks.values() {
            let label = || vec![("task", task.partition.to_string())];
            if task.watermark() != crate::time::NO_WATERMARK {
                let lag = (now_ms.saturating_sub(task.watermark())) as f64 / 1000.0;
                snapshot.set(metrics::WATERMARK_LAG, label(), lag);
            }
            snapshot.set(
                metrics::TIMERS_PENDING,
                label(),
                task.timers_pending() as f64,
            );
            snapshot.set(
                metrics::STATE_BYTES,
                label(),
                task.store.estimated_bytes() as f64,
            );
            for (index, name) in self.settings.store_names.iter().enumerate() {
                snapshot.set(
                    metrics::STATE_KEYS,
                    vec![
                        ("task", task.partition.to_string()),
                        ("store", name.clone()),
                    ],
                    task.store.estimated_keys(index) as f64,
                );
            }
        }
        self.metrics.publish(snapshot);
    }
}
