"""The worker side of test_mpi.py, run under mpirun with SHMBROKER_NODE set per rank: every call
of shmbroker.mpi.Nodes against mpi4py's own on the same data. Prints `OK mpi rank <r>`; a failed
check aborts the job."""

import array
import os
import sys

from mpi4py import MPI

import shmbroker
import shmbroker._nodes
import shmbroker.mpi

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def check(condition, what):
    if not condition:
        print(f"FAILED rank {rank}: {what}", file=sys.stderr, flush=True)
        comm.Abort(1)


OPS = {
    "sum": MPI.SUM,
    "prod": MPI.PROD,
    "min": MPI.MIN,
    "max": MPI.MAX,
    "bit_and": MPI.BAND,
    "bit_or": MPI.BOR,
    "bit_xor": MPI.BXOR,
}
TYPES = {"i": MPI.INT32_T, "q": MPI.INT64_T, "d": MPI.DOUBLE, "f": MPI.FLOAT}

# TEST_NODE, when set, names the node through the argument instead of SHMBROKER_NODE.
with shmbroker.mpi.Nodes(comm, node=os.environ.get("TEST_NODE")) as nodes:
    check(nodes.nodes > 1, "the layout spans nodes (set SHMBROKER_NODE per rank)")
    # This node's ranks, by session rank: what errors from inside the node are renumbered by.
    names = comm.allgather(os.environ.get("TEST_NODE") or os.environ["SHMBROKER_NODE"])
    mates = [r for r in range(size) if names[r] == names[rank]]
    check(nodes._node_ranks == mates, f"node ranks {nodes._node_ranks}, not {mates}")
    # An error from the node's session names the communicator's rank.
    if len(mates) > 1:
        local = shmbroker.PeerLost("peer rank 1 was lost", 1)
        named = shmbroker._nodes.renumbered(local, nodes._node_ranks, "ranks of the communicator")
        check(named.rank == mates[1], f"renumbered to {named.rank}, not {mates[1]}")
    # 0, 1, odd, and past the rails' threshold (odd: padded).
    for count in (0, 1, 7, 70_001, 100_003):
        for code, mpi_type in TYPES.items():
            for name, op in OPS.items():
                if code in "df" and name.startswith("bit"):
                    continue
                values = [(i * 7 + rank * 3) % 5 + 1 for i in range(count)]
                ours, theirs = array.array(code, values), array.array(code, values)
                nodes.all_reduce(ours, name)
                comm.Allreduce(MPI.IN_PLACE, [theirs, mpi_type], op)
                check(ours == theirs, f"all_reduce {name} {code} x{count}")
    mean = array.array("d", [rank + 1.0] * 10)
    nodes.all_reduce(mean, "avg")
    check(list(mean) == [(size + 1) / 2] * 10, f"all_reduce avg: {list(mean)}")
    try:
        nodes.all_reduce(bytearray(4), dtype="float16")
        check(False, "float16 (MPI has no such type) passed")
    except shmbroker.MisuseError:
        pass
    nodes.barrier()
    for root in range(size):
        text = f"from rank {root}".encode()
        message = bytearray(text if rank == root else bytes(len(text)))
        nodes.broadcast(root, message)
        check(bytes(message) == text, f"broadcast from {root}")
    gathered = nodes.all_gather(array.array("q", [rank, rank * 10]))
    want = array.array("q", [x for r in range(size) for x in (r, r * 10)]).tobytes()
    check(gathered == want, "all_gather in rank order")

print(f"OK mpi rank {rank}", flush=True)
