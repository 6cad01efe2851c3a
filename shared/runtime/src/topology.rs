//! What a service reads, writes and keeps: its topology.
//!
//! A topology names the input topics (each with its Avro reader schema and
//! event-time field), the output topic and schema, and the state stores. An
//! input can be re-keyed through an internal repartition topic before it
//! reaches the processor, as Kafka Streams does for joins on another key.

use serde::de::DeserializeOwned;

use crate::avro::{leak_schema, AvroDecoder, DecodeError, Registry};
use crate::duration::HumanDuration;

/// Decodes a wire-format value into the processor's input, with its event time.
pub(crate) type DecodeFn<I> =
    Box<dyn FnMut(&Registry, &[u8], &dyn Fn() -> bool) -> Result<(I, i64), DecodeError> + Send>;

/// One input topic.
pub struct InputStream<I> {
    pub(crate) topic: String,
    pub(crate) decode: DecodeFn<I>,
    pub(crate) repartition: Option<Repartition<I>>,
}

/// Re-keying of an input through `<app-id>-<name>-repartition`.
pub(crate) struct Repartition<I> {
    pub(crate) name: &'static str,
    pub(crate) key_of: fn(&I) -> String,
}

impl<I: 'static> InputStream<I> {
    /// Reads `topic` into `T` (reader schema `schema_json`), wrapped into the
    /// processor's input type by `wrap`, with event time from `event_time`.
    pub fn new<T: DeserializeOwned + 'static>(
        topic: impl Into<String>,
        schema_json: &str,
        event_time: fn(&T) -> i64,
        wrap: fn(T) -> I,
    ) -> anyhow::Result<Self> {
        let topic = topic.into();
        let schema = leak_schema(schema_json)
            .map_err(|e| anyhow::anyhow!("reader schema of topic {topic}: {e}"))?;
        let mut decoder = AvroDecoder::<T>::new(schema);
        Ok(InputStream {
            topic,
            decode: Box::new(move |registry, bytes, shutdown| {
                let value = decoder.decode(registry, bytes, shutdown)?;
                let time = event_time(&value);
                Ok((wrap(value), time))
            }),
            repartition: None,
        })
    }

    /// Re-keys this input by `key_of` through the internal topic
    /// `<app-id>-<name>-repartition`, co-partitioned with the other inputs.
    pub fn repartition_by(mut self, name: &'static str, key_of: fn(&I) -> String) -> Self {
        self.repartition = Some(Repartition { name, key_of });
        self
    }
}

/// The whole description of a service's data flow.
pub struct Topology<I> {
    pub(crate) service: &'static str,
    pub(crate) inputs: Vec<InputStream<I>>,
    pub(crate) output_topic: String,
    pub(crate) output_schema: String,
    pub(crate) stores: Vec<&'static str>,
    pub(crate) max_out_of_orderness: i64,
}

/// Store names the runtime uses for itself.
pub(crate) const TIMER_STORE: &str = "timers";
pub(crate) const WATERMARK_STORE: &str = "watermarks";

impl<I> Topology<I> {
    /// A topology for `service` (the default application id) writing
    /// `output_topic` with `output_schema` (Avro JSON).
    pub fn new(
        service: &'static str,
        output_topic: impl Into<String>,
        output_schema: &str,
    ) -> Self {
        Topology {
            service,
            inputs: Vec::new(),
            output_topic: output_topic.into(),
            output_schema: output_schema.to_string(),
            stores: Vec::new(),
            max_out_of_orderness: 0,
        }
    }

    /// Adds an input.
    pub fn input(mut self, input: InputStream<I>) -> Self {
        self.inputs.push(input);
        self
    }

    /// Declares a state store by its permanent name.
    pub fn store(mut self, name: &'static str) -> Self {
        assert!(
            name != TIMER_STORE && name != WATERMARK_STORE,
            "store name '{name}' is reserved by the runtime"
        );
        self.stores.push(name);
        self
    }

    /// Sets how far behind the largest event time a partition's watermark stays.
    pub fn max_out_of_orderness(mut self, bound: HumanDuration) -> Self {
        self.max_out_of_orderness = bound.as_millis_i64();
        self
    }

    /// All store names, the runtime's own included.
    pub(crate) fn all_stores(&self) -> Vec<String> {
        self.stores
            .iter()
            .copied()
            .chain([TIMER_STORE, WATERMARK_STORE])
            .map(str::to_string)
            .collect()
    }
}
