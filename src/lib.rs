//! shmbroker: single-node inter-process communication.
//!
//! Processes on one machine that must meet, share memory and synchronise get, from one broker
//! round trip, sealed shared-memory rings and everything else they need, and then talk worker to
//! worker at memory speed. This crate is the facade over the workspace's layers:
//!
//! | module | what it is |
//! |---|---|
//! | [`bindings`] | every type that crosses a process boundary (`#[repr(C)]`, `Pod`, size-asserted) |
//! | [`queues`] | the lock-free SPSC ring in a sealed memfd, with spin-then-futex parking |
//! | [`allocator`] | per-worker outboxes only their owner can write: private allocator and acknowledgement ledger, bounds-checked references, loans |
//! | [`handshake`] | the broker's [`Listener`](handshake::Listener) and [`connect`](handshake::connect) |
//! | [`session`] | [`Session`]: barrier, all-gather, broadcast, send/recv, fd and GPU-handle exchange, worker to worker |
//! | [`launch`] | where a worker stands under Open MPI, MPICH, torchrun or Slurm, for [`Session::from_env`] |
//! | [`process`] | starting helper processes that inherit ring fds, and waiting for them with a deadline |
//!
//! ```
//! use shmbroker::queues::{Consumer, Producer, create};
//! use std::os::fd::AsFd;
//! use std::time::Duration;
//!
//! let fd = create::<[u64; 2]>(256)?;
//! let mut tx = Producer::<[u64; 2]>::join(fd.as_fd())?;
//! let mut rx = Consumer::<[u64; 2]>::join(fd.as_fd())?;
//! tx.send_timeout([1, 2], Duration::from_secs(1)).unwrap();
//! assert_eq!(rx.recv_timeout(Duration::from_secs(1)), Ok([1, 2]));
//! # Ok::<(), shmbroker::queues::Error>(())
//! ```

#![warn(missing_docs)]

pub mod launch;
pub mod process;
pub mod session;

pub use session::{Error, Session};

pub use shmbroker_allocator as allocator;
pub use shmbroker_bindings as bindings;
pub use shmbroker_handshake as handshake;
pub use shmbroker_queues as queues;
