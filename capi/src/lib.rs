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
//! A session is used by one thread at a time; different sessions are independent.

#![allow(non_camel_case_types)]

use shmbroker::{Error, Session};
use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::os::fd::{BorrowedFd, IntoRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
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

/// A worker's session: opaque, made by `shmbroker_connect` or `shmbroker_from_env`, ended by
/// `shmbroker_close`.
#[derive(Debug)]
pub struct shmbroker_session {
    session: Session,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// A failure: its code and its message.
struct Failure(c_int, String);

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        let code = match &error {
            Error::PeerLost { .. } => SHMBROKER_E_PEER_LOST,
            Error::PeerLeft { .. } => SHMBROKER_E_PEER_LEFT,
            Error::PeerNeverJoined { .. } => SHMBROKER_E_PEER_NEVER_JOINED,
            Error::Timeout { .. } => SHMBROKER_E_TIMEOUT,
            Error::BrokerLost => SHMBROKER_E_BROKER_LOST,
            Error::Logon(_) | Error::Launch(_) => SHMBROKER_E_LOGON,
            Error::Misuse(_) | Error::RankOutOfRange { .. } | Error::BufferTooSmall { .. } => {
                SHMBROKER_E_MISUSE
            }
            Error::Io { .. } | Error::OwnOutbox(_) | Error::FdTransport(_) => SHMBROKER_E_IO,
            _ => SHMBROKER_E_PROTOCOL,
        };
        Failure(code, error.to_string())
    }
}

fn misuse(message: impl Into<String>) -> Failure {
    Failure(SHMBROKER_E_MISUSE, message.into())
}

fn set_last_error(message: &str) {
    // A NUL inside the message would cut it short in C: replace it.
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
}

/// Runs `call`, turning its failure or panic into a code and this thread's last error.
fn guard(name: &str, call: impl FnOnce() -> Result<(), Failure>) -> c_int {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(())) => SHMBROKER_OK,
        Ok(Err(Failure(code, message))) => {
            set_last_error(&format!("{name}: {message}"));
            code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            set_last_error(&format!(
                "{name}: internal error (a bug in shmbroker; close this session): {what}"
            ));
            SHMBROKER_E_INTERNAL
        }
    }
}

/// The session behind `s`, or misuse when it is null.
///
/// # Safety
///
/// `s` is null or a pointer `shmbroker_connect`/`shmbroker_from_env` returned and
/// `shmbroker_close` has not taken, used by no other thread meanwhile.
unsafe fn session<'a>(s: *mut shmbroker_session) -> Result<&'a mut Session, Failure> {
    // SAFETY: per this function's contract, a non-null `s` is a live, unshared session.
    let handle = unsafe { s.as_mut() };
    handle
        .map(|handle| &mut handle.session)
        .ok_or_else(|| misuse("the session is NULL"))
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
    let handle = Box::into_raw(Box::new(shmbroker_session { session }));
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

/// This worker's rank (0 for a NULL session).
///
/// # Safety
///
/// `s` is null or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_rank(s: *const shmbroker_session) -> u32 {
    // SAFETY: null or a live session, per the contract.
    unsafe { s.as_ref() }.map_or(0, |s| s.session.rank())
}

/// Ranks in the world (0 for a NULL session).
///
/// # Safety
///
/// `s` is null or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_world_size(s: *const shmbroker_session) -> u32 {
    // SAFETY: null or a live session, per the contract.
    unsafe { s.as_ref() }.map_or(0, |s| s.session.world_size())
}

/// Waits until every rank has called it.
///
/// # Safety
///
/// `s` is null or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_barrier(s: *mut shmbroker_session) -> c_int {
    guard("shmbroker_barrier", || {
        // SAFETY: null or a live session, per the contract.
        Ok(unsafe { session(s) }?.barrier()?)
    })
}

/// Every rank's `len` bytes, in rank order, into `out` (`len * world_size` bytes). Every rank
/// passes the same `len`.
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
        let session = unsafe { session(s) }?;
        let total = len
            .checked_mul(session.world_size() as usize)
            .ok_or_else(|| misuse(format!("len {len} times the world size overflows")))?;
        // SAFETY: `len` readable bytes at `data`, per the contract.
        let data = unsafe { bytes(data, len, "data") }?;
        // SAFETY: `len * world_size` writable bytes at `out`, per the contract.
        let out = unsafe { bytes_mut(out, total, "out") }?;
        Ok(session.all_gather_into(data, out)?)
    })
}

/// `root`'s `len` bytes into every rank's `buf`: the root's `buf` is what is sent, every other
/// rank's is filled. Every rank passes the same `len`.
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
        // SAFETY: null or a live session, per the contract.
        let session = unsafe { session(s) }?;
        // SAFETY: `len` bytes at `buf`, writable, per the contract.
        let buf = unsafe { bytes_mut(buf, len, "buf") }?;
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

/// Sends `len` bytes to `rank`.
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
        // SAFETY: null or a live session, per the contract.
        let session = unsafe { session(s) }?;
        // SAFETY: `len` readable bytes at `data`, per the contract.
        let data = unsafe { bytes(data, len, "data") }?;
        Ok(session.send(rank, data)?)
    })
}

/// Receives the next message from `rank` into `buf` (`cap` bytes); `*len` is its length. A
/// message longer than `cap` is `SHMBROKER_E_MISUSE` with `*len` set to its length; it is
/// consumed (the next message is intact).
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
    guard("shmbroker_recv", || {
        // SAFETY: null or a live session, per the contract.
        let session = unsafe { session(s) }?;
        if len.is_null() {
            return Err(misuse("len is NULL"));
        }
        // SAFETY: `cap` writable bytes at `buf`, per the contract.
        let buf = unsafe { bytes_mut(buf, cap, "buf") }?;
        let received = match session.recv_into(rank, buf) {
            Ok(received) => received,
            Err(Error::BufferTooSmall { needed, .. }) => {
                // SAFETY: checked non-null above; writable per the contract.
                unsafe { len.write(usize::try_from(needed).unwrap_or(usize::MAX)) };
                return Err(misuse(format!(
                    "rank {rank} sent {needed} bytes; the buffer holds {cap} (the message is \
                     consumed)"
                )));
            }
            Err(error) => return Err(error.into()),
        };
        // SAFETY: checked non-null above; writable per the contract.
        unsafe { len.write(received) };
        Ok(())
    })
}

/// Every rank's `fd`, in rank order, as new fds in `out_fds` (`world_size` entries) that the
/// caller owns and closes; this rank's own slot gets a duplicate of `fd`.
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
        // SAFETY: null or a live session, per the contract.
        let session = unsafe { session(s) }?;
        if out_fds.is_null() {
            return Err(misuse("out_fds is NULL"));
        }
        let fd = borrowed(fd)?;
        let world = session.world_size() as usize;
        // SAFETY: non-null (checked above), and `world_size` writable ints per the contract.
        let out = unsafe { std::slice::from_raw_parts_mut(out_fds, world) };
        let fds = session.exchange_fds(fd)?;
        for (slot, fd) in out.iter_mut().zip(fds) {
            *slot = fd.into_raw_fd();
        }
        Ok(())
    })
}

/// `root`'s `fd` on every rank, as a new fd in `*out_fd` that the caller owns (the root gets a
/// duplicate); `fd` is ignored off the root.
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
        // SAFETY: null or a live session, per the contract.
        let session = unsafe { session(s) }?;
        if out_fd.is_null() {
            return Err(misuse("out_fd is NULL"));
        }
        let fd = if session.rank() == root {
            Some(borrowed(fd)?)
        } else {
            None
        };
        let received = session.broadcast_fd(root, fd)?;
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

/// The message of this thread's last failing call (empty if none failed yet). Valid until the
/// next shmbroker call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn shmbroker_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// Leaves the session and frees it (nothing for NULL). Peers still waiting on this rank are told
/// it left.
///
/// # Safety
///
/// `s` is null or a live session, not used again after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_close(s: *mut shmbroker_session) {
    if s.is_null() {
        return;
    }
    // SAFETY: a pointer made by Box::into_raw in `give`, taken back once, per the contract.
    let handle = unsafe { Box::from_raw(s) };
    // Dropping logs off; a panic there must not cross the boundary either.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(handle)));
}

// The tests drive the ABI as a C program does: a block of calls on one session at a time.
#[cfg(test)]
#[allow(
    clippy::multiple_unsafe_ops_per_block,
    reason = "each block is a C caller's sequence of calls, under the one SAFETY comment above it"
)]
mod tests {
    use super::*;
    use shmbroker::handshake::{Config, Listener};
    use std::ffi::CString;
    use std::ptr::{null, null_mut};

    fn last_error() -> String {
        // SAFETY: the pointer is this thread's, valid until the next call here.
        unsafe { CStr::from_ptr(shmbroker_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    /// A broker for `world` ranks on a thread, and `world` sessions made through the C ABI.
    fn world(world: u32) -> (shmbroker::sys::TempDir, Vec<usize>) {
        let dir = shmbroker::sys::TempDir::new("capi").unwrap();
        let socket = dir.path().join("broker.sock");
        let config = Config {
            world_size: world,
            ..Config::default()
        };
        let mut listener = Listener::bind(&socket, config).unwrap();
        std::thread::spawn(move || listener.serve(|_| {}));
        let path = CString::new(socket.to_str().unwrap()).unwrap();
        let joins: Vec<_> = (0..world)
            .map(|rank| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut s = null_mut();
                    // SAFETY: a NUL-terminated path and a writable out pointer.
                    let rc =
                        unsafe { shmbroker_connect(path.as_ptr(), rank as i32, 10_000, &mut s) };
                    assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                    s as usize
                })
            })
            .collect();
        let sessions = joins.into_iter().map(|j| j.join().unwrap()).collect();
        (dir, sessions)
    }

    #[test]
    fn null_pointers_and_bad_arguments_are_misuse_with_a_message() {
        let mut s = null_mut();
        // SAFETY: each call is given a null pointer on purpose; none is dereferenced.
        unsafe {
            assert_eq!(
                shmbroker_connect(null(), 0, 1000, &mut s),
                SHMBROKER_E_MISUSE
            );
            assert!(last_error().contains("path is NULL"), "{}", last_error());
            let path = CString::new("/nonexistent/broker.sock").unwrap();
            assert_eq!(
                shmbroker_connect(path.as_ptr(), 0, 1000, null_mut()),
                SHMBROKER_E_MISUSE
            );
            assert_eq!(
                shmbroker_connect(path.as_ptr(), -2, 1000, &mut s),
                SHMBROKER_E_MISUSE
            );
            assert!(last_error().contains("rank -2"), "{}", last_error());
            assert_eq!(
                shmbroker_connect(path.as_ptr(), 0, 0, &mut s),
                SHMBROKER_E_MISUSE
            );
            assert_eq!(shmbroker_barrier(null_mut()), SHMBROKER_E_MISUSE);
            assert!(last_error().contains("shmbroker_barrier: the session is NULL"));
            assert_eq!(shmbroker_rank(null()), 0);
            assert_eq!(shmbroker_world_size(null()), 0);
            shmbroker_close(null_mut());
        }
        assert!(s.is_null(), "no session was made");
    }

    #[test]
    fn short_buffers_bad_fds_and_departures_are_reported_naming_the_rank() {
        let (_dir, sessions) = world(2);
        let (a, b) = (
            sessions[0] as *mut shmbroker_session,
            sessions[1] as *mut shmbroker_session,
        );
        let big = [7u8; 100];
        let mut small = [0u8; 10];
        let mut len = 0usize;
        // SAFETY: live sessions, used from this thread only; buffers as long as said.
        unsafe {
            assert_eq!(
                shmbroker_send(b, 0, big.as_ptr().cast(), big.len()),
                SHMBROKER_OK
            );
            assert_eq!(
                shmbroker_send(b, 0, b"next".as_ptr().cast(), 4),
                SHMBROKER_OK
            );
            let rc = shmbroker_recv(a, 1, small.as_mut_ptr().cast(), small.len(), &mut len);
            assert_eq!(rc, SHMBROKER_E_MISUSE);
            assert_eq!(len, 100, "the length needed");
            assert!(
                last_error().contains("rank 1 sent 100 bytes"),
                "{}",
                last_error()
            );
            // The next message is intact.
            let rc = shmbroker_recv(a, 1, small.as_mut_ptr().cast(), small.len(), &mut len);
            assert_eq!((rc, &small[..len]), (SHMBROKER_OK, &b"next"[..]));
            // A null buffer with a length, a null length, a closed fd, a rank out of range.
            assert_eq!(
                shmbroker_recv(a, 1, null_mut(), 5, &mut len),
                SHMBROKER_E_MISUSE
            );
            assert_eq!(
                shmbroker_recv(a, 1, small.as_mut_ptr().cast(), 10, null_mut()),
                SHMBROKER_E_MISUSE
            );
            let mut fds = [0; 2];
            assert_eq!(
                shmbroker_exchange_fds(a, 987_654, fds.as_mut_ptr()),
                SHMBROKER_E_MISUSE
            );
            assert!(last_error().contains("fd 987654"), "{}", last_error());
            assert_eq!(
                shmbroker_send(a, 5, big.as_ptr().cast(), 1),
                SHMBROKER_E_MISUSE
            );
            assert!(last_error().contains("rank 5"), "{}", last_error());
            assert_eq!(
                shmbroker_all_gather(a, big.as_ptr().cast(), 8, null_mut()),
                SHMBROKER_E_MISUSE
            );
            // Rank 1 leaves: rank 0 waiting for it is told, naming it.
            shmbroker_close(b);
            let rc = shmbroker_recv(a, 1, small.as_mut_ptr().cast(), small.len(), &mut len);
            assert_eq!(rc, SHMBROKER_E_PEER_LEFT, "{}", last_error());
            assert!(last_error().contains("rank 1"), "{}", last_error());
            shmbroker_close(a);
        }
    }

    #[test]
    fn collectives_and_fds_move_through_the_c_calls() {
        let (_dir, sessions) = world(2);
        let joins: Vec<_> = sessions
            .into_iter()
            .map(|s| {
                std::thread::spawn(move || {
                    let s = s as *mut shmbroker_session;
                    // SAFETY: a live session, used by this thread only; buffers as long as said.
                    unsafe {
                        let rank = shmbroker_rank(s);
                        let mine = [rank as u8 + 1; 64];
                        let mut all = [0u8; 128];
                        assert_eq!(
                            shmbroker_all_gather(
                                s,
                                mine.as_ptr().cast(),
                                64,
                                all.as_mut_ptr().cast()
                            ),
                            SHMBROKER_OK
                        );
                        assert_eq!((all[0], all[64]), (1, 2));
                        let mut word = if rank == 0 { *b"hello" } else { [0; 5] };
                        assert_eq!(
                            shmbroker_broadcast(s, 0, word.as_mut_ptr().cast(), 5),
                            SHMBROKER_OK
                        );
                        assert_eq!(&word, b"hello");
                        let file = std::fs::File::open("/proc/self/exe").unwrap();
                        let mut fds = [-1; 2];
                        assert_eq!(
                            shmbroker_exchange_fds(
                                s,
                                std::os::fd::AsRawFd::as_raw_fd(&file),
                                fds.as_mut_ptr()
                            ),
                            SHMBROKER_OK,
                            "{}",
                            last_error()
                        );
                        assert!(fds.iter().all(|&fd| fd >= 0));
                        for fd in fds {
                            nix::libc::close(fd);
                        }
                        let mut got = -1;
                        assert_eq!(
                            shmbroker_broadcast_fd(
                                s,
                                1,
                                std::os::fd::AsRawFd::as_raw_fd(&file),
                                &mut got
                            ),
                            SHMBROKER_OK,
                            "{}",
                            last_error()
                        );
                        assert!(got >= 0);
                        nix::libc::close(got);
                        assert_eq!(shmbroker_barrier(s), SHMBROKER_OK);
                        shmbroker_close(s);
                    }
                })
            })
            .collect();
        for join in joins {
            join.join().unwrap();
        }
    }
}
