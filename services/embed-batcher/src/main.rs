//! embed-batcher: the seed's `EMBED_IN_BATCHES` PTF as a service — article
//! edits are buffered per tenant and embedded in batches, one request per
//! batch, once the watermark says no older edit can still arrive.

mod batching;
mod embedder;
mod model;
mod processor;
mod settings;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let settings = settings::Settings::parse();
    let built = embedder::from_settings(&settings).and_then(|embedder| {
        let processor = processor::EmbedBatcher::new(&settings, embedder);
        Ok((processor::topology(&settings)?, processor))
    });
    match built {
        Ok((topology, processor)) => streams_runtime::run(settings.runtime, topology, processor),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
