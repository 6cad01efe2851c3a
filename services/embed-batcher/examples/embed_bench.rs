//! Throughput and memory of the local model (bench/results/2026-12-01-diary.md,
//! "embed-batcher's model"): the texts of a JSON-lines file (one JSON string per line, as
//! `bench/sentence_transformers_bench.py texts` writes them) embedded in
//! batches of 32 and of 50, `ROUNDS` rounds (default 5) of all the texts per
//! batch size, after a warm-up batch. `bench/model_bench.sh` runs it next to
//! its sentence-transformers peer.
//!
//! ```sh
//! cargo run --release -p embed-batcher --example embed_bench -- /var/tmp/embed-texts.jsonl
//! ```
//!
//! The model is `--model-dir`'s default (`$MODELS_DIR/all-MiniLM-L6-v2`), on
//! `MODEL_THREADS` threads (default 2). Prints, per batch size, the
//! embeddings per second of the rounds (min / median / max) and the CPU time
//! of the process per embedding; then the process's peak RSS (VmHWM) and its
//! RSS with the model loaded, before any batch.

use std::time::Instant;

use embed_batcher::embedder::LocalModel;
use embed_batcher::settings::default_model_dir;

/// A field of /proc/self/status in KiB (0 where there is none).
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// User + system CPU seconds of this process so far, all threads
/// (/proc/self/stat, in clock ticks: USER_HZ, 100 on Linux).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 here.
    ticks(11).unwrap_or(0.0) / 100.0 + ticks(12).unwrap_or(0.0) / 100.0
}

fn env_number(name: &str, default: usize) -> anyhow::Result<usize> {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={value:?} is not a number")),
        Err(_) => Ok(default),
    }
}

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: embed_bench TEXTS.jsonl"))?;
    let texts: Vec<String> = std::fs::read_to_string(&path)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let threads = env_number("MODEL_THREADS", 2)?;
    let rounds = env_number("ROUNDS", 5)?.max(1);
    let model = LocalModel::load(&default_model_dir(), threads)?;
    let loaded_rss = status_kib("VmRSS");
    println!(
        "embed-batcher local model, {} threads, {} texts, {rounds} rounds",
        model.threads(),
        texts.len()
    );
    for batch_size in [32, 50] {
        let batches: Vec<&[String]> = texts.chunks_exact(batch_size).collect();
        anyhow::ensure!(!batches.is_empty(), "fewer than {batch_size} texts");
        model.embed_texts(batches[0])?; // warm-up
        let mut rates = Vec::new();
        let cpu_before = cpu_seconds();
        for _ in 0..rounds {
            let started = Instant::now();
            for batch in &batches {
                model.embed_texts(batch)?;
            }
            let elapsed = started.elapsed().as_secs_f64();
            rates.push((batches.len() * batch_size) as f64 / elapsed);
        }
        let embedded = (rounds * batches.len() * batch_size) as f64;
        let cpu_ms = (cpu_seconds() - cpu_before) * 1000.0 / embedded;
        rates.sort_by(f64::total_cmp);
        println!(
            "batch {batch_size}: {:.1} / {:.1} / {:.1} embeddings/s (min / median / max); \
             {cpu_ms:.1} CPU-ms per embedding",
            rates[0],
            rates[rates.len() / 2],
            rates[rates.len() - 1]
        );
    }
    println!(
        "peak RSS {} MiB; RSS with the model loaded {} MiB",
        status_kib("VmHWM") / 1024,
        loaded_rss / 1024
    );
    Ok(())
}
