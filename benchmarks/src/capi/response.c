/*
 * response_wait: the MindIE loop of issue 45 through the C ABI, the contender `bench farm`
 * (response_wait_c) runs in two modes side by side.
 *
 *     bench run -n WORLD response_wait MODE BATCHES WARMUP BYTES SLOW_MS
 *
 * Rank 0 is a scheduler. Its main thread broadcasts BATCHES batches of BYTES bytes to the
 * workers (shmbroker_broadcast) while a response thread takes their replies with
 * shmbroker_recv_any on the same handle. Rank 1 spends SLOW_MS ms on every batch; the other
 * workers reply at once. MODE is one of:
 *   unpaced  the main thread broadcasts batch after batch: once the outbox is full of batches the
 *            slow worker has not taken, each broadcast waits for its room;
 *   paced    the main thread broadcasts batch n + 1 only once every reply to batch n is in, so
 *            no broadcast waits (the floor the other mode is measured against).
 *
 * Each reply carries its batch number, a checksum of the batch (checked) and when it was sent
 * (CLOCK_MONOTONIC: one clock for every process). Rank 0 prints, for each fast worker's reply to
 * a batch past the first WARMUP, how long it waited between that send and the response thread
 * taking it:
 *
 *     response_sample NS
 *
 * A failing call prints shmbroker_last_error() and exits 1; bad arguments exit 2.
 *
 * Built after c/bench.h (the clock, argument parsing) with shmbroker.h beside it; see response.rs.
 */
#include <pthread.h>
#include <shmbroker.h>

struct reply {
    uint32_t id;
    uint32_t sum;
    uint64_t sent_ns;
};

static shmbroker_session *s;
static uint64_t batches, warmup, bytes;
static uint32_t world;
static uint32_t *sums;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t answered_cond = PTHREAD_COND_INITIALIZER;
/* Batches every worker has answered. */
static uint64_t answered;
static uint64_t *samples;
static size_t nsamples;

static void fail(const char *call, int rc) {
    fprintf(stderr, "response_wait: %s failed (%d): %s\n", call, rc, shmbroker_last_error());
    exit(1);
}

static void wrong(const char *what, uint64_t a, uint64_t b) {
    fprintf(stderr, "response_wait: %s (%llu, %llu)\n", what, (unsigned long long)a,
            (unsigned long long)b);
    exit(1);
}

static void fill(unsigned char *buf, uint32_t id) {
    for (uint64_t at = 0; at < bytes; ++at) buf[at] = (unsigned char)(id * 13 + at / 4096);
    memcpy(buf, &id, sizeof id < bytes ? sizeof id : bytes);
}

static uint32_t checksum(const unsigned char *buf) {
    uint32_t sum = 0;
    for (uint64_t at = 0; at < bytes; at += 997) sum = sum * 31 + buf[at];
    return sum;
}

static void *responses(void *unused) {
    (void)unused;
    uint32_t *count = calloc(batches, sizeof *count);
    uint32_t *next = calloc(world, sizeof *next);
    if (count == NULL || next == NULL) wrong("out of memory", 0, 0);
    for (uint64_t n = 0; n < batches * (world - 1); ++n) {
        struct reply reply;
        uint32_t from = 0;
        size_t len = 0;
        int rc = shmbroker_recv_any(s, &from, &reply, sizeof reply, &len);
        uint64_t taken = now_ns();
        if (rc != SHMBROKER_OK) fail("shmbroker_recv_any", rc);
        if (len != sizeof reply || from == 0 || from >= world) wrong("a reply of the wrong size", len, from);
        if (reply.id != next[from]++ || reply.sum != sums[reply.id])
            wrong("a wrong reply from rank", from, reply.id);
        if (from != 1 && reply.id >= warmup) samples[nsamples++] = taken - reply.sent_ns;
        if (++count[reply.id] == world - 1) {
            pthread_mutex_lock(&lock);
            while (answered < batches && count[answered] == world - 1) ++answered;
            pthread_cond_signal(&answered_cond);
            pthread_mutex_unlock(&lock);
        }
    }
    free(count);
    free(next);
    return NULL;
}

int main(int argc, char **argv) {
    uint64_t slow_ms;
    const char *mode = argc == 6 ? argv[1] : "";
    int paced = strcmp(mode, "paced") == 0, unpaced = strcmp(mode, "unpaced") == 0;
    if (argc != 6 || !(paced || unpaced) || parse_u64(argv[2], 1, 1000000, &batches) ||
        parse_u64(argv[3], 0, 1000000, &warmup) || parse_u64(argv[4], 8, 1ull << 30, &bytes) ||
        parse_u64(argv[5], 0, 10000, &slow_ms) || warmup >= batches) {
        fprintf(stderr,
                "usage: bench run -n WORLD response_wait paced|unpaced BATCHES WARMUP BYTES SLOW_MS"
                " (WARMUP < BATCHES, BYTES >= 8)\n");
        return 2;
    }
    int rc = shmbroker_from_env(30000, &s);
    if (rc != SHMBROKER_OK) fail("shmbroker_from_env", rc);
    uint32_t rank = shmbroker_rank(s);
    world = shmbroker_world_size(s);
    if (world < 3) wrong("run with 3 ranks or more (a slow worker and a fast one)", world, 0);
    unsigned char *buf = malloc(bytes);
    if (buf == NULL) wrong("out of memory", bytes, 0);
    if (rank == 0) {
        sums = malloc(batches * sizeof *sums);
        samples = malloc(batches * world * sizeof *samples);
        if (sums == NULL || samples == NULL) wrong("out of memory", batches, 0);
        for (uint32_t id = 0; id < batches; ++id) {
            fill(buf, id);
            sums[id] = checksum(buf);
        }
        pthread_t thread;
        if (pthread_create(&thread, NULL, responses, NULL) != 0) wrong("pthread_create", 0, 0);
        for (uint32_t id = 0; id < batches; ++id) {
            if (paced) {
                pthread_mutex_lock(&lock);
                while (answered < id) pthread_cond_wait(&answered_cond, &lock);
                pthread_mutex_unlock(&lock);
            }
            fill(buf, id);
            rc = shmbroker_broadcast(s, 0, buf, bytes);
            if (rc != SHMBROKER_OK) fail("shmbroker_broadcast", rc);
        }
        pthread_join(thread, NULL);
        for (size_t i = 0; i < nsamples; ++i)
            printf("response_sample %llu\n", (unsigned long long)samples[i]);
        fflush(stdout);
    } else {
        struct timespec slow = {(time_t)(slow_ms / 1000), (long)(slow_ms % 1000) * 1000000L};
        for (uint32_t id = 0; id < batches; ++id) {
            rc = shmbroker_broadcast(s, 0, buf, bytes);
            if (rc != SHMBROKER_OK) fail("shmbroker_broadcast", rc);
            uint32_t got;
            memcpy(&got, buf, sizeof got);
            if (got != id) wrong("a batch out of order", got, id);
            struct reply reply = {id, checksum(buf), 0};
            if (rank == 1 && slow_ms > 0) nanosleep(&slow, NULL);
            reply.sent_ns = now_ns();
            rc = shmbroker_send(s, 0, &reply, sizeof reply);
            if (rc != SHMBROKER_OK) fail("shmbroker_send", rc);
        }
    }
    rc = shmbroker_barrier(s);
    if (rc != SHMBROKER_OK) fail("shmbroker_barrier", rc);
    rc = shmbroker_close(s);
    if (rc != SHMBROKER_OK) fail("shmbroker_close", rc);
    free(buf);
    return 0;
}
