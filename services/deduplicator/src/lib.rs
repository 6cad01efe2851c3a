//! deduplicator: the first click of each `click_id` goes through, repeats
//! within `--ttl` of event time are dropped. See docs/services/deduplicator.md.

mod model;
pub mod processor;
pub mod settings;

pub use processor::pipeline;
pub use settings::Settings;
