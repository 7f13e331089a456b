#!/usr/bin/env bash
# The checks for a machine with an NVIDIA GPU and 16 cores, when a session is lent one (they
# need what this 2-core CI machine lacks; CI does not run this script). One short run:
#
#   bash ci/device.sh [SECONDS]     # SECONDS: the budget for the timed parts (default 240)
#
# 1. GPU memory shared between two workers through shmbroker, from Rust (tests/cuda.rs: a legacy
#    CUDA IPC handle and a VMM POSIX-fd handle, every byte checked); without a driver it says so.
# 2. The collectives at 8 and 16 ranks: the launcher's self-test (every collective checked).
# 3. torch on 2 nodes of 8 ranks made with SHMBROKER_NODE (issue 46's rows), when a Python with
#    torch and shmbroker is at SHMBROKER_BENCH_PYTHON (default python3).
set -euxo pipefail
cd "$(dirname "$0")/.."
budget=${1:-240}

cargo build --release -p shmbroker-cli
cargo test --release -p shmbroker-test-support --features cuda --test cuda -- --nocapture
for ranks in 8 16; do
  timeout 120 target/release/shmbroker run -n "$ranks" --timeout 100 -- \
    target/release/shmbroker worker --from-env --selftest --repeat 3
done
python=${SHMBROKER_BENCH_PYTHON:-python3}
if "$python" -c 'import torch, shmbroker.torch' 2>/dev/null; then
  (cd python/bench && timeout "$budget" "$python" torch_nodes.py --nodes 2 --per-node 8 \
    --rounds 3 --budget 0.2)
else
  echo "skipped: torch on 2 nodes x 8 ($python cannot import torch and shmbroker.torch)"
fi
