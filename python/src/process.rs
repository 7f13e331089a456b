//! Which process and thread a call runs in, without a system call per call: the pid is kept in
//! an atomic that a `pthread_atfork` child handler updates, and whether this is the main thread
//! is worked out once per thread (and again in a fork's child).

use std::cell::Cell;
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};

static PID: AtomicU32 = AtomicU32::new(0);
static REGISTERED: Once = Once::new();

extern "C" fn in_forked_child() {
    // SAFETY: getpid takes nothing and is async-signal-safe, as a fork's child needs.
    PID.store(unsafe { libc::getpid() } as u32, Ordering::Relaxed);
}

/// This process's pid (a fork's child sees its own).
pub fn pid() -> u32 {
    REGISTERED.call_once(|| {
        in_forked_child();
        // SAFETY: registers a handler for the child side only; the handler touches an atomic
        // and calls getpid, both safe in a fork's child. (Registration failing leaves the pid
        // of this process, which only a fork's child would get wrong: then it reads getpid.)
        if unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) } != 0 {
            PID.store(0, Ordering::Relaxed);
        }
    });
    match PID.load(Ordering::Relaxed) {
        // SAFETY: getpid takes nothing.
        0 => (unsafe { libc::getpid() }) as u32,
        pid => pid,
    }
}

thread_local! {
    /// Whether this thread is its process's main thread, and the pid that answer is for.
    static MAIN: Cell<Option<(u32, bool)>> = const { Cell::new(None) };
}

/// Whether this is the main thread (the one Python runs signal handlers on): its thread id is
/// the process id.
pub fn on_main_thread() -> bool {
    let pid = pid();
    MAIN.with(|main| match main.get() {
        Some((known, answer)) if known == pid => answer,
        _ => {
            // SAFETY: gettid takes nothing.
            let answer = (unsafe { libc::gettid() }) as u32 == pid;
            main.set(Some((pid, answer)));
            answer
        }
    })
}
