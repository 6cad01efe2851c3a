//! Running a service: startup checks, the processing loop, shutdown.
//!
//! A service binary's `main` is [`service_main`]: it parses the flags and
//! runs the service's [`Pipeline`] of one or more stages. Startup problems
//! (broker unreachable, inputs not co-partitioned, a rejected schema, a taken
//! port) end with one clear message and a non-zero exit code.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::client::{redact, RedactingStderr};
use crate::config::{LogFormat, ProcessingGuarantee, RuntimeArgs};
use crate::delivery::DepartedMemberFencer;
use crate::describe::{
    acl_grants, describe_stage, render_acls, AclFormat, AclPurpose, PatternType,
    ServiceDescription, StageDescription, StrimziArgs,
};
use crate::engine::kafka_stage::{run_stage, GroupConsumer};
use crate::metrics::Metrics;
use crate::processor::Processor;
use crate::query::peers::Peers;
use crate::query::{endpoints_topic, serve as serve_queries, QueryServer};
use crate::reset::{reset, ResetArgs, Stopped};
use crate::shutdown::{self, is_interrupted, Signals};
use crate::standby::StandbyUpdater;
use crate::startup::{prepare_stage, ServiceEnv, StreamThread};
use crate::state::format::{WriteFormat, STATE_FORMAT};
use crate::state::store::StateResources;
#[cfg(feature = "test-utils")]
use crate::testing::{driver_stage, DriverEnv, DriverStage};
use crate::topics::{Admin, TopicSpec};
use crate::topology::Topology;
use clap::{Args, Parser};

/// The whole `main` of a service binary: parses its flags `S`, builds its
/// pipeline with `build` and runs it. A flag error exits with clap's
/// message; a build error with one line and a non-zero code.
///
/// ```no_run
/// # #[derive(clap::Parser)] struct Settings { #[command(flatten)] runtime: streams_runtime::RuntimeArgs }
/// # fn pipeline(settings: Settings) -> anyhow::Result<streams_runtime::Pipeline> { unimplemented!() }
/// fn main() -> std::process::ExitCode {
///     streams_runtime::service_main(pipeline)
/// }
/// ```
///
/// Two subcommands connect nowhere: `describe` prints the service's
/// topology and `acls` the ACLs it needs, for the flags that follow them
/// (see [`crate::describe`]). A third, `reset`, makes the stopped
/// application process its input again (see [`crate::reset`]).
pub fn service_main<S: Parser + Args>(build: fn(S) -> anyhow::Result<Pipeline>) -> ExitCode {
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let tool = argv
        .get(1)
        .and_then(|arg| arg.to_str())
        .and_then(|arg| match arg {
            "describe" | "acls" | "reset" => Some(arg.to_string()),
            _ => None,
        });
    let result = match tool.as_deref() {
        // Signals are heard before the flags are even read: start-up may
        // take a while (embed-batcher loads its model as its stage is
        // prepared).
        None => Process::start().and_then(|process| Ok(build(S::parse())?.run(process))),
        Some(tool) => {
            argv.remove(1);
            argv[0] = format!("{} {tool}", argv[0].to_string_lossy()).into();
            let printed = if tool == "describe" {
                let cli = DescribeCli::<S>::parse_from(argv);
                build(cli.settings).and_then(|pipeline| {
                    let description = pipeline.describe()?;
                    Ok(match cli.format {
                        DescribeFormat::Text => description.to_text(),
                        DescribeFormat::Json => serde_json::to_string_pretty(&description)? + "\n",
                    })
                })
            } else if tool == "reset" {
                let cli = ResetCli::<S>::parse_from(argv);
                return build(cli.settings)
                    .and_then(|pipeline| {
                        let description = pipeline.describe()?;
                        reset(
                            &description,
                            &pipeline.args,
                            &cli.reset,
                            &mut std::io::stdout(),
                        )
                    })
                    .map_or_else(reset_failed, |()| ExitCode::SUCCESS);
            } else {
                let cli = AclsCli::<S>::parse_from(argv);
                build(cli.settings).and_then(|pipeline| {
                    let description = pipeline.describe()?;
                    let principal = cli
                        .principal
                        .unwrap_or_else(|| format!("User:{}", description.application_id));
                    let grants = acl_grants(&description, cli.resource_pattern_type, cli.purpose);
                    render_acls(
                        &description,
                        &grants,
                        &principal,
                        cli.purpose,
                        cli.format,
                        &cli.strimzi,
                    )
                })
            };
            printed.map(|text| {
                print!("{text}");
                ExitCode::SUCCESS
            })
        }
    };
    result.unwrap_or_else(|error| {
        eprintln!("error: {}", redact(&format!("{error:#}")));
        ExitCode::FAILURE
    })
}

/// The exit of a `reset` that did not complete: 128 + the signal's number
/// (130, 143) when a signal stopped it, 1 when it failed; its one line on
/// stderr either way.
fn reset_failed(error: anyhow::Error) -> ExitCode {
    eprintln!("error: {}", redact(&format!("{error:#}")));
    match error.downcast_ref::<Stopped>() {
        Some(stopped) => ExitCode::from(stopped.exit_code()),
        None => ExitCode::FAILURE,
    }
}

/// `<service> describe [--format] <service flags>`.
#[derive(Parser)]
struct DescribeCli<S: Args> {
    #[command(flatten)]
    settings: S,
    /// `text` (like Kafka Streams' `Topology#describe()`) or `json`.
    #[arg(long, value_enum, default_value = "text")]
    format: DescribeFormat,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum DescribeFormat {
    Text,
    Json,
}

/// `<service> acls [--principal] [--format] [--for run|reset] [--strimzi-*]
/// <service flags>`.
#[derive(Parser)]
struct AclsCli<S: Args> {
    #[command(flatten)]
    settings: S,
    /// The principal to grant them to. Default `User:<application id>`.
    /// With `--format strimzi` the KafkaUser is named after it (`User:NAME`,
    /// or `User:CN=NAME` for the tls types).
    #[arg(long)]
    principal: Option<String>,
    /// `kafka-acls` commands, a Strimzi `KafkaUser` (with
    /// `--strimzi-cluster`), or JSON.
    #[arg(long, value_enum, default_value = "kafka-acls")]
    format: AclFormat,
    /// Name input and output topics exactly (`literal`) or as prefixes.
    #[arg(long, value_enum, default_value = "literal")]
    resource_pattern_type: PatternType,
    /// The ACLs to run the service (`run`), or to reset it with
    /// `<service> reset` (`reset`).
    #[arg(long = "for", value_enum, default_value = "run")]
    purpose: AclPurpose,
    #[command(flatten)]
    strimzi: StrimziArgs,
}

/// `<service> reset [--to-earliest|--to-latest|--to-datetime|--by-duration|--shift-by|
/// --to-offset|--from-file] [--ignore-committed-topic]... [--wipe-local-state] [--dry-run]
/// <service flags>`.
#[derive(Parser)]
struct ResetCli<S: Args> {
    #[command(flatten)]
    reset: ResetArgs,
    #[command(flatten)]
    settings: S,
}

/// Caps glibc's malloc arenas at one per processing thread, before the
/// stages start their threads, unless `MALLOC_ARENA_MAX` says otherwise.
/// Threads started earlier (the tokio worker, embed-batcher's model pool,
/// made while its settings are read) may already hold arenas of their own;
/// the cap applies to arenas created from here on.
///
/// Rust code allocates with mimalloc; glibc serves librdkafka and RocksDB.
/// glibc gives threads that allocate at once their own arenas (up to eight
/// per core), and memory freed in one arena serves only that arena: the
/// state writer's memtable inserts and the processing thread's block-cache
/// reads then each kept their own high-water mark. One arena per thread
/// lowers peak RSS at no cost in records/s (bench/results/2026-12-01-diary.md,
/// "before midnight", step 3).
fn limit_malloc_arenas(processing_threads: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let arenas = libc::c_int::try_from(processing_threads.max(1)).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only sets a parameter of the allocator.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = processing_threads;
}

/// Sets up logging in the chosen format; `RUST_LOG` filters (default `info`).
/// Secret client properties never reach the log (see [`crate::client`]).
fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(RedactingStderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
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
        Self::with_deferred_processor(args, topology, move || Ok(processor))
    }

    /// [`Pipeline::new`] with the processor that `make` makes when the
    /// service runs (or a test driver starts), not before: `describe`,
    /// `acls` and `reset` run no processor, and should neither wait for one
    /// that is slow to make nor fail for want of what it needs
    /// (embed-batcher's model files).
    pub fn with_deferred_processor<P: Processor>(
        args: RuntimeArgs,
        topology: Topology<P::Input>,
        make: impl FnOnce() -> anyhow::Result<P> + 'static,
    ) -> Self {
        Pipeline {
            args,
            service: topology.service,
            stages: vec![Box::new(Stage {
                name: None,
                topology,
                processor: Box::new(make),
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
            processor: Box::new(move || Ok(processor)),
        }));
        self
    }

    /// The flags, the service name and the stages, for the test driver.
    #[cfg(feature = "test-utils")]
    pub(crate) fn into_parts(self) -> (RuntimeArgs, &'static str, Vec<Box<dyn StageSpec>>) {
        (self.args, self.service, self.stages)
    }

    /// What the pipeline is made of, with no broker (see [`crate::describe`]).
    pub fn describe(&self) -> anyhow::Result<ServiceDescription> {
        let application_id = self.args.application_id_or(self.service);
        let stages = self
            .stages
            .iter()
            .map(|stage| stage.describe(&application_id, &self.args))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(ServiceDescription {
            service: self.service.to_string(),
            dead_letter_topic: format!("{application_id}-dlq"),
            late_topic: self.args.late_topic.clone(),
            query_endpoints_topic: (self.args.queries.query_addr)
                .map(|_| endpoints_topic(&application_id)),
            processing_guarantee: match self.args.processing_guarantee {
                ProcessingGuarantee::ExactlyOnceV2 => "exactly_once_v2",
                ProcessingGuarantee::AtLeastOnce => "at_least_once",
            },
            application_id,
            stages,
        })
    }

    /// Runs every stage in `process` until SIGTERM/SIGINT; the exit code
    /// says whether the service stopped cleanly.
    fn run(self, process: Process) -> ExitCode {
        init_tracing(self.args.log_format);
        match self.run_stages(process) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!("{error:#}");
                eprintln!("error: {}", redact(&format!("{error:#}")));
                ExitCode::FAILURE
            }
        }
    }

    fn run_stages(self, process: Process) -> anyhow::Result<()> {
        self.args.check()?;
        limit_malloc_arenas(self.args.stream_threads * self.stages.len());
        let Process {
            runtime,
            shutdown,
            starting,
        } = process;
        match self.start_and_run(&runtime, shutdown, &starting) {
            Err(error) if is_interrupted(&error) => {
                tracing::info!("stopped during start-up");
                Ok(())
            }
            result => result,
        }
    }

    /// Start-up, then the stages until `shutdown`.
    fn start_and_run(
        self,
        runtime: &tokio::runtime::Runtime,
        shutdown: Arc<AtomicBool>,
        starting: &AtomicBool,
    ) -> anyhow::Result<()> {
        let processing_threads = self.args.stream_threads * self.stages.len();
        let metrics = Arc::new(Metrics::with_liveness_timeout(
            self.args.liveness_timeout.unless_zero(),
        ));
        metrics.add_process_gauges(Box::new(crate::process_stats::export));
        // The operations endpoint first: while start-up waits for the
        // brokers, /healthz answers and /readyz says not ready.
        serve_operations(runtime, self.args.http_addr, &metrics)?;
        // librdkafka logs errors only (the runtime reports what matters).
        let client = self.args.client.settings(&[("log_level", "3")])?;
        for notice in &client.notices {
            tracing::warn!("{notice}");
        }
        let admin = Admin::wait_for_brokers(
            &client.kafka,
            runtime.handle().clone(),
            self.args.kafka_wait_timeout.unless_zero(),
            &shutdown,
        )?;
        let memory_limit = usize::try_from(self.args.state_memory_limit.saturating_mul(1 << 20))
            .unwrap_or(usize::MAX);
        let write_format = self.args.write_format()?;
        if write_format != WriteFormat::NEWEST {
            tracing::info!(
                format = write_format.number(),
                newest = STATE_FORMAT,
                "writing state format {} for a two-step upgrade: drop --upgrade-from-format \
                 (UPGRADE_FROM_FORMAT) in a second rolling restart once every instance runs \
                 this release",
                write_format.number()
            );
        }
        let mut env = ServiceEnv {
            application_id: self.args.application_id_or(self.service),
            runtime: runtime.handle().clone(),
            client_config: client.kafka,
            registry: client.registry,
            admin,
            metrics,
            state_resources: StateResources::new(memory_limit, processing_threads)
                .writing(write_format),
            shutdown,
            link_writers: HashMap::new(),
            queryable: Vec::new(),
            args: self.args,
        };
        let resources = env.state_resources.clone();
        env.metrics.add_process_gauges(Box::new(move |snapshot| {
            for (kind, bytes) in resources.block_cache_bytes() {
                snapshot.set(
                    crate::metrics::ROCKSDB_BLOCK_CACHE_BYTES,
                    vec![("kind", kind.into())],
                    bytes as f64,
                );
            }
        }));
        let mut prepared = Vec::new();
        for stage in self.stages {
            shutdown::check(&env.shutdown)?;
            prepared.extend(stage.prepare(&mut env)?);
        }

        let queries = start_queries(&mut env)?;
        starting.store(false, Ordering::Relaxed);

        let shutdown = &env.shutdown;
        let metrics = &env.metrics;
        let run_stage = |stage: Box<dyn PreparedStage>| {
            let result = match stage.run() {
                // A restore cut short by the signal: the stage stopped
                // without committing, as it should.
                Err(error) if is_interrupted(&error) && shutdown.load(Ordering::Relaxed) => Ok(()),
                result => result,
            };
            if result.is_err() {
                metrics.set_failed();
                shutdown.store(true, Ordering::Relaxed);
            }
            result
        };
        let mut stages = prepared.into_iter();
        let first = stages.next().expect("a pipeline has a first stage thread");
        let results: Vec<anyhow::Result<()>> = std::thread::scope(|scope| {
            let later: Vec<_> = stages
                .map(|stage| scope.spawn(|| run_stage(stage)))
                .collect();
            let mut results = vec![run_stage(first)];
            results.extend(
                later
                    .into_iter()
                    .map(|handle| handle.join().expect("processing thread panicked")),
            );
            results
        });
        if let Some(queries) = queries {
            queries.stop();
        }
        tracing::info!("stopped");
        results.into_iter().collect()
    }
}

/// Serves /metrics, /healthz and /readyz on `address`, or on the default
/// address if it is free.
fn serve_operations(
    runtime: &tokio::runtime::Runtime,
    address: Option<std::net::SocketAddr>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<()> {
    match address {
        Some(address) => {
            runtime.block_on(crate::http::serve_operations(address, metrics.clone()))?;
        }
        None => {
            let address = crate::config::DEFAULT_HTTP_ADDR.parse()?;
            if let Err(error) =
                runtime.block_on(crate::http::serve_operations(address, metrics.clone()))
            {
                tracing::warn!(%error, "running without /metrics, /healthz and /readyz; set --http-addr");
            }
        }
    }
    Ok(())
}

/// Interactive queries, while they run.
struct RunningQueries {
    peers: Arc<Peers>,
    reader: std::thread::JoinHandle<()>,
    /// The listener's own runtime: a flood of queries never keeps
    /// `/healthz`, signals or registry calls waiting on the process's.
    runtime: tokio::runtime::Runtime,
}

impl RunningQueries {
    /// Withdraws this instance's endpoint and stops reading the others'.
    fn stop(self) {
        if let Err(error) = self.peers.advertise(None) {
            tracing::warn!(%error, "queries: cannot withdraw this instance's endpoint");
        }
        let _ = self.reader.join();
        // A range scan under way is not waited for.
        self.runtime
            .shutdown_timeout(std::time::Duration::from_secs(1));
    }
}

/// With `--query-addr`: the endpoints topic, this instance's endpoint in
/// it, the thread that reads it and the groups, and the query listener.
fn start_queries(env: &mut ServiceEnv) -> anyhow::Result<Option<RunningQueries>> {
    let args = &env.args.queries;
    let (Some(address), Some(url)) = (args.query_addr, args.advertised_url()) else {
        return Ok(None);
    };
    let token = args.token()?;
    let token_free = token.is_none() && !address.ip().is_loopback();
    let max_concurrent = args.query_max_concurrent as usize;
    let tls = args.tls_acceptor()?;
    let client = args.forwarding_client()?;
    let topic = endpoints_topic(&env.application_id);
    let common: Vec<(&str, &str)> = (env.args.internal_topics.topic_configs.iter())
        .map(|(key, value)| (key.as_str(), value.as_str()))
        .filter(|(key, _)| *key != "cleanup.policy")
        .chain([("cleanup.policy", "compact")])
        .collect();
    env.admin.ensure_topics(&[TopicSpec {
        name: &topic,
        partitions: 1,
        configs: &common,
        replication: env.args.internal_topics.internal_topic_replication_factor,
    }])?;
    let stages = std::mem::take(&mut env.queryable);
    let groups = stages.iter().map(|stage| stage.group.clone()).collect();
    let peers = Arc::new(Peers::new(
        &env.client_config,
        topic,
        groups,
        env.args.group_protocol,
    )?);
    peers.advertise(Some(&url))?;
    let reader = std::thread::Builder::new()
        .name("query-peers".into())
        .spawn({
            let (peers, shutdown) = (peers.clone(), env.shutdown.clone());
            move || peers.run(&shutdown)
        })?;
    let server = Arc::new(QueryServer {
        application_id: env.application_id.clone(),
        stages,
        open_stores: env.state_resources.open_stores().clone(),
        peers: peers.clone(),
        token,
        client,
        permits: Arc::new(tokio::sync::Semaphore::new(max_concurrent)),
        max_concurrent,
    });
    // Scans run on its blocking threads, as many as queries may be answered.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(max_concurrent)
        .thread_name("queries")
        .enable_all()
        .build()?;
    runtime.block_on(serve_queries(address, tls, server))?;
    if token_free {
        tracing::warn!(%address, "queries are served without a token to anyone who reaches this address (--query-allow-unauthenticated)");
    }
    tracing::info!(%url, "queries advertised");
    Ok(Some(RunningQueries {
        peers,
        reader,
        runtime,
    }))
}

/// What a service process has before its pipeline is built: the tokio
/// runtime (HTTP, signals, registry calls) and the signal handlers, with
/// the flags they set.
struct Process {
    runtime: tokio::runtime::Runtime,
    shutdown: Arc<AtomicBool>,
    /// Start-up is under way (see [`Signals::watch`]).
    starting: Arc<AtomicBool>,
}

impl Process {
    /// The runtime, with SIGTERM and SIGINT handled from here on.
    fn start() -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let shutdown = Arc::new(AtomicBool::new(false));
        let starting = Arc::new(AtomicBool::new(true));
        let signals = Signals::install(&runtime)?;
        runtime.spawn(signals.watch(shutdown.clone(), starting.clone()));
        Ok(Process {
            runtime,
            shutdown,
            starting,
        })
    }
}

/// A stage before startup: checks its topics and builds its clients (one set
/// per processing thread), or becomes a stage of the test driver.
pub(crate) trait StageSpec {
    fn describe(
        &self,
        service_application_id: &str,
        args: &RuntimeArgs,
    ) -> anyhow::Result<StageDescription>;
    fn prepare(
        self: Box<Self>,
        env: &mut ServiceEnv,
    ) -> anyhow::Result<Vec<Box<dyn PreparedStage>>>;
    #[cfg(feature = "test-utils")]
    fn into_driver_stage(
        self: Box<Self>,
        env: &mut DriverEnv,
    ) -> anyhow::Result<Box<dyn DriverStage>>;
}

/// A processing thread of a stage, ready: runs until shutdown.
pub(crate) trait PreparedStage: Send {
    fn run(self: Box<Self>) -> anyhow::Result<()>;
}

struct Stage<P: Processor> {
    name: Option<&'static str>,
    topology: Topology<P::Input>,
    /// Makes the processor; called once, when the stage is prepared.
    processor: Box<dyn FnOnce() -> anyhow::Result<P>>,
}

/// A processing thread's consumer, which owns its engine.
struct RunningStage<P: Processor> {
    thread: StreamThread,
    consumer: GroupConsumer<P>,
    shutdown: Arc<AtomicBool>,
}

impl<P: Processor> StageSpec for Stage<P> {
    fn describe(
        &self,
        service_application_id: &str,
        args: &RuntimeArgs,
    ) -> anyhow::Result<StageDescription> {
        describe_stage::<P>(&self.topology, self.name, service_application_id, args)
    }

    fn prepare(
        self: Box<Self>,
        env: &mut ServiceEnv,
    ) -> anyhow::Result<Vec<Box<dyn PreparedStage>>> {
        let Stage {
            name,
            topology,
            processor,
        } = *self;
        let threads = prepare_stage(env, name, topology, processor()?)?;
        let processing = threads.processing.into_iter().map(|(thread, consumer)| {
            Box::new(RunningStage {
                thread,
                consumer,
                shutdown: env.shutdown.clone(),
            }) as Box<dyn PreparedStage>
        });
        let standby = threads
            .standby
            .map(|standby| Box::new(standby) as Box<dyn PreparedStage>);
        let fencer = threads
            .fencer
            .map(|fencer| Box::new(fencer) as Box<dyn PreparedStage>);
        Ok(processing.chain(standby).chain(fencer).collect())
    }

    #[cfg(feature = "test-utils")]
    fn into_driver_stage(
        self: Box<Self>,
        env: &mut DriverEnv,
    ) -> anyhow::Result<Box<dyn DriverStage>> {
        let Stage {
            name,
            topology,
            processor,
        } = *self;
        driver_stage(env, name, topology, processor()?)
    }
}

impl<P: Processor> PreparedStage for RunningStage<P> {
    /// Runs the loop; with several threads, inside a span that names the
    /// thread, so that every log line (task ready, task closed) says which
    /// thread it came from.
    fn run(self: Box<Self>) -> anyhow::Result<()> {
        let span = match self.thread.label() {
            Some(thread) => tracing::info_span!("stream_thread", thread),
            None => tracing::Span::none(),
        };
        let _entered = span.enter();
        run_stage(self.consumer, &self.shutdown)
    }
}

impl PreparedStage for DepartedMemberFencer {
    fn run(self: Box<Self>) -> anyhow::Result<()> {
        let _entered = tracing::info_span!("fencing").entered();
        DepartedMemberFencer::run(*self);
        Ok(())
    }
}

impl PreparedStage for StandbyUpdater {
    fn run(self: Box<Self>) -> anyhow::Result<()> {
        let _entered = tracing::info_span!("standby").entered();
        StandbyUpdater::run(*self)
    }
}
