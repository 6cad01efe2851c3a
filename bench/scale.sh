#!/usr/bin/env bash
# `make bench-scale`: throughput, memory, restore, latency and failover as
# the keys in state grow past --state-memory-limit, ours and Kafka Streams
# (bench/scale.py has the method and the knobs: SCALE_*). Needs the release
# binaries, Java 17 and Maven for the peer, and the local stack (`make up`).
# Results: bench/results/<date>-scale.{json,md,svg}.
set -euo pipefail
cd "$(dirname "$0")/.."

. bench/prepare.sh
need_binaries loadgen streamctl sessionizer order-shipment-joiner window-aggregator
if [[ " ${SCALE_SYSTEMS:-kafka-streams} " == *" kafka-streams "* ]]; then
  build_peer
fi
BIN_DIR="$BIN" exec python3 bench/scale.py
