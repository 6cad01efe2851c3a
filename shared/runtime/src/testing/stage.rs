//! A stage as the driver runs it: an engine over task stores in a
//! temporary directory, draining its collector into in-memory topics.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::avro::{AvroEncoder, Registry};
use crate::clock::Clock;
use crate::collector::Headers;
use crate::engine::{Engine, Incoming, RecordCounts, Subscription};
use crate::metrics::Snapshot;
use crate::planning::{wire_stage, StageLayout, StageRole, StageSettings, StageWiring};
use crate::processor::Processor;
use crate::state::format::WriteFormat;
use crate::state::store::{StateResources, TaskStore};
use crate::topology::{Source, Topology};

use super::{MemoryTopic, StoredRecord};

/// A stage as the driver runs it.
pub(crate) trait DriverStage {
    fn subscriptions(&self) -> Vec<Subscription>;
    fn handle(&mut self, message: Incoming<'_>) -> anyhow::Result<()>;
    fn tick(&mut self) -> anyhow::Result<()>;
    fn commit_due(&self) -> bool;
    /// Collects what goes out with a commit; returns the input positions.
    fn prepare_commit(&mut self) -> anyhow::Result<Vec<(usize, i32, i64)>>;
    fn commit_succeeded(&mut self, checkpoints: &HashMap<(String, i32), i64>)
        -> anyhow::Result<()>;
    /// Drops uncommitted work and reopens every task from its store on disk,
    /// after deleting it (and replaying `changelogs`) when `lose_state`.
    fn restart(
        &mut self,
        lose_state: bool,
        topics: &BTreeMap<String, MemoryTopic>,
    ) -> anyhow::Result<()>;
    /// Makes the task stores opened from now on write `format`.
    fn write(&mut self, format: WriteFormat);
    /// Hands every collected record to `sink`.
    fn drain(&mut self, sink: &mut dyn FnMut(&str, Option<i32>, StoredRecord));
    fn snapshot(&self) -> Snapshot;
    /// The stage's name, which labels its metrics; `None` for the first.
    fn name(&self) -> Option<&'static str>;
    /// The bytes of every entry of store `name` whose key starts with
    /// `prefix`, across tasks (uncommitted changes included).
    fn scan(&mut self, name: &str, prefix: &[u8]) -> anyhow::Result<Vec<(Vec<u8>, Vec<u8>)>>;
}

/// A stage's engine over task stores in `dir`.
struct EngineStage<P: Processor> {
    pub(crate) name: Option<&'static str>,
    pub(crate) engine: Engine<P>,
    /// The engine's counts of records at the last commit, which a crash
    /// returns to: the records it makes the stage read again count once.
    pub(crate) committed_counts: RecordCounts,
    pub(crate) dir: PathBuf,
    pub(crate) partitions: usize,
    pub(crate) resources: StateResources,
}

impl<P: Processor> EngineStage<P> {
    fn open_tasks(&mut self) -> anyhow::Result<()> {
        for partition in 0..self.partitions as i32 {
            let store = TaskStore::open(
                &self.task_dir(partition),
                self.engine.store_names(),
                &self.resources,
            )?;
            let task = self.engine.task_opener().open(partition, store)?;
            self.engine.install_task(task);
        }
        Ok(())
    }

    fn task_dir(&self, partition: i32) -> PathBuf {
        self.dir.join(format!("task-{partition}"))
    }
}

impl<P: Processor> DriverStage for EngineStage<P> {
    fn subscriptions(&self) -> Vec<Subscription> {
        self.engine.subscriptions().to_vec()
    }

    // The driver takes the collected records after every step; a drain has
    // nothing to hand over early.
    fn handle(&mut self, message: Incoming<'_>) -> anyhow::Result<()> {
        self.engine.handle(message, &mut |_| {})
    }

    fn tick(&mut self) -> anyhow::Result<()> {
        self.engine.tick(&mut |_| {})
    }

    fn commit_due(&self) -> bool {
        self.engine.commit_due()
    }

    fn prepare_commit(&mut self) -> anyhow::Result<Vec<(usize, i32, i64)>> {
        self.engine.prepare_commit()
    }

    fn commit_succeeded(
        &mut self,
        checkpoints: &HashMap<(String, i32), i64>,
    ) -> anyhow::Result<()> {
        let started = std::time::Instant::now();
        let changelogs = self.engine.changelog_topics();
        self.engine.commit_succeeded(|changelog| {
            checkpoints
                .get(&(changelogs[changelog.store].clone(), changelog.partition))
                .copied()
        })?;
        self.engine.commit_finished(started);
        self.committed_counts = self.engine.record_counts();
        Ok(())
    }

    fn restart(
        &mut self,
        lose_state: bool,
        topics: &BTreeMap<String, MemoryTopic>,
    ) -> anyhow::Result<()> {
        self.engine.roll_back()?;
        self.engine.reset_record_counts(&self.committed_counts);
        let subscriptions = self.engine.subscriptions().len();
        for partition in 0..self.partitions as i32 {
            for subscription in 0..subscriptions {
                self.engine.release(subscription, partition);
            }
        }
        if !lose_state {
            return self.open_tasks();
        }
        let changelogs = self.engine.changelog_topics();
        for partition in 0..self.partitions as i32 {
            let dir = self.task_dir(partition);
            std::fs::remove_dir_all(&dir)?;
            let mut store = TaskStore::open(&dir, self.engine.store_names(), &self.resources)?;
            // Restores here are short: in batches.
            let mut restoring = store.begin_restore(0)?;
            let mut restored = 0;
            for (store_index, changelog) in changelogs.iter().enumerate() {
                let Some(records) = topics
                    .get(changelog)
                    .and_then(|topic| topic.partitions.get(partition as usize))
                else {
                    continue;
                };
                for (offset, record) in records.iter().enumerate() {
                    if !record.pending && !record.aborted {
                        let key = record.key.as_deref().unwrap_or_default();
                        store.restore_record(
                            &mut restoring,
                            store_index,
                            offset as i64,
                            key,
                            record.value.as_deref(),
                        )?;
                        restored += 1;
                    }
                }
            }
            self.engine.count_restored(restored);
            store.finish_restore(restoring)?;
            drop(store);
        }
        self.open_tasks()
    }

    fn write(&mut self, format: WriteFormat) {
        self.resources = self.resources.clone().writing(format);
    }

    fn drain(&mut self, sink: &mut dyn FnMut(&str, Option<i32>, StoredRecord)) {
        self.engine.send_output(&mut |collector| {
            collector.drain(|record| {
                let announcement = match record.headers {
                    Headers::Watermark(announcement) => Some(*announcement),
                    _ => None,
                };
                let headers = record
                    .dead_letter_headers()
                    .into_iter()
                    .flatten()
                    .map(|(key, value)| (key.to_string(), value.into_owned()))
                    .collect();
                sink(
                    record.topic,
                    record.partition,
                    StoredRecord {
                        sequence: 0,
                        key: record.key.map(<[u8]>::to_vec),
                        value: record.value.map(<[u8]>::to_vec),
                        announcement,
                        headers,
                        pending: true,
                        aborted: false,
                    },
                );
            })
        });
    }

    fn snapshot(&self) -> Snapshot {
        self.engine.snapshot()
    }

    fn name(&self) -> Option<&'static str> {
        self.name
    }

    fn scan(&mut self, name: &str, prefix: &[u8]) -> anyhow::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut entries = Vec::new();
        for task in self.engine.tasks_mut().values_mut() {
            if let Some(index) = task.store.index_of(name) {
                entries.extend(task.store.scan_prefix(index, prefix)?);
            }
        }
        Ok(entries)
    }
}

/// What building the driver's stages shares (like the service's startup).
pub(crate) struct DriverEnv {
    pub(crate) application_id: String,
    pub(crate) registry: Registry,
    pub(crate) clock: Clock,
    pub(crate) shutdown: Arc<AtomicBool>,
    pub(crate) dir: PathBuf,
    /// Partition counts of every topic known so far.
    pub(crate) partitions: HashMap<String, usize>,
    pub(crate) default_partitions: usize,
    pub(crate) link_writers: HashMap<&'static str, usize>,
    /// The input topics, for piping JSON.
    pub(crate) inputs: HashMap<String, InputTopic>,
    pub(crate) args: crate::config::RuntimeArgs,
}

/// How [`TestDriver::pipe`] writes JSON to one input topic: with the topic's
/// reader schema, registered (and its encoder built) at the first record,
/// not at every one.
pub(crate) struct InputTopic {
    pub(crate) schema: &'static apache_avro::Schema,
    pub(crate) encoder: Option<AvroEncoder>,
}

/// Builds one stage of a pipeline for the driver (see `app.rs`).
pub(crate) fn driver_stage<P: Processor>(
    env: &mut DriverEnv,
    name: Option<&'static str>,
    topology: Topology<P::Input>,
    processor: P,
) -> anyhow::Result<Box<dyn DriverStage>> {
    let role = StageRole::of(&env.application_id, name, &env.args);
    for input in &topology.inputs {
        if let Source::Topic(topic) = &input.source {
            let input = InputTopic {
                schema: input.schema,
                encoder: None,
            };
            env.inputs.insert(topic.clone(), input);
        }
    }
    // The driver's topics: the partitions the test asked for, else its default.
    let (partitions_of, default) = (&mut env.partitions, env.default_partitions);
    let StageLayout {
        sources,
        counts,
        partitions,
        topics,
    } = StageLayout::of::<P>(
        &topology,
        &role,
        &env.application_id,
        &env.link_writers,
        |sources| {
            Ok(sources
                .iter()
                .map(|source| {
                    let count = *partitions_of.entry(source.topic.clone()).or_insert(default);
                    (source.topic.clone(), count)
                })
                .collect())
        },
    )?;
    let StageRole {
        application_id,
        idleness,
        ..
    } = role;
    env.partitions.insert(
        topics.output.clone(),
        topics.link_partitions.unwrap_or(partitions),
    );
    env.partitions.insert(topics.dead_letters.clone(), 1);
    for topic in topics
        .late
        .iter()
        .chain(&topics.repartitions)
        .chain(&topics.changelogs)
    {
        env.partitions.insert(topic.clone(), partitions);
    }
    if let crate::topology::Sink::Link(link) = &topology.sink {
        env.link_writers.insert(link.name, partitions);
    }
    let schema_id = env
        .registry
        .register(&format!("{}-value", topics.output), &topology.output_schema)?;
    let engine = wire_stage(StageWiring {
        topology: &topology,
        processor,
        sources: &sources,
        counts: &counts,
        topics: &topics,
        partitions,
        output_schema_id: schema_id,
        settings: StageSettings {
            commit_interval: env.args.commit_interval.as_std(),
            max_task_idle: env.args.max_task_idle.as_std(),
            idleness,
            // Jobs run inline: results in tests do not depend on thread timing.
            job_workers: 0,
        },
        registry: env.registry.clone(),
        clock: env.clock.clone(),
        shutdown: env.shutdown.clone(),
    })?;
    let mut stage = EngineStage {
        name,
        committed_counts: engine.record_counts(),
        engine,
        dir: env.dir.join(&application_id),
        partitions,
        // Writes at once, on the driver's thread: runs stay deterministic.
        resources: StateResources::new(
            usize::try_from(env.args.state_memory_limit << 20).unwrap_or(usize::MAX),
            0,
        )
        .writing(env.args.write_format()?),
    };
    stage.open_tasks()?;
    Ok(Box::new(stage))
}
