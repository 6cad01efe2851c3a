//! Reading one task's committed state for a query, from one RocksDB
//! snapshot: the entries asked for and the changelog offset they reflect.

use rocksdb::{Direction, IteratorMode, ReadOptions, SnapshotWithThreadMode, DB};
use serde_json::{json, Value};

use super::json::state_value_json;
use crate::processor::StoreShape;
use crate::state::codec::{
    i64_from_ordered_bytes, i64_to_ordered_bytes, map_prefix, split_map_key,
};
use crate::state::store::CHECKPOINTS;

/// What a query asks of one task's store.
#[derive(Debug, Clone, PartialEq)]
pub enum Selection {
    /// One key's value (or, in a map store, its entries).
    Key(String),
    /// One key's windows (entries whose key begins with a time) starting
    /// in `[from, to]`.
    Windows { key: String, from: i64, to: i64 },
    /// Keys in `[from, to)` (either end open) that start with `prefix`, at
    /// most `limit` of them.
    Range {
        from: Option<String>,
        to: Option<String>,
        prefix: Option<String>,
        limit: usize,
    },
}

/// One store of one task, read from a snapshot.
pub struct Snapshot<'a> {
    db: &'a DB,
    snapshot: SnapshotWithThreadMode<'a, DB>,
    family: &'a rocksdb::ColumnFamily,
    name: &'a str,
}

impl<'a> Snapshot<'a> {
    pub fn new(db: &'a DB, name: &'a str) -> anyhow::Result<Self> {
        let family = db
            .cf_handle(name)
            .ok_or_else(|| anyhow::anyhow!("store {name} is not in this task's database"))?;
        Ok(Snapshot {
            db,
            snapshot: db.snapshot(),
            family,
            name,
        })
    }

    fn options(&self) -> ReadOptions {
        let mut options = ReadOptions::default();
        options.set_snapshot(&self.snapshot);
        options
    }

    /// The last changelog offset the snapshot's state includes; `None` for a
    /// store that has never been written.
    pub fn position(&self) -> anyhow::Result<Option<i64>> {
        let family = self
            .db
            .cf_handle(CHECKPOINTS)
            .ok_or_else(|| anyhow::anyhow!("no checkpoints in this task's database"))?;
        let value = self
            .db
            .get_pinned_cf_opt(family, self.name.as_bytes(), &self.options())?;
        Ok(value.and_then(|bytes| bytes.as_ref().try_into().ok().map(i64::from_be_bytes)))
    }

    /// Reads `selection` from a store of `shape`. A key query answers
    /// `{"value": …}` (null when absent) for a value store, `{"entries":
    /// [{"key", "value"}]}` for a map store; a range query answers
    /// `{"entries": [{"key", "value"|"entries"}], "more": bool}`.
    pub fn read(&self, shape: StoreShape, selection: &Selection) -> anyhow::Result<Value> {
        match (selection, shape) {
            (Selection::Key(key), StoreShape::Value) => Ok(json!({"value": self.value(key)?})),
            (Selection::Key(key), StoreShape::Map { entry_key, .. }) => {
                Ok(json!({"entries": self.map_entries(key, entry_key, None)?}))
            }
            (Selection::Windows { key, from, to }, StoreShape::Map { entry_key, timed }) => {
                anyhow::ensure!(timed, "store {} is not windowed", self.name);
                let entries = self.map_entries(key, entry_key, Some((*from, *to)))?;
                Ok(json!({"entries": entries}))
            }
            (Selection::Windows { key, from, to }, StoreShape::Value) => {
                // A value that is a map from window start (window-aggregator's
                // open windows): the windows in range.
                let entries = match self.value(key)? {
                    Value::Null => Vec::new(),
                    Value::Object(windows) => windows
                        .into_iter()
                        .filter_map(|(start, value)| {
                            let start: i64 = start.parse().ok()?;
                            (*from..=*to)
                                .contains(&start)
                                .then(|| json!({"key": start, "value": value}))
                        })
                        .collect(),
                    _ => anyhow::bail!("store {} is not windowed", self.name),
                };
                Ok(json!({"entries": entries}))
            }
            (
                Selection::Range {
                    from,
                    to,
                    prefix,
                    limit,
                },
                shape,
            ) => self.range(
                shape,
                from.as_deref(),
                to.as_deref(),
                prefix.as_deref(),
                *limit,
            ),
        }
    }

    fn value(&self, key: &str) -> anyhow::Result<Value> {
        match (self.db).get_pinned_cf_opt(self.family, key.as_bytes(), &self.options())? {
            Some(bytes) => state_value_json(&bytes),
            None => Ok(Value::Null),
        }
    }

    /// The entries of `key`'s map, those whose time is in `window` if given.
    fn map_entries(
        &self,
        key: &str,
        entry_key: fn(&[u8]) -> anyhow::Result<Value>,
        window: Option<(i64, i64)>,
    ) -> anyhow::Result<Vec<Value>> {
        let mut prefix = Vec::with_capacity(key.len() + 4);
        map_prefix(key.as_bytes(), &mut prefix);
        let mut start = prefix.clone();
        if let Some((from, _)) = window {
            start.extend_from_slice(&i64_to_ordered_bytes(from));
        }
        let mut entries = Vec::new();
        let iterator = self.db.iterator_cf_opt(
            self.family,
            self.options(),
            IteratorMode::From(&start, Direction::Forward),
        );
        for item in iterator {
            let (stored_key, value) = item?;
            let Some(entry) = stored_key.strip_prefix(prefix.as_slice()) else {
                break;
            };
            if let Some((_, to)) = window {
                let time = entry
                    .get(..8)
                    .and_then(|bytes| bytes.try_into().ok())
                    .map(i64_from_ordered_bytes);
                if time.is_none_or(|time| time > to) {
                    break;
                }
            }
            entries.push(json!({"key": entry_key(entry)?, "value": state_value_json(&value)?}));
        }
        Ok(entries)
    }

    fn range(
        &self,
        shape: StoreShape,
        from: Option<&str>,
        to: Option<&str>,
        prefix: Option<&str>,
        limit: usize,
    ) -> anyhow::Result<Value> {
        let selected = |key: &str| {
            from.is_none_or(|from| key >= from)
                && to.is_none_or(|to| key < to)
                && prefix.is_none_or(|prefix| key.starts_with(prefix))
        };
        let mut entries: Vec<Value> = Vec::new();
        let mut more = false;
        match shape {
            StoreShape::Value => {
                // Value stores are in key order: seek to the first key.
                let start = match (from, prefix) {
                    (Some(from), Some(prefix)) => from.max(prefix),
                    (Some(from), None) => from,
                    (None, Some(prefix)) => prefix,
                    (None, None) => "",
                };
                let iterator = self.db.iterator_cf_opt(
                    self.family,
                    self.options(),
                    IteratorMode::From(start.as_bytes(), Direction::Forward),
                );
                for item in iterator {
                    let (key, value) = item?;
                    let key = String::from_utf8_lossy(&key);
                    if to.is_some_and(|to| *key >= *to)
                        || prefix.is_some_and(|prefix| !key.starts_with(prefix))
                    {
                        break;
                    }
                    if entries.len() == limit {
                        more = true;
                        break;
                    }
                    entries.push(json!({"key": key, "value": state_value_json(&value)?}));
                }
            }
            StoreShape::Map { entry_key, .. } => {
                // Map entries are ordered by key length first: every entry
                // is looked at, keys grouped, then sorted.
                let mut by_key: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
                for item in
                    self.db
                        .iterator_cf_opt(self.family, self.options(), IteratorMode::Start)
                {
                    let (stored_key, value) = item?;
                    let (key, entry) = split_map_key(&stored_key)?;
                    let key = String::from_utf8_lossy(key);
                    if !selected(&key) {
                        continue;
                    }
                    by_key.entry(key.into_owned()).or_default().push(
                        json!({"key": entry_key(entry)?, "value": state_value_json(&value)?}),
                    );
                }
                more = by_key.len() > limit;
                entries = by_key
                    .into_iter()
                    .take(limit)
                    .map(|(key, map)| json!({"key": key, "entries": map}))
                    .collect();
            }
        }
        Ok(json!({"entries": entries, "more": more}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processor::MapState;
    use crate::state::codec::{encode_value, MapKey};

    fn database(dir: &std::path::Path, families: &[&str]) -> DB {
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        DB::open_cf(&options, dir, families.iter().chain(&[CHECKPOINTS])).unwrap()
    }

    fn map_key(key: &str, start: i64) -> Vec<u8> {
        let mut bytes = Vec::new();
        map_prefix(key.as_bytes(), &mut bytes);
        start.encode_key(&mut bytes);
        bytes
    }

    #[test]
    fn a_value_store_answers_keys_and_ranges_with_its_position() {
        let dir = tempfile_dir("value");
        let db = database(&dir, &["sessions"]);
        let family = db.cf_handle("sessions").unwrap();
        for (key, events) in [("u1", 1), ("u2", 2), ("v1", 3)] {
            db.put_cf(family, key, encode_value(&events).unwrap())
                .unwrap();
        }
        let checkpoints = db.cf_handle(CHECKPOINTS).unwrap();
        db.put_cf(checkpoints, "sessions", 41i64.to_be_bytes())
            .unwrap();

        let snapshot = Snapshot::new(&db, "sessions").unwrap();
        assert_eq!(snapshot.position().unwrap(), Some(41));
        let key = |key: &str| snapshot.read(StoreShape::Value, &Selection::Key(key.into()));
        assert_eq!(key("u2").unwrap(), json!({"value": 2}));
        assert_eq!(key("nobody").unwrap(), json!({"value": null}));
        let range = |from: Option<&str>, prefix: Option<&str>, limit| {
            let selection = Selection::Range {
                from: from.map(Into::into),
                to: None,
                prefix: prefix.map(Into::into),
                limit,
            };
            snapshot.read(StoreShape::Value, &selection).unwrap()
        };
        assert_eq!(
            range(None, Some("u"), 10),
            json!({"entries": [{"key": "u1", "value": 1}, {"key": "u2", "value": 2}], "more": false})
        );
        assert_eq!(
            range(Some("u2"), None, 1),
            json!({"entries": [{"key": "u2", "value": 2}], "more": true})
        );
    }

    #[test]
    fn a_map_store_answers_a_keys_windows_in_a_time_range() {
        const WINDOWS: MapState<i64, u32> = MapState::new("windows");
        let dir = tempfile_dir("map");
        let db = database(&dir, &["windows"]);
        let family = db.cf_handle("windows").unwrap();
        for (key, start) in [("m1", 0), ("m1", 60), ("m1", 120), ("m10", 60), ("m2", 60)] {
            let value = encode_value(&(start as u32)).unwrap();
            db.put_cf(family, map_key(key, start), value).unwrap();
        }
        let snapshot = Snapshot::new(&db, "windows").unwrap();
        let shape = WINDOWS.spec().shape;
        let windows = Selection::Windows {
            key: "m1".into(),
            from: 30,
            to: 120,
        };
        assert_eq!(
            snapshot.read(shape, &windows).unwrap(),
            json!({"entries": [{"key": 60, "value": 60}, {"key": 120, "value": 120}]})
        );
        let all = snapshot.read(shape, &Selection::Key("m1".into())).unwrap();
        assert_eq!(all["entries"].as_array().unwrap().len(), 3);
        let range = Selection::Range {
            from: Some("m10".into()),
            to: Some("m3".into()),
            prefix: None,
            limit: 10,
        };
        assert_eq!(
            snapshot.read(shape, &range).unwrap(),
            json!({"entries": [
                {"key": "m10", "entries": [{"key": 60, "value": 60}]},
                {"key": "m2", "entries": [{"key": 60, "value": 60}]},
            ], "more": false})
        );
        assert_eq!(snapshot.position().unwrap(), None);
    }

    fn tempfile_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("query-read-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }
}
