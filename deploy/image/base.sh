#!/usr/bin/env bash
# The Dockerfile's base image, made locally: no public registry is reachable
# from the project's machines, so `debian:bookworm-slim` is built with
# debootstrap from the Debian archive and tagged with that name, and builds
# use --pull=never. The trimmed root filesystem is cached as a tarball in
# $IMAGE_HOME (default /var/tmp/streams-image); a rerun imports it again
# only if podman's store lost the image.
set -euo pipefail
source "$(dirname "$0")/env.sh"

BASE=docker.io/library/debian:bookworm-slim
if podman image exists "$BASE"; then
  exit 0
fi

tarball="$IMAGE_HOME/debian-bookworm-minbase.tar"
if [ ! -f "$tarball" ]; then
  mkdir -p "$IMAGE_HOME"
  rootfs=$(mktemp -d "$IMAGE_HOME/rootfs.XXXXXX")
  trap 'rm -rf "$rootfs" "$tarball.tmp"' EXIT
  image_step "debootstrap bookworm (minbase, ca-certificates, libssl3) into $rootfs"
  debootstrap --variant=minbase --include=ca-certificates,libssl3 \
    bookworm "$rootfs" http://deb.debian.org/debian >"$IMAGE_HOME/debootstrap.log" 2>&1 \
    || { tail -20 "$IMAGE_HOME/debootstrap.log" >&2; exit 1; }
  # What bookworm-slim leaves out too: apt's caches and lists, docs, man pages, locales.
  rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/* "$rootfs"/var/log/* "$rootfs"/var/cache/debconf/*-old
  tar --numeric-owner -C "$rootfs" -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
fi
image_step "importing $tarball as $BASE"
podman import --quiet --change 'CMD ["bash"]' "$tarball" "$BASE" >/dev/null
