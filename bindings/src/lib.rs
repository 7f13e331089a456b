//! Every type that crosses a process boundary in shmbroker.
//!
//! Each type here is `#[repr(C)]`, [`bytemuck::Pod`], made of fixed-width integers with explicit
//! padding, and has a compile-time size assertion, so its bytes mean the same thing in every process
//! that maps them. This crate has no `unsafe` and does no I/O: it only describes bytes. Validating a
//! value that came from another process is the job of the crate that reads it, which compares it
//! against the constants defined here and names expected and found values in its errors.
//!
//! All wire integers are little-endian. The crate refuses to build for a big-endian target rather
//! than silently byte-swap shared memory that atomics also touch.
//!
//! ```
//! use shmbroker_bindings::{RING_MAGIC, RING_LAYOUT_VERSION, RingLayout};
//!
//! let layout = RingLayout::new(8, 8, 16, 1024, 384);
//! assert_eq!(layout.magic, RING_MAGIC);
//! assert_eq!(layout.version, RING_LAYOUT_VERSION);
//! assert_eq!(layout.file_size, 384 + 16 * 1024);
//! // Any 48 bytes are a valid `RingLayout`; whether they describe a ring is for the reader to check.
//! let from_peer: RingLayout = bytemuck::pod_read_unaligned(&[0xAB; 48]);
//! assert_ne!(from_peer.magic, RING_MAGIC);
//! ```
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(not(target_endian = "little"))]
compile_error!("shmbroker's wire format is little-endian; big-endian targets are not supported");

mod gpu;
mod logon;
mod message;
mod outbox;
mod report;
mod ring;

pub use gpu::{GPU_HANDLE_BYTES, GpuHandle, GpuHandleKind};
pub use logon::{
    ANY_RANK, ChannelToken, FdRole, LOGON_MAGIC, LogonFrame, MAX_REJOINS, MAX_REPLY_FDS,
    ManifestEntry, NO_PEER, NOTICE_MAGIC, NoticeKind, PROTOCOL_VERSION, REASON_LEN, REPLY_MAGIC,
    RejectReason, ReplyHeader, WorkerNotice, job_id,
};
pub use message::{FdTicket, INLINE_BYTES, Message, PayloadRef, kind};
pub use outbox::{
    OUTBOX_HEADER_BYTES, OUTBOX_LAYOUT_VERSION, OUTBOX_MAGIC, OUTBOX_STATUS_OFFSET, OutboxHeader,
    STATUS_SLOT_WORDS, STATUS_SLOTS, status_word,
};
pub use report::{
    FILL_UNKNOWN, RankState, RankStatus, STATUS_MAGIC, STATUS_MAX_PEERS, STATUS_REPLY_MAGIC,
    StatusReplyHeader,
};
pub use ring::{RING_LAYOUT_VERSION, RING_MAGIC, RingLayout};
