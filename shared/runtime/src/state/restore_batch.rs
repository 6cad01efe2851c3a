//! A batch of changelog records on their way into a task's RocksDB during
//! a restore, written in key order.

use std::ops::Range;

use super::StoreIndex;

/// Changelog records being restored into a [`TaskStore`](super::store::TaskStore), written to
/// RocksDB in key order, together with the changelog offset each store
/// reaches.
///
/// In key order because a memtable insert resumes its search where the
/// last one ended: in changelog order (keys at random) each insert searched
/// the skip list from the top, a large share of a restore's time.
pub struct RestoreBatch {
    records: Vec<Restored>,
    /// Every record's key and value bytes, one after the other.
    bytes: Vec<u8>,
    pub(super) checkpoints: Vec<Option<i64>>,
}

/// A restored record: its store, and where its key and value (none for a
/// tombstone) are in the batch's bytes.
struct Restored {
    store: StoreIndex,
    key: Range<usize>,
    value: Option<Range<usize>>,
}

impl RestoreBatch {
    /// An empty batch for a task of `stores` stores.
    pub(super) fn new(stores: usize) -> Self {
        RestoreBatch {
            records: Vec::new(),
            bytes: Vec::new(),
            checkpoints: vec![None; stores],
        }
    }

    /// Records in the batch.
    pub fn records(&self) -> usize {
        self.records.len()
    }

    pub(super) fn push(&mut self, store: StoreIndex, key: &[u8], value: Option<&[u8]>) {
        let mut store_bytes = |bytes: &[u8]| {
            let start = self.bytes.len();
            self.bytes.extend_from_slice(bytes);
            start..self.bytes.len()
        };
        let key = store_bytes(key);
        let value = value.map(store_bytes);
        self.records.push(Restored { store, key, value });
    }

    /// The records as (store, key, value) in key order (by store, then
    /// key), only the last of a key's records in the batch: the state they
    /// leave.
    pub(super) fn in_key_order(
        &mut self,
    ) -> impl Iterator<Item = (StoreIndex, &[u8], Option<&[u8]>)> {
        let bytes = &self.bytes;
        let sort_key = |record: &Restored| (record.store, &bytes[record.key.clone()]);
        // A key's records stay in changelog order: their bytes are in it.
        self.records.sort_unstable_by(|a, b| {
            (sort_key(a).cmp(&sort_key(b))).then(a.key.start.cmp(&b.key.start))
        });
        let records = &self.records;
        records
            .iter()
            .enumerate()
            .filter_map(move |(index, record)| {
                let superseded = records
                    .get(index + 1)
                    .is_some_and(|next| sort_key(next) == sort_key(record));
                let value = record.value.clone().map(|value| &bytes[value]);
                (!superseded).then_some((record.store, &bytes[record.key.clone()], value))
            })
    }
}
