//! Kafka and schema-registry plumbing shared by the tools.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use streams_runtime::admin::Admin;
use streams_runtime::avro::{leak_schema, AvroEncoder, Registry};
use streams_runtime::client::RegistrySettings;

use crate::records::Record;

/// Where the cluster is.
#[derive(Debug, Clone, clap::Args)]
pub struct Cluster {
    /// Kafka bootstrap servers.
    #[arg(
        long,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "127.0.0.1:9092"
    )]
    pub bootstrap_servers: String,
    /// Schema registry URL.
    #[arg(
        long,
        env = "SCHEMA_REGISTRY_URL",
        default_value = "http://127.0.0.1:8081"
    )]
    pub schema_registry_url: String,
}

impl Cluster {
    /// A client configuration with only the bootstrap servers (and quiet logs).
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.bootstrap_servers)
            .set("log_level", "3");
        config
    }

    /// A consumer for metadata, offsets and group queries (never subscribes).
    pub fn query_consumer(&self, group: &str) -> anyhow::Result<BaseConsumer> {
        let mut config = self.client_config();
        config
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            // read_committed would make offset fetches wait for pending
            // transactional offset commits (KIP-447's require_stable).
            .set("isolation.level", "read_uncommitted");
        Ok(config.create()?)
    }

    /// A consumer that reads committed records only, fetching as soon as
    /// any arrive (for timing arrivals), in group `group` (which it never
    /// joins: it is assigned its partitions).
    pub fn committed_reader(&self, group: &str) -> anyhow::Result<BaseConsumer> {
        let mut config = self.client_config();
        config
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "5");
        Ok(config.create()?)
    }

    /// A registry client.
    pub fn registry(&self, runtime: &tokio::runtime::Runtime) -> anyhow::Result<Registry> {
        let settings = RegistrySettings {
            url: self.schema_registry_url.clone(),
            ..RegistrySettings::default()
        };
        Registry::new(&settings, runtime.handle().clone())
    }
}

/// A multi-thread runtime of one worker: the registry client blocks on its
/// handle from the calling thread.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?)
}

/// Creates the topics (`partitions` each, kept forever) unless they exist.
pub fn create_topics(
    cluster: &Cluster,
    runtime: &tokio::runtime::Runtime,
    topics: &[String],
    partitions: usize,
) -> anyhow::Result<()> {
    let admin = Admin::connect(
        &cluster.client_config(),
        runtime.handle().clone(),
        Duration::from_secs(10),
    )?;
    for topic in topics {
        let count = admin.ensure_topic(topic, partitions, &[("retention.ms", "-1")])?;
        anyhow::ensure!(
            count == partitions,
            "topic {topic} exists with {count} partitions, not {partitions}"
        );
    }
    Ok(())
}

/// Deletes the topics whose names start with one of `prefixes` (a run's
/// inputs, outputs, changelogs and repartition topics); returns their names.
pub fn delete_topics(
    cluster: &Cluster,
    runtime: &tokio::runtime::Runtime,
    prefixes: &[String],
) -> anyhow::Result<Vec<String>> {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    let consumer = cluster.query_consumer("loadgen-query")?;
    let metadata = consumer.fetch_metadata(None, Duration::from_secs(10))?;
    let doomed: Vec<String> = metadata
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .filter(|name| prefixes.iter().any(|p| name.starts_with(p.as_str())))
        .collect();
    if doomed.is_empty() {
        return Ok(doomed);
    }
    let admin: AdminClient<DefaultClientContext> = cluster.client_config().create()?;
    let names: Vec<&str> = doomed.iter().map(String::as_str).collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in runtime.block_on(admin.delete_topics(&names, &options))? {
        if let Err((topic, error)) = result {
            anyhow::bail!("deleting {topic}: {error}");
        }
    }
    Ok(doomed)
}

/// The partition count of a topic, from the broker's metadata.
pub fn partitions(consumer: &BaseConsumer, topic: &str) -> anyhow::Result<i32> {
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let count = metadata
        .topics()
        .first()
        .map_or(0, |t| t.partitions().len() as i32);
    anyhow::ensure!(count > 0, "topic {topic} does not exist");
    Ok(count)
}

/// Encodes the records of one use case's inputs into the wire format, with
/// each input's schema registered under `<topic>-value`.
pub struct Encoders {
    encoders: Vec<AvroEncoder>,
}

impl Encoders {
    pub fn register(
        registry: &Registry,
        topics: &[String],
        schemas: &[&str],
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            topics.len() == schemas.len(),
            "expected {} topics, got {}",
            schemas.len(),
            topics.len()
        );
        let mut encoders = Vec::new();
        for (topic, json) in topics.iter().zip(schemas) {
            let id = registry
                .register(&format!("{topic}-value"), json)
                .map_err(|e| anyhow::anyhow!("registering the schema of {topic}: {e}"))?;
            encoders.push(AvroEncoder::new(leak_schema(json)?, id)?);
        }
        Ok(Encoders { encoders })
    }

    /// Replaces `out` with the wire-format value of `record`, for input `input`.
    pub fn encode(&self, input: usize, record: &Record, out: &mut Vec<u8>) -> anyhow::Result<()> {
        out.clear();
        let encoder = &self.encoders[input];
        match record {
            Record::UserEvent(r) => encoder.append_to(r, out),
            Record::Temperature(r) => encoder.append_to(r, out),
            Record::Humidity(r) => encoder.append_to(r, out),
            Record::Order(r) => encoder.append_to(r, out),
            Record::Shipment(r) => encoder.append_to(r, out),
            Record::Marketplace(r) => encoder.append_to(r, out),
        }
    }
}

/// Current wall-clock time in epoch milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
