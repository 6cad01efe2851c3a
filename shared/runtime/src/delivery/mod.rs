//! Producing: outputs, changelogs, repartition and dead-letter records, with
//! transactions under exactly-once.
//!
//! Records go into librdkafka's queue without waiting (no await per record);
//! delivery reports are served in bulk by `poll`. Each record carries a small
//! opaque tag so that the delivery report of a changelog record tells which
//! changelog partition reached which offset, with no allocation.
//!
//! Records belong to *generations*, one per commit: [`Delivery::seal`] closes
//! the current one, and its commit waits only until that generation is
//! acknowledged, while the records of the next one may already be on their
//! way (at-least-once). The generation travels in the low bits of the tag.

mod fencing;
mod offsets_sender;
mod open_times;
mod producer;
mod reports;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, TopicPartitionList};

use crate::client::brokers::BrokerWatch;
use crate::metrics::{self, Phase, PhaseTimes, Snapshot};
pub(crate) use fencing::DepartedMemberFencer;
use offsets_sender::{OffsetsSender, Sent};
use open_times::OpenTimes;
pub use reports::{DeliveryReports, Generation, UNTRACKED};
use reports::{GENERATIONS, GENERATION_BITS};

/// How long aborting a transaction may take before the producer is replaced.
const ABORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause between two attempts to abort a transaction.
const ABORT_PAUSE: Duration = Duration::from_millis(500);

/// How a failed commit must be handled.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// The transaction was aborted (or at-least-once outputs failed): roll the
    /// tasks back to their last commit and go on.
    #[error("commit failed and was rolled back: {0}")]
    Aborted(String),
    /// The producer cannot continue and could not be recreated.
    #[error("fatal producer error: {0}")]
    Fatal(String),
}

/// The one producer of an instance.
///
/// A failure while sending (a transaction that cannot begin, a record the
/// queue refuses) is not returned to the processor: it is remembered, later
/// records of the interval are dropped, and the next [`Delivery::commit`]
/// fails, so that the caller rolls back and processes the interval again. A
/// producer left in a fatal state (e.g. after a broker restart in the middle
/// of a transaction) is replaced by a new one with the same transactional id.
pub struct Delivery {
    /// Shared only with a call of [`OffsetsSender`] in progress.
    producer: Arc<TransactionalProducer>,
    config: ClientConfig,
    transactional: bool,
    in_transaction: bool,
    send_failure: Option<String>,
    /// An abort failed: the transaction state is unknown, start afresh.
    abort_failed: bool,
    /// Under exactly-once, once started: see [`offsets_sender`].
    offsets_sender: Option<OffsetsSender>,
    /// The producer never returned from adding offsets to its transaction
    /// and is given up.
    stuck: bool,
    /// Whether the last failed commit was refused as fenced, with no
    /// commit since: fenced again, another running producer shares the id.
    fenced_last: bool,
    timeout: Duration,
    /// The generation records sent now belong to.
    generation: Generation,
    /// Records sent per generation.
    sent: [u64; GENERATIONS],
    /// When the open transaction began.
    transaction_began: Option<Instant>,
    /// When the commit of the open transaction was called: the warning
    /// about a long transaction tells the time before it (records still
    /// being sent) from the time in it (acknowledgements, offsets, commit).
    commit_called: Option<Instant>,
    /// The producer's `transaction.timeout.ms`.
    transaction_timeout: Duration,
    /// How long the last transactions stayed open.
    open_times: OpenTimes,
    /// Whether the producer has dropped every broker.
    brokers: BrokerWatch,
}

/// The producer of [`Delivery`] (transactional or not).
type TransactionalProducer = BaseProducer<DeliveryReports>;

/// One record to produce.
pub struct Outgoing<'a> {
    pub topic: &'a str,
    /// `None`: partition by murmur2 of the key, like the Java client.
    pub partition: Option<i32>,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    pub headers: Option<OwnedHeaders>,
    pub tag: usize,
}

/// What librdkafka may hold produced and unacknowledged for one producer,
/// in KiB (librdkafka: 1 GiB), a memory limit of its own beside
/// `--state-memory-limit` (docs/architecture.md, "Memory"): several commit
/// intervals of output at full speed; a full queue makes the stage wait
/// for acknowledgements.
const PRODUCER_QUEUE_KIB: &str = "16384";

impl Delivery {
    /// A producer; transactional (and initialised, fencing any previous
    /// incarnation) when `transactional_id` is set. The initialisation gives
    /// up once `shutdown` is set (a signal during start-up).
    pub fn new(
        mut config: ClientConfig,
        transactional_id: Option<&str>,
        shutdown: Option<&std::sync::atomic::AtomicBool>,
    ) -> anyhow::Result<Self> {
        crate::client::statistics::enable(&mut config);
        config
            .set("partitioner", "murmur2_random")
            .set("enable.idempotence", "true")
            .set("queue.buffering.max.messages", "1000000");
        // Defaults a `--kafka` setting overrides. How long a record may wait
        // for others to fill its batch: under exactly-once, results are read
        // only once the transaction commits, so a longer wait costs no
        // latency and saves broker work (a shorter wait cost records/s);
        // under at-least-once every millisecond shows in the reader's p99
        // (both measured: bench/results/2026-12-01-diary.md, "evening",
        // step 4).
        let linger_ms = if transactional_id.is_some() { "5" } else { "1" };
        for (key, value) in [
            ("linger.ms", linger_ms),
            ("compression.type", "lz4"),
            ("queue.buffering.max.kbytes", PRODUCER_QUEUE_KIB),
        ] {
            if config.get(key).is_none() {
                config.set(key, value);
            }
        }
        if let Some(id) = transactional_id {
            config.set("transactional.id", id);
            // Short, so that the open transaction of an instance that never
            // comes back holds read_committed readers back for 10 s at most.
            // No transaction waits for a processor's jobs, and one open for
            // a quarter of this is committed at once (docs/architecture.md,
            // "Forward progress"), so a slow external call needs no more.
            if config.get("transaction.timeout.ms").is_none() {
                config.set("transaction.timeout.ms", "10000");
            }
        }
        let transaction_timeout = config
            .get("transaction.timeout.ms")
            .and_then(|ms| ms.parse().ok())
            .map_or(Duration::MAX, Duration::from_millis);
        let timeout = Duration::from_secs(30);
        let transactional = transactional_id.is_some();
        let producer = Self::create(&config, transactional, timeout, shutdown)?;
        Ok(Delivery {
            producer: Arc::new(producer),
            config,
            transactional,
            in_transaction: false,
            send_failure: None,
            abort_failed: false,
            offsets_sender: None,
            stuck: false,
            fenced_last: false,
            timeout,
            generation: Generation(0),
            sent: [0; GENERATIONS],
            transaction_began: None,
            commit_called: None,
            transaction_timeout,
            open_times: OpenTimes::default(),
            brokers: BrokerWatch::default(),
        })
    }

    /// Replaces a producer that librdkafka declared unusable, retrying while
    /// the broker is unreachable (ten attempts); says whether it was
    /// unusable because another producer took its transactional id.
    fn replace_if_fatal(&mut self) -> Result<bool, CommitError> {
        let (reason, fenced) = match self.producer.client().fatal_error() {
            Some((code, reason)) => (reason, is_fencing(code)),
            None if self.abort_failed => ("a transaction could not be aborted".to_string(), false),
            None if self.stuck => (
                "librdkafka did not return from adding the offsets to the transaction".to_string(),
                false,
            ),
            None => return Ok(false),
        };
        tracing::warn!(%reason, "the producer failed fatally; replacing it");
        let mut attempts = 0;
        loop {
            match Self::create(&self.config, self.transactional, self.timeout, None) {
                Ok(producer) => {
                    self.producer = Arc::new(producer);
                    self.in_transaction = false;
                    self.transaction_began = None;
                    self.abort_failed = false;
                    self.stuck = false;
                    return Ok(fenced);
                }
                Err(error) if attempts < 10 => {
                    attempts += 1;
                    tracing::warn!(%error, attempts, "cannot recreate the producer yet");
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err(error) => {
                    return Err(CommitError::Fatal(format!("{reason}; recreating: {error}")))
                }
            }
        }
    }

    /// Whether outputs are committed in Kafka transactions.
    pub fn is_transactional(&self) -> bool {
        self.transactional
    }

    /// Queues one record, beginning a transaction first if needed. When the
    /// queue is full, serves delivery reports until there is room. A failure
    /// is reported by the next commit (see the type's documentation).
    pub fn send(&mut self, record: Outgoing<'_>) {
        if self.send_failure.is_some() {
            return;
        }
        if self.transactional && !self.in_transaction {
            if let Err(error) = self.begin_transaction() {
                self.send_failure = Some(format!("cannot begin a Kafka transaction: {error}"));
                return;
            }
        }
        let opaque = (record.tag << GENERATION_BITS) | self.generation.0;
        let mut base: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(record.topic, opaque);
        if let Some(partition) = record.partition {
            base = base.partition(partition);
        }
        if let Some(key) = record.key {
            base = base.key(key);
        }
        if let Some(payload) = record.payload {
            base = base.payload(payload);
        }
        if let Some(headers) = record.headers {
            base = base.headers(headers);
        }
        loop {
            match self.producer.send(base) {
                Ok(()) => {
                    self.sent[self.generation.0] += 1;
                    return;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                    base = returned;
                    self.producer.poll(Duration::from_millis(10));
                }
                Err((error, _)) => {
                    self.send_failure =
                        Some(format!("cannot produce to {}: {error}", record.topic));
                    return;
                }
            }
        }
    }

    /// Serves pending delivery reports without blocking.
    pub fn poll(&mut self) {
        self.producer.poll(Duration::ZERO);
        self.brokers.check(self.producer.client());
    }

    /// Closes the current generation for a commit: records sent from now on
    /// belong to the next one.
    pub fn seal(&mut self) -> Generation {
        let sealed = self.generation;
        let next = (sealed.0 + 1) % GENERATIONS;
        self.sent[next] = 0;
        self.producer.context().reported[next].store(0, Ordering::Relaxed);
        self.generation = Generation(next);
        sealed
    }

    /// Serves pending delivery reports and tells whether every record of
    /// `generation` has been reported.
    pub fn is_acknowledged(&self, generation: Generation) -> bool {
        self.producer.poll(Duration::ZERO);
        self.unreported(generation) == 0
    }

    fn unreported(&self, generation: Generation) -> u64 {
        let reported = self.producer.context().reported[generation.0].load(Ordering::Relaxed);
        self.sent[generation.0].saturating_sub(reported)
    }

    /// Waits for every record of `generation` to be acknowledged and its
    /// delivery report served; returns the first delivery failure since the
    /// last call.
    ///
    /// rdkafka's own `flush` polls in steps of 100 ms, which would put a floor
    /// of 100 ms under every commit; this waits in 1 ms steps instead.
    fn flush(&mut self, generation: Generation) -> Result<(), CommitError> {
        let deadline = Instant::now() + self.timeout;
        while !self.is_acknowledged(generation) {
            if Instant::now() >= deadline {
                return Err(CommitError::Aborted(format!(
                    "{} records not acknowledged within {:?}",
                    self.unreported(generation),
                    self.timeout
                )));
            }
            self.producer.poll(Duration::from_millis(1));
            self.brokers.check(self.producer.client());
        }
        if let Some(error) = self.producer.context().failure.lock().unwrap().take() {
            return Err(CommitError::Aborted(format!(
                "a record was not delivered: {error}"
            )));
        }
        Ok(())
    }

    /// Commits the sealed `generation` together with the input `offsets`.
    ///
    /// Under exactly-once, outputs and offsets commit in one transaction (the
    /// caller sends nothing of the next generation before this returns);
    /// else the generation is flushed here and the caller commits offsets
    /// afterwards.
    pub fn commit(
        &mut self,
        generation: Generation,
        offsets: &TopicPartitionList,
        group: Option<ConsumerGroupMetadata>,
        phases: &mut PhaseTimes,
    ) -> Result<(), CommitError> {
        // The open transaction, or the one this commit begins; whether it
        // outlived its timeout is told after the commit's waits.
        let began = self.transaction_began.unwrap_or_else(Instant::now);
        self.commit_called = Some(Instant::now());
        let result = self.try_commit(generation, offsets, group, phases);
        let outlived = self.transactional && began.elapsed() >= self.transaction_timeout;
        let mut fenced = false;
        if result.is_err() {
            if let Some(denied) = self.producer.context().denied.lock().unwrap().take() {
                return Err(CommitError::Fatal(format!(
                    "not authorized: {denied}; this user lacks the WRITE ACL on that topic \
                     (`<service> acls` lists what a service needs)"
                )));
            }
            self.send_failure = None;
            fenced = self.replace_if_fatal()?;
        }
        match result {
            // The coordinator aborted the transaction and bumped the
            // producer's epoch: "fenced" names this producer's own timeout,
            // not another instance. The new producer carries on from the
            // last commit.
            Err(CommitError::Fatal(reason)) if outlived => Err(CommitError::Aborted(format!(
                "{reason} (the transaction was open longer than transaction.timeout.ms, \
                 so its coordinator aborted it)"
            ))),
            // Another producer took this transactional id: the group dropped
            // this instance (cut off from the broker) and another instance
            // fenced it (`fencing`). Its tasks roll back; the consumer finds
            // out what it still owns when it rejoins. Fenced again before
            // any commit went through, a second live instance shares the id.
            Err(CommitError::Fatal(reason)) if fenced && !self.fenced_last => {
                self.fenced_last = true;
                Err(CommitError::Aborted(format!(
                    "{reason} (another producer initialised this transactional id: the group \
                     dropped this instance and fenced its transactions)"
                )))
            }
            Err(CommitError::Fatal(reason)) if fenced => Err(CommitError::Fatal(format!(
                "{reason}; fenced twice in a row: another running instance uses this \
                 transactional id (each instance needs its own --instance-id and state directory)"
            ))),
            Ok(()) => {
                self.fenced_last = false;
                Ok(())
            }
            other => other,
        }
    }

    /// How long the open transaction has been open.
    pub fn transaction_age(&self) -> Option<Duration> {
        self.transaction_began.map(|began| began.elapsed())
    }

    /// The producer's `transaction.timeout.ms` (unbounded without transactions).
    pub fn transaction_timeout(&self) -> Duration {
        self.transaction_timeout
    }

    fn try_commit(
        &mut self,
        generation: Generation,
        offsets: &TopicPartitionList,
        group: Option<ConsumerGroupMetadata>,
        phases: &mut PhaseTimes,
    ) -> Result<(), CommitError> {
        if let Some(failure) = self.send_failure.clone() {
            let error = CommitError::Aborted(failure);
            if self.transactional {
                self.abort_after(&error);
            }
            return Err(error);
        }
        if !self.transactional {
            let started = Instant::now();
            let flushed = self.flush(generation);
            phases.lap(Phase::CommitFlush, started);
            return flushed;
        }
        if !self.in_transaction {
            if offsets.count() == 0 {
                return Ok(());
            }
            self.begin_transaction().map_err(classify)?;
        }
        let started = Instant::now();
        let result = self.flush(generation).and_then(|()| {
            let flushed = phases.lap(Phase::CommitFlush, started);
            if offsets.count() > 0 {
                let group = group.ok_or_else(|| {
                    CommitError::Aborted("no consumer group metadata (not in a group)".into())
                })?;
                self.send_offsets(offsets, group)?;
            }
            let offsets_sent = phases.lap(Phase::CommitOffsets, flushed);
            let committed = self
                .producer
                .commit_transaction(self.timeout)
                .map_err(classify);
            phases.lap(Phase::CommitTransaction, offsets_sent);
            committed
        });
        if let Err(error) = result {
            self.abort_after(&error);
            return Err(error);
        }
        self.in_transaction = false;
        self.transaction_ended();
        Ok(())
    }

    /// Adds `offsets` to the open transaction, on the [`OffsetsSender`]'s
    /// thread. Past the transaction's own timeout the coordinator aborts it
    /// anyway, so that is as long as the call may take.
    fn send_offsets(
        &mut self,
        offsets: &TopicPartitionList,
        group: ConsumerGroupMetadata,
    ) -> Result<(), CommitError> {
        let sender = match &mut self.offsets_sender {
            Some(sender) => sender,
            empty => empty.insert(OffsetsSender::start().map_err(|e| {
                CommitError::Fatal(format!("cannot start the offsets thread: {e}"))
            })?),
        };
        let timeout = self.timeout.min(self.transaction_timeout);
        match sender.send(&self.producer, offsets, group, timeout) {
            Sent::Returned(outcome) => outcome.map_err(classify),
            Sent::Stuck => {
                self.offsets_sender = None;
                self.stuck = true;
                tracing::error!(
                    timeout_ms = timeout.as_millis() as u64,
                    "librdkafka did not return from adding the offsets to the transaction \
                     (confluentinc/librdkafka#5456); giving the producer up and replacing it"
                );
                Err(CommitError::Aborted(format!(
                    "adding the offsets to the transaction did not return within {timeout:?}"
                )))
            }
        }
    }

    fn begin_transaction(&mut self) -> Result<(), KafkaError> {
        self.producer.begin_transaction()?;
        self.in_transaction = true;
        self.transaction_began = Some(Instant::now());
        Ok(())
    }

    /// Counts how long the transaction that just ended stayed open, and
    /// warns when that came near the timeout past which the coordinator
    /// aborts it.
    fn transaction_ended(&mut self) {
        let called = self.commit_called.take();
        let Some(began) = self.transaction_began.take() else {
            return;
        };
        let open = began.elapsed();
        self.open_times.record(open);
        if open > self.transaction_timeout / 2 {
            let before_commit =
                called.map_or(open, |called| called.saturating_duration_since(began));
            tracing::warn!(
                open_ms = open.as_millis() as u64,
                before_commit_ms = before_commit.as_millis() as u64,
                committing_ms = open.saturating_sub(before_commit).as_millis() as u64,
                transaction_timeout_ms = self.transaction_timeout.as_millis() as u64,
                "a transaction stayed open for more than half of transaction.timeout.ms; \
                 past it the coordinator aborts the transaction and fences this producer"
            );
        }
    }

    /// Adds the transaction open times to `snapshot` (under exactly-once).
    pub fn export(&self, snapshot: &mut Snapshot) {
        (self.producer.context().statistics).export("producer", snapshot);
        if !self.transactional {
            return;
        }
        snapshot.set(
            metrics::TRANSACTION_OPEN_MAX,
            vec![],
            self.open_times.max.as_secs_f64(),
        );
        snapshot.set(
            metrics::TRANSACTION_OPEN,
            vec![("quantile", "0.99".to_string())],
            self.open_times.p99().as_secs_f64(),
        );
    }

    fn abort_after(&mut self, error: &CommitError) {
        self.in_transaction = false;
        self.transaction_ended();
        // A producer still inside a call cannot abort (librdkafka refuses a
        // second transactional call); its replacement's fencing aborts.
        if matches!(error, CommitError::Aborted(_))
            && !self.stuck
            && self.producer.client().fatal_error().is_none()
        {
            if let Err(abort_error) = self.abort_transaction() {
                tracing::warn!(error = %abort_error, "aborting the transaction failed");
                self.abort_failed = true;
            }
        }
        self.take_offsets();
        self.producer.context().failure.lock().unwrap().take();
    }

    /// Aborts the open transaction, retrying while the broker is unreachable,
    /// for [`ABORT_TIMEOUT`] in all. librdkafka can stay stuck in an abort after a
    /// broker restart ("retry call to resume" for minutes); giving up marks
    /// the producer for replacement, and the new one's `init_transactions`
    /// has the broker abort the transaction instead.
    fn abort_transaction(&self) -> Result<(), CommitError> {
        let deadline = Instant::now() + ABORT_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.producer.abort_transaction(left) {
                Ok(()) => return Ok(()),
                Err(KafkaError::Transaction(error))
                    if error.is_retriable() && Instant::now() + ABORT_PAUSE < deadline =>
                {
                    tracing::warn!(%error, "retrying the transaction abort");
                    std::thread::sleep(ABORT_PAUSE);
                }
                Err(error) => return Err(classify(error)),
            }
        }
    }

    /// The highest offsets delivered per tag since the last call.
    pub fn take_offsets(&self) -> HashMap<usize, i64> {
        std::mem::take(&mut *self.producer.context().offsets.lock().unwrap())
    }

    /// Flushes what is queued, for shutdown.
    pub fn close(&mut self) {
        let generation = self.seal();
        if let Err(error) = self.flush(generation) {
            tracing::warn!(%error, "producer did not flush before shutdown");
        }
    }
}

/// Whether a producer's fatal error says that another producer initialised
/// its transactional id.
fn is_fencing(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
    )
}

fn classify(error: KafkaError) -> CommitError {
    match &error {
        KafkaError::Transaction(inner) if inner.txn_requires_abort() => {
            CommitError::Aborted(error.to_string())
        }
        KafkaError::Transaction(inner) if inner.is_retriable() => {
            CommitError::Aborted(error.to_string())
        }
        _ => CommitError::Fatal(error.to_string()),
    }
}
