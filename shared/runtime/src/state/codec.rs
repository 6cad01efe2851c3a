//! How state values and keys become bytes.
//!
//! **Values** carry an explicit format byte and are stored as MessagePack maps
//! with field *names* (`rmp_serde::to_vec_named`), so adding a field with
//! `#[serde(default)]` to a state struct keeps every saved value readable, and
//! removing one is ignored on read. The format byte leaves room for a future
//! encoding without a migration of existing state.
//!
//! **Map keys** use an order-preserving encoding ([`MapKey`]) so that a scan of
//! a map returns entries in key order: big-endian integers with the sign bit
//! flipped, strings as raw UTF-8 (only as the last component).

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Format byte of values written as named MessagePack.
pub(crate) const FORMAT_MSGPACK_NAMED: u8 = 1;

/// Encodes a state value.
pub fn encode_value<T: Serialize>(value: &T) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(64);
    out.push(FORMAT_MSGPACK_NAMED);
    rmp_serde::encode::write_named(&mut out, value)
        .map_err(|e| anyhow::anyhow!("state value encoding failed: {e}"))?;
    Ok(out)
}

/// Decodes a state value written by [`encode_value`].
pub fn decode_value<T: DeserializeOwned>(bytes: &[u8]) -> anyhow::Result<T> {
    match bytes.split_first() {
        Some((&FORMAT_MSGPACK_NAMED, body)) => rmp_serde::from_slice(body)
            .map_err(|e| anyhow::anyhow!("state value decoding failed: {e}")),
        Some((format, _)) => anyhow::bail!("unknown state value format {format}"),
        None => anyhow::bail!("empty state value"),
    }
}

/// A map key with an order-preserving byte encoding.
pub trait MapKey: Sized {
    /// Appends the encoding of `self` to `out`.
    fn encode_key(&self, out: &mut Vec<u8>);
    /// Decodes a key from exactly `bytes`.
    fn decode_key(bytes: &[u8]) -> anyhow::Result<Self>;
    /// The key in JSON, as a query shows it.
    fn to_json(&self) -> serde_json::Value;
    /// Whether the encoding begins with an `i64` time (a window start), so
    /// that entries can be selected by a time range.
    const TIMED: bool = false;
}

/// Encodes an `i64` so that byte order equals numeric order.
pub fn i64_to_ordered_bytes(value: i64) -> [u8; 8] {
    ((value as u64) ^ (1 << 63)).to_be_bytes()
}

/// Inverse of [`i64_to_ordered_bytes`].
pub fn i64_from_ordered_bytes(bytes: [u8; 8]) -> i64 {
    (u64::from_be_bytes(bytes) ^ (1 << 63)) as i64
}

fn fixed<const N: usize>(bytes: &[u8]) -> anyhow::Result<[u8; N]> {
    bytes
        .try_into()
        .map_err(|_| anyhow::anyhow!("map key: expected {N} bytes, got {}", bytes.len()))
}

impl MapKey for i64 {
    fn encode_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&i64_to_ordered_bytes(*self));
    }
    fn decode_key(bytes: &[u8]) -> anyhow::Result<Self> {
        Ok(i64_from_ordered_bytes(fixed(bytes)?))
    }
    fn to_json(&self) -> serde_json::Value {
        (*self).into()
    }
    const TIMED: bool = true;
}

impl MapKey for u64 {
    fn encode_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_be_bytes());
    }
    fn decode_key(bytes: &[u8]) -> anyhow::Result<Self> {
        Ok(u64::from_be_bytes(fixed(bytes)?))
    }
    fn to_json(&self) -> serde_json::Value {
        (*self).into()
    }
}

impl MapKey for String {
    fn encode_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
    fn decode_key(bytes: &[u8]) -> anyhow::Result<Self> {
        Ok(std::str::from_utf8(bytes)?.to_string())
    }
    fn to_json(&self) -> serde_json::Value {
        self.as_str().into()
    }
}

/// A pair of a fixed-width first component and any second one, ordered by
/// the first, then the second.
impl<B: MapKey> MapKey for (i64, B) {
    fn encode_key(&self, out: &mut Vec<u8>) {
        self.0.encode_key(out);
        self.1.encode_key(out);
    }
    fn decode_key(bytes: &[u8]) -> anyhow::Result<Self> {
        anyhow::ensure!(bytes.len() >= 8, "map key too short");
        let (first, rest) = bytes.split_at(8);
        Ok((i64::decode_key(first)?, B::decode_key(rest)?))
    }
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!([self.0, self.1.to_json()])
    }
    const TIMED: bool = true;
}

/// The prefix under which all entries of one map (one record key) are stored:
/// the key's length then its bytes, so that no key's prefix is another's.
pub fn map_prefix(key: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(key.len()).expect("state keys are shorter than 4 GiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(key);
}

/// Splits a stored map entry's key into the record key and the entry's
/// key: the inverse of [`map_prefix`] followed by the entry key.
pub fn split_map_key(bytes: &[u8]) -> anyhow::Result<(&[u8], &[u8])> {
    anyhow::ensure!(bytes.len() >= 4, "map entry key too short");
    let (len, rest) = bytes.split_at(4);
    let len = u32::from_be_bytes(len.try_into()?) as usize;
    anyhow::ensure!(rest.len() >= len, "map entry key truncated");
    Ok(rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[test]
    fn ordered_i64_bytes_sort_like_numbers() {
        let values = [i64::MIN, -300_000, -1, 0, 1, 299_999, i64::MAX];
        let encoded: Vec<_> = values.iter().map(|v| i64_to_ordered_bytes(*v)).collect();
        let mut sorted = encoded.clone();
        sorted.sort();
        assert_eq!(encoded, sorted);
        for v in values {
            assert_eq!(i64_from_ordered_bytes(i64_to_ordered_bytes(v)), v);
        }
    }

    #[test]
    fn composite_keys_round_trip() {
        let mut out = Vec::new();
        (-5i64, "doc-7".to_string()).encode_key(&mut out);
        let decoded = <(i64, String)>::decode_key(&out).unwrap();
        assert_eq!(decoded, (-5, "doc-7".to_string()));
    }

    #[test]
    fn a_map_entry_key_splits_back_into_record_key_and_entry_key() {
        let mut out = Vec::new();
        map_prefix(b"machine-1", &mut out);
        42i64.encode_key(&mut out);
        let (key, entry) = split_map_key(&out).unwrap();
        assert_eq!(key, b"machine-1");
        assert_eq!(i64::decode_key(entry).unwrap(), 42);
        assert!(split_map_key(&out[..6]).is_err());
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct V1 {
        count: u32,
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct V2 {
        count: u32,
        #[serde(default)]
        total: f64,
    }

    #[test]
    fn adding_a_defaulted_field_keeps_old_values_readable() {
        let old = encode_value(&V1 { count: 3 }).unwrap();
        let upgraded: V2 = decode_value(&old).unwrap();
        assert_eq!(
            upgraded,
            V2 {
                count: 3,
                total: 0.0
            }
        );
        let new = encode_value(&V2 {
            count: 4,
            total: 1.5,
        })
        .unwrap();
        let downgraded: V1 = decode_value(&new).unwrap();
        assert_eq!(downgraded, V1 { count: 4 });
    }

    #[test]
    fn unknown_formats_are_errors_not_garbage() {
        assert!(decode_value::<V1>(&[9, 1, 2]).is_err());
        assert!(decode_value::<V1>(&[]).is_err());
    }
}
