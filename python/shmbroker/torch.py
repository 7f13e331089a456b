# torch's stubs give ProcessGroup's methods the overloads of its C++ binding, which a Python
# ProcessGroup (as torch's own threaded test backend) overrides with the form torch calls.
# mypy: disable-error-code="override,import-not-found"
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
on a fresh socket and tells the others its path through torch's store. One node only: the world
must be the ranks of this machine.

**Calls:** ``barrier``, ``all_reduce`` (``SUM``, ``AVG``, ``PRODUCT``, ``MIN``, ``MAX``,
``BAND``, ``BOR``, ``BXOR``), ``all_gather``, ``all_gather_into_tensor``, ``reduce_scatter``,
``reduce_scatter_tensor``, ``broadcast``, ``reduce``, ``gather``, ``scatter``, ``all_to_all``,
``all_to_all_single`` (with or without split sizes), ``send``/``recv`` (also from any source on
the whole world) and ``new_group``. Tensors are CPU tensors of ``uint8 int8 int16 int32 int64
float16 bfloat16 float32 float64``, complex (as pairs of floats: sum and average only), or
``bool`` (``SUM`` is a logical or, ``PRODUCT`` a logical and, as NCCL does).

**Decisions, where torch leaves room:**

- Each call runs to its end in the calling thread. ``async_op=True`` returns a ``Work`` that is
  already complete (``wait()`` returns ``True``, ``get_future()`` holds the outputs), as
  torch's own threaded test backend does. Results are the same; nothing overlaps.
- Reductions combine in rank order, so every rank gets the same bits, run after run.
- The deadline of every call is the ``timeout`` given to ``init_process_group`` (torch's
  default: 30 minutes). A peer's death ends a wait at once with :class:`shmbroker.PeerLost`
  naming it, whatever the deadline.
- Tags of ``send``/``recv`` must be 0: messages between two ranks arrive in the order they were
  sent, and there is no matching on tags.
"""

from __future__ import annotations

import atexit
import ctypes
import datetime
import functools
import os
import shutil
import tempfile
import threading
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

import shmbroker

__all__ = ["BACKEND", "ProcessGroupShmbroker"]

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
# torch's element types the reductions combine, by shmbroker's name.
_DTYPES = {
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}
# The session of this process's world, shared by every group made on it.
_world: dict[str, Any] = {}
_world_lock = threading.Lock()


# The element type each torch type is combined as: complex as pairs of floats, bool as bytes.
_AS = {
    **_DTYPES,
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
    future holds `result` (the output tensors, as torch's backends give). `_source_rank()` is the
    sender of a receive from any source."""

    def __init__(self, result: Any = None, source: int = -1):
        super().__init__()
        self._result = result
        self._source = source

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

    def source_rank(self) -> int:
        return self._source

    def _source_rank(self) -> int:
        return self._source

    def get_future(self) -> Future:
        future: Future = Future()
        future.set_result(self._result)
        return future

    def synchronize(self) -> None:
        pass


# What every barrier returns: a barrier's work holds nothing, so one object serves them all.
_BARRIER_DONE = _Done()


def _check_tag(tag: int) -> None:
    if tag != 0:
        raise ValueError(
            f"shmbroker backend: tag {tag}: tags are not matched (messages between two ranks "
            "arrive in order); pass tag=0"
        )


class ProcessGroupShmbroker(dist.ProcessGroup):
    """The whole world, or a group of it (``new_group``), on this process's shmbroker session."""

    def __init__(
        self,
        session: shmbroker.Session,
        group: shmbroker.Group | None,
        rank: int,
        size: int,
        timeout: datetime.timedelta,
    ):
        super().__init__(rank, size)
        self._session = session
        self._group = group
        self._rank = rank
        self._size = size
        self._timeout = timeout.total_seconds()
        # Keywords of every call: this group and its deadline.
        self._on: dict[str, Any] = {"timeout": self._timeout}
        if group is not None:
            self._on["group"] = group
        # World rank of each group rank.
        self._world_ranks = list(group.ranks) if group is not None else list(range(size))

    def getBackendName(self) -> str:
        return BACKEND

    def __repr__(self) -> str:
        return f"ProcessGroupShmbroker(rank={self._rank}, size={self._size})"

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`method` of the session, on this group, with this group's deadline."""
        return getattr(self._session, method)(*args, **kwargs, **self._on)

    # --- synchronisation

    def barrier(self, opts: Any = None) -> Any:
        self._session.barrier(**self._on)
        return _BARRIER_DONE

    # --- reductions

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

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self.allreduce(tensors, opts)

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

    def reduce_scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> Any:
        for output, parts in zip(outputs, inputs, strict=True):
            flat = torch.cat([part.reshape(-1) for part in parts])
            self._reduce_scatter_flat(output, flat, opts.reduceOp)
        return _Done(outputs)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        self._reduce_scatter_flat(output, input.contiguous(), opts.reduceOp)
        return _Done([output])

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        return self.reduce_scatter_single(output, input, opts)

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> Any:
        for output, input in zip(outputs, inputs, strict=True):
            self.reduce_scatter_single(output, input, opts)
        return _Done(outputs)

    # --- moving data

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        for tensor in tensors:
            with _Contiguous(tensor, write_back=self._rank != opts.rootRank) as dense:
                memory = _memory(dense)
                data = self._call("broadcast", opts.rootRank, memory)
                if self._rank != opts.rootRank:
                    if len(data) != len(memory):
                        raise ValueError(
                            f"shmbroker backend: broadcast from rank {opts.rootRank} carried "
                            f"{len(data)} bytes into a tensor of {len(memory)}"
                        )
                    ctypes.memmove(memory, data, len(data))
        return _Done(tensors)

    def _all_gather_flat(self, output: torch.Tensor, input: torch.Tensor) -> None:
        with _Contiguous(output) as dense, _Contiguous(input, write_back=False) as source:
            self._call("all_gather_into", _memory(source), _memory(dense))

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

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        self._all_gather_flat(output, input)
        return _Done([output])

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        return self.all_gather_single(output, input, opts)

    def allgather_into_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        for output, input in zip(outputs, inputs, strict=True):
            self._all_gather_flat(output, input)
        return _Done(outputs)

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def gather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> Any:
        (input,) = inputs
        with _Contiguous(input, write_back=False) as source:
            parts = self._call("gather", opts.rootRank, _memory(source))
        if parts is not None:
            (targets,) = outputs
            for target, part in zip(targets, parts, strict=True):
                with _Contiguous(target) as dense:
                    memory = _memory(dense)
                    if len(part) != len(memory):
                        raise ValueError(
                            f"shmbroker backend: gather got {len(part)} bytes for a tensor of "
                            f"{len(memory)}"
                        )
                    ctypes.memmove(memory, part, len(part))
        return _Done(outputs)

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
                    self._byte_counts(source, input_split_sizes),
                    _memory(dense),
                    self._byte_counts(dense, output_split_sizes),
                )
        return _Done([output])

    def all_to_all_single(self, *args: Any, **kwargs: Any) -> Any:
        return self.alltoall_base(*args, **kwargs)

    def _byte_counts(self, tensor: torch.Tensor, splits: list[int]) -> list[int]:
        """Bytes per rank of `tensor` cut along its first dimension by `splits` (equal when
        empty)."""
        rows = tensor.shape[0] if tensor.dim() else 1
        row_bytes = tensor.numel() * tensor.element_size() // rows if rows else 0
        if not splits:
            if rows % self._size:
                raise ValueError(
                    f"shmbroker backend: {rows} rows do not split evenly among {self._size} ranks"
                )
            splits = [rows // self._size] * self._size
        return [split * row_bytes for split in splits]

    def alltoall(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        flat_in = torch.cat([_flat(t.contiguous()).reshape(-1).view(torch.uint8) for t in inputs])
        sizes_in = [t.numel() * t.element_size() for t in inputs]
        sizes_out = [t.numel() * t.element_size() for t in outputs]
        flat_out = torch.empty(sum(sizes_out), dtype=torch.uint8)
        self._call("all_to_all_v", _memory(flat_in), sizes_in, _memory(flat_out), sizes_out)
        for output, block in zip(outputs, flat_out.split(sizes_out), strict=True):
            with _Contiguous(output) as dense:
                _flat(dense).reshape(-1).view(torch.uint8).copy_(block)
        return _Done(outputs)

    # --- point to point

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        _check_tag(tag)
        (tensor,) = tensors
        with _Contiguous(tensor, write_back=False) as dense:
            self._session.send(self._world_ranks[dst], _memory(dense), timeout=self._timeout)
        return _Done(tensors)

    def _recv_from(self, tensor: torch.Tensor, world_rank: int | None) -> int:
        with _Contiguous(tensor) as dense:
            memory = _memory(dense)
            if world_rank is None:
                world_rank, length = self._session.recv_any_into(memory, timeout=self._timeout)
            else:
                length = self._session.recv_into(world_rank, memory, timeout=self._timeout)
            if length != len(memory):
                raise ValueError(
                    f"shmbroker backend: rank {world_rank} sent {length} bytes into a tensor "
                    f"of {len(memory)}"
                )
        return world_rank

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        _check_tag(tag)
        (tensor,) = tensors
        self._recv_from(tensor, self._world_ranks[src])
        return _Done(tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Any:
        _check_tag(tag)
        if self._group is not None:
            raise ValueError(
                "shmbroker backend: a receive from any source works on the whole world only "
                "(it would take a message from a rank outside this group)"
            )
        (tensor,) = tensors
        return _Done(tensors, self._recv_from(tensor, None))


def _connect(store: Any, rank: int, size: int, timeout: float) -> shmbroker.Session:
    """This process's session: from the launcher's environment, or on a socket rank 0 makes and
    names in torch's `store`."""
    launched = "SHMBROKER_SOCKET" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ
    if launched:
        session = shmbroker.connect(timeout=timeout)
        if (session.rank, session.world_size) != (rank, size):
            session.close()
            raise RuntimeError(
                f"shmbroker backend: torch says rank {rank} of {size}, the launcher's "
                f"environment rank {session.rank} of {session.world_size} (shmbroker works on "
                "one node: the world must be this node's ranks)"
            )
        return session
    key = "shmbroker/socket"
    if rank == 0:
        folder = tempfile.mkdtemp(prefix="shmbroker-torch-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        path = os.path.join(folder, "broker.sock")
        store.set(key, path)
        return shmbroker.connect(path, rank, timeout, world_size=size)
    path = store.get(key).decode()
    return shmbroker.connect(path, rank, timeout, world_size=size)


def _create(options: Any, _backend_options: Any) -> ProcessGroupShmbroker:
    timeout = options.timeout
    seconds = timeout.total_seconds()
    ranks = list(options.global_ranks_in_group)
    with _world_lock:
        if not ranks or "session" not in _world or _world["session"].closed:
            if ranks and ranks != list(range(len(ranks))):
                raise RuntimeError(
                    "shmbroker backend: make the default group with shmbroker before a subgroup"
                )
            _world["session"] = _connect(
                options.store, options.group_rank, options.group_size, seconds
            )
        session = _world["session"]
    if not ranks:
        return ProcessGroupShmbroker(session, None, session.rank, session.world_size, timeout)
    group = session.group(ranks, timeout=seconds)
    return ProcessGroupShmbroker(session, group, group.rank, group.size, timeout)


dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
