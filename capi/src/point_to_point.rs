//! Messages between two ranks: send, and receive from one rank or from any, waiting or not
//! (`SHMBROKER_E_AGAIN`), with the readiness fd that says when to try again.

use crate::buffer::{bytes, bytes_mut};
use crate::error::{Failure, guard, misuse};
use crate::handle::{enter, peek, shmbroker_session};
use crate::session::timeout_of;
use crate::{SHMBROKER_E_AGAIN, SHMBROKER_E_TOO_SMALL};
use shmbroker::{Error, Receiver};
use std::ffi::{c_int, c_void};

/// Sends `len` bytes to `rank`. Threads: one send or collective at a time (a second waits for
/// the first); a receive on another thread goes on, also while this waits for `rank`'s room.
///
/// # Safety
///
/// `s` is null or a live session; `data` has `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_send(
    s: *mut shmbroker_session,
    rank: u32,
    data: *const c_void,
    len: usize,
) -> c_int {
    guard("shmbroker_send", || {
        // SAFETY: `len` readable bytes at `data`, per the contract.
        let data = unsafe { bytes(data, len, "data") }?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        Ok(entered.handle.sender.send(rank, data)?)
    })
}

/// [`shmbroker_send`] with a deadline of its own: `timeout_ms` milliseconds, or
/// `SHMBROKER_TIMEOUT_FOREVER` for none, instead of the session's. Errors: as
/// [`shmbroker_send`], and `SHMBROKER_E_MISUSE` for a `timeout_ms` of 0. Threads: as [`shmbroker_send`].
///
/// # Safety
///
/// As for [`shmbroker_send`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_send_timeout(
    s: *mut shmbroker_session,
    rank: u32,
    data: *const c_void,
    len: usize,
    timeout_ms: u64,
) -> c_int {
    guard("shmbroker_send_timeout", || {
        let timeout = timeout_of(timeout_ms)?;
        // SAFETY: `len` readable bytes at `data`, per the contract.
        let data = unsafe { bytes(data, len, "data") }?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        Ok(entered
            .handle
            .sender
            .with_timeout(timeout)
            .send(rank, data)?)
    })
}

/// `*len` set to the length of a message that did not fit, and the failure saying so.
///
/// # Safety
///
/// `len` is null or points at a writable `size_t`.
pub(crate) unsafe fn too_small(rank: u32, needed: u64, cap: usize, len: *mut usize) -> Failure {
    // SAFETY: checked non-null by the callers; writable per the contract.
    unsafe { len.write(usize::try_from(needed).unwrap_or(usize::MAX)) };
    Failure(
        SHMBROKER_E_TOO_SMALL,
        format!(
            "rank {rank} sent {needed} bytes; the buffer holds {cap} (the message is kept for the \
             next receive)"
        ),
        Some(rank),
    )
}

/// The body of every receive into a caller's buffer: checks the pointers, takes the receiving
/// half (`SHMBROKER_E_BUSY` when another thread has it), runs `take`, and writes the sender (to
/// `sender`, when the call reports one) and the length. `take` gives `None` when nothing has
/// arrived (`SHMBROKER_E_AGAIN`); a message too long for `buf` sets both and is kept
/// (`SHMBROKER_E_TOO_SMALL`).
///
/// # Safety
///
/// `s` is null or a live session; `buf` has `cap` writable bytes; `len`, and `sender` when
/// given, are null or point at a writable `size_t` and `uint32_t`.
pub(crate) unsafe fn receive(
    name: &str,
    s: *mut shmbroker_session,
    sender: Option<*mut u32>,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
    take: impl FnOnce(&Receiver, &mut [u8]) -> Result<Option<(u32, usize)>, Error>,
) -> c_int {
    guard(name, || {
        if len.is_null() || sender.is_some_and(<*mut u32>::is_null) {
            return Err(misuse(if sender.is_some() {
                "rank or len is NULL"
            } else {
                "len is NULL"
            }));
        }
        // SAFETY: `cap` writable bytes at `buf`, per the contract.
        let buf = unsafe { bytes_mut(buf, cap, "buf") }?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let receiver = entered.handle.receiver()?;
        let (from, received) = match take(&receiver, buf) {
            Ok(Some(got)) => got,
            Ok(None) => return Err(nothing_yet()),
            Err(Error::BufferTooSmall { peer, needed, .. }) => {
                if let Some(sender) = sender {
                    // SAFETY: checked non-null above; writable per the contract.
                    unsafe { sender.write(peer) };
                }
                // SAFETY: checked non-null above.
                return Err(unsafe { too_small(peer, needed, cap, len) });
            }
            Err(error) => return Err(error.into()),
        };
        if let Some(sender) = sender {
            // SAFETY: checked non-null above; writable per the contract.
            unsafe { sender.write(from) };
        }
        // SAFETY: checked non-null above; writable per the contract.
        unsafe { len.write(received) };
        Ok(())
    })
}

/// Receives the next message from `rank` into `buf` (`cap` bytes); `*len` is its length. A
/// message longer than `cap` is `SHMBROKER_E_TOO_SMALL` with `*len` set to its length; it is
/// kept, whole, for the next receive (see also [`shmbroker_probe`]). Threads: one receive at a
/// time (`SHMBROKER_E_BUSY` at once for a second); sends and collectives on other threads go on
/// while it waits.
///
/// # Safety
///
/// `s` is null or a live session; `buf` has `cap` writable bytes; `len` points at a writable
/// `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_recv(
    s: *mut shmbroker_session,
    rank: u32,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> c_int {
    // SAFETY: `s` is null or live, `buf` has `cap` writable bytes, `len` (and `rank`) point at
    // writable memory: this function's contract is `receive`'s.
    unsafe {
        receive("shmbroker_recv", s, None, buf, cap, len, |receiver, buf| {
            Ok(Some((rank, receiver.recv_into(rank, buf)?)))
        })
    }
}

/// Receives the next message from whichever peer has one (round-robin among those that do)
/// into `buf` (`cap` bytes): `*rank` is its sender and `*len` its length. A message longer than
/// `cap` is `SHMBROKER_E_TOO_SMALL` with `*rank` and `*len` set; it is kept, whole: receive it
/// with [`shmbroker_recv`] from `*rank`. Peers that left are skipped; a peer that died is
/// reported once (`SHMBROKER_E_PEER_LOST`) after what it sent, then skipped. Threads: as
/// [`shmbroker_recv`].
///
/// # Safety
///
/// `s` is null or a live session; `buf` has `cap` writable bytes; `rank` points at a writable
/// `uint32_t` and `len` at a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_recv_any(
    s: *mut shmbroker_session,
    rank: *mut u32,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> c_int {
    // SAFETY: `s` is null or live, `buf` has `cap` writable bytes, `len` (and `rank`) point at
    // writable memory: this function's contract is `receive`'s.
    unsafe {
        receive(
            "shmbroker_recv_any",
            s,
            Some(rank),
            buf,
            cap,
            len,
            |receiver, buf| receiver.recv_any_into(buf).map(Some),
        )
    }
}

/// [`shmbroker_recv`] with a deadline of its own: `timeout_ms` milliseconds, or
/// `SHMBROKER_TIMEOUT_FOREVER` for none (a response thread that waits as long as it takes while
/// the main thread's collectives keep the session's deadline). Errors: as [`shmbroker_recv`],
/// and `SHMBROKER_E_MISUSE` for a `timeout_ms` of 0. Threads: as [`shmbroker_recv`].
///
/// # Safety
///
/// As for [`shmbroker_recv`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_recv_timeout(
    s: *mut shmbroker_session,
    rank: u32,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
    timeout_ms: u64,
) -> c_int {
    let name = "shmbroker_recv_timeout";
    let timeout = match timeout_of(timeout_ms) {
        Ok(timeout) => timeout,
        Err(failure) => return guard(name, || Err(failure)),
    };
    // SAFETY: `s` is null or live, `buf` has `cap` writable bytes, `len` points at writable
    // memory: this function's contract is `receive`'s.
    unsafe {
        receive(name, s, None, buf, cap, len, |receiver, buf| {
            Ok(Some((
                rank,
                receiver.with_timeout(timeout).recv_into(rank, buf)?,
            )))
        })
    }
}

/// [`shmbroker_recv_any`] with a deadline of its own: `timeout_ms` milliseconds, or
/// `SHMBROKER_TIMEOUT_FOREVER` for none. Errors: as [`shmbroker_recv_any`], and
/// `SHMBROKER_E_MISUSE` for a `timeout_ms` of 0. Threads: as [`shmbroker_recv_any`].
///
/// # Safety
///
/// As for [`shmbroker_recv_any`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_recv_any_timeout(
    s: *mut shmbroker_session,
    rank: *mut u32,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
    timeout_ms: u64,
) -> c_int {
    let name = "shmbroker_recv_any_timeout";
    let timeout = match timeout_of(timeout_ms) {
        Ok(timeout) => timeout,
        Err(failure) => return guard(name, || Err(failure)),
    };
    // SAFETY: `s` is null or live, `buf` has `cap` writable bytes, `len` and `rank` point at
    // writable memory: this function's contract is `receive`'s.
    unsafe {
        receive(name, s, Some(rank), buf, cap, len, |receiver, buf| {
            receiver.with_timeout(timeout).recv_any_into(buf).map(Some)
        })
    }
}

/// [`shmbroker_recv`] without waiting: `SHMBROKER_E_AGAIN` when nothing from `rank` has started
/// to arrive (a large message that has started is received whole). Threads: as
/// [`shmbroker_recv`].
///
/// # Safety
///
/// As for [`shmbroker_recv`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_try_recv(
    s: *mut shmbroker_session,
    rank: u32,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> c_int {
    // SAFETY: `s` is null or live, `buf` has `cap` writable bytes, `len` (and `rank`) point at
    // writable memory: this function's contract is `receive`'s.
    unsafe {
        receive(
            "shmbroker_try_recv",
            s,
            None,
            buf,
            cap,
            len,
            |receiver, buf| Ok(receiver.try_recv_into(rank, buf)?.map(|got| (rank, got))),
        )
    }
}

/// [`shmbroker_recv_any`] without waiting: `SHMBROKER_E_AGAIN` when nothing has started to
/// arrive. It then leaves every ring armed, so [`shmbroker_readiness_fd`] becomes readable once
/// something does. Threads: as [`shmbroker_recv`].
///
/// # Safety
///
/// As for [`shmbroker_recv_any`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_try_recv_any(
    s: *mut shmbroker_session,
    rank: *mut u32,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> c_int {
    // SAFETY: `s` is null or live, `buf` has `cap` writable bytes, `len` (and `rank`) point at
    // writable memory: this function's contract is `receive`'s.
    unsafe {
        receive(
            "shmbroker_try_recv_any",
            s,
            Some(rank),
            buf,
            cap,
            len,
            |receiver, buf| receiver.try_recv_any_into(buf),
        )
    }
}

pub(crate) fn nothing_yet() -> Failure {
    Failure(SHMBROKER_E_AGAIN, "nothing has arrived yet".into(), None)
}

/// This session's readiness eventfd, for `poll` or `epoll`: readable when a message is waiting
/// from any peer, once [`shmbroker_try_recv_any`] has returned `SHMBROKER_E_AGAIN`. Take what
/// is there with [`shmbroker_try_recv_any`] until it says `SHMBROKER_E_AGAIN` again before
/// waiting on the fd. The fd belongs to the session: do not read or close it. -1 for NULL.
///
/// # Safety
///
/// `s` is null or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_readiness_fd(s: *const shmbroker_session) -> c_int {
    // SAFETY: null or a live session, per the contract.
    unsafe { peek(s, -1, |s| s.readiness) }
}

/// Waits for the next message from `rank` and sets `*len` to its length without receiving it:
/// the next [`shmbroker_recv`] from `rank` gets it. Threads: as [`shmbroker_recv`].
///
/// # Safety
///
/// `s` is null or a live session; `len` points at a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_probe(
    s: *mut shmbroker_session,
    rank: u32,
    len: *mut usize,
) -> c_int {
    guard("shmbroker_probe", || {
        if len.is_null() {
            return Err(misuse("len is NULL"));
        }
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let needed = entered.handle.receiver()?.probe(rank)?;
        // SAFETY: checked non-null above; writable per the contract.
        unsafe { len.write(needed) };
        Ok(())
    })
}

/// [`shmbroker_probe`] with a deadline of its own: `timeout_ms` milliseconds, or
/// `SHMBROKER_TIMEOUT_FOREVER` for none. Errors: as [`shmbroker_probe`], and
/// `SHMBROKER_E_MISUSE` for a `timeout_ms` of 0. Threads: as [`shmbroker_probe`].
///
/// # Safety
///
/// As for [`shmbroker_probe`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_probe_timeout(
    s: *mut shmbroker_session,
    rank: u32,
    len: *mut usize,
    timeout_ms: u64,
) -> c_int {
    guard("shmbroker_probe_timeout", || {
        let timeout = timeout_of(timeout_ms)?;
        if len.is_null() {
            return Err(misuse("len is NULL"));
        }
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let needed = entered
            .handle
            .receiver()?
            .with_timeout(timeout)
            .probe(rank)?;
        // SAFETY: checked non-null above; writable per the contract.
        unsafe { len.write(needed) };
        Ok(())
    })
}
