#!/usr/bin/env bash
# CI stage "bench": the benchmark pipeline end to end, quick (no timing is asserted).
# Runs on its own from a fresh clone (bash ci/bench.sh); .ci/run runs every stage in turn.
set -euxo pipefail
cd "$(dirname "$0")/.."

bash ci/packages.sh
# The C ABI's all-gather runs beside the Rust call: libshmbroker.so is needed.
cargo build --release -p shmbroker-capi

# The benchmark pipeline end to end (no timing is asserted): every suite, quick, into a scratch
# folder, and every output it must write.
bench_out=$(mktemp -d)
trap 'rm -rf "$bench_out"' EXIT
cargo run --release -p shmbroker-benchmarks -- --quick --out "$bench_out" 2> "$bench_out/stderr"
cat "$bench_out/stderr"
# Progress is drawn on a terminal only: no escape codes reach a file or pipe.
if grep -q $'\x1b' "$bench_out/stderr"; then
  echo "bench wrote terminal escape codes into a file" >&2
  exit 1
fi
# results.md says how it was made.
grep -q '^- commit: ' "$bench_out/results.md"
grep -q '^- run: --rounds 1, --quick' "$bench_out/results.md"
for output in results.jsonl results.md pingpong_cdf.svg barrier_vs_workers.svg \
  throughput_vs_size.svg bulk_throughput_vs_size.svg; do
  test -s "$bench_out/$output"
done
# The Open MPI baselines ran beside ours (mpicc and mpirun are installed above).
grep -q '"bench":"bulk_pingpong","impl":"open-mpi"' "$bench_out/results.jsonl"
grep -q '"impl":"open-mpi","workers":2' "$bench_out/results.jsonl"
# The C ABI's all-gather, all-reduce and recv_any ran beside the Rust calls (libshmbroker.so is built above).
grep -q '"bench":"capi_all_gather_64B","impl":"C ABI: shmbroker_all_gather"' "$bench_out/results.jsonl"
grep -q '"bench":"capi_all_reduce_64B","impl":"C ABI: shmbroker_all_reduce (f32 sum)"' "$bench_out/results.jsonl"
grep -q '"bench":"capi_recv_any_64B","impl":"C ABI: shmbroker_send + shmbroker_recv_any, round trip"' "$bench_out/results.jsonl"
# The MindIE loop from C ran, both modes (the Python one runs in ci/python.sh, once the package is
# installed).
grep -q '"bench":"response_wait_c","impl":"broadcasts wait for the 20 ms-slow worker"' "$bench_out/results.jsonl"
grep -q '"bench":"response_wait_c","impl":"paced: no broadcast waits (the floor)"' "$bench_out/results.jsonl"
# Typed channels beside the raw ring and shaq, and the farm beside send/recv_any and Open MPI.
grep -q '"bench":"channel_stream_single","impl":"typed channel"' "$bench_out/results.jsonl"
grep -q '"bench":"typed_farm","impl":"open-mpi"' "$bench_out/results.jsonl"
