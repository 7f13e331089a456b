/*
 * A task farm that heals, in C: rank 0 hands out tasks and takes answers from any worker; the
 * last rank dies on purpose (SIGKILL) in its first process, holding its first task unanswered, the
 * launcher starts it again (`--restart 1`), and the new process rejoins the job in its place. Rank 0 hears
 * SHMBROKER_E_PEER_LOST for the dead process, then SHMBROKER_E_PEER_REJOINED, and gives the
 * newcomer tasks again; the task the dead process held is given to another. Then every rank
 * recovers the whole world's group (shmbroker_regroup takes the newcomer on where it has not
 * been yet) and sums on it.
 *
 *     cargo build --release -p shmbroker-capi -p shmbroker-cli
 *     cc examples/c/restart.c -Icapi/include -Ltarget/release -lshmbroker \
 *        -Wl,-rpath,"$PWD/target/release" -o restart
 *     target/release/shmbroker run -n 3 --restart 1 ./restart
 */
#include <shmbroker.h>

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TASKS 400

#define CHECK(call)                                                                            \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_ != SHMBROKER_OK) {                                                             \
            fprintf(stderr, "%s failed (%d): %s\n", #call, rc_, shmbroker_last_error());       \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static uint64_t answer_of(uint64_t task) { return task * 2654435761u + 7; }

/* Rank 0: every task answered exactly once, whatever dies. */
static void read_tasks(struct shmbroker_session *s) {
    uint32_t world = shmbroker_world_size(s);
    int64_t holding[64];           /* the task each worker holds, or -1 */
    int dead[64] = {0};            /* dead, and no replacement yet */
    int answered[TASKS] = {0};
    uint64_t next = 0, done = 0, lost = 0, died = 0, rejoined = 0;
    int64_t requeued[64];          /* tasks to give again first */
    int nrequeued = 0;
    for (uint32_t w = 0; w < world; w++) holding[w] = -1;
    /* Until every task is answered and every dead worker's replacement has come back. */
    for (;;) {
        int waiting_for_one = 0;
        for (uint32_t w = 1; w < world; w++) waiting_for_one |= dead[w];
        if (done == TASKS && !waiting_for_one) break;
        for (uint32_t w = 1; w < world; w++) {
            if (holding[w] != -1 || (nrequeued == 0 && next == TASKS)) continue;
            uint64_t task = nrequeued > 0 ? (uint64_t)requeued[nrequeued - 1] : next;
            int rc = shmbroker_send(s, w, &task, sizeof task);
            if (rc == SHMBROKER_E_PEER_LOST) continue; /* recv_any reports it, then its return */
            CHECK(rc);
            holding[w] = (int64_t)task;
            if (nrequeued > 0) nrequeued--; else next++;
        }
        uint32_t from = 0;
        uint64_t reply[2];
        size_t len = 0;
        int rc = shmbroker_recv_any(s, &from, reply, sizeof reply, &len);
        if (rc == SHMBROKER_E_PEER_LOST) {
            int64_t rank = shmbroker_last_error_rank();
            /* With every worker dead, each call says so again until a replacement comes. */
            if (rank >= 0 && rank < 64 && !dead[rank]) {
                printf("rank %lld died: %s\n", (long long)rank, shmbroker_last_error());
                dead[rank] = 1;
                died++;
            }
            if (rank > 0 && rank < 64 && holding[rank] != -1) {
                requeued[nrequeued++] = holding[rank];
                holding[rank] = -1;
                lost++;
            }
            continue;
        }
        if (rc == SHMBROKER_E_PEER_REJOINED) {
            int64_t rank = shmbroker_last_error_rank();
            printf("rank %lld rejoined\n", (long long)rank);
            if (rank > 0 && rank < 64) {
                dead[rank] = 0;
                /* A task given to its last process (dead, or one that never came) is gone. */
                if (holding[rank] != -1) {
                    requeued[nrequeued++] = holding[rank];
                    holding[rank] = -1;
                    lost++;
                }
            }
            rejoined++;
            continue;
        }
        CHECK(rc);
        if (len != sizeof reply || (int64_t)reply[0] != holding[from] ||
            reply[1] != answer_of(reply[0]) || answered[reply[0]]) {
            fprintf(stderr, "a wrong or repeated answer from rank %u\n", from);
            exit(1);
        }
        answered[reply[0]] = 1;
        holding[from] = -1;
        done++;
    }
    for (uint32_t w = 1; w < world; w++) CHECK(shmbroker_send(s, w, NULL, 0));
    printf("farm done: %d tasks answered once each, %llu lost and given again, %llu rejoined\n",
           TASKS, (unsigned long long)lost, (unsigned long long)rejoined);
    /* A rank that had not logged on when the other died comes late: also a "rejoin". */
    if (died != 1 || rejoined < 1) {
        fprintf(stderr, "expected one death and its rejoin, saw %llu and %llu\n",
                (unsigned long long)died, (unsigned long long)rejoined);
        exit(1);
    }
}

int main(void) {
    struct shmbroker_session *s = NULL;
    CHECK(shmbroker_from_env(30000, &s));
    uint32_t rank = shmbroker_rank(s), world = shmbroker_world_size(s);
    const char *restarted = getenv("SHMBROKER_RESTART_COUNT");
    if ((restarted != NULL) != (shmbroker_rejoins(s) > 0)) {
        fprintf(stderr, "rank %u: restarted %s, rejoins %u\n", rank, restarted ? "yes" : "no",
                shmbroker_rejoins(s));
        return 1;
    }
    if (rank == 0) {
        read_tasks(s);
    } else {
        for (;;) {
            uint64_t task, reply[2];
            size_t len = 0;
            CHECK(shmbroker_recv(s, 0, &task, sizeof task, &len));
            if (len == 0) break;
            /* Holding a task, never answered: the farm cannot end before rank 0 sees the death
             * (dying after an answer, a late starter's death could come after the last task). */
            if (rank == world - 1 && restarted == NULL) raise(SIGKILL);
            reply[0] = task;
            reply[1] = answer_of(task);
            CHECK(shmbroker_send(s, 0, reply, sizeof reply));
        }
    }
    /* Every rank there (the replacement taken on), a group of the whole world, a sum:
     * shmbroker_regroup waits for replacements and agrees on the group, whatever dies meanwhile. */
    uint32_t ranks[64];
    for (uint32_t r = 0; r < world; r++) ranks[r] = r;
    struct shmbroker_group *g = NULL;
    CHECK(shmbroker_regroup(s, ranks, world, 30000, &g));
    uint32_t sum = rank + 1;
    CHECK(shmbroker_group_all_reduce(s, g, &sum, 1, SHMBROKER_DTYPE_U32, SHMBROKER_OP_SUM));
    if (sum != world * (world + 1) / 2) {
        fprintf(stderr, "rank %u: the sum is %u\n", rank, sum);
        return 1;
    }
    printf("rank %u%s: OK\n", rank, restarted ? " (restarted)" : "");
    shmbroker_group_free(g);
    CHECK(shmbroker_close(s));
    return 0;
}
