"""Another user cannot host this user's job: a connect, a launcher's `connect()` and the torch
backend's all check the broker's uid (`SO_PEERCRED`) before they send anything.

The squatter is a real process running as uid 65534 ("nobody"), listening on a socket in a
shared, sticky, world-writable directory. These tests need root to start it, and skip without.
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import shmbroker
from conftest import clean_env

NOBODY = 65534

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="running as another uid needs root")


@pytest.fixture
def squatter():
    """A socket listening as uid 65534 in a shared, sticky directory under /tmp: its path.

    The squatter is a forked child that drops to uid 65534 before it binds: it runs nothing that
    uid would have to reach (this test's virtualenv may lie in a directory only root can enter).
    """
    shared = tempfile.mkdtemp(prefix="shmbroker-squat-", dir="/tmp")
    os.chmod(shared, 0o1777)
    path = os.path.join(shared, "job.sock")
    ready_read, ready_write = os.pipe()
    stop_read, stop_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_read)
            os.close(stop_write)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(path)
            listener.listen()
            os.write(ready_write, b"1")
            os.read(stop_read, 1)
        finally:
            os._exit(0)
    os.close(ready_write)
    os.close(stop_read)
    try:
        # An empty read: the child failed before it listened (and has exited).
        assert os.read(ready_read, 1) == b"1", "the squatter never listened"
        yield path
    finally:
        os.close(stop_write)
        os.close(ready_read)
        os.waitpid(pid, 0)
        shutil.rmtree(shared, ignore_errors=True)


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
