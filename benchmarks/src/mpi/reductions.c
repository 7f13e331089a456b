/*
 * reductions: latency of MPI_Allreduce (float sum, in place), MPI_Reduce_scatter_block (float
 * sum) and MPI_Alltoall (floats), the Open MPI baselines of shmbroker's all_reduce,
 * reduce_scatter and all_to_all benchmarks.
 *
 *     mpirun -np WORLD reductions OP ROUNDS WARMUP BYTES [BYTES...]
 *
 * OP is all_reduce, reduce_scatter or all_to_all. BYTES is each rank's input (a multiple of 4,
 * and of 4 * WORLD but for all_reduce; at most 64 MiB): reduce_scatter leaves BYTES / WORLD on each rank, all_to_all sends
 * BYTES / WORLD to each. For each BYTES every rank runs WARMUP untimed and then ROUNDS timed
 * calls. Before each call, untimed: every rank fills its input with values that depend on its
 * rank, the round and the index, and all ranks meet in MPI_Barrier; after it, untimed, every
 * element of the result is checked. Rank 0 prints its samples and percentiles on stdout, flushed:
 *
 *     OP_sample WORLD BYTES NS
 *     OP WORLD BYTES P50_NS P99_NS
 *
 * The values are small integers, so every sum is exact in float whatever order MPI adds in.
 * Built after c/bench.h and mpi/common.h; see mpi.rs.
 */

#define MAX_BYTES (64ull << 20)

enum op { ALL_REDUCE, REDUCE_SCATTER, ALL_TO_ALL };
static const char *const OP_NAMES[] = {"all_reduce", "reduce_scatter", "all_to_all"};

static int usage(int rank, const char *why) {
    return usage_of("reductions",
                    "mpirun -np WORLD reductions all_reduce|reduce_scatter|all_to_all ROUNDS"
                    " WARMUP BYTES [BYTES...] (1 <= ROUNDS <= 100000000, BYTES a multiple of"
                    " 4, and of 4 * WORLD but for all_reduce, at most 64 MiB)",
                    rank, why);
}

/* Rank `rank`'s input element `i` in round `round`. */
static float value(int rank, uint64_t round, uint64_t i) {
    return (float)((i + round) % 13 + (uint64_t)rank);
}

int main(int argc, char **argv) {
    int rank, world;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (argc < 5) return usage(rank, "too few arguments");

    int op = -1;
    for (int o = 0; o < 3; o++)
        if (strcmp(argv[1], OP_NAMES[o]) == 0) op = o;
    if (op < 0) return usage(rank, "bad OP");
    uint64_t rounds, warmup;
    if (parse_u64(argv[2], 1, 100000000ull, &rounds)) return usage(rank, "bad ROUNDS");
    if (parse_u64(argv[3], 0, 100000000ull, &warmup)) return usage(rank, "bad WARMUP");
    int nsizes = argc - 4;
    uint64_t *sizes = malloc(sizeof *sizes * (size_t)nsizes);
    uint64_t max_size = 4;
    if (!sizes) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < nsizes; i++) {
        uint64_t whole = op == ALL_REDUCE ? 4 : 4 * (uint64_t)world;
        if (parse_u64(argv[4 + i], 4, MAX_BYTES, &sizes[i]) || sizes[i] % whole)
            return usage(rank, "bad BYTES");
        if (sizes[i] > max_size) max_size = sizes[i];
    }

    float *input = malloc(max_size);
    float *output = malloc(max_size);
    uint64_t *samples = malloc(sizeof *samples * rounds);
    if (!input || !output || !samples) {
        fprintf(stderr, "reductions: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* The sum of the ranks' offsets: world * (world - 1) / 2. */
    const uint64_t ranks_sum = (uint64_t)world * (uint64_t)(world - 1) / 2;

    for (int s = 0; s < nsizes; s++) {
        uint64_t count = sizes[s] / 4, block = count / (uint64_t)world;
        for (uint64_t r = 0; r < warmup + rounds; r++) {
            for (uint64_t i = 0; i < count; i++) input[i] = value(rank, r, i);
            MPI_Barrier(MPI_COMM_WORLD);
            uint64_t t0 = now_ns();
            if (op == ALL_REDUCE)
                MPI_Allreduce(MPI_IN_PLACE, input, (int)count, MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD);
            else if (op == REDUCE_SCATTER)
                MPI_Reduce_scatter_block(input, output, (int)block, MPI_FLOAT, MPI_SUM,
                                         MPI_COMM_WORLD);
            else
                MPI_Alltoall(input, (int)block, MPI_FLOAT, output, (int)block, MPI_FLOAT,
                             MPI_COMM_WORLD);
            uint64_t t1 = now_ns();
            if (r >= warmup) samples[r - warmup] = t1 - t0;
            /* Every element checked: the sum of its column, or the block its sender meant. */
            uint64_t checked = op == ALL_REDUCE ? count : op == REDUCE_SCATTER ? block : count;
            for (uint64_t i = 0; i < checked; i++) {
                float got, want;
                if (op == ALL_REDUCE) {
                    got = input[i];
                    want = (float)((uint64_t)world * ((i + r) % 13) + ranks_sum);
                } else if (op == REDUCE_SCATTER) {
                    uint64_t at = (uint64_t)rank * block + i;
                    got = output[i];
                    want = (float)((uint64_t)world * ((at + r) % 13) + ranks_sum);
                } else {
                    int from = (int)(i / block);
                    got = output[i];
                    want = value(from, r, (uint64_t)rank * block + i % block);
                }
                if (got != want) {
                    fprintf(stderr, "reductions: %s: rank %d: element %llu is %g, expected %g\n",
                            OP_NAMES[op], rank, (unsigned long long)i, got, want);
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
            }
        }
        if (rank == 0) {
            for (uint64_t r = 0; r < rounds; r++)
                printf("%s_sample %d %llu %llu\n", OP_NAMES[op], world,
                       (unsigned long long)sizes[s], (unsigned long long)samples[r]);
            qsort(samples, rounds, sizeof *samples, cmp_u64);
            printf("%s %d %llu %llu %llu\n", OP_NAMES[op], world, (unsigned long long)sizes[s],
                   (unsigned long long)percentile(samples, rounds, 50.0),
                   (unsigned long long)percentile(samples, rounds, 99.0));
            fflush(stdout);
        }
    }

    free(samples);
    free(output);
    free(input);
    free(sizes);
    MPI_Finalize();
    return 0;
}
