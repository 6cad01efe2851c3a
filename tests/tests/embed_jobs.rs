//! embed-batcher embeds off the processing thread (runtime jobs): other
//! tenants' records keep flowing while a batch is embedded, several batches
//! are in flight at once, and a kill -9 during embedding loses nothing and
//! writes nothing twice.

use std::sync::atomic::Ordering;
use std::time::Duration;

use e2e_tests::batches::Edit;
use e2e_tests::embedder::FakeEmbedder;
use e2e_tests::*;
use serde_json::Value;

const T: i64 = 1_783_345_153_000;

fn run_args(run: &SingleInputRun, port: u16, extra: &[&str]) -> Vec<String> {
    let url = format!("http://127.0.0.1:{port}");
    let mut arguments = run.args(&[
        "--embedder",
        "openai",
        "--embedder-url",
        &url,
        "--batch-size",
        "2",
        "--embed-workers",
        "4",
        // Requests are held for a while: let the transaction wait for them.
        "--kafka",
        "transaction.timeout.ms=60000",
    ]);
    arguments.extend(args(extra));
    arguments
}

fn produce_edits(run: &SingleInputRun, edits: &[Edit]) {
    let lines: Vec<Value> = edits.iter().map(Edit::line).collect();
    produce(&run.input, "articles", &lines);
}

/// Two edits (one full batch) for each of `tenants`, then a record that
/// moves the watermark past them all.
fn full_batches(tenants: &[&str], at: i64) -> Vec<Edit> {
    let mut edits: Vec<Edit> = tenants
        .iter()
        .flat_map(|tenant| {
            [
                Edit::new(tenant, &format!("{tenant}-a"), at),
                Edit::new(tenant, &format!("{tenant}-b"), at + 1),
            ]
        })
        .collect();
    edits.push(Edit::new("clock", &format!("tick-{at}"), at + 10_000));
    edits
}

fn doc_ids(rows: &[Value]) -> Vec<String> {
    let mut ids: Vec<String> = rows
        .iter()
        .map(|row| row["value"]["doc_id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

#[test]
fn batches_are_embedded_concurrently_while_records_keep_flowing() {
    let embedder = FakeEmbedder::held();
    let port = embedder.serve();
    let run = SingleInputRun::new("embed-batcher", "articles", "article-embeddings", 1);
    // A commit waits for the batches in flight (their rows and the removal
    // of their edits commit together); with a long interval no commit falls
    // inside this test's held requests, so what it shows is the overlap
    // between commits.
    let service = Service::start(
        "embed-batcher",
        &run_args(&run, port, &["--commit-interval", "60s"]),
    );
    service.wait_ready(Duration::from_secs(60));

    let first = full_batches(&["acme", "globex", "initech"], T);
    produce_edits(&run, &first);
    assert!(
        eventually(Duration::from_secs(30), || embedder
            .received
            .load(Ordering::SeqCst)
            >= 3),
        "three batches should be in flight at once:\n{}",
        service.log()
    );
    assert_eq!(embedder.most_in_flight.load(Ordering::SeqCst), 3);

    // While those requests are held, more records are processed: the next
    // tenant's batch goes out too.
    let second = full_batches(&["umbrella"], T + 20_000);
    produce_edits(&run, &second);
    assert!(
        eventually(Duration::from_secs(30), || embedder
            .received
            .load(Ordering::SeqCst)
            >= 4),
        "a batch of another tenant was sent while three were still embedding:\n{}",
        service.log()
    );
    embedder.released.store(true, Ordering::SeqCst);
    let output = wait_for_records(&run.output, 8, Duration::from_secs(60));
    assert_eq!(
        doc_ids(&output),
        vec![
            "acme-a",
            "acme-b",
            "globex-a",
            "globex-b",
            "initech-a",
            "initech-b",
            "umbrella-a",
            "umbrella-b"
        ],
        "{}",
        service.log()
    );
    for tenant in ["acme", "globex", "initech", "umbrella"] {
        let order: Vec<&str> = output
            .iter()
            .filter(|row| row["key"] == tenant)
            .map(|row| row["value"]["doc_id"].as_str().unwrap())
            .collect();
        assert_eq!(
            order,
            vec![format!("{tenant}-a"), format!("{tenant}-b")],
            "a tenant's rows keep batch order"
        );
    }
}

#[test]
fn a_kill_9_during_embedding_loses_nothing_and_writes_nothing_twice() {
    let embedder = FakeEmbedder::held();
    let port = embedder.serve();
    let run = SingleInputRun::new("embed-batcher", "articles", "article-embeddings", 1);
    let arguments = run_args(&run, port, &[]);
    let state = fresh_state_dir();
    let first = Service::start_with_state("embed-batcher", &arguments, state.clone());
    first.wait_ready(Duration::from_secs(60));
    produce_edits(&run, &full_batches(&["acme", "globex"], T));
    assert!(
        eventually(Duration::from_secs(30), || embedder
            .received
            .load(Ordering::SeqCst)
            >= 2),
        "both batches should be embedding:\n{}",
        first.log()
    );
    first.kill();
    embedder.released.store(true, Ordering::SeqCst);

    let second = Service::start_with_state("embed-batcher", &arguments, state);
    let output = wait_for_records(&run.output, 4, Duration::from_secs(90));
    assert_eq!(
        doc_ids(&output),
        vec!["acme-a", "acme-b", "globex-a", "globex-b"],
        "each edit embedded and written exactly once after the crash:\n{}",
        second.log()
    );
    assert!(
        embedder.received.load(Ordering::SeqCst) >= 4,
        "the batches were embedded again after the restart"
    );
}
