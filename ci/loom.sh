#!/usr/bin/env bash
# CI stage "loom": the loom model checks of every atomic protocol.
# Runs on its own from a fresh clone (bash ci/loom.sh); .ci/run runs every stage in turn.
set -euxo pipefail
cd "$(dirname "$0")/.."

# Loom model checks of every atomic protocol. Their own target dir: --cfg loom rebuilds everything.
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom \
  cargo test --release -p shmbroker-queues --lib loom
