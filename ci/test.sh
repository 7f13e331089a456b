#!/usr/bin/env bash
# CI stage "test": the README's test command, and the tests behind optional features.
# Runs on its own from a fresh clone (bash ci/test.sh); .ci/run runs the README's command itself
# and then this stage with --features-only, so that nothing runs twice.
set -euxo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" != "--features-only" ]; then
  # The README's test command.
  cargo test --workspace
fi

# The optional tokio feature: AsyncReceiver against real worker processes.
cargo test -p shmbroker-test-support --features tokio --test tokio

# Real GPU memory between two processes; without an NVIDIA driver (as on CI) it says so and skips.
cargo test -p shmbroker-test-support --features cuda --test cuda -- --nocapture
