"""GPU memory handles that travel between ranks: :class:`GpuHandle`.

``Session.all_gather_gpu_handles`` and ``Session.broadcast_gpu_handle`` move them, with the fd
that travels beside the kinds that are an fd (a CUDA VMM POSIX fd, a dma-buf, a Level Zero IPC
fd, a memfd). The library never loads a GPU runtime: the exporter fills ``handle`` with what its
runtime exported (``cudaIpcGetMemHandle``'s 64 bytes, say, from CuPy or torch), and the importer
opens it with the same runtime.
"""

import struct
from dataclasses import dataclass

# kind, flags, device_uuid, handle, size, offset, buffer_id: the C struct shmbroker_gpu_handle.
_LAYOUT = struct.Struct("<II16s64sQQQ")

#: Kind names and their wire codes (``SHMBROKER_GPU_*`` in C).
KINDS = {
    "cuda_ipc_memory": 1,
    "cuda_ipc_event": 2,
    "cuda_vmm_posix_fd": 3,
    "cuda_fabric": 4,
    "hip_ipc_memory": 5,
    "level_zero_ipc_fd": 6,
    "dma_buf": 7,
    "host_memfd": 8,
}
_NAMES = {code: name for name, code in KINDS.items()}
#: The kinds whose handle is an fd, which must be given (and arrives) beside it.
CARRY_FD = frozenset({"cuda_vmm_posix_fd", "level_zero_ipc_fd", "dma_buf", "host_memfd"})


@dataclass(frozen=True)
class GpuHandle:
    """One exported GPU allocation (or a range of it).

    ``kind`` is one of :data:`KINDS`; ``handle`` the runtime's opaque bytes (at most 64; empty
    for the kinds whose handle is the fd); ``size`` the allocation's bytes; ``offset`` where the
    shared range starts; ``device_uuid`` the device's 16-byte UUID; ``flags`` kind-specific;
    ``buffer_id`` any number the exporter uses to tell its buffers apart.
    """

    kind: str
    size: int
    handle: bytes = b""
    offset: int = 0
    device_uuid: bytes = bytes(16)
    flags: int = 0
    buffer_id: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"GPU handle kind {self.kind!r}: expected one of {sorted(KINDS)}")
        if len(self.handle) > 64:
            raise ValueError(f"a GPU handle holds at most 64 bytes, not {len(self.handle)}")
        if len(self.device_uuid) != 16:
            raise ValueError(f"a device UUID is 16 bytes, not {len(self.device_uuid)}")

    @property
    def carries_fd(self) -> bool:
        """Whether this kind's handle is an fd that travels beside it."""
        return self.kind in CARRY_FD

    def _pack(self) -> bytes:
        return _LAYOUT.pack(
            KINDS[self.kind],
            self.flags,
            bytes(self.device_uuid),
            bytes(self.handle),
            self.size,
            self.offset,
            self.buffer_id,
        )

    @classmethod
    def _unpack(cls, data: bytes) -> "GpuHandle":
        # The kind was checked by the library (a peer's unknown kind is a ProtocolError).
        code, flags, uuid, handle, size, offset, buffer_id = _LAYOUT.unpack(data)
        return cls(_NAMES[code], size, handle, offset, uuid, flags, buffer_id)
