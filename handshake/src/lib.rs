//! The logon protocol: how a worker process meets the broker and gets its shared memory.
//!
//! A broker [`Listener::bind`]s a UNIX stream socket (mode 0600) and serves logons. A worker
//! calls [`connect`]`(path, logon, timeout)`. The worker first checks who answers (`SO_PEERCRED`:
//! its own uid or root, see [`BROKER_UID_VAR`]) and sends nothing to anyone else; the broker
//! checks who is calling (`SO_PEERCRED`: the same uid by default, an allow-list otherwise),
//! validates every field of the [`LogonFrame`](shmbroker_bindings::LogonFrame) against its
//! [`Config`], gives the worker a rank, and answers with a manifest and every fd the
//! worker needs (its rings to and from each peer) in one `SCM_RIGHTS` message. The worker's socket
//! stays open for the whole session: it carries the worker's goodbye, fds relayed between
//! workers, each worker's outbox ([`Connection::publish_outbox`], [`Connection::take_peer_outbox`]), and
//! a pidfd of every peer's process, which each worker's session watches on a thread of its own
//! ([`Connection::departure`]; see the `liveness` module): a peer that dies is seen within
//! milliseconds whether or not the broker is still there.
//!
//! Nothing here trusts the other side: a logon frame is checked field by field and a bad one is
//! refused with a reason code and text while every other logon goes on; a reply is checked for
//! magic, version, counts, manifest order and padding, control-message truncation and fd count,
//! and every received file's size and seals, before anything is mapped. Every wait has a deadline.
//!
//! ```
//! use shmbroker_handshake::{Config, Listener, connect};
//! use shmbroker_bindings::{ANY_RANK, LogonFrame, Message};
//! use std::time::Duration;
//!
//! let dir = std::env::temp_dir().join(format!("shmbroker-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let path = dir.join("broker.sock");
//! let mut listener = Listener::bind(&path, Config { world_size: 2, ..Config::default() })?;
//! let stop = listener.stop_handle();
//! let broker = std::thread::spawn(move || listener.serve(|event| println!("{event:?}")));
//!
//! let worker = {
//!     let path = path.clone();
//!     std::thread::spawn(move || connect(&path, LogonFrame::new(1), Duration::from_secs(5)))
//! };
//! let mut zero = connect(&path, LogonFrame::new(ANY_RANK), Duration::from_secs(5))?;
//! let mut one = worker.join().unwrap()?;
//! assert_eq!((zero.rank(), one.rank()), (0, 1));
//!
//! let hello = Message { kind: 1, len: 0, tag: 42, inline: [0; 48] };
//! zero.link(1).unwrap().to.try_send(hello).unwrap();
//! assert_eq!(one.link(0).unwrap().from.recv_timeout(Duration::from_secs(5)), Ok(hello));
//!
//! stop.stop();
//! broker.join().unwrap()?;
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), shmbroker_handshake::Error>(())
//! ```

#![warn(missing_docs)]

// Under `--cfg loom` only the state a session shares with its watcher thread is built, for its
// models (`liveness::state`); the rest needs the real eventfds and memfds the queues crate leaves
// out of a loom build.
#[cfg(not(loom))]
mod broker;
#[cfg(not(loom))]
mod client;
#[cfg(not(loom))]
pub mod clock;
#[cfg(not(loom))]
mod error;
#[cfg(not(loom))]
mod liveness;
#[cfg(loom)]
mod liveness {
    // Most of it serves the code a loom build leaves out.
    #[allow(dead_code)]
    pub(crate) mod slots;
    #[allow(dead_code)]
    pub(crate) mod state;
}
/// The loom shim, shared with the queues: the two crates with loom models use one.
use shmbroker_queues::sync;
#[cfg(not(loom))]
mod trust;
#[cfg(not(loom))]
pub mod wire;

#[cfg(not(loom))]
pub use broker::{Config, Event, Listener, MAX_UNCLAIMED_RELAYS, StopHandle};
#[cfg(not(loom))]
pub use client::{
    Connection, Link, RELAY_ORDER_MASK, connect, connect_stream, deadline_after, deadline_from,
    status,
};
#[cfg(not(loom))]
pub use error::{Error, ProtocolError};
#[cfg(not(loom))]
pub use liveness::{Departure, Interrupter, LeftAfter, PeerWatch, TIMED_OUT};
#[cfg(not(loom))]
pub use trust::{BROKER_UID_VAR, private_dir};
#[cfg(not(loom))]
pub use wire::MAX_WORLD_SIZE;

// A logon reply carries every fd of a worker in one message.
const _: () = assert!(shmbroker_bindings::MAX_REPLY_FDS <= shmbroker_sys::fdpass::MAX_FDS);
