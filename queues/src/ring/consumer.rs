//! The receiving end: its settings, its readiness registration, and the receives over the
//! consumer's cursor, never blocking (`try_recv*`), or waiting up to a timeout or an interrupt.

#[cfg(not(loom))]
use super::file::join_ring;
use super::shared::RingRef;
use super::{Closer, RecvCursor};
#[cfg(doc)]
use super::{Producer, close};
#[cfg(not(loom))]
use crate::error::Error;
use crate::error::{RecvTimeoutError, Role, TryRecvError};
use crate::futex::Deadline;
use crate::interrupt::Interrupt;
use crate::readiness::Notifier;
use crate::sync::Ordering;
use crate::waiting::{Patience, Waiting};
use bytemuck::Pod;
use core::fmt;
#[cfg(not(loom))]
use std::os::fd::BorrowedFd;
use std::time::Duration;

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
    pub(super) fn new(ring: RingRef<T>) -> Self {
        Self {
            ring,
            cursor: RecvCursor::new(),
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

    /// Gives slots back to the producer in batches of up to `batch` (at most a quarter of the
    /// ring) while the next message is already there, instead of after every receive; a receive
    /// that finds the ring empty, or that reaches `batch`, gives back all it holds. For a
    /// stream whose producer keeps the ring full: there each slot given back alone costs a
    /// round trip between the two cores, and a batch costs one. The cost: while this consumer
    /// holds unread messages and does not come back for them, its producer sees up to `batch`
    /// fewer free slots. 0 (the default) gives every slot back at once.
    pub fn set_release_batch(&mut self, batch: usize) {
        self.cursor.batch = (batch as u64).min(self.ring.capacity / 4);
        if self.cursor.batch == 0 && self.cursor.head != self.cursor.released {
            self.cursor.release(&self.ring);
        }
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
