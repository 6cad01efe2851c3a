#!/usr/bin/env bash
# `make bench-restore`: how fast a task rebuilds its state from its changelog
# (the current figure: BENCHMARKS.md, "The other benchmarks"; the runs and
# what changed them: bench/results/2026-12-01-diary.md, "Restore").
#
# The joiner keeps every order and every shipment until the join window has
# passed, so its two changelogs hold about as many records as its inputs
# (~1.45M at the default size, 2026-12-01).
# This script fills RESTORE_RECORDS orders and as many shipments (default
# 600 000 each) on fresh 1-partition topics, runs the release joiner over
# them once (exactly-once, so the changelogs are written as in production),
# then BENCH_RUNS times (3) starts it again on an empty state directory with
# the same application id: the task restores both stores from the changelogs
# before it processes anything. Each run reports, from the service's own log
# ("restored changelog", "task ready"), the records per store, the restore's
# time and rate (a task's changelogs are read together) and the time from
# the assignment until the task is ready (restore plus loading its timers).
# Each run is followed by the ceiling: one consumer set up like the
# restore's reading the same changelogs and doing nothing else
# (`loadgen read-all`).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN="${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}"
RECORDS="${RESTORE_RECORDS:-600000}"
RUNS="${BENCH_RUNS:-3}"
HTTP=127.0.0.1:19871
RUN="restore-$(date +%s)"
WORK="${TMPDIR:-/tmp}/$RUN"
mkdir -p "$WORK"
trap '[ -n "${RESTORE_KEEP:-}" ] || rm -rf "$WORK"' EXIT

if [ -z "${BIN_DIR:-}" ]; then
  cargo build --release -p order-shipment-joiner -p bench-loadgen
fi

inputs="$RUN-orders,$RUN-shipments"
"$BIN/loadgen" topics --create "$inputs,$RUN-out" >/dev/null
"$BIN/loadgen" fill --use-case order-shipment-joiner --topics "$inputs" --records "$RECORDS" >/dev/null

# Starts the joiner on state directory $1, logging JSON to $2; its pid goes
# to $pid.
start_joiner() {
  "$BIN/order-shipment-joiner" --orders-topic "$RUN-orders" --shipments-topic "$RUN-shipments" \
    --output-topic "$RUN-out" --application-id "$RUN" --state-dir "$1" \
    --http-addr "$HTTP" --log-format json >"$2" 2>&1 &
  pid=$!
}

stop() {
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

echo "[bench-restore] building state: $RECORDS orders + $RECORDS shipments" >&2
start_joiner "$WORK/state-0" "$WORK/build.log"
"$BIN/loadgen" watch --pid "$pid" --group "$RUN" --inputs "$inputs" --outputs "$RUN-out" \
  --metrics-addr "$HTTP" >"$WORK/build.json"
stop

for run in $(seq "$RUNS"); do
  log="$WORK/restore-$run.log"
  start_joiner "$WORK/state-$run" "$log"
  # /readyz answers 200 once every task of every stage is restored.
  until curl -sf "http://$HTTP/readyz" >/dev/null; do
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.2
  done
  stop
  python3 - "$run" "$log" <<'PY'
import json, sys
run, path = sys.argv[1], sys.argv[2]
fields = [json.loads(line).get("fields", {}) for line in open(path) if line.startswith("{")]
restored = [f for f in fields if f.get("message") == "restored changelog"]
for f in restored:
    print(f"run {run}: {f['topic']}: {f['records']:,} records")
if restored:
    # The changelogs of a task are read together: one elapsed time for all.
    records, ms = sum(f["records"] for f in restored), max(f["elapsed_ms"] for f in restored)
    print(f"run {run}: {records:,} records in {ms} ms: {records / max(ms, 1) * 1000:,.0f} records/s")
for f in fields:
    if f.get("message") == "task ready":
        print(f"run {run}: task ready {f['elapsed_ms']} ms after its assignment")
PY
  [ -n "${RESTORE_KEEP:-}" ] || rm -rf "$WORK/state-$run"
  changelogs=$(python3 - "$log" <<'PY'
import json, sys
fields = [json.loads(line).get("fields", {}) for line in open(sys.argv[1]) if line.startswith("{")]
print(",".join(f["topic"] for f in fields if f.get("message") == "restored changelog"))
PY
)
  if [ -n "$changelogs" ]; then
    "$BIN/loadgen" read-all --topics "$changelogs" | RUN_NUMBER="$run" python3 -c '
import json, os, sys
r = json.load(sys.stdin)
run = os.environ["RUN_NUMBER"]
print("run {}: read alone: {:,} records in {} ms: {:,} records/s".format(
    run, r["records"], r["elapsed_ms"], r["records_per_s"]))'
  fi
done
