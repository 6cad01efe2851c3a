//! One run of each service over its example data (`tests/fixtures/`), with
//! the exact expected output: on the local stack (each service's own test
//! file) and on the secured cluster (`tests/tests/cluster_fixtures.rs`).
//! Each returns the service, so a caller can look at its log and answers.

use std::cell::RefCell;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::batches::{assert_same_rows_per_tenant, row, without_embedding, Edit};
use crate::*;

/// How a fixture run starts its service: as a process on the host
/// ([`Host`]) or from the image (the container tests).
pub trait Launcher {
    type Running: Running;

    /// Starts `service` with `arguments`, ready to take its input.
    fn start(&self, service: &'static str, arguments: &[String]) -> Self::Running;

    /// Produces a fixture's input lines to `topic` ([`produce`]; a launcher
    /// may add client properties, such as a codec).
    fn produce(&self, topic: &str, schema_topic: &str, lines: &[Value]) {
        produce(topic, schema_topic, lines);
    }
}

/// A service started by a [`Launcher`].
pub trait Running {
    /// Everything it has logged so far.
    fn log(&self) -> String;
}

/// Service binaries run on the host ([`Service::start`]).
pub struct Host;

impl Launcher for Host {
    type Running = Service;

    fn start(&self, service: &'static str, arguments: &[String]) -> Service {
        Service::start(service, arguments)
    }
}

/// Starts services as [`Host`] does, with `extra` flags after the run's
/// own, remembering the service and arguments of the last: for a test that
/// runs a fixture, then a tool of the service with the same flags.
#[derive(Default)]
pub struct Recording {
    extra: Vec<String>,
    last: RefCell<Option<(&'static str, Vec<String>)>>,
}

impl Recording {
    /// A recording launcher that adds `extra` to every service's flags.
    pub fn with(extra: Vec<String>) -> Self {
        Recording {
            extra,
            ..Recording::default()
        }
    }

    /// The service last started, and its arguments (`extra` included).
    pub fn last(&self) -> (&'static str, Vec<String>) {
        self.last.borrow().clone().expect("a service was started")
    }
}

impl Launcher for Recording {
    type Running = Service;

    fn start(&self, service: &'static str, arguments: &[String]) -> Service {
        let mut arguments = arguments.to_vec();
        arguments.extend(self.extra.iter().cloned());
        *self.last.borrow_mut() = Some((service, arguments.clone()));
        Host.start(service, &arguments)
    }
}

/// `service <tool> <arguments>`, which must succeed and print JSON.
pub fn tool_json(service: &str, tool: &str, arguments: &[String]) -> Value {
    let output = Command::new(bin(service))
        .arg(tool)
        .args(arguments)
        .args(["--format", "json"])
        .output()
        .expect("run the service binary");
    assert!(
        output.status.success(),
        "{service} {tool} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON")
}

impl Running for Service {
    fn log(&self) -> String {
        Service::log(self)
    }
}

/// How long a fixture's output may take.
const OUTPUT_TIMEOUT: Duration = Duration::from_secs(90);

/// sensor-fusion: the verdicts of the example readings.
pub fn sensor_fusion() -> Service {
    sensor_fusion_on(&Host)
}

/// [`sensor_fusion`], started by `launcher`.
pub fn sensor_fusion_on<L: Launcher>(launcher: &L) -> L::Running {
    let temperature = unique("temperature-readings");
    let humidity = unique("humidity-readings");
    let output = unique("machine-maintenance");
    create_topic(&temperature, 1);
    create_topic(&humidity, 1);
    let service = launcher.start(
        "sensor-fusion",
        &args(&[
            "--temperature-topic",
            &temperature,
            "--humidity-topic",
            &humidity,
            "--output-topic",
            &output,
            "--application-id",
            &unique("sensor-fusion"),
        ]),
    );
    launcher.produce(
        &temperature,
        "temperature-readings",
        &fixture("sensor-fusion/temperature-readings.jsonl"),
    );
    launcher.produce(
        &humidity,
        "humidity-readings",
        &fixture("sensor-fusion/humidity-readings.jsonl"),
    );
    let expected = fixture("sensor-fusion/machine-maintenance.expected.jsonl");
    let records = wait_for_records(&output, expected.len(), OUTPUT_TIMEOUT);
    assert_eq!(records, expected, "log:\n{}", service.log());
    service
}

/// order-shipment-joiner: the example joins.
pub fn order_shipment_joiner() -> Service {
    order_shipment_joiner_on(&Host)
}

/// [`order_shipment_joiner`], started by `launcher`.
pub fn order_shipment_joiner_on<L: Launcher>(launcher: &L) -> L::Running {
    let orders = unique("orders");
    let shipments = unique("shipments");
    let output = unique("shipped-orders");
    create_topic(&orders, 1);
    create_topic(&shipments, 1);
    let service = launcher.start(
        "order-shipment-joiner",
        &args(&[
            "--orders-topic",
            &orders,
            "--shipments-topic",
            &shipments,
            "--output-topic",
            &output,
            "--application-id",
            &unique("order-shipment-joiner"),
        ]),
    );
    launcher.produce(
        &orders,
        "orders",
        &fixture("order-shipment-joiner/orders.jsonl"),
    );
    launcher.produce(
        &shipments,
        "shipments",
        &fixture("order-shipment-joiner/shipments.jsonl"),
    );
    let expected = fixture("order-shipment-joiner/shipped-orders.expected.jsonl");
    let records = wait_for_records(&output, expected.len(), OUTPUT_TIMEOUT);
    assert_eq!(sorted(records), sorted(expected), "log:\n{}", service.log());
    service
}

/// sessionizer: bob's session ends on the timeout.
pub fn sessionizer() -> Service {
    sessionizer_on(&Host)
}

/// [`sessionizer`], started by `launcher`.
pub fn sessionizer_on<L: Launcher>(launcher: &L) -> L::Running {
    single_input_fixture_on(launcher, "sessionizer", "user-events", "user-sessions")
}

/// deduplicator: repeats within the TTL dropped, one after it let through.
pub fn deduplicator() -> Service {
    deduplicator_on(&Host)
}

/// [`deduplicator`], started by `launcher`.
pub fn deduplicator_on<L: Launcher>(launcher: &L) -> L::Running {
    single_input_fixture_on(launcher, "deduplicator", "clicks", "unique-clicks")
}

/// The fixture of a service with one input and one output topic, on one
/// partition with default flags: `tests/fixtures/<service>/<input>.jsonl`
/// in, exactly `<output>.expected.jsonl` out, in order.
fn single_input_fixture_on<L: Launcher>(
    launcher: &L,
    service: &'static str,
    input: &str,
    output: &str,
) -> L::Running {
    let run = SingleInputRun::new(service, input, output, 1);
    let service_run = launcher.start(run.binary, &run.args(&[]));
    launcher.produce(
        &run.input,
        input,
        &fixture(&format!("{service}/{input}.jsonl")),
    );
    let expected = fixture(&format!("{service}/{output}.expected.jsonl"));
    let records = wait_for_records(&run.output, expected.len(), OUTPUT_TIMEOUT);
    assert_eq!(records, expected, "log:\n{}", service_run.log());
    service_run
}

/// window-aggregator: the example windows, in order.
pub fn window_aggregator() -> Service {
    window_aggregator_on(&Host)
}

/// [`window_aggregator`], started by `launcher`.
pub fn window_aggregator_on<L: Launcher>(launcher: &L) -> L::Running {
    let run = SingleInputRun::new(
        "window-aggregator",
        "orders-marketplace",
        "order-window-counts",
        1,
    );
    let service = launcher.start(run.binary, &run.args(&[]));
    launcher.produce(
        &run.input,
        "orders-marketplace",
        &fixture("window-aggregator/orders-marketplace.jsonl"),
    );
    let expected = fixture("window-aggregator/order-window-counts.expected.jsonl");
    let records = wait_for_records(&run.output, expected.len(), OUTPUT_TIMEOUT);
    assert_eq!(records, expected, "log:\n{}", service.log());
    service
}

/// embed-batcher: the worked example (the `make demo` edits, `--batch-size
/// 3`): acme's full batch, globex's and initech's smaller ones, and acme's
/// stale edit counted as late.
pub fn embed_batcher() -> Service {
    embed_batcher_on(&Host)
}

/// [`embed_batcher`], started by `launcher` (on the host: it reads the
/// service's metrics).
pub fn embed_batcher_on<L: Launcher<Running = Service>>(launcher: &L) -> Service {
    let run = SingleInputRun::new("embed-batcher", "articles", "article-embeddings", 1);
    let service = launcher.start(
        run.binary,
        &run.args(&["--batch-size", "3", "--embedder", "hashing"]),
    );
    let text = std::fs::read_to_string(workspace().join("deploy/local/demo-data/articles.jsonl"))
        .expect("demo data");
    let input = parse_jsonl(&text);
    launcher.produce(&run.input, "articles", &input);
    let edits: Vec<Edit> = input.iter().map(Edit::from_line).collect();
    let t = 1_783_332_000_000;
    let expected = [
        row(&edits[1], t + 4_000),
        row(&edits[3], t + 4_000),
        row(&edits[4], t + 4_000),
        row(&edits[2], t + 31_000),
        row(&edits[5], t + 31_000),
        row(&edits[6], t + 39_000),
        row(&edits[7], t + 39_000),
    ];
    let records = wait_for_records(&run.output, expected.len(), Duration::from_secs(60));
    let rows: Vec<Value> = records.iter().map(|l| without_embedding(l, 384)).collect();
    assert_same_rows_per_tenant(&rows, &expected, &service.log());
    let late = format!("streams_records_late_total{{topic=\"{}\"}}", run.input);
    assert!(
        eventually(Duration::from_secs(30), || service.metric(&late) == 1.0),
        "{}",
        service.metrics()
    );
    service
}
