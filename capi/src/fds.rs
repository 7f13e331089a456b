//! File descriptors between ranks: every rank's to all, or one rank's to all.

use crate::error::{Failure, guard, misuse};
use crate::handle::{enter, shmbroker_session};
#[cfg(doc)]
use crate::shmbroker_barrier;
use std::ffi::c_int;
use std::os::fd::{BorrowedFd, IntoRawFd, RawFd};

/// Every rank's `fd`, in rank order, as new fds in `out_fds` (`world_size` entries) that the
/// caller owns and closes; this rank's own slot gets a duplicate of `fd`. Threads: as
/// [`shmbroker_barrier`].
///
/// # Safety
///
/// `s` is null or a live session; `fd` is an open fd; `out_fds` has `world_size` writable ints.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_exchange_fds(
    s: *mut shmbroker_session,
    fd: c_int,
    out_fds: *mut c_int,
) -> c_int {
    guard("shmbroker_exchange_fds", || {
        if out_fds.is_null() {
            return Err(misuse("out_fds is NULL"));
        }
        let fd = borrowed(fd)?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let world = entered.handle.sender.world_size() as usize;
        // SAFETY: non-null (checked above), and `world_size` writable ints per the contract.
        let out = unsafe { std::slice::from_raw_parts_mut(out_fds, world) };
        let fds = entered.handle.sender.session().exchange_fds(fd)?;
        for (slot, fd) in out.iter_mut().zip(fds) {
            *slot = fd.into_raw_fd();
        }
        Ok(())
    })
}

/// `root`'s `fd` on every rank, as a new fd in `*out_fd` that the caller owns (the root gets a
/// duplicate); `fd` is ignored off the root. Threads: as [`shmbroker_barrier`].
///
/// # Safety
///
/// `s` is null or a live session; on the root `fd` is an open fd; `out_fd` points at a writable
/// int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_broadcast_fd(
    s: *mut shmbroker_session,
    root: u32,
    fd: c_int,
    out_fd: *mut c_int,
) -> c_int {
    guard("shmbroker_broadcast_fd", || {
        if out_fd.is_null() {
            return Err(misuse("out_fd is NULL"));
        }
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let fd = if entered.handle.sender.rank() == root {
            Some(borrowed(fd)?)
        } else {
            None
        };
        let received = entered.handle.sender.session().broadcast_fd(root, fd)?;
        // SAFETY: checked non-null above; writable per the contract.
        unsafe { out_fd.write(received.into_raw_fd()) };
        Ok(())
    })
}

/// Every rank's `count` fds, in rank order and then in each rank's order, as new fds in
/// `out_fds` (`world_size * count` entries: rank `r`'s fd `i` at `r * count + i`) that the
/// caller owns and closes; this rank's own slots get duplicates of `fds`. Every rank passes the
/// same `count`, at most `SHMBROKER_MAX_FDS_PER_EXCHANGE`. The whole batch takes two ring
/// trips, as one fd does; what is left a fd is its system calls (`pidfd_getfd`, the `fstat`s of
/// the theft check, the duplicate). Nothing is written to `out_fds` on an error. Threads: as
/// [`shmbroker_barrier`].
///
/// Errors: `SHMBROKER_E_PROTOCOL` naming a rank that passed another `count` or sent a forged
/// ticket (on every rank); `SHMBROKER_E_MISUSE` for NULL arrays, a closed fd or more than
/// `SHMBROKER_MAX_FDS_PER_EXCHANGE` fds; `SHMBROKER_E_IO` on every rank when one has no room
/// for the fds (`EMFILE`: its message says so, the others' name it); otherwise as
/// [`shmbroker_exchange_fds`].
///
/// # Safety
///
/// `s` is null or a live session; `fds` has `count` readable ints (or is NULL when `count` is
/// 0), each an open fd; `out_fds` has `world_size * count` writable ints.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_exchange_fd_batch(
    s: *mut shmbroker_session,
    fds: *const c_int,
    count: usize,
    out_fds: *mut c_int,
) -> c_int {
    guard("shmbroker_exchange_fd_batch", || {
        // SAFETY: `count` readable ints when non-null, per the contract.
        let fds = unsafe { fd_array(fds, count) }?;
        if out_fds.is_null() && count > 0 {
            return Err(misuse("out_fds is NULL"));
        }
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let world = entered.handle.sender.world_size() as usize;
        let batches = entered.handle.sender.session().exchange_fd_batch(&fds)?;
        if count > 0 {
            // SAFETY: non-null (checked above), and `world_size * count` writable ints per the
            // contract.
            let out = unsafe { std::slice::from_raw_parts_mut(out_fds, world * count) };
            for (slot, fd) in out.iter_mut().zip(batches.into_iter().flatten()) {
                *slot = fd.into_raw_fd();
            }
        }
        Ok(())
    })
}

/// `root`'s `count` fds on every rank, in the root's order, as new fds in `out_fds` (`count`
/// entries) that the caller owns (the root gets duplicates); `fds` is read on the root only
/// and may be NULL elsewhere. Every rank passes the same `count`, at most
/// `SHMBROKER_MAX_FDS_PER_EXCHANGE`; two ring trips whatever it is. Nothing is written to
/// `out_fds` on an error. Threads: as [`shmbroker_barrier`].
///
/// Errors: `SHMBROKER_E_PROTOCOL` on every rank when ranks passed different counts, naming the
/// root on a rank whose count is not the root's, and such a rank elsewhere; otherwise as
/// [`shmbroker_exchange_fd_batch`].
///
/// # Safety
///
/// `s` is null or a live session; on the root `fds` has `count` readable ints, each an open
/// fd; `out_fds` has `count` writable ints.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_broadcast_fd_batch(
    s: *mut shmbroker_session,
    root: u32,
    fds: *const c_int,
    count: usize,
    out_fds: *mut c_int,
) -> c_int {
    guard("shmbroker_broadcast_fd_batch", || {
        if out_fds.is_null() && count > 0 {
            return Err(misuse("out_fds is NULL"));
        }
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let mine = if entered.handle.sender.rank() == root {
            // SAFETY: `count` readable ints on the root, per the contract.
            unsafe { fd_array(fds, count) }?
        } else {
            Vec::new()
        };
        let received = entered
            .handle
            .sender
            .session()
            .broadcast_fd_batch(root, &mine, count)?;
        if count > 0 {
            // SAFETY: non-null (checked above), and `count` writable ints per the contract.
            let out = unsafe { std::slice::from_raw_parts_mut(out_fds, count) };
            for (slot, fd) in out.iter_mut().zip(received) {
                *slot = fd.into_raw_fd();
            }
        }
        Ok(())
    })
}

/// The `count` fds at `fds`, each borrowed for one call once `fcntl` says it is open.
///
/// # Safety
///
/// `fds` is NULL with a `count` of 0, or has `count` readable ints.
unsafe fn fd_array<'a>(fds: *const c_int, count: usize) -> Result<Vec<BorrowedFd<'a>>, Failure> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if fds.is_null() {
        return Err(misuse("fds is NULL"));
    }
    if count > shmbroker::session::MAX_FDS_PER_EXCHANGE {
        return Err(misuse(format!(
            "an fd exchange moves at most {} fds a rank, not {count}",
            shmbroker::session::MAX_FDS_PER_EXCHANGE
        )));
    }
    // SAFETY: non-null (checked above) with `count` readable ints, per the contract.
    let raw = unsafe { std::slice::from_raw_parts(fds, count) };
    raw.iter().map(|&fd| borrowed(fd)).collect()
}

/// The most fds one rank may pass to an fd batch.
pub const SHMBROKER_MAX_FDS_PER_EXCHANGE: usize = 4096;
const _: () = assert!(SHMBROKER_MAX_FDS_PER_EXCHANGE == shmbroker::session::MAX_FDS_PER_EXCHANGE);

/// `fd` borrowed for one call, once `fcntl` says it is open.
pub(crate) fn borrowed<'a>(fd: RawFd) -> Result<BorrowedFd<'a>, Failure> {
    // SAFETY: F_GETFD only reads the fd table; a bad fd gives EBADF.
    if fd < 0 || unsafe { nix::libc::fcntl(fd, nix::libc::F_GETFD) } < 0 {
        return Err(misuse(format!("fd {fd} is not an open file descriptor")));
    }
    // SAFETY: open (checked above); the caller keeps it open for the call, per the contract.
    Ok(unsafe { BorrowedFd::borrow_raw(fd) })
}

/// `shmbroker_fd_transport`'s answers: no fd exchange yet (for `used` only).
pub const SHMBROKER_FD_TRANSPORT_NONE: c_int = 0;
/// `pidfd_getfd` where the kernel allows it, the broker relay where it does not (the choice).
pub const SHMBROKER_FD_TRANSPORT_AUTO: c_int = 1;
/// `pidfd_getfd` only (chosen), or every fd so far moved by it (used).
pub const SHMBROKER_FD_TRANSPORT_PIDFD: c_int = 2;
/// The broker relay only (chosen), or some fd has moved through it (used).
pub const SHMBROKER_FD_TRANSPORT_RELAY: c_int = 3;

/// How this session moves fds: `*chosen` gets the choice (`SHMBROKER_FD_TRANSPORT_AUTO`,
/// `_PIDFD` or `_RELAY`, from `SHMBROKER_FD_TRANSPORT`), and `*used` how its exchanges (fds and
/// GPU handles) have moved them so far: `SHMBROKER_FD_TRANSPORT_NONE` before the first,
/// `_PIDFD` while every import was a `pidfd_getfd`, `_RELAY` from the first exchange that went
/// through the broker (chosen, or a `pidfd_getfd` the kernel refused under `auto`: inside a
/// container without `CAP_SYS_PTRACE`, say). Either pointer may be NULL. Threads: as
/// [`shmbroker_barrier`] (it waits for a collective in progress on another thread).
///
/// Errors: `SHMBROKER_E_MISUSE` for a NULL session.
///
/// # Safety
///
/// `s` is null or a live session; `chosen` and `used` are each null or point at a writable int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_fd_transport(
    s: *mut shmbroker_session,
    chosen: *mut c_int,
    used: *mut c_int,
) -> c_int {
    use shmbroker::session::FdTransport;
    let code = |transport: Option<FdTransport>| match transport {
        None => SHMBROKER_FD_TRANSPORT_NONE,
        Some(FdTransport::Auto) => SHMBROKER_FD_TRANSPORT_AUTO,
        Some(FdTransport::Pidfd) => SHMBROKER_FD_TRANSPORT_PIDFD,
        Some(FdTransport::Relay) => SHMBROKER_FD_TRANSPORT_RELAY,
    };
    guard("shmbroker_fd_transport", || {
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let session = entered.handle.sender.session();
        // SAFETY: null or writable, per the contract.
        if let Some(chosen) = unsafe { chosen.as_mut() } {
            *chosen = code(Some(session.fd_transport()));
        }
        // SAFETY: null or writable, per the contract.
        if let Some(used) = unsafe { used.as_mut() } {
            *used = code(session.fd_transport_used());
        }
        Ok(())
    })
}
