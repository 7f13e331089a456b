"""What the benchmarks in this folder share: their sizes and arguments, percentiles, and timing
calls one by one, each after a barrier, the same number of times on every rank."""

import argparse
import time

# The all-reduce sizes, in bytes: 8 B to 16 MiB.
SIZES = [8, 1 << 10, 4 << 10, 64 << 10, 1 << 20, 16 << 20]


def arguments(**counts):
    """`--rounds` and `--budget` (seconds per size and round), and an integer option per entry
    of `counts` (its default; `per_node` is `--per-node`)."""
    parser = argparse.ArgumentParser()
    for name, default in counts.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.3, help="seconds per size and round")
    return parser.parse_args()


def percentile(sorted_samples, p):
    """As the Rust benchmark's `percentile`: the nearest rank of (n - 1) * p / 100."""
    return sorted_samples[round((len(sorted_samples) - 1) * p / 100)]


def timed(call, barrier, budget, agree):
    """Nanoseconds of each `call()`, each after `barrier()`, for about `budget` seconds, after a
    warm-up. `agree(count)` gives every rank rank 0's count (from a probe of one call), so all
    ranks make the same number of calls."""
    for _ in range(3):
        barrier()
        call()
    barrier()
    start = time.perf_counter()
    call()
    probe = time.perf_counter() - start
    count = agree(max(5, min(2000, int(budget / max(probe, 1e-6)))))
    samples = []
    for _ in range(count):
        barrier()
        start = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - start)
    return samples


def row(name, ours, theirs, ratio_of_theirs):
    """A table row: p50 and p99 (microseconds) of `ours` and `theirs` (nanosecond samples), and
    their ratios, theirs/ours when `ratio_of_theirs`, else ours/theirs."""
    ours, theirs = sorted(ours), sorted(theirs)
    o50, o99 = percentile(ours, 50) / 1e3, percentile(ours, 99) / 1e3
    t50, t99 = percentile(theirs, 50) / 1e3, percentile(theirs, 99) / 1e3
    r50, r99 = (t50 / o50, t99 / o99) if ratio_of_theirs else (o50 / t50, o99 / t99)
    return f"{name:<22} {o50:>14.1f} {o99:>9.1f} {t50:>11.1f} {t99:>9.1f} {r50:>16.2f} {r99:>6.2f}"
