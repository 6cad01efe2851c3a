//! Timers beyond a task's memory budget, in a column family of the task's
//! RocksDB (see [`TimerQueue`]).
//!
//! The family is the queue's extension, not state: no changelog, no write
//! ahead log, cleared whenever the task loads its timers from committed
//! state (they are derived from it, or loaded from the timer store). Its
//! memtables and blocks count against the state budget like every store's.
//!
//! Writes are held back and applied [`WRITE_BEHIND`] at a time, sorted by
//! key: a memtable insert resumes its search where the last one ended, so
//! one sorted batch of many timers costs far less than the same timers
//! inserted one at a time, their keys by time and by key interleaved.
//!
//! A bulk load (timers derived from state as a task opens) writes no
//! memtable at all: its writes gather in [`SortedRuns`], merged into SST
//! files that are ingested when it ends.

use std::collections::BTreeMap;
use std::sync::Arc;

use rocksdb::{IngestExternalFileOptions, ReadOptions, WriteBatch, WriteOptions, DB};

#[cfg(doc)]
use super::TimerQueue;
use super::{SpillStore, TimeDomain};
use crate::state::codec::{i64_from_ordered_bytes, i64_to_ordered_bytes};
use crate::state::sorted_runs::SortedRuns;
use crate::state::store::{ingested_file_options, TaskStore, SPILLED_TIMERS};

/// Key prefixes: timers in firing order, and their times by key and name.
const BY_TIME: u8 = b'T';
const BY_KEY: u8 = b'K';

/// Writes held back before they are applied in one sorted batch: ~100 KiB
/// per spilling domain of a task, beyond which the batch gains little.
const WRITE_BEHIND: usize = 1024;

/// The spilled timers of one time domain of a task.
pub struct TimerSpill {
    db: Arc<DB>,
    domain: u8,
    /// Where the earliest timer may be: timers before it were taken, and
    /// the iterator starts here instead of stepping over their tombstones.
    taken_up_to: Option<Vec<u8>>,
    /// Writes not yet applied, the last per store key. Reads by key look
    /// here first; scans apply them first.
    unwritten: BTreeMap<Vec<u8>, Unwritten>,
    /// The writes of a bulk load in progress, instead of `unwritten`.
    bulk: Option<SortedRuns>,
}

/// A held-back write of one store key.
#[derive(Debug, Clone, Copy)]
enum Unwritten {
    /// A timer's entry in firing order (its key says it all).
    InFiringOrder,
    /// A timer's time, by key and name.
    Time([u8; 8]),
    Delete,
}

impl TimerSpill {
    /// Where `store`'s timers of `domain` beyond its timer budget go.
    pub(crate) fn of(store: &TaskStore, domain: TimeDomain) -> Self {
        TimerSpill {
            db: store.database(),
            domain: domain.tag(),
            taken_up_to: None,
            unwritten: BTreeMap::new(),
            bulk: None,
        }
    }

    /// Refuses a read or a removal during a bulk load: only blind writes
    /// and listing keys are gathered (see [`SpillStore::begin_bulk_load`]).
    fn not_bulk_loading(&self, what: &str) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.bulk.is_none(),
            "{what} of a spilled timer during a bulk load"
        );
        Ok(())
    }

    fn family(&self) -> &rocksdb::ColumnFamily {
        self.db
            .cf_handle(SPILLED_TIMERS)
            .expect("every task store has the spilled timers' family")
    }

    /// A store key of this domain (see [`encode`]).
    fn encode(&self, prefix: u8, time: Option<i64>, key: &str, name: &str) -> Vec<u8> {
        encode(prefix, self.domain, time, key, name)
    }

    fn write(&self, batch: WriteBatch) -> anyhow::Result<()> {
        let mut options = WriteOptions::default();
        options.disable_wal(true);
        Ok(self.db.write_opt(batch, &options)?)
    }

    /// Holds back a write of `store_key`, applying the held-back writes
    /// once there are [`WRITE_BEHIND`] of them.
    fn hold(&mut self, store_key: Vec<u8>, write: Unwritten) -> anyhow::Result<()> {
        self.unwritten.insert(store_key, write);
        if self.unwritten.len() >= WRITE_BEHIND {
            self.apply_unwritten()?;
        }
        Ok(())
    }

    /// Applies the held-back writes, in key order.
    fn apply_unwritten(&mut self) -> anyhow::Result<()> {
        if self.unwritten.is_empty() {
            return Ok(());
        }
        let family = self.family();
        let mut batch = WriteBatch::default();
        for (store_key, write) in &self.unwritten {
            match write {
                Unwritten::InFiringOrder => batch.put_cf(family, store_key, []),
                Unwritten::Time(time) => batch.put_cf(family, store_key, time),
                Unwritten::Delete => batch.delete_cf(family, store_key),
            }
        }
        self.write(batch)?;
        self.unwritten.clear();
        Ok(())
    }
}

/// A store key of `domain`: `prefix`, the domain, the time if given, then
/// `key` and `name` in an encoding that sorts as the pair: the key's zero
/// bytes escaped, then two zeros.
fn encode(prefix: u8, domain: u8, time: Option<i64>, key: &str, name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + 8 + key.len() + 2 + name.len());
    out.extend_from_slice(&[prefix, domain]);
    if let Some(time) = time {
        out.extend_from_slice(&i64_to_ordered_bytes(time));
    }
    for &byte in key.as_bytes() {
        out.push(byte);
        if byte == 0 {
            out.push(0xff);
        }
    }
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(name.as_bytes());
    out
}

/// The time, key and name of a by-time key (after its two prefix bytes).
fn decode_by_time(bytes: &[u8]) -> anyhow::Result<(i64, String, &str)> {
    anyhow::ensure!(bytes.len() >= 2 + 8, "spilled timer key too short");
    let time = i64_from_ordered_bytes(bytes[2..10].try_into()?);
    let (key, name) = decode_key_and_name(&bytes[10..])?;
    Ok((time, key, name))
}

/// The key and name at the end of a store key (see [`TimerSpill::encode`]).
fn decode_key_and_name(bytes: &[u8]) -> anyhow::Result<(String, &str)> {
    let mut key = Vec::new();
    let mut rest = bytes;
    loop {
        match rest {
            [0, 0, name @ ..] => {
                return Ok((String::from_utf8(key)?, std::str::from_utf8(name)?));
            }
            [0, 0xff, tail @ ..] => {
                key.push(0);
                rest = tail;
            }
            [byte, tail @ ..] if *byte != 0 => {
                key.push(*byte);
                rest = tail;
            }
            _ => anyhow::bail!("spilled timer key malformed"),
        }
    }
}

impl SpillStore for TimerSpill {
    fn get(&self, key: &str, name: &str) -> anyhow::Result<Option<i64>> {
        self.not_bulk_loading("a read")?;
        let by_key = self.encode(BY_KEY, None, key, name);
        match self.unwritten.get(&by_key) {
            Some(Unwritten::Time(time)) => return Ok(Some(i64_from_ordered_bytes(*time))),
            Some(_) => return Ok(None),
            None => {}
        }
        Ok(match self.db.get_pinned_cf(self.family(), by_key)? {
            Some(time) => Some(i64_from_ordered_bytes(time.as_ref().try_into()?)),
            None => None,
        })
    }

    fn put(&mut self, time: i64, key: &str, name: &str) -> anyhow::Result<()> {
        let by_time = self.encode(BY_TIME, Some(time), key, name);
        if let Some(runs) = &mut self.bulk {
            let by_key = encode(BY_KEY, self.domain, None, key, name);
            runs.put(&by_time, &[])?;
            return runs.put(&by_key, &i64_to_ordered_bytes(time));
        }
        if self
            .taken_up_to
            .as_ref()
            .is_some_and(|taken| by_time < *taken)
        {
            self.taken_up_to = None;
        }
        self.hold(by_time, Unwritten::InFiringOrder)?;
        let by_key = self.encode(BY_KEY, None, key, name);
        self.hold(by_key, Unwritten::Time(i64_to_ordered_bytes(time)))
    }

    fn forget(&mut self, key: &str, name: &str) -> anyhow::Result<()> {
        let by_key = self.encode(BY_KEY, None, key, name);
        match &mut self.bulk {
            Some(runs) => runs.delete(&by_key),
            None => self.hold(by_key, Unwritten::Delete),
        }
    }

    fn delete(&mut self, time: i64, key: &str, name: &str) -> anyhow::Result<()> {
        self.not_bulk_loading("a removal")?;
        let by_time = self.encode(BY_TIME, Some(time), key, name);
        self.hold(by_time, Unwritten::Delete)?;
        self.hold(self.encode(BY_KEY, None, key, name), Unwritten::Delete)
    }

    fn for_each_spilled(&mut self, each: &mut dyn FnMut(&str, &str)) -> anyhow::Result<()> {
        if let Some(runs) = &mut self.bulk {
            let prefix = [BY_KEY, self.domain];
            let mut failure = None;
            runs.for_each_put(&mut |store_key| {
                if failure.is_some() || !store_key.starts_with(&prefix) {
                    return;
                }
                match decode_key_and_name(&store_key[2..]) {
                    Ok((key, name)) => each(&key, name),
                    Err(error) => failure = Some(error),
                }
            })?;
            return failure.map_or(Ok(()), Err);
        }
        self.apply_unwritten()?;
        let mut options = ReadOptions::default();
        options.set_iterate_lower_bound(vec![BY_KEY, self.domain]);
        options.set_iterate_upper_bound(vec![BY_KEY, self.domain + 1]);
        // A one-off scan: its blocks would only push hot ones out.
        options.fill_cache(false);
        let mut iterator = self.db.raw_iterator_cf_opt(self.family(), options);
        iterator.seek_to_first();
        while let Some(by_key) = iterator.key() {
            let (key, name) = decode_key_and_name(&by_key[2..])?;
            each(&key, name);
            iterator.next();
        }
        Ok(iterator.status()?)
    }

    fn take_earliest(
        &mut self,
        take: &mut dyn FnMut(i64, &str, &str) -> bool,
    ) -> anyhow::Result<usize> {
        self.not_bulk_loading("a take")?;
        self.apply_unwritten()?;
        let mut options = ReadOptions::default();
        options.set_iterate_lower_bound(
            self.taken_up_to
                .clone()
                .unwrap_or_else(|| vec![BY_TIME, self.domain]),
        );
        options.set_iterate_upper_bound(vec![BY_TIME, self.domain + 1]);
        let mut batch = WriteBatch::default();
        let mut last_taken = None;
        let mut removed = 0;
        {
            let mut iterator = self.db.raw_iterator_cf_opt(self.family(), options);
            iterator.seek_to_first();
            while let Some(by_time) = iterator.key() {
                let (time, key, name) = decode_by_time(by_time)?;
                let by_key = self.encode(BY_KEY, None, &key, name);
                let live = match self.db.get_pinned_cf(self.family(), &by_key)? {
                    Some(at) => i64_from_ordered_bytes(at.as_ref().try_into()?) == time,
                    None => false,
                };
                if live && !take(time, &key, name) {
                    break;
                }
                batch.delete_cf(self.family(), by_time);
                if live {
                    batch.delete_cf(self.family(), by_key);
                }
                removed += 1;
                last_taken = Some(by_time.to_vec());
                iterator.next();
            }
            iterator.status()?;
        }
        self.write(batch)?;
        if last_taken.is_some() {
            self.taken_up_to = last_taken;
        }
        Ok(removed)
    }

    fn begin_bulk_load(&mut self) -> anyhow::Result<()> {
        self.apply_unwritten()?;
        let dir = self
            .db
            .path()
            .join(format!("timers-bulk-{}", self.domain as char));
        self.bulk = Some(SortedRuns::in_dir(dir)?);
        Ok(())
    }

    fn end_bulk_load(&mut self) -> anyhow::Result<()> {
        let Some(mut runs) = self.bulk.take() else {
            return Ok(());
        };
        // One file by key and one by time: this domain's two key ranges.
        let files = runs.merge_into_sst_files(1, &ingested_file_options())?;
        if !files.is_empty() {
            let mut options = IngestExternalFileOptions::default();
            options.set_move_files(true);
            self.db
                .ingest_external_file_cf_opts(self.family(), &options, files)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_time_keys_sort_as_time_key_name_and_decode_back() {
        let (store, _dir) = crate::state::store::tests::temp_store(&[]);
        let spill = TimerSpill::of(&store, TimeDomain::EventTime);
        let timers = [
            (-5, "z", "a"),
            (7, "", "b"),
            (7, "a", "a"),
            (7, "a", "b"),
            (7, "a\0", "a"),
            (7, "a\0b", "a"),
            (7, "ab", "a"),
            (8, "a", "a"),
        ];
        let keys: Vec<Vec<u8>> = timers
            .iter()
            .map(|&(time, key, name)| spill.encode(BY_TIME, Some(time), key, name))
            .collect();
        assert!(keys.windows(2).all(|pair| pair[0] < pair[1]));
        for (bytes, &(time, key, name)) in keys.iter().zip(&timers) {
            assert_eq!(decode_by_time(bytes).unwrap(), (time, key.to_owned(), name));
        }
    }

    #[test]
    fn timers_come_back_in_order_and_a_clear_forgets_them() {
        let (store, _dir) = crate::state::store::tests::temp_store(&[]);
        let mut spill = TimerSpill::of(&store, TimeDomain::EventTime);
        let mut wall_clock = TimerSpill::of(&store, TimeDomain::WallClock);
        wall_clock.put(1, "w", "a").unwrap();
        wall_clock.apply_unwritten().unwrap();
        for (time, key) in [(30, "c"), (10, "a"), (20, "b"), (40, "d")] {
            spill.put(time, key, "t").unwrap();
        }
        spill.delete(20, "b", "t").unwrap();
        let mut listed = Vec::new();
        spill
            .for_each_spilled(&mut |key, name| listed.push(format!("{key}/{name}")))
            .unwrap();
        assert_eq!(listed, ["a/t", "c/t", "d/t"], "the other domain's apart");
        assert_eq!(spill.get("c", "t").unwrap(), Some(30));
        assert_eq!(spill.get("b", "t").unwrap(), None);
        let mut taken = Vec::new();
        spill
            .take_earliest(&mut |time, key, _| {
                taken.push((time, key.to_owned()));
                taken.len() < 2
            })
            .unwrap();
        assert_eq!(taken, [(10, "a".to_owned()), (30, "c".to_owned())]);
        assert_eq!(spill.get("a", "t").unwrap(), None, "taken");
        assert_eq!(spill.get("c", "t").unwrap(), Some(30), "declined");
        spill.put(5, "e", "t").unwrap();
        let mut rest = Vec::new();
        spill
            .take_earliest(&mut |time, _, _| {
                rest.push(time);
                true
            })
            .unwrap();
        assert_eq!(rest, [5, 30, 40], "one put before the last take");
        store.clear_spilled_timers().unwrap();
        let fresh = TimerSpill::of(&store, TimeDomain::EventTime);
        assert_eq!(fresh.get("c", "t").unwrap(), None, "cleared");
    }

    #[test]
    fn held_back_writes_read_as_written_on_either_side_of_a_batch() {
        let (store, _dir) = crate::state::store::tests::temp_store(&[]);
        let mut spill = TimerSpill::of(&store, TimeDomain::EventTime);
        let timers = 3 * WRITE_BEHIND as i64 + 7;
        // Keys in no order, so batches are sorted and some land held back.
        let key = |i: i64| format!("k{}", (i * 7919) % timers);
        for i in 0..timers {
            spill.put(i, &key(i), "t").unwrap();
        }
        for i in (0..timers).step_by(3) {
            spill.delete(i, &key(i), "t").unwrap();
        }
        for i in (1..timers).step_by(3) {
            spill.put(timers + i, &key(i), "t").unwrap();
        }
        assert!(!spill.unwritten.is_empty(), "the last writes are held back");
        let expected = |i: i64| match i % 3 {
            0 => None,
            1 => Some(timers + i),
            _ => Some(i),
        };
        for i in 0..timers {
            assert_eq!(spill.get(&key(i), "t").unwrap(), expected(i), "{}", key(i));
        }
        let mut taken = Vec::new();
        spill
            .take_earliest(&mut |time, key, _| {
                taken.push((time, key.to_owned()));
                true
            })
            .unwrap();
        let mut live: Vec<(i64, String)> = (0..timers)
            .filter_map(|i| expected(i).map(|time| (time, key(i))))
            .collect();
        live.sort();
        assert_eq!(taken, live, "moved timers come once, at their new time");
        assert!(spill.unwritten.is_empty());
    }

    /// Pops every timer of `timers` in firing order, with the spilled count
    /// and the time `get` answers for `probe` before the first pop.
    fn drained(
        mut timers: super::super::TaskTimers,
        probe: &str,
    ) -> (usize, Option<i64>, Vec<(i64, String)>) {
        let spilled = timers.spilled();
        let probed = timers.get(TimeDomain::EventTime, probe, "t");
        let mut fired = Vec::new();
        while let Some(entry) = timers.pop_due(TimeDomain::EventTime, i64::MAX) {
            fired.push((entry.time, entry.key.to_string()));
        }
        timers.check().unwrap();
        (spilled, probed, fired)
    }

    #[test]
    fn a_bulk_load_spills_and_fires_like_timers_set_one_by_one() {
        use super::super::TaskTimers;
        // Times in no order, a key set twice and another removed meanwhile
        // (its filter answer may be wrong: a blind removal either way), far
        // more timers than the budget holds.
        let load = |timers: &mut TaskTimers| {
            for i in 0..30_000i64 {
                let time = (i * 7_919) % 30_011;
                timers.set(TimeDomain::EventTime, &format!("k{i:05}"), "t", time);
            }
            timers.set(TimeDomain::EventTime, "k00007", "t", 99_999);
            timers.remove(TimeDomain::EventTime, "k00011", "t");
            Ok(())
        };
        let budget = 64 << 10;
        let one_by_one = {
            let (store, _dir) = crate::state::store::tests::temp_store(&[]);
            let mut timers = TaskTimers::spilling(budget, false, |domain| {
                Box::new(TimerSpill::of(&store, domain))
            });
            load(&mut timers).unwrap();
            drained(timers, "k00007")
        };
        let (store, dir) = crate::state::store::tests::temp_store(&[]);
        let mut timers = TaskTimers::spilling(budget, false, |domain| {
            Box::new(TimerSpill::of(&store, domain))
        });
        timers.bulk_load(load).unwrap();
        let files = |level: usize| {
            let family = store.database();
            let family = family.cf_handle(SPILLED_TIMERS).unwrap();
            store
                .database()
                .property_int_value_cf(family, &format!("rocksdb.num-files-at-level{level}"))
                .unwrap()
                .unwrap()
        };
        assert!(
            (0..7).map(files).sum::<u64>() >= 2,
            "ingested: by key and by time"
        );
        let bulk = drained(timers, "k00007");
        assert!(
            one_by_one.0 > 25_000,
            "most timers spilled: {}",
            one_by_one.0
        );
        assert_eq!(bulk.0, one_by_one.0);
        assert_eq!(bulk.1, Some(99_999), "the last set wins");
        assert_eq!(bulk.2.len(), 29_999);
        assert_eq!(bulk, one_by_one);
        assert!(
            !dir.join("timers-bulk-e").exists(),
            "the sorted runs are gone"
        );
    }
}
