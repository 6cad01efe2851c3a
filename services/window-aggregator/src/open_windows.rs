//! The windows a key has open, and the one timer that closes them.
//!
//! Both stages keep, per key, a map from window start to [`Accumulator`] and
//! a single `flush` timer at the end of the earliest open window. Windows
//! all have the same size, so ends come in start order: when the timer
//! fires, every window that ended by the watermark is handed out in start
//! order and the timer moves to the next end. One timer per key, rather than
//! per window, keeps the timer queue as small as the number of active keys.

use serde::Serialize;
use streams_runtime::{Context, MapState};

use crate::accumulator::Accumulator;

/// Open windows per key, by window start.
pub const OPEN_WINDOWS: MapState<i64, Accumulator> = MapState::new("open-windows");

const FLUSH_TIMER: &str = "flush";

/// Window bookkeeping for windows of `size` milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct OpenWindows {
    pub size: i64,
}

impl OpenWindows {
    /// Applies `update` to `key`'s window starting at `start` (opening it if
    /// needed) and makes sure the flush timer fires by the window's end.
    pub fn update<O: Serialize>(
        &self,
        ctx: &mut Context<'_, O>,
        key: &str,
        start: i64,
        update: impl FnOnce(&mut Accumulator),
    ) -> anyhow::Result<()> {
        let mut window = ctx.map_get(&OPEN_WINDOWS, key, &start)?.unwrap_or_default();
        update(&mut window);
        ctx.map_put(&OPEN_WINDOWS, key, &start, &window)?;
        let end = start + self.size;
        if ctx.timer(key, FLUSH_TIMER).is_none_or(|at| at > end) {
            ctx.set_timer(key, FLUSH_TIMER, end);
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
        let watermark = ctx.watermark();
        for (start, window) in ctx.map_entries(&OPEN_WINDOWS, key)? {
            let end = start + self.size;
            if end > watermark {
                ctx.set_timer(key, FLUSH_TIMER, end);
                break;
            }
            ctx.map_remove(&OPEN_WINDOWS, key, &start);
            closed(ctx, start, end, window)?;
        }
        Ok(())
    }
}
