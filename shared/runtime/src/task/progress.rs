//! A task's progress kept with its state: input positions, clocks and the
//! task watermark in the progress store, staged for each commit and loaded
//! back, with the timers, when the task opens or rolls back.

use std::marker::PhantomData;

use super::{InputKind, Task};
use crate::clock::Now;
use crate::processor::{DerivedTimers, Processor, StateView, TimerName};
use crate::state::store::TaskStore;
use crate::state::StoreIndex;
use crate::time::{InputClock, PartitionClock, NO_WATERMARK};
use crate::timers::{TaskTimers, TimerEntry, TimerSpill};
use crate::topology::PROGRESS_STORE;

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

/// The key of an input partition's next offset in the progress store.
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
    let index = store.index_of(PROGRESS_STORE).expect("progress store");
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
    /// (Re)loads timers and clocks from committed state.
    pub(super) fn load(&mut self, now: Now) -> anyhow::Result<()> {
        // Spilled timers belong to the queue being replaced.
        self.store.clear_spilled_timers()?;
        let store = &self.store;
        // A timer store needs a spilled timer's old time to delete its key.
        let exact = self.timer_store.is_some();
        let mut timers = TaskTimers::spilling(store.timer_budget(), exact, |domain| {
            Box::new(TimerSpill::of(store, domain))
        });
        match (self.timer_store, P::DERIVE_TIMERS) {
            (Some(timer_store), _) => self.store.for_each_committed(timer_store, |key, _| {
                let stored = TimerEntry::from_store_key(key)?;
                let name = P::Timers::from_name(stored.name).ok_or_else(|| {
                    anyhow::anyhow!(
                        "task {}: a stored timer is named '{}', which the processor does not know",
                        self.partition,
                        stored.name
                    )
                })?;
                timers.set(stored.domain, stored.key, name.name(), stored.time);
                Ok(())
            })?,
            (None, Some(derive)) => timers
                .bulk_load(|timers| {
                    derive(
                        &self.processor,
                        &StateView { store: &self.store },
                        &mut DerivedTimers {
                            timers,
                            _processor: PhantomData,
                        },
                    )
                })
                .map_err(|e| {
                    anyhow::anyhow!("task {}: deriving timers from state: {e:#}", self.partition)
                })?,
            (None, None) => unreachable!("a task whose timers are not derived has a timer store"),
        }
        timers.check()?;
        self.timers = timers;
        let now = now.instant;
        self.clocks.clear();
        for (slot, kind) in self.kinds.iter().enumerate() {
            let clock = match kind {
                InputKind::Direct => {
                    let mut clock = InputClock::direct(now);
                    if let Some(max) =
                        read_i64(&mut self.store, self.progress_store, &direct_key(slot))?
                    {
                        clock.observe(max, now);
                    }
                    clock
                }
                InputKind::Shuffled { writers } => {
                    let mut clock = InputClock::shuffled(*writers, now);
                    for source in 0..*writers {
                        let key = upstream_key(slot, source);
                        if let Some(wm) = read_i64(&mut self.store, self.progress_store, &key)? {
                            clock.announce(source, wm, now);
                        }
                    }
                    clock
                }
            };
            self.clocks.push(clock);
        }
        self.watermark = read_i64(&mut self.store, self.progress_store, TASK_WATERMARK_KEY)?
            .unwrap_or(NO_WATERMARK);
        self.clocks_dirty = false;
        Ok(())
    }

    /// Records the next offset of an input partition with the state, so that
    /// state and input position can be restored together.
    pub fn stage_position(&mut self, topic: &str, next_offset: i64) {
        self.store.put(
            self.progress_store,
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
                        self.progress_store,
                        direct_key(slot),
                        max.to_be_bytes().to_vec(),
                    );
                }
                PartitionClock::Direct {
                    max_event_time: None,
                } => {}
                PartitionClock::Shuffled { upstream } => {
                    for (source, wm) in upstream.iter().enumerate() {
                        if let Some(wm) = wm {
                            self.store.put(
                                self.progress_store,
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
                self.progress_store,
                TASK_WATERMARK_KEY.to_vec(),
                self.watermark.to_be_bytes().to_vec(),
            );
        }
        self.clocks_dirty = false;
    }
}
