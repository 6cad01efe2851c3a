//! order-shipment-joiner end to end.

use std::collections::HashMap;
use std::time::Duration;

use e2e_tests::*;
use rand::Rng;
use serde_json::Value;

const DAY: i64 = 86_400;

struct Topics {
    orders: String,
    shipments: String,
    output: String,
}

fn topics(partitions: usize) -> Topics {
    let topics = Topics {
        orders: unique("orders"),
        shipments: unique("shipments"),
        output: unique("shipped-orders"),
    };
    create_topic(&topics.orders, partitions);
    create_topic(&topics.shipments, partitions);
    topics
}

fn service_args(topics: &Topics, application_id: &str) -> Vec<String> {
    args(&[
        "--orders-topic",
        &topics.orders,
        "--shipments-topic",
        &topics.shipments,
        "--output-topic",
        &topics.output,
        "--application-id",
        application_id,
    ])
}

fn start(topics: &Topics) -> Service {
    Service::start(
        "order-shipment-joiner",
        &service_args(topics, &unique("joiner")),
    )
}

fn order(id: i32, ts: i64) -> Value {
    json!({"key": id.to_string(), "value": {"id": id, "total_amount": 10.5, "customer_name": format!("customer {id}"), "order_ts_raw": ts}})
}

fn shipment(id: &str, order_id: i32, ts: i64) -> Value {
    json!({"key": id, "value": {"id": id, "order_id": order_id, "warehouse": "Boston", "ship_ts_raw": ts}})
}

fn ship_ids(rows: &[Value]) -> Vec<String> {
    let mut ids: Vec<String> = rows
        .iter()
        .map(|r| r["value"]["ship_id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

fn fixture_run(orders_first: Option<bool>) {
    let topics = topics(1);
    let service = start(&topics);
    let orders = fixture("order-shipment-joiner/orders.jsonl");
    let shipments = fixture("order-shipment-joiner/shipments.jsonl");
    match orders_first {
        Some(true) => {
            produce(&topics.orders, "orders", &orders);
            produce(&topics.shipments, "shipments", &shipments);
        }
        Some(false) => {
            produce(&topics.shipments, "shipments", &shipments);
            produce(&topics.orders, "orders", &orders);
        }
        None => {
            for (o, s) in orders.chunks(3).zip(shipments.chunks(3)) {
                produce(&topics.orders, "orders", o);
                produce(&topics.shipments, "shipments", s);
            }
        }
    }
    let output = wait_for_records(&topics.output, 10, Duration::from_secs(60));
    let expected = fixture("order-shipment-joiner/shipped-orders.expected.jsonl");
    assert_eq!(sorted(output), sorted(expected), "log:\n{}", service.log());
}

#[test]
fn fixture_with_orders_first() {
    fixture_run(Some(true));
}

#[test]
fn fixture_with_shipments_first() {
    fixture_run(Some(false));
}

#[test]
fn fixture_interleaved() {
    fixture_run(None);
}

#[test]
fn window_boundaries_are_inclusive_at_both_ends() {
    let topics = topics(1);
    let service = start(&topics);
    let t = 1_692_812_175;
    produce(&topics.orders, "orders", &[order(1, t)]);
    produce(
        &topics.shipments,
        "shipments",
        &[
            shipment("before", 1, t - 1),
            shipment("same-second", 1, t),
            shipment("last-second", 1, t + 7 * DAY),
            shipment("one-second-too-late", 1, t + 7 * DAY + 1),
        ],
    );
    let output = wait_for_records(&topics.output, 2, Duration::from_secs(60));
    assert_eq!(
        ship_ids(&output),
        ["last-second", "same-second"],
        "log:\n{}",
        service.log()
    );
    let last = output
        .iter()
        .find(|r| r["value"]["ship_id"] == "last-second")
        .unwrap();
    assert_eq!(last["value"]["hr_to_ship"], json!(168));
}

#[test]
fn several_shipments_early_shipments_and_duplicate_orders_each_join_once() {
    let topics = topics(1);
    let service = start(&topics);
    let t = 1_692_812_175;
    // Shipments of order 2 arrive before the order itself.
    produce(
        &topics.shipments,
        "shipments",
        &[
            shipment("s2a", 2, t + 3600),
            shipment("s2b", 2, t + 7200),
            shipment("s3", 3, t + 10),
        ],
    );
    // Order 3 arrives twice: each copy joins (SQL multiset semantics).
    produce(
        &topics.orders,
        "orders",
        &[order(2, t), order(3, t), order(3, t)],
    );
    let output = wait_for_records(&topics.output, 4, Duration::from_secs(60));
    assert_eq!(
        ship_ids(&output),
        ["s2a", "s2b", "s3", "s3"],
        "log:\n{}",
        service.log()
    );
    let hours: Vec<i64> = output
        .iter()
        .filter(|r| r["value"]["order_id"] == 2)
        .map(|r| r["value"]["hr_to_ship"].as_i64().unwrap())
        .collect();
    assert_eq!(hours.iter().sum::<i64>(), 3);
}

/// Random orders and 0–2 shipments each (delays from −1 to 9 days), produced
/// in time order; returns the expected `ship_id → hr_to_ship` of a
/// nested-loop interval join.
fn produce_random_orders(topics: &Topics, count: i32) -> HashMap<String, i64> {
    let mut rng = rand::rng();
    let base = 1_692_000_000i64;
    let mut orders: Vec<(i64, i32)> = (0..count)
        .map(|id| (base + rng.random_range(0..30 * DAY), id))
        .collect();
    let mut shipments: Vec<(i64, String, i32)> = Vec::new();
    for (order_ts, id) in &orders {
        for n in 0..rng.random_range(0..3) {
            let delay = rng.random_range(-DAY..9 * DAY);
            shipments.push((order_ts + delay, format!("ship-{id}-{n}"), *id));
        }
    }
    orders.sort();
    shipments.sort();
    let order_time: HashMap<i32, i64> = orders.iter().map(|(t, id)| (*id, *t)).collect();
    let mut expected = HashMap::new();
    for (ship_ts, ship_id, order_id) in &shipments {
        let order_ts = order_time[order_id];
        if order_ts <= *ship_ts && *ship_ts <= order_ts + 7 * DAY {
            expected.insert(ship_id.clone(), (ship_ts - order_ts) / 3600);
        }
    }
    produce(
        &topics.orders,
        "orders",
        &orders
            .iter()
            .map(|(t, id)| order(*id, *t))
            .collect::<Vec<_>>(),
    );
    produce(
        &topics.shipments,
        "shipments",
        &shipments
            .iter()
            .map(|(t, s, o)| shipment(s, *o, *t))
            .collect::<Vec<_>>(),
    );
    expected
}

/// Checks joined rows against the model: each pair once, keyed by order id.
fn assert_join(output: &[Value], expected: &HashMap<String, i64>, log: &str) {
    let actual: HashMap<String, i64> = output
        .iter()
        .map(|r| {
            (
                r["value"]["ship_id"].as_str().unwrap().to_string(),
                r["value"]["hr_to_ship"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        output.len(),
        expected.len(),
        "every pair exactly once; log:\n{log}"
    );
    assert_eq!(&actual, expected);
    for row in output {
        assert_eq!(row["key"], json!(row["value"]["order_id"].to_string()));
    }
}

#[test]
fn ten_thousand_orders_over_three_partitions_match_a_nested_loop_join() {
    let topics = topics(3);
    let service = start(&topics);
    let expected = produce_random_orders(&topics, 10_000);
    let output = wait_for_records(&topics.output, expected.len(), Duration::from_secs(180));
    assert_join(&output, &expected, &service.log());
}

/// Two instances over three partitions (uneven): partition p of `orders` and
/// of the repartition topic must land on the same instance, or joins are lost.
#[test]
fn two_instances_over_three_partitions_keep_each_task_together() {
    let topics = topics(3);
    let arguments = service_args(&topics, &unique("joiner"));
    let first = Service::start("order-shipment-joiner", &arguments);
    let second = Service::start("order-shipment-joiner", &arguments);
    first.wait_ready(Duration::from_secs(60));
    second.wait_ready(Duration::from_secs(60));
    let expected = produce_random_orders(&topics, 5_000);
    let output = wait_for_records(&topics.output, expected.len(), Duration::from_secs(180));
    assert_join(
        &output,
        &expected,
        &format!("{}\n---\n{}", first.log(), second.log()),
    );
    let tasks = |service: &Service| {
        service
            .metrics()
            .matches("streams_timers_pending{task=")
            .count()
    };
    // Metrics are published at commits: allow a moment after a rebalance.
    assert!(
        eventually(Duration::from_secs(10), || {
            let (a, b) = (tasks(&first), tasks(&second));
            a >= 1 && b >= 1 && a + b == 3
        }),
        "both instances own tasks:\n{}\n{}",
        first.metrics(),
        second.metrics()
    );
}

#[test]
fn expired_entries_leave_the_state_as_event_time_moves_on() {
    let topics = topics(1);
    let service = start(&topics);
    let t = 1_692_812_175;
    let orders: Vec<Value> = (0..50).map(|id| order(id, t + i64::from(id))).collect();
    produce(&topics.orders, "orders", &orders);
    let shipments: Vec<Value> = (0..50)
        .map(|id| shipment(&format!("s{id}"), id, t + 60 + i64::from(id)))
        .collect();
    produce(&topics.shipments, "shipments", &shipments);
    assert_eq!(
        wait_for_records(&topics.output, 50, Duration::from_secs(60)).len(),
        50
    );
    // Both streams move 10 days on: every earlier order and shipment expires.
    produce(&topics.orders, "orders", &[order(1000, t + 10 * DAY)]);
    produce(
        &topics.shipments,
        "shipments",
        &[shipment("late-marker", 1000, t + 10 * DAY)],
    );
    let expired = |name: &str| {
        service.metric(&format!(
            "streams_processor_events_total{{name=\"{name}\"}}"
        ))
    };
    assert!(
        eventually(Duration::from_secs(60), || expired("orders_expired")
            == 50.0
            && expired("shipments_expired") == 50.0),
        "metrics:\n{}\nlog:\n{}",
        service.metrics(),
        service.log()
    );
    assert!(
        eventually(Duration::from_secs(10), || service
            .metric("streams_timers_pending{task=\"0\"}")
            <= 2.0),
        "only the two newest entries keep timers:\n{}",
        service.metrics()
    );
}
