#!/usr/bin/env bash
# `make bench-model`: embed-batcher's local model (examples/embed_bench.rs,
# release build) against sentence-transformers on PyTorch
# (sentence_transformers_bench.py), the same ~100-word texts and model files,
# batches of 32 and 50, on MODEL_THREADS threads (2). The current figure is in
# BENCHMARKS.md, "The other benchmarks"; the method and the runs in
# bench/results/2026-12-01-diary.md, "embed-batcher's model".
#
# The two run in turn, BENCH_RUNS times (3), so that a burst of load from
# elsewhere on a shared machine does not hit only one of them.
#
# The peer runs in the virtualenv ST_VENV (/var/tmp/st-venv), made here from
# PyPI if it lacks sentence-transformers or torch: PyPI's Linux torch wheel is
# the CUDA build and pulls the NVIDIA libraries with it (~6 GB); it computes
# on the CPU all the same. Model files: `make models` (run first).
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV="${ST_VENV:-/var/tmp/st-venv}"
TEXTS="${BENCH_TEXTS:-/var/tmp/embed-texts.jsonl}"
RUNS="${BENCH_RUNS:-3}"
export MODEL_THREADS="${MODEL_THREADS:-2}"
PEER=bench/embed/sentence_transformers_bench.py

bash deploy/local/models.sh
# Deterministic, so rewriting it gives the same texts every time.
python3 "$PEER" texts "$TEXTS"

if ! "$VENV/bin/python" -c 'import sentence_transformers, torch' 2>/dev/null; then
  echo "[bench-model] making the virtualenv $VENV (sentence-transformers, torch from PyPI)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet sentence-transformers torch
fi

cargo build --release -p embed-batcher --example embed_bench
BIN="${CARGO_TARGET_DIR:-target}/release/examples/embed_bench"

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for run in $(seq "$RUNS"); do
  echo "== run $run/$RUNS: Rust (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  "$BIN" "$TEXTS"
  echo "== run $run/$RUNS: sentence-transformers (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  # Offline: the model is read from the folder, nothing from the Hugging Face
  # hub; no progress bars.
  HF_HUB_OFFLINE=1 TQDM_DISABLE=1 "$VENV/bin/python" "$PEER" run "$TEXTS"
done
