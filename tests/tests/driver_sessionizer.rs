//! sessionizer's rules on the broker-free test driver.

use e2e_tests::driver::{driver, lines, pipe_all, settings, settle};
use e2e_tests::fixture;
use sessionizer::Settings;

#[test]
fn fixture_gives_the_expected_sessions() {
    let settings: Settings = settings("sessionizer", &[]);
    let mut driver = driver(sessionizer::pipeline(settings), 1);
    pipe_all(
        &mut driver,
        "user-events",
        &fixture("sessionizer/user-events.jsonl"),
    );
    settle(&mut driver);
    assert_eq!(
        lines(&driver, "user-sessions"),
        fixture("sessionizer/user-sessions.expected.jsonl")
    );
}
