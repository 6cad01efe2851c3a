//! State values (named MessagePack, see [`crate::state::codec`]) as JSON,
//! without their Rust types: a query server reads any store of any service.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::state::codec::FORMAT_MSGPACK_NAMED;

/// A state value's bytes (format byte first) as JSON. Map keys that are not
/// strings (a window start, an id) become their decimal text, as JSON
/// objects need.
pub fn state_value_json(bytes: &[u8]) -> anyhow::Result<Value> {
    match bytes.split_first() {
        Some((&FORMAT_MSGPACK_NAMED, body)) => {
            let mut decoder = rmp_serde::Deserializer::new(body);
            Ok(AnyValue::deserialize(&mut decoder)
                .map_err(|e| anyhow::anyhow!("state value decoding failed: {e}"))?
                .0)
        }
        Some((format, _)) => anyhow::bail!("unknown state value format {format}"),
        None => anyhow::bail!("empty state value"),
    }
}

/// Any self-describing value, as JSON.
struct AnyValue(Value);

impl<'de> Deserialize<'de> for AnyValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(AnyVisitor).map(AnyValue)
    }
}

struct AnyVisitor;

impl<'de> Visitor<'de> for AnyVisitor {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("any value")
    }
    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(value.into())
    }
    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(value.into())
    }
    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(value.into())
    }
    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        // NaN and infinities have no JSON form: null.
        Ok(value.into())
    }
    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(value.into())
    }
    fn visit_bytes<E>(self, value: &[u8]) -> Result<Value, E> {
        Ok(value.iter().map(|&byte| Value::from(byte)).collect())
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        AnyValue::deserialize(deserializer).map(|value| value.0)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Value, D::Error> {
        AnyValue::deserialize(deserializer).map(|value| value.0)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(AnyValue(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some((AnyValue(key), AnyValue(value))) = map.next_entry()? {
            let key = match key {
                Value::String(text) => text,
                other => other.to_string(),
            };
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::codec::encode_value;
    use std::collections::BTreeMap;

    #[derive(serde::Serialize)]
    struct Session {
        user: String,
        events: u32,
        last: Option<i64>,
        tags: Vec<String>,
        mean: f64,
    }

    #[test]
    fn a_struct_becomes_an_object_with_its_field_names() {
        let bytes = encode_value(&Session {
            user: "u1".into(),
            events: 3,
            last: None,
            tags: vec!["a".into()],
            mean: 1.5,
        })
        .unwrap();
        assert_eq!(
            state_value_json(&bytes).unwrap(),
            serde_json::json!({"user": "u1", "events": 3, "last": null, "tags": ["a"], "mean": 1.5})
        );
    }

    #[test]
    fn integer_map_keys_become_their_decimal_text() {
        let windows: BTreeMap<i64, u32> = [(-5, 1), (1_700_000_000_000, 2)].into();
        let bytes = encode_value(&windows).unwrap();
        assert_eq!(
            state_value_json(&bytes).unwrap(),
            serde_json::json!({"-5": 1, "1700000000000": 2})
        );
    }

    #[test]
    fn an_unknown_format_is_an_error() {
        assert!(state_value_json(&[9, 0]).is_err());
        assert!(state_value_json(&[]).is_err());
    }
}
