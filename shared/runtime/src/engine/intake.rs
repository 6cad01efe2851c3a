//! The way in: what becomes of each consumed record before a task sees it.
//!
//! Per record, the route of its topic decides:
//!
//! * a **task input** ([`Route::Task`]): decoded, and queued for task *p*;
//! * a **re-keyed source** ([`Route::Rekey`]): re-keyed and forwarded
//!   unchanged (same wire-format bytes) to its repartition topic, stamped
//!   with its source partition's watermark, and done with here;
//! * a **shuffled input** ([`Route::Shuffled`]), a repartition topic or stage
//!   link: decoded and queued for task *p* with its writer's watermark;
//!   control records (headers only) queue the writer's watermark.
//!
//! What cannot be decoded goes to the dead-letter topic, and its place in
//! the task's queue is kept ([`Pending::Skipped`]), so that the input
//! position moves past it in order. The intake also keeps the input
//! positions the next commit takes, and the re-keyed sources' clocks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::counters::EngineCounters;
use crate::avro::{DecodeError, Registry};
use crate::collector::{Collector, Headers, TopicId};
use crate::task::{InputKind, Origin, Pending};
use crate::topology::{DecodeFn, RekeyFn};
use crate::watermark::{partition_watermark, Announcement};

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

/// A record the intake hands on: for the task of its partition, in input `slot`.
pub(crate) struct Admitted<I> {
    pub slot: usize,
    pub entry: Pending<I>,
    /// Key and value bytes as consumed, counted against the task's buffer.
    pub wire_bytes: usize,
}

/// The way in of one engine (see the module's documentation).
pub(crate) struct Intake<I> {
    inputs: Vec<InputRuntime<I>>,
    subscriptions: Vec<Subscription>,
    kinds: Vec<InputKind>,
    registry: Registry,
    dead_letters: TopicId,
    /// Whether records keep their value bytes, to be copied to the late
    /// topic if they turn out late.
    keeps_raw: bool,
    max_out_of_orderness: i64,
    shutdown: Arc<AtomicBool>,
    /// Next offset to consume, by (subscription, partition).
    positions: FxHashMap<(usize, i32), i64>,
    /// At-least-once only: records below these offsets are already in the
    /// restored state and are skipped.
    skip_below: FxHashMap<(usize, i32), i64>,
    /// By (input slot, source partition).
    upstream: FxHashMap<(usize, i32), UpstreamClock>,
}

/// What an [`Intake`] is built from.
pub(crate) struct IntakeParts<I> {
    pub inputs: Vec<InputRuntime<I>>,
    pub subscriptions: Vec<Subscription>,
    pub registry: Registry,
    pub dead_letters: TopicId,
    pub keeps_raw: bool,
    pub max_out_of_orderness: i64,
    pub shutdown: Arc<AtomicBool>,
}

impl<I> Intake<I> {
    pub fn new(parts: IntakeParts<I>) -> Self {
        Intake {
            kinds: parts.inputs.iter().map(|input| input.kind).collect(),
            inputs: parts.inputs,
            subscriptions: parts.subscriptions,
            registry: parts.registry,
            dead_letters: parts.dead_letters,
            keeps_raw: parts.keeps_raw,
            max_out_of_orderness: parts.max_out_of_orderness,
            shutdown: parts.shutdown,
            positions: FxHashMap::default(),
            skip_below: FxHashMap::default(),
            upstream: FxHashMap::default(),
        }
    }

    /// The topics this stage consumes.
    pub fn subscriptions(&self) -> &[Subscription] {
        &self.subscriptions
    }

    /// The kind of each input, by slot.
    pub fn kinds(&self) -> &[InputKind] {
        &self.kinds
    }

    /// The input slot that `subscription` feeds a task with, if it does.
    pub fn task_slot(&self, subscription: usize) -> Option<usize> {
        match self.subscriptions[subscription].route {
            Route::Task { slot } | Route::Shuffled { slot } => Some(slot),
            Route::Rekey { .. } => None,
        }
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

    /// Takes one consumed record: what goes on to a task, or `None` when it
    /// is done with here (below a skip floor, re-keyed, or a re-keyed
    /// source's undecodable record, dead-lettered).
    pub fn admit(
        &mut self,
        message: Incoming<'_>,
        collector: &mut Collector,
        counters: &mut EngineCounters,
    ) -> Option<Admitted<I>> {
        let Incoming {
            subscription,
            partition,
            offset,
            timestamp,
            ..
        } = message;
        counters.topics[subscription].consumed += 1;
        if let Some(timestamp) = timestamp {
            counters.handled.add(timestamp);
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
            return None;
        }
        let wire_bytes = message.key.map_or(0, <[u8]>::len) + message.value.map_or(0, <[u8]>::len);
        let (slot, entry) = match self.subscriptions[subscription].route {
            Route::Rekey { slot } => {
                self.positions.insert((subscription, partition), offset + 1);
                self.rekey(slot, message, collector, counters);
                return None;
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
                    let error = DecodeError::NotWireFormat("empty or null value".into());
                    self.dead_letter(&message, &error, collector, counters);
                    (slot, Pending::Skipped { origin })
                }
            },
            Route::Task { slot } | Route::Shuffled { slot } => match self.decode(slot, &message) {
                Ok((value, event_time)) => {
                    let key = message.key.map(|k| String::from_utf8_lossy(k).into_owned());
                    let raw = self
                        .keeps_raw
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
                    self.dead_letter(&message, &error, collector, counters);
                    (slot, Pending::Skipped { origin })
                }
            },
        };
        Some(Admitted {
            slot,
            entry,
            wire_bytes,
        })
    }

    fn decode(&mut self, slot: usize, message: &Incoming<'_>) -> Result<(I, i64), DecodeError> {
        check_key(message.key)?;
        let shutdown = &self.shutdown;
        (self.inputs[slot].decode)(&self.registry, message.value.unwrap_or_default(), &|| {
            shutdown.load(Ordering::Relaxed)
        })
    }

    /// Forwards a record of a re-keyed source to its repartition topic,
    /// stamped with the source partition's watermark including this record.
    fn rekey(
        &mut self,
        slot: usize,
        message: Incoming<'_>,
        collector: &mut Collector,
        counters: &mut EngineCounters,
    ) {
        if let Err(error) = check_key(message.key) {
            self.dead_letter(&message, &error, collector, counters);
            return;
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
                    self.dead_letter(&message, &error, collector, counters);
                    return;
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
            watermark: partition_watermark(max, self.max_out_of_orderness),
        };
        collector.push(
            rekeying.topic,
            None,
            Some(key.as_bytes()),
            message.value,
            Headers::Watermark(stamp),
        );
    }

    /// Copies an undecodable record to the dead-letter topic, with headers
    /// naming the error and where the record came from.
    fn dead_letter(
        &self,
        message: &Incoming<'_>,
        error: &DecodeError,
        collector: &mut Collector,
        counters: &mut EngineCounters,
    ) {
        let subscription = &self.subscriptions[message.subscription];
        tracing::warn!(
            topic = subscription.topic,
            partition = message.partition,
            offset = message.offset,
            %error,
            "undecodable record sent to the dead-letter topic"
        );
        let source_topic = collector.topic(&subscription.topic);
        collector.push_dead_letter(
            self.dead_letters,
            message.key,
            message.value,
            error.kind(),
            &error.to_string(),
            source_topic,
            message.partition,
            message.offset,
        );
        counters.topics[message.subscription].dead_lettered += 1;
    }

    /// Notes that a task is done with the record at `origin` of `partition`:
    /// the next commit takes the input past it.
    pub fn consumed_through(&mut self, origin: Origin, partition: i32) {
        self.positions
            .insert((origin.topic_index, partition), origin.offset + 1);
    }

    /// The next offset of every input partition taken so far, by
    /// (subscription, partition).
    pub fn positions(&self) -> impl Iterator<Item = ((usize, i32), i64)> + '_ {
        self.positions.iter().map(|(place, next)| (*place, *next))
    }

    /// Announces, to every partition of its repartition topic, the watermark
    /// of each source partition that moved: the readers of a partition that
    /// received none of its records learn of it this way. With `heartbeats`
    /// (an idle timeout), an active source announces even an unchanged one.
    pub fn announce_source_watermarks(&mut self, collector: &mut Collector, heartbeats: bool) {
        for ((slot, source), clock) in self.upstream.iter_mut() {
            let Some(max) = clock.max_event_time else {
                continue;
            };
            let watermark = partition_watermark(max, self.max_out_of_orderness);
            let moved = clock
                .announced
                .is_none_or(|announced| announced < watermark);
            let heartbeat = clock.active && heartbeats;
            if !moved && !heartbeat {
                continue;
            }
            let rekeying = self.inputs[*slot]
                .rekeying
                .as_ref()
                .expect("re-keyed input");
            let announcement = Announcement {
                source: *source as u32,
                watermark,
            };
            for partition in 0..rekeying.downstream_partitions {
                collector.push(
                    rekeying.topic,
                    Some(partition as i32),
                    None,
                    None,
                    Headers::Watermark(announcement),
                );
            }
            clock.announced = Some(watermark);
            clock.active = false;
        }
    }

    /// Skips records of `subscription`'s `partition` below `offset`: they are
    /// already in the state (at-least-once restarts).
    pub fn skip_below(&mut self, subscription: usize, partition: i32, offset: i64) {
        self.skip_below.insert((subscription, partition), offset);
    }

    /// Forgets `subscription`'s `partition`; returns its route.
    pub fn release(&mut self, subscription: usize, partition: i32) -> Route {
        self.positions.remove(&(subscription, partition));
        self.skip_below.remove(&(subscription, partition));
        let route = self.subscriptions[subscription].route;
        if let Route::Rekey { slot } = route {
            self.upstream.remove(&(slot, partition));
        }
        route
    }

    /// Forgets what was taken since the last commit: the inputs are rewound.
    pub fn roll_back(&mut self) {
        self.upstream.clear();
        self.positions.clear();
    }
}

/// A record key must be UTF-8 (processors see it as `&str`).
fn check_key(key: Option<&[u8]>) -> Result<(), DecodeError> {
    match key.map(std::str::from_utf8) {
        Some(Err(_)) => Err(DecodeError::NotWireFormat("record key is not UTF-8".into())),
        _ => Ok(()),
    }
}
