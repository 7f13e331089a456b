#!/usr/bin/env bash
# CI stage "capi": the C ABI and the C++ header: header check, examples (threads too), the installed package.
# Runs on its own from a fresh clone (bash ci/capi.sh); .ci/run runs every stage in turn.
set -euxo pipefail
cd "$(dirname "$0")/.."

bash ci/packages.sh
cargo build --release -p shmbroker-cli

# The C ABI: the committed header is what cbindgen makes of capi/src/lib.rs, and the C and C++
# examples (the README's cc line, and CMake) pass under the launcher as 4 processes.
if ! command -v cbindgen >/dev/null 2>&1; then
  cargo install cbindgen --locked --version 0.29.4
fi
header_scratch=$(mktemp)
cbindgen --config capi/cbindgen.toml --crate shmbroker-capi --output "$header_scratch"
if ! diff -u capi/include/shmbroker.h "$header_scratch"; then
  echo "capi/include/shmbroker.h is stale: regenerate it with the cbindgen line in capi/cbindgen.toml" >&2
  exit 1
fi
rm -f "$header_scratch"
cargo build --release -p shmbroker-capi
examples_out=$(mktemp -d)
cc -Wall -Wextra -Werror examples/c/example.c -Icapi/include -Ltarget/release -lshmbroker \
  -Wl,-rpath,"$PWD/target/release" -o "$examples_out/example-c"
target/release/shmbroker run -n 4 --timeout 60 "$examples_out/example-c"
c++ -std=c++17 -Wall -Wextra -Werror examples/cpp/example.cpp -Icapi/include -Ltarget/release \
  -lshmbroker -Wl,-rpath,"$PWD/target/release" -o "$examples_out/example-cpp"
target/release/shmbroker run -n 4 --timeout 60 "$examples_out/example-cpp"
# One handle from two threads (a response thread in recv_any beside broadcasts and barriers),
# every reply checked; then close during a wait (busy), interrupt, close. 2 and 4 ranks.
cc -pthread -Wall -Wextra -Werror examples/c/threads.c -Icapi/include -Ltarget/release \
  -lshmbroker -Wl,-rpath,"$PWD/target/release" -o "$examples_out/threads-c"
target/release/shmbroker run -n 2 --timeout 60 "$examples_out/threads-c"
target/release/shmbroker run -n 4 --timeout 60 "$examples_out/threads-c"
# A farm that heals: the last rank dies after its first task, `run --restart 1` starts it again, it
# rejoins; rank 0 hears SHMBROKER_E_PEER_LOST then SHMBROKER_E_PEER_REJOINED, every task is
# answered once, and a group of the whole world sums.
cc -Wall -Wextra -Werror examples/c/restart.c -Icapi/include -Ltarget/release -lshmbroker \
  -Wl,-rpath,"$PWD/target/release" -o "$examples_out/restart-c"
target/release/shmbroker run -n 3 --restart 1 --timeout 60 "$examples_out/restart-c"
target/release/shmbroker run -n 4 --restart 1 --timeout 60 "$examples_out/restart-c"
# Issue 44's scenario: rank 1 dies 300 ms after a send while rank 2 already recovers the world's
# group; every rank calls shmbroker_regroup (Session::regroup in C++), the replacement included,
# and all end in one group of the same processes. Five runs each.
cc -Wall -Wextra -Werror examples/c/regroup.c -Icapi/include -Ltarget/release -lshmbroker \
  -Wl,-rpath,"$PWD/target/release" -o "$examples_out/regroup-c"
c++ -std=c++17 -Wall -Wextra -Werror examples/cpp/regroup.cpp -Icapi/include -Ltarget/release \
  -lshmbroker -Wl,-rpath,"$PWD/target/release" -o "$examples_out/regroup-cpp"
for run in 1 2 3 4 5; do
  for program in regroup-c regroup-cpp; do
    out=$(target/release/shmbroker run -n 3 --restart 1 --timeout 60 "$examples_out/$program")
    test "$(grep -c 'incarnations \[0, 1, 0\]' <<<"$out")" = 3 || { echo "$program: $out"; exit 1; }
  done
done
# Typed channels: records of a size C declares, one at a time and in batches, a tag refused at
# both ends and a close (C); templates over structs, a scheduler and its workers each way (C++).
cc -Wall -Wextra -Werror examples/c/channels.c -Icapi/include -Ltarget/release -lshmbroker \
  -Wl,-rpath,"$PWD/target/release" -o "$examples_out/channels-c"
target/release/shmbroker run -n 2 --timeout 60 "$examples_out/channels-c"
c++ -std=c++17 -Wall -Wextra -Werror examples/cpp/channels.cpp -Icapi/include -Ltarget/release \
  -lshmbroker -Wl,-rpath,"$PWD/target/release" -o "$examples_out/channels-cpp"
target/release/shmbroker run -n 2 --timeout 60 "$examples_out/channels-cpp"
target/release/shmbroker run -n 4 --timeout 60 "$examples_out/channels-cpp"
cc examples/c/example.c $(PKG_CONFIG_PATH="$PWD/capi" pkg-config --cflags --libs shmbroker) \
  -o "$examples_out/example-pc"
target/release/shmbroker run -n 2 --timeout 60 "$examples_out/example-pc"
# The C++ header's MindIE pattern (1 MiB batch broadcasts, rank 1 always 20 ms slow, replies
# taken on the Receiver half; it fails if the fast replies waited behind the slow worker), then
# the package as a project outside the tree uses it: cmake --install of capi/
# into a prefix, find_package(shmbroker CONFIG) for the C++ examples (shared and static), and
# pkg-config from the installed .pc.
c++ -std=c++17 -pthread -Wall -Wextra -Werror examples/cpp/scheduler.cpp -Icapi/include \
  -Ltarget/release -lshmbroker -Wl,-rpath,"$PWD/target/release" -o "$examples_out/scheduler"
target/release/shmbroker run -n 4 --timeout 60 "$examples_out/scheduler"
c++ -std=c++20 -pthread -Wall -Wextra -Werror -fsyntax-only -Icapi/include examples/cpp/scheduler.cpp
cmake -S capi -B "$examples_out/capi" -DCMAKE_INSTALL_PREFIX="$examples_out/prefix"
cmake --build "$examples_out/capi"
cmake --install "$examples_out/capi"
# Every C and C++ block of the README files and the guide compiles against the installed headers.
python3 ci/doc_blocks.py --include "$examples_out/prefix/include" c cpp
cmake -S examples/cpp -B "$examples_out/cmake" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$examples_out/prefix"
cmake --build "$examples_out/cmake"
target/release/shmbroker run -n 4 --timeout 60 "$examples_out/cmake/example"
target/release/shmbroker run -n 3 --timeout 60 "$examples_out/cmake/scheduler"
target/release/shmbroker run -n 2 --timeout 60 "$examples_out/cmake/scheduler-static"
# shmbroker_mpi.h(pp): an MPI job spanning nodes, SHMBROKER_NODE forming 2 or 3 nodes of 2 (and
# an uneven 1 + 2) on this machine; every call checked against MPI's own (C, built with mpicc,
# and C++, built by CMake's find_package(MPI) above).
mpicc -Wall -Wextra -Werror examples/c/mpi_nodes.c -I"$examples_out/prefix/include" \
  -Ltarget/release -lshmbroker -Wl,-rpath,"$PWD/target/release" -o "$examples_out/mpi_nodes"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for layout in "4 R/2" "4 R%2" "6 R/2" "3 (R>0)"; do
  set -- $layout
  for program in "$examples_out/mpi_nodes" "$examples_out/cmake/mpi_nodes"; do
    out=$(timeout 120 mpirun -np "$1" --oversubscribe sh -c \
      "R=\$OMPI_COMM_WORLD_RANK; SHMBROKER_NODE=node\$(($2)) exec $program")
    test "$(grep -c '^OK mpi_nodes' <<<"$out")" = "$1" || { echo "$program $layout: $out"; exit 1; }
  done
done
cc -pthread examples/c/threads.c \
  $(PKG_CONFIG_PATH="$examples_out/prefix/lib/pkgconfig" pkg-config --cflags --libs shmbroker) \
  -o "$examples_out/threads-installed"
target/release/shmbroker run -n 3 --timeout 60 "$examples_out/threads-installed"
rm -rf "$examples_out"
