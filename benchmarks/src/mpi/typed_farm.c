/*
 * typed_farm: the Open MPI baseline of `bench farm`'s typed_farm (channels.rs).
 *
 *     mpirun -np WORLD typed_farm PER_WORKER WINDOW
 *
 * Rank 0 is a scheduler, every other rank a worker. The scheduler sends each worker PER_WORKER
 * records of 64 bytes (an id and 7 words equal to it) with MPI_Send, keeping up to WINDOW out
 * per worker, and takes the answers with MPI_Irecv from MPI_ANY_SOURCE and MPI_Wait. A worker
 * answers every record with one: the id and each word times 3, which the scheduler checks
 * (each worker answers in order). The clock starts once a tenth of the answers are in and
 * stops at the last; rank 0 prints, flushed:
 *
 *     typed_farm TRANSACTIONS ELAPSED_NS
 *
 * Built after c/bench.h (the clock, argument parsing) and mpi/common.h; see mpi.rs.
 */

#define TAG_RECORD 1

struct record {
    uint64_t id;
    uint64_t body[7];
};

static int usage(int rank, const char *why) {
    return usage_of("typed_farm",
                    "mpirun -np WORLD typed_farm PER_WORKER WINDOW (WORLD >= 2, 1 <= PER_WORKER"
                    " <= 100000000, 1 <= WINDOW <= 65536)",
                    rank, why);
}

static struct record task(uint64_t id) {
    struct record r;
    r.id = id;
    for (int i = 0; i < 7; ++i) r.body[i] = id;
    return r;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    uint64_t per_worker, window;
    if (argc != 3 || world < 2 || parse_u64(argv[1], 1, 100000000ull, &per_worker) ||
        parse_u64(argv[2], 1, 65536, &window)) {
        return usage(rank, "bad arguments");
    }
    if (rank != 0) {
        for (uint64_t n = 0; n < per_worker; ++n) {
            struct record r;
            MPI_Recv(&r, sizeof r, MPI_BYTE, 0, TAG_RECORD, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (int i = 0; i < 7; ++i) r.body[i] *= 3;
            MPI_Send(&r, sizeof r, MPI_BYTE, 0, TAG_RECORD, MPI_COMM_WORLD);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Finalize();
        return 0;
    }
    int workers = world - 1;
    uint64_t *sent = calloc((size_t)workers, sizeof *sent);
    uint64_t *answered = calloc((size_t)workers, sizeof *answered);
    if (sent == NULL || answered == NULL) return 1;
    uint64_t total = per_worker * (uint64_t)workers, done = 0, warm = total / 10, at = 0;
    uint64_t start = 0;
    struct record answer;
    MPI_Request request;
    MPI_Status status;
    MPI_Irecv(&answer, sizeof answer, MPI_BYTE, MPI_ANY_SOURCE, TAG_RECORD, MPI_COMM_WORLD,
              &request);
    while (done < total) {
        for (int w = 0; w < workers; ++w) {
            while (sent[w] - answered[w] < window && sent[w] < per_worker) {
                struct record r = task(sent[w]);
                MPI_Send(&r, sizeof r, MPI_BYTE, w + 1, TAG_RECORD, MPI_COMM_WORLD);
                sent[w] += 1;
            }
        }
        MPI_Wait(&request, &status);
        int w = status.MPI_SOURCE - 1;
        struct record want = task(answered[w]);
        for (int i = 0; i < 7; ++i) want.body[i] *= 3;
        if (memcmp(&answer, &want, sizeof want) != 0) {
            fprintf(stderr, "typed_farm: worker %d: a wrong answer\n", w + 1);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        answered[w] += 1;
        done += 1;
        if (done < total) {
            MPI_Irecv(&answer, sizeof answer, MPI_BYTE, MPI_ANY_SOURCE, TAG_RECORD,
                      MPI_COMM_WORLD, &request);
        }
        if (done == warm) {
            start = now_ns();
            at = done;
        }
    }
    uint64_t elapsed = now_ns() - start;
    printf("typed_farm %llu %llu\n", (unsigned long long)(total - at), (unsigned long long)elapsed);
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    free(sent);
    free(answered);
    MPI_Finalize();
    return 0;
}
