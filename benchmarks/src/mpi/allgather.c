/*
 * allgather: MPI_Allgather latency, the Open MPI baseline for shmbroker's all-gather benchmark.
 *
 *     mpirun -np WORLD allgather ROUNDS WARMUP SIZE [SIZE...]
 *
 * For each SIZE (bytes contributed by each rank, at most 64 MiB in total per rank's receive
 * buffer), every rank runs WARMUP untimed and then ROUNDS timed MPI_Allgather calls back to back,
 * with no barrier inside the timed loop; each call is timed with CLOCK_MONOTONIC on every rank.
 * Rank 0 prints its own samples' percentiles, as shmbroker's own all-gather bench reports rank 0,
 * on stdout, flushed:
 *
 *     allgather WORLD SIZE P50_NS P99_NS
 *
 * Percentile p of n sorted samples is sorted[min(n - 1, (size_t)(p / 100.0 * n))].
 *
 * Built after c/bench.h (the clock, percentiles, argument parsing) and mpi/common.h; see
 * mpi.rs.
 */

#define MAX_TOTAL (64ull << 20)

static int usage(int rank, const char *why) {
    return usage_of("allgather",
                    "mpirun -np WORLD allgather ROUNDS WARMUP SIZE [SIZE...]"
                    " (1 <= ROUNDS <= 100000000, WORLD * SIZE <= 64 MiB)",
                    rank, why);
}

int main(int argc, char **argv) {
    int rank, world;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (argc < 4) return usage(rank, "too few arguments");

    uint64_t rounds, warmup;
    if (parse_u64(argv[1], 1, 100000000ull, &rounds)) return usage(rank, "bad ROUNDS");
    if (parse_u64(argv[2], 0, 100000000ull, &warmup)) return usage(rank, "bad WARMUP");
    int nsizes = argc - 3;
    uint64_t *sizes = malloc(sizeof *sizes * (size_t)nsizes);
    uint64_t max_size = 1;
    if (!sizes) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < nsizes; i++) {
        if (parse_u64(argv[3 + i], 0, MAX_TOTAL / (uint64_t)world, &sizes[i]))
            return usage(rank, "bad SIZE");
        if (sizes[i] > max_size) max_size = sizes[i];
    }

    char *sbuf = malloc(max_size), *rbuf = malloc(max_size * (uint64_t)world);
    uint64_t *samples = malloc(sizeof *samples * rounds);
    if (!sbuf || !rbuf || !samples) {
        fprintf(stderr, "allgather: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(sbuf, rank + 1, max_size);
    memset(rbuf, 0, max_size * (uint64_t)world);

    for (int s = 0; s < nsizes; s++) {
        int size = (int)sizes[s];
        MPI_Barrier(MPI_COMM_WORLD);
        for (uint64_t r = 0; r < warmup + rounds; r++) {
            uint64_t t0 = now_ns();
            MPI_Allgather(sbuf, size, MPI_BYTE, rbuf, size, MPI_BYTE, MPI_COMM_WORLD);
            uint64_t t1 = now_ns();
            if (r >= warmup) samples[r - warmup] = t1 - t0;
        }
        if (size > 0 && rbuf[0] != 1) {
            fprintf(stderr, "allgather: rank %d: slot 0 holds %d, expected 1\n", rank, rbuf[0]);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (rank == 0) {
            for (uint64_t r = 0; r < rounds; r++)
                printf("allgather_sample %d %d %llu\n", world, size,
                       (unsigned long long)samples[r]);
            qsort(samples, rounds, sizeof *samples, cmp_u64);
            printf("allgather %d %d %llu %llu\n", world, size,
                   (unsigned long long)percentile(samples, rounds, 50.0),
                   (unsigned long long)percentile(samples, rounds, 99.0));
            fflush(stdout);
        }
    }

    free(samples);
    free(rbuf);
    free(sbuf);
    free(sizes);
    MPI_Finalize();
    return 0;
}
