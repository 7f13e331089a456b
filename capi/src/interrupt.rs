//! Ending the waits in progress on a session (async-signal-safe), and forgetting an
//! interrupt no wait took.

use crate::error::guard;
use crate::handle::{enter, peek, shmbroker_session};
use crate::{SHMBROKER_E_MISUSE, SHMBROKER_OK};
use std::ffi::c_int;

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
