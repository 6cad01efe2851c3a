#!/usr/bin/env bash
# `make bench-pause`: the pause of the tasks that do not move while a group
# changes, ours and Kafka Streams (bench/pause.py has the method and the
# knobs: PAUSE_*). Needs the release binaries, Java 17 and Maven for the
# peer, and the local stack (`make up`). Results: bench/results/<date>-pause.json.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN="${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}"
for binary in loadgen streamctl sessionizer; do
  [ -x "$BIN/$binary" ] || { echo "$BIN/$binary is not built (cargo build --release --bins)" >&2; exit 1; }
done
peer=bench/peers/kafka-streams
if [[ " ${PAUSE_SYSTEMS:-kafka-streams} " == *" kafka-streams "* ]] && { [ ! -f "$peer/target/ks-peer.jar" ] \
    || [ -n "$(find "$peer/pom.xml" "$peer/src" -newer "$peer/target/ks-peer.jar" -print -quit)" ]; }; then
  mvn -q -B -f "$peer/pom.xml" package -DskipTests >&2
fi
BIN_DIR="$BIN" exec python3 bench/pause.py
