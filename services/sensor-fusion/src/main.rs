//! sensor-fusion: joins temperature and humidity readings per machine and
//! decides, per tumbling window, whether the machine needs maintenance.

mod median;
mod model;
mod processor;
mod settings;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let settings = settings::Settings::parse();
    let processor = processor::SensorFusion::new(&settings);
    match processor::topology(&settings) {
        Ok(topology) => streams_runtime::run(settings.runtime, topology, processor),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
