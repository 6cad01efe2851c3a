//! `--embedder local` (the default): a sentence-transformers BERT model,
//! all-MiniLM-L6-v2 unless `--model-dir` points at another, run in-process
//! on the CPU.
//!
//! It computes what sentence-transformers computes for such a folder
//! (`Transformer` → `Pooling` (mean) → `Normalize`):
//!
//! 1. The texts of a batch are tokenized with the folder's `tokenizer.json`,
//!    truncated to `max_seq_length` tokens counting `[CLS]` and `[SEP]` (from
//!    `sentence_bert_config.json`, 256 for all-MiniLM-L6-v2; the tokenizer
//!    file's own truncation at 128 and fixed padding are replaced).
//! 2. The BERT encoder over the batch's tokens (`bert`: no padding, each
//!    text attends to its own tokens only).
//! 3. Mean pooling: the token vectors of the last layer averaged.
//! 4. L2 normalisation, so cosine similarity is a dot product.
//!
//! The model computes on a thread pool of its own (`--model-threads`
//! threads), which the tokenizer uses too, one batch at a time: a batch
//! already keeps every thread of the pool busy, so a second one at the same
//! time would only share the same cores and double the working memory. The
//! other threads that ask for embeddings (`--embed-workers`) wait their turn.
//!
//! The folder is checked when the model is loaded (the service refuses to
//! start on a missing, corrupt or non-BERT folder), and one text is embedded
//! then, so a bad folder cannot fail later on the processing thread.

mod bert;
mod kernels;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use anyhow::Context as _;
use serde::Deserialize;
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use self::bert::{Bert, Config, Tokens, Workspace};
use super::Embedder;

/// `max_seq_length` of a folder without `sentence_bert_config.json`.
const DEFAULT_MAX_SEQ_LENGTH: usize = 256;

/// The files of a model folder, as sentence-transformers lays them out.
const CONFIG: &str = "config.json";
const TOKENIZER: &str = "tokenizer.json";
const WEIGHTS: &str = "model.safetensors";
const POOLING: &str = "1_Pooling/config.json";
const SENTENCE_BERT: &str = "sentence_bert_config.json";

/// A BERT sentence-embedding model, loaded and checked.
pub struct LocalModel {
    dir: PathBuf,
    bert: Bert,
    tokenizer: Tokenizer,
    pool: rayon::ThreadPool,
    /// The encoder's buffers; held by the batch being embedded.
    workspace: Mutex<Workspace>,
    dimensions: usize,
    max_seq_length: usize,
    threads: usize,
}

impl std::fmt::Debug for LocalModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalModel")
            .field("dir", &self.dir)
            .field("dimensions", &self.dimensions)
            .field("max_seq_length", &self.max_seq_length)
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

/// The keys of `config.json` that say which architecture it is.
#[derive(Deserialize)]
struct ModelKind {
    model_type: Option<String>,
    #[serde(default)]
    architectures: Vec<String>,
}

/// `1_Pooling/config.json` (sentence-transformers' `Pooling` module).
#[derive(Deserialize)]
struct PoolingConfig {
    word_embedding_dimension: Option<usize>,
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
}

/// `sentence_bert_config.json` (sentence-transformers' `Transformer` module).
#[derive(Deserialize)]
struct SentenceBertConfig {
    max_seq_length: Option<usize>,
}

/// Reads and parses the JSON file `name` of `dir`.
fn read_json<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> anyhow::Result<T> {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not valid", path.display()))
}

impl LocalModel {
    /// Loads the model folder `dir` (see the module docs), computing with
    /// `threads` threads, and embeds one text to prove it works.
    pub fn load(dir: &Path, threads: usize) -> anyhow::Result<Self> {
        let started = Instant::now();
        let model = Self::load_unchecked(dir, threads)
            .with_context(|| format!("model folder {}", dir.display()))?;
        let probe = model
            .embed_texts(&["Is this model working?".to_string()])
            .with_context(|| format!("model folder {}: a test embedding failed", dir.display()))?;
        anyhow::ensure!(
            probe.len() == 1
                && probe[0].len() == model.dimensions
                && probe[0].iter().all(|x| x.is_finite()),
            "model folder {}: a test embedding is not {} finite numbers",
            dir.display(),
            model.dimensions
        );
        tracing::info!(
            dir = %dir.display(),
            dimensions = model.dimensions,
            max_seq_length = model.max_seq_length,
            threads = model.threads,
            "local model loaded in {:.1?}",
            started.elapsed()
        );
        Ok(model)
    }

    fn load_unchecked(dir: &Path, threads: usize) -> anyhow::Result<Self> {
        anyhow::ensure!(
            dir.is_dir(),
            "no such folder: run `make models` (deploy/local/models.sh) to fetch \
             all-MiniLM-L6-v2, or point --model-dir (MODEL_DIR) at a \
             sentence-transformers BERT folder"
        );
        let kind: ModelKind = read_json(dir, CONFIG)?;
        let is_bert = kind.model_type.as_deref() == Some("bert")
            || (kind.model_type.is_none()
                && kind.architectures.iter().any(|a| a.starts_with("Bert")));
        anyhow::ensure!(
            is_bert,
            "{CONFIG}: not a BERT model (model_type {:?}, architectures {:?}); \
             only BERT sentence-transformers models run locally",
            kind.model_type.unwrap_or_default(),
            kind.architectures
        );
        let config: Config = read_json(dir, CONFIG)?;
        let dimensions = config.hidden_size;

        if dir.join(POOLING).exists() {
            let pooling: PoolingConfig = read_json(dir, POOLING)?;
            let mean_only = pooling.pooling_mode_mean_tokens
                && !pooling.pooling_mode_cls_token
                && !pooling.pooling_mode_max_tokens
                && !pooling.pooling_mode_mean_sqrt_len_tokens
                && !pooling.pooling_mode_weightedmean_tokens
                && !pooling.pooling_mode_lasttoken;
            anyhow::ensure!(mean_only, "{POOLING}: only mean pooling is supported");
            if let Some(width) = pooling.word_embedding_dimension {
                anyhow::ensure!(
                    width == dimensions,
                    "{POOLING}: word_embedding_dimension {width} is not the model's hidden_size {dimensions}"
                );
            }
        }
        let max_seq_length = if dir.join(SENTENCE_BERT).exists() {
            let sbert: SentenceBertConfig = read_json(dir, SENTENCE_BERT)?;
            sbert.max_seq_length.unwrap_or(DEFAULT_MAX_SEQ_LENGTH)
        } else {
            DEFAULT_MAX_SEQ_LENGTH
        }
        .min(config.max_position_embeddings);
        anyhow::ensure!(
            max_seq_length >= 2,
            "max_seq_length {max_seq_length} is too short"
        );

        let tokenizer = Self::tokenizer(dir, max_seq_length, config.vocab_size)?;

        let bert = Bert::load(&dir.join(WEIGHTS), &config)?;
        let threads = threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("model-{i}"))
            .build()
            .context("starting the model's threads")?;
        Ok(LocalModel {
            dir: dir.to_path_buf(),
            bert,
            tokenizer,
            pool,
            workspace: Mutex::default(),
            dimensions,
            max_seq_length,
            threads,
        })
    }

    /// The folder's tokenizer, truncating at `max_seq_length` tokens (what
    /// sentence-transformers asks of it) and not padding (the encoder needs
    /// no padding), whatever `tokenizer.json` says.
    fn tokenizer(
        dir: &Path,
        max_seq_length: usize,
        vocab_size: usize,
    ) -> anyhow::Result<Tokenizer> {
        let path = dir.join(TOKENIZER);
        anyhow::ensure!(path.is_file(), "{}: no such file", path.display());
        let mut tokenizer = Tokenizer::from_file(&path)
            .map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?;
        let tokens = tokenizer.get_vocab_size(true);
        anyhow::ensure!(
            tokens <= vocab_size,
            "{TOKENIZER} has {tokens} tokens, more than the model's vocab_size {vocab_size}"
        );
        tokenizer
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: max_seq_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|error| anyhow::anyhow!("{TOKENIZER}: {error}"))?;
        tokenizer.with_padding(None);
        Ok(tokenizer)
    }

    /// The folder the model was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The length of its vectors (the model's hidden size: 384).
    pub fn dimensions(&self) -> usize {
        self.dimensions
    }

    /// Tokens per text at most, `[CLS]` and `[SEP]` included; the rest of a
    /// longer text is cut off.
    pub fn max_seq_length(&self) -> usize {
        self.max_seq_length
    }

    /// Threads it computes with.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The token ids the model sees of `text`: truncated, `[CLS]` and
    /// `[SEP]` included.
    pub fn token_ids(&self, text: &str) -> anyhow::Result<Vec<u32>> {
        let encoding = self
            .tokenizer
            .encode(text, true)
            .map_err(|error| anyhow::anyhow!("tokenizing: {error}"))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The unit vectors of `texts`, in order.
    pub fn embed_texts(&self, texts: &[String]) -> anyhow::Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        // Taken before entering the pool, never inside it: a pool thread
        // waiting for a lock could be the very thread holding it (rayon
        // threads pick up other jobs while they wait for their own), and the
        // pool would deadlock. The buffers are overwritten by every batch, so
        // a panic in another one leaves nothing to distrust.
        let mut guard = self
            .workspace
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let workspace: &mut Workspace = &mut guard;
        self.pool.install(|| {
            let inputs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let encodings = self
                .tokenizer
                .encode_batch(inputs, true)
                .map_err(|error| anyhow::anyhow!("tokenizing: {error}"))?;
            let tokens: Vec<Tokens<'_>> = encodings
                .iter()
                .map(|encoding| Tokens {
                    ids: encoding.get_ids(),
                    type_ids: encoding.get_type_ids(),
                })
                .collect();
            self.bert.embed(&tokens, workspace)
        })
    }
}

impl Embedder for LocalModel {
    fn embed(&self, texts: &[String]) -> anyhow::Result<Vec<Vec<f32>>> {
        self.embed_texts(texts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_folder_is_one_clear_error() {
        let error = LocalModel::load(Path::new("/nonexistent/model"), 1).unwrap_err();
        let message = format!("{error:#}");
        assert!(message.contains("/nonexistent/model"), "{message}");
        assert!(message.contains("make models"), "{message}");
        assert!(!message.contains('\n'), "{message}");
    }

    #[test]
    fn a_folder_of_another_architecture_is_refused() {
        let dir = std::env::temp_dir().join(format!("embed-batcher-gpt2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(CONFIG),
            r#"{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}"#,
        )
        .unwrap();
        let error = LocalModel::load(&dir, 1).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            format!("{error:#}").contains("not a BERT model"),
            "{error:#}"
        );
    }
}
