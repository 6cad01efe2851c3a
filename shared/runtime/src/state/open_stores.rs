//! The task stores open in this process, as interactive queries see them
//! (see [`crate::query`]).
//!
//! Every [`TaskStore`](super::store::TaskStore) registers itself here when
//! it opens and leaves when it closes. A query reads the registered
//! database directly: RocksDB holds committed state only (uncommitted
//! changes live in the task's overlay), and each write carries the
//! changelog offsets it reaches, so one snapshot gives a value and the
//! position it reflects. The registry holds the database weakly: a query
//! never keeps a closed task's RocksDB open (and locked) for its next owner.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rocksdb::DB;

use super::StoreIndex;

/// What a registered task store is to queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreRole {
    /// Opened, not serving yet (being restored, or about to be).
    Opening = 0,
    /// The processing thread's task: up to date.
    Active = 1,
    /// A standby's warm copy: behind by its lag.
    Standby = 2,
}

/// One open task store.
pub struct OpenStore {
    db: Weak<DB>,
    names: Arc<[String]>,
    role: AtomicU8,
    /// Per store, the last changelog offset known to exist (committed by
    /// the active task, or seen at the changelog's end by a standby); -1
    /// when unknown. The lag of a query is measured against it.
    known_ends: Vec<AtomicI64>,
}

impl OpenStore {
    /// The database, unless it has closed.
    pub fn db(&self) -> Option<Arc<DB>> {
        self.db.upgrade()
    }

    /// The names of its stores, by index.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn role(&self) -> StoreRole {
        match self.role.load(Ordering::Acquire) {
            1 => StoreRole::Active,
            2 => StoreRole::Standby,
            _ => StoreRole::Opening,
        }
    }

    pub(crate) fn set_role(&self, role: StoreRole) {
        self.role.store(role as u8, Ordering::Release);
    }

    /// The last changelog offset of `store` known to exist, if any.
    pub fn known_end(&self, store: StoreIndex) -> Option<i64> {
        let end = self.known_ends[store].load(Ordering::Relaxed);
        (end >= 0).then_some(end)
    }

    pub(crate) fn set_known_end(&self, store: StoreIndex, offset: i64) {
        self.known_ends[store].fetch_max(offset, Ordering::Relaxed);
    }
}

/// Every open task store of the process, by task directory.
#[derive(Default)]
pub struct OpenStores {
    by_path: Mutex<HashMap<PathBuf, Arc<OpenStore>>>,
}

impl OpenStores {
    /// Registers the database of the task directory `path`, until the
    /// registration is dropped.
    pub(crate) fn register(
        self: &Arc<Self>,
        path: &Path,
        db: &Arc<DB>,
        names: &Arc<[String]>,
    ) -> Registration {
        let entry = Arc::new(OpenStore {
            db: Arc::downgrade(db),
            names: names.clone(),
            role: AtomicU8::new(StoreRole::Opening as u8),
            known_ends: names.iter().map(|_| AtomicI64::new(-1)).collect(),
        });
        (self.by_path.lock().unwrap()).insert(path.to_path_buf(), entry.clone());
        Registration {
            stores: self.clone(),
            path: path.to_path_buf(),
            entry,
        }
    }

    /// The store open for task directory `path`, if any.
    pub fn get(&self, path: &Path) -> Option<Arc<OpenStore>> {
        self.by_path.lock().unwrap().get(path).cloned()
    }
}

/// A task store's place in [`OpenStores`], given up when dropped.
pub(crate) struct Registration {
    stores: Arc<OpenStores>,
    path: PathBuf,
    pub(crate) entry: Arc<OpenStore>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut by_path = self.stores.by_path.lock().unwrap();
        // Unless the directory has been opened again since.
        if (by_path.get(&self.path)).is_some_and(|current| Arc::ptr_eq(current, &self.entry)) {
            by_path.remove(&self.path);
        }
    }
}
