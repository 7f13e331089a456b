//! The C ABI of shmbroker: `capi/include/shmbroker.h`, generated from this file by cbindgen.
//!
//! # Rules every function keeps
//!
//! - It returns `SHMBROKER_OK` (0) or a negative `SHMBROKER_E_*` code, and on failure sets this
//!   thread's [`shmbroker_last_error`] to a sentence that names the rank involved when one is.
//! - No Rust panic crosses the boundary: a panic (a bug) becomes `SHMBROKER_E_INTERNAL`, and the
//!   session it happened in should be closed.
//! - A null pointer where one is needed, a buffer shorter than the call needs, or a rank out of
//!   range is `SHMBROKER_E_MISUSE` with a message, never a crash. (A pointer that is not null but
//!   points at less memory than the length given cannot be detected: that is the caller's.)
//! - Every blocking call has the deadline the session was opened with.
//!
//! # Threads
//!
//! A session handle may be called from any number of threads at once, with no undefined
//! behaviour and nothing lost. Inside, it is a [`Sender`] and a [`Receiver`] (a split session):
//!
//! - sends and collectives run one at a time (a second waits for the first to finish touching
//!   the rings);
//! - one receive (`shmbroker_recv`, `shmbroker_recv_any`, `shmbroker_probe`) runs at a time; a
//!   receive called while another thread's is in progress returns `SHMBROKER_E_BUSY` at once;
//! - a receive that waits for a message holds nothing while it sleeps, so another thread's
//!   sends and collectives go on meanwhile (a scheduler broadcasting while a response thread
//!   waits in `shmbroker_recv_any`);
//! - `shmbroker_interrupt` (async-signal-safe) ends another thread's wait with
//!   `SHMBROKER_E_INTERRUPTED`; `shmbroker_close` while a call is in progress on another thread
//!   returns `SHMBROKER_E_BUSY` and frees nothing, so interrupt, wait for that thread's call to
//!   return, then close.
//!
//! A handle used after `shmbroker_close` returned `SHMBROKER_OK` is freed memory, as for any C
//! object. Limits, each bounded by the deadline (see `capi/README.md`): an interrupt does not
//! end a transfer in the middle of a large message; a collective
//! holds the session while it waits, so a message larger than its sender's outbox sent to this
//! rank meanwhile waits for the collective to end.

#![allow(non_camel_case_types)]

use shmbroker::session::Interrupter;
use shmbroker::{Error, Receiver, Sender, Session};
use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::os::fd::{BorrowedFd, IntoRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Duration;

/// Success.
pub const SHMBROKER_OK: c_int = 0;
/// A peer this call needed died (its process ended without leaving).
pub const SHMBROKER_E_PEER_LOST: c_int = -1;
/// A peer this call needed left the session on purpose.
pub const SHMBROKER_E_PEER_LEFT: c_int = -2;
/// The deadline passed; the message names the ranks still waited for.
pub const SHMBROKER_E_TIMEOUT: c_int = -3;
/// A peer sent bytes no correct peer sends, corrupted a ring, or called another collective.
pub const SHMBROKER_E_PROTOCOL: c_int = -4;
/// A mistake in the calling program: a null pointer, a short buffer, a rank out of range.
pub const SHMBROKER_E_MISUSE: c_int = -5;
/// The operating system refused something the call needed.
pub const SHMBROKER_E_IO: c_int = -6;
/// The broker is gone, and this call needed it.
pub const SHMBROKER_E_BROKER_LOST: c_int = -7;
/// Logging on failed (no broker, refused, or the environment says no rank).
pub const SHMBROKER_E_LOGON: c_int = -8;
/// A bug in shmbroker (a Rust panic, caught): close the session.
pub const SHMBROKER_E_INTERNAL: c_int = -9;
/// A peer this call needed never logged on, and no longer can: the job lost a worker (the
/// message names it) and the broker admits nobody new to it.
pub const SHMBROKER_E_PEER_NEVER_JOINED: c_int = -10;

/// Another thread's call on this session is in progress: a second receive while one runs, or
/// `shmbroker_close` during any call. Nothing was done; the other call is undisturbed.
pub const SHMBROKER_E_BUSY: c_int = -11;
/// `shmbroker_interrupt` ended the wait. Nothing was lost: a message not received stays for the
/// next receive. The session goes on.
pub const SHMBROKER_E_INTERRUPTED: c_int = -12;
/// The message is longer than the buffer given: `*len` is its length, and it is kept, whole, for
/// the next receive from its sender.
pub const SHMBROKER_E_TOO_SMALL: c_int = -13;

/// A `shmbroker_try_*` call found nothing waiting. Nothing was taken; not an error.
pub const SHMBROKER_E_AGAIN: c_int = -14;

/// The version of this library and header, major part (`shmbroker_version` gives the library's
/// at run time).
pub const SHMBROKER_VERSION_MAJOR: c_int = 0;
/// Minor part of [`SHMBROKER_VERSION_MAJOR`].
pub const SHMBROKER_VERSION_MINOR: c_int = 1;
/// Patch part of [`SHMBROKER_VERSION_MAJOR`].
pub const SHMBROKER_VERSION_PATCH: c_int = 0;

/// The library's version as `MAJOR * 10000 + MINOR * 100 + PATCH`, to compare with the header's
/// `SHMBROKER_VERSION_*` (a program built against one header and run with another library).
#[unsafe(no_mangle)]
pub extern "C" fn shmbroker_version() -> c_int {
    SHMBROKER_VERSION_MAJOR * 10_000 + SHMBROKER_VERSION_MINOR * 100 + SHMBROKER_VERSION_PATCH
}

/// A worker's session: opaque, made by `shmbroker_connect` or `shmbroker_from_env`, ended by
/// `shmbroker_close`. Safe to call from several threads at once (see the header's thread rules).
#[derive(Debug)]
pub struct shmbroker_session {
    /// Sends and collectives (the whole session, lent for each call).
    sender: Sender,
    /// Receives, one at a time: a wait sleeps on the session's one readiness eventfd, which has
    /// one waiter.
    receiver: Mutex<Receiver>,
    interrupter: Interrupter,
    /// The session's readiness eventfd (open as long as the session is).
    readiness: RawFd,
    /// Calls in progress on any thread; [`CLOSING`] once `shmbroker_close` has taken the handle.
    calls: AtomicUsize,
}

/// [`shmbroker_session::calls`] of a handle being freed.
const CLOSING: usize = usize::MAX;

impl shmbroker_session {
    fn new(session: Session) -> Self {
        let interrupter = session.interrupter();
        let (sender, receiver) = session.split();
        Self {
            readiness: std::os::fd::AsRawFd::as_raw_fd(&receiver.readiness_fd()),
            sender,
            receiver: Mutex::new(receiver),
            interrupter,
            calls: AtomicUsize::new(0),
        }
    }

    /// The receiving half, or `SHMBROKER_E_BUSY` when another thread is receiving.
    fn receiver(&self) -> Result<MutexGuard<'_, Receiver>, Failure> {
        match self.receiver.try_lock() {
            Ok(receiver) => Ok(receiver),
            // A panic mid-receive was reported as internal; the next call reports what it finds.
            Err(TryLockError::Poisoned(poisoned)) => Ok(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => Err(Failure(
                SHMBROKER_E_BUSY,
                "another thread is receiving on this session (one receive at a time; sends and \
                 collectives may run beside it)"
                    .into(),
                None,
            )),
        }
    }
}

/// A call in progress on a handle, counted in [`shmbroker_session::calls`] from before it
/// touches anything until it returns: `shmbroker_close` frees nothing while one is.
struct InCall<'a> {
    handle: &'a shmbroker_session,
}

impl shmbroker_session {
    /// Counts a call in, or `None` once the handle is being closed. Atomics only: safe in a
    /// signal handler.
    fn enter(&self) -> Option<InCall<'_>> {
        let mut calls = self.calls.load(Ordering::Relaxed);
        loop {
            if calls == CLOSING {
                return None;
            }
            match self.calls.compare_exchange_weak(
                calls,
                calls + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(InCall { handle: self }),
                Err(now) => calls = now,
            }
        }
    }
}

impl Drop for InCall<'_> {
    fn drop(&mut self) {
        self.handle.calls.fetch_sub(1, Ordering::Release);
    }
}

/// Runs `peek` on the handle `s` as a counted call; `default` for NULL or a handle being
/// closed. Atomics only (for the calls any thread, or a signal handler, may make any time).
///
/// # Safety
///
/// `s` is null or a live session.
unsafe fn peek<T>(
    s: *const shmbroker_session,
    default: T,
    peek: impl FnOnce(&shmbroker_session) -> T,
) -> T {
    // SAFETY: null or a live session, per the contract.
    match unsafe { s.as_ref() }.and_then(shmbroker_session::enter) {
        Some(call) => peek(call.handle),
        None => default,
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// The rank this thread's last failure named, or -1.
    static LAST_RANK: std::cell::Cell<i64> = const { std::cell::Cell::new(-1) };
}

/// A failure: its code, its message, and the rank it names (if any).
struct Failure(c_int, String, Option<u32>);

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        let code = match &error {
            Error::PeerLost { .. } => SHMBROKER_E_PEER_LOST,
            Error::PeerLeft { .. } => SHMBROKER_E_PEER_LEFT,
            Error::PeerNeverJoined { .. } => SHMBROKER_E_PEER_NEVER_JOINED,
            Error::Timeout { .. } => SHMBROKER_E_TIMEOUT,
            Error::BrokerLost => SHMBROKER_E_BROKER_LOST,
            Error::Logon(_) | Error::Launch(_) => SHMBROKER_E_LOGON,
            Error::BufferTooSmall { .. } => SHMBROKER_E_TOO_SMALL,
            Error::Misuse(_) | Error::RankOutOfRange { .. } => SHMBROKER_E_MISUSE,
            Error::Io { .. } | Error::OwnOutbox(_) | Error::FdTransport(_) => SHMBROKER_E_IO,
            Error::Interrupted => SHMBROKER_E_INTERRUPTED,
            _ => SHMBROKER_E_PROTOCOL,
        };
        Failure(code, error.to_string(), error.rank())
    }
}

fn misuse(message: impl Into<String>) -> Failure {
    Failure(SHMBROKER_E_MISUSE, message.into(), None)
}

fn set_last_error(message: &str, rank: Option<u32>) {
    LAST_RANK.with(|last| last.set(rank.map_or(-1, i64::from)));
    // A NUL inside the message would cut it short in C: replace it.
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
}

/// Runs `call`, turning its failure or panic into a code and this thread's last error.
fn guard(name: &str, call: impl FnOnce() -> Result<(), Failure>) -> c_int {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(())) => SHMBROKER_OK,
        Ok(Err(Failure(code, message, rank))) => {
            set_last_error(&format!("{name}: {message}"), rank);
            code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            set_last_error(
                &format!("{name}: internal error (a bug in shmbroker; close this session): {what}"),
                None,
            );
            SHMBROKER_E_INTERNAL
        }
    }
}

/// Enters a call on the handle `s`: misuse when it is null.
///
/// # Safety
///
/// `s` is null or a pointer `shmbroker_connect`/`shmbroker_from_env` returned that
/// `shmbroker_close` has not freed.
unsafe fn enter<'a>(s: *const shmbroker_session) -> Result<InCall<'a>, Failure> {
    // SAFETY: per this function's contract, a non-null `s` is a live handle.
    let handle = unsafe { s.as_ref() }.ok_or_else(|| misuse("the session is NULL"))?;
    handle
        .enter()
        .ok_or_else(|| misuse("the session is being closed"))
}

/// `len` bytes at `data` (empty when `len` is 0, whatever `data` is).
///
/// # Safety
///
/// When `len > 0` and `data` is not null, `data` points at `len` readable bytes.
unsafe fn bytes<'a>(data: *const c_void, len: usize, what: &str) -> Result<&'a [u8], Failure> {
    if len == 0 {
        return Ok(&[]);
    }
    if data.is_null() {
        return Err(misuse(format!("{what} is NULL with a length of {len}")));
    }
    // SAFETY: non-null, and per this function's contract `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) })
}

/// `len` writable bytes at `data` (empty when `len` is 0).
///
/// # Safety
///
/// When `len > 0` and `data` is not null, `data` points at `len` writable bytes no one else
/// uses during the call.
unsafe fn bytes_mut<'a>(
    data: *mut c_void,
    len: usize,
    what: &str,
) -> Result<&'a mut [u8], Failure> {
    if len == 0 {
        return Ok(&mut []);
    }
    if data.is_null() {
        return Err(misuse(format!("{what} is NULL with a length of {len}")));
    }
    // SAFETY: non-null, and per this function's contract `len` writable, unshared bytes.
    Ok(unsafe { std::slice::from_raw_parts_mut(data.cast::<u8>(), len) })
}

fn timeout_of(timeout_ms: u64) -> Result<Duration, Failure> {
    if timeout_ms == 0 {
        return Err(misuse("timeout_ms is 0: every call needs a deadline"));
    }
    Ok(Duration::from_millis(timeout_ms))
}

/// Stores a new session in `*out`.
///
/// # Safety
///
/// `out` is null or points at a writable `shmbroker_session *`.
unsafe fn give(out: *mut *mut shmbroker_session, session: Session) {
    let handle = Box::into_raw(Box::new(shmbroker_session::new(session)));
    // SAFETY: the caller checked `out` is not null; per the contract it is writable.
    unsafe { out.write(handle) };
}

/// Logs on to the broker listening at `path` as `rank` (-1: any free rank), within `timeout_ms`
/// milliseconds, which is also every later call's deadline. On success `*out` is the session.
///
/// # Safety
///
/// `path` is a NUL-terminated string; `out` points at a writable `shmbroker_session *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_connect(
    path: *const c_char,
    rank: i32,
    timeout_ms: u64,
    out: *mut *mut shmbroker_session,
) -> c_int {
    guard("shmbroker_connect", || {
        if out.is_null() {
            return Err(misuse("out is NULL"));
        }
        if path.is_null() {
            return Err(misuse("path is NULL"));
        }
        // SAFETY: non-null and, per the contract, NUL-terminated.
        let path = unsafe { CStr::from_ptr(path) };
        let path = std::path::Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()));
        let rank =
            match rank {
                -1 => None,
                rank => Some(u32::try_from(rank).map_err(|_| {
                    misuse(format!("rank {rank}: a rank is 0 or more, or -1 for any"))
                })?),
            };
        let timeout = timeout_of(timeout_ms)?;
        let mut session = Session::connect(path, rank, timeout)?;
        session.set_timeout(timeout);
        // SAFETY: checked non-null above; writable per the contract.
        unsafe { give(out, session) };
        Ok(())
    })
}

/// Joins the job this process was started in: `shmbroker run`, or mpirun, torchrun or srun (see
/// the README), within `timeout_ms` milliseconds, which is also every later call's deadline.
///
/// # Safety
///
/// `out` points at a writable `shmbroker_session *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_from_env(
    timeout_ms: u64,
    out: *mut *mut shmbroker_session,
) -> c_int {
    guard("shmbroker_from_env", || {
        if out.is_null() {
            return Err(misuse("out is NULL"));
        }
        let timeout = timeout_of(timeout_ms)?;
        let mut session = Session::from_env(timeout)?;
        session.set_timeout(timeout);
        // SAFETY: checked non-null above; writable per the contract.
        unsafe { give(out, session) };
        Ok(())
    })
}

/// This worker's rank (0 for a NULL session). Any thread, any time.
///
/// # Safety
///
/// `s` is null or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_rank(s: *const shmbroker_session) -> u32 {
    // SAFETY: null or a live session, per the contract.
    unsafe { peek(s, 0, |s| s.sender.rank()) }
}

/// Ranks in the world (0 for a NULL session). Any thread, any time.
///
/// # Safety
///
/// `s` is null or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_world_size(s: *const shmbroker_session) -> u32 {
    // SAFETY: null or a live session, per the contract.
    unsafe { peek(s, 0, |s| s.sender.world_size()) }
}

/// Waits until every rank has called it. Threads: as a send (one collective or send at a time;
/// a receive on another thread goes on).
///
/// # Safety
///
/// `s` is null or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_barrier(s: *mut shmbroker_session) -> c_int {
    guard("shmbroker_barrier", || {
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        Ok(entered.handle.sender.session().barrier()?)
    })
}

/// Every rank's `len` bytes, in rank order, into `out` (`len * world_size` bytes). Every rank
/// passes the same `len`. Threads: as [`shmbroker_barrier`].
///
/// # Safety
///
/// `s` is null or a live session; `data` has `len` readable bytes and `out` `len * world_size`
/// writable ones (either may be null when its length is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_all_gather(
    s: *mut shmbroker_session,
    data: *const c_void,
    len: usize,
    out: *mut c_void,
) -> c_int {
    guard("shmbroker_all_gather", || {
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let total = len
            .checked_mul(entered.handle.sender.world_size() as usize)
            .ok_or_else(|| misuse(format!("len {len} times the world size overflows")))?;
        // SAFETY: `len` readable bytes at `data`, per the contract.
        let data = unsafe { bytes(data, len, "data") }?;
        // SAFETY: `len * world_size` writable bytes at `out`, per the contract.
        let out = unsafe { bytes_mut(out, total, "out") }?;
        Ok(entered.handle.sender.session().all_gather_into(data, out)?)
    })
}

/// `root`'s `len` bytes into every rank's `buf`: the root's `buf` is what is sent, every other
/// rank's is filled. Every rank passes the same `len`. Threads: as [`shmbroker_barrier`].
///
/// # Safety
///
/// `s` is null or a live session; `buf` has `len` bytes (readable on the root, writable
/// elsewhere).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_broadcast(
    s: *mut shmbroker_session,
    root: u32,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    guard("shmbroker_broadcast", || {
        // SAFETY: `len` bytes at `buf`, writable, per the contract.
        let buf = unsafe { bytes_mut(buf, len, "buf") }?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let mut session = entered.handle.sender.session();
        if session.rank() == root {
            session.broadcast(root, Some(&*buf))?;
            return Ok(());
        }
        let received = session.broadcast(root, None)?;
        if received.len() != len {
            return Err(misuse(format!(
                "rank {root} broadcast {} bytes; this rank's buffer holds {len} (every rank \
                 passes the same len)",
                received.len()
            )));
        }
        buf.copy_from_slice(&received);
        Ok(())
    })
}

/// Every rank's `len` bytes, in rank order, into the root's `out` (`len * world_size` bytes;
/// ignored, and may be NULL, on other ranks). Every rank passes the same `len`: a part of
/// another size is `SHMBROKER_E_PROTOCOL` naming its rank. Threads: as [`shmbroker_barrier`].
///
/// # Safety
///
/// `s` is null or a live session; `data` has `len` readable bytes; on the root `out` has
/// `len * world_size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_gather(
    s: *mut shmbroker_session,
    root: u32,
    data: *const c_void,
    len: usize,
    out: *mut c_void,
) -> c_int {
    guard("shmbroker_gather", || {
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        // SAFETY: `len` readable bytes at `data`, per the contract.
        let data = unsafe { bytes(data, len, "data") }?;
        let rank = entered.handle.sender.rank();
        let out = if rank == root {
            let total = len
                .checked_mul(entered.handle.sender.world_size() as usize)
                .ok_or_else(|| misuse(format!("len {len} times the world size overflows")))?;
            // SAFETY: on the root, `len * world_size` writable bytes at `out`, per the contract.
            Some(unsafe { bytes_mut(out, total, "out") }?)
        } else {
            None
        };
        let parts = entered.handle.sender.session().gather(root, data)?;
        if let (Some(out), Some(parts)) = (out, parts) {
            for (peer, part) in (0u32..).zip(&parts) {
                if part.len() != len {
                    return Err(Failure(
                        SHMBROKER_E_PROTOCOL,
                        format!(
                            "rank {peer} gave {} bytes; this root expected {len} (every rank \
                             passes the same len)",
                            part.len()
                        ),
                        Some(peer),
                    ));
                }
                let at = peer as usize * len;
                out[at..at + len].copy_from_slice(part);
            }
        }
        Ok(())
    })
}

/// Sends `len` bytes to `rank`. Threads: one send or collective at a time (a second waits for
/// the first); a receive on another thread goes on.
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

/// `*len` set to the length of a message that did not fit, and the failure saying so.
///
/// # Safety
///
/// `len` is null or points at a writable `size_t`.
unsafe fn too_small(rank: u32, needed: u64, cap: usize, len: *mut usize) -> Failure {
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
unsafe fn receive(
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

fn nothing_yet() -> Failure {
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

/// `fd` borrowed for one call, once `fcntl` says it is open.
fn borrowed<'a>(fd: RawFd) -> Result<BorrowedFd<'a>, Failure> {
    // SAFETY: F_GETFD only reads the fd table; a bad fd gives EBADF.
    if fd < 0 || unsafe { nix::libc::fcntl(fd, nix::libc::F_GETFD) } < 0 {
        return Err(misuse(format!("fd {fd} is not an open file descriptor")));
    }
    // SAFETY: open (checked above); the caller keeps it open for the call, per the contract.
    Ok(unsafe { BorrowedFd::borrow_raw(fd) })
}

/// Ends every wait in progress on the session, on whichever threads they are, with
/// `SHMBROKER_E_INTERRUPTED`; with no call waiting, the next wait ends at once (unless
/// [`shmbroker_clear_interrupt`]).
/// Nothing is lost, and the session goes on. Async-signal-safe: callable from a signal handler.
/// A wait for the broker (a peer still to log on, an fd relay) runs to its deadline. Returns
/// `SHMBROKER_E_MISUSE` for NULL (and sets no message: it may run in a signal handler).
///
/// # Safety
///
/// `s` is null or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_interrupt(s: *const shmbroker_session) -> c_int {
    // A signal handler must leave errno as it found it; the futex wake-ups may set it.
    let errno = nix::errno::Errno::last_raw();
    // SAFETY: null or a live session, per the contract. Atomics and futex wake-ups only: no
    // allocation, no lock.
    let rc = unsafe {
        peek(s, SHMBROKER_E_MISUSE, |handle| {
            handle.interrupter.interrupt();
            SHMBROKER_OK
        })
    };
    nix::errno::Errno::set_raw(errno);
    rc
}

/// Forgets an interrupt that no wait has taken (it came after the call it was meant for).
///
/// # Safety
///
/// `s` is null or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_clear_interrupt(s: *mut shmbroker_session) -> c_int {
    guard("shmbroker_clear_interrupt", || {
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        entered.handle.sender.session().clear_interrupt();
        Ok(())
    })
}

/// The message of this thread's last failing call (empty if none failed yet). Valid until the
/// next shmbroker call on this thread. Each thread has its own.
#[unsafe(no_mangle)]
pub extern "C" fn shmbroker_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// The rank this thread's last failing call named (the peer that died, left, never came, sent
/// bad bytes or disagreed; the first rank a timeout waited for), or -1 when it named none.
#[unsafe(no_mangle)]
pub extern "C" fn shmbroker_last_error_rank() -> i64 {
    LAST_RANK.with(std::cell::Cell::get)
}

/// Leaves the session and frees it (`SHMBROKER_OK` for NULL). Peers still waiting on this rank
/// are told it left. While a call is in progress on another thread it returns `SHMBROKER_E_BUSY`
/// and frees nothing: end that call with [`shmbroker_interrupt`], wait for it to return, and
/// close again.
///
/// # Safety
///
/// `s` is null or a live session, not used again once this call returns `SHMBROKER_OK`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_close(s: *mut shmbroker_session) -> c_int {
    guard("shmbroker_close", || {
        // SAFETY: null or a live session, per the contract.
        let Some(handle) = (unsafe { s.as_ref() }) else {
            return Ok(());
        };
        if let Err(calls) =
            handle
                .calls
                .compare_exchange(0, CLOSING, Ordering::Acquire, Ordering::Relaxed)
        {
            return Err(if calls == CLOSING {
                misuse("the session is already being closed")
            } else {
                Failure(
                    SHMBROKER_E_BUSY,
                    format!(
                        "{calls} call(s) on other threads are in progress on this session: end \
                         them (shmbroker_interrupt), wait for them to return, then close"
                    ),
                    None,
                )
            });
        }
        // SAFETY: a pointer made by Box::into_raw in `give`; no call is in it and none can enter
        // (`calls` is CLOSING), so it is taken back once.
        let handle = unsafe { Box::from_raw(s) };
        // Dropping logs off (a panic there is caught by `guard`).
        drop(handle);
        Ok(())
    })
}

#[cfg(test)]
#[allow(
    clippy::multiple_unsafe_ops_per_block,
    reason = "each block is a C caller's sequence of calls, under the one SAFETY comment above it"
)]
mod tests;
