//! Sessionizer test data: events, expected session rows, and a model of
//! the session rules of docs/services/sessionizer.md to compute the
//! expected output of generated input.

use std::collections::HashMap;

use rand::Rng;
use serde_json::{json, Value};

/// A `user-events` line.
pub fn event(user: &str, kind: &str, time: i64) -> Value {
    json!({"key": user, "value": {"user_id": user, "event_type": kind, "event_time": time}})
}

/// A `user-sessions` line.
pub fn session(user: &str, status: &str, events: &[&str], start: i64, end: i64) -> Value {
    json!({"key": user, "value": {"user_id": user, "status": status, "duration_millis": end - start,
        "event_count": events.len(), "event_sequence": events.join(" > "),
        "session_start": start, "session_end": end}})
}

/// The sessions of docs/services/sessionizer.md for one user's time-ordered
/// events, given that a later event at or after the inactivity deadline sees
/// the timeout first.
pub fn model_sessions(user: &str, events: &[(i64, &str)], timeout: i64) -> Vec<Value> {
    let mut out = Vec::new();
    let mut open: Option<(i64, i64, Vec<&str>)> = None;
    for (time, kind) in events {
        if let Some((start, latest, kinds)) = open.take() {
            if *time >= latest + timeout {
                out.push(session(user, "TIMEOUT", &kinds, start, latest + timeout));
            } else {
                open = Some((start, latest, kinds));
            }
        }
        let (start, latest, mut kinds) = open.take().unwrap_or((*time, *time, Vec::new()));
        kinds.push(kind);
        if *kind == "LOGOUT" {
            out.push(session(user, "COMPLETED", &kinds, start, *time));
        } else {
            open = Some((start.min(*time), latest.max(*time), kinds));
        }
    }
    out
}

/// Random sessions of `users` users starting at `base`, time-ordered, with a
/// far-future event per user that ends whatever is still open. Returns the
/// input lines and the expected output (30 s timeout).
pub fn generate(users: usize, max_events: usize, base: i64) -> (Vec<Value>, Vec<Value>) {
    generate_with(&mut rand::rng(), users, max_events, base)
}

/// [`generate`] drawing from `rng` (a seeded one makes a failure repeatable).
pub fn generate_with(
    rng: &mut impl Rng,
    users: usize,
    max_events: usize,
    base: i64,
) -> (Vec<Value>, Vec<Value>) {
    let kinds = ["LOGIN", "VIEW", "SEARCH", "CART", "LOGOUT"];
    let mut all: Vec<(i64, String, &str)> = Vec::new();
    let mut per_user: HashMap<String, Vec<(i64, &str)>> = HashMap::new();
    for u in 0..users {
        let user = format!("user-{u}");
        let mut time = base + rng.random_range(0..60_000);
        for _ in 0..rng.random_range(1..=max_events) {
            let kind = kinds[rng.random_range(0..kinds.len())];
            per_user.entry(user.clone()).or_default().push((time, kind));
            all.push((time, user.clone(), kind));
            time += if rng.random_bool(0.3) {
                rng.random_range(30_000..90_000)
            } else {
                rng.random_range(0..29_000)
            };
        }
        let end = base + 100_000_000;
        per_user.get_mut(&user).unwrap().push((end, "LOGIN"));
        all.push((end, user.clone(), "LOGIN"));
    }
    // Stable: a user's events with equal times keep their generated order.
    all.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let expected = per_user
        .iter()
        .flat_map(|(user, events)| model_sessions(user, events, 30_000))
        .collect();
    let lines = all.iter().map(|(t, u, k)| event(u, k, *t)).collect();
    (lines, expected)
}
