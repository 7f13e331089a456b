/*
 * capi_calls: shmbroker_all_gather, shmbroker_all_reduce and shmbroker_recv_any called from C
 * through libshmbroker.so, the contender that `bench collectives` (capi_all_gather,
 * capi_all_reduce, capi_recv_any) runs beside the Rust calls they wrap.
 *
 *     bench run -n WORLD capi_calls CALL ROUNDS WARMUP SIZE
 *
 * CALL is one of:
 *   all_gather  shmbroker_all_gather of SIZE bytes, from and into buffers made once; after each
 *               call, the first byte of every rank's part is checked (each rank's part is its
 *               rank in every byte);
 *   all_reduce  shmbroker_all_reduce of SIZE / 4 f32 in place, sum; each rank's elements are
 *               set to rank + 1 before the call (untimed), and the first is checked after it;
 *   recv_any    a ping-pong of SIZE bytes between ranks 0 and 1: rank 0 sends, rank 1 takes it
 *               with shmbroker_recv_any and sends it back, rank 0 takes that with
 *               shmbroker_recv_any; one sample per round trip (other ranks only join).
 *
 * Every rank joins with shmbroker_from_env(20000 ms), which is also every call's deadline, as
 * the Rust contender's session has. WARMUP untimed rounds, then ROUNDS timed ones. Rank 0 prints
 * one line per timed round on stdout, flushed:
 *
 *     capi_sample NS
 *
 * A failing call prints shmbroker_last_error() and exits 1; bad arguments exit 2.
 *
 * Built after c/bench.h (the clock, argument parsing) with shmbroker.h beside it; see capi.rs.
 */
#include <shmbroker.h>

#define MAX_SIZE (1ull << 20)

static void fail(const char *call, int rc) {
    fprintf(stderr, "capi_calls: %s failed (%d): %s\n", call, rc, shmbroker_last_error());
    exit(1);
}

static void wrong(uint32_t rank, const char *what) {
    fprintf(stderr, "capi_calls: rank %u: %s\n", rank, what);
    exit(1);
}

int main(int argc, char **argv) {
    uint64_t rounds, warmup, size;
    const char *call = argc == 5 ? argv[1] : "";
    int gather = strcmp(call, "all_gather") == 0, reduce = strcmp(call, "all_reduce") == 0,
        any = strcmp(call, "recv_any") == 0;
    if (argc != 5 || !(gather || reduce || any) || parse_u64(argv[2], 1, 100000000ull, &rounds) ||
        parse_u64(argv[3], 0, 100000000ull, &warmup) || parse_u64(argv[4], 1, MAX_SIZE, &size) ||
        (reduce && size % 4 != 0)) {
        fprintf(stderr,
                "usage: bench run -n WORLD capi_calls all_gather|all_reduce|recv_any ROUNDS WARMUP"
                " SIZE (1 <= ROUNDS <= 100000000, 1 <= SIZE <= 1 MiB, a multiple of 4 for"
                " all_reduce)\n");
        return 2;
    }

    shmbroker_session *s = NULL;
    int rc = shmbroker_from_env(20000, &s);
    if (rc != SHMBROKER_OK) fail("shmbroker_from_env", rc);
    uint32_t rank = shmbroker_rank(s), world = shmbroker_world_size(s);

    unsigned char *data = malloc(size), *out = malloc(size * world);
    float *floats = malloc(size);
    uint64_t *samples = malloc(sizeof *samples * rounds);
    if (!data || !out || !floats || !samples) wrong(rank, "out of memory");
    memset(data, (int)(rank & 0xff), size);
    memset(out, 0xff, size * world);
    size_t count = (size_t)size / 4;
    const float sum = (float)world * (float)(world + 1) / 2.0f;

    for (uint64_t r = 0; r < warmup + rounds; r++) {
        if (reduce) {
            for (size_t i = 0; i < count; i++) floats[i] = (float)(rank + 1);
        }
        uint64_t t0 = now_ns();
        if (gather) {
            rc = shmbroker_all_gather(s, data, size, out);
            if (rc != SHMBROKER_OK) fail("shmbroker_all_gather", rc);
            for (uint32_t peer = 0; peer < world; peer++) {
                if (out[(size_t)peer * size] != (unsigned char)(peer & 0xff))
                    wrong(rank, "a rank's part holds the wrong byte");
            }
        } else if (reduce) {
            rc = shmbroker_all_reduce(s, floats, count, SHMBROKER_DTYPE_F32, SHMBROKER_OP_SUM);
            if (rc != SHMBROKER_OK) fail("shmbroker_all_reduce", rc);
            if (floats[0] != sum) wrong(rank, "the sum is wrong");
        } else if (rank < 2) {
            uint32_t from = 0;
            size_t len = 0;
            if (rank == 0) {
                rc = shmbroker_send(s, 1, data, size);
                if (rc != SHMBROKER_OK) fail("shmbroker_send", rc);
            }
            rc = shmbroker_recv_any(s, &from, out, size, &len);
            if (rc != SHMBROKER_OK) fail("shmbroker_recv_any", rc);
            if (from != 1 - rank || len != size) wrong(rank, "a message from the wrong rank");
            if (rank == 1) {
                rc = shmbroker_send(s, 0, out, len);
                if (rc != SHMBROKER_OK) fail("shmbroker_send", rc);
            }
        }
        uint64_t t1 = now_ns();
        if (r >= warmup) samples[r - warmup] = t1 - t0;
    }

    if (rank == 0) {
        for (uint64_t r = 0; r < rounds; r++)
            printf("capi_sample %llu\n", (unsigned long long)samples[r]);
        fflush(stdout);
    }
    /* Nobody leaves before everyone is done (a ping-pong's other ranks only join). */
    rc = shmbroker_barrier(s);
    if (rc != SHMBROKER_OK) fail("shmbroker_barrier", rc);
    shmbroker_close(s);
    free(samples);
    free(floats);
    free(out);
    free(data);
    return 0;
}
