"""Receiving from any peer in an asyncio event loop, on the session's readiness fd."""

from __future__ import annotations

import asyncio
import math
from typing import Any, Optional, Set, Tuple

from ._errors import MisuseError, Timeout
from ._shmbroker import Session

__all__ = ["recv_any_async"]

# Sessions a task is waiting on (by id): one waiter at a time per session.
_waiting: Set[int] = set()
# What `timeout=` left out means: the session's own deadline.
_SESSION: Any = object()
# After a wake-up that found nothing (a write the session did not owe), the next waits back off
# from this to _MOST seconds, so a readiness fd that stays readable cannot spin the loop.
_LEAST, _MOST = 0.0005, 0.02


async def recv_any_async(session: Session, *, timeout: Any = _SESSION) -> Tuple[int, bytes]:
    """The next message from whichever peer has one, as ``(rank, bytes)``, awaited on the
    session's readiness fd (:meth:`Session.readiness_fd`) in the running asyncio loop, which goes
    on with other tasks meanwhile. Peers that left are skipped; one that died is reported once
    (:class:`PeerLost`), as with :meth:`Session.recv_any`.

    ``timeout`` (seconds) bounds the wait: the session's deadline when left out, none with
    ``None``; a peer's death or departure ends the wait either way. Raises :class:`Timeout`
    (naming no rank) when it passes, and :class:`MisuseError` for a bad timeout or a second task
    waiting on the same session.

    Taking a message runs on the loop's thread: one larger than the eager limit is received
    whole, waiting for its chunks as its sender writes them. A program receiving many megabytes
    at a time receives them in an executor instead."""
    if timeout is _SESSION:
        timeout = session.timeout
    if timeout is not None and (math.isnan(timeout) or timeout <= 0):
        raise MisuseError(f"timeout {timeout}: a number of seconds above 0, or None")
    if id(session) in _waiting:
        raise MisuseError("another task is already waiting on this session (one at a time)")
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None or math.isinf(timeout) else loop.time() + timeout
    fd = session.readiness_fd()
    _waiting.add(id(session))
    try:
        backoff = 0.0
        while True:
            got = session.try_recv_any()
            if got is not None:
                return got
            if deadline is not None and loop.time() >= deadline:
                raise Timeout(
                    f"recv_any timed out after {timeout}s waiting for any peer",
                    "recv_any",
                    [],
                    float(timeout),
                )
            if backoff:
                await asyncio.sleep(backoff)
            if await _readable(loop, fd, deadline):
                # Readable yet nothing there next time round means a write not owed: back off.
                backoff = min(_MOST, max(_LEAST, backoff * 2))
            # (Timed out: the loop's top looks once more, then raises.)
    finally:
        _waiting.discard(id(session))


async def _readable(loop: asyncio.AbstractEventLoop, fd: int, deadline: Optional[float]) -> bool:
    """Whether `fd` became readable before `deadline` (loop time; None: no deadline)."""
    readable: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(fd, ready)
    try:
        left = None if deadline is None else max(0.0, deadline - loop.time())
        await asyncio.wait_for(readable, left)
        return True
    except asyncio.TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
