//! order-shipment-joiner's rules (docs/services/order-shipment-joiner.md and
//! the common rules of docs/services/README.md: the merge of two inputs,
//! lateness, watermarks through a repartition topic) on the broker-free test
//! driver.
//!
//! Most tests compare the output, record for record and in order, with a
//! model of the rules ([`Joiner`]) fed each task's input in the order the
//! task takes it in. While the driver's clock stands still a task never gives
//! up waiting for an empty input (`--max-task-idle`), so it takes in the full
//! merge by event time of its two inputs (orders on a tie: their input comes
//! first), whatever the order the topics are piped in; [`merged`] is that
//! order. Once time has passed (`settle`) and the task has given up waiting
//! for an input, it takes in the other input's records as they come until
//! that input delivers again (then it waits for it again); tests that rely on
//! that say so.

mod common;

use std::collections::{BTreeMap, HashMap};

use common::driver::{driver, lines, pipe_all, settings, settle};
use e2e_tests::{fixture, sorted};
use order_shipment_joiner::processor::{ORDERS, SHIPMENTS};
use order_shipment_joiner::Settings;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use streams_runtime::metrics;
use streams_runtime::murmur2_partition;
use streams_runtime::testing::TestDriver;

const ORDERS_TOPIC: &str = "orders";
const SHIPMENTS_TOPIC: &str = "shipments";
const OUTPUT: &str = "shipped-orders";
const REPARTITION: &str = "order-shipment-joiner-shipments-by-order-repartition";
const LATE: &str = "late";

/// A day and the join window, in seconds (the unit of the inputs' times).
const DAY: i64 = 86_400;
const WINDOW: i64 = 7 * DAY;
/// The default `--grace`, in milliseconds (the unit of event times).
const GRACE_MS: i64 = DAY * 1000;
/// Order 1 of the worked example: 2023-08-23 17:36:15.
const T: i64 = 1_692_812_175;

/// A random seed, or `$SEED` to replay a failure.
fn seed() -> u64 {
    std::env::var("SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| rand::rng().random())
}

fn joiner(flags: &[&str], partitions: usize) -> TestDriver {
    let settings: Settings = settings("order-shipment-joiner", flags);
    driver(order_shipment_joiner::pipeline(settings), partitions)
}

// ---------------------------------------------------------------------------
// Records and the model of the rules

#[derive(Debug, Clone, PartialEq)]
struct Order {
    id: i32,
    total: f64,
    customer: String,
    ts: i64,
}

#[derive(Debug, Clone, PartialEq)]
struct Shipment {
    id: String,
    order_id: i32,
    warehouse: String,
    ts: i64,
}

fn order(id: i32, ts: i64) -> Order {
    Order {
        id,
        total: f64::from(id.rem_euclid(1000)) + 0.25,
        customer: format!("customer {id}"),
        ts,
    }
}

fn shipment(id: &str, order_id: i32, ts: i64) -> Shipment {
    Shipment {
        id: id.to_string(),
        order_id,
        warehouse: "Boston".into(),
        ts,
    }
}

impl Order {
    fn line(&self) -> Value {
        json!({"key": self.id.to_string(), "value": {"id": self.id,
            "total_amount": self.total, "customer_name": self.customer,
            "order_ts_raw": self.ts}})
    }

    fn from_line(line: &Value) -> Self {
        let value = &line["value"];
        Order {
            id: value["id"].as_i64().unwrap() as i32,
            total: value["total_amount"].as_f64().unwrap(),
            customer: value["customer_name"].as_str().unwrap().into(),
            ts: value["order_ts_raw"].as_i64().unwrap(),
        }
    }

    fn key(&self) -> String {
        self.id.to_string()
    }
}

impl Shipment {
    fn line(&self) -> Value {
        json!({"key": self.id, "value": {"id": self.id, "order_id": self.order_id,
            "warehouse": self.warehouse, "ship_ts_raw": self.ts}})
    }

    fn from_line(line: &Value) -> Self {
        let value = &line["value"];
        Shipment {
            id: value["id"].as_str().unwrap().into(),
            order_id: value["order_id"].as_i64().unwrap() as i32,
            warehouse: value["warehouse"].as_str().unwrap().into(),
            ts: value["ship_ts_raw"].as_i64().unwrap(),
        }
    }
}

/// `yyyy-MM-dd HH:mm:ss`, UTC, of epoch seconds (Howard Hinnant's
/// `civil_from_days`).
fn utc(epoch_seconds: i64) -> String {
    let days = epoch_seconds.div_euclid(DAY);
    let second = epoch_seconds.rem_euclid(DAY);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        second / 3600,
        second % 3600 / 60,
        second % 60
    )
}

/// The output row of a joined pair.
fn row(order: &Order, shipment: &Shipment) -> Value {
    json!({"key": order.key(), "value": {"order_id": order.id, "order_ts": utc(order.ts),
        "total": order.total, "customer": order.customer, "ship_id": shipment.id,
        "ship_ts": utc(shipment.ts), "warehouse": shipment.warehouse,
        "hr_to_ship": (shipment.ts - order.ts).div_euclid(3600)}})
}

/// A record as a joining task takes it in.
#[derive(Debug, Clone)]
enum Input {
    Order(Order),
    /// A re-keyed shipment, from the task of shipments partition `upstream`,
    /// which had reached watermark `stamp` (ms) with it.
    Shipment {
        shipment: Shipment,
        upstream: usize,
        stamp: i64,
    },
}

impl Input {
    fn event_time(&self) -> i64 {
        match self {
            Input::Order(order) => order.ts * 1000,
            Input::Shipment { shipment, .. } => shipment.ts * 1000,
        }
    }

    fn line(&self) -> Value {
        match self {
            Input::Order(order) => order.line(),
            Input::Shipment { shipment, .. } => shipment.line(),
        }
    }
}

/// One joining task, as the rules describe it: the watermark is the smaller
/// of the orders partition's (largest order time so far minus the grace)
/// and the re-keyed shipments' (the least watermark stamped by any shipments
/// partition, minus infinity until every one has been heard from); a record
/// whose event time is `<` the watermark before it is late; an on-time
/// record joins every buffered record of the other side within the window
/// (a shipment's rows in order of order time, an order's in order of ship
/// time, equal times in arrival order) and is buffered. Buffered records are
/// never dropped here: the rules say expiry cannot lose a row, and a model
/// that keeps everything checks that.
struct Joiner {
    window_ms: i64,
    grace_ms: i64,
    orders_max: Option<i64>,
    upstream: Vec<Option<i64>>,
    orders: HashMap<i32, BTreeMap<i64, Vec<Order>>>,
    shipments: HashMap<i32, BTreeMap<i64, Vec<Shipment>>>,
    rows: Vec<Value>,
    late: Vec<Value>,
}

impl Joiner {
    fn new(upstreams: usize) -> Self {
        Joiner {
            window_ms: WINDOW * 1000,
            grace_ms: GRACE_MS,
            orders_max: None,
            upstream: vec![None; upstreams],
            orders: HashMap::new(),
            shipments: HashMap::new(),
            rows: Vec::new(),
            late: Vec::new(),
        }
    }

    fn watermark(&self) -> Option<i64> {
        let orders = self.orders_max.map(|max| max - self.grace_ms)?;
        let shipments = self
            .upstream
            .iter()
            .copied()
            .collect::<Option<Vec<i64>>>()?
            .into_iter()
            .min()?;
        Some(orders.min(shipments))
    }

    fn take(&mut self, input: &Input) {
        let time = input.event_time();
        let late = self.watermark().is_some_and(|watermark| time < watermark);
        if let Input::Shipment {
            upstream, stamp, ..
        } = input
        {
            let known = &mut self.upstream[*upstream];
            *known = Some(known.map_or(*stamp, |w| w.max(*stamp)));
        }
        if late {
            self.late.push(input.line());
            return;
        }
        match input {
            Input::Order(order) => {
                self.orders_max = Some(self.orders_max.map_or(time, |m| m.max(time)));
                if let Some(buffered) = self.shipments.get(&order.id) {
                    for shipment in buffered
                        .range(time..=time + self.window_ms)
                        .flat_map(|e| e.1)
                    {
                        self.rows.push(row(order, shipment));
                    }
                }
                let buffered = self.orders.entry(order.id).or_default();
                buffered.entry(time).or_default().push(order.clone());
            }
            Input::Shipment { shipment, .. } => {
                if let Some(buffered) = self.orders.get(&shipment.order_id) {
                    for order in buffered
                        .range(time - self.window_ms..=time)
                        .flat_map(|e| e.1)
                    {
                        self.rows.push(row(order, shipment));
                    }
                }
                let buffered = self.shipments.entry(shipment.order_id).or_default();
                buffered.entry(time).or_default().push(shipment.clone());
            }
        }
    }
}

/// The input of each task of a run over `partitions` partitions whose topics
/// received `orders` and `shipments` in these orders: orders by the hash of
/// their key, shipments re-keyed by order id, each stamped with the
/// watermark of its shipments partition (by the hash of its key), and the
/// two inputs merged by event time ([`merged`]).
fn task_inputs(orders: &[Order], shipments: &[Shipment], partitions: usize) -> Vec<Vec<Input>> {
    let partition = |key: &str| murmur2_partition(key.as_bytes(), partitions) as usize;
    let mut by_task: Vec<(Vec<Input>, Vec<Input>)> = vec![Default::default(); partitions];
    for order in orders {
        by_task[partition(&order.key())]
            .0
            .push(Input::Order(order.clone()));
    }
    let mut upstream_max: Vec<Option<i64>> = vec![None; partitions];
    for shipment in shipments {
        let upstream = partition(&shipment.id);
        let time = shipment.ts * 1000;
        let max = upstream_max[upstream].map_or(time, |m| m.max(time));
        upstream_max[upstream] = Some(max);
        by_task[partition(&shipment.order_id.to_string())]
            .1
            .push(Input::Shipment {
                shipment: shipment.clone(),
                upstream,
                stamp: max - GRACE_MS,
            });
    }
    by_task
        .into_iter()
        .map(|(orders, shipments)| merged(orders, shipments))
        .collect()
}

/// The merge of a task's two inputs by event time, orders first on a tie.
fn merged(orders: Vec<Input>, shipments: Vec<Input>) -> Vec<Input> {
    let mut out = Vec::with_capacity(orders.len() + shipments.len());
    let (mut orders, mut shipments) = (
        orders.into_iter().peekable(),
        shipments.into_iter().peekable(),
    );
    loop {
        let take_order = match (orders.peek(), shipments.peek()) {
            (Some(o), Some(s)) => o.event_time() <= s.event_time(),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return out,
        };
        out.extend(if take_order {
            orders.next()
        } else {
            shipments.next()
        });
    }
}

/// What the model expects of each task: its rows in order, and its late records.
struct Expected {
    rows: Vec<Vec<Value>>,
    late: Vec<Vec<Value>>,
}

impl Expected {
    fn all_rows(&self) -> Vec<Value> {
        self.rows.concat()
    }

    fn late_count(&self) -> usize {
        self.late.iter().map(Vec::len).sum()
    }
}

fn model(orders: &[Order], shipments: &[Shipment], partitions: usize) -> Expected {
    let mut expected = Expected {
        rows: Vec::new(),
        late: Vec::new(),
    };
    for inputs in task_inputs(orders, shipments, partitions) {
        let mut task = Joiner::new(partitions);
        for input in &inputs {
            task.take(input);
        }
        expected.rows.push(task.rows);
        expected.late.push(task.late);
    }
    expected
}

// ---------------------------------------------------------------------------
// Driving

fn pipe_orders(driver: &mut TestDriver, orders: &[Order]) {
    pipe_all(
        driver,
        ORDERS_TOPIC,
        &orders.iter().map(Order::line).collect::<Vec<_>>(),
    );
}

fn pipe_shipments(driver: &mut TestDriver, shipments: &[Shipment]) {
    pipe_all(
        driver,
        SHIPMENTS_TOPIC,
        &shipments.iter().map(Shipment::line).collect::<Vec<_>>(),
    );
}

/// The output of each partition, in order.
fn output_by_partition(driver: &TestDriver, partitions: usize) -> Vec<Vec<Value>> {
    let mut out = vec![Vec::new(); partitions];
    for record in driver.read(OUTPUT).expect("read") {
        out[record.partition as usize].push(record.to_json());
    }
    out
}

fn late_orders(driver: &TestDriver) -> u64 {
    driver.counter(metrics::RECORDS_LATE, &[("topic", ORDERS_TOPIC)])
}

fn late_shipments(driver: &TestDriver) -> u64 {
    driver.counter(metrics::RECORDS_LATE, &[("topic", REPARTITION)])
}

fn processor_events(driver: &TestDriver, name: &str) -> u64 {
    driver.counter(metrics::PROCESSOR_EVENTS, &[("name", name)])
}

/// The values of `topic` decoded as JSON, with their keys.
fn late_lines(driver: &TestDriver) -> Vec<Value> {
    lines(driver, LATE)
}

// ---------------------------------------------------------------------------
// The worked example

fn fixture_orders() -> Vec<Order> {
    fixture("order-shipment-joiner/orders.jsonl")
        .iter()
        .map(Order::from_line)
        .collect()
}

fn fixture_shipments() -> Vec<Shipment> {
    fixture("order-shipment-joiner/shipments.jsonl")
        .iter()
        .map(Shipment::from_line)
        .collect()
}

/// Pipes the fixture in one of three orders and returns the output.
fn fixture_run(pipe: impl FnOnce(&mut TestDriver, &[Value], &[Value])) -> Vec<Value> {
    let mut driver = joiner(&[], 1);
    pipe(
        &mut driver,
        &fixture("order-shipment-joiner/orders.jsonl"),
        &fixture("order-shipment-joiner/shipments.jsonl"),
    );
    settle(&mut driver);
    assert_eq!(late_orders(&driver) + late_shipments(&driver), 0);
    lines(&driver, OUTPUT)
}

/// The fixture's rows, in the order one task emits them (the full merge of
/// both topics by event time, whichever is piped first).
fn check_fixture_output(output: &[Value]) {
    let expected = fixture("order-shipment-joiner/shipped-orders.expected.jsonl");
    assert_eq!(sorted(output.to_vec()), sorted(expected));
    assert_eq!(
        output,
        model(&fixture_orders(), &fixture_shipments(), 1).all_rows()
    );
}

#[test]
fn fixture_with_orders_first() {
    check_fixture_output(&fixture_run(|driver, orders, shipments| {
        pipe_all(driver, ORDERS_TOPIC, orders);
        pipe_all(driver, SHIPMENTS_TOPIC, shipments);
    }));
}

#[test]
fn fixture_with_shipments_first() {
    check_fixture_output(&fixture_run(|driver, orders, shipments| {
        pipe_all(driver, SHIPMENTS_TOPIC, shipments);
        pipe_all(driver, ORDERS_TOPIC, orders);
    }));
}

#[test]
fn fixture_interleaved() {
    check_fixture_output(&fixture_run(|driver, orders, shipments| {
        for (o, s) in orders.chunks(3).zip(shipments.chunks(3)) {
            pipe_all(driver, ORDERS_TOPIC, o);
            pipe_all(driver, SHIPMENTS_TOPIC, s);
        }
    }));
}

#[test]
fn the_model_formats_times_as_the_document_does() {
    assert_eq!(utc(T), "2023-08-23 17:36:15");
    assert_eq!(utc(1_692_851_775), "2023-08-24 04:36:15");
    assert_eq!(utc(0), "1970-01-01 00:00:00");
    assert_eq!(utc(951_782_400), "2000-02-29 00:00:00");
    assert_eq!(utc(-1), "1969-12-31 23:59:59");
}

// ---------------------------------------------------------------------------
// Matching rules

#[test]
fn window_bounds_are_inclusive_at_both_ends() {
    let mut driver = joiner(&[], 1);
    let order_1 = order(1, T);
    let same_second = shipment("same-second", 1, T);
    let last_second = shipment("last-second", 1, T + WINDOW);
    pipe_orders(&mut driver, std::slice::from_ref(&order_1));
    pipe_shipments(
        &mut driver,
        &[
            shipment("before", 1, T - 1),
            same_second.clone(),
            last_second.clone(),
            shipment("one-second-too-late", 1, T + WINDOW + 1),
        ],
    );
    settle(&mut driver);
    let output = lines(&driver, OUTPUT);
    assert_eq!(
        output,
        [row(&order_1, &same_second), row(&order_1, &last_second)]
    );
    assert_eq!(output[0]["value"]["hr_to_ship"], json!(0));
    assert_eq!(output[1]["value"]["hr_to_ship"], json!(168));
    assert_eq!(late_orders(&driver) + late_shipments(&driver), 0);
}

/// The table of the worked example: order 11 and shipments s-a (exactly 7
/// days later, twice), s-b (a second more), s-c (a second before the order).
#[test]
fn the_documented_bounds_and_duplicates() {
    let mut driver = joiner(&[], 1);
    let order_11 = Order {
        id: 11,
        total: 99.5,
        customer: "Elaine Benes".into(),
        ts: 1_692_812_175,
    };
    let s_a = shipment("s-a", 11, 1_693_416_975);
    pipe_orders(&mut driver, std::slice::from_ref(&order_11));
    pipe_shipments(
        &mut driver,
        &[
            s_a.clone(),
            shipment("s-b", 11, 1_693_416_976),
            shipment("s-c", 11, 1_692_812_174),
            s_a.clone(),
        ],
    );
    settle(&mut driver);
    let expected = row(&order_11, &s_a);
    assert_eq!(expected["value"]["hr_to_ship"], json!(168));
    assert_eq!(expected["value"]["ship_ts"], json!("2023-08-30 17:36:15"));
    assert_eq!(lines(&driver, OUTPUT), [expected.clone(), expected]);
}

#[test]
fn several_shipments_early_shipments_and_duplicate_orders_each_join_once() {
    let mut driver = joiner(&[], 1);
    // Shipments of order 2 arrive before the order itself, out of time order
    // (within the grace), and are taken in before it: the task gives up
    // waiting for orders (`settle`). Order 3 arrives twice and has two
    // shipments, one before and one after its orders.
    let s2b = shipment("s2b", 2, T + 7200);
    let s2a = shipment("s2a", 2, T + 3600);
    let s3a = shipment("s3a", 3, T + 10);
    let s3b = shipment("s3b", 3, T + 20);
    pipe_shipments(&mut driver, &[s2b.clone(), s2a.clone(), s3a.clone()]);
    settle(&mut driver);
    assert!(lines(&driver, OUTPUT).is_empty());
    let (order_2, order_3) = (order(2, T), order(3, T));
    pipe_orders(
        &mut driver,
        &[order_2.clone(), order_3.clone(), order_3.clone()],
    );
    pipe_shipments(&mut driver, std::slice::from_ref(&s3b));
    settle(&mut driver);
    // Order 2 meets both of its buffered shipments, in order of ship time;
    // each copy of order 3 meets s3a; then s3b meets both copies.
    assert_eq!(
        lines(&driver, OUTPUT),
        [
            row(&order_2, &s2a),
            row(&order_2, &s2b),
            row(&order_3, &s3a),
            row(&order_3, &s3a),
            row(&order_3, &s3b),
            row(&order_3, &s3b),
        ]
    );
    assert_eq!(
        lines(&driver, OUTPUT)[..2]
            .iter()
            .map(|r| r["value"]["hr_to_ship"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2]
    );
}

#[test]
fn two_identical_orders_and_three_matching_shipments_give_six_rows() {
    let mut driver = joiner(&[], 1);
    let order_5 = order(5, T);
    let shipments: Vec<Shipment> = (0..3)
        .map(|n| shipment(&format!("s5-{n}"), 5, T + 60 * n))
        .collect();
    pipe_orders(&mut driver, &[order_5.clone(), order_5.clone()]);
    pipe_shipments(&mut driver, &shipments);
    settle(&mut driver);
    let expected: Vec<Value> = shipments
        .iter()
        .flat_map(|s| [row(&order_5, s), row(&order_5, s)])
        .collect();
    assert_eq!(lines(&driver, OUTPUT), expected);
}

/// A shipment that matches several buffered orders emits them in order of
/// order time, equal times in arrival order.
/// The merge waits for an empty input each time anew: having once given up
/// waiting for shipments does not let a later shipment skip the wait for
/// orders. (The wait used to be one per task, reset only when both inputs
/// had something buffered at once; taking records as they came never let
/// that happen, so after one wait ran out the task stopped merging.)
#[test]
fn a_task_waits_again_for_an_input_after_a_wait_ran_out() {
    let mut driver = joiner(&[], 1);
    let first = order(1, T);
    pipe_orders(&mut driver, std::slice::from_ref(&first));
    settle(&mut driver);
    let shipped = shipment("s1", 1, T + 60);
    pipe_shipments(&mut driver, std::slice::from_ref(&shipped));
    assert!(
        lines(&driver, OUTPUT).is_empty(),
        "the shipment waits for orders"
    );
    let earlier = order(1, T + 30);
    pipe_orders(&mut driver, std::slice::from_ref(&earlier));
    assert!(
        lines(&driver, OUTPUT).is_empty(),
        "the order goes first and the shipment waits again"
    );
    settle(&mut driver);
    assert_eq!(
        lines(&driver, OUTPUT),
        [row(&first, &shipped), row(&earlier, &shipped)]
    );
}

#[test]
fn a_shipment_meets_its_orders_in_order_of_order_time() {
    let mut driver = joiner(&[], 1);
    let first = Order {
        customer: "first to arrive".into(),
        ..order(7, T + 100)
    };
    let earliest = order(7, T);
    let second = Order {
        customer: "second to arrive".into(),
        ..order(7, T + 100)
    };
    pipe_orders(
        &mut driver,
        &[first.clone(), earliest.clone(), second.clone()],
    );
    let late_shipment = shipment("s7", 7, T + 3 * DAY);
    pipe_shipments(&mut driver, std::slice::from_ref(&late_shipment));
    settle(&mut driver);
    assert_eq!(
        lines(&driver, OUTPUT),
        [
            row(&earliest, &late_shipment),
            row(&first, &late_shipment),
            row(&second, &late_shipment),
        ]
    );
}

#[test]
fn rows_are_keyed_by_order_id_on_the_partition_of_their_key() {
    let mut driver = joiner(&[], 4);
    let orders: Vec<Order> = (0..40).map(|id| order(id, T + i64::from(id))).collect();
    let shipments: Vec<Shipment> = (0..40)
        .map(|id| shipment(&format!("ship-{id}"), id, T + 3600 + i64::from(id)))
        .collect();
    pipe_orders(&mut driver, &orders);
    pipe_shipments(&mut driver, &shipments);
    settle(&mut driver);
    let output = driver.read(OUTPUT).unwrap();
    assert_eq!(output.len(), 40);
    for record in &output {
        let key = record.key.as_deref().unwrap();
        assert_eq!(record.partition, murmur2_partition(key.as_bytes(), 4));
        assert_eq!(key, record.value.as_ref().unwrap()["order_id"].to_string());
    }
    assert_eq!(
        output_by_partition(&driver, 4),
        model(&orders, &shipments, 4).rows
    );
}

// ---------------------------------------------------------------------------
// State expiry

#[test]
fn expired_entries_leave_the_state_as_event_time_moves_on() {
    expired_entries_leave_the_state(|_| ());
}

/// No timer goes to a changelog, and a task rebuilt from its changelogs
/// alone sweeps its buffers all the same.
#[test]
fn a_task_restored_from_its_changelogs_sweeps_its_buffers_all_the_same() {
    expired_entries_leave_the_state(|driver| {
        let stored = |store: &str| {
            driver
                .read(&format!("order-shipment-joiner-{store}-changelog"))
                .unwrap()
                .len()
        };
        assert_eq!(stored("orders"), 50);
        assert_eq!(stored("timers"), 0);
        driver.crash_losing_state().unwrap();
    });
}

/// Buffers 50 orders and their shipments, commits, calls `then`, and
/// checks that each side's records expire at the first sweep after their
/// deadlines.
fn expired_entries_leave_the_state(then: impl FnOnce(&mut TestDriver)) {
    let mut driver = joiner(&[], 1);
    let orders: Vec<Order> = (0..50).map(|id| order(id, T + i64::from(id))).collect();
    let shipments: Vec<Shipment> = (0..50)
        .map(|id| shipment(&format!("s{id}"), id, T + 60 + i64::from(id)))
        .collect();
    pipe_orders(&mut driver, &orders);
    pipe_shipments(&mut driver, &shipments);
    settle(&mut driver);
    then(&mut driver);
    assert_eq!(lines(&driver, OUTPUT).len(), 50);
    let ids: Vec<String> = {
        let mut ids: Vec<String> = (0..50).map(|id: i32| id.to_string()).collect();
        ids.sort();
        ids
    };
    assert_eq!(driver.state_keys(&ORDERS).unwrap(), ids);
    assert_eq!(driver.state_keys(&SHIPMENTS).unwrap(), ids);
    let buffered = driver.state(&ORDERS, "7").unwrap().expect("order 7");
    assert_eq!(
        buffered.keys().copied().collect::<Vec<_>>(),
        [(T + 7) * 1000]
    );
    assert_eq!(buffered[&((T + 7) * 1000)][0].customer_name, "customer 7");

    // Both streams move on to order 0's time + 8 days: the watermark (a day
    // behind) is exactly order 0's time + 7 days, which keeps order 0 (it
    // goes once the watermark is past that) and expires every shipment up
    // to that time, that is all of them.
    let marker_time = T + WINDOW + DAY;
    pipe_orders(&mut driver, &[order(1000, marker_time)]);
    pipe_shipments(&mut driver, &[shipment("marker", 1000, marker_time)]);
    settle(&mut driver);
    assert_eq!(processor_events(&driver, "orders_expired"), 0);
    assert_eq!(processor_events(&driver, "shipments_expired"), 50);
    assert_eq!(driver.state_keys(&SHIPMENTS).unwrap(), ["1000"]);
    assert_eq!(driver.state_keys(&ORDERS).unwrap().len(), 51);

    // One second more: order 0's deadline has passed, but orders are swept
    // half a window after their last sweep (at T + 7 days), so it stays.
    pipe_orders(&mut driver, &[order(1001, marker_time + 1)]);
    pipe_shipments(&mut driver, &[shipment("marker-2", 1001, marker_time + 1)]);
    settle(&mut driver);
    assert_eq!(processor_events(&driver, "orders_expired"), 0);
    assert!(driver.state(&ORDERS, "0").unwrap().is_some());
    // The watermark at that sweep, T + 10.5 days: every order up to order
    // 49 (at T + 49 s) has expired, and the marker orders, whose window is
    // still open, are kept. Shipments, swept a day (the grace) after their
    // last sweep, lose the first two markers.
    let next_order_sweep = T + WINDOW + WINDOW / 2;
    pipe_orders(&mut driver, &[order(1002, next_order_sweep + DAY)]);
    pipe_shipments(
        &mut driver,
        &[shipment("marker-3", 1002, next_order_sweep + DAY)],
    );
    settle(&mut driver);
    assert_eq!(processor_events(&driver, "orders_expired"), 50);
    assert_eq!(processor_events(&driver, "shipments_expired"), 52);
    let markers = ["1000", "1001", "1002"];
    assert_eq!(driver.state_keys(&ORDERS).unwrap(), markers);
    assert_eq!(driver.state_keys(&SHIPMENTS).unwrap(), ["1002"]);
    // Both streams 10 days on: everything whose window has closed goes; the
    // newest order id's records, and order 1002, whose window is open, stay.
    pipe_orders(&mut driver, &[order(2000, marker_time + 10 * DAY)]);
    pipe_shipments(
        &mut driver,
        &[shipment("last", 2000, marker_time + 10 * DAY)],
    );
    settle(&mut driver);
    assert_eq!(processor_events(&driver, "orders_expired"), 52);
    assert_eq!(processor_events(&driver, "shipments_expired"), 53);
    assert_eq!(driver.state_keys(&ORDERS).unwrap(), ["1002", "2000"]);
    assert_eq!(driver.state_keys(&SHIPMENTS).unwrap(), ["2000"]);
    // No timer per order id: one sweep timer per side.
    let timers: f64 = driver
        .metrics()
        .gauges
        .iter()
        .filter(|((name, _), _)| *name == metrics::TIMERS_PENDING)
        .map(|(_, value)| value)
        .sum();
    assert_eq!(timers, 2.0);
    // The markers joined each other and nothing else.
    let output = lines(&driver, OUTPUT);
    assert_eq!(output.len(), 54);
    assert_eq!(
        output[50..]
            .iter()
            .map(|r| r["value"]["ship_id"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["marker", "marker-2", "marker-3", "last"]
    );
}

// ---------------------------------------------------------------------------
// Ten times the old end-to-end model test

/// Random orders and 0–2 shipments each (delays from −1 to 9 days), both
/// topics in time order, a commit every 4 000 records: nothing is late, the
/// output is the nested-loop interval join, and expired records are swept.
#[test]
fn a_hundred_thousand_orders_over_three_partitions_match_a_nested_loop_join() {
    match_a_nested_loop_join(100_000, &[], |driver| driver.commit().unwrap());
}

/// The same with the least memory for state (a read cache of a few
/// hundred entries per task, where some 20 000 orders per task are inside
/// the window at any time), through crashes that lose the local state:
/// every task restored from its changelogs, its sweeps started again.
#[test]
fn orders_beyond_the_memory_limit_join_and_expire_through_crashes_as_in_memory() {
    let mut crashes = 0;
    match_a_nested_loop_join(20_000, &["--state-memory-limit", "1"], |driver| {
        driver.commit().unwrap();
        driver.crash_losing_state().unwrap();
        crashes += 1;
    });
    assert!(crashes > 5, "{crashes} crashes");
}

fn match_a_nested_loop_join(
    count: i32,
    flags: &[&str],
    mut every_chunk: impl FnMut(&mut TestDriver),
) {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let base = 1_692_000_000i64;
    let mut orders: Vec<Order> = (0..count)
        .map(|id| order(id, base + rng.random_range(0..30 * DAY)))
        .collect();
    let mut shipments: Vec<Shipment> = Vec::new();
    for o in &orders {
        for n in 0..rng.random_range(0..3) {
            let delay = rng.random_range(-DAY..9 * DAY);
            shipments.push(shipment(&format!("ship-{}-{n}", o.id), o.id, o.ts + delay));
        }
    }
    orders.sort_by_key(|o| (o.ts, o.id));
    shipments.sort_by(|a, b| (a.ts, &a.id).cmp(&(b.ts, &b.id)));
    let order_time: HashMap<i32, i64> = orders.iter().map(|o| (o.id, o.ts)).collect();
    let mut nested_loop: Vec<(String, i64)> = shipments
        .iter()
        .filter_map(|s| {
            let order_ts = order_time[&s.order_id];
            (order_ts <= s.ts && s.ts <= order_ts + WINDOW)
                .then(|| (s.id.clone(), (s.ts - order_ts) / 3600))
        })
        .collect();
    nested_loop.sort();

    let mut driver = joiner(flags, 3);
    let mut piper = RawPiper::new(3);
    for chunk in orders.chunks(4_000) {
        piper.pipe_orders(&mut driver, chunk);
        every_chunk(&mut driver);
    }
    for chunk in shipments.chunks(4_000) {
        piper.pipe_shipments(&mut driver, chunk);
        every_chunk(&mut driver);
    }
    settle(&mut driver);
    let output = output_by_partition(&driver, 3);
    let mut joined: Vec<(String, i64)> = output
        .concat()
        .iter()
        .map(|r| {
            (
                r["value"]["ship_id"].as_str().unwrap().to_string(),
                r["value"]["hr_to_ship"].as_i64().unwrap(),
            )
        })
        .collect();
    joined.sort();
    assert_eq!(joined, nested_loop, "seed {seed}");
    assert_eq!(output, model(&orders, &shipments, 3).rows, "seed {seed}");
    assert_eq!(
        late_orders(&driver) + late_shipments(&driver),
        0,
        "seed {seed}"
    );
    // Expired orders left the state: none is buffered whose window closed
    // more than a sweep period (half a window) and the grace before the
    // last record of the input that ends first (it holds the watermark),
    // with a day's slack for the tasks' own watermarks.
    let last_of = |times: &mut dyn Iterator<Item = i64>| times.max().unwrap();
    let last =
        last_of(&mut orders.iter().map(|o| o.ts)).min(last_of(&mut shipments.iter().map(|s| s.ts)));
    let buffered = driver.state_keys(&ORDERS).unwrap();
    assert!(buffered.len() < orders.len() / 2, "seed {seed}");
    for id in buffered {
        let order_ts = order_time[&id.parse::<i32>().unwrap()];
        assert!(
            order_ts + WINDOW + WINDOW / 2 + 2 * DAY >= last,
            "order {id} at {order_ts} still buffered, the last record at {last}; seed {seed}"
        );
    }
}

/// Pipes many records fast: the values are encoded here (Avro binary behind
/// the wire-format header of the schema id the driver registered), for the
/// driver's conversion of JSON through generic Avro values, unoptimised in
/// a debug build, adds about a fifth to the CPU time of the 200 000-record
/// test. The first record of each topic is piped as JSON, which registers
/// the schema, and checks the encoding here against the driver's.
struct RawPiper {
    partitions: usize,
    headers: HashMap<&'static str, Vec<u8>>,
}

fn zigzag(n: i64, out: &mut Vec<u8>) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn avro_string(text: &str, out: &mut Vec<u8>) {
    zigzag(text.len() as i64, out);
    out.extend_from_slice(text.as_bytes());
}

impl RawPiper {
    fn new(partitions: usize) -> Self {
        RawPiper {
            partitions,
            headers: HashMap::new(),
        }
    }

    fn order_bytes(order: &Order) -> Vec<u8> {
        let mut out = Vec::new();
        zigzag(i64::from(order.id), &mut out);
        out.extend_from_slice(&order.total.to_le_bytes());
        avro_string(&order.customer, &mut out);
        zigzag(order.ts, &mut out);
        out
    }

    fn shipment_bytes(shipment: &Shipment) -> Vec<u8> {
        let mut out = Vec::new();
        avro_string(&shipment.id, &mut out);
        zigzag(i64::from(shipment.order_id), &mut out);
        avro_string(&shipment.warehouse, &mut out);
        zigzag(shipment.ts, &mut out);
        out
    }

    fn pipe(
        &mut self,
        driver: &mut TestDriver,
        topic: &'static str,
        key: &str,
        line: Value,
        body: Vec<u8>,
    ) {
        match self.headers.get(topic) {
            Some(header) => {
                let value = [header.as_slice(), &body].concat();
                let partition = murmur2_partition(key.as_bytes(), self.partitions);
                driver
                    .pipe_raw(topic, partition, Some(key.as_bytes()), Some(&value))
                    .unwrap();
            }
            None => {
                pipe_all(driver, topic, &[line]);
                let raw = driver.read(topic).unwrap().remove(0).raw.unwrap();
                assert_eq!(raw[5..], body, "Avro encoding of {topic}");
                self.headers.insert(topic, raw[..5].to_vec());
            }
        }
    }

    fn pipe_orders(&mut self, driver: &mut TestDriver, orders: &[Order]) {
        for order in orders {
            self.pipe(
                driver,
                ORDERS_TOPIC,
                &order.key(),
                order.line(),
                Self::order_bytes(order),
            );
        }
    }

    fn pipe_shipments(&mut self, driver: &mut TestDriver, shipments: &[Shipment]) {
        for shipment in shipments {
            let body = Self::shipment_bytes(shipment);
            self.pipe(driver, SHIPMENTS_TOPIC, &shipment.id, shipment.line(), body);
        }
    }
}

// ---------------------------------------------------------------------------
// Lateness

/// With `--late-topic`: an order and a shipment more than a day behind the
/// watermark are late, counted per topic, copied to the late topic and not
/// joined; a record exactly at the watermark is on time.
#[test]
fn records_behind_the_watermark_are_late_and_not_joined() {
    let mut driver = joiner(&["--late-topic", LATE], 1);
    let old_order = order(1, T);
    let recent_order = order(2, T + 10 * DAY);
    pipe_orders(&mut driver, &[old_order.clone(), recent_order.clone()]);
    let recent_shipment = shipment("recent", 2, T + 10 * DAY);
    pipe_shipments(&mut driver, std::slice::from_ref(&recent_shipment));
    settle(&mut driver);
    // Both partitions are at T + 10 days: the watermark is T + 9 days.
    let stale_shipment = shipment("stale", 1, T + 9 * DAY - 1);
    let stale_order = order(3, T + 9 * DAY - 1);
    let order_at_watermark = order(4, T + 9 * DAY);
    let shipment_at_watermark = shipment("at-watermark", 4, T + 9 * DAY);
    pipe_shipments(&mut driver, std::slice::from_ref(&stale_shipment));
    pipe_orders(
        &mut driver,
        &[stale_order.clone(), order_at_watermark.clone()],
    );
    pipe_shipments(
        &mut driver,
        &[
            shipment("for-stale-order", 3, T + 9 * DAY),
            shipment_at_watermark.clone(),
        ],
    );
    settle(&mut driver);
    assert_eq!(
        lines(&driver, OUTPUT),
        [
            row(&recent_order, &recent_shipment),
            row(&order_at_watermark, &shipment_at_watermark)
        ]
    );
    assert_eq!(late_orders(&driver), 1);
    assert_eq!(late_shipments(&driver), 1);
    // The late topic gets the records as the task read them, in that order
    // (the task gave up waiting for orders at `settle` and no order came
    // since, so it takes the stale shipment in as it comes), the re-keyed
    // shipment under its order id.
    let late = late_lines(&driver);
    assert_eq!(late.len(), 2, "{late:?}");
    assert_eq!(late[0]["key"], json!("1"));
    assert_eq!(late[0]["value"], stale_shipment.line()["value"]);
    assert_eq!(late[1], stale_order.line());
}

/// While one input has said nothing the task watermark is minus infinity,
/// and nothing is late, however far the other input has come.
#[test]
fn nothing_is_late_before_both_inputs_have_a_watermark() {
    let mut driver = joiner(&[], 1);
    let orders = [order(1, T + 30 * DAY), order(2, T)];
    pipe_orders(&mut driver, &orders);
    settle(&mut driver);
    let shipments = [shipment("s2", 2, T + 60), shipment("s1", 1, T + 30 * DAY)];
    pipe_shipments(&mut driver, &shipments);
    settle(&mut driver);
    assert_eq!(
        lines(&driver, OUTPUT),
        [
            row(&orders[1], &shipments[0]),
            row(&orders[0], &shipments[1])
        ]
    );
    assert_eq!(late_orders(&driver) + late_shipments(&driver), 0);
}

// ---------------------------------------------------------------------------
// Event time through the repartition topic is exact (whatever the commits)

/// Six orders, the last far ahead, then shipments: on time ones, one far
/// ahead (it joins the far order), and two more than a day behind it that
/// would join orders 1 and 2 if they were on time. They are late: the task
/// has taken in the far order (orders are merged by event time, so before
/// the far shipment), and the far shipment carries its partition's
/// watermark, 20 days past them.
fn stale_shipments_scenario() -> (Vec<Order>, Vec<Shipment>) {
    let orders = vec![
        order(1, T),
        order(2, T + 3600),
        order(3, T + 7200),
        order(4, T + DAY),
        order(5, T + DAY + 60),
        order(6, T + 20 * DAY),
    ];
    let shipments = vec![
        shipment("s1", 1, T + 1800),
        shipment("s2", 2, T + 2 * 3600),
        shipment("s3", 3, T + DAY),
        shipment("s5", 5, T + 2 * DAY),
        shipment("s6-far", 6, T + 21 * DAY),
        shipment("stale-1", 1, T + 2 * DAY),
        shipment("stale-2", 2, T + 3 * DAY),
    ];
    (orders, shipments)
}

/// When to commit while piping: before record `n` (orders, then shipments,
/// counted together) when `plan(n)`.
fn run_with_commits(
    orders: &[Order],
    shipments: &[Shipment],
    partitions: usize,
    plan: &dyn Fn(usize) -> bool,
) -> TestDriver {
    let mut driver = joiner(&["--late-topic", LATE], partitions);
    let mut n = 0;
    let mut maybe_commit = |driver: &mut TestDriver| {
        if plan(n) {
            driver.commit().unwrap();
        }
        n += 1;
    };
    for o in orders {
        maybe_commit(&mut driver);
        pipe_orders(&mut driver, std::slice::from_ref(o));
    }
    for s in shipments {
        maybe_commit(&mut driver);
        pipe_shipments(&mut driver, std::slice::from_ref(s));
    }
    settle(&mut driver);
    driver
}

type Plan = (&'static str, Box<dyn Fn(usize) -> bool>);

fn commit_plans(far: usize) -> Vec<Plan> {
    vec![
        ("never", Box::new(|_| false)),
        ("before every record", Box::new(|_| true)),
        ("every other record", Box::new(|n| n % 2 == 1)),
        ("right before the far shipment", Box::new(move |n| n == far)),
        (
            "right after the far shipment",
            Box::new(move |n| n == far + 1),
        ),
        (
            "between the stale shipments",
            Box::new(move |n| n == far + 2),
        ),
    ]
}

#[test]
fn stale_shipments_behind_a_far_shipment_are_late_whatever_the_commits() {
    let (orders, shipments) = stale_shipments_scenario();
    let expected = model(&orders, &shipments, 1);
    let stale: Vec<Value> = shipments[5..].iter().map(Shipment::line).collect();
    assert_eq!(
        expected.late,
        std::slice::from_ref(&stale),
        "the model's own answer"
    );
    let s = |id: &str| shipments.iter().find(|s| s.id == id).unwrap();
    assert_eq!(
        expected.all_rows(),
        [
            row(&orders[0], s("s1")),
            row(&orders[1], s("s2")),
            row(&orders[2], s("s3")),
            row(&orders[4], s("s5")),
            row(&orders[5], s("s6-far")),
        ]
    );
    let far = orders.len() + 4;
    for (name, plan) in commit_plans(far) {
        let driver = run_with_commits(&orders, &shipments, 1, &plan);
        assert_eq!(
            lines(&driver, OUTPUT),
            expected.all_rows(),
            "commits {name}"
        );
        assert_eq!(late_shipments(&driver), 2, "commits {name}");
        assert_eq!(late_orders(&driver), 0, "commits {name}");
        let late_values: Vec<Value> = late_lines(&driver)
            .iter()
            .map(|l| l["value"].clone())
            .collect();
        let stale_values: Vec<Value> = stale.iter().map(|l| l["value"].clone()).collect();
        assert_eq!(late_values, stale_values, "commits {name}");
    }
}

/// The orders an id of which lands in each of `partitions` partitions, and
/// shipment ids landing in each, to build scenarios partition by partition.
fn id_in_partition(partition: usize, partitions: usize, from: i32) -> i32 {
    (from..)
        .find(|id| murmur2_partition(id.to_string().as_bytes(), partitions) as usize == partition)
        .unwrap()
}

fn ship_id_in_partition(prefix: &str, partition: usize, partitions: usize) -> String {
    (0..)
        .map(|n| format!("{prefix}-{n}"))
        .find(|id| murmur2_partition(id.as_bytes(), partitions) as usize == partition)
        .unwrap()
}

/// The scenario over three partitions. A task's shipments watermark is the
/// least that any of the three shipments partitions has stamped on a record
/// it received (or announced at a commit), so every shipments partition
/// sends it a far shipment first: one for the far order of each task from
/// each shipments partition. Then the stale shipments, each more than a day
/// behind, are late in every run, from the stamps alone.
fn stale_shipments_over_three_partitions() -> (Vec<Order>, Vec<Shipment>) {
    let mut orders = Vec::new();
    let mut shipments = Vec::new();
    let mut far_orders = Vec::new();
    for task in 0..3 {
        let near = id_in_partition(task, 3, 100 * task as i32 + 1);
        let other = id_in_partition(task, 3, near + 1);
        let far_id = id_in_partition(task, 3, other + 1);
        orders.push(order(near, T + task as i64 * 60));
        orders.push(order(other, T + DAY));
        orders.push(order(far_id, T + 20 * DAY));
        far_orders.push(far_id);
        shipments.push(shipment(
            &ship_id_in_partition(&format!("near-{task}"), task, 3),
            near,
            T + 3600,
        ));
        shipments.push(shipment(
            &ship_id_in_partition(&format!("other-{task}"), (task + 1) % 3, 3),
            other,
            T + DAY + 3600,
        ));
    }
    // Shipments in time order so far; the far ones now.
    shipments.sort_by_key(|s| s.ts);
    for from in 0..3 {
        for (task, far_id) in far_orders.iter().enumerate() {
            let id = ship_id_in_partition(&format!("far-{from}-to-{task}"), from, 3);
            shipments.push(shipment(&id, *far_id, T + 21 * DAY));
        }
    }
    // Orders partition by partition are in time order too.
    orders.sort_by_key(|o| o.ts);
    let near: Vec<i32> = orders
        .iter()
        .filter(|o| o.ts < T + DAY)
        .map(|o| o.id)
        .collect();
    shipments.push(shipment("stale-1", near[0], T + 2 * DAY));
    shipments.push(shipment("stale-2", near[2], T + 3 * DAY));
    (orders, shipments)
}

#[test]
fn stale_shipments_over_three_partitions_are_late_whatever_the_commits() {
    let (orders, shipments) = stale_shipments_over_three_partitions();
    let expected = model(&orders, &shipments, 3);
    assert_eq!(expected.late_count(), 2, "the model's own answer");
    assert_eq!(expected.all_rows().len(), 6 + 9);
    let far = orders.len() + 6 + 9;
    for (name, plan) in commit_plans(far) {
        let driver = run_with_commits(&orders, &shipments, 3, &plan);
        assert_eq!(
            output_by_partition(&driver, 3),
            expected.rows,
            "commits {name}"
        );
        assert_eq!(late_shipments(&driver), 2, "commits {name}");
        assert_eq!(late_orders(&driver), 0, "commits {name}");
    }
}

/// Random event times with late records on both sides, the two topics
/// piped in a random interleaving with commits and crashes (half of them
/// losing the local state) at random points, on one partition (a commit's
/// announcements then say nothing that the stamps have not said): the
/// output and the late records are the model's.
#[test]
fn random_interleavings_commits_and_crashes_match_the_model_of_the_lateness_rule() {
    for _ in 0..20 {
        let seed = seed();
        let mut rng = StdRng::seed_from_u64(seed);
        let (orders, shipments) = random_disordered(&mut rng, 60, 100);
        let expected = model(&orders, &shipments, 1);
        let mut driver = joiner(&["--late-topic", LATE], 1);
        let mut sides: Vec<bool> =
            [vec![true; orders.len()], vec![false; shipments.len()]].concat();
        sides.shuffle(&mut rng);
        let (mut next_order, mut next_shipment) = (orders.iter(), shipments.iter());
        for is_order in sides {
            if rng.random_bool(0.2) {
                driver.commit().unwrap();
            }
            if rng.random_bool(0.02) {
                if rng.random_bool(0.5) {
                    driver.crash_losing_state().unwrap();
                } else {
                    driver.crash().unwrap();
                }
            }
            if is_order {
                pipe_orders(
                    &mut driver,
                    std::slice::from_ref(next_order.next().unwrap()),
                );
            } else {
                pipe_shipments(
                    &mut driver,
                    std::slice::from_ref(next_shipment.next().unwrap()),
                );
            }
        }
        settle(&mut driver);
        assert_eq!(lines(&driver, OUTPUT), expected.all_rows(), "seed {seed}");
        assert_eq!(
            late_orders(&driver) + late_shipments(&driver),
            expected.late_count() as u64,
            "seed {seed}"
        );
    }
}

/// The same over three partitions, without commits: the model follows each
/// shipments partition's stamps, which run ahead of many of the records
/// they come with (see
/// `an_on_time_shipment_joins_its_order_even_when_its_stamp_is_far_ahead_of_it`).
#[test]
fn random_interleavings_over_three_partitions_match_the_model_of_the_lateness_rule() {
    for _ in 0..10 {
        let seed = seed();
        let mut rng = StdRng::seed_from_u64(seed);
        let (orders, shipments) = random_disordered(&mut rng, 150, 250);
        let expected = model(&orders, &shipments, 3);
        let mut driver = joiner(&[], 3);
        let mut sides: Vec<bool> =
            [vec![true; orders.len()], vec![false; shipments.len()]].concat();
        sides.shuffle(&mut rng);
        let (mut next_order, mut next_shipment) = (orders.iter(), shipments.iter());
        for is_order in sides {
            if is_order {
                pipe_orders(
                    &mut driver,
                    std::slice::from_ref(next_order.next().unwrap()),
                );
            } else {
                pipe_shipments(
                    &mut driver,
                    std::slice::from_ref(next_shipment.next().unwrap()),
                );
            }
        }
        settle(&mut driver);
        assert_eq!(
            output_by_partition(&driver, 3),
            expected.rows,
            "seed {seed}"
        );
        assert_eq!(
            late_orders(&driver) + late_shipments(&driver),
            expected.late_count() as u64,
            "seed {seed}"
        );
    }
}

/// Over several task partitions a re-keyed record's stamp can be far ahead
/// of the record itself, for its shipments partition has moved on with
/// records for other tasks. Before the record is processed the stamp may
/// move the watermark no further than the record's own event time minus the
/// grace; the rest counts right after the record. Otherwise the watermark
/// would pass the expiry of the orders the on-time record matches, and they
/// would be dropped before it is joined.
///
/// Here task 0 has taken in orders `a` (at T) and `c` (T + 10 days) while no
/// shipment had arrived (watermark minus infinity); the only shipments
/// partition then sends a shipment 20 days on to task 1, then shipment `s`
/// of order `a` (T + 5 days) to task 0. `s` is on time (task 0 has heard
/// nothing from the shipments partition yet, its watermark is minus
/// infinity) and matches `a`: one row (a, s). Its stamp (T + 19 days) lifts
/// task 0's watermark to T + 9 days, past `a`'s expiry (T + 7 days), only
/// after the join; `a` then expires.
#[test]
fn an_on_time_shipment_joins_its_order_even_when_its_stamp_is_far_ahead_of_it() {
    let settings: Settings = settings("order-shipment-joiner", &[]);
    let mut driver = TestDriver::builder(order_shipment_joiner::pipeline(settings).unwrap())
        .partitions(2)
        .topic_partitions(SHIPMENTS_TOPIC, 1)
        .build()
        .unwrap();
    let a = id_in_partition(0, 2, 1);
    let c = id_in_partition(0, 2, a + 1);
    let b = id_in_partition(1, 2, 1);
    let order_a = order(a, T);
    pipe_orders(&mut driver, &[order_a.clone(), order(c, T + 10 * DAY)]);
    settle(&mut driver);
    let s = shipment("s", a, T + 5 * DAY);
    pipe_shipments(&mut driver, &[shipment("x", b, T + 20 * DAY), s.clone()]);
    settle(&mut driver);
    assert_eq!(late_orders(&driver) + late_shipments(&driver), 0);
    assert_eq!(
        lines(&driver, OUTPUT),
        [row(&order_a, &s)],
        "orders expired: {}",
        processor_events(&driver, "orders_expired")
    );
    assert_eq!(
        processor_events(&driver, "orders_expired"),
        1,
        "`a` expires once `s` has joined it; `c` is still open"
    );
}

/// `order_count` orders over 10 ids (so that ids have several orders) and
/// `shipment_count` shipments, times rising over 20 days with a few hours
/// of disorder, and one record in eight of each topic up to 4 days behind.
fn random_disordered(
    rng: &mut StdRng,
    order_count: usize,
    shipment_count: usize,
) -> (Vec<Order>, Vec<Shipment>) {
    let time_at = |i: usize, count: usize, rng: &mut StdRng| {
        let front = T + (20 * DAY) * i as i64 / count as i64;
        if rng.random_bool(0.125) {
            front - rng.random_range(0..4 * DAY)
        } else {
            front - rng.random_range(0..6 * 3600)
        }
    };
    let orders = (0..order_count)
        .map(|i| {
            let ts = time_at(i, order_count, rng);
            Order {
                total: i as f64 + 0.5,
                ..order(rng.random_range(0..10), ts)
            }
        })
        .collect();
    let shipments = (0..shipment_count)
        .map(|i| {
            let ts = time_at(i, shipment_count, rng);
            shipment(&format!("ship-{i}"), rng.random_range(0..10), ts)
        })
        .collect();
    (orders, shipments)
}
