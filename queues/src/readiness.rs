//! Waiting for any of several rings on one fd: the *readiness* protocol.
//!
//! A worker receives from every peer on its own ring, and a call such as "the next message from
//! anyone" (or an event loop in `epoll`) cannot sleep on several futex words at once. So each
//! worker owns one eventfd, its [`Notifier`], and every producer that writes to that worker holds
//! a copy of it ([`Producer::set_notify`](crate::Producer::set_notify)). The consumer's wait word
//! of each ring gains a third state beside `IDLE` and `WAITING`: `EVENT`, "asleep on the
//! eventfd".
//!
//! # The protocol
//!
//! *Waker* (a producer after publishing, or anyone closing the ring) — unchanged from the futex
//! path except for what it does when it finds a sleeper:
//!
//! ```text
//! publish X                                   // a Release store
//! match word.swap(IDLE, AcqRel) {
//!     IDLE    => {}                           // nobody asleep: no system call
//!     EVENT   => write(eventfd, 1)
//!     _       => FUTEX_WAKE(word)
//! }
//! ```
//!
//! *Waiter* (the consumer side, for every ring it waits on):
//!
//! ```text
//! for each ring: word.swap(EVENT, AcqRel)    // arm            (Consumer::arm)
//! if no ring has X: poll(eventfd)            // or epoll, in the caller's loop
//! for each ring: fired |= word.swap(IDLE, AcqRel) != EVENT     (Consumer::disarm)
//! if slept or fired: read(eventfd)            // reset the count
//! re-check every ring
//! ```
//!
//! # Why no wake-up is lost
//!
//! The argument is the futex module's, ring by ring. Both sides touch the word only with
//! read-modify-write operations, so for one ring either
//!
//! * the waiter's arming swap comes first in the word's modification order: the waker's swap then
//!   reads `EVENT` and writes the eventfd, whose count stays non-zero until the waiter reads it,
//!   so a `poll` made before or after the write returns; or
//! * the waker's swap comes first: the arming swap (Acquire) reads from it (Release, sequenced
//!   after publishing X), so X happens-before the waiter's re-check, which sees it and does not
//!   sleep.
//!
//! Unlike a futex, an eventfd remembers a signal: there is no window between "checked" and
//! "asleep" to argue about. The count must be reset after every sleep, though, not only when a
//! disarming swap shows that a waker took the registration: a waker that took an *earlier*
//! round's registration may write after that round's reset, and a count nobody resets would turn
//! every later sleep into a busy loop (loom found this as a model that never ends). The reset of
//! round `k` happens-before the arming of round `k + 1` in the waiter's thread, which a waker of
//! round `k + 1` reads from, so a reset never eats a later round's signal; a stale signal costs
//! one spurious wake-up and one re-check. A waiter that finds a message without sleeping and
//! whose registrations nobody took makes no system call at all. A ring closed while armed wakes the same way ([`Closer`]
//! and dropping an end use the same waker path), so a peer's death ends the sleep.
//!
//! The loom test `loom_readiness_never_misses_a_message` checks this with two rings, two
//! producers and an eventfd modelled as a counter under a mutex.
//!
//! # A look that does not sleep
//!
//! An event loop (`epoll`, an async runtime) sleeps on the fd itself, between non-blocking looks
//! that arm the rings when they find nothing. Such a look must not end with a reset: the reset
//! may read back the write of a waker that took one of *this* look's registrations, after the
//! look checked that ring, and the caller then sleeps on a count of zero. Worse, that ring is
//! now unregistered, so the same producer's next message writes nothing either. So a look that
//! resets the count arms again after the reset, with no second reset, and checks once more:
//!
//! ```text
//! arm every ring; if any has X: take it
//! if writes are owed: read(eventfd)                     // reset
//!     arm every ring not armed; if any has X: take it   // the look after the reset
//! return nothing                                        // the caller sleeps on the fd
//! ```
//!
//! A registration taken before the second arming is renewed by it, and the arming swap reads
//! from the waker's swap, so the message is seen; one taken after it writes the eventfd after the
//! reset, so the fd is readable. `loom_readiness_look_then_wait_never_misses_a_message` checks
//! this order; dropping either step after the reset makes it report a deadlock.
//!
//! # Memory another process writes
//!
//! The word sits in the ring's header, which the producer can write. A producer that stores
//! `EVENT` into it, or anything else, only makes the consumer's next disarm read "fired" (one
//! needless `read`) or its own next publication make a needless system call; it cannot make the
//! consumer miss its *own* messages any more than it could by not sending them.
//!
//! [`Closer`]: crate::Closer

#[cfg(not(loom))]
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

/// The eventfd a consumer sleeps on, shared by everyone who may wake it.
#[cfg(not(loom))]
pub type Notifier = Arc<OwnedFd>;

/// The eventfd a consumer sleeps on, shared by everyone who may wake it (a loom model).
#[cfg(loom)]
pub type Notifier = Arc<ModelEventFd>;

/// Makes the notifier readable.
#[cfg(not(loom))]
pub(crate) fn signal(notifier: &Notifier) {
    #[cfg(test)]
    crate::futex::WAKE_SYSCALLS.with(|count| count.set(count.get() + 1));
    shmbroker_sys::eventfd::signal(notifier.as_fd());
}

#[cfg(loom)]
pub(crate) fn signal(notifier: &Notifier) {
    notifier.signal();
}

/// An eventfd as loom sees it: a count under a mutex, and a condition variable for `poll`.
#[cfg(loom)]
#[derive(Debug, Default)]
pub struct ModelEventFd {
    count: loom::sync::Mutex<u64>,
    readable: loom::sync::Condvar,
}

#[cfg(loom)]
impl ModelEventFd {
    /// `write(fd, 1)`.
    pub fn signal(&self) {
        *self.count.lock().unwrap() += 1;
        self.readable.notify_all();
    }

    /// `poll` with no timeout: returns once the count is non-zero.
    pub fn wait_readable(&self) {
        let mut count = self.count.lock().unwrap();
        while *count == 0 {
            count = self.readable.wait(count).unwrap();
        }
    }

    /// `read(fd)`: resets the count and returns what it was.
    pub fn drain(&self) -> u64 {
        std::mem::take(&mut *self.count.lock().unwrap())
    }
}
