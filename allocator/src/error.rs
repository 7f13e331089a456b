//! Why an outbox could not be created, mapped or used.

use crate::ledger::AckFault;

/// Why an outbox could not be created, mapped or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Creating, sizing, sealing, checking or mapping the memfd failed, or its seals do not
    /// keep every process but the owner from writing it.
    #[error(transparent)]
    Memfd(#[from] shmbroker_queues::Error),
    /// An outbox size outside what this build accepts.
    #[error("outbox of {found} bytes: expected {min} to {max} bytes")]
    BadSize {
        /// The smallest outbox.
        min: u64,
        /// The largest outbox.
        max: u64,
        /// The size asked for, or found.
        found: u64,
    },
    /// A peer's outbox header is not what its owner must have written.
    #[error(
        "outbox of rank {owner} has a bad header: {field} expected {expected:#x}, found {found:#x}"
    )]
    BadHeader {
        /// The rank the outbox should belong to.
        owner: u32,
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: u64,
        /// What it is.
        found: u64,
    },
    /// A block larger than the whole outbox can ever hold.
    #[error("a block of {requested} bytes is larger than this outbox can hold ({capacity} bytes)")]
    TooLarge {
        /// The size asked for.
        requested: u64,
        /// The most one block can have.
        capacity: u64,
    },
    /// A reference that does not lie inside the blocks of the outbox it names.
    #[error(
        "reference into rank {owner}'s outbox out of bounds: offset {offset} + {len} bytes (padding {pad:#x}); blocks lie in {first}..{region}"
    )]
    OutOfBounds {
        /// The rank whose outbox it names.
        owner: u32,
        /// The reference's offset.
        offset: u64,
        /// The reference's length.
        len: u32,
        /// The reference's padding field (must be 0).
        pad: u32,
        /// Where blocks start.
        first: u64,
        /// The outbox's size.
        region: u64,
    },
    /// An acknowledgement the owner's ledger refuses; nothing was freed.
    #[error("acknowledgement from rank {rank} of offset {offset} ({len} bytes) refused: {fault}")]
    Ack {
        /// The rank that sent it.
        rank: u32,
        /// The offset it named.
        offset: u64,
        /// The length it named.
        len: u32,
        /// What was wrong.
        fault: AckFault,
    },
    /// A copy out of a block into a buffer of another length.
    #[error("a reference of {found} bytes read into a buffer of {expected}")]
    LengthMismatch {
        /// The buffer's length.
        expected: usize,
        /// The reference's length.
        found: u32,
    },
    /// A loan handed to an outbox it did not come from.
    #[error("this loan belongs to another outbox")]
    ForeignLoan,
}
