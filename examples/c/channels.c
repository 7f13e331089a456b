/* Typed channels from C: rank 0 streams 60-byte records to rank 1 one at a time and in batches,
 * each checked; then a channel whose type tag rank 1 does not share is refused at both ends, and
 * closing the sending end is SHMBROKER_E_CLOSED at the receiving one once all was received.
 *
 *     cargo build --release -p shmbroker-capi
 *     cc examples/c/channels.c -Icapi/include -Ltarget/release -lshmbroker
 *         -Wl,-rpath,"$PWD/target/release" -o channels      (one line)
 *     target/release/shmbroker run -n 2 ./channels
 */
#include <shmbroker.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        if (rc_ != SHMBROKER_OK) {                                                           \
            fprintf(stderr, "%s failed (%d): %s\n", #call, rc_, shmbroker_last_error());     \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

/* A transaction: 60 bytes, so its channel's slots (64) hold 4 bytes it does not send. */
struct transaction {
    uint32_t id;
    uint8_t payload[56];
};

#define COUNT 100000u
#define BATCH 250u

static struct transaction make(uint32_t id) {
    struct transaction t;
    t.id = id;
    for (unsigned i = 0; i < sizeof t.payload; ++i) t.payload[i] = (uint8_t)(id * 7 + i);
    return t;
}

static void expect(int rc, int code, const char *what) {
    if (rc != code) {
        fprintf(stderr, "%s: expected %d, got %d (%s)\n", what, code, rc, shmbroker_last_error());
        exit(1);
    }
}

int main(void) {
    shmbroker_session *s = NULL;
    CHECK(shmbroker_from_env(30000, &s));
    uint32_t rank = shmbroker_rank(s);
    if (shmbroker_world_size(s) != 2) {
        fprintf(stderr, "run with 2 ranks\n");
        return 1;
    }
    if (rank == 0) {
        shmbroker_channel_tx *tx = NULL;
        CHECK(shmbroker_channel_to(s, 1, 0xfeed, sizeof(struct transaction), 256, &tx));
        for (uint32_t id = 0; id < COUNT; ++id) {
            struct transaction t = make(id);
            CHECK(shmbroker_channel_send(tx, &t));
        }
        struct transaction batch[BATCH];
        for (uint32_t id = COUNT; id < 2 * COUNT; id += BATCH) {
            for (uint32_t k = 0; k < BATCH; ++k) batch[k] = make(id + k);
            CHECK(shmbroker_channel_send_batch(tx, batch, BATCH));
        }
        /* A channel rank 1 refuses (it expects another tag): its next send fails too. */
        shmbroker_channel_tx *refused = NULL;
        CHECK(shmbroker_channel_to(s, 1, 0xbad, sizeof(struct transaction), 16, &refused));
        CHECK(shmbroker_barrier(s));
        struct transaction t = make(0);
        expect(shmbroker_channel_send(refused, &t), SHMBROKER_E_MISUSE, "send on a refused channel");
        shmbroker_channel_tx_free(refused);
        shmbroker_channel_tx_free(tx);
        /* A payload by reference: a loan filled here, its reference in a record. */
        shmbroker_channel_tx *refs = NULL;
        CHECK(shmbroker_channel_to(s, 1, 0x4ef, sizeof(shmbroker_loan_ref), 16, &refs));
        shmbroker_loan *loan = NULL;
        void *bytes = NULL;
        CHECK(shmbroker_loan_create(s, 100000, &loan, &bytes));
        for (size_t i = 0; i < 100000; ++i) ((unsigned char *)bytes)[i] = (unsigned char)(i * 13);
        shmbroker_loan_ref lent;
        CHECK(shmbroker_lend_ref(s, 1, loan, &lent));
        CHECK(shmbroker_channel_send(refs, &lent));
        CHECK(shmbroker_barrier(s));
        shmbroker_channel_tx_free(refs);
    } else {
        shmbroker_channel_rx *rx = NULL;
        CHECK(shmbroker_channel_from(s, 0, 0xfeed, sizeof(struct transaction), &rx));
        for (uint32_t id = 0; id < COUNT; ++id) {
            struct transaction t, want = make(id);
            CHECK(shmbroker_channel_recv(rx, &t));
            if (memcmp(&t, &want, sizeof t) != 0) {
                fprintf(stderr, "record %u came garbled\n", id);
                return 1;
            }
        }
        struct transaction batch[97];
        uint32_t next = COUNT;
        while (next < 2 * COUNT) {
            size_t got = 0;
            CHECK(shmbroker_channel_recv_batch(rx, batch, 97, &got));
            for (size_t k = 0; k < got; ++k, ++next) {
                struct transaction want = make(next);
                if (memcmp(&batch[k], &want, sizeof want) != 0) {
                    fprintf(stderr, "batched record %u came garbled\n", next);
                    return 1;
                }
            }
        }
        struct transaction t;
        expect(shmbroker_channel_try_recv(rx, &t), SHMBROKER_E_AGAIN, "try_recv with nothing sent");
        shmbroker_channel_rx *refused = NULL;
        expect(shmbroker_channel_from(s, 0, 0x900d, sizeof(struct transaction), &refused),
               SHMBROKER_E_MISUSE, "a channel with another tag");
        if (strstr(shmbroker_last_error(), "0xbad") == NULL) {
            fprintf(stderr, "the refusal does not name rank 0's tag: %s\n", shmbroker_last_error());
            return 1;
        }
        CHECK(shmbroker_barrier(s));
        /* Rank 0 closes the channel: what was sent came first, then SHMBROKER_E_CLOSED. */
        expect(shmbroker_channel_recv(rx, &t), SHMBROKER_E_CLOSED, "recv after the close");
        if (shmbroker_last_error_rank() != 0) {
            fprintf(stderr, "the close names rank %lld\n", (long long)shmbroker_last_error_rank());
            return 1;
        }
        shmbroker_channel_rx_free(rx);
        shmbroker_channel_rx *refs = NULL;
        CHECK(shmbroker_channel_from(s, 0, 0x4ef, sizeof(shmbroker_loan_ref), &refs));
        shmbroker_loan_ref lent;
        CHECK(shmbroker_channel_recv(refs, &lent));
        shmbroker_loan_view *view = NULL;
        const void *bytes = NULL;
        size_t len = 0;
        CHECK(shmbroker_view_loan_ref(s, 0, &lent, &view, &bytes, &len));
        if (len != 100000) {
            fprintf(stderr, "a lent payload of %zu bytes\n", len);
            return 1;
        }
        for (size_t i = 0; i < len; ++i) {
            if (((const unsigned char *)bytes)[i] != (unsigned char)(i * 13)) {
                fprintf(stderr, "the lent payload came garbled at %zu\n", i);
                return 1;
            }
        }
        /* A forged reference, past the lender's outbox, is refused naming the lender. */
        shmbroker_loan_ref forged = lent;
        forged.offset = (uint64_t)1 << 40;
        shmbroker_loan_view *none = NULL;
        expect(shmbroker_view_loan_ref(s, 0, &forged, &none, &bytes, &len), SHMBROKER_E_PROTOCOL,
               "a forged loan reference");
        shmbroker_loan_view_free(view);
        CHECK(shmbroker_barrier(s));
        shmbroker_channel_rx_free(refs);
        printf("rank 1: %u records one at a time and %u in batches, each checked\n", COUNT, COUNT);
    }
    CHECK(shmbroker_close(s));
    return 0;
}
