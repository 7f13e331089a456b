//! The header at the start of every worker's outbox.

use bytemuck::{Pod, Zeroable};

/// First eight bytes of every outbox: `SHMBOUTB`.
pub const OUTBOX_MAGIC: u64 = u64::from_le_bytes(*b"SHMBOUTB");

/// Version of the outbox layout (this header, the owner's status, then blocks named by
/// [`crate::PayloadRef`]).
pub const OUTBOX_LAYOUT_VERSION: u32 = 2;

/// Where the owner's status starts: right after the [`OutboxHeader`].
pub const OUTBOX_STATUS_OFFSET: u64 = 64;

/// Bytes before the first block of an outbox: the header's cache line, then the owner's status
/// ([`STATUS_SLOTS`] slots of [`STATUS_SLOT_WORDS`] 8-byte words).
pub const OUTBOX_HEADER_BYTES: u64 =
    OUTBOX_STATUS_OFFSET + (STATUS_SLOTS * STATUS_SLOT_WORDS * 8) as u64;

/// Slots of an outbox's status: one for the calls that send (collectives included), one for
/// the receives, so that a split session's two threads each say what they are doing.
pub const STATUS_SLOTS: usize = 2;

/// 8-byte words in one status slot.
pub const STATUS_SLOT_WORDS: usize = 16;

/// Which word of a status slot holds what. Every word is written by the outbox's owner alone,
/// with plain (relaxed atomic) stores, and read by peers and the broker for diagnosis only: a
/// reader copies the slot until two copies agree and trusts nothing in it (a hostile owner can
/// write anything there, as anywhere in its outbox).
pub mod status_word {
    /// Two words: the name of the call in progress, ASCII, zero-padded (both zero: in no call).
    pub const CALL: usize = 0;
    /// A collective's number in its group (`u64::MAX`: not a collective, or not known yet): of
    /// its first message, for a call that takes several numbers (a two-shot all-reduce takes
    /// two a piece), so that ranks in one call publish one number whatever stage each is in.
    pub const SEQ: usize = 2;
    /// The group's stream (0: the world), in the low 32 bits; the peer of a point-to-point call
    /// in the high 32 (`u32::MAX`: none).
    pub const GROUP_PEER: usize = 3;
    /// When the call started: `CLOCK_MONOTONIC_COARSE` nanoseconds.
    pub const SINCE: usize = 4;
    /// Two words: the name of the last call that finished (zero: none yet).
    pub const LAST_CALL: usize = 5;
    /// Its [`SEQ`].
    pub const LAST_SEQ: usize = 7;
    /// Its [`GROUP_PEER`].
    pub const LAST_GROUP_PEER: usize = 8;
    /// When it finished: `CLOCK_MONOTONIC_COARSE` nanoseconds.
    pub const LAST_DONE: usize = 9;
    /// Whom the call waits for, once it has had to wait (for a message, an acknowledgement or
    /// room in a ring): a rank, or `u64::MAX`.
    pub const WAITING_FOR: usize = 10;
    /// Bytes of the outbox in blocks (sent and not yet given back, loaned, or being filled), in
    /// slot 0 only; stored by the owner's allocator whenever it changes.
    pub const OUTBOX_USED: usize = 11;
    /// The message kind of the collective in progress (`shmbroker_bindings::kind`), set with
    /// [`SEQ`] (`u64::MAX`: none). Two ranks in the same collective number of the same group
    /// with different kinds called different collectives.
    pub const KIND: usize = 12;
    /// The [`KIND`] of the last call that finished (or failed).
    pub const LAST_KIND: usize = 13;
    /// The [`SEQ`] of the last collective that failed after taking its number, in slot 0
    /// (`u64::MAX`: none yet); only the next such failure overwrites it, whatever calls come
    /// between. This rank has left that collective and sends nothing more for it: a rank
    /// waiting for it there reads this to fail at once instead of at its deadline.
    pub const FAILED_SEQ: usize = 14;
    /// That collective's record: bit 63 set ([`FAILED_RECORD`]; a word without it records
    /// nothing, so zeroed or half-written words never read as a failure), its group's stream (as
    /// in [`GROUP_PEER`]) in bits 32 to 62, and the rank its error named (a world rank) in the
    /// low 32 (`u32::MAX`: none).
    pub const FAILED_STREAM_NAMED: usize = 15;
    /// The bit of [`FAILED_STREAM_NAMED`] that makes it a record.
    pub const FAILED_RECORD: u64 = 1 << 63;
    /// In slot [`ALIVE_SLOT`] only (where [`FAILED_SEQ`]'s index is free): when the owner's
    /// watcher thread last ran (`CLOCK_MONOTONIC_COARSE` nanoseconds; 0: not yet). It ticks
    /// every `shmbroker_handshake::clock::TICK`, so a process that is stopped shows how long it
    /// has been since it last ran.
    pub const ALIVE: usize = 14;
    /// The slot that holds [`ALIVE`].
    pub const ALIVE_SLOT: usize = 1;
    /// In slot [`ALIVE_SLOT`] only: how many processes held the owner's rank before it in the
    /// job (its incarnation, 0 for the job's first), plus one; 0 while not yet written. Written
    /// once, before the outbox is published, and never changed: a peer that maps the outbox
    /// learns which process of the rank its links lead to (making groups compares these).
    pub const INCARNATION: usize = 15;
}

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

const _: () = assert!(size_of::<OutboxHeader>() as u64 == OUTBOX_STATUS_OFFSET);
const _: () = assert!(OUTBOX_HEADER_BYTES.is_multiple_of(64));

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
