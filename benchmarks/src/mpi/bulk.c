/*
 * bulk: two-rank MPI ping-pong latency and one-way throughput, the Open MPI baseline for
 * shmbroker's bulk transfer benchmarks.
 *
 *     mpirun -np 2 bulk ROUNDS WARMUP SIZE [SIZE...]
 *
 * For each SIZE (bytes, at most 64 MiB), rank 0 prints on stdout, flushed:
 *
 *     pingpong SIZE P50_NS P99_NS
 *     throughput SIZE BYTES_PER_SEC
 *
 * Ping-pong: WARMUP untimed round trips, then ROUNDS round trips each timed on rank 0 with
 * CLOCK_MONOTONIC (rank 0 MPI_Send SIZE bytes, rank 1 MPI_Recv and MPI_Send SIZE bytes back).
 * Percentile p of n sorted samples is sorted[min(n - 1, (size_t)(p / 100.0 * n))].
 *
 * Throughput: rank 0 sends SIZE bytes N times, rank 1 receives them all and answers with a
 * one-byte ack; N is about 256 MiB / SIZE, at least 4 and at most ROUNDS * 10. The figure is
 * N * SIZE / elapsed, elapsed running from the first send to the ack's arrival.
 *
 * Send and receive buffers are separate and memset before any timing. Every message is written
 * before it is sent (each byte of message n is n mod 255 + 1: stamp), and the receiver checks a
 * byte of every 4 KiB and the last (check), as shmbroker's side of the benchmark does: a buffer
 * sent again unchanged would stay in the receiver's cache after its first read, which favours
 * CMA's single copy from the sender's memory beyond what a program sees.
 *
 * Built after c/bench.h (the clock, percentiles, argument parsing) and mpi/common.h; see
 * mpi.rs.
 */

#define MAX_SIZE (64ull << 20)
#define THROUGHPUT_TOTAL (256ull << 20)
#define TAG_DATA 1
#define TAG_ACK 2

/* The byte message n is made of: 1 to 255, never the 0 a receive buffer starts with. */
static unsigned char stamp_of(uint64_t n) { return (unsigned char)(n % 255 + 1); }

/* Writes message n: every byte stamp_of(n). */
static void stamp(char *buf, int size, uint64_t n) { memset(buf, stamp_of(n), (size_t)size); }

/* Aborts unless buf holds message n: one byte of every 4 KiB, and the last. */
static void check(const char *buf, int size, uint64_t n) {
    unsigned char want = stamp_of(n);
    for (int at = 0; at < size; at += 4096)
        if ((unsigned char)buf[at] != want) goto wrong;
    if (size > 0 && (unsigned char)buf[size - 1] != want) goto wrong;
    return;
wrong:
    fprintf(stderr, "bulk: message %llu of %d bytes arrived wrong\n", (unsigned long long)n, size);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static int usage(int rank, const char *why) {
    return usage_of("bulk",
                    "mpirun -np 2 bulk ROUNDS WARMUP SIZE [SIZE...]"
                    " (1 <= ROUNDS <= 100000000, SIZE <= 64 MiB)",
                    rank, why);
}

int main(int argc, char **argv) {
    int rank, world;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != 2) return usage(rank, "needs exactly 2 ranks");
    if (argc < 4) return usage(rank, "too few arguments");

    uint64_t rounds, warmup;
    if (parse_u64(argv[1], 1, 100000000ull, &rounds)) return usage(rank, "bad ROUNDS");
    if (parse_u64(argv[2], 0, 100000000ull, &warmup)) return usage(rank, "bad WARMUP");
    int nsizes = argc - 3;
    uint64_t *sizes = malloc(sizeof *sizes * (size_t)nsizes);
    uint64_t max_size = 1;
    if (!sizes) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < nsizes; i++) {
        if (parse_u64(argv[3 + i], 0, MAX_SIZE, &sizes[i])) return usage(rank, "bad SIZE");
        if (sizes[i] > max_size) max_size = sizes[i];
    }

    char *sbuf = malloc(max_size), *rbuf = malloc(max_size);
    uint64_t *samples = malloc(sizeof *samples * rounds);
    if (!sbuf || !rbuf || !samples) {
        fprintf(stderr, "bulk: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(sbuf, rank + 1, max_size);
    memset(rbuf, 0, max_size);
    char ack = 0;
    int peer = 1 - rank;

    for (int s = 0; s < nsizes; s++) {
        int size = (int)sizes[s];

        /* Ping-pong. */
        MPI_Barrier(MPI_COMM_WORLD);
        for (uint64_t r = 0; r < warmup + rounds; r++) {
            if (rank == 0) {
                uint64_t t0 = now_ns();
                stamp(sbuf, size, 2 * r);
                MPI_Send(sbuf, size, MPI_BYTE, peer, TAG_DATA, MPI_COMM_WORLD);
                MPI_Recv(rbuf, size, MPI_BYTE, peer, TAG_DATA, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                check(rbuf, size, 2 * r + 1);
                uint64_t t1 = now_ns();
                if (r >= warmup) samples[r - warmup] = t1 - t0;
            } else {
                MPI_Recv(rbuf, size, MPI_BYTE, peer, TAG_DATA, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                check(rbuf, size, 2 * r);
                stamp(sbuf, size, 2 * r + 1);
                MPI_Send(sbuf, size, MPI_BYTE, peer, TAG_DATA, MPI_COMM_WORLD);
            }
        }

        /* One-way throughput. */
        uint64_t n = size > 0 ? THROUGHPUT_TOTAL / (uint64_t)size : rounds * 10;
        if (n > rounds * 10) n = rounds * 10;
        if (n < 4) n = 4;
        MPI_Barrier(MPI_COMM_WORLD);
        uint64_t elapsed = 0;
        if (rank == 0) {
            uint64_t t0 = now_ns();
            for (uint64_t i = 0; i < n; i++) {
                stamp(sbuf, size, i);
                MPI_Send(sbuf, size, MPI_BYTE, peer, TAG_DATA, MPI_COMM_WORLD);
            }
            MPI_Recv(&ack, 1, MPI_BYTE, peer, TAG_ACK, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            elapsed = now_ns() - t0;
        } else {
            for (uint64_t i = 0; i < n; i++) {
                MPI_Recv(rbuf, size, MPI_BYTE, peer, TAG_DATA, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                check(rbuf, size, i);
            }
            MPI_Send(&ack, 1, MPI_BYTE, peer, TAG_ACK, MPI_COMM_WORLD);
        }

        if (rank == 0) {
            for (uint64_t r = 0; r < rounds; r++)
                printf("pingpong_sample %d %llu\n", size, (unsigned long long)samples[r]);
            qsort(samples, rounds, sizeof *samples, cmp_u64);
            double bps = elapsed > 0 ? (double)n * (double)size * 1e9 / (double)elapsed : 0.0;
            printf("pingpong %d %llu %llu\n", size,
                   (unsigned long long)percentile(samples, rounds, 50.0),
                   (unsigned long long)percentile(samples, rounds, 99.0));
            printf("throughput %d %llu\n", size, (unsigned long long)(bps + 0.5));
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
