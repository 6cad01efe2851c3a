#!/usr/bin/env bash
# --stream-threads 1 vs 2 (bench/results/2026-12-01-diary.md, "2026-12-01:
# `--stream-threads` 1 vs 2, 4 partitions, 2 cores"): one service,
# ours only, exactly_once_v2, commits every 100 ms, on a 4-partition input
# filled once by `loadgen fill --partitions 4`; the two thread counts
# alternate, the order flipping every round; `loadgen watch` measures each run
# from outside the process. Prints one JSON line per run.
#
#   bench/stream_threads.sh sessionizer 2000000 3
#
# Needs the release binaries of the service and loadgen, and streamctl
# (BIN_DIR, STREAMCTL), and the local stack.
set -euo pipefail
use_case=$1 records=$2 rounds=$3
BIN="${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}"
STREAMCTL="${STREAMCTL:-$BIN/streamctl}"
WORK="${TMPDIR:-/tmp}/stream-threads-bench"
mkdir -p "$WORK"
stamp=$(date +%s)
input="bt-$use_case-in-$stamp"
echo "fill: $("$BIN/loadgen" fill --use-case "$use_case" --topics "$input" \
  --records "$records" --partitions 4 --seed 7)" >&2
port=19700
for round in $(seq 1 "$rounds"); do
  if (( round % 2 )); then order="1 2"; else order="2 1"; fi
  for threads in $order; do
    app="bt-$use_case-t$threads-r$round-$stamp"
    port=$((port + 1))
    "$STREAMCTL" topics create "$app-out" --partitions 4 >/dev/null
    "$BIN/$use_case" --input-topic "$input" --output-topic "$app-out" --application-id "$app" \
      --processing-guarantee exactly_once_v2 --commit-interval 100ms \
      --state-dir "$WORK/state-$app" --http-addr "127.0.0.1:$port" --log-format json \
      --stream-threads "$threads" > "$WORK/$app.log" 2>&1 &
    pid=$!
    result=$("$BIN/loadgen" watch --pid "$pid" --group "$app" --inputs "$input" \
      --outputs "$app-out" --metrics-addr "127.0.0.1:$port" --timeout-secs 300)
    kill -TERM "$pid"
    wait "$pid" || echo "$app exited with $?" >&2
    rm -rf "$WORK/state-$app"
    # More task openings than tasks: the threads' first join split into two
    # generations and a rebalance moved tasks during the run.
    opened=$(grep -c '"task ready"' "$WORK/$app.log" || true)
    RESULT="$result" python3 - "$use_case" "$threads" "$round" "$opened" <<'PY'
import json, os, sys
use_case, threads, round_, opened = sys.argv[1:]
r = json.loads(os.environ["RESULT"])
keys = ("ok", "records_timed", "wall_s", "records_per_s", "cpu_s", "records_per_cpu_s",
        "rss_peak_mib", "error")
print(json.dumps({"use_case": use_case, "threads": int(threads), "round": int(round_),
                  "tasks_opened": int(opened), "load": os.getloadavg()[0]}
                 | {k: r.get(k) for k in keys}))
PY
  done
done
