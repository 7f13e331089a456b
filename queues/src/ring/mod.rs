//! The single-producer single-consumer ring and its cursor protocol.
//!
//! # Memory layout
//!
//! ```text
//! offset    0  RingLayout (magic, version, message size/align, slot size, capacity, file size)
//! offset  128  consumer wait word ........ swapped by the producer on every publish
//! offset  256  consumer cursor `head`,
//!              producer wait word ........ written by the consumer on every release
//! offset  384  close and join flags ...... written once each, read often
//! offset  512  slot 0, slot 1, ... slot capacity-1; each slot is { seq: u64, message: T }
//! ```
//!
//! Every field a side writes on its hot path sits on a 128-byte block of its own (two cache lines,
//! because adjacent-line prefetch pairs them), so the only cache line that travels per message is
//! the slot itself.
//!
//! # The cursor protocol
//!
//! Positions count messages from 0 and never wrap in practice (`u64`). Position `p` lives in slot
//! `p & mask`. The slot's sequence word tells the consumer whether the message for `p` is there:
//!
//! * `seq == p + 1`: published for position `p` ("ready");
//! * `seq == p + 1 - capacity`: still holds position `p - capacity` ("pending");
//! * `seq == 0` while `p < capacity`: never written ("pending" too). A fresh file is all zeros, so
//!   [`create`] writes nothing but the layout: creating a ring is O(1) whatever its capacity;
//! * anything else: no correct producer wrote it, and the consumer reports
//!   [`Corruption::SlotSequence`].
//!
//! *Producer*, sending `n` messages at its position `tail`: it needs `n` free slots. It keeps a
//! private copy of the consumer cursor and re-reads `head` (Acquire) only when that copy says there
//! is not enough room. It writes the messages, stores the sequence words of all but the first slot
//! (Relaxed), then the first slot's (Release), then wakes the consumer if it parked.
//!
//! *Consumer*, at its position `head`: it reads the sequence word of `head` (Acquire). When ready
//! it copies the message out and moves on to the next slot while those are ready, then stores its
//! new `head` (Release) once for the whole batch and wakes the producer if it parked.
//!
//! # Why it is correct
//!
//! * **Visibility.** A consumer that reads `seq == p + 1` for the first slot of a batch
//!   synchronises with the producer's Release store, which is sequenced after the writes of every
//!   message in the batch and every other sequence word in it. So all of them happen-before the
//!   consumer's reads, and the later sequence words read as "ready" by coherence.
//! * **No overwrite of unread slots.** The producer writes slot `p & mask` only when
//!   `p - head < capacity` for a `head` it read with Acquire from the consumer's Release store, and
//!   the consumer stores `head` only after copying the messages out. So the copy happens-before
//!   the overwrite.
//! * **FIFO, no loss, no duplicates.** Each side is the only writer of its cursor; each position is
//!   written once by the producer and read once by the consumer, in increasing order.
//! * **Close.** Dropping an endpoint stores its close flag (Release) and wakes the other side
//!   ([`close`] does the same for both ends, for a third process acting for a dead peer). A
//!   consumer that finds its slot pending reads `producer_closed` (Acquire); if set it re-reads the
//!   slot, which now shows everything sent before the close, and reports `Disconnected` only when
//!   that too is pending. So all messages are drained first.
//! * **Parking.** See the [`crate::futex`] module: a waker's swap after publishing and a waiter's
//!   swap before re-checking can never both miss each other.
//!
//! The loom tests in `loom_tests.rs` check these claims on a ring of two slots.
//!
//! # Memory another process writes
//!
//! The peer can write anything anywhere in the file at any time. This code stays in bounds and
//! panic-free regardless:
//!
//! * The layout is copied out of shared memory once, at join, and checked against `T` and the
//!   `fstat` size of a file sealed against resizing. From then on `mask`, `capacity` and the slot
//!   pointer come from that private copy; the header is never re-read for geometry.
//! * Slot indices are always `position & mask` of a *private* position, so they are in bounds.
//! * `head` read from shared memory is only compared; a value that would mean "more free slots
//!   than the ring has" is reported as [`Corruption::ConsumerCursor`], never used as an index.
//! * Sequence words are only compared for equality.
//! * Messages are `Pod`: whatever bytes a peer leaves in a slot read back as a valid `T`, perhaps
//!   garbage, never undefined behaviour. A message is read once into a private copy; it is never
//!   re-read from shared memory after validation.

use crate::error::{
    Corruption, Error, RecvTimeoutError, Role, SendTimeoutError, TryRecvError, TrySendError,
};
use crate::futex::{Deadline, WaitWord};
use crate::interrupt::Interrupt;
use crate::readiness::Notifier;
use crate::sync::{AtomicU32, AtomicU64, Ordering, UnsafeCell};
use crate::waiting::{Patience, Waiting};
use bytemuck::Pod;
use core::fmt;
use core::marker::PhantomData;
use core::ptr::NonNull;
use shmbroker_bindings::RingLayout;
#[cfg(not(loom))]
use shmbroker_bindings::{RING_LAYOUT_VERSION, RING_MAGIC};
#[cfg(not(loom))]
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

/// Spins before parking under a fixed [`Waiting::Spin`] policy, as rings waited before
/// adaptive waiting: roughly the cost of one futex wake-up.
pub const DEFAULT_SPIN_LIMIT: u32 = crate::waiting::SPIN_MAX;

/// Largest capacity [`create`] accepts: 2^30 slots.
pub const MAX_CAPACITY: u64 = 1 << 30;

/// Size of the ring header; slot 0 starts here (or at the next multiple of the slot alignment).
pub const HEADER_SIZE: usize = 512;

/// Pads and aligns its contents to a 128-byte block.
#[repr(C, align(128))]
struct Block<T>(T);

// The layout is plain data written before any other process can see the file and only ever read
// by copying, never concurrently with a write by this protocol: loom has nothing to check there.
#[allow(clippy::disallowed_types)]
#[repr(C)]
struct Header {
    /// Plain data, written before any other process can see the file; read only by copying.
    layout: Block<core::cell::UnsafeCell<RingLayout>>,
    consumer_wait: Block<WaitWord>,
    consumer: Block<ConsumerShared>,
    control: Block<Control>,
}

#[repr(C)]
struct ConsumerShared {
    head: AtomicU64,
    producer_wait: WaitWord,
}

#[repr(C)]
struct Control {
    producer_closed: AtomicU32,
    consumer_closed: AtomicU32,
    producer_joined: AtomicU32,
    consumer_joined: AtomicU32,
    /// Set by [`close`] before the close flags: `CAUSE_SET | cause`, or 0.
    cause: AtomicU64,
}

/// Marks `Control::cause` as holding a cause (so that cause 0 is distinguishable from none).
const CAUSE_SET: u64 = 1 << 32;

#[cfg(not(loom))]
const _: () = assert!(size_of::<Header>() == HEADER_SIZE);

#[repr(C)]
struct Slot<T> {
    seq: AtomicU64,
    message: UnsafeCell<T>,
}

/// Geometry of a ring of `T`, computed at compile time.
struct Geometry<T>(PhantomData<T>);

impl<T> Geometry<T> {
    const SLOT_SIZE: usize = size_of::<Slot<T>>();
    const SLOTS_OFFSET: usize = HEADER_SIZE.next_multiple_of(align_of::<Slot<T>>());
    /// Mappings are page-aligned, so any alignment up to a page holds in shared memory.
    const CHECK: () = {
        assert!(
            align_of::<Slot<T>>() <= 4096,
            "message alignment above 4096 is unsupported"
        );
        assert!(
            Self::SLOT_SIZE <= u32::MAX as usize,
            "message too large for a ring slot"
        );
    };

    fn layout(capacity: u64) -> RingLayout {
        let () = Self::CHECK;
        RingLayout::new(
            size_of::<T>() as u32,
            align_of::<T>() as u32,
            Self::SLOT_SIZE as u32,
            capacity,
            Self::SLOTS_OFFSET as u64,
        )
    }
}

/// The sequence word a slot holds while the message for `position` is not there yet: the one of
/// the previous lap (for the first lap, a fresh file's zero is accepted too).
fn pending_seq(position: u64, capacity: u64) -> u64 {
    position.wrapping_add(1).wrapping_sub(capacity)
}

/// What keeps a ring's memory alive: shared by the endpoint and any [`Closer`] made from it.
#[derive(Clone)]
enum Backing {
    #[cfg(not(loom))]
    Mapped(#[allow(dead_code)] std::sync::Arc<crate::memfd::Mapping>),
    #[cfg(loom)]
    Heap(#[allow(dead_code)] std::sync::Arc<dyn Send + Sync>),
}

/// One endpoint's view of a ring: validated geometry plus pointers into the backing memory.
struct RingRef<T> {
    header: NonNull<Header>,
    slots: NonNull<Slot<T>>,
    mask: u64,
    capacity: u64,
    /// The eventfd of this ring's consumer, when it has one: what a waker signals when the
    /// consumer sleeps on it (see the `readiness` module).
    notifier: Option<Notifier>,
    _backing: Backing,
}

impl<T: Pod> RingRef<T> {
    fn header(&self) -> &Header {
        // SAFETY: `header` points to a live, aligned `Header` for as long as `_backing` lives,
        // which is as long as `self`. Everything in it except `layout` is atomics, and `layout`
        // sits in an `UnsafeCell` and is only read by copying.
        unsafe { self.header.as_ref() }
    }

    fn slot(&self, position: u64) -> &Slot<T> {
        // `index < capacity` because `mask == capacity - 1` and capacity is a power of two.
        let index = (position & self.mask) as usize;
        // SAFETY: `index < capacity`, and the backing holds `capacity` slots from `slots`.
        let slot = unsafe { self.slots.add(index) };
        // SAFETY: the slot is live and aligned as above; its fields are an atomic and a cell.
        unsafe { slot.as_ref() }
    }

    /// Whether the message for `position` is in its slot (Acquire).
    fn poll(&self, position: u64) -> Result<bool, Corruption> {
        let found = self.slot(position).seq.load(Ordering::Acquire);
        let ready = position.wrapping_add(1);
        if found == ready {
            return Ok(true);
        }
        let pending = pending_seq(position, self.capacity);
        if found == pending || (found == 0 && position < self.capacity) {
            return Ok(false);
        }
        Err(Corruption::SlotSequence {
            position,
            ready,
            pending,
            found,
        })
    }
}

impl<T> RingRef<T> {
    /// Another view of the same memory, for a [`Closer`].
    fn share(&self) -> Self {
        Self {
            header: self.header,
            slots: self.slots,
            mask: self.mask,
            capacity: self.capacity,
            notifier: self.notifier.clone(),
            _backing: self._backing.clone(),
        }
    }

    fn control(&self) -> &Control {
        // SAFETY: as in `header` above (this impl has no `Pod` bound, so it cannot call it).
        let header = unsafe { self.header.as_ref() };
        &header.control.0
    }

    /// The cause a third party closed the ring with, if it did (Acquire: pairs with the Release
    /// store in [`Self::close_with_cause`], made before the close flags).
    fn close_cause(&self) -> Option<u32> {
        let cause = self.control().cause.load(Ordering::Acquire);
        (cause & CAUSE_SET != 0).then_some(cause as u32)
    }

    /// Records `cause`, then closes both ends. The cause is stored before the close flags, so
    /// whoever sees the ring closed sees the cause too.
    fn close_with_cause(&self, cause: u32) {
        self.control()
            .cause
            .store(CAUSE_SET | u64::from(cause), Ordering::Release);
        self.close_end(Role::Producer);
        self.close_end(Role::Consumer);
    }

    /// Wakes the `role` side if it parked, without publishing anything of the ring's own.
    fn wake(&self, role: Role) {
        // SAFETY: as in `header` above (repeated here because this impl has no `Pod` bound).
        let header = unsafe { self.header.as_ref() };
        match role {
            Role::Consumer => header
                .consumer_wait
                .0
                .wake_or_notify(self.notifier.as_ref()),
            Role::Producer => header.consumer.0.producer_wait.wake(),
        }
    }

    /// Closes one end: stores its close flag (Release) and wakes the other side if it parked.
    /// What dropping that end does, and what [`close`] does for both ends on a dead peer's behalf.
    fn close_end(&self, role: Role) {
        // SAFETY: as in `header` above (repeated here because this impl has no `Pod` bound).
        let header = unsafe { self.header.as_ref() };
        match role {
            Role::Producer => {
                header.control.0.producer_closed.store(1, Ordering::Release);
                header
                    .consumer_wait
                    .0
                    .wake_or_notify(self.notifier.as_ref());
            }
            Role::Consumer => {
                header.control.0.consumer_closed.store(1, Ordering::Release);
                header.consumer.0.producer_wait.wake();
            }
        }
    }
}

/// Private state of the sending side.
struct SendCursor {
    /// Next position to write.
    tail: u64,
    /// Last consumer cursor read from shared memory.
    head_cache: u64,
}

impl SendCursor {
    /// Sends as many of `messages` as fit (at least one, unless none fit), in one publication.
    fn try_send<T: Pod>(
        &mut self,
        ring: &RingRef<T>,
        messages: &[T],
    ) -> Result<usize, TrySendError<()>> {
        let control = &ring.header().control.0;
        if control.consumer_closed.load(Ordering::Acquire) != 0 {
            return Err(TrySendError::Disconnected(()));
        }
        let wanted = messages.len() as u64;
        let mut free = ring.capacity - self.tail.wrapping_sub(self.head_cache);
        if free < wanted {
            let head = ring.header().consumer.0.head.load(Ordering::Acquire);
            let used = self.tail.wrapping_sub(head);
            if used > ring.capacity {
                return Err(TrySendError::Corrupted(
                    (),
                    Corruption::ConsumerCursor {
                        head,
                        tail: self.tail,
                        capacity: ring.capacity,
                    },
                ));
            }
            self.head_cache = head;
            free = ring.capacity - used;
        }
        let count = wanted.min(free) as usize;
        if count == 0 {
            return Err(TrySendError::Full(()));
        }
        let first = self.tail;
        for (offset, message) in messages[..count].iter().enumerate() {
            let position = first.wrapping_add(offset as u64);
            let slot = ring.slot(position);
            // SAFETY: the consumer has released this slot (checked above against an Acquire read
            // of `head`), so no one else accesses it until its sequence word is published below.
            slot.message.with_mut(|ptr| unsafe { ptr.write(*message) });
            if offset > 0 {
                // Made visible by the Release store to the first slot below.
                slot.seq.store(position.wrapping_add(1), Ordering::Relaxed);
            }
        }
        ring.slot(first)
            .seq
            .store(first.wrapping_add(1), Ordering::Release);
        self.tail = first.wrapping_add(count as u64);
        ring.header()
            .consumer_wait
            .0
            .wake_or_notify(ring.notifier.as_ref());
        Ok(count)
    }
}

/// Private state of the receiving side.
struct RecvCursor {
    /// Next position to read.
    head: u64,
}

impl RecvCursor {
    /// Receives up to `max` ready messages into `sink`, releasing their slots in one store.
    fn take<T: Pod>(
        &mut self,
        ring: &RingRef<T>,
        max: usize,
        mut sink: impl FnMut(usize, T),
    ) -> Result<usize, Corruption> {
        let mut count = 0;
        while count < max {
            let position = self.head.wrapping_add(count as u64);
            match ring.poll(position) {
                Ok(true) => {}
                Ok(false) => break,
                // Hand over what was read intact; the corruption shows on the next call.
                Err(_) if count > 0 => break,
                Err(corruption) => return Err(corruption),
            }
            // SAFETY: the slot is published for this position (Acquire above), and the producer
            // does not write it again until `head` moves past it below.
            let message = ring
                .slot(position)
                .message
                .with(|ptr| unsafe { ptr.read() });
            sink(count, message);
            count += 1;
        }
        if count > 0 {
            self.head = self.head.wrapping_add(count as u64);
            let shared = &ring.header().consumer.0;
            shared.head.store(self.head, Ordering::Release);
            shared.producer_wait.wake();
        }
        Ok(count)
    }

    /// Like [`Self::take`], but tells an empty ring from a closed-and-drained one.
    fn try_recv<T: Pod>(
        &mut self,
        ring: &RingRef<T>,
        max: usize,
        mut sink: impl FnMut(usize, T),
    ) -> Result<usize, TryRecvError> {
        let count = self
            .take(ring, max, &mut sink)
            .map_err(TryRecvError::Corrupted)?;
        if count > 0 || max == 0 {
            return Ok(count);
        }
        if ring
            .header()
            .control
            .0
            .producer_closed
            .load(Ordering::Acquire)
            == 0
        {
            return Err(TryRecvError::Empty);
        }
        // The close was stored after the last publication: look once more.
        match self
            .take(ring, max, sink)
            .map_err(TryRecvError::Corrupted)?
        {
            0 => Err(TryRecvError::Disconnected),
            count => Ok(count),
        }
    }
}

/// Maps a ring file and checks everything in it against `T` before trusting any of it, then
/// claims `role` (each role can be claimed once).
#[cfg(not(loom))]
fn join_ring<T: Pod>(fd: BorrowedFd<'_>, role: Role) -> Result<RingRef<T>, Error> {
    let ring = map_ring::<T>(fd)?;
    let control = &ring.header().control.0;
    let flag = match role {
        Role::Producer => &control.producer_joined,
        Role::Consumer => &control.consumer_joined,
    };
    if flag.swap(1, Ordering::AcqRel) != 0 {
        return Err(Error::AlreadyJoined { role });
    }
    Ok(ring)
}

/// Maps a ring file and checks everything in it against `T`, claiming no role.
#[cfg(not(loom))]
fn map_ring<T: Pod>(fd: BorrowedFd<'_>) -> Result<RingRef<T>, Error> {
    use crate::memfd::{Mapping, check_seals, file_size};

    check_seals(fd)?;
    let size = file_size(fd)?;
    if size < HEADER_SIZE as u64 {
        return Err(Error::FileTooSmall {
            minimum: HEADER_SIZE as u64,
            found: size,
        });
    }
    let mapping = Mapping::map(fd, size)?;
    let header = mapping.as_ptr().cast::<Header>();
    // SAFETY: the mapping is page-aligned and at least `HEADER_SIZE` bytes long. A volatile copy
    // reads the bytes once, whatever a peer does to them meanwhile; every bit pattern is a valid
    // `RingLayout`.
    let found = unsafe { core::ptr::read_volatile(header.cast::<RingLayout>().as_ptr()) };
    let layout = validate_layout::<T>(&found, size)?;
    let ring = RingRef {
        header,
        // `slots_offset + capacity * slot_size == size` was checked, so all slots are mapped.
        slots: mapping.at(layout.slots_offset as usize).cast::<Slot<T>>(),
        mask: layout.capacity - 1,
        capacity: layout.capacity,
        notifier: None,
        _backing: Backing::Mapped(std::sync::Arc::new(mapping)),
    };
    Ok(ring)
}

/// Closes both ends of the ring in `fd` on behalf of processes that cannot close them
/// themselves (a peer that died without dropping its end), exactly as if both ends had been
/// dropped: the consumer still receives everything sent, then `Disconnected`; the producer gets
/// `Disconnected`; whichever side is parked is woken. Either end can then read `cause`
/// (`close_cause`), a number the closer chose (a hint: whoever can write the file can write it
/// too). Safe on a ring already closed. Within a process holding an end, [`Closer`] does the same
/// without mapping the file again.
///
/// # Errors
///
/// As for [`Producer::join`], less [`Error::AlreadyJoined`]: the file must be a ring of `T`.
#[cfg(not(loom))]
pub fn close<T: Pod>(fd: BorrowedFd<'_>, cause: u32) -> Result<(), Error> {
    map_ring::<T>(fd)?.close_with_cause(cause);
    Ok(())
}

/// A handle that closes a ring from another thread of the process holding one of its ends: a
/// watcher that learns the peer died (from its pidfd) closes the rings of the session with it,
/// waking whichever side is parked there, exactly as [`close`] does from another process.
///
/// It shares the endpoint's mapping and its validated geometry; it never re-reads the layout a
/// peer could have scribbled on, so closing works whatever the peer left in the header.
pub struct Closer<T>(RingRef<T>);

// SAFETY: a closer only stores to the control block's atomics and wakes futex words, all through
// shared references to atomics in memory its backing keeps mapped; any thread may do that.
unsafe impl<T> Send for Closer<T> {}
// SAFETY: as for `Send`: every operation takes `&self` and touches only atomics.
unsafe impl<T> Sync for Closer<T> {}

impl<T> Closer<T> {
    /// Closes both ends with `cause`, waking whichever side is parked: the consumer still
    /// receives what was sent, then `Disconnected`; the producer gets `Disconnected`. Safe to call
    /// again, and on a ring already closed.
    pub fn close(&self, cause: u32) {
        self.0.close_with_cause(cause);
    }

    /// The cause a [`Self::close`] (or [`close`]) gave, if one did; an end closed by dropping it
    /// (or by [`Self::close_end`]) leaves none.
    #[must_use]
    pub fn close_cause(&self) -> Option<u32> {
        self.0.close_cause()
    }

    /// Closes only the `role` end, as dropping that end would (waking the other side).
    pub fn close_end(&self, role: Role) {
        self.0.close_end(role);
    }

    /// Closes only the `role` end, as [`Self::close_end`] does, giving `cause` (which the other
    /// end reads with `close_cause`): a worker leaving because it saw that rank die says so.
    pub fn close_end_citing(&self, role: Role, cause: u32) {
        self.0
            .control()
            .cause
            .store(CAUSE_SET | u64::from(cause), Ordering::Release);
        self.0.close_end(role);
    }

    /// Wakes the `role` end if it is parked (on its futex word, or on its readiness eventfd for
    /// the consumer), changing nothing else: the waiter re-checks what it waits for. For
    /// [`Interrupt::fire`](crate::Interrupt::fire); any other caller only causes a spurious
    /// wake-up.
    pub fn wake(&self, role: Role) {
        self.0.wake(role);
    }

    /// Whether the `role` end of the ring has been closed (by that end dropping, or by any
    /// closer).
    #[must_use]
    pub fn is_closed(&self, role: Role) -> bool {
        let control = self.0.control();
        let flag = match role {
            Role::Producer => &control.producer_closed,
            Role::Consumer => &control.consumer_closed,
        };
        flag.load(Ordering::Acquire) != 0
    }
}

impl<T> fmt::Debug for Closer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Closer")
            .field("capacity", &self.0.capacity)
            .finish_non_exhaustive()
    }
}

/// [`pair`], plus a [`Closer`] on the same ring.
#[cfg(all(loom, test))]
pub(crate) fn pair_with_closer<T: Pod>(capacity: usize) -> (Producer<T>, Consumer<T>, Closer<T>) {
    let (producer, consumer) = pair::<T>(capacity).expect("valid capacity");
    let closer = consumer.closer();
    (producer, consumer, closer)
}

/// Checks a layout read from a peer's file of `file_size` bytes against what `T` needs.
#[cfg(not(loom))]
fn validate_layout<T: Pod>(found: &RingLayout, file_size: u64) -> Result<RingLayout, Error> {
    if found.magic != RING_MAGIC {
        return Err(Error::BadMagic {
            expected: RING_MAGIC,
            found: found.magic,
        });
    }
    if found.version != RING_LAYOUT_VERSION {
        return Err(Error::VersionMismatch {
            expected: RING_LAYOUT_VERSION,
            found: found.version,
        });
    }
    let capacity = found.capacity;
    if !capacity.is_power_of_two() || capacity > MAX_CAPACITY {
        return Err(Error::InvalidCapacity {
            max: MAX_CAPACITY,
            found: capacity,
        });
    }
    let expected = Geometry::<T>::layout(capacity);
    if found.elem_size != expected.elem_size {
        return Err(Error::ElementSize {
            expected: expected.elem_size,
            found: found.elem_size,
        });
    }
    if found.elem_align != expected.elem_align {
        return Err(Error::ElementAlign {
            expected: expected.elem_align,
            found: found.elem_align,
        });
    }
    if found.slot_size != expected.slot_size || found.slots_offset != expected.slots_offset {
        return Err(Error::SlotGeometry {
            expected_size: expected.slot_size,
            found_size: found.slot_size,
            expected_offset: expected.slots_offset,
            found_offset: found.slots_offset,
        });
    }
    for size in [found.file_size, file_size] {
        if size != expected.file_size {
            return Err(Error::FileSize {
                expected: expected.file_size,
                found: size,
            });
        }
    }
    Ok(expected)
}

fn check_capacity(capacity: usize) -> Result<u64, Error> {
    let found = capacity as u64;
    if found.is_power_of_two() && found <= MAX_CAPACITY {
        Ok(found)
    } else {
        Err(Error::InvalidCapacity {
            max: MAX_CAPACITY,
            found,
        })
    }
}

/// Creates a ring of `capacity` slots for messages of type `T` in a fresh sealed memfd.
///
/// The returned fd can be sent to another process (over `SCM_RIGHTS`, or inherited); one process
/// then calls [`Producer::join`] and one [`Consumer::join`]. The file holds nothing but the ring:
/// it disappears when the last process holding it closes it.
///
/// # Errors
///
/// [`Error::InvalidCapacity`] unless `capacity` is a power of two from 1 to [`MAX_CAPACITY`];
/// [`Error::Sys`] if the memfd cannot be created, sized, sealed or mapped.
#[cfg(not(loom))]
pub fn create<T: Pod>(capacity: usize) -> Result<OwnedFd, Error> {
    let capacity = check_capacity(capacity)?;
    let layout = Geometry::<T>::layout(capacity);
    let fd = crate::memfd::create_sealed(c"shmbroker-ring", layout.file_size)?;
    // Only the layout: every other byte of a fresh file is zero, which is what the control
    // blocks start as and what slot sequence words read as "pending" in the first lap.
    let file = std::fs::File::from(fd);
    std::os::unix::fs::FileExt::write_all_at(&file, bytemuck::bytes_of(&layout), 0).map_err(
        |e| Error::sys("pwrite")(nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0))),
    )?;
    Ok(OwnedFd::from(file))
}

/// Creates a ring and joins both ends in this process: for threads, and for tests.
///
/// Outside loom the ring is a real sealed memfd mapped twice, exactly as two processes would map
/// it. Under `--cfg loom` it lives on the heap so loom can model every access.
///
/// # Errors
///
/// As for [`create`].
pub fn pair<T: Pod>(capacity: usize) -> Result<(Producer<T>, Consumer<T>), Error> {
    #[cfg(not(loom))]
    {
        use std::os::fd::AsFd;
        let fd = create::<T>(capacity)?;
        Ok((Producer::join(fd.as_fd())?, Consumer::join(fd.as_fd())?))
    }
    #[cfg(loom)]
    {
        let capacity = check_capacity(capacity)?;
        let (producer, consumer) = heap_ring::<T>(capacity);
        Ok((Producer::new(producer), Consumer::new(consumer)))
    }
}

/// Two views of one heap ring: producer and consumer.
#[cfg(loom)]
fn heap_ring<T: Pod>(capacity: u64) -> (RingRef<T>, RingRef<T>) {
    struct HeapRing<T> {
        header: Box<Header>,
        slots: Box<[Slot<T>]>,
    }
    // SAFETY: every field is a loom atomic, cell or lock, whose accesses loom checks; the struct
    // is only reached through `RingRef`, which follows the ring protocol.
    unsafe impl<T> Send for HeapRing<T> {}
    // SAFETY: as for `Send`.
    unsafe impl<T> Sync for HeapRing<T> {}

    #[allow(clippy::disallowed_types)]
    let header = Box::new(Header {
        layout: Block(core::cell::UnsafeCell::new(Geometry::<T>::layout(capacity))),
        consumer_wait: Block(WaitWord::new()),
        consumer: Block(ConsumerShared {
            head: AtomicU64::new(0),
            producer_wait: WaitWord::new(),
        }),
        control: Block(Control {
            producer_closed: AtomicU32::new(0),
            consumer_closed: AtomicU32::new(0),
            producer_joined: AtomicU32::new(1),
            consumer_joined: AtomicU32::new(1),
            cause: AtomicU64::new(0),
        }),
    });
    let slots = (0..capacity)
        .map(|_| Slot {
            seq: AtomicU64::new(0),
            message: UnsafeCell::new(T::zeroed()),
        })
        .collect::<Box<[_]>>();
    let ring = std::sync::Arc::new(HeapRing { header, slots });
    let make = || RingRef {
        header: NonNull::from(&*ring.header),
        slots: NonNull::from(&*ring.slots).cast::<Slot<T>>(),
        mask: capacity - 1,
        capacity,
        notifier: None,
        _backing: Backing::Heap(ring.clone()),
    };
    (make(), make())
}

/// The sending end of a ring. Dropping it closes the ring for sending.
pub struct Producer<T: Pod> {
    ring: RingRef<T>,
    cursor: SendCursor,
    patience: Patience,
}

// SAFETY: a producer owns its private cursor and reaches shared memory only through the ring
// protocol; sending it to another thread moves the only handle to the sending side.
unsafe impl<T: Pod + Send> Send for Producer<T> {}

impl<T: Pod> Producer<T> {
    fn new(ring: RingRef<T>) -> Self {
        Self {
            ring,
            cursor: SendCursor {
                tail: 0,
                head_cache: 0,
            },
            patience: Patience::new(Waiting::default()),
        }
    }

    /// Joins the ring in `fd` as its one producer, after checking its seals, size and layout.
    ///
    /// # Errors
    ///
    /// [`Error::MissingSeals`], [`Error::FileTooSmall`], [`Error::BadMagic`],
    /// [`Error::VersionMismatch`], [`Error::InvalidCapacity`], [`Error::ElementSize`],
    /// [`Error::ElementAlign`], [`Error::SlotGeometry`] or [`Error::FileSize`] when the file is
    /// not a ring of `T`; [`Error::AlreadyJoined`] when it already has a producer; [`Error::Sys`]
    /// when a system call fails.
    #[cfg(not(loom))]
    pub fn join(fd: BorrowedFd<'_>) -> Result<Self, Error> {
        join_ring(fd, Role::Producer).map(Self::new)
    }

    /// Number of slots in the ring.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.ring.capacity as usize
    }

    /// How many times a blocking call re-checks before parking, with no yielding and no
    /// adapting: `set_waiting(Waiting::Spin(spins))`. 0 parks at once; `u32::MAX` spins until
    /// the deadline.
    pub fn set_spin_limit(&mut self, spins: u32) {
        self.set_waiting(Waiting::Spin(spins));
    }

    /// How blocking calls wait (default: [`Waiting::Adaptive`], uncrowded).
    pub fn set_waiting(&mut self, waiting: Waiting) {
        self.patience = Patience::new(waiting);
    }

    /// How blocking calls wait.
    #[must_use]
    pub fn waiting(&self) -> Waiting {
        self.patience.waiting()
    }

    /// Why a third party closed the ring ([`close`]), if one did.
    #[must_use]
    pub fn close_cause(&self) -> Option<u32> {
        self.ring.close_cause()
    }

    /// A [`Closer`] for this ring, to close it from another thread.
    #[must_use]
    pub fn closer(&self) -> Closer<T> {
        Closer(self.ring.share())
    }

    /// Gives this producer the consumer's readiness eventfd: a consumer asleep on it (see
    /// [`Consumer::arm`]) is woken through it. Set it before making [`Closer`]s, which keep the
    /// notifier they were made with.
    pub fn set_notify(&mut self, notifier: Notifier) {
        self.ring.notifier = Some(notifier);
    }

    /// Whether the consumer has closed the ring.
    #[must_use]
    pub fn is_disconnected(&self) -> bool {
        self.ring
            .header()
            .control
            .0
            .consumer_closed
            .load(Ordering::Acquire)
            != 0
    }

    /// Sends `message` if there is room. Never blocks.
    ///
    /// # Errors
    ///
    /// [`TrySendError::Full`] when the ring is full, [`TrySendError::Disconnected`] when the
    /// consumer is gone, [`TrySendError::Corrupted`] when the consumer's cursor is impossible.
    /// Each hands `message` back.
    #[inline]
    pub fn try_send(&mut self, message: T) -> Result<(), TrySendError<T>> {
        match self
            .cursor
            .try_send(&self.ring, core::slice::from_ref(&message))
        {
            Ok(_) => Ok(()),
            Err(TrySendError::Full(())) => Err(TrySendError::Full(message)),
            Err(TrySendError::Disconnected(())) => Err(TrySendError::Disconnected(message)),
            Err(TrySendError::Corrupted((), c)) => Err(TrySendError::Corrupted(message, c)),
        }
    }

    /// Sends as many of `messages` as fit, in order, publishing them together. Never blocks.
    /// Returns how many were sent: at least one unless `messages` is empty.
    ///
    /// # Errors
    ///
    /// [`TrySendError::Full`] when not one fits; otherwise as for [`Self::try_send`].
    #[inline]
    pub fn try_send_batch(&mut self, messages: &[T]) -> Result<usize, TrySendError<()>> {
        if messages.is_empty() {
            return Ok(0);
        }
        self.cursor.try_send(&self.ring, messages)
    }

    /// Sends `message`, waiting up to `timeout` for room: spinning first, then parked.
    ///
    /// # Errors
    ///
    /// [`SendTimeoutError::Timeout`] when the ring stayed full; otherwise as for
    /// [`Self::try_send`]. Each hands `message` back.
    pub fn send_timeout(
        &mut self,
        message: T,
        timeout: Duration,
    ) -> Result<(), SendTimeoutError<T>> {
        // Fast path: room is there, so no deadline and no waiting machinery.
        match self.try_send(message) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Disconnected(m)) => return Err(SendTimeoutError::Disconnected(m)),
            Err(TrySendError::Corrupted(m, c)) => return Err(SendTimeoutError::Corrupted(m, c)),
        }
        self.send_batch_timeout(core::slice::from_ref(&message), timeout)
            .map_err(|error| match error {
                SendTimeoutError::Timeout(_) => SendTimeoutError::Timeout(message),
                SendTimeoutError::Disconnected(_) => SendTimeoutError::Disconnected(message),
                SendTimeoutError::Corrupted(_, c) => SendTimeoutError::Corrupted(message, c),
            })
    }

    /// Sends all of `messages` in order, waiting up to `timeout` for room as needed.
    ///
    /// # Errors
    ///
    /// As for [`Self::send_timeout`]; each error carries how many messages were sent.
    pub fn send_batch_timeout(
        &mut self,
        messages: &[T],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError<usize>> {
        let mut deadline = Deadline::after(timeout);
        let mut sent = 0;
        while sent < messages.len() {
            let (ring, cursor, patience) = (&self.ring, &mut self.cursor, &mut self.patience);
            let outcome =
                ring.header()
                    .consumer
                    .0
                    .producer_wait
                    .wait_until(patience, &mut deadline, || {
                        match cursor.try_send(ring, &messages[sent..]) {
                            Err(TrySendError::Full(())) => None,
                            other => Some(other),
                        }
                    });
            match outcome {
                // `wait_until` only returns a full ring as "no outcome": the deadline passed.
                None | Some(Err(TrySendError::Full(()))) => {
                    return Err(SendTimeoutError::Timeout(sent));
                }
                Some(Ok(count)) => sent += count,
                Some(Err(TrySendError::Disconnected(()))) => {
                    return Err(SendTimeoutError::Disconnected(sent));
                }
                Some(Err(TrySendError::Corrupted((), c))) => {
                    return Err(SendTimeoutError::Corrupted(sent, c));
                }
            }
        }
        Ok(())
    }
}

impl<T: Pod> Drop for Producer<T> {
    fn drop(&mut self) {
        self.ring.close_end(Role::Producer);
    }
}

impl<T: Pod> fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("capacity", &self.ring.capacity)
            .field("position", &self.cursor.tail)
            .field("waiting", &self.patience)
            .finish_non_exhaustive()
    }
}

/// The receiving end of a ring. Dropping it closes the ring for receiving.
pub struct Consumer<T: Pod> {
    ring: RingRef<T>,
    cursor: RecvCursor,
    patience: Patience,
    /// When the last blocking receive started its clock, if it did.
    clock_started: Option<std::time::Instant>,
    /// What ends an interruptible wait early (see the `interrupt` module).
    interrupt: Option<std::sync::Arc<Interrupt>>,
}

// SAFETY: as for `Producer`: the consumer owns its cursor and follows the ring protocol.
unsafe impl<T: Pod + Send> Send for Consumer<T> {}

impl<T: Pod> Consumer<T> {
    fn new(ring: RingRef<T>) -> Self {
        Self {
            ring,
            cursor: RecvCursor { head: 0 },
            patience: Patience::new(Waiting::default()),
            clock_started: None,
            interrupt: None,
        }
    }

    /// Joins the ring in `fd` as its one consumer, after checking its seals, size and layout.
    ///
    /// # Errors
    ///
    /// As for [`Producer::join`].
    #[cfg(not(loom))]
    pub fn join(fd: BorrowedFd<'_>) -> Result<Self, Error> {
        join_ring(fd, Role::Consumer).map(Self::new)
    }

    /// Number of slots in the ring.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.ring.capacity as usize
    }

    /// How many times a blocking call re-checks before parking, with no yielding and no
    /// adapting: `set_waiting(Waiting::Spin(spins))`. 0 parks at once; `u32::MAX` spins until
    /// the deadline.
    pub fn set_spin_limit(&mut self, spins: u32) {
        self.set_waiting(Waiting::Spin(spins));
    }

    /// How blocking calls wait (default: [`Waiting::Adaptive`], uncrowded).
    pub fn set_waiting(&mut self, waiting: Waiting) {
        self.patience = Patience::new(waiting);
    }

    /// How blocking calls wait.
    #[must_use]
    pub fn waiting(&self) -> Waiting {
        self.patience.waiting()
    }

    /// Why a third party closed the ring ([`close`]), if one did.
    #[must_use]
    pub fn close_cause(&self) -> Option<u32> {
        self.ring.close_cause()
    }

    /// A [`Closer`] for this ring, to close it from another thread.
    #[must_use]
    pub fn closer(&self) -> Closer<T> {
        Closer(self.ring.share())
    }

    /// Gives this consumer its own readiness eventfd, which [`Closer`]s made afterwards (and
    /// dropping the producer end in this process) signal when this consumer is armed. Every
    /// producer of the ring must hold the same eventfd ([`Producer::set_notify`]) before the
    /// consumer [`arm`](Self::arm)s.
    pub fn set_notify(&mut self, notifier: Notifier) {
        self.ring.notifier = Some(notifier);
    }

    /// Registers this consumer as asleep on its readiness eventfd, then re-checks: returns
    /// whether a [`Self::try_recv`] would now find anything (a message, a close, or bad bytes),
    /// in which case the caller should not sleep. No system call. See the `readiness` module
    /// for the protocol; a blocking receive on this ring replaces the registration.
    pub fn arm(&self) -> bool {
        self.ring.header().consumer_wait.0.arm_event();
        self.has_pending()
    }

    /// Leaves the readiness registration; returns whether a producer (or a close) consumed it,
    /// so that the eventfd was signalled, or is about to be: the caller resets it then.
    pub fn disarm(&self) -> bool {
        self.ring.header().consumer_wait.0.disarm_event()
    }

    /// Whether this consumer is registered on its readiness eventfd and no producer has taken
    /// the registration yet.
    #[must_use]
    pub fn is_armed(&self) -> bool {
        self.ring.header().consumer_wait.0.is_armed()
    }

    /// Whether a [`Self::try_recv`] would find anything but `Empty`: a message, the producer's
    /// close, or a corrupted slot. Atomic loads only.
    #[must_use]
    pub fn has_pending(&self) -> bool {
        !matches!(self.ring.poll(self.cursor.head), Ok(false))
            || self.ring.control().producer_closed.load(Ordering::Acquire) != 0
    }

    /// When the last blocking receive ([`Self::recv_batch_timeout`]) started counting down its
    /// timeout: the moment its wait went past spinning. `None` when it ended sooner (it read no
    /// clock), or had no limit. A caller with a deadline of its own can start it from here
    /// instead of reading the clock before every receive.
    #[must_use]
    pub fn clock_started(&self) -> Option<std::time::Instant> {
        self.clock_started
    }

    /// Receives one message if one is there. Never blocks.
    ///
    /// # Errors
    ///
    /// [`TryRecvError::Empty`] when nothing is there, [`TryRecvError::Disconnected`] when the
    /// producer is gone and everything it sent has been received, [`TryRecvError::Corrupted`] when
    /// the producer wrote an impossible sequence number.
    #[inline]
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        let mut received = T::zeroed();
        self.cursor
            .try_recv(&self.ring, 1, |_, message| received = message)?;
        Ok(received)
    }

    /// Receives up to `buffer.len()` messages that are there, in order, releasing their slots
    /// together. Never blocks. Returns how many: at least one unless `buffer` is empty.
    ///
    /// # Errors
    ///
    /// As for [`Self::try_recv`].
    #[inline]
    pub fn try_recv_batch(&mut self, buffer: &mut [T]) -> Result<usize, TryRecvError> {
        let max = buffer.len();
        self.cursor
            .try_recv(&self.ring, max, |index, message| buffer[index] = message)
    }

    /// Receives one message, waiting up to `timeout`: spinning first, then parked.
    ///
    /// # Errors
    ///
    /// [`RecvTimeoutError::Timeout`] when nothing arrived in time; otherwise as for
    /// [`Self::try_recv`].
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        let mut received = T::zeroed();
        self.recv_batch_timeout(core::slice::from_mut(&mut received), timeout)?;
        Ok(received)
    }

    /// Receives at least one and up to `buffer.len()` messages, waiting up to `timeout` for the
    /// first. Returns how many. An empty `buffer` returns 0 at once.
    ///
    /// # Errors
    ///
    /// As for [`Self::recv_timeout`].
    pub fn recv_batch_timeout(
        &mut self,
        buffer: &mut [T],
        timeout: Duration,
    ) -> Result<usize, RecvTimeoutError> {
        self.recv_batch_waiting(buffer, timeout, None)
    }

    /// Gives this end an [`Interrupt`] that can end [`Self::recv_batch_interruptible`] early.
    pub fn set_interrupt(&mut self, interrupt: std::sync::Arc<Interrupt>) {
        self.interrupt = Some(interrupt);
    }

    /// [`Self::recv_batch_timeout`] that also returns once the interrupt set with
    /// [`Self::set_interrupt`] is past generation `seen` (read with [`Interrupt::generation`]
    /// before the caller looked at whatever makes it give up). Messages already there are taken
    /// first. Without an interrupt set, the same as [`Self::recv_batch_timeout`].
    ///
    /// # Errors
    ///
    /// [`RecvTimeoutError::Interrupted`] when the generation moved on and nothing was there;
    /// otherwise as for [`Self::recv_timeout`].
    pub fn recv_batch_interruptible(
        &mut self,
        buffer: &mut [T],
        timeout: Duration,
        seen: u64,
    ) -> Result<usize, RecvTimeoutError> {
        self.recv_batch_waiting(buffer, timeout, Some(seen))
    }

    fn recv_batch_waiting(
        &mut self,
        buffer: &mut [T],
        timeout: Duration,
        seen: Option<u64>,
    ) -> Result<usize, RecvTimeoutError> {
        if buffer.is_empty() {
            return Ok(0);
        }
        let (ring, cursor) = (&self.ring, &mut self.cursor);
        let interrupt = seen.and_then(|seen| Some((self.interrupt.as_deref()?, seen)));
        let mut deadline = Deadline::after(timeout);
        let outcome =
            ring.header()
                .consumer_wait
                .0
                .wait_until(&mut self.patience, &mut deadline, || {
                    match cursor.try_recv(ring, buffer.len(), |i, message| buffer[i] = message) {
                        Err(TryRecvError::Empty) => match interrupt {
                            Some((interrupt, seen)) if interrupt.fired_since(seen) => {
                                Some(Err(RecvTimeoutError::Interrupted))
                            }
                            _ => None,
                        },
                        Ok(count) => Some(Ok(count)),
                        Err(TryRecvError::Disconnected) => {
                            Some(Err(RecvTimeoutError::Disconnected))
                        }
                        Err(TryRecvError::Corrupted(c)) => {
                            Some(Err(RecvTimeoutError::Corrupted(c)))
                        }
                    }
                });
        self.clock_started = deadline.started();
        // `wait_until` returns "no outcome" only when the deadline passed.
        outcome.unwrap_or(Err(RecvTimeoutError::Timeout))
    }
}

impl<T: Pod> Drop for Consumer<T> {
    fn drop(&mut self) {
        self.ring.close_end(Role::Consumer);
    }
}

impl<T: Pod> fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("capacity", &self.ring.capacity)
            .field("position", &self.cursor.head)
            .field("waiting", &self.patience)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::futex::WAKE_SYSCALLS;
    use std::time::Instant;

    fn wake_syscalls() -> u64 {
        WAKE_SYSCALLS.with(|count| count.get())
    }

    #[test]
    fn no_wake_syscall_while_nobody_waits() {
        let (mut tx, mut rx) = pair::<u64>(8).unwrap();
        let before = wake_syscalls();
        for i in 0..10_000 {
            tx.try_send(i).unwrap();
            tx.send_timeout(i, Duration::from_secs(1)).unwrap();
            assert_eq!(rx.try_recv(), Ok(i));
            assert_eq!(rx.recv_timeout(Duration::from_secs(1)), Ok(i));
        }
        assert_eq!(wake_syscalls(), before);
    }

    #[test]
    fn one_wake_syscall_for_a_parked_consumer() {
        let (mut tx, mut rx) = pair::<u64>(8).unwrap();
        rx.set_spin_limit(0);
        let consumer = std::thread::spawn(move || {
            let received = rx.recv_timeout(Duration::from_secs(30));
            (rx, received)
        });
        // Wait (with a deadline) until the consumer has registered; from then on it stays
        // registered until it is woken or its 30 s run out.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !tx.ring.header().consumer_wait.0.has_waiter() {
            assert!(Instant::now() < deadline, "consumer never parked");
            std::thread::yield_now();
        }
        let before = wake_syscalls();
        tx.try_send(42).unwrap();
        assert_eq!(wake_syscalls(), before + 1);
        let (mut rx, received) = consumer.join().unwrap();
        assert_eq!(received, Ok(42));
        // The consumer unregistered: the next publication makes no system call.
        tx.try_send(43).unwrap();
        assert_eq!(wake_syscalls(), before + 1);
        assert_eq!(rx.try_recv(), Ok(43));
    }
}
