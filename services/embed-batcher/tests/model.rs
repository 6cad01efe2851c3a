//! The local model (`--embedder local`) computes what sentence-transformers
//! computes for all-MiniLM-L6-v2: its vectors are compared with reference
//! vectors that sentence-transformers itself made from the same model files
//! (tests/data/reference_vectors.json, written by
//! tests/data/reference_vectors.py, which records the library versions).
//!
//! The model is read from `$MODELS_DIR/all-MiniLM-L6-v2` (MODELS_DIR
//! defaulting to /var/tmp/streams-models); `make test` fetches it first
//! (`make models`). Without it these tests fail, they do not skip.

use std::sync::OnceLock;

use embed_batcher::embedder::LocalModel;
use embed_batcher::settings::default_model_dir;
use serde::Deserialize;

/// Least cosine similarity to the reference vector, per text.
const MIN_COSINE: f32 = 0.9999;
/// Largest distance of a vector's L2 norm from 1.
const NORM_TOLERANCE: f32 = 1e-4;

#[derive(Deserialize)]
struct References {
    max_seq_length: usize,
    paraphrases: Vec<(String, String)>,
    unrelated: Vec<(String, String)>,
    texts: Vec<Reference>,
}

#[derive(Deserialize)]
struct Reference {
    name: String,
    text: String,
    token_ids: Vec<u32>,
    vector: Vec<f32>,
}

impl References {
    fn text(&self, name: &str) -> &Reference {
        self.texts
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no reference text {name}"))
    }
}

fn references() -> References {
    // The running test's directory first: a shared build cache may hold
    // this binary compiled in a clone at another path.
    let manifest_dir =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    let path = format!("{manifest_dir}/tests/data/reference_vectors.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The model, loaded once for all tests of this file.
fn model() -> &'static LocalModel {
    static MODEL: OnceLock<LocalModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        let dir = default_model_dir();
        assert!(
            dir.join("model.safetensors").is_file(),
            "the local model is not in {}: run `make models` (deploy/local/models.sh) first, \
             with the same MODELS_DIR",
            dir.display()
        );
        LocalModel::load(&dir, 2).unwrap_or_else(|e| panic!("loading {}: {e:#}", dir.display()))
    })
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn norm(a: &[f32]) -> f32 {
    dot(a, a).sqrt()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    dot(a, b) / (norm(a) * norm(b))
}

#[test]
fn vectors_match_sentence_transformers() {
    let references = references();
    let model = model();
    assert_eq!(model.dimensions(), 384);
    assert_eq!(model.max_seq_length(), references.max_seq_length);
    // All texts in one call, of different lengths.
    let texts: Vec<String> = references.texts.iter().map(|r| r.text.clone()).collect();
    let vectors = model.embed_texts(&texts).expect("embedding");
    assert_eq!(vectors.len(), texts.len());
    let mut failures = Vec::new();
    for (reference, vector) in references.texts.iter().zip(&vectors) {
        let ids = model.token_ids(&reference.text).expect("tokenizing");
        if ids != reference.token_ids {
            failures.push(format!(
                "{}: token ids differ ({} tokens, reference {})",
                reference.name,
                ids.len(),
                reference.token_ids.len()
            ));
        }
        let similarity = cosine(vector, &reference.vector);
        let length = norm(vector);
        if vector.len() != 384 || similarity < MIN_COSINE || (length - 1.0).abs() > NORM_TOLERANCE {
            failures.push(format!(
                "{}: {} numbers, cosine {similarity:.6} to the reference, norm {length:.6}",
                reference.name,
                vector.len()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The test set reaches the truncation.
    assert!(
        references
            .texts
            .iter()
            .filter(|r| r.token_ids.len() == 256)
            .count()
            >= 2
    );
}

/// Batching changes nothing: a text alone and in a batch with longer ones
/// has the same vector.
#[test]
fn a_text_has_the_same_vector_alone_and_in_a_batch() {
    let references = references();
    let model = model();
    let texts: Vec<String> = references.texts.iter().map(|r| r.text.clone()).collect();
    let batch = model.embed_texts(&texts).expect("embedding");
    for (text, in_batch) in texts.iter().zip(&batch) {
        let alone = model
            .embed_texts(std::slice::from_ref(text))
            .expect("embedding");
        let similarity = cosine(&alone[0], in_batch);
        assert!(similarity > 0.99999, "{text:?}: cosine {similarity}");
    }
}

/// A batch of more tokens than the encoder takes in one pass (4096) goes
/// through in several passes, and each text still gets its own vector.
#[test]
fn a_batch_larger_than_one_pass_keeps_every_vector() {
    let references = references();
    let model = model();
    // 18 texts of 256 tokens (4608), each followed by a short one.
    let texts: Vec<String> = (0..18)
        .flat_map(|i| {
            [
                format!("{i} {}", references.text("long_article").text),
                references.texts[i % 9].text.clone(),
            ]
        })
        .collect();
    let batch = model.embed_texts(&texts).expect("embedding");
    assert_eq!(batch.len(), texts.len());
    for (text, in_batch) in texts.iter().zip(&batch) {
        let alone = model
            .embed_texts(std::slice::from_ref(text))
            .expect("embedding");
        let similarity = cosine(&alone[0], in_batch);
        assert!(similarity > 0.99999, "{text:?}: cosine {similarity}");
    }
}

/// Only the first 256 tokens count: text past them changes nothing.
#[test]
fn text_past_256_tokens_is_cut_off() {
    let references = references();
    let model = model();
    let article = &references.text("long_article").text;
    let longer = format!("{article} This closing sentence is never seen by the model.");
    assert_eq!(model.token_ids(&longer).unwrap().len(), 256);
    let vectors = model
        .embed_texts(&[article.clone(), longer])
        .expect("embedding");
    assert!(cosine(&vectors[0], &vectors[1]) > 0.99999);
}

/// Texts that mean the same in other words are clearly closer than
/// unrelated texts.
#[test]
fn paraphrases_score_clearly_above_unrelated_pairs() {
    let references = references();
    let model = model();
    let score = |(a, b): &(String, String)| {
        let texts = [
            references.text(a).text.clone(),
            references.text(b).text.clone(),
        ];
        let vectors = model.embed_texts(&texts).expect("embedding");
        (format!("{a} / {b}"), dot(&vectors[0], &vectors[1]))
    };
    let paraphrases: Vec<(String, f32)> = references.paraphrases.iter().map(score).collect();
    let unrelated: Vec<(String, f32)> = references.unrelated.iter().map(score).collect();
    let lowest = paraphrases.iter().map(|(_, s)| *s).fold(f32::MAX, f32::min);
    let highest = unrelated.iter().map(|(_, s)| *s).fold(f32::MIN, f32::max);
    assert!(
        lowest > 0.4 && highest < 0.2 && lowest - highest > 0.3,
        "paraphrases {paraphrases:?}\nunrelated {unrelated:?}"
    );
}
