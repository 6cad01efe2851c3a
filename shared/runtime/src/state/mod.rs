//! Keyed state: RocksDB per task, an overlay of uncommitted changes, and the
//! byte encodings of keys and values.

pub mod codec;
mod layer;
mod read_cache;
mod resources;
mod restore_batch;
pub mod store;
mod timer_spill;
