//! sessionizer: one session per user, ending on LOGOUT (COMPLETED) or after
//! inactivity (TIMEOUT). See docs/services/sessionizer.md.

mod model;
mod processor;
mod settings;

fn main() -> std::process::ExitCode {
    streams_runtime::service_main(processor::pipeline)
}
