//! Rebalances: the consumer context through which librdkafka's callbacks
//! reach the stage, and what an assignment or a revocation does to tasks.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, RebalanceProtocol};
use rdkafka::error::KafkaError;
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::state_updater::OpenedTask;
use super::store_opening::{committed_list, offsets_in, CommittedInput};
use super::KafkaStage;
use crate::client::statistics::ClientStatistics;
use crate::config::ProcessingGuarantee;
use crate::engine::Engine;
use crate::processor::Processor;

/// The consumer context: rebalance callbacks reach the stage through it.
pub(crate) struct StageContext<P: Processor> {
    pub(super) stage: Mutex<Option<KafkaStage<P>>>,
    /// Apart from the stage: statistics arrive while the stage is in use.
    statistics: Arc<ClientStatistics>,
}

pub(crate) type GroupConsumer<P> = BaseConsumer<StageContext<P>>;

impl<P: Processor> ClientContext for StageContext<P> {
    fn stats(&self, statistics: Statistics) {
        self.statistics.record(&statistics);
    }
}

impl<P: Processor> StageContext<P> {
    /// The context of a consumer that runs `stage`.
    pub fn new(stage: KafkaStage<P>) -> Self {
        StageContext {
            statistics: stage.consumer_statistics.clone(),
            stage: Mutex::new(Some(stage)),
        }
    }

    /// Whether the stage has closed, or was dropped after a failure: the
    /// consumer is closing.
    fn closing(&self) -> bool {
        self.stage
            .lock()
            .unwrap()
            .as_ref()
            .is_none_or(|stage| stage.closed)
    }

    /// Reads the stage's engine (between polls: a rebalance holds the stage).
    pub fn with_engine<T>(&self, read: impl FnOnce(&Engine<P>) -> T) -> T {
        let guard = self.stage.lock().unwrap();
        read(guard.as_ref().expect("a built stage").engine())
    }
}

impl<P: Processor> ConsumerContext for StageContext<P> {
    /// rdkafka's own sequence (before, (un)assign, after), except that an
    /// assignment names where each partition starts: its committed offset,
    /// or its first offset where none is committed (see
    /// [`start_at_first_offsets`]). Left to librdkafka, a partition without
    /// a committed offset is reset to the beginning only after a fixed
    /// 100 ms backoff (`rd_kafka_offset_reset`, rdkafka_offset.c): a tenth
    /// of a second on every fresh start.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        partitions: &mut TopicPartitionList,
    ) {
        let assigning = err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS;
        let revoking = err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS;
        // An assignment that arrives while the consumer closes (a join was
        // under way at the shutdown) is applied and dropped: reading its
        // committed offsets would wait for a coordinator that is gone.
        let closing = self.closing();
        if assigning && !closing {
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
        match rebalance {
            Rebalance::Assign(_) if closing => {}
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
}

impl<P: Processor> KafkaStage<P> {
    /// Takes newly assigned partitions: asks the state updater to open (and
    /// restore) every task whose partitions are now all here, and returns at
    /// once. A task of which only some partitions are here (an incremental
    /// rebalance moves them one by one) stays closed, its partitions paused,
    /// until the rest arrives.
    pub(super) fn assign(
        &mut self,
        consumer: &GroupConsumer<P>,
        partitions: &TopicPartitionList,
    ) -> anyhow::Result<()> {
        self.metrics.set_ready(false);
        self.ownership.assignment();
        let mut touched: Vec<i32> = Vec::new();
        for element in partitions.elements() {
            let Some(index) = self.engine.subscription_index(element.topic()) else {
                continue;
            };
            if self.engine.subscriptions()[index].route.feeds_task() {
                self.ownership.take((index, element.partition()));
                touched.push(element.partition());
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for partition in touched {
            self.settle_task(consumer, partition)?;
        }
        for partition in self.engine.close_suspended() {
            self.active.set(partition, false);
        }
        self.publish_metrics();
        // Ready once every task asked for is open (see `install_opened`).
        self.metrics.set_ready(self.updater.is_idle());
        self.commit_once_handled = Some(self.engine.handled_records());
        Ok(())
    }

    /// Asks for task `partition` to be opened if all its partitions are
    /// owned and it is neither open nor opening; its partitions stay paused
    /// until it is open. Pauses what is owned of an incomplete task.
    pub(super) fn settle_task(
        &mut self,
        consumer: &GroupConsumer<P>,
        partition: i32,
    ) -> anyhow::Result<()> {
        let task_topics = self.engine.task_topics();
        let owned = self.ownership.owned_of(&task_topics, partition);
        let mut list = TopicPartitionList::new();
        for topic in &owned {
            list.add_partition(topic, partition);
        }
        if owned.len() < task_topics.len() {
            if owned.is_empty() {
                return Ok(());
            }
            if self.ownership.held_in_part(partition) {
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
        let was_incomplete = self.ownership.held_whole(partition);
        if self.engine.is_suspended(partition) {
            let committed = committed_for(consumer, &owned, partition)?;
            if !(self.engine).suspended_task_is_current(partition, &owned, &committed)? {
                tracing::warn!(
                    partition,
                    "task {partition} went on elsewhere while it was set aside: \
                     it opens again from its changelogs"
                );
                self.engine.close_suspended_task(partition);
            }
        }
        if self.engine.resume_task(partition) {
            tracing::info!(partition, "task resumed");
        }
        if self.engine.has_task(partition) {
            if was_incomplete {
                resume_fetching(consumer, &list)?;
            }
            return Ok(());
        }
        // Its records wait until the task is open (`install_opened`).
        consumer.pause(&list)?;
        if self.updater.is_opening(partition) {
            return Ok(());
        }
        self.active.set(partition, true);
        let committed = if self.guarantee == ProcessingGuarantee::AtLeastOnce {
            let stores = self.engine.store_names().len();
            Some(CommittedInput::read(consumer, &owned, partition, stores)?)
        } else {
            None
        };
        tracing::info!(partition, "opening task");
        self.updater
            .request(partition, committed, self.engine.task_opener());
        Ok(())
    }

    /// Runs the tasks the state updater has opened since the last call and
    /// resumes their partitions; the stage is ready once no task is left
    /// opening.
    pub(super) fn install_opened(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        let opened = self.updater.take_opened()?;
        if opened.is_empty() {
            return Ok(());
        }
        let task_topics = self.engine.task_topics();
        for OpenedTask {
            task,
            restored,
            positions,
            elapsed,
        } in opened
        {
            let partition = task.partition;
            self.engine.count_restored(restored);
            for ((index, _), position) in task_topics.iter().zip(positions) {
                if let Some(position) = position {
                    self.engine.skip_below(*index, partition, position);
                }
            }
            self.engine.install_task(task);
            let inputs: Vec<(usize, i32)> = task_topics
                .iter()
                .map(|(index, _)| (*index, partition))
                .collect();
            resume_fetching(consumer, &self.partition_list(&inputs))?;
            tracing::info!(
                partition,
                restored,
                elapsed_ms = elapsed.as_millis() as u64,
                "task ready"
            );
        }
        if self.updater.is_idle() {
            self.metrics.set_ready(true);
        }
        self.publish_metrics();
        Ok(())
    }

    /// Commits, then closes the tasks that lose a partition; what they keep
    /// of their partitions is paused until the task is whole again.
    pub(super) fn revoke(
        &mut self,
        consumer: &GroupConsumer<P>,
        partitions: &TopicPartitionList,
    ) -> anyhow::Result<()> {
        self.commit(consumer)?;
        // An eager rebalance takes every partition back, and the assignment
        // that follows mostly gives them back: the tasks wait for it as they
        // are, instead of closing and opening again (reloading their timers).
        // If the group gives one to another member meanwhile (this one's
        // assignment was lost: its session expired while the broker was
        // away), that one may go on and commit it: a task given back is
        // checked against the committed offsets before it runs again.
        if matches!(consumer.rebalance_protocol(), RebalanceProtocol::Eager) {
            let tasks = self.engine.suspend_tasks();
            tracing::info!(?tasks, "tasks set aside for the rebalance");
        }
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
            if self.ownership.give_up((index, partition)) {
                touched.push(partition);
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for partition in touched {
            // A task still opening stops; what it restored stays.
            self.updater.cancel(partition);
            let task_topics = self.engine.task_topics();
            for (index, _) in &task_topics {
                self.engine.release(*index, partition);
            }
            // Records of the partitions kept were consumed into the closed
            // task's buffers but not processed: read them again from the
            // offsets just committed.
            let kept = self.ownership.owned_of(&task_topics, partition);
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
            self.active.set(
                partition,
                self.engine.has_task(partition)
                    || self.engine.is_suspended(partition)
                    || self.updater.is_opening(partition),
            );
            self.ownership.forget_if_gone(partition);
        }
        self.ownership.revocation_done();
        self.publish_metrics();
        Ok(())
    }
}

/// How long an assignment retries reading its committed offsets (the
/// group's coordinator moving, or not known yet on a new cluster).
const COMMITTED_PATIENCE: Duration = Duration::from_secs(30);

/// Sets each of `partitions` to start at its committed offset, or at the
/// beginning (`auto.offset.reset` is always `earliest`) where none is
/// committed. A failed read ("not coordinator" while the coordinator
/// moves) is retried for up to [`COMMITTED_PATIENCE`]: an assignment
/// without offsets is left to librdkafka to look them up, and a partition
/// paused while it does (its task opening) was, in one run, never fetched
/// again. Should the offsets still not come, the list is left as it is.
fn start_at_committed<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: &mut TopicPartitionList,
) {
    let deadline = std::time::Instant::now() + COMMITTED_PATIENCE;
    let committed = loop {
        match consumer.committed_offsets(partitions.clone(), COMMITTED_PATIENCE) {
            Ok(committed) => break committed,
            Err(error) if std::time::Instant::now() < deadline => {
                tracing::warn!(%error, "reading the committed offsets of an assignment; retrying");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(error) => {
                tracing::warn!(%error, "reading the committed offsets of an assignment");
                return;
            }
        }
    };
    let mut uncommitted = TopicPartitionList::new();
    for element in committed.elements() {
        let start = match element.offset() {
            Offset::Offset(offset) => Offset::Offset(offset),
            _ => {
                uncommitted.add_partition(element.topic(), element.partition());
                Offset::Beginning
            }
        };
        // The partition is in the list: it was copied from it.
        let _ = partitions.set_partition_offset(element.topic(), element.partition(), start);
    }
    if uncommitted.count() > 0 {
        start_at_first_offsets(consumer, partitions, uncommitted);
    }
}

/// How long an assignment waits for the first offsets of its partitions
/// that have none committed, before it leaves them to librdkafka.
const FIRST_OFFSETS_PATIENCE: Duration = Duration::from_secs(10);

/// Sets each of `uncommitted` (in `partitions`, to start at the beginning)
/// to start at its first offset, looked up in one request.
///
/// Left as "the beginning", a partition's first offset is looked up by
/// librdkafka as its fetching starts, which is when its task's opening
/// pauses it: librdkafka drops the answer to a lookup that a pause
/// overtook, and asks again only after 500 ms. A partition assigned at an
/// offset needs no lookup (as on a restart, at its committed offset).
/// Where the lookup fails, the partition stays at "the beginning".
fn start_at_first_offsets<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: &mut TopicPartitionList,
    mut uncommitted: TopicPartitionList,
) {
    // ListOffsets by time, with the earliest-offset time (-2, which is how
    // librdkafka spells the beginning): each partition's log start.
    let first = uncommitted
        .set_all_offsets(Offset::Beginning)
        .and_then(|()| consumer.offsets_for_times(uncommitted, FIRST_OFFSETS_PATIENCE));
    let first = match first {
        Ok(first) => first,
        Err(error) => {
            tracing::debug!(%error, "looking up the first offsets of an assignment");
            return;
        }
    };
    for element in first.elements() {
        if let (Ok(()), Offset::Offset(offset)) = (element.error(), element.offset()) {
            let (topic, partition) = (element.topic(), element.partition());
            let _ = partitions.set_partition_offset(topic, partition, Offset::Offset(offset));
        }
    }
}

/// Resumes `partitions`, paused while their task opened, and wakes the
/// threads that fetch them.
///
/// librdkafka carries a resume out on its main thread; the broker thread
/// that fetches the partition, idle since the pause, sees it only at its
/// next wake-up, up to a second later (measured: launch to first commit
/// 1.3 s instead of 0.3). A request to the partition's leader wakes that
/// thread at once: a query of its offsets, sent without waiting for the
/// answer (which is dropped).
fn resume_fetching<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: &TopicPartitionList,
) -> anyhow::Result<()> {
    consumer.resume(partitions)?;
    for element in partitions.elements() {
        // Times out at once by design: the request is on its way.
        let _ = consumer.fetch_watermarks(element.topic(), element.partition(), Duration::ZERO);
    }
    Ok(())
}

/// The group's committed offsets of `topics` at `partition`.
fn committed_for<P: Processor>(
    consumer: &GroupConsumer<P>,
    topics: &[&str],
    partition: i32,
) -> anyhow::Result<Vec<Option<i64>>> {
    let committed = committed_list(consumer, topics, partition)?;
    Ok(offsets_in(&committed, topics, partition))
}
