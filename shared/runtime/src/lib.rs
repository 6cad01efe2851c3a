//! A Kafka Streams-style processor runtime.
//!
//! A service describes its data flow as a [`Topology`] and its domain logic as
//! a [`Processor`]; [`run`] does the rest: consuming as a consumer group, Avro
//! in the Confluent wire format, keyed state in RocksDB with changelogs,
//! event-time watermarks and timers, dead-lettering, and exactly-once or
//! at-least-once delivery.
//!
//! # Layout
//!
//! * [`processor`]: the API a service implements — `Processor`, `Record`,
//!   `Timer`, `Context`, and the named state handles `ValueState` and `MapState`.
//! * [`topology`]: inputs (with optional repartitioning), output, stores, and
//!   the links between the stages of a pipeline.
//! * [`config`]: the flags every service shares.
//! * [`duration`]: human-readable durations for flags.
//! * [`avro`]: wire format, schema registry client and caches, decoders and encoders.
//! * [`state`]: RocksDB per task with an overlay of uncommitted changes; value
//!   and key encodings.
//! * [`time`]: partition and task watermarks, the timer queue.
//! * [`window`]: epoch-anchored tumbling and hopping window arithmetic.
//! * `task`: one partition's processor, state, clocks and timers; the order of work.
//! * `engine`: the processing loop — routing, repartitioning, dead letters;
//!   `engine::commit` (commits and rollbacks) and `engine::lifecycle` (tasks
//!   on rebalances).
//! * [`delivery`]: the producer, delivery reports and transactions.
//! * `output`: encoding and producing results to the output topic.
//! * `restore`: rebuilding task state from changelog topics.
//! * [`topics`]: startup checks and topic creation.
//! * [`metrics`] and `http`: what operators see.
//! * `app`: [`run`] and [`Pipeline`] (services of several stages), which
//!   wire it all together.

mod app;
pub mod avro;
pub mod config;
pub mod delivery;
pub mod duration;
mod engine;
mod http;
pub mod metrics;
mod output;
pub mod processor;
mod restore;
pub mod state;
mod task;
pub mod time;
pub mod topics;
pub mod topology;
pub mod window;

pub use app::{base_client_config, init_tracing, run, Pipeline};
pub use config::RuntimeArgs;
pub use duration::HumanDuration;
pub use processor::{Context, MapState, Processor, Record, Timer, ValueState};
pub use state::codec::MapKey;
pub use time::NO_WATERMARK;
pub use topology::{InputStream, StageLink, Topology};
