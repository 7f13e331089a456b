//! Who is still there: every worker watches its peers' processes, and its broker, itself.
//!
//! # Why not trust the broker (or the rings) to say who died
//!
//! A broker that closes rings for a dead worker must itself be alive, must notice the death (a
//! worker that forked a child holding its socket does not close it), and must find the ring
//! headers intact (a dying peer can scribble on them). So each worker's session runs a watcher
//! thread instead. It sleeps in `poll(2)` on:
//!
//! * a pidfd for every peer, which the broker opened while that peer was waiting for its logon
//!   reply (so it names that very process, immune to pid reuse) and passed on in a
//!   [`NoticeKind::Peer`] notice. A pidfd becomes readable when its process has exited, and stays
//!   readable: every watcher sees the same kernel fact, in any order;
//! * the socket to the broker, to read every notice it sends (peers' pidfds and outboxes, relayed
//!   fds and relay answers, filed for the session's thread; and `PeerGone` when the broker saw a
//!   worker go, which counts like that worker's pidfd: a pidfd names the process that connected,
//!   which is not the one that logged on over an inherited socket) and to see it close;
//! * an eventfd that stops it.
//!
//! When a peer's process has exited, the watcher looks at the two ring ends that peer owns in
//! this worker's links: a peer that dropped its session closed them before it exited
//! ([`Connection`]'s drop does that right after its goodbye to the broker), so it **left**;
//! otherwise it **died**.
//! A death is recorded (the first one is kept apart: collectives name it), and the watcher closes
//! the two rings shared with the dead rank, through [`Closer`]s that share the session's own
//! mappings and validated geometry, with the dead rank as cause: whatever waits on them wakes,
//! receives what the dead rank sent before dying, then learns from [`Shared::departure`] that it
//! died. The rings to the other peers stay open, so a worker can carry on with them. Then the
//! watcher fires the session's [`Interrupt`]: a wait that cannot end without the dead rank even
//! though it waits on a live one (a collective: that peer waits on the dead rank too) gives up,
//! and the others (point to point with a live peer) look again and wait on.
//!
//! A worker that drops its session after a call of its failed on a rank's death closes its ends
//! of its rings with that rank as cause (a worker none of whose calls failed cites nothing: it
//! left because it was done): peers that see it go before they see the death (a peer's collective fails
//! on the dead rank, and its program gives up and leaves, while this worker's collective still
//! waits on it) can tell that it left *because of* the death, and a collective names the rank
//! that died, not the one that gave up. A cause is only a claim, so it is believed only once this
//! worker's own pidfd for that rank (or the broker's word) shows the death, waited for a moment;
//! otherwise the peer itself is named. This worker's own watcher also closes rings with a cause
//! (the dead rank, or [`BROKER_LOST`] for peers that never logged on while the broker was
//! there). So the only things read from memory a live peer could write are that peer's own "I
//! closed my end" and its claims about others, which are checked against the kernel before
//! anyone is named.
//!
//! A job that has lost a worker (it died or left) admits nobody new: the broker then tells every
//! worker still there which ranks never logged on ([`NoticeKind::NeverJoins`]), and the watcher
//! closes the rings to them with [`NEVER_JOINED`] as cause, so that a call waiting for one fails
//! at once, naming it and the rank that wound the job down, instead of waiting to its deadline.
//!
//! When the broker's socket closes, the broker is **lost**: operations that need it (an outbox
//! or relayed fd still to come) fail with [`Error::BrokerLost`], and since no peer can log on any
//! more, the rings to peers that never did are closed, so nobody waits for them.
//!
//! The closing itself is the ring's third-party close ([`Closer::close`]), whose wake-up is
//! model-checked in the queues crate (`loom_a_third_party_close_wakes_a_parked_*`); so is the
//! interrupt's (`loom_an_interrupt_*`).
//!
//! # Between the watcher and the session's thread
//!
//! They share [`Shared`]. What the broker sent sits in an inbox under a mutex, with a condition
//! variable for the session's waits. Who is gone is monotonic atomic words, in the `state`
//! submodule (with the argument for their orderings and the loom models that check it): bits are
//! only ever set in `dead` and `left`, and `first_dead` goes once from "none" to a rank
//! (compare-exchange), so whichever thread records an exit first decides, and both may record the
//! same one (the second finds it recorded). A death is recorded before the interrupt fires, so a
//! call that sees the interrupt sees the death. A change to them is followed by taking the inbox
//! lock and notifying, so a waiter that checked before the change is already waiting when the
//! notification comes. The watcher thread itself is the `watcher` submodule.
//! A session call never waits on these words: it waits on its ring, which a death closes (or
//! interrupts), and only then asks who is gone (which polls the pidfds itself, so it never
//! depends on the watcher having run).
//!
//! [`Connection`]: crate::Connection

mod slots;
mod state;
mod watcher;

pub(crate) use watcher::Watcher;

use crate::error::{Error, ProtocolError};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use shmbroker_bindings::{Message, NoticeKind};
use shmbroker_queues::{Closer, Interrupt, Notifier, Role};
use slots::Slots;
use state::State;
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why a peer is no longer there, as this worker's watcher established it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Departure {
    /// `rank` dropped its session on purpose.
    Left {
        /// The rank.
        rank: u32,
        /// What it gave up on before it left, when it said so (see [`LeftAfter`]).
        after: Option<LeftAfter>,
    },
    /// `rank`'s process exited without dropping its session (killed, crashed, aborted).
    Lost {
        /// The rank.
        rank: u32,
    },
    /// The broker is gone, and the peer never logged on while it was there.
    BrokerLost,
    /// `rank` never logged on, and no longer can: the broker closed the job to newcomers when
    /// `after` died or left (`after_left`).
    NeverJoined {
        /// The rank that never came.
        rank: u32,
        /// The rank whose death or departure wound the job down.
        after: u32,
        /// Whether `after` left (rather than died).
        after_left: bool,
    },
}

/// What a peer that left had given up on, as it said when it closed its ring ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeftAfter {
    /// It saw this rank die (and this worker saw that death too).
    Died(u32),
    /// A call of its timed out waiting for this rank (its word: a hint, not checked).
    TimedOut(u32),
}

/// Marks a ring-close cause as "left after timing out waiting for" the rank in the other bits.
/// Ranks stay below it, and so below the watcher's own causes (`NEVER_JOINED`, `BROKER_LOST`),
/// which have it set.
pub const TIMED_OUT: u32 = 1 << 31;

/// The rank a close cause says its closer timed out waiting for, if it says that.
#[must_use]
pub fn timed_out_on(cause: u32) -> Option<u32> {
    (cause & TIMED_OUT != 0 && cause < NEVER_JOINED).then_some(cause & !TIMED_OUT)
}

/// [`timed_out_on`] for a cause a peer wrote into its ring header: believed only for a rank of
/// the world of `world` ranks other than the closer itself (a peer may write anything there; a
/// rank outside the world is not named in an error).
fn timed_out_within(cause: u32, closer: u32, world: usize) -> Option<u32> {
    timed_out_on(cause).filter(|&rank| rank != closer && (rank as usize) < world)
}

/// The cause a watcher gives the rings it closes because the broker is gone.
pub const BROKER_LOST: u32 = u32::MAX;

/// The cause a watcher gives the rings it closes to a peer that the broker says will never log
/// on (see [`NoticeKind::NeverJoins`]).
pub const NEVER_JOINED: u32 = u32::MAX - 1;

/// How long a peer's claim (that some rank died, or that the broker is gone) is given to show
/// in this worker's own view.
const CLAIM_GRACE: Duration = Duration::from_millis(20);

// Ranks are bits of a u64.
const _: () = assert!(crate::wire::MAX_WORLD_SIZE <= 64);

/// A rank whose process was seen to exit, with the pidfd that showed it (`None`: the broker
/// said so, about whichever process holds the rank now).
pub(crate) type Exit = (u32, Option<Arc<OwnedFd>>);

/// One peer's process, as the broker passed it on.
#[derive(Debug, Clone)]
pub(crate) struct PeerProcess {
    pub pid: i32,
    pub pidfd: Arc<OwnedFd>,
    /// The pid it sees itself as (`getpid` in its own PID namespace), when this process can
    /// see it (read once, from the pidfd's `NSpid`).
    pub own_pid: Option<i32>,
}

/// What the broker sent, filed for the session's thread.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    /// Relayed fds not yet taken, by (sender, token).
    pub relayed: HashMap<(u32, u64), OwnedFd>,
    /// Relayed fds whose token's low 48 bits are below this are of exchanges given up on: they
    /// are closed as they come (see [`crate::Connection::abandon_relays_below`]).
    pub relay_floor: u64,
    /// Relayed fds closed that way, whose taking the broker is still to be told of.
    pub relays_to_claim: Vec<(u32, u64)>,
    /// Peers' outboxes not yet taken, by owner.
    pub outboxes: HashMap<u32, OwnedFd>,
    /// Peers' processes, by rank.
    pub peers: HashMap<u32, PeerProcess>,
    /// The broker's answers to this worker's relays, by (receiver, token): delivered or not.
    pub relay_answers: HashMap<(u32, u64), RelayAnswer>,
    /// The broker's answers to this worker's channel requests, by (consumer, token): the ring,
    /// or the refusal.
    pub channel_answers: HashMap<(u32, u64), Option<OwnedFd>>,
    /// Channels peers asked for to this worker, not yet taken, by (producer, channel number):
    /// the request's token and the ring.
    pub channel_offers: HashMap<(u32, u64), (u64, OwnedFd)>,
    /// Peers that died and whose replacement rejoined, not yet adopted by the session (see
    /// [`Shared::adopt`]), by rank.
    pub rejoins: HashMap<u32, Rejoin>,
    /// The first notice from the broker that broke the protocol; the socket is not read after it.
    pub fault: Option<ProtocolError>,
    /// Peers the broker said are gone (`PeerGone`), until a replacement rejoins. Filed in the
    /// order of the broker's notices, so nothing it passed on from such a peer is still to come.
    /// Whether each said goodbye first.
    pub gone: HashMap<u32, bool>,
}

/// A dead peer's replacement, as the broker announced it (its `Rejoin*` notices, in order).
#[derive(Debug, Default)]
pub(crate) struct Rejoin {
    /// How many times the rank has been replaced, this one included.
    pub times: u32,
    /// The fresh ring to it, the fresh ring from it, its readiness eventfd.
    pub to: Option<OwnedFd>,
    pub from: Option<OwnedFd>,
    pub readiness: Option<OwnedFd>,
    /// Its process: the last notice, after which the rejoin is complete.
    pub process: Option<PeerProcess>,
    /// The broker said it is gone already (and whether it said goodbye).
    pub gone: Option<bool>,
}

impl Rejoin {
    /// Whether every notice of the rejoin has arrived.
    pub fn complete(&self) -> bool {
        self.process.is_some()
    }
}

/// What the broker did with a relayed fd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RelayAnswer {
    Delivered,
    Refused(NoticeKind),
}

/// State shared by a session and its watcher.
#[derive(Debug)]
pub(crate) struct Shared {
    rank: u32,
    pub inbox: Mutex<Inbox>,
    pub arrived: Condvar,
    /// Per peer, the closers of the ring to it and the ring from it (none for this rank),
    /// replaced when the peer rejoins.
    closers: Slots<(Closer<Message>, Closer<Message>)>,
    /// This worker's readiness eventfd: written when a rejoin is complete, so that a receive
    /// from any peer asleep on it wakes to report it.
    readiness: Notifier,
    /// This worker's status words, once its session has an outbox: the watcher stamps
    /// `status_word::ALIVE` in them every tick.
    pub heartbeat: std::sync::OnceLock<shmbroker_allocator::StatusWords>,
    /// Who is gone, the interrupt fired after every death, and an [`Interrupter`]'s requests;
    /// why the last failed call failed, cited when this worker leaves (see [`Connection`]'s
    /// drop).
    state: State,
}

/// Ends whatever waits a session is in, from another thread or a signal handler: each call
/// waiting then (a split session's two halves may both be) returns an "interrupted" error and the
/// session stays usable (a collective cut short leaves its peers waiting for this rank's part, so
/// do not go on with collectives after one). With no call waiting, the next wait ends at once,
/// unless [`Connection::clear_interrupt`](crate::Connection::clear_interrupt) forgets it.
///
/// [`Self::interrupt`] is async-signal-safe: it stores to atomics and makes `futex` and `write`
/// system calls, and takes no lock and allocates nothing. It wakes the waits on rings (every
/// message and collective wait) but not a wait for the broker (an fd relay, a peer's logon),
/// which ends at its deadline.
#[derive(Debug, Clone)]
pub struct Interrupter {
    shared: Arc<Shared>,
}

impl Interrupter {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// How many times an interrupt has been asked for so far (see
    /// [`Connection::interrupt_count`](crate::Connection::interrupt_count)).
    #[must_use]
    pub fn count(&self) -> u64 {
        self.shared.interrupt_count()
    }

    /// Ends the session's current waits (or its next one).
    pub fn interrupt(&self) {
        let closers = self.shared.closers.read();
        self.shared
            .state
            .request_interrupt(closers.iter().map(|(_, from)| from));
    }
}

/// What a channel end asks of its session without borrowing it: whether its peer is still
/// there, and whether an interrupt came. Cheap to clone; any thread.
#[derive(Clone, Debug)]
pub struct PeerWatch {
    shared: Arc<Shared>,
}

impl PeerWatch {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Why `peer` is gone, or `None` while it is there (see
    /// [`Connection::departure`](crate::Connection::departure)).
    #[must_use]
    pub fn departure(&self, peer: u32) -> Option<Departure> {
        self.shared.departure(peer)
    }

    /// Whether `peer`'s process is known to have died (not merely its session closed).
    #[must_use]
    pub fn is_dead(&self, peer: u32) -> bool {
        self.shared.check_now();
        self.shared.is_dead(peer)
    }

    /// [`Interrupter::count`].
    #[must_use]
    pub fn interrupt_count(&self) -> u64 {
        self.shared.interrupt_count()
    }
}

impl Shared {
    pub fn new(
        rank: u32,
        closers: Vec<Option<(Closer<Message>, Closer<Message>)>>,
        interrupt: Arc<Interrupt>,
        readiness: Notifier,
    ) -> Self {
        Self {
            rank,
            inbox: Mutex::new(Inbox::default()),
            arrived: Condvar::new(),
            closers: Slots::new(closers),
            readiness,
            heartbeat: std::sync::OnceLock::new(),
            state: State::new(interrupt),
        }
    }

    /// The interrupt every consumer end of this worker's rings holds.
    pub fn interrupt(&self) -> Arc<Interrupt> {
        self.state.interrupt()
    }

    /// The ranks whose replacement has rejoined and waits to be adopted (bit `rank`).
    pub fn rejoins_pending(&self) -> u64 {
        self.state.rejoins_pending()
    }

    /// Waits up to `timeout` for a complete rejoin of `rank` in the inbox, or the broker's loss.
    pub fn wait_for_rejoin(&self, rank: u32, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut inbox = self.lock();
        loop {
            if inbox.rejoins.get(&rank).is_some_and(Rejoin::complete) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.broker_lost() || inbox.fault.is_some() {
                return false;
            }
            inbox = self
                .arrived
                .wait_timeout(inbox, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// A rejoin of `rank` (replaced `times` times) that could not be adopted is dropped: `rank`
    /// stays gone (unless a newer replacement waits already).
    pub fn drop_rejoin(&self, rank: u32, times: u32) {
        let mut inbox = self.lock();
        if inbox
            .rejoins
            .get(&rank)
            .is_some_and(|rejoin| rejoin.times == times)
        {
            inbox.rejoins.remove(&rank);
            self.state.drop_rejoin(rank);
        }
    }

    /// A rejoin of `rank` is complete in the inbox (the caller holds its lock): the session is
    /// told, by the state's pending bit.
    fn note_rejoin(&self, rank: u32) {
        self.state.note_rejoin(rank);
    }

    /// After [`Self::note_rejoin`], with the lock let go: a receive asleep on the readiness
    /// eventfd wakes to report it. The write is counted ([`Self::take_rejoin_signals`]), so the
    /// session's next look that finds nothing resets the eventfd and an event loop does not
    /// spin on it.
    fn signal_rejoin(&self) {
        self.state.count_rejoin_signal();
        shmbroker_sys::eventfd::signal(self.readiness.as_fd());
    }

    /// The writes to the readiness eventfd made for rejoins since the last call (the session
    /// counts them as owed, see the session's `any` module).
    pub fn take_rejoin_signals(&self) -> u64 {
        self.state.take_rejoin_signals()
    }

    /// Whether a complete rejoin of `rank` waits in the inbox.
    pub fn rejoin_ready(&self, rank: u32) -> bool {
        self.lock().rejoins.get(&rank).is_some_and(Rejoin::complete)
    }

    /// Puts rank `rank`'s replacement (the one replaced `times` times) in place of its dead
    /// process: the closers of the fresh rings (`closers`), its process, and "not gone" in the
    /// state; all under the inbox lock, as every exit is recorded (see [`Self::exited`]), so that
    /// an exit of the old process found just before is either recorded before (and forgotten
    /// here) or found stale. Returns the broker's word that the replacement is gone too, if it
    /// came meanwhile (`Some(said_goodbye)`), or `None`, changing nothing, when a newer
    /// replacement has taken its place in the inbox.
    pub fn adopt(
        &self,
        rank: u32,
        times: u32,
        closers: (Closer<Message>, Closer<Message>),
    ) -> bool {
        let mut inbox = self.lock();
        if inbox
            .rejoins
            .get(&rank)
            .is_none_or(|rejoin| rejoin.times != times)
        {
            return false;
        }
        let Some(rejoin) = inbox.rejoins.remove(&rank) else {
            return false;
        };
        let Some(process) = rejoin.process else {
            return false;
        };
        let pidfd = Arc::clone(&process.pidfd);
        self.closers.replace(rank as usize, closers);
        inbox.peers.insert(rank, process);
        self.state.forget(rank);
        drop(inbox);
        // The broker said this very process is gone (before it was adopted): recorded against
        // its own pidfd, so that a newer replacement filed meanwhile is never taken for it.
        if rejoin.gone.is_some() {
            self.record_exits(&[(rank, Some(pidfd))]);
        }
        // The new process may have exited already: looked at now, and by the watcher, which
        // polls the pidfds of every rank not gone.
        self.check_now();
        self.wake_waiters();
        true
    }

    /// The inbox, even if a thread panicked holding it (its maps stay consistent).
    pub fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.inbox
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the broker's socket has closed.
    pub fn broker_lost(&self) -> bool {
        self.state.broker_lost()
    }

    /// The interrupt fired after every death: read its generation before [`Self::first_dead`]
    /// and hand it to an interruptible wait.
    pub fn interrupt_generation(&self) -> u64 {
        self.state.interrupt_generation()
    }

    /// How many times an [`Interrupter`] has asked so far.
    pub fn interrupt_count(&self) -> u64 {
        self.state.interrupt_count()
    }

    /// Takes an [`Interrupter`]'s request: whether there was one (it is cleared).
    pub fn take_interrupt(&self) -> bool {
        self.state.take_interrupt()
    }

    /// Puts back a request a call took without ending on it: the next look takes it again. The
    /// count does not move, so waits that began after the request are not ended by it twice.
    pub fn keep_interrupt(&self) {
        self.state.keep_interrupt();
    }

    /// Why `rank` will never log on, if the broker said it will not.
    pub fn never_joined(&self, rank: u32) -> Option<Departure> {
        let token = self.state.never_joined(rank)?;
        Some(Departure::NeverJoined {
            rank,
            after: (token & u64::from(u32::MAX)) as u32,
            after_left: token >> 32 & 1 != 0,
        })
    }

    /// Whether `rank`'s death has been recorded.
    pub fn is_dead(&self, rank: u32) -> bool {
        self.state.is_dead(rank)
    }

    /// The ranks whose death has been recorded (bit `rank % 64`): one atomic load, for a hot
    /// path to see that something changed.
    pub fn dead_mask(&self) -> u64 {
        self.state.dead()
    }

    /// The first rank seen to die, if any.
    pub fn first_dead(&self) -> Option<u32> {
        self.state.first_dead()
    }

    /// Records that a call of this worker timed out waiting for `rank` (the last failed call
    /// wins).
    pub fn note_gave_up_on(&self, rank: u32) {
        // Below NEVER_JOINED and BROKER_LOST with the flag set: no cause is mistaken for another.
        if rank < NEVER_JOINED & !TIMED_OUT {
            self.state.note_gave_up_on(TIMED_OUT | rank);
        }
    }

    /// Records that a call of this worker failed because `rank` died (the last failed call
    /// wins).
    pub fn note_failed_on_death(&self, rank: u32) {
        if rank < TIMED_OUT {
            self.state.note_gave_up_on(rank);
        }
    }

    /// What this worker cites when it leaves: why its last failed call failed, a death
    /// ([`Self::note_failed_on_death`]) or a timeout ([`Self::note_gave_up_on`], with
    /// [`TIMED_OUT`] set), else nothing. A death no call of its failed on is not cited: a rank
    /// that finished its work and left did not leave because of it.
    pub fn departure_cause(&self) -> Option<u32> {
        self.state.gave_up_on()
    }

    /// Why the link to `peer` is closed (or a call on it failed): checks every known peer's
    /// process now, then answers from what the kernel said, never from a ring header alone.
    /// `None` while `peer` is there, whoever else is gone.
    pub fn departure(&self, peer: u32) -> Option<Departure> {
        self.check_now();
        if self.is_dead(peer) {
            return Some(Departure::Lost { rank: peer });
        }
        if let Some(never) = self.never_joined(peer) {
            return Some(never);
        }
        // Before the ring flags: losing the broker closes the rings to peers that never logged
        // on, which would otherwise read as those peers having left.
        if self.broker_lost() && !self.lock().peers.contains_key(&peer) {
            return Some(Departure::BrokerLost);
        }
        let claim = self.ends_closed_by(peer);
        let world = self.closers.len();
        let left_after = |claimed: Option<u32>| {
            let claimed = claimed?;
            if timed_out_on(claimed).is_some() {
                return timed_out_within(claimed, peer, world).map(LeftAfter::TimedOut);
            }
            (claimed != peer && (claimed as usize) < world && self.is_dead(claimed))
                .then_some(LeftAfter::Died(claimed))
        };
        if self.state.has_left(peer) {
            return Some(Departure::Left {
                rank: peer,
                after: claim.and_then(left_after),
            });
        }
        let claimed = match claim? {
            None => {
                return Some(Departure::Left {
                    rank: peer,
                    after: None,
                });
            }
            Some(claimed) => claimed,
        };
        // It left, saying which of its calls timed out on whom: a hint, taken as said when it
        // names another rank of the world.
        if timed_out_on(claimed).is_some() {
            return Some(Departure::Left {
                rank: peer,
                after: timed_out_within(claimed, peer, world).map(LeftAfter::TimedOut),
            });
        }
        // The ends were closed with a cause: by this worker's own watcher when `peer` died
        // (recorded by now, unless its pidfd is a moment behind) or when the broker went before
        // `peer` logged on; or by `peer` itself, leaving after it saw `claimed` die. A claim
        // about another rank is believed once this worker sees that death too (it may hear of
        // it a moment later): then `peer` left in its wake. Otherwise `peer` is named, as lost
        // once its process has exited, as having left while it is still there.
        if claimed != BROKER_LOST && claimed != peer && self.confirm_exit(claimed) {
            return Some(Departure::Left {
                rank: peer,
                after: Some(LeftAfter::Died(claimed)),
            });
        }
        let give_up = Instant::now() + CLAIM_GRACE;
        loop {
            self.check_now();
            if self.is_dead(peer) {
                return Some(Departure::Lost { rank: peer });
            }
            if claimed == BROKER_LOST && self.broker_lost() {
                return Some(Departure::BrokerLost);
            }
            if Instant::now() >= give_up {
                return Some(if self.has_exited(peer) {
                    Departure::Lost { rank: peer }
                } else {
                    Departure::Left {
                        rank: peer,
                        after: None,
                    }
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Whether `peer` closed the ring ends it owns in this worker's links: `None` if not,
    /// `Some(None)` when it did so without a cause (it dropped its session: it left),
    /// `Some(Some(cause))` when a watcher closed them with one.
    #[allow(clippy::option_option)]
    fn ends_closed_by(&self, peer: u32) -> Option<Option<u32>> {
        let closers = self.closers.read();
        let (to, from) = closers.get(peer as usize)?;
        if !(from.is_closed(Role::Producer) || to.is_closed(Role::Consumer)) {
            return None;
        }
        Some(from.close_cause().or_else(|| to.close_cause()))
    }

    /// Polls every known peer's pidfd without waiting and records the processes that exited.
    pub fn check_now(&self) {
        let exited = self.exited_among(None);
        self.record_exits(&exited);
    }

    /// The known peers (or only `only`) whose processes have exited, polled now, each with the
    /// pidfd that showed it.
    fn exited_among(&self, only: Option<u32>) -> Vec<Exit> {
        let peers: Vec<(u32, Arc<OwnedFd>)> = self
            .lock()
            .peers
            .iter()
            .filter(|(rank, _)| only.is_none_or(|only| only == **rank))
            .map(|(&rank, process)| (rank, Arc::clone(&process.pidfd)))
            .collect();
        let mut fds: Vec<PollFd<'_>> = peers
            .iter()
            .map(|(_, pidfd)| PollFd::new(pidfd.as_fd(), PollFlags::POLLIN))
            .collect();
        if poll(&mut fds, PollTimeout::ZERO).is_err() {
            return Vec::new();
        }
        peers
            .iter()
            .zip(&fds)
            .filter(|(_, fd)| fd.revents().is_some_and(|r| !r.is_empty()))
            .map(|((rank, pidfd), _)| (*rank, Some(Arc::clone(pidfd))))
            .collect()
    }

    /// Records the exits of `ranks`: first those that left their rings untouched (the deaths),
    /// then those that had closed them, so that a peer that gave up and exited in the wake of a
    /// death is never named for it, in whatever order the exits were found.
    pub fn record_exits(&self, exits: &[Exit]) {
        let (untouched, closed): (Vec<&Exit>, Vec<&Exit>) = exits
            .iter()
            .partition(|(rank, _)| self.ends_closed_by(*rank).is_none());
        for (rank, pidfd) in untouched.into_iter().chain(closed) {
            self.exited(*rank, pidfd.as_ref());
        }
    }

    /// `rank`'s process has exited. It left if it had closed its ring ends without a cause
    /// (it dropped its session), or with a cause that holds: it dropped its session after it saw
    /// that rank die (and said so, see [`Connection`]'s drop), or this watcher closed the rings
    /// to it because the broker went before it logged on. Otherwise it died.
    ///
    /// `pidfd` is the pidfd that showed the exit (`None`: the broker's word, about whichever
    /// process holds the rank now). An exit shown by a pidfd the rank no longer has (its process
    /// was replaced meanwhile, see [`Self::adopt`]) is stale and changes nothing.
    fn exited(&self, rank: u32, pidfd: Option<&Arc<OwnedFd>>) {
        if self.recorded(rank) {
            return;
        }
        let left = match self.ends_closed_by(rank) {
            None => false,
            Some(None | Some(BROKER_LOST)) => true,
            // It closed its ends saying a call of its had timed out: it left on purpose.
            Some(Some(cause)) if timed_out_on(cause).is_some() => true,
            Some(Some(cause)) => cause != rank && self.confirm_exit(cause),
        };
        let inbox = self.lock();
        if let Some(pidfd) = pidfd
            && !inbox
                .peers
                .get(&rank)
                .is_some_and(|process| Arc::ptr_eq(&process.pidfd, pidfd))
        {
            return;
        }
        if left {
            self.state.record_left(rank);
        } else {
            self.record_death_locked(rank);
        }
        drop(inbox);
        self.wake_waiters();
    }

    /// Whether `rank`'s exit has been recorded (as a death or a departure).
    fn recorded(&self, rank: u32) -> bool {
        self.state.recorded(rank)
    }

    /// `rank` died: the rings shared with it close (with `rank` as cause), waking whatever waits
    /// on them; then the interrupt fires, ending every interruptible wait on the other rings
    /// (collectives, which cannot finish without `rank`), which stay open for what does not need
    /// it.
    ///
    /// Called with the inbox lock held (see [`Self::exited`]); the caller wakes the waiters
    /// once it lets go.
    fn record_death_locked(&self, rank: u32) {
        let closers = self.closers.read();
        let close = || {
            if let Some((to, from)) = closers.get(rank as usize) {
                to.close(rank);
                from.close(rank);
            }
        };
        self.state
            .record_death(rank, close, closers.iter().map(|(_, from)| from));
    }

    /// Whether a peer's claim that `rank` died holds: its exit is recorded, or its pidfd shows
    /// it within [`CLAIM_GRACE`] (the claimant may have heard first, from the broker, which sees
    /// a socket close before the kernel reports the exit). A confirmed exit of a rank that left
    /// its rings untouched is recorded as the death it is.
    fn confirm_exit(&self, rank: u32) -> bool {
        // A claim about no rank of this world (garbage) must not read another rank's bit.
        if rank as usize >= self.closers.len() {
            return false;
        }
        let give_up = Instant::now() + CLAIM_GRACE;
        loop {
            if self.recorded(rank) {
                return true;
            }
            if let Some((_, pidfd)) = self.exited_among(Some(rank)).pop() {
                if self.ends_closed_by(rank).is_none() {
                    // As `exited` would, for the pidfd that showed it.
                    let inbox = self.lock();
                    let current = inbox.peers.get(&rank).is_some_and(|process| {
                        pidfd
                            .as_ref()
                            .is_some_and(|fd| Arc::ptr_eq(&process.pidfd, fd))
                    });
                    if current && !self.recorded(rank) {
                        self.record_death_locked(rank);
                    }
                    drop(inbox);
                    self.wake_waiters();
                }
                return true;
            }
            if Instant::now() >= give_up {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Whether `rank`'s process is known to have exited (recorded, or its pidfd says so now).
    fn has_exited(&self, rank: u32) -> bool {
        self.recorded(rank) || !self.exited_among(Some(rank)).is_empty()
    }

    /// Wakes every thread in [`Self::wait_for`] after a change made outside the inbox lock:
    /// taking the lock first means a waiter either has not checked yet (and will see the
    /// change) or is already waiting (and gets the notification).
    fn wake_waiters(&self) {
        drop(self.lock());
        self.arrived.notify_all();
    }

    /// The broker's socket closed: nobody can log on any more, so the rings to peers that never
    /// did are closed.
    fn lose_broker(&self) {
        // The rings first, then the flag: whoever sees the broker lost finds them closed too.
        let known: Vec<u32> = self.lock().peers.keys().copied().collect();
        let closers = self.closers.read();
        for peer in 0..self.closers.len() as u32 {
            if let Some((to, from)) = closers.get(peer as usize)
                && !known.contains(&peer)
            {
                to.close(BROKER_LOST);
                from.close(BROKER_LOST);
            }
        }
        drop(closers);
        self.state.record_broker_lost();
        self.wake_waiters();
    }

    /// The broker says `peer` has not logged on and never will (`token`: who wound the job down,
    /// see [`NoticeKind::NeverJoins`]): recorded first, then the rings to it are closed (waking
    /// whatever waits on them), so whoever finds them closed finds the record too.
    fn never_joins(&self, peer: u32, token: u64) {
        self.state.record_never_joins(peer, token);
        if let Some((to, from)) = self.closers.read().get(peer as usize) {
            to.close(NEVER_JOINED);
            from.close(NEVER_JOINED);
        }
        self.wake_waiters();
    }

    /// The broker says `peer` is gone (`said_goodbye`: it left). A replacement of it that has
    /// not been adopted yet is the one gone (the broker's word about the old process came
    /// before the rejoin); a rank whose process this worker never had (a replacement hears of
    /// ranks gone before it came) is closed as it went, with no cause if it left (ends closed
    /// without a cause read as left) and with itself as cause if it died; otherwise it is
    /// weighed like this worker's own pidfd.
    pub fn peer_gone(&self, peer: u32, said_goodbye: bool) {
        let mut inbox = self.lock();
        if let Some(rejoin) = inbox.rejoins.get_mut(&peer)
            && rejoin.complete()
        {
            rejoin.gone = Some(said_goodbye);
            return;
        }
        let known = inbox.peers.contains_key(&peer);
        drop(inbox);
        if !known
            && said_goodbye
            && let Some((to, from)) = self.closers.read().get(peer as usize)
        {
            to.close_end(Role::Consumer);
            from.close_end(Role::Producer);
        }
        self.record_exits(&[(peer, None)]);
    }

    /// Waits until `take` finds what it looks for in the inbox, the deadline passes, the broker
    /// can no longer send it, or `peer` (whose part it is) died.
    pub fn wait_for<T>(
        &self,
        peer: u32,
        deadline: Instant,
        stage: &'static str,
        timeout: Duration,
        mut take: impl FnMut(&mut Inbox) -> Option<T>,
    ) -> Result<T, Error> {
        let mut inbox = self.lock();
        loop {
            if let Some(found) = take(&mut inbox) {
                return Ok(found);
            }
            if let Some(fault) = &inbox.fault {
                return Err(Error::Protocol(fault.clone()));
            }
            if self.is_dead(peer) {
                return Err(Error::PeerLost { rank: peer, stage });
            }
            if let Some(&left) = inbox.gone.get(&peer) {
                return Err(Error::PeerGone {
                    rank: peer,
                    left,
                    stage,
                });
            }
            if let Some(Departure::NeverJoined {
                rank,
                after,
                after_left,
            }) = self.never_joined(peer)
            {
                return Err(Error::PeerNeverJoined {
                    rank,
                    after,
                    after_left,
                    stage,
                });
            }
            if self.broker_lost() {
                return Err(Error::BrokerLost { stage });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout { stage, timeout });
            }
            inbox = self
                .arrived
                .wait_timeout(inbox, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cited_timeout_is_believed_only_for_another_rank_of_the_world() {
        assert_eq!(timed_out_within(TIMED_OUT | 2, 0, 4), Some(2));
        // Forged: outside the world, the closer itself, or no timeout flag at all.
        assert_eq!(timed_out_within(TIMED_OUT | 4, 0, 4), None);
        assert_eq!(timed_out_within(TIMED_OUT | 0x7fff_fff0, 0, 4), None);
        assert_eq!(timed_out_within(TIMED_OUT | 1, 1, 4), None);
        assert_eq!(timed_out_within(2, 0, 4), None);
        // The watcher's own causes are never read as timeouts.
        assert_eq!(timed_out_on(BROKER_LOST), None);
        assert_eq!(timed_out_on(NEVER_JOINED), None);
    }
}
