//! order-shipment-joiner's rules on the broker-free test driver.

use e2e_tests::driver::{driver, lines, pipe_all, settings, settle};
use e2e_tests::{fixture, sorted};
use order_shipment_joiner::Settings;

#[test]
fn fixture_gives_the_expected_joins() {
    let settings: Settings = settings("order-shipment-joiner", &[]);
    let mut driver = driver(order_shipment_joiner::pipeline(settings), 1);
    pipe_all(
        &mut driver,
        "orders",
        &fixture("order-shipment-joiner/orders.jsonl"),
    );
    pipe_all(
        &mut driver,
        "shipments",
        &fixture("order-shipment-joiner/shipments.jsonl"),
    );
    settle(&mut driver);
    assert_eq!(
        sorted(lines(&driver, "shipped-orders")),
        sorted(fixture(
            "order-shipment-joiner/shipped-orders.expected.jsonl"
        ))
    );
}
