//! The C ABI of shmbroker: `capi/include/shmbroker.h`, generated from this crate by cbindgen.
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
//! - Every blocking call has a deadline: the session's (given at connect, changed by
//!   `shmbroker_set_timeout`), or its own for the `_timeout` forms of the waits a server makes
//!   (`shmbroker_send_timeout`, `shmbroker_recv_timeout`, `shmbroker_recv_any_timeout`,
//!   `shmbroker_probe_timeout`, `shmbroker_barrier_timeout`). `SHMBROKER_TIMEOUT_FOREVER` is
//!   none: deaths, departures and interrupts still end the wait.
//!
//! # Threads
//!
//! A session handle may be called from any number of threads at once, with no undefined
//! behaviour and nothing lost. Inside, it is a [`Sender`] and a [`Receiver`] (a split session):
//!
//! - sends and collectives run one at a time (a second waits for the first to finish);
//! - one receive (`shmbroker_recv`, `shmbroker_recv_any`, `shmbroker_probe`,
//!   `shmbroker_recv_loan`) runs at a time; a receive called while another thread's is in
//!   progress returns `SHMBROKER_E_BUSY` at once;
//! - **a receive never waits behind a send**: a send (`shmbroker_send`), and the root's side
//!   of a world broadcast of up to `SHMBROKER_FLAT_BROADCAST_MAX` ranks (`shmbroker_broadcast`),
//!   hold nothing while they wait for a slow peer's room, and a receive holds nothing while it
//!   waits for a message or its next chunk. So a response thread in `shmbroker_recv_any` takes
//!   a fast worker's reply while the main thread's broadcast waits for a slow one;
//! - other collectives hold the session while they wait: a receive on another thread waits
//!   for them to end, and they wait for a receive part way through a message to end (a
//!   collective takes messages out of the queues that receive reads);
//! - `shmbroker_interrupt` (async-signal-safe) ends another thread's wait with
//!   `SHMBROKER_E_INTERRUPTED`; `shmbroker_close` while a call is in progress on another thread
//!   returns `SHMBROKER_E_BUSY` and frees nothing, so interrupt, wait for that thread's call to
//!   return, then close.
//!
//! A handle used after `shmbroker_close` returned `SHMBROKER_OK` is freed memory, as for any C
//! object. Limits, each bounded by the deadline (see `capi/README.md`): an interrupt does not
//! end a transfer in the middle of a large message; a collective (other than the broadcast root
//! above) holds the session while it waits, so a message larger than its sender's outbox sent to
//! this rank meanwhile waits for the collective to end.

#![allow(non_camel_case_types)]

// cbindgen writes the functions in the order it reads the modules, so they are declared in the
// header's order; a comment above each keeps rustfmt from sorting them.
// shmbroker_connect, shmbroker_from_env, shmbroker_rank, shmbroker_world_size,
// shmbroker_set_timeout
mod session;
// shmbroker_barrier, shmbroker_all_gather, shmbroker_broadcast, shmbroker_gather
mod collectives;
// shmbroker_all_reduce, shmbroker_reduce, shmbroker_reduce_scatter, shmbroker_scatter,
// shmbroker_all_to_all, shmbroker_all_to_all_v
mod reductions;
// shmbroker_group_create, shmbroker_shrink, shmbroker_group_rank, shmbroker_group_size,
// shmbroker_group_world_rank, shmbroker_group_free
mod groups;
// shmbroker_send(_timeout), shmbroker_recv(_timeout), shmbroker_recv_any(_timeout),
// shmbroker_try_recv*, shmbroker_probe(_timeout),
// shmbroker_readiness_fd
mod point_to_point;
// shmbroker_loan_create, shmbroker_send_loan, shmbroker_loan_free, shmbroker_recv_loan,
// shmbroker_broadcast_loan, shmbroker_lend_ref, shmbroker_view_loan_ref, shmbroker_loan_view_free
mod loans;
// shmbroker_channel_to, shmbroker_channel_from, shmbroker_channel_(try_)send(_batch),
// shmbroker_channel_(try_)recv(_batch), shmbroker_channel_tx_free, shmbroker_channel_rx_free
mod channels;
// shmbroker_exchange_fds, shmbroker_broadcast_fd, shmbroker_exchange_fd_batch,
// shmbroker_broadcast_fd_batch
mod fds;
// shmbroker_gpu_handle, shmbroker_all_gather_gpu_handles, shmbroker_broadcast_gpu_handle
mod gpu;
// shmbroker_interrupt, shmbroker_clear_interrupt
mod interrupt;
// shmbroker_set_log and its levels
mod logs;
// shmbroker_status
mod status;
// shmbroker_last_error, shmbroker_last_error_rank; the guard every call runs in
mod error;
// shmbroker_session and shmbroker_close
mod handle;
// Pointers and lengths from C as slices
mod buffer;

#[cfg(test)]
#[allow(
    clippy::multiple_unsafe_ops_per_block,
    reason = "each block is a C caller's sequence of calls, under the one SAFETY comment above it"
)]
mod tests;

pub use channels::*;
pub use collectives::*;
pub use error::{shmbroker_last_error, shmbroker_last_error_rank};
pub use fds::*;
pub use gpu::*;
pub use groups::*;
pub use handle::{shmbroker_close, shmbroker_session};
pub use interrupt::{shmbroker_clear_interrupt, shmbroker_interrupt};
pub use loans::*;
pub use logs::*;
pub use point_to_point::*;
pub use reductions::*;
pub use session::{
    shmbroker_connect, shmbroker_from_env, shmbroker_rank, shmbroker_set_timeout,
    shmbroker_world_size,
};
pub use status::shmbroker_status;

#[cfg(doc)]
use shmbroker::{Receiver, Sender};
use std::ffi::c_int;

/// A `timeout_ms` that means no deadline: calls wait for as long as it takes. A peer's death or
/// departure, a dead broker and `shmbroker_interrupt` still end the wait.
pub const SHMBROKER_TIMEOUT_FOREVER: u64 = u64::MAX;

/// Success.
pub const SHMBROKER_OK: c_int = 0;
/// A peer this call needed died (its process ended without leaving); also a logon or an fd
/// relay that saw it die. Every code is one kind of the library's one table of errors
/// (`shmbroker::ErrorKind`), as every Python exception class is.
pub const SHMBROKER_E_PEER_LOST: c_int = -1;
/// A peer this call needed left the session on purpose.
pub const SHMBROKER_E_PEER_LEFT: c_int = -2;
/// The deadline passed; the message names the ranks still waited for.
pub const SHMBROKER_E_TIMEOUT: c_int = -3;
/// A peer sent bytes no correct peer sends, corrupted a ring, or called another collective.
pub const SHMBROKER_E_PROTOCOL: c_int = -4;
/// A mistake in the calling program: a null pointer, a short buffer, a rank out of range.
pub const SHMBROKER_E_MISUSE: c_int = -5;
/// The operating system refused something the call needed (memory, fds, a system call), or the
/// broker would not pass an fd on.
pub const SHMBROKER_E_IO: c_int = -6;
/// The broker is gone, and this call (a logon or an fd relay too) needed it.
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
/// next receive, whole even when the interrupt came between its chunks. (A send whose large
/// message had started going out returns `SHMBROKER_OK` instead, and the next call finishes it
/// and then returns this.) The session goes on.
pub const SHMBROKER_E_INTERRUPTED: c_int = -12;
/// The message is longer than the buffer given: `*len` is its length, and it is kept, whole, for
/// the next receive from its sender.
pub const SHMBROKER_E_TOO_SMALL: c_int = -13;

/// A `shmbroker_try_*` call found nothing waiting. Nothing was taken; not an error.
pub const SHMBROKER_E_AGAIN: c_int = -14;

/// A receive from any peer: the peer `shmbroker_last_error_rank` names died and a new process
/// took its place (it rejoined the job). Reported once, after the `SHMBROKER_E_PEER_LOST` for
/// the dead process; messages with it work again from now on, numbered afresh. Collectives of
/// groups it was in are over: make a new group (see `shmbroker_wait_for_rank`).
pub const SHMBROKER_E_PEER_REJOINED: c_int = -15;

/// A peer this collective waits for (`shmbroker_last_error_rank`) failed its own part of it and
/// left it (its deadline passed, a peer sent it bad bytes, an interrupt ended it), so this call
/// fails at once instead of at its deadline; the message names the rank that peer's own error
/// named, as its word.
pub const SHMBROKER_E_PEER_GAVE_UP: c_int = -16;

/// The other end of a typed channel (`shmbroker_last_error_rank`) closed it; what it sent
/// before was received first.
pub const SHMBROKER_E_CLOSED: c_int = -17;

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
