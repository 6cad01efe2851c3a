//! The Processor API: what a service implements, and what it may touch.
//!
//! A service is a [`Processor`]: `process` is called for every on-time input
//! record and `on_timer` for every event-time timer that comes due. Everything
//! else — consuming, decoding, watermarks, state persistence, changelogs,
//! transactions, rebalances — belongs to the runtime. Like Kafka Streams'
//! Processor API, the domain code only sees an immutable [`Record`], a
//! [`Timer`] and a [`Context`] with named keyed state, timers, the watermark and
//! `emit`.
//!
//! One processor instance exists per task (input partition), cloned from the
//! one the service hands to the runtime; keep all durable data in the
//! context's state, never in fields.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::output::Output;
use crate::state::codec::{decode_value, encode_value, map_prefix, MapKey};
use crate::state::store::{StoreIndex, TaskStore};
use crate::time::{TimerEntry, TimerQueue, NO_WATERMARK};

/// Domain logic of a service.
pub trait Processor: Clone + Send + 'static {
    /// The decoded input: usually an enum with one variant per input topic.
    type Input: Send + 'static;
    /// The value written to the output topic.
    type Output: Serialize;

    /// Handles one input record that is not late.
    fn process(
        &mut self,
        ctx: &mut Context<'_, Self::Output>,
        record: Record<'_, Self::Input>,
    ) -> anyhow::Result<()>;

    /// Handles a timer that came due (the watermark reached its time).
    fn on_timer(
        &mut self,
        ctx: &mut Context<'_, Self::Output>,
        timer: Timer<'_>,
    ) -> anyhow::Result<()>;

    /// Whether a record at `event_time` is late against the task watermark as
    /// it was before the record. Default: strictly before the watermark.
    /// Windowed processors override this with the window rule.
    fn is_late(&self, event_time: i64, watermark: i64) -> bool {
        watermark != NO_WATERMARK && event_time < watermark
    }
}

/// One input record, as the processor sees it.
#[derive(Debug)]
pub struct Record<'a, I> {
    /// The record key (UTF-8), if it has one.
    pub key: Option<&'a str>,
    /// The decoded value.
    pub value: I,
    /// Event time in epoch milliseconds.
    pub event_time: i64,
}

/// A timer that came due.
#[derive(Debug, Clone, Copy)]
pub struct Timer<'a> {
    /// The key the timer was registered for.
    pub key: &'a str,
    /// The timer's name.
    pub name: &'a str,
    /// The event time it was set for.
    pub time: i64,
}

/// A named store of one value per key. Declare it as a `const` and list its
/// name in the topology; the name is the store's identity on disk and in its
/// changelog topic, so it must never change.
#[derive(Debug)]
pub struct ValueState<T> {
    name: &'static str,
    _value: PhantomData<fn() -> T>,
}

impl<T> ValueState<T> {
    /// A store named `name`.
    pub const fn new(name: &'static str) -> Self {
        ValueState {
            name,
            _value: PhantomData,
        }
    }

    /// The store's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

/// A named store of a map per key, whose entries are read and written one at
/// a time (like Flink's `MapView`), and scanned in key order.
#[derive(Debug)]
pub struct MapState<K, V> {
    name: &'static str,
    _entry: PhantomData<fn() -> (K, V)>,
}

impl<K, V> MapState<K, V> {
    /// A store named `name`.
    pub const fn new(name: &'static str) -> Self {
        MapState {
            name,
            _entry: PhantomData,
        }
    }

    /// The store's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

/// What a processor may do while handling a record or a timer.
pub struct Context<'a, O> {
    pub(crate) store: &'a mut TaskStore,
    pub(crate) timers: &'a mut TimerQueue,
    pub(crate) timer_store: StoreIndex,
    pub(crate) watermark: i64,
    pub(crate) output: &'a mut Output,
    pub(crate) counters: &'a mut BTreeMap<&'static str, u64>,
    pub(crate) shutdown: &'a AtomicBool,
    pub(crate) _output: PhantomData<fn(O)>,
}

impl<O: Serialize> Context<'_, O> {
    /// The task watermark; [`NO_WATERMARK`] until every input has delivered.
    pub fn watermark(&self) -> i64 {
        self.watermark
    }

    /// Writes `value` to the output topic with `key` (partitioned by murmur2
    /// of the key, like the Java client).
    pub fn emit(&mut self, key: Option<&str>, value: &O) -> anyhow::Result<()> {
        self.output.emit(key, value)
    }

    /// Whether the service has been asked to stop. Processor code that waits
    /// (for an external service, say) checks it and gives up with an error:
    /// the stage then stops without committing, and the uncommitted work is
    /// done again after the restart.
    pub fn shutdown_requested(&self) -> bool {
        self.shutdown.load(Ordering::Relaxed)
    }

    /// Adds one to the service counter `name` (exported as a metric).
    pub fn increment(&mut self, name: &'static str) {
        *self.counters.entry(name).or_default() += 1;
    }

    fn index(&self, name: &str) -> StoreIndex {
        self.store
            .index_of(name)
            .unwrap_or_else(|| panic!("state store '{name}' is not declared in the topology"))
    }

    /// The value of `state` for `key`.
    pub fn get<T: DeserializeOwned>(
        &mut self,
        state: &ValueState<T>,
        key: &str,
    ) -> anyhow::Result<Option<T>> {
        let store = self.index(state.name);
        self.store
            .read(store, key.as_bytes(), decode_value::<T>)?
            .transpose()
    }

    /// Sets the value of `state` for `key`.
    pub fn put<T: Serialize>(
        &mut self,
        state: &ValueState<T>,
        key: &str,
        value: &T,
    ) -> anyhow::Result<()> {
        let store = self.index(state.name);
        self.store
            .put(store, key.as_bytes().to_vec(), encode_value(value)?);
        Ok(())
    }

    /// Sets the value of `state` for `key` to `value`, or removes it when
    /// `value` is `None` (an emptied collection, say: absent keys cost nothing).
    pub fn put_or_delete<T: Serialize>(
        &mut self,
        state: &ValueState<T>,
        key: &str,
        value: Option<&T>,
    ) -> anyhow::Result<()> {
        match value {
            Some(value) => self.put(state, key, value),
            None => {
                self.delete(state, key);
                Ok(())
            }
        }
    }

    /// Removes the value of `state` for `key`.
    pub fn delete<T>(&mut self, state: &ValueState<T>, key: &str) {
        let store = self.index(state.name);
        self.store.delete(store, key.as_bytes().to_vec());
    }

    fn map_key<K: MapKey>(key: &str, entry: &K) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(key.len() + 24);
        map_prefix(key.as_bytes(), &mut bytes);
        entry.encode_key(&mut bytes);
        bytes
    }

    /// One entry of `key`'s map.
    pub fn map_get<K: MapKey, V: DeserializeOwned>(
        &mut self,
        map: &MapState<K, V>,
        key: &str,
        entry: &K,
    ) -> anyhow::Result<Option<V>> {
        let store = self.index(map.name);
        self.store
            .read(store, &Self::map_key(key, entry), decode_value::<V>)?
            .transpose()
    }

    /// Sets one entry of `key`'s map.
    pub fn map_put<K: MapKey, V: Serialize>(
        &mut self,
        map: &MapState<K, V>,
        key: &str,
        entry: &K,
        value: &V,
    ) -> anyhow::Result<()> {
        let store = self.index(map.name);
        self.store
            .put(store, Self::map_key(key, entry), encode_value(value)?);
        Ok(())
    }

    /// Removes one entry of `key`'s map.
    pub fn map_remove<K: MapKey, V>(&mut self, map: &MapState<K, V>, key: &str, entry: &K) {
        let store = self.index(map.name);
        self.store.delete(store, Self::map_key(key, entry));
    }

    /// Every entry of `key`'s map, in key order.
    pub fn map_entries<K: MapKey, V: DeserializeOwned>(
        &self,
        map: &MapState<K, V>,
        key: &str,
    ) -> anyhow::Result<Vec<(K, V)>> {
        let store = self.index(map.name);
        let mut prefix = Vec::with_capacity(key.len() + 4);
        map_prefix(key.as_bytes(), &mut prefix);
        self.store
            .scan_prefix(store, &prefix)?
            .into_iter()
            .map(|(bytes, value)| {
                Ok((
                    K::decode_key(&bytes[prefix.len()..])?,
                    decode_value(&value)?,
                ))
            })
            .collect()
    }

    /// Sets the timer `name` of `key` to fire when the watermark reaches `time`,
    /// replacing any earlier setting. A time at or before the current
    /// watermark fires at the next watermark advance.
    pub fn set_timer(&mut self, key: &str, name: &str, time: i64) {
        if let Some(previous) = self.timers.set(key, name, time) {
            self.store.delete(self.timer_store, previous.store_key());
        }
        self.store.put(
            self.timer_store,
            TimerEntry::store_key_of(time, key, name),
            Vec::new(),
        );
    }

    /// Clears the timer `name` of `key`, if set.
    pub fn clear_timer(&mut self, key: &str, name: &str) {
        if let Some(previous) = self.timers.remove(key, name) {
            self.store.delete(self.timer_store, previous.store_key());
        }
    }

    /// The time the timer `name` of `key` is set for.
    pub fn timer(&self, key: &str, name: &str) -> Option<i64> {
        self.timers.get(key, name)
    }
}
