//! Ctrl-C during a call: a SIGINT ends the main thread's pending call, and Python's own handler
//! then runs (normally raising `KeyboardInterrupt`), unless the call succeeded.
//!
//! Python handles a signal in two steps: its C handler only records it, and the Python-level
//! handler runs later, on the main thread, between bytecodes. A call waiting in the library with
//! the GIL released runs no bytecode, so on its own it would wait out its deadline. So during a
//! main-thread call this module's handler sits in front of Python's: it asks the session's
//! [`Interrupter`] to end the wait (async-signal-safe: atomics, `futex` and `write`) and notes
//! that a SIGINT came, but does not pass it on yet.
//!
//! The arming covers the whole call, from before its first look for a SIGINT to its return, and
//! not only its waits. Python looks for signals as a call returns, before the caller stores
//! the result: a SIGINT recorded while a receive makes its `bytes` (a 256 MiB copy, say) would
//! raise there and throw the message away. Held back instead, it reaches Python only once the
//! call has decided ([`Armed::disarm`] says whether one came):
//!
//! - the call failed (ended by the interrupt, stopped by it before taking anything, or failed
//!   for anything else): the caller passes the SIGINT on at once ([`deliver`], which calls the
//!   handler ours displaced, outside signal context), and `check_signals` runs the Python
//!   handler;
//! - the call succeeded (a receive that took its message, a large send that is reported sent
//!   once under way, see `Session::interrupter`): passing the SIGINT on would make Python raise
//!   as the call returns and throw its result away (a program that retried would lose a
//!   message, or send one twice). So it is kept ([`defer`]) and passed on at the start of the
//!   next call, which raises `KeyboardInterrupt` before doing anything. A second Ctrl-C
//!   between calls reaches Python's handler directly, as usual.
//!
//! A SIGINT that reached Python's handler before the call was armed is raised by the call's
//! first look (`check_signals`), before it takes anything. What is left is Python's own window
//! for any function: a SIGINT that comes after the disarming, in the last instructions before
//! the result reaches the interpreter, raises there.
//!
//! The handler is (re)installed at the start of each main-thread call, in front of whatever
//! handler is there then, so a program that sets its own SIGINT handler with `signal.signal`
//! keeps it (it runs after ours). When the disposition is `SIG_DFL` or `SIG_IGN`, nothing is
//! installed: Ctrl-C then kills the process or does nothing, as Python would have it.
//!
//! # Why the handler never touches a freed interrupter
//!
//! The armed call publishes a pointer to its interrupter in [`CURRENT`] and, when it is over,
//! takes it back and waits until no handler is between loading it and finishing with it
//! ([`IN_HANDLER`], incremented before the load and decremented after the use, all `SeqCst`). A
//! handler that loaded the pointer counted itself first, so the caller sees the count and waits;
//! one that counted itself after the caller took the pointer back loads null, and passes the
//! SIGINT straight on.

use shmbroker::session::Interrupter;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

/// The interrupter of the main thread's armed call, or null.
static CURRENT: AtomicPtr<Interrupter> = AtomicPtr::new(std::ptr::null_mut());
/// Handlers between loading [`CURRENT`] and finishing with what it pointed to.
static IN_HANDLER: AtomicUsize = AtomicUsize::new(0);
/// The handler ours displaced (a `sa_handler` or `sa_sigaction` address) and whether it takes
/// three arguments (`SA_SIGINFO`).
static PREVIOUS: AtomicUsize = AtomicUsize::new(0);
static PREVIOUS_SIGINFO: AtomicBool = AtomicBool::new(false);
/// A SIGINT came during the armed call and has not been passed on.
static CAUGHT: AtomicBool = AtomicBool::new(false);
/// A SIGINT that came during a call that succeeded, to pass on at the start of the next call.
static DEFERRED: AtomicBool = AtomicBool::new(false);

/// While alive, a SIGINT interrupts `interrupter`'s session (see the module docs).
pub struct Armed(());

impl Armed {
    /// Installs the handler in front of the current one if that is a function, and publishes
    /// `interrupter` until the returned value is dropped. `None` when there is nothing to do
    /// (SIGINT is ignored or kills the process, or the handler could not be read).
    pub fn arm(interrupter: &Interrupter) -> Option<Self> {
        install()?;
        // Left set only by a call that panicked; no SIGINT is held while nothing is armed.
        CAUGHT.store(false, Ordering::SeqCst);
        CURRENT.store(std::ptr::from_ref(interrupter).cast_mut(), Ordering::SeqCst);
        Some(Self(()))
    }
}

impl Armed {
    /// Ends the arming: from now on a SIGINT goes straight to the displaced handler. Whether one
    /// came while armed and was held back (the caller passes it on or defers it).
    pub fn disarm(self) -> bool {
        drop(self);
        CAUGHT.swap(false, Ordering::SeqCst)
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        CURRENT.store(std::ptr::null_mut(), Ordering::SeqCst);
        while IN_HANDLER.load(Ordering::SeqCst) != 0 {
            std::hint::spin_loop();
        }
    }
}

/// Whether a SIGINT came since the call was armed (it stays held for [`Armed::disarm`]): a
/// call that has taken nothing yet stops instead of going on.
pub fn caught() -> bool {
    CAUGHT.load(Ordering::SeqCst)
}

/// Ends a call that was armed: `caught` says whether a SIGINT came meanwhile (from
/// [`Armed::disarm`]). A result is never thrown away for it: a success keeps it for the next
/// call; a failure passes it on, and, when the failure is the interrupt's (`interrupted`), runs
/// Python's handler for it (`KeyboardInterrupt`), which raises in its place.
pub fn settle<T>(
    py: pyo3::Python<'_>,
    caught: bool,
    interrupted: bool,
    result: pyo3::PyResult<T>,
) -> pyo3::PyResult<T> {
    match result {
        Ok(value) => {
            if caught {
                defer();
            }
            Ok(value)
        }
        Err(error) => {
            if caught {
                deliver();
            }
            if interrupted {
                // If the handler raises nothing, the call still did not finish.
                py.check_signals()?;
            }
            Err(error)
        }
    }
}

/// Keeps a SIGINT that came during a call that succeeded, for [`take_deferred`].
pub fn defer() {
    DEFERRED.store(true, Ordering::SeqCst);
}

/// Whether a SIGINT was deferred by an earlier call (and forgets it): the caller then
/// [`deliver`]s it before doing anything.
pub fn take_deferred() -> bool {
    DEFERRED.swap(false, Ordering::SeqCst)
}

/// Passes a held-back SIGINT on to the handler ours displaced (Python's records it, and runs the
/// Python handler at the caller's next `check_signals`). Called outside signal context, on the
/// main thread.
pub fn deliver() {
    // SAFETY: an all-zero siginfo is a valid value; only its signal number is filled in.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    info.si_signo = libc::SIGINT;
    pass_on(libc::SIGINT, &raw mut info, std::ptr::null_mut());
}

/// Runs the handler ours displaced, if it is a function.
fn pass_on(signal: c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let previous = PREVIOUS.load(Ordering::SeqCst);
    if previous == 0 || previous == libc::SIG_DFL || previous == libc::SIG_IGN {
        return;
    }
    if PREVIOUS_SIGINFO.load(Ordering::SeqCst) {
        // SAFETY: `previous` is the sa_sigaction of a handler installed with SA_SIGINFO.
        let handler: extern "C" fn(c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(previous) };
        handler(signal, info, context);
    } else {
        // SAFETY: `previous` is the sa_handler of a handler installed without SA_SIGINFO.
        let handler: extern "C" fn(c_int) = unsafe { std::mem::transmute(previous) };
        handler(signal);
    }
}

/// Puts [`on_sigint`] in front of SIGINT's handler unless it is there already; `None` when the
/// disposition is not a function.
fn install() -> Option<()> {
    // SAFETY: an all-zero sigaction is a valid value to be filled in.
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: reads SIGINT's disposition into `current`; a null new action changes nothing.
    if unsafe { libc::sigaction(libc::SIGINT, std::ptr::null(), &raw mut current) } != 0 {
        return None;
    }
    let ours = on_sigint as extern "C" fn(c_int, *mut libc::siginfo_t, *mut libc::c_void);
    if current.sa_sigaction == ours as usize {
        return Some(());
    }
    if current.sa_sigaction == libc::SIG_DFL || current.sa_sigaction == libc::SIG_IGN {
        return None;
    }
    PREVIOUS.store(current.sa_sigaction, Ordering::SeqCst);
    PREVIOUS_SIGINFO.store(current.sa_flags & libc::SA_SIGINFO != 0, Ordering::SeqCst);
    let mut action = current;
    action.sa_sigaction = ours as usize;
    action.sa_flags = (current.sa_flags | libc::SA_SIGINFO) & !libc::SA_RESETHAND;
    // SAFETY: installs a handler that only makes async-signal-safe calls (see `on_sigint`).
    let installed =
        unsafe { libc::sigaction(libc::SIGINT, &raw const action, std::ptr::null_mut()) };
    (installed == 0).then_some(())
}

/// Interrupts the armed call's wait and holds the SIGINT back for the call (see the module
/// docs); with no call armed, runs the displaced handler. Async-signal-safe: atomics, the
/// interrupter's `futex`/`write` calls, and the displaced handler (Python's, which is); errno is
/// kept as it was.
extern "C" fn on_sigint(signal: c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: __errno_location only returns the address of this thread's errno slot.
    let slot = unsafe { libc::__errno_location() };
    // SAFETY: that slot is valid and aligned for the thread's whole life.
    let errno = unsafe { *slot };
    IN_HANDLER.fetch_add(1, Ordering::SeqCst);
    let current = CURRENT.load(Ordering::SeqCst);
    // SAFETY: a non-null `CURRENT` points to the interrupter of a call still in progress: its
    // `Armed` clears the pointer and waits for `IN_HANDLER` to drop to 0 before it ends.
    let held = if let Some(interrupter) = unsafe { current.as_ref() } {
        interrupter.interrupt();
        CAUGHT.store(true, Ordering::SeqCst);
        true
    } else {
        false
    };
    IN_HANDLER.fetch_sub(1, Ordering::SeqCst);
    if !held {
        pass_on(signal, info, context);
    }
    // SAFETY: as above: the slot of this very thread.
    unsafe { *slot = errno };
}
