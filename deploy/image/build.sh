#!/usr/bin/env bash
# Builds the image of deploy/docker/Dockerfile with podman (no daemon) from
# binaries built on this host, which runs the image's Debian release:
#   deploy/image/build.sh release streams-services:latest   (make image)
#   deploy/image/build.sh debug   streams-services:test     (make test)
# The base is made locally (base.sh) and nothing is pulled (--pull=never);
# the model is the folder `make models` fills. The Dockerfile is the one
# users build with `docker build`; BINARIES=host and MODEL=host pick the
# stages that copy from these build contexts instead of compiling.
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/image/env.sh
source deploy/services.sh

profile="${1:?usage: build.sh debug|release TAG}"
tag="${2:?usage: build.sh debug|release TAG}"
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/streams-target}"
model="${MODELS_DIR:-/var/tmp/streams-models}/all-MiniLM-L6-v2"
# The services of deploy/k8s/services.toml and streamctl: what the Dockerfile's
# bins-host stage copies, generated from the same table.
BINARIES=("${SERVICES[@]}" streamctl)

bash deploy/image/base.sh
bash deploy/local/models.sh

# Only these binaries, without their DWARF sections (symbols stay, so
# backtraces keep function names): the context holds nothing else, and the
# debug build's line tables would double the layer.
bins="$IMAGE_HOME/bins-$profile"
rm -rf "$bins" && mkdir -p "$bins"
for binary in "${BINARIES[@]}"; do
  built="$CARGO_TARGET_DIR/$profile/$binary"
  [ -x "$built" ] || { echo "[image] ERROR: $built is not built (cargo build$([ "$profile" = release ] && echo " --release") --bins)" >&2; exit 1; }
  strip --strip-debug -o "$bins/$binary" "$built"
done

image_step "podman build $tag ($profile binaries from $CARGO_TARGET_DIR/$profile)"
podman build --quiet --pull=never --layers --label io.streams.build=deploy-image \
  --build-arg BINARIES=host --build-arg MODEL=host \
  --build-context "host-bins=$bins" --build-context "host-model=$model" \
  -f deploy/docker/Dockerfile -t "$tag" . >/dev/null
# The image this tag had before, now untagged; only this script's.
podman image prune --force --filter label=io.streams.build=deploy-image >/dev/null
podman image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' "$tag"
