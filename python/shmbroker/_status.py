"""``shmbroker.status``: what a running job's ranks are doing, asked of its broker."""

import json
import os
from typing import Any, Dict, List, Optional, Union

from ._errors import MisuseError
from ._shmbroker import _status_json


def status(
    socket: Optional[Union[str, "os.PathLike[str]"]] = None, timeout: float = 2.0
) -> List[Dict[str, Any]]:
    """What every rank of a running job is doing, asked of its broker: one dict per rank, in
    rank order, with the fields of ``shmbroker status --json``: ``job``, ``rank``, ``pid``,
    ``state`` (``"running"``, ``"stopped"``, ``"left"``, ``"dead"``, ``"never joined"``), ``call``
    (the call it
    is in, such as ``"barrier #12"``, or None), ``seconds`` (in it for how long), ``waiting_for``
    (the rank it waits for, once it has waited long enough to park), ``calls``, ``last_call``,
    ``last_seconds_ago``, ``last_failed`` (whether that collective failed),
    ``last_failed_naming`` (the rank its error named), ``stopped_seconds`` (for a stopped rank,
    how long since it last ran), ``outbox_bytes``, ``outbox_used``,
    ``ring_fill`` (messages waiting in its ring to each peer, None where there is none) and
    ``readable`` (False when the rank published words no rank of this library writes). Unknown
    values are None.

    ``socket`` is the broker's socket: a ``shmbroker serve`` socket, or by default
    ``SHMBROKER_SOCKET`` (which ``shmbroker run`` gives its copies). Only the broker's uid and the
    uids it admits may ask. The broker answers at once, whatever the job is doing.

    Raises :class:`LogonError` when no broker answers within ``timeout`` seconds or it refuses,
    :class:`MisuseError` when there is no socket to ask.
    """
    if socket is None:
        socket = os.environ.get("SHMBROKER_SOCKET")
        if socket is None:
            raise MisuseError("no socket given and SHMBROKER_SOCKET is not set")
    return [json.loads(line) for line in _status_json(socket, timeout).splitlines()]
