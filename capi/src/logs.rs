//! Where the library's log events go: `shmbroker_set_log`.

use crate::error::{guard, misuse};
use shmbroker::logging::{Level, Sink, set_sink};
use std::ffi::{CString, c_char, c_int, c_void};
use std::io::Write;

/// No log events (the default: a C program hears nothing until it calls [`shmbroker_set_log`]).
pub const SHMBROKER_LOG_OFF: c_int = 0;
/// Something failed.
pub const SHMBROKER_LOG_ERROR: c_int = 1;
/// Something went wrong and was worked around (fds through the broker's relay because the
/// kernel refused `pidfd_getfd`, a refused logon or notice at the broker).
pub const SHMBROKER_LOG_WARN: c_int = 2;
/// What the broker and sessions did: logons, departures, deaths, the fd transport.
pub const SHMBROKER_LOG_INFO: c_int = 3;
/// Details for debugging shmbroker.
pub const SHMBROKER_LOG_DEBUG: c_int = 4;
/// More details.
pub const SHMBROKER_LOG_TRACE: c_int = 5;

/// A log callback: `level` is a `SHMBROKER_LOG_*` level, `target` the module that logged (such
/// as `shmbroker::session::fds`) and `message` one line; both strings are valid only during the
/// call.
pub type shmbroker_log_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        level: c_int,
        target: *const c_char,
        message: *const c_char,
    ),
>;

/// The caller's `user` pointer, handed back to its callback.
struct User(*mut c_void);
// SAFETY: `shmbroker_set_log`'s contract: the callback may be called on any thread, at the same
// time on several, with this pointer; the caller made it safe for that.
unsafe impl Send for User {}
// SAFETY: as above.
unsafe impl Sync for User {}

impl User {
    /// The pointer (a method, so that a closure captures the whole `User`, not its field).
    fn get(&self) -> *mut c_void {
        self.0
    }
}

/// Sends the library's log events at `max_level` or more severe (`SHMBROKER_LOG_ERROR` ...
/// `SHMBROKER_LOG_TRACE`) to `log`, or as lines on stderr when `log` is NULL
/// (`shmbroker WARN shmbroker::session::fds: fd transport: ...`); `SHMBROKER_LOG_OFF` stops
/// them. Each call replaces what the last one set. Events are rare (none is on a message's
/// path): the fd transport a session uses (a warning when it falls back to the broker's relay),
/// and, in the process that hosts a broker, logons, departures, deaths and refusals.
///
/// `log` is called on whichever thread logged (the caller's, a session's watcher thread, the
/// broker's threads), possibly on several at once, with `user`; it must be thread-safe, return
/// promptly (a broker thread waits for it) and call no shmbroker function. Threads: any.
///
/// Errors: `SHMBROKER_E_MISUSE` for a level out of range, or when the process already has a
/// Rust `tracing` subscriber (the events go there).
///
/// # Safety
///
/// `log` is NULL or a function of this signature that stays callable, with `user`, until a later
/// call replaces it or the process ends.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_set_log(
    max_level: c_int,
    log: shmbroker_log_fn,
    user: *mut c_void,
) -> c_int {
    guard("shmbroker_set_log", || {
        let max = match max_level {
            SHMBROKER_LOG_OFF => return Ok(set_sink(Level::Error, None)?),
            SHMBROKER_LOG_ERROR => Level::Error,
            SHMBROKER_LOG_WARN => Level::Warn,
            SHMBROKER_LOG_INFO => Level::Info,
            SHMBROKER_LOG_DEBUG => Level::Debug,
            SHMBROKER_LOG_TRACE => Level::Trace,
            other => {
                return Err(misuse(format!(
                    "log level {other}: expected SHMBROKER_LOG_OFF (0) to SHMBROKER_LOG_TRACE (5)"
                )));
            }
        };
        let sink: Sink = match log {
            None => Box::new(|level, target, message| {
                let line = format!("shmbroker {} {target}: {message}\n", name(level));
                // One write per line, so lines from two threads never interleave; a stderr
                // that fails is no reason to fail the library.
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
            }),
            Some(log) => {
                let user = User(user);
                Box::new(move |level, target, message| {
                    let target = c_string(target);
                    let message = c_string(message);
                    // SAFETY: a callback of this signature that stays callable with `user`, and
                    // is thread-safe (this function's contract); both strings live until it
                    // returns.
                    unsafe {
                        log(
                            user.get(),
                            level as c_int,
                            target.as_ptr(),
                            message.as_ptr(),
                        )
                    };
                })
            }
        };
        Ok(set_sink(max, Some(sink))?)
    })
}

/// The level's name on a stderr line.
fn name(level: Level) -> &'static str {
    match level {
        Level::Error => "ERROR",
        Level::Warn => "WARN",
        Level::Info => "INFO",
        Level::Debug => "DEBUG",
        Level::Trace => "TRACE",
    }
}

/// `text` for C, with any NUL (which would end it early) shown as `\0`.
fn c_string(text: &str) -> CString {
    CString::new(text.replace('\0', "\\0")).unwrap_or_default()
}
