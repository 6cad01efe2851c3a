//! The interval join.
//!
//! Both sides are buffered per order id in RocksDB, each side as one value:
//! the key's records by event time (a list per time, since duplicates each
//! join, as SQL multiset semantics require). An order id has few records, so
//! a record costs a point read of the other side and a read and write of its
//! own — no range scan; most order ids have nothing on one side or both, and
//! the stores' key filters answer those reads from memory. A new record joins
//! everything already buffered on the other side, so each matching pair is
//! emitted exactly once, by whichever record arrives second.
//!
//! Buffered records are dropped once no on-time record can match them any
//! more: an order when the watermark passes `order_ts + window`, a shipment
//! when it passes `ship_ts` (a later order is on time only if
//! `order_ts >= watermark`). No timer per order id does it, but a sweep of
//! each side, as the watermark moves on: a side's committed state is read
//! a page at a time between records, and each key whose earliest record
//! has expired is rewritten without its expired ones. A sweep starts again
//! once the watermark has moved a sweep period on (half the join window for
//! orders, the grace for shipments), so a record may stay that much longer
//! than it has to; a join only ever looks at the other side's records in
//! its window, which never reaches back to an expired one, so the rows are
//! the same. What this saves against a timer per order id and side: the
//! timers' writes (with more order ids in the window than memory holds,
//! two RocksDB writes per record) and their rebuild from state when a task
//! opens. What it costs: each key is read by about three sweeps in its
//! life, sequentially.

use std::collections::BTreeMap;

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::Serialize;

use streams_runtime::prelude::*;

use crate::model::{JoinInput, Order, Shipment, ShippedOrder};
use crate::settings::Settings;
use crate::timestamp::format_utc;

/// One side's buffered records of an order id, by event time (ms).
type Buffered<T> = BTreeMap<i64, Vec<T>>;

streams_runtime::stores! {
    /// Buffered orders per order id. Each record reads both sides for its
    /// order id, which mostly have nothing for it: key filters answer.
    pub ORDERS: ValueState<Buffered<Order>> = "orders".with_key_filter();
    /// Buffered shipments per order id.
    pub SHIPMENTS: ValueState<Buffered<Shipment>> = "shipments".with_key_filter();
}

streams_runtime::timer_names! {
    /// Per side, when its sweep for expired records goes on: set at the
    /// watermark while a sweep has pages left (it fires at the watermark's
    /// next advance), a sweep period ahead once it is done.
    pub enum Sweep {
        Orders = "orders-sweep",
        Shipments = "shipments-sweep",
    }
}

/// The key of both sweep timers: a sweep is of a whole side, not of a key.
const SWEEP_KEY: &str = "";

/// Order ids a sweep reads per page: one page per watermark advance, so a
/// sweep of a large state is spread over many records.
const SWEEP_PAGE: usize = 1_000;

/// The least a sweep period may be, however small the window or grace: a
/// side is never swept more often than this much event time.
const MIN_SWEEP_EVERY_MS: i64 = 60_000;

streams_runtime::counter_names! {
    /// Buffered records dropped unmatched when their join window closed.
    pub enum JoinCounter {
        OrdersExpired = "orders_expired",
        ShipmentsExpired = "shipments_expired",
    }
}

/// The service: orders direct, shipments re-keyed by order id, joined.
pub fn pipeline(settings: Settings) -> anyhow::Result<Pipeline> {
    let processor = IntervalJoin::new(&settings);
    let topology = Topology::new(
        "order-shipment-joiner",
        &settings.output_topic,
        topic_schemas::SHIPPED_ORDERS,
    )
    .input(InputStream::new(
        &settings.orders_topic,
        topic_schemas::ORDERS,
        |o: &Order| o.order_ts_raw.saturating_mul(1000),
        JoinInput::Order,
    )?)
    .input(
        InputStream::new(
            &settings.shipments_topic,
            topic_schemas::SHIPMENTS,
            |s: &Shipment| s.ship_ts_raw.saturating_mul(1000),
            JoinInput::Shipment,
        )?
        .repartition_by("shipments-by-order", |s: &Shipment| s.order_id.to_string()),
    )
    .max_out_of_orderness(settings.grace);
    Ok(Pipeline::new(settings.runtime, topology, processor))
}

/// Buffers `record` at `time` on one side of `key`.
fn buffer<T: Serialize + DeserializeOwned + Send + Sync + 'static>(
    ctx: &mut Context<'_, IntervalJoin>,
    state: &ValueState<Buffered<T>>,
    key: &str,
    time: i64,
    record: T,
) -> anyhow::Result<()> {
    ctx.update(state, key, |buffered| {
        (buffered.get_or_insert_default().entry(time).or_default()).push(record)
    })
}

/// One side of the join, as a sweep sees it.
struct Side<T: 'static> {
    state: &'static ValueState<Buffered<T>>,
    expired: JoinCounter,
}

const ORDER_SIDE: Side<Order> = Side {
    state: &ORDERS,
    expired: JoinCounter::OrdersExpired,
};

const SHIPMENT_SIDE: Side<Shipment> = Side {
    state: &SHIPMENTS,
    expired: JoinCounter::ShipmentsExpired,
};

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> Side<T> {
    /// Reads the page of the side's committed order ids after `after`, and
    /// drops from each the records whose `expiry` the watermark has reached
    /// (counted). Returns where the next page starts, `None` at the end.
    fn sweep_page(
        &self,
        ctx: &mut Context<'_, IntervalJoin>,
        after: Option<&str>,
        expiry: impl Fn(i64) -> i64,
    ) -> anyhow::Result<Option<String>> {
        let watermark = ctx.watermark();
        // Only the times are read: the records themselves are skipped.
        let page: StatePage<Buffered<IgnoredAny>> =
            ctx.committed_page(self.state, after, SWEEP_PAGE)?;
        for (key, times) in page.entries {
            if times
                .keys()
                .next()
                .is_none_or(|&first| expiry(first) > watermark)
            {
                continue;
            }
            let dropped = ctx.update(self.state, &key, |buffered| {
                let Some(records) = buffered else {
                    return 0;
                };
                let mut dropped = 0_u64;
                while let Some(entry) = records.first_entry() {
                    if expiry(*entry.key()) > watermark {
                        break;
                    }
                    dropped += entry.remove().len() as u64;
                }
                if records.is_empty() {
                    *buffered = None;
                }
                dropped
            })?;
            ctx.add(self.expired, dropped);
        }
        Ok(page.next)
    }
}

#[derive(Debug, Clone)]
pub struct IntervalJoin {
    /// Join window in milliseconds.
    window: i64,
    /// How far the watermark moves between two sweeps of a side; this and
    /// the next are indexed by the side's [`Sweep`] (orders, shipments).
    sweep_every: [i64; 2],
    /// Per side, where its sweep goes on (the last order id swept), while
    /// one is under way. Kept in memory only: a task that reopens starts
    /// its sweeps from the beginning.
    swept_up_to: [Option<String>; 2],
}

impl IntervalJoin {
    pub fn new(settings: &Settings) -> Self {
        let window = settings.join_window.as_millis_i64();
        let grace = settings.grace.as_millis_i64();
        IntervalJoin {
            window,
            sweep_every: [window / 2, grace].map(|every| every.max(MIN_SWEEP_EVERY_MS)),
            swept_up_to: [None, None],
        }
    }

    fn joined(order: &Order, shipment: &Shipment) -> ShippedOrder {
        ShippedOrder {
            order_id: order.id,
            order_ts: format_utc(order.order_ts_raw),
            total: order.total_amount,
            customer: order.customer_name.clone(),
            ship_id: shipment.id.clone(),
            ship_ts: format_utc(shipment.ship_ts_raw),
            warehouse: shipment.warehouse.clone(),
            hr_to_ship: (shipment.ship_ts_raw - order.order_ts_raw).div_euclid(3600),
        }
    }

    /// When an order buffered at `time` can no longer match.
    fn order_expiry(window: i64, time: i64) -> i64 {
        time.saturating_add(window).saturating_add(1)
    }

    /// When a shipment buffered at `time` can no longer match.
    fn shipment_expiry(time: i64) -> i64 {
        time.saturating_add(1)
    }

    fn on_order(
        &self,
        ctx: &mut Context<'_, Self>,
        key: &str,
        order: Order,
        time: i64,
    ) -> anyhow::Result<()> {
        let high = time.saturating_add(self.window);
        if let Some(shipments) = ctx.get(&SHIPMENTS, key)? {
            for shipment in shipments.range(time..=high).flat_map(|(_, list)| list) {
                ctx.emit(Some(key), &Self::joined(&order, shipment))?;
            }
        }
        buffer(ctx, &ORDERS, key, time, order)
    }

    fn on_shipment(
        &self,
        ctx: &mut Context<'_, Self>,
        key: &str,
        shipment: Shipment,
        time: i64,
    ) -> anyhow::Result<()> {
        let low = time.saturating_sub(self.window);
        if let Some(orders) = ctx.get(&ORDERS, key)? {
            for order in orders.range(low..=time).flat_map(|(_, list)| list) {
                ctx.emit(Some(key), &Self::joined(order, &shipment))?;
            }
        }
        buffer(ctx, &SHIPMENTS, key, time, shipment)
    }

    /// Sweeps the next page of the side of timer `name`, and sets the timer
    /// again: at the watermark while pages are left, a sweep period on
    /// once the side is done.
    fn sweep(&mut self, ctx: &mut Context<'_, Self>, name: Sweep) -> anyhow::Result<()> {
        let side = name as usize;
        let after = self.swept_up_to[side].take();
        let window = self.window;
        let next = match name {
            Sweep::Orders => ORDER_SIDE.sweep_page(ctx, after.as_deref(), |time| {
                Self::order_expiry(window, time)
            })?,
            Sweep::Shipments => {
                SHIPMENT_SIDE.sweep_page(ctx, after.as_deref(), Self::shipment_expiry)?
            }
        };
        let watermark = ctx.watermark();
        let at = match next {
            Some(_) => watermark,
            None => watermark.saturating_add(self.sweep_every[side]),
        };
        self.swept_up_to[side] = next;
        ctx.set_timer(SWEEP_KEY, name, at);
        Ok(())
    }
}

impl Processor for IntervalJoin {
    type Input = JoinInput;
    type Output = ShippedOrder;
    type Timers = Sweep;
    const STORES: &'static [StoreSpec] = STORES;

    fn process(
        &mut self,
        ctx: &mut Context<'_, IntervalJoin>,
        record: Record<'_, JoinInput>,
    ) -> anyhow::Result<()> {
        match record.value {
            JoinInput::Order(order) => {
                let key = order.id.to_string();
                self.on_order(ctx, &key, order, record.event_time)
            }
            JoinInput::Shipment(shipment) => {
                let key = shipment.order_id.to_string();
                self.on_shipment(ctx, &key, shipment, record.event_time)
            }
        }
    }

    fn on_timer(
        &mut self,
        ctx: &mut Context<'_, Self>,
        timer: Timer<'_, Sweep>,
    ) -> anyhow::Result<()> {
        self.sweep(ctx, timer.name)
    }

    const DERIVE_TIMERS: Option<DeriveTimers<Self>> = Some(Self::start_sweeps);
}

impl IntervalJoin {
    /// A task that opens sweeps both sides from the beginning at the
    /// watermark's first advance: nothing of the last sweeps is kept, and
    /// nothing in state has to be read to open the task.
    fn start_sweeps(
        &self,
        _state: &StateView<'_>,
        timers: &mut DerivedTimers<'_, Self>,
    ) -> anyhow::Result<()> {
        for name in [Sweep::Orders, Sweep::Shipments] {
            timers.set_timer(SWEEP_KEY, name, NO_WATERMARK);
        }
        Ok(())
    }
}
