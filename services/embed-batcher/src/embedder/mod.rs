//! Embedding models behind one trait, and the retry policy around them.
//!
//! The processor holds an `Arc` of the retrying embedder: every task (processor clone)
//! shares one model and, for HTTP, one connection pool. A batch is embedded
//! in a runtime job, off the processing thread (`--embed-workers` at once);
//! the commit waits for it, which keeps a batch's rows and the state change
//! that removes its edits in the same commit.

mod hashing;
mod local;
mod openai;
mod retry;

use std::sync::Arc;

pub use hashing::HashingEmbedder;
pub use local::LocalModel;
pub use openai::OpenAiEmbedder;
pub use retry::Retrying;

use crate::settings::{EmbedderKind, Settings};

/// Turns texts into vectors: one vector per text, in the same order.
pub trait Embedder: Send + Sync {
    /// Embeds `texts` in one request.
    fn embed(&self, texts: &[String]) -> anyhow::Result<Vec<Vec<f32>>>;
}

/// Vector length of the hashing embedder without `--embedding-dimensions`.
const HASHING_DIMENSIONS: u32 = 384;

/// The embedder the flags select, wrapped in the retry policy. The local
/// model is loaded and checked here, so a bad model folder stops the
/// service before it joins its group.
pub fn from_settings(settings: &Settings) -> anyhow::Result<Arc<Retrying<Box<dyn Embedder>>>> {
    let embedder: Box<dyn Embedder> = match settings.embedder {
        EmbedderKind::Local => Box::new(local_model(settings)?),
        EmbedderKind::Hashing => Box::new(HashingEmbedder::new(
            settings.embedding_dimensions.unwrap_or(HASHING_DIMENSIONS) as usize,
        )),
        EmbedderKind::Openai => Box::new(OpenAiEmbedder::new(
            &settings.embedder_url,
            &settings.embedder_model,
            settings.embedder_api_key.as_deref(),
            settings.embedder_timeout.as_std(),
        )?),
    };
    Ok(Arc::new(Retrying::new(embedder)))
}

/// The local model of `--model-dir`, computing with `--model-threads`.
fn local_model(settings: &Settings) -> anyhow::Result<LocalModel> {
    let model = LocalModel::load(&settings.model_dir(), settings.model_threads())
        // One line, whatever the libraries' messages hold.
        .map_err(|error| anyhow::anyhow!("{}", format!("{error:#}").replace('\n', " ")))?;
    if let Some(asked) = settings.embedding_dimensions {
        if asked as usize != model.dimensions() {
            tracing::warn!(
                "--embedding-dimensions {asked} is ignored: it sets the hashing embedder's \
                 length, and the local model's vectors have {} numbers",
                model.dimensions()
            );
        }
    }
    Ok(model)
}

impl Embedder for Box<dyn Embedder> {
    fn embed(&self, texts: &[String]) -> anyhow::Result<Vec<Vec<f32>>> {
        self.as_ref().embed(texts)
    }
}
