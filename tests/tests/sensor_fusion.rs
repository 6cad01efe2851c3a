//! sensor-fusion end to end: what needs a broker (the fixture once, the
//! refusal of inputs that are not co-partitioned, a crash under a backlog). The rules are tested on
//! the driver, tests/driver_sensor_fusion.rs.

mod common;

use std::time::Duration;

use common::driver::{driver, lines, pipe_all, settings, settle};
use e2e_tests::*;
use rand::Rng;
use serde_json::{json, Value};

struct Topics {
    temperature: String,
    humidity: String,
    output: String,
}

fn topics(temperature_partitions: usize, humidity_partitions: usize) -> Topics {
    let topics = Topics {
        temperature: unique("temperature-readings"),
        humidity: unique("humidity-readings"),
        output: unique("machine-maintenance"),
    };
    create_topic(&topics.temperature, temperature_partitions);
    create_topic(&topics.humidity, humidity_partitions);
    topics
}

fn start(topics: &Topics, extra: &[&str]) -> Service {
    Service::start("sensor-fusion", &arguments(topics, extra))
}

fn arguments(topics: &Topics, extra: &[&str]) -> Vec<String> {
    let mut arguments = args(&[
        "--temperature-topic",
        &topics.temperature,
        "--humidity-topic",
        &topics.humidity,
        "--output-topic",
        &topics.output,
        "--application-id",
        &unique("sensor-fusion"),
    ]);
    arguments.extend(args(extra));
    arguments
}

/// The one end-to-end run of the fixture; every rule of
/// docs/services/sensor-fusion.md is tested on the driver
/// (tests/driver_sensor_fusion.rs).
#[test]
fn fixture_gives_the_expected_verdicts() {
    let topics = topics(1, 1);
    let service = start(&topics, &[]);
    produce(
        &topics.temperature,
        "temperature-readings",
        &fixture("sensor-fusion/temperature-readings.jsonl"),
    );
    produce(
        &topics.humidity,
        "humidity-readings",
        &fixture("sensor-fusion/humidity-readings.jsonl"),
    );
    let output = wait_for_records(&topics.output, 2, Duration::from_secs(60));
    assert_eq!(
        output,
        fixture("sensor-fusion/machine-maintenance.expected.jsonl"),
        "log:\n{}",
        service.log()
    );
}

#[test]
fn topics_with_different_partition_counts_are_refused() {
    let topics = topics(2, 3);
    let service = start(&topics, &[]);
    let (status, log) = service
        .wait_exit(Duration::from_secs(30))
        .expect("the service must exit");
    assert!(!status.success());
    assert!(log.contains("not co-partitioned"), "{log}");
    assert!(
        log.contains(&format!("{} has 2", topics.temperature))
            && log.contains(&format!("{} has 3", topics.humidity)),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
}

/// Readings of both sensors of `machines` machines, one every 10 s for
/// `steps` steps, with random values (in event-time order per machine).
fn random_readings(machines: usize, steps: i64) -> (Vec<Value>, Vec<Value>) {
    let mut rng = rand::rng();
    let start = 1_785_574_800_000;
    let (mut temperatures, mut humidities) = (Vec::new(), Vec::new());
    for step in 0..steps {
        for machine in 0..machines {
            let machine = format!("machine-{machine}");
            let time = start + step * 10_000 + rng.random_range(0..5_000);
            temperatures.push(json!({"key": machine, "value": {"machine_id": machine, "temperature": rng.random_range(40.0..90.0), "event_time": time}}));
            humidities.push(json!({"key": machine, "value": {"sensor_id": machine, "humidity": rng.random_range(20.0..80.0), "event_time": time}}));
        }
    }
    (temperatures, humidities)
}

/// A kill -9 under a backlog: the restarted instance restores its windows
/// from the changelogs and takes the rest of both inputs at once. Its
/// verdicts must be those of an uninterrupted run of the same pipeline (the
/// test driver, no broker), each exactly once, with no aborted commit.
#[test]
fn a_backlog_after_a_kill_9_comes_out_as_without_it() {
    let partitions = 2;
    let (temperatures, humidities) = random_readings(40, 500);
    let mut uninterrupted = driver(
        sensor_fusion::pipeline(settings("sensor-fusion", &[])),
        partitions,
    );
    pipe_all(&mut uninterrupted, "temperature-readings", &temperatures);
    pipe_all(&mut uninterrupted, "humidity-readings", &humidities);
    settle(&mut uninterrupted);
    let expected = lines(&uninterrupted, "machine-maintenance");
    assert!(expected.len() >= 600, "{} verdicts", expected.len());

    let topics = topics(partitions, partitions);
    produce(&topics.temperature, "temperature-readings", &temperatures);
    produce(&topics.humidity, "humidity-readings", &humidities);
    let second = restart_after_kill_9_under_backlog(
        "sensor-fusion",
        &arguments(&topics, &[]),
        &topics.temperature,
        5_000,
    );
    let output = wait_for_records(&topics.output, expected.len(), Duration::from_secs(180));
    assert_same_records(&output, &expected, &second.log());
    second.assert_no_aborted_commit();
}
