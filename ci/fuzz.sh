#!/usr/bin/env bash
# CI stage "fuzz": a bounded run of every fuzz target (every decoder of another process's bytes).
# Runs on its own from a fresh clone (bash ci/fuzz.sh); .ci/run runs every stage in turn.
set -euxo pipefail
cd "$(dirname "$0")/.."

# Fuzz every decoder of another process's bytes for a bounded number of runs. Stable Rust: no
# sanitizer (a panic or crash still fails the run). New inputs go to a temp dir; the committed
# seeds in fuzz/corpus stay as they are.
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
fuzz_scratch=$(mktemp -d)
trap 'rm -rf "$fuzz_scratch"' EXIT
for target in $(cd fuzz && cargo fuzz list); do
  mkdir -p "$fuzz_scratch/$target"
  (cd fuzz && cargo fuzz run "$target" --sanitizer none "$fuzz_scratch/$target" "corpus/$target" \
    -- -runs=300000 -max_total_time=90)
done
