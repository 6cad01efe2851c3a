//! The service's output topic: encode a value, produce it, count it.

use rdkafka::message::OwnedHeaders;
use serde::Serialize;

use crate::avro::AvroEncoder;
use crate::delivery::{Delivery, Outgoing, UNTRACKED};

/// Writes processor results to the output topic through the instance's one
/// producer, reusing one encoding buffer.
pub(crate) struct Output {
    pub delivery: Delivery,
    topic: String,
    encoder: AvroEncoder,
    scratch: Vec<u8>,
    /// Records written to the output topic since startup.
    pub produced: u64,
}

impl Output {
    pub fn new(delivery: Delivery, topic: String, encoder: AvroEncoder) -> Self {
        Output {
            delivery,
            topic,
            encoder,
            scratch: Vec::with_capacity(256),
            produced: 0,
        }
    }

    /// The output topic's name.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Encodes `value` and produces it with `key` (partitioned by murmur2 of
    /// the key). Records without a key all go to partition 0, so that a
    /// keyless result stream (a global aggregate) keeps its order even in a
    /// topic of several partitions. The Kafka timestamp is the time of
    /// writing: event time lives in the value, and an old event time as
    /// record timestamp would let time-based retention delete fresh results.
    pub fn emit<T: Serialize>(&mut self, key: Option<&str>, value: &T) -> anyhow::Result<()> {
        self.encoder.encode_into(value, &mut self.scratch)?;
        self.delivery.send(Outgoing {
            topic: &self.topic,
            partition: key.is_none().then_some(0),
            key: key.map(str::as_bytes),
            payload: Some(&self.scratch),
            headers: None,
            tag: UNTRACKED,
        });
        self.produced += 1;
        Ok(())
    }

    /// Produces a record with only `headers` (no key, no value) to
    /// `partition`: a control record such as a watermark announcement.
    pub fn send_control(&mut self, partition: i32, headers: OwnedHeaders) {
        self.delivery.send(Outgoing {
            topic: &self.topic,
            partition: Some(partition),
            key: None,
            payload: None,
            headers: Some(headers),
            tag: UNTRACKED,
        });
    }
}
