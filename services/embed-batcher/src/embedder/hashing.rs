//! `--embedder hashing`: feature hashing, a stand-in that carries no meaning.
//!
//! Lowercased word tokens and the character trigrams of each word (with `^`
//! and `$` marking its ends, so short words and word boundaries count) are
//! hashed into `dimensions` buckets with a sign bit (signed hashing keeps
//! collisions from biasing every bucket upwards), then the vector is
//! L2-normalised, so cosine similarity is a dot product. Texts sharing words
//! and spellings come out close, but nothing else: paraphrases in other
//! words are not, so its vectors are no use for semantic search. It needs no
//! network or model files and is deterministic across runs, machines and
//! Rust versions (FNV-1a, not std's hasher), which makes it handy for tests
//! of the batching rules that do not care about the vectors.

use super::Embedder;

/// Feature-hashing embedder with `dimensions` buckets.
#[derive(Debug, Clone)]
pub struct HashingEmbedder {
    dimensions: usize,
}

/// Trigrams weigh less than whole words: they add spelling similarity
/// without drowning out vocabulary.
const TRIGRAM_WEIGHT: f32 = 0.5;

impl HashingEmbedder {
    /// A model producing vectors of length `dimensions` (at least 1).
    pub fn new(dimensions: usize) -> Self {
        HashingEmbedder {
            dimensions: dimensions.max(1),
        }
    }

    /// The embedding of one text; all zeros for a text without words.
    pub fn embed_one(&self, text: &str) -> Vec<f32> {
        let mut vector = vec![0.0f32; self.dimensions];
        let lower = text.to_lowercase();
        for word in lower
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
        {
            self.add(&mut vector, b"w", word.as_bytes(), 1.0);
            let marked: Vec<char> = std::iter::once('^')
                .chain(word.chars())
                .chain(std::iter::once('$'))
                .collect();
            for trigram in marked.windows(3) {
                let trigram: String = trigram.iter().collect();
                self.add(&mut vector, b"t", trigram.as_bytes(), TRIGRAM_WEIGHT);
            }
        }
        let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > 0.0 {
            vector.iter_mut().for_each(|x| *x /= norm);
        }
        vector
    }

    fn add(&self, vector: &mut [f32], kind: &[u8], feature: &[u8], weight: f32) {
        // The kind keeps a one-letter word and a trigram from sharing a hash.
        let hash = fnv1a(kind.iter().chain(&[0]).chain(feature));
        let bucket = (hash % self.dimensions as u64) as usize;
        let sign = if hash >> 63 == 0 { 1.0 } else { -1.0 };
        vector[bucket] += sign * weight;
    }
}

/// 64-bit FNV-1a: a stable, fast hash (std's hasher may change between releases).
fn fnv1a<'a>(bytes: impl IntoIterator<Item = &'a u8>) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.into_iter().fold(OFFSET, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    })
}

impl Embedder for HashingEmbedder {
    fn embed(&self, texts: &[String]) -> anyhow::Result<Vec<Vec<f32>>> {
        Ok(texts.iter().map(|text| self.embed_one(text)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn vectors_have_the_dimensions_and_unit_length() {
        let model = HashingEmbedder::new(384);
        let v = model.embed_one("Resetting a password\n\nOpen settings, then security.");
        assert_eq!(v.len(), 384);
        assert!((dot(&v, &v) - 1.0).abs() < 1e-5);
    }

    #[test]
    fn it_is_deterministic_and_case_insensitive() {
        let model = HashingEmbedder::new(64);
        assert_eq!(
            model.embed_one("Exporting Invoices"),
            model.embed_one("exporting invoices")
        );
        assert_eq!(
            model.embed(&["a b".into(), "c".into()]).unwrap(),
            vec![model.embed_one("a b"), model.embed_one("c")]
        );
    }

    #[test]
    fn similar_texts_are_closer_than_unrelated_ones() {
        let model = HashingEmbedder::new(384);
        let reset = model.embed_one("How to reset your password");
        let resetting = model.embed_one("Resetting a forgotten password");
        let invoices = model.embed_one("Exporting invoices to CSV");
        assert!(dot(&reset, &resetting) > dot(&reset, &invoices) + 0.1);
    }

    #[test]
    fn a_text_without_words_is_the_zero_vector() {
        let model = HashingEmbedder::new(8);
        assert_eq!(model.embed_one(" \n\n -- "), vec![0.0; 8]);
    }

    #[test]
    fn the_hash_is_fnv1a() {
        // Reference values of the 64-bit FNV-1a test suite.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
