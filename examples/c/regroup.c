/*
 * Recovering a group while a rank dies, in C: rank 1 sends rank 0 a message and dies (SIGKILL)
 * 300 ms later, in its first process only; rank 2, which has nothing to say to rank 1, sends its
 * own message and at once recovers the whole world's group. The launcher starts rank 1 again
 * (`--restart 1`). Every rank, the replacement included, calls shmbroker_regroup: it waits for
 * the replacement, makes the group by agreement, and tries again through the death. A barrier
 * and a sum of every member's incarnation ([0, 1, 0]: rank 1 is the replacement) check it.
 *
 *     cargo build --release -p shmbroker-capi -p shmbroker-cli
 *     cc examples/c/regroup.c -Icapi/include -Ltarget/release -lshmbroker \
 *        -Wl,-rpath,"$PWD/target/release" -o regroup
 *     target/release/shmbroker run -n 3 --restart 1 ./regroup
 */
#include <shmbroker.h>

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call)                                                                            \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_ != SHMBROKER_OK) {                                                             \
            fprintf(stderr, "%s failed (%d): %s\n", #call, rc_, shmbroker_last_error());       \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int main(void) {
    struct shmbroker_session *s = NULL;
    CHECK(shmbroker_from_env(30000, &s));
    uint32_t rank = shmbroker_rank(s), world = shmbroker_world_size(s);
    if (world != 3) {
        fprintf(stderr, "run it with -n 3\n");
        return 1;
    }
    if (shmbroker_rejoins(s) > 0) {
        printf("rank %u logged on at %lld ms\n", rank, now_ms());
    } else if (rank == 0) {
        for (uint32_t from = 1; from <= 2; from++) {
            char text[32] = {0}, want[32];
            size_t len = 0;
            CHECK(shmbroker_recv(s, from, text, sizeof text - 1, &len));
            snprintf(want, sizeof want, "hello from %u", from);
            if (strcmp(text, want) != 0) {
                fprintf(stderr, "rank %u sent \"%s\"\n", from, text);
                return 1;
            }
        }
    } else {
        char text[32];
        snprintf(text, sizeof text, "hello from %u", rank);
        CHECK(shmbroker_send(s, 0, text, strlen(text)));
        if (rank == 1) {
            struct timespec pause = {0, 300 * 1000 * 1000};
            nanosleep(&pause, NULL);
            raise(SIGKILL);
        }
    }
    uint32_t ranks[3] = {0, 1, 2};
    struct shmbroker_group *g = NULL;
    uint32_t incarnations[3] = {0, 0, 0};
    /* A death after the group is made fails the barrier or the sum: recover again. */
    for (int tries = 0;; tries++) {
        if (g != NULL) shmbroker_group_free(g);
        g = NULL;
        CHECK(shmbroker_regroup(s, ranks, 3, 30000, &g));
        memset(incarnations, 0, sizeof incarnations);
        incarnations[shmbroker_group_rank(g)] = shmbroker_rejoins(s);
        if (shmbroker_group_barrier(s, g) == SHMBROKER_OK &&
            shmbroker_group_all_reduce(s, g, incarnations, 3, SHMBROKER_DTYPE_U32,
                                       SHMBROKER_OP_SUM) == SHMBROKER_OK)
            break;
        if (tries == 10) {
            fprintf(stderr, "rank %u: %s\n", rank, shmbroker_last_error());
            return 1;
        }
    }
    if (incarnations[0] != 0 || incarnations[1] != 1 || incarnations[2] != 0) {
        fprintf(stderr, "rank %u: incarnations %u %u %u\n", rank, incarnations[0],
                incarnations[1], incarnations[2]);
        return 1;
    }
    printf("rank %u done at %lld ms: group [0, 1, 2], incarnations [0, 1, 0]\n", rank, now_ms());
    shmbroker_group_free(g);
    CHECK(shmbroker_close(s));
    return 0;
}
