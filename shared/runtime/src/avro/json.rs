//! JSON lines ↔ Avro values.
//!
//! Input lines look like the fixtures: `{"key": "M1", "value": {...}}`, with
//! timestamp-millis fields as epoch milliseconds and nullable fields as plain
//! values or `null`. Output uses the same shape and the same spacing as
//! Python's `json.dumps` (the fixtures' format), fields in schema order.

use std::fmt::Write as _;

use apache_avro::types::Value;
use apache_avro::Schema;

/// One parsed input line.
#[derive(Debug)]
pub struct Line {
    pub key: Option<String>,
    pub value: Value,
}

/// Parses one JSON line into a key and an Avro value valid for `schema`.
pub fn parse_line(text: &str, schema: &Schema) -> anyhow::Result<Line> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| anyhow::anyhow!("not valid JSON: {e}"))?;
    let serde_json::Value::Object(mut object) = json else {
        anyhow::bail!("expected an object with \"key\" and \"value\"");
    };
    let key = match object.remove("key") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(key)) => Some(key),
        Some(other) => Some(other.to_string()),
    };
    let value = object
        .remove("value")
        .ok_or_else(|| anyhow::anyhow!("missing \"value\""))?;
    Ok(Line {
        key,
        value: parse_value(value, schema)?,
    })
}

/// Converts a JSON value as in the fixtures into an Avro value valid for
/// `schema`.
pub fn parse_value(value: serde_json::Value, schema: &Schema) -> anyhow::Result<Value> {
    let avro = Value::try_from(value).map_err(|e| anyhow::anyhow!("value: {e}"))?;
    avro.resolve(schema)
        .map_err(|e| anyhow::anyhow!("value does not match the schema: {e}"))
}

/// One input line whose value is sent as plain bytes.
pub struct RawLine {
    pub key: Option<String>,
    pub value: Option<Vec<u8>>,
}

/// Parses `{"key": ..., "value": "text"}`; the value is sent as its UTF-8 bytes.
pub fn parse_raw_line(text: &str) -> anyhow::Result<RawLine> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| anyhow::anyhow!("not valid JSON: {e}"))?;
    let key = match &json["key"] {
        serde_json::Value::Null => None,
        serde_json::Value::String(key) => Some(key.clone()),
        other => Some(other.to_string()),
    };
    let value = match &json["value"] {
        serde_json::Value::Null => None,
        serde_json::Value::String(text) => Some(text.clone().into_bytes()),
        _ => anyhow::bail!("with --raw, \"value\" must be a string or null"),
    };
    Ok(RawLine { key, value })
}

/// Writes `{"key": ..., "value": ...}` for one record.
pub fn format_line(key: Option<&str>, value: &Value) -> String {
    let mut out = String::with_capacity(256);
    out.push_str("{\"key\": ");
    match key {
        Some(key) => write_string(&mut out, key),
        None => out.push_str("null"),
    }
    out.push_str(", \"value\": ");
    write_value(&mut out, value);
    out.push('}');
    out
}

fn write_string(out: &mut String, text: &str) {
    out.push_str(&serde_json::Value::String(text.to_string()).to_string());
}

fn write_float(out: &mut String, number: f64) {
    if number.is_finite() {
        let _ = write!(out, "{number:?}");
    } else {
        out.push_str("null");
    }
}

/// Writes an Avro value as JSON: records in field order, unions unwrapped,
/// logical timestamps as their numbers.
pub fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Boolean(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(n) | Value::Date(n) | Value::TimeMillis(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Long(n)
        | Value::TimeMicros(n)
        | Value::TimestampMillis(n)
        | Value::TimestampMicros(n)
        | Value::TimestampNanos(n)
        | Value::LocalTimestampMillis(n)
        | Value::LocalTimestampMicros(n)
        | Value::LocalTimestampNanos(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Float(f) => write_float(out, f64::from(*f)),
        Value::Double(f) => write_float(out, *f),
        Value::String(s) | Value::Enum(_, s) => write_string(out, s),
        Value::Union(_, inner) => write_value(out, inner),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Map(entries) => {
            let mut keys: Vec<_> = entries.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_string(out, key);
                out.push_str(": ");
                write_value(out, &entries[key]);
            }
            out.push('}');
        }
        Value::Record(fields) => {
            out.push('{');
            for (i, (name, field)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_string(out, name);
                out.push_str(": ");
                write_value(out, field);
            }
            out.push('}');
        }
        other => match serde_json::Value::try_from(other.clone()) {
            Ok(json) => out.push_str(&json.to_string()),
            Err(_) => out.push_str("null"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &str = r#"{"type": "record", "name": "R", "fields": [
        {"name": "id", "type": "string"},
        {"name": "t", "type": ["null", "double"], "default": null},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "n", "type": "int"}]}"#;

    #[test]
    fn round_trips_a_fixture_line_exactly() {
        let schema = Schema::parse_str(SCHEMA).unwrap();
        let text =
            r#"{"key": "M1", "value": {"id": "M1", "t": 78.0, "at": 1785574810000, "n": 3}}"#;
        let line = parse_line(text, &schema).unwrap();
        assert_eq!(format_line(line.key.as_deref(), &line.value), text);
        let with_null = r#"{"key": null, "value": {"id": "x", "t": null, "at": -5, "n": -1}}"#;
        let line = parse_line(with_null, &schema).unwrap();
        assert_eq!(format_line(line.key.as_deref(), &line.value), with_null);
    }

    #[test]
    fn explains_what_is_wrong() {
        let schema = Schema::parse_str(SCHEMA).unwrap();
        let missing = parse_line(r#"{"key": "a", "value": {"id": "a"}}"#, &schema);
        assert!(missing
            .unwrap_err()
            .to_string()
            .contains("does not match the schema"));
        let broken = parse_line(r#"{"key": "a", "value": {"id": "a""#, &schema);
        assert!(broken.unwrap_err().to_string().contains("not valid JSON"));
    }
}
