#!/usr/bin/env bash
# CI stage "python": the Python package: lints, a fresh virtualenv install, pytest under shmbroker run.
# Runs on its own from a fresh clone (bash ci/python.sh); .ci/run runs every stage in turn.
set -euxo pipefail
cd "$(dirname "$0")/.."

# The Python package (python/, PyO3 + maturin, outside the workspace): its Rust formatted and
# lint-free, then built into a wheel and installed into a fresh virtualenv as a user would
# (maturin from PyPI), and its tests, which start real workers under `shmbroker run` and check the type stubs
# against the module (mypy's stubtest). NumPy too when a wheel is to be had (its tests skip
# otherwise, saying so).
cargo fmt --manifest-path python/Cargo.toml -- --check
# Open MPI (mpirun, and what mpi4py links against) for shmbroker.mpi's tests.
bash ci/packages.sh
cargo build --release -p shmbroker-cli
py_scratch=$(mktemp -d)
trap 'rm -rf "$py_scratch"' EXIT
if ! python3 -m venv "$py_scratch/venv"; then
  # Debian and Ubuntu ship venv (ensurepip) separately.
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv
  rm -rf "$py_scratch/venv"
  python3 -m venv "$py_scratch/venv"
fi
PYO3_PYTHON="$py_scratch/venv/bin/python" \
  cargo clippy --manifest-path python/Cargo.toml --all-targets -- -D warnings
# The package as users get it: `maturin build --release` makes one abi3 manylinux wheel, which
# installs with pip into the fresh virtualenv with no Rust toolchain on PATH (pip would need
# cargo for anything but a ready wheel, so a wheel that is not one fails here).
"$py_scratch/venv/bin/pip" install --quiet "maturin>=1.9,<2"
"$py_scratch/venv/bin/maturin" build --release --manifest-path python/Cargo.toml \
  --out "$py_scratch/dist"
wheel=$(ls "$py_scratch"/dist/shmbroker-*.whl)
case "$wheel" in
  *-cp39-abi3-manylinux*_x86_64.whl) ;;
  *) echo "not an abi3 manylinux wheel: $wheel" >&2; exit 1 ;;
esac
env PATH="$py_scratch/venv/bin:/usr/bin:/bin" "$py_scratch/venv/bin/pip" install --quiet \
  --no-build-isolation "$wheel"
env PATH="/usr/bin:/bin" "$py_scratch/venv/bin/python" -c \
  'import shutil, shmbroker; assert shutil.which("cargo") is None; print("wheel", shmbroker.__file__)'
"$py_scratch/venv/bin/pip" install --quiet pytest mypy typing_extensions
"$py_scratch/venv/bin/pip" install --quiet --only-binary :all: numpy \
  || echo "skipped: numpy (no wheel for this Python); the NumPy tests skip"
# torch, for the torch.distributed backend's tests against gloo (PyPI's wheel: about 5 GB with
# CUDA libraries that go unused here, about a minute; pip's cache keeps it between runs). The
# tests must run: SHMBROKER_REQUIRE_TORCH=1 makes a missing torch a failure, not a skip.
"$py_scratch/venv/bin/pip" install --quiet torch
# mpi4py, for shmbroker.mpi's tests under mpirun; they must run too (SHMBROKER_REQUIRE_MPI=1).
"$py_scratch/venv/bin/pip" install --quiet mpi4py
SHMBROKER_REQUIRE_TORCH=1 SHMBROKER_REQUIRE_MPI=1 SHMBROKER_BIN="$PWD/target/release/shmbroker" \
  "$py_scratch/venv/bin/python" -m pytest python/tests -q -rsxX
# Every Python block of the README files and the guide parses, and uses only names the package has.
"$py_scratch/venv/bin/python" ci/doc_blocks.py python
# The event reader and its workers over typed channels (NumPy records when NumPy is there).
target/release/shmbroker run -n 4 --timeout 60 -- "$py_scratch/venv/bin/python" \
  examples/python/event_reader.py
# The MindIE loop on a split Python session, quick (no timing is asserted): both modes ran.
SHMBROKER_BENCH_PYTHON="$py_scratch/venv/bin/python" cargo run --release -p shmbroker-benchmarks \
  -- farm --only response_wait_python --quick --json > "$py_scratch/response.jsonl"
grep -q '"bench":"response_wait_python","impl":"paced: no broadcast waits (the floor)"' \
  "$py_scratch/response.jsonl"
# torch on 2 nodes of 2 ranks made here (issue 46's rows), quick: all three contenders ran.
SHMBROKER_BENCH_PYTHON="$py_scratch/venv/bin/python" cargo run --release -p shmbroker-benchmarks \
  -- collectives --only torch_nodes --quick --json > "$py_scratch/nodes.jsonl"
grep -q '"bench":"torch_nodes_all_reduce_8","impl":"flat gloo group"' "$py_scratch/nodes.jsonl"
grep -q '"bench":"torch_nodes_barrier","impl":"gloo.s leader step alone"' "$py_scratch/nodes.jsonl"
rm -rf "$py_scratch"
