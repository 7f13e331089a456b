//! Waking a process's own waiters without closing their rings: the *interrupt* protocol.
//!
//! A ring's wait ends when its condition holds (a message, room) or when the ring closes. Some
//! waits must also end when something *outside* the ring changes: a session waiting in a
//! collective on a live peer must give up when a third rank dies, because that peer will never
//! send (it is stuck on the dead rank too). Closing the live ring would end the wait, but it would
//! also end everything else that ring carries. An [`Interrupt`] ends the wait and leaves the ring
//! as it was.
//!
//! An `Interrupt` is a generation counter in the process's private memory, shared by the consumer
//! ends of a session ([`Consumer::set_interrupt`](crate::Consumer::set_interrupt)). A caller that
//! wants to be interrupted reads the generation **before** it looks at whatever would make it give
//! up (who is dead), and hands it to
//! [`Consumer::recv_batch_interruptible`](crate::Consumer::recv_batch_interruptible), which
//! returns [`RecvTimeoutError::Interrupted`](crate::RecvTimeoutError::Interrupted) once the
//! generation has moved on.
//!
//! # The protocol
//!
//! *Firing* (after recording what changed, e.g. the death):
//!
//! ```text
//! record the change                        // any store the waiter will read after waking
//! generation.fetch_add(1, AcqRel)           // publish X
//! for each ring: consumer word.swap(IDLE, AcqRel) → FUTEX_WAKE / eventfd write if a waiter was there
//! ```
//!
//! *Waiting*: the ring's own wait (see the `futex` module), whose `check()` also compares the
//! generation (Acquire) with the one the caller read.
//!
//! # Why no interrupt is lost
//!
//! It is the futex module's argument with X = the generation's increment: the firing side
//! publishes X, then swaps the wait word; the waiter swaps the word to `WAITING`, then checks X.
//! Both swaps are read-modify-writes on one word, so one reads from the other: either the firing
//! swap reads `WAITING` and wakes the sleeper, or the waiter's swap (Acquire) reads from the firing
//! swap (Release, after the increment) and its check sees the new generation. A waiter asleep on
//! the readiness eventfd (`EVENT`) gets the eventfd write, as from any waker.
//!
//! And no change is missed by a caller: it reads the generation before looking at the change's
//! record. If its look missed the record, the increment (made after the record) was not yet
//! visible to its read either, so the generation it holds is older than the one the firing side
//! publishes, and the wait returns `Interrupted`. If the increment *was* visible, the record,
//! made before it, is visible to the look (Acquire read of the generation synchronises with the
//! AcqRel increment).
//!
//! A spurious interrupt (a generation moved on for a change this caller does not care about) only
//! makes the caller look again and wait again. The loom test `loom_an_interrupt_wakes_a_parked_consumer`
//! checks the wake-up; `loom_an_interrupt_never_loses_a_message` checks that a message and an
//! interrupt arriving together leave the message in the ring or in the caller's hands.

use crate::Role;
use crate::ring::Closer;
use crate::sync::{AtomicU64, Ordering};

/// A generation counter that wakes the waiters of a set of rings without closing them. See the
/// module docs.
#[derive(Debug)]
pub struct Interrupt {
    generation: AtomicU64,
}

impl Default for Interrupt {
    fn default() -> Self {
        Self::new()
    }
}

impl Interrupt {
    /// A counter at generation 0.
    #[must_use]
    pub fn new() -> Self {
        Self {
            generation: AtomicU64::new(0),
        }
    }

    /// The current generation (Acquire). Read it before looking at what would make a wait give
    /// up, then hand it to the wait.
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Moves to the next generation, then wakes the consumer parked on each of `closers`' rings
    /// (on its futex word or its readiness eventfd): every wait handed an older generation
    /// returns [`RecvTimeoutError::Interrupted`](crate::RecvTimeoutError::Interrupted). Record
    /// whatever the waiters should find before calling this.
    pub fn fire<'a, T: 'a>(&self, closers: impl IntoIterator<Item = &'a Closer<T>>) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        for closer in closers {
            closer.wake(Role::Consumer);
        }
    }

    /// Whether the generation has moved on from `seen`.
    #[inline]
    pub(crate) fn fired_since(&self, seen: u64) -> bool {
        self.generation() != seen
    }
}
