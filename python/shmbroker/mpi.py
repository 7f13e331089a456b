"""shmbroker's collectives for an mpi4py program whose job spans nodes: shared memory inside
each node, the program's own MPI between nodes (the same as ``shmbroker_mpi.h`` for C)::

    from mpi4py import MPI
    import shmbroker.mpi

    nodes = shmbroker.mpi.Nodes(MPI.COMM_WORLD)    # collective over the communicator
    nodes.all_reduce(values)                        # any writable buffer, in place: a sum
    nodes.close()

**Where each rank stands.** Its node is ``SHMBROKER_NODE`` when set (so that tests on one
machine can form several nodes), otherwise the host's name and boot id. The ranks of one node,
in the communicator's order, share one shmbroker session on a broker the node's first rank
hosts in a fresh private directory; its path goes to the others over MPI.

**Algorithms** (``leaders``: the first rank of every node; ``rail``: the ``j``-th rank of
every node, when every node has the same number ``L > 1`` of ranks):

- ``all_reduce`` up to :data:`RAILS_MIN_BYTES` or on an uneven layout: reduce to the node's
  first rank, ``Allreduce`` among leaders, broadcast in the node. Above it: reduce-scatter in the
  node, ``Allreduce`` of each slice on its rail, all-gather in the node;
- ``barrier``: in the node, among leaders, in the node;
- ``broadcast``: in the root's node, among leaders, in every other node;
- ``all_gather``: in the node, node blocks among leaders, a broadcast in the node.

Floats combine in the node in rank order, then between nodes in MPI's order: every rank gets the
same bits for a fixed layout and MPI. Types MPI lacks (``float16``, ``bfloat16``) raise
:class:`shmbroker.MisuseError`; ``"avg"`` is a sum divided by the size (floats only).

**Errors** inside a node are shmbroker's exceptions, naming the communicator's rank. Making a
:class:`Nodes` agrees over the whole communicator; a later failure inside a node raises on that
node's ranks only, while the other nodes wait in MPI, which has no deadline: end the job on any
error (``comm.Abort()``), as MPI programs do. Between nodes, the communicator's MPI error
handler rules. Calls must be made in the same order on every rank, from one thread at a time.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from typing import Any

import shmbroker

from ._nodes import node_name, renumbered

__all__ = ["Nodes", "RAILS_MIN_BYTES"]

# All-reduces of more bytes than this, on a layout with the same number of ranks on every node,
# run on every rail at once (multi-leader); smaller ones through the node's first rank.
RAILS_MIN_BYTES = 256 * 1024

# shmbroker's element types by a buffer's format character, and their sizes.
_FORMATS = {
    "b": "int8",
    "B": "uint8",
    "h": "int16",
    "H": "uint16",
    "i": "int32",
    "I": "uint32",
    "l": "int64",
    "L": "uint64",
    "q": "int64",
    "Q": "uint64",
    "f": "float32",
    "d": "float64",
}
_SIZES = {
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "float32": 4,
    "float64": 8,
}


def _divide(raw: memoryview, name: str, by: int) -> None:
    """Divides the floats of `raw` (``float32`` or ``float64``) by `by`, in place: through NumPy
    when it is there, else one by one."""
    code: Any = "f" if name == "float32" else "d"
    try:
        numpy: Any = importlib.import_module("numpy")
        values = numpy.frombuffer(raw, dtype=numpy.dtype(code))
        values /= by
    except ImportError:
        typed = raw.cast(code)
        for i in range(len(typed)):
            typed[i] /= by


class Nodes:
    """shmbroker's collectives over the ranks of mpi4py communicator `comm`, which may span
    nodes. Made collectively: every rank of `comm` makes it. `timeout` (seconds) bounds joining
    the node's session and is every later call's deadline inside a node. `node` names this
    rank's node (what its launcher says; ranks that pass the same name are on one node) in
    place of ``SHMBROKER_NODE`` or the host's identity."""

    def __init__(self, comm: Any, timeout: float = 30.0, *, node: str | None = None):
        from mpi4py import MPI

        self._mpi: Any = MPI
        self.comm = comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        names = self.comm.allgather(node_name() if node is None else node)
        numbers: dict[str, int] = {}
        self.node_of = [numbers.setdefault(name, len(numbers)) for name in names]
        counts = [self.node_of.count(n) for n in range(len(numbers))]
        self.local_of = [self.node_of[:r].count(self.node_of[r]) for r in range(self.size)]
        self.nodes = len(numbers)
        self.widest = max(counts)
        here = self.node_of[self.rank]
        self.local_rank, self.local_size = self.local_of[self.rank], counts[here]
        self.balanced = len(set(counts)) == 1 and self.local_size > 1
        self._node = self.comm.Split(here, self.rank)
        self._leaders = self.comm.Split(0 if self.local_rank == 0 else MPI.UNDEFINED, self.rank)
        self._rail = self.comm.Split(self.local_rank, self.rank) if self.balanced else None
        # This node's ranks in the communicator, by session rank.
        self._node_ranks = [r for r in range(self.size) if self.node_of[r] == here]
        self._dir: str | None = None
        self.session: shmbroker.Session | None = None
        failure = None
        if self.local_size > 1:
            # The socket's path, or why the node's first rank could not make its directory.
            word: tuple[str, str] = ("path", "")
            if self.local_rank == 0:
                try:
                    self._dir = tempfile.mkdtemp(prefix="shmbroker-mpi-")
                    word = ("path", os.path.join(self._dir, "broker.sock"))
                except OSError as error:
                    why = f"rank {self.rank} could not make the broker's directory: {error}"
                    word = ("error", why)
            what, text = self._node.bcast(word, root=0)
            try:
                if what == "error":
                    raise shmbroker.MisuseError(f"shmbroker.mpi: {text}")
                self.session = shmbroker.connect(
                    text, self.local_rank, timeout, world_size=self.local_size
                )
            except shmbroker.Error as error:
                failure = error
        # Every rank learns whether every node's session is there: none goes on alone.
        failed = self.comm.allreduce(failure is not None, op=MPI.LOR)
        if failed:
            self.close()
            raise failure or shmbroker.LogonError(
                "shmbroker.mpi: another node's ranks could not make their session"
            )

    # --- what the calls share

    def _local(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`method` of the node's session; its errors name the communicator's ranks."""
        assert self.session is not None
        try:
            return getattr(self.session, method)(*args, **kwargs)
        except shmbroker.Error as error:
            raise renumbered(error, self._node_ranks, "ranks of the communicator") from error

    def _typed(self, data: Any, dtype: str | None) -> tuple[memoryview, str, Any]:
        """`data` as writable bytes, its element type's name and MPI's type for it."""
        view = memoryview(data)
        if view.readonly:
            raise shmbroker.MisuseError("shmbroker.mpi: the buffer must be writable")
        name = dtype or _FORMATS.get(view.format.lstrip("@=<"))
        mpi = {
            "int8": self._mpi.INT8_T,
            "uint8": self._mpi.UINT8_T,
            "int16": self._mpi.INT16_T,
            "uint16": self._mpi.UINT16_T,
            "int32": self._mpi.INT32_T,
            "uint32": self._mpi.UINT32_T,
            "int64": self._mpi.INT64_T,
            "uint64": self._mpi.UINT64_T,
            "float32": self._mpi.FLOAT,
            "float64": self._mpi.DOUBLE,
        }.get(name or "")
        if name is None or mpi is None:
            raise shmbroker.MisuseError(
                f"shmbroker.mpi: no MPI type for {name or view.format!r} (float16 and bfloat16 "
                "have none; give dtype= for a buffer of bytes)"
            )
        return view.cast("B"), name, mpi

    def _op(self, op: str) -> Any:
        MPI = self._mpi
        found = {
            "sum": MPI.SUM,
            "avg": MPI.SUM,
            "prod": MPI.PROD,
            "min": MPI.MIN,
            "max": MPI.MAX,
            "bit_and": MPI.BAND,
            "bit_or": MPI.BOR,
            "bit_xor": MPI.BXOR,
        }.get(op)
        if found is None:
            raise shmbroker.MisuseError(f"shmbroker.mpi: no operation {op!r}")
        return found

    # --- calls

    def barrier(self) -> None:
        """A barrier over every rank of the communicator."""
        if self.session is not None:
            self._local("barrier")
        if self._leaders != self._mpi.COMM_NULL:
            self._leaders.Barrier()
        if self.session is not None:
            self._local("barrier")

    def all_reduce(self, data: Any, op: str = "sum", *, dtype: str | None = None) -> None:
        """Combines every rank's `data` (a writable buffer: its format gives the element type,
        or `dtype` for a buffer of bytes) with `op`, into every rank's, in place."""
        raw, name, mpi_type = self._typed(data, dtype)
        mpi_op = self._op(op)
        if op == "avg" and not name.startswith("float"):
            raise shmbroker.MisuseError(f"shmbroker.mpi: avg is not defined for {name}")
        local_op = "sum" if op == "avg" else op
        size = _SIZES[name]
        count = len(raw) // size
        if self.balanced and len(raw) > RAILS_MIN_BYTES:
            parts = self.local_size
            piece = -(-count // parts)
            padded = bytearray(piece * parts * size)
            padded[: len(raw)] = raw
            mine = bytearray(piece * size)
            self._local("reduce_scatter", padded, mine, local_op, dtype=name)
            assert self._rail is not None
            self._rail.Allreduce(self._mpi.IN_PLACE, [mine, piece, mpi_type], mpi_op)
            self._local("all_gather_into", mine, padded)
            raw[:] = padded[: len(raw)]
        else:
            if self.session is not None:
                self._local("reduce", 0, raw, local_op, dtype=name)
            if self._leaders != self._mpi.COMM_NULL:
                self._leaders.Allreduce(self._mpi.IN_PLACE, [raw, count, mpi_type], mpi_op)
            self._node_broadcast(0, raw)
        if op == "avg":
            _divide(raw, name, self.size)

    def _node_broadcast(self, root: int, raw: memoryview) -> None:
        if self.session is None:
            return
        got = self._local("broadcast", root, raw)
        if self.local_rank != root:
            if len(got) != len(raw):
                sender = self._node_ranks[root]
                raise shmbroker.ProtocolError(
                    f"shmbroker.mpi: rank {sender} broadcast {len(got)} bytes for a buffer of "
                    f"{len(raw)}",
                    sender,
                )
            raw[:] = got

    def broadcast(self, root: int, data: Any) -> None:
        """Rank `root`'s bytes of `data` into every rank's `data` (writable, the same length on
        every rank)."""
        if not 0 <= root < self.size:
            raise shmbroker.MisuseError(f"shmbroker.mpi: root {root} of {self.size} ranks")
        raw = memoryview(data).cast("B")
        root_node = self.node_of[root]
        here = self.node_of[self.rank] == root_node
        if here:
            self._node_broadcast(self.local_of[root], raw)
        if self._leaders != self._mpi.COMM_NULL:
            self._leaders.Bcast([raw, len(raw), self._mpi.BYTE], root=root_node)
        if not here:
            self._node_broadcast(0, raw)

    def all_gather(self, data: Any) -> bytes:
        """Every rank's bytes of `data` (the same length on every rank), in rank order."""
        raw = bytes(memoryview(data).cast("B"))
        length = len(raw)
        block = bytearray(self.widest * length)
        if self.session is not None:
            self._local("all_gather_into", raw, memoryview(block)[: self.local_size * length])
        else:
            block[:length] = raw
        everything = bytearray(self.nodes * len(block))
        if self._leaders != self._mpi.COMM_NULL:
            self._leaders.Allgather([block, self._mpi.BYTE], [everything, self._mpi.BYTE])
        self._node_broadcast(0, memoryview(everything))
        out = bytearray()
        for r in range(self.size):
            at = self.node_of[r] * len(block) + self.local_of[r] * length
            out += everything[at : at + length]
        return bytes(out)

    def close(self) -> None:
        """Leaves the node's session and frees the communicators: collective, as MPI_Comm_free
        is."""
        if self.session is not None:
            self.session.close()
            self.session = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        for comm in (self._rail, self._leaders, self._node, self.comm):
            if comm is not None and comm != self._mpi.COMM_NULL:
                comm.Free()
        self._rail = None
        self._leaders = self._node = self.comm = self._mpi.COMM_NULL

    def __enter__(self) -> "Nodes":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
