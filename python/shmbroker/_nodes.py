"""Which node this process is on, for the calls that span nodes (torch's, MPI's)."""

from __future__ import annotations

import os
import socket


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
