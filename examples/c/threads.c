/*
 * One session handle, two threads: the MindIE pattern in C. Rank 0 is a scheduler whose main
 * thread broadcasts requests (and meets the workers at barriers) while a response thread takes
 * the workers' replies with shmbroker_recv_any as they come, all on one handle (at most WINDOW
 * requests are out at once, as a scheduler's batch would be). Every reply is
 * checked byte for byte and in order per worker, so a race inside the handle shows up as a wrong
 * byte, a wrong order or an error blaming a peer. Rank 1 answers one request late: the response
 * thread still takes the other workers' replies meanwhile.
 *
 * Then the rules for ending: a close while the response thread waits is SHMBROKER_E_BUSY (and
 * frees nothing), shmbroker_interrupt ends that wait with SHMBROKER_E_INTERRUPTED, and the close
 * that follows succeeds.
 *
 *     cargo build --release -p shmbroker-capi
 *     cc -pthread examples/c/threads.c -Icapi/include -Ltarget/release -lshmbroker \
 *        -Wl,-rpath,"$PWD/target/release" -o threads
 *     target/release/shmbroker run -n 4 ./threads
 */
#define _GNU_SOURCE
#include <shmbroker.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 400
#define REQUEST_BYTES 64
#define LATE_ROUND 7
#define LATE_MS 200
#define LARGE_BYTES (100 * 1024)
#define BUFFER_BYTES (128 * 1024)
#define WINDOW 3

#define CHECK(call)                                                                            \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_ != SHMBROKER_OK) {                                                             \
            fprintf(stderr, "%s failed (%d): %s\n", #call, rc_, shmbroker_last_error());       \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

#define EXPECT(cond, ...)                                                                      \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fputc('\n', stderr);                                                               \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

/* Reply sizes: mostly small, now and then pipelined through the outbox. */
static size_t reply_bytes(uint32_t round) { return round % 19 == 3 ? LARGE_BYTES : 16 + round % 40; }

static unsigned char pattern(uint32_t rank, uint32_t round, size_t at) {
    return (unsigned char)(rank * 131u + round * 7u + at);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

struct responses {
    shmbroker_session *s;
    uint32_t workers;
    /* Rounds whose replies are all in: the scheduler keeps at most WINDOW requests out. */
    pthread_mutex_t lock;
    pthread_cond_t progress;
    uint32_t rounds_done;
    /* When the late worker's reply and the last other reply of its round arrived. */
    double late_reply_ms, others_done_ms;
};

static void *take_responses(void *arg) {
    struct responses *r = arg;
    unsigned char *buf = malloc(BUFFER_BYTES);
    uint32_t next[64] = {0};
    uint32_t replies[ROUNDS] = {0};
    uint32_t others_in_late_round = 0;
    EXPECT(buf != NULL, "out of memory");
    for (uint32_t n = 0; n < ROUNDS * r->workers; n++) {
        uint32_t from = 0;
        size_t len = 0;
        CHECK(shmbroker_recv_any(r->s, &from, buf, BUFFER_BYTES, &len));
        EXPECT(from >= 1 && from <= r->workers, "a reply from rank %u", from);
        uint32_t round = next[from]++;
        EXPECT(len == reply_bytes(round), "rank %u's reply %u: %zu bytes, expected %zu", from,
               round, len, reply_bytes(round));
        for (size_t at = 0; at < len; at++) {
            EXPECT(buf[at] == pattern(from, round, at), "rank %u's reply %u: byte %zu wrong", from,
                   round, at);
        }
        if (++replies[round] == r->workers) {
            pthread_mutex_lock(&r->lock);
            while (r->rounds_done < ROUNDS && replies[r->rounds_done] == r->workers) {
                r->rounds_done++;
            }
            pthread_cond_signal(&r->progress);
            pthread_mutex_unlock(&r->lock);
        }
        if (round == LATE_ROUND) {
            if (from == 1) {
                r->late_reply_ms = now_ms();
            } else if (++others_in_late_round == r->workers - 1) {
                r->others_done_ms = now_ms();
            }
        }
    }
    free(buf);
    return NULL;
}

static void *wait_for_nothing(void *arg) {
    shmbroker_session *s = arg;
    unsigned char byte;
    size_t len = 0;
    int rc = shmbroker_recv(s, 1, &byte, 1, &len);
    EXPECT(rc == SHMBROKER_E_INTERRUPTED, "the interrupted recv returned %d: %s", rc,
           shmbroker_last_error());
    return NULL;
}

static void scheduler(shmbroker_session *s, uint32_t workers) {
    struct responses r = {.s = s, .workers = workers};
    pthread_mutex_init(&r.lock, NULL);
    pthread_cond_init(&r.progress, NULL);
    pthread_t responder;
    EXPECT(pthread_create(&responder, NULL, take_responses, &r) == 0, "pthread_create");
    for (uint32_t round = 0; round < ROUNDS; round++) {
        pthread_mutex_lock(&r.lock);
        while (round >= r.rounds_done + WINDOW) {
            pthread_cond_wait(&r.progress, &r.lock);
        }
        pthread_mutex_unlock(&r.lock);
        unsigned char request[REQUEST_BYTES];
        memset(request, (int)(round & 0xff), sizeof request);
        memcpy(request, &round, sizeof round);
        CHECK(shmbroker_broadcast(s, 0, request, sizeof request));
        if (round % 25 == 24) {
            CHECK(shmbroker_barrier(s));
        }
    }
    EXPECT(pthread_join(responder, NULL) == 0, "pthread_join");
    if (workers > 1) {
        printf("rank 0: round %d: the other workers' replies were all in %.1f ms before the late "
               "one's\n",
               LATE_ROUND, r.late_reply_ms - r.others_done_ms);
        EXPECT(r.others_done_ms < r.late_reply_ms,
               "the late worker held up the other replies of its round");
    }

    /* Ending: close while a thread waits is refused; an interrupt ends the wait. */
    pthread_t waiter;
    EXPECT(pthread_create(&waiter, NULL, wait_for_nothing, s) == 0, "pthread_create");
    int rc;
    double until = now_ms() + 10e3;
    /* The waiter is in its receive once a second receive is refused (a try_recv, which waits
     * for nothing, says SHMBROKER_E_AGAIN until then). */
    do {
        unsigned char byte;
        size_t len;
        usleep(1000);
        rc = shmbroker_try_recv(s, 1, &byte, 1, &len);
        EXPECT(rc == SHMBROKER_E_AGAIN || rc == SHMBROKER_E_BUSY, "try_recv returned %d: %s", rc,
               shmbroker_last_error());
        EXPECT(now_ms() < until, "the waiter never started");
    } while (rc != SHMBROKER_E_BUSY);
    rc = shmbroker_close(s);
    EXPECT(rc == SHMBROKER_E_BUSY, "close during a wait returned %d", rc);
    CHECK(shmbroker_interrupt(s));
    EXPECT(pthread_join(waiter, NULL) == 0, "pthread_join");
    CHECK(shmbroker_barrier(s));
    CHECK(shmbroker_close(s));
    printf("rank 0: %d rounds, %u workers, every reply checked\n", ROUNDS, workers);
}

static void worker(shmbroker_session *s, uint32_t rank) {
    unsigned char *reply = malloc(LARGE_BYTES);
    EXPECT(reply != NULL, "out of memory");
    for (uint32_t round = 0; round < ROUNDS; round++) {
        unsigned char request[REQUEST_BYTES];
        uint32_t got;
        CHECK(shmbroker_broadcast(s, 0, request, sizeof request));
        memcpy(&got, request, sizeof got);
        EXPECT(got == round, "rank %u: request %u where %u was due", rank, got, round);
        if (rank == 1 && round == LATE_ROUND) {
            usleep(LATE_MS * 1000);
        }
        size_t len = reply_bytes(round);
        for (size_t at = 0; at < len; at++) {
            reply[at] = pattern(rank, round, at);
        }
        CHECK(shmbroker_send(s, 0, reply, len));
        if (round % 25 == 24) {
            CHECK(shmbroker_barrier(s));
        }
    }
    free(reply);
    /* Rank 0's interrupted wait, then the last barrier. */
    CHECK(shmbroker_barrier(s));
    CHECK(shmbroker_close(s));
}

int main(void) {
    EXPECT(shmbroker_version() == SHMBROKER_VERSION_MAJOR * 10000 + SHMBROKER_VERSION_MINOR * 100 +
                                      SHMBROKER_VERSION_PATCH,
           "libshmbroker is version %d; this program was built against %d.%d.%d",
           shmbroker_version(), SHMBROKER_VERSION_MAJOR, SHMBROKER_VERSION_MINOR,
           SHMBROKER_VERSION_PATCH);
    shmbroker_session *s = NULL;
    CHECK(shmbroker_from_env(30000, &s));
    uint32_t rank = shmbroker_rank(s), world = shmbroker_world_size(s);
    EXPECT(world >= 2 && world <= 64, "run with 2 to 64 ranks, not %u", world);
    if (rank == 0) {
        scheduler(s, world - 1);
    } else {
        worker(s, rank);
    }
    return 0;
}
