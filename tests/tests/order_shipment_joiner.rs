//! order-shipment-joiner end to end: the worked example through a real
//! broker, and two instances sharing the tasks. The rules themselves (window
//! bounds, multiset joins, expiry, lateness, a model test at scale) are
//! tested on the broker-free driver (`driver_order_shipment_joiner.rs`), and
//! event time through the repartition topic in `repartition_event_time.rs`.

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

#[test]
fn fixture_gives_the_expected_joins() {
    let topics = topics(1);
    let service = start(&topics);
    produce(
        &topics.orders,
        "orders",
        &fixture("order-shipment-joiner/orders.jsonl"),
    );
    produce(
        &topics.shipments,
        "shipments",
        &fixture("order-shipment-joiner/shipments.jsonl"),
    );
    let expected = fixture("order-shipment-joiner/shipped-orders.expected.jsonl");
    let output = wait_for_records(&topics.output, expected.len(), Duration::from_secs(60));
    assert_eq!(sorted(output), sorted(expected), "log:\n{}", service.log());
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

/// Event time of the first order of [`orders_alone`].
const BASE: i64 = 1_692_000_000;

/// A joiner whose merge waits `max_task_idle` for shipments, and `count`
/// orders (ids 0.., one second apart from [`BASE`]) produced to it alone.
fn orders_alone(count: i32, max_task_idle: &str, extra: &[&str]) -> (Topics, Service) {
    let topics = topics(1);
    let mut arguments = service_args(&topics, &unique("joiner"));
    arguments.extend(args(&["--max-task-idle", max_task_idle]));
    arguments.extend(args(extra));
    let service = Service::start("order-shipment-joiner", &arguments);
    service.wait_ready(Duration::from_secs(60));
    let orders: Vec<Value> = (0..count).map(|id| order(id, BASE + id as i64)).collect();
    produce(&topics.orders, "orders", &orders);
    (topics, service)
}

/// An input that runs ahead of the other is not read into memory whole: with
/// the merge waiting for shipments (none yet), the service stops fetching
/// orders once its task holds its part of the merge buffers
/// (`MERGE_BUFFER_BYTES` in the runtime: 16 MiB per stage thread, half of it
/// for the orders here, some tens of thousands of orders), and resumes as
/// they are joined, losing none.
#[test]
fn an_input_running_ahead_is_paused_and_nothing_is_lost() {
    const ORDERS: i32 = 150_000;
    let (topics, service) = orders_alone(ORDERS, "20s", &[]);

    let consumed = format!(
        "streams_records_consumed_total{{topic=\"{}\"}}",
        topics.orders
    );
    assert!(
        eventually(Duration::from_secs(30), || service.metric(&consumed)
            >= 10_000.0),
        "orders consumed: {}; log:\n{}",
        service.metric(&consumed),
        service.log()
    );
    // Well within the 20 s the merge waits for shipments: nothing is
    // processed, so without the bound all orders would be read by now; with
    // it, reading has stopped (but for one polled batch).
    std::thread::sleep(Duration::from_secs(3));
    let held = service.metric(&consumed);
    std::thread::sleep(Duration::from_secs(2));
    let later = service.metric(&consumed);
    assert!(
        later < f64::from(ORDERS) && later <= held + 1_000.0,
        "{held}, then {later} orders read while none could be processed; log:\n{}",
        service.log()
    );

    let shipments: Vec<Value> = (0..ORDERS)
        .map(|id| shipment(&format!("ship-{id}"), id, BASE + id as i64 + 3_600))
        .collect();
    produce(&topics.shipments, "shipments", &shipments);
    // 150 000 joins on a share of 2 cores (make test runs another test
    // binary beside this one): room for a slow run, not for a wrong one.
    let output = wait_for_records(&topics.output, ORDERS as usize, Duration::from_secs(300));
    let expected: HashMap<String, i64> = (0..ORDERS).map(|id| (format!("ship-{id}"), 1)).collect();
    assert_join(&output, &expected, &service.log());
}

/// A merge that releases a long run of records at once does not hold back
/// the commits: the drain yields to each commit that falls due. Here the
/// merge waits 10 s for shipments (none come), meanwhile all 20 000 orders
/// are read (within the merge buffer's bound), then it takes them in one
/// go; the per-task gauges, published after each commit, must show the
/// buffered orders (one key each in the `orders` store, committed) arriving
/// over several commits, not all at once after the drain. Commits every
/// 20 ms: on an idle machine the drain of 20 000 orders can take less than
/// the default 100 ms, and then nothing is there to yield to.
#[test]
fn a_long_drain_commits_as_it_goes() {
    const ORDERS: i32 = 20_000;
    const BUFFERED: &str = "streams_state_keys{task=\"0\",store=\"orders\"}";
    let (topics, service) = orders_alone(ORDERS, "10s", &["--commit-interval", "20ms"]);
    service.wait_consumed(&topics.orders, ORDERS as usize, Duration::from_secs(60));
    assert_eq!(
        service.metric(BUFFERED),
        0.0,
        "the drain had begun before every order was read: the test proves nothing"
    );

    // Looked at far more often than the commits, so that no gauge published
    // during the drain goes unseen.
    let mut seen = std::collections::BTreeSet::new();
    let done = eventually_every(Duration::from_millis(10), Duration::from_secs(120), || {
        let buffered = service.metric(BUFFERED) as i32;
        seen.insert(buffered);
        buffered == ORDERS
    });
    assert!(
        done,
        "buffered orders seen: {seen:?}; log:\n{}",
        service.log()
    );
    let partial: Vec<&i32> = seen.iter().filter(|&&n| 0 < n && n < ORDERS).collect();
    assert!(
        !partial.is_empty(),
        "all {ORDERS} orders were taken in one commit (buffered orders seen: {seen:?})"
    );
}

/// A kill -9 under a backlog: the restarted instance restores the buffered
/// orders and shipments from the changelogs and takes the rest of both
/// inputs at once; every pair comes out exactly once, and no commit is
/// aborted.
#[test]
fn a_backlog_after_a_kill_9_comes_out_exact() {
    let topics = topics(2);
    let expected = produce_random_orders(&topics, 30_000);
    let second = restart_after_kill_9_under_backlog(
        "order-shipment-joiner",
        &service_args(&topics, &unique("joiner")),
        &topics.orders,
        10_000,
    );
    let output = wait_for_records(&topics.output, expected.len(), Duration::from_secs(180));
    assert_join(&output, &expected, &second.log());
    second.assert_no_aborted_commit();
}
