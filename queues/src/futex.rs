//! Spin-then-park waiting on a shared 32-bit word, with no lost wake-ups.
//!
//! Each direction of a ring has one [`WaitWord`]: the consumer sleeps on one while the ring is
//! empty, the producer on the other while it is full. The word is `IDLE` (0), `WAITING` (1), or,
//! for a consumer that sleeps on its readiness eventfd instead of the futex, `EVENT` (2; see the
//! `readiness` module, which owns that state's protocol).
//!
//! # The protocol
//!
//! *Waker* (after publishing: a slot's sequence number, the consumer cursor, or a close flag):
//!
//! ```text
//! publish X                          // a Release store
//! if word.swap(IDLE, AcqRel) == WAITING { FUTEX_WAKE(word) }
//! ```
//!
//! *Waiter* (after spinning on `check()` for a bounded number of rounds):
//!
//! ```text
//! loop {
//!     word.swap(WAITING, AcqRel)     // register
//!     if check() sees X { word.swap(IDLE, AcqRel); return }
//!     FUTEX_WAIT(word, WAITING, remaining time)
//! }
//! ```
//!
//! # Why no wake-up is lost
//!
//! Both sides touch the word only with read-modify-write operations (unregistering too), so every
//! write to the word is part of the release sequence of the waker's swap before it, the swaps are
//! ordered in the word's modification order, and each swap reads the value written immediately
//! before it:
//!
//! * If the waiter's registration comes first, the waker's swap reads `WAITING` and issues
//!   `FUTEX_WAKE`. The kernel compares the word and queues the sleeper under one lock, and the
//!   waker changed the word to `IDLE` before waking, so either the waiter's `FUTEX_WAIT` finds
//!   `IDLE` and returns at once, or it is already queued and the wake reaches it.
//! * If the waker's swap comes first, the waiter's swap reads from it. The waker's swap is a
//!   Release operation sequenced after the publication of X and the waiter's swap is an Acquire,
//!   so X happens-before the waiter's `check()`, which therefore sees X and does not sleep.
//!
//! Either way the waiter never sleeps through a publication. A stray wake (a waker resetting a
//! word that a waiter set for a later round) only makes `FUTEX_WAIT` return early; the waiter
//! re-checks and re-registers. Every sleep is also bounded by the caller's deadline.
//!
//! Cost on the hot path: one uncontended swap on a cache line that only the waker writes while
//! nobody parks, and a system call only when a waiter has registered. The loom tests in
//! `loom_tests.rs` check the protocol; loom models the futex as a mutex and condition variable
//! whose wait re-checks the word under the mutex, which is the kernel's contract.
//!
//! Across processes the word lives in a `MAP_SHARED` mapping, so the futex calls use the shared
//! (non-`FUTEX_PRIVATE_FLAG`) forms, which the kernel keys by file and offset.

use crate::readiness::Notifier;
use crate::sync::{AtomicU32, Ordering, spin_loop};
use crate::waiting::Patience;
use std::time::{Duration, Instant};

const IDLE: u32 = 0;
const WAITING: u32 = 1;
/// The consumer sleeps on its readiness eventfd (see the `readiness` module).
const EVENT: u32 = 2;

/// A yield that takes this long gave the CPU to another process (a bare `sched_yield` with
/// nothing else to run returns in well under a microsecond).
#[cfg(not(loom))]
pub(crate) const GAVE_WAY: Duration = Duration::from_micros(4);

/// How many spins run between two clock reads while spinning under a deadline.
const SPINS_PER_CLOCK_READ: u32 = 256;

/// A 32-bit word one side of a ring sleeps on and the other side wakes.
///
/// Outside loom this is exactly one `u32` (zero is `IDLE`), so a zero-filled mapping holds a valid
/// idle word.
#[cfg_attr(not(loom), repr(transparent))]
#[derive(Debug)]
pub(crate) struct WaitWord {
    state: AtomicU32,
    #[cfg(loom)]
    sleepers: loom::sync::Mutex<()>,
    #[cfg(loom)]
    condvar: loom::sync::Condvar,
}

#[cfg(not(loom))]
const _: () = assert!(size_of::<WaitWord>() == 4);

impl WaitWord {
    #[cfg(loom)]
    pub(crate) fn new() -> Self {
        Self {
            state: AtomicU32::new(IDLE),
            sleepers: loom::sync::Mutex::new(()),
            condvar: loom::sync::Condvar::new(),
        }
    }

    /// Wakes the other side if it registered as waiting. Call after every publication.
    #[inline(always)]
    pub(crate) fn wake(&self) {
        if self.state.swap(IDLE, Ordering::AcqRel) != IDLE {
            self.futex_wake();
        }
    }

    /// [`Self::wake`] for a word whose waiter may sleep on `notifier` instead of the futex (the
    /// consumer's word; see the `readiness` module).
    #[inline(always)]
    pub(crate) fn wake_or_notify(&self, notifier: Option<&Notifier>) {
        match self.state.swap(IDLE, Ordering::AcqRel) {
            IDLE => {}
            EVENT if notifier.is_some() => {
                if let Some(notifier) = notifier {
                    crate::readiness::signal(notifier);
                }
            }
            _ => self.futex_wake(),
        }
    }

    /// Registers the waiter as asleep on its readiness eventfd.
    pub(crate) fn arm_event(&self) {
        self.state.swap(EVENT, Ordering::AcqRel);
    }

    /// Leaves the readiness registration; returns whether a waker took it (and so signalled, or
    /// is about to signal, the eventfd). A swap, for the reason given at [`Self::unregister`].
    pub(crate) fn disarm_event(&self) -> bool {
        self.state.swap(IDLE, Ordering::AcqRel) != EVENT
    }

    /// Whether the waiter is registered on its readiness eventfd.
    pub(crate) fn is_armed(&self) -> bool {
        self.state.load(Ordering::Acquire) == EVENT
    }

    /// Runs `check` until it returns `Some`: spinning, then yielding, then parked on this word,
    /// as `patience` says (see the `waiting` module), which learns from the wait. Returns `None`
    /// once `deadline` has passed.
    pub(crate) fn wait_until<R>(
        &self,
        patience: &mut Patience,
        deadline: &mut Deadline,
        mut check: impl FnMut() -> Option<R>,
    ) -> Option<R> {
        if let Some(done) = check() {
            return Some(done);
        }
        let spin_limit = patience.spins();
        let mut spins = 0;
        while spins < spin_limit {
            spin_loop();
            if let Some(done) = check() {
                return Some(done);
            }
            spins += 1;
            if spins.is_multiple_of(SPINS_PER_CLOCK_READ) && deadline.remaining().is_none() {
                return None;
            }
        }
        // Past the spin phase: from here the clock may be read.
        #[cfg(not(loom))]
        let spun = Instant::now();
        #[cfg(not(loom))]
        {
            let window = patience.yield_window();
            let mut gave_way = false;
            let mut last = spun;
            while !window.is_zero() {
                std::thread::yield_now();
                let now = Instant::now();
                gave_way |= now.duration_since(last) >= GAVE_WAY;
                last = now;
                if let Some(done) = check() {
                    patience.learn(now.duration_since(spun), gave_way);
                    return Some(done);
                }
                if now.duration_since(spun) >= window {
                    break;
                }
                deadline.remaining()?;
            }
        }
        loop {
            self.state.swap(WAITING, Ordering::AcqRel);
            if let Some(done) = check() {
                self.unregister();
                #[cfg(not(loom))]
                patience.learn(spun.elapsed(), false);
                return Some(done);
            }
            let Some(timeout) = deadline.remaining() else {
                self.unregister();
                return None;
            };
            self.futex_wait(WAITING, timeout);
        }
    }

    /// Leaves the waiting state. A swap, not a store: a plain store would end the release sequence
    /// of a waker's swap that came just before it, and the next registration, reading the plain
    /// store, would then not synchronise with that waker's publication (loom finds this).
    fn unregister(&self) {
        self.state.swap(IDLE, Ordering::AcqRel);
    }

    /// Sleeps while the word is `expected`, for at most `timeout` (`None`: no limit). Returns on a
    /// wake, a changed word, a signal or the timeout alike: the caller re-checks.
    #[cfg(not(loom))]
    fn futex_wait(&self, expected: u32, timeout: Option<Duration>) {
        shmbroker_sys::futex::wait(self.state.as_core(), expected, timeout);
    }

    #[cfg(not(loom))]
    #[cold]
    fn futex_wake(&self) {
        #[cfg(test)]
        WAKE_SYSCALLS.with(|count| count.set(count.get() + 1));
        shmbroker_sys::futex::wake(self.state.as_core(), 1);
    }

    /// Loom model of FUTEX_WAIT: compare and sleep under the lock the waker takes to wake.
    #[cfg(loom)]
    fn futex_wait(&self, expected: u32, _timeout: Option<Duration>) {
        let guard = self.sleepers.lock().unwrap();
        if self.state.load(Ordering::Relaxed) == expected {
            drop(self.condvar.wait(guard).unwrap());
        }
    }

    #[cfg(loom)]
    fn futex_wake(&self) {
        let _guard = self.sleepers.lock().unwrap();
        self.condvar.notify_all();
    }
}

// Wake-up system calls made by this thread, for tests that check none is made needlessly.
#[cfg(all(test, not(loom)))]
thread_local! {
    pub(crate) static WAKE_SYSCALLS: core::cell::Cell<u64> = const { core::cell::Cell::new(0) };
}

#[cfg(all(test, not(loom)))]
impl WaitWord {
    /// Whether the other side has registered as waiting on this word.
    pub(crate) fn has_waiter(&self) -> bool {
        self.state.load(Ordering::Acquire) == WAITING
    }
}

/// A deadline that reads the clock only once a wait actually has to wait.
#[derive(Debug)]
pub(crate) struct Deadline {
    timeout: Duration,
    /// `None` until first needed; then `Some(None)` when the timeout is beyond what `Instant`
    /// can represent (no limit).
    at: Option<Option<Instant>>,
}

impl Deadline {
    pub(crate) fn after(timeout: Duration) -> Self {
        Self { timeout, at: None }
    }

    /// When the clock started for this deadline (the wait went past its spin phase); `None`
    /// while it has not, or when there is no limit.
    pub(crate) fn started(&self) -> Option<Instant> {
        self.at.flatten()?.checked_sub(self.timeout)
    }

    /// Time left: `Some(None)` without a limit, `None` once the deadline has passed.
    #[allow(clippy::option_option)]
    fn remaining(&mut self) -> Option<Option<Duration>> {
        let timeout = self.timeout;
        match *self
            .at
            .get_or_insert_with(|| Instant::now().checked_add(timeout))
        {
            None => Some(None),
            Some(at) => at
                .checked_duration_since(Instant::now())
                .filter(|left| !left.is_zero())
                .map(Some),
        }
    }
}
