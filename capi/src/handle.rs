//! The handle a C program holds: a session split into its sending and receiving halves, and
//! the count of calls in progress by which `shmbroker_close` frees nothing while another
//! thread is in a call.

use crate::SHMBROKER_E_BUSY;
use crate::error::{Failure, guard, misuse};
#[cfg(doc)]
use crate::shmbroker_interrupt;
use shmbroker::session::Interrupter;
use shmbroker::{Receiver, Sender, Session};
use std::ffi::c_int;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// A worker's session: opaque, made by `shmbroker_connect` or `shmbroker_from_env`, ended by
/// `shmbroker_close`. Safe to call from several threads at once (see the header's thread rules).
#[derive(Debug)]
pub struct shmbroker_session {
    /// Sends and collectives (the whole session, lent for each call).
    pub(crate) sender: Sender,
    /// Receives, one at a time: a wait sleeps on the session's one readiness eventfd, which has
    /// one waiter.
    pub(crate) receiver: Mutex<Receiver>,
    pub(crate) interrupter: Interrupter,
    /// The session's readiness eventfd (open as long as the session is).
    pub(crate) readiness: RawFd,
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
    pub(crate) fn receiver(&self) -> Result<MutexGuard<'_, Receiver>, Failure> {
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
pub(crate) struct InCall<'a> {
    pub(crate) handle: &'a shmbroker_session,
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
pub(crate) unsafe fn peek<T>(
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

/// Enters a call on the handle `s`: misuse when it is null.
///
/// # Safety
///
/// `s` is null or a pointer `shmbroker_connect`/`shmbroker_from_env` returned that
/// `shmbroker_close` has not freed.
pub(crate) unsafe fn enter<'a>(s: *const shmbroker_session) -> Result<InCall<'a>, Failure> {
    // SAFETY: per this function's contract, a non-null `s` is a live handle.
    let handle = unsafe { s.as_ref() }.ok_or_else(|| misuse("the session is NULL"))?;
    handle
        .enter()
        .ok_or_else(|| misuse("the session is being closed"))
}

/// Stores a new session in `*out`.
///
/// # Safety
///
/// `out` is null or points at a writable `shmbroker_session *`.
pub(crate) unsafe fn give(out: *mut *mut shmbroker_session, session: Session) {
    let handle = Box::into_raw(Box::new(shmbroker_session::new(session)));
    // SAFETY: the caller checked `out` is not null; per the contract it is writable.
    unsafe { out.write(handle) };
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
