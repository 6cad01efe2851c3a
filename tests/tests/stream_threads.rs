//! `--stream-threads`: several processing threads in one process share a
//! stage's tasks through its one consumer group, and the output stays exact
//! — also across a kill -9 under exactly-once. Sessionizer on the real stack,
//! four input partitions, two threads.

use std::time::Duration;

use e2e_tests::sessions::generate;
use e2e_tests::*;
use serde_json::Value;

const BASE: i64 = 1_783_345_153_000;
const PARTITIONS: usize = 4;
const THREADS: usize = 2;

struct Run {
    input: String,
    output: String,
    arguments: Vec<String>,
    lines: Vec<Value>,
    inputs: usize,
    expected: Vec<Value>,
}

impl Run {
    fn produce_input(&self) {
        produce(&self.input, "user-events", &self.lines);
    }
}

/// Topics, arguments for two threads (and `extra`) and generated input (not
/// produced yet).
fn prepare(users: usize, extra: &[&str]) -> Run {
    let input = unique("user-events");
    let output = unique("user-sessions");
    create_topic(&input, PARTITIONS);
    let (lines, expected) = generate(users, 9, BASE);
    let mut arguments = args(&[
        "--input-topic",
        &input,
        "--output-topic",
        &output,
        "--application-id",
        &unique("sessionizer-threads"),
        "--stream-threads",
        &THREADS.to_string(),
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
        inputs: lines.len(),
        lines,
        expected,
    }
}

/// Input records consumed by processing thread `thread` of `service`.
fn consumed_by(service: &Service, run: &Run, thread: usize) -> f64 {
    service.metric(&format!(
        "streams_records_consumed_total{{topic=\"{}\",thread=\"{thread}\"}}",
        run.input
    ))
}

fn consumed(service: &Service, run: &Run) -> f64 {
    (0..THREADS)
        .map(|thread| consumed_by(service, run, thread))
        .sum()
}

/// The tasks each thread opened, from the log lines of its span
/// (`stream_thread{thread=1}: task ready partition=2`).
fn tasks_opened_by(log: &str, thread: usize) -> Vec<i32> {
    let span = format!("stream_thread{{thread={thread}}}");
    log.lines()
        .filter(|line| line.contains(&span) && line.contains("task ready"))
        .filter_map(|line| {
            line.split("partition=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Runs the service with two threads to the end of its output and checks
/// that it is exact, that every thread had tasks and consumed, and that
/// SIGTERM stops it cleanly. The input is produced once both threads hold
/// tasks: the first thread to join could otherwise be through all of it
/// before the second one's rebalance.
fn assert_threads_share_the_work(run: &Run) {
    let service = Service::start("sessionizer", &run.arguments);
    service.wait_ready(Duration::from_secs(60));
    let both_hold_tasks = eventually(Duration::from_secs(60), || {
        let log = service.log();
        (0..THREADS).all(|thread| !tasks_opened_by(&log, thread).is_empty())
    });
    assert!(both_hold_tasks, "a thread got no task:\n{}", service.log());
    service.wait_ready(Duration::from_secs(60));
    run.produce_input();
    let output = wait_for_records(&run.output, run.expected.len(), Duration::from_secs(240));
    assert_same_records(&output, &run.expected, &service.log());

    let all_consumed = eventually(Duration::from_secs(30), || {
        consumed(&service, run) >= run.inputs as f64
    });
    let log = service.log();
    let opened: Vec<Vec<i32>> = (0..THREADS).map(|t| tasks_opened_by(&log, t)).collect();
    let per_thread: Vec<f64> = (0..THREADS)
        .map(|thread| consumed_by(&service, run, thread))
        .collect();
    println!("tasks opened per thread: {opened:?}; records consumed per thread: {per_thread:?}");
    assert!(
        opened.iter().all(|tasks| !tasks.is_empty()),
        "every thread must have had tasks: {opened:?}\n{log}"
    );
    assert!(
        per_thread.iter().all(|&count| count > 0.0),
        "every thread must have consumed: {per_thread:?}\n{}",
        service.metrics()
    );
    assert!(
        all_consumed,
        "the threads consume every input record between them: {per_thread:?} of {}",
        run.inputs
    );

    // SIGTERM stops every thread cleanly.
    service.stop_cleanly("the service with two threads");
}

#[test]
fn two_threads_share_the_tasks_and_the_output_is_exact() {
    assert_threads_share_the_work(&prepare(12_000, &[]));
}

/// Each thread is a static member of its own (`pod-0`, `pod-0-1`) with a
/// transactional id of its own: a shared `group.instance.id` would have the
/// coordinator fence one of the threads.
#[test]
fn two_threads_with_an_instance_id_are_two_static_members() {
    let instance = unique("pod");
    assert_threads_share_the_work(&prepare(6_000, &["--instance-id", &instance]));
}

#[test]
fn kill_9_with_two_threads_then_restart_gives_exact_output() {
    let run = prepare(12_000, &[]);
    let state = fresh_state_dir();
    let first = Service::start_with_state("sessionizer", &run.arguments, state.clone());
    run.produce_input();
    assert!(
        eventually(Duration::from_secs(120), || consumed(&first, &run)
            >= 30_000.0),
        "no progress: {}\n{}",
        first.metrics(),
        first.log()
    );
    first.kill();
    let second = Service::start_with_state("sessionizer", &run.arguments, state);
    let output = wait_for_records(&run.output, run.expected.len(), Duration::from_secs(240));
    assert_same_records(&output, &run.expected, &second.log());
}
