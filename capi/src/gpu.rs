//! GPU memory handles between ranks: a typed 112-byte struct, with its fd for the kinds that
//! carry one. The library links no GPU runtime: the caller exports and opens handles with its own.

use crate::error::{Failure, guard, misuse};
use crate::fds::borrowed;
use crate::handle::{enter, shmbroker_session};
#[cfg(doc)]
use crate::shmbroker_barrier;
use shmbroker::bindings::GpuHandle;
use std::ffi::c_int;
use std::os::fd::{BorrowedFd, IntoRawFd, OwnedFd};

/// `cudaIpcMemHandle_t` (legacy CUDA IPC).
pub const SHMBROKER_GPU_CUDA_IPC_MEMORY: u32 = 1;
/// `cudaIpcEventHandle_t`.
pub const SHMBROKER_GPU_CUDA_IPC_EVENT: u32 = 2;
/// A CUDA VMM allocation exported as a POSIX fd (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`):
/// carries an fd.
pub const SHMBROKER_GPU_CUDA_VMM_POSIX_FD: u32 = 3;
/// A CUDA VMM fabric handle (`CU_MEM_HANDLE_TYPE_FABRIC`).
pub const SHMBROKER_GPU_CUDA_FABRIC: u32 = 4;
/// `hipIpcMemHandle_t`.
pub const SHMBROKER_GPU_HIP_IPC_MEMORY: u32 = 5;
/// A Level Zero IPC handle as an fd: carries an fd.
pub const SHMBROKER_GPU_LEVEL_ZERO_IPC_FD: u32 = 6;
/// A dma-buf fd: carries an fd.
pub const SHMBROKER_GPU_DMA_BUF: u32 = 7;
/// Host memory in a memfd (no GPU needed: tests, CPU fallbacks): carries an fd.
pub const SHMBROKER_GPU_HOST_MEMFD: u32 = 8;

/// A GPU memory handle as it travels: 112 bytes, the same on every rank.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct shmbroker_gpu_handle {
    /// A `SHMBROKER_GPU_*` kind.
    pub kind: u32,
    /// Kind-specific flags; zero unless the kind defines some.
    pub flags: u32,
    /// UUID of the device the memory lives on.
    pub device_uuid: [u8; 16],
    /// The runtime's opaque handle bytes (zero for the kinds whose handle is their fd).
    pub handle: [u8; 64],
    /// Bytes of the allocation.
    pub size: u64,
    /// Offset of the shared range within the allocation.
    pub offset: u64,
    /// An id the exporter chooses, to tell its buffers apart.
    pub buffer_id: u64,
}

const _: () = assert!(size_of::<shmbroker_gpu_handle>() == size_of::<GpuHandle>());

impl From<&shmbroker_gpu_handle> for GpuHandle {
    fn from(c: &shmbroker_gpu_handle) -> Self {
        Self {
            kind: c.kind,
            flags: c.flags,
            device_uuid: c.device_uuid,
            handle: c.handle,
            size: c.size,
            offset: c.offset,
            buffer_id: c.buffer_id,
        }
    }
}

impl From<&GpuHandle> for shmbroker_gpu_handle {
    fn from(h: &GpuHandle) -> Self {
        Self {
            kind: h.kind,
            flags: h.flags,
            device_uuid: h.device_uuid,
            handle: h.handle,
            size: h.size,
            offset: h.offset,
            buffer_id: h.buffer_id,
        }
    }
}

/// Every rank's GPU handle, in rank order, into `out_handles` (`world_size` entries), with the
/// fds of the kinds that carry one in `out_fds` (`world_size` ints: new fds the caller owns and
/// closes, -1 for a kind with none; this rank's own is a duplicate of `fd`). `fd` is this rank's
/// handle's fd, -1 for a kind that carries none. Threads: as [`shmbroker_barrier`].
///
/// Errors: `SHMBROKER_E_MISUSE` for an unknown kind, or an fd given (or missing) against the
/// kind; `SHMBROKER_E_PROTOCOL` naming a peer whose kind is unknown; otherwise as
/// `shmbroker_exchange_fds`.
///
/// # Safety
///
/// `s` is null or a live session; `handle` points at a readable handle; `out_handles` and
/// `out_fds` have `world_size` writable entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_all_gather_gpu_handles(
    s: *mut shmbroker_session,
    handle: *const shmbroker_gpu_handle,
    fd: c_int,
    out_handles: *mut shmbroker_gpu_handle,
    out_fds: *mut c_int,
) -> c_int {
    guard("shmbroker_all_gather_gpu_handles", || {
        if handle.is_null() || out_handles.is_null() || out_fds.is_null() {
            return Err(misuse("handle, out_handles or out_fds is NULL"));
        }
        // SAFETY: non-null (checked above) and readable, per the contract.
        let own = GpuHandle::from(unsafe { &*handle });
        let fd = optional_fd(fd)?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let world = entered.handle.sender.world_size() as usize;
        let gathered = entered
            .handle
            .sender
            .session()
            .all_gather_gpu_handles(&own, fd)?;
        // SAFETY: non-null (checked above), `world_size` writable entries per the contract.
        let handles = unsafe { std::slice::from_raw_parts_mut(out_handles, world) };
        // SAFETY: as above.
        let fds = unsafe { std::slice::from_raw_parts_mut(out_fds, world) };
        for ((slot, fd_slot), (handle, fd)) in handles.iter_mut().zip(fds).zip(gathered) {
            *slot = shmbroker_gpu_handle::from(&handle);
            *fd_slot = raw_or_none(fd);
        }
        Ok(())
    })
}

/// `root`'s GPU handle on every rank, into `*out` (the root's own too), with its fd in
/// `*out_fd` for the kinds that carry one (a new fd the caller owns; -1 otherwise). The root
/// passes `handle` and its `fd` (-1 for a kind with none); the other ranks pass NULL and -1.
/// Threads: as [`shmbroker_barrier`].
///
/// Errors: as `shmbroker_all_gather_gpu_handles`, and `SHMBROKER_E_MISUSE` when the root passes
/// no handle or another rank one.
///
/// # Safety
///
/// `s` is null or a live session; `handle` is null or readable; `out` and `out_fd` point at a
/// writable handle and int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_broadcast_gpu_handle(
    s: *mut shmbroker_session,
    root: u32,
    handle: *const shmbroker_gpu_handle,
    fd: c_int,
    out: *mut shmbroker_gpu_handle,
    out_fd: *mut c_int,
) -> c_int {
    guard("shmbroker_broadcast_gpu_handle", || {
        if out.is_null() || out_fd.is_null() {
            return Err(misuse("out or out_fd is NULL"));
        }
        // SAFETY: null or readable, per the contract.
        let own = unsafe { handle.as_ref() }.map(GpuHandle::from);
        let fd = optional_fd(fd)?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let (received, received_fd) = entered
            .handle
            .sender
            .session()
            .broadcast_gpu_handle(root, own.as_ref().map(|handle| (handle, fd)))?;
        // SAFETY: non-null (checked above), writable per the contract.
        unsafe { out.write(shmbroker_gpu_handle::from(&received)) };
        // SAFETY: as above.
        unsafe { out_fd.write(raw_or_none(received_fd)) };
        Ok(())
    })
}

/// `fd` borrowed for one call, or none for -1.
fn optional_fd<'a>(fd: c_int) -> Result<Option<BorrowedFd<'a>>, Failure> {
    if fd == -1 {
        Ok(None)
    } else {
        borrowed(fd).map(Some)
    }
}

/// A received fd handed to C, or -1 for none.
fn raw_or_none(fd: Option<OwnedFd>) -> c_int {
    fd.map_or(-1, IntoRawFd::into_raw_fd)
}
