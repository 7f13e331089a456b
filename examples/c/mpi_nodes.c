// shmbroker_mpi.h in an MPI program whose job spans nodes: every call against MPI's own on the
// same data. Under mpirun, with SHMBROKER_NODE set per rank to form nodes on one machine:
//
//   mpicc examples/c/mpi_nodes.c -Icapi/include -Ltarget/release -lshmbroker
//     -Wl,-rpath,$PWD/target/release -o mpi_nodes           (one line)
//   mpirun -np 4 sh -c 'SHMBROKER_NODE=node$((OMPI_COMM_WORLD_RANK / 2)) exec ./mpi_nodes'
//
// Prints "OK mpi_nodes rank R" on every rank; a mismatch or a failed call ends the job with
// MPI_Abort, as an MPI program does: after a failure inside a node the other nodes would wait in
// MPI for ever.
#include <shmbroker_mpi.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank_;

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "FAILED rank %d: %s\n", rank_, what);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

static void expect_ok(int rc, const char *what) {
  if (rc != SHMBROKER_OK) {
    fprintf(stderr, "FAILED rank %d: %s returned %d\n", rank_, what, rc);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  shmbroker_mpi *m;
  expect_ok(shmbroker_mpi_init(MPI_COMM_WORLD, 30000, &m), "shmbroker_mpi_init");
  check(m->nodes > 1, "the layout spans nodes (set SHMBROKER_NODE per rank)");

  // all_reduce: every op on i32 and f64, through the leader (small) and the rails (large, odd
  // lengths padded), against MPI_Allreduce of the same whole numbers.
  const size_t counts[] = {0, 1, 7, 70001, 262145};
  const int ops[] = {SHMBROKER_OP_SUM, SHMBROKER_OP_PROD, SHMBROKER_OP_MIN, SHMBROKER_OP_MAX,
                     SHMBROKER_OP_BIT_AND, SHMBROKER_OP_BIT_OR, SHMBROKER_OP_BIT_XOR};
  const MPI_Op mpi_ops[] = {MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX, MPI_BAND, MPI_BOR, MPI_BXOR};
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    size_t n = counts[c];
    int32_t *ours = (int32_t *)malloc((n + 1) * sizeof *ours);
    int32_t *theirs = (int32_t *)malloc((n + 1) * sizeof *theirs);
    double *fours = (double *)malloc((n + 1) * sizeof *fours);
    double *ftheirs = (double *)malloc((n + 1) * sizeof *ftheirs);
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
      for (size_t i = 0; i < n; i++) {
        ours[i] = theirs[i] = (int32_t)((i * 7 + (size_t)rank_ * 3 + o) % 5 + 1);
      }
      expect_ok(shmbroker_mpi_all_reduce(m, ours, n, SHMBROKER_DTYPE_I32, ops[o]), "i32");
      MPI_Allreduce(MPI_IN_PLACE, theirs, (int)n, MPI_INT32_T, mpi_ops[o], MPI_COMM_WORLD);
      check(n == 0 || memcmp(ours, theirs, n * sizeof *ours) == 0, "all_reduce i32 as MPI's");
      if (o >= 4) continue;  // (bitwise operations are of integers)
      for (size_t i = 0; i < n; i++) fours[i] = ftheirs[i] = (double)((i + (size_t)rank_) % 3 + 1);
      expect_ok(shmbroker_mpi_all_reduce(m, fours, n, SHMBROKER_DTYPE_F64, ops[o]), "f64");
      MPI_Allreduce(MPI_IN_PLACE, ftheirs, (int)n, MPI_DOUBLE, mpi_ops[o], MPI_COMM_WORLD);
      check(n == 0 || memcmp(fours, ftheirs, n * sizeof *fours) == 0, "all_reduce f64 as MPI's");
    }
    // AVG: the sum divided by the size.
    for (size_t i = 0; i < n; i++) fours[i] = ftheirs[i] = (double)(rank_ + 1);
    expect_ok(shmbroker_mpi_all_reduce(m, fours, n, SHMBROKER_DTYPE_F64, SHMBROKER_OP_AVG), "avg");
    for (size_t i = 0; i < n; i++) check(fours[i] == (size + 1) / 2.0, "all_reduce avg");
    free(ours), free(theirs), free(fours), free(ftheirs);
  }
  check(shmbroker_mpi_all_reduce(m, NULL, 0, SHMBROKER_DTYPE_F16, SHMBROKER_OP_SUM) ==
            SHMBROKER_E_MISUSE,
        "f16 (MPI has no such type) is a misuse");
  // The header's own refusal says why, and names no rank (not a stale one of the library's).
  check(strstr(shmbroker_mpi_last_error(m), "MPI has no type") != NULL, "the refusal's reason");
  check(shmbroker_mpi_last_error_rank(m) == -1, "a refusal names no rank");

  expect_ok(shmbroker_mpi_barrier(m), "barrier");

  // broadcast from every root; all_gather in rank order.
  for (int root = 0; root < size; root++) {
    char message[64] = {0};
    if (rank_ == root) snprintf(message, sizeof message, "from rank %d", root);
    expect_ok(shmbroker_mpi_broadcast(m, root, message, sizeof message), "broadcast");
    char want[64] = {0};
    snprintf(want, sizeof want, "from rank %d", root);
    check(memcmp(message, want, sizeof want) == 0, "broadcast's bytes");
  }
  uint64_t mine[3] = {(uint64_t)rank_, (uint64_t)rank_ * 10, (uint64_t)rank_ * 100};
  uint64_t *all = (uint64_t *)calloc((size_t)size * 3, sizeof *all);
  expect_ok(shmbroker_mpi_all_gather(m, mine, sizeof mine, all), "all_gather");
  for (int r = 0; r < size; r++) {
    check(all[r * 3] == (uint64_t)r && all[r * 3 + 2] == (uint64_t)r * 100, "all_gather's order");
  }
  free(all);

  shmbroker_mpi_free(m);
  printf("OK mpi_nodes rank %d\n", rank_);
  MPI_Finalize();
  return 0;
}
