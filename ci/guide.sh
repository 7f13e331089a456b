#!/usr/bin/env bash
# CI stage "guide": the mdBook guide builds, and no relative link in it is broken.
# Runs on its own from a fresh clone (bash ci/guide.sh); .ci/run runs every stage in turn.
set -euxo pipefail
cd "$(dirname "$0")/.."

if ! command -v mdbook >/dev/null 2>&1; then
  cargo install mdbook --locked
fi
python3 ci/check_links.py
guide_out=$(mktemp -d)
trap 'rm -rf "$guide_out"' EXIT
mdbook build docs/guide --dest-dir "$guide_out"
test -s "$guide_out/index.html"
for chapter in concepts messages reductions groups farms channels liveness launchers c_cpp python \
  torch nodes guarantees benchmarks; do
  test -s "$guide_out/$chapter.html"
done
