#!/usr/bin/env bash
# CI stage "launchers": Open MPI starts 4 workers that find each other from its variables alone.
# Runs on its own from a fresh clone (bash ci/launchers.sh); .ci/run runs every stage in turn.
set -euxo pipefail
cd "$(dirname "$0")/.."

bash ci/packages.sh
cargo build --release -p shmbroker-cli

# Local rank 0 hosts the broker; every collective is checked. Root needs Open MPI's
# allow-run-as-root settings.
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun -np 4 --oversubscribe target/release/shmbroker worker --from-env --selftest --repeat 3

