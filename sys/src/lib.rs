//! The Linux primitives shmbroker is built on, each written once and used by every crate above:
//!
//! * [`eventfd`]: a counter fd that `poll` and `epoll` see, signalled across processes;
//! * [`futex`]: wait on and wake a 32-bit word of shared memory;
//! * [`pidfd`]: an fd for a process (`pidfd_open`), and a copy of one of its fds
//!   (`pidfd_getfd`);
//! * [`fdpass`]: bytes with fds attached over a UNIX socket (`SCM_RIGHTS`);
//! * [`TempDir`]: a private directory for sockets, removed with its contents (for the command,
//!   the benchmarks and the tests; the `shmbroker` crate re-exports the four modules above, not
//!   this).
//!
//! Sealed memfds and their mappings live in `shmbroker_queues::memfd`, beside the ring whose
//! validation errors (missing seals, not shared memory) they report.

pub mod eventfd;
pub mod fdpass;
pub mod futex;
pub mod pidfd;
mod tempdir;

pub use tempdir::TempDir;
