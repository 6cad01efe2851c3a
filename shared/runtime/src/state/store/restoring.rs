//! A task store's restore from its changelogs: a bulk load when the store
//! holds nothing yet, else batches written to RocksDB behind the reading.

use rocksdb::{IngestExternalFileOptions, IteratorMode, WriteBatch};

use super::commit::put_checkpoints;
use super::{ingested_file_options, RestoreBatch, TaskStore};
use crate::state::bulk_restore::BulkRestore;
use crate::state::StoreIndex;

/// Records written to RocksDB per batch while restoring onto local state.
const RESTORE_BATCH: usize = 50_000;

/// A restore under way, from [`TaskStore::begin_restore`].
pub enum Restoring {
    /// Onto local state: batches, each written while the next is read.
    Batches(RestoreBatch),
    /// Into a store with nothing in it: [`BulkRestore`].
    Bulk(BulkRestore),
}

impl Restoring {
    /// Whether the restore is a bulk load.
    pub fn is_bulk(&self) -> bool {
        matches!(self, Restoring::Bulk(_))
    }
}

impl TaskStore {
    /// Starts a restore: a bulk load if no store has a checkpoint or an
    /// entry (a crash in the middle of a bulk load's ingestion leaves some
    /// stores filled and none checkpointed: batches then, which replay the
    /// changelogs over them), else batches.
    pub fn begin_restore(&mut self) -> anyhow::Result<Restoring> {
        self.finish_applying()?;
        for store in 0..self.names.len() {
            let filled = self
                .db
                .iterator_cf(self.family(store), IteratorMode::Start)
                .next()
                .transpose()?
                .is_some();
            if filled || self.checkpoint(store)?.is_some() {
                return Ok(Restoring::Batches(self.restore_batch()));
            }
        }
        Ok(Restoring::Bulk(BulkRestore::in_dir(
            &self.path,
            self.names.len(),
        )?))
    }

    /// Adds the changelog record of `store` at `offset` to `restoring`: a
    /// put, or a deletion for a tombstone (no value). A full batch is handed
    /// to a state writer.
    pub fn restore_record(
        &mut self,
        restoring: &mut Restoring,
        store: StoreIndex,
        offset: i64,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> anyhow::Result<()> {
        match restoring {
            Restoring::Bulk(bulk) => bulk.push(store, offset, key, value),
            Restoring::Batches(batch) => {
                self.stage_restored(batch, store, offset, key, value);
                if batch.records() >= RESTORE_BATCH {
                    let full = std::mem::replace(batch, self.restore_batch());
                    self.write_restored_behind(full)?;
                }
                Ok(())
            }
        }
    }

    /// Writes what `restoring` still holds, with the changelog offsets it
    /// reaches, and waits for it.
    pub fn finish_restore(&mut self, restoring: Restoring) -> anyhow::Result<()> {
        match restoring {
            Restoring::Batches(batch) => self.write_restored(batch),
            Restoring::Bulk(bulk) => self.ingest(bulk),
        }
    }

    /// Merges each store's runs into an SST file, ingests it at the bottom
    /// of the store's column family, then writes the checkpoints: until
    /// then the store reads as not restored at all.
    fn ingest(&mut self, mut bulk: BulkRestore) -> anyhow::Result<()> {
        let options = ingested_file_options();
        let mut ingest = IngestExternalFileOptions::default();
        ingest.set_move_files(true);
        for (store, runs) in bulk.runs() {
            let files = runs.merge_into_sst_files(0, &options)?;
            if !files.is_empty() {
                self.db
                    .ingest_external_file_cf_opts(self.family(store), &ingest, files)?;
            }
        }
        let reached = (bulk.checkpoints.iter().enumerate())
            .filter_map(|(store, offset)| offset.map(|offset| (store, offset)));
        let mut batch = WriteBatch::default();
        put_checkpoints(&mut batch, &self.db, &self.names, reached);
        self.db.write(batch)?;
        self.cache.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::store::tests::temp_store;

    /// A changelog record: its store, key and value (none: a tombstone).
    type Record = (StoreIndex, Vec<u8>, Option<Vec<u8>>);
    /// A column family's entries, in key order.
    type Entries = Vec<(Box<[u8]>, Box<[u8]>)>;

    /// A changelog of two stores: puts, overwrites, deletions, a key put
    /// again after its deletion, and values of every length up to 1 000
    /// bytes, in more records than a batch holds.
    fn changelog() -> Vec<Record> {
        let mut records = Vec::new();
        for n in 0..120_000u32 {
            let key = format!("key-{}", n.wrapping_mul(2_654_435_761) % 40_000).into_bytes();
            let value = match n % 7 {
                0 => None,
                _ => Some(vec![n as u8; (n % 1_000) as usize]),
            };
            records.push(((n % 2) as StoreIndex, key, value));
        }
        records
    }

    fn restore(store: &mut TaskStore, records: &[Record]) {
        let mut restoring = store.begin_restore().unwrap();
        for (offset, (index, key, value)) in records.iter().enumerate() {
            store
                .restore_record(&mut restoring, *index, offset as i64, key, value.as_deref())
                .unwrap();
        }
        store.finish_restore(restoring).unwrap();
    }

    fn contents(store: &TaskStore, index: StoreIndex) -> Entries {
        store
            .db
            .iterator_cf(store.family(index), IteratorMode::Start)
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn a_bulk_restore_leaves_what_batches_leave() {
        let records = changelog();
        let (mut bulk, bulk_dir) = temp_store(&["a", "b"]);
        assert!(bulk.begin_restore().unwrap().is_bulk(), "an empty store");
        restore(&mut bulk, &records);
        // Local state: the rest of the changelog goes in batches.
        let (mut batched, batched_dir) = temp_store(&["a", "b"]);
        let (first, rest) = records.split_at(1);
        restore(&mut batched, first);
        assert!(!batched.begin_restore().unwrap().is_bulk());
        let mut restoring = batched.begin_restore().unwrap();
        for (offset, (index, key, value)) in rest.iter().enumerate() {
            batched
                .restore_record(
                    &mut restoring,
                    *index,
                    offset as i64 + 1,
                    key,
                    value.as_deref(),
                )
                .unwrap();
        }
        batched.finish_restore(restoring).unwrap();

        for index in 0..2 {
            let restored = contents(&bulk, index);
            assert!(restored.len() > 10_000, "{} entries", restored.len());
            assert_eq!(restored, contents(&batched, index), "store {index}");
            assert_eq!(
                bulk.checkpoint(index).unwrap(),
                batched.checkpoint(index).unwrap()
            );
        }
        assert_eq!(bulk.checkpoint(1).unwrap(), Some(records.len() as i64 - 1));
        assert!(
            !bulk_dir.join("restore-bulk-0").exists(),
            "the runs are removed"
        );
        drop((bulk, batched));
        std::fs::remove_dir_all(bulk_dir).unwrap();
        std::fs::remove_dir_all(batched_dir).unwrap();
    }
}
