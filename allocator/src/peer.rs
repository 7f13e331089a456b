//! A peer's side: another rank's outbox, mapped read-only, and references into it checked.

use crate::error::Error;
use crate::outbox::{MAX_OUTBOX_BYTES, MIN_OUTBOX_BYTES};
use shmbroker_bindings::{
    OUTBOX_HEADER_BYTES, OUTBOX_LAYOUT_VERSION, OUTBOX_MAGIC, OutboxHeader, PayloadRef,
};
use shmbroker_queues::memfd::{
    Mapping, OWNER_ONLY_SEALS, check_seals_with, check_shmem, file_size,
};
use std::os::fd::BorrowedFd;
use std::sync::Arc;

/// Checks a reference a peer sent against its outbox of `size` bytes: zero padding, and the whole
/// range inside the blocks (after the header). Returns the range as `(offset, len)`.
///
/// # Errors
///
/// [`Error::OutOfBounds`] naming what arrived.
pub fn check_ref(owner: u32, payload: PayloadRef, size: u64) -> Result<(usize, usize), Error> {
    let fits = payload._pad0 == 0
        && payload.offset >= OUTBOX_HEADER_BYTES
        && payload
            .offset
            .checked_add(u64::from(payload.len))
            .is_some_and(|end| end <= size);
    if fits {
        Ok((payload.offset as usize, payload.len as usize))
    } else {
        Err(Error::OutOfBounds {
            owner,
            offset: payload.offset,
            len: payload.len,
            pad: payload._pad0,
            first: OUTBOX_HEADER_BYTES,
            region: size,
        })
    }
}

/// Another rank's outbox, mapped read-only. Cheap to clone (the mapping is shared).
#[derive(Debug, Clone)]
pub struct PeerOutbox {
    map: Arc<Mapping>,
    owner: u32,
}

impl PeerOutbox {
    /// Maps rank `owner`'s outbox `fd` read-only, after checking that its seals keep every other
    /// process from writing or resizing it, that its size is one an outbox can have, and that the
    /// header its owner wrote says so.
    ///
    /// # Errors
    ///
    /// [`Error::Memfd`] for missing seals or a failing system call, [`Error::BadSize`],
    /// [`Error::BadHeader`].
    pub fn join(fd: BorrowedFd<'_>, owner: u32) -> Result<Self, Error> {
        check_seals_with(fd, OWNER_ONLY_SEALS)?;
        check_shmem(fd)?;
        let size = file_size(fd)?;
        if !(MIN_OUTBOX_BYTES..=MAX_OUTBOX_BYTES).contains(&size) {
            return Err(Error::BadSize {
                min: MIN_OUTBOX_BYTES,
                max: MAX_OUTBOX_BYTES,
                found: size,
            });
        }
        let map = Mapping::map_read_only(fd, size)?;
        let mut header = OutboxHeader::new(0, 0);
        // SAFETY: the mapping is at least MIN_OUTBOX_BYTES long, so its first 64 bytes are mapped
        // and readable (the size is sealed); `header` is a private, distinct local.
        unsafe {
            core::ptr::copy_nonoverlapping(
                map.as_ptr().as_ptr(),
                bytemuck::bytes_of_mut(&mut header).as_mut_ptr(),
                size_of::<OutboxHeader>(),
            );
        }
        let checks = [
            ("magic", OUTBOX_MAGIC, header.magic),
            (
                "version",
                u64::from(OUTBOX_LAYOUT_VERSION),
                u64::from(header.version),
            ),
            ("owner_rank", u64::from(owner), u64::from(header.owner_rank)),
            ("file_size", size, header.file_size),
        ];
        for (field, expected, found) in checks {
            if expected != found {
                return Err(Error::BadHeader {
                    owner,
                    field,
                    expected,
                    found,
                });
            }
        }
        if let Some(&found) = header._pad.iter().find(|&&pad| pad != 0) {
            return Err(Error::BadHeader {
                owner,
                field: "_pad",
                expected: 0,
                found,
            });
        }
        Ok(Self {
            map: Arc::new(map),
            owner,
        })
    }

    /// The outbox's size in bytes.
    #[must_use]
    pub fn size(&self) -> u64 {
        self.map.len() as u64
    }

    /// The rank that owns (and alone writes) this outbox.
    #[must_use]
    pub fn owner(&self) -> u32 {
        self.owner
    }

    /// Copies the bytes `payload` names into `out`, which must be exactly `payload.len` long;
    /// checks the reference first. The bytes are read once; what the owner writes there meanwhile
    /// can only change their values, never where they are read from.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfBounds`] for a reference outside the blocks; [`Error::LengthMismatch`] for
    /// one whose length is not `out.len()`.
    pub fn read_into(&self, payload: PayloadRef, out: &mut [u8]) -> Result<(), Error> {
        let (offset, len) = check_ref(self.owner, payload, self.size())?;
        if len != out.len() {
            return Err(Error::LengthMismatch {
                expected: out.len(),
                found: payload.len,
            });
        }
        let source = self.map.at(offset);
        // SAFETY: `offset + len <= size` was checked, so the source range is inside the mapping
        // (sealed against shrinking, so it stays backed); `out` is this process's private memory,
        // which the read-only mapping cannot overlap.
        unsafe { core::ptr::copy_nonoverlapping(source.as_ptr(), out.as_mut_ptr(), len) };
        Ok(())
    }

    /// A zero-copy view of the bytes `payload` names, after checking the reference.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfBounds`].
    pub fn view(&self, payload: PayloadRef) -> Result<View, Error> {
        let (offset, len) = check_ref(self.owner, payload, self.size())?;
        Ok(View {
            map: Arc::clone(&self.map),
            offset,
            len,
        })
    }
}

/// Bytes in a peer's outbox, read in place.
///
/// # Trust
///
/// The view is always in bounds and the memory stays mapped for as long as the view lives, so
/// reading it can never fault. Its owner is the one process that can write those bytes: an honest
/// owner does not touch a block it sent until every receiver has let go of it, but a buggy or
/// hostile owner can change them at any time, and the view then reads whatever is there. Copy
/// what you must validate before trusting it.
#[derive(Debug, Clone)]
pub struct View {
    map: Arc<Mapping>,
    offset: usize,
    len: usize,
}

impl PeerOutbox {
    /// A copy of the owner's status words (see `shmbroker_bindings::status_word`): whatever the
    /// owner wrote there, to be checked before it is believed.
    #[must_use]
    pub fn status(&self) -> crate::Snapshot {
        crate::status::read_slots(&self.map)
    }
}

impl View {
    /// A [`Pin`](crate::Pin) on the mapping this view reads.
    #[must_use]
    pub fn pin(&self) -> crate::Pin {
        crate::Pin(Arc::clone(&self.map))
    }
}

// SAFETY: a view only reads a mapping its `Arc` keeps alive.
unsafe impl Send for View {}
// SAFETY: as for `Send`: shared access is read-only.
unsafe impl Sync for View {}

impl std::ops::Deref for View {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let start = self.map.at(self.offset);
        // SAFETY: the range was checked against the mapping's size when the view was made, and
        // the `Arc` keeps the mapping alive. This is the one documented place where a reference
        // to memory another process can write is handed out (see "Trust" above): the owner's
        // writes can change the values read, never their location or length.
        unsafe { std::slice::from_raw_parts(start.as_ptr(), self.len) }
    }
}
