//! The `deduplicator` binary: flags in, service running (see the library).

streams_runtime::service_allocator!();

fn main() -> std::process::ExitCode {
    streams_runtime::service_main(deduplicator::pipeline)
}
