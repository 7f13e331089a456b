"""The exceptions shmbroker raises; the package re-exports every one of them.

``str(error)`` is the library's own message, which names the rank involved. The classes live in
Python (not in the native module) so that they can have ordinary constructors, pickle (for
``multiprocessing`` and ``concurrent.futures``) and, for ``MisuseError``, also be a
``ValueError``.
"""

from typing import List, Optional


class Error(Exception):
    """Base class of every error shmbroker raises.

    Raised as itself for a call on a closed session, a session in use by another thread, a
    session used from a forked child, and a library error of no more specific kind.
    """


class _RankError(Error):
    """An error about one peer, named by ``rank``."""

    rank: int

    def __init__(self, message: str, rank: int) -> None:
        super().__init__(message, rank)
        self.rank = rank

    def __str__(self) -> str:
        return str(self.args[0])


class PeerLost(_RankError):
    """A peer's process died without leaving the session (killed, crashed, or exited without
    closing it). The session is over: every pending and later call that needs a peer raises this,
    naming the first rank that died (``rank``).

    ``diagnosis`` is what that rank was doing when it died, read from what it last published
    (``["rank 2 was in all_reduce #5 for 1.2 s"]``); empty when that could not be read."""

    diagnosis: List[str]

    def __init__(self, message: str, rank: int, diagnosis: Optional[List[str]] = None) -> None:
        Error.__init__(self, message, rank, diagnosis)
        self.rank = rank
        self.diagnosis = list(diagnosis or [])


class PeerLeft(_RankError):
    """The peer this call needs (``rank``) closed its session on purpose. Calls that do not need
    it go on.

    ``after`` is the rank it gave up on before it left, when it said so (else ``None``):
    ``after_died`` is ``True`` when that rank died (this worker saw the death too), ``False``
    when a call of the leaver's timed out waiting for it (its word)."""

    after: Optional[int]
    after_died: bool

    def __init__(
        self, message: str, rank: int, after: Optional[int] = None, after_died: bool = False
    ) -> None:
        Error.__init__(self, message, rank, after, after_died)
        self.rank = rank
        self.after = after
        self.after_died = after_died


class PeerGaveUp(_RankError):
    """A peer this collective waits for (``rank``) failed its own part of it and left it (its
    deadline passed, a peer sent it bad bytes, an interrupt ended it): it will send nothing more
    for it, so this call fails at once instead of at its deadline, or never.

    ``named`` is the rank that peer's own error named, as its word (``None`` when it named
    none): the rank it timed out waiting for, that sent it bad bytes, that died."""

    named: Optional[int]

    def __init__(self, message: str, rank: int, named: Optional[int] = None) -> None:
        Error.__init__(self, message, rank, named)
        self.rank = rank
        self.named = named


class PeerNeverJoined(_RankError):
    """The peer this call needs (``rank``) never logged on, and no longer can: the job lost
    rank ``after`` (it died, or left if ``after_left``) before ``rank`` came, and the broker
    admits nobody new to a job that has lost a worker. Calls that do not need it go on."""

    after: int
    after_left: bool

    def __init__(self, message: str, rank: int, after: int, after_left: bool) -> None:
        Error.__init__(self, message, rank, after, after_left)
        self.rank = rank
        self.after = after
        self.after_left = after_left


class PeerRejoined(_RankError):
    """Peer ``rank`` died and a new process took its place (it rejoined the job). Raised once
    by :meth:`Session.recv_any` and its kin, after the :class:`PeerLost` for the dead process;
    messages with ``rank`` work again from then on. Collectives of groups it was in are over:
    make a new group (see :meth:`Session.wait_for_rank`). ``times`` is how many times the rank
    has been replaced in this job."""

    times: int

    def __init__(self, message: str, rank: int, times: int = 1) -> None:
        Error.__init__(self, message, rank, times)
        self.rank = rank
        self.times = times


class ProtocolError(_RankError):
    """Peer ``rank`` sent bytes no correct peer sends, corrupted a ring or its outbox, handed over
    a stale fd, or called another collective than this rank (``barrier`` against
    ``all_gather``, say)."""


class Timeout(Error):
    """The call's deadline passed.

    ``op`` is the call (``"recv"``, ``"barrier"``, ...), ``waiting_for`` the ranks it was still
    waiting for, in rank order, ``timeout`` the deadline in seconds, and ``diagnosis`` what each
    of those ranks was doing then, one sentence each in the same order (``"rank 2 is in no call
    (its last, all_reduce #11, finished 9.8 s ago)"``), from what they publish; empty when
    nothing could be read. ``stopped`` is a rank whose process is stopped (``SIGSTOP``, a
    debugger) that the wait leads to, directly or through ranks waiting for it, or ``None``; the
    diagnosis then has a sentence naming it.
    """

    op: str
    waiting_for: List[int]
    timeout: float
    diagnosis: List[str]
    stopped: Optional[int]

    def __init__(
        self,
        message: str,
        op: str,
        waiting_for: List[int],
        timeout: float,
        diagnosis: Optional[List[str]] = None,
        stopped: Optional[int] = None,
    ) -> None:
        super().__init__(message, op, waiting_for, timeout, diagnosis, stopped)
        self.op = op
        self.waiting_for = list(waiting_for)
        self.timeout = timeout
        self.diagnosis = list(diagnosis or [])
        self.stopped = stopped

    def __str__(self) -> str:
        return str(self.args[0])


class BrokerLost(Error):
    """The broker is gone and this call needed it (a peer that never logged on, an fd relay)."""


class LogonError(Error):
    """``connect`` failed: no broker answered within the timeout, the broker refused, or the
    environment does not say where this process stands (``path=None`` outside a launcher)."""


class ChannelClosed(_RankError):
    """The other end of a typed channel, on rank ``rank``, closed it; what it sent before was
    received first."""


class MisuseError(Error, ValueError):
    """A mistake in the calling program: a rank out of range, a message to this rank itself, a
    broadcast root without data, a non-contiguous buffer, a bad timeout. Also a ``ValueError``."""


class BufferTooSmall(MisuseError):
    """The message from peer ``rank`` is ``needed`` bytes, more than the buffer given to
    :meth:`Session.recv_into` holds. It is kept, whole: the next receive from ``rank`` gets it
    (with a buffer of ``needed`` bytes or more, or :meth:`Session.recv`)."""

    rank: int
    needed: int

    def __init__(self, message: str, rank: int, needed: int) -> None:
        Error.__init__(self, message, rank, needed)
        self.rank = rank
        self.needed = needed

    def __str__(self) -> str:
        return str(self.args[0])


class ResourceError(Error):
    """The operating system refused something the call needed: duplicating or moving an fd,
    creating this rank's outbox, a system call."""
