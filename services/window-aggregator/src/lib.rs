//! window-aggregator: hopping-window order counts and price statistics per
//! window, over the whole stream or per group. See
//! docs/services/window-aggregator.md.
//!
//! Two stages (see `stages.rs`): each task pre-aggregates its partitions'
//! windows, and a final stage combines the partial aggregates once every
//! input partition's watermark has passed a window's end.

mod accumulator;
mod exact_sum;
mod model;
mod open_windows;
pub mod settings;
pub mod stages;

pub use settings::Settings;
pub use stages::pipeline;
