//! Closing a ring, or waking one of its ends, from another thread of a process holding an end.

#[cfg(doc)]
use super::close;
use super::shared::{CAUSE_SET, RingRef};
use crate::error::Role;
use crate::sync::Ordering;
use core::fmt;

/// A handle that closes a ring from another thread of the process holding one of its ends: a
/// watcher that learns the peer died (from its pidfd) closes the rings of the session with it,
/// waking whichever side is parked there, exactly as [`close`] does from another process.
///
/// It shares the endpoint's mapping and its validated geometry; it never re-reads the layout a
/// peer could have scribbled on, so closing works whatever the peer left in the header.
pub struct Closer<T>(pub(super) RingRef<T>);

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
