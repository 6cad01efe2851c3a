//! The processing core of a stage: routing, repartitioning, dead letters and
//! tasks, with no broker in sight.
//!
//! A consumed record ([`Incoming`]) takes one way down: the intake
//! (`intake.rs`) routes and decodes it, re-keys it or sends it to the
//! dead-letter topic; what goes on is queued in the task of its partition,
//! and the drain (`drain.rs`) runs the task's processor over what may go
//! now. Everything the stage writes goes into a [`Collector`], which leaves
//! the engine by one door, the [`Flush`] its caller hands in.
//!
//! Who drains the collector, and how commits reach Kafka, is the business of
//! `kafka_stage/` (the Kafka consumer, producer and transactions) or of
//! `crate::testing` (in-memory topics). The order of work is the same for
//! both, because it is this code.
//!
//! `commit.rs` prepares and settles commits; `lifecycle.rs` opens and closes
//! tasks; `counters.rs` holds what the engine counts and `snapshot.rs`
//! reports it as metrics; `kafka_stage/` runs the engine on a Kafka
//! consumer group.

mod commit;
mod counters;
mod drain;
mod intake;
mod job_gate;
pub(crate) mod kafka_stage;
mod lifecycle;
mod snapshot;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::collector::{Collector, TopicId};
use crate::output::OutputEncoder;
use crate::pool::WorkerPool;
use crate::processor::Processor;
use crate::task::{EventTimeSettings, Pending, Task};
#[cfg(feature = "test-utils")]
pub(crate) use counters::RecordCounts;
pub(crate) use counters::{EngineCounters, Timestamps, TopicCounts};
pub(crate) use drain::Flush;
use intake::Intake;
pub(crate) use intake::{Incoming, InputRuntime, IntakeParts, Rekeying, Route, Subscription};
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

/// The topics a stage writes besides its output and its dead letters
/// (which are the intake's).
pub(crate) struct SideTopics {
    pub late: Option<TopicId>,
    /// One changelog topic per store, by store index.
    pub changelogs: Vec<TopicId>,
}

pub(crate) struct Engine<P: Processor> {
    settings: EngineSettings,
    processor: P,
    /// The way in: routes, decoding, re-keying, dead letters, positions.
    intake: Intake<P::Input>,
    tasks: BTreeMap<i32, Task<P>>,
    /// Tasks set aside by a revocation of every partition (an eager
    /// rebalance), to run again as they are if the assignment that follows
    /// gives them back (see [`Engine::suspend_tasks`]).
    suspended: BTreeMap<i32, Task<P>>,
    collector: Collector,
    output: OutputEncoder,
    side: SideTopics,
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
    pub intake: IntakeParts<P::Input>,
    pub collector: Collector,
    pub output: OutputEncoder,
    pub side: SideTopics,
    pub clock: Clock,
    pub shutdown: Arc<AtomicBool>,
}

impl<P: Processor> Engine<P> {
    pub fn new(parts: EngineParts<P>) -> Self {
        let intake = Intake::new(parts.intake);
        let counters = EngineCounters {
            topics: vec![TopicCounts::default(); intake.subscriptions().len()],
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
            intake,
            tasks: BTreeMap::new(),
            suspended: BTreeMap::new(),
            collector: parts.collector,
            output: parts.output,
            side: parts.side,
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
        self.intake.subscriptions()
    }

    /// The index of the subscription to `topic`.
    pub fn subscription_index(&self, topic: &str) -> Option<usize> {
        self.subscriptions().iter().position(|s| s.topic == topic)
    }

    /// Whether records of `subscription` may carry watermark stamps (see
    /// [`Intake::carries_stamps`]).
    pub fn carries_stamps(&self, subscription: usize) -> bool {
        self.intake.carries_stamps(subscription)
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

    /// The one way down: the intake, the task's queue, the drain.
    fn handle_record(&mut self, message: Incoming<'_>, flush: Flush<'_>) -> anyhow::Result<()> {
        let partition = message.partition;
        let Some(admitted) = self
            .intake
            .admit(message, &mut self.collector, &mut self.counters)
        else {
            return Ok(());
        };
        self.enqueue(
            partition,
            admitted.slot,
            admitted.entry,
            admitted.wire_bytes,
        )?;
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
                self.subscriptions()[entry.origin().topic_index].topic
            );
        };
        task.enqueue(slot, entry, wire_bytes);
        Ok(())
    }
}
