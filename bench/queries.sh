#!/usr/bin/env bash
# `make bench-queries`: interactive queries on one sessionizer, alone and
# while it processes a backlog, against RocksDB's point reads of the same
# state (bench/queries.py has the method and the knobs: QUERIES_*). Needs
# the release binaries and the local stack (`make up`), which it does not
# start. Results: bench/results/<date>-queries.{json,md}.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN="${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}"
for binary in loadgen streamctl sessionizer querygen readbench; do
  [ -x "$BIN/$binary" ] || { echo "$BIN/$binary is not built (cargo build --release --bins)" >&2; exit 1; }
done
"$BIN/streamctl" topics list >/dev/null 2>&1 \
  || { echo "no broker on the local stack: make up" >&2; exit 1; }
BIN_DIR="$BIN" exec python3 bench/queries.py
