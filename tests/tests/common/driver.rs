//! Helpers for the broker-free driver tests (`tests/driver_*.rs`), which run
//! a service's own pipeline through [`streams_runtime::testing::TestDriver`].

use std::time::Duration;

use serde_json::Value;
use streams_runtime::testing::TestDriver;
use streams_runtime::Pipeline;

/// A driver over `pipeline` whose input topics have `partitions` partitions.
pub fn driver(pipeline: anyhow::Result<Pipeline>, partitions: usize) -> TestDriver {
    TestDriver::builder(pipeline.expect("pipeline"))
        .partitions(partitions)
        .build()
        .expect("driver")
}

/// Parses a service's flags (the binary name first is added here).
pub fn settings<S: clap::Parser>(binary: &str, flags: &[&str]) -> S {
    S::try_parse_from(std::iter::once(binary).chain(flags.iter().copied()))
        .unwrap_or_else(|e| panic!("flags {flags:?}: {e}"))
}

/// Pipes fixture-shaped lines (`{"key": ..., "value": {...}}`) to `topic`.
pub fn pipe_all(driver: &mut TestDriver, topic: &str, lines: &[Value]) {
    for line in lines {
        driver
            .pipe(topic, line["key"].as_str(), line["value"].clone())
            .unwrap_or_else(|e| panic!("piping {line} to {topic}: {e:#}"));
    }
}

/// Lets every merge wait run out (`--max-task-idle`, 1 s by default) and
/// commits, so that later stages also act on the final watermarks.
pub fn settle(driver: &mut TestDriver) {
    driver
        .advance_time(Duration::from_secs(2))
        .expect("advance time");
    driver.commit().expect("commit");
}

/// Every record of `topic` as a fixture line, `{"key": ..., "value": ...}`.
pub fn lines(driver: &TestDriver, topic: &str) -> Vec<Value> {
    driver
        .read(topic)
        .expect("read")
        .iter()
        .map(|record| record.to_json())
        .collect()
}
