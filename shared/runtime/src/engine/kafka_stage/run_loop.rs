//! The poll loop: records handed to the engine in batches, a tick between
//! batches (time acts, commits are sealed and finished), and back-pressure
//! on task inputs that run ahead.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::{send, GroupConsumer, KafkaStage};
use crate::metrics::Phase;
use crate::processor::Processor;

/// Memory of the records consumed and waiting in the tasks of one stage
/// thread (a merge waiting for its other input, or a drain that yielded to
/// a commit), split evenly among the task inputs it owns: an input past its
/// part is paused, and resumed once half of it is handled. Without this
/// bound an input that runs ahead of a slow one (a backlog beside a
/// repartition topic, which delivers only as each upstream transaction
/// commits) would be read into memory whole. A limit of its own, beside
/// `--state-memory-limit` (docs/architecture.md, "Memory").
///
/// Kafka Streams pauses at 1 000 records (`buffered.records.per.partition`),
/// but librdkafka, unlike the Java consumer, drops what it has prefetched
/// for a partition when it is paused and fetches it again on resume; one
/// fetch brings thousands of small records per partition. A bound near one
/// fetch cost sensor-fusion, whose two inputs arrive in such fetches, a
/// third of its records/s (bench/results/2026-12-01-diary.md, "evening",
/// step 2). So the bound is many
/// fetches (tens of thousands of records for one or two partitions) and
/// acts only on a real backlog.
pub(crate) const MERGE_BUFFER_BYTES: usize = 16 << 20;

/// Records handled between two checks of timers, idleness and the commit interval.
const MAX_BATCH: usize = 1_000;

impl<P: Processor> KafkaStage<P> {
    /// Serves delivery reports, lets time act, finishes the commit in flight
    /// if its records are acknowledged, and seals the next one when the
    /// interval has passed.
    pub(super) fn tick(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        self.install_opened(consumer)?;
        let started = Instant::now();
        self.delivery.poll();
        let hold = self.holds_output();
        let delivery = &mut self.delivery;
        self.engine
            .tick(&mut |collector| send(collector, delivery, hold))?;
        self.phases.lap(Phase::Process, started);
        self.try_finish_commit(consumer)?;
        // A due commit with jobs in flight waits for them here, not in the
        // seal: the loop goes on polling (the group keeps the member) while
        // the engine takes nothing new and runs their completions.
        if self.in_flight.is_none() && self.commit_due() && !self.engine.has_jobs() {
            if self.engine.has_work_to_commit() {
                self.seal_commit(consumer)?;
            } else {
                self.engine.skip_commit();
                self.publish_metrics();
            }
        }
        self.apply_backpressure(consumer)
    }

    /// Pauses each task input partition whose records waiting in its task
    /// fill its part of [`MERGE_BUFFER_BYTES`], and resumes those paused
    /// here once half of it is handled. (Partitions of incomplete tasks are
    /// paused for another reason and never counted here: their tasks buffer
    /// nothing.)
    pub(super) fn apply_backpressure(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        let mut pause = Vec::new();
        let mut resume = Vec::new();
        let part = MERGE_BUFFER_BYTES / self.ownership.owned().len().max(1);
        for &key @ (subscription, partition) in self.ownership.owned() {
            let buffered = self.engine.buffered_bytes(subscription, partition);
            let paused = self.ownership.is_backpressured(&key);
            if !paused && buffered >= part {
                pause.push(key);
            } else if paused && buffered <= part / 2 {
                resume.push(key);
            }
        }
        if !pause.is_empty() {
            consumer.pause(&self.partition_list(&pause))?;
            self.ownership.backpressure(pause);
        }
        if !resume.is_empty() {
            consumer.resume(&self.partition_list(&resume))?;
            for key in resume {
                self.ownership.relieve(&key);
            }
        }
        Ok(())
    }

    /// Resumes every partition paused by [`Self::apply_backpressure`]: their
    /// buffered records are about to be dropped and read again.
    pub(super) fn release_backpressure(
        &mut self,
        consumer: &GroupConsumer<P>,
    ) -> anyhow::Result<()> {
        let paused = self.ownership.relieve_all();
        if !paused.is_empty() {
            consumer.resume(&self.partition_list(&paused))?;
        }
        Ok(())
    }

    /// Whether the commit interval has passed, or this is the first commit
    /// after an assignment, records have been processed and no job is in
    /// flight (a commit waits for jobs: an early one would stop processing
    /// for them, which the interval's commit does only once per interval).
    pub(super) fn commit_due(&self) -> bool {
        self.engine.commit_due()
            || self.holds_too_much()
            || self.transaction_ages()
            || self.commit_once_handled.is_some_and(|handled| {
                self.engine.handled_records() > handled && !self.engine.has_jobs()
            })
    }

    /// Whether the loop should stop taking records and call [`Self::tick`]:
    /// a commit is due, or held outputs have grown past their bound.
    pub(super) fn wants_tick(&self) -> bool {
        match self.in_flight {
            // The first commit after an assignment waits for the tick after
            // the records at hand, not for the first of them.
            None => self.engine.commit_due() || self.holds_too_much() || self.transaction_ages(),
            Some(_) => self.holds_too_much(),
        }
    }
}

/// Runs the stage until `shutdown`, then commits and leaves the group. After
/// a failure (of the loop or of the final commit) the tasks hold
/// uncommitted, possibly half-done work: the stage is dropped unseen, so
/// that leaving the group (whose revocation would commit) commits nothing,
/// and the next owner starts from the last commit.
pub(crate) fn run_stage<P: Processor>(
    consumer: GroupConsumer<P>,
    shutdown: &AtomicBool,
) -> anyhow::Result<()> {
    let result = process_until_shutdown(&consumer, shutdown);
    let closed = {
        let mut guard = consumer.context().stage.lock().unwrap();
        let closed = match (&result, guard.as_mut()) {
            (Ok(()), Some(stage)) => stage.close(&consumer),
            _ => Ok(()),
        };
        // A failed close is a failure too: its commit stopped half-way (a
        // job that failed has already been taken from its task, with the
        // state its submission changed left behind), and the revocation
        // must not commit that.
        if result.is_err() || closed.is_err() {
            guard.take();
        }
        closed
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

/// What the user lacks when the consumer was refused for want of an ACL:
/// retrying cannot help, so the stage stops, naming the resource.
fn denied(error: &KafkaError, group: &str) -> Option<String> {
    let lacks = match error.rdkafka_error_code()? {
        RDKafkaErrorCode::GroupAuthorizationFailed => {
            format!("the READ ACL on consumer group {group}")
        }
        RDKafkaErrorCode::TopicAuthorizationFailed => {
            "the READ ACL on a topic it consumes".to_string()
        }
        RDKafkaErrorCode::TransactionalIdAuthorizationFailed => {
            format!("the WRITE ACL on the transactional ids {group}-*")
        }
        RDKafkaErrorCode::ClusterAuthorizationFailed => "an ACL on the cluster".to_string(),
        _ => return None,
    };
    Some(format!(
        "not authorized: this user lacks {lacks} ({error}); `<service> acls` lists what a \
         service needs"
    ))
}

/// The main loop. The stage's lock is never held while polling, because
/// rebalance callbacks run inside `poll` and take it.
fn process_until_shutdown<P: Processor>(
    consumer: &GroupConsumer<P>,
    shutdown: &AtomicBool,
) -> anyhow::Result<()> {
    let mut last_poll_error = None::<Instant>;
    let mut processed_before = 0;
    while !shutdown.load(Ordering::Relaxed) {
        // Wait briefly for the first record, then take what is already there;
        // with a commit in flight, only as long as its acknowledgement takes;
        // not at all while buffered records are ready to go.
        let timeout = {
            let guard = consumer.context().stage.lock().unwrap();
            match guard.as_ref() {
                Some(stage) if stage.engine.has_backlog() => Duration::ZERO,
                // A completion or an acknowledgement is awaited: come back soon.
                Some(stage) if stage.in_flight.is_some() || stage.engine.has_jobs() => {
                    Duration::from_millis(1)
                }
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
        let mut consumer_failed = false;
        while let Some(result) = polled {
            let mut guard = consumer.context().stage.lock().unwrap();
            let stage = guard.as_mut().expect("stage present while running");
            if let Some(error) = stage.fatal.take() {
                return Err(error);
            }
            match result {
                Ok(message) => stage.handle(&message)?,
                Err(error) => {
                    if let Some(lacking) = denied(&error, &stage.group_id) {
                        anyhow::bail!(lacking);
                    }
                    if is_fatal(&error) {
                        anyhow::bail!("the Kafka consumer failed and cannot go on: {error}");
                    }
                    if last_poll_error.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                        tracing::warn!(%error, "consumer error (retrying)");
                        last_poll_error = Some(Instant::now());
                    }
                    consumer_failed = true;
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
        // Progress (see `StageActivity`): records processed, not merely
        // consumed into a task that holds them.
        stage.input_lag.refresh(consumer);
        stage.brokers.check(consumer.client());
        let processed = stage.engine.handled_records();
        let input_waits = stage.input_lag.waits() || stage.engine.consumed_records() > processed;
        if processed != processed_before || consumer_failed || !input_waits {
            stage.activity.progressed();
        }
        processed_before = processed;
    }
    tracing::info!("shutdown requested; committing and closing");
    Ok(())
}
