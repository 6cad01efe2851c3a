//! Timers: a task's pending timers per time domain, in time order. Those
//! beyond the task's share of the timer memory are spilled to its RocksDB
//! (see [`TimerQueue`]).

mod queue;
mod spill;

use std::sync::Arc;

use crate::state::codec::{i64_from_ordered_bytes, i64_to_ordered_bytes};

pub use queue::{TaskTimers, TimerQueue};
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
