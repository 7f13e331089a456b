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
