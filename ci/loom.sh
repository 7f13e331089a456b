#!/usr/bin/env bash
# CI stage "loom": the loom model checks of every atomic protocol.
# Runs on its own from a fresh clone (bash ci/loom.sh); .ci/run runs every stage in turn.
set -euxo pipefail
cd "$(dirname "$0")/.."

# Loom model checks of every atomic protocol. Their own target dir: --cfg loom rebuilds everything.
# queues: the ring, futex, interrupt and readiness protocols (ReadySet, which the session calls).
# handshake: the liveness state a session shares with its watcher thread.
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom \
  cargo test --release -p shmbroker-queues -p shmbroker-handshake --lib loom
