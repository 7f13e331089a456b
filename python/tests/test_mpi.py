"""shmbroker.mpi under a real mpirun, with SHMBROKER_NODE forming several nodes on this machine:
every call against mpi4py's own. Skipped when mpi4py or mpirun is missing, unless
SHMBROKER_REQUIRE_MPI=1 (as in CI) makes that a failure."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env

if os.environ.get("SHMBROKER_REQUIRE_MPI") == "1":
    import mpi4py  # noqa: F401  (fails the run when mpi4py is missing)

    assert shutil.which("mpirun"), "mpirun is missing"
else:
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install mpi4py)")
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed", allow_module_level=True)

WORKERS = Path(__file__).with_name("mpi_workers.py")

LAYOUTS = {
    "2 nodes x 2, in blocks": (4, "R / 2"),
    "2 nodes x 2, interleaved": (4, "R % 2"),
    "3 nodes x 2": (6, "R / 2"),
    "1 + 2, uneven": (3, "(R > 0)"),
    "2 nodes x 2, named by the argument": (4, "R / 2"),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_call_gives_what_mpi_gives(layout):
    ranks, node = LAYOUTS[layout]
    env = clean_env({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    variable = "TEST_NODE" if "argument" in layout else "SHMBROKER_NODE"
    script = f'R=$OMPI_COMM_WORLD_RANK; {variable}=node$(({node})) exec "$0" "$1"'
    job = subprocess.run(
        ["mpirun", "-np", str(ranks), "--oversubscribe", "sh", "-c", script]
        + [sys.executable, str(WORKERS)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert job.returncode == 0, job.stdout + job.stderr[-3000:]
    for rank in range(ranks):
        assert f"OK mpi rank {rank}" in job.stdout, job.stdout + job.stderr[-3000:]
