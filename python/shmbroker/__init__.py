"""shmbroker: single-node IPC between cooperating processes.

Workers log on to a broker (``shmbroker run`` starts one, as do mpirun, torchrun and srun
through :func:`connect` with no path), then exchange data with each other directly over
shared-memory rings: barriers, all-gathers, broadcasts, point-to-point messages of any size, and
file descriptors::

    import shmbroker

    with shmbroker.connect() as session:            # under `shmbroker run -n 3 -- python3 ...`
        everyone = session.all_gather(b"hello from %d" % session.rank)

Every call that waits releases the GIL and has a deadline; a peer that dies or leaves is reported
as :class:`PeerLost` or :class:`PeerLeft`, naming its rank, instead of hanging.
"""

from ._errors import (
    BrokerLost,
    BufferTooSmall,
    ChannelClosed,
    Error,
    LogonError,
    MisuseError,
    PeerGaveUp,
    PeerLeft,
    PeerLost,
    PeerNeverJoined,
    PeerRejoined,
    ProtocolError,
    ResourceError,
    Timeout,
)
from . import _logs  # noqa: F401  (the library's log events into logging, logger "shmbroker")
from ._event_loop import recv_any_async
from ._gpu import GpuHandle
from ._objects import all_gather_object, broadcast_object, recv_object, send_object
from ._shmbroker import (
    MAX_FDS_PER_EXCHANGE,
    ChannelReceiver,
    ChannelSender,
    Group,
    Loan,
    LoanView,
    Receiver,
    Sender,
    Session,
    connect,
)
from ._status import status

__all__ = [
    "BrokerLost",
    "BufferTooSmall",
    "ChannelClosed",
    "ChannelReceiver",
    "ChannelSender",
    "Error",
    "GpuHandle",
    "Group",
    "Loan",
    "LoanView",
    "LogonError",
    "MAX_FDS_PER_EXCHANGE",
    "MisuseError",
    "PeerGaveUp",
    "PeerLeft",
    "PeerLost",
    "PeerNeverJoined",
    "PeerRejoined",
    "ProtocolError",
    "Receiver",
    "ResourceError",
    "Sender",
    "Session",
    "Timeout",
    "all_gather_object",
    "broadcast_object",
    "connect",
    "recv_any_async",
    "recv_object",
    "send_object",
    "status",
]
