//! The engine's metrics: a snapshot of its counters, tasks and state,
//! published once per commit interval (see [`crate::metrics`]).

use super::Engine;
use crate::metrics::{self, Snapshot};
use crate::processor::Processor;

impl<P: Processor> Engine<P> {
    /// Every metric of this stage, now.
    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = Snapshot::default();
        for (subscription, counts) in self.subscriptions().iter().zip(&self.counters.topics) {
            let label = || vec![("topic", subscription.topic.clone())];
            snapshot.add(metrics::RECORDS_CONSUMED, label(), counts.consumed);
            snapshot.add(metrics::RECORDS_LATE, label(), counts.late);
            snapshot.add(
                metrics::RECORDS_DEAD_LETTERED,
                label(),
                counts.dead_lettered,
            );
        }
        let changelogs: Vec<&str> = self
            .side
            .changelogs
            .iter()
            .map(|id| self.collector.topic_name(*id))
            .collect();
        for (topic, count) in self.collector.produced() {
            if count > 0 && !changelogs.contains(&topic) {
                snapshot.add(
                    metrics::RECORDS_PRODUCED,
                    vec![("topic", topic.to_string())],
                    count,
                );
            }
        }
        let counters = &self.counters;
        snapshot.add(metrics::RESTORED_RECORDS, vec![], counters.restored_records);
        snapshot.add(metrics::COMMITS, vec![], counters.commits);
        snapshot.add(metrics::COMMITS_ABORTED, vec![], counters.commits_aborted);
        snapshot.add_f64(metrics::COMMIT_SECONDS, vec![], counters.commit_seconds);
        let latency = &counters.latency;
        snapshot.add(metrics::E2E_LATENCY_RECORDS, vec![], latency.records);
        snapshot.add_f64(metrics::E2E_LATENCY_SECONDS, vec![], latency.sum_seconds);
        if let Some(max) = latency.max_seconds {
            snapshot.set(metrics::E2E_LATENCY_MAX, vec![], max);
        }
        if self.runs_jobs_off_thread() {
            snapshot.set(
                metrics::JOBS_IN_FLIGHT,
                vec![],
                self.jobs_in_flight() as f64,
            );
        }
        for (name, count) in &counters.processor {
            snapshot.add(
                metrics::PROCESSOR_EVENTS,
                vec![("name", name.to_string())],
                *count,
            );
        }
        let now_ms = self.clock.now().epoch_ms;
        for task in self.tasks.values() {
            let label = || vec![("task", task.partition.to_string())];
            if task.watermark() != crate::time::NO_WATERMARK {
                let lag = (now_ms.saturating_sub(task.watermark())) as f64 / 1000.0;
                snapshot.set(metrics::WATERMARK_LAG, label(), lag);
            }
            snapshot.set(
                metrics::TIMERS_PENDING,
                label(),
                task.timers_pending() as f64,
            );
            snapshot.set(
                metrics::TIMERS_SPILLED,
                label(),
                task.timers_spilled() as f64,
            );
            let usage = task.store.rocksdb_usage();
            snapshot.set(metrics::STATE_BYTES, label(), usage.state_bytes() as f64);
            for (kind, bytes) in [
                ("memtables", usage.memtables),
                ("live_sst_files", usage.live_sst_files),
                ("pending_compaction", usage.pending_compaction),
            ] {
                snapshot.set(
                    metrics::ROCKSDB_BYTES,
                    vec![("task", task.partition.to_string()), ("kind", kind.into())],
                    bytes as f64,
                );
            }
            for (index, name) in self.settings.store_names.iter().enumerate() {
                snapshot.set(
                    metrics::STATE_KEYS,
                    vec![
                        ("task", task.partition.to_string()),
                        ("store", name.clone()),
                    ],
                    task.store.estimated_keys(index) as f64,
                );
            }
        }
        snapshot
    }
}
