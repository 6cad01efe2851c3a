//! Embedding models behind one trait, and the retry policy around them.
//!
//! The processor holds an `Arc` of the retrying embedder: every task (processor clone)
//! shares one model and, for HTTP, one connection pool. A batch is embedded
//! in a runtime job, off the processing thread (`--embed-workers` at once);
//! the commit waits for it, which keeps a batch's rows and the state change
//! that removes its edits in the same commit.

mod local;
mod openai;
mod retry;

use std::sync::Arc;

pub use local::HashingEmbedder;
pub use openai::OpenAiEmbedder;
pub use retry::Retrying;

use crate::settings::{EmbedderKind, Settings};

/// Turns texts into vectors: one vector per text, in the same order.
pub trait Embedder: Send + Sync {
    /// Embeds `texts` in one request.
    fn embed(&self, texts: &[String]) -> anyhow::Result<Vec<Vec<f32>>>;
}

/// The embedder the flags select, wrapped in the retry policy.
pub fn from_settings(settings: &Settings) -> anyhow::Result<Arc<Retrying<Box<dyn Embedder>>>> {
    let embedder: Box<dyn Embedder> = match settings.embedder {
        EmbedderKind::Local => {
            Box::new(HashingEmbedder::new(settings.embedding_dimensions as usize))
        }
        EmbedderKind::Openai => Box::new(OpenAiEmbedder::new(
            &settings.embedder_url,
            &settings.embedder_model,
            settings.embedder_api_key.as_deref(),
            settings.embedder_timeout.as_std(),
        )?),
    };
    Ok(Arc::new(Retrying::new(embedder)))
}

impl Embedder for Box<dyn Embedder> {
    fn embed(&self, texts: &[String]) -> anyhow::Result<Vec<Vec<f32>>> {
        self.as_ref().embed(texts)
    }
}
