#!/usr/bin/env bash
# `make compose-demo`: deploy/docker/compose.yaml brought up for real with
# podman-compose (PyPI, pinned) on podman, no daemon: Kafka, a schema
# registry and the services from `make image`; the example data of
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

# streamctl in a one-off `tools` container, the repository mounted read-only.
streamctl() {
  compose --profile tools run --rm -T -v "$PWD:/repo:ro" tools streamctl "$@" 2>>"$work/streamctl.log"
}
EXAMPLE_REPO=/repo
source deploy/local/example-data.sh
image_step "producing the example data"
example_create_topics
example_produce_all

failed=0
example_check_all "$work" "$PWD" || failed=1

echo "[compose-demo] $(( $(date +%s) - started )) s from compose up to the last result"
exit "$failed"
