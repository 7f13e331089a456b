/*
 * What every C program the benchmarks build shares: the clock, percentiles and argument
 * parsing. `mpi.rs` and `capi.rs` build each program from this file followed by its own source
 * (the Open MPI ones with `mpi/common.h` in between).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static inline uint64_t percentile(const uint64_t *sorted, size_t n, double p) {
    size_t i = (size_t)(p / 100.0 * (double)n);
    return sorted[i < n - 1 ? i : n - 1];
}

/* Parses a decimal unsigned integer in [min, max]; returns 0 on success. */
static inline int parse_u64(const char *text, uint64_t min, uint64_t max, uint64_t *out) {
    char *end;
    errno = 0;
    if (text[0] < '0' || text[0] > '9') return -1;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max) return -1;
    *out = v;
    return 0;
}
