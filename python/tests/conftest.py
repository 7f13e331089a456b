"""Starting real worker processes under `shmbroker run`, with deadlines.

`SHMBROKER_BIN` names the launcher; by default the repository's `target/release/shmbroker`
(`cargo build --release -p shmbroker-cli`). Every job runs under the launcher's `--timeout`, and
the launcher itself under a subprocess timeout: on expiry it is killed, and its copies die with it
(they have `PR_SET_PDEATHSIG`), so no test can hang or leave a process behind.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).with_name("workers.py")
LAUNCHER_TIMEOUT = 60

# Variables of other launchers: inherited by a test run under one, they would contradict ours.
FOREIGN = ("OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "SLURM_", "TORCHELASTIC_")
FOREIGN_NAMES = ("LOCAL_RANK", "LOCAL_WORLD_SIZE")


def launcher():
    path = Path(os.environ.get("SHMBROKER_BIN", REPO / "target" / "release" / "shmbroker"))
    if not path.is_file():
        pytest.fail(
            f"no launcher at {path}: build it with `cargo build --release -p shmbroker-cli`, "
            "or set SHMBROKER_BIN"
        )
    return path


def clean_env(extra=None):
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(FOREIGN) and name not in FOREIGN_NAMES
    }
    env.update(extra or {})
    return env


def run_job(copies, *argv, env=None, timeout=LAUNCHER_TIMEOUT, options=()):
    """`shmbroker run -n COPIES --tag-output --timeout T OPTIONS -- python ARGV...`, finished."""
    command = [
        str(launcher()),
        "run",
        "-n",
        str(copies),
        "--tag-output",
        "--timeout",
        str(timeout),
        *options,
        "--",
        sys.executable,
        *map(str, argv),
    ]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout + 30,
        env=clean_env(env),
        stdin=subprocess.DEVNULL,
    )


def run_scenario(copies, scenario, *args, env=None, options=()):
    return run_job(copies, WORKERS, scenario, *args, env=env, options=options)


def describe(job):
    return f"exit status {job.returncode}\n--- stdout\n{job.stdout}\n--- stderr\n{job.stderr}"


def assert_ok(job, copies, scenario, ranks=None):
    """The job succeeded and every rank (of `ranks`) finished the scenario."""
    assert job.returncode == 0, describe(job)
    for rank in range(copies) if ranks is None else ranks:
        assert f"[{rank}] OK {scenario} rank {rank}" in job.stdout, describe(job)
