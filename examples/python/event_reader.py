"""An event reader and its workers over typed channels (the "IPC on steroids" pattern): rank 0
reads events (made up here) and hands each to a worker on that worker's channel, as records of a
NumPy structured dtype (or packed bytes without NumPy); each worker scores its events and sends
the scores back on a channel of its own; rank 0 checks every score.

    target/release/shmbroker run -n 4 -- python examples/python/event_reader.py
"""

import struct
import sys

import shmbroker

EVENTS = 20000
BATCH = 500

try:
    import numpy
except ImportError:  # the same records, packed by hand
    numpy = None

if numpy is not None:
    EVENT = numpy.dtype([("id", "<u8"), ("price", "<f8"), ("size", "<u4"), ("side", "u1")], align=True)
    SCORE = numpy.dtype([("id", "<u8"), ("score", "<f8")])
else:
    EVENT = struct.calcsize("<QdIB3x")
    SCORE = struct.calcsize("<Qd")


def events(start, count):
    """The events `start` to `start + count - 1`."""
    if numpy is not None:
        out = numpy.zeros(count, dtype=EVENT)
        out["id"] = numpy.arange(start, start + count)
        out["price"] = 100.0 + out["id"] % 97
        out["size"] = 1 + out["id"] % 13
        out["side"] = out["id"] % 2
        return out
    return b"".join(
        struct.pack("<QdIB3x", i, 100.0 + i % 97, 1 + i % 13, i % 2) for i in range(start, start + count)
    )


def score(event_id):
    price, size, side = 100.0 + event_id % 97, 1 + event_id % 13, event_id % 2
    return price * size * (1 if side else -1)


def reader(session):
    workers = session.world_size - 1
    out = [session.channel_to(w, 1, EVENT, capacity=4096) for w in range(1, workers + 1)]
    back = [session.channel_from(w, 2, SCORE) for w in range(1, workers + 1)]
    owed = [0] * workers
    buffer = numpy.zeros(256, dtype=SCORE) if numpy is not None else bytearray(SCORE * 256)

    def take(w, wait):
        """Checks the scores worker `w + 1` has sent (waiting for one when `wait`)."""
        got = back[w].recv_batch(buffer) if wait else back[w].try_recv_batch(buffer)
        for k in range(got):
            if numpy is not None:
                event_id, value = int(buffer["id"][k]), float(buffer["score"][k])
            else:
                event_id, value = struct.unpack_from("<Qd", buffer, k * SCORE)
            if value != score(event_id):
                sys.exit(f"worker {w + 1}: event {event_id} scored {value}")
        owed[w] -= got
        return got

    checked = 0
    for start in range(0, EVENTS, BATCH):
        w = (start // BATCH) % workers
        batch = events(start, BATCH)
        sent = 0
        # A worker whose scores are not taken stops taking events: take them while its events
        # do not all fit.
        while sent < BATCH:
            went = out[w].try_send_batch(batch[sent:] if numpy is not None else batch[sent * EVENT :])
            owed[w] += went
            sent += went
            if sent < BATCH:
                checked += take(w, False)
    for w in range(workers):
        while owed[w] > 0:
            checked += take(w, True)
    print(f"rank 0: {checked} events to {workers} workers, every score checked", flush=True)


def worker(session):
    workers = session.world_size - 1
    rank = session.rank
    events_in = session.channel_from(0, 1, EVENT)
    scores = session.channel_to(0, 2, SCORE, capacity=4096)
    mine = sum(1 for start in range(0, EVENTS, BATCH) if (start // BATCH) % workers == rank - 1) * BATCH
    buffer = numpy.zeros(256, dtype=EVENT) if numpy is not None else bytearray(EVENT * 256)
    while mine > 0:
        got = events_in.recv_batch(buffer)
        if numpy is not None:
            batch = buffer[:got]
            sign = numpy.where(batch["side"] == 1, 1.0, -1.0)
            out = numpy.zeros(got, dtype=SCORE)
            out["id"] = batch["id"]
            out["score"] = batch["price"] * batch["size"] * sign
        else:
            out = b""
            for k in range(got):
                event_id, price, size, side, = struct.unpack_from("<QdIB3x", buffer, k * EVENT)
                out += struct.pack("<Qd", event_id, price * size * (1 if side else -1))
        scores.send_batch(out)
        mine -= got


def main():
    with shmbroker.connect(timeout=30) as session:
        if session.world_size < 2:
            sys.exit("run with 2 ranks or more")
        if session.rank == 0:
            reader(session)
        else:
            worker(session)
        session.barrier()


if __name__ == "__main__":
    main()
