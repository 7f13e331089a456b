//! The owner's side: an outbox only this process can write.

use crate::error::Error;
use crate::ledger::{Ledger, rank_bit};
use crate::ranges::Ranges;
use shmbroker_bindings::{OUTBOX_HEADER_BYTES, OutboxHeader, PayloadRef};
use shmbroker_queues::memfd::{Mapping, OWNER_ONLY_SEALS, create_sized, seal_with};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};

/// The smallest outbox: the header and one block of 4 KiB.
pub const MIN_OUTBOX_BYTES: u64 = OUTBOX_HEADER_BYTES + 4096;
/// The largest outbox: 1 TiB (address space, not memory: pages are allocated when first written).
pub const MAX_OUTBOX_BYTES: u64 = 1 << 40;
/// The outbox size when nothing else is configured: 64 MiB of address space. Memory is used only
/// for pages a transfer touches; pipelined transfers reuse the same few chunks.
pub const DEFAULT_OUTBOX_BYTES: u64 = 64 << 20;

/// Blocks handed back by [`Loan`]s dropped without being sent; the outbox reuses them at its next
/// allocation.
type Returns = Arc<Mutex<Vec<(u64, u64)>>>;

/// A worker's outbox: a memfd it created, mapped read-write, and then sealed so that no process
/// (itself included) can open a new way to write it. Peers map it read-only
/// ([`crate::PeerOutbox`]); the allocator and the ledger of who owes which acknowledgement are in
/// this struct, in this process's private memory.
pub struct Outbox {
    fd: OwnedFd,
    map: Arc<Mapping>,
    owner: u32,
    ranges: Ranges,
    ledger: Ledger,
    returns: Returns,
    /// Blocks given back (by a dropped [`Loan`]) while ranges of them were still lent in place:
    /// they are freed once those ranges are acknowledged.
    deferred: Vec<(u64, u64)>,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("owner", &self.owner)
            .field("size", &self.map.len())
            .field("blocks_owed", &self.ledger.len())
            .finish_non_exhaustive()
    }
}

/// A block of the outbox this process allocated and has not sent yet.
#[derive(Debug)]
#[must_use = "a block is returned with Outbox::release or sent with Outbox::send"]
pub struct Block {
    offset: u64,
    len: u64,
}

impl Block {
    /// Usable bytes (at least what was asked for).
    #[must_use]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the block has no bytes (never: blocks are at least one cache line).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Outbox {
    /// Creates the outbox of rank `owner`: `bytes` bytes in a fresh memfd, mapped read-write by
    /// this process and then sealed with [`OWNER_ONLY_SEALS`]. Hand [`Self::fd`] to peers only
    /// after this returns.
    ///
    /// # Errors
    ///
    /// [`Error::BadSize`] outside [`MIN_OUTBOX_BYTES`]..=[`MAX_OUTBOX_BYTES`]; [`Error::Memfd`]
    /// when a system call fails.
    pub fn create(owner: u32, bytes: u64) -> Result<Self, Error> {
        if !(MIN_OUTBOX_BYTES..=MAX_OUTBOX_BYTES).contains(&bytes) {
            return Err(Error::BadSize {
                min: MIN_OUTBOX_BYTES,
                max: MAX_OUTBOX_BYTES,
                found: bytes,
            });
        }
        let fd = create_sized(c"shmbroker-outbox", bytes)?;
        let map = Mapping::map(&fd, bytes)?;
        let header = OutboxHeader::new(owner, bytes);
        // SAFETY: the mapping is at least MIN_OUTBOX_BYTES long, so the header's 64 bytes fit at
        // its start; the file is new and no other process has it yet.
        unsafe {
            core::ptr::copy_nonoverlapping(
                bytemuck::bytes_of(&header).as_ptr(),
                map.as_ptr().as_ptr(),
                size_of::<OutboxHeader>(),
            );
        }
        // After this, only mappings made before it (this one) can write the file.
        seal_with(fd.as_fd(), OWNER_ONLY_SEALS)?;
        Ok(Self {
            fd,
            map: Arc::new(map),
            owner,
            ranges: Ranges::new(OUTBOX_HEADER_BYTES, bytes),
            ledger: Ledger::default(),
            returns: Arc::default(),
            deferred: Vec::new(),
        })
    }

    /// This outbox's status words, which only this process can write (see
    /// `shmbroker_bindings::status_word`).
    #[must_use]
    pub fn status(&self) -> crate::StatusWords {
        crate::StatusWords(Arc::clone(&self.map))
    }

    /// The memfd, to hand to peers (it is already sealed).
    #[must_use]
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The outbox's size in bytes.
    #[must_use]
    pub fn size(&self) -> u64 {
        self.map.len() as u64
    }

    /// The most bytes one block (and so one loan) can have.
    #[must_use]
    pub fn capacity(&self) -> u64 {
        self.ranges.capacity()
    }

    /// A free block of at least `len` bytes, or `None` while the blocks in flight leave no room
    /// (acknowledgements free them).
    ///
    /// # Errors
    ///
    /// [`Error::TooLarge`] when no block of `len` bytes can ever fit.
    pub fn try_alloc(&mut self, len: u64) -> Result<Option<Block>, Error> {
        if Ranges::block_len(len) > self.ranges.capacity() {
            return Err(Error::TooLarge {
                requested: len,
                capacity: self.ranges.capacity(),
            });
        }
        self.take_returns();
        let block = self
            .ranges
            .alloc(len)
            .map(|(offset, len)| Block { offset, len });
        self.publish_use();
        Ok(block)
    }

    /// Stores the bytes in blocks in the status words (`status_word::OUTBOX_USED`), for
    /// `shmbroker status`: one relaxed store.
    fn publish_use(&self) {
        crate::status::publish_use(&self.map, self.ranges.used_bytes());
    }

    fn take_returns(&mut self) {
        let returned: Vec<(u64, u64)> = self
            .returns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .collect();
        for (offset, len) in returned {
            if self.ledger.overlaps(offset, len) {
                self.deferred.push((offset, len));
            } else {
                self.ranges.free(offset, len);
            }
        }
    }

    /// Frees the deferred blocks no range lent in place holds any more.
    fn free_deferred(&mut self) {
        if self.deferred.is_empty() {
            return;
        }
        let (held, free): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|&(offset, len)| self.ledger.overlaps(offset, len));
        for (offset, len) in free {
            self.ranges.free(offset, len);
        }
        self.deferred = held;
        self.publish_use();
    }

    /// Lends `bytes`, which must lie in a block of this outbox that this process holds (a
    /// [`Loan`] not sent, such as a symmetric buffer), *in place* to the ranks in `receivers`:
    /// they read it where it lies, and acknowledge it as a block sent, but the block stays the
    /// holder's. Returns the reference to send them, or `None` (nothing recorded) when `bytes`
    /// is empty, lies outside the blocks held, or overlaps a range still lent. The holder must
    /// not write a byte a receiver reads until that receiver is done with it: the caller's
    /// protocol says when (an all-reduce's result slices do).
    pub fn lend_in_place(&mut self, bytes: &[u8], receivers: u64) -> Option<PayloadRef> {
        let parts = self.lend_in_place_parts(bytes, [(0..bytes.len(), receivers)])?;
        parts.first().copied()
    }

    /// [`Self::lend_in_place`] of several disjoint ranges of `bytes`, each to its own
    /// receivers, all or none: `parts` are byte ranges of `bytes`, in ascending order, none
    /// empty and none overlapping the next. Returns their references in that order, or `None`
    /// (nothing recorded) when `bytes` could not be lent in place, or `parts` are not as said.
    pub fn lend_in_place_parts(
        &mut self,
        bytes: &[u8],
        parts: impl IntoIterator<Item = (std::ops::Range<usize>, u64)>,
    ) -> Option<Vec<PayloadRef>> {
        let base = self.map.as_ptr().as_ptr() as usize;
        let offset = (bytes.as_ptr() as usize).checked_sub(base)? as u64;
        let len = bytes.len() as u64;
        let end = offset.checked_add(len)?;
        if bytes.is_empty() || offset < OUTBOX_HEADER_BYTES || end > self.size() {
            return None;
        }
        // Loans dropped meanwhile: their blocks are free, or deferred.
        self.take_returns();
        let held = self.ranges.is_held(offset, len)
            && !self.ledger.overlaps(offset, len)
            && !self
                .deferred
                .iter()
                .any(|&(start, block)| start < end && offset < start + block);
        if !held {
            return None;
        }
        let mut refs = Vec::new();
        let mut from = 0;
        for (range, receivers) in parts {
            if range.is_empty() || range.start < from || range.end > bytes.len() {
                return None;
            }
            from = range.end;
            refs.push((
                PayloadRef {
                    offset: offset + range.start as u64,
                    len: u32::try_from(range.len()).ok()?,
                    _pad0: 0,
                },
                receivers,
            ));
        }
        for &(sent, receivers) in &refs {
            self.ledger.insert_kept(sent, receivers);
        }
        Some(refs.into_iter().map(|(sent, _)| sent).collect())
    }

    /// Whether a range of `loan`'s block is still lent in place (it cannot be sent until every
    /// receiver has acknowledged it).
    #[must_use]
    pub fn lent_in_place(&self, loan: &Loan) -> bool {
        self.ledger.overlaps(loan.offset, loan.block_len)
    }

    /// The ranks that still owe an acknowledgement of `sent` (a bit each, see
    /// [`crate::rank_bit`]); 0 once none does.
    #[must_use]
    pub fn owed_for(&self, sent: PayloadRef) -> u64 {
        self.ledger.owed_for(sent)
    }

    /// Copies `data` into `block` from byte `at` on.
    ///
    /// # Errors
    ///
    /// [`Error::TooLarge`] when `data` does not fit in the block from `at`; nothing is written.
    pub fn write(&mut self, block: &Block, at: u64, data: &[u8]) -> Result<(), Error> {
        let fits = at
            .checked_add(data.len() as u64)
            .is_some_and(|end| end <= block.len);
        if !fits {
            return Err(Error::TooLarge {
                requested: at.saturating_add(data.len() as u64),
                capacity: block.len,
            });
        }
        let start = self.map.at((block.offset + at) as usize);
        // SAFETY: `block` lies inside the mapping (the allocator only hands out ranges of
        // [header, size)) and `at + data.len() <= block.len` was checked above, so the destination
        // is mapped, writable (this process mapped it before sealing) and this block's alone;
        // `data` is private memory of this process, so the ranges do not overlap.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), start.as_ptr(), data.len()) };
        Ok(())
    }

    /// Hands the first `len` bytes of `block` to the ranks in `receivers` (a bit mask, bit `r`
    /// for rank `r`): returns the reference to send them. The block comes back when every one of
    /// them has acknowledged it ([`Self::ack`]) or been [`Self::forget`]-ed.
    ///
    /// # Errors
    ///
    /// [`Error::TooLarge`] when `len` exceeds the block or a reference's 32-bit length.
    pub fn send(&mut self, block: Block, len: u64, receivers: u64) -> Result<PayloadRef, Error> {
        let Ok(ref_len) = u32::try_from(len) else {
            self.release(block);
            return Err(Error::TooLarge {
                requested: len,
                capacity: u64::from(u32::MAX),
            });
        };
        if len > block.len {
            let capacity = block.len;
            self.release(block);
            return Err(Error::TooLarge {
                requested: len,
                capacity,
            });
        }
        let sent = PayloadRef {
            offset: block.offset,
            len: ref_len,
            _pad0: 0,
        };
        if !self.ledger.insert(sent, block.len, receivers) {
            self.release(block);
        }
        Ok(sent)
    }

    /// Returns a block that was never sent.
    pub fn release(&mut self, block: Block) {
        self.ranges.free(block.offset, block.len);
        self.publish_use();
    }

    /// Takes rank `rank`'s acknowledgement of `acked`, freeing the block when it was the last
    /// (then `true`).
    ///
    /// # Errors
    ///
    /// [`Error::Ack`] for an acknowledgement of a block that was not sent, was sent otherwise,
    /// or that `rank` does not owe (a second one, or a block it never got). Nothing is freed.
    pub fn ack(&mut self, rank: u32, acked: PayloadRef) -> Result<bool, Error> {
        match self.ledger.ack(rank, acked) {
            Ok(Some((offset, len))) => {
                self.ranges.free(offset, len);
                self.publish_use();
                Ok(true)
            }
            Ok(None) => {
                self.free_deferred();
                Ok(false)
            }
            Err(fault) => Err(Error::Ack {
                rank,
                offset: acked.offset,
                len: acked.len,
                fault,
            }),
        }
    }

    /// Drops `rank` (dead or gone) from every block's owed set, freeing what only it owed;
    /// returns the offsets of the blocks freed.
    pub fn forget(&mut self, rank: u32) -> Vec<u64> {
        let freed = self.ledger.forget(rank);
        for &(offset, len) in &freed {
            self.ranges.free(offset, len);
        }
        self.free_deferred();
        self.publish_use();
        freed.into_iter().map(|(offset, _)| offset).collect()
    }

    /// Blocks sent and not yet acknowledged by every receiver.
    #[must_use]
    pub fn blocks_owed(&self) -> usize {
        self.ledger.len()
    }

    /// Blocks `rank` still owes an acknowledgement for.
    #[must_use]
    pub fn owed_by(&self, rank: u32) -> usize {
        self.ledger.owed_by(rank)
    }

    /// Bytes not in any block (sent, loaned or being filled).
    #[must_use]
    pub fn free_bytes(&mut self) -> u64 {
        self.take_returns();
        self.ranges.free_bytes()
    }

    /// A writable loan of `len` bytes, or `None` while blocks in flight leave no room.
    ///
    /// # Errors
    ///
    /// [`Error::TooLarge`] when `len` can never fit (or exceeds a reference's 32-bit length).
    pub fn try_loan(&mut self, len: usize) -> Result<Option<Loan>, Error> {
        if u32::try_from(len).is_err() {
            return Err(Error::TooLarge {
                requested: len as u64,
                capacity: u64::from(u32::MAX),
            });
        }
        Ok(self.try_alloc(len as u64)?.map(|block| Loan {
            map: Arc::clone(&self.map),
            returns: Arc::clone(&self.returns),
            offset: block.offset,
            block_len: block.len,
            len,
            sent: false,
        }))
    }

    /// Hands `loan` to the ranks in `receivers`, as [`Self::send`] does a block.
    ///
    /// # Errors
    ///
    /// [`Error::ForeignLoan`] when the loan came from another outbox (it is dropped, and goes
    /// back to that one).
    pub fn send_loan(&mut self, loan: Loan, receivers: u64) -> Result<PayloadRef, Error> {
        if !Arc::ptr_eq(&loan.map, &self.map) {
            return Err(Error::ForeignLoan);
        }
        let block = Block {
            offset: loan.offset,
            len: loan.block_len,
        };
        let len = loan.len as u64;
        let mut loan = loan;
        loan.sent = true;
        drop(loan);
        self.send(block, len, receivers)
    }

    /// The bit mask of `ranks`, for [`Self::send`].
    #[must_use]
    pub fn receivers(ranks: impl IntoIterator<Item = u32>) -> u64 {
        ranks
            .into_iter()
            .fold(0, |mask, rank| mask | rank_bit(rank))
    }
}

/// A writable buffer in this process's outbox, handed to peers by reference with
/// `Session::send_loan`. Dropped unsent, it goes back to the outbox.
pub struct Loan {
    map: Arc<Mapping>,
    returns: Returns,
    offset: u64,
    block_len: u64,
    len: usize,
    /// Set when the loan is handed to peers: its block then belongs to the ledger.
    sent: bool,
}

impl std::fmt::Debug for Loan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loan")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

// SAFETY: a loan is the only handle on its bytes until it is sent or dropped; the mapping it
// points into lives as long as its `Arc`, and the return list is behind a mutex.
unsafe impl Send for Loan {}

impl std::ops::Deref for Loan {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let start = self.map.at(self.offset as usize);
        // SAFETY: the block lies inside the mapping, which the `Arc` keeps alive; the owner's
        // allocator gave it to this loan alone, and peers cannot write the file (owner-only
        // seals), so nothing else writes these bytes while the loan exists.
        unsafe { std::slice::from_raw_parts(start.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for Loan {
    fn deref_mut(&mut self) -> &mut [u8] {
        let start = self.map.at(self.offset as usize);
        // SAFETY: as for `deref`; `&mut self` makes this the only reference into the block, and
        // the mapping is writable (it was made before the seals).
        unsafe { std::slice::from_raw_parts_mut(start.as_ptr(), self.len) }
    }
}

impl Loan {
    /// A [`Pin`] on the mapping this loan's bytes lie in.
    #[must_use]
    pub fn pin(&self) -> Pin {
        Pin(Arc::clone(&self.map))
    }
}

/// Keeps the mapping a [`Loan`] or a [`View`](crate::View) lies in mapped after the loan is sent
/// or the view dropped, for a language binding that hands out raw addresses into it (Python's
/// buffer objects, which may outlive both): reading or writing at such an address then never
/// faults, though the bytes may by then belong to another message. It gives no access itself.
#[derive(Clone, Debug)]
pub struct Pin(
    #[expect(
        dead_code,
        reason = "held, never read: the mapping goes with the last holder"
    )]
    pub(crate) Arc<Mapping>,
);

impl Drop for Loan {
    fn drop(&mut self) {
        if self.sent {
            return;
        }
        self.returns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((self.offset, self.block_len));
    }
}
