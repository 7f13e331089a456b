"""Python `Session.barrier()` against Rust's `Session::barrier`, 2 ranks, hot (spinning).

    python3 python/bench_barrier.py [--rounds 5] [--samples 5000]

Each round runs both, in alternating order:

- Rust: `bench collectives --only barrier_hot --json --rounds 1` (target/release/bench, from
  `cargo build --release -p shmbroker-benchmarks`), the project's own benchmark (2 forked workers, spinning waits); its `"impl":"shmbroker"` row.
- Python: `shmbroker run -n 2 -- python3 bench_barrier.py --worker SAMPLES` with
  `SHMBROKER_SPIN=forever` (the same spinning waits), timing each `barrier()` call on rank 0
  with `time.perf_counter_ns()` after the same warm-up (SAMPLES / 10 + 10 calls).

It prints each round's p50 and p99 (nanoseconds) and the median over rounds of each, with the
difference Python - Rust; the target is a p50 difference of at most 2 us. The Python figure
includes the timer calls and the interpreter loop around each call, as a program's would.
`SHMBROKER_BIN` names the launcher (default: the repository's target/release/shmbroker).
Nothing is asserted: a busy machine moves every figure.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Run as a script, this file puts python/ first on sys.path, where the package's source (without
# its native module, which `pip install ./python` put in site-packages) would hide the installed
# package.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    del sys.path[0]


def percentile(sorted_samples, p):
    """As the Rust benchmark's `percentile`: the nearest rank of (n - 1) * p / 100."""
    rank = round((len(sorted_samples) - 1) * p / 100)
    return sorted_samples[min(rank, len(sorted_samples) - 1)]


def worker(samples):
    import shmbroker

    with shmbroker.connect(timeout=60) as session:
        barrier = session.barrier
        for _ in range(samples // 10 + 10):
            barrier()
        clock = time.perf_counter_ns
        times = []
        for _ in range(samples):
            start = clock()
            barrier()
            times.append(clock() - start)
        # What the two timer calls alone take, for the reader (not subtracted).
        timer = []
        for _ in range(samples):
            start = clock()
            timer.append(clock() - start)
        if session.rank == 0:
            times.sort()
            timer.sort()
            row = {
                "p50_ns": percentile(times, 50),
                "p99_ns": percentile(times, 99),
                "timer_p50_ns": percentile(timer, 50),
                "samples": samples,
            }
            print(json.dumps(row), flush=True)


def launcher():
    path = Path(os.environ.get("SHMBROKER_BIN", REPO / "target" / "release" / "shmbroker"))
    if not path.is_file():
        sys.exit(f"no launcher at {path}: cargo build --release -p shmbroker-cli")
    return str(path)


def bench():
    path = Path(os.environ.get("SHMBROKER_BENCH_BIN", REPO / "target" / "release" / "bench"))
    if not path.is_file():
        sys.exit(f"no bench at {path}: cargo build --release -p shmbroker-benchmarks")
    return str(path)


def rust_round(binary):
    command = [binary, "collectives", "--only", "barrier_hot", "--json", "--rounds", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    for line in done.stdout.splitlines():
        row = json.loads(line)
        if row.get("bench") == "barrier_hot" and row.get("impl") == "shmbroker":
            return row
    sys.exit(f"no shmbroker barrier_hot row in:\n{done.stdout}\n{done.stderr}")


def python_round(binary, samples):
    env = dict(os.environ, SHMBROKER_SPIN="forever")
    command = [binary, "run", "-n", "2", "--timeout", "120", "--"]
    command += [sys.executable, __file__, "--worker", str(samples)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    if done.returncode != 0:
        sys.exit(f"the Python job failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=5000, help="timed barriers per round")
    parser.add_argument("--worker", type=int, metavar="SAMPLES", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return
    binary, bench_binary = launcher(), bench()
    rust, python = [], []
    print(f"barrier, 2 ranks, hot; {args.samples} samples a round, {os.cpu_count()} CPUs")
    print(f"{'round':>5}  {'Rust p50':>9} {'p99':>7}  {'Python p50':>10} {'p99':>7}  (ns)")
    for round_ in range(args.rounds):
        if round_ % 2 == 0:
            rust.append(rust_round(bench_binary))
            python.append(python_round(binary, args.samples))
        else:
            python.append(python_round(binary, args.samples))
            rust.append(rust_round(bench_binary))
        r, p = rust[-1], python[-1]
        print(
            f"{round_ + 1:>5}  {r['p50_ns']:>9} {r['p99_ns']:>7}  "
            f"{p['p50_ns']:>10} {p['p99_ns']:>7}  (timer alone: {p['timer_p50_ns']} ns)"
        )
    median = {
        (who, p): statistics.median(row[f"{p}_ns"] for row in rows)
        for who, rows in (("rust", rust), ("python", python))
        for p in ("p50", "p99")
    }
    print(f"median over {args.rounds} rounds:")
    for p in ("p50", "p99"):
        diff = median[("python", p)] - median[("rust", p)]
        print(
            f"  {p}: Rust {median[('rust', p)]:.0f} ns, Python {median[('python', p)]:.0f} ns, "
            f"difference {diff:+.0f} ns"
        )
    diff = median[("python", "p50")] - median[("rust", "p50")]
    verdict = "within" if diff <= 2000 else "OVER"
    print(f"Python overhead at p50: {diff / 1000:.2f} us ({verdict} the 2 us target)")


if __name__ == "__main__":
    main()
