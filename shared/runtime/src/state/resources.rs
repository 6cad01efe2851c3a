//! The state memory and writer threads every task of the process shares.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use rocksdb::{BlockBasedOptions, Cache, Options, WriteBufferManager};

use crate::pool::WorkerPool;

/// State memory shared by every task of the process: one RocksDB block
/// cache, with memtables charged to it, and the tasks' read caches, so the
/// whole process stays under one budget however many stores and tasks it has
/// (a Kafka Streams pain point). And the threads that write committed
/// changes to RocksDB.
#[derive(Clone)]
pub struct StateResources {
    cache: Cache,
    write_buffers: WriteBufferManager,
    pub(super) read_caches: Arc<ReadCacheBudget>,
    pub(super) writers: Arc<WorkerPool>,
}

/// The read caches' share of the budget, split evenly among open tasks.
pub(super) struct ReadCacheBudget {
    pub(super) bytes: usize,
    pub(super) tasks: AtomicUsize,
}

impl StateResources {
    /// Resources capped at `limit_bytes` in total: a sixteenth for the read
    /// caches (values read or written recently, kept in front of RocksDB:
    /// 8 MiB a generation for one task at the default limit, about the
    /// 32 768 entries of ~200 bytes they held before they were counted in
    /// bytes), the rest for RocksDB.
    ///
    /// `writers` threads write committed changes to RocksDB, one per
    /// processing thread is enough (each task has one write at a time); with
    /// none, each write is done at once on the processing thread.
    pub fn new(limit_bytes: usize, writers: usize) -> Self {
        let read_cache_bytes = limit_bytes / 16;
        let rocksdb_bytes = limit_bytes - read_cache_bytes;
        let cache = Cache::new_lru_cache(rocksdb_bytes);
        let write_buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            rocksdb_bytes / 2,
            false,
            cache.clone(),
        );
        StateResources {
            cache,
            write_buffers,
            read_caches: Arc::new(ReadCacheBudget {
                bytes: read_cache_bytes,
                tasks: AtomicUsize::new(0),
            }),
            writers: Arc::new(WorkerPool::new("state-writer", writers)),
        }
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
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&self.cache);
        table.set_bloom_filter(10.0, false);
        table.set_cache_index_and_filter_blocks(true);
        options.set_block_based_table_factory(&table);
        options
    }
}
