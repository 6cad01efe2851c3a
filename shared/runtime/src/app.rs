//! Running a service: startup checks, the processing loop, shutdown.
//!
//! A service binary parses its flags and calls [`run`]. Startup problems
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
};
use crate::metrics::Metrics;
use crate::output::Output;
use crate::processor::Processor;
use crate::restore::Restorer;
use crate::state::store::StateResources;
use crate::task::EventTimeSettings;
use crate::topics::Admin;
use crate::topology::Topology;

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
    init_tracing(args.log_format);
    match run_service(args, topology, processor) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
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

fn run_service<P: Processor>(
    args: RuntimeArgs,
    topology: Topology<P::Input>,
    processor: P,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let application_id = args.application_id_or(topology.service);
    let state_dir = args.state_dir.join(&application_id);
    std::fs::create_dir_all(&state_dir).map_err(|e| {
        anyhow::anyhow!("cannot create state directory {}: {e}", state_dir.display())
    })?;
    let client_config = base_client_config(&args);

    // Startup checks: broker, inputs, co-partitioning.
    let admin = Admin::connect(
        &client_config,
        runtime.handle().clone(),
        Duration::from_secs(10),
    )?;
    let source_topics: Vec<&str> = topology.inputs.iter().map(|i| i.topic.as_str()).collect();
    let counts = admin.wait_for_topics(&source_topics, args.topic_wait.as_std())?;
    let partitions = co_partition_count(&topology, &counts)?;

    // Internal and output topics.
    let dlq_topic = format!("{application_id}-dlq");
    admin.ensure_topic(&dlq_topic, 1, &[])?;
    if let Some(late) = &args.late_topic {
        admin.ensure_topic(late, partitions, &[])?;
    }
    admin.ensure_topic(&topology.output_topic, partitions, &[])?;
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
    let registry = Registry::new(&args.schema_registry_url, runtime.handle().clone())?;
    let output_schema = leak_schema(&topology.output_schema)?;
    let subject = format!("{}-value", topology.output_topic);
    let schema_id = registry
        .register(&subject, &topology.output_schema)
        .map_err(|e| anyhow::anyhow!("cannot register the output schema under {subject}: {e}"))?;
    let encoder = AvroEncoder::new(output_schema, schema_id)?;

    // Routes and inputs.
    let mut topics = Vec::new();
    let mut inputs = Vec::new();
    for (slot, input) in topology.inputs.into_iter().enumerate() {
        let repartition = match input.repartition {
            None => {
                topics.push((input.topic.clone(), Route::Direct { slot }));
                None
            }
            Some(repartition) => {
                let topic = format!("{application_id}-{}-repartition", repartition.name);
                let count = admin.ensure_topic(&topic, partitions, &[])?;
                anyhow::ensure!(
                    count == partitions,
                    "repartition topic {topic} has {count} partitions, expected {partitions}"
                );
                topics.push((input.topic.clone(), Route::Upstream { slot }));
                topics.push((topic.clone(), Route::Repartitioned { slot }));
                Some(RepartitionRuntime {
                    topic,
                    key_of: repartition.key_of,
                    upstream_partitions: counts[&input.topic],
                    downstream_partitions: partitions,
                })
            }
        };
        inputs.push(InputRuntime {
            decode: input.decode,
            repartition,
        });
    }

    // Operations endpoint and signals.
    let metrics = Arc::new(Metrics::default());
    match args.http_addr {
        Some(address) => {
            runtime.block_on(crate::http::serve(address, metrics.clone()))?;
        }
        None => {
            let address = crate::config::DEFAULT_HTTP_ADDR.parse()?;
            if let Err(error) = runtime.block_on(crate::http::serve(address, metrics.clone())) {
                tracing::warn!(%error, "running without /metrics, /healthz and /readyz; set --http-addr");
            }
        }
    }
    let shutdown = Arc::new(AtomicBool::new(false));
    runtime.spawn(wait_for_signal(shutdown.clone()));

    // Clients.
    let transactional_id = match args.processing_guarantee {
        ProcessingGuarantee::ExactlyOnceV2 => {
            Some(format!("{application_id}-{}", instance_id(&state_dir)?))
        }
        ProcessingGuarantee::AtLeastOnce => None,
    };
    let delivery = Delivery::new(client_config.clone(), transactional_id.as_deref())?;
    let restorer = Restorer::new(&client_config, &application_id)?;
    let settings = EngineSettings {
        guarantee: args.processing_guarantee,
        commit_interval: args.commit_interval.as_std(),
        event_time: EventTimeSettings {
            max_out_of_orderness: topology.max_out_of_orderness,
            idle_timeout: args.idle_timeout.map(|d| d.as_std()),
        },
        max_task_idle: args.max_task_idle.as_std(),
        late_topic: args.late_topic.clone(),
        dlq_topic,
        state_dir,
        store_names,
        changelog_topics,
    };
    let memory_limit =
        usize::try_from(args.state_memory_limit.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
    let engine = Engine::new(
        settings,
        processor,
        inputs,
        topics.clone(),
        Output::new(delivery, topology.output_topic.clone(), encoder),
        registry,
        StateResources::new(memory_limit),
        restorer,
        metrics.clone(),
        shutdown.clone(),
    );

    let mut consumer_config = client_config;
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

    let result = process_until_shutdown(&consumer, &shutdown);
    if result.is_err() {
        metrics.set_failed();
    }
    let closed = {
        let mut guard = consumer.context().engine.lock().unwrap();
        match (&result, guard.as_mut()) {
            (Ok(()), Some(engine)) => engine.close(&consumer),
            _ => Ok(()),
        }
    };
    // Leaving the group serves the revocation callback, which must find the
    // engine unlocked.
    consumer.unsubscribe();
    drop(consumer);
    tracing::info!("stopped");
    result.and(closed)
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

/// The partition count every co-partitioned input shares; inputs that
/// disagree make the service refuse to start.
fn co_partition_count<I>(
    topology: &Topology<I>,
    counts: &HashMap<String, usize>,
) -> anyhow::Result<usize> {
    let direct: Vec<(&str, usize)> = topology
        .inputs
        .iter()
        .filter(|i| i.repartition.is_none())
        .map(|i| (i.topic.as_str(), counts[&i.topic]))
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
