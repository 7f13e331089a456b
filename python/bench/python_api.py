"""The Python API's all_reduce (f32 sum, NumPy arrays in place) and barrier against mpi4py's
Allreduce and Barrier on Open MPI, side by side in one run.

    mpirun -n 2 python3 python/bench/python_api.py [--rounds 5] [--budget 0.3]

(`pip install mpi4py numpy`; mpi4py builds against libopenmpi-dev.) Under mpirun,
`shmbroker.connect()` needs no argument: local rank 0 hosts the broker. For each size (8 B to
16 MiB) and each round the two take turns (which goes first alternates by round): a warm-up,
then calls timed one by one with `time.perf_counter_ns()` for about `--budget` seconds, each
after a barrier of the same library. Rank 0 prints each one's p50 and p99 over all rounds'
samples (microseconds) and the ratios ours/mpi4py (below 1: shmbroker faster).

Nothing is asserted: a busy machine moves every figure.
"""


import numpy
from _timing import SIZES, arguments, row, timed
from mpi4py import MPI

import shmbroker


def main():
    args = arguments()
    comm = MPI.COMM_WORLD
    session = shmbroker.connect(timeout=60)
    rank, size = session.rank, session.world_size
    if (rank, size) != (comm.Get_rank(), comm.Get_size()):
        raise SystemExit(f"shmbroker rank {rank} of {size}, MPI {comm.Get_rank()} of {comm.Get_size()}")
    if rank == 0:
        print(f"# {size} ranks, {args.rounds} rounds, f32 sum; microseconds", flush=True)
        print(
            f"{'call':<22} {'shmbroker p50':>14} {'p99':>9} {'mpi4py p50':>11} {'p99':>9}"
            f" {'ours/mpi4py p50':>16} {'p99':>6}",
            flush=True,
        )
    rows = [("barrier", None)] + [(f"all_reduce {n} B", n) for n in SIZES]
    for name, nbytes in rows:
        ours_data = numpy.ones(max(1, (nbytes or 4) // 4), dtype=numpy.float32)
        mpi_in = ours_data.copy()
        mpi_out = numpy.empty_like(mpi_in)
        if nbytes is None:
            calls = {"shmbroker": session.barrier, "mpi4py": comm.Barrier}
        else:
            calls = {
                "shmbroker": lambda: session.all_reduce(ours_data),
                "mpi4py": lambda: comm.Allreduce(mpi_in, mpi_out, op=MPI.SUM),
            }
        barriers = {"shmbroker": session.barrier, "mpi4py": comm.Barrier}
        samples = {name: [] for name in calls}
        for round in range(args.rounds):
            order = list(calls) if round % 2 == 0 else list(calls)[::-1]
            for library in order:
                samples[library] += timed(
                    calls[library], barriers[library], args.budget, lambda n: comm.bcast(n, root=0)
                )
        if rank == 0:
            print(row(name, samples["shmbroker"], samples["mpi4py"], False), flush=True)
    session.close()


if __name__ == "__main__":
    main()
