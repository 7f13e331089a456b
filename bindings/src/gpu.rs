//! GPU memory handles as they travel between workers.

use bytemuck::{Pod, Zeroable};

/// Bytes of opaque handle a [`GpuHandle`] carries (`cudaIpcMemHandle_t` is 64).
pub const GPU_HANDLE_BYTES: usize = 64;

/// A GPU memory (or event) handle one worker shares with others. 112 bytes.
///
/// The library never interprets `handle`: it is whatever the runtime named by `kind` exports.
/// For the kinds that carry an fd ([`GpuHandleKind::carries_fd`]), the fd travels beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct GpuHandle {
    /// A [`GpuHandleKind`] code.
    pub kind: u32,
    /// Kind-specific flags; zero unless the kind defines some.
    pub flags: u32,
    /// UUID of the device the memory lives on.
    pub device_uuid: [u8; 16],
    /// The runtime's opaque handle bytes.
    pub handle: [u8; GPU_HANDLE_BYTES],
    /// Bytes of the allocation.
    pub size: u64,
    /// Offset of the shared range within the allocation.
    pub offset: u64,
    /// An id chosen by the exporter, to tell its buffers apart.
    pub buffer_id: u64,
}

const _: () = assert!(size_of::<GpuHandle>() == 112);

impl GpuHandle {
    /// A handle of `kind` for `size` bytes, holding `handle` (the runtime's exported bytes; zero
    /// for the kinds whose handle is the fd that travels beside it). The other fields are zero:
    /// set `device_uuid`, `offset`, `flags` and `buffer_id` as the exporter needs.
    #[must_use]
    pub fn new(kind: GpuHandleKind, size: u64, handle: [u8; GPU_HANDLE_BYTES]) -> Self {
        Self {
            kind: kind as u32,
            size,
            handle,
            ..Zeroable::zeroed()
        }
    }

    /// The kind `kind` names, or `None` for a code no kind has (from a newer or a buggy peer).
    #[must_use]
    pub const fn handle_kind(&self) -> Option<GpuHandleKind> {
        GpuHandleKind::from_code(self.kind)
    }
}

/// What kind of handle a [`GpuHandle`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum GpuHandleKind {
    /// `cudaIpcMemHandle_t` (legacy CUDA IPC).
    CudaIpcMemory = 1,
    /// `cudaIpcEventHandle_t`.
    CudaIpcEvent = 2,
    /// A CUDA VMM allocation exported as a POSIX fd (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`).
    CudaVmmPosixFd = 3,
    /// A CUDA VMM fabric handle (`CU_MEM_HANDLE_TYPE_FABRIC`).
    CudaFabric = 4,
    /// `hipIpcMemHandle_t`.
    HipIpcMemory = 5,
    /// A Level Zero IPC handle as an fd.
    LevelZeroIpcFd = 6,
    /// A dma-buf fd.
    DmaBuf = 7,
    /// Host memory in a memfd: no GPU needed, for tests and for CPU fallbacks.
    HostMemfd = 8,
}

impl GpuHandleKind {
    /// The kind for a wire code, if it is one.
    #[must_use]
    pub const fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            1 => Self::CudaIpcMemory,
            2 => Self::CudaIpcEvent,
            3 => Self::CudaVmmPosixFd,
            4 => Self::CudaFabric,
            5 => Self::HipIpcMemory,
            6 => Self::LevelZeroIpcFd,
            7 => Self::DmaBuf,
            8 => Self::HostMemfd,
            _ => return None,
        })
    }

    /// Whether a handle of this kind is an fd (which must travel with it).
    #[must_use]
    pub const fn carries_fd(self) -> bool {
        matches!(
            self,
            Self::CudaVmmPosixFd | Self::LevelZeroIpcFd | Self::DmaBuf | Self::HostMemfd
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_say_which_carry_fds() {
        for code in 0..16 {
            if let Some(kind) = GpuHandleKind::from_code(code) {
                assert_eq!(kind as u32, code);
            }
        }
        assert!(GpuHandleKind::HostMemfd.carries_fd());
        let handle = GpuHandle::new(GpuHandleKind::DmaBuf, 4096, [0; GPU_HANDLE_BYTES]);
        assert_eq!(handle.handle_kind(), Some(GpuHandleKind::DmaBuf));
        assert_eq!(GpuHandle { kind: 99, ..handle }.handle_kind(), None);
        assert!(!GpuHandleKind::CudaIpcMemory.carries_fd());
    }
}
