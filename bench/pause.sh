#!/usr/bin/env bash
# `make bench-pause`: the pause of the tasks that do not move while a group
# changes, ours and Kafka Streams (bench/pause.py has the method and the
# knobs: PAUSE_*). Needs the release binaries, Java 17 and Maven for the
# peer, and the local stack (`make up`). Results: bench/results/<date>-pause.json.
set -euo pipefail
cd "$(dirname "$0")/.."

. bench/prepare.sh
need_binaries loadgen streamctl sessionizer
if [[ " ${PAUSE_SYSTEMS:-kafka-streams} " == *" kafka-streams "* ]]; then
  build_peer
fi
BIN_DIR="$BIN" exec python3 bench/pause.py
