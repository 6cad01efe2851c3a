//! Metrics: counted on the processing thread, published at each commit,
//! rendered in the Prometheus text format by the HTTP listener.
//!
//! The processing thread never takes a lock per record: it counts into plain
//! fields and hands a copy to [`StageMetrics::publish`] once per commit interval.
//! Every metric name is listed here and in `docs/metrics.md`. Naming rules:
//! `streams_<what>_<unit>` with `_total` for counters; labels are bounded
//! (topic names, task ids, processor counter names), never record data.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Records consumed, by input topic.
pub const RECORDS_CONSUMED: &str = "streams_records_consumed_total";
/// Records produced, by topic (outputs, repartition, late and dead-letter topics).
pub const RECORDS_PRODUCED: &str = "streams_records_produced_total";
/// Late records dropped, by input topic.
pub const RECORDS_LATE: &str = "streams_records_late_total";
/// Undecodable records sent to the dead-letter topic, by input topic.
pub const RECORDS_DEAD_LETTERED: &str = "streams_records_dead_lettered_total";
/// Changelog records replayed into local state.
pub const RESTORED_RECORDS: &str = "streams_restored_records_total";
/// Standby tasks this instance keeps (`--standby-replicas`).
pub const STANDBY_TASKS: &str = "streams_standby_tasks";
/// Changelog records applied to standby tasks.
pub const STANDBY_RECORDS: &str = "streams_standby_records_total";
/// Records the standby tasks are behind their changelogs' ends, summed
/// (-1 while an end cannot be read).
pub const STANDBY_LAG: &str = "streams_standby_lag_records";
/// Commits completed. A commit interval with nothing new completes its
/// commit without sending anything (no transaction, no offset commit) and
/// counts too.
pub const COMMITS: &str = "streams_commits_total";
/// Commits rolled back.
pub const COMMITS_ABORTED: &str = "streams_commits_aborted_total";
/// Total seconds spent committing.
pub const COMMIT_SECONDS: &str = "streams_commit_duration_seconds_total";
/// Seconds the processing thread spent in each phase of its loop, by
/// `phase`: `poll` (waiting for records), `process` (decoding, processing,
/// handing records to the producer), `commit_prepare` (changelog records,
/// announcements, and waiting for the last commit's state write if it is
/// still running), `commit_flush` (waiting for every record's
/// acknowledgement), `commit_offsets` (`send_offsets_to_transaction` or the
/// offset commit), `commit_transaction`, `commit_apply` (handing the
/// committed changes to a state writer).
pub const PHASE_SECONDS: &str = "streams_thread_phase_seconds_total";
/// Jobs (`Context::submit`) started and not yet completed.
pub const JOBS_IN_FLIGHT: &str = "streams_jobs_in_flight";
/// The longest time a transaction stayed open, since start (exactly-once).
pub const TRANSACTION_OPEN_MAX: &str = "streams_transaction_open_seconds_max";
/// How long the last 1 024 transactions stayed open, by `quantile` (0.99).
pub const TRANSACTION_OPEN: &str = "streams_transaction_open_seconds";
/// Tasks of which this instance holds only some partitions (an incremental
/// rebalance in progress, or an assignor that split them): they do not
/// process until the rest arrives.
pub const TASKS_INCOMPLETE: &str = "streams_tasks_incomplete";
/// Wall clock minus task watermark, by task.
pub const WATERMARK_LAG: &str = "streams_watermark_lag_seconds";
/// Estimated bytes of committed state, by task.
pub const STATE_BYTES: &str = "streams_state_bytes";
/// Estimated keys per store and task.
pub const STATE_KEYS: &str = "streams_state_keys";
/// Pending timers, by task (spilled ones included).
pub const TIMERS_PENDING: &str = "streams_timers_pending";
/// Pending timers beyond the task's memory budget, kept in its RocksDB.
pub const TIMERS_SPILLED: &str = "streams_timers_spilled";
/// Domain counters incremented by the processor, by name.
pub const PROCESSOR_EVENTS: &str = "streams_processor_events_total";

/// A phase of the processing thread's loop (see [`PHASE_SECONDS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Poll,
    Process,
    CommitPrepare,
    CommitFlush,
    CommitOffsets,
    CommitTransaction,
    CommitApply,
}

impl Phase {
    const ALL: [Phase; 7] = [
        Phase::Poll,
        Phase::Process,
        Phase::CommitPrepare,
        Phase::CommitFlush,
        Phase::CommitOffsets,
        Phase::CommitTransaction,
        Phase::CommitApply,
    ];

    fn label(self) -> &'static str {
        match self {
            Phase::Poll => "poll",
            Phase::Process => "process",
            Phase::CommitPrepare => "commit_prepare",
            Phase::CommitFlush => "commit_flush",
            Phase::CommitOffsets => "commit_offsets",
            Phase::CommitTransaction => "commit_transaction",
            Phase::CommitApply => "commit_apply",
        }
    }
}

/// Time spent per [`Phase`], counted on the processing thread.
#[derive(Debug, Default, Clone)]
pub struct PhaseTimes {
    seconds: [f64; 7],
}

impl PhaseTimes {
    /// Adds `elapsed` to `phase`.
    pub fn add(&mut self, phase: Phase, elapsed: std::time::Duration) {
        self.seconds[phase as usize] += elapsed.as_secs_f64();
    }

    /// Adds the time since `since` to `phase` and returns now, the start of
    /// whatever comes next.
    pub fn lap(&mut self, phase: Phase, since: std::time::Instant) -> std::time::Instant {
        let now = std::time::Instant::now();
        self.add(phase, now.saturating_duration_since(since));
        now
    }

    /// Adds every phase's total to `snapshot`.
    pub fn export(&self, snapshot: &mut Snapshot) {
        for phase in Phase::ALL {
            snapshot.add_f64(
                PHASE_SECONDS,
                vec![("phase", phase.label().to_string())],
                self.seconds[phase as usize],
            );
        }
    }
}

/// One labelled sample.
pub type Series = (&'static str, Vec<(&'static str, String)>);

/// The values of the series of `name` whose labels include all of `labels`.
fn matching<'a, V: Copy>(
    series: &'a BTreeMap<Series, V>,
    name: &'static str,
    labels: &'a [(&'static str, &str)],
) -> impl Iterator<Item = V> + 'a {
    series
        .iter()
        .filter(move |((series, series_labels), _)| {
            *series == name
                && labels
                    .iter()
                    .all(|(key, value)| series_labels.iter().any(|(k, v)| k == key && v == value))
        })
        .map(|(_, value)| *value)
}

/// A point-in-time copy of every metric.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub counters: BTreeMap<Series, u64>,
    /// Counters of a continuous quantity (seconds spent, say).
    pub float_counters: BTreeMap<Series, f64>,
    pub gauges: BTreeMap<Series, f64>,
}

impl Snapshot {
    /// Adds `by` to a counter.
    pub fn add(&mut self, name: &'static str, labels: Vec<(&'static str, String)>, by: u64) {
        *self.counters.entry((name, labels)).or_default() += by;
    }

    /// Adds `by` to a counter of a continuous quantity.
    pub fn add_f64(&mut self, name: &'static str, labels: Vec<(&'static str, String)>, by: f64) {
        *self.float_counters.entry((name, labels)).or_default() += by;
    }

    /// Sets a gauge.
    pub fn set(&mut self, name: &'static str, labels: Vec<(&'static str, String)>, value: f64) {
        self.gauges.insert((name, labels), value);
    }

    /// Gauge `name` summed over every series whose labels include all of
    /// `labels` (0 when none is set), like [`counter`](Self::counter).
    pub fn gauge(&self, name: &'static str, labels: &[(&'static str, &str)]) -> f64 {
        matching(&self.gauges, name, labels).sum()
    }

    /// Counter `name` summed over every series whose labels include all of
    /// `labels` (0 when none was counted), as a Prometheus `sum` would: with
    /// no labels, over every topic (or task, or stage); with a topic, over
    /// every stage that counts it.
    pub fn counter(&self, name: &'static str, labels: &[(&'static str, &str)]) -> u64 {
        matching(&self.counters, name, labels).sum()
    }

    /// Renders the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut last_name = "";
        let mut write_series = |out: &mut String,
                                kind: &str,
                                name: &'static str,
                                labels: &[(&'static str, String)],
                                value: String| {
            if name != last_name {
                let _ = writeln!(out, "# TYPE {name} {kind}");
                last_name = name;
            }
            let labels: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
                .collect();
            if labels.is_empty() {
                let _ = writeln!(out, "{name} {value}");
            } else {
                let _ = writeln!(out, "{name}{{{}}} {value}", labels.join(","));
            }
        };
        for ((name, labels), value) in &self.counters {
            write_series(&mut out, "counter", name, labels, value.to_string());
        }
        for ((name, labels), value) in &self.float_counters {
            write_series(&mut out, "counter", name, labels, value.to_string());
        }
        for ((name, labels), value) in &self.gauges {
            write_series(&mut out, "gauge", name, labels, value.to_string());
        }
        out
    }
}

/// What the processing threads share with the HTTP listener: one published
/// snapshot and one readiness flag per processing thread of each stage.
#[derive(Default)]
pub struct Metrics {
    stages: Mutex<Vec<StageSlot>>,
    failed: AtomicBool,
}

/// One processing thread's last published state.
struct StageSlot {
    /// `None` for the first stage; later stages label their series with it.
    label: Option<String>,
    /// The thread's index when its stage has several (`--stream-threads`),
    /// which then labels its series.
    thread: Option<String>,
    snapshot: Snapshot,
    ready: bool,
}

impl Metrics {
    /// Registers a stage and returns its handle. The first stage's series keep
    /// their labels; a later stage's carry `stage="<label>"` as well, so that
    /// series of different stages never collide.
    pub fn add_stage(self: &Arc<Self>, label: Option<&str>) -> StageMetrics {
        self.add_thread(label, None)
    }

    /// Registers processing thread `thread` of a stage and returns its
    /// handle. With a thread index, its series carry `thread="<index>"` too:
    /// gauges without a task label (incomplete tasks) would otherwise
    /// overwrite each other, and per-thread phase times show an unbalanced
    /// thread. Without one (a single thread) the series are as they were.
    pub fn add_thread(
        self: &Arc<Self>,
        label: Option<&str>,
        thread: Option<usize>,
    ) -> StageMetrics {
        let mut stages = self.stages.lock().unwrap();
        stages.push(StageSlot {
            label: label.map(str::to_string),
            thread: thread.map(|index| index.to_string()),
            snapshot: Snapshot::default(),
            ready: false,
        });
        StageMetrics {
            shared: self.clone(),
            slot: stages.len() - 1,
        }
    }

    /// Every stage's last snapshot, merged.
    pub fn snapshot(&self) -> Snapshot {
        let stages = self.stages.lock().unwrap();
        let mut merged = Snapshot::default();
        for stage in stages.iter() {
            let relabel = |(name, labels): &Series| -> Series {
                let mut labels = labels.clone();
                if let Some(label) = &stage.label {
                    labels.push(("stage", label.clone()));
                }
                if let Some(thread) = &stage.thread {
                    labels.push(("thread", thread.clone()));
                }
                (name, labels)
            };
            for (series, value) in &stage.snapshot.counters {
                *merged.counters.entry(relabel(series)).or_default() += value;
            }
            for (series, value) in &stage.snapshot.float_counters {
                *merged.float_counters.entry(relabel(series)).or_default() += value;
            }
            for (series, value) in &stage.snapshot.gauges {
                merged.gauges.insert(relabel(series), *value);
            }
        }
        merged
    }

    /// Whether every thread of every stage has all its assigned tasks
    /// restored and processing.
    pub fn is_ready(&self) -> bool {
        let stages = self.stages.lock().unwrap();
        !stages.is_empty() && stages.iter().all(|stage| stage.ready)
    }

    /// Marks the service as failed (unhealthy).
    pub fn set_failed(&self) {
        self.failed.store(true, Ordering::Relaxed);
    }

    /// Whether a processing loop has failed.
    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }
}

/// One stage's handle on the shared [`Metrics`].
pub struct StageMetrics {
    shared: Arc<Metrics>,
    slot: usize,
}

impl StageMetrics {
    /// Replaces this stage's published snapshot.
    pub fn publish(&self, snapshot: Snapshot) {
        self.shared.stages.lock().unwrap()[self.slot].snapshot = snapshot;
    }

    /// Whether every thread of every stage of the process is ready (see
    /// [`Metrics::is_ready`]).
    pub fn process_ready(&self) -> bool {
        self.shared.is_ready()
    }

    /// Marks whether every task this stage is assigned is restored and processing.
    pub fn set_ready(&self, ready: bool) {
        self.shared.stages.lock().unwrap()[self.slot].ready = ready;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text_with_escaped_labels() {
        let mut snapshot = Snapshot::default();
        snapshot.add(RECORDS_CONSUMED, vec![("topic", "a\"b".into())], 3);
        snapshot.add(RECORDS_CONSUMED, vec![("topic", "a\"b".into())], 2);
        snapshot.set(TIMERS_PENDING, vec![("task", "0".into())], 4.0);
        let text = snapshot.render();
        assert!(
            text.contains("# TYPE streams_records_consumed_total counter"),
            "{text}"
        );
        assert!(
            text.contains("streams_records_consumed_total{topic=\"a\\\"b\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("streams_timers_pending{task=\"0\"} 4"),
            "{text}"
        );
        assert_eq!(snapshot.counter(RECORDS_CONSUMED, &[("topic", "a\"b")]), 5);
    }

    #[test]
    fn a_counter_sums_the_series_that_have_the_labels_asked_for() {
        let mut snapshot = Snapshot::default();
        let labels = |pairs: &[(&'static str, &str)]| -> Vec<(&'static str, String)> {
            pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
        };
        snapshot.add(RECORDS_LATE, labels(&[("topic", "a")]), 1);
        snapshot.add(RECORDS_LATE, labels(&[("topic", "b")]), 2);
        snapshot.add(
            RECORDS_LATE,
            labels(&[("topic", "a"), ("stage", "final")]),
            4,
        );
        snapshot.add(RECORDS_CONSUMED, labels(&[("topic", "a")]), 8);
        assert_eq!(snapshot.counter(RECORDS_LATE, &[]), 7);
        assert_eq!(snapshot.counter(RECORDS_LATE, &[("topic", "a")]), 5);
        assert_eq!(snapshot.counter(RECORDS_LATE, &[("stage", "final")]), 4);
        assert_eq!(
            snapshot.counter(RECORDS_LATE, &[("stage", "final"), ("topic", "a")]),
            4,
            "in any order"
        );
        assert_eq!(snapshot.counter(RECORDS_LATE, &[("topic", "c")]), 0);
        assert_eq!(snapshot.counter(RECORDS_DEAD_LETTERED, &[]), 0);
    }

    #[test]
    fn later_stages_are_labelled_and_readiness_needs_every_stage() {
        let metrics = Arc::new(Metrics::default());
        let first = metrics.add_stage(None);
        let second = metrics.add_stage(Some("final"));
        let mut snapshot = Snapshot::default();
        snapshot.add(COMMITS, vec![], 2);
        first.publish(snapshot.clone());
        second.publish(snapshot);
        let merged = metrics.snapshot();
        assert_eq!(merged.counter(COMMITS, &[]), 4, "both stages");
        assert_eq!(merged.counter(COMMITS, &[("stage", "final")]), 2);
        first.set_ready(true);
        assert!(!metrics.is_ready());
        second.set_ready(true);
        assert!(metrics.is_ready());
    }

    #[test]
    fn threads_of_a_stage_are_labelled_and_readiness_needs_every_thread() {
        let metrics = Arc::new(Metrics::default());
        let threads: Vec<StageMetrics> = (0..2)
            .map(|thread| metrics.add_thread(None, Some(thread)))
            .collect();
        for thread in &threads {
            let mut snapshot = Snapshot::default();
            snapshot.add(COMMITS, vec![], 3);
            snapshot.set(TASKS_INCOMPLETE, vec![], 1.0);
            thread.publish(snapshot);
        }
        let merged = metrics.snapshot();
        assert_eq!(merged.counter(COMMITS, &[]), 6, "both threads");
        assert_eq!(merged.counter(COMMITS, &[("thread", "1")]), 3);
        let incomplete: Vec<_> = merged
            .gauges
            .keys()
            .filter(|(name, _)| *name == TASKS_INCOMPLETE)
            .collect();
        assert_eq!(incomplete.len(), 2, "one gauge per thread: {incomplete:?}");
        threads[0].set_ready(true);
        assert!(!metrics.is_ready());
        threads[1].set_ready(true);
        assert!(metrics.is_ready());
    }
}
