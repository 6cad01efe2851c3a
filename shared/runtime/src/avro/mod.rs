//! Avro values in the Confluent wire format, through a schema registry.
//!
//! Wire format: magic byte `0`, a 4-byte big-endian schema id, then the Avro
//! binary datum. Writer schemas are fetched by id from the registry once and
//! cached for the life of the process (a registry round trip per record is the
//! classic mistake). Each decoder keeps one prepared reader per writer schema id:
//!
//! * when the writer schema *is* the reader schema, records deserialize straight
//!   into the target struct with no intermediate `Value` tree;
//! * otherwise the datum is read with Avro schema resolution into the service's
//!   reader schema (schema evolution), then converted.
//!
//! Registry HTTP goes through `schema_registry_converter`'s async client; the
//! processing thread is not a tokio worker, so it blocks on the runtime handle
//! only on a cache miss. Which schema id a stage writes under — its own
//! schema registered, or the subject's latest version — is `subjects`'.

mod direct;
pub mod json;
mod remote;
mod subjects;

pub use subjects::{canonical_difference, canonical_form, writer_schema_id, SchemaSource};

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::Schema;

use schema_registry_converter::async_impl::schema_registry::{
    get_schema_by_id, get_schema_by_subject_and_version, post_schema,
};
use schema_registry_converter::schema_registry_common::{SchemaType, SuppliedSchema};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::client::RegistrySettings;

/// Length of the wire-format header: magic byte and schema id.
pub const WIRE_HEADER_LEN: usize = 5;

/// Why a record could not be decoded. Its [`kind`](DecodeError::kind) is the
/// stable label used in dead-letter headers and metrics.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DecodeError {
    #[error("value is not in the Confluent wire format: {0}")]
    NotWireFormat(String),
    #[error("schema id {0} is unknown to the schema registry")]
    UnknownSchemaId(u32),
    #[error("schema id {id} cannot be read into the reader schema: {message}")]
    IncompatibleSchema { id: u32, message: String },
    #[error("Avro decoding failed: {0}")]
    Avro(String),
}

impl DecodeError {
    /// A short, bounded label for headers and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            DecodeError::NotWireFormat(_) => "not_wire_format",
            DecodeError::UnknownSchemaId(_) => "unknown_schema_id",
            DecodeError::IncompatibleSchema { .. } => "incompatible_schema",
            DecodeError::Avro(_) => "avro",
        }
    }
}

/// Splits a wire-format value into its schema id and Avro datum.
pub fn split_wire_format(bytes: &[u8]) -> Result<(u32, &[u8]), DecodeError> {
    match bytes {
        [] => Err(DecodeError::NotWireFormat("empty or null value".into())),
        [0, a, b, c, d, datum @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), datum)),
        [0, ..] => Err(DecodeError::NotWireFormat(format!(
            "only {} bytes, shorter than the 5-byte header",
            bytes.len()
        ))),
        [magic, ..] => Err(DecodeError::NotWireFormat(format!(
            "magic byte is {magic}, expected 0"
        ))),
    }
}

/// Parses an Avro schema (`.avsc` JSON) and keeps it for the life of the process.
///
/// Prepared readers and writers borrow their schemas; schemas are few (one per
/// topic and writer version), so leaking them is cheaper and simpler than
/// self-referential caches.
pub fn leak_schema(json: &str) -> anyhow::Result<&'static Schema> {
    let schema =
        Schema::parse_str(json).map_err(|e| anyhow::anyhow!("invalid Avro schema: {e}"))?;
    Ok(Box::leak(Box::new(schema)))
}

/// A schema registry client with a process-wide cache of writer schemas.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<RegistryInner>,
}

struct RegistryInner {
    url: String,
    /// The HTTP client; `None` for an in-memory registry.
    remote: Option<remote::Remote>,
    schemas_by_id: Mutex<HashMap<u32, &'static Schema>>,
    /// In-memory registry only: the id of every schema text registered, each
    /// also under its canonical form, so that registering a text again
    /// neither parses nor leaks anything.
    ids_by_text: Mutex<HashMap<String, u32>>,
    /// In-memory registry only: the schema id and text of each version of
    /// each subject, oldest first.
    versions_by_subject: Mutex<HashMap<String, Vec<(u32, String)>>>,
    /// Schema texts parsed (see [`Registry::schemas_parsed`]).
    schemas_parsed: AtomicUsize,
    /// See [`Registry::requests`].
    requests: AtomicUsize,
}

/// A registry call that failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The registry answered that there is no such schema.
    #[error("not found in the schema registry: {0}")]
    NotFound(String),
    /// The registry rejected the request (e.g. an incompatible schema change).
    #[error("{0}")]
    Rejected(String),
    /// The registry refused the credentials (401) or the request (403).
    /// Fatal at start-up; while processing, retried like
    /// [`Unavailable`](Self::Unavailable): credentials can be fixed (a token
    /// file rotated) and the records are not at fault.
    #[error("{message}")]
    Refused { status: u16, message: String },
    /// The registry could not be reached or failed; worth retrying.
    #[error("schema registry at {url} is unavailable: {message}")]
    Unavailable { url: String, message: String },
}

/// The latest version of a subject.
#[derive(Debug, Clone)]
pub struct LatestSchema {
    pub id: u32,
    /// The version number, when the registry says it.
    pub version: Option<u32>,
    /// `AVRO`, `JSON` or `PROTOBUF`.
    pub schema_type: String,
    /// The schema's text as registered.
    pub schema: String,
}

impl Registry {
    /// A client for the registry `settings` describe. Blocking calls run
    /// on `runtime`.
    pub fn new(
        settings: &RegistrySettings,
        runtime: tokio::runtime::Handle,
    ) -> anyhow::Result<Registry> {
        Ok(Registry {
            inner: Arc::new(RegistryInner {
                url: settings.url.clone(),
                remote: Some(remote::Remote::new(settings, runtime)?),
                schemas_by_id: Mutex::new(HashMap::new()),
                ids_by_text: Mutex::new(HashMap::new()),
                versions_by_subject: Mutex::new(HashMap::new()),
                schemas_parsed: AtomicUsize::new(0),
                requests: AtomicUsize::new(0),
            }),
        })
    }

    /// A registry that lives in this process only (for the test driver):
    /// [`register`](Self::register) numbers schemas from 1, and an id it did
    /// not hand out is not found.
    pub fn in_memory() -> Registry {
        Registry {
            inner: Arc::new(RegistryInner {
                url: "memory:".to_string(),
                remote: None,
                schemas_by_id: Mutex::new(HashMap::new()),
                ids_by_text: Mutex::new(HashMap::new()),
                versions_by_subject: Mutex::new(HashMap::new()),
                schemas_parsed: AtomicUsize::new(0),
                requests: AtomicUsize::new(0),
            }),
        }
    }

    /// The registry URL.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// How many schema texts this registry has parsed: one per writer schema
    /// fetched, or per distinct text registered in memory, however many
    /// records use it. Parsing is slow and a parsed schema is kept for the
    /// life of the process, so this must not grow with the records.
    pub fn schemas_parsed(&self) -> usize {
        self.inner.schemas_parsed.load(Ordering::Relaxed)
    }

    /// How many registrations, and lookups by id not answered from the
    /// cache, this registry has served: each is a round trip to a remote
    /// registry, so this must not grow with the records either.
    pub fn requests(&self) -> usize {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// The writer schema registered under `id`, from the cache when possible.
    ///
    /// Blocks the calling thread on a cache miss; must not be called from
    /// inside the tokio runtime.
    pub fn schema_by_id(&self, id: u32) -> Result<&'static Schema, RegistryError> {
        if let Some(schema) = self.inner.schemas_by_id.lock().unwrap().get(&id) {
            return Ok(schema);
        }
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
        let Some(remote) = &self.inner.remote else {
            return Err(RegistryError::NotFound(format!("schema id {id}")));
        };
        let registered =
            remote.call(|settings| async move { get_schema_by_id(id, &settings).await })?;
        self.inner.schemas_parsed.fetch_add(1, Ordering::Relaxed);
        let schema = leak_schema(&registered.schema)
            .map_err(|e| RegistryError::Rejected(format!("schema id {id}: {e}")))?;
        self.inner.schemas_by_id.lock().unwrap().insert(id, schema);
        Ok(schema)
    }

    /// Registers `schema_json` under `subject` (or finds it already there) and
    /// returns its id. An incompatible change is [`RegistryError::Rejected`].
    pub fn register(&self, subject: &str, schema_json: &str) -> Result<u32, RegistryError> {
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
        let Some(remote) = &self.inner.remote else {
            return self.register_in_memory(subject, schema_json);
        };
        let registered = remote.call(|settings| async move {
            let supplied = SuppliedSchema::new(None, SchemaType::Avro, schema_json.to_string());
            post_schema(&settings, subject.to_string(), supplied).await
        })?;
        Ok(registered.id)
    }

    /// The latest version of `subject` (`GET /subjects/<subject>/versions/latest`);
    /// [`RegistryError::NotFound`] when the subject has none.
    pub fn latest(&self, subject: &str) -> Result<LatestSchema, RegistryError> {
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
        let Some(remote) = &self.inner.remote else {
            return self.latest_in_memory(subject);
        };
        let latest = remote.call(|settings| async move {
            get_schema_by_subject_and_version(&settings, subject, None).await
        })?;
        let schema_type = match latest.schema_type {
            // Confluent's registry leaves Avro's type out.
            SchemaType::Avro => "AVRO".to_string(),
            SchemaType::Other(other) if other.is_empty() => "AVRO".to_string(),
            SchemaType::Json => "JSON".to_string(),
            SchemaType::Protobuf => "PROTOBUF".to_string(),
            SchemaType::Other(other) => other,
            other => format!("{other:?}"),
        };
        Ok(LatestSchema {
            id: latest.id,
            version: latest.version,
            schema_type,
            schema: latest.schema,
        })
    }

    fn latest_in_memory(&self, subject: &str) -> Result<LatestSchema, RegistryError> {
        let versions = self.inner.versions_by_subject.lock().unwrap();
        let ids = versions
            .get(subject)
            .filter(|ids| !ids.is_empty())
            .ok_or_else(|| RegistryError::NotFound(format!("subject {subject}")))?;
        let (id, schema) = ids.last().unwrap().clone();
        Ok(LatestSchema {
            id,
            version: Some(ids.len() as u32),
            schema_type: "AVRO".to_string(),
            schema,
        })
    }

    /// In-memory registration: the same schema (the same text, or the same
    /// canonical form) always gets the same id. A text registered before is
    /// answered from its id alone; a new one is parsed, and kept only if its
    /// canonical form is new too.
    fn register_in_memory(&self, subject: &str, schema_json: &str) -> Result<u32, RegistryError> {
        let id = self.id_in_memory(schema_json)?;
        let mut versions = self.inner.versions_by_subject.lock().unwrap();
        let ids = versions.entry(subject.to_string()).or_default();
        // Like a remote registry: the schema of an existing version gets no new one.
        if !ids.iter().any(|(known, _)| *known == id) {
            ids.push((id, schema_json.to_string()));
        }
        Ok(id)
    }

    /// The in-memory id of a schema text, given out on first sight.
    fn id_in_memory(&self, schema_json: &str) -> Result<u32, RegistryError> {
        let mut ids_by_text = self.inner.ids_by_text.lock().unwrap();
        if let Some(id) = ids_by_text.get(schema_json) {
            return Ok(*id);
        }
        self.inner.schemas_parsed.fetch_add(1, Ordering::Relaxed);
        let schema = Schema::parse_str(schema_json)
            .map_err(|e| RegistryError::Rejected(format!("invalid Avro schema: {e}")))?;
        let canonical = schema.canonical_form();
        let id = match ids_by_text.get(&canonical) {
            Some(id) => *id,
            None => {
                let mut schemas = self.inner.schemas_by_id.lock().unwrap();
                let id = schemas.len() as u32 + 1;
                schemas.insert(id, Box::leak(Box::new(schema)));
                ids_by_text.insert(canonical, id);
                id
            }
        };
        ids_by_text.insert(schema_json.to_string(), id);
        Ok(id)
    }

    /// Fetches a writer schema, retrying while the registry is unavailable.
    /// Only a definite answer (found, or not found) ends the wait.
    pub fn schema_by_id_retrying(
        &self,
        id: u32,
        shutdown: &dyn Fn() -> bool,
    ) -> Result<&'static Schema, DecodeError> {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.schema_by_id(id) {
                Ok(schema) => return Ok(schema),
                Err(RegistryError::NotFound(_)) => return Err(DecodeError::UnknownSchemaId(id)),
                Err(RegistryError::Rejected(message)) => {
                    return Err(DecodeError::IncompatibleSchema { id, message })
                }
                Err(
                    unavailable @ (RegistryError::Unavailable { .. }
                    | RegistryError::Refused { .. }),
                ) => {
                    if shutdown() {
                        return Err(DecodeError::Avro(unavailable.to_string()));
                    }
                    tracing::warn!(error = %unavailable, schema_id = id, "retrying schema lookup");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

/// How records written with one writer schema are read.
enum ReadPlan {
    /// Writer schema equals the reader schema: deserialize directly.
    Direct(GenericDatumReader<'static>),
    /// Resolve the writer's datum into the reader schema first.
    Resolving(GenericDatumReader<'static>),
}

/// Decodes wire-format values into `T`, resolving any writer schema into
/// `reader_schema`.
pub struct AvroDecoder<T> {
    reader_schema: &'static Schema,
    reader_canonical: String,
    plans: HashMap<u32, ReadPlan>,
    _target: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> AvroDecoder<T> {
    /// A decoder into `reader_schema`.
    pub fn new(reader_schema: &'static Schema) -> Self {
        AvroDecoder {
            reader_schema,
            reader_canonical: reader_schema.canonical_form(),
            plans: HashMap::new(),
            _target: PhantomData,
        }
    }

    /// Decodes one wire-format value. Never panics on bad input.
    pub fn decode(
        &mut self,
        registry: &Registry,
        bytes: &[u8],
        shutdown: &dyn Fn() -> bool,
    ) -> Result<T, DecodeError> {
        let (id, mut datum) = split_wire_format(bytes)?;
        if !self.plans.contains_key(&id) {
            let plan = self.plan_for(registry, id, shutdown)?;
            self.plans.insert(id, plan);
        }
        let result = match &self.plans[&id] {
            ReadPlan::Direct(reader) => reader
                .read_deser::<T>(&mut datum)
                .map_err(|e| DecodeError::Avro(e.to_string())),
            ReadPlan::Resolving(reader) => reader
                .read_value(&mut datum)
                .and_then(|value| apache_avro::from_value::<T>(&value))
                .map_err(|e| DecodeError::Avro(e.to_string())),
        }?;
        if !datum.is_empty() {
            return Err(DecodeError::Avro(format!(
                "{} trailing bytes after the Avro datum",
                datum.len()
            )));
        }
        Ok(result)
    }

    fn plan_for(
        &self,
        registry: &Registry,
        id: u32,
        shutdown: &dyn Fn() -> bool,
    ) -> Result<ReadPlan, DecodeError> {
        let writer = registry.schema_by_id_retrying(id, shutdown)?;
        let incompatible = |e: apache_avro::Error| DecodeError::IncompatibleSchema {
            id,
            message: e.to_string(),
        };
        if writer.canonical_form() == self.reader_canonical {
            let reader = GenericDatumReader::builder(writer)
                .human_readable(false)
                .build()
                .map_err(incompatible)?;
            Ok(ReadPlan::Direct(reader))
        } else {
            let reader = GenericDatumReader::builder(writer)
                .reader_schema(self.reader_schema)
                .human_readable(false)
                .build()
                .map_err(incompatible)?;
            Ok(ReadPlan::Resolving(reader))
        }
    }
}

/// Encodes values of one output schema into the wire format.
pub struct AvroEncoder {
    schema_id: u32,
    writer: GenericDatumWriter<'static>,
    /// The schema as the direct writer walks it, if it can.
    plan: Option<direct::Plan>,
}

impl AvroEncoder {
    /// An encoder for `schema`, registered in the registry as `schema_id`.
    pub fn new(schema: &'static Schema, schema_id: u32) -> anyhow::Result<Self> {
        let writer = GenericDatumWriter::builder(schema)
            .human_readable(false)
            .build()
            .map_err(|e| anyhow::anyhow!("Avro writer: {e}"))?;
        Ok(AvroEncoder {
            schema_id,
            writer,
            plan: direct::Plan::compile(schema),
        })
    }

    /// Appends the wire-format encoding of `value` to the end of `out`:
    /// written by position where the value's fields follow the schema's
    /// order, else by apache-avro's writer, which looks fields up by name.
    pub fn append_to<T: Serialize>(&self, value: &T, out: &mut Vec<u8>) -> anyhow::Result<()> {
        out.push(0);
        out.extend_from_slice(&self.schema_id.to_be_bytes());
        if let Some(plan) = &self.plan {
            let datum_start = out.len();
            if direct::write(plan, value, out).is_ok() {
                return Ok(());
            }
            out.truncate(datum_start);
        }
        self.writer
            .write_ser(out, value)
            .map_err(|e| anyhow::anyhow!("Avro encoding failed: {e}"))?;
        Ok(())
    }

    /// Encodes a generic Avro value (used by tools that work from JSON).
    pub fn encode_value(
        &self,
        value: apache_avro::types::Value,
        out: &mut Vec<u8>,
    ) -> anyhow::Result<()> {
        out.clear();
        out.push(0);
        out.extend_from_slice(&self.schema_id.to_be_bytes());
        self.writer
            .write_value(out, value)
            .map_err(|e| anyhow::anyhow!("value does not match the schema: {e}"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registering_a_schema_again_in_memory_neither_parses_nor_adds_it() {
        let registry = Registry::in_memory();
        let schema = r#"{"type": "record", "name": "Click", "fields": [
            {"name": "user", "type": "string"}, {"name": "at", "type": "long"}]}"#;
        let first = registry.register("clicks-value", schema).unwrap();
        for _ in 0..100 {
            assert_eq!(registry.register("clicks-value", schema).unwrap(), first);
        }
        assert_eq!(registry.schemas_parsed(), 1);
        let canonical = registry.schema_by_id(first).unwrap().canonical_form();
        assert_eq!(
            registry.register("clicks-value", &canonical).unwrap(),
            first
        );
        assert_eq!(registry.schemas_parsed(), 1, "the canonical form is known");
        let reformatted = schema.replace(", ", ",\n ");
        assert_eq!(
            registry.register("clicks-value", &reformatted).unwrap(),
            first
        );
        assert_eq!(registry.schemas_parsed(), 2, "a new text is parsed once");
        let other = r#"{"type": "record", "name": "Count", "fields": [
            {"name": "user", "type": "string"}]}"#;
        let second = registry.register("counts-value", other).unwrap();
        assert_eq!(second, first + 1);
        assert_eq!(
            registry.schema_by_id(second).unwrap().canonical_form(),
            Schema::parse_str(other).unwrap().canonical_form()
        );
        assert!(matches!(
            registry.schema_by_id(second + 1),
            Err(RegistryError::NotFound(_))
        ));
    }

    #[test]
    fn splits_the_wire_header() {
        let (id, datum) = split_wire_format(&[0, 0, 0, 1, 2, 42, 43]).unwrap();
        assert_eq!(id, 258);
        assert_eq!(datum, &[42, 43]);
    }

    #[test]
    fn rejects_values_that_are_not_wire_format() {
        assert_eq!(
            split_wire_format(&[]).unwrap_err().kind(),
            "not_wire_format"
        );
        assert_eq!(
            split_wire_format(&[1, 0, 0, 0, 1]).unwrap_err().kind(),
            "not_wire_format"
        );
        assert_eq!(
            split_wire_format(&[0, 0, 1]).unwrap_err().kind(),
            "not_wire_format"
        );
    }
}
