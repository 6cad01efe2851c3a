//! sessionizer: one session per user, ending on LOGOUT (COMPLETED) or after
//! inactivity (TIMEOUT). See docs/services/sessionizer.md.

mod model;
pub mod processor;
pub mod settings;

pub use processor::pipeline;
pub use settings::Settings;
