//! The [`Context`] a processor works with: named keyed state, timers, the
//! watermark, the wall clock, `emit`, jobs and counters.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{
    declared_store, Completion, CounterName, Job, MapState, Processor, TimerName, ValueState,
};
use crate::collector::Collector;
use crate::output::OutputEncoder;
use crate::state::codec::{decode_value, encode_value, map_prefix, MapKey};
use crate::state::store::TaskStore;
use crate::state::StoreIndex;
use crate::timers::{TaskTimers, TimeDomain, TimerEntry};
use crate::watermark::Announcement;

/// A page of a store's committed entries ([`Context::committed_page`]).
pub struct StatePage<V> {
    /// Keys and values, in key order.
    pub entries: Vec<(String, V)>,
    /// The key the next page starts after: `None` once the store has no
    /// more (a page of fewer entries than asked for is the last).
    pub next: Option<String>,
}

/// What a processor may do while handling a record or a timer.
pub struct Context<'a, P: Processor> {
    pub(crate) store: &'a mut TaskStore,
    pub(crate) timers: &'a mut TaskTimers,
    /// Where timers are persisted; none if they are derived from state.
    pub(crate) timer_store: Option<StoreIndex>,
    pub(crate) watermark: i64,
    pub(crate) now_ms: i64,
    pub(crate) collector: &'a mut Collector,
    pub(crate) output: &'a OutputEncoder,
    /// The watermark that results carry when they feed another stage.
    pub(crate) stamp: Option<Announcement>,
    pub(crate) counters: &'a mut BTreeMap<&'static str, u64>,
    pub(crate) shutdown: &'a Arc<AtomicBool>,
    /// Jobs submitted during this call, started by the task after it.
    pub(crate) submitted: &'a mut Vec<Job<P>>,
    pub(crate) _processor: PhantomData<fn(&P)>,
}

impl<P: Processor> Context<'_, P> {
    /// The task watermark; [`NO_WATERMARK`](crate::NO_WATERMARK) until every input has delivered.
    pub fn watermark(&self) -> i64 {
        self.watermark
    }

    /// Wall-clock time in epoch milliseconds (processing time), read once
    /// per batch of work; the test driver's clock in tests.
    pub fn now(&self) -> i64 {
        self.now_ms
    }

    /// Writes `value` to the output topic with `key` (partitioned by murmur2
    /// of the key, like the Java client; keyless results go to partition 0).
    pub fn emit(&mut self, key: Option<&str>, value: &P::Output) -> anyhow::Result<()> {
        self.output.emit(self.collector, key, value, self.stamp)
    }

    /// Whether the service has been asked to stop. Processor code that waits
    /// (for an external service, say) checks it and gives up with an error:
    /// the stage then stops without committing, and the uncommitted work is
    /// done again after the restart.
    pub fn shutdown_requested(&self) -> bool {
        self.shutdown.load(Ordering::Relaxed)
    }

    /// A flag that turns true when the service is asked to stop, for a job
    /// (see [`submit`](Self::submit)) that waits on something external.
    pub fn shutdown_flag(&self) -> Arc<AtomicBool> {
        self.shutdown.clone()
    }

    /// Runs `job` off the processing thread (on one of the stage's job
    /// workers) while the task goes on with other records; the
    /// [`Completion`] it returns then runs on the processing thread, with
    /// the processor and a context, in submission order among the task's
    /// jobs. The task's next commit waits for every job it has started (no
    /// transaction is open meanwhile, and at most two jobs per worker are
    /// in flight: tasks wait past that). A job that fails fails the stage,
    /// like an error from `process`.
    ///
    /// See [`Completion`] for how this keeps exactly-once.
    pub fn submit(&mut self, job: impl FnOnce() -> anyhow::Result<Completion<P>> + Send + 'static) {
        self.submitted.push(Box::new(job));
    }

    /// Adds one to the processor's `counter` (exported as a metric).
    pub fn increment(&mut self, counter: impl CounterName) {
        self.add(counter, 1);
    }

    /// Adds `count` to the processor's `counter`.
    pub fn add(&mut self, counter: impl CounterName, count: u64) {
        *self.counters.entry(counter.name()).or_default() += count;
    }

    fn index(&self, name: &str) -> StoreIndex {
        declared_store(self.store, name)
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

    /// Changes the value of `state` for `key` in place: `change` gets the
    /// current value (`None`: absent) and may replace it, change it, or set
    /// it to `None` to delete it; its result is returned.
    ///
    /// Prefer this to [`get`](Self::get) then [`put`](Self::put) for a
    /// read-modify-write: the value stays decoded until the commit, so a key
    /// that many records change between two commits is decoded and encoded
    /// once per commit instead of once per record.
    pub fn update<T, R>(
        &mut self,
        state: &ValueState<T>,
        key: &str,
        change: impl FnOnce(&mut Option<T>) -> R,
    ) -> anyhow::Result<R>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        let store = self.index(state.name);
        self.store.update(store, key.as_bytes(), change)
    }

    /// [`update`](Self::update) of a key the processor knows has no value
    /// in `state`, from its own bookkeeping (a timer set exactly while the
    /// key has a value, say, tested with
    /// [`may_have_timer`](Self::may_have_timer)): `change` sees `None`, or
    /// what was written since the last commit, without a read of committed
    /// state (which, for a key that has none, misses the read cache and
    /// goes to RocksDB). A value that does exist is overwritten unseen.
    pub fn update_new<T, R>(
        &mut self,
        state: &ValueState<T>,
        key: &str,
        change: impl FnOnce(&mut Option<T>) -> R,
    ) -> anyhow::Result<R>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        let store = self.index(state.name);
        self.store.update_new(store, key.as_bytes(), change)
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

    /// A page of up to `limit` committed values of `state`, decoded as `V`
    /// (a lighter view of its type, like
    /// [`StateView::for_each_as`](super::StateView::for_each_as)), in key
    /// order from the first key after `after` (from the first without).
    ///
    /// For a sweep that goes through a store a page at a time between
    /// records (a timer that sets itself again at the watermark, to fire at
    /// its next advance): only committed state is read, so what changed
    /// since the last commit is not seen until a later sweep, and a value
    /// to change is read again with [`update`](Self::update).
    pub fn committed_page<T, V: DeserializeOwned>(
        &mut self,
        state: &ValueState<T>,
        after: Option<&str>,
        limit: usize,
    ) -> anyhow::Result<StatePage<V>> {
        let store = self.index(state.name);
        let mut entries = Vec::new();
        let last =
            self.store
                .committed_page(store, after.map(str::as_bytes), limit, |key, value| {
                    entries.push((std::str::from_utf8(key)?.to_owned(), decode_value(value)?));
                    Ok(())
                })?;
        let next = last.map(String::from_utf8).transpose()?;
        Ok(StatePage { entries, next })
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
        &mut self,
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

    /// Sets the event-time timer `name` of `key` to fire when the watermark
    /// reaches `time`, replacing any earlier setting. A time at or before the
    /// current watermark fires at the next watermark advance.
    pub fn set_timer(&mut self, key: &str, name: P::Timers, time: i64) {
        self.set_in(TimeDomain::EventTime, key, name, time);
    }

    /// Clears the event-time timer `name` of `key`, if set.
    pub fn clear_timer(&mut self, key: &str, name: P::Timers) {
        self.clear_in(TimeDomain::EventTime, key, name);
    }

    /// The time the event-time timer `name` of `key` is set for.
    pub fn timer(&self, key: &str, name: P::Timers) -> Option<i64> {
        self.timers.get(TimeDomain::EventTime, key, name.name())
    }

    /// Whether the event-time timer `name` of `key` may be set: `false` is
    /// certain, `true` may be wrong for a timer spilled beyond memory (a
    /// filter answers, where [`timer`](Self::timer) reads RocksDB). For a
    /// processor whose timers follow from its state, a test before reading
    /// that state that costs no read when there is none.
    pub fn may_have_timer(&self, key: &str, name: P::Timers) -> bool {
        self.timers
            .may_be_set(TimeDomain::EventTime, key, name.name())
    }

    /// Sets the wall-clock timer `name` of `key` to fire once [`now`](Self::now)
    /// reaches `at` (epoch milliseconds), like Kafka Streams' `WALL_CLOCK_TIME`
    /// punctuation; replaces any earlier setting.
    pub fn set_wall_clock_timer(&mut self, key: &str, name: P::Timers, at: i64) {
        self.set_in(TimeDomain::WallClock, key, name, at);
    }

    /// Clears the wall-clock timer `name` of `key`, if set.
    pub fn clear_wall_clock_timer(&mut self, key: &str, name: P::Timers) {
        self.clear_in(TimeDomain::WallClock, key, name);
    }

    /// The time the wall-clock timer `name` of `key` is set for.
    pub fn wall_clock_timer(&self, key: &str, name: P::Timers) -> Option<i64> {
        self.timers.get(TimeDomain::WallClock, key, name.name())
    }

    fn set_in(&mut self, domain: TimeDomain, key: &str, name: P::Timers, time: i64) {
        let name = name.name();
        let previous = self.timers.set(domain, key, name, time);
        let Some(timer_store) = self.timer_store else {
            return;
        };
        if let Some(previous) = previous {
            self.store.delete(
                timer_store,
                TimerEntry::store_key_of(domain, previous, key, name),
            );
        }
        self.store.put(
            timer_store,
            TimerEntry::store_key_of(domain, time, key, name),
            Vec::new(),
        );
    }

    fn clear_in(&mut self, domain: TimeDomain, key: &str, name: P::Timers) {
        let name = name.name();
        let previous = self.timers.remove(domain, key, name);
        if let (Some(previous), Some(timer_store)) = (previous, self.timer_store) {
            self.store.delete(
                timer_store,
                TimerEntry::store_key_of(domain, previous, key, name),
            );
        }
    }
}
