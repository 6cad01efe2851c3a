//! deduplicator's rules (docs/services/deduplicator.md) on the broker-free
//! test driver.

mod common;

use common::driver::{driver, lines, pipe_all, settings, settle};
use deduplicator::Settings;
use e2e_tests::{fixture, json};
use serde_json::Value;
use streams_runtime::metrics;
use streams_runtime::testing::TestDriver;

const INPUT: &str = "clicks";
const OUTPUT: &str = "unique-clicks";

/// The time of the worked example in docs/services/deduplicator.md.
const T: i64 = 1_783_345_153_000;

fn deduplicator(flags: &[&str]) -> TestDriver {
    let settings: Settings = settings("deduplicator", flags);
    driver(deduplicator::pipeline(settings), 1)
}

fn click(id: &str, at: i64) -> Value {
    json!({"key": id, "value": {"click_id": id, "user_id": "ann", "url": "/", "clicked_at": at}})
}

fn forwarded_times(driver: &TestDriver) -> Vec<(String, i64)> {
    lines(driver, OUTPUT)
        .iter()
        .map(|line| {
            let value = &line["value"];
            (
                value["click_id"].as_str().unwrap().to_string(),
                value["clicked_at"].as_i64().unwrap(),
            )
        })
        .collect()
}

fn processor_events(driver: &TestDriver, name: &str) -> u64 {
    driver.counter(metrics::PROCESSOR_EVENTS, &[("name", name)])
}

fn forwarded(items: &[(&str, i64)]) -> Vec<(String, i64)> {
    items.iter().map(|(id, at)| (id.to_string(), *at)).collect()
}

#[test]
fn fixture_gives_the_first_clicks() {
    let mut driver = deduplicator(&[]);
    pipe_all(&mut driver, INPUT, &fixture("deduplicator/clicks.jsonl"));
    settle(&mut driver);
    assert_eq!(
        lines(&driver, OUTPUT),
        fixture("deduplicator/unique-clicks.expected.jsonl")
    );
    assert_eq!(processor_events(&driver, "duplicates_dropped"), 2);
    assert_eq!(processor_events(&driver, "ids_expired"), 2);
}

/// An id is remembered for `[first, first + ttl)` of event time: a repeat
/// 1 ms short of the TTL is dropped, one at the TTL goes through (the
/// timer fires before the record that moves the watermark onto it).
#[test]
fn a_repeat_goes_through_from_exactly_the_ttl_on() {
    let mut driver = deduplicator(&["--ttl", "10s"]);
    pipe_all(
        &mut driver,
        INPUT,
        &[
            click("a", T),
            click("a", T + 9_999),
            click("a", T + 10_000),
            click("a", T + 19_999),
        ],
    );
    assert_eq!(
        forwarded_times(&driver),
        forwarded(&[("a", T), ("a", T + 10_000)])
    );
}

/// Timers run on the partition's watermark: other ids' clicks forget an
/// id, and wall-clock time alone forgets nothing.
#[test]
fn any_click_moves_the_clock_and_wall_clock_time_does_not() {
    let mut driver = deduplicator(&["--ttl", "10s"]);
    pipe_all(&mut driver, INPUT, &[click("a", T)]);
    driver
        .advance_time(std::time::Duration::from_secs(3_600))
        .unwrap();
    pipe_all(
        &mut driver,
        INPUT,
        &[click("a", T + 1), click("b", T + 10_000)],
    );
    // b's click moved the watermark onto a's expiry: a is new again.
    pipe_all(&mut driver, INPUT, &[click("a", T + 10_000)]);
    assert_eq!(
        forwarded_times(&driver),
        forwarded(&[("a", T), ("b", T + 10_000), ("a", T + 10_000)])
    );
    driver.commit().unwrap();
    assert_eq!(processor_events(&driver, "duplicates_dropped"), 1);
    assert_eq!(processor_events(&driver, "ids_expired"), 1);
}

/// A late click (behind the watermark) is dropped and counted as late,
/// not as a duplicate; with `--max-out-of-orderness` it is on time, and a
/// remembered id drops it.
#[test]
fn late_clicks_are_dropped_as_late() {
    let mut driver = deduplicator(&[]);
    pipe_all(&mut driver, INPUT, &[click("a", T), click("b", T - 1)]);
    assert_eq!(forwarded_times(&driver), forwarded(&[("a", T)]));
    driver.commit().unwrap();
    assert_eq!(
        driver.counter(metrics::RECORDS_LATE, &[("topic", INPUT)]),
        1
    );

    let mut driver = deduplicator(&["--max-out-of-orderness", "5s"]);
    pipe_all(
        &mut driver,
        INPUT,
        &[click("a", T), click("b", T - 1), click("a", T - 2)],
    );
    assert_eq!(
        forwarded_times(&driver),
        forwarded(&[("a", T), ("b", T - 1)])
    );
    driver.commit().unwrap();
    assert_eq!(processor_events(&driver, "duplicates_dropped"), 1);
}

/// What is remembered survives the loss of local state: a task rebuilt
/// from its changelog still drops repeats, and still forgets them on time
/// (its timers derived from the restored ids).
#[test]
fn remembered_ids_and_their_expiry_survive_a_restore() {
    let mut driver = deduplicator(&["--ttl", "10s"]);
    pipe_all(&mut driver, INPUT, &[click("a", T), click("b", T + 5_000)]);
    driver.commit().unwrap();
    driver.crash_losing_state().unwrap();
    pipe_all(
        &mut driver,
        INPUT,
        &[
            click("a", T + 6_000),
            click("b", T + 9_000),
            click("a", T + 10_000),
            click("b", T + 14_999),
        ],
    );
    assert_eq!(
        forwarded_times(&driver),
        forwarded(&[("a", T), ("b", T + 5_000), ("a", T + 10_000)])
    );
}

#[test]
fn a_ttl_of_zero_is_refused() {
    let settings: Settings = settings("deduplicator", &["--ttl", "0s"]);
    let error = deduplicator::pipeline(settings).err().expect("refused");
    assert_eq!(error.to_string(), "--ttl must be at least 1ms");
}
