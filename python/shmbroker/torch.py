# torch's stubs give ProcessGroup's and Backend's methods the overloads of their C++ binding,
# which this module overrides with the form torch calls (and the two disagree with each other);
# without torch installed, its imports are unresolved.
# mypy: disable-error-code="override,misc,import-not-found"
"""A torch.distributed backend, ``"shmbroker"``, for CPU tensors.

Importing this module registers it::

    import torch.distributed as dist
    import shmbroker.torch  # noqa: F401  (registers the backend)

    dist.init_process_group("shmbroker")   # under torchrun, or `shmbroker run -n N -- python ...`
    dist.all_reduce(tensor)                 # and every other call below, unchanged

**Where the ranks meet.** Under ``shmbroker run`` (which also sets torch's ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``) each rank joins the launcher's broker;
under ``torchrun``, local rank 0 hosts one on a socket named after the run. Started any other
way (``mp.spawn`` with a ``tcp://`` or ``file://`` ``init_method``, say), rank 0 hosts a broker
on a fresh socket and tells the others its path through torch's store. A world or group that
spans nodes uses shared memory inside each node and gloo between them (see
the guide's "Beyond one machine"); ``SHMBROKER_NODE`` names a rank's node.

**Calls:** ``barrier``, ``all_reduce`` (``SUM``, ``AVG``, ``PRODUCT``, ``MIN``, ``MAX``,
``BAND``, ``BOR``, ``BXOR``), ``all_gather``, ``all_gather_into_tensor``, ``reduce_scatter``,
``reduce_scatter_tensor``, ``broadcast``, ``reduce``, ``gather``, ``scatter``, ``all_to_all``,
``all_to_all_single`` (with or without split sizes), ``send``/``recv``/``isend``/``irecv`` and
``batch_isend_irecv`` (receives also from any source on the whole world), and ``new_group``.
Tensors are CPU tensors of ``uint8 int8 int16 int32 int64 float16 bfloat16 float32 float64``,
complex (as pairs of floats: sum and average only), or ``bool`` (``SUM`` is a logical or,
``PRODUCT`` a logical and, as NCCL does).

**Decisions, where torch leaves room:**

- Collectives and sends run to their end in the calling thread: ``async_op=True`` returns a
  ``Work`` that is already complete (``wait()`` returns ``True``, ``get_future()`` holds the
  outputs). Results are the same; nothing overlaps.
- A receive is posted and taken when its ``Work`` is waited for, so a program may post its
  receives before it sends (``irecv`` then ``send``, ``batch_isend_irecv`` in any order).
  Waiting for one receive takes every receive posted before it first, in order.
- Calls from several threads take turns on the process's one session (a lock), so every rank
  must make them in the same order.
- ``destroy_process_group`` keeps the session, which the next ``init_process_group`` in the
  process takes up again (a rank that left a job cannot join it again); it closes when the
  process exits.
- Reductions combine in rank order, so every rank gets the same bits, run after run.
- The deadline of every call is the ``timeout`` given to ``init_process_group`` (torch's
  default: 30 minutes). A peer's death ends a wait at once with :class:`shmbroker.PeerLost`
  naming it, whatever the deadline.
- ``send``/``recv`` match on tags, as gloo does: a message whose tag no receive asked for yet is
  kept (copied) until one does; messages of one tag between two ranks arrive in order. Every
  message carries an 8-byte tag ahead of it.
- A deadline that passes raises :class:`Timeout` (a :class:`shmbroker.Timeout`, and torch's
  ``DistBackendError`` when torch has it), whose text says "Timed out", as torch's callers
  look for.
- ``monitored_barrier`` is a barrier whose timeout names every rank that did not come
  ("Ranks 1, 3 failed to pass monitoredBarrier in 2000 ms"), as gloo's does with
  ``wait_all_ranks=True``.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import datetime
import functools
import os
import shutil
import struct
import tempfile
import threading
from typing import Any, Callable, Iterator

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist
from torch.futures import Future

import shmbroker

__all__ = ["BACKEND", "ShmbrokerBackend", "ShmbrokerProcessGroup"]

BACKEND = "shmbroker"

_R = dist.ReduceOp
# torch's operations as shmbroker names them.
_OPS = {
    _R.SUM: "sum",
    _R.AVG: "avg",
    _R.PRODUCT: "prod",
    _R.MIN: "min",
    _R.MAX: "max",
    _R.BAND: "bit_and",
    _R.BOR: "bit_or",
    _R.BXOR: "bit_xor",
}
# The element type each torch type is combined as, by shmbroker's name: complex as pairs of
# floats, bool as bytes.
_AS = {
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.complex64: "float32",
    torch.complex128: "float64",
    torch.bool: "uint8",
}
# (op, torch type) -> (operation name, element type name), filled as pairs are first seen.
_REDUCTIONS: dict[tuple[Any, torch.dtype], tuple[str, str]] = {}


def _reduction(op: Any, tensor: torch.Tensor) -> tuple[str, str]:
    """How `op` combines `tensor`: shmbroker's operation and element type names."""
    kind = getattr(op, "op", op)
    key = (kind, tensor.dtype)
    found = _REDUCTIONS.get(key)
    if found is not None:
        return found
    if kind not in _OPS:
        raise ValueError(f"shmbroker backend: reduce op {op} is not supported")
    name = _OPS[kind]
    if tensor.dtype == torch.bool:
        # As NCCL: a sum of booleans is a logical or, a product a logical and.
        name = {"sum": "max", "prod": "min"}.get(name, name)
        if name == "avg":
            raise ValueError("shmbroker backend: AVG of bool tensors has no meaning")
    elif tensor.is_complex() and name not in ("sum", "avg"):
        raise ValueError(
            f"shmbroker backend: {name} of complex tensors is not supported (only SUM and AVG)"
        )
    found = (name, _dtype(tensor))
    _REDUCTIONS[key] = found
    return found


def _dtype(tensor: torch.Tensor) -> str:
    try:
        return _AS[tensor.dtype]
    except KeyError:
        raise ValueError(
            f"shmbroker backend: tensors of {tensor.dtype} are not supported"
        ) from None


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`'s elements as the type they are combined as (complex as pairs of floats, bool
    as bytes), sharing its memory."""
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    if tensor.dtype == torch.bool:
        tensor = tensor.view(torch.uint8)
    return tensor


@functools.lru_cache(maxsize=256)
def _bytes_type(size: int) -> Any:
    return ctypes.c_char * size


def _memory(tensor: torch.Tensor) -> Any:
    """The bytes of contiguous CPU `tensor`, writable, with no copy (a ctypes array over them)."""
    if not tensor.is_cpu:
        raise ValueError(f"shmbroker backend: tensors must be on the CPU, not {tensor.device}")
    size = tensor.nbytes
    if size == 0:
        return bytearray()
    return _bytes_type(size).from_address(tensor.data_ptr())


class _Contiguous:
    """`tensor` itself when it is contiguous; otherwise a contiguous copy, copied back into
    `tensor` on leaving the `with` block when `write_back`."""

    def __init__(self, tensor: torch.Tensor, write_back: bool = True):
        self.tensor = tensor
        self.write_back = write_back and not tensor.is_contiguous()
        self.dense = tensor if tensor.is_contiguous() else tensor.contiguous()

    def __enter__(self) -> torch.Tensor:
        return self.dense

    def __exit__(self, *exc: object) -> None:
        if self.write_back and exc[0] is None:
            self.tensor.copy_(self.dense)


class _Done(dist.Work):
    """The work of a call that has already run to its end: `wait()` returns at once, and its
    future holds `result` (the output tensors, as torch's backends give; DDP's communication
    hooks read them there). Through torch's C++ side only `wait` and `get_future` reach it (its
    `is_completed()` then says False); torch's Python functions reach all of it."""

    def __init__(self, result: Any = None):
        super().__init__()
        self._result = result

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Any:
        return None

    def result(self) -> Any:
        return self._result

    def get_future(self) -> Future:
        future: Future = Future()
        future.set_result(self._result)
        return future

    def synchronize(self) -> None:
        pass


# What every barrier returns: a barrier's work holds nothing, so one object serves them all.
_BARRIER_DONE = _Done()

_BackendError: type = getattr(dist, "DistBackendError", RuntimeError)


class Timeout(shmbroker.Timeout, _BackendError):  # type: ignore[misc, valid-type]
    """A deadline passed in a backend call: :class:`shmbroker.Timeout` (``op``,
    ``waiting_for``, ``diagnosis``), also torch's ``DistBackendError``, with "Timed out" in its
    text, where torch's callers look for it."""

    def __str__(self) -> str:
        return f"[shmbroker] Timed out after {self.timeout:g} s: {self.args[0]}"


def _backend_error(error: BaseException) -> BaseException:
    """`error` as torch's callers expect it: a deadline is a :class:`Timeout`."""
    if isinstance(error, shmbroker.Timeout) and not isinstance(error, Timeout):
        return Timeout(
            error.args[0],
            error.op,
            error.waiting_for,
            error.timeout,
            error.diagnosis,
            error.stopped,
        )
    return error


class _World:
    """This process's session, which every group is made on; the lock by which calls from
    several threads take turns on it; and the receives posted and not yet waited for, in the
    order they were posted."""

    def __init__(
        self,
        session: shmbroker.Session,
        rank: int | None = None,
        size: int | None = None,
        nodes: list[int] | None = None,
    ):
        self.session = session
        # This rank and the world's size in torch's world (the session's, on one node).
        self.rank = session.rank if rank is None else rank
        self.size = session.world_size if size is None else size
        # The node of every world rank when the world spans nodes (the session then holds this
        # node's ranks only), and the world ranks of this node by session rank; None on one
        # node.
        self.nodes = nodes
        self.node_ranks: list[int] = (
            [r for r, n in enumerate(nodes) if n == nodes[self.rank]] if nodes else []
        )
        # torch's store of the world, where a world spanning nodes names its first death, and
        # the prefix of this world's keys in it.
        self.store: Any = None
        self.prefix = ""
        self.lock = threading.Lock()
        self.posted: collections.deque[_Receive] = collections.deque()
        # Messages that came before a receive of their tag asked for them: (world rank, tag)
        # in the order they came, and their bytes.
        self.kept: collections.deque[tuple[int, int, bytes]] = collections.deque()

    def take(self, timeout: float) -> None:
        """Takes the lock within `timeout` seconds (the caller's deadline), or raises."""
        if not self.lock.acquire(timeout=timeout if timeout < threading.TIMEOUT_MAX else -1):
            raise RuntimeError(
                f"shmbroker backend: another thread kept this process's session busy for "
                f"{timeout} s (calls from several threads take turns; every rank must make "
                "them in the same order)"
            )

    @contextlib.contextmanager
    def turn(self, timeout: float) -> Iterator[None]:
        """This thread's turn on the session, taken within `timeout` seconds (see `take`)."""
        self.take(timeout)
        try:
            yield
        finally:
            self.lock.release()

    def complete_through(self, receive: "_Receive") -> None:
        """Receives every posted receive up to `receive`, in the order they were posted (the
        caller holds the lock)."""
        while not receive.done:
            self.posted.popleft().complete()


_world: _World | None = None
_world_lock = threading.Lock()


class _Receive(dist.Work):
    """A posted receive (`irecv`, or the first half of `recv`): the message is taken when the
    work is waited for, so a program may post its receives before it sends, as with gloo.
    Waiting for one receives every receive posted before it first, in order. (torch's C++ side
    reaches `wait` and `get_future` of a Python work; its Python functions reach the rest.)"""

    def __init__(self, calls: "_Calls", tensor: torch.Tensor, source: int | None, tag: int):
        super().__init__()
        self._calls = calls
        self._tensor = tensor
        # The world rank it comes from; None: whichever rank sends first (the world only).
        self._source = source
        self._tag = tag
        self.done = False
        self._error: BaseException | None = None

    def complete(self) -> None:
        """Receives the message (the world's lock is held), keeping a failure for `wait`."""
        try:
            self._source = self._calls._receive(self._tensor, self._source, self._tag)
        except BaseException as error:  # noqa: BLE001 - kept for wait(), which raises it
            self._error = self._calls._failed(error)
        self.done = True

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        if not self.done:
            world = self._calls._world
            with world.turn(self._calls._timeout):
                world.complete_through(self)
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self.done

    def is_success(self) -> bool:
        return self.done and self._error is None

    def exception(self) -> Any:
        return self._error

    def result(self) -> list[torch.Tensor]:
        return [self._tensor]

    def source_rank(self) -> int:
        """The sender's rank in the group (after waiting for the message)."""
        self.wait()
        assert self._source is not None
        return self._calls._world_ranks.index(self._source)

    def _source_rank(self) -> int:
        return self.source_rank()

    def get_future(self) -> Future:
        # No thread completes a receive in the background: the future is had by waiting.
        self.wait()
        future: Future = Future()
        future.set_result([self._tensor])
        return future

    def synchronize(self) -> None:
        pass


# What goes ahead of every point-to-point message: its tag.
_TAG = struct.Struct("<q")


def _turn(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` run with the world's lock held: calls from several threads take turns."""

    @functools.wraps(method)
    def taking_turns(self: "_Calls", *args: Any, **kwargs: Any) -> Any:
        lock = self._world.lock
        if not lock.acquire(False):  # (the common case, free, without a timed wait's cost)
            self._world.take(self._timeout)
        try:
            return method(self, *args, **kwargs)
        except shmbroker.Error as error:
            failed = self._failed(error)
            if failed is error:
                raise
            raise failed from None
        finally:
            lock.release()

    return taking_turns


class _Aliases:
    """torch's other names for the calls a group makes (coalesced lists, the old ``_base``
    forms), in terms of the calls themselves: shared by the groups on one node
    (:class:`_Calls`) and those spanning nodes (``_spanning.SpanCalls``)."""

    def getBackendName(self) -> str:
        return BACKEND

    def allreduce_coalesced(self: Any, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self.allreduce(tensors, opts)

    def _reduce_scatter_base(
        self: Any, output: torch.Tensor, input: torch.Tensor, opts: Any
    ) -> Any:
        return self.reduce_scatter_single(output, input, opts)

    def reduce_scatter_single_coalesced(
        self: Any, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> Any:
        for output, input in zip(outputs, inputs, strict=True):
            self.reduce_scatter_single(output, input, opts)
        return _Done(outputs)

    def reduce_scatter_tensor_coalesced(
        self: Any, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> Any:
        return self.reduce_scatter_single_coalesced(outputs, inputs, opts)

    def allgather_coalesced(
        self: Any,
        outputs: list[list[torch.Tensor]],
        inputs: list[torch.Tensor],
        opts: Any = None,
    ) -> Any:
        return self.allgather(outputs, inputs, opts)

    def _allgather_base(
        self: Any, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> Any:
        return self.all_gather_single(output, input, opts)

    def allgather_into_tensor_coalesced(
        self: Any, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        for output, input in zip(outputs, inputs, strict=True):
            self.all_gather_single(output, input)
        return _Done(outputs)

    def all_gather_single_coalesced(
        self: Any, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def all_to_all_single(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self.alltoall_base(*args, **kwargs)


class _Calls(_Aliases):
    """Every call of a group (the whole world, or one ``new_group`` made) on this process's
    shmbroker session: what torch's Python functions call on a ``ProcessGroup``
    (:class:`ShmbrokerProcessGroup`) and its C++ side on a backend (:class:`ShmbrokerBackend`),
    which share them."""

    def _join(self, world: _World, group: shmbroker.Group | None, timeout: float) -> None:
        session = world.session
        self._world = world
        self._session = session
        self._group = group
        self._rank, self._size = (
            (group.rank, group.size) if group else (session.rank, session.world_size)
        )
        self._timeout = timeout
        # Keywords of every call: this group and its deadline.
        self._on: dict[str, Any] = {"timeout": timeout}
        if group is not None:
            self._on["group"] = group
        # World rank of each group rank.
        self._world_ranks = list(group.ranks) if group is not None else list(range(self._size))
        if world.nodes is not None:
            # A group wholly on this node of a world that spans nodes: the session's ranks are
            # this node's, and errors name the job's.
            self._job_ranks = world.node_ranks

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self._rank}, size={self._size})"

    # The job's rank of each session rank, when the session holds one node's ranks of a world
    # that spans nodes (a group wholly on this node); None when session ranks are the job's.
    _job_ranks: list[int] | None = None

    def _failed(self, error: BaseException) -> BaseException:
        """What a call raises for `error`: a deadline as torch's callers expect it, and every
        rank named as the job numbers it."""
        if self._job_ranks is not None:
            error = _nodes.renumbered(error, self._job_ranks, "ranks of the job")
        return _backend_error(error)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`method` of the session, on this group, with this group's deadline."""
        return getattr(self._session, method)(*args, **kwargs, **self._on)

    # --- synchronisation

    def barrier(self, opts: Any = None) -> Any:
        # `_turn` written out: the barrier is all overhead, and a wrapper's frame is a tenth
        # of it.
        lock = self._world.lock
        if not lock.acquire(False):
            self._world.take(self._timeout)
        try:
            self._session.barrier(**self._on)
        except shmbroker.Error as error:
            failed = self._failed(error)
            if failed is error:
                raise
            raise failed from None
        finally:
            lock.release()
        return _BARRIER_DONE

    def monitored_barrier(
        self, timeout: datetime.timedelta | None = None, wait_all_ranks: bool = False
    ) -> None:
        """A barrier whose timeout names every rank that did not come, in group ranks, as
        gloo's does (every rank waits for every other here, so all are named either way)."""
        seconds = self._timeout if timeout is None else timeout.total_seconds()
        with self._world.turn(seconds):
            try:
                group = {"group": self._group} if self._group is not None else {}
                self._session.barrier(timeout=seconds, **group)
            except shmbroker.Timeout as error:
                missing = [self._world_ranks.index(r) for r in error.waiting_for]
                text = ", ".join(map(str, missing))
                raise self._failed(
                    Timeout(
                        f"Rank{'s' if len(missing) > 1 else ''} {text} failed to pass "
                        f"monitoredBarrier in {int(seconds * 1000)} ms: {error.args[0]}",
                        error.op,
                        error.waiting_for,
                        error.timeout,
                        error.diagnosis,
                        error.stopped,
                    )
                ) from None

    # --- reductions

    @_turn
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else _R.SUM
        for tensor in tensors:
            name, dtype = _reduction(op, tensor)
            if tensor.is_contiguous():  # the common case, without a context manager's cost
                self._session.all_reduce(_memory(tensor), name, dtype=dtype, **self._on)
                continue
            with _Contiguous(tensor) as dense:
                self._session.all_reduce(_memory(dense), name, dtype=dtype, **self._on)
        return _Done(tensors)

    @_turn
    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        (tensor,) = tensors
        name, dtype = _reduction(opts.reduceOp, tensor)
        with _Contiguous(tensor) as dense:
            self._call("reduce", opts.rootRank, _memory(dense), name, dtype=dtype)
        return _Done(tensors)

    def _reduce_scatter_flat(self, output: torch.Tensor, flat: torch.Tensor, op: Any) -> None:
        name, dtype = _reduction(op, output)
        with _Contiguous(output) as dense:
            self._call("reduce_scatter", _memory(flat), _memory(dense), name, dtype=dtype)

    @_turn
    def reduce_scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> Any:
        for output, parts in zip(outputs, inputs, strict=True):
            flat = torch.cat([part.reshape(-1) for part in parts])
            self._reduce_scatter_flat(output, flat, opts.reduceOp)
        return _Done(outputs)

    @_turn
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        self._reduce_scatter_flat(output, input.contiguous(), opts.reduceOp)
        return _Done([output])

    # --- moving data

    @_turn
    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        root = opts.rootRank
        for tensor in tensors:
            with _Contiguous(tensor, write_back=self._rank != root) as dense:
                memory = _memory(dense)
                data = self._call("broadcast", root, memory)
                if self._rank != root:
                    _fill(memory, data, f"broadcast from group rank {root}")
        return _Done(tensors)

    def _all_gather_flat(self, output: torch.Tensor, input: torch.Tensor) -> None:
        with _Contiguous(output) as dense, _Contiguous(input, write_back=False) as source:
            self._call("all_gather_into", _memory(source), _memory(dense))

    @_turn
    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        for parts, input in zip(outputs, inputs, strict=True):
            flat = torch.empty(
                (len(parts) * input.numel(),), dtype=input.dtype, device=input.device
            )
            self._all_gather_flat(flat, input)
            for part, block in zip(parts, flat.chunk(len(parts)), strict=True):
                part.copy_(block.view_as(part))
        return _Done(outputs)

    @_turn
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        self._all_gather_flat(output, input)
        return _Done([output])

    @_turn
    def gather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> Any:
        (input,) = inputs
        with _Contiguous(input, write_back=False) as source:
            parts = self._call("gather", opts.rootRank, _memory(source))
        if parts is not None:
            (targets,) = outputs
            for rank, (target, part) in enumerate(zip(targets, parts, strict=True)):
                with _Contiguous(target) as dense:
                    _fill(_memory(dense), part, f"gather from group rank {rank}")
        return _Done(outputs)

    @_turn
    def scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> Any:
        (output,) = outputs
        root = opts.rootRank
        with _Contiguous(output) as dense:
            memory = _memory(dense)
            if self._rank == root:
                (parts,) = inputs
                flat = torch.cat([part.reshape(-1) for part in parts])
                source = _memory(flat)
            else:
                source = None
            self._call("scatter", root, source, memory)
        return _Done(outputs)

    @_turn
    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Any:
        with _Contiguous(output) as dense, _Contiguous(input, write_back=False) as source:
            if not output_split_sizes and not input_split_sizes:
                self._call("all_to_all", _memory(source), _memory(dense))
            else:
                self._call(
                    "all_to_all_v",
                    _memory(source),
                    _byte_counts(source, input_split_sizes, self._size),
                    _memory(dense),
                    _byte_counts(dense, output_split_sizes, self._size),
                )
        return _Done([output])

    @_turn
    def alltoall(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        flat_in = torch.cat([_flat(t.contiguous()).reshape(-1).view(torch.uint8) for t in inputs])
        sizes_in = [t.nbytes for t in inputs]
        sizes_out = [t.nbytes for t in outputs]
        flat_out = torch.empty(sum(sizes_out), dtype=torch.uint8)
        self._call("all_to_all_v", _memory(flat_in), sizes_in, _memory(flat_out), sizes_out)
        for output, block in zip(outputs, flat_out.split(sizes_out), strict=True):
            with _Contiguous(output) as dense:
                _flat(dense).reshape(-1).view(torch.uint8).copy_(block)
        return _Done(outputs)

    # --- point to point

    @_turn
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        (tensor,) = tensors
        rank = self._world_ranks[dst]
        with _Contiguous(tensor, write_back=False) as dense:
            self._session.send(rank, _TAG.pack(tag), timeout=self._timeout)
            self._session.send(rank, _memory(dense), timeout=self._timeout)
        return _Done(tensors)

    def _receive(self, tensor: torch.Tensor, world_rank: int | None, tag: int) -> int:
        """Receives into `tensor` a message of `tag` that must fill it, from `world_rank`
        (None: whichever rank sends first); returns the sender's world rank. Messages of other
        tags that come first are kept for the receives that ask for them."""
        kept = self._world.kept
        with _Contiguous(tensor) as dense:
            memory = _memory(dense)
            for at, (sender, theirs, data) in enumerate(kept):
                if theirs == tag and world_rank in (None, sender):
                    del kept[at]
                    _fill(memory, data, f"rank {sender}'s message of tag {tag}")
                    return sender
            while True:
                if world_rank is None:
                    sender, head = self._session.recv_any(timeout=self._timeout)
                else:
                    sender, head = world_rank, self._session.recv(world_rank, timeout=self._timeout)
                if len(head) != _TAG.size:
                    raise ValueError(
                        f"shmbroker backend: rank {sender} sent {len(head)} bytes where a "
                        f"message's {_TAG.size}-byte tag belongs"
                    )
                (theirs,) = _TAG.unpack(head)
                if theirs != tag:
                    kept.append((sender, theirs, self._session.recv(sender, timeout=self._timeout)))
                    continue
                length = self._session.recv_into(sender, memory, timeout=self._timeout)
                if length != len(memory):
                    raise ValueError(
                        f"shmbroker backend: rank {sender} sent {length} bytes for a tensor "
                        f"of {len(memory)}"
                    )
                return sender

    def _post(self, tensor: torch.Tensor, world_rank: int | None, tag: int) -> "_Receive":
        receive = _Receive(self, tensor, world_rank, tag)
        with self._world.turn(self._timeout):
            self._world.posted.append(receive)
        return receive

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        (tensor,) = tensors
        return self._post(tensor, self._world_ranks[src], tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Any:
        if self._group is not None:
            raise ValueError(
                "shmbroker backend: a receive from any source works on the whole world only "
                "(it would take a message from a rank outside this group)"
            )
        (tensor,) = tensors
        return self._post(tensor, None, tag)


class _Answers:
    """What torch asks a backend about itself. Inherited, each of these asks the C++ side, which
    asks this object again, without end: a Python backend says them itself. Each point-to-point
    call runs (or posts its receive) on its own: no NCCL-style coalescing. Reads the backend's
    `_timeout` (seconds) and `_world_ranks`."""

    _timeout: float
    _world_ranks: list[int]
    _job_ranks: list[int] | None = None

    supports_coalescing = False
    supports_splitting = False
    supports_shrinking = False
    supports_reconfigure = False
    supports_window = False
    _supports_time_estimate = False

    @property
    def options(self) -> Any:
        options = c10d.Backend.Options(BACKEND, datetime.timedelta(seconds=self._timeout))
        ranks = self._world_ranks
        options.global_ranks_in_group = ranks if self._job_ranks is None else [
            self._job_ranks[r] for r in ranks
        ]
        return options


class ShmbrokerBackend(_Answers, _Calls, c10d.Backend):
    """The calls as torch's C++ side reaches them (functional collectives, compiled code), on
    the backend it finds registered for the CPU in :class:`ShmbrokerProcessGroup`."""

    def __init__(self, world: _World, group: shmbroker.Group | None, timeout: float):
        self._join(world, group, timeout)
        c10d.Backend.__init__(self, self._rank, self._size)



class ShmbrokerProcessGroup(_Calls, dist.ProcessGroup):
    """The group torch's Python functions (``dist.all_reduce`` and the rest) call straight
    into, with a :class:`ShmbrokerBackend` registered for the CPU for the C++ side. (A backend
    alone would do, at about 8 us more per call through torch's C++ dispatch.)"""

    def __init__(self, world: _World, group: shmbroker.Group | None, timeout: float):
        self._join(world, group, timeout)
        dist.ProcessGroup.__init__(self, self._rank, self._size)
        custom = dist.ProcessGroup.BackendType.CUSTOM
        self._set_default_backend(custom)
        self._register_backend(torch.device("cpu"), custom, ShmbrokerBackend(world, group, timeout))


def _byte_counts(tensor: torch.Tensor, splits: list[int], size: int) -> list[int]:
    """Bytes per rank of `tensor` cut along its first dimension by `splits` (rows per rank;
    torch passes none for equal parts among `size` ranks)."""
    rows = tensor.shape[0] if tensor.dim() else 1
    row_bytes = tensor.nbytes // rows if rows else 0
    if not splits:
        if rows % size:
            raise ValueError(
                f"shmbroker backend: {rows} rows do not split evenly among {size} ranks"
            )
        splits = [rows // size] * size
    return [split * row_bytes for split in splits]


def _fill(memory: Any, data: bytes, what: str) -> None:
    """Copies `data` into a tensor's `memory`, which it must fill exactly."""
    if len(data) != len(memory):
        raise ValueError(
            f"shmbroker backend: {what} carried {len(data)} bytes for a tensor of {len(memory)}"
        )
    if data:
        ctypes.memmove(memory, data, len(data))


def _connect(
    store: Any, rank: int, size: int, timeout: float, node: str | None = None
) -> shmbroker.Session:
    """A new session: from the launcher's environment, or on a socket rank 0 makes and names in
    torch's `store`. With `node` (the store's key for it), the session of that node's ranks
    (`rank` and `size` counted among them), on a socket its first rank makes."""
    launched = "SHMBROKER_SOCKET" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ
    if launched and node is None:
        session = shmbroker.connect(timeout=timeout)
        if (session.rank, session.world_size) != (rank, size):
            session.close()
            raise RuntimeError(
                f"shmbroker backend: torch says rank {rank} of {size}, the launcher's "
                f"environment rank {session.rank} of {session.world_size} (every rank is on "
                "one node, by SHMBROKER_NODE or the host's identity, but the launcher's world "
                "is not torch's)"
            )
        return session
    key = "shmbroker/socket" if node is None else node
    if rank == 0:
        folder = tempfile.mkdtemp(prefix="shmbroker-torch-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        path = os.path.join(folder, "broker.sock")
        store.set(key, path)
        return shmbroker.connect(path, rank, timeout, world_size=size)
    path = store.get(key).decode()
    return shmbroker.connect(path, rank, timeout, world_size=size)


def _world_for(options: Any, seconds: float) -> _World:
    """The world session for torch's default group: this process's, when it has one that fits
    (a group destroyed and made again keeps it: a rank that left a job cannot join it again),
    otherwise a new one, closed when the process exits."""
    global _world
    rank, size = options.group_rank, options.group_size
    if _world is not None and not _world.session.closed:
        if (_world.rank, _world.size) == (rank, size):
            return _world
        _world.session.close()
    nodes, prefix = _spanning.layout(options.store, rank, size)
    if max(nodes) == 0:
        _world = _World(_connect(options.store, rank, size, seconds))
    else:
        mine = [r for r, n in enumerate(nodes) if n == nodes[rank]]
        key = f"{prefix}/socket/{nodes[rank]}"
        session = _connect(options.store, mine.index(rank), len(mine), seconds, key)
        _world = _World(session, rank, size, nodes)
        _world.store, _world.prefix = options.store, prefix
    atexit.register(_world.session.close)
    return _world


def _create(options: Any, _backend_options: Any) -> dist.ProcessGroup:
    seconds = options.timeout.total_seconds()
    ranks = list(options.global_ranks_in_group)
    with _world_lock:
        if not ranks:
            made = _world_for(options, seconds)
            if made.nodes is None:
                return ShmbrokerProcessGroup(made, None, seconds)
            span = _spanning.Span(made, list(range(made.size)), None, options.store, seconds)
            return _spanning.SpanProcessGroup(span)
        world = _world
    if world is None or world.session.closed:
        raise RuntimeError(
            "shmbroker backend: a group needs the shmbroker backend as the default group's "
            '(init_process_group("shmbroker")) first'
        )
    if world.nodes is None:
        with world.turn(seconds):
            group = world.session.group(ranks, timeout=seconds)
        return ShmbrokerProcessGroup(world, group, seconds)
    # The world spans nodes: the session holds this node's ranks, numbered by session rank.
    here = [world.node_ranks.index(r) for r in ranks if r in world.node_ranks]
    with world.turn(seconds):
        group = world.session.group(here, timeout=seconds)
    if all(r in world.node_ranks for r in ranks):
        return ShmbrokerProcessGroup(world, group, seconds)
    span = _spanning.Span(world, ranks, group, options.store, seconds)
    return _spanning.SpanProcessGroup(span)


from . import _nodes, _spanning  # noqa: E402  (_spanning builds on this module's helpers)

dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
