//! Flags of sensor-fusion (meaning and defaults: docs/services/sensor-fusion.md).

use clap::{Parser, ValueEnum};
use streams_runtime::{HumanDuration, RuntimeArgs};

/// When a machine's window is emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EmitMode {
    /// Once the task watermark reaches the window end: correct whatever the
    /// interleaving of the two streams.
    Watermark,
    /// When a reading of another window arrives (depends on arrival order).
    Rollover,
}

#[derive(Debug, Parser)]
#[command(name = "sensor-fusion", version, about)]
pub struct Settings {
    /// Length of the tumbling windows.
    #[arg(long, env = "WINDOW_INTERVAL", default_value = "5m")]
    pub window_interval: HumanDuration,

    /// A window needs maintenance when its median temperature is above this…
    #[arg(long, env = "TEMPERATURE_THRESHOLD", default_value_t = 75.0)]
    pub temperature_threshold: f64,

    /// …and its median humidity is above this.
    #[arg(long, env = "HUMIDITY_THRESHOLD", default_value_t = 80.0)]
    pub humidity_threshold: f64,

    /// How far behind the largest event time a partition's watermark stays.
    #[arg(long, env = "MAX_OUT_OF_ORDERNESS", default_value = "0s")]
    pub max_out_of_orderness: HumanDuration,

    /// When windows are emitted.
    #[arg(long, env = "EMIT", value_enum, default_value = "watermark")]
    pub emit: EmitMode,

    /// Temperature readings topic.
    #[arg(
        long,
        env = "TEMPERATURE_TOPIC",
        default_value = "temperature-readings"
    )]
    pub temperature_topic: String,

    /// Humidity readings topic.
    #[arg(long, env = "HUMIDITY_TOPIC", default_value = "humidity-readings")]
    pub humidity_topic: String,

    /// Output topic.
    #[arg(long, env = "OUTPUT_TOPIC", default_value = "machine-maintenance")]
    pub output_topic: String,

    #[command(flatten)]
    pub runtime: RuntimeArgs,
}
