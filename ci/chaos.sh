#!/usr/bin/env bash
# CI stage "chaos": 100 chaos trials (kills, broker deaths, scribbles, forked socket holders,
# leaves), 340 of symmetric all-reduces, 200 jobs of deaths and rejoins during regroup, then a
# 5-minute soak of kills and rejoins.
# Runs on its own from a fresh clone (bash ci/chaos.sh); .ci/run runs every stage in turn.
set -euxo pipefail
cd "$(dirname "$0")/.."

cargo build --release -p shmbroker-test-support --bin chaos -p shmbroker-cli

# The chaos suite, beyond the 30 trials `cargo test` runs: 100 trials of kills, broker deaths,
# scribbles, forked socket holders and leaves; exits 1 on any hang, leak, misnamed rank or stray
# signal, and prints the detection times (reported, not asserted).
target/release/chaos --trials 100

# Symmetric all-reduces at every piece size: 170 trials with a rank killed (510 survivor reports)
# and 170 with one leaving; exits 1 if a survivor names a live rank (or anyone but the victim).
target/release/chaos --trials 170 --scenario kill --op symmetric
target/release/chaos --trials 170 --scenario leave --op symmetric

# Deaths and rejoins during group-making: 200 jobs of 4 ranks under `shmbroker run --restart 3`,
# ranks killed at random moments (inside regroup, collectives, logons and rejoins) while every
# rank recovers the world's group; exits 1 on a hang, a failed job or ranks ending in different
# groups, and prints the time from each replacement's logon to its first collective.
target/release/chaos --rejoin 200

# The soak: one job of 4 ranks for 5 minutes, ranks 2 and 3 killed every 0.2-1.2 s and started
# again, every collective at random sizes checked bit for bit; exits 1 on a wrong result, an
# error other than a death's, 10 s without progress, or memory or fds that grow. (A 30-minute
# soak of the fixed stale-acknowledgement bug ran clean by hand before it came back here.)
target/release/chaos --soak 300
