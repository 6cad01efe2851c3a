//! Records of the input and output topics (see `shared/schemas/avro`).

use serde::{Deserialize, Serialize};

/// A `clicks` value, written unchanged to `unique-clicks`.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Click {
    pub click_id: String,
    pub user_id: String,
    pub url: String,
    pub clicked_at: i64,
}
