//! The broker restarts in the middle of a run; the service reconnects by
//! itself and its read_committed output stays exact.
//!
//! This is its own test binary because restarting the shared broker would
//! disturb other tests running in parallel (`deploy/local/run-tests.py`
//! runs it before any other test that needs the broker); its tests take
//! turns for the same reason.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use e2e_tests::sessions::generate;
use e2e_tests::*;

/// Held by each test for its whole run: one broker restart at a time.
static ALONE: Mutex<()> = Mutex::new(());

/// Restarts the local broker and waits until it is back.
fn restart_broker() {
    let restart = Command::new("bash")
        .arg(workspace().join("deploy/local/stack.sh"))
        .arg("restart-kafka")
        .status()
        .expect("run stack.sh");
    assert!(restart.success(), "the broker did not come back");
}

#[test]
fn a_broker_restart_mid_run_leaves_the_output_exact() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
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

    restart_broker();

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

/// Standbys and queries carry on after the broker restarts too: the standby
/// consumer, its group watcher and the query endpoints reader are clients
/// of their own, each given its bootstrap servers again if the restart
/// left it knowing no broker, and none may take the process down (the
/// query endpoints reader once did: librdkafka aborted in a group
/// description cut short by the restart). Two instances, each with one
/// task and a standby of the other's.
#[test]
fn standbys_and_queries_carry_on_after_a_broker_restart() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let input = unique("user-events");
    let output = unique("user-sessions");
    create_topic(&input, 2);
    let (lines, expected) = generate(600, 9, 1_783_345_153_000);
    let (before_restart, after_restart) = lines.split_at(lines.len() / 2);
    let application_id = unique("sessionizer-restart-standby");
    let instances: Vec<(Service, u16)> = (0..2)
        .map(|_| {
            let port = free_port();
            let service = Service::start(
                "sessionizer",
                &args(&[
                    "--input-topic",
                    &input,
                    "--output-topic",
                    &output,
                    "--application-id",
                    &application_id,
                    "--standby-replicas",
                    "1",
                    "--query-addr",
                    &format!("127.0.0.1:{port}"),
                    "--kafka",
                    "session.timeout.ms=6000",
                    "--kafka",
                    "heartbeat.interval.ms=1000",
                ]),
            );
            (service, port)
        })
        .collect();
    let logs = || {
        (instances.iter())
            .map(|(service, _)| format!("--- {}:\n{}", service.log_path().display(), service.log()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let balanced = eventually(Duration::from_secs(60), || {
        (instances.iter()).all(|(service, _)| service.open_tasks::<usize>().len() == 1)
    });
    assert!(balanced, "one task each:\n{}", logs());
    let standby_records = |service: &Service| {
        metric_sum(&service.metrics(), "streams_standby_records_total").unwrap_or(0.0)
    };
    produce(&input, "user-events", before_restart);
    assert!(
        eventually(Duration::from_secs(120), || instances
            .iter()
            .all(|(service, _)| standby_records(service) > 0.0)),
        "no standby took records before the restart:\n{}",
        logs()
    );

    restart_broker();
    produce(&input, "user-events", after_restart);
    let records = wait_for_records(&output, expected.len(), Duration::from_secs(300));
    assert_same_records(&records, &expected, &logs());

    // Each instance keeps a standby again, caught up with its changelog's
    // end, which has moved on since the restart. (How many records each
    // standby applied after it depends on where the rebalances the restart
    // caused left the tasks: a standby made from state its instance wrote
    // as the task's owner starts at the end.)
    let caught_up = eventually(Duration::from_secs(60), || {
        instances.iter().all(|(service, _)| {
            let metrics = service.metrics();
            metric_sum(&metrics, "streams_standby_tasks").is_some_and(|tasks| tasks >= 1.0)
                && metric_sum(&metrics, "streams_standby_lag_records") == Some(0.0)
        })
    });
    assert!(
        caught_up,
        "standbys not caught up after the restart:\n{}",
        logs()
    );
    // Either instance answers for every user: half of them forwarded to
    // the other, which needs the group's description and the endpoints.
    let users: BTreeSet<&str> = (lines.iter())
        .map(|line| line["key"].as_str().unwrap())
        .collect();
    let answered = eventually(Duration::from_secs(60), || {
        users.iter().all(|user| {
            instances.iter().all(|(_, port)| {
                http_answer(*port, &format!("/stores/main/sessions/keys/{user}"))
                    .is_some_and(|(status, _)| status == 200)
            })
        })
    });
    assert!(
        answered,
        "queries not answered after the restart:\n{}",
        logs()
    );
}
