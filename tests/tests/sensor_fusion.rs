//! sensor-fusion end to end.

use std::time::Duration;

use e2e_tests::*;
use rand::Rng;
use serde_json::Value;

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

#[derive(Clone, Copy)]
enum Order {
    TemperatureFirst,
    HumidityFirst,
    Interleaved,
}

fn produce_fixture(topics: &Topics, order: Order) {
    let temperatures = fixture("sensor-fusion/temperature-readings.jsonl");
    let humidities = fixture("sensor-fusion/humidity-readings.jsonl");
    match order {
        Order::TemperatureFirst => {
            produce(&topics.temperature, "temperature-readings", &temperatures);
            produce(&topics.humidity, "humidity-readings", &humidities);
        }
        Order::HumidityFirst => {
            produce(&topics.humidity, "humidity-readings", &humidities);
            produce(&topics.temperature, "temperature-readings", &temperatures);
        }
        Order::Interleaved => {
            for (t, h) in temperatures.chunks(5).zip(humidities.chunks(5)) {
                produce(&topics.temperature, "temperature-readings", t);
                produce(&topics.humidity, "humidity-readings", h);
            }
        }
    }
}

fn expected() -> Vec<Value> {
    sorted(fixture("sensor-fusion/machine-maintenance.expected.jsonl"))
}

/// Watermark mode with the service already running while data arrives.
fn watermark_mode_gives_the_fixture(order: Order) {
    let topics = topics(1, 1);
    let service = start(&topics, &[]);
    produce_fixture(&topics, order);
    let output = wait_for_records(&topics.output, 2, Duration::from_secs(60));
    assert_eq!(sorted(output), expected(), "log:\n{}", service.log());
}

/// Rollover mode (docs/services/sensor-fusion.md) on data produced before the
/// service starts: the task merges both topics in event-time order.
fn rollover_mode_gives_the_fixture(order: Order) {
    let topics = topics(1, 1);
    produce_fixture(&topics, order);
    let service = start(&topics, &["--emit", "rollover"]);
    let output = wait_for_records(&topics.output, 2, Duration::from_secs(60));
    assert_eq!(sorted(output), expected(), "log:\n{}", service.log());
}

#[test]
fn watermark_mode_temperature_first() {
    watermark_mode_gives_the_fixture(Order::TemperatureFirst);
}

#[test]
fn watermark_mode_humidity_first() {
    watermark_mode_gives_the_fixture(Order::HumidityFirst);
}

#[test]
fn watermark_mode_interleaved() {
    watermark_mode_gives_the_fixture(Order::Interleaved);
}

#[test]
fn rollover_mode_temperature_first() {
    rollover_mode_gives_the_fixture(Order::TemperatureFirst);
}

#[test]
fn rollover_mode_humidity_first() {
    rollover_mode_gives_the_fixture(Order::HumidityFirst);
}

#[test]
fn rollover_mode_interleaved() {
    rollover_mode_gives_the_fixture(Order::Interleaved);
}

fn reading(topic_kind: &str, machine: &str, value: Option<f64>, time: i64) -> Value {
    if topic_kind == "temperature" {
        json!({"key": machine, "value": {"machine_id": machine, "temperature": value, "event_time": time}})
    } else {
        json!({"key": machine, "value": {"sensor_id": machine, "humidity": value, "event_time": time}})
    }
}

fn median(values: &mut [f64]) -> Value {
    if values.is_empty() {
        return Value::Null;
    }
    values.sort_by(f64::total_cmp);
    let m = values.len() / 2;
    json!(if values.len() % 2 == 1 {
        values[m]
    } else {
        (values[m - 1] + values[m]) / 2.0
    })
}

#[test]
fn many_machines_over_four_partitions_match_a_model_of_the_rules() {
    const WINDOW: i64 = 300_000;
    const WINDOWS: i64 = 4;
    let base = 1_785_574_800_000i64;
    let mut rng = rand::rng();
    let machines: Vec<String> = (0..200).map(|i| format!("machine-{i}")).collect();
    let mut temperatures = Vec::new();
    let mut humidities = Vec::new();
    let mut expected = Vec::new();
    for machine in &machines {
        for window in 0..WINDOWS {
            let start = base + window * WINDOW;
            let mut temps = Vec::new();
            let mut hums = Vec::new();
            for _ in 0..rng.random_range(0..5) {
                let value = rng
                    .random_bool(0.9)
                    .then(|| f64::from(rng.random_range(600..900)) / 10.0);
                temps.extend(value);
                temperatures.push((start + rng.random_range(0..WINDOW), machine.clone(), value));
            }
            for _ in 0..rng.random_range(0..5) {
                let value = rng
                    .random_bool(0.9)
                    .then(|| f64::from(rng.random_range(600..950)) / 10.0);
                hums.extend(value);
                humidities.push((start + rng.random_range(0..WINDOW), machine.clone(), value));
            }
            let had_readings = temperatures
                .iter()
                .any(|(t, m, _)| m == machine && (start..start + WINDOW).contains(t))
                || humidities
                    .iter()
                    .any(|(t, m, _)| m == machine && (start..start + WINDOW).contains(t));
            if had_readings {
                let (mt, mh) = (median(&mut temps), median(&mut hums));
                let needs =
                    mt.as_f64().is_some_and(|t| t > 75.0) && mh.as_f64().is_some_and(|h| h > 80.0);
                expected.push(json!({"key": machine, "value": {
                    "machine_id": machine, "sensor_id": machine,
                    "window_start": start, "window_end": start + WINDOW,
                    "median_temperature": mt, "median_humidity": mh,
                    "temperature_count": temps.len(), "humidity_count": hums.len(),
                    "needs_maintenance": needs}}));
            }
        }
        // A last reading on both topics closes every earlier window.
        let end = base + WINDOWS * WINDOW + 1;
        temperatures.push((end, machine.clone(), Some(70.0)));
        humidities.push((end, machine.clone(), Some(70.0)));
    }
    temperatures.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    humidities.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let topics = topics(4, 4);
    let service = start(&topics, &[]);
    let lines = |kind: &str, readings: &[(i64, String, Option<f64>)]| -> Vec<Value> {
        readings
            .iter()
            .map(|(t, m, v)| reading(kind, m, *v, *t))
            .collect()
    };
    produce(
        &topics.temperature,
        "temperature-readings",
        &lines("temperature", &temperatures),
    );
    produce(
        &topics.humidity,
        "humidity-readings",
        &lines("humidity", &humidities),
    );
    let output = wait_for_records(&topics.output, expected.len(), Duration::from_secs(120));
    assert_same_records(&output, &expected, "");
    drop(service);
}

#[test]
fn a_window_without_humidity_has_a_null_median_and_needs_no_maintenance() {
    let topics = topics(1, 1);
    let service = start(&topics, &[]);
    let start_time = 1_785_574_800_000i64;
    produce(
        &topics.temperature,
        "temperature-readings",
        &[
            reading("temperature", "M9", Some(90.0), start_time + 1_000),
            reading("temperature", "M9", Some(95.0), start_time + 400_000),
        ],
    );
    produce(
        &topics.humidity,
        "humidity-readings",
        &[reading("humidity", "M9", Some(99.0), start_time + 400_000)],
    );
    let output = wait_for_records(&topics.output, 1, Duration::from_secs(60));
    assert_eq!(
        output,
        vec![
            json!({"key": "M9", "value": {"machine_id": "M9", "sensor_id": "M9",
            "window_start": start_time, "window_end": start_time + 300_000,
            "median_temperature": 90.0, "median_humidity": null,
            "temperature_count": 1, "humidity_count": 0, "needs_maintenance": false}})
        ],
        "log:\n{}",
        service.log()
    );
}

#[test]
fn a_reading_for_an_emitted_window_is_late_and_changes_nothing() {
    let topics = topics(1, 1);
    let service = start(&topics, &[]);
    let t0 = 1_785_574_800_000i64;
    produce(
        &topics.temperature,
        "temperature-readings",
        &[
            reading("temperature", "M1", Some(80.0), t0),
            reading("temperature", "M1", Some(80.0), t0 + 300_000),
        ],
    );
    produce(
        &topics.humidity,
        "humidity-readings",
        &[
            reading("humidity", "M1", Some(85.0), t0),
            reading("humidity", "M1", Some(85.0), t0 + 300_000),
        ],
    );
    let first = wait_for_records(&topics.output, 1, Duration::from_secs(60));
    assert_eq!(first.len(), 1);
    produce(
        &topics.temperature,
        "temperature-readings",
        &[reading("temperature", "M1", Some(10.0), t0 + 5)],
    );
    let late_series = format!(
        "streams_records_late_total{{topic=\"{}\"}}",
        topics.temperature
    );
    assert!(
        eventually(Duration::from_secs(30), || service.metric(&late_series)
            == 1.0),
        "late counter: {}",
        service.metrics()
    );
    assert_eq!(
        consume_all(&topics.output),
        first,
        "the late reading changed nothing"
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
