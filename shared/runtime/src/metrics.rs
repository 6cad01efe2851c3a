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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
/// Counter: the sum, over committed input records, of the wall-clock time
/// from each record's Kafka timestamp to the commit that carried it.
pub const E2E_LATENCY_SECONDS: &str = "streams_e2e_latency_seconds_total";
/// Counter: the input records [`E2E_LATENCY_SECONDS`] counts.
pub const E2E_LATENCY_RECORDS: &str = "streams_e2e_latency_records_total";
/// Gauge: the largest end-to-end latency of the last commit that carried
/// records.
pub const E2E_LATENCY_MAX: &str = "streams_e2e_latency_max_seconds";
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
/// Each task this processing thread is assigned whole, by `task`: 1 once
/// it is open and processing, 0 while the state updater opens it (waits
/// for its store, restores it from its changelogs, loads its timers).
pub const TASK_READY: &str = "streams_task_ready";
/// The processing thread's state, by `state`: 1 for the one it is in, 0
/// for the others (see [`ThreadState`]).
pub const THREAD_STATE: &str = "streams_thread_state";
/// Wall clock minus task watermark, by task.
pub const WATERMARK_LAG: &str = "streams_watermark_lag_seconds";
/// Estimated bytes of committed state, by task.
pub const STATE_BYTES: &str = "streams_state_bytes";
/// Estimated keys per store and task.
pub const STATE_KEYS: &str = "streams_state_keys";
/// Gauge, per task and `kind`: RocksDB's memtables, live SST files, and
/// bytes compaction still has to rewrite.
pub const ROCKSDB_BYTES: &str = "streams_rocksdb_bytes";
/// Gauge, per `client` (`consumer`, `producer`), `broker` and `quantile`:
/// request round trips to the broker, from librdkafka's statistics.
pub const KAFKA_REQUEST_LATENCY: &str = "streams_kafka_request_latency_seconds";
/// Gauge, per `client` and `broker`: the longest a broker throttled the
/// client in librdkafka's last statistics window (quotas).
pub const KAFKA_THROTTLE_MAX: &str = "streams_kafka_throttle_max_seconds";
/// Counter, per `client`: requests that timed out.
pub const KAFKA_REQUEST_TIMEOUTS: &str = "streams_kafka_request_timeouts_total";
/// Gauge, per `kind`: the process's one RocksDB block cache, its capacity,
/// usage (memtables charged to it included) and pinned part.
pub const ROCKSDB_BLOCK_CACHE_BYTES: &str = "streams_rocksdb_block_cache_bytes";
/// Pending timers, by task (spilled ones included).
pub const TIMERS_PENDING: &str = "streams_timers_pending";
/// Pending timers beyond the task's memory budget, kept in its RocksDB.
pub const TIMERS_SPILLED: &str = "streams_timers_spilled";
/// Domain counters incremented by the processor, by name.
pub const PROCESSOR_EVENTS: &str = "streams_processor_events_total";
/// Records between the consumer's position and the end of each assigned
/// input partition (its high watermark as the last fetch saw it), by
/// `topic` and `partition`, read every second.
pub const CONSUMER_LAG: &str = "streams_consumer_lag_records";
/// Changelog records a task still has to replay before it processes, by
/// `store` and `task`; the series goes when the restore ends.
pub const RESTORE_REMAINING: &str = "streams_restore_remaining_records";
/// Assignments the group's rebalances handed this processing thread (an
/// empty one included: each rebalance ends with one).
pub const REBALANCES: &str = "streams_rebalances_total";
/// 1 when `/readyz` answers 200, else 0.
pub const READY: &str = "streams_ready";
/// Seconds a processing thread has gone without progress while input
/// waits for it; `/healthz` fails past `--liveness-timeout` (see
/// [`StageActivity`]).
pub const STALLED_SECONDS: &str = "streams_stalled_seconds";
/// Always 1, labelled with the `version` and `commit` the binary was built from.
pub const BUILD_INFO: &str = "streams_build_info";
/// CPU seconds the process has used, user and system (Linux).
pub const PROCESS_CPU_SECONDS: &str = "process_cpu_seconds_total";
/// Resident memory of the process (Linux).
pub const PROCESS_RESIDENT_MEMORY: &str = "process_resident_memory_bytes";
/// When the process started, in seconds since the Unix epoch (Linux).
pub const PROCESS_START_TIME: &str = "process_start_time_seconds";

/// What a processing thread is doing, as [`THREAD_STATE`] says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadState {
    /// Every task it is assigned is open and processing.
    Running,
    /// An assignment is awaited (before the first one, or after a
    /// revocation took every task), or a task lacks some of its
    /// partitions.
    Rebalancing,
    /// Some task it is assigned is still being opened; the open ones
    /// process meanwhile.
    Restoring,
    /// A processing thread of the process failed: every thread stops and
    /// the process exits non-zero (set for all of them, see
    /// [`Metrics::set_failed`]).
    Error,
}

impl ThreadState {
    const ALL: [ThreadState; 4] = [
        ThreadState::Running,
        ThreadState::Rebalancing,
        ThreadState::Restoring,
        ThreadState::Error,
    ];

    fn label(self) -> &'static str {
        match self {
            ThreadState::Running => "running",
            ThreadState::Rebalancing => "rebalancing",
            ThreadState::Restoring => "restoring",
            ThreadState::Error => "error",
        }
    }

    /// Sets [`THREAD_STATE`] in `snapshot`: 1 for this state, 0 for the others.
    pub fn export(self, snapshot: &mut Snapshot) {
        for state in Self::ALL {
            snapshot.set(
                THREAD_STATE,
                vec![("state", state.label().to_string())],
                f64::from(u8::from(state == self)),
            );
        }
    }
}

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
/// snapshot, one readiness flag and one [`StageActivity`] per processing
/// thread of each stage.
#[derive(Default)]
pub struct Metrics {
    stages: Mutex<Vec<StageSlot>>,
    failed: AtomicBool,
    /// How long a processing thread may go without progress while input
    /// waits before `/healthz` fails (`--liveness-timeout`); never when `None`.
    liveness_timeout: Option<Duration>,
    /// Series of the process as a whole, read when `/metrics` is asked.
    process_gauges: Mutex<Vec<ProcessGauges>>,
}

/// Sets gauges of the whole process on a snapshot (see
/// [`Metrics::add_process_gauges`]).
pub type ProcessGauges = Box<dyn Fn(&mut Snapshot) + Send + Sync>;

/// One processing thread's last published state.
struct StageSlot {
    /// `None` for the first stage; later stages label their series with it.
    label: Option<String>,
    /// The thread's index when its stage has several (`--stream-threads`),
    /// which then labels its series.
    thread: Option<String>,
    snapshot: Snapshot,
    ready: bool,
    /// `None` for a slot that processes nothing (the standby updater): it
    /// neither stalls nor restores, and must not report that it does not
    /// under the labels of the processing thread it shares them with.
    activity: Option<Arc<StageActivity>>,
}

/// What a processing thread reports as it goes rather than at its commits,
/// read whenever `/metrics` or `/healthz` is asked: when it last made
/// progress, and the restore it is in. A thread stuck in a call cannot
/// publish that it is stuck; the time since its last progress says so.
///
/// Progress is records processed (consumed records a task holds back do
/// not count), changelog records restored, a turn of the loop with no input
/// waiting (an idle service is not stalled), or a consumer error (Kafka out of reach is not the thread's
/// fault, and restarting would not help).
#[derive(Debug)]
pub struct StageActivity {
    epoch: Instant,
    /// Milliseconds after `epoch` of the last progress, plus one; 0 before
    /// the loop's first turn (start-up is not a stall).
    last_progress_ms: AtomicU64,
    /// Changelog records left to replay, by (store, task).
    restoring: Mutex<BTreeMap<(String, i32), u64>>,
}

impl Default for StageActivity {
    fn default() -> Self {
        StageActivity {
            epoch: Instant::now(),
            last_progress_ms: AtomicU64::new(0),
            restoring: Mutex::default(),
        }
    }
}

impl StageActivity {
    /// Notes that the thread made progress now.
    pub fn progressed(&self) {
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        self.last_progress_ms.store(now, Ordering::Relaxed);
    }

    /// How long the thread has gone without progress (zero before its
    /// first turn).
    pub fn stalled_for(&self) -> Duration {
        match self.last_progress_ms.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            last => self
                .epoch
                .elapsed()
                .saturating_sub(Duration::from_millis(last - 1)),
        }
    }

    /// Records how many changelog records task `task`'s store `store`
    /// still has to replay; restoring is progress.
    pub fn restoring(&self, store: &str, task: i32, remaining: u64) {
        self.restoring
            .lock()
            .unwrap()
            .insert((store.to_string(), task), remaining);
        self.progressed();
    }

    /// Task `task`'s restore has ended (or stopped): its series go.
    pub fn restored(&self, task: i32) {
        self.restoring
            .lock()
            .unwrap()
            .retain(|(_, restoring), _| *restoring != task);
    }

    fn export(&self, snapshot: &mut Snapshot) {
        snapshot.set(STALLED_SECONDS, vec![], self.stalled_for().as_secs_f64());
        for ((store, task), remaining) in self.restoring.lock().unwrap().iter() {
            snapshot.set(
                RESTORE_REMAINING,
                vec![("store", store.clone()), ("task", task.to_string())],
                *remaining as f64,
            );
        }
    }
}

impl Metrics {
    /// Metrics whose `/healthz` fails once a processing thread has gone
    /// `liveness_timeout` without progress while input waits.
    pub fn with_liveness_timeout(liveness_timeout: Option<Duration>) -> Self {
        Metrics {
            liveness_timeout,
            ..Metrics::default()
        }
    }

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
        self.add_slot(StageSlot {
            label: label.map(str::to_string),
            thread: thread.map(|index| index.to_string()),
            snapshot: Snapshot::default(),
            ready: false,
            activity: Some(Arc::default()),
        })
    }

    /// Registers the standby updater of a stage: its series carry the
    /// stage's labels, it is always ready, and it reports no activity
    /// (stall, restore) of its own.
    pub fn add_standby(self: &Arc<Self>, label: Option<&str>) -> StageMetrics {
        self.add_slot(StageSlot {
            label: label.map(str::to_string),
            thread: None,
            snapshot: Snapshot::default(),
            ready: true,
            activity: None,
        })
    }

    fn add_slot(self: &Arc<Self>, slot: StageSlot) -> StageMetrics {
        let mut stages = self.stages.lock().unwrap();
        stages.push(slot);
        StageMetrics {
            shared: self.clone(),
            slot: stages.len() - 1,
        }
    }

    /// Adds `gauges`, series of the whole process that no thread owns
    /// (CPU and memory, the shared block cache), read at every
    /// [`Metrics::snapshot`].
    pub fn add_process_gauges(&self, gauges: ProcessGauges) {
        self.process_gauges.lock().unwrap().push(gauges);
    }

    /// Every stage's last snapshot and present activity, merged, with the
    /// process's own series.
    pub fn snapshot(&self) -> Snapshot {
        let stages = self.stages.lock().unwrap();
        let mut merged = Snapshot::default();
        merged.set(READY, vec![], f64::from(u8::from(Self::all_ready(&stages))));
        export_build_info(&mut merged);
        for gauges in self.process_gauges.lock().unwrap().iter() {
            gauges(&mut merged);
        }
        for stage in stages.iter() {
            let mut activity = Snapshot::default();
            if let Some(stage_activity) = &stage.activity {
                stage_activity.export(&mut activity);
            }
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
            for (series, value) in stage.snapshot.gauges.iter().chain(&activity.gauges) {
                merged.gauges.insert(relabel(series), *value);
            }
        }
        if self.has_failed() {
            let error = ThreadState::Error.label();
            for ((name, labels), value) in merged.gauges.iter_mut() {
                if *name == THREAD_STATE {
                    let is_error = labels
                        .iter()
                        .any(|(key, state)| *key == "state" && state == error);
                    *value = f64::from(u8::from(is_error));
                }
            }
        }
        merged
    }

    /// Whether every thread of every stage has all its assigned tasks
    /// restored and processing.
    pub fn is_ready(&self) -> bool {
        Self::all_ready(&self.stages.lock().unwrap())
    }

    fn all_ready(stages: &[StageSlot]) -> bool {
        !stages.is_empty() && stages.iter().all(|stage| stage.ready)
    }

    /// Why `/healthz` fails, if it does: a processing loop failed, or one
    /// has gone past the liveness timeout without progress while input waits.
    pub fn unhealthy(&self) -> Option<String> {
        if self.has_failed() {
            return Some("failed".to_string());
        }
        let timeout = self.liveness_timeout?;
        let stages = self.stages.lock().unwrap();
        stages.iter().find_map(|stage| {
            let stalled = stage.activity.as_ref()?.stalled_for();
            (stalled > timeout).then(|| {
                let stage_name = match &stage.label {
                    Some(label) => format!("stage {label}"),
                    None => "the first stage".to_string(),
                };
                let thread = stage.thread.as_deref().unwrap_or("0");
                format!(
                    "stalled: processing thread {thread} of {stage_name} has made no progress \
                     for {} s although input waits (--liveness-timeout {} s)",
                    stalled.as_secs(),
                    timeout.as_secs()
                )
            })
        })
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

    /// This thread's [`StageActivity`], to report progress and restores on.
    pub fn activity(&self) -> Arc<StageActivity> {
        (self.shared.stages.lock().unwrap()[self.slot]
            .activity
            .clone())
        .expect("a processing thread's slot has its activity")
    }
}

/// The version and commit this binary was built from. The commit is
/// `STREAMS_BUILD_COMMIT` at build time, which the release builds set
/// (`make image`, the Dockerfile); a development build says `unknown`
/// rather than rebuild the runtime at every commit.
fn export_build_info(snapshot: &mut Snapshot) {
    snapshot.set(
        BUILD_INFO,
        vec![
            ("version", env!("CARGO_PKG_VERSION").to_string()),
            (
                "commit",
                option_env!("STREAMS_BUILD_COMMIT")
                    .unwrap_or("unknown")
                    .to_string(),
            ),
        ],
        1.0,
    );
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

    /// Two processing threads of the first stage.
    fn two_threads(metrics: &Arc<Metrics>) -> Vec<StageMetrics> {
        (0..2)
            .map(|thread| metrics.add_thread(None, Some(thread)))
            .collect()
    }

    #[test]
    fn threads_of_a_stage_are_labelled_and_readiness_needs_every_thread() {
        let metrics = Arc::new(Metrics::default());
        let threads = two_threads(&metrics);
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

    #[test]
    fn a_thread_without_progress_past_the_timeout_fails_liveness_until_it_progresses() {
        let metrics = Arc::new(Metrics::with_liveness_timeout(Some(Duration::from_millis(
            50,
        ))));
        let _first = metrics.add_stage(None);
        let second = metrics.add_stage(Some("final"));
        let activity = second.activity();
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(metrics.unhealthy(), None, "start-up is not a stall");
        activity.progressed();
        std::thread::sleep(Duration::from_millis(80));
        let why = metrics.unhealthy().expect("stalled");
        assert!(
            why.starts_with("stalled: processing thread 0 of stage final"),
            "{why}"
        );
        assert!(
            metrics
                .snapshot()
                .gauge(STALLED_SECONDS, &[("stage", "final")])
                >= 0.08
        );
        activity.progressed();
        assert_eq!(metrics.unhealthy(), None);
        metrics.set_failed();
        assert_eq!(metrics.unhealthy().as_deref(), Some("failed"));
    }

    #[test]
    fn a_failed_process_shows_every_thread_in_error() {
        let metrics = Arc::new(Metrics::default());
        let threads = two_threads(&metrics);
        for thread in &threads {
            let mut snapshot = Snapshot::default();
            ThreadState::Running.export(&mut snapshot);
            thread.publish(snapshot);
        }
        let state = |metrics: &Metrics, state: &str| {
            metrics.snapshot().gauge(THREAD_STATE, &[("state", state)])
        };
        assert_eq!(state(&metrics, "running"), 2.0);
        assert_eq!(state(&metrics, "error"), 0.0);
        metrics.set_failed();
        assert_eq!(state(&metrics, "running"), 0.0);
        assert_eq!(state(&metrics, "error"), 2.0);
    }

    #[test]
    fn a_standby_beside_a_stalled_thread_leaves_its_stall_reported() {
        let metrics = Arc::new(Metrics::with_liveness_timeout(Some(Duration::from_millis(
            50,
        ))));
        let thread = metrics.add_thread(None, None);
        let mut standby = Snapshot::default();
        standby.set(STANDBY_TASKS, vec![], 1.0);
        metrics.add_standby(None).publish(standby);
        thread.activity().progressed();
        std::thread::sleep(Duration::from_millis(80));
        let snapshot = metrics.snapshot();
        assert!(snapshot.gauge(STALLED_SECONDS, &[]) >= 0.08);
        assert_eq!(snapshot.gauge(STANDBY_TASKS, &[]), 1.0);
        assert!(metrics.unhealthy().is_some());
        thread.set_ready(true);
        assert!(metrics.is_ready(), "a standby never holds readiness back");
    }

    #[test]
    fn restores_are_reported_while_they_run_and_readiness_is_a_gauge() {
        let metrics = Arc::new(Metrics::default());
        let stage = metrics.add_stage(None);
        let activity = stage.activity();
        activity.restoring("windows", 3, 1200);
        activity.restoring("windows", 4, 10);
        let snapshot = metrics.snapshot();
        assert_eq!(snapshot.gauge(RESTORE_REMAINING, &[("task", "3")]), 1200.0);
        assert_eq!(
            snapshot.gauge(RESTORE_REMAINING, &[("store", "windows")]),
            1210.0
        );
        assert_eq!(snapshot.gauge(READY, &[]), 0.0);
        activity.restored(3);
        stage.set_ready(true);
        let snapshot = metrics.snapshot();
        assert_eq!(snapshot.gauge(RESTORE_REMAINING, &[]), 10.0);
        assert_eq!(snapshot.gauge(READY, &[]), 1.0);
        assert_eq!(
            snapshot.gauge(BUILD_INFO, &[("version", env!("CARGO_PKG_VERSION"))]),
            1.0
        );
        assert_eq!(
            metrics.unhealthy(),
            None,
            "no liveness timeout: never stalled"
        );
    }
}
