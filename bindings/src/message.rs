//! What travels over the rings between workers, and references into the payload region.

use bytemuck::{Pod, Zeroable};

/// Bytes a [`Message`] carries inline.
pub const INLINE_BYTES: usize = 48;

/// One ring slot's worth of message between workers. 64 bytes: one cache line with the slot's
/// sequence word beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct Message {
    /// What kind of message this is (defined by the session layer).
    pub kind: u32,
    /// Bytes of `inline` in use, or of the payload for messages that carry a [`PayloadRef`].
    pub len: u32,
    /// A sequence or tag chosen by the sender.
    pub tag: u64,
    /// Inline bytes.
    pub inline: [u8; INLINE_BYTES],
}

const _: () = assert!(size_of::<Message>() == 64);

/// Values of [`Message::kind`] used by the session layer.
pub mod kind {
    /// A barrier arrival; `tag` is the collective's sequence number.
    pub const BARRIER: u32 = 1;
    /// One rank's contribution to an all-gather; `tag` is the sequence number.
    pub const ALL_GATHER: u32 = 2;
    /// The root's data in a broadcast; `tag` is the sequence number.
    pub const BROADCAST: u32 = 3;
    /// A point-to-point message; `tag` counts the sender's messages to this receiver.
    pub const SEND: u32 = 4;
    /// "Done with this payload": `inline` holds the [`super::PayloadRef`] to free.
    pub const PAYLOAD_ACK: u32 = 5;
    /// An exporter's [`super::FdTicket`] in an fd exchange; `tag` is the sequence number.
    pub const FD_TICKET: u32 = 6;
    /// Or-ed into a kind when the data is in the payload region, not inline: `inline` then
    /// starts with a [`super::PayloadRef`].
    pub const IN_PAYLOAD: u32 = 1 << 16;
}

/// What an exporter tells importers about an fd it offers. 32 bytes, inline in a [`Message`].
///
/// An importer takes the fd with `pidfd_getfd(pidfd_open(pid), fd)` and accepts it only if its
/// `(st_dev, st_ino)` are these: a number closed and reused since is refused as stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct FdTicket {
    /// The exporter's process id.
    pub pid: u32,
    /// The fd's number in the exporter.
    pub fd: i32,
    /// `st_dev` of the file.
    pub dev: u64,
    /// `st_ino` of the file.
    pub ino: u64,
    /// The exchange's sequence number, which also tags a relayed copy.
    pub token: u64,
}

const _: () = assert!(size_of::<FdTicket>() == 32);

/// A block in the session's payload region, as one process names it to another. 16 bytes.
///
/// Only meaningful in the region of the session it came from; a receiver checks it against that
/// region's bounds before reading a byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct PayloadRef {
    /// Byte offset from the start of the region.
    pub offset: u64,
    /// Bytes in use from `offset`.
    pub len: u32,
    /// Explicit padding; must be zero.
    pub _pad0: u32,
}

const _: () = assert!(size_of::<PayloadRef>() == 16);
