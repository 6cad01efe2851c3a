#!/usr/bin/env bash
# `make demo`: every service on the example data of tests/fixtures (the worked
# examples of docs/services/), against the local stack.
#
# Each run uses its own topic names (prefix demo-<run>-) and application ids,
# so it can be repeated without old results mixing in. Services run in the
# background and are stopped (SIGTERM) at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
# SERVICES: those of deploy/k8s/services.toml; one without a run below is named, not an error.
source deploy/services.sh

TARGET="${CARGO_TARGET_DIR:-target}/debug"
FIXTURES=tests/fixtures
SCHEMAS=shared/schemas/avro
RUN="demo-$(date +%s)"
WORK="${TMPDIR:-/tmp}/$RUN"
mkdir -p "$WORK"
streamctl() { "$TARGET/streamctl" "$@"; }

pids=()
started=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

topic() { echo "$RUN-$1"; }
create_and_produce() { # topic-name fixture-file partitions
  local name; name=$(topic "$1")
  streamctl topics create "$name" --partitions "${3:-1}" >/dev/null
  streamctl produce --topic "$name" --schema "$SCHEMAS/$1.avsc" --file "$2"
}

echo "== producing the example data of $FIXTURES (topics prefixed $RUN-)"
create_and_produce temperature-readings "$FIXTURES/sensor-fusion/temperature-readings.jsonl"
create_and_produce humidity-readings "$FIXTURES/sensor-fusion/humidity-readings.jsonl"
create_and_produce orders "$FIXTURES/order-shipment-joiner/orders.jsonl"
create_and_produce shipments "$FIXTURES/order-shipment-joiner/shipments.jsonl"
create_and_produce user-events "$FIXTURES/sessionizer/user-events.jsonl"
create_and_produce orders-marketplace "$FIXTURES/window-aggregator/orders-marketplace.jsonl"
# No fixture for embed-batcher: a handful of edits written for the demo.
create_and_produce articles deploy/local/demo-data/articles.jsonl
create_and_produce clicks "$FIXTURES/deduplicator/clicks.jsonl"

start() { # binary http-port args...
  local binary=$1 port=$2; shift 2
  "$TARGET/$binary" --application-id "$RUN-$binary" --state-dir "$WORK/state" \
    --http-addr "127.0.0.1:$port" "$@" >"$WORK/$binary.log" 2>&1 &
  pids+=($!)
  started+=("$binary")
  echo "   $binary started (log: $WORK/$binary.log, metrics: http://127.0.0.1:$port/metrics)"
}

# Output topics exist before anyone reads them (the services would create them too).
for output in machine-maintenance shipped-orders user-sessions order-window-counts article-embeddings unique-clicks; do
  streamctl topics create "$(topic "$output")" --partitions 1 >/dev/null
done

echo "== starting the services"
start sensor-fusion 19101 --temperature-topic "$(topic temperature-readings)" \
  --humidity-topic "$(topic humidity-readings)" --output-topic "$(topic machine-maintenance)"
start order-shipment-joiner 19102 --orders-topic "$(topic orders)" \
  --shipments-topic "$(topic shipments)" --output-topic "$(topic shipped-orders)"
start sessionizer 19103 --input-topic "$(topic user-events)" --output-topic "$(topic user-sessions)"
start window-aggregator 19104 --input-topic "$(topic orders-marketplace)" \
  --output-topic "$(topic order-window-counts)"
# Batches of 3 keep the example small; the vectors are the local model's
# (all-MiniLM-L6-v2, 384 numbers; the table shows the first few).
start embed-batcher 19105 --input-topic "$(topic articles)" --output-topic "$(topic article-embeddings)" \
  --batch-size 3
start deduplicator 19106 --input-topic "$(topic clicks)" --output-topic "$(topic unique-clicks)"
for service in "${SERVICES[@]}"; do
  [[ " ${started[*]} " == *" $service "* ]] \
    || echo "   $service skipped: deploy/local/demo.sh has no example run for it"
done

show() { # title topic rows
  echo
  echo "== $1 ($2)"
  streamctl consume --topic "$2" --from-beginning --max "$3" --idle-exit 60s --format table
}
show "sensor-fusion: maintenance verdicts per machine and window" "$(topic machine-maintenance)" 2
show "order-shipment-joiner: orders shipped within 7 days" "$(topic shipped-orders)" 10
show "sessionizer: sessions ended by LOGOUT or inactivity" "$(topic user-sessions)" 1
show "window-aggregator: 2 s hopping windows every 1 s over all orders" "$(topic order-window-counts)" 4
show "embed-batcher: a full batch (acme), batches after max-wait (globex, initech)" \
  "$(topic article-embeddings)" 7
show "deduplicator: each click id's first click; repeats within 10 minutes dropped" \
  "$(topic unique-clicks)" 4
echo
echo "== embed-batcher: cosine similarity of the vectors read back from $(topic article-embeddings)"
streamctl consume --topic "$(topic article-embeddings)" --from-beginning --max 7 --idle-exit 60s \
  >"$WORK/article-embeddings.jsonl"
python3 deploy/local/embedding_cosines.py "$WORK/article-embeddings.jsonl" \
  paraphrases acme/42 initech/3 unrelated acme/42 initech/1
echo
echo "demo done; stopping the services"
