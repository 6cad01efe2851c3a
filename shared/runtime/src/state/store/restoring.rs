//! A task store's restore from its changelogs: a bulk load when the store
//! holds nothing yet and the restore is long, else batches written to
//! RocksDB behind the reading.

use rocksdb::{IngestExternalFileOptions, IteratorMode, WriteBatch};

use super::commit::put_checkpoints;
use super::{ingested_file_options, RestoreBatch, TaskStore};
use crate::state::bulk_restore::BulkRestore;
use crate::state::StoreIndex;

/// Records written to RocksDB per batch while restoring in batches.
const RESTORE_BATCH: usize = 50_000;

/// The fewest changelog records a restore into an empty store takes to be
/// a bulk load: below it, batches are as fast (measured with 1.45M records,
/// BENCHMARKS.md) and a crash keeps their progress batch by batch.
const BULK_MIN_RECORDS: u64 = 1_000_000;

/// A restore under way, from [`TaskStore::begin_restore`].
pub enum Restoring {
    /// Onto local state, or a short one: batches, each written while the
    /// next is read.
    Batches(RestoreBatch),
    /// A long one into a store with nothing in it: [`BulkRestore`].
    Bulk(BulkRestore),
}

impl Restoring {
    /// Whether the restore is a bulk load.
    pub fn is_bulk(&self) -> bool {
        matches!(self, Restoring::Bulk(_))
    }
}

impl TaskStore {
    /// Starts a restore of about `records` changelog records: a bulk load
    /// if there are at least [`BULK_MIN_RECORDS`] and no store has a
    /// checkpoint or an entry, else batches. (A crash in the middle of a
    /// bulk load's ingestion leaves some stores filled and none
    /// checkpointed: batches then, which replay the changelogs over them.)
    pub fn begin_restore(&mut self, records: u64) -> anyhow::Result<Restoring> {
        self.finish_applying()?;
        if records >= BULK_MIN_RECORDS && self.holds_nothing()? {
            let bulk = BulkRestore::in_dir(&self.path, self.names.len())?;
            return Ok(Restoring::Bulk(bulk));
        }
        Ok(Restoring::Batches(self.restore_batch()))
    }

    /// Whether no store has a checkpoint or an entry.
    fn holds_nothing(&self) -> anyhow::Result<bool> {
        for store in 0..self.names.len() {
            let filled = self
                .db
                .iterator_cf(self.family(store), IteratorMode::Start)
                .next()
                .transpose()?
                .is_some();
            if filled || self.checkpoint(store)?.is_some() {
                return Ok(false);
            }
        }
        Ok(true)
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
            Restoring::Bulk(bulk) => bulk.push(store, offset, key, value)?,
            Restoring::Batches(batch) => {
                self.stage_restored(batch, store, offset, key, value);
                if batch.records() >= RESTORE_BATCH {
                    let full = std::mem::replace(batch, self.restore_batch());
                    self.write_restored_behind(full)?;
                }
            }
        }
        Ok(())
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
    ///
    /// The stores are merged at once, one thread each: the changelogs are
    /// read by then, so the merges have the cores to themselves, and a
    /// task's restore ends with its largest store's merge, not their sum.
    fn ingest(&mut self, mut bulk: BulkRestore) -> anyhow::Result<()> {
        let options = ingested_file_options();
        let merged: Vec<(StoreIndex, Vec<std::path::PathBuf>)> = std::thread::scope(|scope| {
            let merges: Vec<_> = bulk
                .runs()
                .map(|(store, runs)| {
                    let options = &options;
                    std::thread::Builder::new()
                        .name("restore-merge".into())
                        .spawn_scoped(scope, move || {
                            runs.merge_into_sst_files(0, options)
                                .map(|files| (store, files))
                        })
                        .map_err(|e| {
                            anyhow::anyhow!("cannot start a thread to merge a restore: {e}")
                        })
                })
                .collect::<anyhow::Result<_>>()?;
            merges
                .into_iter()
                .map(|merge| {
                    merge
                        .join()
                        .map_err(|_| anyhow::anyhow!("the thread merging a restore panicked"))?
                })
                .collect::<anyhow::Result<_>>()
        })?;
        let mut ingest = IngestExternalFileOptions::default();
        ingest.set_move_files(true);
        for (store, files) in merged {
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

    /// A changelog of two stores (a record's offset is its index): puts,
    /// overwrites, deletions, a key put again after its deletion, and values
    /// of every length up to 1 000 bytes, in more records than a batch holds.
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

    /// Restores the records past each store's checkpoint into `store` with
    /// `restoring`, and finishes.
    fn restore(store: &mut TaskStore, mut restoring: Restoring, records: &[Record]) {
        let checkpoints = [store.checkpoint(0).unwrap(), store.checkpoint(1).unwrap()];
        for (offset, (index, key, value)) in records.iter().enumerate() {
            if checkpoints[*index].is_some_and(|checkpoint| offset as i64 <= checkpoint) {
                continue;
            }
            store
                .restore_record(&mut restoring, *index, offset as i64, key, value.as_deref())
                .unwrap();
        }
        store.finish_restore(restoring).unwrap();
    }

    /// A bulk load of `store`, whatever its length.
    fn bulk(store: &TaskStore) -> Restoring {
        Restoring::Bulk(BulkRestore::in_dir(&store.path, store.names.len()).unwrap())
    }

    /// A store of `records` restored in batches: what any restore of them
    /// must leave.
    fn restored_in_batches(records: &[Record]) -> (TaskStore, std::path::PathBuf) {
        let (mut store, dir) = temp_store(&["a", "b"]);
        let batches = store.begin_restore(0).unwrap();
        restore(&mut store, batches, records);
        (store, dir)
    }

    fn contents(store: &TaskStore, index: StoreIndex) -> Entries {
        store
            .db
            .iterator_cf(store.family(index), IteratorMode::Start)
            .map(Result::unwrap)
            .collect()
    }

    fn assert_same(restored: &TaskStore, expected: &TaskStore) {
        for index in 0..2 {
            let entries = contents(restored, index);
            assert!(entries.len() > 10_000, "{} entries", entries.len());
            assert_eq!(entries, contents(expected, index), "store {index}");
            assert_eq!(
                restored.checkpoint(index).unwrap(),
                expected.checkpoint(index).unwrap()
            );
        }
    }

    #[test]
    fn a_long_restore_into_an_empty_store_is_a_bulk_load() {
        let (mut store, dir) = temp_store(&["a"]);
        assert!(store.begin_restore(BULK_MIN_RECORDS).unwrap().is_bulk());
        assert!(!store.begin_restore(BULK_MIN_RECORDS - 1).unwrap().is_bulk());
        let mut restoring = store.begin_restore(10).unwrap();
        store
            .restore_record(&mut restoring, 0, 0, b"k", None)
            .unwrap();
        store.finish_restore(restoring).unwrap();
        assert!(
            !store.begin_restore(BULK_MIN_RECORDS).unwrap().is_bulk(),
            "a checkpoint, even with no entry"
        );
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_bulk_load_leaves_what_batches_leave() {
        let records = changelog();
        let (batched, batched_dir) = restored_in_batches(&records);
        let (mut bulk_store, bulk_dir) = temp_store(&["a", "b"]);
        let restoring = bulk(&bulk_store);
        restore(&mut bulk_store, restoring, &records);
        assert_same(&bulk_store, &batched);
        assert_eq!(
            bulk_store.checkpoint(1).unwrap(),
            Some(records.len() as i64 - 1)
        );
        assert!(!bulk_dir.join("restore-bulk-0").exists(), "runs removed");
        drop((bulk_store, batched));
        std::fs::remove_dir_all(bulk_dir).unwrap();
        std::fs::remove_dir_all(batched_dir).unwrap();
    }

    #[test]
    fn a_bulk_load_stopped_keeps_what_it_gathered_and_one_cut_short_nothing() {
        let records = changelog();
        let (batched, batched_dir) = restored_in_batches(&records);
        let gather = |store: &mut TaskStore, restoring: &mut Restoring| {
            for (offset, (index, key, value)) in records[..80_000].iter().enumerate() {
                store
                    .restore_record(restoring, *index, offset as i64, key, value.as_deref())
                    .unwrap();
            }
        };
        let (mut store, dir) = temp_store(&["a", "b"]);
        // A crash: nothing was ingested, the next restore starts over.
        let mut restoring = bulk(&store);
        gather(&mut store, &mut restoring);
        drop(restoring);
        assert_eq!(store.checkpoint(1).unwrap(), None);
        assert!(store.begin_restore(BULK_MIN_RECORDS).unwrap().is_bulk());
        // A signal: what was gathered is ingested with its checkpoints, and
        // the next restore goes on from them in batches.
        let mut restoring = bulk(&store);
        gather(&mut store, &mut restoring);
        store.finish_restore(restoring).unwrap();
        assert_eq!(store.checkpoint(1).unwrap(), Some(79_999));
        let restoring = store.begin_restore(BULK_MIN_RECORDS).unwrap();
        assert!(!restoring.is_bulk());
        restore(&mut store, restoring, &records);
        assert_same(&store, &batched);
        drop((store, batched));
        std::fs::remove_dir_all(dir).unwrap();
        std::fs::remove_dir_all(batched_dir).unwrap();
    }
}
