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

import argparse
import os
import sys
import time
from pathlib import Path

# Run as a script, this file puts python/bench/ first on sys.path; the package's source in
# python/ is not on it, so the installed package (with its native module) is the one imported.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import shmbroker.torch  # noqa: E402,F401  (registers the backend)

SIZES = [8, 1 << 10, 4 << 10, 64 << 10, 1 << 20, 16 << 20]


def percentile(sorted_samples, p):
    return sorted_samples[round((len(sorted_samples) - 1) * p / 100)]


def timed(call, group, budget):
    """Nanoseconds of each `call()`, each after a barrier on `group`, for about `budget` s."""
    for _ in range(3):
        dist.barrier(group=group)
        call()
    samples = []
    # Every rank runs the same number of calls: rank 0 decides, from a probe, how many.
    dist.barrier(group=group)
    start = time.perf_counter()
    call()
    probe = time.perf_counter() - start
    count = torch.tensor([max(5, min(2000, int(budget / max(probe, 1e-6))))])
    dist.broadcast(count, 0, group=group)
    for _ in range(int(count)):
        dist.barrier(group=group)
        start = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - start)
    return samples


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.3, help="seconds per size and round")
    args = parser.parse_args()
    dist.init_process_group("shmbroker")
    gloo = dist.new_group(backend="gloo")
    groups = {"shmbroker": dist.group.WORLD, "gloo": gloo}
    rank, size = dist.get_rank(), dist.get_world_size()
    rows = [("barrier", None)] + [(f"all_reduce {n} B", n) for n in SIZES]
    if rank == 0:
        print(f"# {size} ranks, {args.rounds} rounds, f32 sum; microseconds", flush=True)
        print(
            f"{'call':<22} {'shmbroker p50':>14} {'p99':>9} {'gloo p50':>10} {'p99':>9}"
            f" {'gloo/ours p50':>14} {'p99':>6}",
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

                samples[backend] += timed(call, group, args.budget)
        if rank == 0:
            ours = sorted(samples["shmbroker"])
            theirs = sorted(samples["gloo"])
            o50, o99 = percentile(ours, 50) / 1e3, percentile(ours, 99) / 1e3
            t50, t99 = percentile(theirs, 50) / 1e3, percentile(theirs, 99) / 1e3
            print(
                f"{name:<22} {o50:>14.1f} {o99:>9.1f} {t50:>10.1f} {t99:>9.1f}"
                f" {t50 / o50:>14.1f} {t99 / o99:>6.1f}",
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
