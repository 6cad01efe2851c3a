//! sessionizer end to end: what needs a broker and a registry (the fixture
//! once, dead letters on the wire, schema evolution). The rules, and the
//! runtime behaviours they make visible (timers, order of work, lateness,
//! dead letters, stored watermarks), are tested on the driver,
//! tests/driver_sessionizer.rs.

use std::time::Duration;

use e2e_tests::sessions::{event, session};
use e2e_tests::*;

fn topics(partitions: usize) -> SingleInputRun {
    SingleInputRun::new("sessionizer", "user-events", "user-sessions", partitions)
}

const T: i64 = 1_783_345_153_000;

#[test]
fn fixture_gives_bobs_timeout() {
    let topics = topics(1);
    let service = topics.start(&[]);
    produce(
        &topics.input,
        "user-events",
        &fixture("sessionizer/user-events.jsonl"),
    );
    let output = wait_for_records(&topics.output, 1, Duration::from_secs(60));
    assert_eq!(
        output,
        fixture("sessionizer/user-sessions.expected.jsonl"),
        "log:\n{}",
        service.log()
    );
}

#[test]
fn a_poison_pill_goes_to_the_dead_letter_topic_and_good_records_keep_flowing() {
    let topics = topics(1);
    let service = topics.start(&[]);
    produce(&topics.input, "user-events", &[event("hal", "LOGIN", T)]);
    let pill = write_jsonl(&[json!({"key": "hal", "value": "this is not avro"})]);
    streamctl_ok(&[
        "produce",
        "--topic",
        &topics.input,
        "--raw",
        "--file",
        pill.to_str().unwrap(),
    ]);
    produce(
        &topics.input,
        "user-events",
        &[event("hal", "LOGOUT", T + 1_000)],
    );
    let output = wait_for_records(&topics.output, 1, Duration::from_secs(60));
    assert_eq!(
        output,
        vec![session(
            "hal",
            "COMPLETED",
            &["LOGIN", "LOGOUT"],
            T,
            T + 1_000
        )],
        "log:\n{}",
        service.log()
    );
    let dlq = format!("{}-dlq", topics.application_id);
    let dead = parse_jsonl(&streamctl_ok(&[
        "consume",
        "--topic",
        &dlq,
        "--from-beginning",
        "--max",
        "1",
        "--idle-exit",
        "10s",
        "--headers",
    ]));
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["raw"], json!("this is not avro"));
    let headers = &dead[0]["headers"];
    assert_eq!(headers["dlq.error.kind"], json!("not_wire_format"));
    assert_eq!(headers["dlq.source.topic"], json!(topics.input));
    assert_eq!(headers["dlq.source.partition"], json!("0"));
    // Offset 0 is hal's LOGIN, 1 the marker of streamctl's transaction.
    assert_eq!(headers["dlq.source.offset"], json!("2"));
    assert!(headers["dlq.error.message"]
        .as_str()
        .unwrap()
        .contains("magic byte"));
    let series = format!(
        "streams_records_dead_lettered_total{{topic=\"{}\"}}",
        topics.input
    );
    assert!(eventually(Duration::from_secs(10), || service
        .metric(&series)
        == 1.0));
}

#[test]
fn records_written_with_an_evolved_schema_are_read_into_the_service_schema() {
    let topics = topics(1);
    let service = topics.start(&[]);
    produce(&topics.input, "user-events", &[event("kim", "LOGIN", T)]);
    // A producer upgraded its schema: a new optional field (a compatible change).
    let evolved = scratch_dir().join(format!("{}.avsc", unique("user-events-v2")));
    std::fs::write(
        &evolved,
        r#"{"type": "record", "name": "UserEvent", "namespace": "io.streams.sessions", "fields": [
            {"name": "user_id", "type": "string"},
            {"name": "event_type", "type": "string"},
            {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "device", "type": ["null", "string"], "default": null}]}"#,
    )
    .unwrap();
    let lines = write_jsonl(&[
        json!({"key": "kim", "value": {"user_id": "kim", "event_type": "LOGOUT", "event_time": T + 2_000, "device": "phone"}}),
    ]);
    streamctl_ok(&[
        "produce",
        "--topic",
        &topics.input,
        "--schema",
        evolved.to_str().unwrap(),
        "--file",
        lines.to_str().unwrap(),
    ]);
    let output = wait_for_records(&topics.output, 1, Duration::from_secs(60));
    assert_eq!(
        output,
        vec![session(
            "kim",
            "COMPLETED",
            &["LOGIN", "LOGOUT"],
            T,
            T + 2_000
        )],
        "log:\n{}",
        service.log()
    );
    let dead = format!(
        "streams_records_dead_lettered_total{{topic=\"{}\"}}",
        topics.input
    );
    assert_eq!(service.metric(&dead), 0.0);
}

/// A commit interval with nothing new sends nothing: no transaction (each
/// would add a commit marker to the changelog), no changelog record, while
/// commits keep completing.
#[test]
fn an_idle_instance_sends_no_empty_transactions() {
    let topics = topics(1);
    let service = topics.start(&[]);
    produce(&topics.input, "user-events", &[event("ida", "LOGIN", T)]);
    service.wait_consumed(&topics.input, 1, Duration::from_secs(60));
    let describe = || {
        streamctl_ok(&[
            "topics",
            "describe",
            &format!("{}-task-progress-changelog", topics.application_id),
        ])
    };
    let changelog_before = describe();
    let commits_before = service.metric("streams_commits_total");
    assert!(
        eventually(Duration::from_secs(30), || service
            .metric("streams_commits_total")
            >= commits_before + 10.0),
        "commits go on: {}",
        service.metrics()
    );
    assert_eq!(describe(), changelog_before, "log:\n{}", service.log());
}
