#!/usr/bin/env bash
# The documentation check of `make lint` (and so of CI's .ci/run):
#   1. Rust doc comments: `cargo doc` of the workspace, private items
#      included, with every broken intra-doc link an error.
#   2. Markdown: every relative link of every Markdown file of the checkout
#      (tracked or new, not ignored) goes to a file that exists, and every
#      `#anchor` to a heading that exists there (in the same file or in
#      another), checked offline by remark-cli with the remark-validate-links
#      plugin. External http(s) links are not checked: there is no network
#      here, and they are someone else's to keep.
# Either fails the check with the file, the link and what is wrong
# (remark prints file:line:column, the link and, for an anchor, the heading
# it may have meant).
#
# The plugin is given `repository: false`: it then neither asks git for a
# remote (this checkout may have none) nor treats links to a hosting site's
# URLs as local; it checks local paths only. Heading anchors are computed as
# GitHub does (github-slugger). It does not know anchors made by raw HTML
# (`<a id=...>`) or GitHub's line anchors (`file.rs#L10`); the docs use
# neither. remark only reads the files: it is run without `--output` and
# with `--no-stdout`, so nothing is written back.
#
# remark-cli and the plugin come from the npm registry, pinned, installed
# once per pair of versions into
# $LINT_TOOLS_HOME/remark-cli-<v>-validate-links-<v> (default
# /var/tmp/streams-tools), outside the checkout; later runs reuse them.
# Chosen over lychee, which checked the same offline but comes from
# crates.io as source: its cold `cargo install` took 9 min 2 s on this
# 2-core machine (measured 2026-12-05), too long for a cold CI run. The npm
# install of the two packages (196 packages, 21 MB), measured 2026-12-05 on
# this machine with npm's cache emptied first: 18 s (user 5.6 s).
set -euo pipefail
cd "$(dirname "$0")/../.."

REMARK_CLI_VERSION=12.0.1
VALIDATE_LINKS_VERSION=13.1.0
TOOLS_HOME="${LINT_TOOLS_HOME:-/var/tmp/streams-tools}"
CARGO="${CARGO:-cargo}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/streams-target}"

step() { echo "[check-docs] $*"; }

# --- remark-cli and remark-validate-links ----------------------------------------
remark_dir="$TOOLS_HOME/remark-cli-$REMARK_CLI_VERSION-validate-links-$VALIDATE_LINKS_VERSION"
remark="$remark_dir/node_modules/.bin/remark"
validate_links="$remark_dir/node_modules/remark-validate-links/index.js"
installed() {
  [ -f "$validate_links" ] &&
    "$remark" --version 2>/dev/null | grep -qF "remark-cli: $REMARK_CLI_VERSION"
}
if ! installed; then
  mkdir -p "$TOOLS_HOME"
  # One install at a time on a shared machine; the second waits and reuses it.
  exec 9>"$TOOLS_HOME/remark.lock"
  flock 9
  if ! installed; then
    step "installing remark-cli $REMARK_CLI_VERSION and remark-validate-links $VALIDATE_LINKS_VERSION (npm) into $remark_dir"
    rm -rf "$remark_dir.tmp"
    mkdir -p "$remark_dir.tmp"
    npm install --prefix "$remark_dir.tmp" --no-audit --no-fund --no-update-notifier \
      --loglevel=error "remark-cli@$REMARK_CLI_VERSION" \
      "remark-validate-links@$VALIDATE_LINKS_VERSION"
    rm -rf "$remark_dir"
    mv "$remark_dir.tmp" "$remark_dir"
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
step "remark with remark-validate-links, offline: ${#markdown[@]} Markdown files"
# --no-config, --no-ignore: no .remarkrc or .remarkignore changes what is
# checked. --frail: a warning (a broken link) fails. --quiet: only files
# with a warning are printed.
"$remark" --no-config --no-ignore --no-stdout --no-color --frail --quiet \
  --use "$validate_links=repository:false" -- "${markdown[@]}"
step "no broken links"
