//! A task: one partition of every co-partitioned input, its processor
//! instance, its state, its clocks and its timers.
//!
//! The task applies SPEC.md's order of work for each record: (1) the lateness
//! check against the watermark as it was before the record, (2) the partition
//! clock and task watermark advance and every timer now due fires in time
//! order, (3) the record is processed.

use std::collections::{BTreeMap, VecDeque};
use std::marker::PhantomData;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use crate::output::Output;
use crate::processor::{Context, Processor, Record, Timer};
use crate::state::store::{StoreIndex, TaskStore};
use crate::time::{
    task_watermark, Idleness, InputClock, PartitionClock, TimerEntry, TimerQueue, NO_WATERMARK,
};
use crate::topology::{TIMER_STORE, WATERMARK_STORE};

/// How one input reaches a task.
#[derive(Debug, Clone, Copy)]
pub(crate) enum InputKind {
    /// Partition *p* of a source topic.
    Direct,
    /// Partition *p* of a repartition topic written by this many upstream tasks.
    Repartitioned { upstream_partitions: usize },
}

/// How event time advances: the same for every task of an instance.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventTimeSettings {
    pub max_out_of_orderness: i64,
    pub idleness: Idleness,
}

/// What the task borrows from the engine to run processor code.
pub(crate) struct TaskEnv<'a> {
    pub output: &'a mut Output,
    pub time: EventTimeSettings,
    /// Wall-clock time of this batch of work (read once, not per record).
    pub now: Instant,
    /// Set when the service is asked to stop.
    pub shutdown: &'a AtomicBool,
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
    },
    /// A watermark announcement from upstream task `source`.
    Announcement {
        source: usize,
        watermark: i64,
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
    timers: TimerQueue,
    clocks: Vec<InputClock>,
    kinds: Vec<InputKind>,
    watermark: i64,
    clocks_dirty: bool,
    timer_store: StoreIndex,
    watermark_store: StoreIndex,
    pub counters: BTreeMap<&'static str, u64>,
    buffers: Vec<VecDeque<Pending<P::Input>>>,
    blocked_since: Option<Instant>,
    /// The watermark last announced to the next stage, if the output is a
    /// stage link.
    pub announced: Option<i64>,
}

const TASK_WATERMARK_KEY: &[u8] = b"T";

fn direct_key(slot: usize) -> Vec<u8> {
    let mut key = vec![b'D'];
    key.extend_from_slice(&(slot as u16).to_be_bytes());
    key
}

fn upstream_key(slot: usize, source: usize) -> Vec<u8> {
    let mut key = vec![b'U'];
    key.extend_from_slice(&(slot as u16).to_be_bytes());
    key.extend_from_slice(&(source as u32).to_be_bytes());
    key
}

/// The key of an input partition's next offset in the watermark store.
fn position_key(topic: &str) -> Vec<u8> {
    let mut key = vec![b'P'];
    key.extend_from_slice(topic.as_bytes());
    key
}

/// The next input offset of each of `topics` (this task's partition) as
/// recorded with the state in `store`.
pub(crate) fn stored_positions(
    store: &mut TaskStore,
    topics: &[&str],
) -> anyhow::Result<Vec<Option<i64>>> {
    let index = store.index_of(WATERMARK_STORE).expect("watermark store");
    topics
        .iter()
        .map(|topic| read_i64(store, index, &position_key(topic)))
        .collect()
}

fn read_i64(store: &mut TaskStore, index: StoreIndex, key: &[u8]) -> anyhow::Result<Option<i64>> {
    Ok(store
        .read(index, key, |bytes| bytes.try_into().map(i64::from_be_bytes))?
        .transpose()?)
}

impl<P: Processor> Task<P> {
    /// A task over `store`, with timers and clocks loaded from it.
    pub fn open(
        partition: i32,
        processor: P,
        store: TaskStore,
        kinds: &[InputKind],
    ) -> anyhow::Result<Self> {
        let timer_store = store.index_of(TIMER_STORE).expect("timer store");
        let watermark_store = store.index_of(WATERMARK_STORE).expect("watermark store");
        let mut task = Task {
            partition,
            processor,
            store,
            timers: TimerQueue::default(),
            clocks: Vec::new(),
            kinds: kinds.to_vec(),
            watermark: NO_WATERMARK,
            clocks_dirty: false,
            timer_store,
            watermark_store,
            counters: BTreeMap::new(),
            buffers: kinds.iter().map(|_| VecDeque::new()).collect(),
            blocked_since: None,
            announced: None,
        };
        task.load()?;
        Ok(task)
    }

    /// (Re)loads timers and clocks from committed state.
    fn load(&mut self) -> anyhow::Result<()> {
        self.timers = TimerQueue::default();
        for (key, _) in self.store.scan_prefix(self.timer_store, &[])? {
            self.timers.load(TimerEntry::from_store_key(&key)?);
        }
        let now = Instant::now();
        self.clocks.clear();
        for (slot, kind) in self.kinds.iter().enumerate() {
            let clock = match kind {
                InputKind::Direct => {
                    let mut clock = InputClock::direct();
                    if let Some(max) =
                        read_i64(&mut self.store, self.watermark_store, &direct_key(slot))?
                    {
                        clock.observe(max, now);
                    }
                    clock
                }
                InputKind::Repartitioned {
                    upstream_partitions,
                } => {
                    let mut clock = InputClock::repartitioned(*upstream_partitions);
                    for source in 0..*upstream_partitions {
                        let key = upstream_key(slot, source);
                        if let Some(wm) = read_i64(&mut self.store, self.watermark_store, &key)? {
                            clock.announce(source, wm, now);
                        }
                    }
                    clock
                }
            };
            self.clocks.push(clock);
        }
        self.watermark = read_i64(&mut self.store, self.watermark_store, TASK_WATERMARK_KEY)?
            .unwrap_or(NO_WATERMARK);
        self.clocks_dirty = false;
        Ok(())
    }

    /// Queues a consumed entry of input `slot`.
    pub fn enqueue(&mut self, slot: usize, entry: Pending<P::Input>) {
        self.buffers[slot].push_back(entry);
    }

    /// The next entry to handle, if one may go now: the buffer head with the
    /// smallest event time once every input has something buffered, or once
    /// the task has waited `max_idle` for the empty ones.
    pub fn next_ready(
        &mut self,
        max_idle: Duration,
        now: Instant,
    ) -> Option<(usize, Pending<P::Input>)> {
        let mut best: Option<(usize, i64)> = None;
        let mut some_empty = false;
        for (slot, buffer) in self.buffers.iter().enumerate() {
            match buffer.front() {
                Some(head) if best.is_none_or(|(_, time)| head.order_time() < time) => {
                    best = Some((slot, head.order_time()));
                }
                Some(_) => {}
                None => some_empty = true,
            }
        }
        let (slot, time) = best?;
        if some_empty && time != i64::MIN {
            let since = *self.blocked_since.get_or_insert(now);
            if now.saturating_duration_since(since) < max_idle {
                return None;
            }
        } else if !some_empty {
            self.blocked_since = None;
        }
        self.buffers[slot].pop_front().map(|entry| (slot, entry))
    }

    /// Drops uncommitted changes and returns to the last committed state.
    pub fn rollback(&mut self) -> anyhow::Result<()> {
        self.buffers.iter_mut().for_each(VecDeque::clear);
        self.blocked_since = None;
        self.announced = None;
        self.store.discard_overlay();
        self.counters.clear();
        self.load()
    }

    /// The task watermark.
    pub fn watermark(&self) -> i64 {
        self.watermark
    }

    /// Number of pending timers.
    pub fn timers_pending(&self) -> usize {
        self.timers.len()
    }

    /// Handles one decoded record of input `slot`.
    pub fn handle_record(
        &mut self,
        env: &mut TaskEnv<'_>,
        slot: usize,
        key: Option<&str>,
        value: P::Input,
        event_time: i64,
    ) -> anyhow::Result<Outcome> {
        if self.processor.is_late(event_time, self.watermark) {
            return Ok(Outcome::Late);
        }
        self.clocks[slot].observe(event_time, env.now);
        self.clocks_dirty = true;
        self.advance(env)?;
        let record = Record {
            key,
            value,
            event_time,
        };
        self.with_processor(env, |processor, ctx| processor.process(ctx, record))?;
        Ok(Outcome::Processed)
    }

    /// Notes the watermark `watermark` announced by upstream task `source`
    /// through repartitioned input `slot`.
    pub fn handle_announcement(
        &mut self,
        env: &mut TaskEnv<'_>,
        slot: usize,
        source: usize,
        watermark: i64,
    ) -> anyhow::Result<()> {
        self.clocks[slot].announce(source, watermark, env.now);
        self.clocks_dirty = true;
        self.advance(env)
    }

    /// Lets wall-clock idleness move the watermark (only with an idle timeout).
    pub fn tick(&mut self, env: &mut TaskEnv<'_>) -> anyhow::Result<()> {
        if env.time.idleness.is_on() {
            self.advance(env)?;
        }
        Ok(())
    }

    /// Runs `call` with the processor and a context over this task's state.
    fn with_processor<R>(
        &mut self,
        env: &mut TaskEnv<'_>,
        call: impl FnOnce(&mut P, &mut Context<'_, P::Output>) -> R,
    ) -> R {
        let mut ctx = Context {
            store: &mut self.store,
            timers: &mut self.timers,
            timer_store: self.timer_store,
            watermark: self.watermark,
            output: env.output,
            counters: &mut self.counters,
            shutdown: env.shutdown,
            _output: PhantomData,
        };
        call(&mut self.processor, &mut ctx)
    }

    /// Recomputes the task watermark; if it moved forward, fires every timer
    /// now due, in time order.
    fn advance(&mut self, env: &mut TaskEnv<'_>) -> anyhow::Result<()> {
        let now = env.now;
        let candidate = task_watermark(
            &self.clocks,
            env.time.max_out_of_orderness,
            env.time.idleness,
            now,
        )
        .unwrap_or(NO_WATERMARK);
        if candidate <= self.watermark {
            return Ok(());
        }
        self.watermark = candidate;
        self.clocks_dirty = true;
        while let Some(entry) = self.timers.pop_due(self.watermark) {
            self.store.delete(self.timer_store, entry.store_key());
            let timer = Timer {
                key: &entry.key,
                name: &entry.name,
                time: entry.time,
            };
            self.with_processor(env, |processor, ctx| processor.on_timer(ctx, timer))?;
        }
        Ok(())
    }

    /// Records the next offset of an input partition with the state, so that
    /// state and input position can be restored together.
    pub fn stage_position(&mut self, topic: &str, next_offset: i64) {
        self.store.put(
            self.watermark_store,
            position_key(topic),
            next_offset.to_be_bytes().to_vec(),
        );
    }

    /// Writes the clocks into state, so that they commit with everything else.
    pub fn stage_clocks(&mut self) {
        if !self.clocks_dirty {
            return;
        }
        for (slot, clock) in self.clocks.iter().enumerate() {
            match &clock.clock {
                PartitionClock::Direct {
                    max_event_time: Some(max),
                } => {
                    self.store.put(
                        self.watermark_store,
                        direct_key(slot),
                        max.to_be_bytes().to_vec(),
                    );
                }
                PartitionClock::Direct {
                    max_event_time: None,
                } => {}
                PartitionClock::Repartitioned { upstream } => {
                    for (source, wm) in upstream.iter().enumerate() {
                        if let Some(wm) = wm {
                            self.store.put(
                                self.watermark_store,
                                upstream_key(slot, source),
                                wm.to_be_bytes().to_vec(),
                            );
                        }
                    }
                }
            }
        }
        if self.watermark != NO_WATERMARK {
            self.store.put(
                self.watermark_store,
                TASK_WATERMARK_KEY.to_vec(),
                self.watermark.to_be_bytes().to_vec(),
            );
        }
        self.clocks_dirty = false;
    }
}
