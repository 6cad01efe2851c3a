//! embed-batcher end to end, what needs Kafka: the worked example of
//! docs/services/embed-batcher.md through the binary, and the
//! OpenAI-compatible embedder against a flaky in-test HTTP server (retries,
//! an outage longer than the transaction timeout or the poll interval, a
//! stop during an outage). The batching rules, dedupe, lateness, the random
//! model, state restored from the changelogs and the state TTL are tested on
//! the test driver, in driver_embed_batcher.rs.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use e2e_tests::batches::{assert_same_rows_per_tenant, row, without_embedding, Edit};
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

const T: i64 = 1_783_345_153_000;

/// The worked example through the binary (see [`fixture_runs::embed_batcher`]).
#[test]
fn the_worked_example_gives_the_documented_batches() {
    fixture_runs::embed_batcher();
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

/// The embedder fails for about 25 s of backoff, longer than the
/// transaction timeout (10 s): no transaction is open while the commit
/// waits for the batch, so none is aborted and the output is exact.
#[test]
fn an_embedder_outage_longer_than_the_transaction_timeout_loses_nothing() {
    let log = assert_an_outage_loses_nothing(&[]);
    assert!(
        !log.contains("commit aborted"),
        "the outage aborted a commit:\n{log}"
    );
}

/// The instance waits for the failing batch in its loop, polling its
/// consumer, so an outage longer than `max.poll.interval.ms` (7 s here,
/// 5 minutes by default) does not drop it from its group.
#[test]
fn an_embedder_outage_longer_than_the_poll_interval_keeps_the_group() {
    let log = assert_an_outage_loses_nothing(&[
        "--kafka",
        "session.timeout.ms=6000",
        "--kafka",
        "max.poll.interval.ms=7000",
    ]);
    assert!(
        !log.contains("max.poll.interval.ms") && !log.contains("commit aborted"),
        "the instance left its group or aborted a commit during the outage:\n{log}"
    );
}

/// Request 0 (acme's batch) succeeds; beta's batch then fails for 25 s of
/// backoff. The output must still be exact.
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

/// An outage with input waiting: the thread takes in records its commit
/// cannot let it process, so past `--liveness-timeout` `/healthz` fails
/// (the liveness probe would restart the pod), naming the stalled thread,
/// and passes again once the embedder answers. Idle before any input, the
/// thread is not stalled however long it waits. With standbys on (as in
/// the prod overlay), whose updater shares the thread's labels:
/// `streams_stalled_seconds`, which StreamsStalled watches, shows the stall.
#[test]
fn an_outage_with_input_waiting_fails_liveness_until_the_embedder_answers() {
    const TIMEOUT_SECONDS: u64 = 2;
    let (port, requests) = fake_embeddings(1..9);
    let topics = topics(1);
    let timeout = format!("{TIMEOUT_SECONDS}s");
    let service = Service::start(
        "embed-batcher",
        &openai_args(
            &topics,
            port,
            &["--liveness-timeout", &timeout, "--standby-replicas", "1"],
        ),
    );
    service.wait_ready(Duration::from_secs(60));
    let healthz = || http_answer(service.http_port, "/healthz");
    let idle_until = std::time::Instant::now() + Duration::from_secs(2 * TIMEOUT_SECONDS);
    while std::time::Instant::now() < idle_until {
        assert_eq!(healthz(), Some((200, "ok\n".to_string())), "idle");
        std::thread::sleep(Duration::from_millis(250));
    }

    // acme's batch is embedded (request 0); beta's fails from request 1 on.
    let edits = [
        Edit::new("acme", "doc-1", T),
        Edit::new("acme", "doc-2", T + 100),
        Edit::new("beta", "doc-3", T + 200),
        Edit::new("beta", "doc-4", T + 300),
        Edit::new("gamma", "doc-5", T + 200_000),
        Edit::new("gamma", "doc-6", T + 200_100),
    ];
    let tick = |at: i64| Edit::new("clock", "tick", at);
    produce_edits(&topics, &[&edits[..4], &[tick(T + 100_000)]].concat());
    assert!(
        eventually(Duration::from_secs(30), || requests.lock().unwrap().len()
            >= 2),
        "beta's batch was never sent:\n{}",
        service.log()
    );
    // gamma's edits wait: the commit due waits for beta's batch first.
    produce_edits(&topics, &[&edits[4..], &[tick(T + 300_000)]].concat());
    let mut stalled = None;
    assert!(
        eventually(Duration::from_secs(20), || {
            stalled = healthz().filter(|(status, _)| *status == 503);
            stalled.is_some()
        }),
        "/healthz never failed during the outage:\n{}",
        service.log()
    );
    let (_, why) = stalled.unwrap();
    assert!(
        why.starts_with("stalled: processing thread 0 of the first stage has made no progress"),
        "{why}"
    );
    assert!(service.metric("streams_stalled_seconds") > TIMEOUT_SECONDS as f64);

    // The first tick's own batch goes too, once the second tick passes it.
    let output = wait_for_records(&topics.output, 7, Duration::from_secs(120));
    let rows: Vec<Value> = output
        .iter()
        .filter(|line| line["key"] != "clock")
        .map(|l| without_embedding(l, 2))
        .collect();
    let expected = vec![
        row(&edits[0], T + 100),
        row(&edits[1], T + 100),
        row(&edits[2], T + 300),
        row(&edits[3], T + 300),
        row(&edits[4], T + 200_100),
        row(&edits[5], T + 200_100),
    ];
    assert_same_rows_per_tenant(&rows, &expected, &service.log());
    assert!(
        eventually(Duration::from_secs(10), || healthz()
            == Some((200, "ok\n".to_string()))),
        "/healthz still fails after the outage: {:?}",
        healthz()
    );
}
