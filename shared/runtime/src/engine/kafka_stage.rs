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

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, RebalanceProtocol,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Message, OwnedHeaders};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::{Engine, Incoming};
use crate::collector::{ChangelogPartition, Collector, Headers, RecordView};
use crate::config::ProcessingGuarantee;
use crate::delivery::{CommitError, Delivery, Generation, Outgoing, UNTRACKED};
use crate::metrics::{Phase, PhaseTimes, StageMetrics};
use crate::processor::Processor;
use crate::restore::{ChangelogReach, Restorer};
use crate::standby::ActiveTasks;
use crate::state::store::{StateResources, TaskStore};
use crate::task::stored_positions;
use crate::watermark::Announcement;

/// A stage's engine with its Kafka clients.
pub(crate) struct KafkaStage<P: Processor> {
    pub engine: Engine<P>,
    pub delivery: Delivery,
    pub restorer: Restorer,
    pub guarantee: ProcessingGuarantee,
    pub state_dir: PathBuf,
    /// The tasks open in this process, shared with the standby thread.
    pub active: Arc<ActiveTasks>,
    pub resources: StateResources,
    pub metrics: StageMetrics,
    /// Where the processing thread's time goes.
    pub phases: PhaseTimes,
    /// Owned partitions of the topics that feed tasks, by (subscription, partition).
    pub owned: HashSet<(usize, i32)>,
    /// Tasks of which only some partitions are owned (paused).
    pub incomplete: BTreeSet<i32>,
    /// Task input partitions paused because their task has
    /// [`MAX_BUFFERED`] records of them waiting (see [`Self::apply_backpressure`]).
    pub backpressured: HashSet<(usize, i32)>,
    /// An error raised inside a rebalance callback, surfaced by the loop.
    pub fatal: Option<anyhow::Error>,
    /// The sealed commit whose records are being acknowledged.
    pub in_flight: Option<SealedCommit>,
    /// After an assignment: the count of handled records past which the
    /// first commit is due at once, not a commit interval later. A new or
    /// restarted instance shows progress (and, exactly-once, its first
    /// outputs) as soon as it has processed something, instead of having
    /// spent its first interval on an empty commit before records arrived.
    /// Handled, not consumed: records a merge holds while it waits for the
    /// task's other input would make it a commit of nothing (sensor-fusion's
    /// first temperatures come ~100 ms before its first humidities).
    pub commit_once_handled: Option<u64>,
}

/// A commit sealed and sent, to finish once its records are acknowledged.
pub(crate) struct SealedCommit {
    generation: Generation,
    offsets: TopicPartitionList,
    sealed_at: Instant,
}

/// Bytes of held outputs (exactly-once, a commit in flight) past which the
/// thread stops processing and waits for the commit.
const MAX_HELD_BYTES: usize = 64 << 20;

/// Records of one task input consumed and waiting in the task (a merge
/// waiting for its other input, or a drain that yielded to a commit) past
/// which the input's partition is paused; it is resumed once half of them
/// are handled. Without this bound an input that runs ahead of a slow one
/// (a backlog beside a repartition topic, which delivers only as each
/// upstream transaction commits) would be read into memory whole.
///
/// Kafka Streams pauses at 1 000 (`buffered.records.per.partition`), but
/// librdkafka, unlike the Java consumer, drops what it has prefetched for a
/// partition when it is paused and fetches it again on resume; one fetch
/// brings up to 1 MiB per partition, ~20 000 small records. Measured at
/// 10 000: sensor-fusion, whose two inputs arrive in such fetches, fell
/// from ~420k to ~265k records/s. So the bound is far above a fetch and
/// acts only on a real backlog (~50–90 MiB of decoded orders at most).
const MAX_BUFFERED: usize = 100_000;

/// How long a task waits for its store while another thread of the process
/// still holds it: longer than a thread's commit and close take.
const STATE_LOCK_PATIENCE: Duration = Duration::from_secs(60);

/// The consumer context: rebalance callbacks reach the stage through it.
pub(crate) struct StageContext<P: Processor> {
    pub stage: Mutex<Option<KafkaStage<P>>>,
}

pub(crate) type GroupConsumer<P> = BaseConsumer<StageContext<P>>;

impl<P: Processor> ClientContext for StageContext<P> {}

impl<P: Processor> ConsumerContext for StageContext<P> {
    /// rdkafka's own sequence (before, (un)assign, after), except that an
    /// assignment names where each partition starts: its committed offset,
    /// or the beginning where none is committed. Left to librdkafka, a
    /// partition without a committed offset is reset to the beginning only
    /// after a fixed 100 ms backoff (`rd_kafka_offset_reset`,
    /// rdkafka_offset.c): a tenth of a second on every fresh start.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        partitions: &mut TopicPartitionList,
    ) {
        let assigning = err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS;
        let revoking = err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS;
        if assigning {
            start_at_committed(consumer, partitions);
        }
        let rebalance = if assigning {
            Rebalance::Assign(partitions)
        } else if revoking {
            Rebalance::Revoke(partitions)
        } else {
            Rebalance::Error(KafkaError::Rebalance(err.into()))
        };
        self.pre_rebalance(consumer, &rebalance);
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let applied = match (&rebalance, cooperative) {
            (Rebalance::Assign(list), true) => consumer.incremental_assign(list),
            (Rebalance::Assign(list), false) => consumer.assign(list),
            (_, true) => consumer.incremental_unassign(partitions),
            (_, false) => consumer.unassign(),
        };
        if let Err(error) = applied {
            tracing::warn!(%error, "applying a rebalance failed");
        }
        self.post_rebalance(consumer, &rebalance);
    }

    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(partitions) = rebalance {
            let mut guard = self.stage.lock().unwrap();
            if let Some(stage) = guard.as_mut() {
                if let Err(error) = stage.revoke(consumer, partitions) {
                    stage.fatal.get_or_insert(error);
                }
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(partitions) => {
                let mut guard = self.stage.lock().unwrap();
                if let Some(stage) = guard.as_mut() {
                    if let Err(error) = stage.assign(consumer, partitions) {
                        stage.fatal.get_or_insert(error);
                    }
                }
            }
            Rebalance::Error(error) => tracing::warn!(%error, "rebalance error"),
            Rebalance::Revoke(_) => {}
        }
    }
}

/// The Kafka headers of a collected record.
fn kafka_headers(record: &RecordView<'_>) -> Option<OwnedHeaders> {
    match record.headers {
        Headers::None => None,
        Headers::Watermark(announcement) => Some(announcement.to_headers()),
        Headers::DeadLetter(dead) => {
            let message = record.text(&dead.message);
            let partition = dead.partition.to_string();
            let offset = dead.offset.to_string();
            let fields = [
                ("dlq.error.kind", dead.error_kind),
                ("dlq.error.message", message),
                ("dlq.source.topic", record.topic_name(dead.source_topic)),
                ("dlq.source.partition", partition.as_str()),
                ("dlq.source.offset", offset.as_str()),
            ];
            Some(fields.into_iter().fold(
                OwnedHeaders::new_with_capacity(fields.len()),
                |headers, (key, value)| {
                    headers.insert(Header {
                        key,
                        value: Some(value),
                    })
                },
            ))
        }
    }
}

impl<P: Processor> KafkaStage<P> {
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
            },
            &mut |collector| send(collector, delivery, hold),
        )?;
        self.send_collected();
        Ok(())
    }

    /// Moves everything the engine collected into the producer's queue,
    /// unless it belongs to the transaction after the one in flight.
    fn send_collected(&mut self) {
        let hold = self.holds_output();
        send(&mut self.engine.collector, &mut self.delivery, hold);
    }

    /// Whether collected records must wait: they belong to the transaction
    /// after the one in flight.
    fn holds_output(&self) -> bool {
        self.in_flight.is_some() && self.delivery.is_transactional()
    }

    /// Serves delivery reports, lets time act, finishes the commit in flight
    /// if its records are acknowledged, and seals the next one when the
    /// interval has passed.
    pub fn tick(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        let started = Instant::now();
        self.delivery.poll();
        let hold = self.holds_output();
        let delivery = &mut self.delivery;
        self.engine
            .tick(&mut |collector| send(collector, delivery, hold))?;
        self.send_collected();
        self.phases.lap(Phase::Process, started);
        self.try_finish_commit(consumer)?;
        if self.in_flight.is_none() && self.commit_due() {
            if self.engine.has_work_to_commit() {
                self.seal_commit(consumer)?;
            } else {
                self.engine.skip_commit();
                self.publish_metrics();
            }
        }
        self.apply_backpressure(consumer)
    }

    /// Pauses each task input partition with [`MAX_BUFFERED`] records
    /// waiting in its task, and resumes those paused here once half of
    /// them are handled. (Partitions of incomplete tasks are paused for
    /// another reason and never counted here: their tasks buffer nothing.)
    fn apply_backpressure(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        let mut pause = Vec::new();
        let mut resume = Vec::new();
        for &key @ (subscription, partition) in &self.owned {
            let buffered = self.engine.buffered(subscription, partition);
            let paused = self.backpressured.contains(&key);
            if !paused && buffered >= MAX_BUFFERED {
                pause.push(key);
            } else if paused && buffered <= MAX_BUFFERED / 2 {
                resume.push(key);
            }
        }
        if !pause.is_empty() {
            consumer.pause(&self.partition_list(&pause))?;
            self.backpressured.extend(pause);
        }
        if !resume.is_empty() {
            consumer.resume(&self.partition_list(&resume))?;
            for key in resume {
                self.backpressured.remove(&key);
            }
        }
        Ok(())
    }

    /// Resumes every partition paused by [`Self::apply_backpressure`]: their
    /// buffered records are about to be dropped and read again.
    fn release_backpressure(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        let paused: Vec<(usize, i32)> = self.backpressured.drain().collect();
        if !paused.is_empty() {
            consumer.resume(&self.partition_list(&paused))?;
        }
        Ok(())
    }

    /// The topic partitions of (subscription, partition) `keys`.
    fn partition_list(&self, keys: &[(usize, i32)]) -> TopicPartitionList {
        let mut list = TopicPartitionList::new();
        for &(subscription, partition) in keys {
            list.add_partition(&self.engine.subscriptions()[subscription].topic, partition);
        }
        list
    }

    /// Whether the commit interval has passed, or this is the first commit
    /// after an assignment, records have been processed and no job is in
    /// flight (a commit waits for jobs: an early one would stop processing
    /// for them, which the interval's commit does only once per interval).
    fn commit_due(&self) -> bool {
        self.engine.commit_due()
            || self.commit_once_handled.is_some_and(|handled| {
                self.engine.handled_records() > handled && !self.engine.has_jobs()
            })
    }

    /// Whether the loop should stop taking records and call [`Self::tick`]:
    /// a commit is due, or held outputs have grown past their bound.
    pub fn wants_tick(&self) -> bool {
        match self.in_flight {
            // The first commit after an assignment waits for the tick after
            // the records at hand, not for the first of them.
            None => self.engine.commit_due(),
            Some(_) => self.engine.collector.held_bytes() > MAX_HELD_BYTES,
        }
    }

    /// Commits everything processed so far and waits for the outcome.
    pub fn commit(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        self.finish_commit(consumer)?;
        self.seal_commit(consumer)?;
        self.finish_commit(consumer)
    }

    /// Seals the work done so far and sends it: its changelog records and
    /// announcements go out; the commit finishes later.
    fn seal_commit(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        let sealed_at = Instant::now();
        self.commit_once_handled = None;
        let positions = self.engine.prepare_commit()?;
        self.send_collected();
        let generation = self.delivery.seal();
        let mut offsets = TopicPartitionList::new();
        for (subscription, partition, next) in positions {
            offsets.add_partition_offset(
                &self.engine.subscriptions()[subscription].topic,
                partition,
                Offset::Offset(next),
            )?;
        }
        self.in_flight = Some(SealedCommit {
            generation,
            offsets,
            sealed_at,
        });
        self.phases.lap(Phase::CommitPrepare, sealed_at);
        // Nothing to wait for: finish at once (an idle stage, say).
        self.try_finish_commit(consumer)
    }

    /// Finishes the commit in flight if its records are all acknowledged,
    /// or if held outputs have grown past their bound (waiting then).
    fn try_finish_commit(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        let Some(sealed) = &self.in_flight else {
            return Ok(());
        };
        let started = Instant::now();
        let ready = self.delivery.is_acknowledged(sealed.generation)
            || self.engine.collector.held_bytes() > MAX_HELD_BYTES;
        self.phases.lap(Phase::CommitFlush, started);
        if ready {
            self.finish_commit(consumer)?;
        }
        Ok(())
    }

    /// Finishes the commit in flight, if any, waiting for its records:
    /// offsets and transaction committed, state applied, held outputs sent
    /// (in the next transaction); or, if it fails, everything since the last
    /// good commit rolled back.
    fn finish_commit(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        let Some(mut sealed) = self.in_flight.take() else {
            return Ok(());
        };
        let group = consumer.group_metadata();
        let mut delivered = None;
        let result = self
            .delivery
            .commit(
                sealed.generation,
                &sealed.offsets,
                group.as_ref(),
                &mut self.phases,
            )
            .and_then(|()| {
                if self.delivery.is_transactional() || sealed.offsets.count() == 0 {
                    return Ok(());
                }
                // At-least-once: the changelog records are in; the offsets
                // say how far into the changelogs this commit reaches.
                let reach = delivered.insert(self.delivery.take_offsets());
                self.note_changelog_reach(&mut sealed.offsets, reach)
                    .map_err(|e| CommitError::Fatal(format!("{e:#}")))?;
                let started = Instant::now();
                let committed = consumer
                    .commit(&sealed.offsets, CommitMode::Sync)
                    .map_err(|e| CommitError::Aborted(format!("committing offsets: {e}")));
                self.phases.lap(Phase::CommitOffsets, started);
                committed
            });
        match result {
            Ok(()) => {
                let delivered = delivered.unwrap_or_else(|| self.delivery.take_offsets());
                let applying = Instant::now();
                self.engine.commit_succeeded(|changelog| {
                    delivered.get(&changelog.delivery_tag()).copied()
                })?;
                self.phases.lap(Phase::CommitApply, applying);
                self.send_collected();
            }
            Err(CommitError::Aborted(reason)) => {
                tracing::warn!(%reason, "commit aborted; rolling back to the last commit");
                self.engine.counters.commits_aborted += 1;
                self.roll_back(consumer)?;
            }
            Err(fatal @ CommitError::Fatal(_)) => return Err(fatal.into()),
        }
        self.engine.commit_finished(sealed.sealed_at);
        self.publish_metrics();
        Ok(())
    }

    /// Adds to each task input's offset in `offsets` the changelog offsets
    /// its task's stores reach with this commit (see
    /// [`crate::restore::ChangelogReach`]), `delivered` being this commit's
    /// changelog records.
    fn note_changelog_reach(
        &self,
        offsets: &mut TopicPartitionList,
        delivered: &HashMap<usize, i64>,
    ) -> anyhow::Result<()> {
        let reach = self.engine.changelog_reach(delivered)?;
        for mut element in offsets.elements() {
            let feeds_task = self
                .engine
                .subscription_index(element.topic())
                .is_some_and(|index| self.engine.subscriptions()[index].route.feeds_task());
            if let Some(reach) = reach.get(&element.partition()).filter(|_| feeds_task) {
                element.set_metadata(reach.to_metadata());
            }
        }
        Ok(())
    }

    fn publish_metrics(&self) {
        let mut snapshot = self.engine.snapshot();
        self.phases.export(&mut snapshot);
        snapshot.set(
            crate::metrics::TASKS_INCOMPLETE,
            vec![],
            self.incomplete.len() as f64,
        );
        self.metrics.publish(snapshot);
    }

    /// Returns every task to its last committed state and rewinds the
    /// consumer to the committed offsets.
    fn roll_back(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        self.engine.roll_back()?;
        self.release_backpressure(consumer)?;
        let committed = self.committed_offsets(consumer)?;
        for element in committed.elements() {
            let offset = match element.offset() {
                Offset::Offset(offset) => Offset::Offset(offset),
                _ => Offset::Beginning,
            };
            consumer.seek(
                element.topic(),
                element.partition(),
                offset,
                Duration::from_secs(10),
            )?;
        }
        Ok(())
    }

    /// The group's committed offsets, waiting while the broker is unreachable.
    fn committed_offsets(&self, consumer: &GroupConsumer<P>) -> anyhow::Result<TopicPartitionList> {
        loop {
            match consumer.committed(Duration::from_secs(10)) {
                Ok(offsets) => return Ok(offsets),
                Err(error) if !self.engine.shutdown_requested() => {
                    tracing::warn!(%error, "cannot read committed offsets yet; retrying");
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err(error) => anyhow::bail!("reading committed offsets: {error}"),
            }
        }
    }

    /// Final commit and flush on shutdown.
    pub fn close(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        self.commit(consumer)?;
        self.delivery.close();
        Ok(())
    }

    /// Takes newly assigned partitions: opens (and restores) every task whose
    /// partitions are now all here. A task of which only some partitions
    /// are here (an incremental rebalance moves them one by one) stays
    /// closed, its partitions paused, until the rest arrives.
    pub fn assign(
        &mut self,
        consumer: &GroupConsumer<P>,
        partitions: &TopicPartitionList,
    ) -> anyhow::Result<()> {
        self.metrics.set_ready(false);
        let mut touched: Vec<i32> = Vec::new();
        for element in partitions.elements() {
            let Some(index) = self.engine.subscription_index(element.topic()) else {
                continue;
            };
            if self.engine.subscriptions()[index].route.feeds_task() {
                self.owned.insert((index, element.partition()));
                touched.push(element.partition());
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for partition in touched {
            self.settle_task(consumer, partition)?;
        }
        self.publish_metrics();
        self.metrics.set_ready(true);
        self.commit_once_handled = Some(self.engine.handled_records());
        Ok(())
    }

    /// Opens task `partition` if all its partitions are owned and it is not
    /// open; pauses what is owned of it otherwise.
    fn settle_task(&mut self, consumer: &GroupConsumer<P>, partition: i32) -> anyhow::Result<()> {
        let task_topics = self.engine.task_topics();
        let owned: Vec<&String> = task_topics
            .iter()
            .filter(|(index, _)| self.owned.contains(&(*index, partition)))
            .map(|(_, topic)| topic)
            .collect();
        let mut list = TopicPartitionList::new();
        for topic in &owned {
            list.add_partition(topic, partition);
        }
        if owned.len() < task_topics.len() {
            if owned.is_empty() {
                return Ok(());
            }
            if self.incomplete.insert(partition) {
                tracing::warn!(
                    partition,
                    "this instance holds only some partitions of task {partition}; \
                     it does not process them until the rest is assigned"
                );
            }
            // Every owned one, also those that arrived after the first: a
            // record of a task that is not open has nowhere to go.
            consumer.pause(&list)?;
            return Ok(());
        }
        if self.incomplete.remove(&partition) {
            consumer.resume(&list)?;
        }
        if self.engine.has_task(partition) {
            return Ok(());
        }
        let started = Instant::now();
        self.active.set(partition, true);
        let store = self.open_store(consumer, partition)?;
        self.engine.open_task(partition, store)?;
        tracing::info!(
            partition,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "task ready"
        );
        Ok(())
    }

    /// Opens task `partition`'s store and brings it up to date.
    ///
    /// Local state is committed state, with the changelog offset each store
    /// reaches: replay each changelog past its checkpoint. Under
    /// exactly-once, to its end (read_committed). Under at-least-once, only
    /// as far as the last offset commit reaches (see [`ChangelogReach`]);
    /// local state that reaches further (offsets reset or expired) is
    /// dropped and rebuilt. Records below the input positions kept in state
    /// are then skipped instead of applied twice.
    fn open_store(
        &mut self,
        consumer: &GroupConsumer<P>,
        partition: i32,
    ) -> anyhow::Result<TaskStore> {
        let path = self.state_dir.join(format!("task-{partition}"));
        let mut store = self.open_task_store(&path)?;
        let task_topics = self.engine.task_topics();
        let names: Vec<&str> = task_topics.iter().map(|(_, name)| name.as_str()).collect();
        let at_least_once = self.guarantee == ProcessingGuarantee::AtLeastOnce;
        let mut reach = None;
        let mut replay = true;
        if at_least_once {
            let stores = self.engine.store_names().len();
            match committed_reach(consumer, &names, partition, stores)? {
                Some(committed) => {
                    let local = (0..stores)
                        .map(|index| store.checkpoint(index))
                        .collect::<anyhow::Result<Vec<_>>>()?;
                    if local
                        .iter()
                        .zip(&committed.0)
                        .any(|(local, committed)| local > committed)
                    {
                        tracing::info!(
                            partition,
                            "local state reaches past the last commit; rebuilding it"
                        );
                        store = self.wipe_store(store, &path)?;
                    }
                    reach = Some(committed);
                }
                None => {
                    let local = stored_positions(&mut store, &names)?;
                    if local.iter().any(Option::is_some) {
                        if self.behind_committed(consumer, &local, &names, partition)? {
                            tracing::info!(
                                partition,
                                "local state is behind the committed offsets; rebuilding it"
                            );
                            store = self.wipe_store(store, &path)?;
                        } else {
                            replay = false;
                        }
                    }
                }
            }
        }
        if replay {
            let changelogs = self.engine.changelog_topics();
            let restored =
                self.restorer
                    .restore(&mut store, &changelogs, partition, reach.as_ref())?;
            self.engine.count_restored(restored);
        }
        if at_least_once {
            for ((index, _), position) in task_topics
                .iter()
                .zip(stored_positions(&mut store, &names)?)
            {
                if let Some(position) = position {
                    self.engine.skip_below(*index, partition, position);
                }
            }
        }
        Ok(store)
    }

    /// At-least-once, when the committed offsets carry no changelog reach
    /// (an earlier version committed them): whether the group has committed
    /// past the input positions `local` of the local store. If not, the
    /// store (written in one batch with the positions it reflects) is
    /// trusted as it is and nothing is replayed; if so, it is rebuilt from
    /// the whole changelog.
    fn behind_committed(
        &self,
        consumer: &GroupConsumer<P>,
        local: &[Option<i64>],
        names: &[&str],
        partition: i32,
    ) -> anyhow::Result<bool> {
        let committed = committed_for(consumer, names, partition)?;
        Ok(local
            .iter()
            .zip(&committed)
            .any(|(local, committed)| committed.is_some_and(|c| local.is_none_or(|l| c > l))))
    }

    /// Deletes the store at `path` and opens it empty.
    fn wipe_store(&self, store: TaskStore, path: &Path) -> anyhow::Result<TaskStore> {
        drop(store);
        std::fs::remove_dir_all(path)?;
        self.open_task_store(path)
    }

    /// Opens the task store at `path`, waiting while the processing thread
    /// that had the task before still holds it (see
    /// [`TaskStore::open_when_unlocked`]).
    fn open_task_store(&self, path: &Path) -> anyhow::Result<TaskStore> {
        TaskStore::open_when_unlocked(
            path,
            self.engine.store_names(),
            &self.resources,
            STATE_LOCK_PATIENCE,
            &|| self.engine.shutdown_requested(),
        )
    }

    /// Commits, then closes the tasks that lose a partition; what they keep
    /// of their partitions is paused until the task is whole again.
    pub fn revoke(
        &mut self,
        consumer: &GroupConsumer<P>,
        partitions: &TopicPartitionList,
    ) -> anyhow::Result<()> {
        self.commit(consumer)?;
        // librdkafka keeps a partition's pause through its revocation: one
        // paused here (its task incomplete) and assigned back later would
        // never be fetched again. Resuming one that is not paused is a no-op.
        consumer.resume(partitions)?;
        // The tasks that lose a partition close and drop their buffers; the
        // others pause again at the next tick if they still need to.
        self.release_backpressure(consumer)?;
        let mut touched = Vec::new();
        for element in partitions.elements() {
            let Some(index) = self.engine.subscription_index(element.topic()) else {
                continue;
            };
            let partition = element.partition();
            self.engine.release(index, partition);
            if self.owned.remove(&(index, partition)) {
                touched.push(partition);
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for partition in touched {
            let task_topics = self.engine.task_topics();
            for (index, _) in &task_topics {
                self.engine.release(*index, partition);
            }
            // Records of the partitions kept were consumed into the closed
            // task's buffers but not processed: read them again from the
            // offsets just committed.
            let kept: Vec<&str> = task_topics
                .iter()
                .filter(|(index, _)| self.owned.contains(&(*index, partition)))
                .map(|(_, topic)| topic.as_str())
                .collect();
            let committed = if kept.is_empty() {
                Vec::new()
            } else {
                committed_for(consumer, &kept, partition)?
            };
            for (topic, committed) in kept.iter().zip(committed) {
                let offset = committed.map_or(Offset::Beginning, Offset::Offset);
                consumer.seek(topic, partition, offset, Duration::from_secs(10))?;
            }
            self.settle_task(consumer, partition)?;
            self.active.set(partition, self.engine.has_task(partition));
            if !self.owned.iter().any(|(_, p)| *p == partition) {
                self.incomplete.remove(&partition);
            }
        }
        self.publish_metrics();
        Ok(())
    }
}

/// The changelog reach of the group's last commit of task `partition`'s
/// input offsets (`topics`), at-least-once: nothing when no offset was ever
/// committed, `None` when the offsets carry no reach (an earlier version
/// committed them).
fn committed_reach<P: Processor>(
    consumer: &GroupConsumer<P>,
    topics: &[&str],
    partition: i32,
    stores: usize,
) -> anyhow::Result<Option<ChangelogReach>> {
    let committed = committed_list(consumer, topics, partition)?;
    let mut any_offset = false;
    let mut reach: Option<ChangelogReach> = None;
    for element in committed.elements() {
        if !matches!(element.offset(), Offset::Offset(_)) {
            continue;
        }
        any_offset = true;
        if let Some(found) = ChangelogReach::from_metadata(element.metadata(), stores) {
            reach = Some(match reach {
                Some(reach) => reach.furthest(found),
                None => found,
            });
        }
    }
    Ok(if any_offset {
        reach
    } else {
        Some(ChangelogReach::nothing(stores))
    })
}

/// Sets each of `partitions` to start at its committed offset, or at the
/// beginning (`auto.offset.reset` is always `earliest`) where none is
/// committed. Should the committed offsets not come, the list is left as it
/// is and librdkafka looks them up itself.
fn start_at_committed<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: &mut TopicPartitionList,
) {
    let committed = match consumer.committed_offsets(partitions.clone(), Duration::from_secs(30)) {
        Ok(committed) => committed,
        Err(error) => {
            tracing::warn!(%error, "reading the committed offsets of an assignment");
            return;
        }
    };
    for element in committed.elements() {
        let start = match element.offset() {
            Offset::Offset(offset) => Offset::Offset(offset),
            _ => Offset::Beginning,
        };
        // The partition is in the list: it was copied from it.
        let _ = partitions.set_partition_offset(element.topic(), element.partition(), start);
    }
}

/// The group's committed offsets of `topics` at `partition`.
fn committed_for<P: Processor>(
    consumer: &GroupConsumer<P>,
    topics: &[&str],
    partition: i32,
) -> anyhow::Result<Vec<Option<i64>>> {
    let committed = committed_list(consumer, topics, partition)?;
    Ok(topics
        .iter()
        .map(|topic| {
            match committed
                .find_partition(topic, partition)
                .map(|e| e.offset())
            {
                Some(Offset::Offset(offset)) => Some(offset),
                _ => None,
            }
        })
        .collect())
}

/// The group's committed offsets (with their metadata) of `topics` at
/// `partition`.
fn committed_list<P: Processor>(
    consumer: &GroupConsumer<P>,
    topics: &[&str],
    partition: i32,
) -> anyhow::Result<TopicPartitionList> {
    let mut request = TopicPartitionList::new();
    for topic in topics {
        request.add_partition(topic, partition);
    }
    Ok(consumer.committed_offsets(request, Duration::from_secs(30))?)
}

/// Records handled between two checks of timers, idleness and the commit interval.
const MAX_BATCH: usize = 1_000;

/// Runs the stage until `shutdown`, then commits and leaves the group. After
/// a failure the tasks hold uncommitted, possibly half-done work: the stage
/// is dropped unseen, so that leaving the group (whose revocation would
/// commit) commits nothing, and the next owner starts from the last commit.
pub(crate) fn run_stage<P: Processor>(
    consumer: GroupConsumer<P>,
    shutdown: &AtomicBool,
) -> anyhow::Result<()> {
    let result = process_until_shutdown(&consumer, shutdown);
    let closed = {
        let mut guard = consumer.context().stage.lock().unwrap();
        match &result {
            Ok(()) => guard
                .as_mut()
                .map_or(Ok(()), |stage| stage.close(&consumer)),
            Err(_) => {
                guard.take();
                Ok(())
            }
        }
    };
    // Leaving the group serves the revocation callback, which must find the
    // stage unlocked.
    consumer.unsubscribe();
    drop(consumer);
    result.and(closed)
}

/// Whether a consumer error ends the consumer for good: librdkafka's fatal
/// errors, and a static member fenced by another with its instance id.
/// Retrying those would only hang the thread.
fn is_fatal(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::Fatal | RDKafkaErrorCode::FencedInstanceId)
    )
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

/// The main loop. The stage's lock is never held while polling, because
/// rebalance callbacks run inside `poll` and take it.
fn process_until_shutdown<P: Processor>(
    consumer: &GroupConsumer<P>,
    shutdown: &AtomicBool,
) -> anyhow::Result<()> {
    let mut last_poll_error = None::<Instant>;
    while !shutdown.load(Ordering::Relaxed) {
        // Wait briefly for the first record, then take what is already there;
        // with a commit in flight, only as long as its acknowledgement takes;
        // not at all while buffered records are ready to go.
        let timeout = {
            let guard = consumer.context().stage.lock().unwrap();
            match guard.as_ref() {
                Some(stage) if stage.engine.has_backlog() => Duration::ZERO,
                Some(stage) if stage.in_flight.is_some() => Duration::from_millis(1),
                _ => Duration::from_millis(20),
            }
        };
        // The clock is read around the batch, not per record: `poll` is the
        // wait for its first record, `process` everything after it, the
        // non-blocking polls that take what is already fetched included.
        let wait_started = Instant::now();
        let mut polled = consumer.poll(timeout);
        let batch_started = Instant::now();
        let mut handled = 0;
        while let Some(result) = polled {
            let mut guard = consumer.context().stage.lock().unwrap();
            let stage = guard.as_mut().expect("stage present while running");
            if let Some(error) = stage.fatal.take() {
                return Err(error);
            }
            match result {
                Ok(message) => stage.handle(&message)?,
                Err(error) if is_fatal(&error) => {
                    anyhow::bail!("the Kafka consumer failed and cannot go on: {error}");
                }
                Err(error) => {
                    if last_poll_error.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                        tracing::warn!(%error, "consumer error (retrying)");
                        last_poll_error = Some(Instant::now());
                    }
                    break;
                }
            }
            handled += 1;
            if handled == MAX_BATCH || stage.wants_tick() {
                break;
            }
            // Rebalance callbacks run inside `poll` and take the lock.
            drop(guard);
            polled = consumer.poll(Duration::ZERO);
        }
        let mut guard = consumer.context().stage.lock().unwrap();
        let stage = guard.as_mut().expect("stage present while running");
        if let Some(error) = stage.fatal.take() {
            return Err(error);
        }
        stage.phases.add(
            Phase::Poll,
            batch_started.saturating_duration_since(wait_started),
        );
        stage.phases.lap(Phase::Process, batch_started);
        stage.tick(consumer)?;
    }
    tracing::info!("shutdown requested; committing and closing");
    Ok(())
}
