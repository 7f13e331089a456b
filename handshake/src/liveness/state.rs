//! Who is gone, as a session and its watcher thread both record and read it: the atomic state
//! behind the liveness module's `Shared`, in one type that the loom models drive.
//!
//! Either thread may record an exit (the watcher when a pidfd fires or the broker says a worker
//! went; the session's thread when it polls the pidfds itself, see `Shared::check_now`), and
//! either reads. Nothing here is under a lock, and a session call never waits on these words: it
//! waits on its ring, which a death closes or interrupts, and only then reads them.
//!
//! # The words
//!
//! * `dead`, `left`, `never_joined`: sets of ranks (bit `rank % 64` of a `u64`; a world has at
//!   most 64 ranks). Bits are set (`fetch_or`) and cleared only when the session adopts a dead
//!   rank's replacement ([`State::forget`]), so until then a rank once seen gone is seen gone by
//!   every later load in any thread that read the set. The session's thread clears them under
//!   the inbox lock, after putting the new process and rings in place; every exit is recorded
//!   under that lock too, and only for the pidfd the rank has then (`Shared::exited`), so an exit
//!   of the old process is either recorded before the adoption (and forgotten by it) or found
//!   stale after it: the mutex, not an ordering of these words, makes that right.
//! * `rejoins`: ranks whose replacement rejoined and waits for the session to adopt it: set by
//!   the watcher once the last notice of the rejoin is filed (under the inbox lock, which the
//!   adoption takes to read the notices), cleared by the adoption. A session looks at it with
//!   one load per receive from any peer.
//! * `first_dead`: goes once from `NONE` to a rank, by compare-exchange; an adoption of that
//!   rank's replacement ([`State::forget`], under the inbox lock) passes it to the lowest rank
//!   still dead, or back to `NONE`, so that no error names a rank that is there again. "Exactly
//!   once" below is per death between adoptions.
//! * `never_joined_after`: goes once from 0 to the broker's token (bit 40 set, so that a token of
//!   0 is told apart), by compare-exchange, *before* the rank's `never_joined` bit is set.
//! * `broker_lost`: goes once from false to true (the watcher closes the rings first).
//! * `gave_up_on`: why the last failed call failed (a rank that died, or one a timed-out call
//!   waited for, flagged), last writer wins. A hint cited on leaving, which no other word depends
//!   on: Relaxed.
//! * `interrupts` and `interrupted`: an `Interrupter`'s requests (a count a call compares, and a
//!   flag the wait that ends takes with a swap).
//! * the [`Interrupt`]'s generation (the queues crate's), fired after every death.
//!
//! # The first death is recorded exactly once
//!
//! Every compare-exchange on `first_dead` is a read-modify-write, so each reads the value just
//! before it in the word's modification order. That order starts with `NONE`; the first exchange
//! in it succeeds and writes a rank, and every later one reads a rank and fails, writing nothing.
//! So exactly one [`State::record_death`] returns "first", whichever thread and rank it was, and
//! the word never changes again. A thread that recorded a death reads `first_dead` afterwards:
//! by coherence it cannot read a value earlier in the modification order than the one its own
//! exchange read or wrote, which was a rank, so every recorder sees the winner.
//! (`loom_the_first_death_is_recorded_exactly_once`.)
//!
//! # A reader that sees the interrupt sees the death
//!
//! [`State::record_death`] sets the rank's `dead` bit and exchanges `first_dead` (both `AcqRel`),
//! then fires the interrupt: the generation's `fetch_add` (`AcqRel`), sequenced after both. A
//! session's call reads the generation (Acquire) *before* it reads who is dead, and hands that
//! generation to its wait:
//!
//! * if its read of the generation reads the increment (or a later one: every increment is a
//!   read-modify-write, so it continues the release sequence), it synchronises with it, the death
//!   happens-before the call's reads of `first_dead` and `dead`, and they find it;
//! * if it reads an older generation, the wait it hands that generation to ends `Interrupted` as
//!   soon as the increment lands (the queues crate's `interrupt` module), and the call's next
//!   read of the generation, then of `first_dead`, is the first case.
//!
//! So a call never sleeps through a death, and a call that was interrupted by one finds it.
//! (`loom_an_interrupt_after_a_death_sees_it`.) The same argument, with the `never_joined` bit in
//! the place of the generation, gives "whoever sees a rank that never joined sees its token"
//! (`loom_a_rank_that_never_joined_is_read_with_its_token`).
//!
//! [`Interrupt`]: shmbroker_queues::Interrupt

use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use bytemuck::Pod;
use shmbroker_queues::{Closer, Interrupt};
use std::sync::Arc;

/// No rank recorded.
const NONE: u32 = u32::MAX;

/// Marks `never_joined_after` as set (a token may be 0: rank 0 died).
const TOKEN_SET: u64 = 1 << 40;

/// A rank's bit in a set of ranks.
fn bit(rank: u32) -> u64 {
    1u64 << (rank % 64)
}

/// The atomic state a session and its watcher share (see the module docs).
#[derive(Debug)]
pub(crate) struct State {
    /// Ranks whose process exited without leaving, and the first of them.
    dead: AtomicU64,
    first_dead: AtomicU32,
    /// Ranks that left (their process exited after they closed their ring ends).
    left: AtomicU64,
    broker_lost: AtomicBool,
    /// Ranks the broker said will never log on, and its token for the first of them (who wound
    /// the job down; the same for all of one job).
    never_joined: AtomicU64,
    never_joined_after: AtomicU64,
    /// The first rank this worker's last timed-out call waited for (`NONE` if none timed out).
    gave_up_on: AtomicU32,
    /// Fired after every death: ends the interruptible waits of this worker (the consumer end of
    /// every ring from a peer holds it), so that collectives stop waiting on live peers.
    interrupt: Arc<Interrupt>,
    /// Set by an `Interrupter`; taken by the wait it ends.
    interrupted: AtomicBool,
    /// How many times an `Interrupter` has asked: a call that saw one number at its first look
    /// and another later was interrupted meanwhile, whichever other call took the flag.
    interrupts: AtomicU64,
    /// Ranks whose replacement rejoined and is not yet adopted.
    rejoins: AtomicU64,
    /// Writes to the readiness eventfd made for rejoins, not yet counted by the session.
    rejoin_signals: AtomicU64,
}

impl State {
    /// Nobody gone, nothing asked; deaths fire `interrupt`.
    pub(crate) fn new(interrupt: Arc<Interrupt>) -> Self {
        Self {
            dead: AtomicU64::new(0),
            first_dead: AtomicU32::new(NONE),
            left: AtomicU64::new(0),
            broker_lost: AtomicBool::new(false),
            never_joined: AtomicU64::new(0),
            never_joined_after: AtomicU64::new(0),
            gave_up_on: AtomicU32::new(NONE),
            interrupt,
            interrupted: AtomicBool::new(false),
            interrupts: AtomicU64::new(0),
            rejoins: AtomicU64::new(0),
            rejoin_signals: AtomicU64::new(0),
        }
    }

    /// One more write to the readiness eventfd for a rejoin.
    pub(crate) fn count_rejoin_signal(&self) {
        self.rejoin_signals.fetch_add(1, Ordering::AcqRel);
    }

    /// The rejoin writes since the last call (swapped to 0).
    pub(crate) fn take_rejoin_signals(&self) -> u64 {
        self.rejoin_signals.swap(0, Ordering::AcqRel)
    }

    /// The interrupt fired after every death.
    pub(crate) fn interrupt(&self) -> Arc<Interrupt> {
        Arc::clone(&self.interrupt)
    }

    /// `rank`'s replacement rejoined (its notices are filed): the session adopts it when next
    /// asked to.
    pub(crate) fn note_rejoin(&self, rank: u32) {
        self.rejoins.fetch_or(bit(rank), Ordering::AcqRel);
    }

    /// The ranks whose replacement waits to be adopted (bit `rank`).
    pub(crate) fn rejoins_pending(&self) -> u64 {
        self.rejoins.load(Ordering::Acquire)
    }

    /// `rank`'s replacement will not be adopted (its files were not what they should be).
    pub(crate) fn drop_rejoin(&self, rank: u32) {
        self.rejoins.fetch_and(!bit(rank), Ordering::AcqRel);
    }

    /// `rank`'s replacement is adopted: it is no longer gone, and no longer pending (see the
    /// module docs for why clearing is safe here).
    pub(crate) fn forget(&self, rank: u32) {
        let dead = self.dead.fetch_and(!bit(rank), Ordering::AcqRel) & !bit(rank);
        self.left.fetch_and(!bit(rank), Ordering::AcqRel);
        // A rank that had not logged on comes late (the job's token stays for the others).
        self.never_joined.fetch_and(!bit(rank), Ordering::AcqRel);
        self.rejoins.fetch_and(!bit(rank), Ordering::AcqRel);
        // The first death, if it was this rank's, passes to the lowest rank still dead (or to
        // none): errors must not name a rank that is there again.
        let next = if dead == 0 {
            NONE
        } else {
            dead.trailing_zeros()
        };
        let _ = self
            .first_dead
            .compare_exchange(rank, next, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Records that `rank` died (its bit, and `rank` as the first death unless one was recorded
    /// before), then runs `close` (the caller closes the rings shared with `rank` there), then
    /// fires the interrupt, waking the consumers of `wake`'s rings. Returns whether `rank` is
    /// the first death: exactly one call ever does.
    pub(crate) fn record_death<'a, T: Pod>(
        &self,
        rank: u32,
        close: impl FnOnce(),
        wake: impl IntoIterator<Item = &'a Closer<T>>,
    ) -> bool {
        self.dead.fetch_or(bit(rank), Ordering::AcqRel);
        let first = self
            .first_dead
            .compare_exchange(NONE, rank, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        close();
        self.interrupt.fire(wake);
        first
    }

    /// Records that `rank` left.
    pub(crate) fn record_left(&self, rank: u32) {
        self.left.fetch_or(bit(rank), Ordering::AcqRel);
    }

    /// Whether `rank`'s death has been recorded.
    pub(crate) fn is_dead(&self, rank: u32) -> bool {
        rank < 64 && self.dead.load(Ordering::Acquire) & bit(rank) != 0
    }

    /// The ranks whose death has been recorded (bit `rank % 64`).
    pub(crate) fn dead(&self) -> u64 {
        self.dead.load(Ordering::Acquire)
    }

    /// Whether `rank`'s departure has been recorded.
    pub(crate) fn has_left(&self, rank: u32) -> bool {
        self.left.load(Ordering::Acquire) & bit(rank) != 0
    }

    /// The ranks whose exit has been recorded, as a death or a departure (bit `rank % 64`).
    pub(crate) fn gone(&self) -> u64 {
        self.dead.load(Ordering::Acquire) | self.left.load(Ordering::Acquire)
    }

    /// Whether `rank`'s exit has been recorded (as a death or a departure).
    pub(crate) fn recorded(&self, rank: u32) -> bool {
        self.gone() & bit(rank) != 0
    }

    /// The first rank recorded dead, if any.
    pub(crate) fn first_dead(&self) -> Option<u32> {
        let rank = self.first_dead.load(Ordering::Acquire);
        (rank != NONE).then_some(rank)
    }

    /// Records that the broker is gone (after the caller closed what that closes).
    pub(crate) fn record_broker_lost(&self) {
        self.broker_lost.store(true, Ordering::Release);
    }

    /// Whether the broker's loss has been recorded.
    pub(crate) fn broker_lost(&self) -> bool {
        self.broker_lost.load(Ordering::Acquire)
    }

    /// Records that `rank` will never log on, `token` naming who wound the job down: the token
    /// first (only the first is kept: the broker sends the same one for every rank of a job),
    /// then the rank's bit, so that whoever sees the bit sees the token.
    pub(crate) fn record_never_joins(&self, rank: u32, token: u64) {
        let _ = self.never_joined_after.compare_exchange(
            0,
            token | TOKEN_SET,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        self.never_joined.fetch_or(bit(rank), Ordering::AcqRel);
    }

    /// The broker's token for `rank` if it said `rank` will never log on: the rank that wound
    /// the job down (low 32 bits) and whether it left (bit 32).
    pub(crate) fn never_joined(&self, rank: u32) -> Option<u64> {
        if rank >= 64 || self.never_joined.load(Ordering::Acquire) & bit(rank) == 0 {
            return None;
        }
        Some(self.never_joined_after.load(Ordering::Acquire) & !TOKEN_SET)
    }

    /// Records why the last failed call failed (the last such wins): a departure cause, as
    /// [`Shared::departure_cause`](super::Shared::departure_cause) gives it.
    pub(crate) fn note_gave_up_on(&self, cause: u32) {
        self.gave_up_on.store(cause, Ordering::Relaxed);
    }

    /// The cause the last failed call noted, if one did.
    pub(crate) fn gave_up_on(&self) -> Option<u32> {
        let rank = self.gave_up_on.load(Ordering::Relaxed);
        (rank != NONE).then_some(rank)
    }

    /// The generation of the interrupt fired after every death: read it before
    /// [`Self::first_dead`] and hand it to an interruptible wait.
    pub(crate) fn interrupt_generation(&self) -> u64 {
        self.interrupt.generation()
    }

    /// An `Interrupter`'s request: counted, flagged for the wait that takes it, then the
    /// consumers of `wake`'s rings are woken. Async-signal-safe: atomics and wake-up system calls.
    pub(crate) fn request_interrupt<'a, T: Pod>(
        &self,
        wake: impl IntoIterator<Item = &'a Closer<T>>,
    ) {
        self.interrupts.fetch_add(1, Ordering::AcqRel);
        self.interrupted.store(true, Ordering::Release);
        self.interrupt.fire(wake);
    }

    /// How many times an `Interrupter` has asked so far.
    pub(crate) fn interrupt_count(&self) -> u64 {
        self.interrupts.load(Ordering::Acquire)
    }

    /// Takes an `Interrupter`'s request: whether there was one (it is cleared).
    pub(crate) fn take_interrupt(&self) -> bool {
        self.interrupted.load(Ordering::Acquire) && self.interrupted.swap(false, Ordering::AcqRel)
    }

    /// Puts back a request a call took without ending on it (see `Shared::keep_interrupt`): the
    /// count does not move.
    pub(crate) fn keep_interrupt(&self) {
        self.interrupted.store(true, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::State;
    use shmbroker_queues::{Closer, Interrupt};
    use std::sync::Arc;

    fn state() -> State {
        State::new(Arc::new(Interrupt::new()))
    }

    /// No rings to wake.
    fn none() -> std::iter::Empty<&'static Closer<u64>> {
        std::iter::empty()
    }

    #[test]
    fn the_first_death_is_kept_and_every_death_is_recorded() {
        let state = state();
        assert_eq!((state.first_dead(), state.gone()), (None, 0));
        let mut closed = false;
        assert!(state.record_death(3, || closed = true, none()));
        assert!(closed);
        assert!(!state.record_death(1, || {}, none()));
        assert!(!state.record_death(3, || {}, none()));
        assert_eq!(state.first_dead(), Some(3));
        assert!(state.is_dead(1) && state.is_dead(3) && !state.is_dead(2));
        assert!(state.recorded(1) && !state.has_left(1));
        assert_eq!(state.gone(), 0b1010);
    }

    #[test]
    fn a_death_fires_the_interrupt_after_it_is_recorded() {
        let state = state();
        let before = state.interrupt_generation();
        state.record_death(
            2,
            || assert_eq!(state.interrupt_generation(), before),
            none(),
        );
        assert_ne!(state.interrupt_generation(), before);
    }

    #[test]
    fn a_departure_is_recorded_apart_from_deaths() {
        let state = state();
        state.record_left(5);
        assert!(state.has_left(5) && state.recorded(5) && !state.is_dead(5));
        assert_eq!(state.first_dead(), None);
        // Rank 64 and above are never dead (the bit would be another rank's).
        assert!(!state.is_dead(64));
    }

    #[test]
    fn the_first_never_joins_token_is_kept_even_when_it_is_zero() {
        let state = state();
        assert_eq!(state.never_joined(2), None);
        state.record_never_joins(2, 0);
        state.record_never_joins(3, 1 << 32 | 1);
        assert_eq!(state.never_joined(2), Some(0));
        assert_eq!(state.never_joined(3), Some(0));
        assert_eq!(state.never_joined(1), None);
        assert_eq!(state.never_joined(64), None);
    }

    #[test]
    fn the_broker_loss_and_the_last_timeout_are_kept() {
        let state = state();
        assert!(!state.broker_lost());
        assert_eq!(state.gave_up_on(), None);
        state.record_broker_lost();
        state.note_gave_up_on(1);
        state.note_gave_up_on(2);
        assert!(state.broker_lost());
        assert_eq!(state.gave_up_on(), Some(2));
    }

    #[test]
    fn an_interrupt_request_is_counted_and_taken_once() {
        let state = state();
        let generation = state.interrupt_generation();
        assert!(!state.take_interrupt());
        state.request_interrupt(none());
        state.request_interrupt(none());
        assert_eq!(state.interrupt_count(), 2);
        assert_ne!(state.interrupt_generation(), generation);
        assert!(state.take_interrupt());
        assert!(!state.take_interrupt());
        assert_eq!(state.interrupt_count(), 2);
    }
}

/// Loom models of the liveness state. Run with
/// `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p shmbroker-handshake --lib loom`.
/// Each names the property it checks (see the module docs for the arguments).
#[cfg(all(test, loom))]
mod loom_tests {
    use super::State;
    use loom::thread;
    use shmbroker_queues::{Closer, Interrupt};
    use std::sync::Arc;

    fn state() -> Arc<State> {
        Arc::new(State::new(Arc::new(Interrupt::new())))
    }

    /// No rings to wake (the wake-up itself is the queues crate's, model-checked there).
    fn none() -> std::iter::Empty<&'static Closer<u64>> {
        std::iter::empty()
    }

    /// Two threads record two deaths at once (the watcher, and a session's call polling the
    /// pidfds itself): exactly one wins, both then read the winner, and it never changes; both
    /// deaths are recorded.
    #[test]
    fn loom_the_first_death_is_recorded_exactly_once() {
        loom::model(|| {
            let state = state();
            let reporters: Vec<_> = [1, 2]
                .map(|rank| {
                    let state = Arc::clone(&state);
                    thread::spawn(move || {
                        let won = state.record_death(rank, || {}, none());
                        let first = state.first_dead().expect("a recorder reads no first death");
                        assert!(state.is_dead(rank));
                        if won {
                            assert_eq!(first, rank);
                        } else {
                            assert_ne!(first, rank);
                        }
                        (won, first)
                    })
                })
                .into_iter()
                .collect();
            let seen: Vec<(bool, u32)> = reporters.into_iter().map(|t| t.join().unwrap()).collect();
            assert_eq!(seen.iter().filter(|(won, _)| *won).count(), 1);
            assert_eq!(seen[0].1, seen[1].1);
            assert_eq!(state.first_dead(), Some(seen[0].1));
            assert!(state.is_dead(1) && state.is_dead(2));
        });
    }

    /// A session's call reads the interrupt's generation, then who died, as it does before every
    /// wait, while the watcher records a death: it sees the death then, or its wait (handed the
    /// generation it read) ends, and after that it sees the death.
    #[test]
    fn loom_an_interrupt_after_a_death_sees_it() {
        loom::model(|| {
            let state = state();
            let watcher = {
                let state = Arc::clone(&state);
                thread::spawn(move || state.record_death(1, || {}, none()))
            };
            let seen = state.interrupt_generation();
            if state.first_dead().is_none() {
                // The wait: it ends when the generation moves on (Interrupted).
                while state.interrupt_generation() == seen {
                    thread::yield_now();
                }
            }
            assert_eq!(state.first_dead(), Some(1));
            assert!(state.is_dead(1));
            assert!(watcher.join().unwrap());
        });
    }

    /// The watcher records that a rank will never log on while a call asks: one that sees the
    /// rank reads the broker's token with it.
    #[test]
    fn loom_a_rank_that_never_joined_is_read_with_its_token() {
        loom::model(|| {
            let state = state();
            let watcher = {
                let state = Arc::clone(&state);
                thread::spawn(move || state.record_never_joins(2, 1 << 32 | 3))
            };
            if let Some(token) = state.never_joined(2) {
                assert_eq!(token, 1 << 32 | 3);
            }
            watcher.join().unwrap();
            assert_eq!(state.never_joined(2), Some(1 << 32 | 3));
        });
    }
}
