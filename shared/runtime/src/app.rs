//! Running a service: startup checks, the processing loop, shutdown.
//!
//! A service binary parses its flags and calls [`run`] (or builds a
//! [`Pipeline`] of several stages and runs it). Startup problems
//! (broker unreachable, inputs not co-partitioned, a rejected schema, a taken
//! port) end with one clear message and a non-zero exit code.

use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::ClientConfig;

use crate::avro::{leak_schema, AvroEncoder, Registry};
use crate::config::{LogFormat, ProcessingGuarantee, RuntimeArgs};
use crate::delivery::Delivery;
use crate::engine::{
    Engine, EngineContext, EngineSettings, GroupConsumer, InputRuntime, RepartitionRuntime, Route,
    Routes,
};
use crate::metrics::Metrics;
use crate::output::Output;
use crate::processor::Processor;
use crate::restore::Restorer;
use crate::state::store::StateResources;
use crate::task::{EventTimeSettings, InputKind};
use crate::time::Idleness;
use crate::topics::Admin;
use crate::topology::{InputStream, Sink, Source, Topology};

/// Sets up logging in the chosen format; `RUST_LOG` filters (default `info`).
pub fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// The librdkafka settings every client of the service shares.
pub fn base_client_config(args: &RuntimeArgs) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &args.bootstrap_servers)
        .set("log_level", "3");
    for (key, value) in &args.kafka_properties {
        config.set(key, value);
    }
    config
}

/// Runs `processor` over `topology` until SIGTERM/SIGINT; the exit code says
/// whether it stopped cleanly.
pub fn run<P: Processor>(
    args: RuntimeArgs,
    topology: Topology<P::Input>,
    processor: P,
) -> ExitCode {
    Pipeline::new(args, topology, processor).run()
}

/// A service of one or more stages, each a processor over its own topology
/// with its own tasks, state and consumer group (like the sub-topologies of
/// a Kafka Streams application). Stages are connected by [`StageLink`]s:
/// an earlier stage's topology [feeds](Topology::feeding) a link that a later
/// one [reads](crate::InputStream::from_stage).
///
/// The first stage uses the application id; a later stage named `n` uses
/// `<app-id>-n` for its group, state directory, changelogs and transactions.
/// All stages share the process: one HTTP listener (series of later stages
/// carry a `stage` label), one dead-letter topic, one shutdown signal. A stage
/// that fails stops the others.
///
/// [`StageLink`]: crate::StageLink
pub struct Pipeline {
    args: RuntimeArgs,
    service: &'static str,
    stages: Vec<Box<dyn StageSpec>>,
}

impl Pipeline {
    /// A service whose first stage runs `processor` over `topology`.
    pub fn new<P: Processor>(
        args: RuntimeArgs,
        topology: Topology<P::Input>,
        processor: P,
    ) -> Self {
        Pipeline {
            args,
            service: topology.service,
            stages: vec![Box::new(Stage {
                name: None,
                topology,
                processor,
            })],
        }
    }

    /// Adds a later stage named `name`, running `processor` over `topology`.
    pub fn then<P: Processor>(
        mut self,
        name: &'static str,
        topology: Topology<P::Input>,
        processor: P,
    ) -> Self {
        self.stages.push(Box::new(Stage {
            name: Some(name),
            topology,
            processor,
        }));
        self
    }

    /// Runs every stage until SIGTERM/SIGINT; the exit code says whether the
    /// service stopped cleanly.
    pub fn run(self) -> ExitCode {
        init_tracing(self.args.log_format);
        match self.run_stages() {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!("{error:#}");
                eprintln!("error: {error:#}");
                ExitCode::FAILURE
            }
        }
    }

    fn run_stages(self) -> anyhow::Result<()> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let client_config = base_client_config(&self.args);
        let admin = Admin::connect(
            &client_config,
            runtime.handle().clone(),
            Duration::from_secs(10),
        )?;
        let mut env = ServiceEnv {
            application_id: self.args.application_id_or(self.service),
            runtime: runtime.handle().clone(),
            client_config,
            admin,
            metrics: Arc::new(Metrics::default()),
            shutdown: Arc::new(AtomicBool::new(false)),
            link_writers: HashMap::new(),
            args: self.args,
        };
        let mut prepared = Vec::with_capacity(self.stages.len());
        for stage in self.stages {
            prepared.push(stage.prepare(&mut env)?);
        }

        // Operations endpoint and signals.
        match env.args.http_addr {
            Some(address) => {
                runtime.block_on(crate::http::serve(address, env.metrics.clone()))?;
            }
            None => {
                let address = crate::config::DEFAULT_HTTP_ADDR.parse()?;
                if let Err(error) =
                    runtime.block_on(crate::http::serve(address, env.metrics.clone()))
                {
                    tracing::warn!(%error, "running without /metrics, /healthz and /readyz; set --http-addr");
                }
            }
        }
        runtime.spawn(wait_for_signal(env.shutdown.clone()));

        let shutdown = &env.shutdown;
        let metrics = &env.metrics;
        let run_stage = |stage: Box<dyn PreparedStage>| {
            let result = stage.run();
            if result.is_err() {
                metrics.set_failed();
                shutdown.store(true, Ordering::Relaxed);
            }
            result
        };
        let mut stages = prepared.into_iter();
        let first = stages.next().expect("a pipeline has a first stage");
        let results: Vec<anyhow::Result<()>> = std::thread::scope(|scope| {
            let later: Vec<_> = stages
                .map(|stage| scope.spawn(|| run_stage(stage)))
                .collect();
            let mut results = vec![run_stage(first)];
            results.extend(
                later
                    .into_iter()
                    .map(|handle| handle.join().expect("stage thread panicked")),
            );
            results
        });
        tracing::info!("stopped");
        results.into_iter().collect()
    }
}

/// What every stage of a service shares.
struct ServiceEnv {
    args: RuntimeArgs,
    application_id: String,
    runtime: tokio::runtime::Handle,
    client_config: ClientConfig,
    admin: Admin,
    metrics: Arc<Metrics>,
    shutdown: Arc<AtomicBool>,
    /// The partition count of the stage that writes each link, by link name.
    link_writers: HashMap<&'static str, usize>,
}

impl ServiceEnv {
    /// The topic of each input, with how it reaches the stage's tasks.
    fn resolve_sources<I>(&self, inputs: &[InputStream<I>]) -> anyhow::Result<Vec<SourceTopic>> {
        inputs
            .iter()
            .map(|input| match &input.source {
                Source::Topic(topic) => Ok(SourceTopic {
                    topic: topic.clone(),
                    co_partitioned: input.repartition.is_none(),
                    link_writers: None,
                }),
                Source::Link(link) => {
                    anyhow::ensure!(
                        input.repartition.is_none(),
                        "stage link {} cannot be repartitioned again",
                        link.name
                    );
                    let writers = self.link_writers.get(link.name).copied().ok_or_else(|| {
                        anyhow::anyhow!("stage link {} is written by no earlier stage", link.name)
                    })?;
                    Ok(SourceTopic {
                        topic: link.topic(&self.application_id),
                        co_partitioned: true,
                        link_writers: Some(writers),
                    })
                }
            })
            .collect()
    }
}

/// A stage before startup: checks its topics and builds its clients.
trait StageSpec {
    fn prepare(self: Box<Self>, env: &mut ServiceEnv) -> anyhow::Result<Box<dyn PreparedStage>>;
}

/// A stage ready to process: runs until shutdown.
trait PreparedStage: Send {
    fn run(self: Box<Self>) -> anyhow::Result<()>;
}

struct Stage<P: Processor> {
    name: Option<&'static str>,
    topology: Topology<P::Input>,
    processor: P,
}

/// A stage's consumer, which owns its engine.
struct RunningStage<P: Processor> {
    consumer: GroupConsumer<P>,
    shutdown: Arc<AtomicBool>,
}

/// A stable id for this instance's state directory, used in the
/// transactional id so that a restarted instance fences its predecessor.
fn instance_id(state_dir: &Path) -> anyhow::Result<String> {
    let path = state_dir.join("instance.id");
    if let Ok(existing) = std::fs::read_to_string(&path) {
        return Ok(existing.trim().to_string());
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let id = format!("{:x}{:x}", nanos, std::process::id());
    std::fs::write(&path, &id)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    Ok(id)
}

impl<P: Processor> StageSpec for Stage<P> {
    fn prepare(self: Box<Self>, env: &mut ServiceEnv) -> anyhow::Result<Box<dyn PreparedStage>> {
        let Stage {
            name,
            topology,
            processor,
        } = *self;
        let args = &env.args;
        let admin = &env.admin;
        let application_id = match name {
            None => env.application_id.clone(),
            Some(name) => format!("{}-{name}", env.application_id),
        };
        // Late records and idle inputs concern the service's input topics,
        // which only the first stage reads. A later stage's clock follows the
        // watermarks announced on its links (which already move with idleness
        // upstream), except that an upstream task never heard from (its input
        // partition received nothing) stops holding it back.
        let first_stage = name.is_none();
        let late_topic = args.late_topic.clone().filter(|_| first_stage);
        let idleness = match args.idle_timeout.map(|d| d.as_std()) {
            None => Idleness::Off,
            Some(timeout) if first_stage => Idleness::Inputs(timeout),
            Some(timeout) => Idleness::Upstreams(timeout),
        };
        let state_dir = args.state_dir.join(&application_id);
        std::fs::create_dir_all(&state_dir).map_err(|e| {
            anyhow::anyhow!("cannot create state directory {}: {e}", state_dir.display())
        })?;

        // Startup checks: broker, inputs, co-partitioning.
        let sources = env.resolve_sources(&topology.inputs)?;
        let source_names: Vec<&str> = sources.iter().map(|s| s.topic.as_str()).collect();
        let counts = admin.wait_for_topics(&source_names, args.topic_wait.as_std())?;
        let partitions = co_partition_count(&sources, &counts)?;

        // Internal and output topics.
        let dlq_topic = format!("{}-dlq", env.application_id);
        admin.ensure_topic(&dlq_topic, 1, &[])?;
        if let Some(late) = &late_topic {
            admin.ensure_topic(late, partitions, &[])?;
        }
        let (output_topic, link_partitions) = match &topology.sink {
            Sink::Topic(topic) => {
                admin.ensure_topic(topic, partitions, &[])?;
                (topic.clone(), None)
            }
            Sink::Link(link) => {
                let topic = link.topic(&env.application_id);
                let expected = if link.single_partition { 1 } else { partitions };
                let count = admin.ensure_topic(&topic, expected, &[])?;
                anyhow::ensure!(
                    count == expected,
                    "stage link topic {topic} has {count} partitions, expected {expected}"
                );
                env.link_writers.insert(link.name, partitions);
                (topic, Some(expected))
            }
        };
        let store_names = topology.all_stores();
        let changelog_topics: Vec<String> = store_names
            .iter()
            .map(|store| format!("{application_id}-{store}-changelog"))
            .collect();
        for topic in &changelog_topics {
            let count = admin.ensure_topic(topic, partitions, &[("cleanup.policy", "compact")])?;
            anyhow::ensure!(
                count == partitions,
                "changelog topic {topic} has {count} partitions but the inputs have {partitions}; \
                 the partition count of a stateful application cannot change (use a new --application-id)"
            );
        }

        // Schemas: the output's is registered once, here.
        let registry = Registry::new(&args.schema_registry_url, env.runtime.clone())?;
        let output_schema = leak_schema(&topology.output_schema)?;
        let subject = format!("{output_topic}-value");
        let schema_id = registry
            .register(&subject, &topology.output_schema)
            .map_err(|e| {
                anyhow::anyhow!("cannot register the output schema under {subject}: {e}")
            })?;
        let encoder = AvroEncoder::new(output_schema, schema_id)?;

        // Routes and inputs.
        let (topics, inputs) = wire_inputs(
            topology.inputs,
            &sources,
            &counts,
            admin,
            &application_id,
            partitions,
        )?;

        // Clients.
        let transactional_id = match args.processing_guarantee {
            ProcessingGuarantee::ExactlyOnceV2 => {
                Some(format!("{application_id}-{}", instance_id(&state_dir)?))
            }
            ProcessingGuarantee::AtLeastOnce => None,
        };
        let delivery = Delivery::new(env.client_config.clone(), transactional_id.as_deref())?;
        let restorer = Restorer::new(&env.client_config, &application_id)?;
        let settings = EngineSettings {
            guarantee: args.processing_guarantee,
            commit_interval: args.commit_interval.as_std(),
            event_time: EventTimeSettings {
                max_out_of_orderness: topology.max_out_of_orderness,
                idleness,
            },
            max_task_idle: args.max_task_idle.as_std(),
            late_topic,
            dlq_topic,
            state_dir,
            store_names,
            changelog_topics,
            link_partitions,
        };
        let memory_limit =
            usize::try_from(args.state_memory_limit.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        let engine = Engine::new(
            settings,
            processor,
            inputs,
            topics.clone(),
            Output::new(delivery, output_topic, encoder),
            registry,
            StateResources::new(memory_limit),
            restorer,
            env.metrics.add_stage(name),
            env.shutdown.clone(),
        );

        let mut consumer_config = env.client_config.clone();
        consumer_config
            .set("group.id", &application_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed")
            .set("partition.assignment.strategy", "range")
            .set("enable.partition.eof", "false");
        let context = EngineContext {
            engine: Mutex::new(Some(engine)),
        };
        let consumer: GroupConsumer<P> = consumer_config
            .create_with_context(context)
            .map_err(|e| anyhow::anyhow!("cannot create the Kafka consumer: {e}"))?;
        let subscription: Vec<&str> = topics.iter().map(|(t, _)| t.as_str()).collect();
        consumer.subscribe(&subscription)?;
        tracing::info!(
            application_id,
            partitions,
            topics = ?subscription,
            guarantee = ?args.processing_guarantee,
            "started"
        );
        Ok(Box::new(RunningStage {
            consumer,
            shutdown: env.shutdown.clone(),
        }))
    }
}

impl<P: Processor> PreparedStage for RunningStage<P> {
    fn run(self: Box<Self>) -> anyhow::Result<()> {
        let RunningStage { consumer, shutdown } = *self;
        let result = process_until_shutdown(&consumer, &shutdown);
        let closed = {
            let mut guard = consumer.context().engine.lock().unwrap();
            match &result {
                Ok(()) => guard
                    .as_mut()
                    .map_or(Ok(()), |engine| engine.close(&consumer)),
                // After a failure the tasks hold uncommitted, possibly half-done
                // work: drop the engine unseen, so that leaving the group (whose
                // revocation would commit) commits nothing. The next owner
                // starts from the last commit.
                Err(_) => {
                    guard.take();
                    Ok(())
                }
            }
        };
        // Leaving the group serves the revocation callback, which must find the
        // engine unlocked.
        consumer.unsubscribe();
        drop(consumer);
        result.and(closed)
    }
}

/// Records handled between two checks of timers, idleness and the commit interval.
const MAX_BATCH: usize = 1_000;

/// The main loop. The engine's lock is never held while polling, because
/// rebalance callbacks run inside `poll` and take it.
fn process_until_shutdown<P: Processor>(
    consumer: &GroupConsumer<P>,
    shutdown: &AtomicBool,
) -> anyhow::Result<()> {
    let mut last_poll_error = None::<std::time::Instant>;
    while !shutdown.load(Ordering::Relaxed) {
        // Wait briefly for the first record, then take what is already there.
        let mut timeout = Duration::from_millis(20);
        for _ in 0..MAX_BATCH {
            let Some(polled) = consumer.poll(timeout) else {
                break;
            };
            timeout = Duration::ZERO;
            let mut guard = consumer.context().engine.lock().unwrap();
            let engine = guard.as_mut().expect("engine present while running");
            if let Some(error) = engine.fatal.take() {
                return Err(error);
            }
            match polled {
                Ok(message) => engine.handle(&message)?,
                Err(error) => {
                    if last_poll_error.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                        tracing::warn!(%error, "consumer error (retrying)");
                        last_poll_error = Some(std::time::Instant::now());
                    }
                    break;
                }
            }
            if engine.commit_due() {
                break;
            }
        }
        let mut guard = consumer.context().engine.lock().unwrap();
        let engine = guard.as_mut().expect("engine present while running");
        if let Some(error) = engine.fatal.take() {
            return Err(error);
        }
        engine.tick(consumer)?;
    }
    tracing::info!("shutdown requested; committing and closing");
    Ok(())
}

async fn wait_for_signal(shutdown: Arc<AtomicBool>) {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    shutdown.store(true, Ordering::Relaxed);
}

/// The consumer's routes (topic → what to do) and the engine's inputs: a
/// direct input goes to its task, a repartitioned one through its
/// repartition topic, a stage link is read like a repartition topic.
fn wire_inputs<I>(
    inputs: Vec<InputStream<I>>,
    sources: &[SourceTopic],
    counts: &HashMap<String, usize>,
    admin: &Admin,
    application_id: &str,
    partitions: usize,
) -> anyhow::Result<(Routes, Vec<InputRuntime<I>>)> {
    let mut topics = Vec::new();
    let mut runtimes = Vec::with_capacity(inputs.len());
    for (slot, (input, source)) in inputs.into_iter().zip(sources).enumerate() {
        let (kind, repartition) = match input.repartition {
            None => {
                topics.push((
                    source.topic.clone(),
                    match source.link_writers {
                        None => Route::Direct { slot },
                        Some(_) => Route::Repartitioned { slot },
                    },
                ));
                let kind = match source.link_writers {
                    None => InputKind::Direct,
                    Some(upstream_partitions) => InputKind::Repartitioned {
                        upstream_partitions,
                    },
                };
                (kind, None)
            }
            Some(repartition) => {
                let topic = format!("{application_id}-{}-repartition", repartition.name);
                let count = admin.ensure_topic(&topic, partitions, &[])?;
                anyhow::ensure!(
                    count == partitions,
                    "repartition topic {topic} has {count} partitions, expected {partitions}"
                );
                let upstream_partitions = counts[&source.topic];
                topics.push((source.topic.clone(), Route::Upstream { slot }));
                topics.push((topic.clone(), Route::Repartitioned { slot }));
                let runtime = RepartitionRuntime {
                    topic,
                    key_of: repartition.key_of,
                    downstream_partitions: partitions,
                };
                (
                    InputKind::Repartitioned {
                        upstream_partitions,
                    },
                    Some(runtime),
                )
            }
        };
        runtimes.push(InputRuntime {
            decode: input.decode,
            kind,
            repartition,
        });
    }
    Ok((topics, runtimes))
}

/// One input topic of a stage, resolved.
struct SourceTopic {
    topic: String,
    /// Whether partition *p* goes to task *p* (not re-keyed first).
    co_partitioned: bool,
    /// For a stage link: the writing stage's partition count.
    link_writers: Option<usize>,
}

/// The partition count every co-partitioned input shares; inputs that
/// disagree make the service refuse to start.
fn co_partition_count(
    sources: &[SourceTopic],
    counts: &HashMap<String, usize>,
) -> anyhow::Result<usize> {
    let direct: Vec<(&str, usize)> = sources
        .iter()
        .filter(|s| s.co_partitioned)
        .map(|s| (s.topic.as_str(), counts[&s.topic]))
        .collect();
    if let Some((_, first)) = direct.first() {
        if direct.iter().any(|(_, count)| count != first) {
            let listing: Vec<String> = direct
                .iter()
                .map(|(topic, count)| format!("{topic} has {count}"))
                .collect();
            anyhow::bail!(
                "input topics are not co-partitioned: {}; they must have the same number of partitions",
                listing.join(", ")
            );
        }
        return Ok(*first);
    }
    Ok(counts.values().copied().max().unwrap_or(1))
}
