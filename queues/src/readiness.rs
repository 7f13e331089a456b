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
//! producers and an eventfd modelled as a counter under a mutex, through [`ReadySet`].
//!
//! # Many rings: [`ReadySet`]
//!
//! One waiter arms many rings, and the wakers that take those registrations each owe its eventfd
//! one write, which may land at any time after the waiter looked. [`ReadySet`] keeps what the
//! waiter needs between calls: whether its rings are armed, and how many writes it is *owed*
//! (one per registration it finds taken when it disarms or re-arms a ring, less what each reset
//! of the count read back; signed, since a write may be read back before its registration is
//! counted). The rings themselves, and what "a ring has something" means, are the waiter's
//! ([`ReadyRings`]); the order of the steps is the set's, so the loom models run the very
//! functions a session calls:
//!
//! ```text
//! ReadySet::arm      for each ring not armed: owed += (taken since armed); pending |= arm
//! ReadySet::disarm   for each ring that may hold a registration: owed += disarm
//! ReadySet::find     look; if found: disarm
//! find_or_arm        find, or arm and (if any ring has something) find
//! woke               after a sleep on the eventfd: arm, then reset (owed -= read(eventfd))
//! try_next           quiet? nothing : find_or_arm, then, if owed > 0: reset, arm, find
//! ```
//!
//! A blocking wait is `find_or_arm`, sleep on the eventfd, `woke`, over again: the argument above
//! with a reset after every sleep. `woke` arms before it resets, so the registrations that the
//! reset's count pays for are counted first and `owed` does not go negative for long.
//!
//! While writes are owed, a look that finds nothing resets the count (a system call, made only
//! after a wake-up was set in motion); once none are, the fd stays quiet and a look that finds
//! nothing makes no system call at all. So a late write causes at most one spurious wake-up of
//! an event loop, never a busy loop. A look is *quiet*, with no reset and no arming, when nothing
//! can have changed since the last look found nothing: the rings still armed (no waker took a
//! registration, so none owes a write) and empty, nothing buffered on the waiter's side, and no
//! write owed. Its cost is two loads per ring.
//!
//! ## A look that does not sleep
//!
//! An event loop (`epoll`, an async runtime) sleeps on the fd itself, between non-blocking looks
//! that arm the rings when they find nothing ([`ReadySet::try_next`]). Such a look must not end
//! with a reset: the reset may read back the write of a waker that took one of *this* look's
//! registrations, after the look checked that ring, and the caller then sleeps on a count of
//! zero. Worse, that ring is now unregistered, so the same producer's next message writes
//! nothing either. So a look that resets the count arms again after the reset, with no second
//! reset, and checks once more:
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
//! A [`ReadySet`] is the waiter's own state, touched by one thread at a time (a session's, under
//! its lock where it is shared): it has no atomics of its own. Everything that crosses threads
//! is the rings' wait words, with the orderings argued above.
//!
//! # Memory another process writes
//!
//! The word sits in the ring's header, which the producer can write. A producer that stores
//! `EVENT` into it, or anything else, only makes the consumer's next disarm read "fired" (one
//! needless `read`) or its own next publication make a needless system call; it cannot make the
//! consumer miss its *own* messages any more than it could by not sending them.
//!
//! [`Closer`]: crate::Closer

use crate::Consumer;
use bytemuck::Pod;
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

/// The rings one waiter sleeps for on one eventfd, as a [`ReadySet`] sees them. A session
/// implements it for the rings from its peers; the loom models for plain consumers.
pub trait ReadyRings {
    /// What the rings carry.
    type Message: Pod;
    /// What a look finds (which ring has something, say).
    type Found;
    /// Why a look, or reaching a ring, failed.
    type Error;

    /// The waiter's readiness state, kept between calls.
    fn ready_set(&mut self) -> &mut ReadySet;

    /// Runs `f` on the consumer of every ring waited for now.
    ///
    /// # Errors
    ///
    /// When a ring cannot be reached.
    fn each_ring(&mut self, f: impl FnMut(&Consumer<Self::Message>)) -> Result<(), Self::Error>;

    /// Runs `f` on the consumer of every ring that may hold a registration: those waited for
    /// now, and those dropped from the wait since they were armed.
    fn each_registered(&mut self, f: impl FnMut(&Consumer<Self::Message>));

    /// Whether something the waiter already took in from the rings waits to be looked at (so a
    /// look is not quiet even if every ring is).
    fn has_buffered(&mut self) -> bool;

    /// Looks once, without waiting, for something to take.
    ///
    /// # Errors
    ///
    /// The waiter's own, passed on by the [`ReadySet`] function that looked.
    fn look(&mut self) -> Result<Option<Self::Found>, Self::Error>;

    /// Reads the eventfd, which resets its count; returns the count.
    fn drain(&mut self) -> u64;
}

/// One waiter's registrations on many rings and the writes their wakers owe its eventfd (see
/// the module docs for the protocol and why no wake-up is lost). The functions that act on the
/// rings take the waiter's [`ReadyRings`], which holds the set.
#[derive(Debug, Default)]
pub struct ReadySet {
    /// Every ring waited for has been armed (and not disarmed since).
    armed: bool,
    /// Writes to the eventfd that wakers owe for registrations they took, less what resets of
    /// it read back. Signed: a write may be read back before its registration is counted.
    owed: i64,
}

impl ReadySet {
    /// Nothing armed, nothing owed.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            armed: false,
            owed: 0,
        }
    }

    /// Whether the rings are armed for a sleep on the eventfd.
    #[must_use]
    pub fn is_armed(&self) -> bool {
        self.armed
    }

    /// Whether wakers (or the waiter itself) owe the eventfd writes not yet read back.
    #[must_use]
    pub fn owes_signals(&self) -> bool {
        self.owed > 0
    }

    /// Counts a write to the eventfd that the waiter made itself (to wake another thread asleep
    /// on it), so that the next look resets it.
    pub fn count_signal(&mut self) {
        self.owed += 1;
    }

    /// Arms every ring waited for that is not armed, counting a registration a waker took as a
    /// write owed; returns whether any ring has something, so that the caller must not sleep.
    ///
    /// # Errors
    ///
    /// When [`ReadyRings::each_ring`] cannot reach a ring.
    pub fn arm<R: ReadyRings>(rings: &mut R) -> Result<bool, R::Error> {
        let armed = rings.ready_set().armed;
        let mut pending = false;
        let mut taken = 0i64;
        rings.each_ring(|ring| {
            if !armed || !ring.is_armed() {
                // A registration a waker took is a write it owes the eventfd.
                taken += i64::from(armed && ring.disarm());
                pending |= ring.arm();
            } else {
                pending |= ring.has_pending();
            }
        })?;
        let set = rings.ready_set();
        set.armed = true;
        set.owed += taken;
        Ok(pending)
    }

    /// Takes the registration back from every ring that may hold one, counting those wakers
    /// took. Called before anything else waits on one of these rings (its futex wait would
    /// replace the registration).
    pub fn disarm<R: ReadyRings>(rings: &mut R) {
        if !rings.ready_set().armed {
            return;
        }
        let mut taken = 0i64;
        rings.each_registered(|ring| taken += i64::from(ring.disarm()));
        let set = rings.ready_set();
        set.armed = false;
        set.owed += taken;
    }

    /// Looks; if something is there, disarms every ring (a caller that takes it may wait on a
    /// ring's futex).
    ///
    /// # Errors
    ///
    /// The look's.
    pub fn find<R: ReadyRings>(rings: &mut R) -> Result<Option<R::Found>, R::Error> {
        let found = rings.look()?;
        if found.is_some() {
            Self::disarm(rings);
        }
        Ok(found)
    }

    /// Looks, and when nothing is there arms every ring and, if one has something meanwhile,
    /// looks again. `None` leaves every ring armed: the caller may sleep on the eventfd.
    ///
    /// # Errors
    ///
    /// The look's, or [`Self::arm`]'s.
    pub fn find_or_arm<R: ReadyRings>(rings: &mut R) -> Result<Option<R::Found>, R::Error> {
        if let Some(found) = Self::find(rings)? {
            return Ok(Some(found));
        }
        if Self::arm(rings)? {
            return Self::find(rings);
        }
        Ok(None)
    }

    /// After a sleep on the eventfd: re-arms the rings wakers took (counting the writes they
    /// owe), then reads the count back, so that the next sleep waits for a new write.
    ///
    /// # Errors
    ///
    /// [`Self::arm`]'s.
    pub fn woke<R: ReadyRings>(rings: &mut R) -> Result<(), R::Error> {
        Self::arm(rings)?;
        Self::reset(rings);
        Ok(())
    }

    /// A look that does not sleep, for an event loop that sleeps on the eventfd itself: what is
    /// there, or `None` with every ring armed (so that the eventfd becomes readable once
    /// something arrives). No system call unless writes are owed (see the module docs: a reset,
    /// then arm and look again, with no second reset).
    ///
    /// # Errors
    ///
    /// The look's, or [`Self::arm`]'s.
    pub fn try_next<R: ReadyRings>(rings: &mut R) -> Result<Option<R::Found>, R::Error> {
        if Self::quiet(rings) {
            return Ok(None);
        }
        if let Some(found) = Self::find_or_arm(rings)? {
            return Ok(Some(found));
        }
        if rings.ready_set().owed > 0 {
            Self::reset(rings);
            if Self::arm(rings)? {
                return Self::find(rings);
            }
        }
        Ok(None)
    }

    /// Whether nothing can have changed since the last look found nothing: every ring still
    /// armed (no waker took its registration) and empty, nothing buffered, and no write owed.
    fn quiet<R: ReadyRings>(rings: &mut R) -> bool {
        let set = rings.ready_set();
        if !set.armed || set.owed > 0 || rings.has_buffered() {
            return false;
        }
        let mut quiet = true;
        let reached = rings.each_ring(|ring| {
            quiet = quiet && ring.is_armed() && !ring.has_pending();
        });
        reached.is_ok() && quiet
    }

    /// Reads the eventfd's count back, and counts it off what is owed.
    fn reset<R: ReadyRings>(rings: &mut R) {
        let got = rings.drain();
        rings.ready_set().owed -= i64::try_from(got).unwrap_or(i64::MAX);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{ReadyRings, ReadySet};
    use crate::{Consumer, Producer, pair};
    use std::convert::Infallible;
    use std::os::fd::AsFd;
    use std::sync::Arc;
    use std::time::Duration;

    /// Two rings on one real eventfd.
    struct Rings {
        set: ReadySet,
        rings: Vec<Consumer<u64>>,
        event: super::Notifier,
    }

    fn rings() -> (Rings, Vec<Producer<u64>>) {
        let event = Arc::new(shmbroker_sys::eventfd::create().unwrap());
        let mut producers = Vec::new();
        let mut rings = Vec::new();
        for _ in 0..2 {
            let (mut tx, mut rx) = pair::<u64>(4).unwrap();
            tx.set_notify(Arc::clone(&event));
            rx.set_notify(Arc::clone(&event));
            producers.push(tx);
            rings.push(rx);
        }
        let set = ReadySet::new();
        (Rings { set, rings, event }, producers)
    }

    impl Rings {
        fn readable(&self) -> bool {
            shmbroker_sys::eventfd::wait_readable(self.event.as_fd(), Some(Duration::ZERO)).unwrap()
        }
    }

    impl ReadyRings for Rings {
        type Message = u64;
        type Found = usize;
        type Error = Infallible;

        fn ready_set(&mut self) -> &mut ReadySet {
            &mut self.set
        }

        fn each_ring(&mut self, f: impl FnMut(&Consumer<u64>)) -> Result<(), Infallible> {
            self.rings.iter().for_each(f);
            Ok(())
        }

        fn each_registered(&mut self, f: impl FnMut(&Consumer<u64>)) {
            self.rings.iter().for_each(f);
        }

        fn has_buffered(&mut self) -> bool {
            false
        }

        fn look(&mut self) -> Result<Option<usize>, Infallible> {
            Ok(self.rings.iter().position(Consumer::has_pending))
        }

        fn drain(&mut self) -> u64 {
            shmbroker_sys::eventfd::drain(self.event.as_fd())
        }
    }

    #[test]
    fn a_look_that_finds_nothing_arms_every_ring_and_the_next_is_quiet() {
        let (mut rings, _producers) = rings();
        assert_eq!(ReadySet::try_next(&mut rings), Ok(None));
        assert!(rings.set.is_armed());
        assert!(rings.rings.iter().all(Consumer::is_armed));
        assert!(ReadySet::quiet(&mut rings));
        assert_eq!(ReadySet::try_next(&mut rings), Ok(None));
        assert!(!rings.set.owes_signals());
        assert!(!rings.readable());
    }

    #[test]
    fn a_message_into_an_armed_ring_signals_once_and_the_write_is_counted_back() {
        let (mut rings, mut producers) = rings();
        assert_eq!(ReadySet::try_next(&mut rings), Ok(None));
        producers[1].try_send(7).unwrap();
        assert!(rings.readable());
        assert!(!ReadySet::quiet(&mut rings));
        // Found: every ring disarmed, the taken registration owed.
        assert_eq!(ReadySet::try_next(&mut rings), Ok(Some(1)));
        assert!(!rings.set.is_armed());
        assert!(rings.set.owes_signals());
        assert_eq!(rings.rings[1].try_recv(), Ok(7));
        // Nothing left: the look resets the count, re-arms, and the fd is quiet again.
        assert_eq!(ReadySet::try_next(&mut rings), Ok(None));
        assert!(!rings.set.owes_signals());
        assert!(!rings.readable());
        // A second message signals again: the registration was renewed after the reset.
        producers[0].try_send(8).unwrap();
        assert!(rings.readable());
        assert_eq!(ReadySet::find_or_arm(&mut rings), Ok(Some(0)));
    }

    #[test]
    fn a_wake_re_arms_and_resets() {
        let (mut rings, mut producers) = rings();
        assert_eq!(ReadySet::find_or_arm(&mut rings), Ok(None));
        producers[0].try_send(1).unwrap();
        assert!(rings.readable());
        assert_eq!(ReadySet::woke(&mut rings), Ok(()));
        assert!(!rings.readable());
        assert!(!rings.set.owes_signals());
        assert!(rings.rings.iter().all(Consumer::is_armed));
        assert_eq!(ReadySet::find_or_arm(&mut rings), Ok(Some(0)));
    }

    #[test]
    fn a_signal_the_waiter_made_itself_is_reset_by_the_next_look() {
        let (mut rings, _producers) = rings();
        assert_eq!(ReadySet::try_next(&mut rings), Ok(None));
        shmbroker_sys::eventfd::signal(rings.event.as_fd());
        rings.set.count_signal();
        assert_eq!(ReadySet::try_next(&mut rings), Ok(None));
        assert!(!rings.readable());
        assert!(!rings.set.owes_signals());
    }
}
