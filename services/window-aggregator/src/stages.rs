//! The two stages and how they connect.
//!
//! * **partial** (one task per input partition): adds each order to every
//!   hopping window that contains it and has not ended by the watermark
//!   (Flink's rule; an order that fits no such window is late). When the
//!   task watermark reaches a window's end, the window's aggregate goes to
//!   the `window-partials` link, keyed by group (or at once, below).
//! * **final** (`<app-id>-final`): merges the partials of each window and
//!   emits the result once its watermark — the minimum of every partial
//!   task's announced watermark, that is of every input partition's —
//!   reaches the window's end.
//!
//! Without `--group-by` the link has one partition, so one final task sees
//! every partial (a global aggregate). With it, the link has the input's
//! partition count and each group's partials meet in one final task.
//! Pre-aggregating before the shuffle sends one record per window and group
//! per task instead of one per order and window: always without
//! `--group-by`, and with it only under `--pre-aggregate` (few groups). With
//! many groups each has about one order per window, so the partial stage
//! forwards each order's share of its open windows at once, as a partial of
//! one order, and keeps no state.
//!
//! A task sends a window's partial before it announces a watermark at or
//! past the window's end, so the final stage has every partial of a window
//! before its clock can close it. A partial's event time is its window's
//! last millisecond, which is therefore never late there.

use streams_runtime::prelude::*;
use streams_runtime::window::{hopping_starts, tumbling_start};

use crate::accumulator::Accumulator;
use crate::model::{MarketplaceOrder, OrderWindowCount, WindowPartial, WINDOW_PARTIAL_SCHEMA};
use crate::open_windows::{OpenWindows, WindowTimer, STORES};
use crate::settings::{GroupField, Settings, WindowShape};

const SERVICE: &str = "window-aggregator";
const LINK_NAME: &str = "window-partials";

/// Builds both stages from the flags.
pub fn pipeline(settings: Settings) -> anyhow::Result<Pipeline> {
    let shape = settings.window_shape()?;
    let link = match settings.group_by {
        None => StageLink::single_partition(LINK_NAME),
        Some(_) => StageLink::co_partitioned(LINK_NAME),
    };
    let partial_topology = Topology::feeding(SERVICE, link, WINDOW_PARTIAL_SCHEMA)
        .input(InputStream::new(
            &settings.input_topic,
            topic_schemas::ORDERS_MARKETPLACE,
            |order: &MarketplaceOrder| order.order_time,
            |order| order,
        )?)
        .max_out_of_orderness(settings.max_out_of_orderness);
    let final_topology = Topology::new(
        SERVICE,
        &settings.output_topic,
        topic_schemas::ORDER_WINDOW_COUNTS,
    )
    .input(InputStream::from_stage(
        link,
        WINDOW_PARTIAL_SCHEMA,
        |partial: &WindowPartial| partial.window_end - 1,
        |partial| partial,
    )?);
    let windows = OpenWindows { size: shape.size };
    Ok(Pipeline::new(
        settings.runtime,
        partial_topology,
        PartialAggregator {
            shape,
            group_by: settings.group_by,
            pre_aggregate: settings.group_by.is_none() || settings.pre_aggregate,
            windows,
        },
    )
    .then("final", final_topology, FinalAggregator { windows }))
}

/// The state and link key of a group: injective, and never null (a null
/// key would be spread over the link's partitions at random).
fn group_key(group: Option<&str>) -> String {
    group.map_or_else(String::new, |value| format!("={value}"))
}

/// The group of a [`group_key`].
fn group_of_key(key: &str) -> Option<&str> {
    key.strip_prefix('=')
}

/// Stage one: per-task aggregates of each window, or with `--group-by`
/// (unless `--pre-aggregate`) each order's share of its open windows as it
/// comes.
#[derive(Debug, Clone)]
pub struct PartialAggregator {
    shape: WindowShape,
    group_by: Option<GroupField>,
    /// Whether orders are summed in state until their windows end, rather
    /// than forwarded at once as partials of one order.
    pre_aggregate: bool,
    windows: OpenWindows,
}

impl Processor for PartialAggregator {
    type Input = MarketplaceOrder;
    type Output = WindowPartial;
    type Timers = WindowTimer;
    const STORES: &'static [StoreSpec] = STORES;

    fn process(
        &mut self,
        ctx: &mut Context<'_, Self>,
        record: Record<'_, MarketplaceOrder>,
    ) -> anyhow::Result<()> {
        let order = record.value;
        let key = group_key(self.group_by.and_then(|field| order.group(field)));
        let watermark = ctx.watermark();
        let size = self.shape.size;
        let open = hopping_starts(record.event_time, size, self.shape.advance)
            .filter(|start| start + size > watermark);
        if !self.pre_aggregate {
            // Sent before any watermark this task announces after the order,
            // so still before the window can close in the final stage.
            let mut window = Accumulator::default();
            window.add(&order);
            let group = group_of_key(&key).map(str::to_string);
            for start in open {
                ctx.emit(
                    Some(&key),
                    &window.to_partial(start, start + size, group.clone()),
                )?;
            }
            return Ok(());
        }
        self.windows
            .update(ctx, &key, open, |window| window.add(&order))
    }

    fn on_timer(
        &mut self,
        ctx: &mut Context<'_, Self>,
        timer: Timer<'_, WindowTimer>,
    ) -> anyhow::Result<()> {
        let group = group_of_key(timer.key);
        self.windows.flush(ctx, &timer, |ctx, start, end, window| {
            let partial = window.to_partial(start, end, group.map(str::to_string));
            ctx.emit(Some(timer.key), &partial)
        })
    }

    const DERIVE_TIMERS: Option<DeriveTimers<Self>> = Some(Self::derive_timers);

    /// Late when every window containing the order has ended by the watermark.
    fn is_late(&self, event_time: i64, watermark: i64) -> bool {
        let last_end = tumbling_start(event_time, self.shape.advance) + self.shape.size;
        watermark != NO_WATERMARK && last_end <= watermark
    }
}

impl PartialAggregator {
    /// Every pending timer, from committed state (see
    /// [`Processor::DERIVE_TIMERS`]).
    fn derive_timers(
        &self,
        state: &StateView<'_>,
        timers: &mut DerivedTimers<'_, Self>,
    ) -> anyhow::Result<()> {
        self.windows.derive_timers(state, timers)
    }
}

/// Stage two: merges partials and emits each window once.
#[derive(Debug, Clone)]
pub struct FinalAggregator {
    windows: OpenWindows,
}

impl Processor for FinalAggregator {
    type Input = WindowPartial;
    type Output = OrderWindowCount;
    type Timers = WindowTimer;
    const STORES: &'static [StoreSpec] = STORES;

    fn process(
        &mut self,
        ctx: &mut Context<'_, Self>,
        record: Record<'_, WindowPartial>,
    ) -> anyhow::Result<()> {
        let partial = record.value;
        let key = group_key(partial.group.as_deref());
        self.windows
            .update(ctx, &key, [partial.window_start], |window| {
                window.merge(&partial)
            })
    }

    fn on_timer(
        &mut self,
        ctx: &mut Context<'_, Self>,
        timer: Timer<'_, WindowTimer>,
    ) -> anyhow::Result<()> {
        let group = group_of_key(timer.key);
        self.windows.flush(ctx, &timer, |ctx, start, end, window| {
            ctx.emit(
                group,
                &window.to_result(start, end, group.map(str::to_string)),
            )
        })
    }

    const DERIVE_TIMERS: Option<DeriveTimers<Self>> = Some(Self::derive_timers);
}

impl FinalAggregator {
    /// Every pending timer, from committed state (see
    /// [`Processor::DERIVE_TIMERS`]).
    fn derive_timers(
        &self,
        state: &StateView<'_>,
        timers: &mut DerivedTimers<'_, Self>,
    ) -> anyhow::Result<()> {
        self.windows.derive_timers(state, timers)
    }
}
