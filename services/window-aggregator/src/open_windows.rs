//! The windows a key has open, and the one timer that closes them.
//!
//! Both stages keep, per key, the open windows' accumulators by window start
//! and a single `flush` timer at the end of the earliest open window. Windows
//! all have the same size, so ends come in start order: when the timer
//! fires, every window that ended by the watermark is handed out in start
//! order and the timer moves to the next end. One timer per key, rather than
//! per window, keeps the timer queue as small as the number of active keys.
//!
//! A key has few windows open at once (about size / advance, plus what the
//! allowed disorder keeps open), so they are stored as one value: a record
//! costs one read and one write, and a flush needs no range scan.

use std::collections::BTreeMap;

use serde::Serialize;
use streams_runtime::{Context, ValueState};

use crate::accumulator::Accumulator;

/// Open windows per key, by window start.
pub const OPEN_WINDOWS: ValueState<BTreeMap<i64, Accumulator>> = ValueState::new("open-windows");

const FLUSH_TIMER: &str = "flush";

/// Window bookkeeping for windows of `size` milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct OpenWindows {
    pub size: i64,
}

impl OpenWindows {
    /// Applies `update` to `key`'s windows starting at each of `starts`
    /// (opening them if needed) and makes sure the flush timer fires by the
    /// earliest one's end.
    pub fn update<O: Serialize>(
        &self,
        ctx: &mut Context<'_, O>,
        key: &str,
        starts: impl IntoIterator<Item = i64>,
        mut update: impl FnMut(&mut Accumulator),
    ) -> anyhow::Result<()> {
        let mut windows = ctx.get(&OPEN_WINDOWS, key)?.unwrap_or_default();
        let mut earliest_end = None::<i64>;
        for start in starts {
            update(windows.entry(start).or_default());
            let end = start + self.size;
            earliest_end = Some(earliest_end.map_or(end, |e| e.min(end)));
        }
        let Some(earliest_end) = earliest_end else {
            return Ok(());
        };
        ctx.put(&OPEN_WINDOWS, key, &windows)?;
        if ctx
            .timer(key, FLUSH_TIMER)
            .is_none_or(|at| at > earliest_end)
        {
            ctx.set_timer(key, FLUSH_TIMER, earliest_end);
        }
        Ok(())
    }

    /// Removes every window of `key` that ended by the watermark and hands it
    /// to `closed` (start, end, aggregate), earliest first; then sets the
    /// flush timer to the next open window's end.
    pub fn flush<O: Serialize>(
        &self,
        ctx: &mut Context<'_, O>,
        key: &str,
        mut closed: impl FnMut(&mut Context<'_, O>, i64, i64, Accumulator) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let Some(mut windows) = ctx.get(&OPEN_WINDOWS, key)? else {
            return Ok(());
        };
        let watermark = ctx.watermark();
        while let Some(entry) = windows.first_entry() {
            let start = *entry.key();
            let end = start + self.size;
            if end > watermark {
                ctx.set_timer(key, FLUSH_TIMER, end);
                break;
            }
            closed(ctx, start, end, entry.remove())?;
        }
        ctx.put_or_delete(&OPEN_WINDOWS, key, Some(&windows).filter(|w| !w.is_empty()))
    }
}
