# Sourced by the deploy/image scripts: installs podman and friends when they
# are missing and points podman/buildah at the project's containers.conf.
# shellcheck shell=bash
IMAGE_HOME="${IMAGE_HOME:-/var/tmp/streams-image}"
CONTAINERS_CONF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/containers.conf"
export IMAGE_HOME CONTAINERS_CONF

image_step() { echo "[image] $*"; }

if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null \
   || ! command -v runc >/dev/null || ! command -v catatonit >/dev/null; then
  image_step "installing podman buildah runc catatonit debootstrap (apt-get)"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    podman buildah runc catatonit debootstrap >/dev/null
fi
