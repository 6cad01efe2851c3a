//! A Kafka Streams-style processor runtime.
//!
//! A service describes its data flow as a [`Topology`] and its domain logic as
//! a [`Processor`]; [`service_main`] does the rest: consuming as a consumer
//! group, Avro in the Confluent wire format, keyed state in RocksDB with
//! changelogs, event-time watermarks and timers, dead-lettering, and
//! exactly-once or at-least-once delivery. `testing` (the `test-utils`
//! feature) runs the same processor and topology without a broker, for tests.
//!
//! # Layout
//!
//! * [`processor`]: the API a service implements — `Processor`, `Record`,
//!   `Timer`, `Context`, the named state handles `ValueState` and `MapState`,
//!   and the `stores!`, `timer_names!` and `counter_names!` declarations.
//! * [`topology`]: inputs (with optional repartitioning), output, and the
//!   links between the stages of a pipeline.
//! * [`config`]: the flags every service shares; [`duration`]: durations for flags.
//! * [`avro`]: wire format, schema registry client and caches, decoders and
//!   encoders; [`avro::json`]: Avro values as JSON lines.
//! * [`state`]: RocksDB per task with an overlay of uncommitted changes; value
//!   and key encodings; the format version of both, on disk and in changelogs.
//! * [`time`]: partition and task watermarks;
//!   `watermark`: the watermark formula and its headers on the wire;
//!   `clock`: wall-clock time (the system's, or the test driver's).
//! * [`timers`]: a task's pending timers of both time domains, in memory up
//!   to its share of the timer memory, the later ones spilled to its RocksDB.
//! * [`window`]: epoch-anchored tumbling and hopping window arithmetic.
//! * `task`: one partition's processor, state, clocks and timers; the order of work.
//! * `engine`: a stage's processing core — routing, repartitioning, dead
//!   letters, commits as state sees them — writing into a `collector`;
//!   `engine::kafka_stage` runs it on a consumer group (poll loop, producer,
//!   transactions, rebalances).
//! * `pool`: the worker threads that run processors' jobs and state writes.
//! * `output`: encoding results; `collector`: what a stage writes, before a producer.
//! * [`delivery`]: the producer, delivery reports and transactions.
//! * `restore`: rebuilding task state from changelog topics; `standby`:
//!   standby replicas, warm copies of other instances' tasks kept current
//!   from their changelogs.
//! * `planning`: a stage's topics, partitions and role, and the wiring of its
//!   engine, with no broker; `startup`: the same on Kafka (topic checks and
//!   creation, clients).
//! * [`client`]: where Kafka and the schema registry are and the properties
//!   every client gets (`--kafka`, `--kafka-config-file`, `KAFKA_PROPERTY_*`),
//!   secrets kept out of logs; `client::kafka`: every librdkafka setting the
//!   runtime makes and the client ids.
//! * [`admin`] (`topics`): topic and consumer group administration (also for
//!   `streamctl`); `native_admin`: librdkafka's admin requests that
//!   rust-rdkafka does not wrap (group members, topic ids).
//! * [`describe`]: the topology and the ACLs it needs, with no broker;
//!   [`reset`]: an application's offsets, internal topics and local state
//!   set back so that it processes its input again.
//! * [`metrics`] and `http`: what operators see; `process_stats`: the
//!   process's CPU time and memory for them.
//! * `app`: [`service_main`] and [`Pipeline`], which wire it all together;
//!   `shutdown`: SIGTERM and SIGINT, heard from the first moment on.
//! * `partitioner`: Kafka's murmur2 partitioner.
//! * `testing` (feature `test-utils`): the broker-free test driver.
//! * [`prelude`]: what a service imports.

mod app;

pub mod avro;
mod bloom;
pub mod client;
mod clock;
mod collector;
pub mod config;
pub mod delivery;
pub mod describe;
pub mod duration;
mod engine;
mod http;
pub mod metrics;
mod native_admin;
mod output;
mod partitioner;
mod planning;
mod pool;
mod process_stats;
pub mod processor;
pub mod query;
pub mod reset;
mod restore;
mod shutdown;
mod standby;
mod startup;
pub mod state;
mod task;
#[cfg(feature = "test-utils")]
pub mod testing;
pub mod time;
pub mod timers;
mod topics;
pub mod topology;
mod watermark;
pub mod window;

/// Topic and consumer group administration, also for tools such as `streamctl`
/// (their client configuration: [`client`]).
pub mod admin {
    pub use crate::native_admin::{group_members, GroupMember};
    pub use crate::topics::*;
}

pub use app::{service_main, Pipeline};
pub use config::RuntimeArgs;
pub use duration::HumanDuration;
pub use partitioner::murmur2_partition;
pub use processor::{
    Completion, Context, CounterName, DeriveTimers, DerivedTimers, MapState, NoTimers, Processor,
    Record, StateView, StoreSpec, Timer, TimerName, ValueState,
};
pub use state::codec::MapKey;
pub use time::NO_WATERMARK;
pub use timers::TimeDomain;
pub use topology::{InputStream, StageLink, Topology};

/// What a service's processor and topology code imports.
pub mod prelude {
    pub use crate::processor::{
        Completion, Context, CounterName, DeriveTimers, DerivedTimers, MapState, NoTimers,
        Processor, Record, StatePage, StateView, StoreSpec, Timer, TimerName, ValueState,
    };
    pub use crate::time::NO_WATERMARK;
    pub use crate::timers::TimeDomain;
    pub use crate::topology::{InputStream, StageLink, Topology};
    pub use crate::{
        counter_names, service_main, stores, timer_names, HumanDuration, Pipeline, RuntimeArgs,
    };
}

/// The allocator a service binary installs with [`service_allocator!`].
#[doc(hidden)]
pub use mimalloc::MiMalloc as ServiceAllocator;

/// Makes mimalloc the binary's global allocator; a service's `main.rs`
/// says `streams_runtime::service_allocator!();`. The hot path allocates
/// small, short-lived keys and values, where glibc's allocator took a large
/// share of the joiner's CPU time (bench/results/2026-12-01-diary.md, "The
/// steps, each measured before and after", step 4). mimalloc is built without transparent
/// huge pages (`no_thp`): a 2 MiB page is resident as soon as one byte of it
/// is touched. The choice belongs to each binary (`streamctl` and the test
/// harness keep the system allocator).
#[macro_export]
macro_rules! service_allocator {
    () => {
        #[global_allocator]
        static ALLOCATOR: $crate::ServiceAllocator = $crate::ServiceAllocator;
    };
}
