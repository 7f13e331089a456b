//! A lock-free single-producer single-consumer ring in a sealed memfd, shared between processes.
//!
//! # What it guarantees
//!
//! * **FIFO, no loss, no duplicates** between one [`Producer`] and one [`Consumer`], across threads
//!   or processes. Checked with loom (`RUSTFLAGS="--cfg loom"`), see the [`ring`](crate) module
//!   docs for the argument.
//! * **One cache line per message** on the hot path: the consumer learns a message is there from a
//!   sequence word in the message's own slot; the producer re-reads the consumer's cursor only
//!   when its cached copy says the ring is full.
//! * **Batching**: [`Producer::try_send_batch`] and [`Consumer::try_recv_batch`] publish or release
//!   a whole batch with one store.
//! * **Spin, yield, then park**: `*_timeout` calls spin, then yield the CPU, for as long as
//!   recent waits show it pays and as the machine's load allows ([`Waiting`], set with
//!   [`Producer::set_waiting`]), and then sleep on a futex; a wake-up system call is made only
//!   when the other side registered as waiting. No call blocks past its deadline.
//! * **Readiness**: a consumer can instead sleep on an eventfd shared by many rings
//!   ([`Consumer::arm`], the [`readiness`] module), so that one thread, or an `epoll` loop,
//!   waits for a message from any of them, with the same no-lost-wake-up rule and no system
//!   call on the sender's side unless the consumer sleeps.
//! * **Close**: dropping either end closes the ring. The consumer drains what was sent, then gets
//!   `Disconnected`; the producer gets `Disconnected` with its message handed back.
//! * **Untrusted peers**: joining checks the memfd's seals, its `fstat` size, the magic number,
//!   layout version, message size and alignment and slot geometry, each with its own [`Error`]
//!   variant. Afterwards anything a peer writes into the file yields a [`Corruption`] error or a
//!   garbage-but-valid `Pod` message: never undefined behaviour, a panic or an out-of-bounds access.
//!
//! # Example
//!
//! ```
//! use shmbroker_queues::{Consumer, Producer, TryRecvError, create};
//! use std::os::fd::AsFd;
//! use std::time::Duration;
//!
//! // One process creates the ring; the fd can travel to another process over SCM_RIGHTS.
//! let fd = create::<u64>(1024)?;
//! let mut tx = Producer::<u64>::join(fd.as_fd())?;
//! let mut rx = Consumer::<u64>::join(fd.as_fd())?;
//!
//! tx.try_send(7).unwrap();
//! tx.try_send_batch(&[8, 9]).unwrap();
//! assert_eq!(rx.recv_timeout(Duration::from_secs(1)), Ok(7));
//! let mut batch = [0; 4];
//! assert_eq!(rx.try_recv_batch(&mut batch), Ok(2));
//! assert_eq!(&batch[..2], &[8, 9]);
//!
//! drop(tx);
//! assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
//! # Ok::<(), shmbroker_queues::Error>(())
//! ```

#![warn(missing_docs)]

mod error;
mod futex;
mod interrupt;
#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(not(loom))]
pub mod memfd;
pub mod readiness;
mod ring;
#[doc(hidden)]
pub mod sync;
mod waiting;

pub use error::{
    Corruption, Error, RecvTimeoutError, Role, SendTimeoutError, TryRecvError, TrySendError,
};
pub use interrupt::Interrupt;
pub use readiness::{Notifier, ReadyRings, ReadySet};
pub use ring::{Closer, Consumer, HEADER_SIZE, MAX_CAPACITY, Producer, pair};
#[cfg(not(loom))]
pub use ring::{close, create, create_sized, fill};
pub use waiting::{CROWDED_SPIN_MAX, SPIN_MAX, Waiting};
#[cfg(not(loom))]
pub use waiting::{CROWDED_YIELD_MAX, LONG_WAIT_FACTOR, YIELD_MAX};
