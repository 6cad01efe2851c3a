//! A task: one partition of every co-partitioned input, its processor
//! instance, its state, its clocks and its timers.
//!
//! The task applies the order of work of docs/services/README.md for each
//! record: (1) the lateness check against the watermark as it was before the
//! record, (2) the partition clock and task watermark advance and every timer
//! now due fires in time order, (3) the record is processed.
//!
//! A record of a shuffled input (repartition topic or stage link) carries its
//! writer's watermark: the task judges lateness before taking it in, and
//! before processing lets it count only as far as the record's own event
//! time explains it (the advance the record would cause on its source
//! partition); the rest counts right after the record. So lateness and
//! timers do not depend on when upstream tasks commit, and a stamp that other
//! records pushed ahead cannot expire state the on-time record needs.
//!
//! What a task keeps of its progress in state (input positions, clocks, the
//! watermark), and how it loads that and its timers back, is in
//! `task/progress.rs`.

mod progress;

use std::collections::{BTreeMap, VecDeque};
use std::marker::PhantomData;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::TryRecvError;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Now;
use crate::collector::Collector;
use crate::output::OutputEncoder;
use crate::pool::WorkerPool;
use crate::processor::{Context, Processor, Record, Timer, TimerName};
use crate::state::store::TaskStore;
use crate::state::StoreIndex;
use crate::time::{task_watermark, Idleness, InputClock, NO_WATERMARK};
use crate::timers::{TaskTimers, TimeDomain, TimerEntry};
use crate::topology::{PROGRESS_STORE, TIMER_STORE};
use crate::watermark::{partition_watermark, Announcement};
pub(crate) use progress::stored_positions;

/// How one input reaches a task.
#[derive(Debug, Clone, Copy)]
pub(crate) enum InputKind {
    /// Partition *p* of a source topic.
    Direct,
    /// Partition *p* of an internal topic — a repartition topic or a stage
    /// link — written by this many upstream tasks, whose watermarks it carries.
    Shuffled { writers: usize },
}

/// How event time advances: the same for every task of an instance.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventTimeSettings {
    pub max_out_of_orderness: i64,
    pub idleness: Idleness,
}

/// What the task borrows from the engine to run processor code.
pub(crate) struct TaskEnv<'a> {
    pub collector: &'a mut Collector,
    pub output: &'a OutputEncoder,
    /// Whether results feed another stage (and so carry the task's watermark).
    pub feeds_stage: bool,
    pub time: EventTimeSettings,
    /// Wall-clock time of this batch of work (read once, not per record).
    pub now: Now,
    /// Set when the service is asked to stop.
    pub shutdown: &'a Arc<AtomicBool>,
    /// Where submitted jobs run.
    pub jobs: &'a WorkerPool,
}

/// Where a buffered entry came from: its topic (engine index) and offset.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin {
    pub topic_index: usize,
    pub offset: i64,
}

/// A consumed entry waiting for its turn in a task.
pub(crate) enum Pending<I> {
    /// A decoded record.
    Record {
        key: Option<String>,
        value: I,
        event_time: i64,
        origin: Origin,
        /// The original value bytes, kept only when late records are copied.
        raw: Option<Vec<u8>>,
        /// A shuffled input's record: its writer's watermark.
        stamp: Option<Announcement>,
    },
    /// A watermark announcement from an upstream task.
    Announcement {
        announcement: Announcement,
        origin: Origin,
    },
    /// A record already dead-lettered: only its offset remains to be passed.
    Skipped { origin: Origin },
}

impl<I> Pending<I> {
    /// Where the entry came from.
    pub fn origin(&self) -> Origin {
        match self {
            Pending::Record { origin, .. }
            | Pending::Announcement { origin, .. }
            | Pending::Skipped { origin } => *origin,
        }
    }

    /// The event time that orders this entry against other inputs' heads;
    /// entries that are not records go first.
    fn order_time(&self) -> i64 {
        match self {
            Pending::Record { event_time, .. } => *event_time,
            _ => i64::MIN,
        }
    }
}

/// Whether a record was processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Processed,
    Late,
}

pub(crate) struct Task<P: Processor> {
    pub partition: i32,
    processor: P,
    pub store: TaskStore,
    timers: TaskTimers,
    clocks: Vec<InputClock>,
    kinds: Vec<InputKind>,
    watermark: i64,
    clocks_dirty: bool,
    /// Progress entries in the clock layout this build does not write
    /// (`state::progress_layout`), found at load: deleted with the next
    /// staged clocks.
    stale_clock_keys: Vec<Vec<u8>>,
    /// Where timers are persisted; none if the processor derives them
    /// from state ([`Processor::DERIVE_TIMERS`]).
    timer_store: Option<StoreIndex>,
    progress_store: StoreIndex,
    pub counters: BTreeMap<&'static str, u64>,
    /// Per input, the entries consumed and waiting, each with what it is
    /// counted as in memory (see [`Task::enqueue`]).
    buffers: Vec<VecDeque<(Pending<P::Input>, usize)>>,
    /// Per input, the memory its waiting entries are counted as.
    buffered_bytes: Vec<usize>,
    /// Per input, since when a record of another input has been waiting for
    /// it (see [`Task::next_ready`]).
    waiting_since: Vec<Option<std::time::Instant>>,
    /// The watermark before the entry being handled: what results written
    /// meanwhile promise the next stage.
    stamp_watermark: i64,
    /// The watermark last announced to the next stage, if the output is a
    /// stage link.
    pub announced: Option<i64>,
    /// Jobs started and not yet completed, in submission order.
    in_flight: VecDeque<crate::processor::JobResult<P>>,
}

impl<P: Processor> Task<P> {
    /// A task over `store`, with timers and clocks loaded from it.
    pub fn open(
        partition: i32,
        processor: P,
        store: TaskStore,
        kinds: &[InputKind],
        now: Now,
    ) -> anyhow::Result<Self> {
        let timer_store = store.index_of(TIMER_STORE);
        let progress_store = store.index_of(PROGRESS_STORE).expect("progress store");
        let mut task = Task {
            partition,
            processor,
            store,
            timers: TaskTimers::in_memory(),
            clocks: Vec::new(),
            kinds: kinds.to_vec(),
            watermark: NO_WATERMARK,
            clocks_dirty: false,
            stale_clock_keys: Vec::new(),
            timer_store,
            progress_store,
            counters: BTreeMap::new(),
            buffers: kinds.iter().map(|_| VecDeque::new()).collect(),
            buffered_bytes: vec![0; kinds.len()],
            waiting_since: vec![None; kinds.len()],
            stamp_watermark: NO_WATERMARK,
            announced: None,
            in_flight: VecDeque::new(),
        };
        task.load(now)?;
        Ok(task)
    }

    /// Queues a consumed entry of input `slot`, which came as `wire_bytes`
    /// of key and value: it is counted as those (a decoded record's strings
    /// and bytes are about its wire size) and the entry itself.
    pub fn enqueue(&mut self, slot: usize, entry: Pending<P::Input>, wire_bytes: usize) {
        let bytes = std::mem::size_of::<Pending<P::Input>>() + wire_bytes;
        self.buffered_bytes[slot] += bytes;
        self.buffers[slot].push_back((entry, bytes));
    }

    /// The memory the entries of input `slot` consumed and not yet handled
    /// are counted as.
    pub fn buffered_bytes(&self, slot: usize) -> usize {
        self.buffered_bytes[slot]
    }

    /// Entries of every input consumed and not yet handled.
    pub fn buffered_total(&self) -> usize {
        self.buffers.iter().map(|buffer| buffer.len()).sum()
    }

    /// The next entry to handle, if one may go now: the buffer head with the
    /// smallest event time once every input has something buffered, or once
    /// the task has waited `max_idle` for each empty one.
    ///
    /// The wait is per input and starts over whenever that input has had a
    /// record: an input that delivered since the last wait ran out is waited
    /// for again. (One wait for the whole task, reset only when every input
    /// had something buffered at once, ran out once and then never again while
    /// records were taken as they came: the joiner then stopped merging
    /// altogether after any one-second stall.)
    pub fn next_ready(
        &mut self,
        max_idle: Duration,
        now: std::time::Instant,
    ) -> Option<(usize, Pending<P::Input>)> {
        let mut best: Option<(usize, i64)> = None;
        for (slot, buffer) in self.buffers.iter().enumerate() {
            if let Some((head, _)) = buffer.front() {
                self.waiting_since[slot] = None;
                if best.is_none_or(|(_, time)| head.order_time() < time) {
                    best = Some((slot, head.order_time()));
                }
            }
        }
        let (slot, time) = best?;
        if time != i64::MIN {
            let mut waiting = false;
            for (buffer, since) in self.buffers.iter().zip(&mut self.waiting_since) {
                if buffer.is_empty() {
                    let since = *since.get_or_insert(now);
                    waiting |= now.saturating_duration_since(since) < max_idle;
                }
            }
            if waiting {
                return None;
            }
        }
        let (entry, bytes) = self.buffers[slot].pop_front()?;
        self.buffered_bytes[slot] -= bytes;
        Some((slot, entry))
    }

    /// Drops the entries consumed and not yet handled: they will be read
    /// again from the committed offsets.
    fn drop_buffers(&mut self) {
        self.buffers.iter_mut().for_each(VecDeque::clear);
        self.buffered_bytes.fill(0);
        self.waiting_since.fill(None);
        self.announced = None;
    }

    /// Sets the task aside just after a commit, to run again as it is if
    /// the group gives it back: its timers, clocks and store are the
    /// committed state already, and what it had consumed past the commit is
    /// dropped. A task with jobs in flight holds work past the commit, and
    /// is refused.
    pub fn suspend(&mut self) -> bool {
        if self.has_jobs() || self.store.has_uncommitted() {
            return false;
        }
        self.drop_buffers();
        true
    }

    /// Drops uncommitted changes and returns to the last committed state.
    pub fn rollback(&mut self, now: Now) -> anyhow::Result<()> {
        self.in_flight.clear();
        self.drop_buffers();
        self.store.discard_uncommitted()?;
        self.counters.clear();
        self.load(now)
    }

    /// The task watermark.
    pub fn watermark(&self) -> i64 {
        self.watermark
    }

    /// Number of pending timers (both domains).
    pub fn timers_pending(&self) -> usize {
        self.timers.len()
    }

    /// Pending timers spilled to RocksDB, beyond the task's memory budget.
    pub fn timers_spilled(&self) -> usize {
        self.timers.spilled()
    }

    /// Handles one decoded record of input `slot`; `stamp` is the watermark
    /// its writer had reached (shuffled inputs only).
    ///
    /// Before an on-time record is processed, a stamp counts only as far as
    /// the record itself explains it (its event time minus the allowed
    /// out-of-orderness), which is the advance the record would cause on its
    /// source partition. The rest of the stamp comes from records its writer
    /// sent elsewhere; taken in before the record, it could fire the timers
    /// that drop the very state the on-time record needs (the joiner's
    /// orders), so it counts right after the record, as an announcement.
    pub fn handle_record(
        &mut self,
        env: &mut TaskEnv<'_>,
        slot: usize,
        key: Option<&str>,
        value: P::Input,
        event_time: i64,
        stamp: Option<Announcement>,
    ) -> anyhow::Result<Outcome> {
        if self.processor.is_late(event_time, self.watermark) {
            if let Some(announcement) = stamp {
                self.handle_announcement(env, slot, announcement)?;
            }
            return Ok(Outcome::Late);
        }
        self.stamp_watermark = self.watermark;
        let rest = match stamp {
            Some(announcement) => {
                let own = partition_watermark(event_time, env.time.max_out_of_orderness);
                let before = Announcement {
                    watermark: announcement.watermark.min(own),
                    ..announcement
                };
                self.take_announcement(slot, before, env);
                (announcement.watermark > own).then_some(announcement)
            }
            None => {
                self.clocks[slot].observe(event_time, env.now.instant);
                None
            }
        };
        self.clocks_dirty = true;
        self.advance(env)?;
        let record = Record {
            key,
            value,
            event_time,
        };
        self.with_processor(env, |processor, ctx| processor.process(ctx, record))?;
        if let Some(announcement) = rest {
            self.handle_announcement(env, slot, announcement)?;
        }
        Ok(Outcome::Processed)
    }

    /// Notes a watermark announced by an upstream task through shuffled input `slot`.
    pub fn handle_announcement(
        &mut self,
        env: &mut TaskEnv<'_>,
        slot: usize,
        announcement: Announcement,
    ) -> anyhow::Result<()> {
        self.stamp_watermark = self.watermark;
        self.take_announcement(slot, announcement, env);
        self.clocks_dirty = true;
        self.advance(env)
    }

    fn take_announcement(&mut self, slot: usize, announcement: Announcement, env: &TaskEnv<'_>) {
        self.clocks[slot].announce(
            announcement.source as usize,
            announcement.watermark,
            env.now.instant,
        );
    }

    /// Lets wall-clock time act: idleness may move the watermark (only with
    /// an idle timeout), and wall-clock timers now due fire.
    pub fn tick(&mut self, env: &mut TaskEnv<'_>) -> anyhow::Result<()> {
        self.stamp_watermark = self.watermark;
        if env.time.idleness.is_on() {
            self.advance(env)?;
        }
        self.timers.set_budget(self.store.timer_budget());
        while let Some(entry) = self.timers.pop_due(TimeDomain::WallClock, env.now.epoch_ms) {
            self.fire(env, TimeDomain::WallClock, entry)?;
        }
        self.timers.check()
    }

    /// Runs `call` with the processor and a context over this task's state,
    /// then starts the jobs it submitted.
    fn with_processor(
        &mut self,
        env: &mut TaskEnv<'_>,
        call: impl FnOnce(&mut P, &mut Context<'_, P>) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let stamp =
            (env.feeds_stage && self.stamp_watermark != NO_WATERMARK).then_some(Announcement {
                source: self.partition as u32,
                watermark: self.stamp_watermark,
            });
        let mut submitted = Vec::new();
        let mut ctx = Context {
            store: &mut self.store,
            timers: &mut self.timers,
            timer_store: self.timer_store,
            watermark: self.watermark,
            now_ms: env.now.epoch_ms,
            collector: env.collector,
            output: env.output,
            stamp,
            counters: &mut self.counters,
            shutdown: env.shutdown,
            submitted: &mut submitted,
            _processor: PhantomData,
        };
        let result = call(&mut self.processor, &mut ctx);
        for job in submitted {
            self.in_flight.push_back(env.jobs.run(job));
        }
        result.and_then(|()| self.timers.check())
    }

    /// Whether jobs of this task are still running or waiting to complete.
    pub fn has_jobs(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// Jobs of this task started and not yet completed.
    pub fn jobs_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Runs the completions of finished jobs, in submission order; with
    /// `wait`, waits for every job (before a commit).
    pub fn complete_jobs(&mut self, env: &mut TaskEnv<'_>, wait: bool) -> anyhow::Result<()> {
        while let Some(next) = self.in_flight.front() {
            let result = if wait {
                next.recv()
                    .map_err(|_| anyhow::anyhow!("a job of task {} was lost", self.partition))?
            } else {
                match next.try_recv() {
                    Ok(result) => result,
                    Err(TryRecvError::Empty) => return Ok(()),
                    Err(TryRecvError::Disconnected) => {
                        anyhow::bail!("a job of task {} was lost", self.partition)
                    }
                }
            };
            self.in_flight.pop_front();
            let completion = result?;
            self.stamp_watermark = self.watermark;
            self.with_processor(env, |processor, ctx| completion(processor, ctx))?;
        }
        Ok(())
    }

    /// Recomputes the task watermark; if it moved forward, fires every
    /// event-time timer now due, in time order.
    fn advance(&mut self, env: &mut TaskEnv<'_>) -> anyhow::Result<()> {
        let candidate = task_watermark(
            &self.clocks,
            env.time.max_out_of_orderness,
            env.time.idleness,
            env.now.instant,
        )
        .unwrap_or(NO_WATERMARK);
        if candidate <= self.watermark {
            return Ok(());
        }
        self.watermark = candidate;
        self.clocks_dirty = true;
        while let Some(entry) = self.timers.pop_due(TimeDomain::EventTime, self.watermark) {
            self.fire(env, TimeDomain::EventTime, entry)?;
        }
        self.timers.check()
    }

    /// Removes a due timer from state and hands it to the processor.
    fn fire(
        &mut self,
        env: &mut TaskEnv<'_>,
        domain: TimeDomain,
        entry: TimerEntry,
    ) -> anyhow::Result<()> {
        if let Some(timer_store) = self.timer_store {
            self.store.delete(timer_store, entry.store_key(domain));
        }
        let name =
            P::Timers::from_name(entry.name).expect("queued timer names are the processor's own");
        let timer = Timer {
            key: &entry.key,
            name,
            time: entry.time,
            domain,
        };
        self.with_processor(env, |processor, ctx| processor.on_timer(ctx, timer))
    }
}
