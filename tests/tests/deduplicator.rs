//! deduplicator end to end: the fixture, and a kill -9 under a backlog. The
//! rules are tested on the driver, tests/driver_deduplicator.rs.

use std::collections::HashMap;
use std::time::Duration;

use e2e_tests::*;
use rand::Rng;
use serde_json::Value;

const T: i64 = 1_783_345_153_000;

#[test]
fn fixture_gives_the_first_clicks() {
    fixture_runs::deduplicator();
}

/// `count` clicks in event-time order (0–20 ms apart) drawn from a pool of
/// `ids` click ids, so that an id comes back both within and after the TTL.
fn clicks(count: usize, ids: usize) -> Vec<Value> {
    let mut rng = rand::rng();
    let mut time = T;
    (0..count)
        .map(|_| {
            time += rng.random_range(0..20);
            let id = format!("click-{}", rng.random_range(0..ids));
            json!({"key": id, "value": {
                "click_id": id,
                "user_id": format!("user-{}", rng.random_range(0..50)),
                "url": "/",
                "clicked_at": time,
            }})
        })
        .collect()
}

/// What goes through, for clicks in event-time order (so none is late, and
/// an id's timer has fired exactly when a repeat comes `ttl` or more after
/// the click that went through).
fn first_clicks(clicks: &[Value], ttl: i64) -> Vec<Value> {
    let mut forwarded: HashMap<&str, i64> = HashMap::new();
    clicks
        .iter()
        .filter(|click| {
            let id = click["key"].as_str().unwrap();
            let time = click["value"]["clicked_at"].as_i64().unwrap();
            let new = forwarded.get(id).is_none_or(|first| time >= first + ttl);
            if new {
                forwarded.insert(id, time);
            }
            new
        })
        .cloned()
        .collect()
}

fn sorted(mut lines: Vec<Value>) -> Vec<Value> {
    lines.sort_by_key(|line| line.to_string());
    lines
}

/// A kill -9 under a backlog: the restarted instance restores what it
/// remembered from the changelog and derives its timers from it; every
/// first click comes out exactly once, and no commit is aborted.
#[test]
fn a_backlog_after_a_kill_9_comes_out_exact() {
    let run = SingleInputRun::new("deduplicator", "clicks", "unique-clicks", 2);
    let input = clicks(40_000, 3_000);
    let expected = first_clicks(&input, 2_000);
    assert!(
        expected.len() < input.len() && expected.len() > 3_000,
        "repeats both within and after the TTL: {} of {}",
        expected.len(),
        input.len()
    );
    produce(&run.input, "clicks", &input);
    let arguments = run.args(&["--ttl", "2s"]);
    let second = restart_after_kill_9_under_backlog("deduplicator", &arguments, &run.input, 15_000);
    let output = wait_for_records(&run.output, expected.len(), Duration::from_secs(180));
    assert_eq!(sorted(output), sorted(expected), "log:\n{}", second.log());
    second.assert_no_aborted_commit();
}
