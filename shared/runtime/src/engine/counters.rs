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
