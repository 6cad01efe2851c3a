//! The stage's result topic: encoding processor results into the collector.

use serde::Serialize;

use crate::avro::AvroEncoder;
use crate::collector::{Collector, Headers, TopicId};
use crate::watermark::Announcement;

/// Encodes processor results for the output topic (or the stage link).
pub(crate) struct OutputEncoder {
    pub topic: TopicId,
    encoder: AvroEncoder,
}

impl OutputEncoder {
    pub fn new(topic: TopicId, encoder: AvroEncoder) -> Self {
        OutputEncoder { topic, encoder }
    }

    /// Encodes `value` into `collector` with `key` (partitioned by murmur2 of
    /// the key). Records without a key all go to partition 0, so that a
    /// keyless result stream (a global aggregate) keeps its order even in a
    /// topic of several partitions. A result that feeds another stage carries
    /// the writing task's watermark (`stamp`). The Kafka timestamp is the time
    /// of writing: event time lives in the value, and an old event time as
    /// record timestamp would let time-based retention delete fresh results.
    pub fn emit<T: Serialize>(
        &self,
        collector: &mut Collector,
        key: Option<&str>,
        value: &T,
        stamp: Option<Announcement>,
    ) -> anyhow::Result<()> {
        let headers = stamp.map_or(Headers::None, Headers::Watermark);
        collector.push_encoded(
            self.topic,
            key.is_none().then_some(0),
            key.map(str::as_bytes),
            headers,
            |out| self.encoder.append_to(value, out),
        )
    }
}
