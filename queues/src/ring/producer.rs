//! The sending end: its settings, and the sends over the producer's cursor, never blocking
//! (`try_send*`) or waiting up to a timeout (`send*_timeout`).

#[cfg(not(loom))]
use super::file::join_ring;
use super::shared::RingRef;
use super::{Closer, SendCursor};
#[cfg(doc)]
use super::{Consumer, close};
#[cfg(not(loom))]
use crate::error::Error;
use crate::error::{Role, SendTimeoutError, TrySendError};
use crate::futex::Deadline;
use crate::readiness::Notifier;
use crate::sync::Ordering;
use crate::waiting::{Patience, Waiting};
use bytemuck::Pod;
use core::fmt;
#[cfg(not(loom))]
use std::os::fd::BorrowedFd;
use std::time::Duration;

/// The sending end of a ring. Dropping it closes the ring for sending.
pub struct Producer<T: Pod> {
    pub(super) ring: RingRef<T>,
    cursor: SendCursor,
    patience: Patience,
}

// SAFETY: a producer owns its private cursor and reaches shared memory only through the ring
// protocol; sending it to another thread moves the only handle to the sending side.
unsafe impl<T: Pod + Send> Send for Producer<T> {}

impl<T: Pod> Producer<T> {
    pub(super) fn new(ring: RingRef<T>) -> Self {
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
            .try_send(&self.ring, core::slice::from_ref(&message), false)
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
        self.cursor.try_send(&self.ring, messages, false)
    }

    /// Sends all of `messages` in one publication if the ring has room for all of them, and
    /// none otherwise ([`TrySendError::Full`]): a message made of several slots never stands
    /// half-written in the ring, whatever its sender does next. Never blocks. `messages` longer
    /// than the ring never fit.
    ///
    /// # Errors
    ///
    /// As for [`Self::try_send_batch`].
    pub fn try_send_whole(&mut self, messages: &[T]) -> Result<(), TrySendError<()>> {
        if messages.is_empty() {
            return Ok(());
        }
        self.cursor.try_send(&self.ring, messages, true).map(drop)
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
                        match cursor.try_send(ring, &messages[sent..], false) {
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
