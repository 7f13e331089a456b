//! The header at the start of every worker's outbox.

use bytemuck::{Pod, Zeroable};

/// First eight bytes of every outbox: `SHMBOUTB`.
pub const OUTBOX_MAGIC: u64 = u64::from_le_bytes(*b"SHMBOUTB");

/// Version of the outbox layout (this header, then blocks named by [`crate::PayloadRef`]).
pub const OUTBOX_LAYOUT_VERSION: u32 = 1;

/// Bytes before the first block of an outbox: this header, padded to a cache line.
pub const OUTBOX_HEADER_BYTES: u64 = 64;

/// Written once by an outbox's owner before it seals the file; read (copied out) and checked by
/// every peer that maps it. 64 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct OutboxHeader {
    /// [`OUTBOX_MAGIC`].
    pub magic: u64,
    /// [`OUTBOX_LAYOUT_VERSION`].
    pub version: u32,
    /// The rank of the owner, the only process that can write the file.
    pub owner_rank: u32,
    /// The file's exact size in bytes.
    pub file_size: u64,
    /// Explicit padding; must be zero.
    pub _pad: [u64; 5],
}

const _: () = assert!(size_of::<OutboxHeader>() as u64 == OUTBOX_HEADER_BYTES);

impl OutboxHeader {
    /// The header of an outbox of `file_size` bytes owned by `owner_rank`.
    #[must_use]
    pub const fn new(owner_rank: u32, file_size: u64) -> Self {
        Self {
            magic: OUTBOX_MAGIC,
            version: OUTBOX_LAYOUT_VERSION,
            owner_rank,
            file_size,
            _pad: [0; 5],
        }
    }
}
