//! Sealed memfds and their mappings: the only kind of shared memory shmbroker uses.
//!
//! A memfd has no name in any file system, so nothing collides between jobs and nothing is left
//! behind when every process holding it exits. [`create_sealed`] sizes the file and then seals it
//! against shrinking, growing and further sealing, so no peer can truncate the file under another
//! process's mapping (which would turn that process's next access into `SIGBUS`). Joiners call
//! [`check_seals`] and [`file_size`] before mapping anything.

use crate::Error;
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};
use std::ffi::CStr;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

/// The seals every shared region must carry before a joiner maps it.
pub const REQUIRED_SEALS: SealFlag = SealFlag::F_SEAL_SHRINK
    .union(SealFlag::F_SEAL_GROW)
    .union(SealFlag::F_SEAL_SEAL);

/// Creates a memfd named `name` (visible only in `/proc/PID/fd`), sizes it to `size` bytes and
/// seals it with [`REQUIRED_SEALS`]. The file is close-on-exec and zero-filled.
///
/// # Errors
///
/// [`Error::Sys`] naming the system call that failed.
pub fn create_sealed(name: &CStr, size: u64) -> Result<OwnedFd, Error> {
    let fd = create_sized(name, size)?;
    seal(fd.as_fd())?;
    Ok(fd)
}

/// Creates a close-on-exec, zero-filled memfd of `size` bytes that can be sealed later: for a
/// region its creator must map before sealing. Call [`seal_with`] before handing it to anyone.
///
/// # Errors
///
/// [`Error::Sys`] naming the system call that failed.
pub fn create_sized(name: &CStr, size: u64) -> Result<OwnedFd, Error> {
    let fd = create_unsealed(name)?;
    let len = i64::try_from(size).map_err(|_| Error::sys("ftruncate")(Errno::EFBIG))?;
    nix::unistd::ftruncate(&fd, len).map_err(Error::sys("ftruncate"))?;
    Ok(fd)
}

/// Creates an empty, close-on-exec memfd that can be sealed later, for regions whose own code
/// sizes the file. Call [`seal`] before handing it to anyone.
///
/// # Errors
///
/// [`Error::Sys`] if `memfd_create` fails.
pub fn create_unsealed(name: &CStr) -> Result<OwnedFd, Error> {
    memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
        .map_err(Error::sys("memfd_create"))
}

/// The seals of a region only its creator may write: [`REQUIRED_SEALS`] and
/// `F_SEAL_FUTURE_WRITE`. Mappings that were writable before the seal stay writable (the owner's
/// own); from then on the kernel refuses every new way to write the file, whoever asks: `write`,
/// a writable shared `mmap` (also through a reopened `/proc/PID/fd/N`), `mprotect` of a read-only
/// mapping to writable, and `fallocate` hole punching.
pub const OWNER_ONLY_SEALS: SealFlag = REQUIRED_SEALS.union(SealFlag::F_SEAL_FUTURE_WRITE);

/// Adds [`REQUIRED_SEALS`] to `fd`, fixing its size for good.
///
/// # Errors
///
/// [`Error::Sys`] if `fcntl(F_ADD_SEALS)` fails (for example, the file was already sealed).
pub fn seal(fd: BorrowedFd<'_>) -> Result<(), Error> {
    seal_with(fd, REQUIRED_SEALS)
}

/// Adds `seals` to `fd` (`fcntl(2)`, `F_ADD_SEALS`).
///
/// # Errors
///
/// [`Error::Sys`] if `fcntl(F_ADD_SEALS)` fails (for example, the file was already sealed).
pub fn seal_with(fd: BorrowedFd<'_>, seals: SealFlag) -> Result<(), Error> {
    fcntl(fd, FcntlArg::F_ADD_SEALS(seals)).map_err(Error::sys("fcntl(F_ADD_SEALS)"))?;
    Ok(())
}

/// Checks that `fd` carries at least [`REQUIRED_SEALS`].
///
/// # Errors
///
/// [`Error::MissingSeals`] naming the seals expected and found, or [`Error::Sys`] if `fd` cannot
/// be asked (for example, it is not a memfd).
pub fn check_seals(fd: BorrowedFd<'_>) -> Result<(), Error> {
    check_seals_with(fd, REQUIRED_SEALS)
}

/// Checks that `fd` carries at least `required` (`fcntl(2)`, `F_GET_SEALS`).
///
/// # Errors
///
/// As for [`check_seals`].
pub fn check_seals_with(fd: BorrowedFd<'_>, required: SealFlag) -> Result<(), Error> {
    let found = fcntl(fd, FcntlArg::F_GET_SEALS).map_err(Error::sys("fcntl(F_GET_SEALS)"))?;
    if SealFlag::from_bits_retain(found).contains(required) {
        Ok(())
    } else {
        Err(Error::MissingSeals {
            expected: required.bits(),
            found,
        })
    }
}

/// Checks that `fd` is an ordinary shmem file (what `memfd_create` without `MFD_HUGETLB` makes),
/// whose pages are allocated on first touch and never missing: a `MFD_HUGETLB` file from a peer
/// could leave a reader's access to an unreserved huge page to fault with `SIGBUS`.
///
/// # Errors
///
/// [`Error::NotShmem`] naming the filesystem type found, or [`Error::Sys`] if `fstatfs` fails.
pub fn check_shmem(fd: BorrowedFd<'_>) -> Result<(), Error> {
    use nix::sys::statfs::{TMPFS_MAGIC, fstatfs};
    let found = fstatfs(fd)
        .map_err(Error::sys("fstatfs"))?
        .filesystem_type();
    if found == TMPFS_MAGIC {
        Ok(())
    } else {
        Err(Error::NotShmem {
            expected: TMPFS_MAGIC.0 as u64,
            found: found.0 as u64,
        })
    }
}

/// The size of the file behind `fd`, from `fstat`.
///
/// # Errors
///
/// [`Error::Sys`] if `fstat` fails.
pub fn file_size(fd: BorrowedFd<'_>) -> Result<u64, Error> {
    let stat = nix::sys::stat::fstat(fd).map_err(Error::sys("fstat"))?;
    // A regular file's size is never negative; treat a nonsensical one as empty.
    Ok(u64::try_from(stat.st_size).unwrap_or(0))
}

/// A `MAP_SHARED` mapping of a whole file (read-write, or read-only), unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: NonZeroUsize,
}

// SAFETY: a mapping is plain memory; which threads may touch which bytes is the business of the
// protocol built on top of it, not of the owner of the address range.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: `Mapping` hands out only raw pointers.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `fd` read-write and shared. The start is page-aligned.
    ///
    /// # Errors
    ///
    /// [`Error::Sys`] if `len` is zero or `mmap` fails.
    pub fn map(fd: impl AsFd, len: u64) -> Result<Self, Error> {
        Self::map_with(fd, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE)
    }

    /// Maps the first `len` bytes of `fd` read-only and shared: for a file another process
    /// writes. Nothing in this process can write through the mapping.
    ///
    /// # Errors
    ///
    /// [`Error::Sys`] if `len` is zero or `mmap` fails.
    pub fn map_read_only(fd: impl AsFd, len: u64) -> Result<Self, Error> {
        Self::map_with(fd, len, ProtFlags::PROT_READ)
    }

    fn map_with(fd: impl AsFd, len: u64, protection: ProtFlags) -> Result<Self, Error> {
        let len = usize::try_from(len)
            .ok()
            .and_then(NonZeroUsize::new)
            .ok_or(Errno::EINVAL)
            .map_err(Error::sys("mmap"))?;
        // SAFETY: a fresh mapping chosen by the kernel (no address hint, no MAP_FIXED) cannot
        // overlap memory anything in this process already uses. The file is either sealed against
        // shrinking (checked by the caller) or not yet shared with anyone (an outbox mapped by its
        // creator before sealing), so the mapped range stays backed for the mapping's life.
        let ptr = unsafe { mmap(None, len, protection, MapFlags::MAP_SHARED, fd, 0) }
            .map_err(Error::sys("mmap"))?;
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The first byte of the mapping.
    #[must_use]
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The address `offset` bytes into the mapping, clamped to its last byte.
    ///
    /// Callers check `offset` against the file size first; the clamp only keeps the pointer
    /// inside the mapping should they not.
    #[must_use]
    pub fn at(&self, offset: usize) -> NonNull<u8> {
        let offset = offset.min(self.len.get() - 1);
        // SAFETY: `offset < len`, so the result stays inside this one mapped allocation.
        unsafe { self.ptr.add(offset) }
    }

    /// The mapping's length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len.get()
    }

    /// Always `false`: a mapping is never empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are exactly what `mmap` returned, and this owner is the only
        // one that unmaps it. A failure could only mean an invalid range, which cannot happen.
        let _ = unsafe { munmap(self.ptr.cast(), self.len.get()) };
    }
}
