//! Everything a stage writes, gathered before it reaches a producer.
//!
//! Processor results, repartitioned and late records, dead letters, watermark
//! announcements and changelog records all go into one [`Collector`]. The
//! processing code never holds a producer: the Kafka stage drains the
//! collector into its producer after each batch of work, and the test driver
//! (`crate::testing`) drains it into in-memory topics. Either way the same
//! engine and task code ran.
//!
//! Keys and values are appended to one byte arena that is reused from drain
//! to drain, so collecting a record allocates nothing once the arena has
//! grown to a batch's size.

use std::borrow::Cow;
use std::ops::Range;

use crate::state::format::WriteFormat;
use crate::watermark::Announcement;

/// Index of a topic in the collector's topic table.
pub(crate) type TopicId = usize;

/// Metadata that travels with a record as Kafka headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Headers {
    None,
    /// The writing task's watermark (a control record when there is no value).
    Watermark(Announcement),
    /// Why a record was dead-lettered and where it came from.
    DeadLetter(DeadLetter),
    /// A changelog record in this state format.
    Changelog(WriteFormat),
}

/// The provenance of a dead-lettered record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeadLetter {
    pub error_kind: &'static str,
    pub message: Range<u32>,
    pub source_topic: TopicId,
    pub partition: i32,
    pub offset: i64,
}

/// Which changelog partition a record belongs to, so that its delivered
/// offset can be checkpointed with the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ChangelogPartition {
    pub store: usize,
    pub partition: i32,
}

impl ChangelogPartition {
    /// The producer's delivery tag for records of this changelog partition:
    /// never 0 (untracked), store in the high half, partition in the low.
    pub fn delivery_tag(self) -> usize {
        (((self.store as u64) << 32) | u64::from(self.partition as u32)) as usize + 1
    }
}

/// One collected record; its bytes live in the collector's arena.
#[derive(Debug, Clone)]
struct Collected {
    topic: TopicId,
    partition: Option<i32>,
    key: Option<Range<u32>>,
    value: Option<Range<u32>>,
    headers: Headers,
    changelog: Option<ChangelogPartition>,
}

/// A collected record as the draining side sees it.
pub(crate) struct RecordView<'a> {
    pub topic: &'a str,
    /// `None`: partition by murmur2 of the key.
    pub partition: Option<i32>,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: &'a Headers,
    /// Dead-letter headers reference text in the arena and other topics.
    arena: &'a [u8],
    topics: &'a [String],
    pub changelog: Option<ChangelogPartition>,
}

impl<'a> RecordView<'a> {
    /// Text stored in the arena (a dead letter's error message).
    pub fn text(&self, range: &Range<u32>) -> &'a str {
        std::str::from_utf8(&self.arena[range.start as usize..range.end as usize])
            .unwrap_or_default()
    }

    /// The name of topic `id` (a dead letter's source topic).
    pub fn topic_name(&self, id: TopicId) -> &'a str {
        &self.topics[id]
    }

    /// A dead letter's headers (SPEC: the error and the record's source),
    /// or `None` for any other record.
    pub fn dead_letter_headers(&self) -> Option<[(&'static str, Cow<'a, str>); 5]> {
        let Headers::DeadLetter(dead) = self.headers else {
            return None;
        };
        Some([
            ("dlq.error.kind", Cow::Borrowed(dead.error_kind)),
            ("dlq.error.message", Cow::Borrowed(self.text(&dead.message))),
            (
                "dlq.source.topic",
                Cow::Borrowed(self.topic_name(dead.source_topic)),
            ),
            (
                "dlq.source.partition",
                Cow::Owned(dead.partition.to_string()),
            ),
            ("dlq.source.offset", Cow::Owned(dead.offset.to_string())),
        ])
    }
}

/// Records written by a stage, in the order they were written.
#[derive(Debug, Default)]
pub(crate) struct Collector {
    topics: Vec<String>,
    records: Vec<Collected>,
    arena: Vec<u8>,
    /// Records collected per topic since startup.
    produced: Vec<u64>,
}

impl Collector {
    /// Adds `topic` to the topic table (once) and returns its id.
    pub fn topic(&mut self, topic: &str) -> TopicId {
        if let Some(id) = self.topics.iter().position(|t| t == topic) {
            return id;
        }
        self.topics.push(topic.to_string());
        self.produced.push(0);
        self.topics.len() - 1
    }

    /// The name of topic `id`.
    pub fn topic_name(&self, id: TopicId) -> &str {
        &self.topics[id]
    }

    fn store(&mut self, bytes: &[u8]) -> Range<u32> {
        let start = self.arena.len() as u32;
        self.arena.extend_from_slice(bytes);
        start..self.arena.len() as u32
    }

    /// Appends a record; `partition` `None` lets the key decide.
    pub fn push(
        &mut self,
        topic: TopicId,
        partition: Option<i32>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: Headers,
    ) {
        let key = key.map(|k| self.store(k));
        let value = value.map(|v| self.store(v));
        self.records.push(Collected {
            topic,
            partition,
            key,
            value,
            headers,
            changelog: None,
        });
        self.produced[topic] += 1;
    }

    /// Appends a value that `write` encodes straight into the arena.
    pub fn push_encoded(
        &mut self,
        topic: TopicId,
        partition: Option<i32>,
        key: Option<&[u8]>,
        headers: Headers,
        write: impl FnOnce(&mut Vec<u8>) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let key = key.map(|k| self.store(k));
        let start = self.arena.len();
        if let Err(error) = write(&mut self.arena) {
            self.arena.truncate(start);
            return Err(error);
        }
        self.records.push(Collected {
            topic,
            partition,
            key,
            value: Some(start as u32..self.arena.len() as u32),
            headers,
            changelog: None,
        });
        self.produced[topic] += 1;
        Ok(())
    }

    /// Appends a dead letter: the original key and value, with headers that
    /// say why and where from.
    #[allow(clippy::too_many_arguments)]
    pub fn push_dead_letter(
        &mut self,
        topic: TopicId,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        error_kind: &'static str,
        message: &str,
        source_topic: TopicId,
        partition: i32,
        offset: i64,
    ) {
        let message = self.store(message.as_bytes());
        self.push(
            topic,
            None,
            key,
            value,
            Headers::DeadLetter(DeadLetter {
                error_kind,
                message,
                source_topic,
                partition,
                offset,
            }),
        );
    }

    /// Appends a changelog record written in `format` (a `None` value
    /// deletes the key).
    pub fn push_changelog(
        &mut self,
        topic: TopicId,
        changelog: ChangelogPartition,
        format: WriteFormat,
        key: &[u8],
        value: Option<&[u8]>,
    ) {
        self.push(
            topic,
            Some(changelog.partition),
            Some(key),
            value,
            Headers::Changelog(format),
        );
        self.records.last_mut().expect("just pushed").changelog = Some(changelog);
    }

    /// Hands every collected record to `sink`, in order, and empties the
    /// collector (keeping its capacity).
    pub fn drain(&mut self, mut sink: impl FnMut(RecordView<'_>)) {
        for record in &self.records {
            let slice = |range: &Range<u32>| &self.arena[range.start as usize..range.end as usize];
            sink(RecordView {
                topic: &self.topics[record.topic],
                partition: record.partition,
                key: record.key.as_ref().map(slice),
                value: record.value.as_ref().map(slice),
                headers: &record.headers,
                arena: &self.arena,
                topics: &self.topics,
                changelog: record.changelog,
            });
        }
        self.records.clear();
        self.arena.clear();
    }

    /// Bytes of the records waiting to be drained.
    pub fn held_bytes(&self) -> usize {
        self.arena.len()
    }

    /// Drops everything not yet drained (a failed batch).
    pub fn discard(&mut self) {
        for record in &self.records {
            self.produced[record.topic] -= 1;
        }
        self.records.clear();
        self.arena.clear();
    }

    /// Records collected per topic since startup.
    pub fn produced(&self) -> impl Iterator<Item = (&str, u64)> {
        self.topics
            .iter()
            .map(String::as_str)
            .zip(self.produced.iter().copied())
    }

    /// The counts of [`produced`](Self::produced), by topic id.
    #[cfg(feature = "test-utils")]
    pub fn produced_counts(&self) -> Vec<u64> {
        self.produced.clone()
    }

    /// Takes the counts of [`produced`](Self::produced) back to `counts`
    /// (by topic id; a topic added since goes back to 0).
    #[cfg(feature = "test-utils")]
    pub fn reset_produced(&mut self, counts: &[u64]) {
        for (topic, produced) in self.produced.iter_mut().enumerate() {
            *produced = counts.get(topic).copied().unwrap_or(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_records_in_order_and_reuses_the_arena() {
        let mut collector = Collector::default();
        let out = collector.topic("out");
        let dlq = collector.topic("dlq");
        assert_eq!(collector.topic("out"), out);
        collector.push(out, None, Some(b"k1"), Some(b"v1"), Headers::None);
        collector
            .push_encoded(out, Some(0), None, Headers::None, |buf| {
                buf.extend_from_slice(b"v2");
                Ok(())
            })
            .unwrap();
        collector.push_dead_letter(dlq, None, Some(b"bad"), "avro", "broken", out, 3, 7);
        let mut seen = Vec::new();
        collector.drain(|record| {
            let message = match record.headers {
                Headers::DeadLetter(dead) => Some(record.text(&dead.message).to_string()),
                _ => None,
            };
            seen.push((
                record.topic.to_string(),
                record.key.map(<[u8]>::to_vec),
                record.value.map(<[u8]>::to_vec),
                message,
            ));
        });
        assert_eq!(
            seen,
            vec![
                (
                    "out".into(),
                    Some(b"k1".to_vec()),
                    Some(b"v1".to_vec()),
                    None
                ),
                ("out".into(), None, Some(b"v2".to_vec()), None),
                (
                    "dlq".into(),
                    None,
                    Some(b"bad".to_vec()),
                    Some("broken".into())
                ),
            ]
        );
        collector.drain(|_| panic!("drained twice"));
        let counts: Vec<(String, u64)> = collector
            .produced()
            .map(|(t, n)| (t.to_string(), n))
            .collect();
        assert_eq!(counts, vec![("out".into(), 2), ("dlq".into(), 1)]);
    }

    #[test]
    fn changelog_partitions_have_distinct_tracked_delivery_tags() {
        let tag = |store, partition| ChangelogPartition { store, partition }.delivery_tag();
        assert_ne!(tag(0, 0), crate::delivery::UNTRACKED);
        assert_ne!(tag(0, 1), tag(1, 0));
        assert_ne!(tag(3, 17), tag(17, 3));
    }

    #[test]
    fn a_failed_encoding_leaves_nothing_behind() {
        let mut collector = Collector::default();
        let out = collector.topic("out");
        let result = collector.push_encoded(out, None, Some(b"k"), Headers::None, |buf| {
            buf.extend_from_slice(b"partial");
            anyhow::bail!("no")
        });
        assert!(result.is_err());
        collector.drain(|_| panic!("a failed encoding was collected"));
    }
}
