//! window-aggregator test data: orders, expected window rows, and a model of
//! the hopping-window rules of docs/services/window-aggregator.md that
//! replays each partition's watermark.

use std::collections::BTreeMap;

use rand::Rng;
use serde_json::{json, Value};

use crate::murmur2_partition;

/// One marketplace order, as produced.
#[derive(Debug, Clone)]
pub struct Order {
    pub order_id: String,
    pub customer_id: Option<String>,
    pub product_id: String,
    pub price: f64,
    pub order_time: i64,
}

impl Order {
    /// An order of product `p`.
    pub fn new(order_id: &str, customer_id: Option<&str>, price: f64, order_time: i64) -> Order {
        Order {
            order_id: order_id.to_string(),
            customer_id: customer_id.map(str::to_string),
            product_id: "p".to_string(),
            price,
            order_time,
        }
    }

    /// The order of an `orders-marketplace` line (a fixture's, say).
    pub fn from_line(line: &Value) -> Order {
        let value = &line["value"];
        Order {
            order_id: value["order_id"].as_str().expect("order_id").to_string(),
            customer_id: value["customer_id"].as_str().map(str::to_string),
            product_id: value["product_id"]
                .as_str()
                .expect("product_id")
                .to_string(),
            price: value["price"].as_f64().expect("price"),
            order_time: value["order_time"].as_i64().expect("order_time"),
        }
    }

    /// The `orders-marketplace` line, keyed by order id.
    pub fn line(&self) -> Value {
        json!({"key": self.order_id, "value": {"order_id": self.order_id,
            "customer_id": self.customer_id, "product_id": self.product_id,
            "price": self.price, "order_time": self.order_time}})
    }
}

/// Window shape and watermark settings of a run.
#[derive(Debug, Clone, Copy)]
pub struct WindowRules {
    pub size: i64,
    pub advance: i64,
    pub max_out_of_orderness: i64,
    pub partitions: usize,
    /// Group by customer id (the only grouping the model knows).
    pub by_customer: bool,
}

#[derive(Default)]
struct Aggregate {
    count: i64,
    records: i64,
    sum: f64,
    min: f64,
    max: f64,
}

/// What the rules expect of some orders.
#[derive(Debug, Default)]
pub struct Expected {
    /// The rows, in the order one final task emits them: by window end, then
    /// by group (the null group first, then the groups' bytes).
    pub rows: Vec<Value>,
    /// Orders that fit no open window (`streams_records_late_total`).
    pub late: usize,
}

/// The rows the rules expect for `orders` produced in this order (see
/// [`expect`]).
pub fn model(orders: &[Order], rules: WindowRules) -> Vec<Value> {
    expect(orders, rules).rows
}

/// What the rules expect of `orders` produced in this order, each to the
/// partition its order id hashes to: each partition's watermark is replayed
/// to find late orders (an order goes into the windows whose end is after its
/// partition's watermark before it; one that fits none is late), and a
/// window is emitted when the least partition watermark reaches its end.
/// Prices must add exactly in `f64` (e.g. multiples of 1/8).
pub fn expect(orders: &[Order], rules: WindowRules) -> Expected {
    let mut late = 0;
    let mut max_seen: Vec<Option<i64>> = vec![None; rules.partitions];
    let mut windows: BTreeMap<(i64, Option<String>), Aggregate> = BTreeMap::new();
    for order in orders {
        let partition = murmur2_partition(order.order_id.as_bytes(), rules.partitions);
        let watermark = max_seen[partition].map_or(i64::MIN, |m| m - rules.max_out_of_orderness);
        let last_start = order.order_time - order.order_time.rem_euclid(rules.advance);
        if last_start + rules.size <= watermark {
            late += 1;
            continue;
        }
        let mut start = last_start;
        while start > order.order_time - rules.size {
            if start + rules.size > watermark {
                let group = rules
                    .by_customer
                    .then(|| order.customer_id.clone())
                    .flatten();
                let window = windows.entry((start, group)).or_insert(Aggregate {
                    min: f64::INFINITY,
                    max: f64::NEG_INFINITY,
                    ..Aggregate::default()
                });
                window.count += i64::from(order.customer_id.is_some());
                window.records += 1;
                window.sum += order.price;
                window.min = window.min.min(order.price);
                window.max = window.max.max(order.price);
            }
            start -= rules.advance;
        }
        max_seen[partition] =
            Some(max_seen[partition].map_or(order.order_time, |m| m.max(order.order_time)));
    }
    let closed_until = max_seen
        .iter()
        .map(|m| m.map_or(i64::MIN, |m| m - rules.max_out_of_orderness))
        .min()
        .unwrap_or(i64::MIN);
    let rows = windows
        .into_iter()
        .filter(|((start, _), _)| start + rules.size <= closed_until)
        .map(|((start, group), w)| window_row(start, start + rules.size, group.as_deref(), &w))
        .collect();
    Expected { rows, late }
}

fn window_row(start: i64, end: i64, group: Option<&str>, w: &Aggregate) -> Value {
    json!({"key": group, "value": {"window_start": start, "window_end": end, "group": group,
        "count": w.count, "price_sum": w.sum, "price_min": w.min, "price_max": w.max,
        "price_mean": w.sum / w.records as f64}})
}

/// `count` random orders from `base` on, in time order but shuffled within
/// `disorder` ms; about one in 50 is a straggler far behind (late). Prices are
/// multiples of 1/8 so that sums are exact; some customers are null.
pub fn generate(count: usize, customers: usize, base: i64, disorder: i64) -> Vec<Order> {
    let mut rng = rand::rng();
    let mut time = base;
    (0..count)
        .map(|i| {
            time += rng.random_range(0..40);
            let order_time = if rng.random_bool(0.02) {
                time - rng.random_range(3_000..6_000)
            } else {
                time - rng.random_range(0..=disorder)
            };
            Order {
                order_id: format!("order-{i}"),
                customer_id: (!rng.random_bool(0.1))
                    .then(|| format!("customer-{}", rng.random_range(0..customers))),
                product_id: format!("product-{}", rng.random_range(0..20)),
                price: rng.random_range(1..8_000) as f64 / 8.0,
                order_time,
            }
        })
        .collect()
}
