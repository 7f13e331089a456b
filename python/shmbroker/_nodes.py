"""Which node this process is on, for the calls that span nodes (torch's, MPI's)."""

from __future__ import annotations

import os
import socket
from typing import Any, Sequence


def node_name() -> str:
    """This process's node: ``SHMBROKER_NODE`` when set (so that tests on one machine can form
    several nodes), otherwise the host's name and boot id."""
    named = os.environ.get("SHMBROKER_NODE")
    if named:
        return named
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            boot = file.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def renumbered(error: BaseException, ranks: Sequence[int], note: str) -> BaseException:
    """`error` from a session whose rank ``r`` is rank ``ranks[r]`` of the job (or communicator),
    rebuilt with every rank it names renumbered so, and `note` added to its text; an error that
    names no rank is returned as it is."""
    from . import _errors as e

    def to(rank: Any) -> Any:
        return ranks[rank] if isinstance(rank, int) and 0 <= rank < len(ranks) else rank

    text = f"{error.args[0] if error.args else error} ({note})"
    if isinstance(error, e.Timeout):
        stopped = None if error.stopped is None else to(error.stopped)
        waiting = [to(r) for r in error.waiting_for]
        return type(error)(text, error.op, waiting, error.timeout, error.diagnosis, stopped)
    if isinstance(error, e.PeerLost):
        return type(error)(text, to(error.rank), error.diagnosis)
    if isinstance(error, e.PeerLeft):
        return type(error)(text, to(error.rank), to(error.after), error.after_died)
    if isinstance(error, e.PeerGaveUp):
        return type(error)(text, to(error.rank), to(error.named))
    if isinstance(error, e.PeerNeverJoined):
        return type(error)(text, to(error.rank), to(error.after), error.after_left)
    if isinstance(error, e.PeerRejoined):
        return type(error)(text, to(error.rank), error.times)
    if isinstance(error, e._RankError):
        return type(error)(text, to(error.rank))
    return error
