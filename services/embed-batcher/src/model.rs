//! Records of the input and output topics (see `shared/schemas/avro`).

use serde::{Deserialize, Serialize};

/// An `articles` value: one edit of one article.
#[derive(Debug, Clone, Deserialize)]
pub struct Article {
    pub tenant_id: String,
    pub doc_id: String,
    pub title: String,
    pub body: String,
    pub updated_at: i64,
}

/// An `article-embeddings` value: one article of a sent batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArticleEmbedding {
    pub tenant_id: String,
    pub doc_id: String,
    pub updated_at: i64,
    pub title: String,
    pub embedding: Vec<f32>,
    /// The time of the timer that sent the batch.
    pub batch_time: i64,
}
