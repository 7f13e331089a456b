"""torch.distributed's all_reduce (f32 sum) and barrier: the shmbroker backend against gloo, side
by side in one run.

    shmbroker run -n 2 -- python3 python/bench/torch_backend.py [--rounds 5] [--budget 0.3]

Every rank makes the default group with the shmbroker backend and a gloo group of the same
ranks. For each size (8 B to 16 MiB) and each round, the two take turns (which goes first
alternates by round): a warm-up, then calls timed one by one with `time.perf_counter_ns()` for
about `--budget` seconds, each after a barrier on the same backend so that every call starts
with all ranks in it. Rank 0 prints, per size, each backend's p50 and p99 over all rounds'
samples (microseconds) and the ratios gloo/shmbroker (above 1: shmbroker faster).

The figures are what a program sees from Python through `torch.distributed`, dispatch included.
Nothing is asserted: a busy machine moves every figure.
"""

import sys

import torch
import torch.distributed as dist
from _timing import SIZES, arguments, row, timed

import shmbroker.torch  # noqa: F401  (registers the backend)


def main():
    args = arguments()
    dist.init_process_group("shmbroker")
    gloo = dist.new_group(backend="gloo")
    groups = {"shmbroker": dist.group.WORLD, "gloo": gloo}
    rank, size = dist.get_rank(), dist.get_world_size()

    def agree(count):
        count = torch.tensor([count])
        dist.broadcast(count, 0)
        return int(count)

    rows = [("barrier", None)] + [(f"all_reduce {n} B", n) for n in SIZES]
    if rank == 0:
        print(f"# {size} ranks, {args.rounds} rounds, f32 sum; microseconds", flush=True)
        print(
            f"{'call':<22} {'shmbroker p50':>14} {'p99':>9} {'gloo p50':>11} {'p99':>9}"
            f" {'gloo/ours p50':>16} {'p99':>6}",
            flush=True,
        )
    for name, nbytes in rows:
        samples = {backend: [] for backend in groups}
        data = torch.ones(max(1, (nbytes or 4) // 4), dtype=torch.float32)
        for round in range(args.rounds):
            order = list(groups) if round % 2 == 0 else list(groups)[::-1]
            for backend in order:
                group = groups[backend]
                if nbytes is None:

                    def call(group=group):
                        dist.barrier(group=group)
                else:

                    def call(group=group):
                        dist.all_reduce(data, group=group)

                samples[backend] += timed(
                    call, lambda group=group: dist.barrier(group=group), args.budget, agree
                )
        if rank == 0:
            print(row(name, samples["shmbroker"], samples["gloo"], True), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
