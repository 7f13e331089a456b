"""The worker side of the torch backend tests: every rank runs SCENARIO and prints
`OK <scenario> rank <r>`; a failed check exits 1 (the launcher then fails the job).

- `against_gloo`: every call on the shmbroker backend and on a gloo group of the same ranks,
  with the same inputs; the outputs must be equal, bit for bit.
- `basic`: a small all-reduce and barrier (for torchrun and the store rendezvous).
- `again`: `basic`, then the group destroyed and made again, twice, with a call from another
  thread.
- `death`: rank 1 dies in the middle of all-reduces; the others must raise PeerLost naming it.
- `trips`: tags, all_gather_coalesced, monitored_barrier and a timeout's text, as under gloo.
- `spanning`: every call on a world spanning nodes (`SHMBROKER_NODE` set per rank), against
  gloo, with groups inside a node and across nodes, and DistributedDataParallel.
- `span_death`: on a world spanning nodes, rank `VICTIM` dies; every other rank must raise
  PeerLost naming it.
- `span_stop`: the same with rank `VICTIM` stopped; every other rank must raise Timeout naming
  it as stopped.
- `span_chaos`: mixed calls on a world spanning nodes until the test kills rank `VICTIM` at a
  random moment; every other rank must raise PeerLost naming it.

Usage: python torch_workers.py SCENARIO [RANK WORLD_SIZE INIT_METHOD] (the last three only when
no launcher gives them; an INIT_METHOD of `store:PORT` joins a TCP store the test hosts).
"""

import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

import shmbroker
import shmbroker.torch  # noqa: F401  (registers the backend)

TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("TIMEOUT_S", "30")))
R = dist.ReduceOp
SIZES = [1, 7, 600, 70_001]
INTEGERS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def check(condition, what):
    if not condition:
        print(f"FAILED rank {dist.get_rank()}: {what}", file=sys.stderr, flush=True)
        sys.exit(1)


def same(ours, theirs, what):
    if ours is None and theirs is None:
        return  # gloo refused the call
    if isinstance(ours, (list, tuple)):
        check(len(ours) == len(theirs), f"{what}: {len(ours)} tensors against {len(theirs)}")
        for i, (mine, other) in enumerate(zip(ours, theirs)):
            same(mine, other, f"{what}[{i}]")
        return
    equal = ours.dtype == theirs.dtype and ours.shape == theirs.shape and torch.equal(ours, theirs)
    check(equal, f"{what}: shmbroker gave {ours!r}, gloo {theirs!r}")


def values(dtype, count, rank, salt):
    """Small whole numbers (so sums and products are exact in every type and any order)."""
    generator = torch.Generator().manual_seed(rank * 1_000_003 + salt)
    ints = torch.randint(1, 4, (count,), generator=generator)
    return ints.to(dtype)


# Calls gloo refused (an element type it lacks): what was skipped, printed at the end.
REFUSED = set()


def both(call, *tensors, what=""):
    """`call(group, *copies)` on gloo and on the shmbroker world, each on its own copies of
    `tensors`; returns (ours, gloo's). A call gloo refuses before it communicates (it checks
    element types on each rank alike) is skipped on both: (None, None)."""
    results = []
    for group in (GLOO, None):
        copies = [
            [t.clone() for t in tensor] if isinstance(tensor, list) else tensor.clone()
            for tensor in tensors
        ]
        try:
            call(group, *copies)
        except RuntimeError as error:
            if group is None or "Invalid scalar type" not in str(error):
                raise
            REFUSED.add(what)
            return None, None
        results.append(copies)
    theirs, ours = results
    return ours, theirs


def reductions(counts, salt):
    """all_reduce of every op on every type gloo has, at `counts`, against gloo; returns the
    next salt."""
    rank = dist.get_rank()
    for dtype in INTEGERS + FLOATS:
        ops = [R.SUM, R.MIN, R.MAX] + ([R.BAND, R.BOR, R.BXOR] if dtype in INTEGERS else [])
        if dtype not in (torch.float16, torch.bfloat16):
            ops.append(R.PRODUCT)  # gloo has no half-precision product
        for op in ops:
            for count in counts:
                salt += 1
                data = values(dtype, count, rank, salt)
                what = f"all_reduce {op} {dtype}"
                ours, theirs = both(
                    lambda g, t: dist.all_reduce(t, op=op, group=g), data, what=what
                )
                same(ours, theirs, f"{what} x{count}")
    return salt


def moving_data(dtypes, counts, salt):
    """all_gather, all_gather_into_tensor, broadcast from every root, all_to_all_single (equal
    and uneven), reduce_scatter_tensor, reduce, gather and scatter, of `dtypes` at `counts`,
    against gloo; returns the next salt."""
    rank, size = dist.get_rank(), dist.get_world_size()
    for dtype in dtypes:
        for count in counts:
            salt += 1
            data = values(dtype, count, rank, salt)
            # all_gather and all_gather_into_tensor
            outs = [torch.zeros(count, dtype=dtype) for _ in range(size)]
            ours, theirs = both(lambda g, o, t: dist.all_gather(o, t, group=g), outs, data)
            same(ours[0], theirs[0], f"all_gather {dtype} x{count}")
            flat = torch.zeros(count * size, dtype=dtype)
            ours, theirs = both(
                lambda g, o, t: dist.all_gather_into_tensor(o, t, group=g), flat, data
            )
            same(ours[0], theirs[0], f"all_gather_into_tensor {dtype} x{count}")
            # broadcast from every root
            for root in range(size):
                ours, theirs = both(lambda g, t: dist.broadcast(t, root, group=g), data)
                same(ours, theirs, f"broadcast from {root} {dtype} x{count}")
            # all_to_all_single, equal and uneven splits
            block = torch.cat([values(dtype, count, rank * size + q, salt) for q in range(size)])
            ours, theirs = both(
                lambda g, o, i: dist.all_to_all_single(o, i, group=g),
                torch.zeros_like(block),
                block,
            )
            same(ours[0], theirs[0], f"all_to_all_single {dtype} x{count}")
            sends = [(rank + q) % 3 + count for q in range(size)]
            receives = [(q + rank) % 3 + count for q in range(size)]
            uneven = values(dtype, sum(sends), rank, salt + 1)
            ours, theirs = both(
                lambda g, o, i: dist.all_to_all_single(o, i, receives, sends, group=g),
                torch.zeros(sum(receives), dtype=dtype),
                uneven,
            )
            same(ours[0], theirs[0], f"all_to_all_single, uneven, {dtype} x{count}")
            if dtype == torch.complex64:
                continue
            # reduce_scatter_tensor, reduce, gather, scatter
            for op in [R.SUM, R.MAX]:
                ours, theirs = both(
                    lambda g, o, i: dist.reduce_scatter_tensor(o, i, op=op, group=g),
                    torch.zeros(count, dtype=dtype),
                    block,
                )
                same(ours[0], theirs[0], f"reduce_scatter_tensor {op} {dtype} x{count}")
            for root in range(size):
                ours, theirs = both(lambda g, t: dist.reduce(t, root, group=g), data)
                if rank == root:  # elsewhere torch leaves the tensor's contents unspecified
                    same(ours, theirs, f"reduce to {root} {dtype} x{count}")
                gathered = [torch.zeros(count, dtype=dtype) for _ in range(size)]
                ours, theirs = both(
                    lambda g, t, o: dist.gather(t, o if rank == root else None, root, group=g),
                    data,
                    gathered,
                )
                same(ours[1], theirs[1], f"gather to {root} {dtype} x{count}")
                parts = [values(dtype, count, q, salt) for q in range(size)]
                ours, theirs = both(
                    lambda g, o, p: dist.scatter(o, p if rank == root else None, root, group=g),
                    torch.zeros(count, dtype=dtype),
                    parts,
                )
                same(ours[0], theirs[0], f"scatter from {root} {dtype} x{count}")

    return salt


def against_gloo():
    rank, size = dist.get_rank(), dist.get_world_size()
    salt = 0

    dist.barrier()
    dist.barrier(async_op=True).wait()

    # all_reduce: every op on every type it has, at sizes on both sides of the one-shot limit.
    salt = reductions(SIZES, salt)
    # AVG (gloo has none): the sum divided by the size.
    for dtype in [torch.float32, torch.float64]:
        data = values(dtype, 1000, rank, 7)
        ours, theirs = both(lambda g, t: dist.all_reduce(t, group=g), data)
        mine = data.clone()
        dist.all_reduce(mine, op=R.AVG)
        same(mine, theirs[0] / size, f"all_reduce AVG {dtype}")
    # async_op and a non-contiguous tensor.
    data = values(torch.float32, 64, rank, 11).reshape(8, 8)[:, ::2]
    ours, theirs = both(lambda g, t: dist.all_reduce(t, group=g, async_op=True).wait(), data)
    same(ours, theirs, "all_reduce, async, non-contiguous")
    work = dist.all_reduce(mine := data.clone(), async_op=True)
    check(work.is_completed() and work.wait(), "an async all_reduce's Work is complete")
    same(work.get_future().value()[0], mine, "the Work's future holds the output")

    salt = moving_data(
        [torch.uint8, torch.int64, torch.bfloat16, torch.float32, torch.complex64],
        [1, 600, 70_001],
        salt,
    )

    # send/recv in a ring, and recv from any source.
    message = values(torch.float64, 5000, rank, 99)
    received = torch.zeros_like(message)
    if rank % 2 == 0:
        dist.send(message, (rank + 1) % size)
        dist.recv(received, (rank - 1) % size)
    else:
        dist.recv(received, (rank - 1) % size)
        dist.send(message, (rank + 1) % size)
    same(received, values(torch.float64, 5000, (rank - 1) % size, 99), "recv in a ring")
    # Receives from any source, on the world.
    if rank == 0:
        senders = set()
        for _ in range(size - 1):
            got = torch.zeros(3, dtype=torch.int32)
            sender = dist.recv(got)
            same(got, torch.full((3,), sender, dtype=torch.int32), f"recv from any ({sender})")
            senders.add(sender)
        check(senders == set(range(1, size)), f"recv from any: senders {senders}")
    else:
        dist.send(torch.full((3,), rank, dtype=torch.int32), 0)
    dist.barrier()  # (else a rank's next message to rank 0 could be the one it takes from any)

    # Receives posted before the sends: irecv then send, and batch_isend_irecv in both orders.
    got = torch.zeros(100, dtype=torch.int64)
    work = dist.irecv(got, (rank - 1) % size)
    dist.send(torch.full((100,), rank, dtype=torch.int64), (rank + 1) % size)
    work.wait()
    same(got, torch.full((100,), (rank - 1) % size, dtype=torch.int64), "irecv before send")
    for receive_first in (True, False):
        got = torch.zeros(70_001)
        ops = [
            dist.P2POp(dist.irecv, got, (rank - 1) % size),
            dist.P2POp(dist.isend, torch.full((70_001,), float(rank)), (rank + 1) % size),
        ]
        for work in dist.batch_isend_irecv(ops if receive_first else ops[::-1]):
            work.wait()
        same(got, torch.full((70_001,), float((rank - 1) % size)), "batch_isend_irecv")

    # Empty tensors, as gloo takes them.
    empty = torch.zeros(0)
    ours, theirs = both(lambda g, t: dist.all_reduce(t, group=g), empty)
    same(ours, theirs, "all_reduce of nothing")
    ours, theirs = both(lambda g, t: dist.broadcast(t, 0, group=g), empty)
    same(ours, theirs, "broadcast of nothing")
    ours, theirs = both(
        lambda g, o, t: dist.all_gather_into_tensor(o, t, group=g), torch.zeros(0), empty
    )
    same(ours, theirs, "all_gather_into_tensor of nothing")
    ours, theirs = both(
        lambda g, o, t: dist.all_to_all_single(o, t, group=g), torch.zeros(0), empty
    )
    same(ours, theirs, "all_to_all_single of nothing")

    # What torch's own layers reach through the group: its name, and functional collectives.
    check(dist.group.WORLD.group_name, "the world group has a name")
    import torch.distributed._functional_collectives as fc

    summed = fc.all_reduce(torch.full((4,), float(rank)), "sum", dist.group.WORLD)
    same(summed, torch.full((4,), float(sum(range(size)))), "functional all_reduce")

    # new_group: the even ranks, against a gloo group of the same ranks.
    evens = list(range(0, size, 2))
    ours_group = dist.new_group(evens)
    gloo_group = dist.new_group(evens, backend="gloo")
    if rank in evens:
        data = values(torch.int32, 100, rank, 5)
        mine, theirs = data.clone(), data.clone()
        dist.all_reduce(mine, group=ours_group)
        dist.all_reduce(theirs, group=gloo_group)
        same(mine, theirs, f"all_reduce on group {evens}")
        root = evens[-1]
        mine = values(torch.int32, 10, rank, 6)
        theirs = mine.clone()
        dist.broadcast(mine, root, group=ours_group)
        dist.broadcast(theirs, root, group=gloo_group)
        same(mine, theirs, f"broadcast from world rank {root} on group {evens}")
        check(dist.get_rank(ours_group) == evens.index(rank), "group rank")
    dist.barrier()
    if rank == 0 and REFUSED:
        print("gloo refused (skipped on both):", ", ".join(sorted(REFUSED)), flush=True)

    # A root whose tensor has another length than the others': each other rank raises, naming
    # the root, and no data lands in its tensor; the ranks stay in step.
    root = size - 1
    data = torch.zeros(5 if rank == root else 4)
    try:
        dist.broadcast(data, root)
        check(rank == root, "a broadcast of another length passed")
    except ValueError as error:
        check(rank != root and f"group rank {root}" in str(error), str(error))
        check(torch.equal(data, torch.zeros(4)), "a short broadcast wrote into the tensor")
    dist.barrier()

    # Lengths that differ between ranks fail on every rank and hang nobody: a rank that sees
    # the mismatch raises ProtocolError naming a peer; one still waiting when such a rank has
    # gone raises PeerLeft naming it. (Last: after a collective failed this way the ranks'
    # collectives are out of step.)
    try:
        dist.all_reduce(torch.zeros(10 + rank))
        check(False, "an all_reduce of different lengths passed")
    except (shmbroker.ProtocolError, shmbroker.PeerLeft) as error:
        check(error.rank != rank, f"the failure names a peer: {error}")


def spanning():
    """Every call on a world that spans nodes (SHMBROKER_NODE set per rank), against gloo."""
    rank, size = dist.get_rank(), dist.get_world_size()
    check(type(dist.group.WORLD).__name__ == "SpanProcessGroup", f"{dist.group.WORLD!r}")
    salt = 0
    dist.barrier()
    # 0, 1, odd, and past the rails' threshold (odd too: padded to the node's ranks).
    counts = [0, 1, 7, 70_001, 262_145]
    salt = reductions(counts, salt)
    # int16 (which gloo lacks: against gloo's int32, narrowed) and half-precision products.
    for op in [R.SUM, R.MIN, R.MAX, R.PRODUCT, R.BAND, R.BOR, R.BXOR]:
        for count in (7, 262_145):
            data = values(torch.int16, count, rank, 1) * 1000
            wide = data.to(torch.int32)
            dist.all_reduce(data, op=op)
            dist.all_reduce(wide, op=op, group=GLOO)
            same(data, wide.to(torch.int16), f"all_reduce {op} int16 x{count}")
    for dtype in [torch.float16, torch.bfloat16]:
        data = values(dtype, 1000, rank, 2)
        wide = data.to(torch.float32)
        dist.all_reduce(data, op=R.PRODUCT)
        dist.all_reduce(wide, op=R.PRODUCT, group=GLOO)
        same(data, wide.to(dtype), f"all_reduce PRODUCT {dtype}")
    for dtype in [torch.bool, torch.complex64, torch.bfloat16]:
        data = values(torch.int32, 1000, rank, 3).remainder(2).to(dtype)
        ours, theirs = both(lambda g, t: dist.all_reduce(t, group=g), data, what=f"{dtype}")
        same(ours, theirs, f"all_reduce {dtype}")
    data = values(torch.float32, 300_000, rank, 4)
    mine = data.clone()
    dist.all_reduce(mine, op=R.AVG)
    ours, theirs = both(lambda g, t: dist.all_reduce(t, group=g), data)
    same(mine, theirs[0] / size, "all_reduce AVG")
    # reduce_scatter past the rails' threshold, with AVG (gloo has none: its sum / size).
    block = values(torch.float32, 100_000 * size, rank, 9)
    mine, theirs = torch.zeros(100_000), torch.zeros(100_000)
    dist.reduce_scatter_tensor(mine, block, op=R.AVG)
    dist.reduce_scatter_tensor(theirs, block, group=GLOO)
    same(mine, theirs / size, "reduce_scatter_tensor AVG")
    # Floats: the same bits on every rank, both below and above the rails' threshold.
    for count in (1000, 300_000):
        noisy = torch.randn(count, generator=torch.Generator().manual_seed(rank))
        dist.all_reduce(noisy)
        everyone = [torch.zeros(count) for _ in range(size)]
        dist.all_gather(everyone, noisy)
        check(all(torch.equal(noisy, other) for other in everyone), f"same bits x{count}")
    salt = moving_data([torch.uint8, torch.float32, torch.complex64], [0, 1, 7, 70_001], salt)
    # all_to_all of lists, and types gloo lacks (int16, uint16) broadcast and sent all to all.
    for dtype in [torch.float32, torch.int16, torch.uint16]:
        parts = [values(dtype, 3 + q, rank, 40 + q) for q in range(size)]
        outs = [torch.zeros(3 + rank, dtype=dtype) for _ in range(size)]
        dist.all_to_all(outs, parts)
        for q in range(size):
            same(outs[q], values(dtype, 3 + rank, q, 40 + rank), f"all_to_all {dtype} from {q}")
        for root in range(size):
            data = values(dtype, 9, root, 41)
            mine = data if rank == root else torch.zeros_like(data)
            dist.broadcast(mine, root)
            same(mine, data, f"broadcast {dtype} from {root}")
        block = torch.cat([values(dtype, 2, rank * size + q, 42) for q in range(size)])
        out = torch.zeros_like(block)
        dist.all_to_all_single(out, block)
        want = torch.cat([values(dtype, 2, q * size + rank, 42) for q in range(size)])
        same(out, want, f"all_to_all_single {dtype}")
    # send/recv in a ring (across nodes and inside one), with tags, and receives posted first.
    message = values(torch.float64, 5000, rank, 99)
    received = torch.zeros_like(message)
    if rank % 2 == 0:
        dist.send(message, (rank + 1) % size, tag=5)
        dist.recv(received, (rank - 1) % size, tag=5)
    else:
        dist.recv(received, (rank - 1) % size, tag=5)
        dist.send(message, (rank + 1) % size, tag=5)
    same(received, values(torch.float64, 5000, (rank - 1) % size, 99), "recv in a ring")
    for step in (1, 2):
        for send_first in (False, True):
            got = torch.zeros(70_001)
            ops = [
                dist.P2POp(dist.irecv, got, (rank - step) % size),
                dist.P2POp(dist.isend, torch.full((70_001,), float(rank)), (rank + step) % size),
            ]
            for work in dist.batch_isend_irecv(ops[::-1] if send_first else ops):
                work.wait()
            want = torch.full((70_001,), float((rank - step) % size))
            same(got, want, f"batch_isend_irecv {step}, send first: {send_first}")
    # isend, then a blocking recv, then the send's wait.
    work = dist.isend(torch.full((5,), float(rank)), (rank + 1) % size)
    got = torch.zeros(5)
    dist.recv(got, (rank - 1) % size)
    work.wait()
    same(got, torch.full((5,), float((rank - 1) % size)), "isend, recv, wait")
    # Groups: one inside a node, one across nodes, against gloo groups of the same ranks.
    # (The test's nodes are named "node<number>".)
    node = torch.tensor([int(os.environ["SHMBROKER_NODE"].removeprefix("node"))])
    names = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(names, node)
    for members in ([r for r in range(size) if names[r] == names[0]], [0, size - 1]):
        ours_group = dist.new_group(members)
        gloo_group = dist.new_group(members, backend="gloo")
        if rank in members:
            for count in (5, 300_000):
                data = values(torch.int32, count, rank, 5)
                mine, theirs = data.clone(), data.clone()
                dist.all_reduce(mine, group=ours_group)
                dist.all_reduce(theirs, group=gloo_group)
                same(mine, theirs, f"all_reduce on group {members} x{count}")
            mine = values(torch.int32, 10, rank, 6)
            theirs = mine.clone()
            dist.broadcast(mine, members[-1], group=ours_group)
            dist.broadcast(theirs, members[-1], group=gloo_group)
            same(mine, theirs, f"broadcast on group {members}")
            outs = [torch.zeros(3) for _ in members]
            dist.all_gather(outs, torch.full((3,), float(rank)), group=ours_group)
            same(torch.stack(outs), torch.tensor([[float(r)] * 3 for r in members]), "group gather")
            dist.barrier(group=ours_group)
    # DistributedDataParallel: a few steps of a small model end with gloo's weights.
    weights = []
    for group in (None, GLOO):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        optimiser = torch.optim.SGD(ddp.parameters(), lr=0.1)
        inputs = torch.Generator().manual_seed(rank)
        for _ in range(5):
            x = torch.randint(-3, 4, (4, 8), generator=inputs).float()
            optimiser.zero_grad()
            ddp(x).sum().backward()
            optimiser.step()
        weights.append([p.detach().clone() for p in model.parameters()])
    for mine, theirs in zip(*weights):
        check(torch.allclose(mine, theirs, rtol=1e-5, atol=1e-6), "DDP weights differ from gloo's")
    dist.barrier()
    if rank == 0 and REFUSED:
        print("gloo refused (skipped on both):", ", ".join(sorted(REFUSED)), flush=True)
    # (Last: the ranks that stay away leave the flat leg's barrier half done.)
    monitored_barriers()


def basic():
    rank, size = dist.get_rank(), dist.get_world_size()
    data = torch.full((10,), float(rank + 1))
    dist.all_reduce(data)
    check(torch.equal(data, torch.full((10,), size * (size + 1) / 2)), f"all_reduce: {data}")
    dist.barrier()


def again():
    """The group destroyed and made again (twice), with calls from another thread between."""
    basic()
    for _ in range(2):
        dist.destroy_process_group()
        init()
        basic()
        # Calls from another thread, then this one: they take turns on the one session.
        worker = threading.Thread(target=basic)
        worker.start()
        worker.join()
        basic()


def death():
    rank = dist.get_rank()
    data = torch.ones(1000)
    for round in range(50):
        if rank == 1 and round == 20:
            os._exit(3)  # dies without a word, between two all-reduces
        try:
            dist.all_reduce(data)
        except shmbroker.PeerLost as error:
            check(error.rank == 1, f"PeerLost names rank {error.rank}, not 1: {error}")
            check(round >= 20, f"PeerLost in round {round}, before rank 1 died")
            print(f"OK death rank {rank}: {error}", flush=True)
            sys.exit(0)
    check(False, "every all_reduce succeeded after rank 1 died")


def span_death():
    """On a world spanning nodes, rank VICTIM dies in the middle of all-reduces (small, then
    past the rails' threshold); every other rank, on every node, must raise PeerLost naming it.
    The victim writes when it died to DIED_AT; each survivor prints when it learned it."""
    rank = dist.get_rank()
    victim = int(os.environ["VICTIM"])
    for round in range(60):
        data = torch.ones(10 if round < 30 else 300_000)
        if rank == victim and round in (20, 50):
            if round == 50 or os.environ.get("LATE") != "1":
                with open(os.environ["DIED_AT"], "w") as file:
                    file.write(repr(time.time()))
                os._exit(3)
        try:
            dist.all_reduce(data)
        except shmbroker.PeerLost as error:
            learned = time.time()
            check(error.rank == victim, f"PeerLost names rank {error.rank}, not {victim}: {error}")
            print(f"OK span_death rank {rank} learned at {learned!r}: {error}", flush=True)
            sys.exit(0)
        except dist.DistBackendError as error:
            # A victim alone on its node: no node peer sees the death, gloo's leg breaks.
            learned = time.time()
            alone = os.environ.get("ALONE") == "1"
            check(alone and "no rank saw a death" in str(error), f"{type(error)}: {error}")
            print(f"OK span_death rank {rank} learned at {learned!r}: {error}", flush=True)
            sys.exit(0)
    check(False, f"every all_reduce succeeded after rank {victim} died")


def span_chaos():
    """On a world spanning nodes, mixed calls until one fails: the test kills a rank at a random
    moment (SIGKILL, from outside, maybe in the middle of a call). Every other rank must raise
    PeerLost naming it, whatever call it was in, and hang nowhere."""
    rank, size = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    print("READY", flush=True)
    victim = int(os.environ["VICTIM"])
    small, large = torch.ones(10), torch.ones(300_000)
    parts = [torch.zeros(1000) for _ in range(size)]
    message, got = torch.ones(5000), torch.zeros(5000)
    deadline = time.monotonic() + 60
    calls = 0
    try:
        while time.monotonic() < deadline:
            dist.all_reduce(small)
            dist.all_reduce(large)
            dist.all_gather(parts, torch.full((1000,), float(rank)))
            dist.broadcast(small, calls % size)
            work = dist.isend(message, (rank + 1) % size)
            dist.recv(got, (rank - 1) % size)
            work.wait()
            dist.barrier()
            calls += 1
    except shmbroker.PeerLost as error:
        check(error.rank == victim, f"PeerLost names rank {error.rank}, not {victim}: {error}")
        print(f"OK span_chaos rank {rank} after {calls} rounds: {error}", flush=True)
        sys.exit(0)
    check(False, f"60 s of calls and no failure (rank {victim} was to be killed)")


def span_stop():
    """On a world spanning nodes with a 3 s deadline, rank VICTIM stops itself (SIGSTOP) in the
    middle of all-reduces; every other rank, on every node, must raise a Timeout naming it as
    stopped. (The test kills the victim.)"""
    import signal

    rank = dist.get_rank()
    victim = int(os.environ["VICTIM"])
    for round in range(40):
        if rank == victim and round == 20:
            os.kill(os.getpid(), signal.SIGSTOP)
        try:
            dist.all_reduce(torch.ones(10))
        except shmbroker.Timeout as error:
            check(error.stopped == victim, f"Timeout names {error.stopped}, not {victim}: {error}")
            check(isinstance(error, dist.DistBackendError), f"{type(error)}")
            print(f"OK span_stop rank {rank}: {error}", flush=True)
            sys.exit(0)
    check(False, f"every all_reduce succeeded after rank {victim} stopped")


def monitored_barriers():
    """monitored_barrier passes with everyone; on rank 0 alone its timeout names the others."""
    import re

    rank, size = dist.get_rank(), dist.get_world_size()
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    if rank == 0:
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=1), wait_all_ranks=True)
            check(False, "a monitored_barrier nobody else came to passed")
        except dist.DistBackendError as error:
            text = str(error)
            missing = ", ".join(map(str, range(1, size)))
            check(f"Ranks {missing} failed to pass monitoredBarrier in 1000 ms" in text, text)
            check(isinstance(error, shmbroker.Timeout), f"{type(error)}")
            check(error.waiting_for == list(range(1, size)), f"{error.waiting_for}")
            # What torch's own callers look for in a timeout's text.
            check(re.search(" (Timed out|closed|timeout) ", text) is not None, text)
    else:
        time.sleep(2)


def trips():
    """What torch programs trip on where gloo works: tags, all_gather_coalesced,
    monitored_barrier, and a timeout's text."""
    rank, size = dist.get_rank(), dist.get_world_size()
    # Tags: two messages sent in one order, received in the other, and one from any source.
    if rank == 0:
        dist.send(torch.full((3,), 7.0), 1, tag=7)
        dist.send(torch.full((5,), 3.0), 1, tag=3)
    elif rank == 1:
        three, seven = torch.zeros(5), torch.zeros(3)
        dist.recv(three, 0, tag=3)
        dist.recv(seven, 0, tag=7)
        check(torch.equal(three, torch.full((5,), 3.0)), f"tag 3 gave {three}")
        check(torch.equal(seven, torch.full((3,), 7.0)), f"tag 7 gave {seven}")
    if rank == 2:
        dist.send(torch.full((2,), 9.0), 0, tag=1)
        dist.send(torch.full((2,), 2.0), 0, tag=2)
    if rank == 0:
        first = torch.zeros(2)
        sender = dist.recv(first, tag=2)  # any source
        later = torch.zeros(2)
        dist.recv(later, 2, tag=1)
        check(sender == 2 and torch.equal(first, torch.full((2,), 2.0)), f"tag 2: {first}")
        check(torch.equal(later, torch.full((2,), 9.0)), f"tag 1 gave {later}")
    dist.barrier()
    # all_gather_coalesced.
    inputs = [torch.full((2,), float(rank)), torch.full((3,), float(10 * rank))]
    outputs = [[torch.zeros(2) for _ in range(size)], [torch.zeros(3) for _ in range(size)]]
    dist.all_gather_coalesced(outputs, inputs)
    for r in range(size):
        check(torch.equal(outputs[0][r], torch.full((2,), float(r))), f"coalesced 0: {outputs}")
        check(torch.equal(outputs[1][r], torch.full((3,), float(10 * r))), f"coalesced 1: {outputs}")
    monitored_barriers()


def init():
    if len(sys.argv) > 2 and sys.argv[4].startswith("store:"):
        # The test hosts the store, as torchrun's agent does: it outlives any rank.
        rank, size, port = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4][6:])
        store = dist.TCPStore("127.0.0.1", port, size, False, timeout=TIMEOUT)
        dist.init_process_group(
            "shmbroker", store=store, rank=rank, world_size=size, timeout=TIMEOUT
        )
    elif len(sys.argv) > 2:
        rank, size, method = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
        dist.init_process_group(
            "shmbroker", init_method=method, rank=rank, world_size=size, timeout=TIMEOUT
        )
    else:
        dist.init_process_group("shmbroker", timeout=TIMEOUT)


def main():
    scenario = sys.argv[1]
    init()
    global GLOO
    GLOO = dist.new_group(backend="gloo") if scenario in ("against_gloo", "spanning") else None
    scenarios = {
        "against_gloo": against_gloo,
        "spanning": spanning,
        "basic": basic,
        "again": again,
        "death": death,
        "trips": trips,
        "span_death": span_death,
        "span_stop": span_stop,
        "span_chaos": span_chaos,
    }
    scenarios[scenario]()
    rank = dist.get_rank()
    dist.destroy_process_group()
    print(f"OK {scenario} rank {rank}", flush=True)


if __name__ == "__main__":
    main()
