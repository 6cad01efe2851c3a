//! What a service reads, writes and keeps: its topology.
//!
//! A topology names the input topics (each with its Avro reader schema and
//! event-time field), the output topic and schema, and the state stores. An
//! input can be re-keyed through an internal repartition topic before it
//! reaches the processor, as Kafka Streams does for joins on another key.
//!
//! A service of several stages (see [`crate::Pipeline`]) connects them with a
//! [`StageLink`]: one stage's topology writes it instead of an output topic,
//! the next reads it as an input. Like a repartition topic, a link carries the
//! writing tasks' watermarks, so the reading stage's clocks follow the
//! slowest writer.

use serde::de::DeserializeOwned;

use apache_avro::Schema;

use crate::avro::{leak_schema, AvroDecoder, DecodeError, Registry};
use crate::duration::HumanDuration;
use crate::processor::Processor;

/// Decodes a wire-format value into the processor's input, with its event time.
pub(crate) type DecodeFn<I> =
    Box<dyn FnMut(&Registry, &[u8], &dyn Fn() -> bool) -> Result<(I, i64), DecodeError> + Send>;

/// Decodes a wire-format value into its repartition key and event time.
pub(crate) type RekeyFn = Box<
    dyn FnMut(&Registry, &[u8], &dyn Fn() -> bool) -> Result<(String, i64), DecodeError> + Send,
>;

/// Makes a fresh decoder for each engine that reads an input: every
/// processing thread of a stage gets its own (a decoder is stateful and
/// used without a lock).
pub(crate) type DecodeFactory<I> = Box<dyn Fn() -> DecodeFn<I> + Send>;

/// Makes a fresh re-keying decoder for each engine, like [`DecodeFactory`].
pub(crate) type RekeyFactory = Box<dyn Fn() -> RekeyFn + Send>;

/// The internal topic `<app-id>-<name>-repartition` between two stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageLink {
    pub(crate) name: &'static str,
    pub(crate) single_partition: bool,
}

impl StageLink {
    /// A link with the writing stage's partition count: records are
    /// partitioned by murmur2 of their key (which must not be null), so every
    /// key meets its peers in one task of the reading stage.
    pub const fn co_partitioned(name: &'static str) -> Self {
        StageLink {
            name,
            single_partition: false,
        }
    }

    /// A link of one partition: every record meets in the reading stage's one
    /// task, for global aggregates.
    pub const fn single_partition(name: &'static str) -> Self {
        StageLink {
            name,
            single_partition: true,
        }
    }

    /// The internal topic of this link for `application_id`.
    pub(crate) fn topic(&self, application_id: &str) -> String {
        format!("{application_id}-{}-repartition", self.name)
    }
}

/// Where an input's records come from.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// A topic the service is given.
    Topic(String),
    /// The link written by an earlier stage.
    Link(StageLink),
}

/// Where a stage's results go.
#[derive(Debug, Clone)]
pub(crate) enum Sink {
    /// The service's output topic.
    Topic(String),
    /// The link read by the next stage.
    Link(StageLink),
}

/// One input topic, whose values decode into `T` and reach the processor
/// as `I` (usually one variant of the processor's input enum).
pub struct InputStream<I, T> {
    source: Source,
    schema: &'static Schema,
    event_time: fn(&T) -> i64,
    wrap: fn(T) -> I,
    repartition: Option<RepartitionBy<T>>,
}

/// A repartitioning's name and key function, before type erasure.
type RepartitionBy<T> = (&'static str, fn(&T) -> String);

impl<I: 'static, T: DeserializeOwned + 'static> InputStream<I, T> {
    /// Reads `topic` into `T` (reader schema `schema_json`), wrapped into the
    /// processor's input type by `wrap`, with event time from `event_time`.
    pub fn new(
        topic: impl Into<String>,
        schema_json: &str,
        event_time: fn(&T) -> i64,
        wrap: fn(T) -> I,
    ) -> anyhow::Result<Self> {
        Self::from_source(Source::Topic(topic.into()), schema_json, event_time, wrap)
    }

    /// Reads the link an earlier stage writes, like [`InputStream::new`].
    /// Its watermark is the minimum of what every writing task announced.
    pub fn from_stage(
        link: StageLink,
        schema_json: &str,
        event_time: fn(&T) -> i64,
        wrap: fn(T) -> I,
    ) -> anyhow::Result<Self> {
        Self::from_source(Source::Link(link), schema_json, event_time, wrap)
    }

    fn from_source(
        source: Source,
        schema_json: &str,
        event_time: fn(&T) -> i64,
        wrap: fn(T) -> I,
    ) -> anyhow::Result<Self> {
        let schema = leak_schema(schema_json).map_err(|e| {
            let name = match &source {
                Source::Topic(topic) => topic.as_str(),
                Source::Link(link) => link.name,
            };
            anyhow::anyhow!("reader schema of input {name}: {e}")
        })?;
        Ok(InputStream {
            source,
            schema,
            event_time,
            wrap,
            repartition: None,
        })
    }

    /// Re-keys this input by `key_of` through the internal topic
    /// `<app-id>-<name>-repartition`, co-partitioned with the other inputs.
    pub fn repartition_by(mut self, name: &'static str, key_of: fn(&T) -> String) -> Self {
        self.repartition = Some((name, key_of));
        self
    }

    /// The type-erased form the runtime runs.
    fn into_spec(self) -> InputSpec<I> {
        let InputStream {
            source,
            schema,
            event_time,
            wrap,
            repartition,
        } = self;
        let decode: DecodeFactory<I> = Box::new(move || {
            let mut decoder = AvroDecoder::<T>::new(schema);
            Box::new(move |registry, bytes, shutdown| {
                let value = decoder.decode(registry, bytes, shutdown)?;
                let time = event_time(&value);
                Ok((wrap(value), time))
            })
        });
        let repartition = repartition.map(|(name, key_of)| {
            let rekey: RekeyFactory = Box::new(move || {
                let mut decoder = AvroDecoder::<T>::new(schema);
                Box::new(move |registry, bytes, shutdown| {
                    let value = decoder.decode(registry, bytes, shutdown)?;
                    Ok((key_of(&value), event_time(&value)))
                })
            });
            Repartition { name, rekey }
        });
        InputSpec {
            source,
            schema,
            decode,
            repartition,
        }
    }
}

/// An input as the runtime runs it: its decoders, without the value type.
pub(crate) struct InputSpec<I> {
    pub(crate) source: Source,
    /// The reader schema (the test driver writes piped values with it).
    #[cfg_attr(not(feature = "test-utils"), allow(dead_code))]
    pub(crate) schema: &'static Schema,
    pub(crate) decode: DecodeFactory<I>,
    pub(crate) repartition: Option<Repartition>,
}

/// Re-keying of an input through `<app-id>-<name>-repartition`.
pub(crate) struct Repartition {
    pub(crate) name: &'static str,
    pub(crate) rekey: RekeyFactory,
}

/// The whole description of a service's data flow.
pub struct Topology<I> {
    pub(crate) service: &'static str,
    pub(crate) inputs: Vec<InputSpec<I>>,
    pub(crate) sink: Sink,
    pub(crate) output_schema: String,
    pub(crate) max_out_of_orderness: i64,
    pub(crate) job_workers: usize,
}

/// The runtime's store of pending timers.
pub(crate) const TIMER_STORE: &str = "timers";
pub(crate) use crate::state::progress_layout::PROGRESS_STORE;

/// Every store of processor `P`, the runtime's own last (the timer store
/// only if `P` does not derive its timers from state); a declared name that
/// clashes with those is an error.
pub(crate) fn all_stores<P: Processor>() -> anyhow::Result<Vec<String>> {
    for name in P::STORES.iter().map(|store| store.name) {
        anyhow::ensure!(
            name != TIMER_STORE && name != PROGRESS_STORE,
            "store name '{name}' is reserved by the runtime"
        );
    }
    let timers = P::DERIVE_TIMERS.is_none().then_some(TIMER_STORE);
    Ok(P::STORES
        .iter()
        .map(|store| store.name)
        .chain(timers)
        .chain([PROGRESS_STORE])
        .map(str::to_string)
        .collect())
}

impl<I> Topology<I> {
    /// A topology for `service` (the default application id) writing
    /// `output_topic` with `output_schema` (Avro JSON).
    pub fn new(
        service: &'static str,
        output_topic: impl Into<String>,
        output_schema: &str,
    ) -> Self {
        Self::with_sink(service, Sink::Topic(output_topic.into()), output_schema)
    }

    /// A topology for the stage of `service` that writes `link` (schema
    /// `link_schema`, Avro JSON) for the next stage instead of an output topic.
    pub fn feeding(service: &'static str, link: StageLink, link_schema: &str) -> Self {
        Self::with_sink(service, Sink::Link(link), link_schema)
    }

    fn with_sink(service: &'static str, sink: Sink, output_schema: &str) -> Self {
        Topology {
            service,
            inputs: Vec::new(),
            sink,
            output_schema: output_schema.to_string(),
            max_out_of_orderness: 0,
            job_workers: 0,
        }
    }

    /// Adds an input.
    pub fn input<T: DeserializeOwned + 'static>(mut self, input: InputStream<I, T>) -> Self
    where
        I: 'static,
    {
        self.inputs.push(input.into_spec());
        self
    }

    /// Runs the processor's [jobs](crate::Context::submit) on `workers`
    /// threads, so that at most that many run at once (default 0: a job runs
    /// at once on the processing thread).
    pub fn job_workers(mut self, workers: usize) -> Self {
        self.job_workers = workers;
        self
    }

    /// Sets how far behind the largest event time a partition's watermark stays.
    pub fn max_out_of_orderness(mut self, bound: HumanDuration) -> Self {
        self.max_out_of_orderness = bound.as_millis_i64();
        self
    }
}
