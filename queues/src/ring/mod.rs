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
//! new `head` (Release) once for the whole batch and wakes the producer if it parked (or, with a
//! release batch, keeps the slots a while: see below).
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
//! # Release in batches
//!
//! A consumer may keep the slots it has read, up to a batch ([`Consumer::set_release_batch`]),
//! while the slot after them already holds the next message, and give them all back with one
//! store of `head` when the batch is full or when it finds the ring empty. This is the batched
//! update of control variables of Lee et al.'s MCRingBuffer (2009). When the producer keeps the
//! ring full, each slot given back alone costs a round trip of `head`'s cache line between the
//! cores (the producer reads it for every free slot, the consumer's next store must take it
//! back); a batch costs one round trip per batch.
//!
//! It changes only *when* `head` is stored, always later, never sooner, so visibility, no
//! overwrite and FIFO hold as above. No wait is lost either:
//!
//! * the consumer keeps slots only while a message it has not read is in the ring, so it never
//!   parks, nor reports `Empty`, holding any: a receive that finds the ring empty gives back what
//!   it holds first, and a parked consumer's wait begins with such a receive;
//! * a producer that parks on a full ring is woken by the store that gives the batch back,
//!   exactly as by a single slot's; that store comes within `batch` receives, or at the first
//!   receive that finds the ring empty.
//!
//! The cost is room, not progress: while the consumer holds unread messages and does not come
//! back for them, its producer sees up to `batch` fewer free slots than it would. The loom test
//! `loom_slots_released_in_batches_wake_a_parked_producer` checks the parking claims.
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

mod closer;
mod consumer;
#[cfg(not(loom))]
mod file;
#[cfg(loom)]
mod heap;
mod producer;
mod shared;
#[cfg(all(test, not(loom)))]
mod tests;

pub use closer::Closer;
pub use consumer::Consumer;
#[cfg(not(loom))]
pub use file::{close, create, create_sized, fill};
pub use producer::Producer;

use crate::error::{Corruption, Error, TryRecvError, TrySendError};
use crate::sync::Ordering;
#[cfg(doc)]
use crate::waiting::Waiting;
use bytemuck::Pod;
#[cfg(loom)]
use heap::heap_ring;
use shared::RingRef;

/// Largest capacity [`create`] accepts: 2^30 slots.
pub const MAX_CAPACITY: u64 = 1 << 30;

/// Size of the ring header; slot 0 starts here (or at the next multiple of the slot alignment).
pub const HEADER_SIZE: usize = 512;

/// The sequence word a slot holds while the message for `position` is not there yet: the one of
/// the previous lap (for the first lap, a fresh file's zero is accepted too).
fn pending_seq(position: u64, capacity: u64) -> u64 {
    position.wrapping_add(1).wrapping_sub(capacity)
}

impl<T: Pod> RingRef<T> {
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

/// Private state of the sending side.
struct SendCursor {
    /// Next position to write.
    tail: u64,
    /// Last consumer cursor read from shared memory.
    head_cache: u64,
}

impl SendCursor {
    /// Sends as many of `messages` as fit (at least one, unless none fit), in one publication;
    /// with `whole`, all of them or none.
    fn try_send<T: Pod>(
        &mut self,
        ring: &RingRef<T>,
        messages: &[T],
        whole: bool,
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
        if count == 0 || (whole && free < wanted) {
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
    /// The last `head` stored for the producer: the slots from here to `head` were read and
    /// not yet given back (see "Release in batches" in the module docs).
    released: u64,
    /// How many read slots may stay unreleased while the next message is already there: 0
    /// gives every slot back at once.
    batch: u64,
}

impl RecvCursor {
    fn new() -> Self {
        Self {
            head: 0,
            released: 0,
            batch: 0,
        }
    }

    /// Gives the producer every slot read so far, and wakes it if it parked.
    fn release<T: Pod>(&mut self, ring: &RingRef<T>) {
        self.released = self.head;
        let shared = &ring.header().consumer.0;
        shared.head.store(self.head, Ordering::Release);
        shared.producer_wait.wake();
    }

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
        self.head = self.head.wrapping_add(count as u64);
        // Keep the slots while the next message is already there and fewer than `batch` are
        // kept: the caller comes back for it, and gives them back then (see the module docs).
        if self.batch > 0
            && count == max
            && self.head.wrapping_sub(self.released) < self.batch
            && matches!(ring.poll(self.head), Ok(true))
        {
            return Ok(count);
        }
        if self.head != self.released {
            self.release(ring);
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

/// [`pair`], plus a [`Closer`] on the same ring.
#[cfg(all(loom, test))]
pub(crate) fn pair_with_closer<T: Pod>(capacity: usize) -> (Producer<T>, Consumer<T>, Closer<T>) {
    let (producer, consumer) = pair::<T>(capacity).expect("valid capacity");
    let closer = consumer.closer();
    (producer, consumer, closer)
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
