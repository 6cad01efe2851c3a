//! A task's progress kept with its state: input positions, clocks and the
//! task watermark in the progress store, staged for each commit and loaded
//! back, with the timers, when the task opens or rolls back.

use std::marker::PhantomData;

use super::{InputKind, Task};
use crate::clock::Now;
use crate::processor::{DerivedTimers, Processor, StateView, TimerName};
use crate::state::progress_layout::{
    direct_key, is_format_1_clock_key, position_key, upstream_key, StoredClocks, CLOCKS_KEY,
    TASK_WATERMARK_KEY,
};
use crate::state::store::TaskStore;
use crate::state::StoreIndex;
use crate::time::{InputClock, PartitionClock, NO_WATERMARK};
use crate::timers::{TaskTimers, TimerEntry, TimerSpill};
use crate::topology::PROGRESS_STORE;

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
        for spec in P::STORES.iter().filter(|spec| spec.key_filter) {
            let store = (self.store.index_of(spec.name))
                .ok_or_else(|| anyhow::anyhow!("store '{}' is not open", spec.name))?;
            self.store.filter_keys(store)?;
        }
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
        self.load_clocks(now.instant)
    }

    /// (Re)loads the clocks and the task watermark, from whichever layout
    /// of the progress store holds them (`state::progress_layout`).
    fn load_clocks(&mut self, now: std::time::Instant) -> anyhow::Result<()> {
        let one_entry = self
            .store
            .read(self.progress_store, CLOCKS_KEY, StoredClocks::decode)?
            .transpose()?;
        let has_one_entry = one_entry.is_some();
        let (format_1_clocks, format_1_keys) = self.read_format_1_clocks()?;
        let stored = one_entry.unwrap_or(format_1_clocks);
        self.stale_clock_keys = match self.store.write_format().number() {
            1 if has_one_entry => vec![CLOCKS_KEY.to_vec()],
            1 => Vec::new(),
            _ => format_1_keys,
        };
        self.clocks.clear();
        for (slot, kind) in self.kinds.iter().enumerate() {
            let clock = match kind {
                InputKind::Direct => {
                    let mut clock = InputClock::direct(now);
                    let max = stored.direct.iter().find(|(s, _)| usize::from(*s) == slot);
                    if let Some(&(_, max)) = max {
                        clock.observe(max, now);
                    }
                    clock
                }
                InputKind::Shuffled { writers } => {
                    let mut clock = InputClock::shuffled(*writers, now);
                    for &(s, source, wm) in &stored.upstream {
                        if usize::from(s) == slot && (source as usize) < *writers {
                            clock.announce(source as usize, wm, now);
                        }
                    }
                    clock
                }
            };
            self.clocks.push(clock);
        }
        self.watermark = stored.watermark.unwrap_or(NO_WATERMARK);
        // The next commit writes the clocks in this build's layout, which
        // deletes the other's.
        self.clocks_dirty = !self.stale_clock_keys.is_empty();
        Ok(())
    }

    /// The committed format-1 clock entries of the progress store, read
    /// and by key.
    fn read_format_1_clocks(&self) -> anyhow::Result<(StoredClocks, Vec<Vec<u8>>)> {
        let mut clocks = StoredClocks::default();
        let mut keys = Vec::new();
        self.store
            .for_each_committed(self.progress_store, |key, value| {
                if is_format_1_clock_key(key) {
                    clocks.add_format_1_entry(key, value)?;
                    keys.push(key.to_vec());
                }
                Ok(())
            })?;
        Ok((clocks, keys))
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

    /// Writes the clocks into state, so that they commit with everything
    /// else, in the layout of the format this build writes.
    pub fn stage_clocks(&mut self) -> anyhow::Result<()> {
        if !self.clocks_dirty {
            return Ok(());
        }
        for key in std::mem::take(&mut self.stale_clock_keys) {
            self.store.delete(self.progress_store, key);
        }
        let clocks = self.stored_clocks();
        match self.store.write_format().number() {
            1 => {
                let entries = clocks
                    .direct
                    .iter()
                    .map(|&(slot, max)| (direct_key(slot.into()), max))
                    .chain(clocks.upstream.iter().map(|&(slot, source, wm)| {
                        (upstream_key(slot.into(), source as usize), wm)
                    }))
                    .chain(clocks.watermark.map(|wm| (TASK_WATERMARK_KEY.to_vec(), wm)));
                for (key, value) in entries {
                    self.store
                        .put(self.progress_store, key, value.to_be_bytes().to_vec());
                }
            }
            _ => self
                .store
                .put(self.progress_store, CLOCKS_KEY.to_vec(), clocks.encode()?),
        }
        self.clocks_dirty = false;
        Ok(())
    }

    /// The clocks and the task watermark as the progress store keeps them.
    fn stored_clocks(&self) -> StoredClocks {
        let mut stored = StoredClocks {
            watermark: (self.watermark != NO_WATERMARK).then_some(self.watermark),
            ..StoredClocks::default()
        };
        for (slot, clock) in self.clocks.iter().enumerate() {
            let slot = slot as u16;
            match &clock.clock {
                PartitionClock::Direct {
                    max_event_time: Some(max),
                } => stored.direct.push((slot, *max)),
                PartitionClock::Direct {
                    max_event_time: None,
                } => {}
                PartitionClock::Shuffled { upstream } => {
                    for (source, wm) in upstream.iter().enumerate() {
                        if let Some(wm) = wm {
                            stored.upstream.push((slot, source as u32, *wm));
                        }
                    }
                }
            }
        }
        stored
    }
}
