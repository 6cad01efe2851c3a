//! Topic administration at startup: is the broker there, do the inputs exist
//! and agree on partition counts, and are the internal topics in place.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use rdkafka::admin::{
    AdminClient, AdminOptions, ConfigSource, NewTopic, ResourceSpecifier, TopicReplication,
};
use std::sync::Mutex;

use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientConfig;

/// How long a metadata request waits for the broker.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one metadata request of [`Admin::connect`] may take before the
/// client's error events are looked at.
const CONNECT_ATTEMPT: Duration = Duration::from_millis(500);

/// How often a service waiting for its brokers says so.
const WAITING_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// One partition as `describe` reports it.
#[derive(Debug, Clone)]
pub struct PartitionInfo {
    pub id: i32,
    pub leader: i32,
    pub replicas: Vec<i32>,
    pub low: i64,
    pub high: i64,
}

pub use crate::native_admin::GroupMember;

/// Keeps the client's last error: an authentication or TLS failure, which
/// a metadata request only reports as a timeout.
#[derive(Default)]
struct LastError(Mutex<Option<ClientError>>);

/// An error event of a client.
struct ClientError {
    text: String,
    /// A refused login or TLS handshake: trying longer cannot help.
    refused: bool,
}

impl ClientContext for LastError {
    fn error(&self, error: KafkaError, reason: &str) {
        let text = if reason.is_empty() {
            error.to_string()
        } else {
            reason.to_string()
        };
        // A TLS alert or a failed verification is an answer too, though
        // librdkafka reports it as a transport failure.
        let refused = matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SSL)
        ) || text.contains("certificate verify failed")
            || text.contains("SSL alert number");
        *self.0.lock().unwrap() = Some(ClientError { text, refused });
    }
}

impl ConsumerContext for LastError {}

/// When the brokers answered the TLS handshake with a certificate alert
/// and the client presented a certificate, what to check: the broker's
/// alert (in TLS 1.3 always `certificate unknown`) does not say why it
/// refused it.
fn client_certificate_hint(config: &ClientConfig, cause: &str) -> String {
    let refused = [
        "alert certificate unknown",
        "alert bad certificate",
        "alert certificate expired",
        "alert unsupported certificate",
    ]
    .iter()
    .any(|alert| cause.contains(alert));
    let certificate = config
        .get("ssl.certificate.location")
        .or_else(|| config.get("ssl.keystore.location"))
        .or_else(|| {
            config
                .get("ssl.certificate.pem")
                .map(|_| "(ssl.certificate.pem)")
        });
    match certificate {
        Some(certificate) if refused => format!(
            "; the brokers refused the client certificate {certificate}: is it expired or \
             not yet valid, signed by a CA they do not trust, or not for client authentication?"
        ),
        _ => String::new(),
    }
}

/// A topic to create if it does not exist.
pub struct TopicSpec<'a> {
    pub name: &'a str,
    pub partitions: usize,
    /// Topic configs, e.g. `("cleanup.policy", "compact")`.
    pub configs: &'a [(&'a str, &'a str)],
    /// Replicas of each partition; `None`: the broker's default.
    pub replication: Option<i32>,
}

/// Admin operations on one cluster.
pub struct Admin {
    admin: AdminClient<DefaultClientContext>,
    metadata: BaseConsumer<LastError>,
    bootstrap: String,
    runtime: tokio::runtime::Handle,
}

impl Admin {
    /// Connects, and fails with a clear message if the broker does not answer
    /// within `timeout`: for tools, whose operator is watching.
    pub fn connect(
        config: &ClientConfig,
        runtime: tokio::runtime::Handle,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        Self::connect_within(config, runtime, Some(timeout), None)
    }

    /// Connects for a service, which waits for brokers that do not answer
    /// (down, or not started yet) up to `patience`, or as long as it takes
    /// with `None`, warning every [`WAITING_WARNING_INTERVAL`]; until
    /// `shutdown` is set. A refused login or TLS handshake fails at once:
    /// waiting cannot mend it.
    pub fn wait_for_brokers(
        config: &ClientConfig,
        runtime: tokio::runtime::Handle,
        patience: Option<Duration>,
        shutdown: &AtomicBool,
    ) -> anyhow::Result<Self> {
        Self::connect_within(config, runtime, patience, Some(shutdown))
    }

    fn connect_within(
        config: &ClientConfig,
        runtime: tokio::runtime::Handle,
        timeout: Option<Duration>,
        shutdown: Option<&AtomicBool>,
    ) -> anyhow::Result<Self> {
        let bootstrap = config.get("bootstrap.servers").unwrap_or("?").to_string();
        let admin: AdminClient<DefaultClientContext> = config
            .create()
            .map_err(|e| anyhow::anyhow!("invalid Kafka client settings: {e}"))?;
        let metadata: BaseConsumer<LastError> = config
            .create_with_context(LastError::default())
            .map_err(|e| anyhow::anyhow!("invalid Kafka client settings: {e}"))?;
        // Asked in short attempts, so that a refused login or handshake
        // (the broker says so at once) ends the wait at once.
        let started = Instant::now();
        let deadline = timeout.map(|timeout| started + timeout);
        let mut warned: Option<Instant> = None;
        loop {
            if let Some(shutdown) = shutdown {
                crate::shutdown::check(shutdown)?;
            }
            let attempt = deadline.map_or(CONNECT_ATTEMPT, |deadline| {
                CONNECT_ATTEMPT.min(deadline.saturating_duration_since(Instant::now()))
            });
            let Err(e) = metadata.fetch_metadata(None, attempt) else {
                break;
            };
            // A refused login or TLS handshake shows only as a transport
            // failure here; the client's error events, which polling hands
            // to the context, say what went wrong.
            while metadata.poll(Duration::from_millis(10)).is_some() {}
            let last_error = metadata.context().0.lock().unwrap();
            let refused = last_error.as_ref().is_some_and(|error| error.refused);
            let expired = deadline.is_some_and(|deadline| Instant::now() >= deadline);
            if !refused && !expired {
                if shutdown.is_some()
                    && warned.is_none_or(|at| at.elapsed() >= WAITING_WARNING_INTERVAL)
                {
                    let cause = last_error
                        .as_ref()
                        .map_or_else(|| e.to_string(), |error| error.text.clone());
                    tracing::warn!(
                        %bootstrap,
                        waited_s = started.elapsed().as_secs(),
                        %cause,
                        "Kafka does not answer; waiting for it, not ready until it does"
                    );
                    warned = Some(Instant::now());
                }
                continue;
            }
            drop(last_error);
            let waited = timeout.unwrap_or_else(|| started.elapsed()).as_secs_f32();
            let cause = metadata.context().0.lock().unwrap().take();
            return Err(match cause.map(|error| error.text) {
                Some(cause) if cause.contains("OAUTHBEARER token") => anyhow::anyhow!(
                    "cannot log in to Kafka at {bootstrap}: no OAUTHBEARER token from the token endpoint {}: {cause}",
                    config
                        .get("sasl.oauthbearer.token.endpoint.url")
                        .unwrap_or("(sasl.oauthbearer.token.endpoint.url not set)")
                ),
                Some(cause) if refused => anyhow::anyhow!(
                    "cannot connect to Kafka at {bootstrap}: {cause}{}",
                    client_certificate_hint(config, &cause)
                ),
                Some(cause) => anyhow::anyhow!(
                    "cannot reach Kafka at {bootstrap} within {waited}s: {cause}{}",
                    client_certificate_hint(config, &cause)
                ),
                None => anyhow::anyhow!(
                    "cannot reach Kafka at {bootstrap} within {waited}s ({e}); is the broker running? (--bootstrap-servers / KAFKA_BOOTSTRAP_SERVERS)"
                ),
            });
        }
        Ok(Admin {
            admin,
            metadata,
            bootstrap,
            runtime,
        })
    }

    /// Names of all topics, internal ones (`__*`) excluded, sorted.
    pub fn list(&self) -> anyhow::Result<Vec<String>> {
        let metadata = self
            .metadata
            .fetch_metadata(None, METADATA_TIMEOUT)
            .map_err(|e| anyhow::anyhow!("cannot list topics on {}: {e}", self.bootstrap))?;
        let mut names: Vec<String> = metadata
            .topics()
            .iter()
            .map(|t| t.name().to_string())
            .filter(|name| !name.starts_with("__"))
            .collect();
        names.sort();
        Ok(names)
    }

    fn topic_metadata(&self, topic: &str) -> anyhow::Result<rdkafka::metadata::Metadata> {
        self.metadata
            .fetch_metadata(Some(topic), METADATA_TIMEOUT)
            .map_err(|e| {
                anyhow::anyhow!("cannot describe topic {topic} on {}: {e}", self.bootstrap)
            })
    }

    /// Partitions of `topic` with their leader, replicas and offset range.
    pub fn describe(&self, topic: &str) -> anyhow::Result<Vec<PartitionInfo>> {
        let metadata = self.topic_metadata(topic)?;
        let found = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
            .ok_or_else(|| anyhow::anyhow!("topic {topic} does not exist"))?;
        let mut partitions = Vec::new();
        for partition in found.partitions() {
            let (low, high) = self
                .metadata
                .fetch_watermarks(topic, partition.id(), METADATA_TIMEOUT)
                .map_err(|e| {
                    anyhow::anyhow!("cannot read offsets of {topic}-{}: {e}", partition.id())
                })?;
            partitions.push(PartitionInfo {
                id: partition.id(),
                leader: partition.leader(),
                replicas: partition.replicas().to_vec(),
                low,
                high,
            });
        }
        partitions.sort_by_key(|p| p.id);
        Ok(partitions)
    }

    /// The configs of `topic` set on the topic itself (not the broker's
    /// defaults), sorted by name.
    pub fn topic_configs(&self, topic: &str) -> anyhow::Result<Vec<(String, String)>> {
        let options = AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT));
        let results = self
            .runtime
            .block_on(
                self.admin
                    .describe_configs([&ResourceSpecifier::Topic(topic)], &options),
            )
            .map_err(|e| anyhow::anyhow!("cannot read the configs of topic {topic}: {e}"))?;
        let mut configs = Vec::new();
        for result in results {
            let resource = result
                .map_err(|e| anyhow::anyhow!("cannot read the configs of topic {topic}: {e}"))?;
            for entry in resource.entries {
                if matches!(entry.source, ConfigSource::DynamicTopic) {
                    configs.push((entry.name, entry.value.unwrap_or_default()));
                }
            }
        }
        configs.sort();
        Ok(configs)
    }

    /// Partition count of `topic`, or `None` if it does not exist.
    pub fn partition_count(&self, topic: &str) -> anyhow::Result<Option<usize>> {
        let metadata = self.topic_metadata(topic)?;
        let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Ok(None);
        };
        match found.error() {
            None if !found.partitions().is_empty() => Ok(Some(found.partitions().len())),
            None => Ok(None),
            Some(
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART
                | RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
            ) => Ok(None),
            Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED) => anyhow::bail!(
                "not authorized to describe topic {topic}: this user lacks the DESCRIBE \
                 ACL on it (and READ or WRITE, as the topic is an input or an output)"
            ),
            Some(code) => anyhow::bail!("topic {topic}: {}", RDKafkaErrorCode::from(code)),
        }
    }

    /// Waits up to `wait` for every topic to exist; returns their partition counts.
    pub fn wait_for_topics(
        &self,
        topics: &[&str],
        wait: Duration,
        shutdown: &AtomicBool,
    ) -> anyhow::Result<HashMap<String, usize>> {
        let deadline = Instant::now() + wait;
        let mut last_log = Instant::now();
        loop {
            crate::shutdown::check(shutdown)?;
            let mut counts = HashMap::new();
            let mut missing = Vec::new();
            for topic in topics {
                match self.partition_count(topic)? {
                    Some(count) => {
                        counts.insert(topic.to_string(), count);
                    }
                    None => missing.push(*topic),
                }
            }
            if missing.is_empty() {
                return Ok(counts);
            }
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "input topic(s) {} do not exist on {} (waited {}s; create them or set --topic-wait)",
                    missing.join(", "),
                    self.bootstrap,
                    wait.as_secs()
                );
            }
            if last_log.elapsed() >= Duration::from_secs(10) {
                tracing::warn!(missing = %missing.join(", "), "waiting for input topics to be created");
                last_log = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Creates `topic` with `partitions` and `configs` unless it exists;
    /// returns its partition count.
    pub fn ensure_topic(
        &self,
        topic: &str,
        partitions: usize,
        configs: &[(&str, &str)],
    ) -> anyhow::Result<usize> {
        let counts = self.ensure_topics(&[TopicSpec {
            name: topic,
            partitions,
            configs,
            replication: None,
        }])?;
        Ok(counts[0])
    }

    /// Creates those of `topics` that do not exist, in one request (the
    /// controller creates them together: a service's startup does not pay
    /// one round trip per internal topic); returns every topic's partition
    /// count, in order.
    pub fn ensure_topics(&self, topics: &[TopicSpec<'_>]) -> anyhow::Result<Vec<usize>> {
        let mut counts = Vec::with_capacity(topics.len());
        for topic in topics {
            counts.push(self.partition_count(topic.name)?);
        }
        let missing: Vec<&TopicSpec<'_>> = topics
            .iter()
            .zip(&counts)
            .filter(|(_, count)| count.is_none())
            .map(|(topic, _)| topic)
            .collect();
        if !missing.is_empty() {
            self.create(&missing)?;
        }
        // A fresh topic reaches the brokers' metadata a moment after the
        // controller confirms it. Waiting for it here matters beyond the
        // count (one that another client created meanwhile may have other
        // partitions than asked for): a consumer that subscribes before
        // its metadata shows the topic leaves it out of the group's
        // assignment until its next periodic metadata refresh, minutes
        // later, and the tasks that need its partitions stay incomplete.
        topics
            .iter()
            .zip(counts)
            .map(|(topic, count)| match count {
                Some(count) => Ok(count),
                None => self.wait_for_metadata(topic.name),
            })
            .collect()
    }

    /// Partition count of `topic` if it exists and every partition has a
    /// leader (what a consumer's subscription and a producer need).
    fn led_partition_count(&self, topic: &str) -> anyhow::Result<Option<usize>> {
        let metadata = self.topic_metadata(topic)?;
        let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Ok(None);
        };
        let led = found.error().is_none()
            && !found.partitions().is_empty()
            && found.partitions().iter().all(|p| p.leader() >= 0);
        Ok(led.then(|| found.partitions().len()))
    }

    /// Creates `topics`; one that another client created meanwhile is fine.
    fn create(&self, topics: &[&TopicSpec<'_>]) -> anyhow::Result<()> {
        let new_topics: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|topic| {
                let mut new_topic = NewTopic::new(
                    topic.name,
                    topic.partitions as i32,
                    TopicReplication::Fixed(topic.replication.unwrap_or(-1)),
                );
                for (key, value) in topic.configs {
                    new_topic = new_topic.set(key, value);
                }
                new_topic
            })
            .collect();
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let names = || topics.iter().map(|t| t.name).collect::<Vec<_>>().join(", ");
        let results = self
            .runtime
            .block_on(self.admin.create_topics(&new_topics, &options))
            .map_err(|e| anyhow::anyhow!("cannot create topics {}: {e}", names()))?;
        for (result, topic) in results.into_iter().zip(topics) {
            match result {
                Ok(_) => tracing::info!(
                    topic = topic.name,
                    partitions = topic.partitions,
                    "created topic"
                ),
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, RDKafkaErrorCode::TopicAuthorizationFailed)) => anyhow::bail!(
                    "not authorized to create topic {name}: this user lacks the CREATE \
                     (and WRITE) ACL on it; grant them or create the topic beforehand"
                ),
                Err((name, code)) => anyhow::bail!("cannot create topic {name}: {code}"),
            }
        }
        Ok(())
    }

    /// Deletes `topics` (one that is already gone is fine) and waits until
    /// the metadata no longer shows them: a service started right after
    /// must create them anew, not find them on their way out.
    pub fn delete_topics(&self, topics: &[&str]) -> anyhow::Result<()> {
        if topics.is_empty() {
            return Ok(());
        }
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let results = self
            .runtime
            .block_on(self.admin.delete_topics(topics, &options))
            .map_err(|e| anyhow::anyhow!("cannot delete topics {}: {e}", topics.join(", ")))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
                Err((name, RDKafkaErrorCode::TopicAuthorizationFailed)) => anyhow::bail!(
                    "not authorized to delete topic {name}: this user lacks the DELETE ACL on it"
                ),
                Err((name, code)) => anyhow::bail!("cannot delete topic {name}: {code}"),
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for topic in topics {
            while self.partition_count(topic)?.is_some() {
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "topic {topic} was deleted but still appears in metadata after 30s"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// The members of each of `groups` (none for a group that does not
    /// exist), classic groups and KIP-848 `consumer` groups alike, by group.
    pub fn group_members(
        &self,
        groups: &[&str],
    ) -> anyhow::Result<HashMap<String, Vec<GroupMember>>> {
        crate::native_admin::group_members(self.admin.inner(), groups, METADATA_TIMEOUT)
    }

    /// The partition count of a topic that has just been created, once
    /// the metadata shows it with a leader for every partition.
    fn wait_for_metadata(&self, topic: &str) -> anyhow::Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(count) = self.led_partition_count(topic)? {
                return Ok(count);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "topic {topic} was created but does not appear in metadata"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod login_error_tests {
    use super::*;

    #[test]
    fn a_refused_client_certificate_is_named_with_what_to_check() {
        let alert = "ssl://127.0.0.1:19123/bootstrap: Receive failed: error:0A000416:SSL \
                     routines::sslv3 alert certificate unknown: SSL alert number 46";
        let mut config = ClientConfig::new();
        assert_eq!(client_certificate_hint(&config, alert), "");
        config.set("ssl.certificate.location", "/etc/kafka/client.pem");
        let hint = client_certificate_hint(&config, alert);
        assert!(hint.contains("refused the client certificate /etc/kafka/client.pem"));
        assert!(hint.contains("expired"), "{hint}");
        let refused_login = "SASL authentication error: Authentication failed";
        assert_eq!(client_certificate_hint(&config, refused_login), "");
    }
}
