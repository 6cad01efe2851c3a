//! `readbench`: the ceiling of interactive key queries. Random point reads
//! of one store of a stopped service's task directory, opened as the service
//! opens it (`TaskStore::open`: its RocksDB options and block cache, at
//! `--state-memory-limit-mib`), for `--seconds` per path:
//!
//! * `get`: `get_pinned_cf` of the value, nothing more;
//! * `query`: what the query server does for a key, without HTTP
//!   (shared/runtime/src/query/read.rs and server.rs): a snapshot, the
//!   store's checkpoint and the value read under it, the value decoded to
//!   JSON, the answer's fields added and the body serialized.
//!
//! Prints one JSON object: reads per second of each path, on `--threads`
//! threads together, and per CPU-second of the process.

use std::fmt::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench_loadgen::procfs;
use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rocksdb::{ReadOptions, DB};
use serde_json::json;
use streams_runtime::query::state_value_json;
use streams_runtime::state::store::{StateResources, TaskStore};

/// The column family of the stores' checkpoints (`state::store`).
const CHECKPOINTS: &str = "__checkpoints";

#[derive(Parser)]
#[command(name = "readbench", about = "RocksDB point reads of a task's store")]
struct Args {
    /// A task's state directory (`<state-dir>/<application id>/task-<p>`)
    /// of a service that has stopped.
    #[arg(long)]
    task_dir: PathBuf,
    #[arg(long)]
    store: String,
    /// The keys, `{}` standing for a number drawn from `0..keys`.
    #[arg(long)]
    key_template: String,
    #[arg(long)]
    keys: u64,
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// The service's `--state-memory-limit` (its default), in MiB.
    #[arg(long, default_value_t = 256)]
    state_memory_limit_mib: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

/// What one thread's reads came to.
#[derive(Default)]
struct Count {
    reads: u64,
    found: u64,
    value_bytes: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.key_template.contains("{}"),
        "--key-template needs a {{}}"
    );
    // Every store of the task is named, so that opening drops none.
    let stores: Vec<String> = DB::list_cf(&rocksdb::Options::default(), &args.task_dir)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.task_dir.display()))?
        .into_iter()
        .filter(|name| name != "default" && !name.starts_with("__"))
        .collect();
    anyhow::ensure!(
        stores.contains(&args.store),
        "no store {} in {} (it has {stores:?})",
        args.store,
        args.task_dir.display()
    );
    let resources = StateResources::new(args.state_memory_limit_mib << 20, 0);
    // Kept open: the registry below holds the database only while it is.
    let _task = TaskStore::open(&args.task_dir, &stores, &resources)?;
    let db = (resources.open_stores().get(&args.task_dir))
        .and_then(|open| open.db())
        .ok_or_else(|| anyhow::anyhow!("the task store did not register"))?;

    let (get, get_cpu) = measure(&args, &db, read_value)?;
    let (query, query_cpu) = measure(&args, &db, answer_query)?;
    let rate = |count: &Count| count.reads as f64 / args.seconds;
    let per_cpu = |count: &Count, cpu: Option<f64>| cpu.map(|cpu| count.reads as f64 / cpu);
    println!(
        "{}",
        json!({
            "store": args.store,
            "keys": args.keys,
            "threads": args.threads,
            "seconds": args.seconds,
            "found_share": get.found as f64 / get.reads.max(1) as f64,
            "mean_value_bytes": get.value_bytes as f64 / get.found.max(1) as f64,
            "get_reads_per_s": rate(&get),
            "query_path_reads_per_s": rate(&query),
            "get_reads_per_cpu_s": per_cpu(&get, get_cpu),
            "query_path_reads_per_cpu_s": per_cpu(&query, query_cpu),
            "query_path_mean_answer_bytes": query.value_bytes as f64 / query.reads.max(1) as f64,
        })
    );
    Ok(())
}

/// One point read on `db` for `key` with `read`, adding to `count`.
type Read = fn(&DB, &str, &str, &mut Count) -> anyhow::Result<()>;

/// Random keys read with `read` on `--threads` threads for `--seconds`,
/// and the CPU seconds they took (on a shared machine the wall-clock rate
/// is only what the scheduler gave).
fn measure(args: &Args, db: &Arc<DB>, read: Read) -> anyhow::Result<(Count, Option<f64>)> {
    let cpu_before = procfs::cpu_seconds(std::process::id());
    let (prefix, suffix) = args.key_template.split_once("{}").expect("checked");
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let counts = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..args.threads)
            .map(|thread| {
                let mut rng = StdRng::seed_from_u64(args.seed.wrapping_add(thread as u64));
                scope.spawn(move || {
                    let mut count = Count::default();
                    let mut key = String::new();
                    // The clock is read every 256 reads, not each time.
                    while count.reads % 256 != 0 || Instant::now() < deadline {
                        key.clear();
                        let number = rng.random_range(0..args.keys);
                        write!(key, "{prefix}{number}{suffix}")?;
                        read(db, &args.store, &key, &mut count)?;
                        count.reads += 1;
                    }
                    anyhow::Ok(count)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| thread.join().expect("reader thread panicked"))
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    let cpu = procfs::cpu_seconds(std::process::id())
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    let sum = counts
        .into_iter()
        .fold(Count::default(), |sum, count| Count {
            reads: sum.reads + count.reads,
            found: sum.found + count.found,
            value_bytes: sum.value_bytes + count.value_bytes,
        });
    Ok((sum, cpu))
}

fn read_value(db: &DB, store: &str, key: &str, count: &mut Count) -> anyhow::Result<()> {
    let family = db.cf_handle(store).expect("store checked at start");
    if let Some(value) = db.get_pinned_cf(family, key)? {
        count.found += 1;
        count.value_bytes += value.len() as u64;
    }
    Ok(())
}

fn answer_query(db: &DB, store: &str, key: &str, count: &mut Count) -> anyhow::Result<()> {
    let family = db.cf_handle(store).expect("store checked at start");
    let checkpoints = db
        .cf_handle(CHECKPOINTS)
        .expect("every task has checkpoints");
    let snapshot = db.snapshot();
    let mut options = ReadOptions::default();
    options.set_snapshot(&snapshot);
    let position = (db.get_pinned_cf_opt(checkpoints, store, &options)?)
        .and_then(|bytes| bytes.as_ref().try_into().ok().map(i64::from_be_bytes));
    let mut options = ReadOptions::default();
    options.set_snapshot(&snapshot);
    let value = match db.get_pinned_cf_opt(family, key, &options)? {
        Some(bytes) => {
            count.found += 1;
            state_value_json(&bytes)?
        }
        None => serde_json::Value::Null,
    };
    let mut body = json!({"value": value});
    body["stage"] = "main".into();
    body["store"] = store.into();
    body["partition"] = 0.into();
    body["position"] = json!({"changelog": format!("{store}-changelog"), "offset": position});
    body["lag"] = 0.into();
    body["served_by"] = json!({"instance": "readbench", "role": "active"});
    body["key"] = key.into();
    count.value_bytes += body.to_string().len() as u64;
    Ok(())
}
