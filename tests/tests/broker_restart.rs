//! The broker restarts in the middle of a run; the service reconnects by
//! itself and its read_committed output stays exact.
//!
//! This is its own test binary because restarting the shared broker would
//! disturb other tests running in parallel (cargo runs test binaries one at
//! a time).

use std::process::Command;
use std::time::Duration;

use e2e_tests::sessions::generate;
use e2e_tests::*;

#[test]
fn a_broker_restart_mid_run_leaves_the_output_exact() {
    let input = unique("user-events");
    let output = unique("user-sessions");
    create_topic(&input, 2);
    let (lines, expected) = generate(12_000, 9, 1_783_345_153_000);
    produce(&input, "user-events", &lines);
    let service = Service::start(
        "sessionizer",
        &args(&[
            "--input-topic",
            &input,
            "--output-topic",
            &output,
            "--application-id",
            &unique("sessionizer-restart"),
        ]),
    );
    let series = format!("streams_records_consumed_total{{topic=\"{input}\"}}");
    assert!(
        eventually(Duration::from_secs(120), || service.metric(&series)
            >= 10_000.0),
        "{}",
        service.log()
    );

    let restart = Command::new("bash")
        .arg(workspace().join("deploy/local/stack.sh"))
        .arg("restart-kafka")
        .status()
        .expect("run stack.sh");
    assert!(restart.success(), "the broker did not come back");

    let records = wait_for_records(&output, expected.len(), Duration::from_secs(300));
    assert_same_records(&records, &expected, &service.log());
    let metrics = service.metrics();
    assert!(
        metric_value(&metrics, &series) >= lines.len() as f64,
        "metrics: {metrics:?}; healthz: {:?}; log:\n{}",
        http_get(service.http_port, "/healthz"),
        service.log()
    );
}
