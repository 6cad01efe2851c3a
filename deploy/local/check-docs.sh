#!/usr/bin/env bash
# The documentation check of `make lint` (and so of CI's .ci/run):
#   1. Rust doc comments: `cargo doc` of the workspace, private items
#      included, with every broken intra-doc link an error.
#   2. Markdown: every relative link of every Markdown file of the checkout
#      (tracked or new, not ignored) goes to a file that exists, and every
#      `#anchor` to a heading (or id) that exists there, checked offline by
#      lychee. External http(s) links are not checked: there is no network
#      here, and they are someone else's to keep.
# Either fails the check with the file, the link and what is wrong.
#
# lychee comes from crates.io: `cargo install --locked` builds it once per
# version into $LINT_TOOLS_HOME/lychee-<version> (default
# /var/tmp/streams-tools), outside the checkout, in a build directory of its
# own that is removed afterwards; later runs reuse the binary. A cold install of
# 0.24.2 measured 2026-12-05 on this 2-core machine, other builds sharing the
# cores: 9 min 2 s (user 12 min 44 s; crates downloaded during it).
set -euo pipefail
cd "$(dirname "$0")/../.."

LYCHEE_VERSION=0.24.2
TOOLS_HOME="${LINT_TOOLS_HOME:-/var/tmp/streams-tools}"
CARGO="${CARGO:-cargo}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/streams-target}"

step() { echo "[check-docs] $*"; }

# --- lychee -------------------------------------------------------------------
lychee_dir="$TOOLS_HOME/lychee-$LYCHEE_VERSION"
lychee="$lychee_dir/bin/lychee"
installed() { "$lychee" --version 2>/dev/null | grep -qF "$LYCHEE_VERSION"; }
if ! installed; then
  mkdir -p "$TOOLS_HOME"
  # One install at a time on a shared machine; the second waits and reuses it.
  exec 9>"$TOOLS_HOME/lychee.lock"
  flock 9
  if ! installed; then
    step "installing lychee $LYCHEE_VERSION (crates.io) into $lychee_dir: minutes, once"
    rm -rf "$lychee_dir.tmp" "$lychee_dir.build"
    CARGO_TARGET_DIR="$lychee_dir.build" "$CARGO" install --locked --quiet \
      --root "$lychee_dir.tmp" "lychee@$LYCHEE_VERSION"
    rm -rf "$lychee_dir" "$lychee_dir.build"
    mv "$lychee_dir.tmp" "$lychee_dir"
  fi
  exec 9>&-
fi

# --- Rust doc comments ----------------------------------------------------------
# Private items included: most of the runtime is private (the engine, tasks,
# restores), and its doc comments link to each other. So a public item's link
# to a private one resolves in these docs, and rustdoc's
# private_intra_doc_links (meant for crates that publish their public docs
# only; these are not published) is allowed.
step "cargo doc --workspace --no-deps --document-private-items, broken intra-doc links denied"
RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D rustdoc::broken_intra_doc_links -A rustdoc::private_intra_doc_links" \
  "$CARGO" doc --workspace --no-deps --document-private-items --keep-going --quiet

# --- Markdown -------------------------------------------------------------------
markdown=()
while IFS= read -r -d '' file; do
  [ -f "$file" ] && markdown+=("$file")
done < <(git ls-files -z --cached --others --exclude-standard -- '*.md')
step "lychee --offline --include-fragments: ${#markdown[@]} Markdown files"
"$lychee" --offline --include-fragments --no-progress --format compact -- "${markdown[@]}"
step "no broken links"
