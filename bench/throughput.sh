#!/usr/bin/env bash
# `make bench`: our services side by side with Kafka Streams and a raw copy,
# on the local stack (see BENCHMARKS.md for the method, bench/run.py for the
# knobs: BENCH_SCALE, BENCH_RUNS, BENCH_ONLY, BENCH_LATENCY, ...).
#
# Needs the release binaries (`cargo build --release --bins`: the services,
# streamctl, loadgen, rawcopy), Java 17 and Maven (the Kafka Streams peer is
# built here, dependencies from Maven Central), and the local Kafka broker and
# schema registry (`make up`). Results: bench/results/<date>.{json,md,svg}.
set -euo pipefail
cd "$(dirname "$0")/.."

. bench/prepare.sh
need_binaries loadgen rawcopy streamctl sessionizer order-shipment-joiner sensor-fusion window-aggregator
build_peer

BIN_DIR="$BIN" exec python3 bench/run.py
