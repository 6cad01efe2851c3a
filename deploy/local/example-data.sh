# Sourced: the example data of tests/fixtures into the services' input topics, and their
# results read back and checked against the expected files, wherever the services run
# (deploy/image/compose-demo.sh: podman compose; deploy/k8s/cluster/test.sh: Kubernetes).
#
# The caller defines `streamctl` (run wherever the Kafka and registry it tests are reached)
# and sets EXAMPLE_REPO: the repository's root as streamctl sees it.
# shellcheck shell=bash

# Input topic, partitions, then the file of its records: a path in the repository, unless
# absolute. One partition: the expected files are what one task per service makes of the
# inputs in their order. No fixture for embed-batcher: a handful of edits written for the demo.
EXAMPLE_INPUTS=(
  temperature-readings 1 tests/fixtures/sensor-fusion/temperature-readings.jsonl
  humidity-readings 1 tests/fixtures/sensor-fusion/humidity-readings.jsonl
  orders 1 tests/fixtures/order-shipment-joiner/orders.jsonl
  shipments 1 tests/fixtures/order-shipment-joiner/shipments.jsonl
  user-events 1 tests/fixtures/sessionizer/user-events.jsonl
  orders-marketplace 1 tests/fixtures/window-aggregator/orders-marketplace.jsonl
  articles 1 deploy/local/demo-data/articles.jsonl
  clicks 1 tests/fixtures/deduplicator/clicks.jsonl
)
# Service, output topic, then the file of the rows expected on it: a path of this machine, in
# the repository unless absolute. embed-batcher's rows are checked by document (below).
EXAMPLE_OUTPUTS=(
  sensor-fusion machine-maintenance tests/fixtures/sensor-fusion/machine-maintenance.expected.jsonl
  order-shipment-joiner shipped-orders tests/fixtures/order-shipment-joiner/shipped-orders.expected.jsonl
  sessionizer user-sessions tests/fixtures/sessionizer/user-sessions.expected.jsonl
  window-aggregator order-window-counts tests/fixtures/window-aggregator/order-window-counts.expected.jsonl
  deduplicator unique-clicks tests/fixtures/deduplicator/unique-clicks.expected.jsonl
)

# Another input for a topic, and the rows then expected of its service: example_replace
# user-events 2 /tmp/events.jsonl user-sessions /tmp/sessions.jsonl
example_replace() { # input-topic partitions file output-topic expected-file
  local i
  for ((i = 0; i < ${#EXAMPLE_INPUTS[@]}; i += 3)); do
    [ "${EXAMPLE_INPUTS[i]}" = "$1" ] && EXAMPLE_INPUTS[i + 1]="$2" EXAMPLE_INPUTS[i + 2]="$3"
  done
  for ((i = 0; i < ${#EXAMPLE_OUTPUTS[@]}; i += 3)); do
    [ "${EXAMPLE_OUTPUTS[i + 1]}" = "$4" ] && EXAMPLE_OUTPUTS[i + 2]="$5"
  done
  return 0
}

in_repo() { # path root: the path, under root unless absolute
  case "$1" in /*) echo "$1" ;; *) echo "$2/$1" ;; esac
}

example_create_topics() {
  local i
  for ((i = 0; i < ${#EXAMPLE_INPUTS[@]}; i += 3)); do
    streamctl topics create "${EXAMPLE_INPUTS[i]}" --partitions "${EXAMPLE_INPUTS[i + 1]}" >/dev/null
  done
}

example_produce() { # topic file (as streamctl sees it)
  streamctl produce --topic "$1" --schema "$EXAMPLE_REPO/shared/schemas/avro/$1.avsc" --file "$2" >/dev/null
}

example_produce_all() {
  local i
  for ((i = 0; i < ${#EXAMPLE_INPUTS[@]}; i += 3)); do
    example_produce "${EXAMPLE_INPUTS[i]}" "$(in_repo "${EXAMPLE_INPUTS[i + 2]}" "$EXAMPLE_REPO")"
  done
}

# A service creates its output topic once it has reached Kafka: wait for it, up to 180 s.
example_wait_for_topic() { # topic
  local deadline=$((SECONDS + 180))
  until streamctl topics describe "$1" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 0 # the read below says what is missing
    sleep 2
  done
}

# Reads each output topic (read_committed) into WORK and compares it with the expected rows,
# order aside. embed-batcher's rows are checked by document and vector length: with the
# default --batch-size 50 and 30 s max-wait each tenant's batch goes after max-wait, and the
# late acme/42 edit and initech/2 (past the watermark) stay out. Returns 1 if any differs.
example_check_all() { # work-dir repository-root
  local work="$1" repo="$2" failed=0 i service topic expected count
  for ((i = 0; i < ${#EXAMPLE_OUTPUTS[@]}; i += 3)); do
    service="${EXAMPLE_OUTPUTS[i]}" topic="${EXAMPLE_OUTPUTS[i + 1]}"
    expected="$(in_repo "${EXAMPLE_OUTPUTS[i + 2]}" "$repo")"
    count=$(grep -c . "$expected")
    example_wait_for_topic "$topic"
    streamctl consume --topic "$topic" --from-beginning --max "$count" --idle-exit 180s \
      >"$work/$topic.jsonl" || true
    if python3 - "$work/$topic.jsonl" "$expected" <<'PY'
import json, sys
rows = lambda path: sorted(json.dumps(json.loads(l), sort_keys=True) for l in open(path) if l.strip())
sys.exit(rows(sys.argv[1]) != rows(sys.argv[2]))
PY
    then echo "[example-data] $service: $count rows on $topic, as expected"
    else echo "[example-data] $service: $topic differs from $expected (got $work/$topic.jsonl)" >&2; failed=1
    fi
  done

  example_wait_for_topic article-embeddings
  streamctl consume --topic article-embeddings --from-beginning --max 7 --idle-exit 180s \
    >"$work/article-embeddings.jsonl" || true
  if python3 - "$work/article-embeddings.jsonl" <<'PY'
import json, sys
rows = [json.loads(l)["value"] for l in open(sys.argv[1]) if l.strip()]
docs = sorted(f'{r["tenant_id"]}/{r["doc_id"]}' for r in rows)
want = sorted(["acme/42", "acme/17", "acme/5", "globex/8", "globex/9", "initech/1", "initech/3"])
ok = docs == want and all(len(r["embedding"]) == 384 for r in rows)
sys.exit(not ok)
PY
  then
    echo "[example-data] embed-batcher: 7 rows with 384-number vectors"
    python3 "$repo/deploy/local/embedding_cosines.py" "$work/article-embeddings.jsonl" \
      paraphrases acme/42 initech/3 unrelated acme/42 initech/1
  else
    echo "[example-data] embed-batcher: unexpected rows (got $work/article-embeddings.jsonl)" >&2; failed=1
  fi
  return "$failed"
}
