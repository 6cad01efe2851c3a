//! Event time through a repartition topic is exact, end to end: a record
//! that crosses a repartition topic (or a stage link) carries its writer's
//! watermark, and the reading task judges lateness against its watermark
//! before the record, so lateness and the output no longer depend on when
//! commits happen to announce watermarks (docs/services/README.md, "Event
//! time and watermarks" and "Late records").
//!
//! Each test runs the service once per `--commit-interval` (10 ms, 100 ms,
//! 5 s), concurrently, each run on its own topics, and expects the same
//! output from every run: the answer of a small model of the rules.
//! `Service::start` fixes the commit interval at 100 ms, so the runs here
//! start the binaries themselves ([`Run`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use e2e_tests::windows::{model as window_model, Order as MarketOrder, WindowRules};
use e2e_tests::*;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::Value;

const COMMIT_INTERVALS: [&str; 3] = ["10ms", "100ms", "5s"];
const TIMEOUT: Duration = Duration::from_secs(90);

/// A service binary started with a chosen commit interval, killed when dropped.
struct Run {
    child: Child,
    http_port: u16,
    log: PathBuf,
    commit_interval: String,
}

impl Run {
    fn start(binary: &str, arguments: &[String], commit_interval: &str) -> Run {
        let http_port = free_port();
        let log = scratch_dir().join(format!("{}.log", unique(binary)));
        let child = Command::new(bin(binary))
            .args(arguments)
            .arg("--state-dir")
            .arg(fresh_state_dir())
            .arg("--http-addr")
            .arg(format!("127.0.0.1:{http_port}"))
            .arg("--commit-interval")
            .arg(commit_interval)
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
            .env("SCHEMA_REGISTRY_URL", registry())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start service");
        Run {
            child,
            http_port,
            log,
            commit_interval: commit_interval.to_string(),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn metrics(&self) -> String {
        http_get(self.http_port, "/metrics").unwrap_or_default()
    }

    fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics(), series)
    }

    /// What to show when an assertion fails.
    fn context(&self) -> String {
        format!(
            "commit interval {}\nmetrics:\n{}\nlog:\n{}",
            self.commit_interval,
            self.metrics(),
            self.log()
        )
    }

    /// Waits until `value()` (of the published metrics, refreshed at every
    /// commit) is at least `target`.
    fn wait_until(&self, what: &str, target: f64, value: impl Fn(&str) -> f64) {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let now = value(&self.metrics());
            if now >= target {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {now} of {target} after {TIMEOUT:?}\n{}",
                self.context()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until `series` reaches `target`.
    fn wait_metric(&self, series: &str, target: f64) {
        self.wait_until(series, target, |text| metric_value(text, series));
    }

    /// Waits until `count` records of `topic` are consumed (as published at
    /// a commit).
    fn wait_consumed_records(&self, topic: &str, count: usize) {
        self.wait_metric(
            &format!("streams_records_consumed_total{{topic=\"{topic}\"}}"),
            count as f64,
        );
    }

    /// Waits until `count` records of `topic` are consumed and a commit has
    /// followed: nothing more comes of them.
    fn wait_consumed(&self, topic: &str, count: usize) {
        self.wait_consumed_records(topic, count);
        let commits = self.metric("streams_commits_total");
        self.wait_metric("streams_commits_total", commits + 1.0);
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------
// order-shipment-joiner: records and a model of its rules
// (docs/services/order-shipment-joiner.md)

const DAY: i64 = 86_400;
const WINDOW: i64 = 7 * DAY;
const GRACE_MS: i64 = DAY * 1000;
const T: i64 = 1_692_812_175;

#[derive(Debug, Clone)]
struct Order {
    id: i32,
    ts: i64,
}

#[derive(Debug, Clone)]
struct Shipment {
    id: String,
    order_id: i32,
    ts: i64,
}

fn order(id: i32, ts: i64) -> Order {
    Order { id, ts }
}

fn shipment(id: &str, order_id: i32, ts: i64) -> Shipment {
    Shipment {
        id: id.to_string(),
        order_id,
        ts,
    }
}

impl Order {
    fn total(&self) -> f64 {
        f64::from(self.id) + 0.25
    }

    fn line(&self) -> Value {
        json!({"key": self.id.to_string(), "value": {"id": self.id,
            "total_amount": self.total(), "customer_name": format!("customer {}", self.id),
            "order_ts_raw": self.ts}})
    }
}

impl Shipment {
    fn line(&self) -> Value {
        json!({"key": self.id, "value": {"id": self.id, "order_id": self.order_id,
            "warehouse": "Boston", "ship_ts_raw": self.ts}})
    }
}

/// `yyyy-MM-dd HH:mm:ss`, UTC (Howard Hinnant's `civil_from_days`).
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

fn row(order: &Order, shipment: &Shipment) -> Value {
    json!({"key": order.id.to_string(), "value": {"order_id": order.id,
        "order_ts": utc(order.ts), "total": order.total(),
        "customer": format!("customer {}", order.id), "ship_id": shipment.id,
        "ship_ts": utc(shipment.ts), "warehouse": "Boston",
        "hr_to_ship": (shipment.ts - order.ts).div_euclid(3600)}})
}

/// A record as a joining task takes it in; a re-keyed shipment comes from
/// shipments partition `upstream`, stamped with its watermark `stamp` (ms).
#[derive(Debug, Clone)]
enum Input {
    Order(Order),
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
}

/// One joining task: the watermark is the smaller of the orders partition's
/// (largest order time minus the grace) and the shipments' (the least that
/// any shipments partition stamped, minus infinity until all have); a record
/// `<` the watermark before it is late; an on-time record joins the buffered
/// records of the other side within the window (a shipment's rows by order
/// time, an order's by ship time, equal times in arrival order) and is
/// buffered. Nothing is dropped: the rules say expiry loses no row.
struct Joiner {
    orders_max: Option<i64>,
    upstream: Vec<Option<i64>>,
    orders: HashMap<i32, BTreeMap<i64, Vec<Order>>>,
    shipments: HashMap<i32, BTreeMap<i64, Vec<Shipment>>>,
    rows: Vec<Value>,
    late: usize,
}

impl Joiner {
    fn new(upstreams: usize) -> Self {
        Joiner {
            orders_max: None,
            upstream: vec![None; upstreams],
            orders: HashMap::new(),
            shipments: HashMap::new(),
            rows: Vec::new(),
            late: 0,
        }
    }

    fn watermark(&self) -> Option<i64> {
        let orders = self.orders_max? - GRACE_MS;
        let shipments = self.upstream.iter().copied().collect::<Option<Vec<_>>>()?;
        Some(orders.min(shipments.into_iter().min()?))
    }

    /// Takes in `input`; whether it was late.
    fn take(&mut self, input: &Input) -> bool {
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
            self.late += 1;
            return true;
        }
        let window = WINDOW * 1000;
        match input {
            Input::Order(order) => {
                self.orders_max = Some(self.orders_max.map_or(time, |m| m.max(time)));
                if let Some(buffered) = self.shipments.get(&order.id) {
                    for shipment in buffered.range(time..=time + window).flat_map(|e| e.1) {
                        self.rows.push(row(order, shipment));
                    }
                }
                let buffered = self.orders.entry(order.id).or_default();
                buffered.entry(time).or_default().push(order.clone());
            }
            Input::Shipment { shipment, .. } => {
                if let Some(buffered) = self.orders.get(&shipment.order_id) {
                    for order in buffered.range(time - window..=time).flat_map(|e| e.1) {
                        self.rows.push(row(order, shipment));
                    }
                }
                let buffered = self.shipments.entry(shipment.order_id).or_default();
                buffered.entry(time).or_default().push(shipment.clone());
            }
        }
        false
    }
}

/// Each task's input when the topics hold `orders` and `shipments` in these
/// orders and every task takes in the full merge of its two inputs by event
/// time (orders first on a tie), or, with `orders_first`, all its orders and
/// then all its shipments.
fn task_inputs(
    orders: &[Order],
    shipments: &[Shipment],
    partitions: usize,
    orders_first: bool,
) -> Vec<Vec<Input>> {
    let mut by_task: Vec<(Vec<Input>, Vec<Input>)> = vec![Default::default(); partitions];
    for order in orders {
        let task = murmur2_partition(order.id.to_string().as_bytes(), partitions);
        by_task[task].0.push(Input::Order(order.clone()));
    }
    let mut upstream_max: Vec<Option<i64>> = vec![None; partitions];
    for shipment in shipments {
        let upstream = murmur2_partition(shipment.id.as_bytes(), partitions);
        let max = upstream_max[upstream].map_or(shipment.ts * 1000, |m| m.max(shipment.ts * 1000));
        upstream_max[upstream] = Some(max);
        let task = murmur2_partition(shipment.order_id.to_string().as_bytes(), partitions);
        by_task[task].1.push(Input::Shipment {
            shipment: shipment.clone(),
            upstream,
            stamp: max - GRACE_MS,
        });
    }
    by_task
        .into_iter()
        .map(|(orders, shipments)| {
            if orders_first {
                return [orders, shipments].concat();
            }
            let mut merged = Vec::new();
            let (mut o, mut s) = (
                orders.into_iter().peekable(),
                shipments.into_iter().peekable(),
            );
            loop {
                let take_order = match (o.peek(), s.peek()) {
                    (Some(a), Some(b)) => a.event_time() <= b.event_time(),
                    (a, _) => a.is_some(),
                };
                match if take_order { o.next() } else { s.next() } {
                    Some(input) => merged.push(input),
                    None => return merged,
                }
            }
        })
        .collect()
}

/// The rows of each task, in order, and the number of late records.
fn join_model(tasks: Vec<Vec<Input>>) -> (Vec<Vec<Value>>, usize) {
    let upstreams = tasks.len();
    let mut late = 0;
    let rows = tasks
        .into_iter()
        .map(|inputs| {
            let mut task = Joiner::new(upstreams);
            for input in &inputs {
                task.take(input);
            }
            late += task.late;
            task.rows
        })
        .collect();
    (rows, late)
}

/// One joiner run: its topics, application id and service.
struct JoinRun {
    orders: String,
    shipments: String,
    output: String,
    late: String,
    repartition: String,
    run: Run,
}

impl JoinRun {
    fn start(partitions: usize, commit_interval: &str, extra: &[&str]) -> JoinRun {
        let application_id = unique("joiner-event-time");
        let (orders, shipments) = (unique("orders"), unique("shipments"));
        let (output, late) = (unique("shipped-orders"), unique("late"));
        create_topic(&orders, partitions);
        create_topic(&shipments, partitions);
        let mut arguments = args(&[
            "--orders-topic",
            &orders,
            "--shipments-topic",
            &shipments,
            "--output-topic",
            &output,
            "--late-topic",
            &late,
            "--application-id",
            &application_id,
            "--grace",
            "1d",
        ]);
        arguments.extend(args(extra));
        let run = Run::start("order-shipment-joiner", &arguments, commit_interval);
        JoinRun {
            orders,
            shipments,
            output,
            late,
            repartition: format!("{application_id}-shipments-by-order-repartition"),
            run,
        }
    }

    fn produce_orders(&self, orders: &[Order]) {
        produce(
            &self.orders,
            "orders",
            &orders.iter().map(Order::line).collect::<Vec<_>>(),
        );
    }

    fn produce_shipments(&self, shipments: &[Shipment]) {
        produce(
            &self.shipments,
            "shipments",
            &shipments.iter().map(Shipment::line).collect::<Vec<_>>(),
        );
    }

    fn late_series(&self) -> [String; 2] {
        [&self.orders, &self.repartition]
            .map(|topic| format!("streams_records_late_total{{topic=\"{topic}\"}}"))
    }

    /// Waits until `count` records are counted late (orders and shipments).
    fn wait_late(&self, count: usize) {
        let [orders, shipments] = self.late_series();
        self.run.wait_until("late records", count as f64, |text| {
            metric_value(text, &orders) + metric_value(text, &shipments)
        });
    }

    fn late_shipments(&self) -> f64 {
        self.run.metric(&self.late_series()[1])
    }

    /// The output, partition by partition.
    fn output(&self) -> Vec<Value> {
        consume_all(&self.output)
    }
}

// ---------------------------------------------------------------------------
// The stale shipments

/// Six orders, the last far ahead (order 6, 20 days on); shipments on time,
/// then one far ahead (joining order 6) and two more than a day behind it,
/// which would join orders 1 and 2 if they were on time. The task takes in
/// order 6 before the far shipment (they are merged by event time, and the
/// orders are produced first), and the far shipment carries its partition's
/// watermark: the stale shipments are late in every run, not only when a
/// commit happens to announce that watermark before they arrive.
fn stale_scenario() -> (Vec<Order>, Vec<Shipment>) {
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

/// The ship ids of the late topic.
fn late_ship_ids(run: &JoinRun) -> BTreeSet<String> {
    consume_all(&run.late)
        .iter()
        .map(|line| line["value"]["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn stale_shipments_are_late_whatever_the_commit_interval() {
    let (orders, shipments) = stale_scenario();
    let (rows, late) = join_model(task_inputs(&orders, &shipments, 1, false));
    assert_eq!(late, 2, "the model's own answer");
    let expected = rows.concat();
    assert_eq!(expected.len(), 5);
    assert!(expected
        .iter()
        .all(|r| !r["value"]["ship_id"].as_str().unwrap().starts_with("stale")));
    let runs = COMMIT_INTERVALS.map(|interval| JoinRun::start(1, interval, &[]));
    for run in &runs {
        run.produce_orders(&orders);
        run.produce_shipments(&shipments);
    }
    for run in &runs {
        // The stale shipments are the last records the task takes in.
        run.wait_late(2);
        run.run.wait_consumed(&run.orders, orders.len());
        run.run.wait_consumed(&run.shipments, shipments.len());
        assert_eq!(run.output(), expected, "{}", run.run.context());
        assert_eq!(run.late_shipments(), 2.0, "{}", run.run.context());
        assert_eq!(
            late_ship_ids(run),
            BTreeSet::from(["stale-1".to_string(), "stale-2".to_string()])
        );
    }
}

/// A key of `partition` (of 3): the first decimal id from `from` on, or the
/// first `<prefix>-<n>`.
fn id_in(partition: usize, from: i32) -> i32 {
    (from..)
        .find(|id| murmur2_partition(id.to_string().as_bytes(), 3) == partition)
        .unwrap()
}

fn ship_id_in(partition: usize, prefix: &str) -> String {
    (0..)
        .map(|n| format!("{prefix}-{n}"))
        .find(|id| murmur2_partition(id.as_bytes(), 3) == partition)
        .unwrap()
}

/// The scenario over three partitions: per task a near order, another a day
/// later and a far one (20 days on); shipments of the near and other orders
/// in time order, then a far shipment from every shipments partition to
/// every task (each joins its task's far order), then the two stale ones.
/// Returns the orders, the shipments up to the far ones, and the stale ones.
fn stale_scenario_over_three_partitions() -> (Vec<Order>, Vec<Shipment>, Vec<Shipment>) {
    let (mut orders, mut shipments, mut far_orders) = (Vec::new(), Vec::new(), Vec::new());
    for task in 0..3 {
        let near = id_in(task, 100 * task as i32 + 1);
        let other = id_in(task, near + 1);
        let far = id_in(task, other + 1);
        orders.extend([
            order(near, T + task as i64 * 60),
            order(other, T + DAY),
            order(far, T + 20 * DAY),
        ]);
        far_orders.push(far);
        shipments.push(shipment(
            &ship_id_in(task, &format!("near-{task}")),
            near,
            T + 3600,
        ));
        shipments.push(shipment(
            &ship_id_in((task + 1) % 3, &format!("other-{task}")),
            other,
            T + DAY + 3600,
        ));
    }
    orders.sort_by_key(|o| o.ts);
    shipments.sort_by_key(|s| s.ts);
    for from in 0..3 {
        for (task, far) in far_orders.iter().enumerate() {
            let id = ship_id_in(from, &format!("far-{from}-to-{task}"));
            shipments.push(shipment(&id, *far, T + 21 * DAY));
        }
    }
    let stale = vec![
        shipment("stale-1", orders[0].id, T + 2 * DAY),
        shipment("stale-2", orders[2].id, T + 3 * DAY),
    ];
    (orders, shipments, stale)
}

/// Over three partitions a task's shipments watermark is the least of what
/// the three shipments partitions have told it, by stamps on the records
/// they sent it or by announcements at commits; which upstream task gets to
/// a partition first is up to the consumers. So the run waits until the
/// service has consumed the far shipments (one from every shipments
/// partition to every task) before producing the stale ones: from then on
/// the far shipments precede the stale ones in every repartition partition,
/// and their stamps alone make the stale ones late, whatever the commits.
#[test]
fn stale_shipments_over_three_partitions_are_late_whatever_the_commit_interval() {
    let (orders, shipments, stale) = stale_scenario_over_three_partitions();
    let all: Vec<Shipment> = [shipments.clone(), stale.clone()].concat();
    let (rows, late) = join_model(task_inputs(&orders, &all, 3, false));
    assert_eq!(late, 2, "the model's own answer");
    let expected = sorted(rows.concat());
    assert_eq!(expected.len(), 6 + 9);
    let runs = COMMIT_INTERVALS.map(|interval| JoinRun::start(3, interval, &[]));
    for run in &runs {
        run.produce_orders(&orders);
    }
    for run in &runs {
        run.run.wait_consumed_records(&run.orders, orders.len());
        run.produce_shipments(&shipments);
    }
    for run in &runs {
        run.run
            .wait_consumed_records(&run.shipments, shipments.len());
        run.produce_shipments(&stale);
    }
    for run in &runs {
        run.wait_late(2);
        run.run.wait_consumed(&run.shipments, all.len());
        assert_eq!(sorted(run.output()), expected, "{}", run.run.context());
        assert_eq!(run.late_shipments(), 2.0, "{}", run.run.context());
        assert_eq!(
            late_ship_ids(run),
            BTreeSet::from(["stale-1".to_string(), "stale-2".to_string()])
        );
    }
}

// ---------------------------------------------------------------------------
// Random interleavings against the model

/// `count` records' times rising over 20 days with up to 6 hours of
/// disorder, one in eight up to 4 days behind (late, mostly).
fn random_times(rng: &mut StdRng, count: usize) -> Vec<i64> {
    (0..count)
        .map(|i| {
            let front = T + 20 * DAY * i as i64 / count as i64;
            if rng.random_bool(0.125) {
                front - rng.random_range(0..4 * DAY)
            } else {
                front - rng.random_range(0..6 * 3600)
            }
        })
        .collect()
}

/// A random run on one partition: random orders and shipments over eight
/// order ids, each topic in a random disorder with late records, and a
/// random commit interval.
///
/// The model needs the task's input order, which the runtime leaves to
/// timing where the two inputs overlap in time (the merge waits at most
/// `--max-task-idle` for an empty input). So one side is produced first, in
/// full, and the run waits until the task has taken all of it in (a timer
/// per order id; while the other side has said nothing the task watermark is
/// minus infinity, so nothing of it is late or expires); with
/// `--max-task-idle 10ms` that is quick. Then the other side is produced,
/// and the task takes it in in produced order: the input order is the first
/// side, then the second, both as produced. The second side ends with a
/// record a month behind, which is late; once the late count includes it,
/// everything has been taken in. Which side goes first is random too, so
/// that late orders are tested as well as late shipments.
struct RandomRun {
    seed: u64,
    orders_first: bool,
    orders: Vec<Order>,
    shipments: Vec<Shipment>,
    expected: Vec<Value>,
    late: usize,
    join: JoinRun,
}

impl RandomRun {
    fn start() -> RandomRun {
        let seed: u64 = rand::rng().random();
        let mut rng = StdRng::seed_from_u64(seed);
        let orders_first = rng.random_bool(0.5);
        let mut orders: Vec<Order> = random_times(&mut rng, 30)
            .into_iter()
            .map(|ts| order(rng.random_range(0..8), ts))
            .collect();
        let mut shipments: Vec<Shipment> = random_times(&mut rng, 50)
            .into_iter()
            .enumerate()
            .map(|(n, ts)| shipment(&format!("ship-{n}"), rng.random_range(0..8), ts))
            .collect();
        if orders_first {
            shipments.push(shipment("last-and-late", 0, T - 30 * DAY));
        } else {
            orders.push(order(0, T - 30 * DAY));
        }
        let tasks = if orders_first {
            task_inputs(&orders, &shipments, 1, true)
        } else {
            // Shipments first: the same model with the sides swapped in time.
            let mut shipped = task_inputs(&[], &shipments, 1, true);
            shipped[0].extend(orders.iter().cloned().map(Input::Order));
            shipped
        };
        let mut task = Joiner::new(1);
        let late: Vec<bool> = tasks[0].iter().map(|input| task.take(input)).collect();
        assert_eq!(
            late.last(),
            Some(&true),
            "seed {seed}: the last record is late"
        );
        let (rows, late) = join_model(tasks);
        let interval = *["10ms", "30ms", "100ms", "300ms", "1s", "2s"]
            .choose(&mut rng)
            .unwrap();
        let join = JoinRun::start(1, interval, &["--max-task-idle", "10ms"]);
        let run = RandomRun {
            seed,
            orders_first,
            orders,
            shipments,
            expected: rows.concat(),
            late,
            join,
        };
        if run.orders_first {
            run.join.produce_orders(&run.orders);
        } else {
            run.join.produce_shipments(&run.shipments);
        }
        run
    }

    fn context(&self) -> String {
        format!(
            "seed {}, orders first: {}\n{}",
            self.seed,
            self.orders_first,
            self.join.run.context()
        )
    }

    /// Waits until the task has taken in the first side (all of it consumed,
    /// then every order id of it buffered and committed: a key each in the
    /// side's store), then produces the second.
    fn second_side(&self) {
        let (ids, topic, count, store): (BTreeSet<i32>, _, _, _) = if self.orders_first {
            let ids = self.orders.iter().map(|o| o.id).collect();
            (ids, &self.join.orders, self.orders.len(), "orders")
        } else {
            let ids = self.shipments.iter().map(|s| s.order_id).collect();
            (ids, &self.join.shipments, self.shipments.len(), "shipments")
        };
        self.join.run.wait_consumed(topic, count);
        self.join.run.wait_metric(
            &format!("streams_state_keys{{task=\"0\",store=\"{store}\"}}"),
            ids.len() as f64,
        );
        if self.orders_first {
            self.join.produce_shipments(&self.shipments);
        } else {
            self.join.produce_orders(&self.orders);
        }
    }

    fn check(&self) {
        self.join.wait_late(self.late);
        let (topic, count) = if self.orders_first {
            (&self.join.shipments, self.shipments.len())
        } else {
            (&self.join.orders, self.orders.len())
        };
        self.join.run.wait_consumed(topic, count);
        let [orders, shipments] = self.join.late_series();
        let late = self.join.run.metric(&orders) + self.join.run.metric(&shipments);
        assert_eq!(late, self.late as f64, "{}", self.context());
        assert_eq!(self.join.output(), self.expected, "{}", self.context());
    }
}

#[test]
fn random_interleavings_and_commit_intervals_match_a_model_of_the_lateness_rule() {
    let runs: Vec<RandomRun> = (0..4).map(|_| RandomRun::start()).collect();
    for run in &runs {
        run.second_side();
    }
    for run in &runs {
        run.check();
    }
}

// ---------------------------------------------------------------------------
// window-aggregator: late and just-on-time orders through the stage link

const WT: i64 = 1_783_345_153_000;

/// An order id of partition `partition` (of 2), numbered from `next`.
fn market_order(partition: usize, offset: i64, next: &mut usize) -> MarketOrder {
    loop {
        *next += 1;
        let id = format!("order-{next}");
        if murmur2_partition(id.as_bytes(), 2) == partition {
            return MarketOrder {
                order_id: id,
                customer_id: (!next.is_multiple_of(3)).then(|| format!("c{}", *next % 4)),
                product_id: "p".into(),
                price: *next as f64 + 0.125,
                order_time: WT + offset,
            };
        }
    }
}

/// Orders on two partitions (2 s windows every 1 s, 500 ms out of
/// orderness), with, on each partition, an order just late (its last window
/// ends exactly at the partition's watermark) and one just on time (it fits
/// only its last window), and an order late on partition 0 that partition
/// 1's watermark, far behind, would still have let in: lateness is judged
/// per partition. The partials of every window cross the stage link, and the
/// final stage emits the windows that the least partition watermark closes.
#[test]
fn window_aggregator_late_and_just_on_time_orders_give_the_same_windows_whatever_the_commits() {
    let rules = WindowRules {
        size: 2_000,
        advance: 1_000,
        max_out_of_orderness: 500,
        partitions: 2,
        by_customer: false,
    };
    let mut next = 0;
    let mut at = |partition, offset| market_order(partition, offset, &mut next);
    let orders = vec![
        at(0, 100),
        at(1, 500),
        at(0, 1_200),
        at(1, 800),
        at(0, 3_500), // partition 0's watermark: +3000
        at(0, 1_999), // windows end at +2000 and +3000: late
        at(0, 2_000), // fits [+2000, +4000) only
        at(0, 1_500), // late on partition 0 (partition 1 is at +300)
        at(1, 1_000), // on time on partition 1
        at(1, 5_500), // partition 1's watermark: +5000
        at(1, 3_999), // windows end at +4000 and +5000: late
        at(1, 4_000), // fits [+4000, +6000) only
        at(0, 7_000),
        at(1, 8_000),
    ];
    let late_count = 3;
    let expected = window_model(&orders, rules);
    assert!(expected.len() >= 6, "{expected:#?}");
    let lines: Vec<Value> = orders.iter().map(MarketOrder::line).collect();
    let runs: Vec<(SingleInputRun, Run)> = COMMIT_INTERVALS
        .iter()
        .map(|interval| {
            let topics = SingleInputRun::new(
                "window-aggregator",
                "orders-marketplace",
                "order-window-counts",
                2,
            );
            let arguments = topics.args(&[
                "--window-size",
                "2s",
                "--window-advance",
                "1s",
                "--max-out-of-orderness",
                "500ms",
            ]);
            let run = Run::start("window-aggregator", &arguments, interval);
            (topics, run)
        })
        .collect();
    for (topics, _) in &runs {
        produce(&topics.input, "orders-marketplace", &lines);
    }
    for (topics, run) in &runs {
        let late = format!("streams_records_late_total{{topic=\"{}\"}}", topics.input);
        run.wait_metric(&late, late_count as f64);
        run.wait_consumed(&topics.input, orders.len());
        let output = wait_for_records(&topics.output, expected.len(), TIMEOUT);
        assert_eq!(output, expected, "{}", run.context());
        assert_eq!(run.metric(&late), late_count as f64, "{}", run.context());
    }
}
