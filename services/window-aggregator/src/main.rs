//! window-aggregator: the seed's hopping-window aggregation (Flink Table API
//! `HOP`) as a service — order counts and price statistics per window, over
//! the whole stream or per group.
//!
//! Two stages (see `stages.rs`): each task pre-aggregates its partitions'
//! windows, and a final stage combines the partial aggregates once every
//! input partition's watermark has passed a window's end.

mod accumulator;
mod exact_sum;
mod model;
mod open_windows;
mod settings;
mod stages;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let settings = settings::Settings::parse();
    match stages::pipeline(settings) {
        Ok(pipeline) => pipeline.run(),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
