#!/usr/bin/env bash
# CI stage "chaos": 100 chaos trials (kills, broker deaths, scribbles, forked socket holders,
# leaves).
# Runs on its own from a fresh clone (bash ci/chaos.sh); .ci/run runs every stage in turn.
set -euxo pipefail
cd "$(dirname "$0")/.."

cargo build --release -p shmbroker-test-support --bin chaos

# The chaos suite, beyond the 30 trials `cargo test` runs: 100 trials of kills, broker deaths,
# scribbles, forked socket holders and leaves; exits 1 on any hang, leak, misnamed rank or stray
# signal, and prints the detection times (reported, not asserted).
target/release/chaos --trials 100

# The soak (`chaos --soak 300`, by hand) is not run here yet: it found a stale acknowledgement
# after a rejoin (about one in 2,500 kills; fixed: a loan view's acknowledgement now names the
# process that lent it), and comes back here once long soaks have confirmed the fix; `cargo
# test` runs 12 s of it.
