//! The schema id a stage writes under: its own output schema registered
//! (`--schema-registry-auto-register true`, the default), or the latest
//! version of the subject, registered beforehand by someone else.
//!
//! The services encode their records straight from their structs with their
//! own schema. A registered schema is therefore usable in its place only if
//! it gives the same bytes: if its Parsing Canonical Form (Avro's
//! specification) equals the service's. That keeps names, field order and
//! types, and drops what does not change the encoding: docs, defaults,
//! aliases, logical types. "Compatible" in the registry's sense (BACKWARD,
//! FULL, ...) is not enough: a schema with one field more, even with a
//! default, reads the service's bytes wrongly as its writer schema.
//!
//! The form is `apache_avro::Schema::canonical_form` with one step of the
//! specification it leaves out: a primitive whose logical type was stripped
//! stays `{"type":"long"}` there, where the specification (and Java's
//! `SchemaNormalization`) reduce it to `"long"`.

use apache_avro::Schema;
use serde_json::Value;

use super::{Registry, RegistryError};

/// Where a stage's writer schema id comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaSource {
    /// Register the schema (a schema already registered keeps its id).
    Register,
    /// The subject's latest version, which must have the schema's canonical
    /// form: an output topic with auto-registration off.
    Latest,
    /// The latest version if it has the schema's canonical form, otherwise
    /// register it: a stage link (an internal topic the service owns) with
    /// auto-registration off. Needs no write permission once registered.
    LatestOrRegister,
}

impl SchemaSource {
    /// The source for a topic written with `--schema-registry-auto-register
    /// auto_register`; `link` for an internal link between stages.
    pub fn of(auto_register: bool, link: bool) -> SchemaSource {
        match (auto_register, link) {
            (true, _) => SchemaSource::Register,
            (false, false) => SchemaSource::Latest,
            (false, true) => SchemaSource::LatestOrRegister,
        }
    }
}

/// The id under which records encoded with `schema_json` are written to
/// the topic of `subject`. The errors say what to do.
pub fn writer_schema_id(
    registry: &Registry,
    subject: &str,
    schema_json: &str,
    source: SchemaSource,
) -> anyhow::Result<u32> {
    let register = || {
        registry.register(subject, schema_json).map_err(|e| {
            let hint = match e {
                RegistryError::Refused { status: 403, .. } => {
                    " (a registry user that may only read schemas needs the schema registered \
                     beforehand and --schema-registry-auto-register false)"
                }
                _ => "",
            };
            anyhow::anyhow!("cannot register the output schema under {subject}: {e}{hint}")
        })
    };
    if source == SchemaSource::Register {
        return register();
    }
    let ours = Schema::parse_str(schema_json)
        .map_err(|e| anyhow::anyhow!("the output schema of {subject} is invalid: {e}"))?;
    let latest = match registry.latest(subject) {
        Ok(latest) => latest,
        Err(RegistryError::NotFound(_)) if source == SchemaSource::LatestOrRegister => {
            return register();
        }
        Err(RegistryError::NotFound(_)) => anyhow::bail!(
            "subject {subject} has no schema in the schema registry at {url}. With \
             --schema-registry-auto-register false the service does not register its output \
             schema: it writes under the id of the subject's latest version. Register the \
             output schema under {subject} first (POST {url}/subjects/{subject}/versions), or \
             run with --schema-registry-auto-register true",
            url = registry.url().trim_end_matches('/')
        ),
        Err(e) => anyhow::bail!("cannot read the latest schema of {subject}: {e}"),
    };
    let version = latest
        .version
        .map_or_else(|| "latest".to_string(), |v| v.to_string());
    let difference = if latest.schema_type != "AVRO" {
        Some(format!("it is a {} schema, not Avro", latest.schema_type))
    } else {
        match Schema::parse_str(&latest.schema) {
            Ok(theirs) => canonical_difference(&ours, &theirs).map(|difference| {
                format!(
                    "{difference}; canonical forms: the service's {}, \
                     the registry's {}",
                    shorten(&canonical_form(&ours), 400),
                    shorten(&canonical_form(&theirs), 400)
                )
            }),
            Err(e) => Some(format!("it cannot be read as an Avro schema alone ({e})")),
        }
    };
    match difference {
        None => Ok(latest.id),
        Some(_) if source == SchemaSource::LatestOrRegister => register(),
        Some(difference) => anyhow::bail!(
            "the latest schema of subject {subject} (version {version}, id {id}) is not the \
             service's output schema: {difference}. With --schema-registry-auto-register false \
             the service writes records encoded with its own schema under the id of the \
             subject's latest version, so the two must have the same Avro Parsing Canonical \
             Form (the same names, field order and types; docs, defaults, aliases and logical \
             types may differ). Register the service's output schema as the subject's new \
             version (if the subject's compatibility rules allow it), or run with \
             --schema-registry-auto-register true",
            id = latest.id
        ),
    }
}

/// The Parsing Canonical Form of `schema`: apache-avro's, with primitives
/// reduced to their names also where a logical type was stripped.
pub fn canonical_form(schema: &Schema) -> String {
    const PRIMITIVES: [&str; 8] = [
        "null", "boolean", "int", "long", "float", "double", "bytes", "string",
    ];
    let mut form = schema.canonical_form();
    // No name or symbol can hold `{` or `"`, so this text is only ever a
    // type.
    for primitive in PRIMITIVES {
        form = form.replace(
            &format!(r#"{{"type":"{primitive}"}}"#),
            &format!(r#""{primitive}""#),
        );
    }
    form
}

/// Where `theirs` stops encoding like `ours` (the first difference of their
/// Parsing Canonical Forms), or `None` when the two encode alike.
pub fn canonical_difference(ours: &Schema, theirs: &Schema) -> Option<String> {
    let (ours_form, theirs_form) = (canonical_form(ours), canonical_form(theirs));
    if ours_form == theirs_form {
        return None;
    }
    let parse = |form: &str| serde_json::from_str::<Value>(form).unwrap_or(Value::Null);
    let found = first_difference("the schema", &parse(&ours_form), &parse(&theirs_form));
    Some(found.unwrap_or_else(|| "their canonical forms differ".to_string()))
}

/// The first difference between two canonical forms (as JSON), described
/// at `path`.
fn first_difference(path: &str, ours: &Value, theirs: &Value) -> Option<String> {
    if ours == theirs {
        return None;
    }
    let whole = || {
        Some(format!(
            "{path} is {} in the service's schema, {} in the registry's",
            shorten(&ours.to_string(), 120),
            shorten(&theirs.to_string(), 120)
        ))
    };
    match (ours, theirs) {
        (Value::Object(a), Value::Object(b)) if a.get("type") == b.get("type") => {
            let kind = a.get("type").and_then(Value::as_str).unwrap_or("");
            if a.get("name") != b.get("name") {
                return Some(format!(
                    "{path}: the {kind} is named {} in the service's schema, {} in the \
                     registry's",
                    a.get("name").unwrap_or(&Value::Null),
                    b.get("name").unwrap_or(&Value::Null)
                ));
            }
            let name = a.get("name").and_then(Value::as_str).unwrap_or(path);
            match kind {
                "record" => fields_difference(name, &a["fields"], &b["fields"]),
                "array" => {
                    first_difference(&format!("{path} (its items)"), &a["items"], &b["items"])
                }
                "map" => {
                    first_difference(&format!("{path} (its values)"), &a["values"], &b["values"])
                }
                _ => whole(),
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            a.iter().zip(b).enumerate().find_map(|(i, (x, y))| {
                first_difference(&format!("{path} (union branch {})", i + 1), x, y)
            })
        }
        _ => whole(),
    }
}

/// The first difference between two records' field lists.
fn fields_difference(record: &str, ours: &Value, theirs: &Value) -> Option<String> {
    let empty = Vec::new();
    let ours = ours.as_array().unwrap_or(&empty);
    let theirs = theirs.as_array().unwrap_or(&empty);
    let name = |field: &Value| field["name"].as_str().unwrap_or("?").to_string();
    for index in 0..ours.len().max(theirs.len()) {
        match (ours.get(index), theirs.get(index)) {
            (Some(a), Some(b)) if name(a) != name(b) => {
                return Some(format!(
                    "field {} of record {record} is `{}` in the service's schema, `{}` in the \
                     registry's",
                    index + 1,
                    name(a),
                    name(b)
                ))
            }
            (Some(a), Some(b)) => {
                let at = format!("field `{}` of record {record}", name(a));
                if let Some(found) = first_difference(&at, &a["type"], &b["type"]) {
                    return Some(found);
                }
            }
            (Some(a), None) => {
                return Some(format!(
                    "the registry's record {record} has no field `{}` (field {} of the \
                     service's)",
                    name(a),
                    index + 1
                ))
            }
            (None, Some(b)) => {
                return Some(format!(
                    "the registry's record {record} has a field `{}` (field {}) that the \
                     service's has not",
                    name(b),
                    index + 1
                ))
            }
            (None, None) => {}
        }
    }
    None
}

/// `text` cut to about `max` characters.
fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION: &str = r#"{"type": "record", "name": "Session", "namespace": "streams",
        "doc": "one session", "fields": [
        {"name": "user", "type": "string", "doc": "who"},
        {"name": "start", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "events", "type": {"type": "array", "items": "string"}},
        {"name": "device", "type": ["null", {"type": "record", "name": "Device",
            "fields": [{"name": "os", "type": "string"}]}], "default": null}]}"#;

    fn schema(json: &str) -> Schema {
        Schema::parse_str(json).unwrap()
    }

    /// `SESSION` with `from` replaced by `to` (which must occur).
    fn changed(from: &str, to: &str) -> Schema {
        assert!(SESSION.contains(from), "{from}");
        schema(&SESSION.replacen(from, to, 1))
    }

    #[test]
    fn docs_defaults_aliases_and_logical_types_do_not_change_the_encoding() {
        let ours = schema(SESSION);
        let plain = r#"{"type": "record", "name": "streams.Session", "fields": [
            {"name": "user", "type": "string"},
            {"name": "start", "type": "long", "aliases": ["begin"]},
            {"name": "events", "type": {"type": "array", "items": "string"}},
            {"name": "device", "type": ["null", {"type": "record", "name": "Device",
                "namespace": "streams", "fields": [{"name": "os", "type": "string"}]}]}]}"#;
        assert_eq!(canonical_difference(&ours, &schema(plain)), None);
    }

    #[test]
    fn the_first_difference_is_named() {
        let ours = schema(SESSION);
        let cases = [
            (
                changed(r#"{"type": "long", "logicalType": "timestamp-millis"}"#, r#""int""#),
                "field `start` of record streams.Session is \"long\" in the service's schema, \"int\" in the registry's",
            ),
            (
                changed(r#"{"name": "user", "type": "string", "doc": "who"},"#, ""),
                "field 1 of record streams.Session is `user` in the service's schema, `start` in the registry's",
            ),
            (
                changed(r#"{"name": "os", "type": "string"}"#, r#"{"name": "os", "type": "string"}, {"name": "version", "type": "int", "default": 0}"#),
                "the registry's record streams.Device has a field `version` (field 2) that the service's has not",
            ),
            (
                changed(r#""items": "string""#, r#""items": "bytes""#),
                "field `events` of record streams.Session (its items) is \"string\" in the service's schema, \"bytes\" in the registry's",
            ),
            (
                changed(r#""name": "Session""#, r#""name": "UserSession""#),
                "the schema: the record is named \"streams.Session\" in the service's schema, \"streams.UserSession\" in the registry's",
            ),
        ];
        for (theirs, expected) in cases {
            assert_eq!(
                canonical_difference(&ours, &theirs).as_deref(),
                Some(expected)
            );
        }
        let fewer = changed(
            r#", "default": null}"#,
            r#", "default": null}, {"name": "x", "type": "int"}"#,
        );
        assert_eq!(
            canonical_difference(&fewer, &ours).as_deref(),
            Some(
                "the registry's record streams.Session has no field `x` (field 5 of the service's)"
            )
        );
    }

    #[test]
    fn with_auto_register_off_the_latest_version_is_used_only_if_it_encodes_alike() {
        let registry = Registry::in_memory();
        let latest = |subject| writer_schema_id(&registry, subject, SESSION, SchemaSource::Latest);

        let missing = latest("sessions-value").unwrap_err().to_string();
        assert!(
            missing.starts_with("subject sessions-value has no schema"),
            "{missing}"
        );
        assert!(
            missing.contains("Register the output schema under sessions-value first"),
            "{missing}"
        );
        assert!(
            missing.contains("--schema-registry-auto-register true"),
            "{missing}"
        );
        assert!(
            registry.latest("sessions-value").is_err(),
            "nothing was registered"
        );

        let other = changed(r#""type": "string", "doc": "who""#, r#""type": "bytes""#);
        let first = registry
            .register("sessions-value", &other.canonical_form())
            .unwrap();
        let differs = latest("sessions-value").unwrap_err().to_string();
        assert!(
            differs.starts_with(&format!(
                "the latest schema of subject sessions-value (version 1, id {first}) is not the \
                 service's output schema: field `user` of record streams.Session is \"string\" in \
                 the service's schema, \"bytes\" in the registry's; canonical forms: the service's \
                 {{\"name\":\"streams.Session\""
            )),
            "{differs}"
        );
        assert!(
            differs.contains("same Avro Parsing Canonical Form"),
            "{differs}"
        );

        // The same schema written differently, as the subject's new version: its id.
        let plain = schema(SESSION).canonical_form();
        let second = registry.register("sessions-value", &plain).unwrap();
        assert_ne!(first, second);
        assert_eq!(latest("sessions-value").unwrap(), second);
        assert_eq!(registry.latest("sessions-value").unwrap().version, Some(2));

        // Registering is the default, and the same schema keeps its id.
        let registered =
            writer_schema_id(&registry, "sessions-value", SESSION, SchemaSource::Register);
        assert_eq!(registered.unwrap(), second);
        assert_eq!(registry.latest("sessions-value").unwrap().version, Some(2));
    }

    #[test]
    fn a_link_with_auto_register_off_uses_a_matching_latest_version_or_registers() {
        assert_eq!(SchemaSource::of(true, false), SchemaSource::Register);
        assert_eq!(SchemaSource::of(true, true), SchemaSource::Register);
        assert_eq!(SchemaSource::of(false, false), SchemaSource::Latest);
        assert_eq!(
            SchemaSource::of(false, true),
            SchemaSource::LatestOrRegister
        );
        let registry = Registry::in_memory();
        let link = || {
            writer_schema_id(
                &registry,
                "app-link-value",
                SESSION,
                SchemaSource::LatestOrRegister,
            )
            .unwrap()
        };
        let registered = link();
        assert_eq!(registry.latest("app-link-value").unwrap().id, registered);
        let before = registry.requests();
        assert_eq!(link(), registered);
        assert_eq!(
            registry.requests(),
            before + 1,
            "found by one read, not registered"
        );
        let other = changed(r#""type": "string", "doc": "who""#, r#""type": "bytes""#);
        registry
            .register("app-link-value", &other.canonical_form())
            .unwrap();
        assert_eq!(
            link(),
            registered,
            "a different latest version: registered again"
        );
    }
}
