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

BIN="${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}"
for binary in loadgen rawcopy streamctl sessionizer order-shipment-joiner sensor-fusion window-aggregator; do
  [ -x "$BIN/$binary" ] || { echo "missing $BIN/$binary: run cargo build --release --bins" >&2; exit 1; }
done
command -v java >/dev/null && command -v mvn >/dev/null \
  || { echo "the Kafka Streams peer needs java (17+) and mvn" >&2; exit 1; }

JAR=bench/peers/kafka-streams/target/ks-peer.jar
if [ ! -f "$JAR" ] || [ -n "$(find bench/peers/kafka-streams/pom.xml bench/peers/kafka-streams/src -newer "$JAR" -print -quit)" ]; then
  echo "building the Kafka Streams peer ($JAR)..." >&2
  mvn -q -B -f bench/peers/kafka-streams/pom.xml package -DskipTests >&2
fi

BIN_DIR="$BIN" exec python3 bench/run.py
