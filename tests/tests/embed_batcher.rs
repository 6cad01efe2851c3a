//! embed-batcher end to end: random edits against a model of the rules in
//! docs/services/embed-batcher.md, the batching rules on a hand-written
//! scenario, state TTL, and the OpenAI-compatible embedder against a flaky
//! in-test HTTP server.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use e2e_tests::batches::{generate, model, per_tenant, row, without_embedding, Edit, Rules};
use e2e_tests::*;
use serde_json::Value;

fn topics(partitions: usize) -> SingleInputRun {
    SingleInputRun::new(
        "embed-batcher",
        "articles",
        "article-embeddings",
        partitions,
    )
}

fn produce_edits(topics: &SingleInputRun, edits: &[Edit]) {
    let lines: Vec<Value> = edits.iter().map(Edit::line).collect();
    produce(&topics.input, "articles", &lines);
}

/// Waits until the service has consumed `count` input records and committed.
fn wait_consumed(service: &Service, topics: &SingleInputRun, count: usize) {
    let series = format!(
        "streams_records_consumed_total{{topic=\"{}\"}}",
        topics.input
    );
    assert!(
        eventually(Duration::from_secs(60), || service.metric(&series)
            == count as f64),
        "{}",
        service.log()
    );
}

fn processor_counter(service: &Service, name: &str) -> f64 {
    service.metric(&format!(
        "streams_processor_events_total{{name=\"{name}\"}}"
    ))
}

fn late_records(service: &Service, topics: &SingleInputRun) -> f64 {
    service.metric(&format!(
        "streams_records_late_total{{topic=\"{}\"}}",
        topics.input
    ))
}

/// Same rows, and each tenant's rows in the same order.
fn assert_same_rows_per_tenant(actual: &[Value], expected: &[Value], log: &str) {
    assert_same_records(actual, expected, log);
    let (actual, expected) = (per_tenant(actual), per_tenant(expected));
    for (tenant, rows) in &expected {
        assert_eq!(
            actual.get(tenant),
            Some(rows),
            "rows of {tenant} in another order"
        );
    }
}

const T: i64 = 1_783_345_153_000;

#[test]
fn random_edits_of_many_tenants_over_four_partitions_match_a_model_of_the_rules() {
    let partitions = 4;
    let rules = Rules {
        batch_size: 5,
        max_wait: 30_000,
        max_out_of_orderness: 5_000,
    };
    // Disorder a little beyond the watermark bound, so that some edits are late.
    let edits = generate(12, partitions, T, 5_500);
    let expected = model(&edits, partitions, &rules);
    assert!(expected.batches > 20 && expected.late > 0, "{expected:?}");
    let topics = topics(partitions);
    let service = topics.start(&["--batch-size", "5", "--embedding-dimensions", "16"]);
    produce_edits(&topics, &edits);
    let output = wait_for_records(
        &topics.output,
        expected.rows.len(),
        Duration::from_secs(180),
    );
    let rows: Vec<Value> = output.iter().map(|l| without_embedding(l, 16)).collect();
    assert_same_rows_per_tenant(&rows, &expected.rows, &service.log());
    assert!(
        eventually(Duration::from_secs(30), || {
            late_records(&service, &topics) == expected.late as f64
                && processor_counter(&service, "batches_sent") == expected.batches as f64
        }),
        "expected {} late, {} batches\n{}",
        expected.late,
        expected.batches,
        service.metrics()
    );
}

#[test]
fn batches_follow_the_documented_rules() {
    let topics = topics(1);
    let service = topics.start(&["--batch-size", "3"]);
    let acme_d1_old = Edit::new("acme", "d1", T);
    let acme_d2 = Edit::new("acme", "d2", T + 1_000);
    let acme_d1 = Edit::new("acme", "d1", T + 2_000);
    let acme_d2_older = Edit::new("acme", "d2", T + 500);
    let acme_d3 = Edit::new("acme", "d3", T + 3_000);
    let globex_g1 = Edit::new("globex", "g1", T + 4_000);
    produce_edits(
        &topics,
        &[
            acme_d1_old,
            acme_d2.clone(),
            acme_d1.clone(), // replaces the pending d1
            acme_d2_older,   // older than the pending d2: ignored
            acme_d3.clone(), // the third pending edit: a batch is full at T + 3 s
            globex_g1.clone(),
            Edit::new("clock", "tick", T + 7_999), // watermark T + 2.999 s
        ],
    );
    wait_consumed(&service, &topics, 7);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        consume_all(&topics.output).is_empty(),
        "the watermark is 1 ms short of acme's full batch\n{}",
        service.log()
    );

    produce_edits(
        &topics,
        &[
            Edit::new("clock", "tick", T + 8_000), // watermark T + 3 s: acme's batch goes
            Edit::new("acme", "d4", T + 3_000),    // at the watermark: late
            Edit::new("clock", "tock", T + 39_000), // watermark T + 34 s: globex waited 30 s
        ],
    );
    let output = wait_for_records(&topics.output, 4, Duration::from_secs(60));
    let rows: Vec<Value> = output.iter().map(|l| without_embedding(l, 384)).collect();
    assert_same_rows_per_tenant(
        &rows,
        &[
            row(&acme_d2, T + 3_000),
            row(&acme_d1, T + 3_000),
            row(&acme_d3, T + 3_000),
            row(&globex_g1, T + 34_000),
        ],
        &service.log(),
    );
    let counters = [
        ("batches_sent", 2.0),
        ("edits_replaced", 2.0), // acme d1, clock tick
        ("edits_superseded", 1.0),
    ];
    assert!(
        eventually(Duration::from_secs(30), || {
            late_records(&service, &topics) == 1.0
                && counters
                    .iter()
                    .all(|(name, value)| processor_counter(&service, name) == *value)
        }),
        "{}",
        service.metrics()
    );
}

#[test]
fn pending_edits_not_written_for_the_state_ttl_are_dropped_and_counted() {
    let topics = topics(1);
    let service = topics.start(&["--state-ttl", "2s"]);
    produce_edits(
        &topics,
        &[Edit::new("acme", "d1", T), Edit::new("globex", "g1", T)],
    );
    wait_consumed(&service, &topics, 2);
    std::thread::sleep(Duration::from_secs(3));
    let globex_g2 = Edit::new("globex", "g2", T + 1_000);
    let acme_d2 = Edit::new("acme", "d2", T + 40_000);
    produce_edits(
        &topics,
        &[
            // globex is touched: its expired g1 goes before g2 is buffered.
            globex_g2.clone(),
            // Watermark T + 35 s: both timers (T + 30 s) fire; acme's d1 has
            // expired, globex's g2 is fresh and has waited 30 s.
            acme_d2.clone(),
            // Watermark T + 75 s: acme's d2 has waited 30 s.
            Edit::new("clock", "tick", T + 80_000),
        ],
    );
    let output = wait_for_records(&topics.output, 2, Duration::from_secs(60));
    let rows: Vec<Value> = output.iter().map(|l| without_embedding(l, 384)).collect();
    assert_same_rows_per_tenant(
        &rows,
        &[row(&globex_g2, T + 30_000), row(&acme_d2, T + 70_000)],
        &service.log(),
    );
    assert!(
        eventually(Duration::from_secs(30), || processor_counter(
            &service,
            "pending_edits_expired"
        ) == 2.0),
        "{}",
        service.metrics()
    );
}

/// Watermark and state survive a restart (a watermark kept only in memory
/// would let stale edits in): after a restart on an empty state directory, the
/// pending edits, the timer and the watermark come back from the changelogs,
/// so a stale edit is still late and the waiting batch still goes.
#[test]
fn pending_edits_timers_and_the_watermark_survive_a_restart_without_local_state() {
    let topics = topics(1);
    let arguments = topics.args(&[]);
    let first = Service::start("embed-batcher", &arguments);
    let acme_d1 = Edit::new("acme", "d1", T);
    produce_edits(
        &topics,
        &[acme_d1.clone(), Edit::new("clock", "tick", T + 20_000)],
    );
    wait_consumed(&first, &topics, 2);
    std::thread::sleep(Duration::from_millis(500));
    assert!(first.stop().success());

    produce_edits(
        &topics,
        &[
            // At or before the stored watermark (T + 15 s): late, not buffered.
            Edit::new("acme", "d1", T + 10_000),
            // Watermark T + 35 s: acme's timer (T + 30 s) sends the old d1.
            Edit::new("clock", "tock", T + 40_000),
        ],
    );
    let second = Service::start("embed-batcher", &arguments);
    let output = wait_for_records(&topics.output, 1, Duration::from_secs(60));
    let rows: Vec<Value> = output.iter().map(|l| without_embedding(l, 384)).collect();
    assert_same_rows_per_tenant(&rows, &[row(&acme_d1, T + 30_000)], &second.log());
    assert!(
        eventually(Duration::from_secs(30), || late_records(&second, &topics)
            == 1.0),
        "{}",
        second.metrics()
    );
}

/// What the fake embeddings endpoint received: authorization, model, inputs.
type Requests = Arc<Mutex<Vec<(String, Value, Vec<String>)>>>;

/// An OpenAI-compatible `/v1/embeddings` endpoint that answers the requests
/// numbered (from 0) in `failures` with 500, the others with, for each input
/// `doc-<k>...`, the vector `[k, 0.5]`, listing the answers in reverse
/// (clients must order them by index).
fn fake_embeddings(failures: std::ops::Range<usize>) -> (u16, Requests) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests: Requests = Arc::default();
    let seen = requests.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let failed = failures.contains(&seen.lock().unwrap().len());
            if let Some(request) = answer(stream, failed) {
                seen.lock().unwrap().push(request);
            }
        }
    });
    (port, requests)
}

/// Serves one request on `stream` (the connection is then closed).
fn answer(stream: TcpStream, fail: bool) -> Option<(String, Value, Vec<String>)> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).ok()?;
    assert!(
        request_line.starts_with("POST /v1/embeddings "),
        "{request_line}"
    );
    let mut headers = BTreeMap::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let Some((name, value)) = line.trim_end().split_once(':') else {
            break;
        };
        headers.insert(name.to_ascii_lowercase(), value.trim().to_string());
    }
    let length: usize = headers.get("content-length")?.parse().ok()?;
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let request: Value = serde_json::from_slice(&body).ok()?;
    let inputs: Vec<String> = request["input"]
        .as_array()?
        .iter()
        .map(|i| i.as_str().unwrap_or_default().to_string())
        .collect();
    let (status, answer) = if fail {
        ("500 Internal Server Error", json!({"error": "overloaded"}))
    } else {
        let mut data: Vec<Value> = inputs
            .iter()
            .enumerate()
            .map(|(index, text)| {
                let k: f64 = text
                    .trim_start_matches("doc-")
                    .split(' ')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(-1.0);
                json!({"object": "embedding", "index": index, "embedding": [k, 0.5]})
            })
            .collect();
        data.reverse();
        (
            "200 OK",
            json!({"object": "list", "data": data, "model": request["model"]}),
        )
    };
    let answer = answer.to_string();
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    )
    .ok()?;
    let authorization = headers.get("authorization").cloned().unwrap_or_default();
    Some((authorization, request["model"].clone(), inputs))
}

/// Arguments for batches of two through the OpenAI-compatible embedder at
/// `port` (the fake server), then `extra`.
fn openai_args(topics: &SingleInputRun, port: u16, extra: &[&str]) -> Vec<String> {
    let url = format!("http://127.0.0.1:{port}");
    let mut flags = vec![
        "--batch-size",
        "2",
        "--embedder",
        "openai",
        "--embedder-url",
        &url,
    ];
    flags.extend(extra);
    topics.args(&flags)
}

#[test]
fn the_openai_embedder_is_retried_until_it_answers_and_nothing_is_lost() {
    let (port, requests) = fake_embeddings(0..2);
    let topics = topics(1);
    let service = Service::start(
        "embed-batcher",
        &openai_args(
            &topics,
            port,
            &[
                "--embedder-model",
                "test-model",
                "--embedder-api-key",
                "sk-test",
                // One batch at a time: the requests below are in send order.
                "--embed-workers",
                "1",
            ],
        ),
    );
    let edits: Vec<Edit> = (1..=5)
        .map(|k| Edit::new("acme", &format!("doc-{k}"), T + 100 * (k - 1)))
        .collect();
    let mut lines = edits.clone();
    // Watermark T + 95 s: acme's timer (T + 100 ms, when doc-2 filled a batch)
    // fires; two full batches and the overdue rest go, with that batch time.
    lines.push(Edit::new("clock", "tick", T + 100_000));
    produce_edits(&topics, &lines);

    let output = wait_for_records(&topics.output, 5, Duration::from_secs(60));
    let rows: Vec<Value> = output.iter().map(|l| without_embedding(l, 2)).collect();
    let expected: Vec<Value> = edits.iter().map(|e| row(e, T + 100)).collect();
    assert_same_rows_per_tenant(&rows, &expected, &service.log());
    for (line, k) in output.iter().zip(1..) {
        assert_eq!(line["value"]["embedding"], json!([k as f64, 0.5]), "{line}");
    }

    let requests = requests.lock().unwrap();
    let text = |e: &Edit| format!("{}\n\n{}", e.title, e.body);
    let inputs: Vec<Vec<String>> = requests.iter().map(|(_, _, i)| i.clone()).collect();
    assert_eq!(
        inputs,
        vec![
            vec![text(&edits[0]), text(&edits[1])], // failed
            vec![text(&edits[0]), text(&edits[1])], // failed
            vec![text(&edits[0]), text(&edits[1])],
            vec![text(&edits[2]), text(&edits[3])],
            vec![text(&edits[4])],
        ]
    );
    assert!(requests
        .iter()
        .all(|(auth, model, _)| auth == "Bearer sk-test" && model == "test-model"));
}

/// The embedder blocks the engine thread while it retries; under exactly-once
/// the runtime's transaction times out (10 s), the producer is fenced and
/// replaced, and the task rolls back to its last commit.
#[test]
fn an_embedder_outage_longer_than_the_transaction_timeout_loses_nothing() {
    assert_an_outage_loses_nothing(&[]);
}

/// While the engine thread waits for the embedder it does not poll: past
/// `max.poll.interval.ms` librdkafka leaves the group. The instance must
/// rejoin, get its task back and finish the batch, with nothing lost or
/// repeated. (7 s instead of the default 5 minutes, to keep the test short;
/// a transaction timeout longer than the outage, so that only the group is
/// left behind.)
#[test]
fn an_embedder_outage_longer_than_the_poll_interval_loses_nothing() {
    let log = assert_an_outage_loses_nothing(&[
        "--kafka",
        "session.timeout.ms=6000",
        "--kafka",
        "max.poll.interval.ms=7000",
        "--kafka",
        "transaction.timeout.ms=60000",
    ]);
    assert!(
        log.contains("max.poll.interval.ms"),
        "the instance was to exceed the poll interval:\n{log}"
    );
}

/// Request 0 (acme's batch) succeeds and its rows open a transaction; beta's
/// batch then fails for 25 s of backoff. The output must still be exact.
/// Returns the service's log.
fn assert_an_outage_loses_nothing(extra: &[&str]) -> String {
    let (port, requests) = fake_embeddings(1..9);
    let topics = topics(1);
    let service = Service::start("embed-batcher", &openai_args(&topics, port, extra));
    let edits = vec![
        Edit::new("acme", "doc-1", T),
        Edit::new("acme", "doc-2", T + 100),
        Edit::new("beta", "doc-3", T + 200),
        Edit::new("beta", "doc-4", T + 300),
    ];
    let mut lines = edits.clone();
    lines.push(Edit::new("clock", "tick", T + 100_000));
    produce_edits(&topics, &lines);
    let output = wait_for_records(&topics.output, 4, Duration::from_secs(120));
    let rows: Vec<Value> = output.iter().map(|l| without_embedding(l, 2)).collect();
    let expected = vec![
        row(&edits[0], T + 100),
        row(&edits[1], T + 100),
        row(&edits[2], T + 300),
        row(&edits[3], T + 300),
    ];
    // Exactly once: the aborted transaction's rows are not visible, the
    // rolled-back batches were embedded again.
    assert_same_rows_per_tenant(&rows, &expected, &service.log());
    assert!(requests.lock().unwrap().len() >= 10);
    service.log()
}

#[test]
fn a_stop_during_an_embedder_outage_is_prompt_and_loses_nothing() {
    let (down_port, down_requests) = fake_embeddings(0..usize::MAX);
    let topics = topics(1);
    let state = fresh_state_dir();
    let embedder = |port: u16| openai_args(&topics, port, &[]);
    let edits = vec![
        Edit::new("acme", "doc-1", T),
        Edit::new("acme", "doc-2", T + 100),
    ];
    let mut lines = edits.clone();
    lines.push(Edit::new("clock", "tick", T + 100_000));
    produce_edits(&topics, &lines);
    let first = Service::start_with_state("embed-batcher", &embedder(down_port), state.clone());
    assert!(
        eventually(Duration::from_secs(60), || down_requests
            .lock()
            .unwrap()
            .len()
            >= 3),
        "the embedder is being retried:\n{}",
        first.log()
    );
    let asked = std::time::Instant::now();
    let log = first.log.clone();
    let status = first.stop();
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "stopped in {:?}",
        asked.elapsed()
    );
    assert!(
        !status.success(),
        "the batch was not sent, so the stop fails"
    );
    assert!(std::fs::read_to_string(log)
        .unwrap()
        .contains("stopping while the embedder fails"));
    assert!(consume_all(&topics.output).is_empty());

    let (up_port, _) = fake_embeddings(0..0);
    let second = Service::start_with_state("embed-batcher", &embedder(up_port), state);
    let output = wait_for_records(&topics.output, 2, Duration::from_secs(60));
    let rows: Vec<Value> = output.iter().map(|l| without_embedding(l, 2)).collect();
    let expected: Vec<Value> = edits.iter().map(|e| row(e, T + 100)).collect();
    assert_same_rows_per_tenant(&rows, &expected, &second.log());
}
