//! What the benchmark tools share (`loadgen` and `rawcopy`): the use cases and
//! their input records, the generators that make realistic input, the Kafka
//! and schema-registry plumbing, and measurements read from `/proc`.
//!
//! See `BENCHMARKS.md` for how the benchmark runs and what it measures.

pub mod generate;
pub mod kafka;
pub mod pauses;
pub mod procfs;
pub mod read_all;
pub mod records;

use clap::ValueEnum;

/// A benchmarked use case: one service and the inputs it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UseCase {
    /// `sessionizer`: user events.
    Sessionizer,
    /// `order-shipment-joiner`: orders, then shipments.
    OrderShipmentJoiner,
    /// `sensor-fusion`: temperature readings, then humidity readings.
    SensorFusion,
    /// `window-aggregator` (global windows): marketplace orders.
    WindowAggregator,
}

/// The shape of a use case's input. `bench/run.py` gives each shape its
/// service flags too; bench/README.md has the table of what each shape is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Shape {
    /// The benchmark's original input: few outputs per input for every use
    /// case but the joiner.
    #[default]
    Base,
    /// About one output per input.
    OutputHeavy,
}

impl UseCase {
    /// The Avro schema of each input, in the order the tools take the topics.
    pub fn input_schemas(self) -> &'static [&'static str] {
        match self {
            UseCase::Sessionizer => &[topic_schemas::USER_EVENTS],
            UseCase::OrderShipmentJoiner => &[topic_schemas::ORDERS, topic_schemas::SHIPMENTS],
            UseCase::SensorFusion => &[
                topic_schemas::TEMPERATURE_READINGS,
                topic_schemas::HUMIDITY_READINGS,
            ],
            UseCase::WindowAggregator => &[topic_schemas::ORDERS_MARKETPLACE],
        }
    }

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            UseCase::Sessionizer => "sessionizer",
            UseCase::OrderShipmentJoiner => "order-shipment-joiner",
            UseCase::SensorFusion => "sensor-fusion",
            UseCase::WindowAggregator => "window-aggregator",
        }
    }
}
