//! What a service is made of, told without connecting anywhere: its
//! stages, the topics each reads and writes, its internal topics, stores,
//! timers, consumer groups and transactional ids (like Kafka Streams'
//! `Topology#describe()`), and the ACLs that follow from them.
//!
//! A service binary prints both: `<service> describe [--format text|json]`
//! and `<service> acls [--principal User:NAME] [--format kafka-acls|strimzi|json]
//! [--for run|reset]`, followed by the flags it runs with (topic names and
//! the application id are flags).

use std::fmt::Write as _;

use clap::ValueEnum;
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
        timers_from_state: P::TIMERS_FROM_STATE,
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
///   changelogs (Read to restore), repartition and link topics, dead letters;
/// * Read on the groups prefixed `<application-id>`: the group of each
///   stage and the group-less readers of changelogs;
/// * under exactly-once, Write on the transactional ids prefixed
///   `<application-id>-`.
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
    grants.push(AclGrant::prefixed(
        ResourceType::Group,
        app.clone(),
        &["Read"],
        "consumer groups of the stages and of the changelog readers",
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
/// * Read on the groups prefixed `<application-id>`: they are described
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
    grants.push(AclGrant::prefixed(
        ResourceType::Group,
        app.clone(),
        &["Read"],
        "consumer groups: described, their offsets committed",
    ));
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
    /// A Strimzi `KafkaUser` with simple authorization.
    Strimzi,
    Json,
}

/// The grants as `format` for `principal` (`User:NAME`).
pub fn render_acls(
    description: &ServiceDescription,
    grants: &[AclGrant],
    principal: &str,
    purpose: AclPurpose,
    format: AclFormat,
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
            let user = principal.strip_prefix("User:").unwrap_or(principal);
            let _ = writeln!(
                out,
                "# {of} {} (application id {}).",
                description.service, description.application_id
            );
            let _ = writeln!(out, "apiVersion: kafka.strimzi.io/v1beta2");
            let _ = writeln!(out, "kind: KafkaUser");
            let _ = writeln!(out, "metadata:\n  name: {user}");
            let _ = writeln!(out, "spec:\n  authorization:\n    type: simple\n    acls:");
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
