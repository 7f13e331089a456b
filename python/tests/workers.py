"""The worker side of the tests: `shmbroker run -n N -- python workers.py SCENARIO [ARGS]`.

Each scenario runs in every copy, checks what it sees with `check` (which exits 1, so the
launcher fails the job), and prints `OK <scenario> rank <r>` on success; some print other lines
the test then looks for. Every call has a deadline well inside the launcher's `--timeout`.
"""

import array
import os
import pickle
import signal
import struct
import sys
import threading
import time

import shmbroker

SIZES = [0, 1, 47, 48, 49, 4096, 4097, 65536, 65537, 1 << 20, 4 << 20]


def check(condition, what):
    if not condition:
        print(f"FAILED: {what}", file=sys.stderr, flush=True)
        sys.exit(1)


def say(*words):
    print(*words, flush=True)


def pattern(rank, size, salt=0):
    """`size` bytes that differ between ranks, sizes and salts."""
    period = bytes((rank * 31 + salt * 7 + size + i) % 251 for i in range(251))
    return (period * (size // 251 + 1))[:size]


def raises(kind, call):
    """The exception `call` raises, which must be a `kind`."""
    try:
        call()
    except kind as error:
        return error
    except BaseException as error:  # noqa: BLE001 - reported, then the job fails
        check(False, f"expected {kind.__name__}, got {type(error).__name__}: {error}")
    check(False, f"expected {kind.__name__}, nothing was raised")


def as_kind(kind, data):
    """`data` as an object of another buffer type, with the same bytes."""
    if kind == "bytes":
        return bytes(data)
    if kind == "bytearray":
        return bytearray(data)
    if kind == "memoryview":
        return memoryview(bytearray(data))
    if kind == "memoryview-slice":  # a contiguous window into a larger object
        return memoryview(b"head" + data + b"tail")[4 : 4 + len(data)]
    if kind == "array":  # elements larger than a byte
        if len(data) % 4:
            return array.array("B", data)
        return array.array("i", data)
    if kind == "numpy":
        import numpy

        return numpy.frombuffer(data, dtype=numpy.uint8).copy()
    raise ValueError(kind)


def collectives(session, kinds):
    """Every operation, at every size, with every kind of buffer."""
    rank, world = session.rank, session.world_size
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    for kind in kinds:
        for size in SIZES:
            mine = pattern(rank, size)
            session.barrier()
            gathered = session.all_gather(as_kind(kind, mine))
            check(isinstance(gathered, list), "all_gather returns a list")
            check(all(type(part) is bytes for part in gathered), "all_gather gives bytes")
            check(
                gathered == [pattern(r, size) for r in range(world)],
                f"all_gather of {size} B as {kind}",
            )
            for root in range(world):
                data = as_kind(kind, pattern(root, size, salt=1)) if rank == root else None
                got = session.broadcast(root, data)
                check(type(got) is bytes, "broadcast gives bytes")
                check(got == pattern(root, size, salt=1), f"broadcast of {size} B from {root}")
            # Around the ring; rank 0 sends first, the others receive first, so that a send
            # larger than the outbox (which returns once its receiver is receiving) cannot wait
            # on a receiver that is itself sending.
            message = as_kind(kind, pattern(rank, size, salt=2))
            if rank == 0:
                session.send(nxt, message)
                got = session.recv(prev)
            else:
                got = session.recv(prev)
                session.send(nxt, message)
            check(type(got) is bytes, "recv gives bytes")
            check(got == pattern(prev, size, salt=2), f"send/recv of {size} B as {kind}")
    # Ranks may all-gather different lengths.
    gathered = session.all_gather(b"x" * rank)
    check(gathered == [b"x" * r for r in range(world)], "all_gather of different lengths")


def scenario_collectives(session, args):
    kinds = ["bytes", "bytearray", "memoryview", "memoryview-slice", "array"]
    collectives(session, kinds)


def scenario_numpy(session, args):
    import numpy

    rank, world = session.rank, session.world_size
    collectives(session, ["numpy"])
    # A 2-D float array, and a read-only one, come back as the bytes of the array.
    matrix = numpy.arange(12, dtype=numpy.float64).reshape(3, 4) * (rank + 1)
    gathered = session.all_gather(matrix)
    for r, part in enumerate(gathered):
        got = numpy.frombuffer(part, dtype=numpy.float64).reshape(3, 4)
        check((got == numpy.arange(12).reshape(3, 4) * (r + 1)).all(), "2-D float all_gather")
    frozen = numpy.full(100_000, rank, dtype=numpy.int32)
    frozen.setflags(write=False)
    gathered = session.all_gather(frozen)
    check(
        all((numpy.frombuffer(p, dtype=numpy.int32) == r).all() for r, p in enumerate(gathered)),
        "read-only array all_gather",
    )
    # Not C-contiguous: refused on this rank before anything is sent, naming what to do.
    for bad in (matrix[:, ::2], numpy.asfortranarray(matrix)):
        error = raises(shmbroker.MisuseError, lambda: session.all_gather(bad))
        check(isinstance(error, ValueError), "MisuseError is a ValueError")
        check("C-contiguous" in str(error) and "ndarray" in str(error), str(error))
    session.barrier()


def scenario_reductions(session, args):
    import array

    rank, world = session.rank, session.world_size
    # Sums of floats in place, small (one shot) and large (two shots), as array.array.
    for count in (5, 100_000):
        data = array.array("f", [float(i % 11 + rank) for i in range(count)])
        session.all_reduce(data)
        want = [float(world * (i % 11) + world * (world - 1) // 2) for i in range(count)]
        check(data.tolist() == want, f"all_reduce sum of {count} float32")
    # The type comes from the buffer: int64 maxima at a root, others unchanged.
    data = array.array("q", [rank * 10, -rank])
    session.reduce(world - 1, data, "max")
    want = [(world - 1) * 10, 0] if rank == world - 1 else [rank * 10, -rank]
    check(data.tolist() == want, f"reduce max int64 gave {data.tolist()}")
    # Rank r keeps block r of a bitwise or of every rank's blocks.
    blocks = array.array("i", [1 << rank] * (2 * world))
    mine = array.array("i", [0, 0])
    session.reduce_scatter(blocks, mine, "bit_or")
    check(mine.tolist() == [(1 << world) - 1] * 2, f"reduce_scatter bit_or gave {mine.tolist()}")
    # An operation the type lacks, an unknown name, a buffer of no known type: MisuseError.
    floats = array.array("d", [1.0])
    raises(shmbroker.MisuseError, lambda: session.all_reduce(floats, "bit_xor"))
    raises(shmbroker.MisuseError, lambda: session.all_reduce(floats, "median"))
    raises(shmbroker.MisuseError, lambda: session.all_reduce(bytearray(4), "avg"))
    # bfloat16 has no buffer format: dtype= says what the bytes are (1.5 in bfloat16 is 0x3fc0).
    halves = bytearray(b"\xc0\x3f" * 4)
    session.all_reduce(halves, "sum", dtype="bfloat16")
    check(bytes(halves) == b"\x40\x40" * 4, f"bfloat16 sums gave {bytes(halves)!r}")  # 3.0
    # Scatter and all-to-all of bytes.
    out = bytearray(3)
    source = bytes(range(3 * world)) if rank == 0 else None
    session.scatter(0, source, out)
    check(bytes(out) == bytes(range(3 * rank, 3 * rank + 3)), "scatter")
    outgoing = bytes(rank * 16 + to for to in range(world))
    incoming = bytearray(world)
    session.all_to_all(outgoing, incoming)
    check(bytes(incoming) == bytes(src * 16 + rank for src in range(world)), "all_to_all")
    # Rank r sends r + q + 1 bytes to rank q.
    sends = [rank + q + 1 for q in range(world)]
    receives = [q + rank + 1 for q in range(world)]
    outgoing = b"".join(bytes([rank * 16 + q]) * sends[q] for q in range(world))
    incoming = bytearray(sum(receives))
    session.all_to_all_v(outgoing, sends, incoming, receives)
    want = b"".join(bytes([q * 16 + rank]) * receives[q] for q in range(world))
    check(bytes(incoming) == want, "all_to_all_v")
    raises(shmbroker.MisuseError, lambda: session.all_to_all_v(outgoing, sends[:1], incoming, receives))
    try:
        import numpy
    except ImportError:
        return
    grads = numpy.full(300_000, rank + 1, dtype=numpy.float32)
    session.all_reduce(grads, "avg")
    check((grads == (world + 1) / 2).all(), "numpy float32 avg")


def scenario_groups(session, args):
    import array

    rank, world = session.rank, session.world_size
    # Even and odd ranks (disjoint), and the world numbered backwards (overlapping both).
    parity = session.group([q for q in range(world) if q % 2 == rank % 2])
    backwards = session.group(list(reversed(range(world))))
    check(parity.ranks == [q for q in range(world) if q % 2 == rank % 2], "parity ranks")
    check(backwards.rank == world - 1 - rank and backwards.world_rank(0) == world - 1, "numbering")
    for group in (parity, backwards, parity):
        members = group.ranks
        data = array.array("q", [rank, 1])
        session.all_reduce(data, group=group)
        check(data.tolist() == [sum(members), len(members)], f"all_reduce on {members}")
        session.barrier(group=group)
        parts = session.all_gather(b"%d" % rank, group=group)
        check(parts == [b"%d" % q for q in members], f"all_gather on {members}")
        got = session.broadcast(0, b"from %d" % rank if group.rank == 0 else None, group=group)
        check(got == b"from %d" % members[0], f"broadcast on {members}")
        out = bytearray(1)
        source = bytes(range(group.size)) if group.rank == 0 else None
        session.scatter(0, source, out, group=group)
        check(out[0] == group.rank, f"scatter on {members}")
        incoming = bytearray(group.size)
        session.all_to_all(bytes([group.rank] * group.size), incoming, group=group)
        check(list(incoming) == list(range(group.size)), f"all_to_all on {members}")
        total = array.array("i", [rank])
        session.reduce(0, total, "sum", group=group)
        check(group.rank != 0 or total[0] == sum(members), f"reduce on {members}")
    raises(shmbroker.MisuseError, lambda: session.group([(rank + 1) % world]))
    # The last rank dies; the others are told, shrink, and sum among themselves. (The launcher
    # stops the other copies once one is killed, SIGKILL 3 s after SIGTERM: they finish first.)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    session.barrier()
    if rank == world - 1:
        os.kill(os.getpid(), 9)
    data = array.array("d", [1.0] * 1000)
    try:
        session.all_reduce(data)
        check(False, "all_reduce after a death succeeded")
    except shmbroker.PeerLost as error:
        check(error.rank == world - 1, f"PeerLost named {error.rank}")
    survivors = session.shrink()
    check(survivors.ranks == list(range(world - 1)), f"shrink gave {survivors.ranks}")
    data = array.array("d", [float(rank)] * 1000)
    session.all_reduce(data, group=survivors)
    check(data[0] == sum(range(world - 1)), f"sum on the survivors gave {data[0]}")


def scenario_group_mismatch(session, args):
    rank = session.rank
    ranks = [0, 2, 1] if rank == 2 else [0, 1, 2]
    try:
        session.group(ranks)
        check(False, "a group of disagreeing members was made")
    except shmbroker.ProtocolError as error:
        say(f"MISMATCH {error.rank}")


def scenario_receives(session, args):
    """recv_into, recv_any(_into), try_recv(_any) and probe: rank 0 takes what every other rank
    sends, in whatever order it comes, and a message too long for its buffer is kept."""
    rank, world = session.rank, session.world_size
    sizes = [0, 1, 48, 4097, 65537, 1 << 20]
    if rank != 0:
        for size in sizes:
            session.send(0, pattern(rank, size))
        session.barrier()
        session.send(0, pattern(rank, 300, salt=1))
        session.barrier()
        # Nothing more comes from rank 0 until the last barrier: try_recv finds nothing.
        check(session.try_recv(0) is None, "try_recv with nothing sent")
        session.barrier()
        session.send(0, pattern(rank, 5000, salt=2))
        session.barrier()
        return
    # recv_any: every message, in order per sender, whatever order the senders come in.
    taken = {r: 0 for r in range(1, world)}
    for _ in range(len(sizes) * (world - 1)):
        sender, data = session.recv_any()
        check(data == pattern(sender, sizes[taken[sender]]), f"recv_any from {sender}")
        taken[sender] += 1
    session.barrier()
    # recv_into a short buffer: BufferTooSmall, kept; probe sizes it; recv_into gets it whole.
    for sender in range(1, world):
        short = bytearray(100)
        error = raises(shmbroker.BufferTooSmall, lambda: session.recv_into(sender, short))
        check((error.rank, error.needed) == (sender, 300), f"too small: {error}")
        check(isinstance(error, shmbroker.MisuseError), "BufferTooSmall is a MisuseError")
        check(session.probe(sender) == 300, "probe")
        whole = bytearray(1000)
        got = session.recv_into(sender, whole)
        check(bytes(whole[:got]) == pattern(sender, 300, salt=1), "recv_into after a refusal")
    session.barrier()
    check(session.try_recv_any() is None, "try_recv_any with nothing sent")
    session.barrier()
    # recv_any_into a short buffer, then into a large enough one (a memoryview of an array).
    buffer = array.array("B", bytes(10))
    error = raises(shmbroker.BufferTooSmall, lambda: session.recv_any_into(buffer))
    check(error.needed == 5000, f"recv_any_into too small: {error}")
    first = session.recv(error.rank)
    check(first == pattern(error.rank, 5000, salt=2), "the kept message, by recv")
    large = array.array("B", bytes(8192))
    for _ in range(world - 2):
        sender, got = session.recv_any_into(memoryview(large))
        check(bytes(large[:got]) == pattern(sender, 5000, salt=2), "recv_any_into")
    # Nothing left: try_recv_any says None without waiting.
    started = time.monotonic()
    check(session.try_recv_any() is None, "try_recv_any when all is taken")
    check(time.monotonic() - started < 1.0, "try_recv_any waited")
    # A bytes object cannot be written into.
    raises(BufferError, lambda: session.recv_into(1, b"read-only"))
    session.barrier()


def scenario_arguments(session, args):
    """Bad arguments raise on this rank, before anything is sent, and leave the session usable."""
    rank, world = session.rank, session.world_size
    peer = (rank + 1) % world
    error = raises(shmbroker.MisuseError, lambda: session.send(peer, memoryview(b"abcdef")[::2]))
    check("C-contiguous" in str(error), str(error))
    raises(TypeError, lambda: session.send(peer, "text"))
    raises(TypeError, lambda: session.all_gather(12))
    error = raises(shmbroker.MisuseError, lambda: session.send(rank, b"x"))
    check(f"rank {rank}" in str(error), str(error))
    error = raises(shmbroker.MisuseError, lambda: session.recv(world + 3))
    check(f"rank {world + 3}" in str(error) and isinstance(error, ValueError), str(error))
    error = raises(shmbroker.MisuseError, lambda: session.send(-1, b"x"))
    check("rank -1" in str(error), str(error))
    error = raises(shmbroker.MisuseError, lambda: session.broadcast(rank))
    check("root" in str(error), str(error))
    raises(shmbroker.MisuseError, lambda: session.broadcast(world))
    error = raises(shmbroker.MisuseError, lambda: session.exchange_fds(987654))
    check("fd 987654" in str(error), str(error))
    for timeout in (0, -1.0, float("nan"), "soon"):
        raises(shmbroker.MisuseError, lambda: session.barrier(timeout=timeout))
    # No deadline: None, or infinity.
    session.barrier(timeout=None)
    session.barrier(timeout=float("inf"))
    raises(shmbroker.MisuseError, lambda: shmbroker.connect(rank=0))
    # What a rank other than the root gives to broadcast is checked to be a buffer, not sent.
    raises(TypeError, lambda: session.broadcast(0, "text"))
    got = session.broadcast(0, b"from the root" if rank == 0 else bytearray(b"ignored"))
    check(got == b"from the root", f"broadcast gave {got!r}")
    # Still in step with the peers.
    session.barrier()
    check(session.all_gather(b"%d" % rank) == [b"%d" % r for r in range(world)], "after misuse")


def scenario_fds_exhausted(session, args):
    """Rank 1 has room for its own duplicates but not for rank 0's fds: both ranks fail, rank 1
    saying it is out of fds and rank 0 naming rank 1, and both go on in step."""
    import resource

    rank = session.rank
    mine = [os.memfd_create(f"many-{i}") for i in range(32)]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if rank == 1:
        highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1 + 40, hard))
    error = raises(shmbroker.ResourceError, lambda: session.exchange_fd_batch(mine))
    said = "no room for them" if rank == 1 else "rank 1 had no room for the fds of rank 0"
    check(said in str(error), f"rank {rank}: {error}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    # Nothing was left open by the failed call, and the ranks are in step.
    batches = session.exchange_fd_batch(mine[:2])
    check([len(b) for b in batches] == [2, 2], f"after the failure: {batches}")
    for fd in [fd for batch in batches for fd in batch] + mine:
        os.close(fd)
    session.barrier()


def scenario_fds(session, args):
    rank, world = session.rank, session.world_size
    content = lambda r: (b"rank %d " % r) * 1000  # noqa: E731
    fd = os.memfd_create(f"test-rank-{rank}")
    os.write(fd, content(rank))
    chosen = os.environ.get("SHMBROKER_FD_TRANSPORT", "auto")
    check(session.fd_transport() == (chosen, None), f"before: {session.fd_transport()}")
    fds = session.exchange_fds(fd)
    check(len(fds) == world and all(type(f) is int for f in fds), f"exchange_fds gave {fds}")
    # Under "auto", pidfd_getfd unless the kernel refuses it (Yama, a container): then relay.
    used = ("relay",) if chosen == "relay" else ("pidfd", "relay")
    check(session.fd_transport()[1] in used, f"after: {session.fd_transport()}")
    for r, imported in enumerate(fds):
        check(os.pread(imported, 100_000, 0) == content(r), f"content of rank {r}'s memfd")
    check(fds[rank] != fd, "this rank's own entry is a new fd")
    check(os.fstat(fds[rank]).st_ino == os.fstat(fd).st_ino, "a duplicate of the fd given")
    # The same file, not a copy: what rank 0 writes now, everyone reads through its fd.
    session.barrier()
    if rank == 0:
        os.pwrite(fd, b"changed", 0)
    session.barrier()
    check(os.pread(fds[0], 7, 0) == b"changed", "rank 0's memfd is shared, not copied")
    for imported in fds:
        os.close(imported)
    os.fstat(fd)  # closing every entry left `fd` open
    # An object with fileno(), and broadcast_fd.
    with os.fdopen(os.dup(fd), "rb") as file:
        fds = session.exchange_fds(file)
    for r, imported in enumerate(fds):
        expected = content(r) if r != 0 else b"changed" + content(0)[7:]
        check(os.pread(imported, 100_000, 0) == expected, "exchange_fds of a file object")
        os.close(imported)
    root = world - 1
    got = session.broadcast_fd(root, fd if rank == root else None)
    expected = (b"rank %d " % root)[:7] if root != 0 else b"changed"
    check(os.pread(got, 7, 0) == expected, "broadcast_fd content")
    os.close(got)
    # Batches: three memfds from every rank, then two from the root (the others give count=).
    mine = [os.memfd_create(f"batch-{rank}-{i}") for i in range(3)]
    for i, each in enumerate(mine):
        os.pwrite(each, b"%d.%d" % (rank, i), 0)
    batches = session.exchange_fd_batch(mine)
    check([len(b) for b in batches] == [3] * world, f"exchange_fd_batch gave {batches}")
    for r, batch in enumerate(batches):
        for i, imported in enumerate(batch):
            check(os.pread(imported, 3, 0) == b"%d.%d" % (r, i), f"batch fd {i} of rank {r}")
            os.close(imported)
    offered = mine[:2] if rank == root else None
    got = session.broadcast_fd_batch(root, offered, count=2)
    check([os.pread(g, 3, 0) for g in got] == [b"%d.0" % root, b"%d.1" % root], "batch bcast")
    for each in got + mine:
        os.close(each)
    # Off the root, fds are ignored (as broadcast_fd does) and count is needed: refused before
    # anything is sent. A generator of file objects is held for the whole call.
    if rank != root:
        raises(shmbroker.MisuseError, lambda: session.broadcast_fd_batch(root, [fd]))
    check(shmbroker.MAX_FDS_PER_EXCHANGE == 4096, f"{shmbroker.MAX_FDS_PER_EXCHANGE}")
    files = (os.fdopen(os.dup(fd), "rb") for _ in range(2))
    batches = session.exchange_fd_batch(files)
    for batch in batches:
        check(len(batch) == 2, f"a generator's batch: {batches}")
        for each in batch:
            os.close(each)
    os.close(fd)
    session.barrier()


def scenario_peer_lost(session, args):
    """Rank 2 is killed with SIGKILL; ranks 0 and 1 are told, naming it, and carry on."""
    # The launcher stops the other copies (SIGTERM, then SIGKILL 3 s later) once one is killed:
    # the survivors report first.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    check(session.timeout is None, f"connect(timeout=None) gave a deadline of {session.timeout}")
    rank = session.rank
    session.barrier()
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 0:  # waiting, with no deadline, when it happens: the death ends the wait
        error = raises(shmbroker.PeerLost, lambda: session.recv(2, timeout=None))
    else:  # calling afterwards; a barrier needs every rank
        time.sleep(0.2)
        error = raises(shmbroker.PeerLost, lambda: session.barrier(timeout=30))
    check(isinstance(error, shmbroker.Error), "PeerLost is an Error")
    # What rank 2 last published: the barrier it finished before it was killed.
    check(error.diagnosis and error.diagnosis[0].startswith("rank 2 was in no call (its last, barrier #0"),
          f"diagnosis {error.diagnosis}")
    check(error.diagnosis[0] in str(error), str(error))
    say(f"PEERLOST rank {error.rank}: {error}")
    # A collective needs every rank: every later one names rank 2 too. Messages between the
    # survivors go on.
    error = raises(shmbroker.PeerLost, lambda: session.barrier(timeout=30))
    check(error.rank == 2, f"later collectives name rank 2, not {error.rank}")
    error = raises(shmbroker.PeerLost, lambda: session.send(2, b"x", timeout=30))
    check(error.rank == 2, f"a send to rank 2 names it, not {error.rank}")
    if rank == 0:
        session.send(1, b"still here", timeout=30)
        check(session.recv(1, timeout=30) == b"and me", "rank 1 answered")
    else:
        check(session.recv(0, timeout=30) == b"still here", "rank 0 still talks to rank 1")
        session.send(0, b"and me", timeout=30)
    session.close()


def scenario_peer_left(session, args):
    """Rank 2 closes its session: calls that need it raise PeerLeft, the others go on."""
    rank = session.rank
    session.barrier()
    if rank == 2:
        # It gives up on rank 1 (which sends it nothing) before it leaves, and says so.
        raises(shmbroker.Timeout, lambda: session.recv(1, timeout=0.2))
        session.close()
        return
    # (Not a collective here: a barrier that finds rank 2 gone sometimes names rank 0 instead,
    # and leaves ranks 0 and 1 out of step; a library bug, reported.)
    error = raises(shmbroker.PeerLeft, lambda: session.recv(2, timeout=30))
    check((error.after, error.after_died) == (1, False), f"after {error.after} {error.after_died}")
    check("after timing out waiting for rank 1" in str(error), str(error))
    say(f"PEERLEFT rank {error.rank}: {error}")
    if rank == 0:
        session.send(1, b"still here")
        check(session.recv(1) == b"and me", "rank 1 answered")
    else:
        check(session.recv(0) == b"still here", "rank 0 still talks to rank 1")
        session.send(0, b"and me")


def scenario_timeout(session, args):
    rank = session.rank
    if rank == 0:
        error = raises(shmbroker.Timeout, lambda: session.recv(1, timeout=0.3))
        check(error.op == "recv" and error.waiting_for == [1], f"{error.op} {error.waiting_for}")
        check(abs(error.timeout - 0.3) < 1e-9 and "rank 1" in str(error), str(error))
        say(f"TIMEOUT {error.op} {error.waiting_for}: {error}")
        # A receive that timed out leaves the session usable.
        session.send(1, b"go")
        check(session.recv(1) == b"back", "after a timeout")
        # The session's own deadline applies when a call gives none (connect(timeout=...)).
        check(session.timeout == 5.0, f"session timeout {session.timeout}")
        error = raises(shmbroker.Timeout, lambda: session.barrier())
        check(error.op == "barrier" and error.waiting_for == [1], str(error))
        session.send(1, b"bye")
        # With no deadline, a wait lasts as long as the peer takes (it sleeps before it sends).
        check(session.recv(1, timeout=None) == b"late", "late")
    else:
        check(session.recv(0, timeout=30) == b"go", "go")
        session.send(0, b"back")
        check(session.recv(0, timeout=30) == b"bye", "bye")
        time.sleep(0.6)
        session.send(0, b"late")


def scenario_context(_, args):
    """The context manager closes the session, on an exception too; then calls raise Error."""
    rank = int(os.environ["SHMBROKER_RANK"])
    peer = 1 - rank
    try:
        with shmbroker.connect(timeout=30) as inner:
            check(isinstance(inner, shmbroker.Session) and not inner.closed, "open")
            inner.barrier()
            if rank == 1:
                raise KeyError("boom")
    except KeyError:
        check(rank == 1, "only rank 1 raises")
    check(inner.closed, "closed by the with block")
    for call in (
        inner.barrier,
        lambda: inner.all_gather(b"x"),
        lambda: inner.broadcast(0, b"x"),
        lambda: inner.send(peer, b"x"),
        lambda: inner.recv(peer),
        lambda: inner.exchange_fds(0),
        lambda: inner.broadcast_fd(0, 0),
    ):
        error = raises(shmbroker.Error, call)
        check(type(error) is shmbroker.Error and str(error) == "session is closed", str(error))
    inner.close()  # again: nothing happens
    check((inner.rank, inner.world_size) == (rank, 2), "rank and world size stay readable")
    check("closed" in repr(inner), repr(inner))
    say(f"CLOSED rank {rank}")


def scenario_gil(session, args):
    """Another thread keeps running Python while this one waits in recv."""
    rank = session.rank
    flag = os.path.join(args[0], "progress")
    if rank == 0:
        progress = []
        busy = []

        def helper():
            # Each step needs the GIL back: none is made while it is held by a wait.
            for step in range(50):
                time.sleep(0.01)
                progress.append(step)
            # The session is in the main thread's recv: told so at once, not made to wait.
            try:
                session.send(1, b"from the helper")
            except shmbroker.Error as error:
                busy.append(str(error))
            with open(flag, "w"):
                pass

        thread = threading.Thread(target=helper)
        thread.start()
        got = session.recv(1, timeout=20)
        thread.join(timeout=20)
        check(got == b"go" and len(progress) == 50, f"progress {len(progress)} while waiting")
        check(len(busy) == 1 and "busy" in busy[0], f"busy: {busy}")
        say("GIL released")
    else:
        deadline = time.monotonic() + 15
        while not os.path.exists(flag):
            check(time.monotonic() < deadline, "rank 0's other thread made no progress")
            time.sleep(0.01)
        session.send(0, b"go")


def scenario_mismatch(session, args):
    """Rank 0 calls barrier while rank 1 calls all_gather: each names the other."""
    rank = session.rank
    if rank == 0:
        error = raises(shmbroker.ProtocolError, lambda: session.barrier(timeout=10))
    else:
        error = raises(shmbroker.ProtocolError, lambda: session.all_gather(b"x", timeout=10))
    check(error.rank == 1 - rank, f"names rank {error.rank}")
    say(f"MISMATCH rank {error.rank}: {error}")


def scenario_fork(session, args):
    """A forked child can neither use nor end its parent's session."""
    rank = session.rank
    session.barrier()
    if rank == 0:
        pid = os.fork()
        if pid == 0:  # the child: report by exit status, never return into the test's code
            status = 1
            try:
                try:
                    session.barrier(timeout=1)
                except shmbroker.Error as error:
                    if type(error) is shmbroker.Error and "fork" in str(error):
                        status = 0
                session.close()  # closes the child's copy only
                status += 0 if session.closed else 2
                del session  # and so does dropping it
                import gc

                gc.collect()
            finally:
                os._exit(status)
        _, status = os.waitpid(pid, 0)
        check(os.waitstatus_to_exitcode(status) == 0, f"the child's status {status}")
    # The parent's session is intact: rank 1 never heard that rank 0 left.
    session.barrier()
    check(session.all_gather(b"%d" % rank) == [b"0", b"1"], "after the fork")
    if rank == 0:
        session.send(1, b"after the child")
    else:
        check(session.recv(0) == b"after the child", "a message after the child")


def scenario_solo(session, args):
    """A world of one."""
    check((session.rank, session.world_size) == (0, 1), "rank 0 of 1")
    session.barrier()
    check(session.all_gather(b"me") == [b"me"], "all_gather alone")
    check(session.broadcast(0, bytearray(b"me")) == b"me", "broadcast alone")
    fds = session.exchange_fds(0)
    check(len(fds) == 1, "exchange_fds alone")
    os.close(fds[0])


def scenario_interrupt(session, args):
    """SIGINT while rank 1 waits in recv: KeyboardInterrupt, within seconds."""
    rank = session.rank
    pids = [int(p) for p in session.all_gather(b"%d" % os.getpid())]
    waiting = os.path.join(args[0], "waiting")
    if rank == 1:

        def tell():
            time.sleep(0.5)  # by then the main thread is in recv
            with open(waiting, "w"):
                pass

        threading.Thread(target=tell, daemon=True).start()
        started = time.monotonic()
        try:
            session.recv(0, timeout=60)
        except KeyboardInterrupt:
            say(f"INTERRUPTED after {time.monotonic() - started:.1f} s")
            with open(os.path.join(args[0], "interrupted"), "w"):
                pass
            # Nothing was lost: the session goes on.
            check(session.recv(0, timeout=10) == b"after", "no message after the interrupt")
            say("RECEIVED after the interrupt")
            return
        check(False, "recv returned")
    else:
        deadline = time.monotonic() + 15
        while not os.path.exists(waiting):
            check(time.monotonic() < deadline, "rank 1 never waited")
            time.sleep(0.01)
        os.kill(pids[1], signal.SIGINT)
        # Open (and sending nothing) until rank 1 reports: a peer that left would end its recv
        # with PeerLeft, after which the pending SIGINT would raise KeyboardInterrupt anyway.
        interrupted = os.path.join(args[0], "interrupted")
        deadline = time.monotonic() + 10
        while not os.path.exists(interrupted):
            check(time.monotonic() < deadline, "rank 1 was not interrupted within 10 s")
            time.sleep(0.01)
        session.send(1, b"after")


def scenario_interrupt_send(session, args):
    """SIGINT while rank 1's large send is under way: the send returns (it is delivered, so a
    KeyboardInterrupt would make a program that retries send it twice); rank 1's next call raises
    KeyboardInterrupt before doing anything; the call after that finishes the message, which
    rank 0 receives once, whole."""
    rank = session.rank
    size = 64 << 20
    pids = [int(p) for p in session.all_gather(b"%d" % os.getpid())]
    sending, returned = (os.path.join(args[0], name) for name in ("sending", "returned"))
    if rank == 1:

        def tell():
            time.sleep(0.5)  # by then the main thread waits in send for rank 0 to read
            with open(sending, "w"):
                pass

        threading.Thread(target=tell, daemon=True).start()
        message = bytes(range(256)) * (size // 256)
        try:
            session.send(0, message, timeout=60)
        except KeyboardInterrupt:
            check(False, "the send that went out raised KeyboardInterrupt")
        say("SEND RETURNED")
        with open(returned, "w"):
            pass
        try:
            session.barrier(timeout=60)
            check(False, "the Ctrl-C was lost")
        except KeyboardInterrupt:
            say("NEXT CALL INTERRUPTED")
        session.barrier(timeout=60)
    else:
        wait_for_file(sending, "rank 1 sending")
        os.kill(pids[1], signal.SIGINT)
        wait_for_file(returned, "rank 1's send returned")
        got = session.recv(1, timeout=60)
        check(len(got) == size and got[:512] == bytes(range(256)) * 2, "the message, whole")
        check(got == bytes(range(256)) * (size // 256), "the message's bytes")
        session.barrier(timeout=60)
        check(session.try_recv(1) is None, "the message arrived twice")
        say("RECEIVED ONCE")


# Ctrl-C during large receives (`interrupt_receives`): the receiver's state, shared with the
# rank that sends it SIGINTs through a file both map. One int64 per field.
FIELDS = 9
CALLS, BUSY, MESSAGE, TYPICAL_US, SEEN, DONE, FIRED, FIRED_AT_NS, STOPPED = range(FIELDS)
RECEIVE_FORMS = (
    "recv",
    "recv_into",
    "recv_any",
    "recv_any_into",
    "try_recv",
    "try_recv_any",
    "recv_loan",
)


class Shared:
    """The fields above, in a file mapped by the receiver and the interrupter."""

    def __init__(self, path):
        import mmap

        with open(path, "r+b") as file:
            self.map = mmap.mmap(file.fileno(), 8 * FIELDS)

    def __getitem__(self, field):
        return struct.unpack_from("<q", self.map, 8 * field)[0]

    def __setitem__(self, field, value):
        struct.pack_into("<q", self.map, 8 * field, value)


def numbered(seq, size):
    """Message `seq` of `size` bytes: its number and size, then a block of 4099 bytes drawn
    from `seq`, repeated (4099 is prime, so a chunk landing at another offset shows)."""
    import random

    head = struct.pack("<QQ", seq, size)
    block = random.Random(seq).randbytes(4099)
    return head + (block * (size // 4099 + 1))[: size - len(head)]


def scenario_interrupt_receives(session, args):
    """Ctrl-C during large receives loses nothing (issue 42): rank 0 sends COUNT numbered
    messages of SIZE MiB (half that as loans); rank 1 takes them with one receive FORM,
    retrying on KeyboardInterrupt; rank 2 sends rank 1 a SIGINT at a random moment of the
    receive of each message. Every message must arrive exactly once, in order, every byte as
    sent, and every SIGINT must come out once."""
    directory, form, count = args[0], args[1], int(args[2])
    size = (int(args[3]) if len(args) > 3 else 64) << 20
    if form == "recv_loan":
        size //= 2  # a loan lives in the 64 MiB outbox
    check(form in RECEIVE_FORMS, f"a receive form: {form}")
    pids = [int(p) for p in session.all_gather(b"%d" % os.getpid())]
    path = os.path.join(directory, "state")
    if session.rank == 1:
        with open(path, "wb") as file:
            file.write(bytes(8 * FIELDS))
    session.barrier()
    if session.rank == 0:
        for seq in range(count):
            if form == "recv_loan":
                with session.loan(size, timeout=60) as loan:
                    loan.buffer[:] = numbered(seq, size)
                    session.send_loan(1, loan, timeout=60)
            else:
                session.send(1, numbered(seq, size), timeout=60)
    elif session.rank == 1:
        receive_interrupted(session, Shared(path), form, count, size)
    else:
        interrupt_receives(Shared(path), pids[1])
    session.barrier(timeout=60)


def receive_interrupted(session, shared, form, count, size):
    """Rank 1 of `interrupt_receives`. Its SIGINT handler raises KeyboardInterrupt as Python's
    does, but only within a receive (from just before the call to just after its result is
    stored), and not in Python's own window. A SIGINT that lands elsewhere (the interrupter saw
    the call just as it ended) is only counted, so that this loop's bookkeeping is never cut
    short.

    Python's own window: a SIGINT that comes after a call released it, in the microseconds
    before the interpreter stores the result, is raised there by Python, for any function. The
    handler tells it by two facts: it runs outside the call (the session is not busy, so no
    look of the call's own ran it), and the SIGINT was sent under a millisecond before. A
    receive that released a SIGINT held over its copy into ``bytes`` (the bug of issue 42)
    shows as one sent milliseconds before, and raises. (The try_* forms' polling loop counts
    there too a SIGINT that lands in its short sleep between two calls.)"""
    within = [False]
    raised, late, window = [0], [0], [0]

    def seen():
        shared[SEEN] = raised[0] + late[0] + window[0]

    def in_pythons_window():
        try:
            session.readiness_fd()
        except shmbroker.Error:
            return False  # busy: the call itself is looking for a SIGINT
        return time.monotonic_ns() - shared[FIRED_AT_NS] < 1_000_000

    def on_sigint(signum, frame):
        if within[0] and not in_pythons_window():
            raise KeyboardInterrupt
        if within[0]:
            window[0] += 1
        else:
            late[0] += 1
        seen()

    signal.signal(signal.SIGINT, on_sigint)
    buffer = bytearray(size)
    expected, lost, repeated, corrupted, typical = 0, 0, 0, 0, [0.0]
    history = []  # (message awaited, how the call ended, its milliseconds), for a failure

    def attempt(timeout=10):
        """One receive: the message it returned (as bytes), or None if it raised
        KeyboardInterrupt first. The call's duration goes to the interrupter."""
        got = None
        shared[MESSAGE] = expected
        shared[CALLS] = shared[CALLS] + 1
        shared[BUSY] = 1
        started = time.monotonic()
        within[0] = True
        try:
            if form == "recv":
                got = session.recv(0, timeout=timeout)
            elif form == "recv_into":
                got = session.recv_into(0, buffer, timeout=timeout)
            elif form == "recv_any":
                got = session.recv_any(timeout=timeout)
            elif form == "recv_any_into":
                got = session.recv_any_into(buffer, timeout=timeout)
            elif form == "try_recv":
                while got is None:
                    got = session.try_recv(0)
                    if got is None:
                        if time.monotonic() > started + timeout:
                            raise TimeoutError(form)
                        time.sleep(0.0005)
            elif form == "try_recv_any":
                while got is None:
                    got = session.try_recv_any()
                    if got is None:
                        if time.monotonic() > started + timeout:
                            raise TimeoutError(form)
                        time.sleep(0.0005)
            else:
                got = session.recv_loan(0, timeout=timeout)
            within[0] = False
        except KeyboardInterrupt:
            # Raised after `got` was stored too, on an interpreter that looks for signals
            # between any two bytecodes: then the message is in `got`, and counts.
            within[0] = False
            raised[0] += 1
            seen()
        within[0] = False
        shared[BUSY] = 0
        took = time.monotonic() - started
        history.append((expected, "raised" if got is None else "returned", round(took * 1e3)))
        if got is None:
            return None
        typical[0] = took if typical[0] == 0 else 0.8 * typical[0] + 0.2 * took
        shared[TYPICAL_US] = int(typical[0] * 1e6)
        if form in ("recv_any", "recv_any_into", "try_recv_any"):
            sender, got = got
            check(sender == 0, f"{form} from rank {sender}")
        if form in ("recv_into", "recv_any_into"):
            return bytes(memoryview(buffer)[:got])
        if form == "recv_loan":
            with got as view:
                return bytes(view.buffer)
        return got

    while expected < count:
        try:
            got = attempt()
        except (shmbroker.Timeout, TimeoutError):
            say(f"TIMEOUT waiting for message {expected} of {count}")
            lost += count - expected
            break
        if got is None:
            continue
        seq, length = struct.unpack_from("<QQ", got)
        if seq > expected:
            say(f"LOST messages {expected} to {seq - 1}; the last calls: {history[-6:]}")
            lost += seq - expected
        elif seq < expected:
            say(f"REPEATED message {seq}")
            repeated += 1
            continue
        if length != size or got != numbered(seq, size):
            say(f"CORRUPTED message {seq}")
            corrupted += 1
        expected = seq + 1
    # Every SIGINT the interrupter sent comes out: a deferred one at the next call.
    shared[DONE] = 1
    deadline = time.monotonic() + 20
    while not shared[STOPPED]:
        check(time.monotonic() < deadline, "the interrupter stopped")
        time.sleep(0.001)
    within[0] = True
    try:
        session.try_recv(0)
        within[0] = False
    except KeyboardInterrupt:
        within[0] = False
        raised[0] += 1
    within[0] = False
    for _ in range(20):
        time.sleep(0.005)
    fired = shared[FIRED]
    say(
        f"INTERRUPTS {form}: {fired} SIGINTs, {raised[0]} KeyboardInterrupts, {late[0]} after a "
        f"call, {window[0]} in Python's window; {count} messages of {size >> 20} MiB: {lost} lost, "
        f"{repeated} repeated, {corrupted} corrupted"
    )
    check(lost == 0 and repeated == 0 and corrupted == 0, "every message once, whole, in order")
    check(raised[0] + late[0] + window[0] == fired, "every SIGINT came out once")


def interrupt_receives(shared, pid):
    """Rank 2 of `interrupt_receives`: one SIGINT during the receive of each message, at a
    random moment of the call (uniform over the receiver's typical receive), the next only once
    the last came out."""
    import random

    chance = random.Random()
    fired, last = 0, -1
    while not shared[DONE]:
        call, message = shared[CALLS], shared[MESSAGE]
        if not shared[BUSY] or message == last or shared[SEEN] < fired:
            time.sleep(0.0005)
            continue
        typical = max(shared[TYPICAL_US], 1000) / 1e6
        time.sleep(chance.uniform(0, typical))
        if shared[CALLS] != call or not shared[BUSY]:
            continue
        shared[FIRED_AT_NS] = time.monotonic_ns()
        os.kill(pid, signal.SIGINT)
        fired += 1
        last = message
        shared[FIRED] = fired
    shared[FIRED] = fired
    shared[STOPPED] = 1

def scenario_logs(session, _):
    """The library's log events reach logging's logger "shmbroker" (here: how fds moved, under
    SHMBROKER_FD_TRANSPORT=relay), with the module that logged them."""
    import logging

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    logger = logging.getLogger("shmbroker")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    fd = os.memfd_create("logs")
    for imported in session.exchange_fds(fd):
        os.close(imported)
    deadline = time.monotonic() + 10
    wanted = [r for r in records if "fd transport: relay" in r.getMessage()]
    while not wanted:
        check(time.monotonic() < deadline, f"no fd transport record within 10 s: {records}")
        time.sleep(0.01)
        wanted = [r for r in records if "fd transport: relay" in r.getMessage()]
    record = wanted[0]
    check(record.levelno == logging.INFO, f"level {record.levelname}")
    check(record.shmbroker_target == "shmbroker::session::fds", record.shmbroker_target)
    check(f"rank={session.rank}" in record.getMessage(), record.getMessage())
    say(f"LOGGED {record.getMessage()}")


def scenario_gpu_handles(session, _):
    """GPU handles with their fds (host memfds stand in for device memory), a handle kind with
    no fd (bytes only), a broadcast, and misuse: an fd against the kind, a missing fd."""
    rank, world = session.rank, session.world_size
    fd = os.memfd_create(f"gpu-{rank}")
    os.write(fd, b"memory of rank %d" % rank)
    own = shmbroker.GpuHandle(
        "host_memfd", size=16, device_uuid=bytes([rank]) * 16, buffer_id=100 + rank
    )
    check(own.carries_fd, "a memfd handle carries its fd")
    gathered = session.all_gather_gpu_handles(own, fd)
    check(len(gathered) == world, f"{len(gathered)} handles")
    for peer, (handle, theirs) in enumerate(gathered):
        check(handle.kind == "host_memfd" and handle.buffer_id == 100 + peer, repr(handle))
        check(handle.device_uuid == bytes([peer]) * 16, repr(handle))
        check(os.pread(theirs, 64, 0) == b"memory of rank %d" % peer, f"rank {peer}'s memory")
        os.close(theirs)
    # Legacy CUDA IPC: 64 opaque bytes and no fd.
    ipc = shmbroker.GpuHandle("cuda_ipc_memory", size=1 << 20, handle=bytes([rank + 1]) * 64)
    gathered = session.all_gather_gpu_handles(ipc)
    check([h.handle for h, _ in gathered] == [bytes([p + 1]) * 64 for p in range(world)], "ipc")
    check(all(f is None for _, f in gathered), "no fds for cuda_ipc_memory")
    got, got_fd = session.broadcast_gpu_handle(
        1, own if rank == 1 else None, fd if rank == 1 else None
    )
    check(got.buffer_id == 101 and os.pread(got_fd, 64, 0) == b"memory of rank 1", repr(got))
    os.close(got_fd)
    raises(shmbroker.MisuseError, lambda: session.all_gather_gpu_handles(ipc, fd))
    raises(shmbroker.MisuseError, lambda: session.all_gather_gpu_handles(own))
    raises(shmbroker.MisuseError, lambda: session.all_gather_gpu_handles(b"not a handle"))
    raises(ValueError, lambda: shmbroker.GpuHandle("cuda", size=1))
    # Still in step with the peers after the misuse.
    session.barrier()


def scenario_loans(session, _):
    """Loans by reference: send_loan/recv_loan in a loop (the buffers come back, or the outbox
    would fill), broadcast_loan, misuse, and a slice kept past its view and its session, which
    must read without faulting (the mapping is pinned)."""
    rank = session.rank
    pattern = lambda i: bytes((i + j) % 251 for j in range(256)) * 4096  # noqa: E731 (1 MiB)
    for i in range(40):
        if rank == 0:
            with session.loan(len(pattern(i))) as loan:
                buffer = loan.buffer
                check(not buffer.readonly and buffer.format == "B", "a writable byte buffer")
                buffer[:] = pattern(i)
                session.send_loan(1, loan)
                raises(shmbroker.MisuseError, lambda: loan.buffer)
                raises(ValueError, lambda: buffer[0])  # released with the loan
                raises(shmbroker.MisuseError, lambda: session.send_loan(1, loan))
        elif rank == 1:
            with session.recv_loan(0) as view:
                check(view.owner == 0 and len(view) == len(pattern(i)), repr(view))
                check(view.buffer.readonly, "a view is read-only")
                check(view.buffer == pattern(i), f"loan {i}'s bytes")
            raises(shmbroker.MisuseError, lambda: view.buffer)
    # A plain message where a loan is expected stays queued for recv.
    if rank == 0:
        session.send(1, b"plain")
    elif rank == 1:
        raises(shmbroker.MisuseError, lambda: session.recv_loan(0))
        check(session.recv(0) == b"plain", "the plain message stayed queued")
    # Rank 2 lends to every other rank.
    if rank == 2:
        loan = session.loan(4096)
        loan.buffer[:] = b"x" * 4096
        check(session.broadcast_loan(2, loan) is None, "the root gets no view")
        kept = None
    else:
        view = session.broadcast_loan(2)
        check(view.owner == 2 and view.buffer == b"x" * 4096, "the broadcast loan")
        kept = view.buffer[0:16]  # a slice outlives its view
        view.release()
    if rank == 2:
        raises(shmbroker.MisuseError, lambda: session.broadcast_loan(2))  # the root's loan
    else:
        raises(shmbroker.MisuseError, lambda: session.broadcast_loan(2, session.loan(8)))
    session.barrier()
    session.close()
    if kept is not None:
        len(bytes(kept))  # reads pinned memory: never a fault, whatever it holds now
        say("PINNED slice read after close")


def scenario_symmetric(session, _):
    """Symmetric buffers: an all-reduce of a float view of session.symmetric()'s buffer is read
    in place by the peers (every piece counted), beside rank 1, which sums from a bytearray; the
    results are checked every round, after the buffer is rewritten at once."""
    import struct

    rank, world = session.rank, session.world_size
    count = (1 << 20) + 3  # 4 MiB and 12 bytes of f32: five pieces of at most 1 MiB
    with session.symmetric(4 * count) as loan:
        check(bytes(loan.buffer[:64]) == bytes(64), "a symmetric buffer starts zeroed")
        plain = bytearray(4 * count)
        data = memoryview(plain).cast("f") if rank == 1 else loan.buffer.cast("f")
        for round in range(3):
            values = [float((i + round) % 9 + rank) for i in range(count)]
            struct.pack_into(f"{count}f", data.cast("B"), 0, *values)
            before = session.reductions_read_in_place()
            session.all_reduce(data, "sum")
            read = session.reductions_read_in_place() - before
            check(read == (0 if rank == 1 else 5), f"round {round}: {read} pieces read in place")
            ranks = world * (world - 1) // 2
            want = [float(world * ((i + round) % 9) + ranks) for i in range(count)]
            check(data.tolist() == want, f"round {round}: the sums")
        data.release()
    say("SYMMETRIC", session.reductions_read_in_place())


def scenario_stuck_idle(session, _):
    """Who is where: rank 2 idles outside any call while ranks 0 and 1 wait in a barrier; their
    timeouts say so, from what rank 2 publishes."""
    import numpy as np

    session.all_reduce(np.ones(4, np.float32))
    if session.rank == 2:
        time.sleep(2.0)  # in no call
        session.barrier(timeout=30)  # the others' parts are there: it completes
        for peer in (0, 1):
            session.send(peer, b"done")
        return
    error = raises(shmbroker.Timeout, lambda: session.barrier(timeout=1))
    check(error.waiting_for == [2], f"waiting for {error.waiting_for}")
    check(len(error.diagnosis) == 1, f"diagnosis {error.diagnosis}")
    idle = error.diagnosis[0]
    check(idle.startswith("rank 2 is in no call (its last, all_reduce #0, finished "), idle)
    check(idle in str(error), str(error))
    say(f"IDLE {idle}")
    # Stay until rank 2 is through its barrier (a rank that left would end it).
    check(session.recv(2, timeout=30) == b"done", "rank 2 done")


def scenario_stuck_recv(session, _):
    """Rank 2 waits in a recv from rank 1 while ranks 0 and 1 wait in a barrier for rank 2: their
    timeouts say rank 2 is in recv from rank 1."""
    if session.rank == 2:
        check(session.recv(1, timeout=30) == b"go", "rank 1's word")
        return
    error = raises(shmbroker.Timeout, lambda: session.barrier(timeout=1.5))
    busy = error.diagnosis[0]
    check(busy.startswith("rank 2 is in recv from rank 1 for "), busy)
    say(f"BUSY {busy}")
    # Rank 2 may leave once both have timed out (a rank that left would end rank 0's barrier
    # with PeerLeft instead): rank 0 tells rank 1, which releases rank 2.
    if session.rank == 0:
        session.send(1, b"seen")
    else:
        check(session.recv(0, timeout=30) == b"seen", "rank 0 timed out too")
        session.send(2, b"go")


def scenario_status(session, _):
    """shmbroker.status(): rank 0 asks the broker while ranks 1 and 2 wait for it in a barrier."""
    session.barrier()
    if session.rank == 0:
        deadline = time.monotonic() + 20
        while True:
            ranks = shmbroker.status()
            check(len(ranks) == 3 and [r["rank"] for r in ranks] == [0, 1, 2], str(ranks))
            waiting = [r for r in ranks[1:] if r["call"] == "barrier #1"]
            if len(waiting) == 2:
                break
            check(time.monotonic() < deadline, f"ranks 1 and 2 in barrier #1: {ranks}")
            time.sleep(0.01)
        for r in ranks:
            check(r["state"] == "running" and r["readable"] and r["outbox_bytes"] > 0, str(r))
            check(r["last_call"] == "barrier #0" and r["last_failed"] is False, str(r))
            check(r["last_failed_naming"] is None, str(r))
        check(ranks[1]["seconds"] >= 0 and ranks[0]["call"] is None, str(ranks))
        raises(shmbroker.LogonError, lambda: shmbroker.status("/nonexistent/socket", timeout=0.2))
        say(f"STATUS {ranks[1]['call']} {ranks[1]['state']}")
    session.barrier()


def scenario_mismatch_waiting(session, args):
    """Rank 0 calls broadcast (root 1) and rank 1 gather (root 1), with no deadline: each waits
    for the other, and both raise ProtocolError naming both calls well before any deadline."""
    session.barrier()
    started = time.monotonic()
    if session.rank == 0:
        error = raises(shmbroker.ProtocolError, lambda: session.broadcast(1, timeout=None))
        expected = "rank 1 called gather #1 while this rank called broadcast #1"
    else:
        error = raises(shmbroker.ProtocolError, lambda: session.gather(1, b"mine", timeout=None))
        expected = "rank 0 called broadcast #1 while this rank called gather #1"
    check(str(error) == expected and error.rank == 1 - session.rank, f"{error!r}")
    check(time.monotonic() - started < 20, "seen long after it happened")
    say(f"MISMATCH {error}")
    # Stay, making no other call, until both have seen it (see the guide's liveness chapter).
    mine, other = (os.path.join(args[0], f"seen-{r}") for r in (session.rank, 1 - session.rank))
    open(mine, "w").close()
    wait_for_file(other, "the other rank saw it")


def scenario_gave_up(session, args):
    """Rank 1 gives a two-shot all-reduce up after 100 ms, waiting for rank 2, which comes at
    500 ms; ranks 0 and 2, with no deadline, then wait for rank 1's result slice, and raise
    PeerGaveUp naming rank 1 (and, as its word, rank 2) well before any deadline."""
    session.barrier()
    data = array.array("f", [1.0]) * (1 << 20)
    if session.rank == 2:
        time.sleep(0.5)
    started = time.monotonic()
    if session.rank == 1:
        error = raises(shmbroker.Timeout, lambda: session.all_reduce(data, "sum", timeout=0.1))
        check(error.waiting_for == [2], f"{error!r}")
    else:
        error = raises(
            shmbroker.PeerGaveUp, lambda: session.all_reduce(data, "sum", timeout=None)
        )
        expected = "peer rank 1 gave up on all_reduce #1 (its own call failed naming rank 2)"
        check(str(error) == expected and (error.rank, error.named) == (1, 2), f"{error!r}")
        check(time.monotonic() - started < 20, "seen long after it happened")
    if session.rank == 0:
        # What rank 1 published, as its broker reads it (`shmbroker status --json`).
        last = shmbroker.status()[1]
        check(last["last_call"] == "all_reduce #1" and last["last_failed"] is True, str(last))
        check(last["last_failed_naming"] == 2, str(last))
    say(f"GAVEUP {error}")
    # Stay, making no other call, until every rank has its outcome.
    open(os.path.join(args[0], f"seen-{session.rank}"), "w").close()
    for rank in range(session.world_size):
        wait_for_file(os.path.join(args[0], f"seen-{rank}"), f"rank {rank} saw it")


def scenario_watchdog(session, _):
    """A wait with no deadline (SHMBROKER_WARN_AFTER=0.5): rank 0 waits in recv from rank 1,
    which sleeps 2.3 s first; the watchdog warns at 0.5, 1 and 2 s with what rank 1 is doing,
    and the wait goes on until the message comes."""
    import logging

    if session.rank == 1:
        time.sleep(2.3)
        session.send(0, b"late")
        return
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    logging.getLogger("shmbroker").addHandler(Keep())
    check(session.recv(1, timeout=None) == b"late", "the late message")
    deadline = time.monotonic() + 5  # records come from the forwarding thread
    while len([r for r in records if "no deadline" in r.getMessage()]) < 3:
        check(time.monotonic() < deadline, f"3 warnings: {[r.getMessage() for r in records]}")
        time.sleep(0.01)
    warnings = [r for r in records if "no deadline" in r.getMessage()]
    for record in warnings:
        check(record.levelname == "WARNING", record.levelname)
        message = record.getMessage()
        check("recv has waited" in message and "for rank 1: rank 1 is in no call" in message, message)
        check("still waiting" in message, message)
    say(f"WARNED {warnings[0].getMessage()}")


def wait_for_file(path, what):
    deadline = time.monotonic() + 20
    while not os.path.exists(path):
        check(time.monotonic() < deadline, f"{what} within 20 s")
        time.sleep(0.01)


def scenario_never_joined(_, args):
    """Rank 1 never logs on; rank 2 logs on after rank 0 and leaves: the job admits nobody new
    after that, so rank 0's calls that need rank 1 raise PeerNeverJoined naming both."""
    rank = int(os.environ["SHMBROKER_RANK"])
    zero_in, done = (os.path.join(args[0], name) for name in ("zero-in", "done"))
    if rank == 1:
        wait_for_file(done, "rank 0 finished")
        return
    if rank == 2:
        wait_for_file(zero_in, "rank 0 logged on")
        shmbroker.connect(timeout=30).close()
        return
    session = shmbroker.connect(timeout=30)
    with open(zero_in, "w"):
        pass
    raises(shmbroker.PeerLeft, lambda: session.recv(2, timeout=30))
    error = raises(shmbroker.PeerNeverJoined, lambda: session.recv(1, timeout=30))
    check((error.rank, error.after, error.after_left) == (1, 2, True), repr(error.args))
    say(f"NEVERJOINED rank {error.rank}: {error}")
    session.close()
    with open(done, "w"):
        pass


def scenario_objects(session, args):
    """Objects: send/recv (NumPy arrays out of band, arriving writable), broadcast, all_gather,
    on the world and on a group; a forged header is a ProtocolError naming the sender."""
    rank, world = session.rank, session.world_size
    try:
        import numpy
    except ImportError:
        numpy = None
    payload = {"rank": rank, "text": "x" * 1000, "blob": bytearray(pattern(rank, 300_000))}
    if numpy is not None:
        payload["array"] = numpy.arange(200_000, dtype=numpy.float64) * rank
    peer, source = (rank + 1) % world, (rank - 1) % world
    if rank % 2 == 0:
        shmbroker.send_object(session, peer, payload)
        got = shmbroker.recv_object(session, source, timeout=30)
    else:
        got = shmbroker.recv_object(session, source, timeout=30)
        shmbroker.send_object(session, peer, payload)
    check(got["rank"] == source and got["blob"] == pattern(source, 300_000), "recv_object")
    if numpy is not None:
        check(numpy.array_equal(got["array"], numpy.arange(200_000) * source), "array")
        got["array"][0] = 7.0  # out of band, into a bytearray: writable
    root = world - 1
    settings = shmbroker.broadcast_object(session, root, {"lr": 0.1, "from": root, "big": payload}
                                          if rank == root else None)
    check(settings["from"] == root and settings["big"]["rank"] == root, "broadcast_object")
    everyone = shmbroker.all_gather_object(session, ("rank", rank))
    check(everyone == [("rank", r) for r in range(world)], f"all_gather_object: {everyone}")
    evens = session.group(list(range(0, world, 2))) if rank % 2 == 0 else None
    if evens is not None:
        got = shmbroker.all_gather_object(session, rank * 10, group=evens)
        check(got == [r * 10 for r in range(0, world, 2)], f"all_gather_object on a group {got}")
        got = shmbroker.broadcast_object(session, 0, "even" if rank == 0 else None, group=evens)
        check(got == "even", f"broadcast_object on a group: {got!r}")
    # A header that names a buffer of another length than the one that follows.
    if rank == 0:
        forged = struct.pack("<QQ", 1, 1 << 40) + pickle.dumps(None, protocol=5)
        session.send(1, forged)
        session.send(1, b"short")
    elif rank == 1:
        error = raises(shmbroker.ProtocolError, lambda: shmbroker.recv_object(session, 0))
        check(error.rank == 0 and "1099511627776" in str(error), str(error))
    session.barrier()


def scenario_asyncio(session, args):
    """recv_any_async: rank 0 awaits messages from every peer while another task ticks; a
    timeout; then a peer's death ends the wait, naming it."""
    import asyncio

    rank, world = session.rank, session.world_size
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the launcher's stop comes after the report
    if rank != 0:
        check(session.recv(0, timeout=30) == b"go", "go")
        time.sleep(0.1 * rank)
        session.send(0, b"hello from %d" % rank)
        session.barrier()
        if rank == world - 1:
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGKILL)
        session.recv(0, timeout=30)  # rank 0 says nothing: this ends when the job does
        return

    async def ticker(ticks):
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    async def serve():
        ticks = []
        task = asyncio.ensure_future(ticker(ticks))
        await asyncio.sleep(0)  # the ticker's first tick
        for peer in range(1, world):
            session.send(peer, b"go")
        senders = set()
        for _ in range(world - 1):
            sender, data = await shmbroker.recv_any_async(session, timeout=30)
            check(data == b"hello from %d" % sender, f"{data!r} from {sender}")
            senders.add(sender)
        check(senders == set(range(1, world)), f"senders {senders}")
        # The peers sent 0.1 s or more after "go": the ticker ran again meanwhile.
        check(len(ticks) >= 2, f"the loop ran other tasks meanwhile ({len(ticks)} ticks)")
        error = None
        try:
            await shmbroker.recv_any_async(session, timeout=0.2)
        except shmbroker.Timeout as timeout:
            error = timeout
        check(error is not None and error.op == "recv_any", f"timeout: {error!r}")
        for bad in (0, -1.0, float("nan")):
            try:
                await shmbroker.recv_any_async(session, timeout=bad)
                check(False, f"timeout={bad} was accepted")
            except shmbroker.MisuseError:
                pass
        session.barrier()
        try:
            await shmbroker.recv_any_async(session, timeout=None)  # the death ends it
            check(False, "recv_any_async returned after the death")
        except shmbroker.PeerLost as lost:
            check(lost.rank == world - 1, f"PeerLost names {lost.rank}")
            say(f"ASYNC PEERLOST rank {lost.rank}")
        task.cancel()

    asyncio.run(serve())


def scenario_rejoin(_session, args):
    """A broker of 2 ranks at ``args[1]``, no launcher; ``args[0]`` says which part to play:
    ``survivor`` (rank 0: the dead rank's messages, PeerLost, PeerRejoined, then its
    replacement's hello and an all-reduce on a group of both), ``victim`` (rank 1: says
    something, meets rank 0, dies) or ``newcomer`` (rank 1 again, after the death)."""
    part, path = args
    rank = 0 if part == "survivor" else 1
    session = shmbroker.connect(path, rank, timeout=30)
    if part == "victim":
        session.send(0, b"old")
        session.barrier()
        os.kill(os.getpid(), signal.SIGKILL)
    if part == "newcomer":
        check(session.rejoins == 1 and session.rejoined, f"rejoins is {session.rejoins}")
        session.wait_for_rank(0, timeout=5)
        try:
            session.barrier()
            check(False, "a replacement's world barrier returned")
        except shmbroker.PeerLost as lost:
            check(lost.rank == 1, f"the world barrier names {lost.rank}")
        session.send(0, b"hello")
    if part == "survivor":
        session.barrier()
        check(session.recv_any() == (1, b"old"), "the victim's message comes first")
        seen = []
        while True:
            try:
                sender, data = session.recv_any(timeout=30)
                break
            except shmbroker.PeerLost as lost:
                if not seen or seen[-1] != "lost":
                    seen.append("lost")
                time.sleep(0.002)
            except shmbroker.PeerRejoined as rejoined:
                check(rejoined.rank == 1 and rejoined.times == 1, str(rejoined))
                seen.append("rejoined")
        check(seen == ["lost", "rejoined"], f"seen {seen}")
        check((sender, data) == (1, b"hello"), f"got {sender} {data!r}")
        session.wait_for_rank(1, timeout=5)  # there already: returns at once
        say("REJOINED")
    group = session.group([0, 1])
    total = array.array("i", [session.rank + 1] * 4)
    session.all_reduce(total, group=group)
    check(list(total) == [3] * 4, f"sum {total!r}")
    session.close()


def scenario_regroup(session, _):
    """Issue 44's scenario, under ``run -n 3 --restart 1``: rank 1 sends rank 0 a message and
    dies 300 ms later (its first process only); rank 2 at once recovers the world's group. Every
    rank, the replacement included, calls ``regroup``; a barrier and a sum of each member's
    incarnation (``[0, 1, 0]``) check that all hold one group of the same processes."""
    rank = session.rank
    if not session.rejoined:
        if rank == 0:
            for sender in (1, 2):
                data = session.recv(sender)
                check(data == f"hello from {sender}".encode(), f"rank {sender} sent {data!r}")
        else:
            session.send(0, f"hello from {rank}".encode())
            if rank == 1:
                time.sleep(0.3)
                os.kill(os.getpid(), signal.SIGKILL)
    for tries in range(10):
        group = session.regroup([0, 1, 2], timeout=30)
        incarnations = array.array("I", [0, 0, 0])
        incarnations[group.rank] = session.rejoins
        try:
            session.barrier(group=group)
            session.all_reduce(incarnations, group=group)
            break
        except shmbroker.PeerLost:
            # A death after the group was made: recover again.
            continue
    check(list(incarnations) == [0, 1, 0], f"incarnations {list(incarnations)}")


def scenario_split(session, args):
    """Rank 0's session split in two: its receiver takes rank 2's reply while its sender's
    broadcasts wait for rank 1, which receives only once the reply is in (a file says so). Then
    every rank splits and sends messages of every size both ways, each checked, and rejoins."""
    flag = str(args[0])
    rank = session.rank
    batches = [pattern(n, 400 << 10) for n in range(4)]
    if rank == 0:
        sender, receiver = session.split()
        raises(shmbroker.Error, lambda: session.barrier())
        done = threading.Event()

        def broadcast_all():
            for batch in batches:
                sender.broadcast(batch)
            done.set()

        thread = threading.Thread(target=broadcast_all)
        thread.start()
        got = receiver.recv_any(timeout=20)
        still_sending = not done.is_set()
        open(flag, "w").close()
        check(got == (2, b"reply"), f"reply {got!r}")
        check(still_sending, "the broadcasts ended before rank 1 received")
        # One receive at a time: a second thread's receive while this one waits raises.
        second = []
        waiting = threading.Thread(target=lambda: second.append(receiver.recv(1, timeout=20)))
        waiting.start()
        time.sleep(0.2)
        raises(shmbroker.Error, lambda: receiver.try_recv_any())
        open(flag + ".busy", "w").close()
        waiting.join(30)
        check(second == [b"ack"], f"rank 1's ack {second!r}")
        check(receiver.try_recv(2) is None, "a message from rank 2 nobody sent")
        thread.join(30)
        check(done.is_set(), "the broadcasts did not end")
        session = sender.rejoin(receiver)
        raises(shmbroker.Error, lambda: sender.send(1, b"x"))
    elif rank == 1:
        wait_for_file(flag, "rank 0's reply")
        for batch in batches:
            check(session.broadcast(0) == batch, "a broadcast came garbled")
        # Once rank 0 has seen its second receive refused while the first waits for this.
        wait_for_file(flag + ".busy", "rank 0's busy check")
        session.send(0, b"ack")
    else:
        check(session.broadcast(0) == batches[0], "the first broadcast came garbled")
        session.send(0, b"reply")
        for batch in batches[1:]:
            check(session.broadcast(0) == batch, "a broadcast came garbled")
    session.barrier()
    sizes = [0, 9, 3000, 40_000, 300_000, 1_500_000]
    peers = [p for p in range(session.world_size) if p != rank]
    sender, receiver = session.split()

    def send_all():
        for n, size in enumerate(sizes * 3):
            for peer in peers:
                sender.send(peer, pattern(rank, size, salt=n))

    thread = threading.Thread(target=send_all)
    thread.start()
    counts = {peer: 0 for peer in peers}
    for _ in range(len(sizes) * 3 * len(peers)):
        peer, data = receiver.recv_any(timeout=20)
        n = counts[peer]
        counts[peer] += 1
        check(data == pattern(peer, sizes[n % len(sizes)], salt=n), f"message {n} from {peer}")
    thread.join(30)
    session = sender.rejoin(receiver)
    session.barrier()
    return session


def scenario_channels(session, _):
    """Typed channels between ranks 0 and 1: records of a NumPy structured dtype (or 12-byte
    records as bytes without NumPy) one at a time and in batches, checked; a tag the ends do
    not share; closing from the sending end."""
    try:
        import numpy
    except ImportError:
        numpy = None
    rank = session.rank
    count = 5000
    if numpy is not None:
        record = numpy.dtype([("id", "<u4"), ("price", "<f8")])
    else:
        record = 12

    def make(n):
        if numpy is not None:
            return numpy.array([(n, n * 0.5)], dtype=record)
        return struct.pack("<Id", n, n * 0.5)

    def batch(start, stop):
        if numpy is not None:
            out = numpy.zeros(stop - start, dtype=record)
            out["id"] = numpy.arange(start, stop)
            out["price"] = out["id"] * 0.5
            return out
        return b"".join(make(n) for n in range(start, stop))

    if rank == 0:
        tx = session.channel_to(1, 77, record, capacity=256)
        check(tx.record_bytes == 12, f"record_bytes {tx.record_bytes}")
        for n in range(count):
            tx.send(make(n))
        tx.send_batch(batch(count, 2 * count))
        raises(shmbroker.MisuseError, lambda: tx.send(b"short"))
        # A tag rank 1 does not share: refused there, and then here.
        wrong = session.channel_to(1, 5, record)
        session.barrier()
        raises(shmbroker.MisuseError, lambda: wrong.send(make(1)))
        tx.close()
        raises(shmbroker.Error, lambda: tx.send(make(0)))
        # A payload by reference: a loan, its 16-byte reference in a record.
        refs = session.channel_to(1, 78, 16)
        loan = session.loan(50000)
        loan.buffer[:] = pattern(0, 50000)
        refs.send(session.lend_ref(1, loan))
        session.barrier()
    elif rank == 1:
        rx = session.channel_from(0, 77, record)
        for n in range(count):
            got = rx.recv()
            check(got == bytes(make(n)), f"record {n}: {got!r}")
        received = 0
        if numpy is not None:
            out = numpy.zeros(700, dtype=record)
        else:
            out = bytearray(12 * 700)
        want = bytes(batch(count, 2 * count))
        seen = bytearray()
        while received < count:
            got = rx.recv_batch(out)
            seen += bytes(out)[: 12 * got]
            received += got
        check(bytes(seen) == want, "the batch came garbled")
        raises(shmbroker.MisuseError, lambda: session.channel_from(0, 6, record))
        session.barrier()
        raises(shmbroker.ChannelClosed, lambda: rx.recv())
        refs = session.channel_from(0, 78, 16)
        view = session.view_loan_ref(0, refs.recv())
        check(bytes(view.buffer) == pattern(0, 50000), "the lent payload came garbled")
        forged = struct.pack("<QI4x", 1 << 40, 16)
        raises(shmbroker.ProtocolError, lambda: session.view_loan_ref(0, forged))
        view.release()
        session.barrier()
    else:
        session.barrier()
        session.barrier()


def main():
    scenario, args = sys.argv[1], sys.argv[2:]
    run = globals()[f"scenario_{scenario}"]
    if scenario == "rejoin":  # no launcher: it connects itself
        run(None, args)
        say(f"OK {scenario} {args[0]}")
        return
    if scenario in ("context", "never_joined"):  # they connect themselves
        run(None, args)
        say(f"OK {scenario} rank {os.environ['SHMBROKER_RANK']}")
        return
    # The timeout scenario checks that a call without timeout= has the connect timeout.
    # peer_lost runs with no deadline at all: the death must end its waits.
    timeout = {"timeout": 5.0, "peer_lost": None}.get(scenario, 30)
    session = shmbroker.connect(timeout=timeout)
    # A scenario that splits its session returns the one it rejoined.
    session = run(session, args) or session
    session.close()
    say(f"OK {scenario} rank {session.rank}")


if __name__ == "__main__":
    main()
