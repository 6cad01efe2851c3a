//! The `embed-batcher` binary: flags in, service running (see the library).

fn main() -> std::process::ExitCode {
    streams_runtime::service_main(embed_batcher::pipeline)
}
