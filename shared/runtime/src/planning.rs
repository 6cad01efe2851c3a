//! Planning a stage, with no broker: the topic of each input, the stage's
//! partition count and internal topics, its role in the pipeline, and the
//! wiring of an engine from its topology ([`wire_stage`]). `startup.rs`
//! does the Kafka part around it; the test driver uses it as it is.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::avro::{leak_schema, AvroEncoder, Registry};
use crate::clock::Clock;
use crate::collector::Collector;
use crate::config::RuntimeArgs;
use crate::engine::{
    Engine, EngineParts, EngineSettings, InputRuntime, IntakeParts, Rekeying, Route, SideTopics,
    Subscription,
};
use crate::output::OutputEncoder;
use crate::processor::Processor;
use crate::task::{EventTimeSettings, InputKind};
use crate::time::Idleness;
use crate::topology::{all_stores, InputSpec, Sink, Source, Topology};

/// One input topic of a stage, resolved.
pub(crate) struct SourceTopic {
    pub topic: String,
    /// Whether partition *p* goes to task *p* (not re-keyed first).
    pub co_partitioned: bool,
    /// For a stage link: the writing stage's partition count.
    pub link_writers: Option<usize>,
}

/// The topic of each input, with how it reaches the stage's tasks.
pub(crate) fn resolve_sources<I>(
    inputs: &[InputSpec<I>],
    application_id: &str,
    link_writers: &HashMap<&'static str, usize>,
) -> anyhow::Result<Vec<SourceTopic>> {
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
                let writers = link_writers.get(link.name).copied().ok_or_else(|| {
                    anyhow::anyhow!("stage link {} is written by no earlier stage", link.name)
                })?;
                Ok(SourceTopic {
                    topic: link.topic(application_id),
                    co_partitioned: true,
                    link_writers: Some(writers),
                })
            }
        })
        .collect()
}

/// The partition count every co-partitioned input shares; inputs that
/// disagree make the service refuse to start.
pub(crate) fn co_partition_count(
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

/// The topics a stage writes and owns, named and sized.
pub(crate) struct StageTopics {
    pub output: String,
    /// When the output is a stage link: its partition count.
    pub link_partitions: Option<usize>,
    pub dead_letters: String,
    pub late: Option<String>,
    /// Repartition topics, each with the stage's partition count.
    pub repartitions: Vec<String>,
    pub store_names: Vec<String>,
    pub changelogs: Vec<String>,
}

/// Names every topic stage `application_id` writes.
pub(crate) fn stage_topics<I, P: Processor>(
    topology: &Topology<I>,
    service_application_id: &str,
    application_id: &str,
    partitions: usize,
    late_topic: Option<String>,
) -> anyhow::Result<StageTopics> {
    let (output, link_partitions) = match &topology.sink {
        Sink::Topic(topic) => (topic.clone(), None),
        Sink::Link(link) => (
            link.topic(service_application_id),
            Some(if link.single_partition { 1 } else { partitions }),
        ),
    };
    let store_names = all_stores::<P>()?;
    let changelogs = store_names
        .iter()
        .map(|store| format!("{application_id}-{store}-changelog"))
        .collect();
    let repartitions = topology
        .inputs
        .iter()
        .filter_map(|input| input.repartition.as_ref())
        .map(|repartition| format!("{application_id}-{}-repartition", repartition.name))
        .collect();
    Ok(StageTopics {
        output,
        link_partitions,
        dead_letters: format!("{service_application_id}-dlq"),
        late: late_topic,
        repartitions,
        store_names,
        changelogs,
    })
}

/// What a stage reads and writes: its sources with their partition
/// counts, its task count and every topic it writes. Laid out by
/// [`StageLayout::of`] for Kafka and the test driver alike.
pub(crate) struct StageLayout {
    pub sources: Vec<SourceTopic>,
    /// Partitions of each source topic, by name.
    pub counts: HashMap<String, usize>,
    /// Tasks of the stage: the partition count its sources share.
    pub partitions: usize,
    pub topics: StageTopics,
}

impl StageLayout {
    /// The layout of the stage of `topology` in `role`, its sources'
    /// partition counts given by `counts` (the broker's, or the driver's
    /// own topics). `link_writers` has the partition count of each stage
    /// link written by an earlier stage.
    pub fn of<P: Processor>(
        topology: &Topology<P::Input>,
        role: &StageRole,
        service_application_id: &str,
        link_writers: &HashMap<&'static str, usize>,
        counts: impl FnOnce(&[SourceTopic]) -> anyhow::Result<HashMap<String, usize>>,
    ) -> anyhow::Result<Self> {
        let sources = resolve_sources(&topology.inputs, service_application_id, link_writers)?;
        let counts = counts(&sources)?;
        let partitions = co_partition_count(&sources, &counts)?;
        let topics = stage_topics::<_, P>(
            topology,
            service_application_id,
            &role.application_id,
            partitions,
            role.late_topic.clone(),
        )?;
        Ok(StageLayout {
            sources,
            counts,
            partitions,
            topics,
        })
    }
}

/// What a stage is called and how its clock treats quiet inputs.
pub(crate) struct StageRole {
    /// The stage's group, state directory and internal-topic prefix: the
    /// service's application id, or `<app-id>-<name>` for a later stage.
    pub application_id: String,
    pub late_topic: Option<String>,
    pub idleness: Idleness,
}

impl StageRole {
    /// The role of stage `name` (`None` for the first) of the service whose
    /// application id is `service_application_id`.
    ///
    /// Late records and idle inputs concern the service's input topics,
    /// which only the first stage reads. A later stage's clock follows the
    /// watermarks announced on its links (which already move with idleness
    /// upstream), except that an upstream task never heard from (its input
    /// partition received nothing) stops holding it back.
    pub fn of(service_application_id: &str, name: Option<&str>, args: &RuntimeArgs) -> Self {
        let first_stage = name.is_none();
        StageRole {
            application_id: match name {
                None => service_application_id.to_string(),
                Some(name) => format!("{service_application_id}-{name}"),
            },
            late_topic: args.late_topic.clone().filter(|_| first_stage),
            idleness: match args.idle_timeout.map(|d| d.as_std()) {
                None => Idleness::Off,
                Some(timeout) if first_stage => Idleness::Inputs(timeout),
                Some(timeout) => Idleness::Upstreams(timeout),
            },
        }
    }
}

/// How a stage commits, merges, tells idle inputs and runs jobs.
pub(crate) struct StageSettings {
    pub commit_interval: std::time::Duration,
    pub max_task_idle: std::time::Duration,
    pub idleness: Idleness,
    pub job_workers: usize,
}

/// Everything an engine of a stage is built from, once its topics exist.
/// Both the Kafka stage and the test driver build engines through it, so
/// that routes, internal topic names and store lists cannot drift apart.
pub(crate) struct StageWiring<'a, P: Processor> {
    pub topology: &'a Topology<P::Input>,
    pub processor: P,
    pub sources: &'a [SourceTopic],
    /// The partition count of every source topic.
    pub counts: &'a HashMap<String, usize>,
    pub topics: &'a StageTopics,
    /// The stage's task count.
    pub partitions: usize,
    pub output_schema_id: u32,
    pub settings: StageSettings,
    pub registry: Registry,
    pub clock: Clock,
    pub shutdown: Arc<AtomicBool>,
}

/// Builds an engine of a stage (one per processing thread, each with its
/// own decoders).
pub(crate) fn wire_stage<P: Processor>(wiring: StageWiring<'_, P>) -> anyhow::Result<Engine<P>> {
    let StageWiring {
        topology,
        processor,
        sources,
        counts,
        topics,
        partitions,
        output_schema_id,
        settings: stage,
        registry,
        clock,
        shutdown,
    } = wiring;
    let mut collector = Collector::default();
    let output_schema = leak_schema(&topology.output_schema)?;
    let output = OutputEncoder::new(
        collector.topic(&topics.output),
        AvroEncoder::new(output_schema, output_schema_id)?,
    );
    let dead_letters = collector.topic(&topics.dead_letters);
    let side = SideTopics {
        late: topics.late.as_deref().map(|late| collector.topic(late)),
        changelogs: topics
            .changelogs
            .iter()
            .map(|topic| collector.topic(topic))
            .collect(),
    };
    let mut subscriptions = Vec::new();
    let mut inputs = Vec::with_capacity(topology.inputs.len());
    let mut repartition_topics = topics.repartitions.iter();
    for (slot, (input, source)) in topology.inputs.iter().zip(sources).enumerate() {
        let (kind, rekeying) = match &input.repartition {
            None => {
                let (route, kind) = match source.link_writers {
                    None => (Route::Task { slot }, InputKind::Direct),
                    Some(writers) => (Route::Shuffled { slot }, InputKind::Shuffled { writers }),
                };
                subscriptions.push(Subscription {
                    topic: source.topic.clone(),
                    route,
                });
                (kind, None)
            }
            Some(repartition) => {
                let topic = repartition_topics
                    .next()
                    .expect("a topic name per repartitioning")
                    .clone();
                subscriptions.push(Subscription {
                    topic: source.topic.clone(),
                    route: Route::Rekey { slot },
                });
                subscriptions.push(Subscription {
                    topic: topic.clone(),
                    route: Route::Shuffled { slot },
                });
                let rekeying = Rekeying {
                    topic: collector.topic(&topic),
                    rekey: (repartition.rekey)(),
                    downstream_partitions: partitions,
                };
                let writers = counts[&source.topic];
                (InputKind::Shuffled { writers }, Some(rekeying))
            }
        };
        inputs.push(InputRuntime {
            decode: (input.decode)(),
            kind,
            rekeying,
        });
    }
    let settings = EngineSettings {
        commit_interval: stage.commit_interval,
        event_time: EventTimeSettings {
            max_out_of_orderness: topology.max_out_of_orderness,
            idleness: stage.idleness,
        },
        max_task_idle: stage.max_task_idle,
        store_names: topics.store_names.clone(),
        link_partitions: topics.link_partitions,
        job_workers: stage.job_workers,
    };
    let intake = IntakeParts {
        inputs,
        subscriptions,
        registry,
        dead_letters,
        keeps_raw: side.late.is_some(),
        max_out_of_orderness: settings.event_time.max_out_of_orderness,
        shutdown: shutdown.clone(),
    };
    Ok(Engine::new(EngineParts {
        settings,
        processor,
        intake,
        collector,
        output,
        side,
        clock,
        shutdown,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(topic: &str, co_partitioned: bool) -> SourceTopic {
        SourceTopic {
            topic: topic.to_string(),
            co_partitioned,
            link_writers: None,
        }
    }

    fn counts(pairs: &[(&str, usize)]) -> HashMap<String, usize> {
        pairs.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    #[test]
    fn co_partitioned_inputs_give_their_shared_count() {
        let sources = [source("orders", true), source("shipments", false)];
        let partitions =
            co_partition_count(&sources, &counts(&[("orders", 3), ("shipments", 8)])).unwrap();
        assert_eq!(partitions, 3, "a re-keyed input does not count");
    }

    #[test]
    fn co_partitioned_inputs_that_disagree_are_refused_with_their_counts() {
        let sources = [source("temperature", true), source("humidity", true)];
        let error = co_partition_count(&sources, &counts(&[("temperature", 2), ("humidity", 3)]))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("temperature has 2") && error.contains("humidity has 3"),
            "{error}"
        );
    }

    #[test]
    fn only_re_keyed_inputs_take_the_largest_count() {
        let sources = [source("a", false), source("b", false)];
        assert_eq!(
            co_partition_count(&sources, &counts(&[("a", 2), ("b", 5)])).unwrap(),
            5
        );
    }

    #[test]
    #[cfg(feature = "test-utils")]
    fn a_later_stage_has_its_own_id_and_no_late_topic() {
        let args = crate::testing::runtime_args(&["--late-topic", "late", "--idle-timeout", "5s"])
            .unwrap();
        let first = StageRole::of("app", None, &args);
        assert_eq!(first.application_id, "app");
        assert_eq!(first.late_topic.as_deref(), Some("late"));
        assert!(matches!(first.idleness, Idleness::Inputs(_)));
        let later = StageRole::of("app", Some("final"), &args);
        assert_eq!(later.application_id, "app-final");
        assert_eq!(later.late_topic, None);
        assert!(matches!(later.idleness, Idleness::Upstreams(_)));
    }
}
