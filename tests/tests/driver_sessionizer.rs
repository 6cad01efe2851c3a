//! sessionizer's rules (docs/services/sessionizer.md, and the common rules
//! of docs/services/README.md it makes visible: timers, order of work,
//! lateness, dead letters, stored watermarks) on the broker-free test driver.

mod common;

use std::time::Duration;

use common::driver::{driver, lines, pipe_all, settings, settle};
use e2e_tests::sessions::{event, generate_with, session};
use e2e_tests::{assert_same_records, fixture};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use sessionizer::Settings;
use streams_runtime::metrics;
use streams_runtime::murmur2_partition;
use streams_runtime::testing::{TestDriver, START_EPOCH_MS};

const INPUT: &str = "user-events";
const OUTPUT: &str = "user-sessions";
const DLQ: &str = "sessionizer-dlq";

/// The time of the worked example in docs/services/sessionizer.md.
const T: i64 = 1_783_345_153_000;

fn sessionizer(flags: &[&str], partitions: usize) -> TestDriver {
    let settings: Settings = settings("sessionizer", flags);
    driver(sessionizer::pipeline(settings), partitions)
}

fn send(driver: &mut TestDriver, events: &[Value]) {
    pipe_all(driver, INPUT, events);
}

/// Pipes `events` to partition `partition`, whatever their keys hash to.
fn send_to(driver: &mut TestDriver, partition: i32, events: &[Value]) {
    for line in events {
        driver
            .pipe_to(
                INPUT,
                partition,
                line["key"].as_str(),
                line["value"].clone(),
            )
            .expect("pipe");
    }
}

fn sessions(driver: &TestDriver) -> Vec<Value> {
    lines(driver, OUTPUT)
}

fn late(driver: &TestDriver) -> u64 {
    driver.counter(metrics::RECORDS_LATE, &[("topic", INPUT)])
}

fn processor_events(driver: &TestDriver, name: &str) -> u64 {
    driver.counter(metrics::PROCESSOR_EVENTS, &[("name", name)])
}

#[test]
fn fixture_gives_the_expected_sessions() {
    let mut driver = sessionizer(&[], 1);
    send(&mut driver, &fixture("sessionizer/user-events.jsonl"));
    settle(&mut driver);
    assert_eq!(
        sessions(&driver),
        fixture("sessionizer/user-sessions.expected.jsonl")
    );
    assert_eq!(processor_events(&driver, "sessions_timed_out"), 1);
    assert_eq!(processor_events(&driver, "sessions_completed"), 0);
}

#[test]
fn logout_completes_the_session_at_once() {
    let mut driver = sessionizer(&[], 1);
    send(
        &mut driver,
        &[event("amy", "LOGIN", T), event("amy", "VIEW", T + 1_000)],
    );
    assert!(sessions(&driver).is_empty(), "amy's session is still open");
    send(&mut driver, &[event("amy", "LOGOUT", T + 5_000)]);
    // No time passes and no later event moves the watermark: the LOGOUT
    // alone ends the session.
    assert_eq!(
        sessions(&driver),
        vec![session(
            "amy",
            "COMPLETED",
            &["LOGIN", "VIEW", "LOGOUT"],
            T,
            T + 5_000
        )]
    );
    driver.commit().unwrap();
    assert_eq!(
        processor_events(&driver, "sessions_completed"),
        1,
        "counted at the commit"
    );

    // The state and timer are gone: far later events open a new session and
    // no TIMEOUT row ever comes for the completed one.
    send(
        &mut driver,
        &[
            event("amy", "VIEW", T + 500_000),
            event("amy", "LOGOUT", T + 500_001),
        ],
    );
    assert_eq!(
        sessions(&driver)[1],
        session(
            "amy",
            "COMPLETED",
            &["VIEW", "LOGOUT"],
            T + 500_000,
            T + 500_001
        )
    );
    assert_eq!(sessions(&driver).len(), 2);
    driver.commit().unwrap();
    assert_eq!(processor_events(&driver, "sessions_completed"), 2);
    assert_eq!(processor_events(&driver, "sessions_timed_out"), 0);
}

#[test]
fn a_logout_as_first_event_is_a_session_of_duration_zero() {
    let mut driver = sessionizer(&[], 1);
    send(&mut driver, &[event("eve", "LOGOUT", T)]);
    assert_eq!(
        sessions(&driver),
        vec![session("eve", "COMPLETED", &["LOGOUT"], T, T)]
    );
}

#[test]
fn logout_is_matched_exactly_and_case_sensitively() {
    let mut driver = sessionizer(&[], 1);
    send(
        &mut driver,
        &[
            event("amy", "logout", T),
            event("amy", "LOGOUT ", T + 1),
            event("amy", "LOGOUT", T + 2),
        ],
    );
    assert_eq!(
        sessions(&driver),
        vec![session(
            "amy",
            "COMPLETED",
            &["logout", "LOGOUT ", "LOGOUT"],
            T,
            T + 2
        )]
    );
}

#[test]
fn timers_fire_when_the_watermark_reaches_them_and_not_before() {
    let mut driver = sessionizer(&[], 1);
    send(
        &mut driver,
        &[event("bob", "LOGIN", T), event("cat", "LOGIN", T + 29_999)],
    );
    // Wall-clock time does not fire event-time timers.
    driver.advance_time(Duration::from_secs(3_600)).unwrap();
    driver.commit().unwrap();
    assert!(
        sessions(&driver).is_empty(),
        "the watermark is 1 ms short of bob's timer"
    );
    send(&mut driver, &[event("cat", "VIEW", T + 30_000)]);
    assert_eq!(
        sessions(&driver),
        vec![session("bob", "TIMEOUT", &["LOGIN"], T, T + 30_000)]
    );
    driver.commit().unwrap();
    assert_eq!(processor_events(&driver, "sessions_timed_out"), 1);
}

/// The inactivity timers follow from the open sessions: none is written to
/// a changelog, and a task rebuilt from its changelogs alone (local state
/// lost) times its sessions out all the same.
#[test]
fn timers_come_from_the_sessions_after_a_restore_and_never_go_to_a_changelog() {
    let mut driver = sessionizer(&[], 1);
    send(
        &mut driver,
        &[
            event("amy", "LOGIN", T),
            event("bob", "LOGIN", T + 1_000),
            event("bob", "VIEW", T + 5_000),
        ],
    );
    driver.commit().unwrap();
    let stored = |driver: &TestDriver, store: &str| {
        driver
            .read(&format!("sessionizer-{store}-changelog"))
            .unwrap()
            .len()
    };
    assert_eq!(stored(&driver, "sessions"), 2, "one record per session");
    assert_eq!(stored(&driver, "timers"), 0);
    driver.crash_losing_state().unwrap();
    send(&mut driver, &[event("cat", "LOGIN", T + 40_000)]);
    assert_eq!(
        sessions(&driver),
        vec![
            session("amy", "TIMEOUT", &["LOGIN"], T, T + 30_000),
            session("bob", "TIMEOUT", &["LOGIN", "VIEW"], T + 1_000, T + 35_000),
        ]
    );
}

#[test]
fn a_record_after_a_deadline_sees_the_timeout_then_starts_a_new_session() {
    let mut driver = sessionizer(&[], 1);
    send(
        &mut driver,
        &[
            event("dan", "LOGIN", T),
            event("dan", "SEARCH", T + 10_000),
            event("dan", "VIEW", T + 40_000),
            event("dan", "LOGOUT", T + 45_000),
        ],
    );
    assert_eq!(
        sessions(&driver),
        vec![
            session("dan", "TIMEOUT", &["LOGIN", "SEARCH"], T, T + 40_000),
            session(
                "dan",
                "COMPLETED",
                &["VIEW", "LOGOUT"],
                T + 40_000,
                T + 45_000
            ),
        ]
    );
}

#[test]
fn an_event_exactly_one_timeout_later_opens_a_new_session_one_millisecond_less_does_not() {
    let mut driver = sessionizer(&[], 1);
    send(
        &mut driver,
        &[event("dan", "LOGIN", T), event("dan", "VIEW", T + 30_000)],
    );
    assert_eq!(
        sessions(&driver),
        vec![session("dan", "TIMEOUT", &["LOGIN"], T, T + 30_000)],
        "the VIEW at the deadline sees the timeout first"
    );

    let mut driver = sessionizer(&[], 1);
    send(
        &mut driver,
        &[
            event("dan", "LOGIN", T),
            event("dan", "VIEW", T + 29_999),
            // Moves the watermark to 1 ms before the moved deadline.
            event("zoe", "LOGIN", T + 59_998),
        ],
    );
    assert!(sessions(&driver).is_empty(), "{:?}", sessions(&driver));
    send(&mut driver, &[event("zoe", "VIEW", T + 59_999)]);
    assert_eq!(
        sessions(&driver),
        vec![session("dan", "TIMEOUT", &["LOGIN", "VIEW"], T, T + 59_999)]
    );
}

#[test]
fn an_earlier_event_lowers_the_start_but_does_not_move_the_deadline() {
    // The worked example with --max-out-of-orderness 10s.
    let flags = ["--max-out-of-orderness", "10s"];
    let mut driver = sessionizer(&flags, 1);
    send(
        &mut driver,
        &[
            event("eve", "LOGIN", T + 5_000),
            event("eve", "VIEW", T),
            event("eve", "LOGOUT", T + 8_000),
        ],
    );
    assert_eq!(
        late(&driver),
        0,
        "the VIEW is not late: the watermark was T-5s"
    );
    assert_eq!(
        sessions(&driver),
        vec![session(
            "eve",
            "COMPLETED",
            &["LOGIN", "VIEW", "LOGOUT"],
            T,
            T + 8_000
        )]
    );

    // The deadline stays at the latest event time + 30 s = T + 35 s.
    let mut driver = sessionizer(&flags, 1);
    send(
        &mut driver,
        &[
            event("eve", "LOGIN", T + 5_000),
            event("eve", "VIEW", T),
            // Watermark T + 34.999 s.
            event("max", "LOGIN", T + 44_999),
        ],
    );
    assert!(sessions(&driver).is_empty());
    // Watermark T + 35 s.
    send(&mut driver, &[event("max", "VIEW", T + 45_000)]);
    assert_eq!(
        sessions(&driver),
        vec![session("eve", "TIMEOUT", &["LOGIN", "VIEW"], T, T + 35_000)]
    );
}

#[test]
fn sessions_timing_out_in_one_advance_come_out_by_deadline_then_user() {
    let mut driver = sessionizer(&[], 1);
    send(
        &mut driver,
        &[
            event("zed", "LOGIN", T),
            event("bob", "LOGIN", T + 1_000),
            event("Bob", "LOGIN", T + 1_000),
            event("amy", "LOGIN", T + 1_000),
            event("ann", "LOGIN", T + 2_000),
        ],
    );
    send(&mut driver, &[event("kim", "LOGIN", T + 100_000)]);
    let users: Vec<String> = sessions(&driver)
        .iter()
        .map(|s| s["key"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(users, ["zed", "Bob", "amy", "bob", "ann"]);
    assert_eq!(
        sessions(&driver)[1],
        session("Bob", "TIMEOUT", &["LOGIN"], T + 1_000, T + 31_000)
    );
}

#[test]
fn events_of_other_users_on_the_same_partition_time_a_session_out_not_those_of_another_partition() {
    let mut driver = sessionizer(&[], 2);
    send_to(&mut driver, 0, &[event("ada", "LOGIN", T)]);
    send_to(&mut driver, 1, &[event("ben", "LOGIN", T + 100_000)]);
    settle(&mut driver);
    assert!(
        sessions(&driver).is_empty(),
        "partition 0's watermark has not moved"
    );
    send_to(&mut driver, 0, &[event("cyd", "LOGIN", T + 100_000)]);
    let rows = driver.read(OUTPUT).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].to_json(),
        session("ada", "TIMEOUT", &["LOGIN"], T, T + 30_000)
    );
    assert_eq!(
        rows[0].partition,
        murmur2_partition(b"ada", 2),
        "the output goes to the partition of its key"
    );
}

/// 10,000 users (ten times the end-to-end test of old) over 4 partitions,
/// against the model of the rules in `e2e_tests::sessions`.
#[test]
fn ten_thousand_users_over_four_partitions_match_a_model_of_the_rules() {
    let seed: u64 = rand::rng().random();
    let mut rng = StdRng::seed_from_u64(seed);
    let (input, expected) = generate_with(&mut rng, 10_000, 7, T);
    let mut driver = sessionizer(&[], 4);
    send(&mut driver, &input);
    settle(&mut driver);
    let output = driver.read(OUTPUT).unwrap();
    for record in &output {
        let key = record.key.as_deref().unwrap();
        assert_eq!(record.partition, murmur2_partition(key.as_bytes(), 4));
    }
    let output: Vec<Value> = output.iter().map(|r| r.to_json()).collect();
    assert_same_records(&output, &expected, &format!("seed {seed}"));
    assert_eq!(late(&driver), 0, "seed {seed}");
    assert_eq!(
        processor_events(&driver, "sessions_completed")
            + processor_events(&driver, "sessions_timed_out"),
        expected.len() as u64,
        "seed {seed}"
    );
}

/// The same, with commits and crashes at random points: what a crash drops
/// is done again, and the output is the model's, each session once.
#[test]
fn crashes_at_random_points_change_no_session() {
    let seed: u64 = rand::rng().random();
    let mut rng = StdRng::seed_from_u64(seed);
    let (input, expected) = generate_with(&mut rng, 1_000, 7, T);
    let mut driver = sessionizer(&[], 4);
    // Four crashes, half of them losing the local state, at random points
    // between commits at random points.
    let mut crash_at: Vec<usize> = (0..4).map(|_| rng.random_range(1..input.len())).collect();
    crash_at.sort_unstable();
    for (index, line) in input.iter().enumerate() {
        send(&mut driver, std::slice::from_ref(line));
        if rng.random_range(0..40) == 0 {
            driver.commit().unwrap();
        }
        for (n, _) in crash_at.iter().enumerate().filter(|(_, at)| **at == index) {
            if n % 2 == 0 {
                driver.crash().unwrap();
            } else {
                driver.crash_losing_state().unwrap();
            }
        }
    }
    settle(&mut driver);
    assert_same_records(&sessions(&driver), &expected, &format!("seed {seed}"));
    // Counters count committed work only: each session once.
    assert_eq!(
        processor_events(&driver, "sessions_completed")
            + processor_events(&driver, "sessions_timed_out"),
        expected.len() as u64,
        "seed {seed}"
    );
}

#[test]
fn with_an_idle_timeout_a_quiet_session_times_out_in_wall_clock_time() {
    let mut driver = sessionizer(&["--idle-timeout", "2s", "--session-timeout", "3s"], 1);
    let now = START_EPOCH_MS;
    send(&mut driver, &[event("eve", "LOGIN", now)]);
    // Quiet for 2 s: the watermark follows the wall clock from now on.
    driver.advance_time(Duration::from_millis(2_999)).unwrap();
    assert!(
        sessions(&driver).is_empty(),
        "the watermark is at now + 2.999 s"
    );
    driver.advance_time(Duration::from_millis(1)).unwrap();
    assert_eq!(
        sessions(&driver),
        vec![session("eve", "TIMEOUT", &["LOGIN"], now, now + 3_000)]
    );

    // Without --idle-timeout, an hour of quiet changes nothing.
    let mut driver = sessionizer(&["--session-timeout", "3s"], 1);
    send(&mut driver, &[event("eve", "LOGIN", now)]);
    driver.advance_time(Duration::from_secs(3_600)).unwrap();
    assert!(sessions(&driver).is_empty());
}

#[test]
fn late_records_are_counted_and_dropped() {
    let mut driver = sessionizer(&[], 1);
    send(
        &mut driver,
        &[
            event("fay", "LOGIN", T + 100_000),
            event("gus", "LOGOUT", T + 50_000),
            event("gus", "LOGOUT", T + 99_999),
        ],
    );
    assert_eq!(late(&driver), 2);
    assert!(
        sessions(&driver).is_empty(),
        "gus's late LOGOUTs must not be processed"
    );
    // Exactly at the watermark is not late (late means `<`).
    send(&mut driver, &[event("gus", "LOGOUT", T + 100_000)]);
    assert_eq!(late(&driver), 2);
    assert_eq!(
        sessions(&driver),
        vec![session(
            "gus",
            "COMPLETED",
            &["LOGOUT"],
            T + 100_000,
            T + 100_000
        )]
    );
    assert_eq!(driver.read("late-events").unwrap(), vec![], "no late topic");
}

#[test]
fn late_records_within_the_allowed_disorder_are_processed() {
    let mut driver = sessionizer(&["--max-out-of-orderness", "10s"], 1);
    send(
        &mut driver,
        &[
            event("fay", "LOGIN", T + 100_000),
            event("gus", "LOGOUT", T + 90_000),
            event("hal", "LOGOUT", T + 89_999),
        ],
    );
    assert_eq!(late(&driver), 1);
    assert_eq!(
        sessions(&driver),
        vec![session(
            "gus",
            "COMPLETED",
            &["LOGOUT"],
            T + 90_000,
            T + 90_000
        )]
    );
}

#[test]
fn with_a_late_topic_late_records_are_copied_there_unchanged() {
    let mut driver = sessionizer(&["--late-topic", "late-events"], 1);
    send(
        &mut driver,
        &[
            event("fay", "LOGIN", T + 100_000),
            event("gus", "LOGOUT", T + 50_000),
        ],
    );
    assert_eq!(late(&driver), 1);
    assert!(sessions(&driver).is_empty());
    let input = driver.read(INPUT).unwrap();
    let copies = driver.read("late-events").unwrap();
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].key.as_deref(), Some("gus"));
    assert_eq!(copies[0].raw, input[1].raw, "same value bytes");
    assert_eq!(
        copies[0].value,
        Some(event("gus", "LOGOUT", T + 50_000)["value"].clone())
    );
}

#[test]
fn a_poison_pill_goes_to_the_dead_letter_topic_and_good_records_keep_flowing() {
    let mut driver = sessionizer(&[], 1);
    send(&mut driver, &[event("hal", "LOGIN", T)]);
    driver
        .pipe_raw(INPUT, 0, Some(b"hal"), Some(b"this is not avro"))
        .unwrap();
    send(&mut driver, &[event("hal", "LOGOUT", T + 1_000)]);
    assert_eq!(
        sessions(&driver),
        vec![session(
            "hal",
            "COMPLETED",
            &["LOGIN", "LOGOUT"],
            T,
            T + 1_000
        )]
    );
    let dead = driver.read(DLQ).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].key.as_deref(), Some("hal"));
    assert_eq!(dead[0].raw.as_deref(), Some(&b"this is not avro"[..]));
    assert_eq!(dead[0].header("dlq.error.kind"), Some("not_wire_format"));
    assert_eq!(dead[0].header("dlq.source.topic"), Some(INPUT));
    assert_eq!(dead[0].header("dlq.source.partition"), Some("0"));
    assert_eq!(dead[0].header("dlq.source.offset"), Some("1"));
    assert!(
        dead[0]
            .header("dlq.error.message")
            .unwrap()
            .contains("magic byte"),
        "{:?}",
        dead[0].headers
    );
    assert_eq!(
        driver.counter(metrics::RECORDS_DEAD_LETTERED, &[("topic", INPUT)]),
        1
    );
}

#[test]
fn every_kind_of_undecodable_record_is_dead_lettered_with_its_bytes() {
    let mut driver = sessionizer(&[], 1);
    send(&mut driver, &[event("ivy", "LOGIN", T)]);
    let good = driver.read(INPUT).unwrap()[0].raw.clone().unwrap();
    let mut unknown_id = good.clone();
    unknown_id[1..5].copy_from_slice(&9_999u32.to_be_bytes());
    let truncated = good[..good.len() - 3].to_vec();
    let pills: [(&[u8], &[u8], &str); 5] = [
        (b"ivy", b"", "not_wire_format"),
        (b"ivy", &[0, 0, 1], "not_wire_format"),
        (b"ivy", &unknown_id, "unknown_schema_id"),
        (b"ivy", &truncated, "avro"),
        (&[0xff, 0xfe], &good, "not_wire_format"),
    ];
    for (key, value, _) in pills {
        driver.pipe_raw(INPUT, 0, Some(key), Some(value)).unwrap();
    }
    send(&mut driver, &[event("ivy", "LOGOUT", T + 1_000)]);
    assert_eq!(
        sessions(&driver),
        vec![session(
            "ivy",
            "COMPLETED",
            &["LOGIN", "LOGOUT"],
            T,
            T + 1_000
        )]
    );
    let dead = driver.read(DLQ).unwrap();
    assert_eq!(dead.len(), pills.len());
    for (offset, ((key, value, kind), record)) in pills.iter().zip(&dead).enumerate() {
        assert_eq!(record.header("dlq.error.kind"), Some(*kind), "{record:?}");
        assert_eq!(
            record.header("dlq.source.offset"),
            Some((offset + 1).to_string().as_str())
        );
        assert_eq!(record.raw.as_deref(), Some(*value));
        assert_eq!(
            record.key.as_deref(),
            Some(String::from_utf8_lossy(key).as_ref())
        );
    }
    assert_eq!(
        driver.counter(metrics::RECORDS_DEAD_LETTERED, &[("topic", INPUT)]),
        pills.len() as u64
    );
}

#[test]
fn after_a_crash_the_stored_watermark_still_marks_old_records_late() {
    for lose_state in [false, true] {
        let mut driver = sessionizer(&[], 1);
        send(&mut driver, &[event("ivy", "LOGIN", T + 500_000)]);
        driver.commit().unwrap();
        if lose_state {
            driver.crash_losing_state().unwrap();
        } else {
            driver.crash().unwrap();
        }
        // ivy's LOGIN is committed and not read again: a watermark kept only
        // in memory would start over and accept this stale event.
        send(&mut driver, &[event("jon", "LOGOUT", T)]);
        assert_eq!(late(&driver), 1, "lose_state {lose_state}");
        assert!(sessions(&driver).is_empty(), "lose_state {lose_state}");
        // ivy's open session and its timer survived too.
        send(&mut driver, &[event("ivy", "VIEW", T + 510_000)]);
        send(&mut driver, &[event("kit", "LOGIN", T + 540_000)]);
        assert_eq!(
            sessions(&driver),
            vec![session(
                "ivy",
                "TIMEOUT",
                &["LOGIN", "VIEW"],
                T + 500_000,
                T + 540_000
            )],
            "lose_state {lose_state}"
        );
    }
}

/// A crash takes the counters of records back to the last commit, as it
/// takes the state: what it makes the task read again counts once, so the
/// counters are those of a run without the crash. Restores and commits are
/// counted as they happen.
#[test]
fn after_a_crash_the_records_read_again_count_once() {
    let late_topic = "late-events";
    let mut driver = sessionizer(&["--late-topic", late_topic], 1);
    send(&mut driver, &[event("amy", "LOGIN", T + 100_000)]);
    driver.commit().unwrap();
    send(
        &mut driver,
        &[
            event("amy", "LOGOUT", T + 101_000),
            event("bob", "LOGOUT", T),
        ],
    );
    driver
        .pipe_raw(INPUT, 0, Some(b"cal"), Some(b"not avro"))
        .unwrap();
    let counts = |driver: &TestDriver| {
        let produced = |topic| driver.counter(metrics::RECORDS_PRODUCED, &[("topic", topic)]);
        [
            driver.counter(metrics::RECORDS_CONSUMED, &[("topic", INPUT)]),
            late(driver),
            driver.counter(metrics::RECORDS_DEAD_LETTERED, &[("topic", INPUT)]),
            produced(OUTPUT),
            produced(late_topic),
            produced(DLQ),
            processor_events(driver, "sessions_completed"),
        ]
    };
    let uncommitted = counts(&driver);
    assert_eq!(
        uncommitted,
        [4, 1, 1, 1, 1, 1, 0],
        "the session is not committed"
    );
    driver.crash().unwrap();
    assert_eq!(counts(&driver), uncommitted);
    driver.commit().unwrap();
    let committed = counts(&driver);
    assert_eq!(committed[..6], uncommitted[..6]);
    assert_eq!(committed[6], 1);
    let commits = driver.counter(metrics::COMMITS, &[]);
    driver.crash_losing_state().unwrap();
    assert_eq!(counts(&driver), committed);
    assert!(driver.counter(metrics::RESTORED_RECORDS, &[]) > 0);
    assert_eq!(driver.counter(metrics::COMMITS, &[]), commits);
}

#[test]
fn a_crash_before_a_commit_drops_its_sessions_and_makes_them_again_once() {
    let mut driver = sessionizer(&[], 1);
    send(
        &mut driver,
        &[event("amy", "LOGIN", T), event("amy", "VIEW", T + 1_000)],
    );
    driver.commit().unwrap();
    send(&mut driver, &[event("amy", "LOGOUT", T + 2_000)]);
    assert_eq!(sessions(&driver).len(), 1);
    driver.crash().unwrap();
    let expected = vec![session(
        "amy",
        "COMPLETED",
        &["LOGIN", "VIEW", "LOGOUT"],
        T,
        T + 2_000,
    )];
    // The LOGOUT is read again from the committed offset: the aborted row is
    // invisible and the new one is the only one.
    assert_eq!(sessions(&driver), expected);
    driver.commit().unwrap();
    driver.crash().unwrap();
    assert_eq!(sessions(&driver), expected);
}

/// The progress store's changelog, as the runtime names it.
const PROGRESS_CHANGELOG: &str = "sessionizer-task-progress-changelog";

/// The keys of the progress store's live entries of clocks, as its
/// changelog holds them (a tombstone removes one): `C` in state format 2,
/// `D…` and `T` in format 1.
fn live_clock_keys(driver: &TestDriver) -> Vec<String> {
    let mut live = std::collections::BTreeMap::new();
    for record in driver.read(PROGRESS_CHANGELOG).expect("read") {
        let key = record.key.clone().unwrap_or_default();
        if key.starts_with('P') {
            continue; // an input position: the same in both formats
        }
        let name = format!("p{} {}", record.partition, &key[..1]);
        live.insert(name, record.raw.is_some());
    }
    live.into_iter()
        .filter(|(_, live)| *live)
        .map(|(name, _)| name)
        .collect()
}

/// A two-step upgrade across the state format, and back: the first step
/// writes format 1 (the clocks one entry each), the second format 2 (one
/// entry of all the clocks, the old ones deleted in the same commit), a
/// rollback of the second writes format 1 again; a restore from the mixed
/// changelog and the next step go on. Every restart keeps the watermark (a
/// record far behind it is late right after), and the output is exactly
/// the model's.
#[test]
fn an_upgrade_of_the_state_format_in_two_steps_and_back_changes_no_session() {
    use streams_runtime::state::format::WriteFormat;
    let seed: u64 = rand::rng().random();
    let mut rng = StdRng::seed_from_u64(seed);
    let (input, expected) = generate_with(&mut rng, 1_000, 7, T);
    let mut driver = sessionizer(&["--upgrade-from-format", "1"], 2);
    let format_1 = WriteFormat::upgrading_from(1).unwrap();
    let parts: Vec<&[Value]> = input.chunks(input.len() / 4 + 1).collect();
    let mut late_so_far = 0;
    let mut keeps_its_watermark = |driver: &mut TestDriver, step: &str| {
        for partition in 0..2 {
            send_to(driver, partition, &[event("late-probe", "VIEW", T - 1)]);
        }
        late_so_far += 2;
        assert_eq!(late(driver), late_so_far, "{step}: seed {seed}");
    };

    send(&mut driver, parts[0]);
    driver.commit().unwrap();
    assert_eq!(
        live_clock_keys(&driver),
        ["p0 D", "p0 T", "p1 D", "p1 T"],
        "the first step writes format 1"
    );

    driver.restart_writing(WriteFormat::NEWEST).unwrap();
    keeps_its_watermark(&mut driver, "the second step");
    send(&mut driver, parts[1]);
    driver.commit().unwrap();
    assert_eq!(
        live_clock_keys(&driver),
        ["p0 C", "p1 C"],
        "the second step writes format 2"
    );

    driver.restart_writing(format_1).unwrap();
    keeps_its_watermark(&mut driver, "a rollback of the second step");
    send(&mut driver, parts[2]);
    driver.commit().unwrap();
    assert_eq!(
        live_clock_keys(&driver),
        ["p0 D", "p0 T", "p1 D", "p1 T"],
        "a rollback writes format 1 again"
    );

    driver.crash_losing_state().unwrap();
    keeps_its_watermark(&mut driver, "a restore from both formats");
    driver.restart_writing(WriteFormat::NEWEST).unwrap();
    keeps_its_watermark(&mut driver, "the second step again");
    send(&mut driver, parts[3]);
    settle(&mut driver);
    assert_eq!(live_clock_keys(&driver), ["p0 C", "p1 C"]);
    assert_same_records(&sessions(&driver), &expected, &format!("seed {seed}"));
}
