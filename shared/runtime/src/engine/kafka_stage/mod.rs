//! The engine on a Kafka consumer group: the poll loop, the producer that
//! drains the engine's collector, transactions, rebalances and restores.
//!
//! One thread owns everything mutable. It polls the stage's consumer, hands
//! each record to the [`Engine`], and moves what the engine collected into
//! the producer's queue after each record (no waiting: librdkafka sends in
//! the background). Every commit interval it commits outputs, changelogs and
//! input offsets together — one Kafka transaction under exactly-once — and
//! then applies the changes to RocksDB.
//!
//! A commit does not stop processing while its records are being
//! acknowledged (the longest part of it): the engine seals the work so far,
//! the thread goes on processing, and the commit finishes — offsets sent,
//! transaction committed, state applied — once the sealed records are
//! acknowledged. Under exactly-once the records of the work after the seal
//! wait in the collector meanwhile (they belong to the next transaction);
//! under at-least-once they go out at once.
//!
//! Rebalances arrive as consumer callbacks on the same thread (inside `poll`),
//! which is why the stage lives in the consumer context behind a mutex that
//! is never held across `poll`.
//!
//! The stage's work is split by concern: `rebalance` (assignments and
//! revocations), `ownership` (the task input partitions owned, held in part
//! or paused), `commit_in_flight` (sealing, finishing and rolling back a
//! commit), `run_loop` (the poll loop, ticks and back-pressure) and
//! `store_opening` (how a task's store is brought up to date).

mod commit_in_flight;
mod ownership;
mod rebalance;
mod run_loop;
mod state_updater;
mod store_opening;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::message::{BorrowedMessage, Header, Message, OwnedHeaders};
use rdkafka::Offset;
use rdkafka::TopicPartitionList;

pub(crate) use rebalance::{GroupConsumer, StageContext};
pub(crate) use run_loop::run_stage;

use crate::client::brokers::BrokerWatch;
use crate::client::statistics::ClientStatistics;
use crate::collector::{ChangelogPartition, Collector, Headers, RecordView};
use crate::config::ProcessingGuarantee;
use crate::delivery::{Delivery, Outgoing, UNTRACKED};
use crate::engine::{Engine, Incoming};
use crate::metrics::{self, PhaseTimes, Snapshot, StageActivity, StageMetrics, ThreadState};
use crate::processor::Processor;
use crate::restore::Restorer;
use crate::standby::ThreadTasks;
use crate::state::store::StateResources;
use crate::watermark::Announcement;
use commit_in_flight::SealedCommit;
use ownership::Ownership;
use state_updater::StateUpdater;
use store_opening::StoreOpener;

/// A stage's engine with its Kafka clients.
pub(crate) struct KafkaStage<P: Processor> {
    /// The stage's consumer group (its application id), for messages.
    group_id: String,
    engine: Engine<P>,
    delivery: Delivery,
    /// Opens tasks off this thread (see [`state_updater`]).
    updater: StateUpdater<P>,
    guarantee: ProcessingGuarantee,
    /// This thread's hold on the tasks open in this process, which the
    /// standby thread keeps its hands off.
    active: ThreadTasks,
    metrics: StageMetrics,
    /// Progress and restores as they happen, for `/healthz` and `/metrics`.
    activity: Arc<StageActivity>,
    /// The lag of each assigned input partition.
    input_lag: InputLag,
    /// Whether the consumer has dropped every broker.
    brokers: BrokerWatch,
    /// The consumer's last librdkafka statistics, which its context keeps.
    pub(super) consumer_statistics: Arc<ClientStatistics>,
    /// Where the processing thread's time goes.
    phases: PhaseTimes,
    /// The task input partitions owned, held in part, or paused for
    /// back-pressure (see [`Self::apply_backpressure`]).
    ownership: Ownership,
    /// An error raised inside a rebalance callback, surfaced by the loop.
    fatal: Option<anyhow::Error>,
    /// Whether the stage has made its final commit (the consumer closes).
    closed: bool,
    /// The sealed commit whose records are being acknowledged.
    in_flight: Option<SealedCommit>,
    /// After an assignment: the count of handled records past which the
    /// first commit is due at once, not a commit interval later. A new or
    /// restarted instance shows progress (and, exactly-once, its first
    /// outputs) as soon as it has processed something, instead of having
    /// spent its first interval on an empty commit before records arrived.
    /// Handled, not consumed: records a merge holds while it waits for the
    /// task's other input would make it a commit of nothing (sensor-fusion's
    /// first temperatures come ~100 ms before its first humidities).
    commit_once_handled: Option<u64>,
}

/// What a [`KafkaStage`] is built from; everything else starts empty.
pub(crate) struct KafkaStageParts<P: Processor> {
    pub group_id: String,
    pub engine: Engine<P>,
    pub delivery: Delivery,
    pub restorer: Restorer,
    pub guarantee: ProcessingGuarantee,
    pub state_dir: PathBuf,
    /// This thread's hold on the tasks open in this process.
    pub active: ThreadTasks,
    pub resources: StateResources,
    pub metrics: StageMetrics,
}

/// Bytes of held outputs (exactly-once, a commit in flight) past which the
/// thread stops processing and waits for the commit: a commit takes tens
/// of milliseconds, in which a thread produces a few MiB at most.
pub(crate) const MAX_HELD_BYTES: usize = 16 << 20;

/// The Kafka headers of a collected record.
fn kafka_headers(record: &RecordView<'_>) -> Option<OwnedHeaders> {
    match record.headers {
        Headers::None => None,
        Headers::Watermark(announcement) => Some(announcement.to_headers()),
        Headers::Changelog(format) => Some(crate::state::format::changelog_headers(*format)),
        Headers::DeadLetter(_) => {
            let fields = record.dead_letter_headers()?;
            Some(fields.iter().fold(
                OwnedHeaders::new_with_capacity(fields.len()),
                |headers, (key, value)| {
                    headers.insert(Header {
                        key,
                        value: Some(value.as_ref()),
                    })
                },
            ))
        }
    }
}

impl<P: Processor> KafkaStage<P> {
    /// The stage, with its state updater thread started.
    pub fn new(parts: KafkaStageParts<P>) -> anyhow::Result<Self> {
        let KafkaStageParts {
            group_id,
            engine,
            delivery,
            restorer,
            guarantee,
            state_dir,
            active,
            resources,
            metrics,
        } = parts;
        let opener = StoreOpener {
            state_dir,
            resources,
            restorer,
            guarantee,
            store_names: engine.store_names().to_vec(),
            changelogs: engine.changelog_topics(),
            task_topics: engine
                .task_topics()
                .into_iter()
                .map(|(_, topic)| topic)
                .collect(),
        };
        let updater = StateUpdater::start(opener)?;
        Ok(KafkaStage {
            group_id,
            engine,
            delivery,
            updater,
            guarantee,
            active,
            activity: metrics.activity(),
            metrics,
            input_lag: InputLag::default(),
            brokers: BrokerWatch::default(),
            consumer_statistics: Arc::default(),
            phases: PhaseTimes::default(),
            ownership: Ownership::default(),
            fatal: None,
            closed: false,
            in_flight: None,
            commit_once_handled: None,
        })
    }

    /// The stage's engine, to read from.
    pub fn engine(&self) -> &Engine<P> {
        &self.engine
    }

    /// Handles one consumed record.
    pub fn handle(&mut self, message: &BorrowedMessage<'_>) -> anyhow::Result<()> {
        let Some(subscription) = self.engine.subscription_index(message.topic()) else {
            return Ok(());
        };
        let announcement = if self.engine.carries_stamps(subscription) {
            message.headers().and_then(Announcement::from_headers)
        } else {
            None
        };
        let hold = self.holds_output();
        let delivery = &mut self.delivery;
        self.engine.handle(
            Incoming {
                subscription,
                partition: message.partition(),
                offset: message.offset(),
                key: message.key(),
                value: message.payload(),
                announcement,
                timestamp: message.timestamp().to_millis(),
            },
            &mut |collector| send(collector, delivery, hold),
        )
    }

    /// Moves everything the engine collected into the producer's queue,
    /// unless it must wait for the next seal (see [`Self::holds_output`]).
    fn send_collected(&mut self) {
        let hold = self.holds_output();
        let delivery = &mut self.delivery;
        self.engine
            .send_output(&mut |collector| send(collector, delivery, hold));
    }

    /// Whether collected records must wait for the next seal, under
    /// exactly-once: they belong to the transaction after the one in
    /// flight; or the stage runs jobs, whose commit may wait for them, and
    /// a record sent would open the transaction before that wait. Held
    /// until the seal, when no job is left, the transaction stays open
    /// only while its records are sent and acknowledged, however slow the
    /// jobs (a transaction open past `transaction.timeout.ms` is aborted
    /// by its coordinator, which fences the producer).
    fn holds_output(&self) -> bool {
        self.delivery.is_transactional()
            && (self.in_flight.is_some() || self.engine.runs_jobs_off_thread())
    }

    /// Whether the open transaction has been open for a quarter of
    /// `transaction.timeout.ms`: the commit is then due whatever the commit
    /// interval, so that a long `--commit-interval` or a slow stretch of
    /// processing does not keep it open until its coordinator aborts it.
    fn transaction_ages(&self) -> bool {
        self.in_flight.is_none()
            && self
                .delivery
                .transaction_age()
                .is_some_and(|age| age >= self.delivery.transaction_timeout() / 4)
    }

    /// Whether outputs held for the next seal have grown past their bound.
    fn holds_too_much(&self) -> bool {
        self.engine.held_output_bytes() > MAX_HELD_BYTES
    }

    /// The topic partitions of (subscription, partition) `keys`.
    fn partition_list(&self, keys: &[(usize, i32)]) -> TopicPartitionList {
        let mut list = TopicPartitionList::new();
        for &(subscription, partition) in keys {
            list.add_partition(&self.engine.subscriptions()[subscription].topic, partition);
        }
        list
    }

    fn publish_metrics(&self) {
        let mut snapshot = self.engine.snapshot();
        self.phases.export(&mut snapshot);
        self.delivery.export(&mut snapshot);
        self.consumer_statistics.export("consumer", &mut snapshot);
        self.input_lag.export(&mut snapshot);
        snapshot.add(metrics::REBALANCES, vec![], self.ownership.rebalances());
        snapshot.set(
            metrics::TASKS_INCOMPLETE,
            vec![],
            self.ownership.incomplete() as f64,
        );
        for partition in self.updater.opening() {
            snapshot.set(
                metrics::TASK_READY,
                vec![("task", partition.to_string())],
                0.0,
            );
        }
        for partition in self.engine.open_tasks() {
            snapshot.set(
                metrics::TASK_READY,
                vec![("task", partition.to_string())],
                1.0,
            );
        }
        self.thread_state().export(&mut snapshot);
        self.metrics.publish(snapshot);
    }

    fn thread_state(&self) -> ThreadState {
        if !self.updater.is_idle() {
            ThreadState::Restoring
        } else if self.ownership.waits_for_partitions() {
            ThreadState::Rebalancing
        } else {
            ThreadState::Running
        }
    }
}

/// Moves everything in `collector` into the producer's queue, unless `hold`.
fn send(collector: &mut Collector, delivery: &mut Delivery, hold: bool) {
    if hold {
        return;
    }
    collector.drain(|record| {
        delivery.send(Outgoing {
            topic: record.topic,
            partition: record.partition,
            key: record.key,
            payload: record.value,
            headers: kafka_headers(&record),
            tag: record
                .changelog
                .map_or(UNTRACKED, ChangelogPartition::delivery_tag),
        });
    });
}

/// How often the lag is read again: often enough for a scrape every 15 s
/// and for the liveness check, rarely enough to cost nothing.
const LAG_REFRESH: Duration = Duration::from_secs(1);

/// The consumer's lag on each input partition assigned to it: the
/// partition's end as the last fetch saw it (its high watermark, cached by
/// librdkafka: no request) minus the position handed to the stage.
#[derive(Debug, Default)]
pub(crate) struct InputLag {
    /// (topic, partition, records behind the end).
    partitions: Vec<(String, i32, i64)>,
    refreshed: Option<Instant>,
}

impl InputLag {
    /// Reads the lag again, at most every [`LAG_REFRESH`]. Partitions whose
    /// position or end is not known yet (nothing fetched) are left out.
    fn refresh<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) {
        if self
            .refreshed
            .is_some_and(|refreshed| refreshed.elapsed() < LAG_REFRESH)
        {
            return;
        }
        self.refreshed = Some(Instant::now());
        let Ok(positions) = consumer.position() else {
            return;
        };
        self.partitions = positions
            .elements()
            .into_iter()
            .filter_map(|element| {
                let (_, end) = crate::native_admin::cached_watermarks(
                    consumer.client(),
                    element.topic(),
                    element.partition(),
                )?;
                let lag = records_behind(element.offset(), end)?;
                Some((element.topic().to_string(), element.partition(), lag))
            })
            .collect();
        self.partitions.sort_unstable();
    }

    /// Whether records wait on any assigned partition.
    fn waits(&self) -> bool {
        self.partitions.iter().any(|&(_, _, lag)| lag > 0)
    }

    fn export(&self, snapshot: &mut Snapshot) {
        for (topic, partition, lag) in &self.partitions {
            snapshot.set(
                metrics::CONSUMER_LAG,
                vec![
                    ("topic", topic.clone()),
                    ("partition", partition.to_string()),
                ],
                *lag as f64,
            );
        }
    }
}

/// Records between `position` and `end` when both are known. The position
/// moves past transaction markers, so a partition read to its end is 0
/// behind; records of a transaction still open count.
fn records_behind(position: Offset, end: i64) -> Option<i64> {
    match position {
        Offset::Offset(position) if end >= 0 => Some((end - position).max(0)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::records_behind;
    use rdkafka::Offset;

    #[test]
    fn lag_is_known_once_the_position_and_the_end_are() {
        assert_eq!(records_behind(Offset::Offset(10_339), 38_043), Some(27_704));
        assert_eq!(records_behind(Offset::Offset(700), 700), Some(0));
        assert_eq!(
            records_behind(Offset::Offset(701), 700),
            Some(0),
            "never negative"
        );
        assert_eq!(
            records_behind(Offset::Invalid, 700),
            None,
            "nothing handed over yet"
        );
        assert_eq!(
            records_behind(Offset::Offset(5), -1001),
            None,
            "no fetch yet"
        );
    }
}
