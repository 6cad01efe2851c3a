//! What a service is made of, told without connecting anywhere: its
//! stages, the topics each reads and writes, its internal topics, stores,
//! timers, consumer groups and transactional ids (like Kafka Streams'
//! `Topology#describe()`), and the ACLs that follow from them.
//!
//! A service binary prints both: `<service> describe [--format text|json]`
//! and `<service> acls [--principal User:NAME] [--format kafka-acls|strimzi|json]
//! [--for run|reset] [--strimzi-cluster NAME] [--strimzi-authentication TYPE]
//! [--strimzi-api-version v1|v1beta2]`, followed by the flags it runs with
//! (topic names and the application id are flags).

use std::fmt::Write as _;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::config::{ProcessingGuarantee, RuntimeArgs};
use crate::planning::{stage_topics, StageRole};
use crate::processor::{Processor, TimerName};
use crate::topology::{Sink, Source, Topology};

/// A whole service: every stage, and what the stages share.
#[derive(Debug, Clone, Serialize)]
pub struct ServiceDescription {
    pub service: String,
    pub application_id: String,
    pub processing_guarantee: &'static str,
    pub stages: Vec<StageDescription>,
    /// Where records that cannot be processed go (all stages).
    pub dead_letter_topic: String,
    /// Where late records go (`--late-topic`), if anywhere.
    pub late_topic: Option<String>,
    /// Where instances advertise their query URL, with `--query-addr`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query_endpoints_topic: Option<String>,
}

/// One stage: a processor over its own tasks, in its own consumer group.
#[derive(Debug, Clone, Serialize)]
pub struct StageDescription {
    /// `None` for the first stage.
    pub name: Option<String>,
    /// The stage's consumer group, and the prefix of its internal topics.
    pub group_id: String,
    pub processor: String,
    pub sources: Vec<SourceDescription>,
    pub sink: SinkDescription,
    pub stores: Vec<StoreDescription>,
    pub timers: Vec<&'static str>,
    /// Whether timers are derived from state on restore (no timer store).
    pub timers_from_state: bool,
    /// Under exactly-once: `<group>-<instance>` (thread *i* > 0 adds `-<i>`).
    pub transactional_id: Option<String>,
}

/// A topic a stage reads.
#[derive(Debug, Clone, Serialize)]
pub struct SourceDescription {
    pub topic: String,
    /// Written by an earlier stage of this service.
    pub internal: bool,
    /// How its records reach a task: `"co-partitioned"` (partition *p* to
    /// task *p*) or the repartition topic they are re-keyed through.
    pub partitioning: String,
    pub repartition_topic: Option<String>,
}

/// The topic a stage writes its results to.
#[derive(Debug, Clone, Serialize)]
pub struct SinkDescription {
    pub topic: String,
    /// A link to a later stage of this service.
    pub internal: bool,
    /// `"as inputs"`, or `"1"` for a single-partition link.
    pub partitions: &'static str,
}

/// A store of a stage, with its changelog.
#[derive(Debug, Clone, Serialize)]
pub struct StoreDescription {
    pub name: String,
    pub changelog: String,
}

impl ServiceDescription {
    /// Every internal topic the service creates and owns (changelogs,
    /// repartition and link topics, dead letters), sorted.
    pub fn internal_topics(&self) -> Vec<String> {
        let mut topics = vec![self.dead_letter_topic.clone()];
        topics.extend(self.query_endpoints_topic.clone());
        for stage in &self.stages {
            topics.extend(stage.stores.iter().map(|store| store.changelog.clone()));
            topics.extend(
                stage
                    .sources
                    .iter()
                    .filter_map(|source| source.repartition_topic.clone()),
            );
            if stage.sink.internal {
                topics.push(stage.sink.topic.clone());
            }
        }
        topics.sort();
        topics.dedup();
        topics
    }

    /// The topics the service reads and did not create.
    pub fn input_topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = self
            .stages
            .iter()
            .flat_map(|stage| &stage.sources)
            .filter(|source| !source.internal)
            .map(|source| source.topic.clone())
            .collect();
        topics.sort();
        topics.dedup();
        topics
    }

    /// The topics the service writes its results to (not internal).
    pub fn output_topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = self
            .stages
            .iter()
            .filter(|stage| !stage.sink.internal)
            .map(|stage| stage.sink.topic.clone())
            .chain(self.late_topic.clone())
            .collect();
        topics.sort();
        topics.dedup();
        topics
    }

    /// The description as text, in the manner of `Topology#describe()`.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Service {} (application id {}, {})",
            self.service, self.application_id, self.processing_guarantee
        );
        for (index, stage) in self.stages.iter().enumerate() {
            let name = stage.name.as_deref().unwrap_or("main");
            let _ = writeln!(
                out,
                "  Stage {index}: {name} (consumer group {})",
                stage.group_id
            );
            for source in &stage.sources {
                let origin = if source.internal {
                    "from an earlier stage"
                } else {
                    "input"
                };
                let _ = writeln!(
                    out,
                    "    Source: {} ({origin}; {})",
                    source.topic, source.partitioning
                );
            }
            let _ = writeln!(out, "    Processor: {}", stage.processor);
            for store in &stage.stores {
                let _ = writeln!(
                    out,
                    "      store {} -> changelog {}",
                    store.name, store.changelog
                );
            }
            if !stage.timers.is_empty() {
                let kept = if stage.timers_from_state {
                    "derived from state"
                } else {
                    "in the timer store"
                };
                let _ = writeln!(out, "      timers: {} ({kept})", stage.timers.join(", "));
            }
            let kind = if stage.sink.internal {
                "to a later stage"
            } else {
                "output"
            };
            let _ = writeln!(
                out,
                "    Sink: {} ({kind}; partitions: {})",
                stage.sink.topic, stage.sink.partitions
            );
            if let Some(id) = &stage.transactional_id {
                let _ = writeln!(out, "    Transactional id: {id}");
            }
        }
        let _ = writeln!(out, "  Dead letters: {}", self.dead_letter_topic);
        if let Some(late) = &self.late_topic {
            let _ = writeln!(out, "  Late records: {late}");
        }
        let _ = writeln!(
            out,
            "  Internal topics: {}",
            self.internal_topics().join(", ")
        );
        out
    }
}

/// Describes stage `name` (`None`: the first) of a service.
pub(crate) fn describe_stage<P: Processor>(
    topology: &Topology<P::Input>,
    name: Option<&'static str>,
    service_application_id: &str,
    args: &RuntimeArgs,
) -> anyhow::Result<StageDescription> {
    let role = StageRole::of(service_application_id, name, args);
    let topics = stage_topics::<_, P>(
        topology,
        service_application_id,
        &role.application_id,
        1,
        role.late_topic,
    )?;
    let sources = topology
        .inputs
        .iter()
        .map(|input| {
            let (topic, internal) = match &input.source {
                Source::Topic(topic) => (topic.clone(), false),
                Source::Link(link) => (link.topic(service_application_id), true),
            };
            let repartition_topic = input.repartition.as_ref().map(|repartition| {
                format!("{}-{}-repartition", role.application_id, repartition.name)
            });
            let partitioning = match &repartition_topic {
                Some(through) => format!("re-keyed through {through}"),
                None => "co-partitioned".to_string(),
            };
            SourceDescription {
                topic,
                internal,
                partitioning,
                repartition_topic,
            }
        })
        .collect();
    let sink = SinkDescription {
        topic: topics.output.clone(),
        internal: matches!(topology.sink, Sink::Link(_)),
        partitions: match &topology.sink {
            Sink::Link(link) if link.single_partition => "1",
            _ => "as inputs",
        },
    };
    let stores = topics
        .store_names
        .iter()
        .zip(&topics.changelogs)
        .map(|(store, changelog)| StoreDescription {
            name: store.clone(),
            changelog: changelog.clone(),
        })
        .collect();
    let processor = std::any::type_name::<P>();
    let transactional_id = (args.processing_guarantee == ProcessingGuarantee::ExactlyOnceV2)
        .then(|| format!("{}-<instance>", role.application_id));
    Ok(StageDescription {
        name: name.map(str::to_string),
        group_id: role.application_id,
        processor: processor
            .rsplit("::")
            .next()
            .unwrap_or(processor)
            .to_string(),
        sources,
        sink,
        stores,
        timers: <P::Timers as TimerName>::NAMES.to_vec(),
        timers_from_state: P::DERIVE_TIMERS.is_some(),
        transactional_id,
    })
}

/// How the ACLs name resources: each exactly, or every name starting with
/// it (for a shared test cluster whose topic names carry suffixes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PatternType {
    Literal,
    Prefixed,
}

/// What the principal of the ACLs does with the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AclPurpose {
    /// Runs the service.
    Run,
    /// Runs `<service> reset`: usually an operator, not the service's user.
    Reset,
}

/// A Kafka resource type an ACL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ResourceType {
    Topic,
    Group,
    TransactionalId,
}

/// One resource and the operations a principal needs on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AclGrant {
    pub resource_type: ResourceType,
    pub name: String,
    pub pattern_type: PatternType,
    /// Kafka's operation names: `Read`, `Write`, `Create`.
    pub operations: Vec<&'static str>,
    /// Why the service needs it.
    pub reason: &'static str,
}

/// The ACLs a service needs, and no more (docs/deploy.md, "ACLs"):
///
/// * Read on each input topic;
/// * Write and Create on each output topic (the late topic included): the
///   service creates an output that does not exist;
/// * Create, Write and Read on the topics prefixed `<application-id>-`: its
///   changelogs (Read to restore), repartition and link topics, dead letters,
///   query endpoints;
/// * Read on the group `<application-id>`, the first stage's;
/// * Read on the groups prefixed `<application-id>-`: those of the later
///   stages (`<application-id>-<stage>`), and the groups that only name the
///   consumers reading by assignment, which look up their coordinator all
///   the same: the changelog readers (`<group>-restore`, `<group>-standby`),
///   the standby's group watcher (`<group>-standby-watch`) and the query
///   endpoints reader (`<application-id>-query-endpoints-reader`);
/// * under exactly-once, Write on the transactional ids prefixed
///   `<application-id>-`.
///
/// Every prefix ends with the separator `-`, so that an application `A`
/// is granted nothing of an application `A2`. (An application whose id is
/// `A-` followed by more shares the prefix: give applications ids of which
/// none is another's followed by `-`.)
///
/// Describe is implied by each of these, and nothing is needed on the
/// cluster (idempotent producers need Write on a topic only, KIP-679).
/// With `pattern` `Prefixed`, input and output topics are prefixes too.
/// For [`AclPurpose::Reset`], those of [`reset_grants`] instead.
pub fn acl_grants(
    description: &ServiceDescription,
    pattern: PatternType,
    purpose: AclPurpose,
) -> Vec<AclGrant> {
    if purpose == AclPurpose::Reset {
        return reset_grants(description, pattern);
    }
    let app = &description.application_id;
    let mut grants = AclGrant::topics(description.input_topics(), pattern, &["Read"], "input");
    grants.extend(AclGrant::topics(
        description.output_topics(),
        pattern,
        &["Create", "Write"],
        "output, created if missing",
    ));
    grants.push(AclGrant::prefixed(
        ResourceType::Topic,
        format!("{app}-"),
        &["Create", "Read", "Write"],
        "internal topics: changelogs, repartition and stage links, dead letters",
    ));
    grants.push(AclGrant::literal(
        ResourceType::Group,
        app.clone(),
        &["Read"],
        "consumer group of the first stage",
    ));
    grants.push(AclGrant::prefixed(
        ResourceType::Group,
        format!("{app}-"),
        &["Read"],
        "consumer groups of the later stages, the changelog readers, the standby's group \
         watcher and the query endpoints reader",
    ));
    if description
        .stages
        .iter()
        .any(|stage| stage.transactional_id.is_some())
    {
        grants.push(AclGrant::prefixed(
            ResourceType::TransactionalId,
            format!("{app}-"),
            &["Write"],
            "exactly-once transactions",
        ));
    }
    grants
}

/// The ACLs `<service> reset` needs (`crate::reset`), for a principal that
/// holds none of the service's own:
///
/// * Read on each input topic: its offsets are looked up and committed
///   anew (an offset commit needs Read on the topic and on the group);
/// * Read and Delete on the topics prefixed `<application-id>-`: the
///   internal topics are deleted, and the offsets of the repartition and
///   stage-link topics committed;
/// * Read on the consumer group of each stage, by name: they are described
///   (a reset refuses while one has members) and their offsets committed.
///
/// Output and dead-letter topics are kept and not touched.
fn reset_grants(description: &ServiceDescription, pattern: PatternType) -> Vec<AclGrant> {
    let app = &description.application_id;
    let mut grants = AclGrant::topics(
        description.input_topics(),
        pattern,
        &["Read"],
        "input: its offsets committed anew",
    );
    grants.push(AclGrant::prefixed(
        ResourceType::Topic,
        format!("{app}-"),
        &["Delete", "Read"],
        "internal topics: deleted, the offsets of repartition and stage links committed",
    ));
    grants.extend(description.stages.iter().map(|stage| {
        AclGrant::literal(
            ResourceType::Group,
            stage.group_id.clone(),
            &["Read"],
            "consumer group of a stage: described, its offsets committed",
        )
    }));
    grants
}

impl AclGrant {
    /// `operations` on each of the topics `names`, named as `pattern` says.
    fn topics(
        names: Vec<String>,
        pattern: PatternType,
        operations: &[&'static str],
        reason: &'static str,
    ) -> Vec<AclGrant> {
        (names.into_iter())
            .map(|name| AclGrant {
                resource_type: ResourceType::Topic,
                name,
                pattern_type: pattern,
                operations: operations.to_vec(),
                reason,
            })
            .collect()
    }

    /// `operations` on the resource of `resource_type` named `name`.
    fn literal(
        resource_type: ResourceType,
        name: String,
        operations: &[&'static str],
        reason: &'static str,
    ) -> AclGrant {
        AclGrant {
            resource_type,
            name,
            pattern_type: PatternType::Literal,
            operations: operations.to_vec(),
            reason,
        }
    }

    /// `operations` on every resource of `resource_type` whose name starts
    /// with `prefix`.
    fn prefixed(
        resource_type: ResourceType,
        prefix: String,
        operations: &[&'static str],
        reason: &'static str,
    ) -> AclGrant {
        AclGrant {
            resource_type,
            name: prefix,
            pattern_type: PatternType::Prefixed,
            operations: operations.to_vec(),
            reason,
        }
    }
}

/// How `acls` prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AclFormat {
    /// `kafka-acls` commands (Apache Kafka's `bin/kafka-acls.sh`).
    KafkaAcls,
    /// A Strimzi `KafkaUser` with simple authorization, for the User
    /// Operator of the cluster `--strimzi-cluster`.
    Strimzi,
    Json,
}

/// What a Strimzi `KafkaUser` needs besides its ACLs (`acls --format
/// strimzi`): the cluster whose User Operator takes it up, and how the user
/// logs in.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct StrimziArgs {
    /// With `--format strimzi` (and required with it): the name of the
    /// `Kafka` resource of the cluster, the KafkaUser's label
    /// `strimzi.io/cluster`. The User Operator takes up only the KafkaUsers
    /// labelled with its cluster.
    #[arg(
        long = "strimzi-cluster",
        value_name = "NAME",
        required_if_eq("format", "strimzi")
    )]
    pub cluster: Option<String>,
    /// With `--format strimzi`: how the user logs in
    /// (`spec.authentication.type`).
    #[arg(
        long = "strimzi-authentication",
        value_enum,
        value_name = "TYPE",
        default_value = "scram-sha-512"
    )]
    pub authentication: StrimziAuthentication,
    /// With `--format strimzi`: the KafkaUser's `apiVersion`.
    #[arg(
        long = "strimzi-api-version",
        value_enum,
        value_name = "VERSION",
        default_value = "v1"
    )]
    pub api_version: StrimziApiVersion,
}

/// A `KafkaUser`'s `spec.authentication.type`, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StrimziAuthentication {
    /// SASL SCRAM-SHA-512: the User Operator makes the password, in the
    /// Secret named after the user; the principal is `User:<name>`.
    #[value(name = "scram-sha-512")]
    ScramSha512,
    /// Mutual TLS with a certificate the User Operator issues, in the
    /// Secret named after the user; the principal is `User:CN=<name>`.
    #[value(name = "tls")]
    Tls,
    /// Mutual TLS with a certificate issued elsewhere (cert-manager, as
    /// the kafka-mtls component expects) whose CN is the user's name; the
    /// principal is `User:CN=<name>`.
    #[value(name = "tls-external")]
    TlsExternal,
    /// No `spec.authentication`: the login is not the User Operator's
    /// (OAUTHBEARER, PLAIN); the KafkaUser carries the ACLs of
    /// `User:<name>` only.
    #[value(name = "none")]
    None,
}

impl StrimziAuthentication {
    /// The value of `spec.authentication.type`.
    fn type_name(self) -> Option<&'static str> {
        match self {
            StrimziAuthentication::ScramSha512 => Some("scram-sha-512"),
            StrimziAuthentication::Tls => Some("tls"),
            StrimziAuthentication::TlsExternal => Some("tls-external"),
            StrimziAuthentication::None => None,
        }
    }

    /// Whether the user is a certificate's: Strimzi grants the ACLs to
    /// `User:CN=<name>`.
    fn by_certificate(self) -> bool {
        matches!(
            self,
            StrimziAuthentication::Tls | StrimziAuthentication::TlsExternal
        )
    }
}

/// The `apiVersion` of a `KafkaUser`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StrimziApiVersion {
    /// `kafka.strimzi.io/v1`: Strimzi 0.49 and later, the only version
    /// served since Strimzi 1.0.
    #[value(name = "v1")]
    V1,
    /// `kafka.strimzi.io/v1beta2`: Strimzi before 1.0 (up to 0.51).
    #[value(name = "v1beta2")]
    V1beta2,
}

impl StrimziApiVersion {
    fn api_version(self) -> &'static str {
        match self {
            StrimziApiVersion::V1 => "kafka.strimzi.io/v1",
            StrimziApiVersion::V1beta2 => "kafka.strimzi.io/v1beta2",
        }
    }
}

/// Strimzi's User Operator refuses a user with a certificate of its own
/// whose name is longer than a certificate's CN may be.
const STRIMZI_TLS_NAME_MAX: usize = 64;

/// The name of the `KafkaUser` of `principal`: `User:NAME` (or
/// `User:CN=NAME` for a certificate's user), a Kubernetes object name.
fn kafka_user_name(principal: &str, authentication: StrimziAuthentication) -> anyhow::Result<&str> {
    let user = principal.strip_prefix("User:").unwrap_or(principal);
    let name = match user.strip_prefix("CN=") {
        Some(common_name) if authentication.by_certificate() => common_name,
        _ => user,
    };
    let expected = if authentication.by_certificate() {
        "User:NAME or User:CN=NAME"
    } else {
        "User:NAME"
    };
    if !is_dns_subdomain(name) {
        anyhow::bail!(
            "principal {principal}: a KafkaUser is named after its user, and {name:?} is no \
             Kubernetes object name (lowercase letters, digits, '-' and '.', starting and ending \
             with a letter or digit, at most 253 characters); give --principal {expected}"
        );
    }
    if authentication == StrimziAuthentication::Tls && name.len() > STRIMZI_TLS_NAME_MAX {
        anyhow::bail!(
            "principal {principal}: the User Operator refuses a tls user whose name is longer \
             than {STRIMZI_TLS_NAME_MAX} characters (its certificate's CN); give a shorter \
             --principal"
        );
    }
    Ok(name)
}

/// Whether `name` is a DNS-1123 subdomain, as Kubernetes object names are.
fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            let alphanumeric = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
            let bytes = label.as_bytes();
            match (bytes.first(), bytes.last()) {
                (Some(&first), Some(&last)) => {
                    alphanumeric(first)
                        && alphanumeric(last)
                        && bytes.iter().all(|&c| alphanumeric(c) || c == b'-')
                }
                _ => false,
            }
        })
}

/// Whether `value` is a valid, non-empty Kubernetes label value.
fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            bytes.len() <= 63
                && first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
        }
        _ => false,
    }
}

/// The grants as `format` for `principal` (`User:NAME`); `strimzi` says
/// what else a `KafkaUser` needs.
pub fn render_acls(
    description: &ServiceDescription,
    grants: &[AclGrant],
    principal: &str,
    purpose: AclPurpose,
    format: AclFormat,
    strimzi: &StrimziArgs,
) -> anyhow::Result<String> {
    let mut out = String::new();
    let of = match purpose {
        AclPurpose::Run => "ACLs of",
        AclPurpose::Reset => "ACLs of a reset of",
    };
    match format {
        AclFormat::KafkaAcls => {
            let _ = writeln!(
                out,
                "# {of} {} (application id {}) for {principal}; \
                 set BOOTSTRAP and ADMIN_CONFIG (an admin's client properties) first.",
                description.service, description.application_id
            );
            for grant in grants {
                let resource = match grant.resource_type {
                    ResourceType::Topic => "--topic",
                    ResourceType::Group => "--group",
                    ResourceType::TransactionalId => "--transactional-id",
                };
                let operations: String = grant
                    .operations
                    .iter()
                    .map(|operation| format!(" --operation {operation}"))
                    .collect();
                let pattern = match grant.pattern_type {
                    PatternType::Literal => "literal",
                    PatternType::Prefixed => "prefixed",
                };
                let _ = writeln!(out, "# {}", grant.reason);
                let _ = writeln!(
                    out,
                    "kafka-acls --bootstrap-server \"$BOOTSTRAP\" --command-config \"$ADMIN_CONFIG\" \
                     --add --allow-principal '{principal}' {resource} '{}' \
                     --resource-pattern-type {pattern}{operations}",
                    grant.name
                );
            }
        }
        AclFormat::Strimzi => {
            let cluster = strimzi
                .cluster
                .as_deref()
                .context("--format strimzi needs --strimzi-cluster NAME (the Kafka resource's)")?;
            if !is_label_value(cluster) {
                anyhow::bail!(
                    "--strimzi-cluster {cluster:?}: not a Kubernetes label value (at most 63 \
                     letters, digits, '-', '_' and '.', starting and ending with a letter or digit)"
                );
            }
            let user = kafka_user_name(principal, strimzi.authentication)?;
            let granted_to = if strimzi.authentication.by_certificate() {
                format!("User:CN={user}")
            } else {
                format!("User:{user}")
            };
            let _ = writeln!(
                out,
                "# {of} {} (application id {}) for {granted_to}, as a KafkaUser of the Kafka \
                 cluster {cluster}: apply it in the namespace its User Operator watches.",
                description.service, description.application_id
            );
            let _ = writeln!(out, "apiVersion: {}", strimzi.api_version.api_version());
            let _ = writeln!(out, "kind: KafkaUser");
            let _ = writeln!(
                out,
                "metadata:\n  name: \"{user}\"\n  labels:\n    strimzi.io/cluster: \"{cluster}\""
            );
            let _ = writeln!(out, "spec:");
            match strimzi.authentication.type_name() {
                Some(kind) => {
                    let _ = writeln!(out, "  authentication:\n    type: {kind}");
                }
                None => {
                    let _ = writeln!(
                        out,
                        "  # no authentication: the user logs in by other means than the User \
                         Operator's (OAUTHBEARER, PLAIN)"
                    );
                }
            }
            let _ = writeln!(out, "  authorization:\n    type: simple\n    acls:");
            for grant in grants {
                let kind = match grant.resource_type {
                    ResourceType::Topic => "topic",
                    ResourceType::Group => "group",
                    ResourceType::TransactionalId => "transactionalId",
                };
                let pattern = match grant.pattern_type {
                    PatternType::Literal => "literal",
                    PatternType::Prefixed => "prefix",
                };
                let _ = writeln!(out, "      # {}", grant.reason);
                let _ = writeln!(
                    out,
                    "      - resource:\n          type: {kind}\n          name: \"{}\"\n          \
                     patternType: {pattern}\n        operations: [{}]",
                    grant.name,
                    grant.operations.join(", ")
                );
            }
        }
        AclFormat::Json => {
            out = serde_json::to_string_pretty(&serde_json::json!({
                "service": description.service,
                "application_id": description.application_id,
                "principal": principal,
                "for": purpose,
                "acls": grants,
            }))?;
            out.push('\n');
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A service of two stages like window-aggregator's, application id
    /// `agg`, with queries on.
    fn two_stages(processing_guarantee: ProcessingGuarantee) -> ServiceDescription {
        let exactly_once = processing_guarantee == ProcessingGuarantee::ExactlyOnceV2;
        let stage = |name: Option<&str>, group: &str, source: (&str, bool), sink: (&str, bool)| {
            StageDescription {
                name: name.map(str::to_string),
                group_id: group.to_string(),
                processor: "P".to_string(),
                sources: vec![SourceDescription {
                    topic: source.0.to_string(),
                    internal: source.1,
                    partitioning: "co-partitioned".to_string(),
                    repartition_topic: None,
                }],
                sink: SinkDescription {
                    topic: sink.0.to_string(),
                    internal: sink.1,
                    partitions: "as inputs",
                },
                stores: vec![StoreDescription {
                    name: "windows".to_string(),
                    changelog: format!("{group}-windows-changelog"),
                }],
                timers: vec![],
                timers_from_state: false,
                transactional_id: exactly_once.then(|| format!("{group}-<instance>")),
            }
        };
        ServiceDescription {
            service: "window-aggregator".to_string(),
            application_id: "agg".to_string(),
            processing_guarantee: if exactly_once {
                "exactly_once_v2"
            } else {
                "at_least_once"
            },
            stages: vec![
                stage(
                    None,
                    "agg",
                    ("orders", false),
                    ("agg-partials-repartition", true),
                ),
                stage(
                    Some("final"),
                    "agg-final",
                    ("agg-partials-repartition", true),
                    ("counts", false),
                ),
            ],
            dead_letter_topic: "agg-dlq".to_string(),
            late_topic: None,
            query_endpoints_topic: Some("agg-query-endpoints".to_string()),
        }
    }

    /// Whether `grants` allow `operation` on the resource `name`, as Kafka's
    /// authorizer matches literal and prefixed patterns.
    fn allows(grants: &[AclGrant], kind: ResourceType, name: &str, operation: &str) -> bool {
        grants.iter().any(|grant| {
            grant.resource_type == kind
                && grant.operations.contains(&operation)
                && match grant.pattern_type {
                    PatternType::Literal => grant.name == name,
                    PatternType::Prefixed => name.starts_with(&grant.name),
                }
        })
    }

    fn run_grants(description: &ServiceDescription) -> Vec<AclGrant> {
        acl_grants(description, PatternType::Literal, AclPurpose::Run)
    }

    fn strimzi(cluster: Option<&str>, authentication: StrimziAuthentication) -> StrimziArgs {
        StrimziArgs {
            cluster: cluster.map(str::to_string),
            authentication,
            api_version: StrimziApiVersion::V1,
        }
    }

    fn kafka_user(principal: &str, strimzi: &StrimziArgs) -> anyhow::Result<String> {
        let description = two_stages(ProcessingGuarantee::ExactlyOnceV2);
        render_acls(
            &description,
            &run_grants(&description),
            principal,
            AclPurpose::Run,
            AclFormat::Strimzi,
            strimzi,
        )
    }

    /// The groups each consumer of the service names: the stages' own,
    /// and those of the consumers that read by assignment (restore.rs,
    /// standby/mod.rs, standby/watcher.rs, query/peers.rs).
    #[test]
    fn the_group_acls_cover_every_group_the_service_uses() {
        let description = two_stages(ProcessingGuarantee::ExactlyOnceV2);
        let grants = run_grants(&description);
        for stage in &description.stages {
            let group = &stage.group_id;
            for used in [
                group.clone(),
                format!("{group}-restore"),
                format!("{group}-standby"),
                format!("{group}-standby-watch"),
            ] {
                assert!(
                    allows(&grants, ResourceType::Group, &used, "Read"),
                    "{used}: {grants:#?}"
                );
            }
        }
        let reader = format!("{}-reader", description.query_endpoints_topic.unwrap());
        assert!(allows(&grants, ResourceType::Group, &reader, "Read"));
    }

    #[test]
    fn the_internal_topic_acls_cover_every_internal_topic() {
        let description = two_stages(ProcessingGuarantee::ExactlyOnceV2);
        let grants = run_grants(&description);
        for topic in description.internal_topics() {
            for operation in ["Create", "Read", "Write"] {
                assert!(
                    allows(&grants, ResourceType::Topic, &topic, operation),
                    "{operation} on {topic}"
                );
            }
        }
        for stage in &description.stages {
            let id = format!("{}-instance-0-1", stage.group_id);
            assert!(allows(&grants, ResourceType::TransactionalId, &id, "Write"));
        }
    }

    /// Application `agg` is granted nothing of application `agg2`: no
    /// group, internal topic or transactional id.
    #[test]
    fn no_acl_covers_an_application_whose_id_extends_this_ones() {
        let description = two_stages(ProcessingGuarantee::ExactlyOnceV2);
        for purpose in [AclPurpose::Run, AclPurpose::Reset] {
            let grants = acl_grants(&description, PatternType::Literal, purpose);
            for group in ["agg2", "agg2-final", "agg2-restore", "aggregates"] {
                assert!(
                    !allows(&grants, ResourceType::Group, group, "Read"),
                    "{purpose:?}: group {group} is covered: {grants:#?}"
                );
            }
            for topic in ["agg2-dlq", "agg2-windows-changelog", "aggregates"] {
                for operation in ["Create", "Read", "Write", "Delete"] {
                    assert!(
                        !allows(&grants, ResourceType::Topic, topic, operation),
                        "{purpose:?}: {operation} on topic {topic}"
                    );
                }
            }
            assert!(!allows(
                &grants,
                ResourceType::TransactionalId,
                "agg2-0",
                "Write"
            ));
        }
    }

    #[test]
    fn every_prefix_ends_with_the_separator() {
        for guarantee in [
            ProcessingGuarantee::ExactlyOnceV2,
            ProcessingGuarantee::AtLeastOnce,
        ] {
            let description = two_stages(guarantee);
            for purpose in [AclPurpose::Run, AclPurpose::Reset] {
                for grant in acl_grants(&description, PatternType::Literal, purpose) {
                    if grant.pattern_type == PatternType::Prefixed {
                        assert!(grant.name.ends_with('-'), "{purpose:?}: {grant:?}");
                    }
                }
            }
        }
    }

    /// The first stage's group by name, the others under the prefix `A-`.
    #[test]
    fn the_run_grants_name_the_first_group_and_prefix_the_others() {
        let description = two_stages(ProcessingGuarantee::AtLeastOnce);
        let groups: Vec<(String, PatternType)> = run_grants(&description)
            .into_iter()
            .filter(|grant| grant.resource_type == ResourceType::Group)
            .map(|grant| (grant.name, grant.pattern_type))
            .collect();
        assert_eq!(
            groups,
            [
                ("agg".to_string(), PatternType::Literal),
                ("agg-".to_string(), PatternType::Prefixed),
            ]
        );
    }

    /// A reset describes and commits the stages' groups, and no other.
    #[test]
    fn the_reset_grants_name_each_stage_group() {
        let description = two_stages(ProcessingGuarantee::ExactlyOnceV2);
        let grants = acl_grants(&description, PatternType::Literal, AclPurpose::Reset);
        let groups: Vec<(&str, PatternType, &[&str])> = grants
            .iter()
            .filter(|grant| grant.resource_type == ResourceType::Group)
            .map(|grant| {
                (
                    grant.name.as_str(),
                    grant.pattern_type,
                    grant.operations.as_slice(),
                )
            })
            .collect();
        assert_eq!(
            groups,
            [
                ("agg", PatternType::Literal, &["Read"][..]),
                ("agg-final", PatternType::Literal, &["Read"][..]),
            ]
        );
        assert!(!allows(&grants, ResourceType::Group, "agg-restore", "Read"));
    }

    #[test]
    fn a_strimzi_kafka_user_names_its_cluster_and_authentication() {
        let user = kafka_user(
            "User:agg",
            &strimzi(Some("my-cluster"), StrimziAuthentication::ScramSha512),
        )
        .unwrap();
        assert!(user.contains("\napiVersion: kafka.strimzi.io/v1\nkind: KafkaUser\n"));
        assert!(
            user.contains(
                "\nmetadata:\n  name: \"agg\"\n  labels:\n    strimzi.io/cluster: \"my-cluster\"\n"
            ),
            "{user}"
        );
        assert!(
            user.contains("\nspec:\n  authentication:\n    type: scram-sha-512\n  authorization:\n    type: simple\n    acls:\n"),
            "{user}"
        );
        assert!(user.contains(
            "      - resource:\n          type: group\n          name: \"agg-\"\n          \
             patternType: prefix\n        operations: [Read]\n"
        ));
        for (authentication, kind) in [
            (StrimziAuthentication::Tls, "tls"),
            (StrimziAuthentication::TlsExternal, "tls-external"),
        ] {
            let user = kafka_user("User:agg", &strimzi(Some("c"), authentication)).unwrap();
            assert!(user.contains(&format!("  authentication:\n    type: {kind}\n")));
            assert!(user.contains(" for User:CN=agg, "), "{user}");
        }
        let user =
            kafka_user("User:agg", &strimzi(Some("c"), StrimziAuthentication::None)).unwrap();
        assert!(!user.contains("\n  authentication:"), "{user}");
        let older = StrimziArgs {
            api_version: StrimziApiVersion::V1beta2,
            ..strimzi(Some("c"), StrimziAuthentication::ScramSha512)
        };
        let user = kafka_user("User:agg", &older).unwrap();
        assert!(user.contains("\napiVersion: kafka.strimzi.io/v1beta2\n"));
    }

    #[test]
    fn a_strimzi_kafka_user_needs_a_cluster_and_a_kubernetes_name() {
        let scram = StrimziAuthentication::ScramSha512;
        let error = kafka_user("User:agg", &strimzi(None, scram)).unwrap_err();
        assert!(error.to_string().contains("--strimzi-cluster"), "{error}");
        for cluster in ["", "my cluster", "-c", &"c".repeat(64)] {
            let error = kafka_user("User:agg", &strimzi(Some(cluster), scram)).unwrap_err();
            assert!(error.to_string().contains("label value"), "{error}");
        }
        for principal in ["User:Agg", "User:agg_1", "User:CN=agg", "Group:agg"] {
            let error = kafka_user(principal, &strimzi(Some("c"), scram)).unwrap_err();
            assert!(
                error.to_string().contains("no Kubernetes object name"),
                "{principal}: {error}"
            );
        }
        let tls = strimzi(Some("c"), StrimziAuthentication::Tls);
        let user = kafka_user("User:CN=agg", &tls).unwrap();
        assert!(user.contains("  name: \"agg\"\n"), "{user}");
        let long = format!("User:{}", "a".repeat(STRIMZI_TLS_NAME_MAX + 1));
        let error = kafka_user(&long, &tls).unwrap_err();
        assert!(error.to_string().contains("tls user"), "{error}");
        let external = strimzi(Some("c"), StrimziAuthentication::TlsExternal);
        assert!(kafka_user(&long, &external).is_ok());
    }
}
