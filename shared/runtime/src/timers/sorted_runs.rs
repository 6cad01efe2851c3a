//! Sorted runs: the writes of a bulk load of spilled timers, gathered in
//! memory, sorted and written to files a run at a time, then merged into
//! SST files that RocksDB ingests whole (see
//! [`TimerSpill`](super::TimerSpill)).
//!
//! A task that derives its timers from 10M keys in state spills nearly all
//! of them, in key order, not time order. Written one by one, every timer
//! costs two memtable inserts at random places (its entries by time and by
//! key) and, later, their compactions through the levels. Sorted runs cost
//! a sort and two sequential passes instead, and the ingested files need no
//! compaction.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use rocksdb::{Options, SstFileWriter};

/// The bytes of keys and values a run gathers before it is sorted and
/// written out: what a bulk load holds in memory beyond the timers' budget.
const RUN_BYTES: usize = 16 << 20;

/// The value length that marks a deletion in a run.
const DELETED: u8 = u8::MAX;

/// Writes gathered for a bulk load: the one in memory, and those written.
pub(super) struct SortedRuns {
    dir: PathBuf,
    /// Keys and values of the run in memory, back to back.
    data: Vec<u8>,
    entries: Vec<Entry>,
    /// The runs written, oldest first: a later one wins over an earlier one.
    written: Vec<PathBuf>,
}

/// One write of the run in memory, in `data`.
#[derive(Clone, Copy)]
struct Entry {
    start: u32,
    key_len: u32,
    /// The value's length, or [`DELETED`].
    value_len: u8,
}

impl SortedRuns {
    /// Empty runs kept in `dir`, which is emptied (of a load that did not
    /// finish) and removed again when the runs are dropped.
    pub(super) fn in_dir(dir: PathBuf) -> anyhow::Result<Self> {
        remove_dir(&dir)?;
        std::fs::create_dir_all(&dir)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
        Ok(SortedRuns {
            dir,
            data: Vec::new(),
            entries: Vec::new(),
            written: Vec::new(),
        })
    }

    /// Gathers a write of `value` (at most 254 bytes) under `key`.
    pub(super) fn put(&mut self, key: &[u8], value: &[u8]) -> anyhow::Result<()> {
        debug_assert!(value.len() < DELETED as usize);
        self.gather(key, value, value.len() as u8)
    }

    /// Gathers a deletion of `key`.
    pub(super) fn delete(&mut self, key: &[u8]) -> anyhow::Result<()> {
        self.gather(key, &[], DELETED)
    }

    fn gather(&mut self, key: &[u8], value: &[u8], value_len: u8) -> anyhow::Result<()> {
        if self.data.len() + key.len() + value.len() > RUN_BYTES && !self.entries.is_empty() {
            self.write_run()?;
        }
        self.entries.push(Entry {
            start: self.data.len() as u32,
            key_len: key.len() as u32,
            value_len,
        });
        self.data.extend_from_slice(key);
        self.data.extend_from_slice(value);
        Ok(())
    }

    fn key(&self, entry: &Entry) -> &[u8] {
        &self.data[entry.start as usize..][..entry.key_len as usize]
    }

    /// Calls `each` with every key that may have a value when the load
    /// ends (a key deleted since may be among them), in no order.
    pub(super) fn for_each_put(&self, each: &mut dyn FnMut(&[u8])) -> anyhow::Result<()> {
        for path in &self.written {
            let mut reader = RunReader::open(path)?;
            while let Some((key, value)) = reader.next()? {
                if value.is_some() {
                    each(&key);
                }
            }
        }
        for entry in self
            .entries
            .iter()
            .filter(|entry| entry.value_len != DELETED)
        {
            each(self.key(entry));
        }
        Ok(())
    }

    /// Sorts the run in memory by key (the last write of a key wins) and
    /// writes it to a file.
    fn write_run(&mut self) -> anyhow::Result<()> {
        let mut entries = std::mem::take(&mut self.entries);
        // Stable: the writes of one key stay in the order they came.
        entries.sort_by(|a, b| self.key(a).cmp(self.key(b)));
        let path = self.dir.join(format!("run-{:05}", self.written.len()));
        let file = File::create(&path)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
        let mut out = BufWriter::with_capacity(1 << 16, file);
        for (index, entry) in entries.iter().enumerate() {
            let superseded = entries
                .get(index + 1)
                .is_some_and(|next| self.key(next) == self.key(entry));
            if superseded {
                continue;
            }
            let key = self.key(entry);
            out.write_all(&(key.len() as u32).to_be_bytes())?;
            out.write_all(key)?;
            out.write_all(&[entry.value_len])?;
            if entry.value_len != DELETED {
                let value_start = entry.start as usize + key.len();
                out.write_all(&self.data[value_start..][..entry.value_len as usize])?;
            }
        }
        out.flush()?;
        self.written.push(path);
        self.data.clear();
        entries.clear();
        self.entries = entries;
        Ok(())
    }

    /// Merges the runs into SST files, one per distinct first `prefix`
    /// bytes of the keys (the files do not overlap), with `options`; returns
    /// their paths, to be ingested before the runs are dropped. A deletion
    /// leaves no entry: the load began on an empty store, so there is
    /// nothing older to hide.
    pub(super) fn merge_into_sst_files(
        &mut self,
        prefix: usize,
        options: &Options,
    ) -> anyhow::Result<Vec<PathBuf>> {
        if !self.entries.is_empty() {
            self.write_run()?;
        }
        let mut heads = BinaryHeap::new();
        let mut readers = Vec::with_capacity(self.written.len());
        for (run, path) in self.written.iter().enumerate() {
            let mut reader = RunReader::open(path)?;
            if let Some((key, value)) = reader.next()? {
                heads.push(Head { key, value, run });
            }
            readers.push(reader);
        }
        let mut files: Vec<PathBuf> = Vec::new();
        let mut writer: Option<(Vec<u8>, SstFileWriter)> = None;
        while let Some(head) = heads.pop() {
            // Every other run's write of this key is older: skipped.
            while heads.peek().is_some_and(|other| other.key == head.key) {
                let other = heads.pop().expect("peeked");
                if let Some((key, value)) = readers[other.run].next()? {
                    heads.push(Head {
                        key,
                        value,
                        run: other.run,
                    });
                }
            }
            if let Some(value) = &head.value {
                let file_prefix = &head.key[..prefix.min(head.key.len())];
                if writer.as_ref().is_none_or(|(open, _)| open != file_prefix) {
                    if let Some((_, mut done)) = writer.take() {
                        done.finish()?;
                    }
                    let path = self.dir.join(format!("ingest-{:03}.sst", files.len()));
                    let sst = SstFileWriter::create(options);
                    sst.open(&path)?;
                    files.push(path);
                    writer = Some((file_prefix.to_vec(), sst));
                }
                let (_, sst) = writer.as_mut().expect("opened above");
                sst.put(&head.key, value)?;
            }
            if let Some((key, value)) = readers[head.run].next()? {
                heads.push(Head {
                    key,
                    value,
                    run: head.run,
                });
            }
        }
        if let Some((_, mut done)) = writer.take() {
            done.finish()?;
        }
        for path in std::mem::take(&mut self.written) {
            std::fs::remove_file(&path)?;
        }
        Ok(files)
    }
}

impl Drop for SortedRuns {
    fn drop(&mut self) {
        if let Err(error) = remove_dir(&self.dir) {
            tracing::warn!("bulk load of timers: {error:#}");
        }
    }
}

fn remove_dir(dir: &Path) -> anyhow::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(anyhow::anyhow!("cannot remove {}: {e}", dir.display()))
        }
        _ => Ok(()),
    }
}

/// The next write of a run in the merge.
struct Head {
    key: Vec<u8>,
    value: Option<Vec<u8>>,
    run: usize,
}

impl Ord for Head {
    /// The heap's greatest is the smallest key, and of one key the latest run.
    fn cmp(&self, other: &Self) -> Ordering {
        other.key.cmp(&self.key).then(self.run.cmp(&other.run))
    }
}

impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Head {}

/// A key and its value (none: a deletion), as a run file holds it.
type RunWrite = (Vec<u8>, Option<Vec<u8>>);

/// Reads a run file written by [`SortedRuns::write_run`].
struct RunReader {
    input: BufReader<File>,
}

impl RunReader {
    fn open(path: &Path) -> anyhow::Result<Self> {
        let file =
            File::open(path).map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
        Ok(RunReader {
            input: BufReader::with_capacity(1 << 16, file),
        })
    }

    /// The next write, or none at the end.
    fn next(&mut self) -> anyhow::Result<Option<RunWrite>> {
        let mut length = [0u8; 4];
        match self.input.read_exact(&mut length) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            result => result?,
        }
        let mut key = vec![0u8; u32::from_be_bytes(length) as usize];
        self.input.read_exact(&mut key)?;
        let mut value_len = [0u8; 1];
        self.input.read_exact(&mut value_len)?;
        if value_len[0] == DELETED {
            return Ok(Some((key, None)));
        }
        let mut value = vec![0u8; value_len[0] as usize];
        self.input.read_exact(&mut value)?;
        Ok(Some((key, Some(value))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_sst(path: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
        let dir = path.with_extension("db");
        let db = rocksdb::DB::open_default(&dir).unwrap();
        db.ingest_external_file(vec![path]).unwrap();
        let read = db
            .iterator(rocksdb::IteratorMode::Start)
            .map(|item| {
                let (key, value) = item.unwrap();
                (key.to_vec(), value.to_vec())
            })
            .collect();
        drop(db);
        std::fs::remove_dir_all(dir).unwrap();
        read
    }

    #[test]
    fn runs_merge_in_key_order_with_the_last_write_of_a_key_winning() {
        let dir = std::env::temp_dir().join(format!("sorted-runs-test-{}", std::process::id()));
        let mut runs = SortedRuns::in_dir(dir.clone()).unwrap();
        // Three runs written, then one left in memory.
        for round in 0..4u8 {
            for key in [b"Kc".as_slice(), b"Ka", b"Tz", b"Kb", b"Tb"] {
                runs.put(key, &[round]).unwrap();
            }
            runs.put(&[b'K', b'x', round], b"").unwrap();
            match round {
                0 => runs.put(b"Kd", b"gone").unwrap(),
                2 => runs.delete(b"Kd").unwrap(),
                _ => {}
            }
            if round == 1 {
                runs.delete(b"Kb").unwrap();
                runs.put(b"Ka", b"late").unwrap();
            }
            if round < 3 {
                runs.write_run().unwrap();
            }
        }
        runs.delete(b"Tz").unwrap();
        let mut listed = std::collections::HashSet::new();
        runs.for_each_put(&mut |key| {
            listed.insert(key.to_vec());
        })
        .unwrap();
        let files = runs.merge_into_sst_files(1, &Options::default()).unwrap();
        assert_eq!(files.len(), 2, "one file per first byte: K and T");
        let by_key = read_sst(&files[0]);
        assert_eq!(
            by_key,
            vec![
                (b"Ka".to_vec(), vec![3]),
                (b"Kb".to_vec(), vec![3]),
                (b"Kc".to_vec(), vec![3]),
                (vec![b'K', b'x', 0], vec![]),
                (vec![b'K', b'x', 1], vec![]),
                (vec![b'K', b'x', 2], vec![]),
                (vec![b'K', b'x', 3], vec![]),
            ]
        );
        assert_eq!(read_sst(&files[1]), vec![(b"Tb".to_vec(), vec![3])]);
        for (key, _) in by_key {
            assert!(listed.contains(&key), "{key:?} listed before the merge");
        }
        drop(runs);
        assert!(!dir.exists(), "the runs' directory goes with them");
    }
}
