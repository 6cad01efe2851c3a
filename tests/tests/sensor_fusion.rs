//! sensor-fusion end to end: what needs a broker (the fixture once, the
//! refusal of inputs that are not co-partitioned). The rules are tested on
//! the driver, tests/driver_sensor_fusion.rs.

use std::time::Duration;

use e2e_tests::*;

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
    Service::start("sensor-fusion", &arguments)
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
