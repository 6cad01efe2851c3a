//! Timers: a task's pending timers per time domain, in time order. Those
//! beyond the task's share of the timer memory are spilled to its RocksDB
//! (see [`TimerQueue`]).

mod queue;
mod rocksdb_spill;
mod spill;
mod spill_filter;

use std::sync::Arc;

use crate::state::codec::{i64_from_ordered_bytes, i64_to_ordered_bytes};

pub use queue::TimerQueue;
pub(crate) use rocksdb_spill::TimerSpill;
pub use spill::SpillStore;

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
    pub(crate) fn tag(self) -> u8 {
        match self {
            TimeDomain::EventTime => b'e',
            TimeDomain::WallClock => b'w',
        }
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

/// A task's pending timers of both domains, which share one memory budget.
#[derive(Default)]
pub struct TaskTimers {
    event_time: TimerQueue,
    wall_clock: TimerQueue,
    /// The bytes the timers of both domains may keep in memory together.
    budget: usize,
}

impl TaskTimers {
    /// Timers that keep at most `budget` bytes in memory between both
    /// domains and spill the rest to `spill(domain)`. With `exact`, setting
    /// or removing a spilled timer says the time it had (the caller keeps a
    /// timer store in step), which costs a read of the spill store; without,
    /// the write is blind (see [`TimerQueue`]).
    pub fn spilling(
        budget: usize,
        exact: bool,
        mut spill: impl FnMut(TimeDomain) -> Box<dyn SpillStore>,
    ) -> Self {
        TaskTimers {
            event_time: TimerQueue::spilling(spill(TimeDomain::EventTime), exact),
            wall_clock: TimerQueue::spilling(spill(TimeDomain::WallClock), exact),
            budget,
        }
    }

    /// Timers kept in memory only, however many: for tests.
    pub fn in_memory() -> Self {
        TaskTimers {
            budget: usize::MAX,
            ..TaskTimers::default()
        }
    }

    /// Changes the memory budget (the task's share, as tasks come and go);
    /// timers beyond it are spilled at the next change.
    pub fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
    }

    /// The timers of `domain`.
    pub fn queue(&self, domain: TimeDomain) -> &TimerQueue {
        match domain {
            TimeDomain::EventTime => &self.event_time,
            TimeDomain::WallClock => &self.wall_clock,
        }
    }

    fn queue_mut(&mut self, domain: TimeDomain) -> &mut TimerQueue {
        match domain {
            TimeDomain::EventTime => &mut self.event_time,
            TimeDomain::WallClock => &mut self.wall_clock,
        }
    }

    /// The time of the timer `name` of `key` in `domain`, if one is set.
    pub fn get(&self, domain: TimeDomain, key: &str, name: &str) -> Option<i64> {
        self.queue(domain).get(key, name)
    }

    /// Whether timer `name` of `key` in `domain` may be set (see
    /// [`TimerQueue::may_be_set`]).
    pub fn may_be_set(&self, domain: TimeDomain, key: &str, name: &str) -> bool {
        self.queue(domain).may_be_set(key, name)
    }

    /// Sets timer `name` of `key` in `domain` to `time`; returns the time
    /// it replaced.
    pub fn set(
        &mut self,
        domain: TimeDomain,
        key: &str,
        name: &'static str,
        time: i64,
    ) -> Option<i64> {
        let previous = self.queue_mut(domain).set(key, name, time);
        if self.event_time.memory() + self.wall_clock.memory() > self.budget {
            // Halving the larger queue brings the two under the budget.
            if self.event_time.bytes >= self.wall_clock.bytes {
                self.event_time.spill_latest_half();
            } else {
                self.wall_clock.spill_latest_half();
            }
        }
        previous
    }

    /// Sets timers with `load` as one bulk load, as a task opens: the
    /// timers spilled meanwhile are gathered and written to the spill store
    /// at once, at the end (see [`SpillStore::begin_bulk_load`]). For
    /// timers derived from state: an exact queue, which reads a spilled
    /// timer before it changes it, writes each as it comes.
    pub fn bulk_load(
        &mut self,
        load: impl FnOnce(&mut Self) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.event_time.begin_bulk_load();
        self.wall_clock.begin_bulk_load();
        let loaded = load(self);
        self.event_time.end_bulk_load();
        self.wall_clock.end_bulk_load();
        loaded?;
        self.check()
    }

    /// Removes timer `name` of `key` in `domain`; returns its time.
    pub fn remove(&mut self, domain: TimeDomain, key: &str, name: &str) -> Option<i64> {
        self.queue_mut(domain).remove(key, name)
    }

    /// Removes and returns the earliest timer of `domain` due at `now`
    /// (time <= now): a watermark for event-time timers, epoch
    /// milliseconds for wall-clock ones.
    pub fn pop_due(&mut self, domain: TimeDomain, now: i64) -> Option<TimerEntry> {
        let other = match domain {
            TimeDomain::EventTime => self.wall_clock.memory(),
            TimeDomain::WallClock => self.event_time.memory(),
        };
        // Spilled timers come back until the queue fills half its room.
        let refill = self.budget.saturating_sub(other) / 2;
        self.queue_mut(domain).pop_due(now, refill)
    }

    /// Pending timers of both domains, spilled ones included.
    pub fn len(&self) -> usize {
        self.event_time.len() + self.wall_clock.len()
    }

    /// Whether no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pending timers of both domains in the spill stores.
    pub fn spilled(&self) -> usize {
        self.event_time.spilled() + self.wall_clock.spilled()
    }

    /// The first error of a spill store since the last check: the timers
    /// may have lost a change, so the task must not commit.
    pub fn check(&self) -> anyhow::Result<()> {
        for queue in [&self.event_time, &self.wall_clock] {
            if let Some(spill) = &queue.spill {
                if let Some(error) = spill.failure.take() {
                    return Err(error.context("timers spilled to the state store"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
