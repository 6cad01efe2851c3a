#!/usr/bin/env bash
# `make bench`: end-to-end throughput of each service on the local stack.
#
# For each service: generate N input records (deterministic), produce them
# with streamctl, start the service (release build) on them and sample its
# /metrics until every input record is consumed and committed. Reports
# records per wall-clock second and per CPU second of the service process
# (user + system time from /proc, all its threads: librdkafka's included).
#
#   BENCH_RECORDS   input records per service (default 400000)
#   BENCH_GUARANTEES  processing guarantees to measure (default "exactly_once_v2 at_least_once")
#   BIN_DIR         where the release binaries are (default $CARGO_TARGET_DIR/release)
#   BENCH_ONLY      run only the runs whose label matches this regex (default: all)
set -euo pipefail
cd "$(dirname "$0")/../.."

N="${BENCH_RECORDS:-400000}"
GUARANTEES="${BENCH_GUARANTEES:-exactly_once_v2 at_least_once}"
BIN="${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}"
RUN="bench-$(date +%s)"
WORK="${TMPDIR:-/tmp}/$RUN"
mkdir -p "$WORK"
SCHEMAS=shared/schemas/avro
TICKS=$(getconf CLK_TCK)

generate() { # service file
  python3 - "$1" "$N" >"$2" <<'PY'
import json, random, sys
service, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(42)
base = 1_785_574_800_000
out = sys.stdout
if service == "sessionizer":
    kinds = ["LOGIN", "VIEW", "SEARCH", "CART", "LOGOUT"]
    users = max(1, n // 5)
    for i in range(n):
        u = rng.randrange(users)
        out.write(json.dumps({"key": f"user-{u}", "value": {"user_id": f"user-{u}", "event_type": rng.choice(kinds), "event_time": base + i * 10}}) + "\n")
elif service == "sensor-fusion":
    for i in range(n):
        m = f"M{rng.randrange(1000)}"
        out.write(json.dumps({"key": m, "value": {"machine_id": m, "temperature": round(rng.uniform(60, 90), 1), "event_time": base + i * 10}}) + "\n")
elif service == "orders":
    for i in range(n):
        out.write(json.dumps({"key": str(i), "value": {"id": i, "total_amount": 10.5, "customer_name": f"c{i % 997}", "order_ts_raw": 1_692_000_000 + i}}) + "\n")
elif service == "window-aggregator":
    for i in range(n):
        customer = None if rng.random() < 0.1 else f"c{rng.randrange(5000)}"
        out.write(json.dumps({"key": f"o{i}", "value": {"order_id": f"o{i}", "customer_id": customer, "product_id": f"p{rng.randrange(100)}", "price": rng.randrange(100, 100000) / 100, "order_time": base + i * 10}}) + "\n")
elif service == "shipments":
    for i in range(n):
        out.write(json.dumps({"key": f"s{i}", "value": {"id": f"s{i}", "order_id": i, "warehouse": "Boston", "ship_ts_raw": 1_692_000_000 + i + 3600}}) + "\n")
PY
}

produce() { # topic schema file
  "$BIN/streamctl" topics create "$1" --partitions 1 >/dev/null
  "$BIN/streamctl" produce --topic "$1" --schema "$SCHEMAS/$2.avsc" --file "$3" 2>/dev/null
}

metric() { # port series
  curl -s "http://127.0.0.1:$1/metrics" | awk -v s="$2" '$1 == s { print $2 }'
}

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

measure() { # label binary expected-consumed consumed-series port args...
  local label=$1 binary=$2 total=$3 series=$4 port=$5; shift 5
  [[ "$label" =~ ${BENCH_ONLY:-.} ]] || return 0
  local name=${label//\//-}
  "$BIN/$binary" --state-dir "$WORK/state-$name" --http-addr "127.0.0.1:$port" --log-format json "$@" \
    >"$WORK/$name.log" 2>&1 &
  local pid=$! start_ns start_ticks consumed=0
  until [ "$(metric "$port" "$series")" != "" ] && [ "$(metric "$port" "$series")" != "0" ]; do
    kill -0 "$pid" 2>/dev/null || { echo "$label: service exited, see $WORK/$name.log" >&2; return 1; }
    sleep 0.05
  done
  start_ns=$(date +%s%N); start_ticks=$(cpu_ticks "$pid")
  while :; do
    consumed=$(metric "$port" "$series"); consumed=${consumed%.*}
    [ "${consumed:-0}" -ge "$total" ] && break
    sleep 0.1
  done
  local end_ns end_ticks; end_ns=$(date +%s%N); end_ticks=$(cpu_ticks "$pid")
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  python3 - "$label" "$total" "$start_ns" "$end_ns" "$((end_ticks - start_ticks))" "$TICKS" <<'PY'
import sys
label, total, s, e, ticks, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
wall = (e - s) / 1e9
cpu = ticks / hz
print(f"| {label} | {total} | {wall:.2f} s | {total / wall:,.0f} | {cpu:.2f} s | {total / cpu if cpu else float('nan'):,.0f} |")
PY
}

echo "generating and producing $N records per input (run $RUN)..." >&2
generate sessionizer "$WORK/events.jsonl"; produce "$RUN-user-events" user-events "$WORK/events.jsonl"
generate sensor-fusion "$WORK/temperatures.jsonl"; produce "$RUN-temperatures" temperature-readings "$WORK/temperatures.jsonl"
"$BIN/streamctl" topics create "$RUN-humidities" --partitions 1 >/dev/null
generate orders "$WORK/orders.jsonl"; produce "$RUN-orders" orders "$WORK/orders.jsonl"
generate shipments "$WORK/shipments.jsonl"; produce "$RUN-shipments" shipments "$WORK/shipments.jsonl"
generate window-aggregator "$WORK/marketplace.jsonl"; produce "$RUN-marketplace" orders-marketplace "$WORK/marketplace.jsonl"

echo "| run | input records | wall time | records/s | CPU time | records per CPU-second |"
echo "| --- | --- | --- | --- | --- | --- |"
port=19300
for guarantee in $GUARANTEES; do
  port=$((port + 1))
  measure "sessionizer/$guarantee" sessionizer "$N" "streams_records_consumed_total{topic=\"$RUN-user-events\"}" "$port" \
    --input-topic "$RUN-user-events" --output-topic "$RUN-sessions-$guarantee" \
    --application-id "$RUN-sessionizer-$guarantee" --processing-guarantee "$guarantee"
  port=$((port + 1))
  measure "sensor-fusion/$guarantee" sensor-fusion "$N" "streams_records_consumed_total{topic=\"$RUN-temperatures\"}" "$port" \
    --temperature-topic "$RUN-temperatures" --humidity-topic "$RUN-humidities" --max-task-idle 0s \
    --output-topic "$RUN-maintenance-$guarantee" --application-id "$RUN-fusion-$guarantee" --processing-guarantee "$guarantee"
  port=$((port + 1))
  # Every shipment joins its order: done when N rows are out (2N inputs in).
  measure "order-shipment-joiner/$guarantee" order-shipment-joiner "$N" \
    "streams_records_produced_total{topic=\"$RUN-shipped-$guarantee\"}" "$port" \
    --orders-topic "$RUN-orders" --shipments-topic "$RUN-shipments" --output-topic "$RUN-shipped-$guarantee" \
    --application-id "$RUN-joiner-$guarantee" --processing-guarantee "$guarantee"
  for grouping in global product_id customer_id; do
    port=$((port + 1))
    group_flag=(); [ "$grouping" = global ] || group_flag=(--group-by "$grouping")
    measure "window-aggregator ($grouping)/$guarantee" window-aggregator "$N" \
      "streams_records_consumed_total{topic=\"$RUN-marketplace\"}" "$port" \
      --input-topic "$RUN-marketplace" --output-topic "$RUN-windows-$grouping-$guarantee" "${group_flag[@]}" \
      --application-id "$RUN-windows-$grouping-$guarantee" --processing-guarantee "$guarantee"
  done
done
