//! sensor-fusion: joins temperature and humidity readings per machine and
//! decides, per tumbling window, whether the machine needs maintenance. See
//! docs/services/sensor-fusion.md.

mod median;
mod model;
pub mod processor;
pub mod settings;

pub use processor::pipeline;
pub use settings::Settings;
