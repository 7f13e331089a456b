#!/usr/bin/env bash
# CI stage "packages": the Debian packages the later stages need (Open MPI, cmake, pkg-config).
# Runs on its own from a fresh clone (bash ci/packages.sh); .ci/run runs every stage in turn.
set -euxo pipefail
cd "$(dirname "$0")/.."

# mpicc (libopenmpi-dev) builds the Open MPI baselines the benchmarks run beside ours, mpirun
# starts workers in the launcher stage, cmake and pkg-config build the C and C++ examples.
if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicc >/dev/null 2>&1 \
  || ! command -v cmake >/dev/null 2>&1 || ! command -v pkg-config >/dev/null 2>&1; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y openmpi-bin libopenmpi-dev cmake pkg-config
fi
