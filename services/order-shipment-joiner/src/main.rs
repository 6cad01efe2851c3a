//! order-shipment-joiner: the seed's Flink SQL interval join of orders and
//! shipments, as a service.

mod model;
mod processor;
mod settings;
mod timestamp;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let settings = settings::Settings::parse();
    let processor = processor::IntervalJoin::new(&settings);
    match processor::topology(&settings) {
        Ok(topology) => streams_runtime::run(settings.runtime, topology, processor),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
