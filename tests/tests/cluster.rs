//! The services on a secured three-broker cluster (deploy/local/cluster.sh):
//! SASL_SSL with SCRAM-SHA-512, ACLs, replication factor 3 with
//! `min.insync.replicas=2`, a TLS registry with basic auth, bearer tokens
//! (JWT) and client certificates.
//!
//! One test binary, so the cluster starts once (a no-op when `make test` or
//! `make cluster-up` started it). Tests that stop brokers hold the write
//! side of [`BROKERS`]; the others the read side, so no test meets two
//! brokers down. Every log and HTTP answer is searched for the passwords.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use e2e_tests::cluster::{self, assert_no_password};
use e2e_tests::*;
use serde_json::Value;

static BROKERS: RwLock<()> = RwLock::new(());

/// The log and the HTTP answers of `service` hold no password.
fn assert_nothing_leaks(service: &Service) {
    assert_no_password(&service.log(), "the service log");
    for path in ["/metrics", "/healthz", "/readyz"] {
        let answer = http_get(service.http_port, path).unwrap_or_default();
        assert_no_password(&answer, path);
    }
}

fn fixture_through_sasl_ssl(run: fn() -> Service) {
    cluster::use_cluster();
    let _brokers = BROKERS.read().unwrap_or_else(|e| e.into_inner());
    let service = run();
    assert_nothing_leaks(&service);
}

#[test]
fn sensor_fusion_fixture_through_sasl_ssl() {
    fixture_through_sasl_ssl(fixture_runs::sensor_fusion);
}

#[test]
fn order_shipment_joiner_fixture_through_sasl_ssl() {
    fixture_through_sasl_ssl(fixture_runs::order_shipment_joiner);
}

#[test]
fn sessionizer_fixture_through_sasl_ssl() {
    fixture_through_sasl_ssl(fixture_runs::sessionizer);
}

#[test]
fn window_aggregator_fixture_through_sasl_ssl() {
    fixture_through_sasl_ssl(fixture_runs::window_aggregator);
}

#[test]
fn embed_batcher_fixture_through_sasl_ssl() {
    fixture_through_sasl_ssl(fixture_runs::embed_batcher);
}

/// The example service logs in as its own user, with the ACLs that
/// `deploy/local/cluster.sh` granted from its `acls` (it reads the list of
/// services from `deploy/k8s/services.toml`).
#[test]
fn deduplicator_fixture_through_sasl_ssl() {
    fixture_through_sasl_ssl(fixture_runs::deduplicator);
}

/// The sessionizer's properties file with `key` set to `value`.
fn sessionizer_properties_with(key: &str, value: &str) -> PathBuf {
    sessionizer_properties_edited(&[key], &format!("{key}={value}\n"))
}

/// The sessionizer's properties file without the properties `remove` and
/// with the lines `add`.
fn sessionizer_properties_edited(remove: &[&str], add: &str) -> PathBuf {
    // The cluster writes the user's properties file when it starts.
    cluster::use_cluster();
    let original = std::fs::read_to_string(cluster::properties("sessionizer")).unwrap();
    let mut text: String = original
        .lines()
        .filter(|line| {
            !remove
                .iter()
                .any(|key| line.starts_with(&format!("{key}=")))
        })
        .map(|line| format!("{line}\n"))
        .collect();
    text.push_str(add);
    let path = scratch_dir().join(format!("{}.properties", unique("client")));
    std::fs::write(&path, text).unwrap();
    path
}

/// Starts the sessionizer with `properties` over a fresh input, expects
/// it to exit with an error within a minute and returns its log.
fn sessionizer_fails(properties: &Path, output: &str) -> String {
    sessionizer_fails_with(properties, output, &[])
}

/// [`sessionizer_fails`] with `extra` flags.
fn sessionizer_fails_with(properties: &Path, output: &str, extra: &[&str]) -> String {
    cluster::use_cluster();
    let _brokers = BROKERS.read().unwrap_or_else(|e| e.into_inner());
    let input = unique("user-events");
    create_topic(&input, 1);
    let started = Instant::now();
    let service = Service::start(
        "sessionizer",
        &args(&[
            "--input-topic",
            &input,
            "--output-topic",
            output,
            "--application-id",
            &unique("sessionizer"),
            // The flags file names the user's own; a later flag wins.
            "--kafka-config-file",
            properties.to_str().unwrap(),
        ])
        .into_iter()
        .chain(args(extra))
        .collect::<Vec<_>>(),
    );
    cluster::expect_failure(service, started)
}

#[test]
fn a_wrong_password_is_an_authentication_error() {
    let properties = sessionizer_properties_with("sasl.password", "not-the-password");
    let log = sessionizer_fails(&properties, &unique("user-sessions"));
    assert!(log.contains("Authentication failed"), "{log}");
    assert!(log.contains("SCRAM-SHA-512"), "{log}");
}

#[test]
fn a_ca_that_did_not_sign_the_brokers_certificates_is_a_tls_error() {
    let dir = scratch_dir().join(unique("other-ca"));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=another-ca", "-keyout"])
        .arg(dir.join("ca.key"))
        .arg("-out")
        .arg(&ca)
        .output()
        .expect("run openssl");
    assert!(made.status.success(), "{made:?}");
    let properties = sessionizer_properties_with("ssl.ca.location", ca.to_str().unwrap());
    let log = sessionizer_fails(&properties, &unique("user-sessions"));
    assert!(log.contains("SSL handshake failed"), "{log}");
    assert!(log.contains("certificate verify failed"), "{log}");
}

#[test]
fn an_output_topic_without_an_acl_is_named_with_the_operation() {
    // The sessionizer user may write topics named user-sessions* and
    // sessionizer*, nothing else.
    let output = unique("forbidden-sessions");
    let log = sessionizer_fails(&cluster::properties("sessionizer"), &output);
    // With no ACL at all on the topic, looking it up is the first thing denied.
    assert!(
        log.contains(&format!("not authorized to describe topic {output}")),
        "{log}"
    );
    assert!(log.contains("DESCRIBE ACL"), "{log}");
}

// ---- the registry's other logins, and auto-registration turned off ----------

/// The registry's basic-auth property, which the other registry logins replace.
const REGISTRY_BASIC: &str = "schema.registry.basic.auth.user.info";

/// The sessionizer's properties with the registry login that cluster.sh
/// wrote to `secrets/registry-<method>.properties` in place of basic auth.
fn sessionizer_registry_login(method: &str) -> PathBuf {
    cluster::use_cluster();
    let login = cluster::home()
        .join("secrets")
        .join(format!("registry-{method}.properties"));
    let lines =
        std::fs::read_to_string(&login).unwrap_or_else(|e| panic!("{}: {e}", login.display()));
    sessionizer_properties_edited(&[REGISTRY_BASIC], &lines)
}

/// `properties` log in to the registry with `key` (a line starting with
/// it), not with basic auth. Only keys are shown: the file holds passwords.
fn assert_registry_login(properties: &Path, key: &str) {
    let text = std::fs::read_to_string(properties).unwrap();
    let keys: Vec<&str> = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once('=').map(|(key, _)| key))
        .collect();
    assert!(!keys.contains(&REGISTRY_BASIC), "{keys:?}");
    assert!(text.lines().any(|line| line.starts_with(key)), "{keys:?}");
}

/// The registry user's bearer token (a JWT), as cluster.sh minted it.
fn registry_token() -> String {
    let path = cluster::home().join("secrets/registry.token");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

/// Starts services with a properties file of its own and more flags, once
/// `prepare` has seen the run's output topic.
struct HostWith<'a> {
    properties: PathBuf,
    extra: &'a [&'a str],
    prepare: &'a dyn Fn(&str),
}

impl fixture_runs::Launcher for HostWith<'_> {
    type Running = Service;

    fn start(&self, service: &'static str, arguments: &[String]) -> Service {
        let at = arguments
            .iter()
            .position(|a| a == "--output-topic")
            .unwrap();
        (self.prepare)(&arguments[at + 1]);
        let mut arguments = arguments.to_vec();
        arguments.extend(args(&[
            "--kafka-config-file",
            self.properties.to_str().unwrap(),
        ]));
        arguments.extend(args(self.extra));
        Service::start(service, &arguments)
    }
}

/// The sessionizer fixture, exact, with `properties`, `extra` flags and
/// `prepare`; nothing secret in its log and answers.
fn sessionizer_fixture_with(properties: PathBuf, extra: &[&str], prepare: &dyn Fn(&str)) {
    cluster::use_cluster();
    let _brokers = BROKERS.read().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let service = fixture_runs::sessionizer_on(&HostWith {
        properties,
        extra,
        prepare,
    });
    assert_nothing_leaks(&service);
    assert!(
        !service.log().contains(&registry_token()),
        "the token shows in the log"
    );
    eprintln!("exact output after {:?}", started.elapsed());
}

#[test]
fn sessionizer_fixture_with_a_registry_bearer_token_from_a_file() {
    let properties = sessionizer_registry_login("bearer");
    assert_registry_login(&properties, "schema.registry.bearer.auth.token.location=");
    sessionizer_fixture_with(properties, &[], &|_| {});
}

#[test]
fn sessionizer_fixture_with_a_registry_client_certificate() {
    let properties = sessionizer_registry_login("mtls");
    assert_registry_login(&properties, "schema.registry.ssl.certificate.location=");
    sessionizer_fixture_with(properties, &[], &|_| {});
}

#[test]
fn a_wrong_registry_token_is_refused_at_startup() {
    // The registry's own token with its signature spoiled: well-formed, not valid.
    let token = registry_token();
    let wrong = format!("{}AAAA", &token[..token.len() - 4]);
    assert_ne!(wrong, token);
    let properties = sessionizer_properties_edited(
        &[REGISTRY_BASIC],
        &format!("schema.registry.bearer.auth.token={wrong}\n"),
    );
    // Gives up within a minute (`expect_failure`), timed from its start: a
    // clock started here would count the wait for a rolling restart of the
    // brokers by another test.
    let log = sessionizer_fails(&properties, &unique("user-sessions"));
    assert!(
        log.contains(
            "refused the credentials of schema.registry.bearer.auth.token (HTTP 401 Unauthorized)"
        ),
        "{log}"
    );
    assert!(
        !log.contains(&wrong[20..]),
        "the token shows in the log:\n{log}"
    );
}

/// The flag that turns registration off.
const NO_AUTO_REGISTER: [&str; 2] = ["--schema-registry-auto-register", "false"];

/// Registers the `.avsc` at `schema` under `<topic>-value`, as a user
/// would with streamctl (creating the topic, producing nothing).
fn register_schema(topic: &str, schema: &Path) {
    create_topic(topic, 1);
    produce_file_as(topic, schema, &write_jsonl(&[]), &[]);
}

#[test]
fn without_auto_registration_a_missing_output_schema_is_named() {
    let output = unique("user-sessions");
    let log = sessionizer_fails_with(
        &cluster::properties("sessionizer"),
        &output,
        &NO_AUTO_REGISTER,
    );
    assert!(
        log.contains(&format!(
            "subject {output}-value has no schema in the schema registry"
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "Register the output schema under {output}-value first"
        )),
        "{log}"
    );
    assert!(
        log.contains("--schema-registry-auto-register true"),
        "{log}"
    );
}

#[test]
fn without_auto_registration_the_output_schema_registered_beforehand_is_used() {
    sessionizer_fixture_with(
        cluster::properties("sessionizer"),
        &NO_AUTO_REGISTER,
        &|output| register_schema(output, &schema("user-sessions")),
    );
}

#[test]
fn without_auto_registration_a_different_latest_schema_is_refused() {
    // Version 2 adds a field with a default: the registry takes it as a
    // BACKWARD-compatible change, but it does not encode like the
    // service's schema.
    let original: Value =
        serde_json::from_str(&std::fs::read_to_string(schema("user-sessions")).unwrap()).unwrap();
    let mut changed = original.clone();
    changed["fields"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "channel", "type": "string", "default": "web"}));
    let changed_path = scratch_dir().join(format!("{}.avsc", unique("user-sessions-v2")));
    std::fs::write(&changed_path, changed.to_string()).unwrap();
    let output = unique("user-sessions");
    cluster::use_cluster();
    register_schema(&output, &schema("user-sessions"));
    register_schema(&output, &changed_path);
    let log = sessionizer_fails_with(
        &cluster::properties("sessionizer"),
        &output,
        &NO_AUTO_REGISTER,
    );
    let expected = format!("the latest schema of subject {output}-value (version 2, id ");
    assert!(log.contains(&expected), "{log}");
    assert!(
        log.contains(
            "the registry's record io.streams.sessions.UserSession has a field `channel` \
             (field 8) that the service's has not"
        ),
        "{log}"
    );
    assert!(log.contains("same Avro Parsing Canonical Form"), "{log}");
}

/// `count` orders a second apart and one shipment each, `order_id % 24`
/// hours later; the expected `ship_id -> hr_to_ship`. All of it spans
/// less than [`GRACE`], so no record is late whatever order the broker
/// disruptions make the inputs arrive in.
fn joiner_input(count: i64) -> (Vec<Value>, Vec<Value>, HashMap<String, i64>) {
    let start = 1_700_000_000;
    let mut orders = Vec::new();
    let mut shipments = Vec::new();
    let mut expected = HashMap::new();
    for id in 0..count {
        let ts = start + id;
        let hours = id % 24;
        let ship_id = format!("s-{id}");
        orders.push(json!({"key": id.to_string(), "value": {"id": id, "total_amount": 1.5, "customer_name": "c", "order_ts_raw": ts}}));
        shipments.push(json!({"key": ship_id, "value": {"id": ship_id, "order_id": id, "warehouse": "Boston", "ship_ts_raw": ts + hours * 3_600}}));
        expected.insert(ship_id, hours);
    }
    (orders, shipments, expected)
}

/// The joiner's allowed out-of-orderness here: more than the inputs span.
const GRACE: &str = "7d";

/// Nothing lost, nothing doubled: one output per shipment, with its hours.
fn assert_exact_joins(output: &[Value], expected: &HashMap<String, i64>, log: &str) {
    let mut seen: HashMap<String, i64> = HashMap::new();
    for record in output {
        let value = &record["value"];
        let ship_id = value["ship_id"].as_str().unwrap().to_string();
        let hours = value["hr_to_ship"].as_i64().unwrap();
        assert!(
            seen.insert(ship_id.clone(), hours).is_none(),
            "{ship_id} joined twice"
        );
    }
    assert_eq!(seen.len(), expected.len(), "joins: {}\n{log}", seen.len());
    assert!(seen == *expected, "wrong hours in the joins\n{log}");
}

/// Samples the consumed-records counter of `service` every 50 ms while
/// `during` runs; returns the longest time it stood still (input keeps
/// arriving meanwhile, so a stall is the disruption's, not idleness).
fn longest_stall(service: &Service, series: &str, during: impl FnOnce()) -> Duration {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let (mut last, mut since, mut longest) = (-1.0, Instant::now(), Duration::ZERO);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let now = service.metric(series);
                if now != last {
                    longest = longest.max(since.elapsed());
                    (last, since) = (now, Instant::now());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            longest.max(since.elapsed())
        });
        during();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        sampler.join().unwrap()
    })
}

/// The input arrives in this many transactions, one after the other, while
/// brokers are lost: the service has work all through the disruptions.
const CHUNKS: usize = 20;

/// Chunks processed before the first disruption.
const UNDISTURBED_CHUNKS: usize = 3;

/// Milliseconds since the epoch, as Kafka timestamps count.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A topic's records with their Kafka timestamps.
fn timestamped(topic: &str) -> Vec<(Value, i64)> {
    let lines = streamctl_ok(&[
        "consume",
        "--topic",
        topic,
        "--from-beginning",
        "--until-end",
        "--timestamps",
    ]);
    parse_jsonl(&lines)
        .into_iter()
        .map(|line| {
            let timestamp = line["timestamp"].as_i64().expect("a timestamp");
            (line["value"].clone(), timestamp)
        })
        .collect()
}

/// How long each join took: from the later of its order's and its
/// shipment's append to the output's (all three stamped by their producer's
/// clock, this machine's), by ship id.
fn join_latencies(topics: &JoinerTopics) -> Vec<(i64, i64)> {
    let orders: HashMap<i64, i64> = timestamped(&topics.orders)
        .into_iter()
        .map(|(value, at)| (value["id"].as_i64().unwrap(), at))
        .collect();
    let shipments: HashMap<String, i64> = timestamped(&topics.shipments)
        .into_iter()
        .map(|(value, at)| {
            let order = orders[&value["order_id"].as_i64().unwrap()];
            (value["id"].as_str().unwrap().to_string(), at.max(order))
        })
        .collect();
    timestamped(&topics.output)
        .into_iter()
        .map(|(value, at)| {
            let ready = shipments[value["ship_id"].as_str().unwrap()];
            (ready, at - ready)
        })
        .collect()
}

/// Prints p50, p99 and the maximum of the join latencies whose input was
/// complete within 30 s after each disruption, and of those before the
/// first (docs/fault-tolerance.md has the figures). Measured, not asserted.
fn print_latencies(topics: &JoinerTopics, disruptions: &[(String, i64)]) {
    let latencies = join_latencies(topics);
    let summary = |from: i64, to: i64| {
        let mut window: Vec<i64> = latencies
            .iter()
            .filter(|(ready, _)| (from..to).contains(ready))
            .map(|(_, latency)| *latency)
            .collect();
        window.sort_unstable();
        let at = |q: f64| window[((window.len() - 1) as f64 * q) as usize];
        match window.len() {
            0 => "no joins".to_string(),
            n => format!(
                "{n} joins: p50 {} ms, p99 {} ms, max {} ms",
                at(0.5),
                at(0.99),
                at(1.0)
            ),
        }
    };
    let first = disruptions.first().map_or(i64::MAX, |(_, at)| *at);
    eprintln!(
        "latency before any disruption: {}",
        summary(i64::MIN, first)
    );
    for (what, at) in disruptions {
        eprintln!(
            "latency in the 30 s from {what}: {}",
            summary(*at, at + 30_000)
        );
    }
}

/// The joiner over `count` orders and shipments on two partitions under
/// exactly_once_v2, with `disrupt` run once the first [`UNDISTURBED_CHUNKS`]
/// of the input are consumed (the latencies to compare with), while the
/// rest is still being produced; the output must be exact. `disrupt` returns what it did and when (milliseconds since the
/// epoch), for the latency figures.
fn joiner_survives(
    count: i64,
    disrupt: impl FnOnce(&Service, &JoinerTopics) -> Vec<(String, i64)>,
) {
    cluster::use_cluster();
    let _brokers = BROKERS.write().unwrap_or_else(|e| e.into_inner());
    let topics = JoinerTopics::new();
    let (orders, shipments, expected) = joiner_input(count);
    let chunk = orders.len().div_ceil(CHUNKS);
    let service = Service::start(
        "order-shipment-joiner",
        &args(&[
            "--orders-topic",
            &topics.orders,
            "--shipments-topic",
            &topics.shipments,
            "--output-topic",
            &topics.output,
            "--application-id",
            &topics.application_id,
            "--processing-guarantee",
            "exactly_once_v2",
            "--grace",
            GRACE,
        ]),
    );
    let series = format!(
        "streams_records_consumed_total{{topic=\"{}\"}}",
        topics.orders
    );
    let disruptions = std::thread::scope(|scope| {
        scope.spawn(|| {
            for (orders, shipments) in orders.chunks(chunk).zip(shipments.chunks(chunk)) {
                produce(&topics.orders, "orders", orders);
                produce(&topics.shipments, "shipments", shipments);
            }
        });
        assert!(
            eventually(Duration::from_secs(300), || service.metric(&series)
                >= (chunk * UNDISTURBED_CHUNKS) as f64),
            "{}",
            service.log()
        );
        disrupt(&service, &topics)
    });
    let output = wait_for_records(&topics.output, expected.len(), Duration::from_secs(600));
    assert_exact_joins(&output, &expected, &service.log());
    assert_nothing_leaks(&service);
    print_latencies(&topics, &disruptions);
}

struct JoinerTopics {
    orders: String,
    shipments: String,
    output: String,
    application_id: String,
}

impl JoinerTopics {
    fn new() -> Self {
        let topics = JoinerTopics {
            orders: unique("orders"),
            shipments: unique("shipments"),
            output: unique("shipped-orders"),
            application_id: unique("order-shipment-joiner"),
        };
        create_topic(&topics.orders, 2);
        create_topic(&topics.shipments, 2);
        topics
    }
}

/// Orders (and as many shipments) of the leader-loss test: 200k records.
const LEADER_LOSS_ORDERS: i64 = 100_000;

/// kill -9 the leader of an input partition, bring it back; later kill -9
/// the leader of the output partition, then that of a changelog partition
/// (one broker down at a time), bringing each back.
#[test]
fn leader_loss_under_exactly_once_leaves_the_output_exact() {
    joiner_survives(LEADER_LOSS_ORDERS, |service, topics| {
        let consumed = format!(
            "streams_records_consumed_total{{topic=\"{}\"}}",
            topics.orders
        );
        let mut disruptions = Vec::new();
        let mut lose = |what: &str, broker: usize| {
            disruptions.push((format!("losing the {what} leader"), now_ms()));
            let stall = longest_stall(service, &consumed, || {
                cluster::kill(broker);
                std::thread::sleep(Duration::from_secs(5));
                cluster::start(broker);
            });
            eprintln!("{what} leader {broker} killed for 5 s: longest stall {stall:?}");
            let next = (service.metric(&consumed) + 5_000.0).min(LEADER_LOSS_ORDERS as f64);
            assert!(
                eventually(Duration::from_secs(300), || service.metric(&consumed)
                    >= next),
                "no progress after losing the {what} leader:\n{}",
                service.log()
            );
        };
        lose("input", cluster::leader(&topics.orders, 0) as usize);
        lose("output", cluster::leader(&topics.output, 0) as usize);
        let changelog = cluster_topics()
            .into_iter()
            .find(|t| t.starts_with(&topics.application_id) && t.ends_with("-changelog"))
            .expect("a changelog topic");
        lose("changelog", cluster::leader(&changelog, 0) as usize);
        disruptions
    });
}

#[test]
fn a_rolling_restart_of_every_broker_leaves_the_output_exact() {
    joiner_survives(60_000, |service, topics| {
        let consumed = format!(
            "streams_records_consumed_total{{topic=\"{}\"}}",
            topics.orders
        );
        let started = now_ms();
        let stall = longest_stall(service, &consumed, cluster::roll);
        eprintln!("rolling restart: longest stall {stall:?}");
        vec![("the rolling restart".to_string(), started)]
    });
}

fn cluster_topics() -> Vec<String> {
    streamctl_ok(&["topics", "list"])
        .lines()
        .map(str::to_string)
        .collect()
}
