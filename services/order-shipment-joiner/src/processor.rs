//! The interval join.
//!
//! Both sides are buffered per order id in RocksDB, each side as one value:
//! the key's records by event time (a list per time, since duplicates each
//! join, as SQL multiset semantics require). An order id has few records, so
//! a record costs a point read of the other side and a read and write of its
//! own — no range scan. A new record joins everything already buffered on the
//! other side, so each matching pair is emitted exactly once, by whichever
//! record arrives second.
//!
//! Buffered records are dropped once no on-time record can match them any
//! more: an order when the watermark passes `order_ts + window`, a shipment
//! when it passes `ship_ts` (a later order is on time only if
//! `order_ts >= watermark`). One timer per order id and side, at the side's
//! earliest such deadline, does it.
//!
//! So a side of an order id has buffered records exactly while its timer is
//! set, and the timer answers "anything buffered?" without a state read: a
//! new order id, most of the input, costs no RocksDB lookup of either side.

use std::collections::BTreeMap;

use serde::de::IgnoredAny;

use streams_runtime::prelude::*;

use crate::model::{JoinInput, Order, Shipment, ShippedOrder};
use crate::settings::Settings;
use crate::timestamp::format_utc;

/// One side's buffered records of an order id, by event time (ms).
type Buffered<T> = BTreeMap<i64, Vec<T>>;

streams_runtime::stores! {
    /// Buffered orders per order id.
    pub ORDERS: ValueState<Buffered<Order>> = "orders";
    /// Buffered shipments per order id.
    pub SHIPMENTS: ValueState<Buffered<Shipment>> = "shipments";
}

streams_runtime::timer_names! {
    /// Per order id and side, the earliest time a buffered record expires.
    pub enum Expiry {
        Order = "order-expiry",
        Shipment = "shipment-expiry",
    }
}

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

/// `key`'s buffered records of one side, whose expiry timer is `name`: none
/// unless the timer is set (see the module docs). The timer is only
/// tested, not read: the state read follows anyway when it is set.
fn buffered<T: serde::de::DeserializeOwned>(
    ctx: &mut Context<'_, IntervalJoin>,
    state: &ValueState<Buffered<T>>,
    key: &str,
    name: Expiry,
) -> anyhow::Result<Option<Buffered<T>>> {
    if !ctx.may_have_timer(key, name) {
        return Ok(None);
    }
    ctx.get(state, key)
}

/// Buffers `record` at `time` on one side of `key`, whose expiry timer is
/// `name`, and moves that timer to `expires` if that is earlier. The timer
/// is looked up once: it says whether the side has anything buffered, and
/// when it expires.
fn buffer<T: serde::Serialize + serde::de::DeserializeOwned>(
    ctx: &mut Context<'_, IntervalJoin>,
    state: &ValueState<Buffered<T>>,
    key: &str,
    (name, expires): (Expiry, i64),
    time: i64,
    record: T,
) -> anyhow::Result<()> {
    let current = ctx.timer(key, name);
    let mut buffered = match current {
        Some(_) => ctx.get(state, key)?.unwrap_or_default(),
        None => Buffered::new(),
    };
    buffered.entry(time).or_default().push(record);
    ctx.put(state, key, &buffered)?;
    if current.is_none_or(|current| expires < current) {
        ctx.set_timer(key, name, expires);
    }
    Ok(())
}

/// Drops `key`'s buffered records of one side whose `expiry` has passed the
/// watermark, counting them as `counter`; re-arms timer `name` for the rest.
fn expire<T: serde::Serialize + serde::de::DeserializeOwned>(
    ctx: &mut Context<'_, IntervalJoin>,
    state: &ValueState<Buffered<T>>,
    key: &str,
    (name, counter): (Expiry, JoinCounter),
    expiry: impl Fn(i64) -> i64,
) -> anyhow::Result<()> {
    let Some(mut buffered) = ctx.get(state, key)? else {
        return Ok(());
    };
    let watermark = ctx.watermark();
    while let Some(entry) = buffered.first_entry() {
        let at = expiry(*entry.key());
        if at > watermark {
            ctx.set_timer(key, name, at);
            break;
        }
        entry.remove();
        ctx.increment(counter);
    }
    ctx.put_or_delete(state, key, Some(&buffered).filter(|b| !b.is_empty()))
}

#[derive(Debug, Clone)]
pub struct IntervalJoin {
    /// Join window in milliseconds.
    window: i64,
}

impl IntervalJoin {
    pub fn new(settings: &Settings) -> Self {
        IntervalJoin {
            window: settings.join_window.as_millis_i64(),
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
    fn order_expiry(&self, time: i64) -> i64 {
        time.saturating_add(self.window).saturating_add(1)
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
        if let Some(shipments) = buffered(ctx, &SHIPMENTS, key, Expiry::Shipment)? {
            for shipment in shipments.range(time..=high).flat_map(|(_, list)| list) {
                ctx.emit(Some(key), &Self::joined(&order, shipment))?;
            }
        }
        let expiry = (Expiry::Order, self.order_expiry(time));
        buffer(ctx, &ORDERS, key, expiry, time, order)
    }

    fn on_shipment(
        &self,
        ctx: &mut Context<'_, Self>,
        key: &str,
        shipment: Shipment,
        time: i64,
    ) -> anyhow::Result<()> {
        let low = time.saturating_sub(self.window);
        if let Some(orders) = buffered(ctx, &ORDERS, key, Expiry::Order)? {
            for order in orders.range(low..=time).flat_map(|(_, list)| list) {
                ctx.emit(Some(key), &Self::joined(order, &shipment))?;
            }
        }
        let expiry = (Expiry::Shipment, Self::shipment_expiry(time));
        buffer(ctx, &SHIPMENTS, key, expiry, time, shipment)
    }
}

impl Processor for IntervalJoin {
    type Input = JoinInput;
    type Output = ShippedOrder;
    type Timers = Expiry;
    const STORES: &'static [StoreSpec] = STORES;

    fn process(
        &mut self,
        ctx: &mut Context<'_, Self>,
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
        timer: Timer<'_, Expiry>,
    ) -> anyhow::Result<()> {
        match timer.name {
            Expiry::Order => expire(
                ctx,
                &ORDERS,
                timer.key,
                (Expiry::Order, JoinCounter::OrdersExpired),
                |time| self.order_expiry(time),
            ),
            Expiry::Shipment => expire(
                ctx,
                &SHIPMENTS,
                timer.key,
                (Expiry::Shipment, JoinCounter::ShipmentsExpired),
                Self::shipment_expiry,
            ),
        }
    }

    const DERIVE_TIMERS: Option<DeriveTimers<Self>> = Some(Self::derive_timers);
}

impl IntervalJoin {
    /// A side's expiry timer of an order id is always the expiry of its
    /// earliest buffered record (buffering moves it earlier, expiring
    /// re-arms it for the earliest left, and an empty side is deleted), so
    /// the timers follow from the buffers and none is written to a changelog.
    fn derive_timers(
        &self,
        state: &StateView<'_>,
        timers: &mut DerivedTimers<'_, Self>,
    ) -> anyhow::Result<()> {
        // Only the times are read: the records themselves are skipped.
        state.for_each_as(&ORDERS, |key, orders: Buffered<IgnoredAny>| {
            if let Some(earliest) = orders.keys().next() {
                timers.set_timer(key, Expiry::Order, self.order_expiry(*earliest));
            }
            Ok(())
        })?;
        state.for_each_as(&SHIPMENTS, |key, shipments: Buffered<IgnoredAny>| {
            if let Some(earliest) = shipments.keys().next() {
                timers.set_timer(key, Expiry::Shipment, Self::shipment_expiry(*earliest));
            }
            Ok(())
        })
    }
}
