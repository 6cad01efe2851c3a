//! The processing core of a stage: routing, repartitioning, dead letters and
//! tasks, with no broker in sight.
//!
//! The engine takes consumed records ([`Incoming`]) and, per record, finds the
//! route of its topic:
//!
//! * a **task input** ([`Route::Task`]): partition *p* goes to task *p*;
//! * a **re-keyed source** ([`Route::Rekey`]): the record is re-keyed and
//!   forwarded unchanged (same wire-format bytes) to its repartition topic,
//!   stamped with its source partition's watermark;
//! * a **shuffled input** ([`Route::Shuffled`]), a repartition topic or stage
//!   link: records go to task *p* with their writer's watermark; control
//!   records (headers only) announce a writer's watermark.
//!
//! Everything the stage writes goes into a [`Collector`]. Who drains it, and
//! how commits reach Kafka, is the business of `kafka_stage/` (the Kafka
//! consumer, producer and transactions) or of `crate::testing` (in-memory
//! topics). The order of work is the same for both, because it is this code.
//!
//! `drain.rs` runs the tasks' buffered work and jobs; `commit.rs` prepares
//! and settles commits; `lifecycle.rs` opens and closes tasks;
//! `counters.rs` holds what the engine counts and `snapshot.rs` reports it
//! as metrics; `kafka_stage/` runs the engine on a Kafka consumer group.

mod commit;
mod counters;
mod drain;
mod job_gate;
pub(crate) mod kafka_stage;
mod lifecycle;
mod snapshot;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::avro::{DecodeError, Registry};
use crate::clock::Clock;
use crate::collector::{Collector, Headers, TopicId};
use crate::output::OutputEncoder;
use crate::pool::WorkerPool;
use crate::processor::Processor;
use crate::task::{EventTimeSettings, InputKind, Origin, Pending, Task};
use crate::topology::{DecodeFn, RekeyFn};
use crate::watermark::{partition_watermark, Announcement};
#[cfg(feature = "test-utils")]
pub(crate) use counters::RecordCounts;
pub(crate) use counters::{EngineCounters, Timestamps, TopicCounts};
pub(crate) use drain::Flush;
use job_gate::JobGate;

/// Settings of the engine, resolved at startup.
pub(crate) struct EngineSettings {
    pub commit_interval: Duration,
    pub event_time: EventTimeSettings,
    pub max_task_idle: Duration,
    pub store_names: Vec<String>,
    /// When the output is a stage link: its partition count. Every task then
    /// stamps its results with its watermark and announces it to each
    /// partition at commit.
    pub link_partitions: Option<usize>,
    /// Threads running the processors' jobs (0: jobs run inline).
    pub job_workers: usize,
}

/// What the engine does with records of one subscribed topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Input `slot`, read directly: partition *p* feeds task *p*.
    Task { slot: usize },
    /// Source of input `slot`: re-keyed into its repartition topic.
    Rekey { slot: usize },
    /// The repartition topic or stage link of input `slot`.
    Shuffled { slot: usize },
}

impl Route {
    /// Whether partition *p* of this topic belongs to task *p*.
    pub fn feeds_task(self) -> bool {
        matches!(self, Route::Task { .. } | Route::Shuffled { .. })
    }
}

/// A topic the stage consumes, and what to do with its records.
#[derive(Debug, Clone)]
pub(crate) struct Subscription {
    pub topic: String,
    pub route: Route,
}

/// One input of the topology, as the engine runs it.
pub(crate) struct InputRuntime<I> {
    pub decode: DecodeFn<I>,
    pub kind: InputKind,
    pub rekeying: Option<Rekeying>,
}

/// A repartitioning: where to, by what key, and how many partitions it has.
pub(crate) struct Rekeying {
    pub topic: TopicId,
    pub rekey: RekeyFn,
    pub downstream_partitions: usize,
}

/// The topics a stage writes besides its output.
pub(crate) struct SideTopics {
    pub dead_letters: TopicId,
    pub late: Option<TopicId>,
    /// One changelog topic per store, by store index.
    pub changelogs: Vec<TopicId>,
}

/// A consumed record, as the engine needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Incoming<'a> {
    /// Index into the engine's subscriptions.
    pub subscription: usize,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// The writer's watermark, on records of shuffled inputs.
    pub announcement: Option<Announcement>,
    /// The record's Kafka timestamp (milliseconds since the epoch).
    pub timestamp: Option<i64>,
}

/// Event-time progress of one source partition of a repartitioning.
#[derive(Debug, Default)]
struct UpstreamClock {
    max_event_time: Option<i64>,
    announced: Option<i64>,
    /// Whether records were forwarded since the last announcement: with an
    /// idle timeout, an active upstream announces even an unchanged
    /// watermark, so that downstream does not take it for idle.
    active: bool,
}

pub(crate) struct Engine<P: Processor> {
    settings: EngineSettings,
    processor: P,
    inputs: Vec<InputRuntime<P::Input>>,
    subscriptions: Vec<Subscription>,
    kinds: Vec<InputKind>,
    tasks: BTreeMap<i32, Task<P>>,
    /// Tasks set aside by a revocation of every partition (an eager
    /// rebalance), to run again as they are if the assignment that follows
    /// gives them back (see [`Engine::suspend_tasks`]).
    suspended: BTreeMap<i32, Task<P>>,
    collector: Collector,
    output: OutputEncoder,
    side: SideTopics,
    registry: Registry,
    /// Next offset to consume, by (subscription, partition).
    positions: FxHashMap<(usize, i32), i64>,
    /// At-least-once only: records below these offsets are already in the
    /// restored state and are skipped.
    skip_below: FxHashMap<(usize, i32), i64>,
    /// By (input slot, source partition).
    upstream: FxHashMap<(usize, i32), UpstreamClock>,
    pub(crate) counters: EngineCounters,
    /// Processor counters of the sealed commit, counted once it succeeds.
    sealed_counters: BTreeMap<&'static str, u64>,
    clock: Clock,
    last_commit: Instant,
    /// Records consumed and produced, as counted when the last commit was
    /// sealed: a commit with nothing new is skipped.
    sealed_progress: (u64, u64),
    shutdown: Arc<AtomicBool>,
    jobs: WorkerPool,
    /// Whether a drain stops once a commit is due (see [`Engine::yield_to_commits`]).
    yields_to_commits: bool,
    /// When jobs in flight hold the tasks back.
    job_gate: JobGate,
    /// Whether a drain stopped with entries ready to go; cleared by [`Engine::tick`].
    backlog: bool,
}

/// The parts an engine is built from.
pub(crate) struct EngineParts<P: Processor> {
    pub settings: EngineSettings,
    pub processor: P,
    pub inputs: Vec<InputRuntime<P::Input>>,
    pub subscriptions: Vec<Subscription>,
    pub collector: Collector,
    pub output: OutputEncoder,
    pub side: SideTopics,
    pub registry: Registry,
    pub clock: Clock,
    pub shutdown: Arc<AtomicBool>,
}

impl<P: Processor> Engine<P> {
    pub fn new(parts: EngineParts<P>) -> Self {
        let kinds = parts.inputs.iter().map(|input| input.kind).collect();
        let counters = EngineCounters {
            topics: vec![TopicCounts::default(); parts.subscriptions.len()],
            ..EngineCounters::default()
        };
        let last_commit = parts.clock.now().instant;
        let jobs = WorkerPool::new("job-worker", parts.settings.job_workers);
        let job_gate = JobGate::for_workers(parts.settings.job_workers);
        Engine {
            job_gate,
            jobs,
            settings: parts.settings,
            processor: parts.processor,
            inputs: parts.inputs,
            subscriptions: parts.subscriptions,
            kinds,
            tasks: BTreeMap::new(),
            suspended: BTreeMap::new(),
            collector: parts.collector,
            output: parts.output,
            side: parts.side,
            registry: parts.registry,
            positions: FxHashMap::default(),
            skip_below: FxHashMap::default(),
            upstream: FxHashMap::default(),
            counters,
            sealed_counters: BTreeMap::new(),
            clock: parts.clock,
            last_commit,
            sealed_progress: (0, 0),
            shutdown: parts.shutdown,
            yields_to_commits: false,
            backlog: false,
        }
    }

    /// The topics this stage consumes.
    pub fn subscriptions(&self) -> &[Subscription] {
        &self.subscriptions
    }

    /// The index of the subscription to `topic`.
    pub fn subscription_index(&self, topic: &str) -> Option<usize> {
        self.subscriptions.iter().position(|s| s.topic == topic)
    }

    /// Whether records of `subscription` may carry watermark stamps: only a
    /// repartition topic or stage link does, written by this application.
    /// A stamp on a topic read directly is not ours and is not looked for
    /// (librdkafka parses a record's headers on every request, even when it
    /// has none, a cost seen in the profile of a stateless-heavy stage).
    pub fn carries_stamps(&self, subscription: usize) -> bool {
        matches!(
            self.subscriptions[subscription].route,
            Route::Shuffled { .. }
        )
    }

    /// The open tasks, by partition, to change (the test driver's crash).
    #[cfg(feature = "test-utils")]
    pub(crate) fn tasks_mut(&mut self) -> &mut BTreeMap<i32, Task<P>> {
        &mut self.tasks
    }

    /// Handles one consumed record; `flush` is handed the collected records
    /// during a long drain (see [`FLUSH_EVERY`](drain::FLUSH_EVERY)) and
    /// at the end.
    pub fn handle(&mut self, message: Incoming<'_>, flush: Flush<'_>) -> anyhow::Result<()> {
        self.handle_record(message, &mut *flush)?;
        self.send_output(flush);
        Ok(())
    }

    /// Hands what the engine collected (outputs, changelog records,
    /// announcements, dead letters) to `flush`: the one way records leave
    /// the engine.
    pub fn send_output(&mut self, flush: Flush<'_>) {
        flush(&mut self.collector);
    }

    /// Bytes of collected records that `flush` held back (see
    /// [`Collector::held_bytes`]).
    pub fn held_output_bytes(&self) -> usize {
        self.collector.held_bytes()
    }

    fn handle_record(&mut self, message: Incoming<'_>, flush: Flush<'_>) -> anyhow::Result<()> {
        let Incoming {
            subscription,
            partition,
            offset,
            timestamp,
            ..
        } = message;
        self.counters.topics[subscription].consumed += 1;
        if let Some(timestamp) = timestamp {
            self.counters.handled.add(timestamp);
        }
        let origin = Origin {
            topic_index: subscription,
            offset,
        };
        if self
            .skip_below
            .get(&(subscription, partition))
            .is_some_and(|floor| offset < *floor)
        {
            self.positions.insert((subscription, partition), offset + 1);
            return Ok(());
        }
        let wire_bytes = message.key.map_or(0, <[u8]>::len) + message.value.map_or(0, <[u8]>::len);
        let (slot, entry) = match self.subscriptions[subscription].route {
            Route::Rekey { slot } => {
                self.positions.insert((subscription, partition), offset + 1);
                return self.rekey(slot, message);
            }
            Route::Shuffled { slot } if message.value.is_none() => match message.announcement {
                Some(announcement) => (
                    slot,
                    Pending::Announcement {
                        announcement,
                        origin,
                    },
                ),
                None => {
                    self.dead_letter(
                        &message,
                        &DecodeError::NotWireFormat("empty or null value".into()),
                    );
                    (slot, Pending::Skipped { origin })
                }
            },
            Route::Task { slot } | Route::Shuffled { slot } => match self.decode(slot, &message) {
                Ok((value, event_time)) => {
                    let key = message.key.map(|k| String::from_utf8_lossy(k).into_owned());
                    let raw = self
                        .side
                        .late
                        .is_some()
                        .then(|| message.value.unwrap_or_default().to_vec());
                    (
                        slot,
                        Pending::Record {
                            key,
                            value,
                            event_time,
                            origin,
                            raw,
                            stamp: message
                                .announcement
                                .filter(|_| self.carries_stamps(subscription)),
                        },
                    )
                }
                Err(error) => {
                    self.dead_letter(&message, &error);
                    (slot, Pending::Skipped { origin })
                }
            },
        };
        self.enqueue(partition, slot, entry, wire_bytes)?;
        self.drain(partition, flush)
    }

    fn enqueue(
        &mut self,
        partition: i32,
        slot: usize,
        entry: Pending<P::Input>,
        wire_bytes: usize,
    ) -> anyhow::Result<()> {
        let Some(task) = self.tasks.get_mut(&partition) else {
            anyhow::bail!(
                "record from {}-{partition} has no task",
                self.subscriptions[entry.origin().topic_index].topic
            );
        };
        task.enqueue(slot, entry, wire_bytes);
        Ok(())
    }

    fn decode(
        &mut self,
        slot: usize,
        message: &Incoming<'_>,
    ) -> Result<(P::Input, i64), DecodeError> {
        check_key(message.key)?;
        let shutdown = &self.shutdown;
        (self.inputs[slot].decode)(&self.registry, message.value.unwrap_or_default(), &|| {
            shutdown.load(Ordering::Relaxed)
        })
    }

    /// Forwards a record of a re-keyed source to its repartition topic,
    /// stamped with the source partition's watermark including this record.
    fn rekey(&mut self, slot: usize, message: Incoming<'_>) -> anyhow::Result<()> {
        if let Err(error) = check_key(message.key) {
            self.dead_letter(&message, &error);
            return Ok(());
        }
        let shutdown = &self.shutdown;
        let rekeying = self.inputs[slot]
            .rekeying
            .as_mut()
            .expect("re-keyed routes have a repartitioning");
        let (key, event_time) =
            match (rekeying.rekey)(&self.registry, message.value.unwrap_or_default(), &|| {
                shutdown.load(Ordering::Relaxed)
            }) {
                Ok(decoded) => decoded,
                Err(error) => {
                    self.dead_letter(&message, &error);
                    return Ok(());
                }
            };
        let clock = self.upstream.entry((slot, message.partition)).or_default();
        let max = clock
            .max_event_time
            .map_or(event_time, |m| m.max(event_time));
        clock.max_event_time = Some(max);
        clock.active = true;
        let stamp = Announcement {
            source: message.partition as u32,
            watermark: partition_watermark(max, self.settings.event_time.max_out_of_orderness),
        };
        self.collector.push(
            rekeying.topic,
            None,
            Some(key.as_bytes()),
            message.value,
            Headers::Watermark(stamp),
        );
        Ok(())
    }

    /// Copies an undecodable record to the dead-letter topic, with headers
    /// naming the error and where the record came from.
    fn dead_letter(&mut self, message: &Incoming<'_>, error: &DecodeError) {
        let subscription = &self.subscriptions[message.subscription];
        tracing::warn!(
            topic = subscription.topic,
            partition = message.partition,
            offset = message.offset,
            %error,
            "undecodable record sent to the dead-letter topic"
        );
        let source_topic = self.collector.topic(&subscription.topic);
        self.collector.push_dead_letter(
            self.side.dead_letters,
            message.key,
            message.value,
            error.kind(),
            &error.to_string(),
            source_topic,
            message.partition,
            message.offset,
        );
        self.counters.topics[message.subscription].dead_lettered += 1;
    }
}

/// A record key must be UTF-8 (processors see it as `&str`).
fn check_key(key: Option<&[u8]>) -> Result<(), DecodeError> {
    match key.map(std::str::from_utf8) {
        Some(Err(_)) => Err(DecodeError::NotWireFormat("record key is not UTF-8".into())),
        _ => Ok(()),
    }
}
