#!/usr/bin/env bash
# `make compose-demo`: deploy/docker/compose.yaml brought up for real with
# podman-compose (PyPI, pinned) on podman, no daemon: Kafka, a schema
# registry and the five services from `make image`; the example data of
# tests/fixtures goes in through the `tools` service (streamctl in the
# image) and the results come out, checked against the expected files.
# Kafka's and the registry's public images cannot be pulled here, so local
# stand-ins are built on the local base from the jars and the registry
# binary `make up` uses (deploy/image/compose/); compose.yaml takes them
# through KAFKA_IMAGE and SCHEMA_REGISTRY_IMAGE. Everything is removed at the
# end (`down -v`). Not part of `make test`: docs/deploy.md says why.
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/image/env.sh

PODMAN_COMPOSE_VERSION=1.6.0
tools="${DEPLOY_TOOLS_HOME:-/var/tmp/streams-deploy-tools}/podman-compose-$PODMAN_COMPOSE_VERSION"
if [ ! -f "$tools/podman_compose.py" ]; then
  image_step "installing podman-compose $PODMAN_COMPOSE_VERSION (PyPI) into $tools"
  rm -rf "$tools.tmp"
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target "$tools.tmp" "podman-compose==$PODMAN_COMPOSE_VERSION" 2> >(grep -v "Running pip as the 'root' user" >&2)
  mv "$tools.tmp" "$tools"
fi
compose() { PYTHONPATH="$tools" python3 -m podman_compose -f deploy/docker/compose.yaml -p streams-compose-demo "$@"; }

podman image exists localhost/streams-services:latest \
  || { echo "[compose-demo] ERROR: no localhost/streams-services:latest; run make image" >&2; exit 1; }

STACK_HOME="${STACK_HOME:-/var/tmp/streams-stack}"
bash deploy/local/stack.sh install
image_step "building the Kafka and registry stand-ins"
podman build --quiet --pull=never --build-context "kafka-libs=$STACK_HOME/kafka-libs" \
  -f deploy/image/compose/kafka.Dockerfile -t localhost/streams-kafka:local . >/dev/null
podman build --quiet --pull=never --build-context "registry-bin=$STACK_HOME/bin" \
  -f deploy/image/compose/registry.Dockerfile -t localhost/streams-registry:local . >/dev/null
export KAFKA_IMAGE=localhost/streams-kafka:local SCHEMA_REGISTRY_IMAGE=localhost/streams-registry:local
# The local stack may hold 8081.
export REGISTRY_HOST_PORT="${REGISTRY_HOST_PORT:-28081}"

work=$(mktemp -d "${TMPDIR:-/tmp}/compose-demo.XXXXXX")
cleanup() {
  local status=$?
  [ "$status" = 0 ] || tail -n 20 "$work/streamctl.log" >&2 2>/dev/null || true
  compose logs >"$work/compose.log" 2>&1 || true
  compose down -v >/dev/null 2>&1 || true
  echo "[compose-demo] logs of every container: $work/compose.log"
}
trap cleanup EXIT

started=$(date +%s)
image_step "compose up"
compose up -d >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; exit 1; }

# streamctl in a one-off `tools` container, the example data mounted read-only.
streamctl() {
  compose --profile tools run --rm -T -v "$PWD/tests/fixtures:/fixtures:ro" \
    -v "$PWD/deploy/local/demo-data:/demo-data:ro" tools streamctl "$@" 2>>"$work/streamctl.log"
}
produce() { # topic file
  streamctl topics create "$1" --partitions 1 >/dev/null
  streamctl produce --topic "$1" --schema "/usr/share/streams/schemas/$1.avsc" --file "$2" >/dev/null
}
image_step "producing the example data"
produce temperature-readings /fixtures/sensor-fusion/temperature-readings.jsonl
produce humidity-readings /fixtures/sensor-fusion/humidity-readings.jsonl
produce orders /fixtures/order-shipment-joiner/orders.jsonl
produce shipments /fixtures/order-shipment-joiner/shipments.jsonl
produce user-events /fixtures/sessionizer/user-events.jsonl
produce orders-marketplace /fixtures/window-aggregator/orders-marketplace.jsonl
produce articles /demo-data/articles.jsonl

failed=0
check() { # service topic expected-file
  local expected count
  expected="tests/fixtures/$1/$3"
  count=$(grep -c . "$expected")
  streamctl consume --topic "$2" --from-beginning --max "$count" --idle-exit 180s >"$work/$2.jsonl" || true
  if python3 - "$work/$2.jsonl" "$expected" <<'PY'
import json, sys
rows = lambda path: sorted(json.dumps(json.loads(l), sort_keys=True) for l in open(path) if l.strip())
sys.exit(rows(sys.argv[1]) != rows(sys.argv[2]))
PY
  then echo "[compose-demo] $1: $count rows on $2, as expected"
  else echo "[compose-demo] $1: $2 differs from $expected (got $work/$2.jsonl)" >&2; failed=1
  fi
}
check sensor-fusion machine-maintenance machine-maintenance.expected.jsonl
check order-shipment-joiner shipped-orders shipped-orders.expected.jsonl
check sessionizer user-sessions user-sessions.expected.jsonl
check window-aggregator order-window-counts order-window-counts.expected.jsonl

# embed-batcher runs with compose's defaults (--batch-size 50, 30 s max-wait):
# each tenant's batch goes after max-wait, the late acme/42 edit and
# initech/2 (past the watermark) stay out; vectors from the model in the image.
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
  echo "[compose-demo] embed-batcher: 7 rows with 384-number vectors"
  python3 deploy/local/embedding_cosines.py "$work/article-embeddings.jsonl" \
    paraphrases acme/42 initech/3 unrelated acme/42 initech/1
else
  echo "[compose-demo] embed-batcher: unexpected rows (got $work/article-embeddings.jsonl)" >&2; failed=1
fi

echo "[compose-demo] $(( $(date +%s) - started )) s from compose up to the last result"
exit "$failed"
