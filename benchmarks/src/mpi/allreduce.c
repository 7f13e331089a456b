/*
 * allreduce: MPI_Allreduce latency (float sum, in place), the Open MPI baseline for shmbroker's
 * all-reduce benchmark.
 *
 *     mpirun -np WORLD allreduce ROUNDS WARMUP BYTES [BYTES...]
 *
 * For each BYTES (a multiple of 4, at most 64 MiB), every rank runs WARMUP untimed and then
 * ROUNDS timed calls. Before each call, untimed: every rank fills its data with values that
 * depend on its rank and the round, and all ranks meet in MPI_Barrier; after it, untimed, every
 * element is checked against the sum it must hold. Rank 0 prints its samples and percentiles on
 * stdout, flushed:
 *
 *     allreduce_sample WORLD BYTES NS
 *     allreduce WORLD BYTES P50_NS P99_NS
 *
 * The values are small integers, so every sum is exact in float whatever order MPI adds in.
 * Built after c/bench.h and mpi/common.h; see mpi.rs.
 */

#define MAX_BYTES (64ull << 20)

static int usage(int rank, const char *why) {
    return usage_of("allreduce",
                    "mpirun -np WORLD allreduce ROUNDS WARMUP BYTES [BYTES...]"
                    " (1 <= ROUNDS <= 100000000, BYTES a multiple of 4, at most 64 MiB)",
                    rank, why);
}

static float value(int rank, uint64_t round, uint64_t i) {
    return (float)((i + round) % 13 + (uint64_t)rank);
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
    uint64_t max_size = 4;
    if (!sizes) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < nsizes; i++) {
        if (parse_u64(argv[3 + i], 4, MAX_BYTES, &sizes[i]) || sizes[i] % 4)
            return usage(rank, "bad BYTES");
        if (sizes[i] > max_size) max_size = sizes[i];
    }

    float *data = malloc(max_size);
    uint64_t *samples = malloc(sizeof *samples * rounds);
    if (!data || !samples) {
        fprintf(stderr, "allreduce: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* The sum of the ranks' offsets: world * (world - 1) / 2. */
    const uint64_t ranks_sum = (uint64_t)world * (uint64_t)(world - 1) / 2;

    for (int s = 0; s < nsizes; s++) {
        uint64_t count = sizes[s] / 4;
        for (uint64_t r = 0; r < warmup + rounds; r++) {
            for (uint64_t i = 0; i < count; i++) data[i] = value(rank, r, i);
            MPI_Barrier(MPI_COMM_WORLD);
            uint64_t t0 = now_ns();
            MPI_Allreduce(MPI_IN_PLACE, data, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            uint64_t t1 = now_ns();
            if (r >= warmup) samples[r - warmup] = t1 - t0;
            for (uint64_t i = 0; i < count; i++) {
                float want = (float)((uint64_t)world * ((i + r) % 13) + ranks_sum);
                if (data[i] != want) {
                    fprintf(stderr, "allreduce: rank %d: element %llu is %g, expected %g\n", rank,
                            (unsigned long long)i, data[i], want);
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
            }
        }
        if (rank == 0) {
            for (uint64_t r = 0; r < rounds; r++)
                printf("allreduce_sample %d %llu %llu\n", world, (unsigned long long)sizes[s],
                       (unsigned long long)samples[r]);
            qsort(samples, rounds, sizeof *samples, cmp_u64);
            printf("allreduce %d %llu %llu %llu\n", world, (unsigned long long)sizes[s],
                   (unsigned long long)percentile(samples, rounds, 50.0),
                   (unsigned long long)percentile(samples, rounds, 99.0));
            fflush(stdout);
        }
    }

    free(samples);
    free(data);
    free(sizes);
    MPI_Finalize();
    return 0;
}
