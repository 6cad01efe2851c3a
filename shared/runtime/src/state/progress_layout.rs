//! The keys and values of the runtime's progress store: each task's input
//! positions, input clocks and task watermark, committed with its state.
//!
//! Input positions are one entry per input topic in every format. The
//! clocks and the task watermark are laid out by state format:
//!
//! * **format 1**: one entry per clock (`D` + slot: a direct input's
//!   largest event time; `U` + slot + writer: a shuffled input's upstream
//!   watermark) and one for the task watermark (`T`), each an `i64`;
//! * **format 2**: one entry, [`CLOCKS_KEY`], holding them all
//!   ([`StoredClocks`]): one changelog record per commit instead of one per
//!   clock, which for a re-keyed input is one per upstream partition.
//!
//! A reader takes [`CLOCKS_KEY`] when it is there and the format-1 entries
//! otherwise; a writer deletes the other layout's entries it found, in the
//! same commit, so that at most one layout is ever live.

use rocksdb::DB;
use serde::{Deserialize, Serialize};

use super::codec::{decode_value, encode_value};

/// The runtime's store of each task's progress.
pub(crate) const PROGRESS_STORE: &str = "task-progress";

/// Format 2: every clock and the task watermark, in one entry.
pub(crate) const CLOCKS_KEY: &[u8] = b"C";

/// Format 1: the task watermark.
pub(crate) const TASK_WATERMARK_KEY: &[u8] = b"T";

/// Format 1: the largest event time of the direct input in `slot`.
pub(crate) fn direct_key(slot: usize) -> Vec<u8> {
    let mut key = vec![b'D'];
    key.extend_from_slice(&(slot as u16).to_be_bytes());
    key
}

/// Format 1: the watermark upstream writer `source` announced to the
/// shuffled input in `slot`.
pub(crate) fn upstream_key(slot: usize, source: usize) -> Vec<u8> {
    let mut key = vec![b'U'];
    key.extend_from_slice(&(slot as u16).to_be_bytes());
    key.extend_from_slice(&(source as u32).to_be_bytes());
    key
}

/// The key of an input partition's next offset (every format).
pub(crate) fn position_key(topic: &str) -> Vec<u8> {
    let mut key = vec![b'P'];
    key.extend_from_slice(topic.as_bytes());
    key
}

/// Whether `key` is a format-1 clock or task-watermark entry.
pub(crate) fn is_format_1_clock_key(key: &[u8]) -> bool {
    matches!(
        (key.first(), key.len()),
        (Some(b'T'), 1) | (Some(b'D'), 3) | (Some(b'U'), 7)
    )
}

/// Format 2's one entry of clocks (an absent clock has no element).
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredClocks {
    /// The task watermark.
    pub watermark: Option<i64>,
    /// (slot, largest event time) of each direct input.
    pub direct: Vec<(u16, i64)>,
    /// (slot, upstream writer, watermark) of each shuffled input.
    pub upstream: Vec<(u16, u32, i64)>,
}

impl StoredClocks {
    pub fn encode(&self) -> anyhow::Result<Vec<u8>> {
        encode_value(self)
    }

    pub fn decode(bytes: &[u8]) -> anyhow::Result<Self> {
        decode_value(bytes).map_err(|e| e.context("the progress store's clocks"))
    }

    /// Adds the format-1 entry `key` = `value` (see
    /// [`is_format_1_clock_key`]).
    pub fn add_format_1_entry(&mut self, key: &[u8], value: &[u8]) -> anyhow::Result<()> {
        let value =
            i64::from_be_bytes(value.try_into().map_err(|_| {
                anyhow::anyhow!("a progress clock of {} bytes, not 8", value.len())
            })?);
        let slot = || u16::from_be_bytes([key[1], key[2]]);
        match key[0] {
            b'T' => self.watermark = Some(value),
            b'D' => self.direct.push((slot(), value)),
            _ => {
                let source = u32::from_be_bytes(key[3..7].try_into().expect("7-byte key"));
                self.upstream.push((slot(), source, value));
            }
        }
        Ok(())
    }
}

/// The migration of a task store from format 1 to 2: writes the format-1
/// clock entries of the progress store as one [`CLOCKS_KEY`]. It leaves the
/// format-1 entries for the task's first commit to delete, so that its
/// changelog loses them too (a reader takes [`CLOCKS_KEY`] over them
/// meanwhile). Safe to repeat: the entry it wrote is not written again.
pub(crate) fn fold_clocks(db: &DB) -> anyhow::Result<()> {
    let Some(family) = db.cf_handle(PROGRESS_STORE) else {
        return Ok(());
    };
    if db.get_pinned_cf(family, CLOCKS_KEY)?.is_some() {
        return Ok(());
    }
    let mut clocks = StoredClocks::default();
    let mut found = false;
    for entry in db.iterator_cf(family, rocksdb::IteratorMode::Start) {
        let (key, value) = entry?;
        if is_format_1_clock_key(&key) {
            clocks.add_format_1_entry(&key, &value)?;
            found = true;
        }
    }
    if found {
        db.put_cf(family, CLOCKS_KEY, clocks.encode()?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_1_clock_keys_are_told_from_positions() {
        assert!(is_format_1_clock_key(TASK_WATERMARK_KEY));
        assert!(is_format_1_clock_key(&direct_key(3)));
        assert!(is_format_1_clock_key(&upstream_key(1, 7)));
        assert!(!is_format_1_clock_key(CLOCKS_KEY));
        // Topic names are never this short, but a one-letter one is legal.
        assert!(!is_format_1_clock_key(&position_key("orders")));
    }

    #[test]
    fn folding_writes_every_clock_into_one_entry_once() {
        let dir = std::env::temp_dir().join(format!(
            "progress-layout-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        let db = DB::open_cf(&options, &dir, [PROGRESS_STORE]).unwrap();
        let family = db.cf_handle(PROGRESS_STORE).unwrap();
        db.put_cf(family, position_key("orders"), 41i64.to_be_bytes())
            .unwrap();
        db.put_cf(family, direct_key(0), 1_000i64.to_be_bytes())
            .unwrap();
        db.put_cf(family, upstream_key(1, 2), 900i64.to_be_bytes())
            .unwrap();
        db.put_cf(family, TASK_WATERMARK_KEY, 800i64.to_be_bytes())
            .unwrap();
        fold_clocks(&db).unwrap();
        fold_clocks(&db).unwrap();
        let entries: Vec<(Vec<u8>, Vec<u8>)> = db
            .iterator_cf(family, rocksdb::IteratorMode::Start)
            .map(|entry| {
                let (key, value) = entry.unwrap();
                (key.to_vec(), value.to_vec())
            })
            .collect();
        let keys: Vec<&[u8]> = entries.iter().map(|(key, _)| &key[..1]).collect();
        assert_eq!(
            keys,
            [b"C", b"D", b"P", b"T", b"U"],
            "the format-1 ones kept"
        );
        assert_eq!(entries[0].0, CLOCKS_KEY);
        assert_eq!(
            StoredClocks::decode(&entries[0].1).unwrap(),
            StoredClocks {
                watermark: Some(800),
                direct: vec![(0, 1_000)],
                upstream: vec![(1, 2, 900)],
            }
        );
        drop(db);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
