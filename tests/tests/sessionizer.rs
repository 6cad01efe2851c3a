//! sessionizer end to end, and the runtime behaviours it makes visible
//! (timers, order of work, lateness, dead letters, stored watermarks).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
fn logout_completes_the_session_at_once() {
    let topics = topics(1);
    let service = topics.start(&[]);
    produce(
        &topics.input,
        "user-events",
        &[
            event("amy", "LOGIN", T),
            event("amy", "VIEW", T + 1_000),
            event("amy", "LOGOUT", T + 5_000),
        ],
    );
    let output = wait_for_records(&topics.output, 1, Duration::from_secs(60));
    assert_eq!(
        output,
        vec![session(
            "amy",
            "COMPLETED",
            &["LOGIN", "VIEW", "LOGOUT"],
            T,
            T + 5_000
        )],
        "log:\n{}",
        service.log()
    );
}

#[test]
fn timers_fire_when_the_watermark_reaches_them_and_not_before() {
    let topics = topics(1);
    let service = topics.start(&[]);
    produce(
        &topics.input,
        "user-events",
        &[event("bob", "LOGIN", T), event("cat", "LOGIN", T + 29_999)],
    );
    service.wait_ready(Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        consume_all(&topics.output).is_empty(),
        "the watermark is 1 ms short of bob's timer"
    );
    produce(
        &topics.input,
        "user-events",
        &[event("cat", "VIEW", T + 30_000)],
    );
    let output = wait_for_records(&topics.output, 1, Duration::from_secs(30));
    assert_eq!(
        output,
        vec![session("bob", "TIMEOUT", &["LOGIN"], T, T + 30_000)]
    );
}

#[test]
fn a_record_after_a_deadline_sees_the_timeout_then_starts_a_new_session() {
    let topics = topics(1);
    let service = topics.start(&[]);
    produce(
        &topics.input,
        "user-events",
        &[
            event("dan", "LOGIN", T),
            event("dan", "SEARCH", T + 10_000),
            event("dan", "VIEW", T + 40_000),
            event("dan", "LOGOUT", T + 45_000),
        ],
    );
    let output = wait_for_records(&topics.output, 2, Duration::from_secs(60));
    assert_eq!(
        output,
        vec![
            session("dan", "TIMEOUT", &["LOGIN", "SEARCH"], T, T + 40_000),
            session(
                "dan",
                "COMPLETED",
                &["VIEW", "LOGOUT"],
                T + 40_000,
                T + 45_000
            ),
        ],
        "log:\n{}",
        service.log()
    );
}

#[test]
fn a_thousand_users_over_four_partitions_match_a_model_of_the_rules() {
    let (lines, expected) = e2e_tests::sessions::generate(1000, 7, T);
    let topics = topics(4);
    let service = topics.start(&[]);
    produce(&topics.input, "user-events", &lines);
    let output = wait_for_records(&topics.output, expected.len(), Duration::from_secs(120));
    assert_same_records(&output, &expected, &service.log());
}

#[test]
fn with_an_idle_timeout_a_quiet_session_times_out_in_wall_clock_time() {
    let topics = topics(1);
    let service = topics.start(&["--idle-timeout", "2s", "--session-timeout", "3s"]);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    produce(&topics.input, "user-events", &[event("eve", "LOGIN", now)]);
    let output = wait_for_records(&topics.output, 1, Duration::from_secs(20));
    assert_eq!(
        output,
        vec![session("eve", "TIMEOUT", &["LOGIN"], now, now + 3_000)],
        "log:\n{}",
        service.log()
    );
}

#[test]
fn late_records_are_counted_and_dropped() {
    let topics = topics(1);
    let service = topics.start(&[]);
    produce(
        &topics.input,
        "user-events",
        &[
            event("fay", "LOGIN", T + 100_000),
            event("gus", "LOGOUT", T + 50_000),
        ],
    );
    let series = format!("streams_records_late_total{{topic=\"{}\"}}", topics.input);
    assert!(
        eventually(Duration::from_secs(30), || service.metric(&series) == 1.0),
        "{}",
        service.metrics()
    );
    assert!(
        consume_all(&topics.output).is_empty(),
        "gus's late LOGOUT must not be processed"
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
fn after_a_restart_the_stored_watermark_still_marks_old_records_late() {
    let topics = topics(1);
    let arguments = topics.args(&[]);
    let first = Service::start("sessionizer", &arguments);
    produce(
        &topics.input,
        "user-events",
        &[event("ivy", "LOGIN", T + 500_000)],
    );
    let series = format!(
        "streams_records_consumed_total{{topic=\"{}\"}}",
        topics.input
    );
    assert!(eventually(Duration::from_secs(30), || first
        .metric(&series)
        == 1.0));
    std::thread::sleep(Duration::from_millis(500));
    let state_dir = first.state_dir.clone();
    assert!(first.stop().success());

    // A watermark kept only in memory would start over after the restart
    // and accept this stale event.
    produce(&topics.input, "user-events", &[event("jon", "LOGOUT", T)]);
    let second = Service::start_with_state("sessionizer", &arguments, state_dir);
    let late = format!("streams_records_late_total{{topic=\"{}\"}}", topics.input);
    assert!(
        eventually(Duration::from_secs(30), || second.metric(&late) == 1.0),
        "{}",
        second.log()
    );
    assert!(consume_all(&topics.output).is_empty());
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
