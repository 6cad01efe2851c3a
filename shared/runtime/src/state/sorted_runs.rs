//! Sorted runs: the writes of a bulk load into an empty column family,
//! gathered in memory, sorted and written to files a run at a time, then
//! merged into SST files that RocksDB ingests whole.
//!
//! Two loads use them: the spilled timers a task derives from its state
//! ([`TimerSpill`](crate::timers::TimerSpill)), and the restore of a task
//! with no local state ([`BulkRestore`](super::bulk_restore::BulkRestore)).
//! Both write many keys in an order unrelated to the keys' (a changelog's
//! order, a state scan's for timers by time). Written one by one, every
//! write costs a memtable insert at a random place and, later, its
//! compactions through the levels. Sorted runs cost a sort and two
//! sequential passes instead, and the ingested files need no compaction.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use rocksdb::{Options, SstFileWriter};

/// The bytes of keys and values a run gathers before it is sorted and
/// written out: what a bulk load holds in memory beyond the state's budget
/// (twice that while the last full run is being written).
const RUN_BYTES: usize = 16 << 20;

/// The value length that marks a deletion in a run.
const DELETED: u32 = u32::MAX;

/// Writes gathered for a bulk load: the run in memory, the one being
/// written, and those written.
pub(crate) struct SortedRuns {
    dir: PathBuf,
    run: Run,
    /// The last full run, sorted and written on a thread of its own while
    /// the next one gathers.
    writing: Option<JoinHandle<anyhow::Result<PathBuf>>>,
    /// The runs written, oldest first: a later one wins over an earlier one.
    written: Vec<PathBuf>,
}

/// Writes in memory: keys and values back to back, and where each is.
#[derive(Default)]
struct Run {
    data: Vec<u8>,
    entries: Vec<Entry>,
}

/// One write of a run, in its `data`.
#[derive(Clone, Copy)]
struct Entry {
    start: u32,
    key_len: u32,
    /// The value's length, or [`DELETED`].
    value_len: u32,
}

impl Run {
    fn key(&self, entry: &Entry) -> &[u8] {
        &self.data[entry.start as usize..][..entry.key_len as usize]
    }

    fn value(&self, entry: &Entry) -> Option<&[u8]> {
        let start = entry.start as usize + entry.key_len as usize;
        (entry.value_len != DELETED).then(|| &self.data[start..][..entry.value_len as usize])
    }

    /// Sorts the writes by key; a key's writes stay in the order they came
    /// (their `start`s grow).
    fn sort(&mut self) {
        let mut entries = std::mem::take(&mut self.entries);
        entries.sort_unstable_by(|a, b| (self.key(a).cmp(self.key(b))).then(a.start.cmp(&b.start)));
        self.entries = entries;
    }

    /// The last write of each key, in key order: `None` for a deletion.
    /// Sorted first.
    fn latest(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        let entries = &self.entries;
        entries
            .iter()
            .enumerate()
            .filter_map(move |(index, entry)| {
                let superseded = entries
                    .get(index + 1)
                    .is_some_and(|next| self.key(next) == self.key(entry));
                (!superseded).then(|| (self.key(entry), self.value(entry)))
            })
    }

    /// Sorts the run and writes the last write of each key to `path`.
    fn write_sorted(mut self, path: PathBuf) -> anyhow::Result<PathBuf> {
        self.sort();
        let file = File::create(&path)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
        let mut out = BufWriter::with_capacity(1 << 16, file);
        for (key, value) in self.latest() {
            out.write_all(&(key.len() as u32).to_be_bytes())?;
            out.write_all(key)?;
            match value {
                Some(value) => {
                    out.write_all(&(value.len() as u32).to_be_bytes())?;
                    out.write_all(value)?;
                }
                None => out.write_all(&DELETED.to_be_bytes())?,
            }
        }
        out.flush()?;
        Ok(path)
    }
}

impl SortedRuns {
    /// Empty runs kept in `dir`, which is emptied (of a load that did not
    /// finish) and removed again when the runs are dropped.
    pub(crate) fn in_dir(dir: PathBuf) -> anyhow::Result<Self> {
        remove_dir(&dir)?;
        std::fs::create_dir_all(&dir)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
        Ok(SortedRuns {
            dir,
            run: Run::default(),
            writing: None,
            written: Vec::new(),
        })
    }

    /// Gathers a write of `value` under `key`.
    pub(crate) fn put(&mut self, key: &[u8], value: &[u8]) -> anyhow::Result<()> {
        let value_len = u32::try_from(value.len())
            .ok()
            .filter(|len| *len != DELETED)
            .ok_or_else(|| anyhow::anyhow!("a value of {} bytes is too long", value.len()))?;
        self.gather(key, value, value_len)
    }

    /// Gathers a deletion of `key`.
    pub(crate) fn delete(&mut self, key: &[u8]) -> anyhow::Result<()> {
        self.gather(key, &[], DELETED)
    }

    fn gather(&mut self, key: &[u8], value: &[u8], value_len: u32) -> anyhow::Result<()> {
        let run = &self.run;
        if run.data.len() + key.len() + value.len() > RUN_BYTES && !run.entries.is_empty() {
            self.end_run()?;
        }
        self.run.entries.push(Entry {
            start: self.run.data.len() as u32,
            key_len: key.len() as u32,
            value_len,
        });
        self.run.data.extend_from_slice(key);
        self.run.data.extend_from_slice(value);
        Ok(())
    }

    /// Hands the run in memory to a thread that sorts and writes it, once
    /// the one before is written.
    fn end_run(&mut self) -> anyhow::Result<()> {
        self.finish_writing()?;
        let path = self.dir.join(format!("run-{:05}", self.written.len()));
        let run = std::mem::take(&mut self.run);
        let writing = std::thread::Builder::new()
            .name("sorted-run".into())
            .spawn(move || run.write_sorted(path))
            .map_err(|e| anyhow::anyhow!("cannot start a thread to write a sorted run: {e}"))?;
        self.writing = Some(writing);
        Ok(())
    }

    /// Waits for the run being written.
    fn finish_writing(&mut self) -> anyhow::Result<()> {
        if let Some(writing) = self.writing.take() {
            let path = writing
                .join()
                .map_err(|_| anyhow::anyhow!("the thread writing a sorted run panicked"))??;
            self.written.push(path);
        }
        Ok(())
    }

    /// Calls `each` with every key that may have a value when the load
    /// ends (a key deleted since may be among them), in no order.
    pub(crate) fn for_each_put(&mut self, each: &mut dyn FnMut(&[u8])) -> anyhow::Result<()> {
        self.finish_writing()?;
        for path in &self.written {
            let mut reader = RunReader::open(path, 0)?;
            let mut write = Head::default();
            while reader.next_into(&mut write)? {
                if !write.deleted {
                    each(&write.key);
                }
            }
        }
        for entry in &self.run.entries {
            if entry.value_len != DELETED {
                each(self.run.key(entry));
            }
        }
        Ok(())
    }

    /// Merges the writes into SST files, one per distinct first `prefix`
    /// bytes of the keys (the files do not overlap), with `options`; returns
    /// their paths, to be ingested before the runs are dropped. A deletion
    /// leaves no entry: the load began on an empty store, so there is
    /// nothing older to hide. Writes that all fit in memory go straight
    /// from there.
    pub(crate) fn merge_into_sst_files(
        &mut self,
        prefix: usize,
        options: &Options,
    ) -> anyhow::Result<Vec<PathBuf>> {
        self.finish_writing()?;
        let mut out = SstFiles::new(self.dir.clone(), prefix, options);
        if self.written.is_empty() {
            self.run.sort();
            for (key, value) in self.run.latest() {
                out.write(key, value)?;
            }
            self.run = Run::default();
            return out.finish();
        }
        if !self.run.entries.is_empty() {
            self.end_run()?;
            self.finish_writing()?;
        }
        let mut heads = BinaryHeap::new();
        let mut readers = Vec::with_capacity(self.written.len());
        for (run, path) in self.written.iter().enumerate() {
            let mut reader = RunReader::open(path, run)?;
            let mut head = Head::default();
            if reader.next_into(&mut head)? {
                heads.push(head);
            }
            readers.push(reader);
        }
        while let Some(mut head) = heads.pop() {
            // Every other run's write of this key is older: skipped.
            while heads.peek().is_some_and(|other| other.key == head.key) {
                let mut other = heads.pop().expect("peeked");
                if readers[other.run].next_into(&mut other)? {
                    heads.push(other);
                }
            }
            out.write(&head.key, (!head.deleted).then_some(&head.value[..]))?;
            if readers[head.run].next_into(&mut head)? {
                heads.push(head);
            }
        }
        for path in std::mem::take(&mut self.written) {
            std::fs::remove_file(&path)?;
        }
        out.finish()
    }
}

impl Drop for SortedRuns {
    fn drop(&mut self) {
        // A run still being written goes with the directory.
        let _ = self.finish_writing();
        if let Err(error) = remove_dir(&self.dir) {
            tracing::warn!("bulk load: {error:#}");
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

/// The SST files a merge writes, in key order: a new file where the keys'
/// first `prefix` bytes change.
struct SstFiles<'a> {
    dir: PathBuf,
    prefix: usize,
    options: &'a Options,
    files: Vec<PathBuf>,
    /// The file being written, with its keys' prefix.
    open: Option<(Vec<u8>, SstFileWriter<'a>)>,
}

impl<'a> SstFiles<'a> {
    fn new(dir: PathBuf, prefix: usize, options: &'a Options) -> Self {
        SstFiles {
            dir,
            prefix,
            options,
            files: Vec::new(),
            open: None,
        }
    }

    /// Writes `value` under `key`; a deletion (none) leaves no entry.
    fn write(&mut self, key: &[u8], value: Option<&[u8]>) -> anyhow::Result<()> {
        let Some(value) = value else {
            return Ok(());
        };
        let file_prefix = &key[..self.prefix.min(key.len())];
        if self
            .open
            .as_ref()
            .is_none_or(|(open, _)| open != file_prefix)
        {
            if let Some((_, mut done)) = self.open.take() {
                done.finish()?;
            }
            let path = self.dir.join(format!("ingest-{:03}.sst", self.files.len()));
            let sst = SstFileWriter::create(self.options);
            sst.open(&path)?;
            self.files.push(path);
            self.open = Some((file_prefix.to_vec(), sst));
        }
        let (_, sst) = self.open.as_mut().expect("opened above");
        Ok(sst.put(key, value)?)
    }

    fn finish(mut self) -> anyhow::Result<Vec<PathBuf>> {
        if let Some((_, mut done)) = self.open.take() {
            done.finish()?;
        }
        Ok(self.files)
    }
}

/// The next write of a run in the merge, its buffers reused from one write
/// to the next.
#[derive(Default)]
struct Head {
    key: Vec<u8>,
    value: Vec<u8>,
    deleted: bool,
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

/// Reads a run file written by [`Run::write_sorted`].
struct RunReader {
    input: BufReader<File>,
    /// The run's place among the runs, oldest first.
    run: usize,
}

impl RunReader {
    fn open(path: &Path, run: usize) -> anyhow::Result<Self> {
        let file =
            File::open(path).map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
        Ok(RunReader {
            input: BufReader::with_capacity(1 << 16, file),
            run,
        })
    }

    /// Reads the next write into `head`; false at the end.
    fn next_into(&mut self, head: &mut Head) -> anyhow::Result<bool> {
        let mut length = [0u8; 4];
        match self.input.read_exact(&mut length) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
            result => result?,
        }
        head.key.resize(u32::from_be_bytes(length) as usize, 0);
        self.input.read_exact(&mut head.key)?;
        self.input.read_exact(&mut length)?;
        let value_len = u32::from_be_bytes(length);
        head.deleted = value_len == DELETED;
        head.value
            .resize(if head.deleted { 0 } else { value_len as usize }, 0);
        self.input.read_exact(&mut head.value)?;
        head.run = self.run;
        Ok(true)
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
                runs.end_run().unwrap();
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

    #[test]
    fn writes_that_fit_in_memory_go_straight_to_one_file() {
        let dir = std::env::temp_dir().join(format!("sorted-runs-mem-{}", std::process::id()));
        let mut runs = SortedRuns::in_dir(dir.clone()).unwrap();
        runs.put(b"b", b"1").unwrap();
        runs.put(b"a", &[7; 300]).unwrap();
        runs.delete(b"b").unwrap();
        runs.put(b"c", b"").unwrap();
        runs.put(b"b", b"2").unwrap();
        runs.delete(b"c").unwrap();
        let files = runs.merge_into_sst_files(0, &Options::default()).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(
            read_sst(&files[0]),
            vec![
                (b"a".to_vec(), vec![7; 300]),
                (b"b".to_vec(), b"2".to_vec())
            ]
        );
        assert!(std::fs::read_dir(&dir).unwrap().all(|entry| entry
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".sst")));
        drop(runs);
        assert!(!dir.exists());
    }
}
