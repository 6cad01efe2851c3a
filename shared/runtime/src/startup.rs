//! Starting a stage on Kafka: checking and creating its topics, registering
//! its output schema, building its clients, and its engine through
//! [`crate::planning`] (the broker-free part, shared with the test driver).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use rdkafka::consumer::Consumer;
use rdkafka::ClientConfig;

use crate::avro::{writer_schema_id, Registry, SchemaSource};
use crate::client::kafka::{
    client_id, group_consumer_config, instance_id, member_id, transactional_id, GroupProtocol,
};
use crate::client::RegistrySettings;
use crate::clock::Clock;
use crate::config::{InternalTopicArgs, ProcessingGuarantee, RuntimeArgs};
use crate::delivery::{Delivery, DepartedMemberFencer};
use crate::engine::kafka_stage::{GroupConsumer, KafkaStage, KafkaStageParts, StageContext};
use crate::metrics::Metrics;
use crate::planning::{
    wire_stage, SourceTopic, StageLayout, StageRole, StageSettings, StageTopics, StageWiring,
};
use crate::processor::Processor;
use crate::query::peers::StageGroup;
use crate::query::QueryableStage;
use crate::restore::Restorer;
use crate::standby::{ActiveTasks, StandbySettings, StandbyUpdater};
use crate::state::store::StateResources;
use crate::time::Idleness;
use crate::topics::{Admin, TopicSpec};
use crate::topology::{Sink, Topology};

/// What every stage of a service shares while starting.
pub(crate) struct ServiceEnv {
    pub args: RuntimeArgs,
    pub application_id: String,
    pub runtime: tokio::runtime::Handle,
    pub client_config: ClientConfig,
    pub registry: RegistrySettings,
    pub admin: Admin,
    pub metrics: Arc<Metrics>,
    /// RocksDB's memory budget (`--state-memory-limit`): one for the whole
    /// process, shared by every task of every thread and stage.
    pub state_resources: StateResources,
    pub shutdown: Arc<AtomicBool>,
    /// The partition count of the stage that writes each link, by link name.
    pub link_writers: HashMap<&'static str, usize>,
    /// The stages prepared so far, as queries see them.
    pub queryable: Vec<QueryableStage>,
}

/// One processing thread of a stage (`--stream-threads`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamThread {
    pub index: usize,
    pub count: usize,
}

impl StreamThread {
    /// Every thread of a stage run with `count` threads.
    pub fn all(count: usize) -> impl Iterator<Item = StreamThread> {
        (0..count).map(move |index| StreamThread { index, count })
    }

    /// This thread's name for what must be unique per client of the group —
    /// the transactional id and `group.instance.id` — made from the
    /// instance's `base`. Thread 0 keeps `base`, so that changing the thread
    /// count keeps what a single-threaded instance used: thread 0 still
    /// fences its predecessor's transactions and takes its static membership
    /// over at once. Thread *i* adds `-<i>`.
    pub fn member_id(&self, base: &str) -> String {
        member_id(base, self.index)
    }

    /// The `thread` label of this thread's metrics and logs: none when the
    /// stage has one thread, whose series and log lines stay as they were.
    pub fn label(&self) -> Option<usize> {
        (self.count > 1).then_some(self.index)
    }
}

/// What every processing thread of a stage shares, once the stage's topics
/// exist and its output schema is registered.
struct StagePlan<P: Processor> {
    name: Option<&'static str>,
    application_id: String,
    topology: Topology<P::Input>,
    processor: P,
    sources: Vec<SourceTopic>,
    counts: HashMap<String, usize>,
    topics: StageTopics,
    partitions: usize,
    schema_id: u32,
    registry: Registry,
    idleness: Idleness,
    state_dir: PathBuf,
    /// This instance's name: `--instance-id`, or the id kept in the state
    /// directory.
    instance: String,
    /// The tasks this process's threads have open, for the standby thread.
    active: Arc<ActiveTasks>,
    /// Each processing thread's producer, initialised (transactions
    /// included), in thread order.
    deliveries: Vec<Delivery>,
}

/// A stage's threads, ready to run: its processing threads (each with its
/// consumer), with `--standby-replicas` its standby thread, and under
/// exactly-once in a classic group the fencer of departed members.
pub(crate) struct PreparedThreads<P: Processor> {
    pub processing: Vec<(StreamThread, GroupConsumer<P>)>,
    pub standby: Option<StandbyUpdater>,
    pub fencer: Option<DepartedMemberFencer>,
}

/// Checks and creates stage `name`'s topics, then builds every processing
/// thread's clients and engine and subscribes its consumer; one consumer
/// per thread, all in the stage's group.
pub(crate) fn prepare_stage<P: Processor>(
    env: &mut ServiceEnv,
    name: Option<&'static str>,
    topology: Topology<P::Input>,
    processor: P,
) -> anyhow::Result<PreparedThreads<P>> {
    let mut plan = plan_stage(env, name, topology, processor)?;
    let threads = env.args.stream_threads;
    if threads > plan.partitions {
        tracing::warn!(
            application_id = plan.application_id,
            threads,
            partitions = plan.partitions,
            "more stream threads than input partitions: some threads get no task"
        );
    }
    let deliveries = std::mem::take(&mut plan.deliveries);
    let consumers = StreamThread::all(threads)
        .zip(deliveries)
        .map(|(thread, delivery)| Ok((thread, plan.thread_consumer(env, thread, delivery)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Subscribed together, once all are built (a producer's
    // init_transactions takes a while): members that join at once form the
    // group's first generation together, instead of the first thread taking
    // every task only to hand most back a moment later, in a rebalance that
    // commits, closes and reopens every task.
    let mut topics = Vec::new();
    for (_, consumer) in &consumers {
        topics = subscribe(consumer)?;
    }
    let standby = match env.args.standby_replicas {
        0 => None,
        replicas => Some(plan.standby_updater(env, replicas, &consumers[0].1)?),
    };
    let fences = env.args.processing_guarantee == ProcessingGuarantee::ExactlyOnceV2
        && env.args.group_protocol == GroupProtocol::Classic;
    let fencer = fences
        .then(|| {
            DepartedMemberFencer::new(
                &env.client_config,
                &plan.application_id,
                &plan.instance,
                env.shutdown.clone(),
            )
        })
        .transpose()?;
    env.queryable.push(plan.queryable(env, &consumers[0].1));
    tracing::info!(
        application_id = plan.application_id,
        partitions = plan.partitions,
        threads,
        topics = ?topics,
        guarantee = ?env.args.processing_guarantee,
        standby_replicas = env.args.standby_replicas,
        "started"
    );
    Ok(PreparedThreads {
        processing: consumers,
        standby,
        fencer,
    })
}

/// The startup checks of stage `name`, its topics and its output schema.
fn plan_stage<P: Processor>(
    env: &mut ServiceEnv,
    name: Option<&'static str>,
    topology: Topology<P::Input>,
    processor: P,
) -> anyhow::Result<StagePlan<P>> {
    let args = &env.args;
    let role = StageRole::of(&env.application_id, name, args);
    let state_dir = args.state_dir.join(&role.application_id);
    // Before anything else: state this build cannot read stops it here.
    crate::state::format::check_stage_dir(&state_dir)?;
    std::fs::create_dir_all(&state_dir).map_err(|e| {
        anyhow::anyhow!("cannot create state directory {}: {e}", state_dir.display())
    })?;

    // Startup checks: broker, inputs, co-partitioning.
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
            let names: Vec<&str> = sources.iter().map(|s| s.topic.as_str()).collect();
            env.admin
                .wait_for_topics(&names, args.topic_wait.as_std(), &env.shutdown)
        },
    )?;
    let StageRole {
        application_id,
        idleness,
        ..
    } = role;
    let instance = match &args.instance_id {
        Some(instance) => instance.clone(),
        None => instance_id(&state_dir)?,
    };
    let exactly_once = args.processing_guarantee == ProcessingGuarantee::ExactlyOnceV2;

    // Three independent sets of round trips, side by side rather than one
    // after the other: the topic checks and creations, the output schema's
    // registration (the output's is registered once, here), and each
    // thread's producer with its init_transactions.
    let registry = Registry::new(&env.registry, env.runtime.clone())?;
    let subject = format!("{}-value", topics.output);
    // With --schema-registry-auto-register false: the subject's latest
    // version, if it encodes alike (avro::SchemaSource).
    let source = SchemaSource::of(
        args.schema_registry_auto_register,
        matches!(topology.sink, Sink::Link(_)),
    );
    let (created, registered, deliveries) = std::thread::scope(|scope| {
        let registering =
            scope.spawn(|| writer_schema_id(&registry, &subject, &topology.output_schema, source));
        let producing = scope.spawn(|| {
            StreamThread::all(args.stream_threads)
                .map(|thread| {
                    let id = exactly_once
                        .then(|| transactional_id(&application_id, &instance, thread.index));
                    let mut config = env.client_config.clone();
                    config.set("compression.type", args.compression_type.as_str());
                    Delivery::new(config, id.as_deref(), Some(&env.shutdown))
                })
                .collect::<anyhow::Result<Vec<_>>>()
        });
        let created = ensure_stage_topics(&env.admin, &topics, partitions, &args.internal_topics);
        let joined = |name| move |_| anyhow::anyhow!("the thread {name} panicked");
        (
            created,
            registering.join().map_err(joined("registering the schema")),
            producing.join().map_err(joined("creating the producers")),
        )
    });
    created?;
    let schema_id = registered??;
    let deliveries = deliveries??;
    if let Sink::Link(link) = &topology.sink {
        env.link_writers.insert(link.name, partitions);
    }
    Ok(StagePlan {
        name,
        application_id,
        topology,
        processor,
        sources,
        counts,
        topics,
        partitions,
        schema_id,
        registry,
        idleness,
        state_dir,
        instance,
        active: Arc::default(),
        deliveries,
    })
}

/// Creates the topics a stage writes (in one request), made as
/// `--internal-topic-*` says, checking the partition counts of those that
/// already exist.
fn ensure_stage_topics(
    admin: &Admin,
    topics: &StageTopics,
    partitions: usize,
    made: &InternalTopicArgs,
) -> anyhow::Result<()> {
    // The common configs, then those of one kind of topic (later wins).
    fn configs<'a>(
        common: &'a [(String, String)],
        kind: &'a [(String, String)],
    ) -> Vec<(&'a str, &'a str)> {
        common
            .iter()
            .chain(kind)
            .map(|(key, value)| (key.as_str(), value.as_str()))
            .collect()
    }
    let common = configs(&made.topic_configs, &[]);
    let mut changelog = configs(&made.topic_configs, &made.changelog_configs);
    changelog.retain(|(key, _)| *key != "cleanup.policy");
    changelog.push(("cleanup.policy", "compact"));
    let repartition = configs(&made.topic_configs, &made.repartition_configs);
    let spec = |name, partitions, configs| TopicSpec {
        name,
        partitions,
        configs,
        replication: made.internal_topic_replication_factor,
    };
    let output_partitions = topics.link_partitions.unwrap_or(partitions);
    let output_configs = if topics.link_partitions.is_some() {
        &repartition
    } else {
        &common
    };
    let mut specs = vec![
        spec(&topics.dead_letters, 1, &common),
        spec(&topics.output, output_partitions, output_configs),
    ];
    specs.extend(
        topics
            .late
            .iter()
            .map(|late| spec(late, partitions, &common)),
    );
    specs.extend(
        topics
            .changelogs
            .iter()
            .map(|topic| spec(topic, partitions, &changelog)),
    );
    specs.extend(
        topics
            .repartitions
            .iter()
            .map(|topic| spec(topic, partitions, &repartition)),
    );
    let counts = admin.ensure_topics(&specs)?;
    let count_of = |name: &str| {
        specs
            .iter()
            .zip(&counts)
            .find(|(spec, _)| spec.name == name)
            .map_or(0, |(_, count)| *count)
    };
    if let Some(expected) = topics.link_partitions {
        let count = count_of(&topics.output);
        anyhow::ensure!(
            count == expected,
            "stage link topic {} has {count} partitions, expected {expected}",
            topics.output
        );
    }
    for topic in &topics.changelogs {
        let count = count_of(topic);
        anyhow::ensure!(
            count == partitions,
            "changelog topic {topic} has {count} partitions but the inputs have {partitions}; \
             the partition count of a stateful application cannot change (use a new --application-id)"
        );
    }
    for topic in &topics.repartitions {
        let count = count_of(topic);
        anyhow::ensure!(
            count == partitions,
            "repartition topic {topic} has {count} partitions, expected {partitions}"
        );
    }
    Ok(())
}

impl<P: Processor> StagePlan<P> {
    /// Builds processing thread `thread`: its engine (with a clone of the
    /// processor), producer, restore consumer and group consumer, subscribed.
    fn thread_consumer(
        &self,
        env: &ServiceEnv,
        thread: StreamThread,
        delivery: Delivery,
    ) -> anyhow::Result<GroupConsumer<P>> {
        let args = &env.args;
        let mut engine = wire_stage(StageWiring {
            topology: &self.topology,
            processor: self.processor.clone(),
            sources: &self.sources,
            counts: &self.counts,
            topics: &self.topics,
            partitions: self.partitions,
            output_schema_id: self.schema_id,
            settings: StageSettings {
                commit_interval: args.commit_interval.as_std(),
                max_task_idle: args.max_task_idle.as_std(),
                idleness: self.idleness,
                job_workers: self.topology.job_workers,
            },
            registry: self.registry.clone(),
            clock: Clock::system(),
            shutdown: env.shutdown.clone(),
        })?;
        let metrics = env.metrics.add_thread(self.name, thread.label());
        let restorer = Restorer::new(
            &env.client_config,
            &self.application_id,
            metrics.activity(),
            self.topics.store_names.clone(),
        )?;
        engine.yield_to_commits();
        let stage = KafkaStage::new(KafkaStageParts {
            group_id: self.application_id.clone(),
            engine,
            delivery,
            restorer,
            guarantee: args.processing_guarantee,
            state_dir: self.state_dir.clone(),
            active: self.active.for_thread(thread.index),
            resources: env.state_resources.clone(),
            metrics,
        })?;
        let group_instance_id = args.instance_id.as_deref().map(|id| thread.member_id(id));
        let context = StageContext::new(stage);
        let mut config = group_consumer_config(
            &env.client_config,
            args.group_protocol,
            self.sources.len(),
            &self.application_id,
            &client_id(&self.instance, thread.index),
            group_instance_id.as_deref(),
        );
        crate::client::statistics::enable(&mut config);
        let consumer: GroupConsumer<P> = config
            .create_with_context(context)
            .map_err(|e| anyhow::anyhow!("cannot create the Kafka consumer: {e}"))?;
        Ok(consumer)
    }
}

impl<P: Processor> StagePlan<P> {
    /// The stage as queries see it; `consumer` is one of its processing
    /// threads' (for the task topics).
    fn queryable(&self, env: &ServiceEnv, consumer: &GroupConsumer<P>) -> QueryableStage {
        let task_topic = consumer.context().with_engine(|engine| {
            let topics = engine.task_topics();
            topics
                .into_iter()
                .next()
                .map(|(_, topic)| topic)
                .unwrap_or_default()
        });
        let stores = P::STORES
            .iter()
            .filter_map(|spec| {
                let index = self
                    .topics
                    .store_names
                    .iter()
                    .position(|n| n == spec.name)?;
                Some((*spec, index, self.topics.changelogs[index].clone()))
            })
            .collect();
        QueryableStage {
            name: self.name.unwrap_or("main").to_string(),
            group: StageGroup {
                group: self.application_id.clone(),
                task_topic,
                tasks: self.partitions,
                instance: self.instance.clone(),
                static_members: env.args.instance_id.is_some(),
                standby_replicas: env.args.standby_replicas,
            },
            state_dir: self.state_dir.clone(),
            stores,
        }
    }

    /// The stage's standby thread, keeping `replicas` copies per task;
    /// `consumer` is one of its processing threads' (for the task topics).
    fn standby_updater(
        &self,
        env: &ServiceEnv,
        replicas: usize,
        consumer: &GroupConsumer<P>,
    ) -> anyhow::Result<StandbyUpdater> {
        let task_topics = consumer.context().with_engine(|engine| {
            engine
                .task_topics()
                .into_iter()
                .map(|(_, topic)| topic)
                .collect()
        });
        let settings = StandbySettings {
            replicas,
            group: self.application_id.clone(),
            instance: self.instance.clone(),
            static_members: env.args.instance_id.is_some(),
            task_topics,
            changelogs: self.topics.changelogs.clone(),
            store_names: self.topics.store_names.clone(),
            tasks: self.partitions,
            state_dir: self.state_dir.clone(),
        };
        StandbyUpdater::new(
            settings,
            &env.client_config,
            env.state_resources.clone(),
            self.active.clone(),
            env.metrics.add_standby(self.name),
            env.shutdown.clone(),
        )
    }
}

/// Subscribes a built consumer to its engine's topics; returns them.
fn subscribe<P: Processor>(consumer: &GroupConsumer<P>) -> anyhow::Result<Vec<String>> {
    let topics: Vec<String> = consumer.context().with_engine(|engine| {
        engine
            .subscriptions()
            .iter()
            .map(|s| s.topic.clone())
            .collect()
    });
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    consumer.subscribe(&names)?;
    Ok(topics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_zero_keeps_the_single_threaded_ids_and_the_others_add_their_index() {
        let threads: Vec<StreamThread> = StreamThread::all(3).collect();
        let ids: Vec<String> = threads
            .iter()
            .map(|thread| thread.member_id("sessionizer-pod-0"))
            .collect();
        assert_eq!(
            ids,
            [
                "sessionizer-pod-0",
                "sessionizer-pod-0-1",
                "sessionizer-pod-0-2"
            ]
        );
        let alone = StreamThread::all(1).next().unwrap();
        assert_eq!(alone.member_id("pod-0"), "pod-0");
    }

    #[test]
    fn only_threads_of_a_multi_threaded_stage_are_labelled() {
        assert_eq!(StreamThread::all(1).next().unwrap().label(), None);
        let labels: Vec<Option<usize>> = StreamThread::all(2).map(|t| t.label()).collect();
        assert_eq!(labels, [Some(0), Some(1)]);
    }
}
