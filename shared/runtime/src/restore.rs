//! Restoring a task's state from its changelog topics.
//!
//! Local RocksDB only ever holds committed changes plus, per store, the
//! changelog offset they reach. Restoring a store therefore reads its
//! changelog partition from that checkpoint (or from the beginning when there
//! is no local state) up to the end, and writes it in large batches.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::{Client, ClientContext};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::client::brokers::rebootstrap_if_cut_off;
use crate::client::kafka::restore_reader_config;
use crate::metrics::StageActivity;
use crate::native_admin;
use crate::shutdown::Interrupted;
use crate::state::store::TaskStore;

/// Records restored between two reports of the records left.
const REPORT_EVERY: usize = 50_000;
/// How long a restore waits without progress before taking the end as reached
/// (transaction markers and aborted records at the tail are never delivered).
const IDLE_END: Duration = Duration::from_secs(2);

/// How far into each of a task's changelogs (by store index) a commit of
/// its input offsets reaches: the offset of the last changelog record that
/// belongs to committed work, `None` for a changelog none of whose records
/// does.
///
/// Under exactly-once the changelogs are read `read_committed` and hold only
/// committed work. Under at-least-once a commit writes its changelog records
/// first and its input offsets after them, so a crash in between leaves
/// records of work whose input will be processed again; restoring them would
/// apply that input twice (or, with the input positions kept in state, skip
/// input whose outputs never went out). So each at-least-once offset commit
/// carries this reach in its metadata, and a restore stops there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChangelogReach(pub Vec<Option<i64>>);

impl ChangelogReach {
    const PREFIX: &'static str = "streams.changelogs=";

    /// The reach when nothing was ever committed: no changelog record counts.
    pub fn nothing(stores: usize) -> Self {
        ChangelogReach(vec![None; stores])
    }

    /// The offset commit metadata: `streams.changelogs=12,-,40`.
    pub fn to_metadata(&self) -> String {
        let offsets: Vec<String> = self
            .0
            .iter()
            .map(|offset| offset.map_or("-".to_string(), |offset| offset.to_string()))
            .collect();
        format!("{}{}", Self::PREFIX, offsets.join(","))
    }

    /// Reads [`ChangelogReach::to_metadata`]'s text back, for `stores` stores.
    pub fn from_metadata(text: &str, stores: usize) -> Option<Self> {
        let offsets = text
            .strip_prefix(Self::PREFIX)?
            .split(',')
            .map(|offset| match offset {
                "-" => Some(None),
                offset => offset.parse().ok().map(Some),
            })
            .collect::<Option<Vec<Option<i64>>>>()?;
        (offsets.len() == stores).then_some(ChangelogReach(offsets))
    }

    /// The further of the two reaches, store by store: commits only move
    /// forward, so of the reaches kept on a task's input partitions the
    /// furthest is the last commit's (a partition the last commit did not
    /// include still carries an older one).
    pub fn furthest(self, other: Self) -> Self {
        ChangelogReach(
            self.0
                .into_iter()
                .zip(other.0)
                .map(|(a, b)| a.max(b))
                .collect(),
        )
    }
}

/// How long a restore retries reading a changelog partition's offsets.
const WATERMARKS_PATIENCE: Duration = Duration::from_secs(30);

/// Reads changelog partitions into task stores.
pub(crate) struct Restorer {
    consumer: BaseConsumer,
    /// The consumer's settings, for the rare look at a log's end.
    config: ClientConfig,
    changelog_ids: ChangelogIds,
    /// Where each restore reports the records it has left, by store.
    activity: Arc<StageActivity>,
    /// The stage's store names, by store index.
    store_names: Vec<String>,
}

impl Restorer {
    /// A restorer using a group-less, read_committed consumer, reporting
    /// its progress on `activity`.
    pub fn new(
        base: &ClientConfig,
        application_id: &str,
        activity: Arc<StageActivity>,
        store_names: Vec<String>,
    ) -> anyhow::Result<Self> {
        let config = restore_reader_config(base, application_id);
        let consumer = config
            .create()
            .map_err(|e| anyhow::anyhow!("cannot create the restore consumer: {e}"))?;
        Ok(Restorer {
            consumer,
            config,
            changelog_ids: ChangelogIds::default(),
            activity,
            store_names,
        })
    }

    /// Brings every store of `store` up to the end of its changelog
    /// partition, or only as far as `reach` when given. Returns the number of
    /// changelog records applied.
    ///
    /// All the task's changelogs are read at once, in one assignment, so
    /// their fetches overlap and no changelog waits for the one before it.
    ///
    /// Once `shutdown` is set (the service stops, or the task was revoked)
    /// the restore stops with `Interrupted`, what it read so far written
    /// with its checkpoint (so the next opening goes on from there). Local state of a changelog since deleted, or that
    /// reaches past the end of one, fails with [`StaleLocalState`] before
    /// anything is read.
    pub fn restore(
        &self,
        store: &mut TaskStore,
        changelogs: &[String],
        partition: i32,
        reach: Option<&ChangelogReach>,
        shutdown: &AtomicBool,
    ) -> anyhow::Result<u64> {
        // Idle between restores, the consumer may have lost its brokers
        // to a broker restart meanwhile.
        rebootstrap_if_cut_off(self.consumer.client());
        let recreated =
            self.changelog_ids
                .check(self.consumer.client(), store, changelogs, partition)?;
        if let Some(stale) = recreated {
            return Err(stale.into());
        }
        let mut pending = Vec::new();
        for (index, topic) in changelogs.iter().enumerate() {
            let (low, high) = self.watermarks(topic, partition, shutdown)?;
            let checkpoint = store.checkpoint(index)?;
            if let Some(checkpoint) = checkpoint.filter(|checkpoint| *checkpoint >= high) {
                if let Some(stale) = stale_checkpoint(&self.config, topic, partition, checkpoint)? {
                    return Err(stale.into());
                }
            }
            let first = match checkpoint {
                Some(offset) => (offset + 1).max(low),
                None => low,
            };
            let high = match reach.map(|reach| reach.0[index]) {
                None => high,
                Some(None) => low,
                Some(Some(last)) => high.min(last + 1),
            };
            if first < high {
                pending.push(Changelog {
                    index,
                    topic,
                    first,
                    end: high,
                    next: first,
                    restored: 0,
                    done: false,
                });
            }
        }
        if pending.is_empty() {
            return Ok(0);
        }
        let started = Instant::now();
        let mut assignment = TopicPartitionList::new();
        for changelog in &pending {
            assignment.add_partition_offset(
                changelog.topic,
                partition,
                Offset::Offset(changelog.first),
            )?;
        }
        self.consumer.assign(&assignment)?;
        self.report(&pending, partition);
        let result = self.read_all(store, &mut pending, partition, shutdown);
        self.activity.restored(partition);
        self.consumer.unassign()?;
        let bulk = result?;
        let elapsed_ms = started.elapsed().as_millis() as u64;
        for changelog in &pending {
            tracing::info!(
                topic = changelog.topic,
                partition,
                records = changelog.restored,
                elapsed_ms,
                bulk,
                "restored changelog"
            );
        }
        Ok(pending.iter().map(|changelog| changelog.restored).sum())
    }

    /// The first and end offsets of a changelog partition. Right after the
    /// topic is created, or while its leader moves, the broker answers
    /// "not leader" or "unknown partition" for a moment: such answers are
    /// retried for up to [`WATERMARKS_PATIENCE`].
    fn watermarks(
        &self,
        topic: &str,
        partition: i32,
        shutdown: &AtomicBool,
    ) -> anyhow::Result<(i64, i64)> {
        let deadline = Instant::now() + WATERMARKS_PATIENCE;
        loop {
            crate::shutdown::check(shutdown)?;
            match self
                .consumer
                .fetch_watermarks(topic, partition, Duration::from_secs(10))
            {
                Ok(watermarks) => return Ok(watermarks),
                Err(error) if Instant::now() < deadline => {
                    tracing::warn!(%error, topic, partition, "cannot read the end of a changelog yet; retrying");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(error) => {
                    anyhow::bail!("cannot read the end of changelog {topic}-{partition}: {error}")
                }
            }
        }
    }

    /// Reads the assigned changelogs to their ends into `store`: in
    /// batches, each written while the next is read, or, a long restore
    /// into a store with nothing in it, as a bulk load
    /// ([`TaskStore::begin_restore`]); says which.
    fn read_all(
        &self,
        store: &mut TaskStore,
        pending: &mut [Changelog<'_>],
        partition: i32,
        shutdown: &AtomicBool,
    ) -> anyhow::Result<bool> {
        let records = pending
            .iter()
            .map(|c| (c.end - c.first).max(0) as u64)
            .sum();
        let mut restoring = store.begin_restore(records)?;
        let bulk = restoring.is_bulk();
        let mut unreported = 0;
        // Progress is timed at the first empty poll after it, not per record.
        let (mut last_progress, mut progressed) = (Instant::now(), false);
        while pending.iter().any(|changelog| !changelog.done) {
            if shutdown.load(Ordering::Relaxed) {
                let restored: u64 = pending.iter().map(|changelog| changelog.restored).sum();
                tracing::info!(partition, restored, "restore stopped");
                store.finish_restore(restoring)?;
                return Err(Interrupted.into());
            }
            match self.consumer.poll(Duration::from_millis(10)) {
                Some(Ok(message)) => {
                    progressed = true;
                    // Once per record: the name is read from librdkafka
                    // (and checked as UTF-8) at every call.
                    let topic = message.topic();
                    let Some(changelog) = pending
                        .iter_mut()
                        .find(|changelog| changelog.topic == topic)
                    else {
                        continue;
                    };
                    if message.offset() >= changelog.end {
                        // Past the reach: work that was never committed.
                        changelog.done = true;
                        continue;
                    }
                    let format = crate::state::format::changelog_record_format(
                        message.headers(),
                        changelog.topic,
                        partition,
                        message.offset(),
                    )?;
                    store.applying_format(format)?;
                    let key = message.key().unwrap_or_default();
                    store.restore_record(
                        &mut restoring,
                        changelog.index,
                        message.offset(),
                        key,
                        message.payload(),
                    )?;
                    changelog.restored += 1;
                    changelog.next = message.offset() + 1;
                    changelog.done = changelog.next >= changelog.end;
                    unreported += 1;
                    if unreported >= REPORT_EVERY {
                        unreported = 0;
                        self.report(pending, partition);
                    }
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, partition, "error while restoring; retrying");
                }
                None => {
                    if std::mem::take(&mut progressed) {
                        last_progress = Instant::now();
                    } else if last_progress.elapsed() >= IDLE_END {
                        break;
                    }
                    for changelog in pending.iter_mut() {
                        changelog.done |= self.reached(changelog.topic, partition, changelog.end);
                    }
                }
            }
        }
        store.finish_restore(restoring)?;
        Ok(bulk)
    }

    /// Reports the records each changelog still has to go.
    fn report(&self, pending: &[Changelog<'_>], partition: i32) {
        for changelog in pending {
            let remaining = if changelog.done {
                0
            } else {
                (changelog.end - changelog.next).max(0) as u64
            };
            self.activity
                .restoring(&self.store_names[changelog.index], partition, remaining);
        }
    }

    /// Whether the consumer's position has reached `end` (it moves past
    /// transaction markers, which are never delivered as messages).
    fn reached(&self, topic: &str, partition: i32, end: i64) -> bool {
        let Ok(positions) = self.consumer.position() else {
            return false;
        };
        positions.find_partition(topic, partition).is_some_and(
            |element| matches!(element.offset(), Offset::Offset(offset) if offset >= end),
        )
    }
}

/// Local state of a changelog that is no longer there: the changelog was
/// deleted and created again (an application reset) or lost records, and
/// the state holds what the changelog no longer has. Kafka Streams calls
/// such a task corrupted, and so does its state: it is wiped and restored
/// from the changelogs.
#[derive(Debug)]
pub(crate) struct StaleLocalState {
    pub partition: i32,
    pub topic: String,
    pub why: Staleness,
}

/// How [`StaleLocalState`] was told.
#[derive(Debug)]
pub(crate) enum Staleness {
    /// The task directory names another topic id for the changelog.
    Recreated,
    /// A store's checkpoint lies past the end of the changelog.
    PastEnd { checkpoint: i64, end: i64 },
}

impl std::fmt::Display for StaleLocalState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let StaleLocalState {
            partition, topic, ..
        } = self;
        match self.why {
            Staleness::Recreated => write!(
                f,
                "the local state of task {partition} came from changelog {topic} as it was \
                 before it was deleted and created again (by an application reset?)"
            ),
            Staleness::PastEnd { checkpoint, end } => write!(
                f,
                "the local state of task {partition} reaches offset {checkpoint} of changelog \
                 {topic}, which ends at {end} (deleted and created again, by an application \
                 reset?)"
            ),
        }
    }
}

impl std::error::Error for StaleLocalState {}

/// The file of a task directory that names, by topic id, the changelogs
/// its state was restored from and written to: `<topic> <id>` a line.
const CHANGELOG_IDS: &str = "CHANGELOG_IDS";

/// The topic ids of a stage's changelogs, read once: they change only when
/// a reset deletes the changelogs, with every instance stopped, and the
/// service creates them again. A read that fails, or finds a changelog
/// missing or without an id (a broker before Kafka 2.8), is tried again
/// at the next task; meanwhile only checkpoints are checked.
#[derive(Default)]
pub(crate) struct ChangelogIds(Mutex<Option<HashMap<String, String>>>);

impl ChangelogIds {
    /// Whether `store`, task `partition`'s, holds the state of a changelog
    /// of `changelogs` since deleted: its directory names another id for
    /// it. Otherwise the directory is made to name the current ids.
    /// `client` reads them.
    pub fn check<C: ClientContext>(
        &self,
        client: &Client<C>,
        store: &TaskStore,
        changelogs: &[String],
        partition: i32,
    ) -> anyhow::Result<Option<StaleLocalState>> {
        let Some(current) = self.current(client, changelogs) else {
            return Ok(None);
        };
        let path = store.path().join(CHANGELOG_IDS);
        let recorded: HashMap<String, String> = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.split_once(' '))
            .map(|(topic, id)| (topic.to_string(), id.to_string()))
            .collect();
        let recreated = changelogs.iter().find(|topic| {
            recorded
                .get(*topic)
                .is_some_and(|id| *id != current[*topic])
        });
        if let Some(topic) = recreated {
            return Ok(Some(StaleLocalState {
                partition,
                topic: topic.clone(),
                why: Staleness::Recreated,
            }));
        }
        if changelogs.iter().any(|topic| !recorded.contains_key(topic)) {
            let text: String = changelogs
                .iter()
                .map(|topic| format!("{topic} {}\n", current[topic]))
                .collect();
            let partial = path.with_extension("partial");
            std::fs::write(&partial, text)
                .and_then(|()| std::fs::rename(&partial, &path))
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        }
        Ok(None)
    }

    /// The ids of all of `changelogs`, once known.
    fn current<C: ClientContext>(
        &self,
        client: &Client<C>,
        changelogs: &[String],
    ) -> Option<HashMap<String, String>> {
        let mut known = self.0.lock().unwrap();
        if known.is_none() {
            match native_admin::topic_ids(client, changelogs, Duration::from_secs(10)) {
                Ok(ids) if changelogs.iter().all(|topic| ids.contains_key(topic)) => {
                    *known = Some(ids)
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "cannot read the changelogs' topic ids"),
            }
        }
        known.clone()
    }
}

/// Whether a store's `checkpoint` (the offset of the last record of
/// `topic`'s `partition` it holds) lies past the end of the changelog's
/// log. Asked only when it lies at or past the last stable offset, which
/// read_committed readers see as the end: just after a commit, the markers
/// of the last transaction may not have moved it yet. The log end, read
/// uncommitted, comes after every record ever acknowledged; only a
/// changelog that lost records ends before a checkpoint. `config` is a
/// changelog reader's.
pub(crate) fn stale_checkpoint(
    config: &ClientConfig,
    topic: &str,
    partition: i32,
    checkpoint: i64,
) -> anyhow::Result<Option<StaleLocalState>> {
    let mut config = config.clone();
    config.set("isolation.level", "read_uncommitted");
    let consumer: BaseConsumer = config
        .create()
        .map_err(|e| anyhow::anyhow!("cannot create a consumer: {e}"))?;
    let (_, end) = consumer
        .fetch_watermarks(topic, partition, Duration::from_secs(10))
        .map_err(|e| {
            anyhow::anyhow!("cannot read the end of changelog {topic}-{partition}: {e}")
        })?;
    Ok((checkpoint >= end).then(|| StaleLocalState {
        partition,
        topic: topic.to_string(),
        why: Staleness::PastEnd { checkpoint, end },
    }))
}

/// One changelog partition being restored.
struct Changelog<'a> {
    /// The store it restores.
    index: usize,
    topic: &'a str,
    /// The first offset to read.
    first: i64,
    /// The end offset when the restore began, or the reach's end.
    end: i64,
    /// The offset after the last record read.
    next: i64,
    restored: u64,
    done: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reach_round_trips_through_commit_metadata_and_the_furthest_wins() {
        let reach = ChangelogReach(vec![Some(12), None, Some(0)]);
        let text = reach.to_metadata();
        assert_eq!(text, "streams.changelogs=12,-,0");
        assert_eq!(ChangelogReach::from_metadata(&text, 3), Some(reach.clone()));
        assert_eq!(ChangelogReach::from_metadata(&text, 2), None);
        assert_eq!(ChangelogReach::from_metadata("", 3), None);
        assert_eq!(
            ChangelogReach::from_metadata("streams.changelogs=1,x,2", 3),
            None
        );
        let older = ChangelogReach(vec![Some(10), None, None]);
        let newer = ChangelogReach(vec![Some(12), Some(3), Some(0)]);
        assert_eq!(older.furthest(newer.clone()), newer);
        assert_eq!(ChangelogReach::nothing(2).0, [None, None]);
    }
}
