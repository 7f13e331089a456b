/*
 * farm: a task farm over MPI_ANY_SOURCE, the Open MPI baseline for shmbroker's farm benchmark.
 *
 *     mpirun -np WORLD farm TASKS WARMUP DEPTH SIZE [SIZE...]
 *
 * Rank 0 is the reader, every other rank a worker. For each SIZE, the reader hands each worker
 * DEPTH tasks of SIZE bytes, then waits for an answer from any worker (MPI_Recv with
 * MPI_ANY_SOURCE) and hands that worker the next task, until WARMUP + TASKS answers are in. A
 * task's first 8 bytes are its id and its last byte is the id's low byte; a worker answers with
 * 16 bytes: the id and SIZE * 31 + that last byte, which the reader checks against the task it
 * gave that worker least recently (each worker answers in order). After the last answer the
 * reader sends every worker an empty message with tag STOP.
 *
 * The clock starts when the WARMUP-th answer arrives and stops at the last one; rank 0 prints,
 * flushed:
 *
 *     farm WORKERS SIZE TASKS ELAPSED_NS
 *
 * This is the same loop as `bench farm`'s shmbroker and UNIX socket contenders (farm.rs).
 * Built after c/bench.h (the clock, argument parsing) and mpi/common.h; see mpi.rs.
 */

#define TAG_TASK 1
#define TAG_STOP 2
#define MAX_SIZE (64ull << 20)
#define MAX_DEPTH 64

static int usage(int rank, const char *why) {
    return usage_of("farm",
                    "mpirun -np WORLD farm TASKS WARMUP DEPTH SIZE [SIZE...]"
                    " (WORLD >= 2, 1 <= TASKS <= 100000000, 1 <= DEPTH <= 64, 8 <= SIZE <= 64 MiB)",
                    rank, why);
}

static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, sizeof v); }

static uint64_t get_u64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The reader: returns the nanoseconds the last TASKS answers took. */
static uint64_t reader(int world, uint64_t tasks, uint64_t warmup, uint64_t depth, uint64_t size,
                       unsigned char *task) {
    int workers = world - 1;
    uint64_t total = tasks + warmup, sent = 0, done = 0, start = warmup == 0 ? now_ns() : 0;
    /* Each worker's outstanding ids, oldest first: a ring of DEPTH per worker. */
    uint64_t *queue = calloc((size_t)workers * depth, sizeof *queue);
    uint64_t *head = calloc((size_t)workers, sizeof *head);
    uint64_t *count = calloc((size_t)workers, sizeof *count);
    if (!queue || !head || !count) MPI_Abort(MPI_COMM_WORLD, 1);

#define HAND_OUT(w)                                                                            \
    do {                                                                                       \
        put_u64(task, sent);                                                                   \
        task[size - 1] = (unsigned char)sent;                                                  \
        queue[(size_t)(w) * depth + (head[w] + count[w]) % depth] = sent;                      \
        count[w]++;                                                                            \
        sent++;                                                                                \
        MPI_Send(task, (int)size, MPI_BYTE, (w) + 1, TAG_TASK, MPI_COMM_WORLD);                \
    } while (0)

    for (uint64_t d = 0; d < depth; d++)
        for (int w = 0; w < workers && sent < total; w++) HAND_OUT(w);
    while (done < total) {
        unsigned char answer[16];
        MPI_Status status;
        MPI_Recv(answer, sizeof answer, MPI_BYTE, MPI_ANY_SOURCE, TAG_TASK, MPI_COMM_WORLD,
                 &status);
        int w = status.MPI_SOURCE - 1;
        if (w < 0 || w >= workers || count[w] == 0) {
            fprintf(stderr, "farm: an answer from rank %d, which has no task\n", status.MPI_SOURCE);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        uint64_t id = queue[(size_t)w * depth + head[w]];
        head[w] = (head[w] + 1) % depth;
        count[w]--;
        if (get_u64(answer) != id || get_u64(answer + 8) != size * 31 + (unsigned char)id) {
            fprintf(stderr, "farm: rank %d answered task %llu wrongly\n", status.MPI_SOURCE,
                    (unsigned long long)id);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        done++;
        if (done == warmup) start = now_ns();
        if (sent < total) HAND_OUT(w);
    }
#undef HAND_OUT
    uint64_t elapsed = now_ns() - start;
    for (int w = 0; w < workers; w++) MPI_Send(task, 0, MPI_BYTE, w + 1, TAG_STOP, MPI_COMM_WORLD);
    free(count);
    free(head);
    free(queue);
    return elapsed;
}

/* A worker: answers tasks until STOP. */
static void worker(uint64_t size, unsigned char *task) {
    for (;;) {
        MPI_Status status;
        int got;
        MPI_Recv(task, (int)size, MPI_BYTE, 0, MPI_ANY_TAG, MPI_COMM_WORLD, &status);
        if (status.MPI_TAG == TAG_STOP) return;
        MPI_Get_count(&status, MPI_BYTE, &got);
        unsigned char answer[16];
        put_u64(answer, get_u64(task));
        put_u64(answer + 8, (uint64_t)got * 31 + task[got - 1]);
        MPI_Send(answer, sizeof answer, MPI_BYTE, 0, TAG_TASK, MPI_COMM_WORLD);
    }
}

int main(int argc, char **argv) {
    int rank, world;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world < 2) return usage(rank, "a farm needs a reader and at least one worker");
    if (argc < 5) return usage(rank, "too few arguments");

    uint64_t tasks, warmup, depth;
    if (parse_u64(argv[1], 1, 100000000ull, &tasks)) return usage(rank, "bad TASKS");
    if (parse_u64(argv[2], 0, 100000000ull, &warmup)) return usage(rank, "bad WARMUP");
    if (parse_u64(argv[3], 1, MAX_DEPTH, &depth)) return usage(rank, "bad DEPTH");
    int nsizes = argc - 4;
    uint64_t *sizes = malloc(sizeof *sizes * (size_t)nsizes);
    uint64_t max_size = 8;
    if (!sizes) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < nsizes; i++) {
        if (parse_u64(argv[4 + i], 8, MAX_SIZE, &sizes[i])) return usage(rank, "bad SIZE");
        if (sizes[i] > max_size) max_size = sizes[i];
    }
    unsigned char *task = malloc(max_size);
    if (!task) MPI_Abort(MPI_COMM_WORLD, 1);
    memset(task, 0xa5, max_size);

    for (int s = 0; s < nsizes; s++) {
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) {
            uint64_t elapsed = reader(world, tasks, warmup, depth, sizes[s], task);
            printf("farm %d %llu %llu %llu\n", world - 1, (unsigned long long)sizes[s],
                   (unsigned long long)tasks, (unsigned long long)elapsed);
            fflush(stdout);
        } else {
            worker(sizes[s], task);
        }
    }

    free(task);
    free(sizes);
    MPI_Finalize();
    return 0;
}
