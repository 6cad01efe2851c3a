//! A task's pending timers: in memory up to a budget, the rest spilled.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use hashbrown::hash_map::EntryRef;
use rustc_hash::FxBuildHasher;
use smallvec::SmallVec;

use super::spill::SpillStore;
use super::spill_filter::SpillFilter;
use super::TimerEntry;

/// What one timer in memory is counted as, beside its key's bytes: the
/// index entry by key (with the hash table's slack), the shared key's
/// allocation header and its heap entries (up to two, with the heap's slack).
const TIMER_BYTES: usize = 256;

/// The pending timers of one domain of a task, in time order, with one
/// timer per key and name; persisted through the task's timer store by the
/// caller (or derived from state). In memory up to the task's budget, which
/// makes "next due timer" a cheap lookup; beyond it, the latest timers are
/// spilled to a [`SpillStore`] (the task's RocksDB) and come back, in
/// order, when the earlier ones have fired.
///
/// The split is by firing order: every timer before the *horizon* (a
/// time, key and name) is in memory, every one from it on is spilled. A
/// timer set before the horizon goes to memory, one set at or after it to
/// the spill store. When memory holds more than the budget, its later half
/// is spilled and the horizon moves back to the first of them; when memory
/// has nothing due and the horizon is, the earliest spilled timers are
/// loaded until memory holds half its room, and the horizon moves on to
/// the first left. Timers of keys with many records (a session moving its
/// deadline) stay in memory while they fit; a state with many more keys
/// than memory costs a write of the spill store per timer set, and a
/// sequential read when its turn comes. While nothing is spilled, no spill
/// store is touched.
///
/// A timer moved or removed while spilled is written blind unless the queue
/// is *exact*: its index entry by key changes, its old entry in firing order
/// is left behind and dropped when its turn comes, so no read is needed
/// (and [`len`](Self::len) counts such entries until then). An exact queue
/// reads the old time first, to return it: a processor whose timers are in
/// a timer store needs it; one that derives its timers from state does not.
///
/// In memory, the index by key is the truth. The heap by time may also hold
/// entries a timer has since left (moved or removed): moving a timer pushes
/// its new time and leaves the old entry behind, to be skipped when it
/// comes up, instead of searching a sorted set for it. Most timers move on
/// every record of their key (a session's inactivity deadline), so this
/// halves the ordered work of a move, and pushing a later time onto a
/// min-heap rarely climbs. The heap is rebuilt from the index once
/// left-behind entries outnumber live ones, so it stays within about twice
/// the timers.
///
/// A key is stored once, shared by the index and the heap's entries, and
/// names are the processor's static names: moving an existing timer
/// allocates nothing.
#[derive(Default)]
pub struct TimerQueue {
    by_time: BinaryHeap<Reverse<TimerEntry>>,
    by_key: hashbrown::HashMap<Arc<str>, NamedTimes, FxBuildHasher>,
    /// Timers in `by_key`; `by_time` holds these and left-behind entries.
    live: usize,
    /// The memory the timers in `by_key` are counted as ([`timer_bytes`]).
    pub(super) bytes: usize,
    /// Where timers beyond the budget go; none: all stay in memory.
    pub(super) spill: Option<Spill>,
}

/// The spilled timers of a queue.
pub(super) struct Spill {
    store: Box<dyn SpillStore>,
    /// The first spilled timer in firing order, if any is spilled.
    horizon: Option<Horizon>,
    /// Entries in firing order in the store (stale ones included, see
    /// [`TimerQueue`]).
    count: usize,
    /// Whether a spilled timer's old time is read before it changes.
    exact: bool,
    /// The names of spilled timers: a loaded timer gets its static name back.
    names: SmallVec<[&'static str; 4]>,
    /// The store's first error since the last [`TaskTimers::check`](super::TaskTimers::check).
    pub(super) failure: Cell<Option<anyhow::Error>>,
    /// The last key and name looked up in the store, with the answer: a
    /// processor that reads a timer and then sets it reads the store once.
    last_lookup: RefCell<Option<Lookup>>,
    /// Which keys and names may be in the store: a lookup or removal of a
    /// timer certainly not spilled touches no store.
    filter: SpillFilter,
}

/// A spilled timer's time by key and name, as the store said.
struct Lookup {
    key: String,
    name: String,
    time: Option<i64>,
}

/// A position in firing order: time, then key, then name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Horizon {
    time: i64,
    key: Box<str>,
    name: &'static str,
}

impl Horizon {
    /// Whether timer `name` of `key` at `time` fires before this position.
    fn follows(&self, time: i64, key: &str, name: &str) -> bool {
        (time, key, name) < (self.time, &*self.key, self.name)
    }
}

impl Spill {
    /// The time of the spilled timer `name` of `key`, if it is spilled.
    fn lookup(&self, key: &str, name: &str) -> anyhow::Result<Option<i64>> {
        if let Some(known) = self.known(key, name) {
            return Ok(known);
        }
        let time = self.store.get(key, name)?;
        self.remember(key, name, time);
        Ok(time)
    }

    /// What is known of the spilled timer `name` of `key` without reading
    /// the store: the last lookup's answer, or none if the filter rules it out.
    fn known(&self, key: &str, name: &str) -> Option<Option<i64>> {
        if let Some(last) = &*self.last_lookup.borrow() {
            if last.key == key && last.name == name {
                return Some(last.time);
            }
        }
        (!self.filter.may_contain(key, name)).then_some(None)
    }

    /// Notes that the spilled timer `name` of `key` is at `time` (or none).
    fn remember(&self, key: &str, name: &str, time: Option<i64>) {
        let mut last = self.last_lookup.borrow_mut();
        let last = last.get_or_insert_with(|| Lookup {
            key: String::new(),
            name: String::new(),
            time: None,
        });
        last.key.clear();
        last.key.push_str(key);
        last.name.clear();
        last.name.push_str(name);
        last.time = time;
    }

    fn record(&self, error: anyhow::Error) {
        let first = self.failure.take();
        self.failure.set(first.or(Some(error)));
    }

    /// Builds the filter again from the store's timers, sized for twice as
    /// many as it counts (stale entries included: an upper bound); on a
    /// failed read the old filter, which holds them all, stays.
    fn rebuild_filter(&mut self) {
        let mut filter = SpillFilter::with_capacity(2 * self.count);
        match (self.store).for_each_spilled(&mut |key, name| filter.insert(key, name)) {
            Ok(()) => self.filter = filter,
            Err(error) => self.record(error),
        }
    }

    /// Notes that the store holds no timer any more.
    fn emptied(&mut self) {
        self.count = 0;
        self.horizon = None;
        self.filter.clear();
        self.last_lookup.take();
    }
}

/// The memory a timer of `key` is counted as.
fn timer_bytes(key: &str) -> usize {
    TIMER_BYTES + key.len()
}

/// One key's timers, by name, with their times: most keys have one or two,
/// kept inline. (With room for one, a second spilled to the heap: the
/// joiner's records per CPU-second, when it kept an expiry timer per order
/// id and side, 142/149/156k -> 148/160/160k with room for two.)
type NamedTimes = SmallVec<[(&'static str, i64); 2]>;

/// Left-behind heap entries tolerated beyond the live ones before a rebuild.
const COMPACT_SLACK: usize = 1024;

impl TimerQueue {
    /// An empty queue that spills to `store`.
    pub(super) fn spilling(store: Box<dyn SpillStore>, exact: bool) -> Self {
        TimerQueue {
            spill: Some(Spill {
                store,
                horizon: None,
                count: 0,
                exact,
                names: SmallVec::new(),
                failure: Cell::new(None),
                last_lookup: RefCell::new(None),
                filter: SpillFilter::default(),
            }),
            ..TimerQueue::default()
        }
    }

    /// The time of the timer `name` of `key`, if one is set.
    pub fn get(&self, key: &str, name: &str) -> Option<i64> {
        if let Some(time) = self.get_in_memory(key, name) {
            return Some(time);
        }
        let spill = self.spill.as_ref().filter(|spill| spill.count > 0)?;
        spill.lookup(key, name).unwrap_or_else(|error| {
            spill.record(error);
            None
        })
    }

    /// Whether timer `name` of `key` may be set: `false` is certain, `true`
    /// is exact for a timer in memory and may be wrong for a spilled one
    /// (the spill filter answers, without reading the store).
    pub fn may_be_set(&self, key: &str, name: &str) -> bool {
        self.get_in_memory(key, name).is_some()
            || self.spill.as_ref().is_some_and(|spill| {
                spill.count > 0 && spill.known(key, name).is_none_or(|known| known.is_some())
            })
    }

    /// Sets timer `name` of `key` to `time`; returns the time it replaced.
    pub fn set(&mut self, key: &str, name: &'static str, time: i64) -> Option<i64> {
        let Some(horizon) = self.spill.as_ref().and_then(|spill| spill.horizon.as_ref()) else {
            return self.set_in_memory(key, name, time);
        };
        let to_memory = horizon.follows(time, key, name);
        if let Some(in_memory) = self.get_in_memory(key, name) {
            if to_memory {
                return self.set_in_memory(key, name, time);
            }
            self.remove_from_memory(key, name);
            self.spill_one(time, key, name);
            return Some(in_memory);
        }
        if to_memory {
            let previous = self.remove_spilled(key, name);
            self.set_in_memory(key, name, time);
            return previous;
        }
        // A blind put replaces the spilled timer's index entry by key.
        let exact = self.spill.as_ref().is_some_and(|spill| spill.exact);
        let previous = if exact {
            self.remove_spilled(key, name)
        } else {
            None
        };
        self.spill_one(time, key, name);
        previous
    }

    /// Removes timer `name` of `key`; returns its time.
    pub fn remove(&mut self, key: &str, name: &str) -> Option<i64> {
        self.remove_from_memory(key, name)
            .or_else(|| self.remove_spilled(key, name))
    }

    /// Removes and returns the earliest timer due at `now`, loading spilled
    /// timers until memory holds `refill` bytes when their turn comes.
    pub(super) fn pop_due(&mut self, now: i64, refill: usize) -> Option<TimerEntry> {
        loop {
            while self.by_time.peek().is_some_and(|top| top.0.time <= now) {
                let Reverse(entry) = self.by_time.pop()?;
                if self.take_if_live(&entry) {
                    return Some(entry);
                }
            }
            // Nothing in memory is due, so memory holds nothing before the
            // horizon that is: if it is due, the spilled timers are next.
            let spill = self.spill.as_ref()?;
            if spill.horizon.as_ref().is_none_or(|h| h.time > now) || !self.load_spilled(refill) {
                return None;
            }
        }
    }

    /// Number of pending timers, spilled ones included (with, if the queue
    /// is not exact, the stale entries of spilled timers since moved).
    pub fn len(&self) -> usize {
        self.live + self.spill.as_ref().map_or(0, |spill| spill.count)
    }

    /// Whether no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Timers spilled to the store.
    pub fn spilled(&self) -> usize {
        self.spill.as_ref().map_or(0, |spill| spill.count)
    }

    /// The memory the queue is counted as: its timers in memory and the
    /// filter of its spilled ones.
    pub(super) fn memory(&self) -> usize {
        self.bytes + self.spill.as_ref().map_or(0, |spill| spill.filter.bytes())
    }

    fn get_in_memory(&self, key: &str, name: &str) -> Option<i64> {
        self.by_key
            .get(key)?
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, time)| *time)
    }

    fn set_in_memory(&mut self, key: &str, name: &'static str, time: i64) -> Option<i64> {
        // One hash lookup, which finds the key's shared copy or adds it.
        let (shared, named) = match self.by_key.entry_ref(key) {
            EntryRef::Occupied(entry) => (entry.key().clone(), entry.into_mut()),
            EntryRef::Vacant(entry) => {
                let entry = entry.insert_entry(NamedTimes::new());
                (entry.key().clone(), entry.into_mut())
            }
        };
        let previous = match named.iter_mut().find(|(n, _)| *n == name) {
            Some((_, at)) => Some(std::mem::replace(at, time)),
            None => {
                named.push((name, time));
                self.live += 1;
                self.bytes += timer_bytes(key);
                None
            }
        };
        if previous != Some(time) {
            self.push(TimerEntry {
                time,
                key: shared,
                name,
            });
        }
        previous
    }

    /// Removes timer `name` of `key` from memory; its heap entry is left
    /// behind.
    fn remove_from_memory(&mut self, key: &str, name: &str) -> Option<i64> {
        let named = self.by_key.get_mut(key)?;
        let position = named.iter().position(|(n, _)| *n == name)?;
        let (_, time) = named.swap_remove(position);
        if named.is_empty() {
            self.by_key.remove(key);
        }
        self.live -= 1;
        self.bytes -= timer_bytes(key);
        Some(time)
    }

    /// Removes timer `name` of `key` from the spill store, if it is there;
    /// returns its time if the queue is exact.
    fn remove_spilled(&mut self, key: &str, name: &str) -> Option<i64> {
        let spill = self.spill.as_mut().filter(|spill| spill.count > 0)?;
        if !spill.filter.may_contain(key, name) {
            return None;
        }
        if !spill.exact {
            if let Err(error) = spill.store.forget(key, name) {
                spill.record(error);
            }
            spill.remember(key, name, None);
            return None;
        }
        let removed = spill.lookup(key, name).and_then(|time| {
            time.map(|time| spill.store.delete(time, key, name).map(|()| time))
                .transpose()
        });
        // Whatever happened, the store has no such timer now (or is broken).
        spill.remember(key, name, None);
        match removed {
            Ok(Some(time)) => {
                spill.count -= 1;
                if spill.count == 0 {
                    spill.emptied();
                }
                Some(time)
            }
            Ok(None) => None,
            Err(error) => {
                spill.record(error);
                None
            }
        }
    }

    /// Writes a timer at or after the horizon (or the first) to the store.
    fn spill_one(&mut self, time: i64, key: &str, name: &'static str) {
        let spill = self.spill.as_mut().expect("only a spilling queue spills");
        if let Err(error) = spill.store.put(time, key, name) {
            spill.last_lookup.take();
            spill.record(error);
            return;
        }
        spill.remember(key, name, Some(time));
        spill.filter.insert(key, name);
        if spill.filter.needs_rebuild() {
            spill.rebuild_filter();
        }
        spill.count += 1;
        if !spill.names.contains(&name) {
            spill.names.push(name);
        }
        if spill
            .horizon
            .as_ref()
            .is_none_or(|h| h.follows(time, key, name))
        {
            spill.horizon = Some(Horizon {
                time,
                key: key.into(),
                name,
            });
        }
    }

    /// Spills the later half of the timers in memory (all of them if there
    /// is one), moving the horizon back to the first of them.
    pub(super) fn spill_latest_half(&mut self) {
        if self.spill.is_none() || self.live == 0 {
            return;
        }
        let mut entries: Vec<TimerEntry> = self.in_memory().collect();
        let keep = entries.len() / 2;
        entries.select_nth_unstable(keep);
        for entry in entries.drain(keep..) {
            self.remove_from_memory(&entry.key, entry.name);
            self.spill_one(entry.time, &entry.key, entry.name);
        }
        drop(entries);
        self.rebuild();
        self.by_key.shrink_to_fit();
        self.by_time.shrink_to_fit();
    }

    /// Begins a bulk load of the spill store, unless the queue is exact
    /// (see [`TaskTimers::bulk_load`](super::TaskTimers::bulk_load)).
    pub(super) fn begin_bulk_load(&mut self) {
        if let Some(spill) = self.spill.as_mut().filter(|spill| !spill.exact) {
            if let Err(error) = spill.store.begin_bulk_load() {
                spill.record(error);
            }
        }
    }

    /// Ends a bulk load of the spill store begun by [`begin_bulk_load`](Self::begin_bulk_load).
    pub(super) fn end_bulk_load(&mut self) {
        if let Some(spill) = self.spill.as_mut() {
            if let Err(error) = spill.store.end_bulk_load() {
                spill.record(error);
            }
        }
    }

    /// Loads the earliest spilled timers into memory until it holds
    /// `refill` bytes (at least one timer); whether any was loaded.
    fn load_spilled(&mut self, refill: usize) -> bool {
        let mut bytes = self.memory();
        let Some(spill) = self.spill.as_mut() else {
            return false;
        };
        let mut loaded: Vec<(i64, Box<str>, &'static str)> = Vec::new();
        let mut next = None;
        let mut unknown = None;
        let names = &spill.names;
        spill.last_lookup.take();
        let taken = spill.store.take_earliest(&mut |time, key, name| {
            let Some(name) = names.iter().copied().find(|known| *known == name) else {
                unknown = Some(name.to_owned());
                return false;
            };
            if bytes >= refill && !loaded.is_empty() {
                next = Some(Horizon {
                    time,
                    key: key.into(),
                    name,
                });
                return false;
            }
            bytes += timer_bytes(key);
            loaded.push((time, key.into(), name));
            true
        });
        let removed = match taken {
            Ok(removed) => removed,
            Err(error) => {
                spill.record(error);
                return false;
            }
        };
        if let Some(name) = unknown {
            spill.record(anyhow::anyhow!(
                "a spilled timer is named '{name}', which was never set"
            ));
            return false;
        }
        spill.count = spill.count.saturating_sub(removed);
        spill.horizon = next;
        if spill.horizon.is_none() {
            // All taken. A blind put over an entry already in the store
            // (a timer moved away and back) counted it twice.
            if spill.exact && spill.count > 0 {
                spill.record(anyhow::anyhow!(
                    "{} spilled timers are missing from the state store",
                    spill.count
                ));
            }
            spill.emptied();
        }
        let any = !loaded.is_empty();
        for (time, key, name) in loaded {
            self.set_in_memory(&key, name, time);
        }
        any
    }

    /// Removes `entry` from the index if it is a live timer, not one left
    /// behind by a move or a removal.
    fn take_if_live(&mut self, entry: &TimerEntry) -> bool {
        let Some(named) = self.by_key.get_mut(&*entry.key) else {
            return false;
        };
        let Some(position) = named
            .iter()
            .position(|&(name, time)| name == entry.name && time == entry.time)
        else {
            return false;
        };
        named.swap_remove(position);
        if named.is_empty() {
            self.by_key.remove(&*entry.key);
        }
        self.live -= 1;
        self.bytes -= timer_bytes(&entry.key);
        true
    }

    fn push(&mut self, entry: TimerEntry) {
        if self.by_time.len() >= 2 * self.live + COMPACT_SLACK {
            self.rebuild();
        }
        self.by_time.push(Reverse(entry));
    }

    /// Rebuilds the heap from the index, dropping left-behind entries.
    fn rebuild(&mut self) {
        let mut entries = std::mem::take(&mut self.by_time).into_vec();
        entries.clear();
        entries.extend(self.in_memory().map(Reverse));
        self.by_time = BinaryHeap::from(entries);
    }

    /// The timers in memory, from the index by key, in no order.
    fn in_memory(&self) -> impl Iterator<Item = TimerEntry> + '_ {
        self.by_key.iter().flat_map(|(key, named)| {
            named.iter().map(|&(name, time)| TimerEntry {
                time,
                key: key.clone(),
                name,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::spill::memory::MemorySpill;
    use super::super::{TaskTimers, TimeDomain};
    use super::*;

    #[test]
    fn timers_pop_in_time_order_and_replace_by_name() {
        let mut timers = TimerQueue::default();
        timers.set("bob", "inactivity", 300);
        timers.set("amy", "inactivity", 100);
        timers.set("bob", "inactivity", 200);
        assert_eq!(timers.len(), 2);
        assert_eq!(&*timers.pop_due(150, 0).unwrap().key, "amy");
        assert!(timers.pop_due(150, 0).is_none());
        assert_eq!(timers.pop_due(200, 0).unwrap().time, 200);
        assert!(timers.is_empty());
    }

    #[test]
    fn several_named_timers_of_a_key_move_and_go_independently() {
        let mut timers = TimerQueue::default();
        assert_eq!(timers.set("k", "a", 10), None);
        assert_eq!(timers.set("k", "b", 5), None);
        assert_eq!(timers.set("k", "a", 3), Some(10));
        assert_eq!(timers.get("k", "a"), Some(3));
        assert_eq!(timers.get("k", "b"), Some(5));
        assert_eq!(timers.remove("k", "b"), Some(5));
        assert_eq!(timers.remove("k", "b"), None);
        assert_eq!(timers.len(), 1);
        let due = timers.pop_due(3, 0).unwrap();
        assert_eq!((&*due.key, due.name, due.time), ("k", "a", 3));
        assert_eq!(timers.get("k", "a"), None);
        assert!(timers.is_empty());
    }

    #[test]
    fn a_timer_moved_away_and_back_or_removed_and_set_again_fires_once() {
        let mut timers = TimerQueue::default();
        timers.set("k", "a", 10);
        timers.set("k", "a", 20);
        timers.set("k", "a", 10);
        timers.set("j", "a", 5);
        timers.remove("j", "a");
        timers.set("j", "a", 5);
        assert_eq!(timers.len(), 2);
        let fired: Vec<(String, i64)> = std::iter::from_fn(|| timers.pop_due(100, 0))
            .map(|entry| (entry.key.to_string(), entry.time))
            .collect();
        assert_eq!(fired, [("j".to_string(), 5), ("k".to_string(), 10)]);
        assert!(timers.is_empty());
    }

    /// Random sets, removals and pops against a plain sorted set: the same
    /// timers fire in the same order, through many heap rebuilds.
    #[test]
    fn the_queue_matches_a_sorted_set_under_random_moves() {
        let mut timers = TaskTimers::in_memory();
        match_a_sorted_set(&mut timers, 300);
        let queue = timers.queue(TimeDomain::EventTime);
        assert!(queue.by_time.len() <= 2 * queue.len() + COMPACT_SLACK + 1);
    }

    /// The same with room in memory for about 40 timers of 300 keys: most
    /// are spilled, loaded back and spilled again, and the order holds.
    #[test]
    fn spilled_timers_fire_in_the_same_order_as_in_memory() {
        for exact in [true, false] {
            let budget = 40 * timer_bytes("k100");
            let mut timers =
                TaskTimers::spilling(budget, exact, |_| Box::new(MemorySpill::default()));
            match_a_sorted_set(&mut timers, 300);
            timers.check().unwrap();
            let queue = timers.queue(TimeDomain::EventTime);
            assert!(queue.bytes <= budget, "{} bytes in memory", queue.bytes);
        }
    }

    /// A queue that is not exact says the old time of an in-memory timer
    /// only, and counts stale spilled entries in its length.
    fn match_a_sorted_set(timers: &mut TaskTimers, keys: u64) {
        let domain = TimeDomain::EventTime;
        let exact = timers
            .queue(domain)
            .spill
            .as_ref()
            .is_none_or(|spill| spill.exact);
        let said = |told: Option<i64>, expected: Option<i64>| {
            if exact {
                assert_eq!(told, expected);
            } else if told.is_some() {
                assert_eq!(told, expected, "a blind queue says the truth or nothing");
            }
        };
        let mut model = std::collections::BTreeMap::<(String, &'static str), i64>::new();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |bound: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % bound
        };
        let mut now = 0;
        let mut spilled_at_most = 0;
        for _ in 0..50_000 {
            let key = format!("k{}", next(keys));
            let name = ["a", "b"][next(2) as usize];
            match next(10) {
                0 => {
                    let expected = model.remove(&(key.clone(), name));
                    said(timers.remove(domain, &key, name), expected);
                }
                1 => {
                    now += next(20) as i64;
                    let mut due: Vec<(i64, String, &str)> = model
                        .iter()
                        .filter(|(_, time)| **time <= now)
                        .map(|((key, name), time)| (*time, key.clone(), *name))
                        .collect();
                    due.sort();
                    for (time, key, name) in due {
                        let entry = timers.pop_due(domain, now).expect("a due timer");
                        assert_eq!((entry.time, &*entry.key, entry.name), (time, &*key, name));
                        model.remove(&(key, name));
                    }
                    assert!(timers.pop_due(domain, now).is_none());
                }
                2 => {
                    let expected = model.get(&(key.clone(), name)).copied();
                    assert_eq!(timers.get(domain, &key, name), expected);
                }
                _ => {
                    let time = now + next(500) as i64;
                    let expected = model.insert((key.clone(), name), time);
                    said(timers.set(domain, &key, name, time), expected);
                }
            }
            if exact {
                assert_eq!(timers.len(), model.len());
            } else {
                assert!(timers.len() >= model.len());
            }
            spilled_at_most = spilled_at_most.max(timers.queue(domain).spilled());
        }
        if timers.budget != usize::MAX {
            assert!(spilled_at_most > 100, "the test spills: {spilled_at_most}");
        }
    }

    /// A spill store that counts its reads.
    #[derive(Default)]
    struct Counted {
        inner: MemorySpill,
        reads: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl SpillStore for Counted {
        fn get(&self, key: &str, name: &str) -> anyhow::Result<Option<i64>> {
            self.reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.inner.get(key, name)
        }
        fn put(&mut self, time: i64, key: &str, name: &str) -> anyhow::Result<()> {
            self.inner.put(time, key, name)
        }
        fn delete(&mut self, time: i64, key: &str, name: &str) -> anyhow::Result<()> {
            self.inner.delete(time, key, name)
        }
        fn forget(&mut self, key: &str, name: &str) -> anyhow::Result<()> {
            self.inner.forget(key, name)
        }
        fn for_each_spilled(&mut self, each: &mut dyn FnMut(&str, &str)) -> anyhow::Result<()> {
            self.inner.for_each_spilled(each)
        }
        fn take_earliest(
            &mut self,
            take: &mut dyn FnMut(i64, &str, &str) -> bool,
        ) -> anyhow::Result<usize> {
            self.inner.take_earliest(take)
        }
    }

    #[test]
    fn timers_never_spilled_are_answered_without_reading_the_store() {
        let store = Counted::default();
        let reads = store.reads.clone();
        let mut queue = TimerQueue::spilling(Box::new(store), false);
        // Everything from time 1 000 000 on spills, through many rebuilds
        // of the filter.
        queue.set("first", "a", 1_000_000);
        queue.spill_latest_half();
        let spilled = 20_000;
        for id in 0..spilled {
            queue.set(&format!("late-{id}"), "a", 2_000_000 + id);
        }
        assert_eq!(queue.spilled(), spilled as usize + 1);
        let reads_before = reads.load(std::sync::atomic::Ordering::Relaxed);
        // Other keys, and the spilled keys' other name: next to no reads.
        for id in 0..spilled {
            assert_eq!(queue.get(&format!("new-{id}"), "a"), None);
            assert_eq!(queue.get(&format!("late-{id}"), "b"), None);
        }
        let wasted = reads.load(std::sync::atomic::Ordering::Relaxed) - reads_before;
        assert!(
            wasted < spilled as usize / 25,
            "{wasted} reads for no timer"
        );
        // Every spilled timer is still found and fires in order.
        for id in (0..spilled).step_by(97) {
            assert!(queue.may_be_set(&format!("late-{id}"), "a"));
            assert_eq!(queue.get(&format!("late-{id}"), "a"), Some(2_000_000 + id));
        }
        let reads_before = reads.load(std::sync::atomic::Ordering::Relaxed);
        let maybe = (0..spilled)
            .filter(|id| queue.may_be_set(&format!("new-{id}"), "a"))
            .count();
        assert!(maybe < spilled as usize / 25, "{maybe} maybes for no timer");
        assert_eq!(
            reads.load(std::sync::atomic::Ordering::Relaxed),
            reads_before
        );
        queue.set("soon", "a", 10);
        assert!(queue.may_be_set("soon", "a"), "in memory");
        let fired: Vec<i64> = std::iter::from_fn(|| queue.pop_due(i64::MAX, 1 << 20))
            .map(|entry| entry.time)
            .collect();
        assert_eq!(fired.len(), spilled as usize + 2);
        assert!(fired.windows(2).all(|pair| pair[0] <= pair[1]));
        // Emptied: the filter starts over.
        let spill = queue.spill.as_ref().unwrap();
        assert_eq!(spill.count, 0);
        assert!(!spill.filter.may_contain("late-0", "a"));
    }

    #[test]
    fn wall_clock_and_event_time_timers_share_one_budget() {
        let budget = 10 * timer_bytes("k0");
        let mut timers = TaskTimers::spilling(budget, true, |_| Box::new(MemorySpill::default()));
        for i in 0..30 {
            timers.set(TimeDomain::EventTime, &format!("k{i}"), "a", i);
            timers.set(TimeDomain::WallClock, &format!("k{i}"), "a", 1_000 + i);
            assert!(
                timers.event_time.bytes + timers.wall_clock.bytes <= budget,
                "over the budget after {i}"
            );
        }
        assert_eq!(timers.len(), 60);
        let fired: Vec<i64> = std::iter::from_fn(|| timers.pop_due(TimeDomain::WallClock, 2_000))
            .map(|entry| entry.time)
            .collect();
        assert_eq!(fired, (1_000..1_030).collect::<Vec<_>>());
        timers.check().unwrap();
    }

    #[test]
    fn a_spill_store_error_stops_the_task() {
        struct Broken;
        impl SpillStore for Broken {
            fn get(&self, _: &str, _: &str) -> anyhow::Result<Option<i64>> {
                anyhow::bail!("disk gone")
            }
            fn put(&mut self, _: i64, _: &str, _: &str) -> anyhow::Result<()> {
                anyhow::bail!("disk gone")
            }
            fn delete(&mut self, _: i64, _: &str, _: &str) -> anyhow::Result<()> {
                anyhow::bail!("disk gone")
            }
            fn forget(&mut self, _: &str, _: &str) -> anyhow::Result<()> {
                anyhow::bail!("disk gone")
            }
            fn for_each_spilled(&mut self, _: &mut dyn FnMut(&str, &str)) -> anyhow::Result<()> {
                anyhow::bail!("disk gone")
            }
            fn take_earliest(
                &mut self,
                _: &mut dyn FnMut(i64, &str, &str) -> bool,
            ) -> anyhow::Result<usize> {
                anyhow::bail!("disk gone")
            }
        }
        let mut timers = TaskTimers::spilling(timer_bytes("k0"), true, |_| Box::new(Broken));
        timers.set(TimeDomain::EventTime, "k0", "a", 1);
        timers.set(TimeDomain::EventTime, "k1", "a", 2);
        let error = timers.check().unwrap_err();
        assert!(format!("{error:#}").contains("disk gone"), "{error:#}");
        timers.check().unwrap();
    }

    #[test]
    fn timers_due_at_the_same_time_pop_in_key_then_name_order() {
        let mut timers = TimerQueue::default();
        for (key, name) in [("b", "x"), ("a", "y"), ("a", "x"), ("B", "x")] {
            timers.set(key, name, 1);
        }
        let order: Vec<(String, &str)> = std::iter::from_fn(|| timers.pop_due(1, 0))
            .map(|entry| (entry.key.to_string(), entry.name))
            .collect();
        assert_eq!(
            order,
            [
                ("B".to_string(), "x"),
                ("a".to_string(), "x"),
                ("a".to_string(), "y"),
                ("b".to_string(), "x")
            ]
        );
    }
}
