//! Keyed state: RocksDB per task, an overlay of uncommitted changes, the
//! byte encodings of keys and values, and the format version they are in.

mod bulk_restore;
pub mod codec;
pub mod format;
mod key_filter;
mod layer;
pub mod open_stores;
pub(crate) mod progress_layout;
mod read_cache;
mod resources;
mod restore_batch;
pub(crate) mod sorted_runs;
pub mod store;

/// Index of a store within its [`TaskStore`](store::TaskStore), fixed for
/// the process lifetime. Here, not in `store`, because the store's helpers
/// (`read_cache`, `restore_batch`) take it too and `store` uses them.
pub type StoreIndex = usize;
