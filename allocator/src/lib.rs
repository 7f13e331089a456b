//! The session's shared payload region: an `rts-alloc` allocator in a sealed memfd.
//!
//! Messages on the rings are 64 bytes; anything larger (up to [`MAX_PAYLOAD`] bytes) travels as a
//! [`PayloadRef`] to a block in this region. The broker [`create`]s one region per session; each
//! worker [`PayloadRegion::join`]s it and gets its own `rts-alloc` worker slot.
//!
//! # Who frees what, and when
//!
//! * **Only the process that allocated a block frees it**, after its receivers are done with it
//!   (the session layer's acknowledgements say when). [`PayloadRegion::free`] checks a private
//!   ledger of this process's live allocations, so a reference that came from a peer can never be
//!   handed to the allocator: a peer cannot make us free a block twice or free garbage.
//! * A block freed by a process that does not own its slab goes on the owner's remote-free list
//!   (`rts-alloc`'s design). Those are reclaimed by the owner when an allocation finds its slabs
//!   full ([`PayloadRegion::alloc`] then calls `clean_remote_frees` and retries), so a region never
//!   reports exhaustion while remote frees are waiting.
//!
//! # Untrusted references
//!
//! Reading a [`PayloadRef`] from a peer ([`PayloadRegion::read`]) checks the padding, the length
//! against [`MAX_PAYLOAD`] and the whole range against the region's size before copying a byte;
//! a bad one is an [`Error::OutOfBounds`] naming what arrived. Payloads are copied out once; no
//! reference into memory a peer can write is handed out.
//!
//! What this crate cannot promise: `rts-alloc` keeps its free lists inside the shared file and
//! trusts every process that maps it. A peer that scribbles over the allocator's own metadata can
//! make *allocation* in other processes misbehave. Such a peer is already able to corrupt any
//! payload; the broker's uid check is what keeps strangers out of the region.
//!
//! ```
//! use shmbroker_allocator::{PayloadRegion, create};
//! use std::os::fd::AsFd;
//!
//! let fd = create(2, 1 << 20)?;
//! let mut a = PayloadRegion::join(fd.as_fd())?;
//! let b = PayloadRegion::join(fd.as_fd())?;
//! let payload = a.alloc(b"hello from a")?;
//! assert_eq!(b.read(payload)?, b"hello from a");
//! a.free(payload)?;
//! # Ok::<(), shmbroker_allocator::Error>(())
//! ```

#![warn(missing_docs)]

use shmbroker_bindings::PayloadRef;
use shmbroker_queues::memfd::{check_seals, file_size};
use std::collections::HashSet;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

/// The largest payload one block holds.
pub const MAX_PAYLOAD: usize = rts_alloc::MAX_ALLOC_SIZE;

/// `rts-alloc`'s layout version, as carried in the logon manifest.
pub const PAYLOAD_LAYOUT_VERSION: u32 = rts_alloc::VERSION;

/// Bytes per slab: 16 blocks of the largest size class.
const SLAB_SIZE: u32 = 64 * 1024;

/// Why a region could not be created, joined or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Creating, sealing or checking the memfd failed.
    #[error(transparent)]
    Memfd(#[from] shmbroker_queues::Error),
    /// `rts-alloc` refused to create or join the region.
    #[error("payload region: {0}")]
    Allocator(#[source] rts_alloc::error::Error),
    /// Duplicating the fd failed.
    #[error("dup of the payload region fd failed: {0}")]
    Dup(#[source] std::io::Error),
    /// A payload larger than one block.
    #[error("payload of {found} bytes is larger than the largest block, {max} bytes")]
    TooLarge {
        /// [`MAX_PAYLOAD`].
        max: usize,
        /// The payload's size.
        found: usize,
    },
    /// No block of that size is free, even after reclaiming remote frees.
    #[error("payload region exhausted: no free block for {requested} bytes")]
    Exhausted {
        /// The payload's size.
        requested: usize,
    },
    /// A reference that does not lie inside the region.
    #[error(
        "payload reference out of bounds: offset {offset} + {len} bytes (padding {pad:#x}) in a region of {region} bytes"
    )]
    OutOfBounds {
        /// The reference's offset.
        offset: u64,
        /// The reference's length.
        len: u32,
        /// The reference's padding field (must be 0).
        pad: u32,
        /// The region's size.
        region: u64,
    },
    /// [`PayloadRegion::free`] of a block this process did not allocate (or already freed).
    #[error("payload at offset {offset} was not allocated by this process, or was freed already")]
    NotAllocatedHere {
        /// The reference's offset.
        offset: u64,
    },
}

/// Creates a payload region of `bytes` bytes for `workers` workers in a fresh sealed memfd.
///
/// # Errors
///
/// [`Error::Allocator`] when `rts-alloc` finds the size too small for that many workers;
/// [`Error::Memfd`] when a system call fails.
pub fn create(workers: u32, bytes: u64) -> Result<OwnedFd, Error> {
    let fd = shmbroker_queues::memfd::create_unsealed(c"shmbroker-payload")?;
    let file = File::from(fd.try_clone().map_err(Error::Dup)?);
    let size = usize::try_from(bytes).unwrap_or(usize::MAX);
    // SAFETY: the memfd was created just now and nothing else has it, so this is the one and only
    // `create` for this file; the creator's worker slot is released when `creator` drops below.
    let creator = unsafe { rts_alloc::Allocator::create(&file, size, workers, SLAB_SIZE) }
        .map_err(Error::Allocator)?;
    drop(creator);
    shmbroker_queues::memfd::seal(fd.as_fd())?;
    Ok(fd)
}

/// One process's handle on the session's payload region.
pub struct PayloadRegion {
    allocator: rts_alloc::Allocator,
    base: NonNull<u8>,
    size: u64,
    /// Offsets of the blocks this process allocated and has not freed.
    live: HashSet<u64>,
}

// SAFETY: `rts_alloc::Allocator` is `Send`; `base` is only used to copy bytes within the
// allocator's own mapping, which lives as long as the allocator.
unsafe impl Send for PayloadRegion {}

impl std::fmt::Debug for PayloadRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PayloadRegion")
            .field("size", &self.size)
            .field("live_blocks", &self.live.len())
            .finish_non_exhaustive()
    }
}

impl PayloadRegion {
    /// Joins the region in `fd`, taking a free worker slot, after checking the seals.
    ///
    /// # Errors
    ///
    /// [`Error::Memfd`] when the file is not sealed; [`Error::Allocator`] when it is not an
    /// `rts-alloc` region of this version or every worker slot is taken.
    pub fn join(fd: BorrowedFd<'_>) -> Result<Self, Error> {
        check_seals(fd)?;
        let size = file_size(fd)?;
        let file = File::from(fd.try_clone_to_owned().map_err(Error::Dup)?);
        let allocator = rts_alloc::Allocator::join(&file).map_err(Error::Allocator)?;
        // SAFETY: offset 0 is the start of the allocator's own mapping (its header), which is
        // valid for every allocator; the pointer is used only as the base for bounds-checked copies.
        let base = unsafe { allocator.ptr_from_offset(0) };
        Ok(Self {
            allocator,
            base,
            size,
            live: HashSet::new(),
        })
    }

    /// The region's size in bytes.
    #[must_use]
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Copies `bytes` into a fresh block and returns its reference. An empty payload needs no
    /// block: its reference is offset 0, length 0.
    ///
    /// # Errors
    ///
    /// [`Error::TooLarge`] above [`MAX_PAYLOAD`] bytes; [`Error::Exhausted`] when no block is free
    /// even after reclaiming remote frees.
    pub fn alloc(&mut self, bytes: &[u8]) -> Result<PayloadRef, Error> {
        if bytes.is_empty() {
            return Ok(PayloadRef {
                offset: 0,
                len: 0,
                _pad0: 0,
            });
        }
        if bytes.len() > MAX_PAYLOAD {
            return Err(Error::TooLarge {
                max: MAX_PAYLOAD,
                found: bytes.len(),
            });
        }
        let len = bytes.len() as u32;
        let block = match self.allocator.allocate(len) {
            Some(block) => block,
            None => {
                self.allocator.clean_remote_frees();
                self.allocator.allocate(len).ok_or(Error::Exhausted {
                    requested: bytes.len(),
                })?
            }
        };
        // SAFETY: the block was just allocated with room for `len` bytes and is this process's
        // alone until its reference is sent; `bytes` is a separate, live slice.
        unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), block.as_ptr(), bytes.len()) };
        // SAFETY: `block` came from this allocator's `allocate`.
        let offset = unsafe { self.allocator.offset(block) } as u64;
        self.live.insert(offset);
        Ok(PayloadRef {
            offset,
            len,
            _pad0: 0,
        })
    }

    /// Copies the payload `payload` names out of the region, after checking it lies inside.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfBounds`] when the reference has nonzero padding, is longer than
    /// [`MAX_PAYLOAD`], or reaches past the region.
    pub fn read(&self, payload: PayloadRef) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        self.read_into(payload, &mut out)?;
        Ok(out)
    }

    /// Like [`Self::read`], into `out` (cleared first), reusing its allocation.
    ///
    /// # Errors
    ///
    /// As for [`Self::read`].
    pub fn read_into(&self, payload: PayloadRef, out: &mut Vec<u8>) -> Result<(), Error> {
        let len = payload.len as usize;
        let fits = payload._pad0 == 0
            && len <= MAX_PAYLOAD
            && payload
                .offset
                .checked_add(u64::from(payload.len))
                .is_some_and(|end| end <= self.size);
        if !fits {
            return Err(Error::OutOfBounds {
                offset: payload.offset,
                len: payload.len,
                pad: payload._pad0,
                region: self.size,
            });
        }
        out.clear();
        out.reserve(len);
        // SAFETY: `offset + len <= size` was checked above, and the mapping is `size` bytes from
        // `base`, so the result stays inside it.
        let source = unsafe { self.base.add(payload.offset as usize) };
        // SAFETY: the source range is mapped memory (as above); `out` has room for `len` bytes
        // and is private to this process, so the ranges cannot overlap.
        unsafe { core::ptr::copy_nonoverlapping(source.as_ptr(), out.as_mut_ptr(), len) };
        // SAFETY: the `len` bytes were just initialised by the copy.
        unsafe { out.set_len(len) };
        Ok(())
    }

    /// Frees a block this process allocated.
    ///
    /// # Errors
    ///
    /// [`Error::NotAllocatedHere`] for any reference this process did not get from
    /// [`Self::alloc`], or freed already. Nothing is freed then.
    pub fn free(&mut self, payload: PayloadRef) -> Result<(), Error> {
        if payload.len == 0 && payload.offset == 0 {
            return Ok(());
        }
        if !self.live.remove(&payload.offset) {
            return Err(Error::NotAllocatedHere {
                offset: payload.offset,
            });
        }
        // SAFETY: the offset is in this process's ledger of live blocks from `alloc`, so it names
        // a block this allocator handed out and that has not been freed.
        unsafe { self.allocator.free_offset(payload.offset as usize) };
        Ok(())
    }

    /// How many blocks this process has allocated and not yet freed.
    #[must_use]
    pub fn live_blocks(&self) -> usize {
        self.live.len()
    }
}
