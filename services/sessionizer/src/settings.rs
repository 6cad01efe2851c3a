//! Flags of sessionizer (meaning and defaults: docs/services/sessionizer.md).
//! `--idle-timeout` comes with the common runtime flags.

use clap::Parser;
use streams_runtime::{HumanDuration, RuntimeArgs};

#[derive(Debug, Parser)]
#[command(name = "sessionizer", version, about)]
pub struct Settings {
    /// A session ends after this much event time without an event.
    #[arg(long, env = "SESSION_TIMEOUT", default_value = "30s")]
    pub session_timeout: HumanDuration,

    /// How far behind the largest event time a partition's watermark stays.
    #[arg(long, env = "MAX_OUT_OF_ORDERNESS", default_value = "0s")]
    pub max_out_of_orderness: HumanDuration,

    /// User events topic.
    #[arg(long, env = "INPUT_TOPIC", default_value = "user-events")]
    pub input_topic: String,

    /// Output topic.
    #[arg(long, env = "OUTPUT_TOPIC", default_value = "user-sessions")]
    pub output_topic: String,

    #[command(flatten)]
    pub runtime: RuntimeArgs,
}
