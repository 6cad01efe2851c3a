//! order-shipment-joiner: an interval join of orders and shipments (a
//! shipment within 7 days of its order), as a service. See
//! docs/services/order-shipment-joiner.md.

mod model;
mod processor;
mod settings;
mod timestamp;

fn main() -> std::process::ExitCode {
    streams_runtime::service_main(processor::pipeline)
}
