/*
 * What both Open MPI baselines share: the clock, percentiles and argument parsing. `mpi.rs`
 * builds each program from this file followed by its own source.
 */
#include <mpi.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static uint64_t percentile(const uint64_t *sorted, size_t n, double p) {
    size_t i = (size_t)(p / 100.0 * (double)n);
    return sorted[i < n - 1 ? i : n - 1];
}

/* Parses a decimal unsigned integer in [min, max]; returns 0 on success. */
static int parse_u64(const char *text, uint64_t min, uint64_t max, uint64_t *out) {
    char *end;
    errno = 0;
    if (text[0] < '0' || text[0] > '9') return -1;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max) return -1;
    *out = v;
    return 0;
}

/* Says why the arguments were refused and how to call `program` (rank 0 only), finalizes MPI and
 * returns the exit status 2. Each program wraps it in a `usage(rank, why)` of its own. */
static int usage_of(const char *program, const char *synopsis, int rank, const char *why) {
    if (rank == 0) fprintf(stderr, "%s: %s\nusage: %s\n", program, why, synopsis);
    MPI_Finalize();
    return 2;
}
