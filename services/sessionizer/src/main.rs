//! sessionizer: the seed's absence-detection PTF as a service — a session per
//! user that ends on LOGOUT (COMPLETED) or after inactivity (TIMEOUT).

mod model;
mod processor;
mod settings;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let settings = settings::Settings::parse();
    let processor = processor::Sessionizer::new(&settings);
    match processor::topology(&settings) {
        Ok(topology) => streams_runtime::run(settings.runtime, topology, processor),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
