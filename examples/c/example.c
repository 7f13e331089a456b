/*
 * The KittensBroker pattern in C, done with shmbroker: every rank publishes a 64-byte GPU IPC
 * handle (here a host memfd stands in for device memory, so it runs on any machine), every rank
 * gets every other rank's memory by fd, checks what is in it, and the ranks meet at barriers.
 *
 *     cargo build --release -p shmbroker-capi
 *     cc examples/c/example.c -Icapi/include -Ltarget/release -lshmbroker \
 *        -Wl,-rpath,"$PWD/target/release" -o example
 *     target/release/shmbroker run -n 4 ./example
 *
 * Every call is checked; a failing one prints shmbroker_last_error() (which names the rank
 * involved) and the program exits 1, which `shmbroker run` passes on.
 */
#define _GNU_SOURCE
#include <shmbroker.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define BUFFER_BYTES (1 << 20)

/* What a rank publishes: in a GPU program, the bytes cuIpcGetMemHandle wrote. */
struct handle {
    uint32_t rank;
    uint32_t magic;
    uint64_t bytes;
    unsigned char opaque[48];
};
_Static_assert(sizeof(struct handle) == 64, "a CUDA IPC handle is 64 bytes");

#define CHECK(call)                                                                            \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_ != SHMBROKER_OK) {                                                             \
            fprintf(stderr, "%s failed (%d): %s\n", #call, rc_, shmbroker_last_error());       \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static void fail(const char *what) {
    perror(what);
    exit(1);
}

int main(void) {
    shmbroker_session *s = NULL;
    /* The library's warnings (an fd transport that fell back to the broker's relay, say) on stderr. */
    CHECK(shmbroker_set_log(SHMBROKER_LOG_WARN, NULL, NULL));
    CHECK(shmbroker_from_env(30000, &s));
    uint32_t rank = shmbroker_rank(s), world = shmbroker_world_size(s);

    /* This rank's "device memory": a memfd filled with its rank. */
    int fd = memfd_create("example-buffer", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, BUFFER_BYTES) != 0) fail("memfd");
    unsigned char *mine = mmap(NULL, BUFFER_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mine == MAP_FAILED) fail("mmap");
    memset(mine, (int)(rank + 1), BUFFER_BYTES);

    /* 1. Every rank's handle. */
    struct handle own = {.rank = rank, .magic = 0x5348424b, .bytes = BUFFER_BYTES};
    memset(own.opaque, (int)rank, sizeof own.opaque);
    struct handle *all = calloc(world, sizeof *all);
    if (!all) fail("calloc");
    CHECK(shmbroker_all_gather(s, &own, sizeof own, all));
    CHECK(shmbroker_barrier(s));

    /* 2. Every rank's memory, by fd; check the handle describes it. */
    int *fds = calloc(world, sizeof *fds);
    if (!fds) fail("calloc");
    CHECK(shmbroker_exchange_fds(s, fd, fds));
    /* pidfd_getfd, or the broker's relay where the kernel refuses it (a container, say). */
    int used = SHMBROKER_FD_TRANSPORT_NONE;
    CHECK(shmbroker_fd_transport(s, NULL, &used));
    if (used == SHMBROKER_FD_TRANSPORT_NONE) {
        fprintf(stderr, "rank %u: fds moved, but by no transport\n", rank);
        return 1;
    }
    for (uint32_t peer = 0; peer < world; peer++) {
        if (all[peer].rank != peer || all[peer].magic != 0x5348424b) {
            fprintf(stderr, "rank %u: rank %u's handle is wrong\n", rank, peer);
            return 1;
        }
        unsigned char *theirs = mmap(NULL, all[peer].bytes, PROT_READ, MAP_SHARED, fds[peer], 0);
        if (theirs == MAP_FAILED) fail("mmap of a peer's buffer");
        if (theirs[0] != peer + 1 || theirs[all[peer].bytes - 1] != peer + 1) {
            fprintf(stderr, "rank %u: rank %u's memory holds %d\n", rank, peer, theirs[0]);
            return 1;
        }
        munmap(theirs, all[peer].bytes);
        close(fds[peer]);
    }
    CHECK(shmbroker_barrier(s));

    /* 2b. Many fds at once: two more files from every rank, in one batch (two ring trips). */
    int pair[2];
    for (int i = 0; i < 2; i++) {
        pair[i] = memfd_create("example-batch", MFD_CLOEXEC);
        unsigned char tag = (unsigned char)(rank * 2 + i);
        if (pair[i] < 0 || pwrite(pair[i], &tag, 1, 0) != 1) fail("memfd of a batch");
    }
    int *batch = calloc(world * 2, sizeof *batch);
    if (!batch) fail("calloc");
    CHECK(shmbroker_exchange_fd_batch(s, pair, 2, batch));
    for (uint32_t at = 0; at < world * 2; at++) {
        unsigned char tag = 0xff;
        if (pread(batch[at], &tag, 1, 0) != 1 || tag != at) {
            fprintf(stderr, "rank %u: batch fd %u holds %d\n", rank, at, tag);
            return 1;
        }
        close(batch[at]);
    }
    close(pair[0]);
    close(pair[1]);
    free(batch);

    /* 3. A word from rank 0 to everyone, and a message around the ring. */
    char word[16] = {0};
    if (rank == 0) snprintf(word, sizeof word, "go, %u ranks", world);
    CHECK(shmbroker_broadcast(s, 0, word, sizeof word));
    if (world > 1) {
        uint32_t next = (rank + 1) % world, prev = (rank + world - 1) % world;
        CHECK(shmbroker_send(s, next, &rank, sizeof rank));
        uint32_t got = 0;
        size_t len = 0;
        CHECK(shmbroker_recv(s, prev, &got, sizeof got, &len));
        if (len != sizeof got || got != prev) {
            fprintf(stderr, "rank %u: expected %u from rank %u, got %u\n", rank, prev, prev, got);
            return 1;
        }
    }
    /* Who is where, asked of the broker as `shmbroker status --json` would (rank 0, when the
     * job came from `shmbroker run`): one line per rank, each running. */
    const char *socket_path = getenv("SHMBROKER_SOCKET");
    if (rank == 0 && socket_path != NULL) {
        size_t cap = 0, len = 0;
        char *text = NULL;
        int rc;
        while ((rc = shmbroker_status(socket_path, 5000, text, cap, &len)) == SHMBROKER_E_TOO_SMALL) {
            cap = len + 256; /* times may have grown a digit by the next answer */
            free(text);
            text = malloc(cap);
            if (text == NULL) fail("malloc");
        }
        CHECK(rc);
        uint32_t running = 0;
        for (const char *at = text; (at = strstr(at, "\"state\":\"running\"")) != NULL; at++) running++;
        if (running != world) {
            fprintf(stderr, "rank 0: shmbroker_status shows %u running ranks of %u:\n%s", running,
                    world, text);
            return 1;
        }
        free(text);
    }
    CHECK(shmbroker_barrier(s));

    /* 4. Every rank's numbers summed on every rank, the same bits everywhere. */
    double sums[3] = {1.0, (double)rank, 0.5};
    CHECK(shmbroker_all_reduce(s, sums, 3, SHMBROKER_DTYPE_F64, SHMBROKER_OP_SUM));
    if (sums[0] != world || sums[1] != world * (world - 1) / 2.0 || sums[2] != world * 0.5) {
        fprintf(stderr, "rank %u: all_reduce gave %g %g %g\n", rank, sums[0], sums[1], sums[2]);
        return 1;
    }
    /* 4b. A symmetric buffer: the bytes of a loan this rank holds. An all-reduce on it is read
     *     by the peers where it lies, with no copy in; the loan stays this rank's. */
    enum { SYMMETRIC_COUNT = 1 << 18 };
    shmbroker_loan *held = NULL;
    void *held_bytes = NULL;
    CHECK(shmbroker_loan_create(s, SYMMETRIC_COUNT * sizeof(float), &held, &held_bytes));
    float *symmetric = held_bytes;
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < SYMMETRIC_COUNT; i++) symmetric[i] = (float)(i % 5 + rank + round);
        CHECK(shmbroker_all_reduce(s, symmetric, SYMMETRIC_COUNT, SHMBROKER_DTYPE_F32,
                                   SHMBROKER_OP_SUM));
        for (size_t i = 0; i < SYMMETRIC_COUNT; i++) {
            float want = (float)(world * (i % 5 + round) + world * (world - 1) / 2);
            if (symmetric[i] != want) {
                fprintf(stderr, "rank %u: symmetric all_reduce gave %g at %zu, not %g\n", rank,
                        symmetric[i], i, want);
                return 1;
            }
        }
    }
    uint64_t read_in_place = 0;
    CHECK(shmbroker_reductions_read_in_place(s, &read_in_place));
    if (world > 1 && read_in_place != 3) {
        fprintf(stderr, "rank %u: %llu pieces read in place, not 3\n", rank,
                (unsigned long long)read_in_place);
        return 1;
    }
    shmbroker_loan_free(held);
    /* 5. A group of the even ranks and one of the odd ones, each numbered from 0: the same
     *    sum among each group's members only. */
    uint32_t members[64], count = 0;
    for (uint32_t q = rank % 2; q < world && count < 64; q += 2) members[count++] = q;
    shmbroker_group *parity = NULL;
    CHECK(shmbroker_group_create(s, members, count, &parity));
    int64_t mine_in_group = shmbroker_group_world_rank(parity, shmbroker_group_rank(parity));
    double ones = 1.0, ranks_sum = (double)rank;
    CHECK(shmbroker_group_all_reduce(s, parity, &ones, 1, SHMBROKER_DTYPE_F64, SHMBROKER_OP_SUM));
    CHECK(shmbroker_group_all_reduce(s, parity, &ranks_sum, 1, SHMBROKER_DTYPE_F64,
                                     SHMBROKER_OP_SUM));
    double want_sum = 0;
    for (uint32_t i = 0; i < count; i++) want_sum += members[i];
    if (mine_in_group != rank || ones != count || ranks_sum != want_sum ||
        shmbroker_group_size(parity) != count) {
        fprintf(stderr, "rank %u: group all_reduce gave %g and %g\n", rank, ones, ranks_sum);
        return 1;
    }
    CHECK(shmbroker_group_barrier(s, parity));
    shmbroker_group_free(parity);
    CHECK(shmbroker_barrier(s));
    printf("rank %u of %u: %u handles and buffers checked; rank 0 said \"%s\"\n", rank, world,
           world, word);

    munmap(mine, BUFFER_BYTES);
    close(fd);
    free(fds);
    free(all);
    shmbroker_close(s);
    return 0;
}
