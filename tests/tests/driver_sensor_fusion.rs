//! sensor-fusion's rules on the broker-free test driver.

use e2e_tests::driver::{driver, lines, pipe_all, settings, settle};
use e2e_tests::fixture;
use sensor_fusion::Settings;

#[test]
fn fixture_gives_the_expected_verdicts() {
    let settings: Settings = settings("sensor-fusion", &[]);
    let mut driver = driver(sensor_fusion::pipeline(settings), 1);
    pipe_all(
        &mut driver,
        "temperature-readings",
        &fixture("sensor-fusion/temperature-readings.jsonl"),
    );
    pipe_all(
        &mut driver,
        "humidity-readings",
        &fixture("sensor-fusion/humidity-readings.jsonl"),
    );
    settle(&mut driver);
    assert_eq!(
        lines(&driver, "machine-maintenance"),
        fixture("sensor-fusion/machine-maintenance.expected.jsonl")
    );
}
