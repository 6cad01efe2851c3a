//! Event time: watermarks per input partition and per task, and timers.
//!
//! The rules (docs/services/README.md, "common rules"): a partition's watermark is its
//! largest event time minus the allowed out-of-orderness; a task's watermark is
//! the minimum over its partitions (a partition that has delivered nothing holds
//! it at minus infinity) and never goes backwards. A repartitioned input's
//! watermark is the minimum of what every upstream task has announced.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use hashbrown::hash_map::EntryRef;
use rustc_hash::FxBuildHasher;
use smallvec::SmallVec;
use std::time::{Duration, Instant};

use crate::state::codec::{i64_from_ordered_bytes, i64_to_ordered_bytes};
use crate::watermark::partition_watermark;

/// The watermark before anything has been seen: minus infinity.
pub const NO_WATERMARK: i64 = i64::MIN;

/// Where one input partition's event time comes from.
#[derive(Debug, Clone)]
pub enum PartitionClock {
    /// A source topic partition: the largest event time seen so far.
    Direct { max_event_time: Option<i64> },
    /// A repartition topic partition: the watermark each upstream task
    /// announced, by upstream partition.
    Shuffled { upstream: Vec<Option<i64>> },
}

/// Event-time progress of one input partition of a task.
#[derive(Debug, Clone)]
pub struct InputClock {
    pub clock: PartitionClock,
    /// Wall-clock time of the last record, for idle detection.
    last_activity: Instant,
    /// Repartitioned inputs: when each upstream partition was last heard
    /// from (created, or announced), for idle detection per upstream.
    heard_from: Vec<Instant>,
}

impl InputClock {
    /// A direct input partition that has seen nothing yet.
    pub fn direct(now: Instant) -> Self {
        InputClock {
            clock: PartitionClock::Direct {
                max_event_time: None,
            },
            last_activity: now,
            heard_from: Vec::new(),
        }
    }

    /// A shuffled input (repartition topic or stage link) written by
    /// `upstream_partitions` upstream tasks.
    pub fn shuffled(upstream_partitions: usize, now: Instant) -> Self {
        InputClock {
            clock: PartitionClock::Shuffled {
                upstream: vec![None; upstream_partitions],
            },
            last_activity: now,
            heard_from: vec![now; upstream_partitions],
        }
    }

    /// Notes a record with `event_time` (direct inputs only track it).
    pub fn observe(&mut self, event_time: i64, now: Instant) {
        self.last_activity = now;
        if let PartitionClock::Direct { max_event_time } = &mut self.clock {
            *max_event_time = Some(max_event_time.map_or(event_time, |m| m.max(event_time)));
        }
    }

    /// Notes a watermark announced by upstream task `source`.
    pub fn announce(&mut self, source: usize, watermark: i64, now: Instant) {
        self.last_activity = now;
        if let Some(heard) = self.heard_from.get_mut(source) {
            *heard = now;
        }
        if let PartitionClock::Shuffled { upstream } = &mut self.clock {
            if let Some(slot) = upstream.get_mut(source) {
                *slot = Some(slot.map_or(watermark, |w| w.max(watermark)));
            }
        }
    }

    /// This partition's watermark when upstream partitions not heard from
    /// for `idle_timeout` stop holding it back — unless none has been heard
    /// from, when the whole input is idle and this is its plain watermark.
    fn watermark_without_idle_upstreams(
        &self,
        max_out_of_orderness: i64,
        idle_timeout: Duration,
        now: Instant,
    ) -> i64 {
        let PartitionClock::Shuffled { upstream } = &self.clock else {
            return self.watermark(max_out_of_orderness);
        };
        upstream
            .iter()
            .zip(&self.heard_from)
            .filter(|(_, heard)| now.saturating_duration_since(**heard) < idle_timeout)
            .map(|(w, _)| w.unwrap_or(NO_WATERMARK))
            .min()
            .unwrap_or_else(|| self.watermark(max_out_of_orderness))
    }

    /// This partition's watermark, ignoring idleness.
    pub fn watermark(&self, max_out_of_orderness: i64) -> i64 {
        match &self.clock {
            PartitionClock::Direct { max_event_time } => max_event_time.map_or(NO_WATERMARK, |m| {
                partition_watermark(m, max_out_of_orderness)
            }),
            PartitionClock::Shuffled { upstream } => upstream
                .iter()
                .map(|w| w.unwrap_or(NO_WATERMARK))
                .min()
                .unwrap_or(NO_WATERMARK),
        }
    }

    /// How long this partition has delivered nothing.
    pub fn quiet_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.last_activity)
    }
}

/// How a task treats inputs that have delivered nothing for a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idleness {
    /// Quiet inputs hold the watermark back: results are deterministic.
    Off,
    /// The idle timeout (`--idle-timeout`), for tasks reading the service's input topics: a
    /// partition quiet for this long stops holding the watermark back, and a
    /// task's only input moves on with the wall-clock time since its last
    /// record.
    Inputs(Duration),
    /// For a later stage: only upstream tasks of a link not heard from for
    /// this long (one whose input never received anything, say) stop holding
    /// the watermark back. The stage never moves on by wall clock: its
    /// upstream tasks already do when idle, and a stalled earlier stage must
    /// not have its windows closed before its results arrive.
    Upstreams(Duration),
}

impl Idleness {
    /// Whether quiet inputs or upstreams can stop holding a watermark back.
    pub fn is_on(self) -> bool {
        self != Idleness::Off
    }
}

/// Computes a task's watermark from its input partitions (see [`Idleness`]).
pub fn task_watermark(
    inputs: &[InputClock],
    max_out_of_orderness: i64,
    idleness: Idleness,
    now: Instant,
) -> Option<i64> {
    let idle_timeout = match idleness {
        Idleness::Off => {
            return inputs
                .iter()
                .map(|i| i.watermark(max_out_of_orderness))
                .min()
        }
        Idleness::Upstreams(idle_timeout) => {
            return inputs
                .iter()
                .map(|i| {
                    i.watermark_without_idle_upstreams(max_out_of_orderness, idle_timeout, now)
                })
                .min()
        }
        Idleness::Inputs(idle_timeout) => idle_timeout,
    };
    if let [only] = inputs {
        let base = only.watermark_without_idle_upstreams(max_out_of_orderness, idle_timeout, now);
        let quiet = only.quiet_for(now);
        if base != NO_WATERMARK && quiet >= idle_timeout {
            let elapsed = i64::try_from(quiet.as_millis()).unwrap_or(i64::MAX);
            return Some(base.saturating_add(elapsed));
        }
        return Some(base);
    }
    inputs
        .iter()
        .filter(|i| i.quiet_for(now) < idle_timeout)
        .map(|i| i.watermark_without_idle_upstreams(max_out_of_orderness, idle_timeout, now))
        .min()
}

/// One pending timer: a name per key, at a time. Timers due at the same
/// time fire in key order, then name order (bytes).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TimerEntry {
    pub time: i64,
    /// Shared with the queue's index by key: a timer costs one copy of its
    /// key, however often it is moved.
    pub key: Arc<str>,
    /// One of the processor's timer names (see [`TimerName`](crate::TimerName)).
    pub name: &'static str,
}

/// A timer as the timer store keeps it, borrowed from the store key.
#[derive(Debug, PartialEq, Eq)]
pub struct StoredTimer<'a> {
    pub domain: TimeDomain,
    pub time: i64,
    pub key: &'a str,
    pub name: &'a str,
}

/// Which clock a timer runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeDomain {
    /// Fires when the task watermark reaches the timer's time.
    EventTime,
    /// Fires when the wall clock reaches the timer's time (processing time).
    WallClock,
}

impl TimeDomain {
    /// The first byte of the timer-store keys of this domain.
    fn tag(self) -> u8 {
        match self {
            TimeDomain::EventTime => b'e',
            TimeDomain::WallClock => b'w',
        }
    }
}

/// A task's pending timers of both domains.
#[derive(Debug, Default)]
pub struct TaskTimers {
    event_time: TimerQueue,
    wall_clock: TimerQueue,
}

impl TaskTimers {
    /// The timers of `domain`.
    pub fn queue(&self, domain: TimeDomain) -> &TimerQueue {
        match domain {
            TimeDomain::EventTime => &self.event_time,
            TimeDomain::WallClock => &self.wall_clock,
        }
    }

    /// The timers of `domain`, to change.
    pub fn queue_mut(&mut self, domain: TimeDomain) -> &mut TimerQueue {
        match domain {
            TimeDomain::EventTime => &mut self.event_time,
            TimeDomain::WallClock => &mut self.wall_clock,
        }
    }

    /// Pending timers of both domains.
    pub fn len(&self) -> usize {
        self.event_time.len() + self.wall_clock.len()
    }

    /// Whether no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl TimerEntry {
    /// The state-store key of this timer in `domain`: domain, then time, so
    /// a scan is time-ordered per domain.
    pub fn store_key(&self, domain: TimeDomain) -> Vec<u8> {
        Self::store_key_of(domain, self.time, &self.key, self.name)
    }

    /// The state-store key of timer `name` of `key` at `time`, without
    /// building the entry.
    pub fn store_key_of(domain: TimeDomain, time: i64, key: &str, name: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + 8 + 4 + key.len() + name.len());
        out.push(domain.tag());
        out.extend_from_slice(&i64_to_ordered_bytes(time));
        out.extend_from_slice(&(key.len() as u32).to_be_bytes());
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(name.as_bytes());
        out
    }

    /// Inverse of [`TimerEntry::store_key`].
    pub fn from_store_key(bytes: &[u8]) -> anyhow::Result<StoredTimer<'_>> {
        let (domain, bytes) = match bytes.split_first() {
            Some((b'e', rest)) => (TimeDomain::EventTime, rest),
            Some((b'w', rest)) => (TimeDomain::WallClock, rest),
            _ => anyhow::bail!("timer key of an unknown time domain"),
        };
        anyhow::ensure!(bytes.len() >= 12, "timer key too short");
        let time = i64_from_ordered_bytes(bytes[..8].try_into()?);
        let key_len = u32::from_be_bytes(bytes[8..12].try_into()?) as usize;
        anyhow::ensure!(bytes.len() >= 12 + key_len, "timer key truncated");
        Ok(StoredTimer {
            domain,
            time,
            key: std::str::from_utf8(&bytes[12..12 + key_len])?,
            name: std::str::from_utf8(&bytes[12 + key_len..])?,
        })
    }
}

/// The pending timers of one task, in time order, with one timer per key and
/// name. Persisted through the task's timer store by the caller (or derived
/// from state); this is the in-memory index that makes "next due timer" a
/// cheap lookup.
///
/// The index by key is the truth. The heap by time may also hold entries a
/// timer has since left (moved or removed): moving a timer pushes its new
/// time and leaves the old entry behind, to be skipped when it comes up,
/// instead of searching a sorted set for it. Most timers move on every
/// record of their key (a session's inactivity deadline), so this halves
/// the ordered work of a move, and pushing a later time onto a min-heap
/// rarely climbs. The heap is rebuilt from the index once left-behind
/// entries outnumber live ones, so it stays within about twice the timers.
///
/// A key is stored once, shared by the index and the heap's entries, and
/// names are the processor's static names: moving an existing timer
/// allocates nothing.
#[derive(Debug, Default)]
pub struct TimerQueue {
    by_time: BinaryHeap<Reverse<TimerEntry>>,
    by_key: hashbrown::HashMap<Arc<str>, NamedTimes, FxBuildHasher>,
    /// Timers in `by_key`; `by_time` holds these and left-behind entries.
    live: usize,
}

/// One key's timers, by name, with their times: most keys have one or two
/// (the joiner's order ids: one per side), kept inline. (With room for one,
/// a second spilled to the heap: the joiner's records per CPU-second
/// 142/149/156k -> 148/160/160k with room for two.)
type NamedTimes = SmallVec<[(&'static str, i64); 2]>;

/// Left-behind heap entries tolerated beyond the live ones before a rebuild.
const COMPACT_SLACK: usize = 1024;

impl TimerQueue {
    /// The time of the timer `name` of `key`, if one is set.
    pub fn get(&self, key: &str, name: &str) -> Option<i64> {
        self.by_key
            .get(key)?
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, time)| *time)
    }

    /// Sets timer `name` of `key` to `time`; returns the time it replaced.
    pub fn set(&mut self, key: &str, name: &'static str, time: i64) -> Option<i64> {
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

    /// Removes timer `name` of `key`; returns its time. Its heap entry is
    /// left behind.
    pub fn remove(&mut self, key: &str, name: &str) -> Option<i64> {
        let named = self.by_key.get_mut(key)?;
        let position = named.iter().position(|(n, _)| *n == name)?;
        let (_, time) = named.swap_remove(position);
        if named.is_empty() {
            self.by_key.remove(key);
        }
        self.live -= 1;
        Some(time)
    }

    /// Removes and returns the earliest timer due at `now` (time <= now): a
    /// watermark for event-time timers, epoch milliseconds for wall-clock ones.
    pub fn pop_due(&mut self, now: i64) -> Option<TimerEntry> {
        while self.by_time.peek()?.0.time <= now {
            let Reverse(entry) = self.by_time.pop()?;
            if self.take_if_live(&entry) {
                return Some(entry);
            }
        }
        None
    }

    /// Number of pending timers.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.live == 0
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
        entries.extend(self.by_key.iter().flat_map(|(key, named)| {
            named.iter().map(|&(name, time)| {
                Reverse(TimerEntry {
                    time,
                    key: key.clone(),
                    name,
                })
            })
        }));
        self.by_time = BinaryHeap::from(entries);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_watermark_is_the_minimum_and_waits_for_every_input() {
        let now = Instant::now();
        let mut a = InputClock::direct(Instant::now());
        let b = InputClock::direct(Instant::now());
        a.observe(10_000, now);
        assert_eq!(
            task_watermark(&[a.clone(), b.clone()], 0, Idleness::Off, now),
            Some(NO_WATERMARK)
        );
        let mut b = b;
        b.observe(4_000, now);
        assert_eq!(
            task_watermark(&[a.clone(), b.clone()], 1_000, Idleness::Off, now),
            Some(3_000)
        );
    }

    #[test]
    fn repartitioned_inputs_wait_for_every_upstream_task() {
        let now = Instant::now();
        let mut input = InputClock::shuffled(2, Instant::now());
        input.announce(0, 500, now);
        assert_eq!(input.watermark(0), NO_WATERMARK);
        input.announce(1, 300, now);
        assert_eq!(input.watermark(0), 300);
        input.announce(1, 100, now);
        assert_eq!(input.watermark(0), 300, "announcements never move back");
    }

    #[test]
    fn an_upstream_partition_never_heard_from_stops_holding_back_after_the_idle_timeout() {
        let start = Instant::now();
        let mut input = InputClock::shuffled(2, Instant::now());
        let idle = Idleness::Inputs(Duration::from_secs(2));
        input.announce(0, 700, start + Duration::from_secs(1));
        let waiting = task_watermark(&[input.clone()], 0, idle, start + Duration::from_secs(1));
        assert_eq!(waiting, Some(NO_WATERMARK), "upstream 1 may still come");
        input.announce(0, 900, start + Duration::from_secs(4));
        let mut other = InputClock::direct(Instant::now());
        other.observe(5_000, start + Duration::from_secs(4));
        let later = start + Duration::from_secs(5);
        assert_eq!(
            task_watermark(&[input.clone(), other], 0, idle, later),
            Some(900),
            "upstream 1, silent since the start, no longer counts"
        );
        assert_eq!(
            task_watermark(&[input], 0, Idleness::Off, later),
            Some(NO_WATERMARK)
        );
    }

    #[test]
    fn a_later_stage_drops_silent_upstreams_but_never_follows_wall_clock() {
        let start = Instant::now();
        let mut link = InputClock::shuffled(2, Instant::now());
        let idle = Idleness::Upstreams(Duration::from_secs(2));
        link.announce(0, 700, start);
        assert_eq!(
            task_watermark(&[link.clone()], 0, idle, start + Duration::from_secs(1)),
            Some(NO_WATERMARK),
            "upstream 1 may still come"
        );
        let later = start + Duration::from_secs(60);
        link.announce(0, 900, later);
        assert_eq!(
            task_watermark(&[link.clone()], 0, idle, later),
            Some(900),
            "upstream 1, silent since the start, no longer counts"
        );
        let quiet = task_watermark(&[link], 0, idle, later + Duration::from_secs(60));
        assert!(
            quiet.is_some_and(|w| w <= 900),
            "a quiet link does not move on by itself: {quiet:?}"
        );
    }

    #[test]
    fn an_idle_single_input_follows_wall_clock() {
        let start = Instant::now();
        let mut input = InputClock::direct(Instant::now());
        input.observe(1_000, start);
        let later = start + Duration::from_secs(5);
        let wm = task_watermark(
            &[input.clone()],
            0,
            Idleness::Inputs(Duration::from_secs(2)),
            later,
        )
        .unwrap();
        assert_eq!(wm, 6_000);
        let soon = start + Duration::from_secs(1);
        assert_eq!(
            task_watermark(&[input], 0, Idleness::Inputs(Duration::from_secs(2)), soon),
            Some(1_000)
        );
    }

    #[test]
    fn an_idle_input_stops_holding_back_the_others() {
        let start = Instant::now();
        let mut quiet = InputClock::direct(Instant::now());
        quiet.observe(1_000, start);
        let mut busy = InputClock::direct(Instant::now());
        let later = start + Duration::from_secs(5);
        busy.observe(9_000, later);
        let wm = task_watermark(
            &[quiet, busy],
            0,
            Idleness::Inputs(Duration::from_secs(2)),
            later,
        );
        assert_eq!(wm, Some(9_000));
    }

    #[test]
    fn timers_pop_in_time_order_and_replace_by_name() {
        let mut timers = TimerQueue::default();
        timers.set("bob", "inactivity", 300);
        timers.set("amy", "inactivity", 100);
        timers.set("bob", "inactivity", 200);
        assert_eq!(timers.len(), 2);
        assert_eq!(&*timers.pop_due(150).unwrap().key, "amy");
        assert!(timers.pop_due(150).is_none());
        assert_eq!(timers.pop_due(200).unwrap().time, 200);
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
        let due = timers.pop_due(3).unwrap();
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
        let fired: Vec<(String, i64)> = std::iter::from_fn(|| timers.pop_due(100))
            .map(|entry| (entry.key.to_string(), entry.time))
            .collect();
        assert_eq!(fired, [("j".to_string(), 5), ("k".to_string(), 10)]);
        assert!(timers.is_empty());
    }

    /// Random sets, removals and pops against a plain sorted set: the same
    /// timers fire in the same order, through many heap rebuilds.
    #[test]
    fn the_queue_matches_a_sorted_set_under_random_moves() {
        let mut queue = TimerQueue::default();
        let mut model = std::collections::BTreeMap::<(String, &'static str), i64>::new();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |bound: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % bound
        };
        let mut now = 0;
        for _ in 0..50_000 {
            let key = format!("k{}", next(300));
            let name = ["a", "b"][next(2) as usize];
            match next(10) {
                0 => {
                    let expected = model.remove(&(key.clone(), name));
                    assert_eq!(queue.remove(&key, name), expected);
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
                        let entry = queue.pop_due(now).expect("a due timer");
                        assert_eq!((entry.time, &*entry.key, entry.name), (time, &*key, name));
                        model.remove(&(key, name));
                    }
                    assert!(queue.pop_due(now).is_none());
                }
                _ => {
                    let time = now + next(500) as i64;
                    let expected = model.insert((key.clone(), name), time);
                    assert_eq!(queue.set(&key, name, time), expected);
                }
            }
            assert_eq!(queue.len(), model.len());
            assert!(queue.by_time.len() <= 2 * queue.len() + COMPACT_SLACK + 1);
        }
    }

    #[test]
    fn timers_due_at_the_same_time_pop_in_key_then_name_order() {
        let mut timers = TimerQueue::default();
        for (key, name) in [("b", "x"), ("a", "y"), ("a", "x"), ("B", "x")] {
            timers.set(key, name, 1);
        }
        let order: Vec<(String, &str)> = std::iter::from_fn(|| timers.pop_due(1))
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

    #[test]
    fn timer_store_keys_sort_by_time_even_before_the_epoch() {
        let early = TimerEntry {
            time: -5,
            key: "z".into(),
            name: "t",
        };
        let late = TimerEntry {
            time: 7,
            key: "a".into(),
            name: "t",
        };
        let domain = TimeDomain::EventTime;
        assert!(early.store_key(domain) < late.store_key(domain));
        for domain in [TimeDomain::EventTime, TimeDomain::WallClock] {
            assert_eq!(
                TimerEntry::from_store_key(&late.store_key(domain)).unwrap(),
                StoredTimer {
                    domain,
                    time: 7,
                    key: "a",
                    name: "t"
                }
            );
        }
    }
}
