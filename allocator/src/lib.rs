//! Per-worker outboxes: shared memory that only its owner can write.
//!
//! Every worker creates one [`Outbox`]: a memfd it maps read-write and then seals with
//! `F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL`
//! ([`OWNER_ONLY_SEALS`](shmbroker_queues::memfd::OWNER_ONLY_SEALS)) before anyone else sees it.
//! Peers check those seals, then map it read-only ([`PeerOutbox::join`]). From then on the kernel
//! refuses every new way to write the file, to every process: `write`, a writable shared `mmap`
//! (also of a reopened `/proc/PID/fd/N`), `mprotect` to writable, hole punching. Only the mapping
//! the owner made before sealing can write it.
//!
//! A sender puts large data (pipelined chunks) and loans in blocks of its outbox and sends peers
//! a [`PayloadRef`](shmbroker_bindings::PayloadRef); they copy the bytes out (or read them in a
//! [`View`]) and acknowledge. Everything that decides what is free lives in the owner's private
//! memory, not in the shared file:
//!
//! * [`Ranges`]: a first-fit allocator over the outbox's bytes.
//! * [`Ledger`]: for every block sent, the exact reference and the set of ranks that still owe an
//!   acknowledgement. A block is reused only when that set is empty. A duplicate, foreign,
//!   altered or unknown acknowledgement is an [`Error::Ack`] naming the rank, and frees nothing.
//!   A rank that dies or leaves is [`Outbox::forget`]-ed.
//!
//! A reference a peer sent is checked ([`check_ref`]) against the outbox it names before a byte is
//! read; bytes are copied out once.
//!
//! # Why not rts-alloc
//!
//! Until protocol version 2 the session shared one `rts-alloc` region that every worker mapped
//! writable. Its free lists live in the shared file and it follows offsets found there without
//! bounds checks, so one worker scribbling over them crashed the next honest allocation in
//! another process. With one writer per outbox there is nothing left for a shared allocator to
//! do, and its largest block (4 KiB) is far below the chunks (256 KiB) and loans (up to the whole
//! outbox) this crate serves. The private first-fit allocator here is slower per call (measured by
//! `bench bulk --only outbox_alloc`: 44 to 66 ns per allocate-and-free of a 256 KiB
//! chunk, against rts-alloc's 23 to 26 ns for its largest block, 4 KiB, on a 2-core EPYC guest), which does not matter: it runs once per 256 KiB
//! chunk or loan, beside a copy of tens of microseconds, and never for eager messages.
//!
//! ```
//! use shmbroker_allocator::{Outbox, PeerOutbox};
//!
//! let mut outbox = Outbox::create(0, 1 << 20)?;
//! let peer = PeerOutbox::join(outbox.fd(), 0)?; // what rank 1 does with the fd it was given
//!
//! let block = outbox.try_alloc(5)?.expect("room");
//! outbox.write(&block, 0, b"hello")?;
//! let sent = outbox.send(block, 5, Outbox::receivers([1]))?;
//!
//! let mut copy = [0; 5];
//! peer.read_into(sent, &mut copy)?;
//! assert_eq!(&copy, b"hello");
//! outbox.ack(1, sent)?; // rank 1's acknowledgement frees the block
//! assert!(outbox.ack(1, sent).is_err()); // a second one is refused
//! assert_eq!(outbox.blocks_owed(), 0);
//! # Ok::<(), shmbroker_allocator::Error>(())
//! ```

#![warn(missing_docs)]

mod error;
pub mod ledger;
pub mod offsets;
mod outbox;
mod peer;
pub mod ranges;
pub mod status;

pub use error::Error;
pub use ledger::{AckFault, Ledger, rank_bit};
pub use outbox::{
    Block, DEFAULT_OUTBOX_BYTES, Loan, MAX_OUTBOX_BYTES, MIN_OUTBOX_BYTES, Outbox, Pin,
};
pub use peer::{PeerOutbox, View, check_ref};
pub use ranges::Ranges;
pub use status::{Snapshot, StatusWords};
