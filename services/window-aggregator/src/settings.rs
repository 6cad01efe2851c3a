//! Flags of window-aggregator (meaning and defaults:
//! docs/services/window-aggregator.md).

use clap::{Parser, ValueEnum};
use streams_runtime::{HumanDuration, RuntimeArgs};

#[derive(Debug, Parser)]
#[command(name = "window-aggregator", version, about)]
pub struct Settings {
    /// Length of each hopping window.
    #[arg(long, env = "WINDOW_SIZE", default_value = "2s")]
    pub window_size: HumanDuration,

    /// Distance between the starts of consecutive windows (at most the size).
    #[arg(long, env = "WINDOW_ADVANCE", default_value = "1s")]
    pub window_advance: HumanDuration,

    /// How far behind the largest event time a partition's watermark stays.
    #[arg(long, env = "MAX_OUT_OF_ORDERNESS", default_value = "0s")]
    pub max_out_of_orderness: HumanDuration,

    /// Aggregate per value of this field instead of over the whole stream.
    #[arg(long, env = "GROUP_BY", value_enum)]
    pub group_by: Option<GroupField>,

    /// With `--group-by`, sum each partial task's orders per window and group
    /// before the shuffle (one record per window, group and task instead of
    /// one per order and window): fewer records when groups repeat within a
    /// window, at the cost of state work on every order when they do not.
    #[arg(long, env = "PRE_AGGREGATE")]
    pub pre_aggregate: bool,

    /// Marketplace orders topic.
    #[arg(long, env = "INPUT_TOPIC", default_value = "orders-marketplace")]
    pub input_topic: String,

    /// Output topic.
    #[arg(long, env = "OUTPUT_TOPIC", default_value = "order-window-counts")]
    pub output_topic: String,

    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

/// A string field of an order that windows can be grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GroupField {
    #[value(name = "customer_id")]
    Customer,
    #[value(name = "product_id")]
    Product,
    #[value(name = "order_id")]
    Order,
}

/// Window shape in milliseconds, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowShape {
    pub size: i64,
    pub advance: i64,
}

impl Settings {
    /// The window shape, or why the flags do not describe one.
    pub fn window_shape(&self) -> anyhow::Result<WindowShape> {
        let size = self.window_size.as_millis_i64();
        let advance = self.window_advance.as_millis_i64();
        anyhow::ensure!(size > 0, "--window-size must be at least 1ms");
        anyhow::ensure!(advance > 0, "--window-advance must be at least 1ms");
        anyhow::ensure!(
            advance <= size,
            "--window-advance ({advance}ms) must not exceed --window-size ({size}ms): \
             records between windows would belong to none"
        );
        Ok(WindowShape { size, advance })
    }
}
