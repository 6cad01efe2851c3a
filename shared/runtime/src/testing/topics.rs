//! The driver's in-memory topics, and records as tests read them back.

use crate::watermark::Announcement;

/// A record read back from a topic.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicRecord {
    pub partition: i32,
    pub offset: i64,
    /// The key as text (lossy for keys that are not UTF-8).
    pub key: Option<String>,
    /// The value decoded with the schema its wire-format header names, as
    /// JSON in the fixtures' format; `None` when absent or not decodable.
    pub value: Option<serde_json::Value>,
    /// The value's bytes.
    pub raw: Option<Vec<u8>>,
    /// Headers as text (dead-letter provenance, say); watermarks excluded.
    pub headers: Vec<(String, String)>,
}

impl TopicRecord {
    /// The record as a fixture line's JSON: `{"key": ..., "value": ...}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"key": self.key, "value": self.value})
    }

    /// The value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// One record of an in-memory topic.
#[derive(Debug, Clone)]
pub(crate) struct StoredRecord {
    /// Global order of appends, which is the order stages consume in.
    pub(crate) sequence: u64,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) announcement: Option<Announcement>,
    pub(crate) headers: Vec<(String, String)>,
    /// Written by a stage and not yet committed.
    pub(crate) pending: bool,
    /// Written by a stage whose work was dropped by a crash: invisible.
    pub(crate) aborted: bool,
}

/// An in-memory topic.
#[derive(Debug, Default)]
pub(crate) struct MemoryTopic {
    pub(crate) partitions: Vec<Vec<StoredRecord>>,
}
