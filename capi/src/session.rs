//! Making a session (`shmbroker_connect`, `shmbroker_from_env`) and asking what it is.

use crate::error::{Failure, guard, misuse};
use crate::handle::{enter, give, peek, shmbroker_session};
#[cfg(doc)]
use crate::{SHMBROKER_TIMEOUT_FOREVER, shmbroker_barrier};
use shmbroker::Session;
use std::ffi::{CStr, c_char, c_int};
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

pub(crate) fn timeout_of(timeout_ms: u64) -> Result<Duration, Failure> {
    if timeout_ms == 0 {
        return Err(misuse("timeout_ms is 0: every call needs a deadline"));
    }
    if timeout_ms == crate::SHMBROKER_TIMEOUT_FOREVER {
        return Ok(Duration::MAX);
    }
    Ok(Duration::from_millis(timeout_ms))
}

/// Logs on to the broker listening at `path` as `rank` (-1: any free rank), within `timeout_ms`
/// milliseconds, which is also every later call's deadline ([`SHMBROKER_TIMEOUT_FOREVER`]: no
/// deadline; deaths and departures still end a wait). On success `*out` is the session.
///
/// Nothing is sent to a broker that runs as another user than this process's (or root): that is
/// `SHMBROKER_E_LOGON` naming its uid, unless `SHMBROKER_BROKER_UID` names it.
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
/// the README), within `timeout_ms` milliseconds, which is also every later call's deadline
/// ([`SHMBROKER_TIMEOUT_FOREVER`]: no deadline).
///
/// The socket lies in a directory private to this user (`shmbroker-<uid>` under
/// `$XDG_RUNTIME_DIR` or the temp dir), checked before use; one that another user owns, or a
/// broker of another user, is `SHMBROKER_E_LOGON` naming what was found.
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

/// How many processes held this session's rank before it in the job: 0 for the job's first,
/// `n` for the `n`th replacement of a rank that died (a process that rejoined; its world's
/// collectives are over: make a group). 0 for a NULL session. Any thread, any time.
///
/// # Safety
///
/// `s` is null or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_rejoins(s: *const shmbroker_session) -> u32 {
    // SAFETY: null or a live session, per the contract.
    unsafe { peek(s, 0, |s| s.sender.rejoins()) }
}

/// Waits until rank `rank` is there, up to `timeout_ms` milliseconds
/// (`SHMBROKER_TIMEOUT_FOREVER`: no deadline): at once if its process is alive; if it died,
/// until a replacement rejoins the job, which this session then takes on. Messages with it
/// work afterwards; make a new group for collectives.
///
/// Errors: `SHMBROKER_E_TIMEOUT` when no replacement came in time; `SHMBROKER_E_PEER_LEFT` or
/// `SHMBROKER_E_PEER_NEVER_JOINED` for a rank nobody replaces; `SHMBROKER_E_BROKER_LOST`;
/// `SHMBROKER_E_MISUSE` for a rank out of range, this session's own, or a `timeout_ms` of 0.
/// Threads: as [`shmbroker_barrier`](crate::shmbroker_barrier).
///
/// # Safety
///
/// `s` is null or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_wait_for_rank(
    s: *mut shmbroker_session,
    rank: u32,
    timeout_ms: u64,
) -> c_int {
    guard("shmbroker_wait_for_rank", || {
        let timeout = timeout_of(timeout_ms)?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        Ok(entered
            .handle
            .sender
            .session()
            .with_timeout(timeout)
            .wait_for_rank(rank)?)
    })
}

/// Sets the deadline of every later call on the session, from any thread: `timeout_ms`
/// milliseconds, or [`SHMBROKER_TIMEOUT_FOREVER`] for none. A call already waiting (on any
/// thread) keeps the deadline it started with. Threads: as [`shmbroker_barrier`] (it waits for
/// a send or collective in progress on another thread to finish).
///
/// Errors: `SHMBROKER_E_MISUSE` for a NULL session or a `timeout_ms` of 0.
///
/// # Safety
///
/// `s` is null or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_set_timeout(
    s: *mut shmbroker_session,
    timeout_ms: u64,
) -> c_int {
    guard("shmbroker_set_timeout", || {
        let timeout = timeout_of(timeout_ms)?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        entered.handle.sender.set_timeout(timeout);
        Ok(())
    })
}
