//! What travels over the rings between workers, and references into a worker's outbox.

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
    /// Bytes of data in an eager message (see [`kind`]); 0 for other transports.
    pub len: u32,
    /// A sequence or tag chosen by the sender.
    pub tag: u64,
    /// Inline bytes.
    pub inline: [u8; INLINE_BYTES],
}

const _: () = assert!(size_of::<Message>() == 64);

/// Values of [`Message::kind`] used by the session layer.
///
/// The low 16 bits name the operation ([`kind::OP_MASK`]); one of the transport flags above them
/// says where the data is:
///
/// * **no flag (eager):** `len` bytes of data; the first [`INLINE_BYTES`] are in `inline`, the
///   rest fill [`kind::continuation_slots`]`(len)` whole slots that follow at once on the same
///   ring (raw bytes, 64 to a slot). A receiver accepts at most [`kind::EAGER_MAX`] bytes this way.
/// * **[`kind::PIPELINED`]:** the data is in the sender's outbox, in chunks: `inline` starts with
///   the total length (`u64`), and [`kind::CHUNK`] messages follow on the same ring, each carrying
///   a [`PayloadRef`] to the next piece, until the total is reached. Each chunk is acknowledged
///   with [`kind::PAYLOAD_ACK`] as soon as it is copied out.
/// * **[`kind::LOAN`]:** zero-copy: `inline` starts with a [`PayloadRef`] to the whole buffer in
///   the sender's outbox; the receiver acknowledges it when it is done with it.
pub mod kind {
    /// A barrier arrival; `tag` is the collective's sequence number.
    pub const BARRIER: u32 = 1;
    /// One rank's contribution to an all-gather; `tag` is the sequence number.
    pub const ALL_GATHER: u32 = 2;
    /// The root's data in a broadcast; `tag` is the sequence number.
    pub const BROADCAST: u32 = 3;
    /// A point-to-point message; `tag` counts the sender's messages to this receiver.
    pub const SEND: u32 = 4;
    /// "Done with this block of your outbox": `inline` holds the [`super::PayloadRef`] as sent.
    pub const PAYLOAD_ACK: u32 = 5;
    /// An exporter's [`super::FdTicket`] in an fd exchange; `tag` is the sequence number.
    pub const FD_TICKET: u32 = 6;
    /// One rank's contribution to a gather at a root; `tag` is the sequence number.
    pub const GATHER: u32 = 7;
    /// The next piece of a [`PIPELINED`] message: `inline` holds its [`super::PayloadRef`].
    pub const CHUNK: u32 = 8;

    /// An all-reduce's contribution or result (its own operation, so that ranks in different
    /// collectives get a mismatch naming both).
    pub const ALL_REDUCE: u32 = 9;

    /// A reduce-scatter's contribution.
    pub const REDUCE_SCATTER: u32 = 10;

    /// A reduce's contribution or result.
    pub const REDUCE: u32 = 11;

    /// A scatter's block.
    pub const SCATTER: u32 = 12;

    /// An all-to-all's block.
    pub const ALL_TO_ALL: u32 = 13;

    /// A member's view of a group being made: the stream it proposes and the ranks it passed.
    pub const GROUP: u32 = 14;

    /// A round of agreeing on the ranks still there (`Session::shrink`): the departed ranks as
    /// the sender's estimate has them.
    pub const SHRINK: u32 = 15;

    /// The operation bits of a kind.
    pub const OP_MASK: u32 = 0xffff;

    /// The name of operation `op` (a kind's [`OP_MASK`] bits) as the API spells it: `barrier`,
    /// `all_gather`, ...; `None` for a number no operation has.
    pub const fn name(op: u32) -> Option<&'static str> {
        Some(match op {
            BARRIER => "barrier",
            ALL_GATHER => "all_gather",
            BROADCAST => "broadcast",
            SEND => "send",
            PAYLOAD_ACK => "payload acknowledgement",
            FD_TICKET => "fd exchange",
            GATHER => "gather",
            CHUNK => "chunk",
            ALL_REDUCE => "all_reduce",
            REDUCE_SCATTER => "reduce_scatter",
            REDUCE => "reduce",
            SCATTER => "scatter",
            ALL_TO_ALL => "all_to_all",
            GROUP => "group",
            SHRINK => "shrink",
            _ => return None,
        })
    }
    /// Transport flag: the data follows in [`CHUNK`]s through the sender's outbox.
    pub const PIPELINED: u32 = 1 << 16;
    /// Transport flag: the data is lent by reference, in the sender's outbox.
    pub const LOAN: u32 = 1 << 17;

    /// The most bytes an eager message may carry: 48 inline and 63 continuation slots.
    pub const EAGER_MAX: usize = super::INLINE_BYTES + 63 * size_of::<super::Message>();

    /// How many continuation slots follow an eager message of `len` bytes.
    #[must_use]
    pub const fn continuation_slots(len: usize) -> usize {
        if len <= super::INLINE_BYTES {
            0
        } else {
            (len - super::INLINE_BYTES).div_ceil(size_of::<super::Message>())
        }
    }
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

/// A block in a worker's outbox, as the owner names it to a peer. 16 bytes.
///
/// Only meaningful in the outbox of the rank that sent it; a receiver checks it against that
/// outbox's bounds before reading a byte, and the owner checks an acknowledgement's reference
/// against its private ledger of blocks it sent.
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
