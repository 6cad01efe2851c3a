//! A task store's commits: sealing the overlay, writing committed changes to
//! RocksDB with the changelog offsets they reach (on a state writer, or at
//! once for restored changelog records), and rolling back.

use std::sync::mpsc::Receiver;
use std::sync::Arc;

use rocksdb::{WriteBatch, DB};

use super::{empty_layers, family, Change, Changes, RestoreBatch, TaskStore, CHECKPOINTS};
use crate::state::StoreIndex;

/// A commit's changes on their way into RocksDB, shared with the writer
/// until it is done (none for a batch of restored records, which the
/// writer owns).
pub(super) struct Applying {
    pub(super) changes: Arc<Vec<Changes>>,
    /// The changelog offset each changed store reaches with them.
    checkpoints: Vec<(StoreIndex, i64)>,
    written: Receiver<anyhow::Result<()>>,
}

impl TaskStore {
    /// Seals the changes made so far for a commit; later changes go to a
    /// fresh overlay. The previous commit must have been handed to
    /// [`Self::apply_sealed`] or discarded.
    ///
    /// Values kept decoded are encoded here, once; should one fail, the
    /// overlay stays as it is (some values encoded and some deletions of
    /// keys that have no committed value dropped, which reads the same).
    pub fn seal(&mut self) -> anyhow::Result<()> {
        // The last commit's write has had a commit interval; its layers go
        // now, so that at most two commits' changes are held at a time.
        self.finish_applying()?;
        debug_assert!(
            self.sealed.iter().all(Changes::is_empty),
            "one commit in flight at a time"
        );
        for store in 0..self.names.len() {
            if self.key_filters[store]
                .as_ref()
                .is_some_and(|filter| filter.is_full())
            {
                self.build_key_filter(store)?;
            }
        }
        let (cache, db, names) = (&self.cache, &self.db, &self.names);
        let filters = &self.key_filters;
        for (store, overlay) in self.overlay.iter_mut().enumerate() {
            // A deletion of a key that committed state does not hold is no
            // change: no tombstone for RocksDB or the changelog. Such keys
            // were created and deleted again since the last seal (a session
            // or window that began and ended within one commit), often
            // written without a read (the processor knew the key was new),
            // so where the read cache does not know, the store's key filter
            // or RocksDB's bloom filters answer: committed state is all in
            // RocksDB by now.
            //
            // One pass over the overlay, which also encodes the values kept
            // decoded: a pass costs a memory access per entry.
            let family = family(db, &names[store]);
            let filter = filters[store].as_ref();
            let mut failed = None;
            overlay.retain(|key, change| match change {
                Change::Deleted => {
                    !(cache.knows_absent(store, key)
                        || filter.is_some_and(|filter| !filter.may_contain(key))
                        || !db.key_may_exist_cf(family, key))
                }
                Change::Decoded(value) if failed.is_none() => {
                    match value.encode() {
                        Ok(bytes) => *change = Change::Put(bytes),
                        Err(error) => failed = Some(error),
                    }
                    true
                }
                Change::Decoded(_) | Change::Put(_) => true,
            });
            if let Some(error) = failed {
                return Err(error);
            }
        }
        // The emptied layers of the last write, capacity and all, take the
        // next changes.
        let fresh = (self.spare.take()).unwrap_or_else(|| empty_layers(self.names.len()));
        self.sealed = std::mem::replace(&mut self.overlay, fresh);
        Ok(())
    }

    /// The sealed changes of `store` (in key order if it has been scanned).
    pub fn sealed(&self, store: StoreIndex) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.sealed[store]
            .iter()
            .map(|(key, change)| (key.as_slice(), change.sealed()))
    }

    /// Hands the sealed (now committed) changes to a state writer, which
    /// writes them to RocksDB in one batch with the changelog offset each
    /// changed store has reached. Until then they are read from memory.
    pub fn apply_sealed(&mut self, checkpoints: &[(StoreIndex, i64)]) -> anyhow::Result<()> {
        self.finish_applying()?;
        let sealed = std::mem::replace(&mut self.sealed, empty_layers(self.names.len()));
        let changes = Arc::new(sealed);
        let checkpoints = checkpoints.to_vec();
        for &(store, offset) in &checkpoints {
            self.changelog_reached(store, offset);
        }
        let written = self.writers.run({
            let (db, names) = (self.db.clone(), self.names.clone());
            let (changes, checkpoints) = (changes.clone(), checkpoints.clone());
            // The closure, and its share of the changes, is gone by the time
            // its result is sent: the changes come back to the task whole.
            move || write_changes(&db, &names, &changes, &checkpoints)
        });
        self.applying = Some(Applying {
            changes,
            checkpoints,
            written,
        });
        Ok(())
    }

    /// Waits for the write in flight, if any, and empties its layers into
    /// the read cache (what was just written is what will be read next),
    /// keeping them as spares.
    pub(super) fn finish_applying(&mut self) -> anyhow::Result<()> {
        let Some(applying) = self.applying.take() else {
            return Ok(());
        };
        let written = applying
            .written
            .recv()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the state writer stopped")));
        written.map_err(|e| e.context(format!("writing state to {}", self.path.display())))?;
        let mut changes =
            Arc::into_inner(applying.changes).expect("the writer has let go of the changes");
        for (store, layer) in changes.iter_mut().enumerate() {
            for (key, change) in layer.drain() {
                self.cache.insert(store, key, change.into_sealed());
            }
        }
        self.spare = Some(changes);
        Ok(())
    }

    /// Drops every uncommitted change, sealed or not: the task is back at
    /// its last commit, which is in RocksDB once this returns.
    pub fn discard_uncommitted(&mut self) -> anyhow::Result<()> {
        self.overlay.iter_mut().for_each(Changes::clear);
        self.sealed.iter_mut().for_each(Changes::clear);
        self.finish_applying()
    }

    /// Whether any store has changes not yet sealed for a commit.
    pub fn has_uncommitted(&self) -> bool {
        self.overlay.iter().any(|overlay| !overlay.is_empty())
    }

    /// The last changelog offset applied locally for `store` (or being
    /// applied), if any.
    pub fn checkpoint(&self, store: StoreIndex) -> anyhow::Result<Option<i64>> {
        let mut applying = self.applying.iter().flat_map(|a| &a.checkpoints);
        if let Some((_, offset)) = applying.find(|(s, _)| *s == store) {
            return Ok(Some(*offset));
        }
        let family = self.db.cf_handle(CHECKPOINTS).expect("checkpoint family");
        let value = self
            .db
            .get_pinned_cf(family, self.names[store].as_bytes())?;
        Ok(value.and_then(|bytes| bytes.as_ref().try_into().ok().map(i64::from_be_bytes)))
    }

    /// An empty batch of restored changelog records for this store.
    pub fn restore_batch(&self) -> RestoreBatch {
        RestoreBatch::new(self.names.len())
    }

    /// Adds a changelog record of `store` at `offset` to `batch`: a put, or
    /// a deletion for a tombstone (no value).
    pub fn stage_restored(
        &self,
        batch: &mut RestoreBatch,
        store: StoreIndex,
        offset: i64,
        key: &[u8],
        value: Option<&[u8]>,
    ) {
        batch.push(store, key, value);
        batch.checkpoints[store] = Some(offset);
    }

    /// Writes restored changelog records straight to RocksDB, in one write
    /// with the offsets they reach, and waits for it. Used only while the
    /// task is restoring (nothing uncommitted).
    pub fn write_restored(&mut self, restored: RestoreBatch) -> anyhow::Result<()> {
        self.write_restored_behind(restored)?;
        self.finish_applying()?;
        self.cache.clear();
        Ok(())
    }

    /// Hands restored changelog records to a state writer, which writes
    /// them like [`Self::write_restored`] while the caller reads the next
    /// ones; the call after waits for it. The last batch of a restore goes
    /// through [`Self::write_restored`].
    pub fn write_restored_behind(&mut self, mut restored: RestoreBatch) -> anyhow::Result<()> {
        self.finish_applying()?;
        // Whatever was read before these records is older than they are,
        // and key filters do not know their keys: built again at the open.
        self.cache.clear();
        self.key_filters
            .iter_mut()
            .for_each(|filter| *filter = None);
        let checkpoints: Vec<(StoreIndex, i64)> = (restored.checkpoints.iter().enumerate())
            .filter_map(|(store, offset)| offset.map(|offset| (store, offset)))
            .collect();
        let written = self.writers.run({
            let (db, names) = (self.db.clone(), self.names.clone());
            let checkpoints = checkpoints.clone();
            move || {
                let families: Vec<_> = names.iter().map(|name| family(&db, name)).collect();
                let mut batch = WriteBatch::default();
                for (store, key, value) in restored.in_key_order() {
                    match value {
                        Some(value) => batch.put_cf(families[store], key, value),
                        None => batch.delete_cf(families[store], key),
                    }
                }
                put_checkpoints(&mut batch, &db, &names, checkpoints);
                Ok(db.write(batch)?)
            }
        });
        self.applying = Some(Applying {
            changes: Arc::new(empty_layers(self.names.len())),
            checkpoints,
            written,
        });
        Ok(())
    }
}

impl Drop for TaskStore {
    /// Waits for the write in flight, so that the database is closed (and
    /// unlocked for its next owner) when the store is.
    fn drop(&mut self) {
        if let Err(error) = self.finish_applying() {
            tracing::error!(error = format!("{error:#}"), "the last commit's state was not written locally; it is restored from the changelog on the next start");
        }
    }
}

/// Writes a commit's `changes` to RocksDB in one batch, with the changelog
/// offsets they reach, so that local state and its checkpoints move together.
fn write_changes(
    db: &DB,
    names: &[String],
    changes: &[Changes],
    checkpoints: &[(StoreIndex, i64)],
) -> anyhow::Result<()> {
    let mut batch = WriteBatch::default();
    for (store, changes) in changes.iter().enumerate() {
        let family = family(db, &names[store]);
        // In key order: RocksDB's memtable resumes each insert's search
        // where the last one ended, so sorted inserts search less (measured
        // on the sessionizer's profile).
        for (key, change) in changes.in_key_order() {
            match change.sealed() {
                Some(value) => batch.put_cf(family, key, value),
                None => batch.delete_cf(family, key),
            }
        }
    }
    put_checkpoints(&mut batch, db, names, checkpoints.iter().copied());
    Ok(db.write(batch)?)
}

/// Adds to `batch` the changelog offset each store reaches with it.
pub(super) fn put_checkpoints(
    batch: &mut WriteBatch,
    db: &DB,
    names: &[String],
    reached: impl IntoIterator<Item = (StoreIndex, i64)>,
) {
    let checkpoint_family = family(db, CHECKPOINTS);
    for (store, offset) in reached {
        batch.put_cf(
            checkpoint_family,
            names[store].as_bytes(),
            offset.to_be_bytes(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::store::tests::{temp_store, temp_store_with};
    use crate::state::store::StateResources;

    #[test]
    fn a_commit_is_read_from_memory_until_its_write_is_done() {
        let resources = StateResources::new(8 << 20, 1);
        let (mut store, dir) = temp_store_with(&["a"], &resources);
        let in_rocksdb =
            |store: &TaskStore, key: &[u8]| store.db.get_cf(store.family(0), key).unwrap();
        // The only writer is busy until told: the commit's write waits.
        let (release, busy) = std::sync::mpsc::channel::<()>();
        let _busy = resources.writers.run(move || busy.recv());
        store.put(0, b"k".to_vec(), b"1".to_vec());
        store.seal().unwrap();
        store.apply_sealed(&[(0, 7)]).unwrap();
        assert_eq!(in_rocksdb(&store, b"k"), None, "not written yet");
        assert_eq!(
            store.read(0, b"k", |v| v.to_vec()).unwrap(),
            Some(b"1".to_vec())
        );
        assert_eq!(store.checkpoint(0).unwrap(), Some(7));
        release.send(()).unwrap();
        // The next seal waits for the write.
        store.put(0, b"k".to_vec(), b"2".to_vec());
        store.seal().unwrap();
        assert_eq!(in_rocksdb(&store, b"k"), Some(b"1".to_vec()));
        assert_eq!(store.checkpoint(0).unwrap(), Some(7));
        // So does a rollback, which keeps what is committed.
        store.apply_sealed(&[(0, 8)]).unwrap();
        store.put(0, b"k".to_vec(), b"3".to_vec());
        store.discard_uncommitted().unwrap();
        assert_eq!(in_rocksdb(&store, b"k"), Some(b"2".to_vec()));
        assert_eq!(
            store.read(0, b"k", |v| v.to_vec()).unwrap(),
            Some(b"2".to_vec())
        );
        // Closing waits too: a write in flight is in the database reopened.
        store.put(0, b"k".to_vec(), b"4".to_vec());
        store.seal().unwrap();
        store.apply_sealed(&[(0, 9)]).unwrap();
        drop(store);
        let mut reopened = TaskStore::open(&dir, &["a".to_string()], &resources).unwrap();
        assert_eq!(
            reopened.read(0, b"k", |v| v.to_vec()).unwrap(),
            Some(b"4".to_vec())
        );
        assert_eq!(reopened.checkpoint(0).unwrap(), Some(9));
        drop(reopened);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_key_created_and_deleted_between_two_seals_leaves_no_tombstone() {
        let (mut store, dir) = temp_store(&["a"]);
        for key in [&b"committed"[..], b"committed-unread"] {
            store.update(0, key, |slot| *slot = Some(1_u32)).unwrap();
        }
        store.seal().unwrap();
        store.apply_sealed(&[(0, 1)]).unwrap();
        drop(store);
        // Reopened, so the read cache knows nothing of the committed keys.
        let resources = StateResources::new(8 << 20, 1);
        let mut store = TaskStore::open(&dir, &["a".to_string()], &resources).unwrap();
        // Read as absent, created, deleted: nothing to tell RocksDB.
        let created = store.update(0, b"new", |slot: &mut Option<u32>| {
            assert!(slot.is_none());
            *slot = Some(1);
        });
        created.unwrap();
        store.update(0, b"new", Option::<u32>::take).unwrap();
        // Written without a read (the processor knew it was new), deleted:
        // RocksDB's filters say it was never committed.
        store.put(0, b"new-unread".to_vec(), b"1".to_vec());
        store.delete(0, b"new-unread".to_vec());
        // Committed, then deleted, read first or not: a tombstone.
        store.update(0, b"committed", Option::<u32>::take).unwrap();
        store.delete(0, b"committed-unread".to_vec());
        store.seal().unwrap();
        let mut sealed: Vec<(Vec<u8>, Option<Vec<u8>>)> = (store.sealed(0))
            .map(|(key, value)| (key.to_vec(), value.map(<[u8]>::to_vec)))
            .collect();
        sealed.sort();
        assert_eq!(
            sealed,
            [
                (b"committed".to_vec(), None),
                (b"committed-unread".to_vec(), None)
            ]
        );
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_restored_batch_leaves_each_key_as_its_last_changelog_record_says() {
        let (mut store, dir) = temp_store(&["a", "b"]);
        store.put(0, b"gone".to_vec(), b"old".to_vec());
        store.seal().unwrap();
        store.apply_sealed(&[(0, 1)]).unwrap();
        let mut batch = store.restore_batch();
        let records: [(StoreIndex, &[u8], _); 7] = [
            (0, b"k2", Some(&b"first"[..])),
            (1, b"k1", Some(b"in b")),
            (0, b"k1", Some(b"one")),
            (0, b"gone", None),
            (0, b"k2", Some(b"second")),
            (0, b"k3", Some(b"put")),
            (0, b"k3", None),
        ];
        for (offset, (store_index, key, value)) in records.into_iter().enumerate() {
            store.stage_restored(&mut batch, store_index, 10 + offset as i64, key, value);
        }
        assert_eq!(batch.records(), 7);
        store.write_restored(batch).unwrap();
        let mut read = |store_index: StoreIndex, key: &[u8]| {
            store.read(store_index, key, |v| v.to_vec()).unwrap()
        };
        assert_eq!(read(0, b"k1"), Some(b"one".to_vec()));
        assert_eq!(
            read(0, b"k2"),
            Some(b"second".to_vec()),
            "the later record wins"
        );
        assert_eq!(read(0, b"k3"), None, "a tombstone after a put deletes");
        assert_eq!(read(0, b"gone"), None);
        assert_eq!(read(1, b"k1"), Some(b"in b".to_vec()));
        assert_eq!(store.checkpoint(0).unwrap(), Some(16));
        assert_eq!(store.checkpoint(1).unwrap(), Some(11));
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn uncommitted_layers_shadow_rocksdb_until_applied_or_discarded() {
        let (mut store, dir) = temp_store(&["a"]);
        store.put(0, b"k".to_vec(), b"1".to_vec());
        store.seal().unwrap();
        store.apply_sealed(&[(0, 7)]).unwrap();
        store.put(0, b"k".to_vec(), b"2".to_vec());
        assert_eq!(
            store.read(0, b"k", |v| v.to_vec()).unwrap(),
            Some(b"2".to_vec())
        );
        store.seal().unwrap();
        store.put(0, b"k".to_vec(), b"3".to_vec());
        assert_eq!(
            store.read(0, b"k", |v| v.to_vec()).unwrap(),
            Some(b"3".to_vec()),
            "changes after the seal shadow the sealed ones"
        );
        store.discard_uncommitted().unwrap();
        assert_eq!(
            store.read(0, b"k", |v| v.to_vec()).unwrap(),
            Some(b"1".to_vec())
        );
        store.delete(0, b"k".to_vec());
        assert_eq!(store.read(0, b"k", |v| v.to_vec()).unwrap(), None);
        assert_eq!(store.checkpoint(0).unwrap(), Some(7));
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
