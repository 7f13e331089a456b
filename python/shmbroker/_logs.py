"""The library's log events in Python's :mod:`logging`, under the logger ``shmbroker``.

Events are rare: how a session's fds moved (a warning when the kernel refused ``pidfd_getfd``
and they went through the broker's relay), and, in a process that hosts a broker (local rank 0
under torchrun or mpirun), logons, departures, deaths and refused requests. Each record carries
the Rust module that logged it as ``record.shmbroker_target``. They arrive from a thread of the
library's own, shortly after they happen, in order.
"""

import logging

from . import _shmbroker

logger = logging.getLogger("shmbroker")


def _forward(levelno: int, target: str, message: str) -> None:
    if logger.isEnabledFor(levelno):
        logger.log(levelno, "%s", message, extra={"shmbroker_target": target})


_shmbroker._forward_logs(_forward)
