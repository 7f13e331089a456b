"""Type stubs of the native module ``shmbroker._shmbroker`` (re-exported by ``shmbroker``)."""

import os
import sys
from types import TracebackType
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Type,
    Union,
    final,
)

from ._gpu import GpuHandle

__all__ = [
    "MAX_FDS_PER_EXCHANGE",
    "Session",
    "Group",
    "Loan",
    "LoanView",
    "Sender",
    "Receiver",
    "ChannelSender",
    "ChannelReceiver",
    "connect",
    "_forward_logs",
    "_status_json",
]

MAX_FDS_PER_EXCHANGE: int
"""The most fds one rank may pass to :meth:`Session.exchange_fd_batch` or
:meth:`Session.broadcast_fd_batch`."""

if sys.version_info >= (3, 12):
    from collections.abc import Buffer

    _Data = Buffer
else:
    from typing_extensions import Buffer

    class _NumPyArray(Protocol):
        # NumPy's stubs give arrays `__buffer__` only from Python 3.12 on.
        @property
        def __array_interface__(self) -> Dict[str, Any]: ...

    _Data = Union[Buffer, _NumPyArray]

class _HasFileno(Protocol):
    def fileno(self) -> int: ...

_Fd = Union[int, _HasFileno]
_Path = Union[str, os.PathLike[str]]

@final
class Loan:
    """A writable buffer in this rank's outbox (:meth:`Session.loan`), handed to peers by
    reference with :meth:`Session.send_loan` or :meth:`Session.broadcast_loan`. Its ``with``
    block (or :meth:`release`) gives it back unsent. Once sent or released, ``buffer`` raises and
    nothing made from it may be used."""

    @property
    def buffer(self) -> memoryview:
        """The loan's bytes, writable (format ``B``)."""
    def __len__(self) -> int: ...
    def release(self) -> None:
        """Gives the loan back to the outbox unsent (nothing if sent or released already)."""
    def __enter__(self) -> "Loan": ...
    def __exit__(self, *exc: object) -> bool: ...

@final
class LoanView:
    """A read-only view of a buffer rank ``owner`` lent this rank, read in place. Its ``with``
    block (or :meth:`release`) gives the buffer back to its lender; ``buffer`` then raises."""

    @property
    def buffer(self) -> memoryview:
        """The lent bytes, read-only (format ``B``)."""
    @property
    def owner(self) -> int:
        """The rank that lent the buffer."""
    def __len__(self) -> int: ...
    def release(self) -> None:
        """Gives the buffer back to its lender (nothing if released already)."""
    def __enter__(self) -> "LoanView": ...
    def __exit__(self, *exc: object) -> bool: ...

@final
class Group:
    """A group of ranks, made by :meth:`Session.group` or :meth:`Session.shrink`. Pass it as
    ``group=`` to any collective to run it among the members only: ranks, roots, blocks and
    counts are then group ranks."""

    @property
    def rank(self) -> int:
        """This rank's rank in the group."""
    @property
    def size(self) -> int:
        """The number of ranks in the group."""
    @property
    def ranks(self) -> List[int]:
        """The members' world ranks, by group rank."""
    def world_rank(self, rank: int) -> int:
        """The world rank of group rank ``rank``; raises :class:`MisuseError` when none."""

@final
class Session:
    """A worker's session, made by :func:`connect`: its rank, its links to every peer, and the
    collectives over them.

    Every call that waits releases the GIL and has a deadline: the ``timeout`` given to
    ``connect``, or the call's own ``timeout=`` (seconds; ``None`` for none: a peer's death or
    departure still ends the wait). Data is anything with the buffer
    protocol that is C-contiguous (``bytes``, ``bytearray``, ``memoryview``, ``array.array``,
    NumPy arrays); it is read in place while the GIL is released, so no other thread may write to
    it during the call. Received data is ``bytes``.

    Ctrl-C ends a wait on the main thread with ``KeyboardInterrupt``, and nothing is lost. A
    call raises it only before it takes anything: a receive that took its message returns it,
    and the next call raises. So a loop that retries a receive on ``KeyboardInterrupt`` gets
    every message once, in order.

    A session is used by one thread at a time: a call while another thread is in one raises
    :class:`shmbroker.Error`. Use it as a context manager, or call :meth:`close`.
    """

    @property
    def rank(self) -> int:
        """This worker's rank, from 0 to ``world_size - 1`` (still readable after close)."""
    @property
    def world_size(self) -> int:
        """The number of ranks in the session (still readable after close)."""
    @property
    def rejoins(self) -> int:
        """How many processes held this rank before this one in the job (0: the job's first)."""
    @property
    def rejoined(self) -> bool:
        """Whether this process replaced a rank that died (``rejoins > 0``)."""
    def wait_for_rank(self, rank: int, *, timeout: Optional[float] = ...) -> None:
        """Waits until ``rank`` is there: at once if alive; if it died, until a replacement
        rejoins (then messages with it work again; make a new group for collectives)."""
    @property
    def timeout(self) -> Optional[float]:
        """The deadline, in seconds, of every call not given its own ``timeout=``; ``None``
        when there is none."""
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
    def group(self, ranks: Sequence[int], *, timeout: Optional[float] = ...) -> Group:
        """A group of ``ranks`` (world ranks; their order numbers them in the group), made by
        every member with the same ranks, by agreement: every member gets the group or every
        member raises the same error. Raises :class:`ProtocolError` naming a member that passed
        other ranks."""
    def regroup(self, ranks: Sequence[int], *, timeout: Optional[float] = ...) -> Group:
        """After deaths: waits until every member of ``ranks`` is alive (a dead one replaced),
        makes their group by agreement, and tries again through deaths and rejoins until
        ``timeout``. Every member calls it, replacements included. Raises :class:`Timeout`
        naming a member still dead at the deadline, :class:`PeerLeft` for one that left."""
    def shrink(self, *, timeout: Optional[float] = ...) -> Group:
        """After a death: the group of every rank still there, the same on every survivor.
        Raises :class:`PeerLost` naming a rank that died after the survivors agreed (call it
        again)."""
    def barrier(
        self, *, timeout: Optional[float] = ..., group: Optional["Group"] = None
    ) -> None:
        """Returns once every rank has entered the barrier.

        Raises :class:`PeerLost`, :class:`PeerLeft`, :class:`Timeout`, :class:`PeerGaveUp`
        when a rank it waits for failed its part and left it, or :class:`ProtocolError` when
        another rank called another collective.
        """
    def all_gather(
        self, data: _Data, *, timeout: Optional[float] = ..., group: Optional["Group"] = None
    ) -> List[bytes]:
        """Every rank's ``data``, in rank order (this rank's own included). Ranks may give
        different lengths. Raises as :meth:`barrier` does."""
    def all_gather_into(
        self,
        data: _Data,
        output: _Data,
        *,
        timeout: Optional[float] = ...,
        group: Optional["Group"] = None,
    ) -> None:
        """Every rank's ``data``, all of one length, into ``output`` (exactly ``len(data) *
        size`` writable bytes) in rank order, with no ``bytes`` made. Raises
        :class:`MisuseError` for another ``output`` length, :class:`ProtocolError` naming a
        rank that gave another length, otherwise as :meth:`barrier` does."""
    def gather(
        self,
        root: int,
        data: _Data,
        *,
        timeout: Optional[float] = ...,
        group: Optional["Group"] = None,
    ) -> Optional[List[bytes]]:
        """Every rank's ``data`` at ``root``, in rank order (lengths may differ); ``None`` on
        the other ranks. Raises as :meth:`barrier` does."""
    def all_reduce(
        self,
        data: _Data,
        op: str = "sum",
        *,
        dtype: Optional[str] = None,
        timeout: Optional[float] = ...,
        group: Optional["Group"] = None,
    ) -> None:
        """Combines every rank's ``data`` with ``op`` (``"sum"``, ``"prod"``, ``"min"``,
        ``"max"``, ``"bit_and"``, ``"bit_or"``, ``"bit_xor"``, ``"avg"``), in rank order, into
        every rank's ``data``, in place. The element type is the buffer's, or ``dtype``
        (``"bfloat16"`` needs it). Every rank gets the same bits."""
    def reduce(
        self,
        root: int,
        data: _Data,
        op: str = "sum",
        *,
        dtype: Optional[str] = None,
        timeout: Optional[float] = ...,
        group: Optional["Group"] = None,
    ) -> None:
        """:meth:`all_reduce` with the result in the root's ``data`` only."""
    def reduce_scatter(
        self,
        input: _Data,
        output: _Data,
        op: str = "sum",
        *,
        dtype: Optional[str] = None,
        timeout: Optional[float] = ...,
        group: Optional["Group"] = None,
    ) -> None:
        """Combines every rank's ``input`` (``world_size`` blocks of ``output``'s length) and
        writes block ``rank`` of the result into ``output``."""
    def scatter(
        self,
        root: int,
        input: Optional[_Data],
        output: _Data,
        *,
        timeout: Optional[float] = ...,
        group: Optional["Group"] = None,
    ) -> None:
        """The root's ``input`` cut into ``world_size`` equal blocks, block ``rank`` into each
        rank's ``output``."""
    def all_to_all(
        self,
        input: _Data,
        output: _Data,
        *,
        timeout: Optional[float] = ...,
        group: Optional["Group"] = None,
    ) -> None:
        """Block ``q`` of ``input`` to rank ``q``, block ``q`` of ``output`` from rank ``q``."""
    def all_to_all_v(
        self,
        input: _Data,
        send_counts: Sequence[int],
        output: _Data,
        recv_counts: Sequence[int],
        *,
        timeout: Optional[float] = ...,
        group: Optional["Group"] = None,
    ) -> None:
        """:meth:`all_to_all` with a byte count per rank, each way, in rank order."""
    def broadcast(
        self,
        root: int,
        data: Optional[_Data] = None,
        *,
        timeout: Optional[float] = ...,
        group: Optional["Group"] = None,
    ) -> bytes:
        """``root``'s ``data`` on every rank, returned as ``bytes`` (on the root too).

        The root must give ``data``; other ranks may leave it out, and what they give is not
        sent. Raises :class:`MisuseError` for a root without data or a root out of range;
        otherwise as :meth:`barrier` does.
        """
    def send(self, rank: int, data: _Data, *, timeout: Optional[float] = ...) -> None:
        """Sends ``data`` (any size) to ``rank``, which receives it, in order, with
        ``recv(this rank)``. Returns once the data is copied out of ``data``; a message larger
        than this rank's outbox returns only once ``rank`` is receiving it.

        Raises :class:`MisuseError` for a rank out of range or this rank itself;
        :class:`PeerLost`, :class:`PeerLeft`, :class:`Timeout`.
        """
    def recv(self, rank: int, *, timeout: Optional[float] = ...) -> bytes:
        """The next message ``rank`` sent this rank with :meth:`send`. Raises as :meth:`send`
        does, and :class:`ProtocolError` for bytes no correct peer sends."""
    def recv_into(self, rank: int, buffer: _Data, *, timeout: Optional[float] = ...) -> int:
        """Receives the next message from ``rank`` into ``buffer`` (writable and C-contiguous:
        ``bytearray``, a NumPy array, a torch CPU tensor's ``.numpy()``) and returns its length.
        Raises :class:`BufferTooSmall` for a longer message, which is kept for the next receive;
        otherwise as :meth:`recv` does."""
    def recv_any(self, *, timeout: Optional[float] = ...) -> Tuple[int, bytes]:
        """The next message from whichever peer has one (round-robin), as ``(rank, bytes)``.
        Peers that left are skipped; one that died is reported once (:class:`PeerLost`)."""
    def recv_any_into(
        self, buffer: _Data, *, timeout: Optional[float] = ...
    ) -> Tuple[int, int]:
        """:meth:`recv_any` into ``buffer``: ``(rank, length)``. A longer message raises
        :class:`BufferTooSmall` (``.rank``, ``.needed``) and is kept."""
    def try_recv(self, rank: int) -> Optional[bytes]:
        """The next message from ``rank`` if one has started to arrive, else ``None``."""
    def try_recv_any(self) -> Optional[Tuple[int, bytes]]:
        """The next message from any peer if one has started to arrive, else ``None``."""
    def readiness_fd(self) -> int:
        """This rank's readiness file descriptor, for ``select``, ``epoll`` or an event loop:
        readable when a message is waiting from any peer (or one died or left), once
        :meth:`try_recv_any` has returned ``None``. Never read it; it stays open as long as the
        session. :func:`shmbroker.recv_any_async` is this done for asyncio."""
    def loan(self, size: int, *, timeout: Optional[float] = ...) -> Loan:
        """A writable buffer of ``size`` bytes in this rank's outbox, to fill and hand to peers
        by reference."""
    def symmetric(self, size: int, *, timeout: Optional[float] = ...) -> Loan:
        """A zeroed buffer of ``size`` bytes in this rank's outbox that this rank keeps: an
        :meth:`all_reduce` of ``loan.buffer`` (or an array over it) is read by the peers in place,
        with no copy in."""
    def reductions_read_in_place(self) -> int:
        """How many pieces of this session's all-reduces the peers read in place (symmetric
        buffers)."""
    def channel_to(
        self, peer: int, tag: int, record: Any, capacity: int = 1024
    ) -> "ChannelSender":
        """A typed channel of ``capacity`` records of ``record`` (bytes, or a NumPy dtype) from
        this rank to ``peer``, a ring of its own the broker makes; ``peer`` calls
        :meth:`channel_from` with the same ``tag`` and ``record``."""
    def channel_from(self, peer: int, tag: int, record: Any) -> "ChannelReceiver":
        """The typed channel ``peer`` makes to this rank with :meth:`channel_to`; raises
        :class:`MisuseError` when its tag or record size is not this end's."""
    def lend_ref(self, rank: int, loan: Loan) -> bytes:
        """Lends ``loan`` to ``rank`` by reference: 16 bytes for a channel record to carry;
        ``rank`` views it with :meth:`view_loan_ref`, once."""
    def view_loan_ref(self, rank: int, lent: _Data) -> LoanView:
        """A view of the loan ``rank`` lent this rank as ``lent`` (16 bytes), read in place."""
    def split(self) -> Tuple["Sender", "Receiver"]:
        """Splits the session into a :class:`Sender` and a :class:`Receiver` for two threads;
        each releases the GIL while it waits, and a receive never waits behind a send (or the
        root's side of a world broadcast) waiting for a slow peer. This object is closed from
        then on; :meth:`Sender.rejoin` gives the whole session back."""
    def send_loan(self, rank: int, loan: Loan, *, timeout: Optional[float] = ...) -> None:
        """Hands ``loan`` to ``rank`` by reference (it is sent whether or not this raises)."""
    def recv_loan(self, rank: int, *, timeout: Optional[float] = ...) -> LoanView:
        """The next message from ``rank``, which must be a loan, as a view read in place."""
    def broadcast_loan(
        self, root: int, loan: Optional[Loan] = None, *, timeout: Optional[float] = ...
    ) -> Optional[LoanView]:
        """``root``'s loan on every other rank by reference; ``None`` on the root."""
    def all_gather_gpu_handles(
        self, handle: GpuHandle, fd: Optional[_Fd] = None, *, timeout: Optional[float] = ...
    ) -> List[Tuple[GpuHandle, Optional[int]]]:
        """Every rank's GPU handle in rank order, each with a new fd this process owns for the
        kinds whose handle is an fd (``None`` for the others). Give ``fd`` exactly when this
        rank's kind carries one."""
    def broadcast_gpu_handle(
        self,
        root: int,
        handle: Optional[GpuHandle] = None,
        fd: Optional[_Fd] = None,
        *,
        timeout: Optional[float] = ...,
    ) -> Tuple[GpuHandle, Optional[int]]:
        """``root``'s GPU handle on every rank, with a new fd for the kinds that carry one."""
    def fd_transport(self) -> Tuple[str, Optional[str]]:
        """How fds move, as ``(chosen, used)``: ``chosen`` is ``"auto"``, ``"pidfd"`` or
        ``"relay"``; ``used`` is ``None`` before the first exchange, then ``"pidfd"`` while every
        import was a ``pidfd_getfd``, ``"relay"`` once one went through the broker."""
    def probe(self, rank: int, *, timeout: Optional[float] = ...) -> int:
        """The length of the next message from ``rank``, waiting for it, without receiving
        it."""
    def exchange_fds(self, fd: _Fd, *, timeout: Optional[float] = ...) -> List[int]:
        """Every rank's ``fd``, in rank order, as new file descriptors this process owns (close
        each with ``os.close``). This rank's own entry is a duplicate of ``fd``, so closing every
        entry never closes ``fd`` itself. ``fd`` must stay open during the call.

        Raises :class:`MisuseError` for an fd that is not open; :class:`ProtocolError` for a
        peer's stale fd; :class:`ResourceError` when an fd cannot be moved; otherwise as
        :meth:`all_gather` does.
        """
    def broadcast_fd(
        self, root: int, fd: Optional[_Fd] = None, *, timeout: Optional[float] = ...
    ) -> int:
        """``root``'s ``fd`` on every rank, as a new file descriptor this process owns (on the
        root, a duplicate of ``fd``). Other ranks may leave ``fd`` out; what they give is
        ignored. Raises as :meth:`exchange_fds` does."""
    def exchange_fd_batch(
        self, fds: Iterable[_Fd], *, timeout: Optional[float] = ...
    ) -> List[List[int]]:
        """Every rank's ``fds`` (every rank passes as many, at most
        :data:`MAX_FDS_PER_EXCHANGE`), by rank and then in each rank's order, as new file
        descriptors this process owns (this rank's own entries are duplicates). Two ring trips
        for the whole batch. Raises :class:`ProtocolError` naming a rank that passed another
        number of fds or forged a ticket, :class:`ResourceError` naming a rank with no room for
        the fds; otherwise as :meth:`exchange_fds`."""
    def broadcast_fd_batch(
        self,
        root: int,
        fds: Optional[Iterable[_Fd]] = None,
        *,
        count: Optional[int] = None,
        timeout: Optional[float] = ...,
    ) -> List[int]:
        """``root``'s ``fds`` on every rank, in the root's order, as new file descriptors this
        process owns (on the root, duplicates). Other ranks give ``count`` (on the root it
        defaults to ``len(fds)``); their ``fds`` are ignored. Raises as
        :meth:`exchange_fd_batch` does."""
    def close(self) -> None:
        """Leaves the session: peers waiting on this rank are told it left (:class:`PeerLeft`).
        Closing a closed session does nothing; every other call on it raises
        :class:`shmbroker.Error`. In a forked child, closes only the child's copy: the parent's
        session goes on. Raises :class:`shmbroker.Error` while another thread is in a call on
        the session."""
    def __enter__(self) -> "Session": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> bool:
        """Closes the session; never suppresses an exception."""

def connect(
    path: Optional[_Path] = None,
    rank: Optional[int] = None,
    timeout: Optional[float] = 10.0,
    *,
    world_size: Optional[int] = None,
) -> Session:
    """Logs on and returns the :class:`Session`.

    With ``path=None``, joins the job this process was started in: ``shmbroker run``, or
    mpirun, torchrun or srun; the environment then gives the rank, so ``rank`` must be left out.
    With a ``path``, logs on to the broker listening there as ``rank`` (``None``: any free rank).
    With a ``path``, a ``rank`` and a ``world_size``, starts a job of its own with no launcher:
    rank 0 hosts the broker on ``path`` for as long as its session lives.

    ``timeout`` (seconds, above 0) bounds the logon, and is every later call's deadline unless
    the call is given its own.

    Nothing is sent to a broker that runs as another user than this process's (or root), and
    a launcher's socket lies in a directory private to this user (``shmbroker-<uid>`` under
    ``$XDG_RUNTIME_DIR`` or the temp dir), checked before use.

    Raises :class:`LogonError` when no broker answers in time, the broker refuses, the broker
    runs as another user (``SHMBROKER_BROKER_UID`` trusts one more uid), the socket's directory
    is not private, or the environment does not say where this process stands;
    :class:`MisuseError` for a bad argument.
    """

@final
class ChannelSender:
    """The sending end of a typed channel (:meth:`Session.channel_to`): one thread at a time;
    :meth:`close` (or dropping it) closes the channel."""

    @property
    def record_bytes(self) -> int: ...
    def try_send(self, record: _Data) -> bool:
        """One record if the ring has room now: whether it went."""
    def send(self, record: _Data) -> None:
        """One record, waiting for room within the deadline."""
    def send_batch(self, records: _Data) -> None:
        """Every record of ``records`` (whole records: a NumPy array of the dtype, ...)."""
    def try_send_batch(self, records: _Data) -> int:
        """As many records as fit now: how many."""
    def close(self) -> None:
        """Closes the channel: the receiver gets what was sent, then :class:`ChannelClosed`."""

@final
class ChannelReceiver:
    """The receiving end of a typed channel (:meth:`Session.channel_from`)."""

    @property
    def record_bytes(self) -> int: ...
    def try_recv(self) -> Optional[bytes]:
        """The next record's bytes if one has arrived."""
    def recv(self) -> bytes:
        """The next record's bytes, waiting within the deadline."""
    def recv_batch(self, records: _Data) -> int:
        """Into ``records`` (a NumPy array of the dtype, ...), waiting for the first: how many."""
    def try_recv_batch(self, records: _Data) -> int:
        """:meth:`recv_batch` without waiting: may be 0."""
    def close(self) -> None:
        """Closes the channel: the sender's next call raises :class:`ChannelClosed`."""

@final
class Sender:
    """The sending half of a split session (:meth:`Session.split`). While a send waits for a slow
    peer's room it holds nothing the :class:`Receiver` needs. Calls run one at a time."""

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    def send(self, rank: int, data: _Data, *, timeout: Optional[float] = ...) -> None:
        """:meth:`Session.send`."""
    def broadcast(self, data: _Data, *, timeout: Optional[float] = ...) -> None:
        """:meth:`Session.broadcast` from this rank, the root, to the world; every other rank
        calls ``broadcast(this rank)``. Up to 8 ranks it waits for a slow rank's room holding
        nothing the receiver needs."""
    def rejoin(self, receiver: "Receiver") -> Session:
        """The :class:`Session` both halves were split from; raises :class:`MisuseError` for
        another session's receiver."""

@final
class Receiver:
    """The receiving half of a split session (:meth:`Session.split`): one receive at a time (a
    second thread's raises :class:`shmbroker.Error`), never waiting behind the sender."""

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    def recv(self, rank: int, *, timeout: Optional[float] = ...) -> bytes:
        """:meth:`Session.recv`."""
    def recv_into(self, rank: int, buffer: _Data, *, timeout: Optional[float] = ...) -> int:
        """:meth:`Session.recv_into`."""
    def recv_any(self, *, timeout: Optional[float] = ...) -> Tuple[int, bytes]:
        """:meth:`Session.recv_any`."""
    def recv_any_into(
        self, buffer: _Data, *, timeout: Optional[float] = ...
    ) -> Tuple[int, int]:
        """:meth:`Session.recv_any_into`."""
    def try_recv(self, rank: int) -> Optional[bytes]:
        """:meth:`Session.try_recv`."""
    def probe(self, rank: int, *, timeout: Optional[float] = ...) -> int:
        """:meth:`Session.probe`."""
    def try_recv_any(self) -> Optional[Tuple[int, bytes]]:
        """:meth:`Session.try_recv_any`."""
    def readiness_fd(self) -> int:
        """:meth:`Session.readiness_fd`."""

def _forward_logs(forward: Callable[[int, str, str], None]) -> None:
    """Sends the library's log events to ``forward(levelno, target, message)`` on a thread of
    its own (``shmbroker._logs`` calls it once, at import)."""

def _status_json(socket: _Path, timeout: float) -> str:
    """What every rank of the job served at ``socket`` is doing, asked of its broker within
    ``timeout`` seconds: the lines of ``shmbroker status --json`` (:func:`shmbroker.status`
    parses them)."""
