//! Flags of embed-batcher (meaning and defaults: docs/services/embed-batcher.md).
//! `--idle-timeout` comes with the common runtime flags.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use streams_runtime::{HumanDuration, RuntimeArgs};

/// Which embedding model turns article text into vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EmbedderKind {
    /// A sentence-transformers BERT model (all-MiniLM-L6-v2) run in-process
    /// on the CPU, from the files in `--model-dir`.
    Local,
    /// A test stand-in, not for production: feature hashing, deterministic
    /// and needing no files, but carrying no meaning (only shared words and
    /// spellings bring texts close).
    Hashing,
    /// An OpenAI-compatible `POST {url}/v1/embeddings` endpoint (OpenAI,
    /// Ollama, vLLM, TEI).
    Openai,
}

/// Where `deploy/local/models.sh` (`make models`) puts models unless
/// `MODELS_DIR` says otherwise.
pub const DEFAULT_MODELS_DIR: &str = "/var/tmp/streams-models";

/// The folder of the default model inside the models directory.
pub const DEFAULT_MODEL_NAME: &str = "all-MiniLM-L6-v2";

/// The default `--model-dir`: `$MODELS_DIR/all-MiniLM-L6-v2`, with
/// `MODELS_DIR` defaulting to `/var/tmp/streams-models` (where `make models`
/// puts it).
pub fn default_model_dir() -> PathBuf {
    let models = std::env::var_os("MODELS_DIR")
        .filter(|dir| !dir.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_MODELS_DIR), PathBuf::from);
    models.join(DEFAULT_MODEL_NAME)
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

    /// Folder of the local model: a sentence-transformers BERT folder
    /// (config.json, tokenizer.json, model.safetensors, 1_Pooling/).
    /// [default: $MODELS_DIR/all-MiniLM-L6-v2, MODELS_DIR defaulting to
    /// /var/tmp/streams-models, where `make models` puts it]
    #[arg(long, env = "MODEL_DIR")]
    pub model_dir: Option<PathBuf>,

    /// Threads the local model computes with [default: the available cores].
    #[arg(long, env = "MODEL_THREADS",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub model_threads: Option<u32>,

    /// Vector length of the hashing embedder [default: 384]. The local
    /// model's length is its own (384 for all-MiniLM-L6-v2).
    #[arg(long, env = "EMBEDDING_DIMENSIONS",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub embedding_dimensions: Option<u32>,

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

impl Settings {
    /// `--model-dir`, or its default.
    pub fn model_dir(&self) -> PathBuf {
        self.model_dir.clone().unwrap_or_else(default_model_dir)
    }

    /// `--model-threads`, or the available cores.
    pub fn model_threads(&self) -> usize {
        self.model_threads.map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            |threads| threads as usize,
        )
    }
}
