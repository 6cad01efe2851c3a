//! Crashes, restarts, lost state and scale-out, with a real service
//! (sessionizer) on the real stack. Outputs are read with read_committed.

use std::time::Duration;

use e2e_tests::sessions::generate;
use e2e_tests::*;
use serde_json::{json, Value};

const BASE: i64 = 1_783_345_153_000;

struct Run {
    input: String,
    output: String,
    arguments: Vec<String>,
    lines: Vec<Value>,
    expected: Vec<Value>,
}

impl Run {
    fn produce_input(&self) {
        produce(&self.input, "user-events", &self.lines);
    }
}

/// Topics, arguments and the events of `users` generated users, already
/// produced to the input.
fn prepare(partitions: usize, users: usize, extra: &[&str]) -> Run {
    let run = prepare_unproduced(partitions, users, extra);
    run.produce_input();
    run
}

/// Like [`prepare`], but the input is left empty.
fn prepare_unproduced(partitions: usize, users: usize, extra: &[&str]) -> Run {
    let input = unique("user-events");
    let output = unique("user-sessions");
    create_topic(&input, partitions);
    let (lines, expected) = generate(users, 9, BASE);
    let mut arguments = args(&[
        "--input-topic",
        &input,
        "--output-topic",
        &output,
        "--application-id",
        &unique("sessionizer-ft"),
        // A killed member is noticed after 6 s instead of librdkafka's 45 s.
        "--kafka",
        "session.timeout.ms=6000",
        "--kafka",
        "heartbeat.interval.ms=1000",
    ]);
    arguments.extend(args(extra));
    Run {
        input,
        output,
        arguments,
        lines,
        expected,
    }
}

fn consumed(service: &Service, run: &Run) -> f64 {
    service.metric(&format!(
        "streams_records_consumed_total{{topic=\"{}\"}}",
        run.input
    ))
}

/// Waits until `service` has consumed at least `count` input records.
fn wait_for_progress(service: &Service, run: &Run, count: f64) {
    assert!(
        eventually(Duration::from_secs(120), || consumed(service, run) >= count),
        "no progress: {}\n{}",
        service.metrics(),
        service.log()
    );
}

/// Starts the service, kills it (SIGKILL) once it has made progress, starts
/// it again on the same state directory and returns all output once complete.
fn kill_and_restart(run: &Run) -> (Vec<Value>, Service) {
    let second =
        restart_after_kill_9_under_backlog("sessionizer", &run.arguments, &run.input, 30_000);
    let output = wait_for_records(&run.output, run.expected.len(), Duration::from_secs(240));
    (output, second)
}

/// A service started while its broker does not answer waits for it,
/// alive and not ready, instead of exiting (a crash loop on Kubernetes);
/// once the broker answers it starts, and the output is exact.
#[test]
fn a_service_started_before_its_broker_waits_for_it() {
    let run = prepare(2, 500, &[]);
    let port = free_port();
    let mut arguments = run.arguments.clone();
    arguments.extend(args(&["--bootstrap-servers", &format!("127.0.0.1:{port}")]));
    let mut service = Service::start("sessionizer", &arguments);
    service.wait_for_log(
        "Kafka does not answer; waiting for it",
        Duration::from_secs(30),
    );
    // Longer than the 10 s after which start-up once gave up.
    std::thread::sleep(Duration::from_secs(12));
    assert!(!service.has_exited(), "exited:\n{}", service.log());
    let status = |path| http_answer(service.http_port, path).map(|(status, _)| status);
    assert_eq!(status("/healthz"), Some(200), "{}", service.log());
    assert_eq!(status("/readyz"), Some(503), "{}", service.log());
    assert!(
        service.log().matches("waiting for it").count() >= 2,
        "the wait is reported again while it lasts:\n{}",
        service.log()
    );

    forward_port(port, &bootstrap());
    let output = wait_for_records(&run.output, run.expected.len(), Duration::from_secs(120));
    assert_same_records(&output, &run.expected, &service.log());
    service.wait_ready(Duration::from_secs(30));
    service.assert_no_aborted_commit();
}

#[test]
fn kill_9_in_the_middle_then_restart_gives_exact_output() {
    let run = prepare(2, 12_000, &[]);
    let (output, service) = kill_and_restart(&run);
    assert_same_records(&output, &run.expected, &service.log());
    service.assert_no_aborted_commit();
}

#[test]
fn at_least_once_after_kill_9_loses_nothing() {
    let run = prepare(2, 12_000, &["--processing-guarantee", "at_least_once"]);
    let (output, second) = kill_and_restart(&run);
    let distinct = |rows: &[Value]| {
        let mut rows = sorted(rows.to_vec());
        rows.dedup();
        rows
    };
    let written_once = distinct(&output);
    println!(
        "at_least_once: {} rows, {} distinct, {} duplicates",
        output.len(),
        written_once.len(),
        output.len() - written_once.len()
    );
    // The same rows, some repeated; compared as sets, because the generated
    // input can make one user two identical sessions, which a set holds once.
    assert_same_records(&written_once, &distinct(&run.expected), &second.log());
    let copies = |rows: &[Value]| {
        let mut copies = std::collections::BTreeMap::<String, usize>::new();
        for row in rows {
            *copies.entry(row.to_string()).or_default() += 1;
        }
        copies
    };
    let written = copies(&output);
    for (row, expected) in copies(&run.expected) {
        assert!(
            written[&row] >= expected,
            "{row} is expected {expected} times but was written {} times",
            written[&row]
        );
    }
}

/// At-least-once writes an interval's changelog records before its input
/// offsets; a crash in between leaves records of work that will be done
/// again. A restore must stop where the last offset commit reaches, or that
/// work would count twice. Simulated: after a clean stop, a record is
/// appended to the changelog that no commit covers.
#[test]
fn at_least_once_restores_only_what_the_last_commit_reaches() {
    let run = prepare(1, 2_000, &["--processing-guarantee", "at_least_once"]);
    let first = Service::start_with_state("sessionizer", &run.arguments, fresh_state_dir());
    let output = wait_for_records(&run.output, run.expected.len(), Duration::from_secs(120));
    assert_same_records(&output, &run.expected, &first.log());
    assert!(first.stop().success());
    let restore = || {
        let service = Service::start_with_state("sessionizer", &run.arguments, fresh_state_dir());
        service.wait_ready(Duration::from_secs(60));
        let restored = service.metric("streams_restored_records_total");
        assert!(service.stop().success());
        restored
    };
    let committed = restore();
    assert!(committed > 1_000.0, "restored {committed}");

    let application_id = run
        .arguments
        .iter()
        .skip_while(|argument| *argument != "--application-id")
        .nth(1)
        .expect("an application id");
    let uncommitted = write_jsonl(&[json!({"key": "user-0", "value": "half-done work"})]);
    streamctl_ok(&[
        "produce",
        "--topic",
        &format!("{application_id}-sessions-changelog"),
        "--raw",
        "--file",
        uncommitted.to_str().unwrap(),
    ]);
    assert_eq!(
        restore(),
        committed,
        "the record past the last commit's reach must not be restored"
    );
    // Nothing was processed twice either.
    let output = consume_all(&run.output);
    assert_same_records(&output, &run.expected, "after two restores");
}

#[test]
fn lost_local_state_is_rebuilt_from_the_changelog() {
    let run = prepare(2, 12_000, &[]);
    let first = Service::start_with_state("sessionizer", &run.arguments, fresh_state_dir());
    wait_for_progress(&first, &run, 30_000.0);
    let old_state = first.state_dir.clone();
    assert!(first.stop().success());
    std::fs::remove_dir_all(&old_state).unwrap();
    let second = Service::start_with_state("sessionizer", &run.arguments, fresh_state_dir());
    let output = wait_for_records(&run.output, run.expected.len(), Duration::from_secs(240));
    assert_same_records(&output, &run.expected, &second.log());
    assert!(
        second.metric("streams_restored_records_total") > 1_000.0,
        "state must come back from the changelog: {}",
        second.metrics()
    );
}

#[test]
fn a_restart_after_kill_9_restores_only_the_changelog_tail() {
    // 20k users with one event each: 20k open sessions and timers in state.
    let input = unique("user-events");
    let output = unique("user-sessions");
    create_topic(&input, 1);
    let lines: Vec<Value> = (0..20_000)
        .map(|u| e2e_tests::sessions::event(&format!("user-{u}"), "LOGIN", BASE + u))
        .collect();
    produce(&input, "user-events", &lines);
    let arguments = args(&[
        "--input-topic",
        &input,
        "--output-topic",
        &output,
        "--application-id",
        &unique("sessionizer-tail"),
    ]);
    let state = fresh_state_dir();
    let first = Service::start_with_state("sessionizer", &arguments, state.clone());
    let series = format!("streams_records_consumed_total{{topic=\"{input}\"}}");
    assert!(
        eventually(Duration::from_secs(120), || first.metric(&series)
            >= 20_000.0),
        "{}",
        first.log()
    );
    std::thread::sleep(Duration::from_secs(1));
    first.kill();
    let second = Service::start_with_state("sessionizer", &arguments, state);
    second.wait_ready(Duration::from_secs(60));
    let restored = second.metric("streams_restored_records_total");
    assert!(
        restored < 2_000.0,
        "only the tail past the checkpoint may be replayed, not the ~60k changelog records; restored {restored}"
    );
    // The state is all there: one more event times every session out.
    produce(
        &input,
        "user-events",
        &[e2e_tests::sessions::event(
            "closer",
            "LOGIN",
            BASE + 1_000_000,
        )],
    );
    let timed_out = wait_for_records(&output, 20_000, Duration::from_secs(120));
    assert_eq!(timed_out.len(), 20_000, "{}", second.log());
}

#[test]
fn two_instances_survive_losing_one() {
    // The input comes once both instances hold their tasks: produced
    // before, one instance alone could process it all before the other joins.
    let run = prepare_unproduced(4, 12_000, &[]);
    let first = Service::start_with_state("sessionizer", &run.arguments, fresh_state_dir());
    let second = Service::start_with_state("sessionizer", &run.arguments, fresh_state_dir());
    second.wait_ready(Duration::from_secs(60));
    first.wait_ready(Duration::from_secs(60));
    run.produce_input();
    wait_for_progress(&first, &run, 5_000.0);
    wait_for_progress(&second, &run, 5_000.0);
    first.kill();
    let output = wait_for_records(&run.output, run.expected.len(), Duration::from_secs(240));
    assert_same_records(&output, &run.expected, &second.log());
}

/// An instance killed with a transaction open: once the group drops it, the
/// other instance fences its transactional id, which aborts the open
/// transaction at once. Until then the killed instance's open transaction
/// holds back every read_committed reader of the partitions it wrote, the
/// output's included; with a transaction timeout of 10 minutes, waiting
/// for it would outlast this test's wait for the output.
#[test]
fn a_killed_instance_s_open_transaction_is_aborted_once_the_group_drops_it() {
    let run = prepare_unproduced(
        4,
        4_000,
        &[
            "--commit-interval",
            "30s",
            "--kafka",
            "transaction.timeout.ms=600000",
        ],
    );
    let first = Service::start_with_state("sessionizer", &run.arguments, fresh_state_dir());
    let second = Service::start_with_state("sessionizer", &run.arguments, fresh_state_dir());
    second.wait_ready(Duration::from_secs(60));
    first.wait_ready(Duration::from_secs(60));
    run.produce_input();
    // Consumed, not committed: the first commit comes 30 s in.
    wait_for_progress(&first, &run, 1_000.0);
    first.kill();
    let output = wait_for_records(&run.output, run.expected.len(), Duration::from_secs(150));
    assert_same_records(&output, &run.expected, &second.log());
    let log = second.log();
    assert!(
        log.contains("fenced its transactional id"),
        "the remaining instance did not fence the killed one:\n{log}"
    );
}

/// A commit interval longer than the transaction timeout (60 s against
/// 10 s): a transaction open for a quarter of the timeout is committed
/// whatever the interval, so the output comes within seconds and no
/// transaction is aborted by its coordinator.
#[test]
fn a_commit_interval_longer_than_the_transaction_timeout_still_commits() {
    let run = prepare(1, 2_000, &["--commit-interval", "60s"]);
    let service = Service::start("sessionizer", &run.arguments);
    let output = wait_for_records(&run.output, run.expected.len(), Duration::from_secs(40));
    assert_same_records(&output, &run.expected, &service.log());
    service.assert_no_aborted_commit();
    let longest = service.metric("streams_transaction_open_seconds_max");
    assert!(longest < 5.0, "a transaction stayed open {longest} s");
}
