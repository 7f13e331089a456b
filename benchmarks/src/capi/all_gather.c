/*
 * capi_allgather: shmbroker_all_gather called from C through libshmbroker.so, the contender
 * that `bench collectives` (capi_all_gather) runs beside the Rust call it wraps,
 * Session::all_gather_into.
 *
 *     bench run -n WORLD capi_allgather ROUNDS WARMUP SIZE
 *
 * Every rank joins with shmbroker_from_env(20000 ms), which is also every call's deadline, as
 * the Rust contender's session has. Then it runs WARMUP untimed and ROUNDS timed
 * shmbroker_all_gather calls of SIZE bytes back to back, from and into buffers made once, and
 * after each call checks the first byte of every rank's part, inside the timed region, as the
 * Rust contender does. Rank 0 prints one line per timed call on stdout, flushed:
 *
 *     capi_allgather_sample NS
 *
 * A failing call prints shmbroker_last_error() and exits 1; bad arguments exit 2.
 *
 * Built after c/bench.h (the clock, argument parsing) with shmbroker.h beside it; see capi.rs.
 */
#include <shmbroker.h>

#define MAX_SIZE (1ull << 20)

static void fail(const char *call, int rc) {
    fprintf(stderr, "capi_allgather: %s failed (%d): %s\n", call, rc, shmbroker_last_error());
    exit(1);
}

int main(int argc, char **argv) {
    uint64_t rounds, warmup, size;
    if (argc != 4 || parse_u64(argv[1], 1, 100000000ull, &rounds) ||
        parse_u64(argv[2], 0, 100000000ull, &warmup) || parse_u64(argv[3], 1, MAX_SIZE, &size)) {
        fprintf(stderr,
                "usage: bench run -n WORLD capi_allgather ROUNDS WARMUP SIZE"
                " (1 <= ROUNDS <= 100000000, 1 <= SIZE <= 1 MiB)\n");
        return 2;
    }

    shmbroker_session *s = NULL;
    int rc = shmbroker_from_env(20000, &s);
    if (rc != SHMBROKER_OK) fail("shmbroker_from_env", rc);
    uint32_t rank = shmbroker_rank(s), world = shmbroker_world_size(s);

    unsigned char *data = malloc(size), *out = malloc(size * world);
    uint64_t *samples = malloc(sizeof *samples * rounds);
    if (!data || !out || !samples) {
        fprintf(stderr, "capi_allgather: rank %u: out of memory\n", rank);
        return 1;
    }
    /* Each rank's part is its rank in every byte, as in the Rust contender. */
    memset(data, (int)(rank & 0xff), size);
    memset(out, 0xff, size * world);

    for (uint64_t r = 0; r < warmup + rounds; r++) {
        uint64_t t0 = now_ns();
        rc = shmbroker_all_gather(s, data, size, out);
        if (rc != SHMBROKER_OK) fail("shmbroker_all_gather", rc);
        for (uint32_t peer = 0; peer < world; peer++) {
            if (out[(size_t)peer * size] != (unsigned char)(peer & 0xff)) {
                fprintf(stderr, "capi_allgather: rank %u: rank %u's part holds %d\n", rank, peer,
                        out[(size_t)peer * size]);
                return 1;
            }
        }
        uint64_t t1 = now_ns();
        if (r >= warmup) samples[r - warmup] = t1 - t0;
    }

    if (rank == 0) {
        for (uint64_t r = 0; r < rounds; r++)
            printf("capi_allgather_sample %llu\n", (unsigned long long)samples[r]);
        fflush(stdout);
    }
    shmbroker_close(s);
    free(samples);
    free(out);
    free(data);
    return 0;
}
