//! embed-batcher: article edits are buffered per tenant and embedded in
//! batches, one request per batch, once the watermark says no older edit can
//! still arrive. See docs/services/embed-batcher.md.

mod batching;
pub mod embedder;
mod model;
pub mod processor;
pub mod settings;

pub use processor::pipeline;
pub use settings::Settings;
