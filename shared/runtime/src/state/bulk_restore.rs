//! The restore of a task store that holds nothing yet (a task new to this
//! instance, or whose local state was lost): its changelogs are gathered in
//! [`SortedRuns`], one set per store, merged into an SST file per store
//! and ingested, with no memtable, write-ahead log or compaction on the way.
//!
//! Changelog records come in offset order, their keys at random; written
//! one by one, each costs a memtable insert at a random place, its
//! write-ahead log entry, and later its share of flushes and compactions,
//! which go on competing for the CPU after the task is ready. Here each
//! costs its share of a sort and two sequential passes.
//!
//! Nothing reaches the store before the end: a restore stopped by a signal
//! or a revocation ingests what it gathered, with its checkpoints, but one
//! cut short by a crash leaves the store empty, to be restored again.
//! Ingesting in parts to keep a crash's progress was measured and dropped:
//! each part after the first lands above the one before and is compacted
//! into it during the restore, which then ran no faster than in batches.

use std::path::Path;

use super::sorted_runs::SortedRuns;
use super::StoreIndex;

/// A bulk restore under way: each store's records so far, and the
/// changelog offset each store reaches.
pub struct BulkRestore {
    runs: Vec<SortedRuns>,
    pub(super) checkpoints: Vec<Option<i64>>,
}

impl BulkRestore {
    /// An empty restore of `stores` stores, whose runs are kept in
    /// directories of `task_dir` (emptied first, of a restore that did not
    /// finish, and removed with the runs).
    pub(super) fn in_dir(task_dir: &Path, stores: usize) -> anyhow::Result<Self> {
        let runs = (0..stores)
            .map(|store| SortedRuns::in_dir(task_dir.join(format!("restore-bulk-{store}"))))
            .collect::<anyhow::Result<_>>()?;
        Ok(BulkRestore {
            runs,
            checkpoints: vec![None; stores],
        })
    }

    /// Gathers the changelog record of `store` at `offset`: a put, or a
    /// deletion for a tombstone (no value).
    pub(super) fn push(
        &mut self,
        store: StoreIndex,
        offset: i64,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> anyhow::Result<()> {
        match value {
            Some(value) => self.runs[store].put(key, value)?,
            None => self.runs[store].delete(key)?,
        }
        self.checkpoints[store] = Some(offset);
        Ok(())
    }

    /// Each store's runs, by store index, to merge.
    pub(super) fn runs(&mut self) -> impl Iterator<Item = (StoreIndex, &mut SortedRuns)> {
        self.runs.iter_mut().enumerate()
    }
}
