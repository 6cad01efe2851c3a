//! The `sensor-fusion` binary: flags in, service running (see the library).

fn main() -> std::process::ExitCode {
    streams_runtime::service_main(sensor_fusion::pipeline)
}
