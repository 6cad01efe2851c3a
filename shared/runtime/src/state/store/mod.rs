//! One task's RocksDB database, with an overlay of uncommitted changes.
//!
//! Every named store is a column family. Writes made while processing go to
//! an in-memory overlay, never straight to RocksDB; at commit the runtime
//! produces the overlay to the changelog topics and, once the commit (or the
//! Kafka transaction) has succeeded, applies it to RocksDB in one `WriteBatch`
//! together with the changelog offsets it corresponds to. So local RocksDB only
//! ever holds committed state: rolling a task back is dropping the overlay, and
//! a restart only replays the changelog past the stored checkpoint (what KIP-892
//! is about in Kafka Streams).
//!
//! A commit seals the overlay and opens a fresh one: processing goes on
//! into the new overlay while the sealed changes are being committed. Once
//! committed, they are written to RocksDB by a state writer thread (see
//! [`StateResources`]) while processing goes on again: until that write is
//! done they stay readable as the applying layer. Reads see the overlay,
//! then the sealed layer, then the applying one, then RocksDB. Only one
//! commit is in flight and one written at a time, so three layers are
//! enough.
//!
//! A layer is a hash map until its store is first scanned, sorted from then
//! on (see [`super::layer`]). A value changed in place
//! ([`TaskStore::update`]) is kept decoded in the overlay and encoded once,
//! at the seal.
//!
//! Reads and writes are here; the commit path (seal, write to RocksDB,
//! rollback, restored records) is in `store/commit.rs`.

mod commit;
mod restoring;

use std::any::Any;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::codec::{decode_value, encode_value};
use super::format::{self, WriteFormat};
use super::key_filter::KeyFilter;
use super::layer::Layer;
use super::open_stores::{Registration, StoreRole};
use super::read_cache::ReadCache;
pub(crate) use super::resources::ingested_file_options;
use super::resources::MemoryShares;
pub use super::resources::StateResources;
pub use super::restore_batch::RestoreBatch;
use super::StoreIndex;
use crate::pool::WorkerPool;
use commit::Applying;
pub use restoring::Restoring;

use rocksdb::{ColumnFamilyDescriptor, Direction, IteratorMode, ReadOptions, DB};

/// Column family holding, per store, the last changelog offset applied locally.
pub(crate) const CHECKPOINTS: &str = "__checkpoints";
/// The column family of the timers beyond the task's memory budget
/// ([`crate::timers::TimerSpill`]): not state, so no changelog.
pub(crate) const SPILLED_TIMERS: &str = "__spilled_timers";
/// RocksDB's own column family, which every database has.
const DEFAULT_FAMILY: &str = "default";

/// Changes of one store: since the last seal (the overlay), or sealed for
/// the commit in flight (no value decoded any more).
type Changes = Layer<Change>;

/// One uncommitted change of a key.
enum Change {
    Put(Vec<u8>),
    /// A value changed in place ([`TaskStore::update`]), kept decoded until
    /// the seal encodes it: a key updated by many records between two
    /// commits (a window-aggregator group, a busy session) is decoded once
    /// and encoded once per commit, not once per record.
    Decoded(Box<dyn StateValue>),
    Deleted,
}

impl Change {
    /// Calls `read` with the changed value's bytes; `None` for a deletion.
    fn read<R>(&self, read: impl FnOnce(&[u8]) -> R) -> anyhow::Result<Option<R>> {
        Ok(match self {
            Change::Put(bytes) => Some(read(bytes)),
            Change::Decoded(value) => Some(read(&value.encode()?)),
            Change::Deleted => None,
        })
    }

    /// A sealed change's bytes; `None` for a deletion.
    fn sealed(&self) -> Option<&[u8]> {
        match self {
            Change::Put(bytes) => Some(bytes),
            Change::Deleted => None,
            Change::Decoded(_) => unreachable!("the seal encodes every decoded value"),
        }
    }

    fn into_sealed(self) -> Option<Vec<u8>> {
        match self {
            Change::Put(bytes) => Some(bytes),
            Change::Deleted => None,
            Change::Decoded(_) => unreachable!("the seal encodes every decoded value"),
        }
    }
}

/// A decoded state value: encodable at the seal, and recoverable as its type.
pub trait StateValue: Any + Send + Sync {
    fn encode(&self) -> anyhow::Result<Vec<u8>>;
    fn as_any(&self) -> &dyn Any;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<T: Serialize + Any + Send + Sync> StateValue for T {
    fn encode(&self) -> anyhow::Result<Vec<u8>> {
        encode_value(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// The state of one task: named stores in one RocksDB, plus the overlay.
pub struct TaskStore {
    db: Arc<DB>,
    path: PathBuf,
    names: Arc<[String]>,
    /// Changes since the last seal, per store.
    overlay: Vec<Changes>,
    /// Changes of the commit in flight, per store.
    sealed: Vec<Changes>,
    /// Committed changes being written to RocksDB.
    applying: Option<Applying>,
    /// The layers of the last write, emptied, for the next overlay (they
    /// keep their capacity: two sets of layers take turns).
    spare: Option<Vec<Changes>>,
    cache: ReadCache,
    /// Per store, a filter of its keys if it has one ([`Self::filter_keys`]).
    key_filters: Vec<Option<KeyFilter>>,
    shares: Arc<MemoryShares>,
    writers: Arc<WorkerPool>,
    /// Its place among the stores queries read.
    registration: Registration,
    /// The state format its changes are written in.
    write_format: WriteFormat,
    /// The format its directory's marker says: raised when a restore or a
    /// standby applies a changelog record of a newer one.
    marked_format: u8,
}

/// Whether opening a database failed because another handle holds its
/// `LOCK` file (RocksDB says "lock hold by current process" within one
/// process, "While lock file" across processes; both name the file).
fn is_locked(error: &anyhow::Error) -> bool {
    error.to_string().contains("/LOCK:")
}

impl TaskStore {
    /// Opens (or creates) the database at `path` with one column family per
    /// store. State of a format this build cannot read is refused before
    /// RocksDB touches it; an older one is migrated (see [`format`](mod@format)).
    pub fn open(path: &Path, names: &[String], resources: &StateResources) -> anyhow::Result<Self> {
        let stored_format = format::check_task_dir(path)?;
        std::fs::create_dir_all(path).map_err(|e| {
            anyhow::anyhow!("cannot create state directory {}: {e}", path.display())
        })?;
        let options = resources.options();
        // RocksDB opens a database only with all its column families. One
        // that is no longer wanted (the timer store of a processor that now
        // derives its timers from state) is opened, then dropped.
        let existing = DB::list_cf(&options, path).unwrap_or_default();
        let unwanted: Vec<&String> = existing
            .iter()
            .filter(|name| {
                name.as_str() != DEFAULT_FAMILY
                    && name.as_str() != CHECKPOINTS
                    && name.as_str() != SPILLED_TIMERS
                    && !names.contains(name)
            })
            .collect();
        let families = names
            .iter()
            .map(String::as_str)
            .chain([CHECKPOINTS, SPILLED_TIMERS])
            .chain(unwanted.iter().map(|name| name.as_str()))
            .map(|name| ColumnFamilyDescriptor::new(name, options.clone()));
        let mut db = DB::open_cf_descriptors(&options, path, families)
            .map_err(|e| anyhow::anyhow!("cannot open state store {}: {e}", path.display()))?;
        // Migrated with every column family open, the unwanted ones too.
        let marked_format = format::settle(&db, path, stored_format, resources.write_format)?;
        for name in unwanted {
            let checkpoint_family = db.cf_handle(CHECKPOINTS).expect("checkpoint family");
            db.delete_cf(checkpoint_family, name.as_bytes())?;
            db.drop_cf(name)?;
            tracing::info!(path = %path.display(), store = %name, "dropped a store no longer used");
        }
        let mut store = Self::with_db(Arc::new(db), path, names, resources);
        store.marked_format = marked_format;
        Ok(store)
    }

    /// Opens like [`TaskStore::open`], or `None` while another handle (a
    /// thread of this process, or another process) holds the database.
    ///
    /// A task's directory is the same on every processing thread of the
    /// process (`task-<p>`), so a task that moves from one thread to another
    /// keeps its local state. The thread that had it closes it a little
    /// after the group hands it over (at its own assignment, or later if it
    /// lost it without a revocation): meanwhile RocksDB refuses the second
    /// handle, and the task's new owner tries again.
    pub fn try_open(
        path: &Path,
        names: &[String],
        resources: &StateResources,
    ) -> anyhow::Result<Option<Self>> {
        match Self::open(path, names, resources) {
            Err(error) if is_locked(&error) => Ok(None),
            result => result.map(Some),
        }
    }

    fn with_db(db: Arc<DB>, path: &Path, names: &[String], resources: &StateResources) -> Self {
        let names: Arc<[String]> = names.into();
        let registration = resources.open_stores.register(path, &db, &names);
        TaskStore {
            db,
            path: path.to_path_buf(),
            registration,
            overlay: empty_layers(names.len()),
            sealed: empty_layers(names.len()),
            applying: None,
            spare: None,
            cache: ReadCache::new(names.len(), resources.shares.clone()),
            key_filters: (0..names.len()).map(|_| None).collect(),
            shares: resources.shares.clone(),
            writers: resources.writers.clone(),
            names,
            write_format: resources.write_format,
            marked_format: resources.write_format.number(),
        }
    }

    /// The state format this store's changes are written in.
    pub fn write_format(&self) -> WriteFormat {
        self.write_format
    }

    /// Notes that a changelog record of `format` is about to be applied:
    /// a newer format than the directory's marker says raises the marker
    /// first, so that a release that cannot read the record refuses the
    /// directory rather than misread it.
    pub fn applying_format(&mut self, format: u8) -> anyhow::Result<()> {
        if format > self.marked_format {
            format::write_marker(&self.path, format)?;
            self.marked_format = format;
        }
        Ok(())
    }

    /// Makes the store answer queries as `role` from now on.
    pub fn serve_queries_as(&self, role: StoreRole) {
        self.registration.entry.set_role(role);
    }

    /// Tells queries that `store`'s changelog has reached `offset` (their
    /// lag is counted from it).
    pub fn changelog_reached(&self, store: StoreIndex, offset: i64) {
        self.registration.entry.set_known_end(store, offset);
    }

    /// This task's share of the memory for timers, less its key filters.
    pub fn timer_budget(&self) -> usize {
        self.timer_share().saturating_sub(self.key_filter_bytes())
    }

    fn timer_share(&self) -> usize {
        self.shares.per_task(self.shares.timer_bytes)
    }

    fn key_filter_bytes(&self) -> usize {
        self.key_filters
            .iter()
            .flatten()
            .map(KeyFilter::bytes)
            .sum()
    }

    /// Keeps a filter of `store`'s keys in memory from now on, which
    /// answers reads of keys it does not hold without RocksDB
    /// ([`super::key_filter`]); no-op if it has one. Reads every key of
    /// the store. The task's key filters may take up to half its share of
    /// the timers' memory; a filter that would not fit is not kept, and
    /// the store is read as without one.
    pub fn filter_keys(&mut self, store: StoreIndex) -> anyhow::Result<()> {
        if self.key_filters[store].is_none() {
            self.build_key_filter(store)?;
        }
        Ok(())
    }

    /// Builds `store`'s key filter from every key it holds, committed or not.
    fn build_key_filter(&mut self, store: StoreIndex) -> anyhow::Result<()> {
        self.finish_applying()?;
        self.key_filters[store] = None;
        let room = (self.timer_share() / 2).saturating_sub(self.key_filter_bytes());
        let too_many = |keys: usize| KeyFilter::bytes_for(keys) > room;
        // RocksDB's estimate spares the scan of a store far too large.
        let estimate = usize::try_from(self.estimated_keys(store)).unwrap_or(usize::MAX);
        if too_many(estimate / 2) {
            return self.no_key_filter(store, estimate);
        }
        let mut hashes = Vec::new();
        let mut iterator = self.db.raw_iterator_cf(self.family(store));
        iterator.seek_to_first();
        while let Some(key) = iterator.key() {
            hashes.push(KeyFilter::hash(key));
            iterator.next();
        }
        iterator.status()?;
        for (key, _) in self.overlay[store].iter().chain(self.sealed[store].iter()) {
            hashes.push(KeyFilter::hash(key));
        }
        if too_many(hashes.len()) {
            return self.no_key_filter(store, hashes.len());
        }
        self.key_filters[store] = Some(KeyFilter::of(&hashes));
        Ok(())
    }

    fn no_key_filter(&self, store: StoreIndex, keys: usize) -> anyhow::Result<()> {
        tracing::debug!(
            path = %self.path.display(),
            store = %self.names[store],
            keys,
            "no key filter: it would not fit in half the task's memory for timers"
        );
        Ok(())
    }

    /// Notes in `store`'s key filter, if it has one, that `key` may now
    /// have a value.
    fn may_now_hold(&mut self, store: StoreIndex, key: &[u8]) {
        if let Some(filter) = &mut self.key_filters[store] {
            filter.insert(key);
        }
    }

    /// The task's database, for the timers spilled into its
    /// [`SPILLED_TIMERS`] family.
    pub(crate) fn database(&self) -> Arc<DB> {
        self.db.clone()
    }

    /// Forgets every spilled timer (the queue they belonged to is gone).
    pub fn clear_spilled_timers(&self) -> anyhow::Result<()> {
        let family = family(&self.db, SPILLED_TIMERS);
        let mut options = rocksdb::WriteOptions::default();
        options.disable_wal(true);
        let mut batch = rocksdb::WriteBatch::default();
        batch.delete_range_cf(family, [0u8].as_slice(), [0xffu8].as_slice());
        Ok(self.db.write_opt(batch, &options)?)
    }

    /// The directory of this database.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The index of the store called `name`.
    pub fn index_of(&self, name: &str) -> Option<StoreIndex> {
        self.names.iter().position(|n| n == name)
    }

    /// The names of the stores, by index.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    fn family(&self, store: StoreIndex) -> &rocksdb::ColumnFamily {
        family(&self.db, &self.names[store])
    }

    /// Calls `read` with the current value of `key`, if there is one:
    /// changes not in RocksDB yet first (newest layer first), then the read
    /// cache, then RocksDB.
    pub fn read<R>(
        &mut self,
        store: StoreIndex,
        key: &[u8],
        read: impl FnOnce(&[u8]) -> R,
    ) -> anyhow::Result<Option<R>> {
        match self.overlay[store].get(key) {
            Some(change) => change.read(read),
            None => self.read_committed_or_sealed(store, key, read),
        }
    }

    /// [`Self::read`] below the current overlay: the sealed changes, those
    /// being written, then the read cache, then RocksDB.
    fn read_committed_or_sealed<R>(
        &mut self,
        store: StoreIndex,
        key: &[u8],
        read: impl FnOnce(&[u8]) -> R,
    ) -> anyhow::Result<Option<R>> {
        if let Some(change) = self.sealed[store].get(key) {
            return Ok(change.sealed().map(read));
        }
        if let Some(change) = (self.applying.as_ref()).and_then(|a| a.changes[store].get(key)) {
            return Ok(change.sealed().map(read));
        }
        if let Some(cached) = self.cache.get(store, key) {
            return Ok(cached.as_deref().map(read));
        }
        if let Some(filter) = &self.key_filters[store] {
            if !filter.may_contain(key) {
                return Ok(None);
            }
        }
        let value = self
            .db
            .get_pinned_cf(self.family(store), key)?
            .map(|v| v.to_vec());
        let result = value.as_deref().map(read);
        self.cache.insert(store, key.to_vec(), value);
        Ok(result)
    }

    /// Sets `key` to `value` (uncommitted until sealed and applied).
    pub fn put(&mut self, store: StoreIndex, key: Vec<u8>, value: Vec<u8>) {
        self.may_now_hold(store, &key);
        self.overlay[store].insert(key, Change::Put(value));
    }

    /// Deletes `key` (uncommitted until sealed and applied).
    pub fn delete(&mut self, store: StoreIndex, key: Vec<u8>) {
        self.overlay[store].insert(key, Change::Deleted);
    }

    /// Calls `change` with `key`'s current value, decoded, to change in
    /// place (`None`: absent; set it to `None` to delete). The result stays
    /// decoded in the overlay until the seal; a value already decoded there
    /// is not decoded again.
    pub fn update<T, R>(
        &mut self,
        store: StoreIndex,
        key: &[u8],
        change: impl FnOnce(&mut Option<T>) -> R,
    ) -> anyhow::Result<R>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        self.update_reading(store, key, true, change)
    }

    /// [`Self::update`] of a key its caller knows to hold no value before
    /// the changes since the last seal: committed state is not read.
    pub fn update_new<T, R>(
        &mut self,
        store: StoreIndex,
        key: &[u8],
        change: impl FnOnce(&mut Option<T>) -> R,
    ) -> anyhow::Result<R>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        self.update_reading(store, key, false, change)
    }

    fn update_reading<T, R>(
        &mut self,
        store: StoreIndex,
        key: &[u8],
        read_committed: bool,
        change: impl FnOnce(&mut Option<T>) -> R,
    ) -> anyhow::Result<R>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        if let Some(slot) = self.overlay[store].get_mut(key) {
            let was_deleted = matches!(slot, Change::Deleted);
            // An error leaves the slot as it was.
            let mut value = match slot {
                Change::Put(bytes) => Some(decode_value::<T>(bytes)?),
                Change::Deleted => None,
                Change::Decoded(held) if !held.as_any().is::<T>() => {
                    anyhow::bail!("a state value updated as a type it was not written as")
                }
                Change::Decoded(_) => match std::mem::replace(slot, Change::Deleted) {
                    Change::Decoded(held) => held.into_any().downcast::<T>().ok().map(|v| *v),
                    Change::Put(_) | Change::Deleted => unreachable!("matched as decoded"),
                },
            };
            let result = change(&mut value);
            let holds = value.is_some();
            *slot = value.map_or(Change::Deleted, |value| Change::Decoded(Box::new(value)));
            if was_deleted && holds {
                self.may_now_hold(store, key);
            }
            return Ok(result);
        }
        let mut value = if read_committed {
            (self.read_committed_or_sealed(store, key, decode_value::<T>)?).transpose()?
        } else {
            None
        };
        let existed = value.is_some();
        let result = change(&mut value);
        match value {
            Some(value) => {
                if !existed {
                    self.may_now_hold(store, key);
                }
                self.overlay[store].insert(key.to_vec(), Change::Decoded(Box::new(value)));
            }
            None if existed => {
                self.overlay[store].insert(key.to_vec(), Change::Deleted);
            }
            None => {}
        }
        Ok(result)
    }

    /// All entries whose key starts with `prefix`, in key order, uncommitted
    /// changes included. The store's layers are sorted for good. Waits for
    /// the write in flight, if any: a scan reads RocksDB.
    pub fn scan_prefix(
        &mut self,
        store: StoreIndex,
        prefix: &[u8],
    ) -> anyhow::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.finish_applying()?;
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        // The upper bound lets RocksDB stop at the prefix's end instead of
        // stepping over the tombstones of every deleted key after it.
        let mut options = ReadOptions::default();
        if let Some(bound) = prefix_end(prefix) {
            options.set_iterate_upper_bound(bound);
        }
        let iterator = self.db.iterator_cf_opt(
            self.family(store),
            options,
            IteratorMode::From(prefix, Direction::Forward),
        );
        for entry in iterator {
            let (key, value) = entry?;
            if !key.starts_with(prefix) {
                break;
            }
            merged.insert(key.into_vec(), value.into_vec());
        }
        self.sealed[store].sort();
        self.overlay[store].sort();
        for (key, change) in self.sealed[store].prefixed(prefix) {
            match change.sealed() {
                Some(value) => merged.insert(key.clone(), value.to_vec()),
                None => merged.remove(key),
            };
        }
        for (key, change) in self.overlay[store].prefixed(prefix) {
            match change {
                Change::Put(value) => merged.insert(key.clone(), value.clone()),
                Change::Decoded(value) => merged.insert(key.clone(), value.encode()?),
                Change::Deleted => merged.remove(key),
            };
        }
        Ok(merged.into_iter().collect())
    }

    /// Calls `visit` with every committed entry of `store`, in key order,
    /// borrowing keys and values from RocksDB (no copies). For loading a
    /// task's in-memory indexes when it opens, before anything is
    /// uncommitted.
    pub fn for_each_committed(
        &self,
        store: StoreIndex,
        mut visit: impl FnMut(&[u8], &[u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        debug_assert!(self.overlay[store].is_empty() && self.sealed[store].is_empty());
        debug_assert!(self.applying.is_none());
        let mut iterator = self.db.raw_iterator_cf(self.family(store));
        iterator.seek_to_first();
        while let (Some(key), Some(value)) = (iterator.key(), iterator.value()) {
            visit(key, value)?;
            iterator.next();
        }
        iterator.status()?;
        Ok(())
    }

    /// Calls `visit` with up to `limit` committed entries of `store` in key
    /// order, from the first key after `after` (from the first key without
    /// it), and returns the last key visited if that made `limit`: `None`
    /// when the store has no more. Reads RocksDB alone while processing goes on, so what is not
    /// written to it yet (changes since the last commit, the commit in
    /// flight and its write) is not seen: for a sweep over state that
    /// comes round again, which reads each key's current value before it
    /// changes it.
    pub fn committed_page(
        &self,
        store: StoreIndex,
        after: Option<&[u8]>,
        limit: usize,
        mut visit: impl FnMut(&[u8], &[u8]) -> anyhow::Result<()>,
    ) -> anyhow::Result<Option<Vec<u8>>> {
        let mut iterator = self.db.raw_iterator_cf(self.family(store));
        match after {
            Some(after) => {
                iterator.seek(after);
                if iterator.key() == Some(after) {
                    iterator.next();
                }
            }
            None => iterator.seek_to_first(),
        }
        let mut last = None;
        let mut visited = 0;
        while visited < limit {
            let (Some(key), Some(value)) = (iterator.key(), iterator.value()) else {
                break;
            };
            visit(key, value)?;
            visited += 1;
            last = Some(key.to_vec());
            iterator.next();
        }
        iterator.status()?;
        Ok(last.filter(|_| visited == limit))
    }

    /// Estimated number of committed keys in `store`.
    pub fn estimated_keys(&self, store: StoreIndex) -> u64 {
        self.db
            .property_int_value_cf(self.family(store), "rocksdb.estimate-num-keys")
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// What RocksDB holds and owes for this task, across all stores, as
    /// its properties estimate it.
    pub fn rocksdb_usage(&self) -> RocksdbUsage {
        let property = |family, name| {
            self.db
                .property_int_value_cf(family, name)
                .ok()
                .flatten()
                .unwrap_or(0)
        };
        let mut usage = RocksdbUsage::default();
        for store in 0..self.names.len() {
            let family = self.family(store);
            usage.live_data += property(family, "rocksdb.estimate-live-data-size");
            usage.memtables += property(family, "rocksdb.cur-size-all-mem-tables");
            usage.live_sst_files += property(family, "rocksdb.live-sst-files-size");
            usage.pending_compaction +=
                property(family, "rocksdb.estimate-pending-compaction-bytes");
        }
        usage
    }
}

/// A task store's RocksDB bytes (see [`TaskStore::rocksdb_usage`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RocksdbUsage {
    /// Live data in its SST files, without what compaction will drop.
    pub live_data: u64,
    /// Its memtables, charged to the block cache.
    pub memtables: u64,
    /// Its SST files on disk, live ones only.
    pub live_sst_files: u64,
    /// What compaction estimates it still has to rewrite.
    pub pending_compaction: u64,
}

impl RocksdbUsage {
    /// Estimated bytes of committed state: live data plus memtables.
    pub fn state_bytes(&self) -> u64 {
        self.live_data + self.memtables
    }
}

fn empty_layers(stores: usize) -> Vec<Changes> {
    (0..stores).map(|_| Changes::default()).collect()
}

fn family<'db>(db: &'db DB, name: &str) -> &'db rocksdb::ColumnFamily {
    db.cf_handle(name).expect("every store has a column family")
}

/// The smallest key after every key that starts with `prefix`, if any.
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key_after_the_prefix() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 0xFF]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xFF, 0xFF]), None);
        assert_eq!(prefix_end(b""), None);
    }

    pub(crate) fn temp_store(names: &[&str]) -> (TaskStore, PathBuf) {
        temp_store_with(names, &StateResources::new(8 << 20, 1))
    }

    pub(super) fn temp_store_with(
        names: &[&str],
        resources: &StateResources,
    ) -> (TaskStore, PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "task-store-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let store = TaskStore::open(&dir, &names, resources).unwrap();
        (store, dir)
    }

    #[test]
    fn a_store_locked_by_another_handle_opens_once_that_one_is_closed() {
        let (store, dir) = temp_store(&["a"]);
        let names = store.names().to_vec();
        let resources = StateResources::new(8 << 20, 1);
        let refused = TaskStore::open(&dir, &names, &resources)
            .err()
            .expect("locked");
        assert!(is_locked(&refused), "{refused:#}");
        let locked = TaskStore::try_open(&dir, &names, &resources).unwrap();
        assert!(locked.is_none(), "not opened while another handle holds it");
        drop(store);
        let opened = TaskStore::try_open(&dir, &names, &resources).unwrap();
        assert!(opened.is_some(), "opened once that handle is closed");
        drop(opened);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_store_no_longer_declared_is_dropped_and_the_others_kept() {
        let (mut store, dir) = temp_store(&["kept", "gone"]);
        store.put(0, b"k".to_vec(), b"1".to_vec());
        store.put(1, b"k".to_vec(), b"2".to_vec());
        store.seal().unwrap();
        store.apply_sealed(&[(0, 7), (1, 9)]).unwrap();
        drop(store);
        let resources = StateResources::new(8 << 20, 1);
        let mut reopened = TaskStore::open(&dir, &["kept".to_string()], &resources).unwrap();
        assert_eq!(
            reopened.read(0, b"k", |v| v.to_vec()).unwrap(),
            Some(b"1".to_vec())
        );
        assert_eq!(reopened.checkpoint(0).unwrap(), Some(7));
        drop(reopened);
        let families = DB::list_cf(&resources.options(), &dir).unwrap();
        assert!(!families.contains(&"gone".to_string()), "{families:?}");
        let readded =
            TaskStore::open(&dir, &["kept".to_string(), "gone".to_string()], &resources).unwrap();
        assert_eq!(
            readded.checkpoint(1).unwrap(),
            None,
            "its checkpoint went too"
        );
        drop(readded);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_update_of_a_new_key_sees_the_changes_since_the_seal_and_not_committed_state() {
        let (mut store, dir) = temp_store(&["a"]);
        store.put(0, b"committed".to_vec(), encode_value(&1_u32).unwrap());
        store.seal().unwrap();
        store.apply_sealed(&[(0, 1)]).unwrap();
        let seen = |store: &mut TaskStore, key: &[u8]| {
            store
                .update_new(0, key, |slot: &mut Option<u32>| {
                    let seen = *slot;
                    *slot = Some(7);
                    seen
                })
                .unwrap()
        };
        // Committed state is not read: its value is overwritten unseen.
        assert_eq!(seen(&mut store, b"committed"), None);
        // Changes since the seal are: the value just written, and a
        // deletion as none.
        assert_eq!(seen(&mut store, b"committed"), Some(7));
        store.delete(0, b"deleted".to_vec());
        assert_eq!(seen(&mut store, b"deleted"), None);
        let read = |store: &mut TaskStore, key: &[u8]| {
            (store.read(0, key, |bytes| decode_value::<u32>(bytes).unwrap())).unwrap()
        };
        assert_eq!(read(&mut store, b"committed"), Some(7));
        assert_eq!(read(&mut store, b"deleted"), Some(7));
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_key_filter_answers_reads_of_absent_keys_and_never_hides_a_present_one() {
        let (mut store, dir) = temp_store(&["a"]);
        let value = |n: u32| encode_value(&n).unwrap();
        let commit = |store: &mut TaskStore, offset: i64| {
            store.seal().unwrap();
            store.apply_sealed(&[(0, offset)]).unwrap();
            store.finish_applying().unwrap();
            // Reads go past the read cache.
            store.cache.clear();
        };
        let read = |store: &mut TaskStore, key: &[u8]| {
            (store.read(0, key, |bytes| decode_value::<u32>(bytes).unwrap())).unwrap()
        };
        store.put(0, b"committed".to_vec(), value(1));
        commit(&mut store, 1);
        store.filter_keys(0).unwrap();
        // A key written to RocksDB behind the filter's back is not read:
        // the filter answers for it.
        (store.db.put_cf(store.family(0), b"unknown", value(2))).unwrap();
        assert_eq!(read(&mut store, b"unknown"), None);
        assert_eq!(read(&mut store, b"committed"), Some(1));
        // A value given by a put, an update, or an update after a delete
        // is found, before the commit and after it.
        store.put(0, b"put".to_vec(), value(3));
        (store.update(0, b"updated", |slot: &mut Option<u32>| *slot = Some(4))).unwrap();
        store.delete(0, b"revived".to_vec());
        (store.update(0, b"revived", |slot: &mut Option<u32>| *slot = Some(5))).unwrap();
        let found = [(&b"put"[..], 3), (b"updated", 4), (b"revived", 5)];
        for (key, n) in found {
            assert_eq!(read(&mut store, key), Some(n));
        }
        commit(&mut store, 2);
        for (key, n) in found {
            assert_eq!(read(&mut store, key), Some(n));
        }
        // A rolled-back write leaves its key behind, harmlessly.
        store.put(0, b"rolled back".to_vec(), value(6));
        store.discard_uncommitted().unwrap();
        assert_eq!(read(&mut store, b"rolled back"), None);
        // More keys than it was sized for: built again, from the store,
        // which now finds the key written behind its back too.
        for n in 0..40_000_u32 {
            let key = format!("key {n}");
            (store.update(0, key.as_bytes(), |slot: &mut Option<u32>| *slot = Some(n))).unwrap();
            if n % 10_000 == 9_999 {
                commit(&mut store, 3 + i64::from(n));
            }
        }
        assert!((0..40_000_u32).all(|n| read(&mut store, format!("key {n}").as_bytes()) == Some(n)));
        assert_eq!(read(&mut store, b"unknown"), Some(2));
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_key_filter_that_would_not_fit_in_memory_is_not_kept() {
        // 64 KiB in all: 12 KiB for timers, too little for the smallest filter.
        let (mut store, dir) = temp_store_with(&["a"], &StateResources::new(64 << 10, 1));
        store.filter_keys(0).unwrap();
        assert!(store.key_filters[0].is_none());
        let timers = store.timer_budget();
        (store
            .db
            .put_cf(store.family(0), b"behind", encode_value(&1_u32).unwrap()))
        .unwrap();
        let read = store.read(0, b"behind", |bytes| decode_value::<u32>(bytes).unwrap());
        assert_eq!(read.unwrap(), Some(1));
        // Nothing was taken from the timers' share.
        assert_eq!(store.timer_budget(), timers);
        assert_eq!(timers, store.timer_share());
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn committed_pages_go_through_rocksdb_in_key_order_without_uncommitted_changes() {
        let (mut store, dir) = temp_store(&["a"]);
        for key in ["k3", "k1", "k5", "k2", "k4"] {
            store.put(0, key.as_bytes().to_vec(), key.as_bytes().to_vec());
        }
        store.seal().unwrap();
        store.apply_sealed(&[(0, 1)]).unwrap();
        // Not in RocksDB, and so not seen, until the state writer is done.
        store.finish_applying().unwrap();
        store.put(0, b"k0".to_vec(), b"uncommitted".to_vec());
        store.delete(0, b"k2".to_vec());
        let mut pages = Vec::new();
        let mut after = None;
        loop {
            let mut page = Vec::new();
            after = store
                .committed_page(0, after.as_deref(), 2, |key, value| {
                    assert_eq!(key, value);
                    page.push(String::from_utf8(key.to_vec())?);
                    Ok(())
                })
                .unwrap();
            pages.push(page);
            if after.is_none() {
                break;
            }
        }
        // The deletion and the new key are not committed yet: not seen.
        assert_eq!(pages, [vec!["k1", "k2"], vec!["k3", "k4"], vec!["k5"]]);
        // A key that is gone is passed from where it would be.
        store.seal().unwrap();
        store.apply_sealed(&[(0, 2)]).unwrap();
        store.finish_applying().unwrap();
        let mut seen = Vec::new();
        store
            .committed_page(0, Some(b"k2"), 10, |key, _| {
                seen.push(key.to_vec());
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, [b"k3".to_vec(), b"k4".to_vec(), b"k5".to_vec()]);
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn values_updated_in_place_read_scan_and_seal_like_written_ones() {
        let (mut store, dir) = temp_store(&["a"]);
        let encoded = |n: u32| encode_value(&n).unwrap();
        store.put(0, b"committed".to_vec(), encoded(1));
        store.seal().unwrap();
        store.apply_sealed(&[(0, 1)]).unwrap();
        // Absent, committed, and written as bytes: each changed in place.
        for (key, expected_before) in [(&b"new"[..], None), (b"committed", Some(1))] {
            let before = store
                .update(0, key, |slot: &mut Option<u32>| {
                    let before = *slot;
                    *slot = Some(before.unwrap_or(0) + 10);
                    before
                })
                .unwrap();
            assert_eq!(before, expected_before);
        }
        store.put(0, b"bytes".to_vec(), encoded(5));
        store
            .update(0, b"bytes", |slot: &mut Option<u32>| {
                *slot = slot.map(|n| n * 2)
            })
            .unwrap();
        // Updated again: no decoding in between, the same value goes on.
        store
            .update(0, b"new", |slot: &mut Option<u32>| {
                *slot = slot.map(|n| n + 1)
            })
            .unwrap();
        let read = |store: &mut TaskStore, key: &[u8]| {
            store
                .read(0, key, |bytes| decode_value::<u32>(bytes).unwrap())
                .unwrap()
        };
        assert_eq!(read(&mut store, b"new"), Some(11));
        assert_eq!(read(&mut store, b"committed"), Some(11));
        assert_eq!(read(&mut store, b"bytes"), Some(10));
        let scanned: Vec<(Vec<u8>, u32)> = store
            .scan_prefix(0, b"")
            .unwrap()
            .into_iter()
            .map(|(key, value)| (key, decode_value(&value).unwrap()))
            .collect();
        assert_eq!(
            scanned,
            [
                (b"bytes".to_vec(), 10),
                (b"committed".to_vec(), 11),
                (b"new".to_vec(), 11)
            ]
        );
        assert!(
            store
                .update(0, b"new", |slot: &mut Option<String>| slot.take())
                .is_err(),
            "another type is refused"
        );
        assert_eq!(read(&mut store, b"new"), Some(11), "and changes nothing");
        store.seal().unwrap();
        let sealed: Vec<(Vec<u8>, Option<u32>)> = store
            .sealed(0)
            .map(|(key, value)| (key.to_vec(), value.map(|v| decode_value(v).unwrap())))
            .collect();
        assert_eq!(
            sealed,
            [
                (b"bytes".to_vec(), Some(10)),
                (b"committed".to_vec(), Some(11)),
                (b"new".to_vec(), Some(11))
            ]
        );
        store.apply_sealed(&[(0, 2)]).unwrap();
        // Taking a value out deletes it; taking an absent one writes nothing.
        for key in [&b"committed"[..], b"never"] {
            store
                .update(0, key, |slot: &mut Option<u32>| slot.take())
                .unwrap();
        }
        store.seal().unwrap();
        let sealed: Vec<(Vec<u8>, Option<Vec<u8>>)> = store
            .sealed(0)
            .map(|(key, value)| (key.to_vec(), value.map(<[u8]>::to_vec)))
            .collect();
        assert_eq!(sealed, [(b"committed".to_vec(), None)]);
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn scans_merge_overlay_and_committed_entries_in_order() {
        let (mut store, dir) = temp_store(&["m"]);
        store.put(0, b"p1".to_vec(), b"a".to_vec());
        store.put(0, b"p3".to_vec(), b"c".to_vec());
        store.put(0, b"q1".to_vec(), b"x".to_vec());
        store.seal().unwrap();
        store.apply_sealed(&[]).unwrap();
        store.put(0, b"p2".to_vec(), b"b".to_vec());
        store.put(0, b"p4".to_vec(), b"d".to_vec());
        store.seal().unwrap();
        store.delete(0, b"p3".to_vec());
        store.delete(0, b"p4".to_vec());
        store.put(0, b"p5".to_vec(), b"e".to_vec());
        let keys: Vec<_> = store
            .scan_prefix(0, b"p")
            .unwrap()
            .into_iter()
            .map(|(k, _)| String::from_utf8(k).unwrap())
            .collect();
        assert_eq!(keys, ["p1", "p2", "p5"]);
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
