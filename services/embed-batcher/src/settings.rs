//! Flags of embed-batcher (meaning and defaults: docs/services/embed-batcher.md).
//! `--idle-timeout` comes with the common runtime flags.

use clap::{Parser, ValueEnum};
use streams_runtime::{HumanDuration, RuntimeArgs};

/// Which embedding model turns article text into vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EmbedderKind {
    /// In-process feature hashing: deterministic, no network, no model files.
    Local,
    /// An OpenAI-compatible `POST {url}/v1/embeddings` endpoint (OpenAI,
    /// Ollama, vLLM, TEI).
    Openai,
}

#[derive(Debug, Parser)]
#[command(name = "embed-batcher", version, about)]
pub struct Settings {
    /// Edits per embedding request; a tenant's batch goes out once this many
    /// of its edits are safe.
    #[arg(long, env = "BATCH_SIZE", default_value = "50",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: u32,

    /// Event time an edit may wait for a full batch before a smaller batch goes.
    #[arg(long, env = "MAX_WAIT", default_value = "30s")]
    pub max_wait: HumanDuration,

    /// How far behind the largest event time a partition's watermark stays.
    #[arg(long, env = "MAX_OUT_OF_ORDERNESS", default_value = "5s")]
    pub max_out_of_orderness: HumanDuration,

    /// A pending edit not written for this long (wall clock) is dropped.
    #[arg(long, env = "STATE_TTL", default_value = "7d")]
    pub state_ttl: HumanDuration,

    /// Articles topic.
    #[arg(long, env = "INPUT_TOPIC", default_value = "articles")]
    pub input_topic: String,

    /// Output topic.
    #[arg(long, env = "OUTPUT_TOPIC", default_value = "article-embeddings")]
    pub output_topic: String,

    /// Embedding model.
    #[arg(long, env = "EMBEDDER", value_enum, default_value = "local")]
    pub embedder: EmbedderKind,

    /// Base URL of the OpenAI-compatible endpoint (`/v1/embeddings` is appended).
    #[arg(long, env = "EMBEDDER_URL", default_value = "https://api.openai.com")]
    pub embedder_url: String,

    /// Model name sent to the OpenAI-compatible endpoint.
    #[arg(long, env = "EMBEDDER_MODEL", default_value = "text-embedding-3-small")]
    pub embedder_model: String,

    /// Bearer token for the OpenAI-compatible endpoint (none if unset).
    #[arg(long, env = "EMBEDDER_API_KEY", hide_env_values = true)]
    pub embedder_api_key: Option<String>,

    /// Vector length of the local model.
    #[arg(long, env = "EMBEDDING_DIMENSIONS", default_value = "384",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub embedding_dimensions: u32,

    /// Batches embedded at once, off the processing thread (for the
    /// OpenAI-compatible embedder: concurrent requests). Records keep being
    /// processed while batches are embedded.
    #[arg(long, env = "EMBED_WORKERS", default_value = "2",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub embed_workers: u32,

    /// Timeout of one embedding request (a timed-out request is retried).
    #[arg(long, env = "EMBEDDER_TIMEOUT", default_value = "60s")]
    pub embedder_timeout: HumanDuration,

    #[command(flatten)]
    pub runtime: RuntimeArgs,
}
