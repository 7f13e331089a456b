/*
 * barrier: MPI_Barrier latency, the Open MPI baseline for shmbroker's barrier benchmark.
 *
 *     mpirun -np WORLD barrier ROUNDS WARMUP
 *
 * Every rank runs WARMUP untimed and then ROUNDS timed MPI_Barrier calls back to back, each timed
 * with CLOCK_MONOTONIC. Rank 0 prints every sample, then its percentiles, on stdout, flushed:
 *
 *     barrier_sample WORLD NS
 *     barrier WORLD P50_NS P99_NS
 *
 * Percentile p of n sorted samples is sorted[min(n - 1, (size_t)(p / 100.0 * n))].
 *
 * Built after c/bench.h (the clock, percentiles, argument parsing) and mpi/common.h; see
 * mpi.rs.
 */

static int usage(int rank, const char *why) {
    return usage_of("barrier",
                    "mpirun -np WORLD barrier ROUNDS WARMUP (1 <= ROUNDS <= 100000000)",
                    rank, why);
}

int main(int argc, char **argv) {
    int rank, world;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (argc != 3) return usage(rank, "expected ROUNDS and WARMUP");

    uint64_t rounds, warmup;
    if (parse_u64(argv[1], 1, 100000000ull, &rounds)) return usage(rank, "bad ROUNDS");
    if (parse_u64(argv[2], 0, 100000000ull, &warmup)) return usage(rank, "bad WARMUP");
    uint64_t *samples = malloc(sizeof *samples * rounds);
    if (!samples) {
        fprintf(stderr, "barrier: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    for (uint64_t r = 0; r < warmup + rounds; r++) {
        uint64_t t0 = now_ns();
        MPI_Barrier(MPI_COMM_WORLD);
        uint64_t t1 = now_ns();
        if (r >= warmup) samples[r - warmup] = t1 - t0;
    }
    if (rank == 0) {
        for (uint64_t r = 0; r < rounds; r++)
            printf("barrier_sample %d %llu\n", world, (unsigned long long)samples[r]);
        qsort(samples, rounds, sizeof *samples, cmp_u64);
        printf("barrier %d %llu %llu\n", world,
               (unsigned long long)percentile(samples, rounds, 50.0),
               (unsigned long long)percentile(samples, rounds, 99.0));
        fflush(stdout);
    }

    free(samples);
    MPI_Finalize();
    return 0;
}
