//! Keyed state: RocksDB per task, an overlay of uncommitted changes, and the
//! byte encodings of keys and values.

pub mod codec;
mod layer;
pub mod store;
