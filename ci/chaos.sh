#!/usr/bin/env bash
# CI stage "chaos": 100 chaos trials (kills, broker deaths, scribbles, forked socket holders,
# leaves), then a 5-minute soak with kills and rejoins.
# Runs on its own from a fresh clone (bash ci/chaos.sh); .ci/run runs every stage in turn.
set -euxo pipefail
cd "$(dirname "$0")/.."

cargo build --release -p shmbroker-test-support --bin chaos

# The chaos suite, beyond the 30 trials `cargo test` runs: 100 trials of kills, broker deaths,
# scribbles, forked socket holders and leaves; exits 1 on any hang, leak, misnamed rank or stray
# signal, and prints the detection times (reported, not asserted).
target/release/chaos --trials 100

# The soak: one job for 5 minutes, every operation at random sizes, with kills and rejoins at
# random moments; exits 1 on a wrong result, a hang, or memory or fds growing beyond its bounds
# (it prints each long-lived process's figures).
target/release/chaos --soak 300
