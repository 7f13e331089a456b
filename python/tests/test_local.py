"""What needs no peer: the exception classes, and connect's own failures."""

import os
import pickle
import struct
import subprocess
import sys

import pytest
import shmbroker


def test_every_exception_is_an_error():
    for name in (
        "PeerLost",
        "PeerLeft",
        "PeerNeverJoined",
        "Timeout",
        "ProtocolError",
        "BrokerLost",
        "LogonError",
        "MisuseError",
        "BufferTooSmall",
        "ResourceError",
    ):
        assert issubclass(getattr(shmbroker, name), shmbroker.Error), name
    assert issubclass(shmbroker.Error, Exception)
    assert issubclass(shmbroker.MisuseError, ValueError)


def test_exceptions_keep_their_fields_through_pickle():
    lost = pickle.loads(pickle.dumps(shmbroker.PeerLost("peer rank 2 was lost", 2)))
    assert (type(lost), lost.rank, str(lost)) == (shmbroker.PeerLost, 2, "peer rank 2 was lost")
    timeout = pickle.loads(pickle.dumps(shmbroker.Timeout("timed out", "recv", [1, 3], 0.5)))
    assert (timeout.op, timeout.waiting_for, timeout.timeout) == ("recv", [1, 3], 0.5)
    assert str(timeout) == "timed out"
    never = pickle.loads(pickle.dumps(shmbroker.PeerNeverJoined("rank 1 never came", 1, 2, True)))
    assert (type(never), never.rank, never.after, never.after_left) == (
        shmbroker.PeerNeverJoined,
        1,
        2,
        True,
    )
    assert str(never) == "rank 1 never came"
    left = pickle.loads(pickle.dumps(shmbroker.PeerLeft("rank 0 left", 0, 2, False)))
    assert (type(left), left.rank, left.after, left.after_died) == (shmbroker.PeerLeft, 0, 2, False)
    plain = shmbroker.PeerLeft("rank 0 left", 0)
    assert (plain.after, plain.after_died) == (None, False)
    small = pickle.loads(pickle.dumps(shmbroker.BufferTooSmall("rank 1 sent 300 bytes", 1, 300)))
    assert (type(small), small.rank, small.needed) == (shmbroker.BufferTooSmall, 1, 300)


def test_connect_without_a_broker_is_a_logon_error_naming_the_path(tmp_path):
    path = tmp_path / "nobody.sock"
    with pytest.raises(shmbroker.LogonError, match="no broker at .*nobody.sock"):
        shmbroker.connect(path, timeout=0.2)
    with pytest.raises(shmbroker.LogonError):
        shmbroker.connect(str(path), rank=1, timeout=0.2)


def test_connect_outside_a_launcher_says_which_variables_are_missing(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("SHMBROKER_", "OMPI_", "PMI_", "MPI_LOCAL", "SLURM_", "LOCAL_")):
            monkeypatch.delenv(name)
    with pytest.raises(shmbroker.LogonError, match="SHMBROKER_RANK"):
        shmbroker.connect(timeout=0.2)


@pytest.mark.parametrize("timeout", [0, -1, float("nan")])
def test_connect_refuses_a_deadline_that_is_no_time(timeout):
    # (None and infinity are no deadline at all: they are checked in the workers' scenarios.)
    with pytest.raises(shmbroker.MisuseError, match="timeout"):
        shmbroker.connect("/nonexistent.sock", timeout=timeout)


def test_connect_refuses_a_rank_without_a_path():
    with pytest.raises(shmbroker.MisuseError, match="SHMBROKER_RANK"):
        shmbroker.connect(rank=1)
    with pytest.raises(shmbroker.MisuseError, match="rank -1"):
        shmbroker.connect("/nonexistent.sock", rank=-1)


def test_the_type_stubs_match_the_module(tmp_path):
    # Every name, signature and class of the stubs against the installed module.
    pytest.importorskip("mypy.stubtest")
    # shmbroker.torch is plain Python with no stub of its own: what stubtest would report there
    # is torch's stubs against torch (pybind11 enums and metaclasses), or that torch is absent.
    allowlist = tmp_path / "allowlist"
    allowlist.write_text("shmbroker\\.(torch|_spanning)(\\..*)?\n")
    done = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "shmbroker", "--allowlist", str(allowlist)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # not python/, whose package source would hide the installed one
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_object_header_from_a_peer_is_checked_before_it_is_believed():
    from shmbroker._objects import _lengths

    good = struct.pack("<QQQ", 2, 5, 7) + b"pickle"
    lengths, data = _lengths(good, 3)
    assert lengths == [5, 7] and bytes(data) == b"pickle"
    for forged in (b"", b"short", struct.pack("<Q", 1), struct.pack("<Q", 1 << 60) + b"x" * 64):
        with pytest.raises(shmbroker.ProtocolError) as error:
            _lengths(forged, 3)
        assert error.value.rank == 3 and "rank 3" in str(error.value)
