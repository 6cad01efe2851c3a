//! `streamctl` against the real broker and registry.

use std::time::{Duration, Instant};

use e2e_tests::*;

/// The topic whose schema a fixture file uses (file name = topic name).
fn schema_topic_of(file: &str) -> &str {
    file.trim_end_matches(".jsonl")
        .trim_end_matches(".expected")
}

#[test]
fn every_fixture_file_round_trips_value_for_value() {
    let mut checked = 0;
    for service in std::fs::read_dir(fixtures_dir()).expect("fixtures directory") {
        let service = service.unwrap().path();
        for file in std::fs::read_dir(&service).unwrap() {
            let path = file.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            let topic = unique(schema_topic_of(&name));
            create_topic(&topic, 1);
            produce_file(&topic, schema_topic_of(&name), &path);
            let expected = parse_jsonl(&std::fs::read_to_string(&path).unwrap());
            let consumed = parse_jsonl(&streamctl_ok(&[
                "consume",
                "--topic",
                &topic,
                "--from-beginning",
                "--max",
                &expected.len().to_string(),
                "--idle-exit",
                "10s",
            ]));
            assert_eq!(consumed, expected, "round trip of {}", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} fixture files found");
}

#[test]
fn a_malformed_line_names_its_number_and_produces_nothing() {
    let topic = unique("user-events");
    create_topic(&topic, 1);
    let good = |i: i64| json!({"key": "u", "value": {"user_id": "u", "event_type": "VIEW", "event_time": i}});
    let path = scratch_dir().join(format!("{}.jsonl", unique("malformed")));
    std::fs::write(
        &path,
        format!(
            "{}\n{}\n{{\"key\": \"u\", \"value\": {{\"user_id\": \n{}\n",
            good(1),
            good(2),
            good(4)
        ),
    )
    .unwrap();
    let output = streamctl(&[
        "produce",
        "--topic",
        &topic,
        "--schema",
        schema("user-events").to_str().unwrap(),
        "--file",
        path.to_str().unwrap(),
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("line 3"),
        "error should name line 3: {stderr}"
    );
    assert!(
        consume_all(&topic).is_empty(),
        "nothing may be produced before the bad line"
    );

    // The user fixes line 3 and runs again: every line exactly once.
    std::fs::write(
        &path,
        format!("{}\n{}\n{}\n{}\n", good(1), good(2), good(3), good(4)),
    )
    .unwrap();
    produce_file(&topic, "user-events", &path);
    let times: Vec<i64> = consume_all(&topic)
        .iter()
        .map(|r| r["value"]["event_time"].as_i64().unwrap())
        .collect();
    assert_eq!(times, [1, 2, 3, 4]);
}

#[test]
fn a_value_that_does_not_fit_the_schema_is_rejected_with_its_line() {
    let topic = unique("orders");
    create_topic(&topic, 1);
    let path = write_jsonl(&[
        json!({"key": "1", "value": {"id": 1, "total_amount": 1.5, "customer_name": "a", "order_ts_raw": 5}}),
        json!({"key": "2", "value": {"id": "two", "total_amount": 1.5, "customer_name": "a", "order_ts_raw": 5}}),
    ]);
    let output = streamctl(&[
        "produce",
        "--topic",
        &topic,
        "--schema",
        schema("orders").to_str().unwrap(),
        "--file",
        path.to_str().unwrap(),
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("line 2") && stderr.contains("schema"),
        "{stderr}"
    );
}

#[test]
fn an_incompatible_schema_change_is_rejected_readably() {
    let topic = unique("evolving");
    create_topic(&topic, 1);
    let dir = scratch_dir();
    let v1 = dir.join(format!("{}.avsc", unique("v1")));
    std::fs::write(
        &v1,
        r#"{"type": "record", "name": "E", "fields": [{"name": "a", "type": "string"}]}"#,
    )
    .unwrap();
    let v2 = dir.join(format!("{}.avsc", unique("v2")));
    std::fs::write(
        &v2,
        r#"{"type": "record", "name": "E", "fields": [{"name": "a", "type": "string"}, {"name": "b", "type": "int"}]}"#,
    )
    .unwrap();
    let v1_data = write_jsonl(&[json!({"key": "k", "value": {"a": "x"}})]);
    streamctl_ok(&[
        "produce",
        "--topic",
        &topic,
        "--schema",
        v1.to_str().unwrap(),
        "--file",
        v1_data.to_str().unwrap(),
    ]);
    let v2_data = write_jsonl(&[json!({"key": "k", "value": {"a": "x", "b": 1}})]);
    let output = streamctl(&[
        "produce",
        "--topic",
        &topic,
        "--schema",
        v2.to_str().unwrap(),
        "--file",
        v2_data.to_str().unwrap(),
    ]);
    assert!(
        !output.status.success(),
        "a new required field without default must be refused"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("refused") && stderr.contains(&format!("{topic}-value")),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        consume_all(&topic).len(),
        1,
        "the refused records were not produced"
    );
}

#[test]
fn a_stopped_broker_fails_fast_with_a_clear_message() {
    let port = free_port();
    let started = Instant::now();
    let output = std::process::Command::new(bin("streamctl"))
        .args([
            "--bootstrap-servers",
            &format!("127.0.0.1:{port}"),
            "topics",
            "list",
        ])
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot reach Kafka"), "{stderr}");
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
}

#[test]
fn table_format_prints_aligned_columns() {
    let topic = unique("shipped-orders");
    create_topic(&topic, 1);
    let path = fixtures_dir().join("order-shipment-joiner/shipped-orders.expected.jsonl");
    produce_file(&topic, "shipped-orders", &path);
    let table = streamctl_ok(&[
        "consume",
        "--topic",
        &topic,
        "--from-beginning",
        "--max",
        "10",
        "--idle-exit",
        "10s",
        "--format",
        "table",
    ]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[1].contains("| order_id |") && lines[1].contains("| hr_to_ship |"),
        "{table}"
    );
    assert!(
        lines.iter().any(|l| l.contains("| Art Vandelay ")),
        "{table}"
    );
    let width = lines[0].len();
    assert!(
        lines[..lines.len() - 1]
            .iter()
            .all(|l| l.chars().count() == width),
        "{table}"
    );
    assert_eq!(*lines.last().unwrap(), "10 rows in set");
}

#[test]
fn topics_can_be_created_listed_and_described() {
    let topic = unique("described");
    create_topic(&topic, 3);
    assert!(streamctl_ok(&["topics", "list"])
        .lines()
        .any(|l| l == topic));
    let description = streamctl_ok(&["topics", "describe", &topic]);
    assert!(description.contains("3 partitions"), "{description}");
    let again = streamctl(&["topics", "create", &topic, "--partitions", "2"]);
    assert!(
        !again.status.success(),
        "a different partition count is an error"
    );
}

#[test]
fn consume_until_end_stops_at_the_end_offsets_read_at_start() {
    let topic = unique("until-end");
    create_topic(&topic, 3);
    let events: Vec<_> = (0..30)
        .map(|i| e2e_tests::sessions::event(&format!("user{i}"), "LOGIN", 1_000 + i))
        .collect();
    produce(&topic, "user-events", &events);
    let started = Instant::now();
    let consumed = parse_jsonl(&streamctl_ok(&[
        "consume",
        "--topic",
        &topic,
        "--from-beginning",
        "--until-end",
        "--idle-exit",
        "30s",
    ]));
    assert_same_records(&consumed, &events, "consume --until-end");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "--until-end waited for the idle exit instead of stopping at the end"
    );
    let empty = unique("until-end-empty");
    create_topic(&empty, 2);
    let nothing = streamctl_ok(&[
        "consume",
        "--topic",
        &empty,
        "--from-beginning",
        "--until-end",
        "--idle-exit",
        "30s",
    ]);
    assert!(nothing.trim().is_empty(), "an empty topic gave: {nothing}");
}
