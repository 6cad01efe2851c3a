//! sensor-fusion's rules (docs/services/sensor-fusion.md) on the broker-free
//! test driver: the fixture in both modes and every input order, medians and
//! null readings, lateness, emission order, and many machines over four
//! partitions against a model of the rules.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::driver::{driver, lines, settings, settle};
use e2e_tests::{assert_same_records, fixture};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sensor_fusion::Settings;
use serde_json::{json, Value};
use streams_runtime::metrics;
use streams_runtime::murmur2_partition;
use streams_runtime::testing::TestDriver;

const TEMPERATURE: &str = "temperature-readings";
const HUMIDITY: &str = "humidity-readings";
const OUTPUT: &str = "machine-maintenance";
const WINDOW: i64 = 300_000;

/// 2026-08-01 09:00, the first window of the fixture.
const T0: i64 = 1_785_574_800_000;

fn fusion(flags: &[&str], partitions: usize) -> TestDriver {
    let settings: Settings = settings("sensor-fusion", flags);
    driver(sensor_fusion::pipeline(settings), partitions)
}

fn temperature(machine: &str, value: Option<f64>, time: i64) -> Value {
    json!({"key": machine, "value": {"machine_id": machine, "temperature": value, "event_time": time}})
}

fn humidity(machine: &str, value: Option<f64>, time: i64) -> Value {
    json!({"key": machine, "value": {"sensor_id": machine, "humidity": value, "event_time": time}})
}

/// The topic a reading line belongs to.
fn topic_of(line: &Value) -> &'static str {
    if line["value"].get("machine_id").is_some() {
        TEMPERATURE
    } else {
        HUMIDITY
    }
}

/// Pipes reading lines of either topic, in the order given.
fn send(driver: &mut TestDriver, readings: &[Value]) {
    for line in readings {
        driver
            .pipe(topic_of(line), line["key"].as_str(), line["value"].clone())
            .unwrap_or_else(|e| panic!("piping {line}: {e:#}"));
    }
}

/// Pipes readings one by one as if they arrived live: after each, the wall
/// clock moves past `--max-task-idle`, so the task processes it at once
/// even when the other topic has nothing buffered.
fn send_live(driver: &mut TestDriver, readings: &[Value]) {
    for line in readings {
        send(driver, std::slice::from_ref(line));
        driver.advance_time(Duration::from_secs(2)).unwrap();
    }
}

/// A `machine-maintenance` line for a window of the default length.
fn verdict(
    machine: &str,
    start: i64,
    temperatures: (Option<f64>, usize),
    humidities: (Option<f64>, usize),
    needs_maintenance: bool,
) -> Value {
    verdict_of_length(
        machine,
        start,
        WINDOW,
        temperatures,
        humidities,
        needs_maintenance,
    )
}

fn verdict_of_length(
    machine: &str,
    start: i64,
    length: i64,
    (median_temperature, temperature_count): (Option<f64>, usize),
    (median_humidity, humidity_count): (Option<f64>, usize),
    needs_maintenance: bool,
) -> Value {
    json!({"key": machine, "value": {
        "machine_id": machine, "sensor_id": machine,
        "window_start": start, "window_end": start + length,
        "median_temperature": median_temperature, "median_humidity": median_humidity,
        "temperature_count": temperature_count, "humidity_count": humidity_count,
        "needs_maintenance": needs_maintenance}})
}

fn verdicts(driver: &TestDriver) -> Vec<Value> {
    lines(driver, OUTPUT)
}

fn late(driver: &TestDriver, topic: &str) -> u64 {
    driver.counter(metrics::RECORDS_LATE, &[("topic", topic)])
}

fn windows_emitted(driver: &TestDriver) -> u64 {
    driver.counter(metrics::PROCESSOR_EVENTS, &[("name", "windows_emitted")])
}

// ---------------------------------------------------------------------------
// The fixture (docs/services/sensor-fusion.md, worked example)

#[derive(Clone, Copy, Debug)]
enum Order {
    TemperatureFirst,
    HumidityFirst,
    Interleaved,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Arrival {
    /// Everything is in the topics before the task runs: the task merges the
    /// two topics in event-time order.
    Merged,
    /// Each record is processed as it arrives.
    Live,
}

fn fixture_in(order: Order) -> Vec<Value> {
    let temperatures = fixture("sensor-fusion/temperature-readings.jsonl");
    let humidities = fixture("sensor-fusion/humidity-readings.jsonl");
    match order {
        Order::TemperatureFirst => [temperatures, humidities].concat(),
        Order::HumidityFirst => [humidities, temperatures].concat(),
        Order::Interleaved => temperatures
            .chunks(5)
            .zip(humidities.chunks(5))
            .flat_map(|(t, h)| [t, h].concat())
            .collect(),
    }
}

fn fixture_gives_the_expected_verdicts(flags: &[&str], order: Order, arrival: Arrival) {
    let mut driver = fusion(flags, 1);
    let readings = fixture_in(order);
    match arrival {
        Arrival::Merged => send(&mut driver, &readings),
        Arrival::Live => send_live(&mut driver, &readings),
    }
    settle(&mut driver);
    assert_eq!(
        verdicts(&driver),
        fixture("sensor-fusion/machine-maintenance.expected.jsonl"),
        "{flags:?} {order:?} {arrival:?}"
    );
    assert_eq!(late(&driver, TEMPERATURE) + late(&driver, HUMIDITY), 0);
    assert_eq!(windows_emitted(&driver), 2);
}

#[test]
fn watermark_mode_temperature_first() {
    for arrival in [Arrival::Merged, Arrival::Live] {
        fixture_gives_the_expected_verdicts(&[], Order::TemperatureFirst, arrival);
    }
}

#[test]
fn watermark_mode_humidity_first() {
    for arrival in [Arrival::Merged, Arrival::Live] {
        fixture_gives_the_expected_verdicts(&[], Order::HumidityFirst, arrival);
    }
}

#[test]
fn watermark_mode_interleaved() {
    for arrival in [Arrival::Merged, Arrival::Live] {
        fixture_gives_the_expected_verdicts(&[], Order::Interleaved, arrival);
    }
}

#[test]
fn rollover_mode_temperature_first() {
    let flags = ["--emit", "rollover"];
    fixture_gives_the_expected_verdicts(&flags, Order::TemperatureFirst, Arrival::Merged);
}

#[test]
fn rollover_mode_humidity_first() {
    let flags = ["--emit", "rollover"];
    fixture_gives_the_expected_verdicts(&flags, Order::HumidityFirst, Arrival::Merged);
}

#[test]
fn rollover_mode_interleaved() {
    let flags = ["--emit", "rollover"];
    fixture_gives_the_expected_verdicts(&flags, Order::Interleaved, Arrival::Merged);
}

#[test]
fn rollover_mode_depends_on_the_arrival_order() {
    // Live, temperatures first: each machine's first temperature of the
    // next window rolls over a window without humidities, and the
    // humidities then roll windows back and forth.
    let mut driver = fusion(&["--emit", "rollover"], 1);
    send_live(&mut driver, &fixture_in(Order::TemperatureFirst));
    settle(&mut driver);
    let rows = verdicts(&driver);
    assert_ne!(
        rows,
        fixture("sensor-fusion/machine-maintenance.expected.jsonl")
    );
    assert_eq!(
        rows[0],
        verdict("M1", T0, (Some(79.0), 4), (None, 0), false),
        "M1's first window, rolled over by its 09:05:10 temperature"
    );
}

// ---------------------------------------------------------------------------
// Where the two modes differ (docs/services/sensor-fusion.md)

/// Machine M3's five records, in processing order.
fn m3_records() -> Vec<Value> {
    let ten = T0 + 3_600_000; // 10:00
    vec![
        temperature("M3", Some(70.0), ten + 30_000),
        humidity("M3", Some(85.0), ten + 60_000),
        temperature("M3", Some(72.0), ten + 360_000),
        humidity("M3", None, ten + 320_000),
        temperature("M3", Some(71.0), ten + 290_000),
    ]
}

#[test]
fn where_the_modes_differ_watermark_mode() {
    let ten = T0 + 3_600_000;
    let mut driver = fusion(&[], 1);
    let records = m3_records();
    send_live(&mut driver, &records[..3]);
    assert!(
        verdicts(&driver).is_empty(),
        "the humidity topic holds the watermark at 10:01"
    );
    send_live(&mut driver, &records[3..4]);
    let first = verdict("M3", ten, (Some(70.0), 1), (Some(85.0), 1), false);
    assert_eq!(verdicts(&driver), vec![first.clone()]);
    send_live(&mut driver, &records[4..]);
    assert_eq!(late(&driver, TEMPERATURE), 1, "record 5 is late");
    settle(&mut driver);
    assert_eq!(verdicts(&driver), vec![first]);
}

#[test]
fn where_the_modes_differ_rollover_mode() {
    let ten = T0 + 3_600_000;
    let mut driver = fusion(&["--emit", "rollover"], 1);
    let records = m3_records();
    send_live(&mut driver, &records[..3]);
    let first = verdict("M3", ten, (Some(70.0), 1), (Some(85.0), 1), false);
    assert_eq!(verdicts(&driver), vec![first.clone()]);
    send_live(&mut driver, &records[3..]);
    settle(&mut driver);
    assert_eq!(
        verdicts(&driver),
        vec![
            first,
            verdict("M3", ten + WINDOW, (Some(72.0), 1), (None, 0), false)
        ]
    );
    assert_eq!(
        late(&driver, TEMPERATURE),
        0,
        "no lateness in rollover mode"
    );
}

#[test]
fn where_the_modes_differ_both_give_the_same_rows_when_merged() {
    let ten = T0 + 3_600_000;
    for (flags, late_records) in [(&[][..], 1), (&["--emit", "rollover"][..], 0)] {
        let mut driver = fusion(flags, 1);
        send(&mut driver, &m3_records());
        settle(&mut driver);
        assert_eq!(
            verdicts(&driver),
            vec![
                verdict("M3", ten, (Some(70.0), 1), (Some(85.0), 1), false),
                verdict("M3", ten + WINDOW, (Some(72.0), 1), (None, 0), false),
            ][..2 - late_records],
            "{flags:?}"
        );
        assert_eq!(late(&driver, TEMPERATURE), late_records as u64, "{flags:?}");
    }
}

// ---------------------------------------------------------------------------
// Medians, null readings, the verdict

#[test]
fn medians_null_readings_and_thresholds() {
    let mut driver = fusion(&[], 1);
    let t = |m: &str, v: Option<f64>, s: i64| temperature(m, v, T0 + s * 1_000);
    let h = |m: &str, v: Option<f64>, s: i64| humidity(m, v, T0 + s * 1_000);
    send(
        &mut driver,
        &[
            // Odd counts take the middle value, even the mean of the two middle ones.
            t("odd", Some(90.0), 1),
            t("odd", Some(70.0), 2),
            t("odd", Some(80.0), 3),
            h("odd", Some(85.0), 1),
            h("odd", Some(81.0), 2),
            // Equal to the temperature threshold is not above it.
            t("at-temperature", Some(75.0), 1),
            t("at-temperature", Some(75.0), 2),
            h("at-temperature", Some(90.0), 1),
            // Equal to the humidity threshold is not above it.
            t("at-humidity", Some(80.0), 1),
            h("at-humidity", Some(80.0), 1),
            // Null readings add nothing to medians and counts.
            t("some-null", None, 1),
            t("some-null", Some(76.0), 2),
            h("some-null", None, 1),
            h("some-null", Some(85.0), 2),
            h("some-null", None, 3),
            h("some-null", Some(87.0), 4),
            // Only null readings: still emitted, null medians, zero counts.
            t("all-null", None, 1),
            h("all-null", None, 2),
            // No humidity at all: null median, no maintenance.
            t("no-humidity", Some(99.0), 1),
            // Byte order of ids: upper case first.
            h("ZZ", Some(99.0), 1),
            t("ZZ", Some(99.0), 299),
            // The next window, on both topics, closes the first one.
            t("clock", Some(1.0), 300),
            h("clock", Some(1.0), 300),
        ],
    );
    settle(&mut driver);
    assert_eq!(
        verdicts(&driver),
        vec![
            verdict("ZZ", T0, (Some(99.0), 1), (Some(99.0), 1), true),
            verdict("all-null", T0, (None, 0), (None, 0), false),
            verdict("at-humidity", T0, (Some(80.0), 1), (Some(80.0), 1), false),
            verdict(
                "at-temperature",
                T0,
                (Some(75.0), 2),
                (Some(90.0), 1),
                false
            ),
            verdict("no-humidity", T0, (Some(99.0), 1), (None, 0), false),
            verdict("odd", T0, (Some(80.0), 3), (Some(83.0), 2), true),
            verdict("some-null", T0, (Some(76.0), 1), (Some(86.0), 2), true),
        ]
    );
}

#[test]
fn a_window_without_humidity_has_a_null_median_and_needs_no_maintenance() {
    let mut driver = fusion(&[], 1);
    send(
        &mut driver,
        &[
            temperature("M9", Some(90.0), T0 + 1_000),
            temperature("M9", Some(95.0), T0 + 400_000),
            humidity("M9", Some(99.0), T0 + 400_000),
        ],
    );
    settle(&mut driver);
    assert_eq!(
        verdicts(&driver),
        vec![verdict("M9", T0, (Some(90.0), 1), (None, 0), false)]
    );
}

#[test]
fn thresholds_and_window_length_come_from_the_flags() {
    let flags = [
        "--temperature-threshold",
        "60",
        "--humidity-threshold",
        "76",
        "--window-interval",
        "1m",
    ];
    let mut driver = fusion(&flags, 1);
    send(
        &mut driver,
        &[
            temperature("M2", Some(61.0), T0 + 59_999),
            humidity("M2", Some(76.5), T0 + 1_000),
            temperature("M2", Some(60.0), T0 + 60_000),
            humidity("M2", Some(76.0), T0 + 60_000),
            temperature("M2", Some(60.0), T0 + 120_000),
            humidity("M2", Some(76.0), T0 + 120_000),
        ],
    );
    settle(&mut driver);
    assert_eq!(
        verdicts(&driver),
        vec![
            verdict_of_length("M2", T0, 60_000, (Some(61.0), 1), (Some(76.5), 1), true),
            verdict_of_length(
                "M2",
                T0 + 60_000,
                60_000,
                (Some(60.0), 1),
                (Some(76.0), 1),
                false
            ),
        ]
    );
}

#[test]
fn windows_are_aligned_to_the_epoch_also_before_1970() {
    let mut driver = fusion(&[], 1);
    send(
        &mut driver,
        &[
            temperature("old", Some(80.0), -1),
            humidity("old", Some(90.0), -WINDOW),
            temperature("old", Some(70.0), 0),
            humidity("old", Some(70.0), 0),
        ],
    );
    settle(&mut driver);
    assert_eq!(
        verdicts(&driver),
        vec![verdict(
            "old",
            -WINDOW,
            (Some(80.0), 1),
            (Some(90.0), 1),
            true
        )]
    );
}

// ---------------------------------------------------------------------------
// When windows close (watermark mode)

#[test]
fn nothing_is_emitted_until_both_topics_have_moved_past_a_window() {
    let mut driver = fusion(&[], 1);
    send(
        &mut driver,
        &[
            temperature("M1", Some(80.0), T0),
            temperature("M1", Some(81.0), T0 + WINDOW),
            temperature("M1", Some(82.0), T0 + 2 * WINDOW),
            temperature("M1", Some(83.0), T0 + 3 * WINDOW),
        ],
    );
    settle(&mut driver);
    driver.advance_time(Duration::from_secs(3_600)).unwrap();
    assert!(
        verdicts(&driver).is_empty(),
        "the humidity topic has no watermark yet"
    );
    // One humidity reading far ahead closes every window of M1 it passes,
    // in end order; a machine holds several open windows.
    send(&mut driver, &[humidity("M1", Some(90.0), T0 + 3 * WINDOW)]);
    settle(&mut driver);
    assert_eq!(
        verdicts(&driver),
        vec![
            verdict("M1", T0, (Some(80.0), 1), (None, 0), false),
            verdict("M1", T0 + WINDOW, (Some(81.0), 1), (None, 0), false),
            verdict("M1", T0 + 2 * WINDOW, (Some(82.0), 1), (None, 0), false),
        ]
    );
}

/// The window-end timers follow from the buffered windows: none goes to a
/// changelog, and a task rebuilt from its changelogs alone (local state
/// lost) closes its windows all the same.
#[test]
fn window_timers_come_from_the_buffered_windows_after_a_restore_and_never_go_to_a_changelog() {
    let mut driver = fusion(&[], 1);
    send(
        &mut driver,
        &[
            temperature("M1", Some(80.0), T0),
            temperature("M2", Some(81.0), T0 + WINDOW),
            humidity("M1", Some(40.0), T0 + 10),
        ],
    );
    settle(&mut driver);
    let stored = |driver: &TestDriver, store: &str| {
        driver
            .read(&format!("sensor-fusion-{store}-changelog"))
            .unwrap()
            .len()
    };
    assert_eq!(
        stored(&driver, "window-readings"),
        2,
        "one record per window"
    );
    assert_eq!(stored(&driver, "timers"), 0);
    driver.crash_losing_state().unwrap();
    send(
        &mut driver,
        &[
            temperature("M3", Some(82.0), T0 + 2 * WINDOW),
            humidity("M3", Some(50.0), T0 + 2 * WINDOW),
        ],
    );
    settle(&mut driver);
    assert_eq!(
        verdicts(&driver),
        vec![
            verdict("M1", T0, (Some(80.0), 1), (Some(40.0), 1), false),
            verdict("M2", T0 + WINDOW, (Some(81.0), 1), (None, 0), false),
        ]
    );
}

#[test]
fn windows_closing_in_one_advance_come_out_by_end_then_machine_bytes() {
    let mut driver = fusion(&[], 1);
    send(
        &mut driver,
        &[
            temperature("b", Some(80.0), T0 + WINDOW),
            temperature("a", Some(80.0), T0 + WINDOW),
            temperature("b", Some(80.0), T0),
            temperature("B", Some(80.0), T0 + WINDOW),
            temperature("a", Some(80.0), T0),
            temperature("a1", Some(80.0), T0),
        ],
    );
    send(&mut driver, &[temperature("x", None, T0 + 5 * WINDOW)]);
    settle(&mut driver);
    assert!(
        verdicts(&driver).is_empty(),
        "nothing closes before both topics have a watermark"
    );
    // One advance of the task watermark closes all six windows.
    send(&mut driver, &[humidity("x", None, T0 + 5 * WINDOW)]);
    settle(&mut driver);
    let order: Vec<(String, i64)> = verdicts(&driver)
        .iter()
        .map(|v| {
            (
                v["key"].as_str().unwrap().to_string(),
                v["value"]["window_start"].as_i64().unwrap(),
            )
        })
        .collect();
    let expected = [
        ("a", T0),
        ("a1", T0),
        ("b", T0),
        ("B", T0 + WINDOW),
        ("a", T0 + WINDOW),
        ("b", T0 + WINDOW),
    ];
    assert_eq!(
        order,
        expected
            .iter()
            .map(|(m, s)| (m.to_string(), *s))
            .collect::<Vec<_>>()
    );
}

#[test]
fn rollover_mode_emits_only_when_another_window_of_the_machine_arrives() {
    let mut driver = fusion(&["--emit", "rollover"], 1);
    send(
        &mut driver,
        &[
            temperature("M1", Some(80.0), T0),
            humidity("M1", Some(85.0), T0 + 1),
            humidity("M2", Some(85.0), T0 + 10 * WINDOW),
            temperature("M2", Some(85.0), T0 + 10 * WINDOW),
        ],
    );
    settle(&mut driver);
    driver.advance_time(Duration::from_secs(3_600)).unwrap();
    assert!(
        verdicts(&driver).is_empty(),
        "no timers: time passing emits nothing"
    );
    send(&mut driver, &[humidity("M1", None, T0 + WINDOW)]);
    settle(&mut driver);
    assert_eq!(
        verdicts(&driver),
        vec![verdict("M1", T0, (Some(80.0), 1), (Some(85.0), 1), true)]
    );
}

// ---------------------------------------------------------------------------
// Lateness

#[test]
fn a_reading_for_an_emitted_window_is_late_and_changes_nothing() {
    let mut driver = fusion(&[], 1);
    send(
        &mut driver,
        &[
            temperature("M1", Some(80.0), T0),
            temperature("M1", Some(80.0), T0 + WINDOW),
            humidity("M1", Some(85.0), T0),
            humidity("M1", Some(85.0), T0 + WINDOW),
        ],
    );
    settle(&mut driver);
    let first = vec![verdict("M1", T0, (Some(80.0), 1), (Some(85.0), 1), true)];
    assert_eq!(verdicts(&driver), first);

    send(&mut driver, &[temperature("M1", Some(10.0), T0 + 5)]);
    settle(&mut driver);
    assert_eq!(late(&driver, TEMPERATURE), 1);
    assert_eq!(verdicts(&driver), first, "the late reading changed nothing");
    assert_eq!(
        driver.read("late-readings").unwrap(),
        vec![],
        "no late topic"
    );
}

#[test]
fn a_reading_older_than_the_watermark_in_an_open_window_is_not_late() {
    let mut driver = fusion(&[], 1);
    send_live(
        &mut driver,
        &[
            temperature("M1", Some(80.0), T0 + WINDOW + 200_000),
            humidity("M1", Some(85.0), T0 + WINDOW + 200_000),
            // Before the watermark, but its window (ending at T0 + 2 windows)
            // is still open.
            temperature("M1", Some(90.0), T0 + WINDOW),
            humidity("M1", None, T0 + 2 * WINDOW),
            temperature("M1", None, T0 + 2 * WINDOW),
        ],
    );
    settle(&mut driver);
    assert_eq!(late(&driver, TEMPERATURE), 0);
    assert_eq!(
        verdicts(&driver),
        vec![verdict(
            "M1",
            T0 + WINDOW,
            (Some(85.0), 2),
            (Some(85.0), 1),
            true
        )]
    );
}

#[test]
fn with_a_late_topic_late_readings_are_copied_there_unchanged() {
    let mut driver = fusion(&["--late-topic", "late-readings"], 1);
    send_live(
        &mut driver,
        &[
            temperature("M1", Some(80.0), T0 + WINDOW),
            humidity("M1", Some(85.0), T0 + WINDOW),
            humidity("M1", Some(1.0), T0 + WINDOW - 1),
            temperature("M1", None, T0),
        ],
    );
    settle(&mut driver);
    assert_eq!(late(&driver, HUMIDITY), 1);
    assert_eq!(late(&driver, TEMPERATURE), 1);
    assert!(verdicts(&driver).is_empty());
    let late_records = driver.read("late-readings").unwrap();
    let copies: Vec<Value> = late_records.iter().map(|r| r.to_json()).collect();
    // The late topic keeps each copy's bytes, so it decodes with its own
    // topic's schema.
    assert_eq!(
        copies,
        vec![
            humidity("M1", Some(1.0), T0 + WINDOW - 1),
            temperature("M1", None, T0),
        ]
    );
    assert_eq!(
        late_records[0].raw,
        driver.read(HUMIDITY).unwrap()[1].raw,
        "same bytes"
    );
}

#[test]
fn rollover_mode_has_no_lateness() {
    let mut driver = fusion(&["--emit", "rollover"], 1);
    send_live(
        &mut driver,
        &[
            temperature("M1", Some(80.0), T0),
            temperature("M1", Some(80.0), T0 + WINDOW),
            humidity("M1", Some(85.0), T0 + WINDOW),
            temperature("M1", Some(10.0), T0 + 5),
        ],
    );
    settle(&mut driver);
    assert_eq!(late(&driver, TEMPERATURE), 0);
    assert_eq!(
        verdicts(&driver),
        vec![
            verdict("M1", T0, (Some(80.0), 1), (None, 0), false),
            verdict("M1", T0 + WINDOW, (Some(80.0), 1), (Some(85.0), 1), true),
        ]
    );
}

#[test]
fn topics_with_different_partition_counts_are_refused() {
    let settings: Settings = settings("sensor-fusion", &[]);
    let error = TestDriver::builder(sensor_fusion::pipeline(settings).unwrap())
        .topic_partitions(TEMPERATURE, 2)
        .topic_partitions(HUMIDITY, 3)
        .build()
        .err()
        .expect("the driver must refuse to build");
    let message = format!("{error:#}");
    assert!(message.contains("not co-partitioned"), "{message}");
    assert!(
        message.contains("temperature-readings has 2")
            && message.contains("humidity-readings has 3"),
        "{message}"
    );
}

// ---------------------------------------------------------------------------
// Many machines over four partitions against a model of the rules

/// The median rule of docs/services/sensor-fusion.md.
fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let m = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[m]
    } else {
        (values[m - 1] + values[m]) / 2.0
    })
}

/// A reading as the model sees it: time, machine, value.
type Reading = (i64, String, Option<f64>);

/// The verdicts of watermark mode for time-ordered readings, given that a
/// last reading on both topics closes every window of every machine: one
/// per machine and window that had any reading, null or not.
fn model_verdicts(temperatures: &[Reading], humidities: &[Reading]) -> Vec<Value> {
    type Values = (Vec<f64>, Vec<f64>);
    let mut windows: BTreeMap<(String, i64), Values> = BTreeMap::new();
    for (time, machine, value) in temperatures {
        let start = time.div_euclid(WINDOW) * WINDOW;
        let entry = windows.entry((machine.clone(), start)).or_default();
        entry.0.extend(*value);
    }
    for (time, machine, value) in humidities {
        let start = time.div_euclid(WINDOW) * WINDOW;
        let entry = windows.entry((machine.clone(), start)).or_default();
        entry.1.extend(*value);
    }
    let last = temperatures.iter().chain(humidities).map(|r| r.0).max();
    let last_start = last.map_or(0, |t| t.div_euclid(WINDOW) * WINDOW);
    windows
        .into_iter()
        .filter(|((_, start), _)| *start < last_start)
        .map(|((machine, start), (mut temps, mut hums))| {
            let (mt, mh) = (median(&mut temps), median(&mut hums));
            let needs = mt.is_some_and(|t| t > 75.0) && mh.is_some_and(|h| h > 80.0);
            verdict(&machine, start, (mt, temps.len()), (mh, hums.len()), needs)
        })
        .collect()
}

/// Random readings of `machines` machines over `windows` windows from `base`,
/// each topic time-ordered, and a last reading of each machine on both
/// topics after the last window.
fn generate(
    rng: &mut impl Rng,
    machines: usize,
    windows: i64,
    base: i64,
) -> (Vec<Reading>, Vec<Reading>) {
    let mut temperatures = Vec::new();
    let mut humidities = Vec::new();
    for m in 0..machines {
        let machine = format!("machine-{m}");
        for window in 0..windows {
            let start = base + window * WINDOW;
            for _ in 0..rng.random_range(0..5) {
                let value = rng
                    .random_bool(0.9)
                    .then(|| f64::from(rng.random_range(600..900)) / 10.0);
                temperatures.push((start + rng.random_range(0..WINDOW), machine.clone(), value));
            }
            for _ in 0..rng.random_range(0..5) {
                let value = rng
                    .random_bool(0.9)
                    .then(|| f64::from(rng.random_range(600..950)) / 10.0);
                humidities.push((start + rng.random_range(0..WINDOW), machine.clone(), value));
            }
        }
        let end = base + windows * WINDOW + 1;
        temperatures.push((end, machine.clone(), Some(70.0)));
        humidities.push((end, machine, Some(70.0)));
    }
    temperatures.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    humidities.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    (temperatures, humidities)
}

/// 2,000 machines (ten times the end-to-end test of old), four windows
/// each, over 4 partitions; the two topics interleaved at random and
/// processed now merged, now live. Watermark mode does not depend on the
/// interleaving, so the output is the model's.
#[test]
fn two_thousand_machines_over_four_partitions_match_a_model_of_the_rules() {
    let seed: u64 = rand::rng().random();
    let mut rng = StdRng::seed_from_u64(seed);
    let (temperatures, humidities) = generate(&mut rng, 2_000, 4, T0);
    let expected = model_verdicts(&temperatures, &humidities);
    let mut driver = fusion(&[], 4);
    let (mut t, mut h) = (0, 0);
    while t < temperatures.len() || h < humidities.len() {
        let take_temperature =
            h == humidities.len() || (t < temperatures.len() && rng.random_bool(0.5));
        let line = if take_temperature {
            let (time, machine, value) = &temperatures[t];
            t += 1;
            temperature(machine, *value, *time)
        } else {
            let (time, machine, value) = &humidities[h];
            h += 1;
            humidity(machine, *value, *time)
        };
        send(&mut driver, &[line]);
        if rng.random_range(0..1_000) == 0 {
            driver.advance_time(Duration::from_secs(2)).unwrap();
        }
    }
    settle(&mut driver);
    let context = format!("seed {seed}");

    let output = driver.read(OUTPUT).unwrap();
    let rows: Vec<Value> = output.iter().map(|r| r.to_json()).collect();
    assert_same_records(&rows, &expected, &context);
    // Each verdict on its key's partition, and within a partition in order
    // of window end, then machine id bytes.
    let mut previous: BTreeMap<i32, (i64, String)> = BTreeMap::new();
    for record in &output {
        let machine = record.key.clone().unwrap();
        assert_eq!(
            record.partition,
            murmur2_partition(machine.as_bytes(), 4),
            "{context}"
        );
        let end = record.value.as_ref().unwrap()["window_end"]
            .as_i64()
            .unwrap();
        let this = (end, machine);
        if let Some(before) = previous.get(&record.partition) {
            assert!(*before < this, "{before:?} then {this:?}; {context}");
        }
        previous.insert(record.partition, this);
    }
    assert_eq!(
        late(&driver, TEMPERATURE) + late(&driver, HUMIDITY),
        0,
        "{context}"
    );
    assert_eq!(windows_emitted(&driver), expected.len() as u64, "{context}");
}
