# mypy: disable-error-code="override,misc,import-not-found"
"""The torch backend on a world or group that spans nodes: shared memory inside each node,
gloo between them.

**Where each rank stands.** Every rank of the world says which node it is on through torch's
store: ``SHMBROKER_NODE`` when set (so that tests on one machine can form several nodes),
otherwise the host's name and boot id. The ranks of one node, in world-rank order, share one
shmbroker session on a broker the node's first rank hosts; its socket's path goes through the
store. A group's layout is the world's, restricted to its members.

**The legs.** For a world or group that spans nodes the backend makes, from the same store, gloo
process groups of its own (torch's trusted engine carries every byte between nodes):

- ``leaders``: the first rank of every node;
- ``rails``: when every node has the same number ``L > 1`` of the group's ranks, one per local
  index ``j``: the ``j``-th rank of every node;
- ``flat``: every rank of the group, for what has no node-aware form (all-to-all, and
  point-to-point between nodes).

**Algorithms.** ``N`` nodes, ``L`` ranks of the group on this node:

- all-reduce, up to :data:`RAILS_MIN_BYTES` or on an uneven layout: reduce to the node's
  leader, all-reduce among leaders, broadcast in the node (UCC's ``rab``). Above it: a
  reduce-scatter in the node, an all-reduce of each slice among the ranks of one rail, an
  all-gather in the node (multi-leader, UCC's ``split_rail``);
- barrier: a barrier in the node, among leaders, in the node;
- broadcast: in the root's node, among leaders, in every other node;
- reduce: to the node's leader, to the root's node's leader, to the root;
- all-gather (and gather): an all-gather in the node, an all-gather of node blocks among
  leaders, a broadcast in the node;
- reduce-scatter, up to :data:`RAILS_MIN_BYTES` or on an uneven layout: the all-reduce above of
  the whole input, of which each rank keeps its part. Above it: a reduce-scatter in the node
  that gives local rank ``j`` the node's sums of the blocks of rail ``j``'s members, then an
  all-reduce of those on the rail;
- scatter: the broadcast above of every part, of which each rank keeps its own;
- all-to-all and point-to-point between nodes: gloo on ``flat``; point-to-point inside a node:
  the session.

**Order of the sum.** Floats are combined in the node in rank order, then across nodes by gloo
(whose order depends on the number of nodes and the length, not on timing). Every rank gets
the same bits, run after run, for a fixed layout; another layout (more nodes, ranks placed
elsewhere) may change the last bits, as another number of ranks does under gloo.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import re
from typing import Any, Iterator

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist

import shmbroker

from ._nodes import node_name, renumbered
from .torch import (
    _R,
    _Aliases,
    _Answers,
    _Calls,
    _backend_error,
    _byte_counts,
    _Contiguous,
    _Done,
    _fill,
    _flat,
    _memory,
    _reduction,
    _World,
)
from .torch import Timeout as _Timeout
from .torch import _BackendError

# All-reduces of more bytes than this, on a layout with the same number of ranks on every
# node, run on every rail at once (multi-leader); smaller ones through the node's leader.
RAILS_MIN_BYTES = 256 * 1024

# What ends a spanning call on every rank: a deadline, a peer gone or misbehaving in the node, or
# a gloo leg that failed (torch raises RuntimeError, or DistBackendError which is one).
_BROKEN = (
    shmbroker.Timeout,
    shmbroker.PeerLost,
    shmbroker.PeerLeft,
    shmbroker.PeerGaveUp,
    shmbroker.ProtocolError,
    RuntimeError,
)

# The store's key (after the world's prefix) where the first rank that sees a death or a
# stopped process in its node writes which (``lost N``, ``stopped N``: N the job's rank), or a
# rank whose gloo leg broke with nobody naming a cause writes ``broken N`` (itself).
_CAUSE = "cause"

# How long a rank that saw a failure's effect waits for the rank that saw the death to name it.
LOST_WAIT_S = 3.0

# torch's operations as gloo takes them: gloo has no AVG (a sum, divided after).
_GLOO_OPS = {
    "sum": _R.SUM,
    "avg": _R.SUM,
    "prod": _R.PRODUCT,
    "min": _R.MIN,
    "max": _R.MAX,
    "bit_and": _R.BAND,
    "bit_or": _R.BOR,
    "bit_xor": _R.BXOR,
}


def layout(store: Any, rank: int, size: int) -> tuple[list[int], str]:
    """The node of every rank of the world, numbered by their first rank, and the prefix of
    this world's keys in `store`. Every rank says its node's name through the store and reads
    the others'. A world made again on the same store (after ``destroy_process_group``) counts
    as another: every rank counts its own worlds, and all count alike."""
    world = store.add(f"shmbroker/worlds/{rank}", 1)
    prefix = f"shmbroker/{world}"
    store.set(f"{prefix}/node/{rank}", node_name())
    keys = [f"{prefix}/node/{r}" for r in range(size)]
    names = [name.decode() for name in store.multi_get(keys)]
    numbers: dict[str, int] = {}
    return [numbers.setdefault(name, len(numbers)) for name in names], prefix


def _leg(store: Any, name: str, members: list[int], me: int, timeout: float) -> Any:
    """A gloo process group of `members` (group ranks), made from `store` under `name`; None on
    a rank that is not a member."""
    if me not in members:
        return None
    prefixed = dist.PrefixStore(f"shmbroker/leg/{name}/", store)
    return dist.ProcessGroupGloo(
        prefixed, members.index(me), len(members), datetime.timedelta(seconds=timeout)
    )


class Span:
    """A world or group that spans nodes, as this rank sees it: where every member stands, the
    session (and group) of this node's members, and the gloo legs between nodes. One per
    group, shared by its process group and its backend."""

    def __init__(
        self,
        world: _World,
        members: list[int],
        local: shmbroker.Group | None,
        store: Any,
        timeout: float,
    ):
        assert world.nodes is not None
        self.world = world
        self.session = world.session
        self.timeout = timeout
        self.members = members
        me = members.index(world.rank)
        self.rank, self.size = me, len(members)
        # Group ranks on each node that has any, nodes in order of their first member.
        by_node: dict[int, list[int]] = {}
        for group_rank, world_rank in enumerate(members):
            by_node.setdefault(world.nodes[world_rank], []).append(group_rank)
        self.nodes = list(by_node.values())
        self.node_of = [0] * self.size
        self.local_index = [0] * self.size
        for n, ranks in enumerate(self.nodes):
            for j, group_rank in enumerate(ranks):
                self.node_of[group_rank], self.local_index[group_rank] = n, j
        self.node = self.node_of[me]
        self.local_rank = self.local_index[me]
        self.local_size = len(self.nodes[self.node])
        # Keywords of every call on this node's members: their group and the deadline.
        self.on: dict[str, Any] = {"timeout": timeout}
        if local is not None:
            self.on["group"] = local
        # Session rank of each group rank on this node.
        self.session_ranks = {
            group_rank: world.node_ranks.index(members[group_rank])
            for group_rank in self.nodes[self.node]
        }
        leaders = [ranks[0] for ranks in self.nodes]
        self.leaders = _leg(store, "leaders", leaders, me, timeout)
        self.leader_index = self.node
        counts = {len(ranks) for ranks in self.nodes}
        self.balanced = len(counts) == 1 and self.local_size > 1
        self.rail = None
        if self.balanced:
            rail = [ranks[self.local_rank] for ranks in self.nodes]
            self.rail = _leg(store, f"rail{self.local_rank}", rail, me, timeout)
        self.flat = _leg(store, "flat", list(range(self.size)), me, timeout)

    # --- failures

    @contextlib.contextmanager
    def failing(self) -> Iterator[None]:
        """Runs a call's steps. A failure of any (a peer's death or a stopped peer seen in the
        node, a gloo leg broken, a deadline) ends this rank's part in the job at once, naming
        the job's rank that caused it (see :meth:`fail`)."""
        try:
            yield
        except _BROKEN as error:
            raise self.fail(error) from error

    def fail(self, error: BaseException) -> BaseException:
        """What a failed step raises.

        A death, or a stopped process, that this rank saw in its node is written in the world's
        store as ``lost N`` or ``stopped N`` (N: the job's rank; the first written wins). A rank
        that saw only its effect (a gloo leg broken or timed out, a node peer that left) reads it
        there, waiting up to :data:`LOST_WAIT_S`. When nobody wrote one, a rank whose gloo leg
        broke writes ``broken N`` (N: itself): a death no node peer could see, of a node of one
        rank or of a whole node. This rank then aborts its gloo legs and closes its session, so
        that every rank still waiting for it, on any node, fails at once too and reads the same
        word."""
        if isinstance(error, shmbroker.Error):
            # The node's session numbers its ranks among the node's: name the job's.
            error = renumbered(error, self.world.node_ranks, "ranks of the job")
        word = None
        if isinstance(error, shmbroker.Timeout) and error.stopped is not None:
            word = f"stopped {error.stopped}"
        elif isinstance(error, shmbroker.PeerLost):
            word = f"lost {error.rank}"
        cause = self._cause(word, LOST_WAIT_S)
        if cause is None and not isinstance(error, shmbroker.Error):
            cause = self._cause(f"broken {self.world.rank}", 1)
        for leg in (self.leaders, self.rail, self.flat):
            if leg is not None:
                with contextlib.suppress(Exception):
                    leg.abort()
                _keep_to_exit(leg)
        with contextlib.suppress(Exception):
            self.session.close()
        learned = f"this rank {self.world.rank} learned it from {type(error).__name__}: {error}"
        if cause is None:
            return _backend_error(error)
        what, culprit = cause
        if what == "lost":
            return shmbroker.PeerLost(
                f"rank {culprit} of the job died (a world spanning nodes: {learned})", culprit
            )
        if what == "broken":
            return _BackendError(
                f"[shmbroker] rank {culprit}'s gloo leg between nodes broke, and no rank saw a "
                "death in its node: a node of one rank, or a whole node, is gone (a world "
                f"spanning nodes: {learned})"
            )
        timeout = getattr(error, "timeout", self.timeout)
        return _Timeout(
            f"rank {culprit} of the job is stopped (a world spanning nodes: {learned})",
            getattr(error, "op", "call"),
            [culprit],
            timeout,
            [f"rank {culprit} is stopped"],
            culprit,
        )

    def _cause(self, word: str | None, wait_s: float) -> tuple[str, int] | None:
        """Writes `word` as the job's cause unless one is there, then reads the cause, waiting
        up to `wait_s` seconds for one; None when there is none, or no store to ask."""
        store, key = self.world.store, f"{self.world.prefix}/{_CAUSE}"
        try:
            if word is not None:
                store.compare_set(key, "", word)
            store.wait([key], datetime.timedelta(seconds=wait_s))
            what, number = store.get(key).decode().split()
            return what, int(number)
        except Exception:  # noqa: BLE001 - no cause, or no store: the error stands as it is
            return None

    # --- steps inside the node (nothing to do for a node of one)

    def local(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.session, method)(*args, **kwargs, **self.on)

    def local_broadcast(self, root: int, tensor: torch.Tensor) -> None:
        """`tensor` (contiguous) of this node's rank `root` (local index) into every other."""
        if self.local_size == 1:
            return
        memory = _memory(tensor)
        data = self.local("broadcast", root, memory)
        if self.local_rank != root:
            _fill(memory, data, f"broadcast from local rank {root}")


def _keep_to_exit(leg: Any) -> None:
    """Keeps an aborted gloo leg alive until the process exits, never destroyed.

    Its threads may still be inside a receive from the dead peer. Destroying the process group
    under them, when the interpreter shuts down, can end the process in ``std::terminate``
    ("terminate called without an active exception", seen once in CI after a death between
    nodes). A broken leg is never used again, so leaking one per leg is the safe cost."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(leg))


def _wait(work: Any) -> None:
    work.wait()


def _widened(tensor: torch.Tensor, op: Any) -> torch.Tensor | None:
    """A wider copy of `tensor` for a gloo leg, where gloo lacks its type for `op` (int16;
    half-precision products); None where gloo takes it as it is. Integers wrap as in their own
    width once narrowed back."""
    if tensor.dtype == torch.int16:
        return tensor.to(torch.int32)
    if op == _R.PRODUCT and tensor.dtype in (torch.float16, torch.bfloat16):
        return tensor.to(torch.float32)
    return None


def _reduce_leg(leg: Any, tensor: torch.Tensor, op: Any, root: int | None = None) -> None:
    """All-reduces `tensor` among `leg`'s ranks (or reduces to its rank `root`), in place."""
    wide = _widened(tensor, op)
    target = tensor if wide is None else wide
    if root is None:
        _wait(leg.allreduce([target], _allreduce_options(op)))
    else:
        options = c10d.ReduceOptions()
        options.reduceOp = op
        options.rootRank = root
        _wait(leg.reduce([target], options))
    if wide is not None:
        tensor.copy_(wide.to(tensor.dtype))


def _allreduce_options(op: Any) -> Any:
    options = c10d.AllreduceOptions()
    options.reduceOp = op
    return options


class SpanCalls(_Aliases):
    """Every call of a group that spans nodes (see the module docs), with the world's lock held
    for the whole of it (calls from several threads take turns, as on one node)."""

    _span: Span

    def __repr__(self) -> str:
        span = self._span
        return f"{type(self).__name__}(rank={span.rank}, size={span.size}, nodes={len(span.nodes)})"

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """This thread's turn on the session for one call, whose failure ends the job's spanning
        calls on every rank (see :meth:`Span.failing`)."""
        span = self._span
        with span.world.turn(span.timeout), span.failing():
            yield

    # --- synchronisation

    def barrier(self, opts: Any = None) -> Any:
        span = self._span
        with self._turn():
            if span.local_size > 1:
                span.local("barrier")
            if span.leaders is not None:
                _wait(span.leaders.barrier(c10d.BarrierOptions()))
            if span.local_size > 1:
                span.local("barrier")
        return _Done()

    def monitored_barrier(
        self, timeout: datetime.timedelta | None = None, wait_all_ranks: bool = False
    ) -> None:
        """gloo's monitored barrier on the flat leg: its timeout names the ranks that did not
        come ("Ranks 1, 3 failed to pass monitoredBarrier in 2000 ms"), as a
        :class:`shmbroker.torch.Timeout` whose ``waiting_for`` are their job ranks. It does not
        end the job: a rank that did not come is not a failure of the others."""
        span = self._span
        seconds = span.timeout if timeout is None else timeout.total_seconds()
        with span.world.turn(seconds):
            try:
                span.flat.monitored_barrier(datetime.timedelta(seconds=seconds), wait_all_ranks)
            except RuntimeError as error:
                text = str(error)
                named = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", text)
                missing = [int(r) for r in named.group(1).split(",")] if named else []
                raise _Timeout(
                    f"{text.splitlines()[0]} (group ranks)",
                    "monitored_barrier",
                    [span.members[r] for r in missing if 0 <= r < span.size],
                    seconds,
                ) from None

    # --- reductions

    def _all_reduce_flat(self, flat: torch.Tensor, name: str, dtype: str) -> None:
        """All-reduces contiguous `flat` (of the element type `dtype` names) in place."""
        span = self._span
        if name == "avg" and not flat.is_floating_point():
            raise ValueError(
                f"shmbroker backend: AVG is not defined for {flat.dtype} (averages are of floats)"
            )
        op = _GLOO_OPS[name]
        local_op = "sum" if name == "avg" else name
        if span.balanced and flat.nbytes > RAILS_MIN_BYTES:
            self._all_reduce_rails(flat, local_op, dtype, op)
        else:
            if span.local_size > 1:
                span.local("reduce", 0, _memory(flat), local_op, dtype=dtype)
            if span.leaders is not None:
                _reduce_leg(span.leaders, flat, op)
            span.local_broadcast(0, flat)
        if name == "avg":
            flat.div_(span.size)

    def _all_reduce_rails(self, flat: torch.Tensor, name: str, dtype: str, op: Any) -> None:
        """Multi-leader: a reduce-scatter in the node, each slice among its rail, an all-gather
        in the node."""
        span = self._span
        parts = span.local_size
        count = flat.numel()
        slice_count = -(-count // parts)
        padded = flat
        if slice_count * parts != count:
            padded = torch.zeros(slice_count * parts, dtype=flat.dtype)
            padded[:count].copy_(flat)
        mine = torch.empty(slice_count, dtype=flat.dtype)
        span.local("reduce_scatter", _memory(padded), _memory(mine), name, dtype=dtype)
        _reduce_leg(span.rail, mine, op)
        span.local("all_gather_into", _memory(mine), _memory(padded))
        if padded is not flat:
            flat.copy_(padded[:count])

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else _R.SUM
        with self._turn():
            for tensor in tensors:
                name, dtype = _reduction(op, tensor)
                with _Contiguous(tensor) as dense:
                    self._all_reduce_flat(_flat(dense).reshape(-1), name, dtype)
        return _Done(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        (tensor,) = tensors
        span = self._span
        root = opts.rootRank
        name, dtype = _reduction(opts.reduceOp, tensor)
        if name == "avg" and not _flat(tensor).is_floating_point():
            raise ValueError(
                f"shmbroker backend: AVG is not defined for {tensor.dtype} (averages are of floats)"
            )
        local_op = "sum" if name == "avg" else name
        root_node, root_local = span.node_of[root], span.local_index[root]
        with self._turn(), _Contiguous(tensor) as dense:
            flat = _flat(dense).reshape(-1)
            if span.local_size > 1:
                span.local("reduce", 0, _memory(flat), local_op, dtype=dtype)
            if span.leaders is not None:
                _reduce_leg(span.leaders, flat, _GLOO_OPS[name], root_node)
            if span.node == root_node and root_local != 0:
                span.local_broadcast(0, flat)
            if name == "avg" and span.rank == root:
                flat.div_(span.size)
        return _Done(tensors)

    def reduce_scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> Any:
        for output, parts in zip(outputs, inputs, strict=True):
            flat = torch.cat([part.reshape(-1) for part in parts])
            self._reduce_scatter_flat(output, flat, opts.reduceOp)
        return _Done(outputs)

    def _reduce_scatter_flat(self, output: torch.Tensor, input: torch.Tensor, op: Any) -> None:
        """Up to :data:`RAILS_MIN_BYTES` or on an uneven layout: the all-reduce of the whole
        input, of which this rank keeps its block. Above it: a reduce-scatter in the node that
        gives local rank ``j`` the node's sums of the blocks of rail ``j``'s members, an
        all-reduce of those on the rail, and each rank keeps its own."""
        span = self._span
        name, dtype = _reduction(op, output)
        whole = _flat(input.contiguous()).reshape(-1)
        if whole.numel() != span.size * _flat(output).numel():
            raise ValueError(
                f"shmbroker backend: reduce_scatter of {whole.numel()} elements into "
                f"{_flat(output).numel()} for each of {span.size} ranks"
            )
        if name == "avg" and not whole.is_floating_point():
            raise ValueError(
                f"shmbroker backend: AVG is not defined for {output.dtype} (averages are of floats)"
            )
        if not (span.balanced and whole.nbytes > RAILS_MIN_BYTES):
            whole = whole.clone()
            with self._turn():
                self._all_reduce_flat(whole, name, dtype)
            mine = whole.view(span.size, -1)[span.rank]
        else:
            nodes, block = len(span.nodes), whole.numel() // span.size
            # Chunk j of the node's input: the blocks of rail j's members, in node order.
            order = [span.nodes[n][j] for j in range(span.local_size) for n in range(nodes)]
            arranged = whole.view(span.size, block)[order].reshape(-1)
            rail = torch.empty(nodes * block, dtype=whole.dtype)
            local_op = "sum" if name == "avg" else name
            with self._turn():
                memory = (_memory(arranged), _memory(rail))
                span.local("reduce_scatter", *memory, local_op, dtype=dtype)
                _reduce_leg(span.rail, rail, _GLOO_OPS[name])
            mine = rail.view(nodes, block)[span.node]
            if name == "avg":
                mine = mine / span.size
        with _Contiguous(output) as dense:
            _flat(dense).reshape(-1).copy_(mine)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        self._reduce_scatter_flat(output, input, opts.reduceOp)
        return _Done([output])

    # --- moving data

    def _broadcast_bytes(self, data: torch.Tensor, root: int) -> None:
        """Broadcasts contiguous `data` of group rank `root` into every rank's (the lock held)."""
        span = self._span
        root_node = span.node_of[root]
        if span.node == root_node:
            span.local_broadcast(span.local_index[root], data)
        if span.leaders is not None:
            options = c10d.BroadcastOptions()
            options.rootRank = root_node
            _wait(span.leaders.broadcast([data], options))
        if span.node != root_node:
            span.local_broadcast(0, data)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        with self._turn():
            for tensor in tensors:
                with _Contiguous(tensor) as dense:
                    # As bytes: gloo lacks some types (int16, the unsigned ones).
                    self._broadcast_bytes(_flat(dense).reshape(-1).view(torch.uint8), opts.rootRank)
        return _Done(tensors)

    def _all_gather_bytes(self, input: torch.Tensor) -> torch.Tensor:
        """Every rank's `input` (contiguous bytes, the same length on each), in group-rank
        order, as one tensor of bytes (the lock held)."""
        span = self._span
        size = input.numel()
        widest = max(len(ranks) for ranks in span.nodes)
        block = torch.zeros(widest * size, dtype=torch.uint8)
        if span.local_size > 1:
            span.local("all_gather_into", _memory(input), _memory(block[: span.local_size * size]))
        else:
            block[:size].copy_(input)
        everything = torch.empty(len(span.nodes) * widest * size, dtype=torch.uint8)
        if span.leaders is not None:
            blocks = list(everything.chunk(len(span.nodes)))
            _wait(span.leaders.allgather([blocks], [block]))
        span.local_broadcast(0, everything)
        ordered = torch.empty(span.size * size, dtype=torch.uint8)
        for group_rank in range(span.size):
            at = (span.node_of[group_rank] * widest + span.local_index[group_rank]) * size
            ordered[group_rank * size : (group_rank + 1) * size] = everything[at : at + size]
        return ordered

    def _gathered(self, input: torch.Tensor) -> torch.Tensor:
        with _Contiguous(input, write_back=False) as source, self._turn():
            return self._all_gather_bytes(_flat(source).reshape(-1).view(torch.uint8))

    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        for parts, input in zip(outputs, inputs, strict=True):
            ordered = self._gathered(input)
            for part, bytes_ in zip(parts, ordered.chunk(len(parts)), strict=True):
                _copy_bytes(part, bytes_)
        return _Done(outputs)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        _copy_bytes(output, self._gathered(input))
        return _Done([output])

    def gather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> Any:
        (input,) = inputs
        ordered = self._gathered(input)
        if self._span.rank == opts.rootRank:
            (targets,) = outputs
            for target, bytes_ in zip(targets, ordered.chunk(len(targets)), strict=True):
                _copy_bytes(target, bytes_)
        return _Done(outputs)

    def scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> Any:
        (output,) = outputs
        span = self._span
        root = opts.rootRank
        size = output.nbytes
        everything = torch.empty(size * span.size, dtype=torch.uint8)
        if span.rank == root:
            (parts,) = inputs
            for at, part in enumerate(parts):
                dense = _flat(part.contiguous()).reshape(-1).view(torch.uint8)
                if dense.numel() != size:
                    raise ValueError(
                        f"shmbroker backend: scatter's part {at} has {dense.numel()} bytes, "
                        f"the output {size}"
                    )
                everything[at * size : (at + 1) * size] = dense
        with self._turn():
            self._broadcast_bytes(everything, root)
        _copy_bytes(output, everything[span.rank * size : (span.rank + 1) * size])
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
            outgoing = _flat(source).reshape(-1).view(torch.uint8)
            incoming = _flat(dense).reshape(-1).view(torch.uint8)
            sends = _byte_counts(source, input_split_sizes, self._span.size)
            receives = _byte_counts(dense, output_split_sizes, self._span.size)
            with self._turn():
                # As bytes: gloo lacks some types (int16, the unsigned ones).
                options = c10d.AllToAllOptions()
                _wait(self._span.flat.alltoall_base(incoming, outgoing, receives, sends, options))
        return _Done([output])

    def alltoall(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        # gloo has no list form: one byte tensor each way, cut at the tensors' edges.
        flat_in = torch.cat([_flat(t.contiguous()).reshape(-1).view(torch.uint8) for t in inputs])
        sizes_in = [t.nbytes for t in inputs]
        sizes_out = [t.nbytes for t in outputs]
        flat_out = torch.empty(sum(sizes_out), dtype=torch.uint8)
        with self._turn():
            options = c10d.AllToAllOptions()
            _wait(self._span.flat.alltoall_base(flat_out, flat_in, sizes_out, sizes_in, options))
        for output, block in zip(outputs, flat_out.split(sizes_out), strict=True):
            _copy_bytes(output, block)
        return _Done(outputs)

    # --- point to point: gloo between nodes; on one node, the session

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        span = self._span
        if span.node_of[dst] != span.node:
            # gloo sends once the receiver has posted its receive: the work is waited for
            # later, as an isend's is, so that a program may send before it receives.
            dense = [t.contiguous() for t in tensors]
            return _LegWork(span, span.flat.send(dense, dst, tag), dense)
        with span.failing():
            return self._local_calls().send(tensors, span.session_ranks[dst], tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        span = self._span
        if span.node_of[src] != span.node:
            return _LegWork(span, span.flat.recv(tensors, src, tag), tensors)
        return self._local_calls().recv(tensors, span.session_ranks[src], tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Any:
        raise ValueError(
            "shmbroker backend: a receive from any source works on a world on one node only "
            "(across nodes, name the source)"
        )

    def _local_calls(self) -> Any:
        """The point-to-point calls of this node's session (ranks: the session's)."""
        calls = getattr(self, "_p2p", None)
        if calls is None:
            calls = _NodeCalls()
            calls._join(self._span.world, None, self._span.timeout)
            calls.span = self._span
            calls._job_ranks = None  # (failing() names the job's ranks)
            self._p2p = calls
        return calls


class _LegWork(dist.Work):
    """A send or receive between nodes: gloo's work, whose failure ends the job's spanning
    calls as a collective's does (see :meth:`Span.failing`)."""

    def __init__(self, span: Span, work: Any, tensors: list[torch.Tensor]):
        super().__init__()
        self._span, self._work, self._tensors = span, work, tensors

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        with self._span.failing():
            self._work.wait()
        return True

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())

    def is_success(self) -> bool:
        return bool(self._work.is_success())

    def exception(self) -> Any:
        return self._work.exception()

    def result(self) -> list[torch.Tensor]:
        return self._tensors

    def source_rank(self) -> int:
        return int(self._work.source_rank())

    def _source_rank(self) -> int:
        return self.source_rank()

    def get_future(self) -> Any:
        self.wait()
        future: Any = torch.futures.Future()
        future.set_result(self._tensors)
        return future

    def synchronize(self) -> None:
        pass


class _NodeCalls(_Calls):
    """Point-to-point calls inside this node, on its session, whose failures name the job's
    ranks and end the job's spanning calls as a collective's do (see :meth:`Span.failing`)."""

    span: Span

    def _receive(self, tensor: torch.Tensor, world_rank: int | None, tag: int) -> int:
        with self.span.failing():
            return super()._receive(tensor, world_rank, tag)


def _copy_bytes(target: torch.Tensor, data: torch.Tensor) -> None:
    """Copies bytes `data` into `target`, which they must fill."""
    with _Contiguous(target) as dense:
        raw = _flat(dense).reshape(-1).view(torch.uint8)
        if raw.numel() != data.numel():
            raise ValueError(
                f"shmbroker backend: {data.numel()} bytes arrived for a tensor of {raw.numel()}"
            )
        raw.copy_(data)


class SpanBackend(_Answers, SpanCalls, c10d.Backend):
    """The calls of a group spanning nodes as torch's C++ side reaches them."""

    def __init__(self, span: Span):
        self._span = span
        self._timeout, self._world_ranks = span.timeout, span.members
        c10d.Backend.__init__(self, span.rank, span.size)


class SpanProcessGroup(SpanCalls, dist.ProcessGroup):
    """A group spanning nodes, as torch's Python functions reach it (see
    :class:`shmbroker.torch.ShmbrokerProcessGroup`)."""

    def __init__(self, span: Span):
        self._span = span
        dist.ProcessGroup.__init__(self, span.rank, span.size)
        custom = dist.ProcessGroup.BackendType.CUSTOM
        self._set_default_backend(custom)
        self._register_backend(torch.device("cpu"), custom, SpanBackend(span))
