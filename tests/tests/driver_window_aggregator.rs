//! window-aggregator's rules on the broker-free test driver.

use e2e_tests::driver::{driver, lines, pipe_all, settings, settle};
use e2e_tests::fixture;
use window_aggregator::Settings;

#[test]
fn fixture_gives_the_expected_windows() {
    let settings: Settings = settings("window-aggregator", &[]);
    let mut driver = driver(window_aggregator::pipeline(settings), 1);
    pipe_all(
        &mut driver,
        "orders-marketplace",
        &fixture("window-aggregator/orders-marketplace.jsonl"),
    );
    settle(&mut driver);
    assert_eq!(
        lines(&driver, "order-window-counts"),
        fixture("window-aggregator/order-window-counts.expected.jsonl")
    );
}
