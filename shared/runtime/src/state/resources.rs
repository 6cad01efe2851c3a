//! The state memory and writer threads every task of the process shares.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rocksdb::{BlockBasedIndexType, BlockBasedOptions, Cache, Options, WriteBufferManager};

use super::format::WriteFormat;
use super::open_stores::OpenStores;
use crate::pool::WorkerPool;

/// State memory shared by every task of the process: one RocksDB block
/// cache, with memtables charged to it, the tasks' read caches and their
/// timers in memory, so the whole process stays under one budget however
/// many stores, tasks and keys it has (a Kafka Streams pain point). And the
/// threads that write committed changes to RocksDB.
#[derive(Clone)]
pub struct StateResources {
    cache: Cache,
    cache_capacity: usize,
    write_buffers: WriteBufferManager,
    pub(super) shares: Arc<MemoryShares>,
    pub(super) writers: Arc<WorkerPool>,
    /// Every task store open in the process, for queries.
    pub(super) open_stores: Arc<OpenStores>,
    /// The state format task stores are opened in and write.
    pub(super) write_format: WriteFormat,
}

/// The read caches' and the timers' shares of the budget, each split evenly
/// among open tasks.
pub(super) struct MemoryShares {
    pub(super) read_cache_bytes: usize,
    pub(super) timer_bytes: usize,
    /// Open tasks (each task's read cache counts itself).
    pub(super) tasks: AtomicUsize,
}

impl MemoryShares {
    /// One task's part of `bytes`.
    pub(super) fn per_task(&self, bytes: usize) -> usize {
        bytes / self.tasks.load(Ordering::Relaxed).max(1)
    }
}

impl StateResources {
    /// Resources capped at `limit_bytes` in total: a sixteenth for the read
    /// caches (values read or written recently, kept in front of RocksDB:
    /// 8 MiB a generation for one task at the default limit, about the
    /// 32 768 entries of ~200 bytes they held before they were counted in
    /// bytes), three sixteenths for timers in memory (about 190 000 at the
    /// default limit; more are spilled to RocksDB: every key in state may
    /// have one, so they need more room than the read cache), the rest for
    /// RocksDB.
    ///
    /// `writers` threads write committed changes to RocksDB, one per
    /// processing thread is enough (each task has one write at a time); with
    /// none, each write is done at once on the processing thread.
    pub fn new(limit_bytes: usize, writers: usize) -> Self {
        let read_cache_bytes = limit_bytes / 16;
        let timer_bytes = limit_bytes / 16 * 3;
        let rocksdb_bytes = limit_bytes - read_cache_bytes - timer_bytes;
        let cache = Cache::new_lru_cache(rocksdb_bytes);
        let write_buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            rocksdb_bytes / 2,
            false,
            cache.clone(),
        );
        StateResources {
            cache,
            cache_capacity: rocksdb_bytes,
            write_buffers,
            shares: Arc::new(MemoryShares {
                read_cache_bytes,
                timer_bytes,
                tasks: AtomicUsize::new(0),
            }),
            writers: Arc::new(WorkerPool::new("state-writer", writers)),
            open_stores: Arc::default(),
            write_format: WriteFormat::NEWEST,
        }
    }

    /// These resources, with task stores that write `format`.
    pub fn writing(self, format: WriteFormat) -> Self {
        StateResources {
            write_format: format,
            ..self
        }
    }

    /// The block cache's capacity, usage (the memtables charged to it
    /// included) and pinned part, in bytes.
    pub fn block_cache_bytes(&self) -> [(&'static str, usize); 3] {
        [
            ("capacity", self.cache_capacity),
            ("usage", self.cache.get_usage()),
            ("pinned", self.cache.get_pinned_usage()),
        ]
    }

    /// The task stores open in the process.
    pub fn open_stores(&self) -> &Arc<OpenStores> {
        &self.open_stores
    }

    pub(super) fn options(&self) -> Options {
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        options.set_write_buffer_manager(&self.write_buffers);
        // Small memtables per column family (the manager caps the total):
        // RocksDB preallocates each write-ahead log at 1.1x the memtable size,
        // so the 64 MiB default costs ~70 MiB of disk per task before any data.
        options.set_write_buffer_size(16 << 20);
        // A bloom filter over whole keys in the memtable: most point reads of
        // keys not in state (a new order id, a new user) end there instead of
        // searching the skip list.
        options.set_memtable_whole_key_filtering(true);
        options.set_memtable_prefix_bloom_ratio(0.05);
        options.set_compression_type(rocksdb::DBCompressionType::Lz4);
        options.set_max_background_jobs(2);
        let mut table = table_options();
        table.set_block_cache(&self.cache);
        // Index and filter blocks live in the block cache, within the
        // budget (see `table_options`): the top level, small, stays pinned
        // with the level-0 files' blocks.
        table.set_cache_index_and_filter_blocks(true);
        table.set_cache_index_and_filter_blocks_with_high_priority(true);
        table.set_pin_top_level_index_and_filter(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        options.set_block_based_table_factory(&table);
        options
    }
}

/// The layout of the stores' SST files: a bloom filter per key, index and
/// filter partitioned. A whole-file filter or index is megabytes once state
/// outgrows memory, and a cache full of data blocks evicted it and read it
/// back (and checksummed it) for nearly every point read; partitions are a
/// few KiB each.
fn table_options() -> BlockBasedOptions {
    let mut table = BlockBasedOptions::default();
    table.set_bloom_filter(10.0, false);
    table.set_index_type(BlockBasedIndexType::TwoLevelIndexSearch);
    table.set_partition_filters(true);
    table.set_metadata_block_size(4096);
    table
}

/// Options for SST files written beside RocksDB and ingested into a store
/// (a bulk load of spilled timers): the stores' layout and compression.
pub(crate) fn ingested_file_options() -> Options {
    let mut options = Options::default();
    options.set_compression_type(rocksdb::DBCompressionType::Lz4);
    options.set_block_based_table_factory(&table_options());
    options
}
