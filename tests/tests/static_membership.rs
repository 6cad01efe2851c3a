//! Static membership (`--instance-id`): an instance restarted within the
//! session timeout gets its partitions back with no rebalance, after a
//! SIGTERM and after a kill -9, and the output stays exact.

use std::time::{Duration, Instant};

use e2e_tests::sessions::generate;
use e2e_tests::*;

const BASE: i64 = 1_783_345_153_000;

/// How many times the log says a task was closed (a revocation).
fn closed_tasks(service: &Service) -> usize {
    service.log().matches("task closed").count()
}

/// Seconds from `started` until `service` has committed once.
fn seconds_to_first_commit(service: &Service, started: Instant) -> f64 {
    assert!(
        eventually(Duration::from_secs(60), || service
            .metric("streams_commits_total")
            >= 1.0),
        "no commit after the restart:\n{}",
        service.log()
    );
    started.elapsed().as_secs_f64()
}

#[test]
fn a_restart_with_the_same_instance_id_moves_no_task_of_the_other_instance() {
    let run = SingleInputRun::new("sessionizer", "user-events", "user-sessions", 4);
    // A long session timeout: the restart must happen within it.
    let extra = [
        "--kafka",
        "session.timeout.ms=30000",
        "--kafka",
        "heartbeat.interval.ms=1000",
    ];
    let start = |instance: &str, state: &std::path::Path| {
        let mut arguments = run.args(&extra);
        arguments.extend(args(&["--instance-id", instance]));
        Service::start_with_state("sessionizer", &arguments, state.to_path_buf())
    };
    let (state_a, state_b) = (fresh_state_dir(), fresh_state_dir());
    let a = start("instance-a", &state_a);
    let mut b = start("instance-b", &state_b);
    a.wait_ready(Duration::from_secs(60));
    b.wait_ready(Duration::from_secs(60));

    let (lines, expected) = generate(2_000, 6, BASE);
    let (first, rest) = lines.split_at(lines.len() / 3);
    let (second, third) = rest.split_at(rest.len() / 2);
    produce(&run.input, "user-events", first);
    assert!(
        eventually(Duration::from_secs(60), || {
            a.metric("streams_commits_total") >= 1.0 && b.metric("streams_commits_total") >= 1.0
        }),
        "both instances should own tasks and commit"
    );
    let closed_before = closed_tasks(&a);

    // SIGTERM, then the same instance id on the same state directory.
    assert!(b.stop().success());
    let restarted = Instant::now();
    b = start("instance-b", &state_b);
    let after_sigterm = seconds_to_first_commit(&b, restarted);
    produce(&run.input, "user-events", second);

    // kill -9, then the same again.
    std::thread::sleep(Duration::from_secs(1));
    b.kill();
    let restarted = Instant::now();
    b = start("instance-b", &state_b);
    let after_kill = seconds_to_first_commit(&b, restarted);
    produce(&run.input, "user-events", third);

    let output = wait_for_records(&run.output, expected.len(), Duration::from_secs(120));
    assert_same_records(&output, &expected, &format!("log of b:\n{}", b.log()));
    assert_eq!(
        closed_tasks(&a),
        closed_before,
        "instance a lost tasks to a rebalance:\n{}",
        a.log()
    );
    println!(
        "restart to first commit with --instance-id: {after_sigterm:.2} s after SIGTERM, \
         {after_kill:.2} s after kill -9"
    );
    assert!(
        after_sigterm < 5.0 && after_kill < 5.0,
        "restart to first commit took {after_sigterm:.2} s / {after_kill:.2} s"
    );
}

#[test]
fn an_invalid_instance_id_is_refused_with_one_clear_line() {
    let run = SingleInputRun::new("sessionizer", "user-events", "user-sessions", 1);
    let mut arguments = run.args(&[]);
    arguments.extend(args(&["--instance-id", "pod 0/bad"]));
    let service = Service::start("sessionizer", &arguments);
    let (status, log) = service
        .wait_exit(Duration::from_secs(20))
        .expect("the service should refuse to start");
    assert!(!status.success());
    assert!(log.contains("not a valid instance id"), "log: {log}");
    assert!(!log.contains("panicked"), "log: {log}");
}

#[test]
fn an_instance_fenced_by_another_with_its_instance_id_exits_with_one_clear_line() {
    let run = SingleInputRun::new("sessionizer", "user-events", "user-sessions", 1);
    let mut arguments = run.args(&[]);
    arguments.extend(args(&["--instance-id", "twin"]));
    let first = Service::start_with_state("sessionizer", &arguments, fresh_state_dir());
    first.wait_ready(Duration::from_secs(60));
    // A second process with the same instance id (a misconfigured
    // deployment) takes the membership over; the broker fences the first.
    let second = Service::start_with_state("sessionizer", &arguments, fresh_state_dir());
    second.wait_ready(Duration::from_secs(60));
    let (status, log) = first
        .wait_exit(Duration::from_secs(60))
        .expect("the fenced instance should stop instead of retrying for ever");
    assert!(!status.success(), "log: {log}");
    assert!(log.contains("cannot go on"), "log: {log}");
    assert!(!log.contains("panicked"), "log: {log}");
}
