//! Records of the input and output topics (see `shared/schemas/avro`).

use serde::{Deserialize, Serialize};

/// A `user-events` value.
#[derive(Debug, Clone, Deserialize)]
pub struct UserEvent {
    pub user_id: String,
    pub event_type: String,
    pub event_time: i64,
}

/// A `user-sessions` value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UserSession {
    pub user_id: String,
    pub status: &'static str,
    pub duration_millis: i64,
    pub event_count: i32,
    pub event_sequence: String,
    pub session_start: i64,
    pub session_end: i64,
}
