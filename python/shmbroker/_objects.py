"""Python objects between ranks, pickled with protocol 5.

Objects are pickled with protocol 5: large buffers that support it (NumPy arrays, ``bytearray``,
``pickle.PickleBuffer``) travel out of band, each as a message of its own read in place from the
object's memory, with no copy into one joined ``bytes``; they arrive writable (a received NumPy
array is writable) except through :func:`broadcast_object` and :func:`all_gather_object`.

Unpickling runs code the sender chose: use these only between processes that trust each
other, as with ``torch.distributed``'s ``*_object`` calls. (The other calls of a session take
only bytes from peers, and check them.)
"""

from __future__ import annotations

import pickle
import struct
from typing import Any, List, Tuple

from ._errors import ProtocolError
from ._shmbroker import Session

__all__ = ["all_gather_object", "broadcast_object", "recv_object", "send_object"]

# The first message of an object: the number of out-of-band buffers, each one's length, then
# the pickle itself.
_COUNT = struct.Struct("<Q")


def _pickle(obj: Any) -> Tuple[bytes, List[memoryview]]:
    buffers: List[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    views = [buffer.raw() for buffer in buffers]
    head = _COUNT.pack(len(views)) + b"".join(_COUNT.pack(view.nbytes) for view in views)
    return head + data, views


def _lengths(head: bytes, rank: int) -> Tuple[List[int], memoryview]:
    """The out-of-band buffers' lengths and the pickle, from an object's first message."""
    view = memoryview(head)
    if len(view) < _COUNT.size:
        raise ProtocolError(
            f"rank {rank} sent {len(view)} bytes where an object's header was due", rank
        )
    (count,) = _COUNT.unpack_from(view)
    end = _COUNT.size * (count + 1)
    if count > len(view) or end > len(view):
        raise ProtocolError(
            f"rank {rank} sent an object header naming {count} buffers in {len(view)} bytes",
            rank,
        )
    lengths = [_COUNT.unpack_from(view, _COUNT.size * (i + 1))[0] for i in range(count)]
    return lengths, view[end:]


def send_object(session: Session, rank: int, obj: Any, **kwargs: Any) -> None:
    """Sends `obj` to `rank`, which takes it with :func:`recv_object`: a message with the pickle,
    then one per out-of-band buffer, each read in place. `kwargs` (``timeout=``) go to each
    :meth:`Session.send`."""
    head, views = _pickle(obj)
    session.send(rank, head, **kwargs)
    for view in views:
        session.send(rank, view, **kwargs)


def recv_object(session: Session, rank: int, **kwargs: Any) -> Any:
    """The next object `rank` sent with :func:`send_object`; its out-of-band buffers are
    received straight into fresh, writable ``bytearray``s. `kwargs` (``timeout=``) go to each
    receive."""
    lengths, data = _lengths(session.recv(rank, **kwargs), rank)
    buffers = []
    for length in lengths:
        # The message's own length, before anything is allocated for what the header claims.
        arrived = session.probe(rank, **kwargs)
        if arrived != length:
            raise ProtocolError(
                f"rank {rank} sent a buffer of {arrived} bytes where its header said {length}",
                rank,
            )
        buffer = bytearray(length)
        session.recv_into(rank, buffer, **kwargs)
        buffers.append(buffer)
    return pickle.loads(data, buffers=buffers)


def broadcast_object(session: Session, root: int, obj: Any = None, **kwargs: Any) -> Any:
    """`root`'s `obj` on every rank (the root gets its own `obj` back, not a copy). `kwargs`
    (``timeout=``, ``group=``) go to each :meth:`Session.broadcast`."""
    rank = kwargs["group"].rank if kwargs.get("group") is not None else session.rank
    if rank == root:
        head, views = _pickle(obj)
        session.broadcast(root, head, **kwargs)
        for view in views:
            session.broadcast(root, view, **kwargs)
        return obj
    lengths, data = _lengths(session.broadcast(root, **kwargs), root)
    buffers = [session.broadcast(root, **kwargs) for _ in lengths]
    for length, buffer in zip(lengths, buffers):
        if len(buffer) != length:
            raise ProtocolError(
                f"rank {root} sent a buffer of {len(buffer)} bytes where its header said "
                f"{length}",
                root,
            )
    return pickle.loads(data, buffers=buffers)


def all_gather_object(session: Session, obj: Any, **kwargs: Any) -> List[Any]:
    """Every rank's `obj`, in rank order. `kwargs` (``timeout=``, ``group=``) go to
    :meth:`Session.all_gather`."""
    parts = session.all_gather(pickle.dumps(obj, protocol=5), **kwargs)
    return [pickle.loads(part) for part in parts]
