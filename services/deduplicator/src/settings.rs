//! Flags of deduplicator (meaning and defaults: docs/services/deduplicator.md).

use clap::Parser;
use streams_runtime::{HumanDuration, RuntimeArgs};

#[derive(Debug, Parser)]
#[command(name = "deduplicator", version, about)]
pub struct Settings {
    /// How long, in event time after its first click, a click id is
    /// remembered: repeats within it are dropped.
    #[arg(long, env = "TTL", default_value = "10m")]
    pub ttl: HumanDuration,

    /// How far behind the largest event time a partition's watermark stays.
    #[arg(long, env = "MAX_OUT_OF_ORDERNESS", default_value = "0s")]
    pub max_out_of_orderness: HumanDuration,

    /// Clicks topic.
    #[arg(long, env = "INPUT_TOPIC", default_value = "clicks")]
    pub input_topic: String,

    /// Output topic.
    #[arg(long, env = "OUTPUT_TOPIC", default_value = "unique-clicks")]
    pub output_topic: String,

    #[command(flatten)]
    pub runtime: RuntimeArgs,
}
