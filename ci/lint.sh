#!/usr/bin/env bash
# CI stage "lint": rustfmt and clippy (every feature set), with no warning.
# Runs on its own from a fresh clone (bash ci/lint.sh); .ci/run runs every stage in turn.
set -euxo pipefail
cd "$(dirname "$0")/.."

# rustfmt and clippy ship with the toolchain here; add them if a machine lacks them.
for component in rustfmt clippy; do
  if ! rustup component list --installed 2>/dev/null | grep -q "^${component}"; then
    rustup component add "${component}"
  fi
done

cargo fmt --all -- --check
python3 ci/module_dag.py
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy --workspace --all-targets --features shmbroker-test-support/cuda -- -D warnings
cargo clippy --workspace --all-targets --features shmbroker-test-support/tokio -- -D warnings
