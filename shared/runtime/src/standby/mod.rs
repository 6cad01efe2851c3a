//! Standby replicas (`--standby-replicas N`, Kafka Streams'
//! `num.standby.replicas`): warm copies of other instances' tasks.
//!
//! Each stage of an instance runs one standby thread beside its processing
//! threads. Every [`REFRESH`] it looks at its consumer group's description
//! (members, client ids, assignments, read by the [`watcher`]), works out
//! which tasks it keeps with the rule in [`placement`], and tails those tasks' changelog partitions
//! (read_committed: committed state only) into their local stores, exactly
//! where the task would keep its state: `<state-dir>/<stage>/task-<p>`, with
//! the same per-store checkpoints a restore writes. When the task then moves
//! here, opening it restores only what the changelog gained since the last
//! write of the standby: the tail.
//!
//! A task that becomes active in this process is handed over through
//! [`ActiveTasks`]: the processing thread marks it before opening its store;
//! the standby thread sees the mark within one poll, writes what it has
//! staged and closes the store, which the processing thread's state updater
//! is waiting to open (see [`TaskStore::try_open`]).
//!
//! Standbys need exactly-once: under at-least-once a changelog can be ahead
//! of the committed input offsets, and a copy that far ahead cannot be
//! trusted by the next owner (see `docs/fault-tolerance.md`).

pub(crate) mod placement;
mod watcher;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::client::brokers::BrokerWatch;
use crate::client::kafka::changelog_reader_config;
use crate::metrics::{Snapshot, StageMetrics, STANDBY_LAG, STANDBY_RECORDS, STANDBY_TASKS};
use crate::restore::{stale_checkpoint, ChangelogIds, StaleLocalState};
use crate::state::format::{self, UnknownFormat};
use crate::state::open_stores::StoreRole;
use crate::state::store::{RestoreBatch, StateResources, TaskStore};
use placement::standby_tasks;
use watcher::GroupWatcher;

/// How often the group's membership and the changelog ends are read.
const REFRESH: Duration = Duration::from_secs(1);
/// Changelog records staged per task before they are written to RocksDB.
const WRITE_BATCH: usize = 10_000;

/// The tasks a stage's processing threads have open (or are opening) in this
/// process: the standby thread keeps its hands off them.
#[derive(Default)]
pub(crate) struct ActiveTasks {
    /// The processing threads (by index) that hold each task. A task moving
    /// between two threads of the process is held by both for a moment:
    /// the new owner opens it while the old one, which had set it aside in
    /// an eager rebalance, closes it.
    tasks: Mutex<BTreeMap<i32, BTreeSet<usize>>>,
    /// Bumped on every change, so that the standby thread can check for one
    /// between two records without taking the lock.
    changes: AtomicU64,
}

/// One processing thread's hold on [`ActiveTasks`].
pub(crate) struct ThreadTasks {
    shared: Arc<ActiveTasks>,
    thread: usize,
}

impl ThreadTasks {
    /// Marks task `partition` held by this thread (about to be opened) or
    /// not (closed).
    pub fn set(&self, partition: i32, active: bool) {
        let mut tasks = self.shared.tasks.lock().unwrap();
        let holders = tasks.entry(partition).or_default();
        let changed = if active {
            holders.insert(self.thread)
        } else {
            holders.remove(&self.thread)
        };
        if holders.is_empty() {
            tasks.remove(&partition);
        }
        if changed {
            self.shared.changes.fetch_add(1, Ordering::Release);
        }
    }
}

impl ActiveTasks {
    /// Processing thread `thread`'s hold on these tasks.
    pub fn for_thread(self: &Arc<Self>, thread: usize) -> ThreadTasks {
        ThreadTasks {
            shared: self.clone(),
            thread,
        }
    }

    fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    fn snapshot(&self) -> BTreeSet<i32> {
        self.tasks.lock().unwrap().keys().copied().collect()
    }
}

/// What the standby thread of a stage needs to know about it.
pub(crate) struct StandbySettings {
    pub replicas: usize,
    /// The stage's consumer group.
    pub group: String,
    /// This instance's name, as in its members' client ids.
    pub instance: String,
    /// Whether members are static (`--instance-id`): the range assignor then
    /// orders them by `group.instance.id` instead of member id.
    pub static_members: bool,
    /// Topics whose partition *p* belongs to task *p*.
    pub task_topics: Vec<String>,
    /// The changelog topic of each store, by store index.
    pub changelogs: Vec<String>,
    pub store_names: Vec<String>,
    pub tasks: usize,
    pub state_dir: PathBuf,
}

/// A standby task: its store and what is staged for it.
struct Standby {
    store: TaskStore,
    batch: RestoreBatch,
}

/// The standby thread of a stage.
pub(crate) struct StandbyUpdater {
    settings: StandbySettings,
    consumer: BaseConsumer,
    /// The consumer's settings, for the rare look at a log's end.
    config: ClientConfig,
    changelog_ids: ChangelogIds,
    watcher: Arc<GroupWatcher>,
    resources: StateResources,
    active: Arc<ActiveTasks>,
    metrics: StageMetrics,
    shutdown: Arc<AtomicBool>,
    standbys: BTreeMap<i32, Standby>,
    /// Tasks whose state is of a newer format than this build reads: no
    /// standby of them while this process runs.
    unreadable: BTreeSet<i32>,
    /// The [`ActiveTasks`] change count last looked at.
    seen_changes: u64,
    /// The watcher's observation last acted on.
    seen_round: u64,
    applied: u64,
    lag: i64,
    /// The consumer given its bootstrap servers again if it drops every
    /// broker (a single broker restarting), as the stage's own clients are.
    brokers: BrokerWatch,
}

impl StandbyUpdater {
    pub fn new(
        settings: StandbySettings,
        base: &ClientConfig,
        resources: StateResources,
        active: Arc<ActiveTasks>,
        metrics: StageMetrics,
        shutdown: Arc<AtomicBool>,
    ) -> anyhow::Result<Self> {
        let config = changelog_reader_config(base, format!("{}-standby", settings.group));
        let consumer = config
            .create()
            .map_err(|e| anyhow::anyhow!("cannot create the standby consumer: {e}"))?;
        let watcher = GroupWatcher::new(
            base,
            &settings.group,
            settings.task_topics.clone(),
            settings.static_members,
        )?;
        Ok(StandbyUpdater {
            settings,
            consumer,
            config,
            changelog_ids: ChangelogIds::default(),
            watcher: Arc::new(watcher),
            resources,
            active,
            metrics,
            shutdown,
            standbys: BTreeMap::new(),
            unreadable: BTreeSet::new(),
            seen_changes: 0,
            seen_round: 0,
            applied: 0,
            lag: 0,
            brokers: BrokerWatch::default(),
        })
    }

    /// Keeps the standbys up to date until shutdown, then writes what is
    /// staged; the watcher runs beside it. Broker errors are logged and
    /// retried: standbys only save restore time, they never stop the
    /// service. So does state of a format this build cannot read (a
    /// rolling upgrade under way): the task gets no standby here. Only a
    /// failing local store is an error.
    pub fn run(mut self) -> anyhow::Result<()> {
        let watcher = self.watcher.clone();
        let shutdown = self.shutdown.clone();
        std::thread::scope(|scope| {
            scope.spawn(|| watcher.run(&shutdown));
            let result = self.update_until_shutdown();
            // A failure stops the service; the watcher stops with it.
            if result.is_err() {
                shutdown.store(true, Ordering::Relaxed);
            }
            result
        })
    }

    fn update_until_shutdown(&mut self) -> anyhow::Result<()> {
        while !self.shutdown.load(Ordering::Relaxed) {
            self.hand_over_activated()?;
            self.refresh()?;
            self.brokers.check(self.consumer.client());
            match self.consumer.poll(Duration::from_millis(50)) {
                Some(Ok(message)) => {
                    let partition = message.partition();
                    // Once per record: the name is read from librdkafka
                    // (and checked as UTF-8) at every call.
                    let changelog = message.topic();
                    let store_index = self
                        .settings
                        .changelogs
                        .iter()
                        .position(|topic| topic == changelog);
                    let (Some(standby), Some(store_index)) =
                        (self.standbys.get_mut(&partition), store_index)
                    else {
                        continue;
                    };
                    let format = match format::changelog_record_format(
                        message.headers(),
                        changelog,
                        partition,
                        message.offset(),
                    ) {
                        Ok(format) => format,
                        Err(error) if error.is::<UnknownFormat>() => {
                            self.set_aside_unreadable(partition, &error)?;
                            continue;
                        }
                        Err(error) => return Err(error),
                    };
                    standby.store.applying_format(format)?;
                    standby.store.stage_restored(
                        &mut standby.batch,
                        store_index,
                        message.offset(),
                        message.key().unwrap_or_default(),
                        message.payload(),
                    );
                    self.applied += 1;
                    if standby.batch.records() >= WRITE_BATCH {
                        write_staged(standby)?;
                    }
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, "standby: error while reading changelogs")
                }
                None => self.write_all()?,
            }
        }
        self.write_all()
    }

    /// Closes the standbys of tasks a processing thread of this process is
    /// opening, after writing what is staged for them.
    fn hand_over_activated(&mut self) -> anyhow::Result<()> {
        let changes = self.active.changes();
        if changes == self.seen_changes {
            return Ok(());
        }
        self.seen_changes = changes;
        let active = self.active.snapshot();
        let activated: Vec<i32> = self
            .standbys
            .keys()
            .filter(|task| active.contains(task))
            .copied()
            .collect();
        if activated.is_empty() {
            return Ok(());
        }
        for task in activated {
            let mut standby = self.standbys.remove(&task).expect("a standby");
            write_staged(&mut standby)?;
            tracing::info!(task, "standby handed over to the active task");
        }
        self.assign()
    }

    /// Acts on a new observation of the watcher, if there is one: starts
    /// or stops standbys to match the placement, and publishes the standby
    /// metrics.
    fn refresh(&mut self) -> anyhow::Result<()> {
        let observed = self.watcher.observed();
        if observed.round == self.seen_round {
            return Ok(());
        }
        self.seen_round = observed.round;
        if let Some(members) = &observed.members {
            let active = self.active.snapshot();
            let wanted: BTreeSet<i32> = standby_tasks(
                members,
                &self.settings.instance,
                self.settings.tasks,
                self.settings.replicas,
            )
            .into_iter()
            .filter(|task| !active.contains(task) && !self.unreadable.contains(task))
            .collect();
            let current: BTreeSet<i32> = self.standbys.keys().copied().collect();
            // New standbys wait until the process's active tasks are all
            // open: after a failover, catching up on other tasks'
            // changelogs would take the cores the takeover needs.
            let start_new = self.metrics.process_ready();
            let dropped: Vec<i32> = current.difference(&wanted).copied().collect();
            let started: Vec<i32> = if start_new {
                wanted.difference(&current).copied().collect()
            } else {
                Vec::new()
            };
            for task in &dropped {
                let mut standby = self.standbys.remove(task).expect("a standby");
                write_staged(&mut standby)?;
                tracing::info!(task, "standby dropped");
            }
            for task in &started {
                self.open(*task)?;
            }
            if !dropped.is_empty() || !started.is_empty() {
                self.assign()?;
            }
        }
        self.lag = self.lag(&observed.ends)?;
        self.publish();
        Ok(())
    }

    /// Opens the local store of task `task` as a standby. A store still held
    /// by a processing thread that is closing it is tried again at the next
    /// refresh; one of a format this build cannot read is left alone.
    fn open(&mut self, task: i32) -> anyhow::Result<()> {
        let path = self.settings.state_dir.join(format!("task-{task}"));
        let mut opened = TaskStore::open(&path, &self.settings.store_names, &self.resources);
        if let Ok(store) = &opened {
            match self.stale_state(store, task) {
                Ok(None) => {}
                Ok(Some(stale)) => {
                    tracing::warn!(task, "{stale}; wiping it");
                    drop(opened);
                    std::fs::remove_dir_all(&path)?;
                    opened = TaskStore::open(&path, &self.settings.store_names, &self.resources);
                }
                Err(error) => opened = Err(error),
            }
        }
        match opened {
            Ok(store) => {
                let batch = store.restore_batch();
                store.serve_queries_as(StoreRole::Standby);
                tracing::info!(task, "standby started");
                self.standbys.insert(task, Standby { store, batch });
            }
            Err(error) if error.is::<UnknownFormat>() => {
                tracing::warn!(task, "no standby of this task: {error:#}");
                self.unreadable.insert(task);
            }
            Err(error) => tracing::info!(task, %error, "standby not started yet"),
        }
        Ok(())
    }

    /// Stops the standby of task `task`, whose changelog holds a record of
    /// a format this build cannot read (`error`): a rolling upgrade to a
    /// newer format is under way. Standbys only save restore time, so this
    /// process goes on without that one; what it staged before the record
    /// is written.
    fn set_aside_unreadable(&mut self, task: i32, error: &anyhow::Error) -> anyhow::Result<()> {
        if let Some(mut standby) = self.standbys.remove(&task) {
            write_staged(&mut standby)?;
        }
        self.unreadable.insert(task);
        tracing::warn!(
            task,
            "standby stopped: {error:#}; this instance keeps no standby of the task until it \
             runs a build that reads that format"
        );
        self.assign()
    }

    /// Whether `store`, task `task`'s, holds the state of a changelog since
    /// deleted, or reaches past the end of one (see [`StaleLocalState`]).
    fn stale_state(&self, store: &TaskStore, task: i32) -> anyhow::Result<Option<StaleLocalState>> {
        let changelogs = &self.settings.changelogs;
        let recreated =
            self.changelog_ids
                .check(self.consumer.client(), store, changelogs, task)?;
        if recreated.is_some() {
            return Ok(recreated);
        }
        for (index, topic) in changelogs.iter().enumerate() {
            let Some(checkpoint) = store.checkpoint(index)? else {
                continue;
            };
            let (_, end) = self
                .consumer
                .fetch_watermarks(topic, task, Duration::from_secs(10))?;
            if checkpoint >= end {
                if let Some(stale) = stale_checkpoint(&self.config, topic, task, checkpoint)? {
                    return Ok(Some(stale));
                }
            }
        }
        Ok(None)
    }

    /// Points the consumer at every standby's changelog partitions, each
    /// from just past its store's checkpoint.
    fn assign(&mut self) -> anyhow::Result<()> {
        let mut assignment = TopicPartitionList::new();
        for (task, standby) in &self.standbys {
            for (index, topic) in self.settings.changelogs.iter().enumerate() {
                let offset = match standby.store.checkpoint(index)? {
                    Some(offset) => Offset::Offset(offset + 1),
                    None => Offset::Beginning,
                };
                assignment.add_partition_offset(topic, *task, offset)?;
            }
        }
        self.consumer.assign(&assignment)?;
        self.watcher.watch(
            assignment
                .elements()
                .iter()
                .map(|element| (element.topic().to_string(), element.partition()))
                .collect(),
        );
        Ok(())
    }

    /// Records the standbys are behind the changelog ends in `ends`,
    /// summed; -1 while an end is not known yet.
    fn lag(&self, ends: &HashMap<(String, i32), i64>) -> anyhow::Result<i64> {
        let positions = self.consumer.position()?;
        let mut lag = 0;
        for (task, standby) in &self.standbys {
            for (index, topic) in self.settings.changelogs.iter().enumerate() {
                let Some(end) = ends.get(&(topic.clone(), *task)) else {
                    return Ok(-1);
                };
                // The last offset (a transaction marker, often): a query's
                // lag is counted from it.
                standby.store.changelog_reached(index, end - 1);
                // The consumer's position moves past transaction markers;
                // before anything is fetched it is unset, and the standby
                // stands where it was assigned: past its checkpoint.
                let position = match positions.find_partition(topic, *task).map(|e| e.offset()) {
                    Some(Offset::Offset(offset)) => offset,
                    _ => match standby.store.checkpoint(index)? {
                        Some(checkpoint) => checkpoint + 1,
                        None => 0,
                    },
                };
                lag += (end - position).max(0);
            }
        }
        Ok(lag)
    }

    fn write_all(&mut self) -> anyhow::Result<()> {
        for standby in self.standbys.values_mut() {
            write_staged(standby)?;
        }
        Ok(())
    }

    fn publish(&self) {
        let mut snapshot = Snapshot::default();
        snapshot.set(STANDBY_TASKS, vec![], self.standbys.len() as f64);
        snapshot.set(STANDBY_LAG, vec![], self.lag as f64);
        snapshot.add(STANDBY_RECORDS, vec![], self.applied);
        self.metrics.publish(snapshot);
    }
}

/// Writes what is staged for `standby`, with its checkpoints.
fn write_staged(standby: &mut Standby) -> anyhow::Result<()> {
    if standby.batch.records() == 0 {
        return Ok(());
    }
    let batch = std::mem::replace(&mut standby.batch, standby.store.restore_batch());
    standby.store.write_restored(batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_held_by_two_threads_is_active_until_both_let_go() {
        let active = Arc::new(ActiveTasks::default());
        let (old_owner, new_owner) = (active.for_thread(0), active.for_thread(1));
        old_owner.set(3, true);
        let before = active.changes();
        // The new owner opens it before the old one, which set it aside in
        // an eager rebalance, has closed it.
        new_owner.set(3, true);
        old_owner.set(3, false);
        assert_eq!(active.snapshot(), BTreeSet::from([3]));
        assert!(active.changes() > before);
        new_owner.set(3, false);
        assert!(active.snapshot().is_empty());
        let settled = active.changes();
        new_owner.set(3, false);
        assert_eq!(
            active.changes(),
            settled,
            "letting go twice changes nothing"
        );
    }
}
