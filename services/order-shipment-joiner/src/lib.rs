//! order-shipment-joiner: an interval join of orders and shipments (a
//! shipment within 7 days of its order), as a service. See
//! docs/services/order-shipment-joiner.md.

mod model;
pub mod processor;
pub mod settings;
mod timestamp;

pub use processor::pipeline;
pub use settings::Settings;
