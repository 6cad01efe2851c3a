#!/usr/bin/env bash
# Installs the Debian packages the Rust build needs, if any is missing
# (see docs/build.md): cmake for librdkafka, libclang for RocksDB's bindgen,
# the curl header librdkafka's CMake build includes, OpenSSL for TLS.
set -euo pipefail

packages=(cmake libclang1-14 libclang-common-14-dev libcurl4-openssl-dev libssl-dev pkg-config)
missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "[deps] installing: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "[deps] ERROR: need root (or sudo) to install ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
else
  SUDO=
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
