#!/usr/bin/env bash
# CI stage "examples": the API docs, every Rust example, and the README's demo.
# Runs on its own from a fresh clone (bash ci/examples.sh); .ci/run runs every stage in turn.
set -euxo pipefail
cd "$(dirname "$0")/.."

# The API docs build with no broken link, and every example runs (each as four processes).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --features shmbroker/tokio
for example in hello all_gather fd_sharing gpu_handles scheduler; do
  cargo run --example "$example"
done

# A server answering 4 workers from one tokio task (5 processes).
cargo run --example tokio_server --features tokio

# The README's main command.
cargo run --release -- demo
