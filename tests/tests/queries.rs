//! Interactive queries (docs/queries.md) on the real stack: two instances
//! of a service share three partitions; each is asked by key and by range
//! and must answer what the state is, wherever the key lives. The expected
//! state comes from the test driver fed the same input (the same
//! processor, no broker, no query code): what is checked here is the
//! routing, the reading and the rendering, not the service's rules.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::driver::{driver, pipe_all, settings};
use e2e_tests::sessions::generate;
use e2e_tests::*;
use serde_json::Value;
use streams_runtime::testing::TestDriver;
use streams_runtime::ValueState;

const PARTITIONS: usize = 3;
const BASE: i64 = 1_783_345_153_000;

/// A GET with an optional bearer token: the status and the JSON body.
fn query(port: u16, path: &str, token: Option<&str>) -> Option<(u16, Value)> {
    let stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .ok()?;
    ask(stream, path, token)
}

/// [`query`] as a client honouring `Retry-After` would: asked again while
/// the answer is 503 (a partition moving between instances, as when the
/// second instance joins after the first has answered everything) or does
/// not come, for up to a minute; the first other answer.
fn query_settled(port: u16, path: &str, token: Option<&str>) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match query(port, path, token) {
            Some((status, body)) if status != 503 => return (status, body),
            answer if Instant::now() >= deadline => {
                panic!("{path}: nothing but 503 or no answer for 60 s; the last: {answer:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// [`query`] over TLS, trusting `ca` (PEM).
fn query_tls(port: u16, path: &str, ca: &[u8]) -> Option<(u16, Value)> {
    let connector = native_tls::TlsConnector::builder()
        .add_root_certificate(native_tls::Certificate::from_pem(ca).expect("CA"))
        .build()
        .expect("TLS connector");
    let stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .ok()?;
    ask(connector.connect("127.0.0.1", stream).ok()?, path, None)
}

/// Sends a GET of `path` on `stream` and reads the answer.
fn ask(mut stream: impl Read + Write, path: &str, token: Option<&str>) -> Option<(u16, Value)> {
    let authorization = token
        .map(|token| format!("Authorization: Bearer {token}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{authorization}Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    if status == 503 || status == 429 {
        assert!(
            head.to_ascii_lowercase().contains("\r\nretry-after: 1"),
            "a {status} says when to retry: {head}"
        );
    }
    Some((status, serde_json::from_str(body).ok()?))
}

/// An instance of a service with queries on.
struct Instance {
    service: Service,
    port: u16,
}

fn start_instance(binary: &str, arguments: &[String], extra: &[&str]) -> Instance {
    start_instance_with_scheme(binary, arguments, extra, "http")
}

/// [`start_instance`], advertised with URL scheme `scheme`.
fn start_instance_with_scheme(
    binary: &str,
    arguments: &[String],
    extra: &[&str],
    scheme: &str,
) -> Instance {
    let port = free_port();
    let mut arguments = arguments.to_vec();
    arguments.extend(args(&[
        "--query-addr",
        &format!("127.0.0.1:{port}"),
        "--query-advertised-url",
        &format!("{scheme}://127.0.0.1:{port}"),
        // A killed instance leaves the group after 6 s, not 45.
        "--kafka",
        "session.timeout.ms=6000",
        "--kafka",
        "heartbeat.interval.ms=1000",
    ]));
    arguments.extend(args(extra));
    Instance {
        service: Service::start(binary, &arguments),
        port,
    }
}

/// Every key of value store `state` with its value, in the driver, as
/// serde's JSON renders the service's own type.
fn model_values<T: serde::Serialize + serde::de::DeserializeOwned>(
    driver: &mut TestDriver,
    state: &ValueState<T>,
) -> BTreeMap<String, Value> {
    let keys = driver.state_keys(state).expect("keys");
    keys.into_iter()
        .map(|key| {
            let value = driver.state(state, &key).expect("state").expect("a value");
            (key, serde_json::to_value(value).expect("JSON"))
        })
        .collect()
}

/// The whole store as a range query over every partition answers it, or
/// the status of an answer that is not complete.
fn range(
    port: u16,
    store: &str,
    token: Option<&str>,
) -> Result<(BTreeMap<String, Value>, Value), u16> {
    let path = format!("/stores/main/{store}/range?limit=100000");
    let (status, body) = query(port, &path, token).ok_or(0u16)?;
    if status != 200 {
        return Err(status);
    }
    let partitions = body["partitions"].as_array().expect("partitions");
    assert_eq!(partitions.len(), PARTITIONS, "{body}");
    let mut values = BTreeMap::new();
    for (index, partition) in partitions.iter().enumerate() {
        assert_eq!(partition["partition"], index as i64, "{partition}");
        assert_eq!(partition["more"], false, "{partition}");
        assert!(
            partition["position"]["offset"].is_i64() || partition["position"]["offset"].is_null(),
            "{partition}"
        );
        for entry in partition["entries"].as_array().expect("entries") {
            let key = entry["key"].as_str().expect("key").to_string();
            assert_eq!(
                murmur2_partition(key.as_bytes(), PARTITIONS),
                index,
                "key {key} answered by the wrong partition"
            );
            values.insert(key, without_wall_clock(entry["value"].clone()));
        }
    }
    Ok((values, body))
}

/// Waits until a range query on `port` gives `expected`; the last answer.
fn wait_for_state(
    port: u16,
    store: &str,
    expected: &BTreeMap<String, Value>,
    token: Option<&str>,
    log: impl Fn() -> String,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last = None;
    while Instant::now() < deadline {
        match range(port, store, token) {
            Ok((values, body)) if values == *expected => return body,
            Ok((values, _)) => last = Some(values),
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let last = last.unwrap_or_default();
    let missing: Vec<_> = expected
        .keys()
        .filter(|k| !last.contains_key(*k))
        .take(5)
        .collect();
    let wrong: Vec<_> = (last.iter())
        .filter(|(k, v)| expected.get(*k) != Some(v))
        .take(5)
        .collect();
    panic!(
        "store {store} never answered the model's {} keys (last: {} keys; missing {missing:?}; differing {wrong:?})\nlog:\n{}",
        expected.len(),
        last.len(),
        log()
    );
}

/// Asks instance `port` for every key of `expected` (and one absent key),
/// and checks each answer; returns the instances that served them.
fn check_keys(
    port: u16,
    store: &str,
    expected: &BTreeMap<String, Value>,
    token: Option<&str>,
) -> std::collections::BTreeSet<String> {
    let mut served_by = std::collections::BTreeSet::new();
    for (key, value) in expected {
        let path = format!("/stores/main/{store}/keys/{}", percent(key));
        let (status, body) = query_settled(port, &path, token);
        assert_eq!(status, 200, "{key}: {body}");
        assert_eq!(body["value"], *value, "{key}: {body}");
        assert_eq!(body["key"], key.as_str());
        assert_eq!(
            body["partition"],
            murmur2_partition(key.as_bytes(), PARTITIONS) as i64
        );
        assert_eq!(body["served_by"]["role"], "active", "{body}");
        assert_eq!(body["lag"], 0, "{body}");
        served_by.insert(body["served_by"]["instance"].as_str().unwrap().to_string());
    }
    let (status, body) = query_settled(
        port,
        &format!("/stores/main/{store}/keys/nobody-at-all"),
        token,
    );
    assert_eq!((status, &body["value"]), (200, &Value::Null), "{body}");
    served_by
}

fn percent(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A sessionizer run on new topics of [`PARTITIONS`] partitions: generated
/// events of `users` users (not produced yet), and the open sessions the
/// driver holds after them.
fn sessionizer_run(
    users: usize,
    max_events: usize,
) -> (SingleInputRun, Vec<Value>, BTreeMap<String, Value>) {
    let run = SingleInputRun::new("sessionizer", "user-events", "user-sessions", PARTITIONS);
    let (lines, _) = generate(users, max_events, BASE);
    let mut model = driver(
        sessionizer::pipeline(settings("sessionizer", &[])),
        PARTITIONS,
    );
    pipe_all(&mut model, "user-events", &lines);
    model.commit().expect("commit");
    // Its session type is the service's own: read as any JSON value.
    let expected = model_values(&mut model, &ValueState::<Value>::new("sessions"));
    (run, lines, expected)
}

#[test]
fn sessionizer_answers_every_key_from_either_instance_and_after_a_kill_9_of_an_owner() {
    let (run, lines, expected) = sessionizer_run(60, 6);
    assert!(
        expected.len() >= 10,
        "open sessions to ask about: {}",
        expected.len()
    );

    let arguments = run.args(&[]);
    let first = start_instance("sessionizer", &arguments, &[]);
    let second = start_instance("sessionizer", &arguments, &[]);
    produce(&run.input, "user-events", &lines);
    let logs = || format!("{}\n---\n{}", first.service.log(), second.service.log());

    // The range over every partition, from each instance, once the second
    // has joined (the first may have had every partition, and the whole
    // state, before).
    let owners = |body: &Value| -> std::collections::BTreeSet<String> {
        (body["partitions"].as_array().unwrap())
            .iter()
            .map(|p| p["served_by"]["instance"].to_string())
            .collect()
    };
    let mut body = Value::Null;
    let shared = eventually(Duration::from_secs(60), || {
        body = wait_for_state(first.port, "sessions", &expected, None, logs);
        owners(&body).len() == 2
    });
    assert!(shared, "both instances own partitions: {body}");
    wait_for_state(second.port, "sessions", &expected, None, logs);

    // By key, from each: half the keys live on the other instance.
    assert_eq!(check_keys(first.port, "sessions", &expected, None).len(), 2);
    assert_eq!(
        check_keys(second.port, "sessions", &expected, None).len(),
        2
    );

    // The catalog, and the errors of a bad query.
    let (status, catalog) = query_settled(first.port, "/stores", None);
    assert_eq!(status, 200);
    assert_eq!(catalog["stores"][0]["store"], "sessions", "{catalog}");
    assert_eq!(catalog["stores"][0]["partitions"], PARTITIONS as i64);
    assert_eq!(
        query(first.port, "/stores/main/nothing/keys/a", None)
            .unwrap()
            .0,
        404
    );
    let (status, _) = query(first.port, "/stores/main/sessions/range?limit=x", None).unwrap();
    assert_eq!(status, 400);

    // kill -9 of the second instance: its partitions answer 503 until the
    // first has taken them over, then the same state; never another value.
    let (status, body) = query_settled(first.port, "/stores/main/sessions/range", None);
    assert_eq!(status, 200, "{body}");
    let killed = second.service.state_dir.clone();
    second.service.kill();
    let mut unavailable = 0;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let mut all_answered = true;
        for (key, value) in &expected {
            let path = format!("/stores/main/sessions/keys/{}", percent(key));
            let (status, body) = query(first.port, &path, None).expect("an answer");
            match status {
                200 => assert_eq!(body["value"], *value, "{key} after the kill: {body}"),
                503 => {
                    unavailable += 1;
                    all_answered = false;
                }
                other => panic!("{key}: status {other}: {body}"),
            }
        }
        if all_answered && unavailable > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first instance never answered for the killed one's partitions ({unavailable} 503s)\n{}",
            first.service.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        unavailable > 0,
        "the killed owner's keys were unavailable for a while"
    );
    let body = wait_for_state(first.port, "sessions", &expected, None, || {
        first.service.log()
    });
    for partition in body["partitions"].as_array().unwrap() {
        assert_eq!(
            partition["served_by"]["instance"],
            body["partitions"][0]["served_by"]["instance"]
        );
    }
    let _ = std::fs::remove_dir_all(killed);
}

#[test]
fn the_order_shipment_joiner_answers_both_stores_with_a_token_that_can_change_and_positions() {
    let orders = unique("orders");
    let shipments = unique("shipments");
    create_topic(&orders, PARTITIONS);
    create_topic(&shipments, PARTITIONS);
    let order_lines = fixture("order-shipment-joiner/orders.jsonl");
    let shipment_lines = fixture("order-shipment-joiner/shipments.jsonl");
    let mut model = driver(
        order_shipment_joiner::pipeline(settings("order-shipment-joiner", &[])),
        PARTITIONS,
    );
    pipe_all(&mut model, "orders", &order_lines);
    pipe_all(&mut model, "shipments", &shipment_lines);
    model.advance_time(Duration::from_secs(2)).expect("time");
    model.commit().expect("commit");
    let expected_orders = model_values(&mut model, &order_shipment_joiner::processor::ORDERS);
    let expected_shipments = model_values(&mut model, &order_shipment_joiner::processor::SHIPMENTS);
    assert!(!expected_orders.is_empty() || !expected_shipments.is_empty());

    let token = "s3cret-token";
    let token_file = scratch_dir().join(unique("query-token"));
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let arguments = args(&[
        "--orders-topic",
        &orders,
        "--shipments-topic",
        &shipments,
        "--output-topic",
        &unique("shipped-orders"),
        "--application-id",
        &unique("joiner-queries"),
        "--query-token-file",
        token_file.to_str().unwrap(),
    ]);
    let first = start_instance("order-shipment-joiner", &arguments, &[]);
    let second = start_instance("order-shipment-joiner", &arguments, &[]);
    produce(&orders, "orders", &order_lines);
    produce(&shipments, "shipments", &shipment_lines);
    let logs = || format!("{}\n---\n{}", first.service.log(), second.service.log());

    let body = wait_for_state(first.port, "orders", &expected_orders, Some(token), logs);
    wait_for_state(
        second.port,
        "shipments",
        &expected_shipments,
        Some(token),
        logs,
    );
    check_keys(second.port, "orders", &expected_orders, Some(token));
    check_keys(first.port, "shipments", &expected_shipments, Some(token));

    // Positions: each partition's changelog offset, and a minimum position
    // past it is not met (503), while one at it is.
    let partition = &body["partitions"][0];
    assert!(partition["position"]["changelog"]
        .as_str()
        .unwrap()
        .ends_with("-orders-changelog"));
    if let Some(offset) = partition["position"]["offset"].as_i64() {
        let at = format!("/stores/main/orders/range?partition=0&min_position={offset}");
        assert_eq!(query_settled(first.port, &at, Some(token)).0, 200);
        let past = format!(
            "/stores/main/orders/range?partition=0&min_position={}",
            offset + 1_000
        );
        assert_eq!(query(first.port, &past, Some(token)).unwrap().0, 503);
    }

    // Without the token, or with another, nothing is answered.
    assert_eq!(query_settled(first.port, "/stores", None).0, 401);
    assert_eq!(query_settled(first.port, "/stores", Some("wrong")).0, 401);
    assert_eq!(query_settled(first.port, "/stores", Some(token)).0, 200);

    // A new token in the file (a Secret updated in place) is taken up by
    // both instances without a restart, forwarded queries included, and
    // the old one is refused.
    let rotated = "r0tated-token";
    std::fs::write(&token_file, format!("{rotated}\n")).unwrap();
    check_keys(first.port, "shipments", &expected_shipments, Some(rotated));
    check_keys(second.port, "orders", &expected_orders, Some(rotated));
    assert_eq!(query_settled(first.port, "/stores", Some(token)).0, 401);
    assert!(first.service.log().contains("the token file changed"));
}

#[test]
fn queries_over_tls_are_answered_and_forwarded_between_instances() {
    let dir = scratch_dir().join(unique("query-tls"));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let ca = std::fs::read(&cert).unwrap();

    let (run, lines, expected) = sessionizer_run(20, 4);
    assert!(!expected.is_empty());

    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let tls = [
        "--query-tls-cert-file",
        cert,
        "--query-tls-key-file",
        key,
        "--query-tls-ca-file",
        cert,
    ];
    let arguments = run.args(&[]);
    let first = start_instance_with_scheme("sessionizer", &arguments, &tls, "https");
    let second = start_instance_with_scheme("sessionizer", &arguments, &tls, "https");
    produce(&run.input, "user-events", &lines);

    // Every key from the first instance, once both share the partitions:
    // those of the second's are forwarded to it over TLS, trusting the CA
    // file.
    let mut served_by = std::collections::BTreeSet::new();
    let answered = eventually(Duration::from_secs(90), || {
        served_by.clear();
        let all = expected.iter().all(|(key, value)| {
            let path = format!("/stores/main/sessions/keys/{}", percent(key));
            match query_tls(first.port, &path, &ca) {
                Some((200, body)) if body["value"] == *value => {
                    served_by.insert(body["served_by"]["instance"].to_string());
                    true
                }
                _ => false,
            }
        });
        all && served_by.len() == 2
    });
    assert!(
        answered,
        "not every key was answered over TLS by both instances ({served_by:?})\n{}\n---\n{}",
        first.service.log(),
        second.service.log()
    );
    // Plain HTTP gets no answer from a TLS listener.
    assert!(query(first.port, "/stores", None).is_none());
}

/// Fields holding wall-clock times (embed-batcher's), which differ between
/// the driver's manual clock and a running service's.
const WALL_CLOCK_FIELDS: [&str; 2] = ["written_at", "expiry_check"];

/// `value` without [`WALL_CLOCK_FIELDS`], at any depth.
fn without_wall_clock(mut value: Value) -> Value {
    match &mut value {
        Value::Object(fields) => {
            for name in WALL_CLOCK_FIELDS {
                fields.remove(name);
            }
            for field in fields.values_mut() {
                *field = without_wall_clock(field.take());
            }
        }
        Value::Array(items) => {
            for item in items {
                *item = without_wall_clock(item.take());
            }
        }
        _ => {}
    }
    value
}

/// The entries of map store `store` in the driver, by key: what a key
/// query's `entries` holds, `{"key", "value"}` each, in entry order.
fn model_maps(
    driver: &mut TestDriver,
    store: &str,
    entry_key: impl Fn(&[u8]) -> Value,
) -> BTreeMap<String, Value> {
    let mut maps: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (stored, value) in driver
        .stage_entries::<Value>("main", store)
        .expect("entries")
    {
        let length = u32::from_be_bytes(stored[..4].try_into().unwrap()) as usize;
        let key = String::from_utf8(stored[4..4 + length].to_vec()).unwrap();
        let entry = &stored[4 + length..];
        maps.entry(key)
            .or_default()
            .push(serde_json::json!({"key": entry_key(entry), "value": value}));
    }
    maps.into_iter()
        .map(|(key, entries)| {
            let mut entries = entries;
            entries.sort_by_key(|entry| entry["key"].to_string());
            (key, Value::Array(entries))
        })
        .collect()
}

/// Waits until instance `port` answers every key of `expected` (map
/// stores: their `entries`) as the model says.
fn wait_for_keys(
    port: u16,
    store: &str,
    expected: &BTreeMap<String, Value>,
    log: impl Fn() -> String,
) {
    let answer = |key: &str| -> Option<Value> {
        let path = format!("/stores/main/{store}/keys/{}", percent(key));
        let (status, body) = query(port, &path, None)?;
        (status == 200).then(|| {
            let mut entries = body["entries"].as_array().cloned().unwrap_or_default();
            entries.sort_by_key(|entry| entry["key"].to_string());
            without_wall_clock(Value::Array(entries))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut wrong = Vec::new();
    while Instant::now() < deadline {
        wrong = (expected.iter())
            .filter(|(key, value)| answer(key).as_ref() != Some(*value))
            .map(|(key, _)| key.clone())
            .collect();
        if wrong.is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let first = &wrong[0];
    panic!(
        "store {store}: keys {wrong:?} never answered as the model says; {first}: {:?}, expected {}\n{}",
        answer(first),
        expected[first],
        log()
    );
}

#[test]
fn sensor_fusion_answers_a_machines_windows_in_a_time_range() {
    let (temperature, humidity) = (unique("temperature-readings"), unique("humidity-readings"));
    create_topic(&temperature, PARTITIONS);
    create_topic(&humidity, PARTITIONS);
    let start = 1_785_574_800_000_i64;
    let machines: Vec<String> = (0..12).map(|m| format!("machine-{m}")).collect();
    let mut temperatures = Vec::new();
    let mut humidities = Vec::new();
    for step in 0..8_i64 {
        for (index, machine) in machines.iter().enumerate() {
            let time = start + step * 40_000 + index as i64 * 100;
            temperatures.push(serde_json::json!({"key": machine, "value":
                {"machine_id": machine, "temperature": 60.0 + (step * 3 + index as i64) as f64, "event_time": time}}));
            humidities.push(serde_json::json!({"key": machine, "value":
                {"sensor_id": machine, "humidity": 50.0 + (step * 5) as f64, "event_time": time + 10}}));
        }
    }
    let mut model = driver(
        sensor_fusion::pipeline(settings("sensor-fusion", &[])),
        PARTITIONS,
    );
    pipe_all(&mut model, "temperature-readings", &temperatures);
    pipe_all(&mut model, "humidity-readings", &humidities);
    model.advance_time(Duration::from_secs(2)).expect("time");
    model.commit().expect("commit");
    let start_of = |entry: &[u8]| -> Value {
        (i64::from_be_bytes(entry.try_into().unwrap()) ^ i64::MIN).into()
    };
    let expected = model_maps(&mut model, "window-readings", start_of);
    assert!(
        expected.len() >= 6,
        "machines with open windows: {}",
        expected.len()
    );

    let arguments = args(&[
        "--temperature-topic",
        &temperature,
        "--humidity-topic",
        &humidity,
        "--output-topic",
        &unique("machine-maintenance"),
        "--application-id",
        &unique("sensor-fusion-queries"),
    ]);
    let first = start_instance("sensor-fusion", &arguments, &[]);
    let second = start_instance("sensor-fusion", &arguments, &[]);
    produce(&temperature, "temperature-readings", &temperatures);
    produce(&humidity, "humidity-readings", &humidities);
    let logs = || format!("{}\n---\n{}", first.service.log(), second.service.log());
    wait_for_keys(second.port, "window-readings", &expected, logs);

    // A time range selects windows by their start, both ends included.
    let (machine, windows) = expected.iter().next().unwrap();
    let windows = windows.as_array().unwrap();
    let first_start = windows[0]["key"].as_i64().unwrap();
    let path = format!(
        "/stores/main/window-readings/keys/{machine}/windows?from={first_start}&to={first_start}"
    );
    let (status, body) = query_settled(first.port, &path, None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["entries"],
        Value::Array(vec![windows[0].clone()]),
        "{body}"
    );
    let path = format!(
        "/stores/main/window-readings/keys/{machine}/windows?to={}",
        first_start - 1
    );
    assert_eq!(
        query_settled(first.port, &path, None).1["entries"],
        serde_json::json!([])
    );
    let (_, catalog) = query_settled(first.port, "/stores", None);
    assert_eq!(catalog["stores"][0]["kind"], "map");
    assert_eq!(catalog["stores"][0]["windowed"], true);
}

#[test]
fn window_aggregator_answers_the_final_stages_open_windows_by_group() {
    use e2e_tests::windows::generate as generate_orders;
    let run = SingleInputRun::new(
        "window-aggregator",
        "orders-marketplace",
        "order-window-counts",
        PARTITIONS,
    );
    let orders = generate_orders(300, 9, BASE, 5_000);
    let lines: Vec<Value> = orders.iter().map(|order| order.line()).collect();
    let flags = [
        "--window-size",
        "60s",
        "--window-advance",
        "20s",
        "--group-by",
        "customer_id",
    ];
    let mut model = driver(
        window_aggregator::pipeline(settings("window-aggregator", &flags)),
        PARTITIONS,
    );
    pipe_all(&mut model, "orders-marketplace", &lines);
    for _ in 0..3 {
        model.advance_time(Duration::from_secs(2)).expect("time");
        model.commit().expect("commit");
    }
    let expected: BTreeMap<String, Value> = model
        .stage_entries::<BTreeMap<i64, Value>>("final", "open-windows")
        .expect("final state")
        .into_iter()
        .map(|(key, windows)| {
            let entries = (windows.into_iter())
                .map(|(start, value)| serde_json::json!({"key": start, "value": value}))
                .collect();
            (String::from_utf8(key).unwrap(), Value::Array(entries))
        })
        .collect();
    assert!(!expected.is_empty(), "open final windows to ask about");

    let arguments = run.args(&flags);
    let first = start_instance("window-aggregator", &arguments, &[]);
    let second = start_instance("window-aggregator", &arguments, &[]);
    produce(&run.input, "orders-marketplace", &lines);
    let answer = |port: u16, key: &str| -> Option<Value> {
        let path = format!("/stores/final/open-windows/windows?key={}", percent(key));
        let (status, body) = query(port, &path, None)?;
        (status == 200).then(|| body["entries"].clone())
    };
    let answered = eventually(Duration::from_secs(90), || {
        (expected.iter()).all(|(key, windows)| {
            [first.port, second.port]
                .iter()
                .all(|port| answer(*port, key).as_ref() == Some(windows))
        })
    });
    assert!(
        answered,
        "the final stage's windows never matched the model {expected:?}\n{}\n---\n{}",
        first.service.log(),
        second.service.log()
    );
    // Stores are named per stage: the first stage has its own open windows
    // (answered once its group is not rebalancing).
    let main_stage = |port| query(port, "/stores/main/open-windows/range?limit=1", None);
    assert!(
        eventually(Duration::from_secs(60), || main_stage(first.port)
            .is_some_and(|(status, _)| status == 200)),
        "{:?}",
        main_stage(first.port)
    );
    assert_eq!(
        query(first.port, "/stores/other/open-windows/range", None)
            .unwrap()
            .0,
        404
    );
}

#[test]
fn embed_batcher_answers_each_tenants_pending_edits_and_progress() {
    use e2e_tests::batches::generate as generate_edits;
    let run = SingleInputRun::new(
        "embed-batcher",
        "articles",
        "article-embeddings",
        PARTITIONS,
    );
    // Without the generator's closing far-future edits, which would make
    // every batch due.
    let edits = generate_edits(12, PARTITIONS, BASE, 1_000);
    let lines: Vec<Value> = (edits.iter())
        .filter(|edit| !edit.tenant.starts_with("flush-"))
        .map(|edit| edit.line())
        .collect();
    // Batches that never fill nor wait out: every edit stays pending.
    let flags = [
        "--embedder",
        "hashing",
        "--batch-size",
        "100000",
        "--max-wait",
        "1h",
    ];
    let mut model = driver(
        embed_batcher::pipeline(settings("embed-batcher", &flags)),
        PARTITIONS,
    );
    pipe_all(&mut model, "articles", &lines);
    model.commit().expect("commit");
    let document = |entry: &[u8]| -> Value { String::from_utf8(entry.to_vec()).unwrap().into() };
    let expected: BTreeMap<String, Value> = (model_maps(&mut model, "pending", document)
        .into_iter())
    .map(|(tenant, edits)| (tenant, without_wall_clock(edits)))
    .collect();
    assert!(
        expected.len() >= 6,
        "tenants with pending edits: {}",
        expected.len()
    );

    let arguments = run.args(&flags);
    let first = start_instance("embed-batcher", &arguments, &[]);
    let second = start_instance("embed-batcher", &arguments, &[]);
    produce(&run.input, "articles", &lines);
    let logs = || format!("{}\n---\n{}", first.service.log(), second.service.log());
    wait_for_keys(first.port, "pending", &expected, logs);
    wait_for_keys(second.port, "pending", &expected, logs);
    let progress = (model_values(&mut model, &ValueState::<Value>::new("progress")).into_iter())
        .map(|(tenant, progress)| (tenant, without_wall_clock(progress)))
        .collect();
    wait_for_state(first.port, "progress", &progress, None, logs);
    // The wall-clock times left out above are this run's.
    let (_, body) = query_settled(second.port, "/stores/main/pending/keys/tenant-1", None);
    let written_at = body["entries"][0]["value"]["written_at"].as_i64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!((now - 600_000..=now).contains(&written_at), "{body}");
}

#[test]
fn a_standby_answers_when_allowed_with_its_lag() {
    let (run, lines, expected) = sessionizer_run(30, 4);

    let arguments = run.args(&["--standby-replicas", "1"]);
    let first = start_instance("sessionizer", &arguments, &[]);
    let second = start_instance("sessionizer", &arguments, &[]);
    produce(&run.input, "user-events", &lines);
    let logs = || format!("{}\n---\n{}", first.service.log(), second.service.log());
    wait_for_state(first.port, "sessions", &expected, None, logs);

    // Every key from the first instance with standby=allow: the keys of the
    // second's partitions come from the first's own standby copies once
    // they are kept, with their lag, and equal the owner's state.
    let mut roles = std::collections::BTreeSet::new();
    let answered = eventually(Duration::from_secs(60), || {
        roles.clear();
        expected.iter().all(|(key, value)| {
            let path = format!("/stores/main/sessions/keys/{}?standby=allow", percent(key));
            match query(first.port, &path, None) {
                Some((200, body)) if body["value"] == *value => {
                    assert!(body["lag"].as_i64().unwrap() >= 0, "{body}");
                    roles.insert(body["served_by"]["role"].as_str().unwrap().to_string());
                    true
                }
                _ => false,
            }
        }) && roles.contains("standby")
    });
    assert!(answered, "no standby answered ({roles:?})\n{}", logs());
    assert!(roles.contains("active"), "{roles:?}");
    // Without standby=allow the owner answers.
    let (key, value) = expected.iter().next().unwrap();
    let path = format!("/stores/main/sessions/keys/{}", percent(key));
    let (status, body) = query_settled(first.port, &path, None);
    assert_eq!((status, &body["value"]), (200, value), "{body}");
    assert_eq!(body["served_by"]["role"], "active", "{body}");
}

/// More queries at once than `--query-max-concurrent` allows: the rest are
/// turned away with 429 and `Retry-After` rather than queued, those within
/// it are answered whole, and `/healthz` answers within its probe's
/// timeout (3 s in the manifests) throughout.
#[test]
fn a_query_flood_is_turned_away_and_health_still_answers() {
    let (run, lines, expected) = sessionizer_run(3_000, 6);
    let instance = start_instance(
        "sessionizer",
        &run.args(&[]),
        &["--query-max-concurrent", "2"],
    );
    produce(&run.input, "user-events", &lines);
    wait_for_state(instance.port, "sessions", &expected, None, || {
        instance.service.log()
    });

    let flooding = std::sync::atomic::AtomicBool::new(true);
    let statuses = std::sync::Mutex::new(BTreeMap::<u16, usize>::new());
    let slowest_health = std::thread::scope(|scope| {
        for _ in 0..16 {
            scope.spawn(|| {
                while flooding.load(std::sync::atomic::Ordering::Relaxed) {
                    let answered = match range(instance.port, "sessions", None) {
                        Ok((values, _)) => {
                            assert_eq!(values, expected, "an answered range is whole");
                            200
                        }
                        Err(status) => status,
                    };
                    *statuses.lock().unwrap().entry(answered).or_default() += 1;
                }
            });
        }
        let mut slowest = Duration::ZERO;
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            let asked = Instant::now();
            let health = http_answer(instance.service.http_port, "/healthz");
            assert_eq!(health.map(|(status, _)| status), Some(200));
            slowest = slowest.max(asked.elapsed());
            std::thread::sleep(Duration::from_millis(100));
        }
        flooding.store(false, std::sync::atomic::Ordering::Relaxed);
        slowest
    });
    let statuses = statuses.into_inner().unwrap();
    println!("statuses under the flood: {statuses:?}; slowest /healthz {slowest_health:?}");
    assert!(statuses.get(&429).is_some_and(|&n| n > 0), "{statuses:?}");
    assert!(statuses.get(&200).is_some_and(|&n| n > 0), "{statuses:?}");
    assert_eq!(
        statuses.keys().copied().collect::<Vec<_>>(),
        [200, 429],
        "nothing but answers and refusals: {statuses:?}"
    );
    assert!(
        slowest_health < Duration::from_secs(3),
        "/healthz took {slowest_health:?} under the flood"
    );
}

/// A listener other hosts can reach, without a token: refused at start,
/// with one line that says what to do, unless explicitly allowed.
#[test]
fn open_queries_without_a_token_are_refused_unless_allowed() {
    let query_addr = format!("0.0.0.0:{}", free_port());
    let output = std::process::Command::new(bin("sessionizer"))
        .args(["--query-addr", &query_addr])
        .env("STATE_DIR", fresh_state_dir())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--query-token-file"), "{stderr}");
    assert!(stderr.contains("--query-allow-unauthenticated"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
