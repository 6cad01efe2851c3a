//! sensor-fusion: joins temperature and humidity readings per machine and
//! decides, per tumbling window, whether the machine needs maintenance. See
//! docs/services/sensor-fusion.md.

mod median;
mod model;
mod processor;
mod settings;

fn main() -> std::process::ExitCode {
    streams_runtime::service_main(processor::pipeline)
}
