//! Settings every service shares: where Kafka and the registry are, who the
//! application is, where its state lives and how it delivers.
//!
//! A service flattens [`RuntimeArgs`] into its own clap struct, so every binary
//! takes the same common flags (and the same environment variables).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

pub use crate::client::kafka::GroupProtocol;
use crate::client::ClientArgs;
use crate::duration::HumanDuration;
use crate::state::format::WriteFormat;

/// How input records, state changes and outputs are committed together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProcessingGuarantee {
    /// Outputs, changelog writes and input offsets commit in one Kafka
    /// transaction per commit interval.
    #[value(name = "exactly_once_v2")]
    ExactlyOnceV2,
    /// Outputs are flushed before input offsets are committed; a crash can
    /// repeat the outputs of one commit interval.
    #[value(name = "at_least_once")]
    AtLeastOnce,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The flags shared by every service.
#[derive(Debug, Clone, Args)]
pub struct RuntimeArgs {
    /// Where Kafka and the registry are, and the client properties.
    #[command(flatten)]
    pub client: ClientArgs,

    /// Whether the service registers the schema of each topic it writes
    /// (`true`, the default) or, with `false`, uses the latest version
    /// registered under the output subject (`<topic>-value`, `GET
    /// /subjects/<subject>/versions/latest`) and its id. The service encodes
    /// records with its own schema, so that version must encode the same
    /// bytes: its Avro Parsing Canonical Form must equal the service's (same
    /// names, field order and types; docs, defaults, aliases and logical
    /// types may differ): "compatible" means that here, and a version the
    /// registry calls compatible but that differs is refused. Start-up fails
    /// if the subject has no version or its latest differs. Stage-link topics
    /// (internal, the service's own) use their subject's latest version when
    /// it matches and are registered otherwise (docs/deploy.md).
    #[arg(
        long,
        env = "SCHEMA_REGISTRY_AUTO_REGISTER",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "true|false"
    )]
    pub schema_registry_auto_register: bool,

    /// Application id: the consumer group id and the prefix of every internal
    /// topic. Defaults to the service name.
    #[arg(long, env = "APPLICATION_ID")]
    pub application_id: Option<String>,

    /// A name for this instance that stays the same across its restarts
    /// (a StatefulSet pod name, say). It sets Kafka static membership
    /// (`group.instance.id`): an instance restarted within the session
    /// timeout gets its partitions back without a rebalance. Under
    /// exactly-once it is also the stable part of the transactional id, so it
    /// must be unique among the instances of an application.
    #[arg(long, env = "INSTANCE_ID", value_parser = parse_instance_id)]
    pub instance_id: Option<String>,

    /// The consumer group protocol: `classic` (eager rebalancing with the
    /// client-side range assignor) or `consumer` (KIP-848: incremental
    /// rebalancing with the broker's range assignor; tasks that do not move
    /// keep processing through a rebalance). Needs Kafka 4.0 or newer.
    #[arg(long, env = "GROUP_PROTOCOL", value_enum, default_value = "classic")]
    pub group_protocol: GroupProtocol,

    /// Directory for the RocksDB state of this instance's tasks.
    #[arg(long, env = "STATE_DIR", default_value = "./state")]
    pub state_dir: PathBuf,

    /// Delivery guarantee.
    #[arg(
        long,
        env = "PROCESSING_GUARANTEE",
        value_enum,
        default_value = "exactly_once_v2"
    )]
    pub processing_guarantee: ProcessingGuarantee,

    /// How often input offsets, outputs and state changes are committed.
    #[arg(long, env = "COMMIT_INTERVAL", default_value = "100ms")]
    pub commit_interval: HumanDuration,

    /// Memory shared by all tasks' state, in MiB: RocksDB's block cache and
    /// write buffers (12/16), the read caches in front of them (1/16) and
    /// the timers kept in memory (3/16; later ones are spilled to RocksDB);
    /// one budget for the process, whatever its threads and stages.
    #[arg(long, env = "STATE_MEMORY_LIMIT_MB", default_value_t = 256)]
    pub state_memory_limit: u64,

    /// Processing threads per stage (Kafka Streams' `num.stream.threads`):
    /// each has its own tasks, consumer and producer, all in the stage's one
    /// consumer group, so one process can use several cores. More threads
    /// than input partitions leave the extra ones idle.
    #[arg(long, env = "STREAM_THREADS", default_value_t = 1, value_parser = parse_stream_threads)]
    pub stream_threads: usize,

    /// Warm copies of other instances' tasks that this instance keeps, per
    /// task (Kafka Streams' `num.standby.replicas`): a task that
    /// moves here after its instance fails restores only the changelog tail.
    /// Needs exactly_once_v2 and the classic group protocol.
    #[arg(long, env = "STANDBY_REPLICAS", default_value_t = 0)]
    pub standby_replicas: usize,

    /// The first step of a two-step upgrade to a release of a newer state
    /// format (Kafka Streams' `upgrade.from`): the state format the pods
    /// being replaced write, which this build then writes too, so that they
    /// can keep standbys of its tasks, take them over, or replace it again
    /// (a rollback). Drop it in a second rolling restart once every pod runs
    /// this build (docs/deploy.md, "Upgrades and rollback").
    #[arg(long, env = "UPGRADE_FROM_FORMAT")]
    pub upgrade_from_format: Option<u8>,

    /// When an input partition delivers nothing for this long (wall clock), it
    /// stops holding the watermark back. Off by default: results stay replayable.
    #[arg(long, env = "IDLE_TIMEOUT")]
    pub idle_timeout: Option<HumanDuration>,

    /// How long a task with several inputs waits for an input that has nothing
    /// buffered before going on without it (Kafka Streams' `max.task.idle.ms`).
    /// Waiting lets records of different topics be merged in event-time order.
    #[arg(long, env = "MAX_TASK_IDLE", default_value = "1s")]
    pub max_task_idle: HumanDuration,

    /// Topic that receives a copy of every late record (not processed). Off by default.
    #[arg(long, env = "LATE_TOPIC")]
    pub late_topic: Option<String>,

    /// How long to wait at startup for input topics that do not exist yet.
    #[arg(long, env = "TOPIC_WAIT", default_value = "60s")]
    pub topic_wait: HumanDuration,

    /// How long start-up waits for the brokers to answer before it gives
    /// up with an error. `0s`, the default, waits as long as it takes: not
    /// ready meanwhile, with a warning every 10 s, so that a pod started
    /// before its brokers waits for them instead of crash-looping. A
    /// refused login or TLS handshake fails at once either way.
    #[arg(long, env = "KAFKA_WAIT_TIMEOUT", default_value = "0s")]
    pub kafka_wait_timeout: HumanDuration,

    /// Address of the HTTP listener for /metrics, /healthz and /readyz.
    /// Default `0.0.0.0:9090`; when the default port is taken (several
    /// services on one host) the service runs without the listener and says
    /// so, while an address given explicitly must be free.
    #[arg(long, env = "HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,

    /// How long a processing thread may go without progress while input
    /// waits for it before `/healthz` fails, so that the orchestrator
    /// restarts a stuck process. Restoring, idling without input and
    /// Kafka out of reach are not stalls (docs/metrics.md). `0s` turns
    /// the check off.
    #[arg(long, env = "LIVENESS_TIMEOUT", default_value = "300s")]
    pub liveness_timeout: HumanDuration,

    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// How produced batches are compressed: outputs, changelogs,
    /// repartition topics and dead letters alike. lz4 costs the least CPU
    /// per record of the codecs that shrink Avro records well
    /// (docs/deploy.md, "Compression"). Inputs may use any codec. Wins over
    /// `--kafka compression.type`.
    #[arg(long, env = "COMPRESSION_TYPE", value_enum, default_value = "lz4")]
    pub compression_type: CompressionType,

    /// Where the service creates its internal topics (changelogs,
    /// repartition and stage-link topics, dead letters): how they are made.
    #[command(flatten)]
    pub internal_topics: InternalTopicArgs,

    /// Interactive queries of the state (off unless `--query-addr` is set).
    #[command(flatten)]
    pub queries: crate::query::QueryArgs,
}

/// A codec of Kafka record batches, as `compression.type` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompressionType {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl CompressionType {
    /// The value of librdkafka's `compression.type`.
    pub fn as_str(self) -> &'static str {
        match self {
            CompressionType::None => "none",
            CompressionType::Gzip => "gzip",
            CompressionType::Snappy => "snappy",
            CompressionType::Lz4 => "lz4",
            CompressionType::Zstd => "zstd",
        }
    }
}

/// How the topics a service creates for itself are made (Kafka Streams'
/// `replication.factor` and `topic.*` settings). Topics that exist already
/// are left as they are.
#[derive(Debug, Clone, Args)]
pub struct InternalTopicArgs {
    /// Replication factor of the internal topics the service creates
    /// (changelogs, repartition and stage-link topics, the dead-letter and
    /// late topics, the output topic if missing). Default: the broker's
    /// `default.replication.factor`.
    #[arg(long, env = "INTERNAL_TOPIC_REPLICATION_FACTOR", value_parser = clap::value_parser!(i32).range(1..=32))]
    pub internal_topic_replication_factor: Option<i32>,

    /// A topic config for every topic the service creates, e.g.
    /// `min.insync.replicas=2`. Repeatable; env: comma-separated.
    #[arg(
        long = "internal-topic-config",
        env = "INTERNAL_TOPIC_CONFIGS",
        value_delimiter = ',',
        value_name = "KEY=VALUE",
        value_parser = crate::client::parse_key_value
    )]
    pub topic_configs: Vec<(String, String)>,

    /// A topic config for changelog topics only (after the common ones),
    /// e.g. `segment.bytes=104857600`. `cleanup.policy` stays `compact`.
    #[arg(
        long = "changelog-topic-config",
        env = "CHANGELOG_TOPIC_CONFIGS",
        value_delimiter = ',',
        value_name = "KEY=VALUE",
        value_parser = crate::client::parse_key_value
    )]
    pub changelog_configs: Vec<(String, String)>,

    /// A topic config for repartition and stage-link topics only, e.g.
    /// `retention.ms=86400000`.
    #[arg(
        long = "repartition-topic-config",
        env = "REPARTITION_TOPIC_CONFIGS",
        value_delimiter = ',',
        value_name = "KEY=VALUE",
        value_parser = crate::client::parse_key_value
    )]
    pub repartition_configs: Vec<(String, String)>,
}

/// An instance id: non-empty, and only characters that are safe in Kafka
/// ids and file names.
fn parse_instance_id(text: &str) -> Result<String, String> {
    let valid = !text.is_empty()
        && text.len() <= 200
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if valid {
        Ok(text.to_string())
    } else {
        Err(format!(
            "'{text}' is not a valid instance id: use 1 to 200 letters, digits, '-', '_' or '.'"
        ))
    }
}

/// The most processing threads a stage may have: far more than any host has
/// cores, low enough to catch a typo.
const MAX_STREAM_THREADS: usize = 1024;

/// A thread count: 1 to [`MAX_STREAM_THREADS`].
fn parse_stream_threads(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(threads) if (1..=MAX_STREAM_THREADS).contains(&threads) => Ok(threads),
        _ => Err(format!(
            "'{text}' is not a thread count: use a number from 1 to {MAX_STREAM_THREADS}"
        )),
    }
}

/// The HTTP listener address used when none is given.
pub const DEFAULT_HTTP_ADDR: &str = "0.0.0.0:9090";

impl RuntimeArgs {
    /// The state format to write (`--upgrade-from-format`).
    pub fn write_format(&self) -> anyhow::Result<WriteFormat> {
        match self.upgrade_from_format {
            Some(format) => WriteFormat::upgrading_from(format),
            None => Ok(WriteFormat::NEWEST),
        }
    }

    /// Checks the combinations of flags that clap cannot.
    pub fn check(&self) -> anyhow::Result<()> {
        self.queries.check()?;
        self.write_format()?;
        if self.standby_replicas > 0 {
            anyhow::ensure!(
                self.processing_guarantee == ProcessingGuarantee::ExactlyOnceV2,
                "--standby-replicas needs --processing-guarantee exactly_once_v2: under \
                 at_least_once a changelog can run ahead of the committed offsets, and a \
                 standby copy that far ahead cannot be taken over safely"
            );
            anyhow::ensure!(
                self.group_protocol == GroupProtocol::Classic,
                "--standby-replicas needs --group-protocol classic: standbys are placed \
                 from the group's assignments, which the consumer protocol does not describe"
            );
        }
        Ok(())
    }

    /// The application id, or `default` (the service name) when none was given.
    pub fn application_id_or(&self, default: &str) -> String {
        self.application_id
            .clone()
            .unwrap_or_else(|| default.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        runtime: RuntimeArgs,
    }

    fn parse(args: &[&str]) -> Result<RuntimeArgs, clap::Error> {
        Flags::try_parse_from(std::iter::once("service").chain(args.iter().copied()))
            .map(|flags| flags.runtime)
    }

    #[test]
    fn standby_replicas_need_exactly_once_and_the_classic_protocol() {
        let check = |flags: &[&str]| parse(flags).unwrap().check();
        assert!(check(&["--standby-replicas", "1"]).is_ok());
        let at_least_once = check(&[
            "--standby-replicas",
            "1",
            "--processing-guarantee",
            "at_least_once",
        ])
        .unwrap_err();
        assert!(at_least_once.to_string().contains("exactly_once_v2"));
        let consumer = check(&["--standby-replicas", "2", "--group-protocol", "consumer"]);
        assert!(consumer.unwrap_err().to_string().contains("classic"));
        assert!(check(&["--processing-guarantee", "at_least_once"]).is_ok());
    }

    #[test]
    fn queries_open_to_other_hosts_need_a_token_or_an_explicit_allowance() {
        let check = |flags: &[&str]| parse(flags).unwrap().check();
        assert!(check(&["--query-addr", "127.0.0.1:8090"]).is_ok());
        assert!(check(&["--query-addr", "[::1]:8090"]).is_ok());
        let open = check(&["--query-addr", "0.0.0.0:8090"]).unwrap_err();
        assert!(open.to_string().contains("--query-token-file"), "{open}");
        assert!(check(&[
            "--query-addr",
            "0.0.0.0:8090",
            "--query-token-file",
            "/run/token"
        ])
        .is_ok());
        assert!(check(&[
            "--query-addr",
            "10.0.0.7:8090",
            "--query-allow-unauthenticated"
        ])
        .is_ok());
    }

    #[test]
    fn schemas_are_registered_unless_turned_off_with_true_or_false() {
        let auto_register = |flags: &[&str]| parse(flags).map(|a| a.schema_registry_auto_register);
        if std::env::var_os("SCHEMA_REGISTRY_AUTO_REGISTER").is_none() {
            assert!(auto_register(&[]).unwrap());
        }
        let flag = "--schema-registry-auto-register";
        assert!(!auto_register(&[flag, "false"]).unwrap());
        assert!(auto_register(&[flag, "true"]).unwrap());
        for bad in ["no", "0", ""] {
            assert!(auto_register(&[flag, bad]).is_err(), "{bad} is refused");
        }
    }

    #[test]
    fn every_kafka_codec_is_a_compression_type_and_nothing_else() {
        for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
            let args = parse(&["--compression-type", codec]).unwrap();
            assert_eq!(args.compression_type.as_str(), codec);
        }
        let error = parse(&["--compression-type", "brotli"]).err().unwrap();
        assert!(
            error.to_string().contains("invalid value 'brotli'"),
            "{error}"
        );
    }

    #[test]
    fn internal_topic_settings_repeat_and_split_on_commas() {
        let args = parse(&[
            "--internal-topic-replication-factor",
            "3",
            "--internal-topic-config",
            "min.insync.replicas=2",
            "--changelog-topic-config",
            "segment.bytes=1048576,min.compaction.lag.ms=0",
        ])
        .unwrap();
        let topics = args.internal_topics;
        assert_eq!(topics.internal_topic_replication_factor, Some(3));
        assert_eq!(
            topics.topic_configs,
            [("min.insync.replicas".into(), "2".into())]
        );
        assert_eq!(topics.changelog_configs.len(), 2);
        assert!(parse(&["--internal-topic-replication-factor", "0"]).is_err());
        assert!(parse(&["--internal-topic-config", "no-value"]).is_err());
    }

    #[test]
    fn one_stream_thread_by_default_and_a_positive_bounded_count_otherwise() {
        if std::env::var_os("STREAM_THREADS").is_none() {
            assert_eq!(parse(&[]).unwrap().stream_threads, 1);
        }
        assert_eq!(
            parse(&["--stream-threads", "16"]).unwrap().stream_threads,
            16
        );
        for bad in ["0", "-1", "two", "1025"] {
            assert!(
                parse(&["--stream-threads", bad]).is_err(),
                "{bad} is refused"
            );
        }
    }
}
