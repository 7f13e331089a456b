//! Failures: the code and message a call returns, this thread's last error and the rank it
//! names, and the guard that keeps a panic from crossing the boundary.

use crate::{
    SHMBROKER_E_BROKER_LOST, SHMBROKER_E_CLOSED, SHMBROKER_E_INTERNAL, SHMBROKER_E_INTERRUPTED,
    SHMBROKER_E_IO, SHMBROKER_E_LOGON, SHMBROKER_E_MISUSE, SHMBROKER_E_PEER_GAVE_UP,
    SHMBROKER_E_PEER_LEFT, SHMBROKER_E_PEER_LOST, SHMBROKER_E_PEER_NEVER_JOINED,
    SHMBROKER_E_PEER_REJOINED, SHMBROKER_E_PROTOCOL, SHMBROKER_E_TIMEOUT, SHMBROKER_E_TOO_SMALL,
    SHMBROKER_OK,
};
use shmbroker::{Error, ErrorKind};
use std::cell::RefCell;
use std::ffi::{CString, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// The rank this thread's last failure named, or -1.
    static LAST_RANK: std::cell::Cell<i64> = const { std::cell::Cell::new(-1) };
}

/// A failure: its code, its message, and the rank it names (if any).
pub(crate) struct Failure(pub(crate) c_int, pub(crate) String, pub(crate) Option<u32>);

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        // One to one with the library's table (`shmbroker::ErrorKind`).
        let code = match error.kind() {
            ErrorKind::PeerLost => SHMBROKER_E_PEER_LOST,
            ErrorKind::PeerRejoined => SHMBROKER_E_PEER_REJOINED,
            ErrorKind::PeerLeft => SHMBROKER_E_PEER_LEFT,
            ErrorKind::PeerNeverJoined => SHMBROKER_E_PEER_NEVER_JOINED,
            ErrorKind::PeerGaveUp => SHMBROKER_E_PEER_GAVE_UP,
            ErrorKind::Timeout => SHMBROKER_E_TIMEOUT,
            ErrorKind::BrokerLost => SHMBROKER_E_BROKER_LOST,
            ErrorKind::Logon => SHMBROKER_E_LOGON,
            ErrorKind::BufferTooSmall => SHMBROKER_E_TOO_SMALL,
            ErrorKind::Misuse => SHMBROKER_E_MISUSE,
            ErrorKind::Resource => SHMBROKER_E_IO,
            ErrorKind::Interrupted => SHMBROKER_E_INTERRUPTED,
            ErrorKind::Protocol => SHMBROKER_E_PROTOCOL,
            ErrorKind::ChannelClosed => SHMBROKER_E_CLOSED,
            // A kind added later than this ABI: the nearest code it has.
            _ => SHMBROKER_E_PROTOCOL,
        };
        Failure(code, error.to_string(), error.rank())
    }
}

pub(crate) fn misuse(message: impl Into<String>) -> Failure {
    Failure(SHMBROKER_E_MISUSE, message.into(), None)
}

pub(crate) fn set_last_error(message: &str, rank: Option<u32>) {
    LAST_RANK.with(|last| last.set(rank.map_or(-1, i64::from)));
    // A NUL inside the message would cut it short in C: replace it.
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
}

/// Runs `call`, turning its failure or panic into a code and this thread's last error.
pub(crate) fn guard(name: &str, call: impl FnOnce() -> Result<(), Failure>) -> c_int {
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

/// The message of this thread's last failing call (empty if none failed yet). Valid until the
/// next shmbroker call on this thread. Each thread has its own.
#[unsafe(no_mangle)]
pub extern "C" fn shmbroker_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// The rank this thread's last failing call named (the peer that died, left, never came, sent
/// bad bytes or disagreed; for a timeout, the stopped rank its wait leads to if it found one,
/// else the first rank it waited for), or -1 when it named none.
#[unsafe(no_mangle)]
pub extern "C" fn shmbroker_last_error_rank() -> i64 {
    LAST_RANK.with(std::cell::Cell::get)
}
