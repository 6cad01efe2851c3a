//! The Processor API: what a service implements, and what it may touch.
//!
//! A service is a [`Processor`]: `process` is called for every on-time input
//! record and `on_timer` for every timer that comes due. Everything else —
//! consuming, decoding, watermarks, state persistence, changelogs,
//! transactions, rebalances — belongs to the runtime. Like Kafka Streams'
//! Processor API, the domain code only sees an immutable [`Record`], a
//! [`Timer`] and a [`Context`] with named keyed state, timers, the watermark,
//! the wall clock and `emit`.
//!
//! One processor instance exists per task (input partition), cloned from the
//! one the service hands to the runtime; keep all durable data in the
//! context's state, never in fields.
//!
//! Stores are declared once, with [`stores!`](crate::stores), which also
//! lists them for the processor's [`Processor::STORES`]; timer names are an
//! enum declared with [`timer_names!`](crate::timer_names), so `on_timer`
//! matches them exhaustively.

mod context;

use std::fmt::Debug;
use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::state::codec::{decode_value, split_map_key, MapKey};
use crate::state::store::TaskStore;
use crate::state::StoreIndex;
use crate::time::NO_WATERMARK;
use crate::timers::{TaskTimers, TimeDomain};
pub use context::{Context, StatePage};

/// Domain logic of a service.
pub trait Processor: Clone + Send + 'static {
    /// The decoded input: usually an enum with one variant per input topic.
    type Input: Send + 'static;
    /// The value written to the output topic.
    type Output: Serialize;
    /// The names of this processor's timers (see [`timer_names!`](crate::timer_names)).
    type Timers: TimerName;

    /// The state stores this processor uses, as listed by
    /// [`stores!`](crate::stores). The runtime opens exactly these (plus its
    /// own), each with a changelog topic.
    const STORES: &'static [StoreSpec];

    /// Handles one input record that is not late.
    fn process(
        &mut self,
        ctx: &mut Context<'_, Self>,
        record: Record<'_, Self::Input>,
    ) -> anyhow::Result<()>;

    /// Handles a timer that came due: an event-time timer when the watermark
    /// reached its time, a wall-clock timer when the clock did.
    fn on_timer(
        &mut self,
        ctx: &mut Context<'_, Self>,
        timer: Timer<'_, Self::Timers>,
    ) -> anyhow::Result<()>;

    /// Whether a record at `event_time` is late against the task watermark as
    /// it was before the record. Default: strictly before the watermark.
    /// Windowed processors override this with the window rule.
    fn is_late(&self, event_time: i64, watermark: i64) -> bool {
        watermark != NO_WATERMARK && event_time < watermark
    }

    /// How a task's pending timers come back when it opens. `None` (the
    /// default): every `set_timer` is written to a timer store and its
    /// changelog, and loaded from there. `Some(derive)`: this processor's
    /// pending timers follow from its state, so the runtime keeps them in
    /// memory only (a `set_timer` writes nothing to a store or a
    /// changelog), and a task that opens has `derive` set them all again
    /// from its committed state.
    ///
    /// The contract: after every `process` and `on_timer`, the timers set
    /// are exactly those `derive` would set from the state. A timer that
    /// has fired must leave state from which it is not derived again.
    const DERIVE_TIMERS: Option<DeriveTimers<Self>> = None;
}

/// Sets every pending timer of a task from its committed state (see
/// [`Processor::DERIVE_TIMERS`]).
pub type DeriveTimers<P> = fn(&P, &StateView<'_>, &mut DerivedTimers<'_, P>) -> anyhow::Result<()>;

/// The index of the store `name`, which the processor must have declared
/// in its `STORES` (using an undeclared one is a programming error).
fn declared_store(store: &TaskStore, name: &str) -> StoreIndex {
    store
        .index_of(name)
        .unwrap_or_else(|| panic!("state store '{name}' is missing from the processor's STORES"))
}

/// A task's committed state, read while its timers are derived (see
/// [`Processor::DERIVE_TIMERS`]).
pub struct StateView<'a> {
    pub(crate) store: &'a TaskStore,
}

impl StateView<'_> {
    /// Calls `visit` with every key of `state` and its value, in key order.
    pub fn for_each<T: DeserializeOwned>(
        &self,
        state: &ValueState<T>,
        visit: impl FnMut(&str, T) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.for_each_as(state, visit)
    }

    /// Like [`Self::for_each`], but decodes each value as `V`: a lighter
    /// view of the state's type that reads only what the timers need (the
    /// fields it names, or `serde::de::IgnoredAny` for a part to skip), so
    /// that deriving a task's timers does not build every value in full.
    pub fn for_each_as<T, V: DeserializeOwned>(
        &self,
        state: &ValueState<T>,
        mut visit: impl FnMut(&str, V) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.store
            .for_each_committed(self.index(state.name), |key, value| {
                visit(std::str::from_utf8(key)?, decode_value(value)?)
            })
    }

    /// Calls `visit` with the key and the entry key of every entry of every
    /// key's map in `map`, in key order (values are not read).
    pub fn for_each_map_key<K: MapKey, V>(
        &self,
        map: &MapState<K, V>,
        mut visit: impl FnMut(&str, K) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.store
            .for_each_committed(self.index(map.name), |bytes, _| {
                let (key, entry) = split_map_key(bytes)?;
                visit(std::str::from_utf8(key)?, K::decode_key(entry)?)
            })
    }

    fn index(&self, name: &str) -> StoreIndex {
        declared_store(self.store, name)
    }
}

/// Where a [`DeriveTimers`] function sets a task's timers.
pub struct DerivedTimers<'a, P: Processor> {
    pub(crate) timers: &'a mut TaskTimers,
    pub(crate) _processor: PhantomData<fn(&P)>,
}

impl<P: Processor> DerivedTimers<'_, P> {
    /// Sets the event-time timer `name` of `key` (see [`Context::set_timer`]).
    pub fn set_timer(&mut self, key: &str, name: P::Timers, time: i64) {
        self.timers
            .set(TimeDomain::EventTime, key, name.name(), time);
    }

    /// Sets the wall-clock timer `name` of `key` (see
    /// [`Context::set_wall_clock_timer`]).
    pub fn set_wall_clock_timer(&mut self, key: &str, name: P::Timers, at: i64) {
        self.timers.set(TimeDomain::WallClock, key, name.name(), at);
    }
}

/// The names of a processor's timers: an enum, so that `on_timer` can match
/// every name and the compiler finds the one forgotten. The text of a name is
/// stored with the timer and must never change.
pub trait TimerName: Copy + Eq + Debug + Send + 'static {
    /// The stored text of every name, in declaration order.
    const NAMES: &'static [&'static str];
    /// The stored text of this name.
    fn name(self) -> &'static str;
    /// The name whose stored text is `text`.
    fn from_name(text: &str) -> Option<Self>;
}

/// Timer names of a processor that sets no timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoTimers {}

impl TimerName for NoTimers {
    const NAMES: &'static [&'static str] = &[];
    fn name(self) -> &'static str {
        match self {}
    }
    fn from_name(_: &str) -> Option<Self> {
        None
    }
}

/// A processor's domain counter (exported as `streams_processor_events_total`
/// with its name as the `name` label), declared with [`counter_names!`](crate::counter_names).
pub trait CounterName: Copy {
    /// The counter's name.
    fn name(self) -> &'static str;
}

/// Declares an enum of a processor's counters and implements
/// [`CounterName`] for it, so that a counter is named once and a typo does
/// not compile.
///
/// ```
/// streams_runtime::counter_names! {
///     /// What the sessionizer counts.
///     pub enum SessionCounter {
///         Completed = "sessions_completed",
///         TimedOut = "sessions_timed_out",
///     }
/// }
/// use streams_runtime::CounterName;
/// assert_eq!(SessionCounter::TimedOut.name(), "sessions_timed_out");
/// ```
#[macro_export]
macro_rules! counter_names {
    (
        $(#[$meta:meta])*
        $vis:vis enum $enum:ident {
            $($(#[$variant_meta:meta])* $variant:ident = $text:literal),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis enum $enum {
            $($(#[$variant_meta])* $variant),+
        }

        impl $crate::CounterName for $enum {
            fn name(self) -> &'static str {
                match self {
                    $($enum::$variant => $text),+
                }
            }
        }
    };
}

/// Declares an enum of timer names and implements [`TimerName`] for it.
///
/// ```
/// streams_runtime::timer_names! {
///     /// A session's timers.
///     pub enum SessionTimer {
///         /// The session has been inactive too long.
///         Inactivity = "inactivity",
///         Heartbeat = "heartbeat",
///     }
/// }
/// use streams_runtime::TimerName;
/// assert_eq!(SessionTimer::from_name("inactivity"), Some(SessionTimer::Inactivity));
/// assert_eq!(SessionTimer::Heartbeat.name(), "heartbeat");
/// ```
#[macro_export]
macro_rules! timer_names {
    (
        $(#[$meta:meta])*
        $vis:vis enum $enum:ident {
            $($(#[$variant_meta:meta])* $variant:ident = $text:literal),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis enum $enum {
            $($(#[$variant_meta])* $variant),+
        }

        impl $crate::TimerName for $enum {
            const NAMES: &'static [&'static str] = &[$($text),+];

            fn name(self) -> &'static str {
                match self {
                    $($enum::$variant => $text),+
                }
            }

            fn from_name(text: &str) -> Option<Self> {
                match text {
                    $($text => Some($enum::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

/// Declares state stores — each a `const` handle with its permanent name —
/// and a `STORES` list of them for [`Processor::STORES`], so that a
/// store cannot be used without being opened (and can be queried, see
/// [`crate::query`]).
///
/// ```
/// use std::collections::BTreeMap;
/// use streams_runtime::{MapState, ValueState};
///
/// streams_runtime::stores! {
///     /// Open sessions by user.
///     pub SESSIONS: ValueState<String> = "sessions";
///     /// Readings by window start.
///     READINGS: MapState<i64, f64> = "readings";
///     /// Orders by id, mostly read for ids they do not have.
///     ORDERS: ValueState<String> = "orders".with_key_filter();
/// }
/// let names: Vec<&str> = STORES.iter().map(|store| store.name).collect();
/// assert_eq!(names, ["sessions", "readings", "orders"]);
/// assert_eq!(SESSIONS.name(), "sessions");
/// assert!(STORES[2].key_filter && !STORES[0].key_filter);
/// ```
#[macro_export]
macro_rules! stores {
    (
        $($(#[$meta:meta])* $vis:vis $name:ident : $kind:ident < $($arg:ty),+ > = $text:literal $(. $option:ident ())*;)+
    ) => {
        $($(#[$meta])* $vis const $name: $kind<$($arg),+> = $kind::new($text)$(.$option())*;)+

        /// Every store declared here, for `Processor::STORES`.
        #[allow(dead_code)]
        pub const STORES: &[$crate::processor::StoreSpec] = &[$($name.spec()),+];
    };
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
pub struct Timer<'a, N> {
    /// The key the timer was registered for.
    pub key: &'a str,
    /// The timer's name.
    pub name: N,
    /// The time it was set for (event time or wall-clock epoch milliseconds).
    pub time: i64,
    /// Which clock it was set on.
    pub domain: TimeDomain,
}

/// A named store of one value per key. Declare it with
/// [`stores!`](crate::stores); the name is the store's identity on disk and
/// in its changelog topic, so it must never change.
#[derive(Debug)]
pub struct ValueState<T> {
    name: &'static str,
    key_filter: bool,
    _value: PhantomData<fn() -> T>,
}

impl<T> ValueState<T> {
    /// A store named `name` (use [`stores!`](crate::stores), which also lists it).
    #[doc(hidden)]
    pub const fn new(name: &'static str) -> Self {
        ValueState {
            name,
            key_filter: false,
            _value: PhantomData,
        }
    }

    /// The store with a filter of its keys in memory, in front of RocksDB
    /// (`"orders".with_key_filter()` in [`stores!`](crate::stores)): a read
    /// of a key the store does not hold is answered without RocksDB. For a
    /// store read for keys it mostly does not have (the other side of a
    /// join, for each new key), whose processor has no cheaper way to tell;
    /// it costs a scan of the store's keys when its task opens, and about
    /// 2.5 bytes per key of the task's memory for timers
    /// (docs/architecture.md, "Key filters").
    pub const fn with_key_filter(self) -> Self {
        ValueState {
            key_filter: true,
            ..self
        }
    }

    /// The store's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// What a query needs to know of it.
    #[doc(hidden)]
    pub const fn spec(&self) -> StoreSpec {
        StoreSpec {
            name: self.name,
            shape: StoreShape::Value,
            key_filter: self.key_filter,
        }
    }
}

/// A declared store, as [`Processor::STORES`] lists it: its name and the
/// shape of its entries, which is what a query needs to render them.
#[derive(Debug, Clone, Copy)]
pub struct StoreSpec {
    pub name: &'static str,
    pub shape: StoreShape,
    /// Whether a filter of its keys answers reads of keys it does not hold
    /// ([`ValueState::with_key_filter`]).
    pub key_filter: bool,
}

/// How a store's entries are laid out.
#[derive(Debug, Clone, Copy)]
pub enum StoreShape {
    /// One value per key ([`ValueState`]).
    Value,
    /// A map per key ([`MapState`]).
    Map {
        /// Renders an entry's key, as stored, in JSON.
        entry_key: fn(&[u8]) -> anyhow::Result<serde_json::Value>,
        /// Whether entry keys begin with a time (an `i64`: a window start),
        /// so that a query can ask for a time range.
        timed: bool,
    },
}

/// A named store of a map per key, whose entries are read and written one at
/// a time (like Flink's `MapView`), and scanned in key order.
#[derive(Debug)]
pub struct MapState<K, V> {
    name: &'static str,
    _entry: PhantomData<fn() -> (K, V)>,
}

impl<K, V> MapState<K, V> {
    /// A store named `name` (use [`stores!`](crate::stores), which also lists it).
    #[doc(hidden)]
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

impl<K: MapKey, V> MapState<K, V> {
    /// What a query needs to know of it.
    #[doc(hidden)]
    pub const fn spec(&self) -> StoreSpec {
        StoreSpec {
            name: self.name,
            shape: StoreShape::Map {
                entry_key: entry_key_json::<K>,
                timed: K::TIMED,
            },
            key_filter: false,
        }
    }
}

fn entry_key_json<K: MapKey>(bytes: &[u8]) -> anyhow::Result<serde_json::Value> {
    Ok(K::decode_key(bytes)?.to_json())
}

/// Work a processor hands off the processing thread — a call to an external
/// service, a model inference — and the completions that bring its result
/// back.
///
/// A processor submits (`Context::submit`) a job: a closure that runs
/// on one of the stage's job workers and returns a `Completion`, which in
/// turn runs on the processing thread with the processor and a context, like
/// `process` or `on_timer`. Meanwhile the task goes on with other records.
/// Completions of one task run in the order their jobs were submitted, so a
/// processor that emits in a job's completion keeps its output order. Every
/// job of a task completes before the task commits: a commit never includes
/// state that expects a result without the result (exactly-once), and after
/// a crash uncommitted jobs are simply done again. How the engine keeps
/// that wait bounded and out of any transaction is `JobGate`'s business
/// (`engine/job_gate.rs`).
///
/// Jobs run on a [`WorkerPool`](crate::pool::WorkerPool). With no workers
/// configured, a job runs at once on the processing thread (the test driver
/// always does this, so tests are deterministic).
///
/// A completion is what a job gives back: the code that applies its result
/// on the processing thread.
pub type Completion<P> =
    Box<dyn for<'c> FnOnce(&mut P, &mut Context<'c, P>) -> anyhow::Result<()> + Send>;

/// A job: runs off the processing thread, returns its completion.
pub type Job<P> = Box<dyn FnOnce() -> anyhow::Result<Completion<P>> + Send>;

/// Where the result of a job in flight arrives.
pub(crate) type JobResult<P> = std::sync::mpsc::Receiver<anyhow::Result<Completion<P>>>;
