//! Throughput and memory of the local model (BENCHMARKS.md): the texts of a
//! JSON-lines file (one JSON string per line, as
//! `bench/sentence_transformers_bench.py texts` writes them) embedded in
//! batches of 32 and 50, 3 rounds each after a warm-up batch.
//!
//! ```sh
//! cargo run --release -p embed-batcher --example embed_bench -- /var/tmp/embed-texts.jsonl
//! ```
//!
//! The model is `--model-dir`'s default (`$MODELS_DIR/all-MiniLM-L6-v2`), on
//! `MODEL_THREADS` threads (default: the available cores). Prints one line per
//! batch size (embeddings/s, the median of the rounds), then the process's
//! peak RSS (VmHWM) and its RSS with the model loaded, before any batch.

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

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: embed_bench TEXTS.jsonl"))?;
    let texts: Vec<String> = std::fs::read_to_string(&path)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let threads = std::env::var("MODEL_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let model = LocalModel::load(&default_model_dir(), threads)?;
    let loaded_rss = status_kib("VmRSS");
    println!(
        "embed-batcher local model, {} threads, {} texts",
        model.threads(),
        texts.len()
    );
    for batch_size in [32, 50] {
        let batches: Vec<&[String]> = texts.chunks_exact(batch_size).collect();
        model.embed_texts(batches[0])?; // warm-up
        let mut rates = Vec::new();
        for _ in 0..3 {
            let started = Instant::now();
            for batch in &batches {
                model.embed_texts(batch)?;
            }
            let elapsed = started.elapsed().as_secs_f64();
            rates.push((batches.len() * batch_size) as f64 / elapsed);
        }
        let rounds: Vec<String> = rates.iter().map(|r| format!("{r:.1}")).collect();
        let mut sorted = rates.clone();
        sorted.sort_by(f64::total_cmp);
        println!(
            "batch {batch_size}: {:.1} embeddings/s (rounds: {})",
            sorted[sorted.len() / 2],
            rounds.join(", ")
        );
    }
    println!(
        "peak RSS {} MiB; RSS with the model loaded {} MiB",
        status_kib("VmHWM") / 1024,
        loaded_rss / 1024
    );
    Ok(())
}
