/*
 * What the Open MPI baselines share beyond `c/bench.h`: MPI itself and the usage message.
 * `mpi.rs` builds each program from `c/bench.h`, this file and its own source.
 */
#include <mpi.h>

/* Says why the arguments were refused and how to call `program` (rank 0 only), finalizes MPI and
 * returns the exit status 2. Each program wraps it in a `usage(rank, why)` of its own. */
static int usage_of(const char *program, const char *synopsis, int rank, const char *why) {
    if (rank == 0) fprintf(stderr, "%s: %s\nusage: %s\n", program, why, synopsis);
    MPI_Finalize();
    return 2;
}
