//! Errors. [`Error`] is for creating and joining rings; the hot-path errors hand the message back
//! and never allocate.

use core::fmt;
use nix::errno::Errno;

/// Why a ring could not be created or joined.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A system call failed.
    #[error("{op} failed: {source}")]
    Sys {
        /// The call, as in its man page.
        op: &'static str,
        /// What it returned.
        #[source]
        source: Errno,
    },
    /// The requested capacity is zero, not a power of two, or too large.
    #[error("ring capacity must be a power of two from 1 to {max}, got {found}")]
    InvalidCapacity {
        /// The largest capacity supported.
        max: u64,
        /// The capacity asked for or found in the header.
        found: u64,
    },
    /// The file lacks seals that stop a peer from resizing it under our mapping.
    #[error("memfd lacks seals: expected seals {expected:#x}, found {found:#x}")]
    MissingSeals {
        /// The `F_SEAL_*` bits required.
        expected: i32,
        /// The `F_SEAL_*` bits the file has.
        found: i32,
    },
    /// The file is not an ordinary shared-memory (shmem) file: a hugetlbfs file, say, whose pages
    /// may be missing when a reader touches them (`SIGBUS`).
    #[error(
        "memfd is not a shmem file: expected filesystem type {expected:#x} (tmpfs), found {found:#x}"
    )]
    NotShmem {
        /// `TMPFS_MAGIC`.
        expected: u64,
        /// What `fstatfs` said.
        found: u64,
    },
    /// The file is too small to hold even a ring header.
    #[error("ring file too small: expected at least {minimum} bytes, found {found}")]
    FileTooSmall {
        /// The header size.
        minimum: u64,
        /// The file size.
        found: u64,
    },
    /// The file does not start with the ring magic number.
    #[error("ring magic mismatch: expected {expected:#018x}, found {found:#018x}")]
    BadMagic {
        /// [`shmbroker_bindings::RING_MAGIC`].
        expected: u64,
        /// What the file holds.
        found: u64,
    },
    /// The ring was made by a build with another memory layout.
    #[error("ring layout version mismatch: expected {expected}, found {found}")]
    VersionMismatch {
        /// [`shmbroker_bindings::RING_LAYOUT_VERSION`].
        expected: u32,
        /// What the header holds.
        found: u32,
    },
    /// The ring carries messages of another size than this process's `T`.
    #[error("ring message size mismatch: expected {expected} bytes, found {found}")]
    ElementSize {
        /// `size_of::<T>()` here.
        expected: u32,
        /// What the header holds.
        found: u32,
    },
    /// The ring carries messages of another alignment than this process's `T`.
    #[error("ring message alignment mismatch: expected {expected}, found {found}")]
    ElementAlign {
        /// `align_of::<T>()` here.
        expected: u32,
        /// What the header holds.
        found: u32,
    },
    /// The slot size or slot offset in the header is not what this build lays out for `T`.
    #[error(
        "ring slot geometry mismatch: expected {expected_size}-byte slots at offset {expected_offset}, found {found_size}-byte slots at offset {found_offset}"
    )]
    SlotGeometry {
        /// Slot size this build uses.
        expected_size: u32,
        /// Slot size in the header.
        found_size: u32,
        /// Offset of slot 0 this build uses.
        expected_offset: u64,
        /// Offset of slot 0 in the header.
        found_offset: u64,
    },
    /// The file size disagrees with the size the header describes.
    #[error("ring file size mismatch: expected {expected} bytes, found {found}")]
    FileSize {
        /// `slots_offset + capacity * slot_size`.
        expected: u64,
        /// What `fstat` (or the header's own `file_size` field) says.
        found: u64,
    },
    /// Another endpoint already joined the ring in this role.
    #[error("the ring already has a {role}")]
    AlreadyJoined {
        /// The role that was taken.
        role: Role,
    },
}

impl Error {
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn sys(op: &'static str) -> impl FnOnce(Errno) -> Self {
        move |source| Self::Sys { op, source }
    }
}

/// Which end of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The end that sends.
    Producer,
    /// The end that receives.
    Consumer,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Producer => "producer",
            Self::Consumer => "consumer",
        })
    }
}

/// Shared state that no correct peer could have written: the peer is buggy or hostile.
///
/// The ring stays memory-safe (every index is masked locally); this error reports what was seen so
/// that the session can be torn down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Corruption {
    /// The consumer cursor claims more was consumed than sent, or less than a ring's worth.
    #[error(
        "consumer cursor {head} is out of range for producer cursor {tail} and capacity {capacity}"
    )]
    ConsumerCursor {
        /// The consumer cursor read from shared memory.
        head: u64,
        /// This producer's cursor.
        tail: u64,
        /// The ring capacity.
        capacity: u64,
    },
    /// A slot's sequence number is neither "ready" nor "not yet written" for the position read.
    #[error(
        "slot sequence at position {position}: expected {ready} (ready) or {pending} (pending), found {found}"
    )]
    SlotSequence {
        /// The consumer's position.
        position: u64,
        /// The sequence number of a published slot.
        ready: u64,
        /// The sequence number of a slot left from the previous lap.
        pending: u64,
        /// What the slot holds.
        found: u64,
    },
}

/// Why [`Producer::try_send`](crate::Producer::try_send) did not send. Holds the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TrySendError<T> {
    /// The ring is full.
    #[error("ring is full")]
    Full(T),
    /// The consumer closed the ring.
    #[error("ring consumer is gone")]
    Disconnected(T),
    /// The consumer wrote an impossible cursor.
    #[error("{1}")]
    Corrupted(T, Corruption),
}

/// Why [`Consumer::try_recv`](crate::Consumer::try_recv) returned no message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TryRecvError {
    /// Nothing has been sent.
    #[error("ring is empty")]
    Empty,
    /// The producer closed the ring and everything it sent has been received.
    #[error("ring producer is gone")]
    Disconnected,
    /// The producer wrote an impossible slot sequence number.
    #[error("{0}")]
    Corrupted(Corruption),
}

/// Why a `send*_timeout` call did not finish. Holds the message (for batches: how many went).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendTimeoutError<T> {
    /// The deadline passed while the ring stayed full.
    #[error("timed out waiting for ring space")]
    Timeout(T),
    /// The consumer closed the ring.
    #[error("ring consumer is gone")]
    Disconnected(T),
    /// The consumer wrote an impossible cursor.
    #[error("{1}")]
    Corrupted(T, Corruption),
}

/// Why a `recv*_timeout` call returned no message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvTimeoutError {
    /// The deadline passed while the ring stayed empty.
    #[error("timed out waiting for a message")]
    Timeout,
    /// The producer closed the ring and everything it sent has been received.
    #[error("ring producer is gone")]
    Disconnected,
    /// The producer wrote an impossible slot sequence number.
    #[error("{0}")]
    Corrupted(Corruption),
    /// The consumer's [`Interrupt`](crate::Interrupt) moved on from the generation the caller
    /// gave ([`Consumer::recv_batch_interruptible`](crate::Consumer::recv_batch_interruptible)
    /// only); nothing was received.
    #[error("interrupted while waiting for a message")]
    Interrupted,
}
