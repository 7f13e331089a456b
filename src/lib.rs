//! shmbroker: single-node inter-process communication.
//!
//! Processes on one machine that must meet, share memory and synchronise (one process per GPU,
//! a scheduler and its workers, a reader and the workers it feeds) each get a [`Session`] from
//! one broker round trip, then talk worker to worker over sealed shared-memory rings at memory
//! speed: barriers, all-gathers, broadcasts, gathers, messages of any size, zero-copy loans,
//! fd exchange and GPU handle exchange. A peer that dies or leaves turns every call waiting on
//! it into an error naming it; nothing waits past its deadline.
//!
//! ```
//! use shmbroker::{Collectives, Session};
//! use shmbroker::handshake::{Config, Listener};
//! use std::time::Duration;
//!
//! // The broker. Usually `shmbroker serve --workers 2 --socket PATH`, or started for you by
//! // `Session::from_env` under mpirun, torchrun or srun; here a thread.
//! let dir = std::env::temp_dir().join(format!("shmbroker-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let socket = dir.join("broker.sock");
//! let config = Config { world_size: 2, ..Config::default() };
//! let mut broker = Listener::bind(&socket, config)?;
//! let stop = broker.stop_handle();
//! let serving = std::thread::spawn(move || broker.serve(|_| {}));
//!
//! // Two workers. Usually two processes; here two threads.
//! let workers: Vec<_> = (0..2)
//!     .map(|rank| {
//!         let socket = socket.clone();
//!         std::thread::spawn(move || -> Result<Vec<Vec<u8>>, shmbroker::Error> {
//!             let mut session = Session::connect(&socket, Some(rank), Duration::from_secs(10))?;
//!             session.barrier()?;
//!             let everyone = session.all_gather(format!("rank {rank}").as_bytes())?;
//!             if rank == 0 {
//!                 session.send(1, b"ping")?;
//!             } else {
//!                 assert_eq!(session.recv(0)?, b"ping");
//!             }
//!             Ok(everyone)
//!         })
//!     })
//!     .collect();
//! for worker in workers {
//!     assert_eq!(worker.join().unwrap()?, [b"rank 0".to_vec(), b"rank 1".to_vec()]);
//! }
//! stop.stop();
//! serving.join().unwrap()?;
//! std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! More in `examples/` (`cargo run --example hello`, `all_gather`, `fd_sharing`,
//! `gpu_handles`), each run as four real processes.
//!
//! # Defaults and limits
//!
//! - Every blocking call has a deadline: [`session::DEFAULT_TIMEOUT`] unless
//!   [`Session::set_timeout`] or [`Session::with_timeout`] says otherwise.
//! - Messages of any size: up to the eager limit they travel in the ring itself; larger ones
//!   stream through the sender's outbox ([`session::DEFAULT_OUTBOX_BYTES`], or
//!   `SHMBROKER_OUTBOX_BYTES`), which also bounds a loan.
//! - Fds from [`Session::exchange_fds`] and [`Session::broadcast_fd`] are the same open files
//!   as the sender's, so they share its file offset: use `pread`/`pwrite` or `mmap`.
//!
//! # Layers
//!
//! This crate is the facade over the workspace's layers:
//!
//! | module | what it is |
//! |---|---|
//! | [`session`] | [`Session`] and its groups: the collectives of [`Collectives`], send/recv, fd and GPU-handle exchange, worker to worker |
//! | [`launch`] | where a worker stands under Open MPI, MPICH, torchrun or Slurm, for [`Session::from_env`] |
//! | [`logging`] | where log events go for a program with no `tracing` subscriber (the C ABI, Python) |
//! | [`handshake`] | the broker's [`Listener`](handshake::Listener) and [`connect`](handshake::connect) |
//! | [`queues`] | the lock-free SPSC ring in a sealed memfd, with spin-then-futex parking |
//! | [`allocator`] | per-worker outboxes only their owner can write: private allocator and acknowledgement ledger, bounds-checked references, loans |
//! | [`bindings`] | every type that crosses a process boundary (`#[repr(C)]`, `Pod`, size-asserted) |
//! | [`sys`] | the Linux primitives underneath: eventfd, futex, pidfd, `SCM_RIGHTS` |

#![warn(missing_docs)]

mod error;
pub mod launch;
pub mod logging;
pub mod nodes;
pub mod reduce;
pub mod session;
pub mod status;
mod tag;

/// Half-precision floats the reductions combine ([`half::f16`], [`half::bf16`]).
pub use half;
pub use reduce::{DType, Element, ReduceOp};
#[cfg(feature = "tokio")]
pub use session::AsyncReceiver;
pub use session::{
    Collectives, Error, ErrorKind, Group, GroupView, Receiver, Sender, Session, Symmetric, Timed,
};
pub use shmbroker_bindings::{GpuHandle, GpuHandleKind};

pub use shmbroker_allocator as allocator;
pub use shmbroker_bindings as bindings;
pub use shmbroker_handshake as handshake;
pub use shmbroker_queues as queues;

/// The Linux primitives the layers are built on, each written once (from `shmbroker-sys`).
pub mod sys {
    pub use shmbroker_sys::{eventfd, fdpass, futex, pidfd};
}
