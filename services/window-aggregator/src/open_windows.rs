//! The windows a key has open, and the one timer that closes them.
//!
//! Both stages keep, per key, the open windows' accumulators by window start
//! and a single `flush` timer at the end of the earliest open window. Windows
//! all have the same size, so ends come in start order: when the timer
//! fires, the windows ending at its time are handed out and the timer moves
//! to the next end. One timer per key, rather than
//! per window, keeps the timer queue as small as the number of active keys.
//!
//! A key has few windows open at once (about size / advance, plus what the
//! allowed disorder keeps open), so they are stored as one value: a record
//! costs one read and one write, and a flush needs no range scan.

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use streams_runtime::prelude::*;

use crate::accumulator::Accumulator;

streams_runtime::stores! {
    /// Open windows per key, by window start.
    pub OPEN_WINDOWS: ValueState<BTreeMap<i64, Accumulator>> = "open-windows";
}

streams_runtime::timer_names! {
    /// The timers of both stages.
    pub enum WindowTimer {
        /// A key's earliest open window ends.
        Flush = "flush",
    }
}

/// Window bookkeeping for windows of `size` milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct OpenWindows {
    pub size: i64,
}

impl OpenWindows {
    /// Applies `update` to `key`'s windows starting at each of `starts`
    /// (opening them if needed) and makes sure the flush timer fires by the
    /// earliest one's end.
    pub fn update<P: Processor<Timers = WindowTimer>>(
        &self,
        ctx: &mut Context<'_, P>,
        key: &str,
        starts: impl IntoIterator<Item = i64>,
        mut update: impl FnMut(&mut Accumulator),
    ) -> anyhow::Result<()> {
        let size = self.size;
        let apply = |slot: &mut Option<BTreeMap<i64, Accumulator>>| {
            let windows = slot.get_or_insert_with(BTreeMap::new);
            let mut earliest_end = None::<i64>;
            for start in starts {
                update(windows.entry(start).or_default());
                let end = start + size;
                earliest_end = Some(earliest_end.map_or(end, |e| e.min(end)));
            }
            if windows.is_empty() {
                *slot = None;
            }
            earliest_end
        };
        // A key has open windows exactly while its flush timer is set (see
        // `derive_timers`): without one there is nothing to read, and a new
        // key, most of them with many groups, costs no state lookup (which
        // misses the read cache and goes to RocksDB).
        let timer = ctx.timer(key, WindowTimer::Flush);
        let earliest_end = match timer {
            Some(_) => ctx.update(&OPEN_WINDOWS, key, apply)?,
            None => ctx.update_new(&OPEN_WINDOWS, key, apply)?,
        };
        let Some(earliest_end) = earliest_end else {
            return Ok(());
        };
        if timer.is_none_or(|at| at > earliest_end) {
            ctx.set_timer(key, WindowTimer::Flush, earliest_end);
        }
        Ok(())
    }

    /// Sets every key's flush timer from the open windows in `state`: it is
    /// always the end of the key's earliest open window (an update only
    /// moves it earlier, a flush re-arms it for the earliest window left, and
    /// a key without windows is deleted), so processors over open windows
    /// derive their timers instead of writing them to a changelog.
    pub fn derive_timers<P: Processor<Timers = WindowTimer>>(
        &self,
        state: &StateView<'_>,
        timers: &mut DerivedTimers<'_, P>,
    ) -> anyhow::Result<()> {
        // Only the windows' starts are read: the aggregates are skipped.
        state.for_each_as(&OPEN_WINDOWS, |key, windows: BTreeMap<i64, IgnoredAny>| {
            if let Some(start) = windows.keys().next() {
                timers.set_timer(key, WindowTimer::Flush, start + self.size);
            }
            Ok(())
        })
    }

    /// Removes every window of the timer's key that ends by the timer's time
    /// and hands it to `closed` (start, end, aggregate), earliest first; then
    /// sets the flush timer to the next open window's end.
    ///
    /// Windows ending later wait for their own firing even when the watermark
    /// has already passed them: the runtime fires the re-set timer within the
    /// same watermark advance, after every other key's earlier timers, so
    /// closed windows come out in end order across keys (timers of one task fire
    /// in time order; see docs/services/README.md), not key by key.
    pub fn flush<P: Processor<Timers = WindowTimer>>(
        &self,
        ctx: &mut Context<'_, P>,
        timer: &Timer<'_, WindowTimer>,
        mut closed: impl FnMut(&mut Context<'_, P>, i64, i64, Accumulator) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let WindowTimer::Flush = timer.name;
        let key = timer.key;
        let (ended, next_end) = ctx.update(&OPEN_WINDOWS, key, |slot| {
            let mut ended = Vec::new();
            let mut next_end = None;
            let Some(windows) = slot else {
                return (ended, next_end);
            };
            while let Some(entry) = windows.first_entry() {
                let start = *entry.key();
                let end = start + self.size;
                if end > timer.time {
                    next_end = Some(end);
                    break;
                }
                ended.push((start, end, entry.remove()));
            }
            if windows.is_empty() {
                *slot = None;
            }
            (ended, next_end)
        })?;
        for (start, end, window) in ended {
            closed(ctx, start, end, window)?;
        }
        if let Some(end) = next_end {
            ctx.set_timer(key, WindowTimer::Flush, end);
        }
        Ok(())
    }
}
