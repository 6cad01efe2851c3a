//! The interval join.
//!
//! Both sides are buffered per order id in RocksDB, each in a map keyed by
//! the entry's event time (a list per time, since duplicates each join, as SQL
//! multiset semantics require). A new record joins everything already buffered
//! on the other side, so each matching pair is emitted exactly once, by
//! whichever record arrives second.
//!
//! State is dropped by timers once no on-time record can match it any more:
//! an order when the watermark passes `order_ts + window`, a shipment when it
//! passes `ship_ts` (a later order is on time only if `order_ts >= watermark`).

use streams_runtime::{Context, InputStream, MapState, Processor, Record, Timer, Topology};

use crate::model::{JoinInput, Order, Shipment, ShippedOrder};
use crate::settings::Settings;
use crate::timestamp::format_utc;

/// Buffered orders per order id, by order time (ms).
const ORDERS: MapState<i64, Vec<Order>> = MapState::new("orders");
/// Buffered shipments per order id, by ship time (ms).
const SHIPMENTS: MapState<i64, Vec<Shipment>> = MapState::new("shipments");

const ORDER_EXPIRY: &str = "order-expiry";
const SHIPMENT_EXPIRY: &str = "shipment-expiry";

/// Builds the topology: orders direct, shipments re-keyed by order id.
pub fn topology(settings: &Settings) -> anyhow::Result<Topology<JoinInput>> {
    Ok(Topology::new(
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
        .repartition_by("shipments-by-order", |input| match input {
            JoinInput::Shipment(s) => s.order_id.to_string(),
            JoinInput::Order(o) => o.id.to_string(),
        }),
    )
    .store(ORDERS.name())
    .store(SHIPMENTS.name())
    .max_out_of_orderness(settings.grace))
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

    fn on_order(
        &self,
        ctx: &mut Context<'_, ShippedOrder>,
        key: &str,
        order: Order,
        time: i64,
    ) -> anyhow::Result<()> {
        let low = time;
        let high = time.saturating_add(self.window);
        for (ship_time, shipments) in ctx.map_entries(&SHIPMENTS, key)? {
            if (low..=high).contains(&ship_time) {
                for shipment in &shipments {
                    ctx.emit(Some(key), &Self::joined(&order, shipment))?;
                }
            }
        }
        let mut buffered = ctx.map_get(&ORDERS, key, &time)?.unwrap_or_default();
        buffered.push(order);
        ctx.map_put(&ORDERS, key, &time, &buffered)?;
        ctx.set_timer(
            key,
            &format!("{ORDER_EXPIRY}-{time}"),
            high.saturating_add(1),
        );
        Ok(())
    }

    fn on_shipment(
        &self,
        ctx: &mut Context<'_, ShippedOrder>,
        key: &str,
        shipment: Shipment,
        time: i64,
    ) -> anyhow::Result<()> {
        let low = time.saturating_sub(self.window);
        for (order_time, orders) in ctx.map_entries(&ORDERS, key)? {
            if (low..=time).contains(&order_time) {
                for order in &orders {
                    ctx.emit(Some(key), &Self::joined(order, &shipment))?;
                }
            }
        }
        let mut buffered = ctx.map_get(&SHIPMENTS, key, &time)?.unwrap_or_default();
        buffered.push(shipment);
        ctx.map_put(&SHIPMENTS, key, &time, &buffered)?;
        ctx.set_timer(
            key,
            &format!("{SHIPMENT_EXPIRY}-{time}"),
            time.saturating_add(1),
        );
        Ok(())
    }
}

impl Processor for IntervalJoin {
    type Input = JoinInput;
    type Output = ShippedOrder;

    fn process(
        &mut self,
        ctx: &mut Context<'_, ShippedOrder>,
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
        ctx: &mut Context<'_, ShippedOrder>,
        timer: Timer<'_>,
    ) -> anyhow::Result<()> {
        if timer.name.starts_with(SHIPMENT_EXPIRY) {
            ctx.map_remove(&SHIPMENTS, timer.key, &(timer.time - 1));
            ctx.increment("shipments_expired");
        } else {
            ctx.map_remove(&ORDERS, timer.key, &(timer.time - 1 - self.window));
            ctx.increment("orders_expired");
        }
        Ok(())
    }
}
