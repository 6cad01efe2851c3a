//! What the engine counts: records per topic, commits, restored records and
//! the processors' counters.

use std::collections::BTreeMap;

use super::Engine;
use crate::processor::Processor;

/// Per-topic counts since startup.
#[derive(Debug, Default, Clone)]
pub(crate) struct TopicCounts {
    pub consumed: u64,
    pub late: u64,
    pub dead_lettered: u64,
}

/// The engine's counts of records, per topic: consumed, late and
/// dead-lettered (by subscription index) and produced (by collector topic
/// id). The test driver's crash takes them back to the last commit.
#[cfg(feature = "test-utils")]
#[derive(Debug, Clone, Default)]
pub(crate) struct RecordCounts {
    topics: Vec<TopicCounts>,
    produced: Vec<u64>,
}

/// Everything the engine counts, published as metrics at each commit.
#[derive(Debug, Default)]
pub(crate) struct EngineCounters {
    /// By subscription index.
    pub topics: Vec<TopicCounts>,
    pub restored_records: u64,
    pub commits: u64,
    pub commits_aborted: u64,
    pub commit_seconds: f64,
    /// Processor counters of committed work.
    pub processor: BTreeMap<&'static str, u64>,
    /// Timestamps of the records handled since the last seal, and of those
    /// the sealed commit carries.
    pub handled: Timestamps,
    pub sealed: Timestamps,
    pub latency: EndToEndLatency,
}

/// The Kafka timestamps of a set of records, summed up: enough to know,
/// once they are committed, their latencies' sum and largest.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct Timestamps {
    count: u64,
    sum_ms: f64,
    oldest_ms: i64,
}

impl Timestamps {
    pub fn add(&mut self, timestamp_ms: i64) {
        self.oldest_ms = match self.count {
            0 => timestamp_ms,
            _ => self.oldest_ms.min(timestamp_ms),
        };
        self.count += 1;
        self.sum_ms += timestamp_ms as f64;
    }
}

/// End-to-end latency of committed records: from a record's timestamp to
/// the commit that made what it caused visible (Kafka Streams'
/// `record-e2e-latency`, measured at the commit rather than at the sink).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct EndToEndLatency {
    pub records: u64,
    pub sum_seconds: f64,
    /// The largest of the last commit that carried records.
    pub max_seconds: Option<f64>,
}

impl EndToEndLatency {
    /// `committed` were committed at `now_ms` (wall clock).
    pub fn observe(&mut self, committed: Timestamps, now_ms: i64) {
        if committed.count == 0 {
            return;
        }
        self.records += committed.count;
        self.sum_seconds += (committed.count as f64 * now_ms as f64 - committed.sum_ms) / 1000.0;
        self.max_seconds = Some((now_ms - committed.oldest_ms) as f64 / 1000.0);
    }
}

impl<P: Processor> Engine<P> {
    /// Records consumed so far, over all subscriptions.
    pub fn consumed_records(&self) -> u64 {
        self.counters
            .topics
            .iter()
            .map(|counts| counts.consumed)
            .sum()
    }

    /// The records counted so far (see [`RecordCounts`]).
    #[cfg(feature = "test-utils")]
    pub(crate) fn record_counts(&self) -> RecordCounts {
        RecordCounts {
            topics: self.counters.topics.clone(),
            produced: self.collector.produced_counts(),
        }
    }

    /// Takes the counts of records back to `counts`, taken earlier.
    #[cfg(feature = "test-utils")]
    pub(crate) fn reset_record_counts(&mut self, counts: &RecordCounts) {
        self.counters.topics.clone_from(&counts.topics);
        self.collector.reset_produced(&counts.produced);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_adds_each_records_latency_and_keeps_its_largest() {
        let mut latency = EndToEndLatency::default();
        let mut committed = Timestamps::default();
        for timestamp in [10_000, 9_000, 10_500] {
            committed.add(timestamp);
        }
        latency.observe(committed, 11_000);
        assert_eq!(latency.records, 3);
        assert!((latency.sum_seconds - (1.0 + 2.0 + 0.5)).abs() < 1e-9);
        assert_eq!(latency.max_seconds, Some(2.0));
        latency.observe(Timestamps::default(), 20_000);
        assert_eq!(
            latency.max_seconds,
            Some(2.0),
            "an empty commit changes nothing"
        );
        let mut later = Timestamps::default();
        later.add(19_750);
        latency.observe(later, 20_000);
        assert_eq!(latency.records, 4);
        assert_eq!(latency.max_seconds, Some(0.25), "the last commit's");
    }
}
