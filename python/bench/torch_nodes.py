"""torch.distributed on a world spanning nodes: the shmbroker backend (shared memory inside each
node, gloo between nodes) against a flat gloo group of the same ranks, and gloo's leader step
alone, side by side in one run.

    python3 python/bench/torch_nodes.py [--nodes 2] [--per-node 2] [--rounds 5] [--budget 0.3]
        [--samples 1]

It starts `nodes * per-node` ranks on this machine, each with its node's `SHMBROKER_NODE`, on a
TCP store it hosts, so the network leg runs over loopback TCP. (On the 16-core machine:
`--nodes 2 --per-node 8`.) Every rank makes the default group with the shmbroker backend, a
gloo group of every rank ("flat gloo"), and the leaders (the first rank of every node) a gloo
group of their own ("leader step": what the network leg of a small all-reduce costs by itself).

For each call and each round the backends take turns (which goes first alternates by round): a
warm-up, then calls timed one by one for about `--budget` seconds, each after a barrier on the
same backend. Rank 0 prints, per call, each one's p50 and p99 (microseconds) and the ratio
flat gloo / shmbroker (above 1: shmbroker faster). Nothing is asserted. `--samples 1` also
prints every sample, per round, for `bench` (its `torch_nodes_*` rows run this script).
"""

import datetime
import os
import subprocess
import sys

import torch
import torch.distributed as dist
from _timing import arguments, percentile, row, timed

# (name, key for `bench`, bytes or what the call is).
ROWS = [
    ("barrier", "barrier", None),
    ("all_reduce 8 B", "all_reduce_8", 8),
    ("all_reduce 64 KiB", "all_reduce_65536", 64 << 10),
    ("all_reduce 1 MiB", "all_reduce_1048576", 1 << 20),
    ("all_reduce 16 MiB", "all_reduce_16777216", 16 << 20),
    ("all_gather 1 KiB", "all_gather_1024", "gather"),
]


def launch(args):
    """Starts every rank and waits for them (with a deadline, killing them on the way out)."""
    size = args.nodes * args.per_node
    store = dist.TCPStore(
        "127.0.0.1", 0, size, True, timeout=datetime.timedelta(seconds=300), wait_for_workers=False
    )
    ranks = []
    try:
        for rank in range(size):
            foreign = ("SHMBROKER_", "TORCHELASTIC")
            env = {k: v for k, v in os.environ.items() if not k.startswith(foreign)}
            env.update(
                SHMBROKER_NODE=f"node{rank // args.per_node}",
                BENCH_RANK=str(rank),
                BENCH_SIZE=str(size),
                BENCH_STORE=str(store.port),
            )
            ranks.append(subprocess.Popen([sys.executable, *sys.argv], env=env))
        for process in ranks:
            process.wait(timeout=1800)
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.wait()
    return max(process.returncode for process in ranks)


def work(args):
    import shmbroker.torch  # noqa: F401  (registers the backend)

    rank, size = int(os.environ["BENCH_RANK"]), int(os.environ["BENCH_SIZE"])
    timeout = datetime.timedelta(seconds=300)
    store = dist.TCPStore("127.0.0.1", int(os.environ["BENCH_STORE"]), size, False, timeout=timeout)
    dist.init_process_group("shmbroker", store=store, rank=rank, world_size=size, timeout=timeout)
    flat = dist.new_group(backend="gloo")
    leader_ranks = list(range(0, size, args.per_node))
    leaders = dist.new_group(leader_ranks, backend="gloo")
    groups = {"shmbroker": dist.group.WORLD, "gloo": flat}

    def agree(count, group=None):
        count = torch.tensor([count])
        dist.broadcast(count, 0 if group is None else leader_ranks[0], group=group)
        return int(count)

    if rank == 0:
        print(
            f"# {args.nodes} nodes x {args.per_node} ranks (loopback TCP between nodes), "
            f"{args.rounds} rounds, f32 sum; microseconds",
            flush=True,
        )
        print(
            f"{'call':<22} {'shmbroker p50':>14} {'p99':>9} {'flat gloo p50':>11} {'p99':>9}"
            f" {'gloo/ours p50':>16} {'p99':>6} {'leader step p50':>16}",
            flush=True,
        )
    for name, key, nbytes in ROWS:
        if nbytes is None:

            def call(group):
                dist.barrier(group=group)
        elif nbytes == "gather":
            part = torch.ones(256)
            out = torch.empty(256 * size)

            def call(group, part=part, out=out):
                if group is leaders:
                    dist.all_gather_into_tensor(
                        torch.empty(256 * args.per_node * len(leader_ranks)),
                        torch.ones(256 * args.per_node),
                        group=group,
                    )
                else:
                    dist.all_gather_into_tensor(out, part, group=group)
        else:
            data = torch.ones(max(1, nbytes // 4))

            def call(group, data=data):
                dist.all_reduce(data, group=group)

        # Per round: each backend's samples, and the leader step's.
        rounds = {backend: [] for backend in [*groups, "leaders"]}
        for round in range(args.rounds):
            order = list(groups) if round % 2 == 0 else list(groups)[::-1]
            for backend in order:
                group = groups[backend]
                rounds[backend].append(
                    timed(
                        lambda group=group: call(group),
                        lambda group=group: dist.barrier(group=group),
                        args.budget,
                        agree,
                    )
                )
            if rank in leader_ranks:
                rounds["leaders"].append(
                    timed(
                        lambda: call(leaders),
                        lambda: dist.barrier(group=leaders),
                        args.budget,
                        lambda count: agree(count, leaders),
                    )
                )
            dist.barrier()
        if rank == 0:
            pooled = {backend: [x for r in lists for x in r] for backend, lists in rounds.items()}
            step = percentile(sorted(pooled["leaders"]), 50) / 1e3
            ours = row(name, pooled["shmbroker"], pooled["gloo"], True)
            print(f"{ours} {step:>16.1f}", flush=True)
            if args.samples:
                # For `bench`: one line per sample, "torch_nodes_sample ROW BACKEND ROUND NS".
                for backend, lists in rounds.items():
                    for number, samples in enumerate(lists):
                        for ns in samples:
                            print(f"torch_nodes_sample {key} {backend} {number} {ns}")
                sys.stdout.flush()
    dist.destroy_process_group()
    return 0


def main():
    args = arguments(nodes=2, per_node=2, samples=0)
    if "BENCH_RANK" in os.environ:
        return work(args)
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
