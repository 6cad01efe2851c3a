//! `streamctl`: create topics, produce and consume Avro records as JSON lines.
//!
//! Records use the Confluent wire format with schemas registered under
//! `<topic>-value`, exactly like the services, so that anything `streamctl`
//! produces a service can read and vice versa.

mod consume;

mod produce;
mod table;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use streams_runtime::admin::Admin;
use streams_runtime::client::{parse_key_value, redact, ClientArgs, RegistrySettings};
use streams_runtime::HumanDuration;

#[derive(Parser)]
#[command(
    name = "streamctl",
    version,
    about = "Topics, and Avro records as JSON lines, on Kafka + a schema registry"
)]
struct Cli {
    /// Where Kafka and the registry are, and the client properties.
    #[command(flatten)]
    client: ClientArgs,

    /// How long to wait for the broker before failing.
    #[arg(long, global = true, default_value = "5s")]
    connect_timeout: HumanDuration,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create, list and describe topics.
    Topics {
        #[command(subcommand)]
        command: TopicsCommand,
    },
    /// Produce JSON lines (`{"key": ..., "value": {...}}`) as Avro records.
    Produce(produce::ProduceArgs),
    /// Consume Avro records and print them as JSON lines or a table.
    Consume(consume::ConsumeArgs),
}

#[derive(Subcommand)]
enum TopicsCommand {
    /// Create a topic (no error if it exists with the same partition count).
    Create {
        name: String,
        #[arg(long, default_value_t = 1)]
        partitions: usize,
        /// Topic config (repeatable), e.g. `--config cleanup.policy=compact`.
        #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        configs: Vec<(String, String)>,
    },
    /// List topics.
    List,
    /// Show a topic's partitions, leaders, offsets and the configs set on it.
    Describe { name: String },
}

/// Output format of `consume`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Jsonl,
    Table,
}

/// What every command needs to reach the cluster.
pub struct Connection {
    pub config: rdkafka::ClientConfig,
    pub runtime: tokio::runtime::Runtime,
    pub registry: RegistrySettings,
    pub connect_timeout: Duration,
}

impl Connection {
    /// An admin client, failing fast when the broker does not answer.
    pub fn admin(&self) -> anyhow::Result<Admin> {
        Admin::connect(
            &self.config,
            self.runtime.handle().clone(),
            self.connect_timeout,
        )
    }

    /// A schema registry client.
    pub fn registry(&self) -> anyhow::Result<streams_runtime::avro::Registry> {
        streams_runtime::avro::Registry::new(&self.registry, self.runtime.handle().clone())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // librdkafka stays silent: every failure comes back as an error.
    let client = match cli.client.settings(&[("log_level", "0")]) {
        Ok(client) => client,
        Err(error) => {
            eprintln!("error: {}", redact(&format!("{error:#}")));
            return ExitCode::FAILURE;
        }
    };
    // The registry client blocks on the runtime handle, which only a
    // multi-thread runtime drives from outside `block_on`.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let connection = Connection {
        config: client.kafka,
        runtime,
        registry: client.registry,
        connect_timeout: cli.connect_timeout.as_std(),
    };
    let result = match cli.command {
        Command::Topics { command } => topics(&connection, command),
        Command::Produce(args) => produce::run(&connection, args),
        Command::Consume(args) => consume::run(&connection, args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", redact(&format!("{error:#}")));
            ExitCode::FAILURE
        }
    }
}

fn topics(connection: &Connection, command: TopicsCommand) -> anyhow::Result<()> {
    let admin = connection.admin()?;
    match command {
        TopicsCommand::Create {
            name,
            partitions,
            configs,
        } => {
            let configs: Vec<(&str, &str)> = configs
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let existing = admin.partition_count(&name)?;
            let count = admin.ensure_topic(&name, partitions, &configs)?;
            anyhow::ensure!(
                count == partitions,
                "topic {name} already exists with {count} partitions, not {partitions}"
            );
            match existing {
                Some(_) => println!("topic {name} already exists with {count} partitions"),
                None => println!("created topic {name} with {count} partitions"),
            }
        }
        TopicsCommand::List => {
            for name in admin.list()? {
                println!("{name}");
            }
        }
        TopicsCommand::Describe { name } => {
            let partitions = admin.describe(&name)?;
            println!("topic {name}: {} partitions", partitions.len());
            for p in partitions {
                println!(
                    "  partition {:>3}  leader {:>3}  replicas {:?}  offsets {}..{}",
                    p.id, p.leader, p.replicas, p.low, p.high
                );
            }
            for (key, value) in admin.topic_configs(&name)? {
                println!("  config {key}={value}");
            }
        }
    }
    Ok(())
}

/// Reads a schema file.
pub fn read_schema(path: &PathBuf) -> anyhow::Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read schema {}: {e}", path.display()))
}
