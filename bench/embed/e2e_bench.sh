#!/usr/bin/env bash
# `make bench-embed`: embed-batcher end to end with the local model, on the
# local stack (`make up`): articles/s in, rows/s out and peak RSS
# (bench/results/2026-12-01-diary.md, "embed-batcher's model").
#
# Produces TENANTS x PER_TENANT ~100-word article edits (articles.py; default
# 20 x 100 = 2000, every tenant's edits in full batches of 50) to a fresh
# 1-partition topic, then starts the release embed-batcher on it with its
# defaults (--embedder local, --batch-size 50, --embed-workers 2,
# --model-threads = the cores, exactly-once) and follows it with `loadgen
# watch` from its start until all input is committed and the output has
# stopped growing. BENCH_RUNS runs (1), each on new topics.
# EXTRA_FLAGS are added to the service's flags.
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN="${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}"
TENANTS="${TENANTS:-20}"
PER_TENANT="${PER_TENANT:-100}"
RUNS="${BENCH_RUNS:-1}"
SCHEMAS=shared/schemas/avro
WORK="${TMPDIR:-/tmp}/embed-bench-$$"
mkdir -p "$WORK"

cargo build --release -p embed-batcher -p streamctl -p bench-loadgen
bash deploy/local/models.sh
python3 bench/embed/articles.py "$TENANTS" "$PER_TENANT" "$WORK/articles.jsonl"
articles=$((TENANTS * PER_TENANT))

service=
trap '[ -n "$service" ] && kill -TERM "$service" 2>/dev/null; wait 2>/dev/null; true' EXIT

for run in $(seq "$RUNS"); do
  name="embed-bench-$(date +%s)-$run"
  "$BIN/streamctl" topics create "$name-articles" --partitions 1 >/dev/null
  "$BIN/streamctl" topics create "$name-embeddings" --partitions 1 >/dev/null
  "$BIN/streamctl" produce --topic "$name-articles" --schema "$SCHEMAS/articles.avsc" \
    --file "$WORK/articles.jsonl" >/dev/null
  # shellcheck disable=SC2086 # EXTRA_FLAGS is a list of flags
  "$BIN/embed-batcher" --application-id "$name" --state-dir "$WORK/state-$run" \
    --http-addr 127.0.0.1:19199 --input-topic "$name-articles" \
    --output-topic "$name-embeddings" ${EXTRA_FLAGS:-} >"$WORK/$name.log" 2>&1 &
  service=$!
  result=$("$BIN/loadgen" watch --pid "$service" --group "$name" --inputs "$name-articles" \
    --outputs "$name-embeddings" --quiet-ms 3000 --input-markers 1)
  kill -TERM "$service"
  wait "$service" || true
  service=
  rows=$("$BIN/streamctl" consume --topic "$name-embeddings" --from-beginning --until-end | wc -l)
  RESULT="$result" ROWS="$rows" ARTICLES="$articles" python3 - <<'PY'
import json, os
r = json.loads(os.environ["RESULT"])
rows, articles = int(os.environ["ROWS"]), int(os.environ["ARTICLES"])
assert r["ok"], r
# Timed from the process's start (model loading included) until the last
# row is out: the input is committed only as its batches' rows go out, so
# the first commit may come late and carry most of the input.
wall = r["startup_s"] + r["wall_s"]
print(f"{articles} articles (+1 clock edit) in, {rows} rows out in {wall:.1f} s from start: "
      f"{articles / wall:.1f} articles/s, {rows / wall:.1f} rows/s; "
      f"peak RSS {r['rss_peak_mib']:.0f} MiB")
PY
done
