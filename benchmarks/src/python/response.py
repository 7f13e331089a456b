"""response_wait in Python: the MindIE loop of issue 45 on a split session, the contender
`bench farm` (response_wait_python) runs in two modes side by side.

    bench run -n WORLD -- python response.py MODE BATCHES WARMUP BYTES SLOW_MS

As `capi/response.c`, line for line: rank 0 splits its session; its main thread broadcasts
BATCHES batches of BYTES bytes on the Sender (``unpaced``: batch after batch; ``paced``: batch
n + 1 once every reply to batch n is in) while a response thread takes replies on the Receiver.
Rank 1 spends SLOW_MS ms on every batch. Each reply carries its batch number, a checksum
(checked) and when it was sent (``time.monotonic_ns``, CLOCK_MONOTONIC); rank 0 prints
``response_sample NS`` for each fast worker's reply past the first WARMUP batches.
"""

import struct
import sys
import threading
import time

import shmbroker

REPLY = struct.Struct("<IIQ")


def batch(batch_id, size):
    block = bytes((batch_id * 13 + i) % 256 for i in range(size // 4096 + 1))
    data = bytearray(b"".join(bytes([b]) * 4096 for b in block)[:size])
    data[:4] = struct.pack("<I", batch_id)
    return data


def checksum(data):
    total = 0
    for byte in data[::997]:
        total = (total * 31 + byte) & 0xFFFFFFFF
    return total


def scheduler(session, mode, batches, warmup, size):
    world = session.world_size
    datas = [batch(n, size) for n in range(batches)]
    sums = [checksum(d) for d in datas]
    sender, receiver = session.split()
    answered = [0]
    cond = threading.Condition()
    samples = []
    failed = []

    def responses():
        try:
            count = [0] * batches
            following = [0] * world
            for _ in range(batches * (world - 1)):
                sender_rank, reply = receiver.recv_any()
                taken = time.monotonic_ns()
                batch_id, total, sent = REPLY.unpack(reply)
                if batch_id != following[sender_rank] or total != sums[batch_id]:
                    raise RuntimeError(f"a wrong reply from rank {sender_rank}: batch {batch_id}")
                following[sender_rank] += 1
                if sender_rank != 1 and batch_id >= warmup:
                    samples.append(taken - sent)
                count[batch_id] += 1
                if count[batch_id] == world - 1:
                    with cond:
                        while answered[0] < batches and count[answered[0]] == world - 1:
                            answered[0] += 1
                        cond.notify()
        except BaseException as error:  # handed to the main thread
            failed.append(error)
            with cond:
                answered[0] = batches
                cond.notify()

    thread = threading.Thread(target=responses)
    thread.start()
    for batch_id in range(batches):
        if mode == "paced":
            with cond:
                cond.wait_for(lambda: answered[0] >= batch_id)
        if failed:
            break
        sender.broadcast(datas[batch_id])
    thread.join()
    if failed:
        raise failed[0]
    print("\n".join(f"response_sample {sample}" for sample in samples), flush=True)
    return sender.rejoin(receiver)


def worker(session, batches, size, slow_ms):
    for batch_id in range(batches):
        data = session.broadcast(0)
        got = struct.unpack_from("<I", data)[0]
        if got != batch_id:
            raise RuntimeError(f"batch {got} came out of order (expected {batch_id})")
        total = checksum(data)
        if session.rank == 1 and slow_ms:
            time.sleep(slow_ms / 1000)
        session.send(0, REPLY.pack(batch_id, total, time.monotonic_ns()))


if __name__ == "__main__":
    mode, batches, warmup, size, slow_ms = sys.argv[1], *map(int, sys.argv[2:6])
    if mode not in ("paced", "unpaced") or warmup >= batches or size < 8:
        sys.exit("usage: response.py paced|unpaced BATCHES WARMUP BYTES SLOW_MS")
    session = shmbroker.connect(timeout=30)
    if session.world_size < 3:
        sys.exit("run with 3 ranks or more (a slow worker and a fast one)")
    if session.rank == 0:
        session = scheduler(session, mode, batches, warmup, size)
    else:
        worker(session, batches, size, slow_ms)
    session.barrier()
    session.close()
