//! The BERT encoder of a sentence-transformers folder, with its mean pooling
//! and normalisation, on the CPU.
//!
//! The texts of a batch are not padded: their tokens are stacked into one
//! matrix (a row per token), so the linear layers (nearly all of the work)
//! are one matrix product per layer over exactly the batch's tokens, and
//! attention runs per text over that text's own tokens, which needs no
//! attention mask. The result is what the padded, masked computation of
//! sentence-transformers gives, without computing the padding.
//!
//! A pass holds at most `MAX_PASS_TOKENS` tokens (more texts go through in
//! several passes), which bounds the working memory whatever the batch size.
//! The working buffers (`Workspace`) are kept between batches.

use std::path::Path;

use anyhow::Context as _;
use gemm::Parallelism;
use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use super::kernels::{self, matmul, Strides};

/// Tokens per pass at most (a text longer than this is a pass of its own).
/// 4096 tokens of MiniLM take about 50 MiB of buffers, and keep the matrix
/// products large enough to run at full speed.
const MAX_PASS_TOKENS: usize = 4096;

/// Rows per parallel task of the row-wise steps (layer norm, activation).
const ROWS_PER_TASK: usize = 32;

/// The keys of `config.json` the encoder needs (Hugging Face's `BertConfig`).
#[derive(Debug, Deserialize)]
pub(super) struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    pub position_embedding_type: Option<String>,
}

/// The activation between a layer's two feed-forward products.
#[derive(Debug, Clone, Copy)]
enum Activation {
    /// `gelu`: the exact, erf-based GELU.
    Gelu,
    Relu,
}

/// y = x · Wᵀ + b, with W as PyTorch stores it (outputs × inputs).
struct Linear {
    weight: Vec<f32>,
    bias: Vec<f32>,
    inputs: usize,
}

impl Linear {
    fn outputs(&self) -> usize {
        self.bias.len()
    }

    /// `out` (rows × outputs) += `input` (rows × inputs) · Wᵀ.
    fn add_product(&self, input: &[f32], out: &mut [f32], parallelism: Parallelism) {
        let rows = input.len() / self.inputs;
        matmul(
            (rows, self.outputs(), self.inputs),
            out,
            self.outputs(),
            (
                input,
                Strides {
                    row: self.inputs,
                    col: 1,
                },
            ),
            // Wᵀ: element (input i, output j) is W[j][i].
            (
                &self.weight,
                Strides {
                    row: 1,
                    col: self.inputs,
                },
            ),
            1.0,
            true,
            parallelism,
        );
    }
}

struct LayerNorm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    /// Normalises each row of `rows`, in place, in parallel.
    fn apply(&self, rows: &mut [f32]) {
        rows.par_chunks_mut(ROWS_PER_TASK * self.gamma.len())
            .for_each(|chunk| kernels::layer_norm(chunk, &self.gamma, &self.beta, self.eps));
    }
}

struct Layer {
    /// Query, key and value in one product: outputs 0..H are the query,
    /// H..2H the key, 2H..3H the value.
    qkv: Linear,
    attention_output: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

/// The reusable buffers of a pass, grown to the largest pass seen.
#[derive(Default)]
pub(super) struct Workspace {
    /// Tokens × hidden: the input and output of each layer.
    hidden: Vec<f32>,
    /// Tokens × hidden: a layer's sums before their layer norm.
    sums: Vec<f32>,
    /// Tokens × 3·hidden: queries, keys and values.
    qkv: Vec<f32>,
    /// Tokens × hidden: the attention's output, heads side by side.
    context: Vec<f32>,
    /// Tokens × intermediate: the feed-forward's inner activations.
    intermediate: Vec<f32>,
}

/// The first `len` numbers of `buffer`, grown if it is shorter. The contents
/// are whatever the previous pass left: every step overwrites its output.
fn sized(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
    &mut buffer[..len]
}

/// A tokenized text: its token ids and token type ids.
pub(super) struct Tokens<'a> {
    pub ids: &'a [u32],
    pub type_ids: &'a [u32],
}

/// A BERT encoder with its weights.
pub(super) struct Bert {
    word_embeddings: Vec<f32>,
    position_embeddings: Vec<f32>,
    token_type_embeddings: Vec<f32>,
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
    hidden: usize,
    heads: usize,
    max_positions: usize,
    token_types: usize,
    activation: Activation,
}

impl Bert {
    /// Reads the weights of `config` from the safetensors file `path`:
    /// Hugging Face's `BertModel` names, with or without a `bert.` prefix,
    /// in `f32`. Checks every name, shape and type it reads.
    pub(super) fn load(path: &Path, config: &Config) -> anyhow::Result<Self> {
        let activation = match config.hidden_act.as_str() {
            "gelu" => Activation::Gelu,
            "relu" => Activation::Relu,
            other => {
                anyhow::bail!("config.json: hidden_act {other:?} is not supported (gelu or relu)")
            }
        };
        if let Some(kind) = &config.position_embedding_type {
            anyhow::ensure!(
                kind == "absolute",
                "config.json: position_embedding_type {kind:?} is not supported (absolute)"
            );
        }
        let hidden = config.hidden_size;
        anyhow::ensure!(
            config.num_attention_heads > 0 && hidden.is_multiple_of(config.num_attention_heads),
            "config.json: hidden_size {hidden} is not a multiple of num_attention_heads {}",
            config.num_attention_heads
        );

        let bytes = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
        let file = SafeTensors::deserialize(&bytes)
            .map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?;
        let prefix = if file.tensor("embeddings.word_embeddings.weight").is_ok() {
            ""
        } else {
            "bert."
        };
        let tensor = |name: &str, shape: &[usize]| -> anyhow::Result<Vec<f32>> {
            let name = format!("{prefix}{name}");
            let view = file
                .tensor(&name)
                .map_err(|_| anyhow::anyhow!("{}: no tensor {name}", path.display()))?;
            anyhow::ensure!(
                view.shape() == shape,
                "{}: {name} has shape {:?}, not {shape:?}",
                path.display(),
                view.shape()
            );
            anyhow::ensure!(
                view.dtype() == Dtype::F32,
                "{}: {name} is {:?}; only F32 weights are supported",
                path.display(),
                view.dtype()
            );
            Ok(view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect())
        };
        let eps = config.layer_norm_eps as f32;
        let layer_norm = |name: &str| -> anyhow::Result<LayerNorm> {
            Ok(LayerNorm {
                gamma: tensor(&format!("{name}.weight"), &[hidden])?,
                beta: tensor(&format!("{name}.bias"), &[hidden])?,
                eps,
            })
        };
        let linear = |name: &str, inputs: usize, outputs: usize| -> anyhow::Result<Linear> {
            Ok(Linear {
                weight: tensor(&format!("{name}.weight"), &[outputs, inputs])?,
                bias: tensor(&format!("{name}.bias"), &[outputs])?,
                inputs,
            })
        };

        let inner = config.intermediate_size;
        let layers = (0..config.num_hidden_layers)
            .map(|i| -> anyhow::Result<Layer> {
                let at = |name: &str| format!("encoder.layer.{i}.{name}");
                let [query, key, value] = ["query", "key", "value"]
                    .map(|part| linear(&at(&format!("attention.self.{part}")), hidden, hidden));
                let (query, key, value) = (query?, key?, value?);
                Ok(Layer {
                    qkv: Linear {
                        weight: [query.weight, key.weight, value.weight].concat(),
                        bias: [query.bias, key.bias, value.bias].concat(),
                        inputs: hidden,
                    },
                    attention_output: linear(&at("attention.output.dense"), hidden, hidden)?,
                    attention_norm: layer_norm(&at("attention.output.LayerNorm"))?,
                    intermediate: linear(&at("intermediate.dense"), hidden, inner)?,
                    output: linear(&at("output.dense"), inner, hidden)?,
                    output_norm: layer_norm(&at("output.LayerNorm"))?,
                })
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Bert {
            word_embeddings: tensor(
                "embeddings.word_embeddings.weight",
                &[config.vocab_size, hidden],
            )?,
            position_embeddings: tensor(
                "embeddings.position_embeddings.weight",
                &[config.max_position_embeddings, hidden],
            )?,
            token_type_embeddings: tensor(
                "embeddings.token_type_embeddings.weight",
                &[config.type_vocab_size, hidden],
            )?,
            embedding_norm: layer_norm("embeddings.LayerNorm")?,
            layers,
            hidden,
            heads: config.num_attention_heads,
            max_positions: config.max_position_embeddings,
            token_types: config.type_vocab_size,
            activation,
        })
    }

    /// The mean-pooled, L2-normalised vector of each text, in order. Runs on
    /// the current rayon pool, with all of its threads, in `workspace`.
    pub(super) fn embed(
        &self,
        texts: &[Tokens<'_>],
        workspace: &mut Workspace,
    ) -> anyhow::Result<Vec<Vec<f32>>> {
        let vocab = self.word_embeddings.len() / self.hidden;
        for text in texts {
            anyhow::ensure!(
                text.ids.len() == text.type_ids.len() && !text.ids.is_empty(),
                "a text has {} token ids and {} type ids",
                text.ids.len(),
                text.type_ids.len()
            );
            anyhow::ensure!(
                text.ids.len() <= self.max_positions,
                "a text has {} tokens, more than the model's {} positions",
                text.ids.len(),
                self.max_positions
            );
            anyhow::ensure!(
                text.ids.iter().all(|&id| (id as usize) < vocab)
                    && text
                        .type_ids
                        .iter()
                        .all(|&t| (t as usize) < self.token_types),
                "a token id is outside the model's vocabulary"
            );
        }
        let mut vectors = Vec::with_capacity(texts.len());
        let mut rest = texts;
        while !rest.is_empty() {
            let mut count = 1;
            let mut tokens = rest[0].ids.len();
            while count < rest.len() && tokens + rest[count].ids.len() <= MAX_PASS_TOKENS {
                tokens += rest[count].ids.len();
                count += 1;
            }
            let (pass, next) = rest.split_at(count);
            vectors.extend(self.pass(pass, workspace));
            rest = next;
        }
        Ok(vectors)
    }

    /// Encodes `texts` in one pass; see the module docs.
    fn pass(&self, texts: &[Tokens<'_>], workspace: &mut Workspace) -> Vec<Vec<f32>> {
        let h = self.hidden;
        let tokens: usize = texts.iter().map(|t| t.ids.len()).sum();
        let threads = rayon::current_num_threads();
        let parallelism = if threads > 1 {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        };
        let Workspace {
            hidden,
            sums,
            qkv,
            context,
            intermediate,
        } = workspace;

        // Embeddings: word + position + token type, then a layer norm.
        let rows = sized(hidden, tokens * h);
        let mut rows_of_texts = rows.chunks_exact_mut(h);
        for text in texts {
            for (position, (&id, &kind)) in text.ids.iter().zip(text.type_ids).enumerate() {
                let row = rows_of_texts.next().expect("a row per token");
                let word = &self.word_embeddings[id as usize * h..][..h];
                let place = &self.position_embeddings[position * h..][..h];
                let kind = &self.token_type_embeddings[kind as usize * h..][..h];
                for (((x, w), p), k) in row.iter_mut().zip(word).zip(place).zip(kind) {
                    *x = w + p + k;
                }
            }
        }
        self.embedding_norm.apply(rows);

        for layer in &self.layers {
            // Self-attention, its output projection, the residual and a layer norm.
            let input = sized(hidden, tokens * h);
            let queries_keys_values = sized(qkv, tokens * 3 * h);
            fill_rows(queries_keys_values, &layer.qkv.bias);
            layer
                .qkv
                .add_product(input, queries_keys_values, parallelism);
            let heads = sized(context, tokens * h);
            self.attention(texts, queries_keys_values, heads);
            let attended = sized(sums, tokens * h);
            add_rows(attended, input, &layer.attention_output.bias);
            layer
                .attention_output
                .add_product(heads, attended, parallelism);
            layer.attention_norm.apply(attended);
            std::mem::swap(hidden, sums);

            // The feed-forward block, its residual and a layer norm.
            let input = sized(hidden, tokens * h);
            let inner = sized(intermediate, tokens * layer.intermediate.outputs());
            fill_rows(inner, &layer.intermediate.bias);
            layer.intermediate.add_product(input, inner, parallelism);
            let activation = self.activation;
            inner
                .par_chunks_mut(ROWS_PER_TASK * layer.intermediate.outputs())
                .for_each(|chunk| match activation {
                    Activation::Gelu => kernels::gelu(chunk),
                    Activation::Relu => kernels::relu(chunk),
                });
            let output = sized(sums, tokens * h);
            add_rows(output, input, &layer.output.bias);
            layer.output.add_product(inner, output, parallelism);
            layer.output_norm.apply(output);
            std::mem::swap(hidden, sums);
        }

        // Mean pooling over each text's tokens, then L2 normalisation
        // (sentence-transformers' `Pooling` and `Normalize`).
        let rows = &hidden[..tokens * h];
        let mut start = 0;
        texts
            .iter()
            .map(|text| {
                let end = start + text.ids.len() * h;
                let mut mean = vec![0f32; h];
                for row in rows[start..end].chunks_exact(h) {
                    for (m, x) in mean.iter_mut().zip(row) {
                        *m += x;
                    }
                }
                start = end;
                let count = text.ids.len() as f32;
                mean.iter_mut().for_each(|m| *m /= count);
                let norm = mean.iter().map(|m| m * m).sum::<f32>().sqrt().max(1e-12);
                mean.iter_mut().for_each(|m| *m /= norm);
                mean
            })
            .collect()
    }

    /// Scaled dot-product attention of each text over its own tokens, each
    /// head in turn; texts in parallel. `qkv` holds a row of queries, keys and
    /// values per token; the heads' outputs go side by side into `context`.
    fn attention(&self, texts: &[Tokens<'_>], qkv: &[f32], context: &mut [f32]) {
        let h = self.hidden;
        let width = h / self.heads;
        let scale = 1.0 / (width as f32).sqrt();
        // Each text's rows of `context`, and where its rows of `qkv` start.
        let mut parts = Vec::with_capacity(texts.len());
        let mut rest = context;
        let mut first_row = 0;
        for text in texts {
            let (part, next) = rest.split_at_mut(text.ids.len() * h);
            parts.push((first_row, part));
            first_row += text.ids.len();
            rest = next;
        }
        parts
            .into_par_iter()
            .for_each_init(Vec::new, |scores, (first_row, out)| {
                let len = out.len() / h;
                let rows = &qkv[first_row * 3 * h..(first_row + len) * 3 * h];
                let scores = sized(scores, len * len);
                for head in 0..self.heads {
                    let query = &rows[head * width..];
                    let key = &rows[h + head * width..];
                    let value = &rows[2 * h + head * width..];
                    // scores = scale · Q · Kᵀ (Kᵀ: element (d, j) is key j's d).
                    matmul(
                        (len, len, width),
                        scores,
                        len,
                        (query, Strides { row: 3 * h, col: 1 }),
                        (key, Strides { row: 1, col: 3 * h }),
                        scale,
                        false,
                        Parallelism::None,
                    );
                    kernels::softmax(scores, len);
                    matmul(
                        (len, width, len),
                        &mut out[head * width..],
                        h,
                        (scores, Strides { row: len, col: 1 }),
                        (value, Strides { row: 3 * h, col: 1 }),
                        1.0,
                        false,
                        Parallelism::None,
                    );
                }
            });
    }
}

/// Each row of `rows` set to `row`, in parallel.
fn fill_rows(rows: &mut [f32], row: &[f32]) {
    rows.par_chunks_mut(ROWS_PER_TASK * row.len())
        .for_each(|chunk| {
            for out in chunk.chunks_exact_mut(row.len()) {
                out.copy_from_slice(row);
            }
        });
}

/// Each row of `rows` set to the same row of `residual` plus `bias`, in
/// parallel.
fn add_rows(rows: &mut [f32], residual: &[f32], bias: &[f32]) {
    let chunk = ROWS_PER_TASK * bias.len();
    rows.par_chunks_mut(chunk)
        .zip(residual.par_chunks(chunk))
        .for_each(|(rows, residual)| kernels::residual_plus_bias(rows, residual, bias));
}
