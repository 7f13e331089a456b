"""Another user cannot host this user's job: a connect, a launcher's `connect()` and the torch
backend's all check the broker's uid (`SO_PEERCRED`) before they send anything.

The squatter is a real process running as uid 65534 ("nobody"), listening on a socket in a
shared, sticky, world-writable directory. These tests need root to start it, and skip without.
"""

import os
import subprocess
import sys
import time

import pytest

import shmbroker
from conftest import clean_env

NOBODY = 65534

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="running as another uid needs root")

SQUATTER = """
import socket, sys
listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen()
print("listening", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def squatter(tmp_path):
    """A socket listening as uid 65534 in a shared directory: its path."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    tmp_path.chmod(0o755)
    path = shared / "job.sock"
    child = subprocess.Popen(
        [sys.executable, "-c", SQUATTER, str(path)],
        user=NOBODY,
        group=NOBODY,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "listening"
        yield path
    finally:
        child.kill()
        child.wait(timeout=10)


@needs_root
def test_connect_refuses_a_broker_of_another_user(squatter):
    started = time.monotonic()
    with pytest.raises(shmbroker.LogonError, match="runs as uid 65534") as error:
        shmbroker.connect(str(squatter), 0, timeout=60.0)
    assert "SHMBROKER_BROKER_UID" in str(error.value)
    # Refused at once, not at the deadline: nothing was sent for the squatter to ignore.
    assert time.monotonic() - started < 30


def refused_in_a_process(squatter, rank, size, program):
    """Runs `program` (which prints 'refused:' and the error when it gets one) in a process whose
    launcher variables name the squatter's socket as its job's external broker."""
    env = clean_env(
        {
            "SHMBROKER_RANK": str(rank),
            "SHMBROKER_WORLD_SIZE": str(size),
            "SHMBROKER_SOCKET": str(squatter),
            "SHMBROKER_BROKER": "external",
        }
    )
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120
    )
    assert "refused:" in done.stdout and "runs as uid 65534" in done.stdout, done


@needs_root
def test_a_launcher_job_refuses_it_too(squatter):
    # What `connect()` reads under a launcher.
    program = (
        "import shmbroker\n"
        "try:\n"
        "    shmbroker.connect(timeout=60.0)\n"
        "except shmbroker.LogonError as error:\n"
        "    print('refused:', error)\n"
    )
    refused_in_a_process(squatter, 1, 2, program)


@needs_root
def test_the_torch_backend_refuses_it(squatter, tmp_path):
    pytest.importorskip("torch")
    # One rank of a world of 1: the backend joins the launcher's broker, here the squatter.
    program = (
        "import datetime, torch.distributed as dist, shmbroker.torch\n"
        f"method = 'file://{tmp_path / 'store'}'\n"
        "try:\n"
        "    dist.init_process_group('shmbroker', init_method=method, rank=0, world_size=1,\n"
        "                            timeout=datetime.timedelta(seconds=60))\n"
        "except Exception as error:\n"
        "    print('refused:', error)\n"
    )
    refused_in_a_process(squatter, 0, 1, program)
