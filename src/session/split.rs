//! A session split in two halves for two threads: a [`Sender`] and a [`Receiver`].
//!
//! # What runs concurrently, and why the rings stay SPSC
//!
//! Both halves share the session behind one mutex. Every ring end is touched only while that
//! mutex is held, so each ring still has exactly one producer and one consumer at any instant,
//! and the ring protocol (and its loom models) apply unchanged. What makes two threads useful is
//! that **neither half holds the session while it waits**:
//!
//! - a [`Receiver`] waiting for a message sleeps on the readiness eventfd holding nothing (see
//!   the `any` module); once one is there, it takes the session a step at a time, and gives it
//!   up whenever it waits for the next chunk of a large message;
//! - a [`Sender`]'s send, and the root's side of its world broadcast, send what goes at once
//!   and give the session up whenever a peer's ring or this rank's outbox has no room (see the
//!   `stepwise` module, which argues why a message can be left half sent meanwhile). Its calls
//!   run one at a time (a second waits for the first), so nothing else goes on a ring between
//!   the pieces of a message.
//!
//! So **a receive never waits behind a send**: a scheduler's response thread takes a fast
//! worker's reply while its main thread's broadcast waits for a slow worker. The two wait on
//! each other only for the moments each copies bytes. Neither can hold the other up
//! indefinitely either: ranks whose halves each held the session while they waited could wait
//! on each other in a cycle (see the `stepwise` module).
//!
//! Collectives need every ring at once and the whole session: [`Sender::session`] lends it (a
//! receive that waits for a message meanwhile goes on when it is given back; one part way through
//! a message finishes it first, since a collective takes messages out of the inboxes), and
//! [`Sender::rejoin`] gives it back for good. A world broadcast of
//! more than [`FLAT_BROADCAST_MAX`](super::FLAT_BROADCAST_MAX) ranks goes down a tree and holds the session too.
//!
//! # A receive asleep while the session is lent
//!
//! A receive sleeps on the readiness eventfd with every ring armed. A call that waits on a ring
//! itself takes those registrations back first (its futex wait replaces them), so a message that
//! arrives afterwards writes nothing to the eventfd. When the session comes back from such a call
//! ([`SessionGuard`]'s drop: the [`Sender`]'s calls and [`Sender::session`] go through it), it writes the eventfd
//! once, counted as owed like any waker's write, and the sleeping receive looks again.

use super::communicator::Collectives;
use super::demux::Sink;
use super::engine::any::{Access, wait_for_sender};
use super::engine::outgoing::Targets;
use super::engine::stepwise::{PendingSend, Step};
use super::state::Deadline;
use super::state::Session;
use super::tuning;
use crate::error::Error;
use shmbroker_bindings::kind;
use shmbroker_handshake::Interrupter;
use shmbroker_queues::Notifier;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// What the halves share.
#[derive(Debug)]
struct Shared {
    session: Mutex<Session>,
    /// Held by the [`Sender`] for each of its calls, across the pauses in which it gives
    /// `session` up: one send at a time, so that nothing else goes on a ring between the
    /// pieces of a message.
    sending: Mutex<()>,
    /// Held by the [`Receiver`] from when it starts taking a message to when it has it, across
    /// its pauses, and by [`Sender::session`] for a whole call (taken after `sending`, before
    /// `session`): a collective must not take messages out of an inbox while a receive is part
    /// way through one of its messages (the receive knows where its next chunk is queued).
    receiving: Mutex<()>,
    /// The session's readiness eventfd, for waits that hold no lock.
    readiness: Notifier,
    /// The session's interrupter: a receive notes its count before it may wait for the lock.
    interrupter: Interrupter,
    /// The session's rank and world size, read without the lock.
    rank: u32,
    world_size: u32,
    /// [`Session::rejoins`], read without the lock.
    rejoins: u32,
    /// The default deadline, read without the lock: nanoseconds, `u64::MAX` for none
    /// (`Duration::MAX`). A plain value that [`Shared::set_timeout`] replaces whole: no
    /// ordering with anything else rests on it.
    timeout: AtomicU64,
    /// The session's publisher of what it is doing, for waits that hold no lock.
    publisher: Arc<super::publisher::Publisher>,
}

impl Shared {
    /// The session, for the [`Receiver`]'s own calls.
    fn lock(&self) -> MutexGuard<'_, Session> {
        // A thread that panicked mid-call leaves its link out of step, as any interrupted call
        // does (see the `receive` module); the next call reports what it finds.
        self.session.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The deadline of calls given none.
    fn timeout(&self) -> Duration {
        match self.timeout.load(Ordering::Relaxed) {
            u64::MAX => Duration::MAX,
            nanos => Duration::from_nanos(nanos),
        }
    }

    /// Sets the deadline of the calls on either half that start from now on.
    fn set_timeout(&self, timeout: Duration) {
        let nanos = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        self.lend().set_timeout(timeout);
        self.timeout.store(nanos, Ordering::Relaxed);
    }

    /// The session, for the [`Sender`]: a receive may be asleep meanwhile.
    fn lend(&self) -> SessionGuard<'_> {
        let session = self.lock();
        SessionGuard {
            was_armed: session.readiness_armed(),
            session,
            turns: None,
        }
    }

    /// The [`Sender`]'s turn: see [`Self::sending`].
    fn sending(&self) -> MutexGuard<'_, ()> {
        self.sending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The [`Receiver`]'s turn: see [`Self::receiving`].
    fn receiving(&self) -> MutexGuard<'_, ()> {
        self.receiving
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The whole session of a split pair, lent by [`Sender::session`]: every [`Session`] call works
/// on it. Dropping it gives the session back, and wakes a receive asleep meanwhile if the rings
/// it armed were taken back (see the module docs).
#[derive(Debug)]
pub struct SessionGuard<'a> {
    session: MutexGuard<'a, Session>,
    was_armed: bool,
    /// The [`Sender`]'s and the [`Receiver`]'s turns, for a guard lent by [`Sender::session`].
    /// Declared last: dropped after the session is given back.
    turns: Option<(MutexGuard<'a, ()>, MutexGuard<'a, ()>)>,
}

impl Deref for SessionGuard<'_> {
    type Target = Session;

    fn deref(&self) -> &Session {
        &self.session
    }
}

impl DerefMut for SessionGuard<'_> {
    fn deref_mut(&mut self) -> &mut Session {
        &mut self.session
    }
}

impl Drop for SessionGuard<'_> {
    fn drop(&mut self) {
        if self.was_armed && !self.session.readiness_armed() {
            self.session.nudge_readiness();
        }
    }
}

impl Access for &Shared {
    fn with<R>(&mut self, f: impl FnOnce(&mut Session) -> R) -> R {
        f(&mut self.lock())
    }
}

/// The sending half of a split session ([`Session::split`]).
#[derive(Debug)]
pub struct Sender {
    shared: Arc<Shared>,
    /// This handle's own deadline ([`Sender::with_timeout`]), in place of the session's.
    timeout: Option<Duration>,
}

/// The receiving half of a split session ([`Session::split`]).
#[derive(Debug)]
pub struct Receiver {
    shared: Arc<Shared>,
    /// This handle's own deadline ([`Receiver::with_timeout`]), in place of the session's.
    timeout: Option<Duration>,
}

/// A half of a split session whose calls have their own deadline: [`Sender::with_timeout`],
/// [`Receiver::with_timeout`]. Every call of the half works on it; the half itself keeps the
/// session's deadline.
#[derive(Debug)]
pub struct TimedHalf<'a, H> {
    half: H,
    _borrowed: std::marker::PhantomData<&'a H>,
}

impl<H> Deref for TimedHalf<'_, H> {
    type Target = H;

    fn deref(&self) -> &H {
        &self.half
    }
}

impl Session {
    /// Splits the session into a [`Sender`] and a [`Receiver`] that two threads use at once (see
    /// the module docs for what runs concurrently). [`Sender::rejoin`] puts them back together
    /// for collectives.
    #[must_use]
    pub fn split(self) -> (Sender, Receiver) {
        let shared = Arc::new(Shared {
            readiness: self.inner.readiness(),
            interrupter: self.interrupter(),
            rank: self.rank(),
            world_size: self.world_size(),
            rejoins: self.rejoins(),
            timeout: AtomicU64::new(u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX)),
            publisher: Arc::clone(self.engine.publisher()),
            session: Mutex::new(self),
            sending: Mutex::new(()),
            receiving: Mutex::new(()),
        });
        (
            Sender {
                shared: Arc::clone(&shared),
                timeout: None,
            },
            Receiver {
                shared,
                timeout: None,
            },
        )
    }
}

impl Sender {
    /// This worker's rank.
    #[must_use]
    pub fn rank(&self) -> u32 {
        self.shared.rank
    }

    /// [`Session::rejoins`].
    #[must_use]
    pub fn rejoins(&self) -> u32 {
        self.shared.rejoins
    }

    /// Ranks in the world.
    #[must_use]
    pub fn world_size(&self) -> u32 {
        self.shared.world_size
    }

    /// [`Session::send`].
    ///
    /// # Errors
    ///
    /// As for [`Session::send`].
    pub fn send(&self, rank: u32, data: &[u8]) -> Result<(), Error> {
        let timeout = self.timeout();
        let _turn = self.shared.sending();
        let mut session = self.shared.lend();
        session.check_peer(rank)?;
        let tag = session.numbers[rank as usize].send_tag;
        if !session.send_one_slot(rank, tag, data)? {
            let deadline = session.track(Deadline::new("send", timeout));
            session.engine.publisher().peer("send", rank);
            let pending = session.begin_send(kind::SEND, tag, data, Targets::One(rank), &deadline);
            let result;
            (session, result) = self.drive(session, pending, &deadline);
            result?;
        }
        session.numbers[rank as usize].send_tag += 1;
        Ok(())
    }

    /// [`Collectives::broadcast`] from this rank, its root, to the
    /// world. Every other rank calls [`Collectives::broadcast`] (or
    /// its language's broadcast) with this rank as the root.
    ///
    /// While a receiver is slow to make room, this waits without holding the session, as
    /// [`Self::send`] does, in a world of up to [`FLAT_BROADCAST_MAX`](super::FLAT_BROADCAST_MAX) ranks. A larger world's
    /// broadcast goes down a tree, and holds the session for the whole call.
    ///
    /// # Errors
    ///
    /// As for [`Collectives::broadcast`].
    pub fn broadcast(&self, data: &[u8]) -> Result<(), Error> {
        let timeout = self.timeout();
        let root = self.rank();
        let _turn = self.shared.sending();
        let mut session = self.shared.lend();
        if tuning::broadcast(self.world_size()) == tuning::Rooted::Tree {
            return session
                .with_timeout(timeout)
                .broadcast(root, Some(data))
                .map(drop);
        }
        let world = session.groups.world().clone();
        let deadline = session.track(Deadline::collective("broadcast", timeout, &world));
        let pending = session
            .check_root(&world, root, true, "broadcast")
            .and_then(|()| session.next_seq(&world, kind::BROADCAST))
            .and_then(|seq| {
                session.begin_send(kind::BROADCAST, seq, data, Targets::Peers, &deadline)
            });
        let result;
        (session, result) = self.drive(session, pending, &deadline);
        session.settled(&deadline, result)
    }

    /// Drives `pending` (a send [`Session::begin_send`] started) to its end, giving the session
    /// up whenever it has to wait, so that the [`Receiver`] receives meanwhile (see the
    /// `stepwise` module). Returns the session, held again, with the outcome.
    fn drive<'s>(
        &'s self,
        mut session: SessionGuard<'s>,
        pending: Result<Option<PendingSend<'_>>, Error>,
        deadline: &Deadline,
    ) -> (SessionGuard<'s>, Result<(), Error>) {
        let mut pending = match pending {
            Ok(Some(pending)) => pending,
            Ok(None) => return (session, Ok(())),
            Err(error) => return (session, Err(error)),
        };
        loop {
            match session.advance_send(&mut pending, deadline) {
                Ok(Step::Done) => return (session, Ok(())),
                Ok(step) => {
                    drop(session);
                    step.pause();
                    session = self.shared.lend();
                }
                Err(error) => {
                    let result = session.send_failed(pending, error, deadline);
                    return (session, result);
                }
            }
        }
    }

    /// Sets the deadline of every call on either half given none, from the next call on
    /// ([`Session::set_timeout`]; `Duration::MAX`: none). A call already waiting keeps its own.
    pub fn set_timeout(&self, timeout: Duration) {
        self.shared.set_timeout(timeout);
    }

    /// The deadline of its calls: its own ([`Self::with_timeout`]), else the session's.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or_else(|| self.shared.timeout())
    }

    /// This half, with `timeout` as the deadline of every call made through the value returned
    /// (as [`Session::with_timeout`]); other calls on either half keep the session's. The
    /// session that [`Self::session`] lends has its own: `sender.session().with_timeout(d)`.
    #[must_use]
    pub fn with_timeout(&self, timeout: Duration) -> TimedHalf<'_, Sender> {
        TimedHalf {
            half: Sender {
                shared: Arc::clone(&self.shared),
                timeout: Some(timeout),
            },
            _borrowed: std::marker::PhantomData,
        }
    }

    /// [`Session::wait_for_rank`]: waits until `rank` is there, taking on a replacement of it
    /// (the session is held meanwhile, as for [`Self::session`]).
    ///
    /// # Errors
    ///
    /// As for [`Session::wait_for_rank`].
    pub fn wait_for_rank(&self, rank: u32) -> Result<(), Error> {
        let timeout = self.timeout();
        self.session().with_timeout(timeout).wait_for_rank(rank)
    }

    /// The whole session, for a collective (or any [`Session`] call) while the halves are apart:
    /// waits for the [`Receiver`] to finish looking at the rings (never for a receive asleep
    /// waiting for a message), and holds it off until the guard is dropped. Do not call the
    /// [`Receiver`] from the same thread while holding it.
    pub fn session(&self) -> SessionGuard<'_> {
        let sending = self.shared.sending();
        let receiving = self.shared.receiving();
        let mut guard = self.shared.lend();
        guard.turns = Some((sending, receiving));
        guard
    }

    /// Puts the two halves of one session back together.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when `receiver` is a half of another session; both halves are then
    /// dropped, as dropping them would.
    pub fn rejoin(self, receiver: Receiver) -> Result<Session, Error> {
        if !Arc::ptr_eq(&self.shared, &receiver.shared) {
            return Err(Error::Misuse(format!(
                "rank {}'s sender cannot rejoin rank {}'s receiver: they are halves of different \
                 sessions",
                self.shared.rank, receiver.shared.rank
            )));
        }
        drop(receiver);
        let shared = Arc::try_unwrap(self.shared).map_err(|_| {
            Error::Misuse("a half of this session is still in use elsewhere".into())
        })?;
        Ok(shared
            .session
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner))
    }
}

impl Receiver {
    /// This worker's rank.
    #[must_use]
    pub fn rank(&self) -> u32 {
        self.shared.rank
    }

    /// [`Session::rejoins`].
    #[must_use]
    pub fn rejoins(&self) -> u32 {
        self.shared.rejoins
    }

    /// Ranks in the world.
    #[must_use]
    pub fn world_size(&self) -> u32 {
        self.shared.world_size
    }

    /// The deadline of its receives: its own ([`Self::with_timeout`]), else the session's (as
    /// [`Sender::set_timeout`] last set it).
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or_else(|| self.shared.timeout())
    }

    /// This half, with `timeout` as the deadline of every receive made through the value
    /// returned (as [`Session::with_timeout`]); other calls on either half keep the session's.
    #[must_use]
    pub fn with_timeout(&self, timeout: Duration) -> TimedHalf<'_, Receiver> {
        TimedHalf {
            half: Receiver {
                shared: Arc::clone(&self.shared),
                timeout: Some(timeout),
            },
            _borrowed: std::marker::PhantomData,
        }
    }

    /// [`Session::recv`], waiting without holding the session (a [`Sender`] sends meanwhile).
    ///
    /// # Errors
    ///
    /// As for [`Session::recv`].
    pub fn recv(&self, rank: u32) -> Result<Vec<u8>, Error> {
        let timeout = self.timeout();
        let (_, _, sink) = self.receive("recv", Some(rank), Sink::Vec(Vec::new()), timeout)?;
        Ok(sink.into_vec())
    }

    /// Waits without holding the session (up to `timeout`, under the name `op`) until `only`
    /// (or any peer) has a message ready, then receives it into `sink` (see [`Self::take`]).
    /// Returns the sender, the length and the sink.
    fn receive<'a>(
        &self,
        op: &'static str,
        only: Option<u32>,
        sink: Sink<'a>,
        timeout: Duration,
    ) -> Result<(u32, u64, Sink<'a>), Error> {
        let deadline = self.deadline(op, only, timeout)?;
        let peer = wait_for_sender(&mut &*self.shared, self.readiness_fd(), only, &deadline)?;
        let turn = self.shared.receiving();
        self.take(turn, self.shared.lock(), peer, sink, &deadline)
    }

    /// [`Self::receive`] without waiting for a message: `None` when nothing from `only` (or
    /// any peer) has started to arrive. One that has is taken as [`Self::take`] does, within
    /// the session's deadline.
    fn try_receive<'a>(
        &self,
        op: &'static str,
        only: Option<u32>,
        sink: Sink<'a>,
    ) -> Result<Option<(u32, u64, Sink<'a>)>, Error> {
        let turn = self.shared.receiving();
        let mut session = self.shared.lock();
        let peer = match only {
            Some(rank) => {
                session.check_peer(rank)?;
                if !session.sender_ready(rank)? {
                    return Ok(None);
                }
                rank
            }
            None => match session.next_sender()? {
                Some(peer) => peer,
                None => return Ok(None),
            },
        };
        let deadline = Deadline::new(op, self.timeout())
            .noting_interrupts(self.shared.interrupter.count())
            .tracked_by(&self.shared.publisher);
        self.take(turn, session, peer, sink, &deadline).map(Some)
    }

    /// Receives the next message from `peer`, which has started to arrive, into `sink`, a step
    /// at a time, giving the session up whenever it waits for the next piece (see the
    /// `stepwise` module); `turn` is held throughout. Returns the sender, the length and the
    /// sink.
    fn take<'a, 's>(
        &'s self,
        _turn: MutexGuard<'s, ()>,
        mut session: MutexGuard<'s, Session>,
        peer: u32,
        sink: Sink<'a>,
        deadline: &Deadline,
    ) -> Result<(u32, u64, Sink<'a>), Error> {
        let mut pending = session.begin_receive(peer, sink, deadline)?;
        loop {
            match session.advance_receive(&mut pending, deadline) {
                Ok(Step::Done) => {
                    let (len, sink) = session.end_receive(pending, Ok(()), deadline)?;
                    return Ok((peer, len, sink));
                }
                Ok(step) => {
                    drop(session);
                    step.pause();
                    session = self.shared.lock();
                }
                Err(error) => {
                    return session
                        .end_receive(pending, Err(error), deadline)
                        .map(|(len, sink)| (peer, len, sink));
                }
            }
        }
    }

    /// The deadline of a call `op` on this half, published, and `only` checked.
    fn deadline(
        &self,
        op: &'static str,
        only: Option<u32>,
        timeout: Duration,
    ) -> Result<Deadline, Error> {
        let deadline = Deadline::new(op, timeout)
            .noting_interrupts(self.shared.interrupter.count())
            .tracked_by(&self.shared.publisher);
        if let Some(rank) = only {
            self.shared.publisher.peer(op, rank);
            self.shared.lock().check_peer(rank)?;
        }
        Ok(deadline)
    }

    /// Waits without holding the session (up to `timeout`, under the name `op`) until `only`
    /// (or any peer) has a message ready, then runs `take` on the session with that peer and
    /// the time left.
    fn once_ready<T>(
        &self,
        op: &'static str,
        only: Option<u32>,
        timeout: Duration,
        take: impl FnOnce(&mut Session, u32, Duration) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let deadline = self.deadline(op, only, timeout)?;
        let peer = wait_for_sender(&mut &*self.shared, self.readiness_fd(), only, &deadline)?;
        take(&mut self.shared.lock(), peer, deadline.left())
    }

    /// [`Session::recv_any`], waiting without holding the session.
    ///
    /// # Errors
    ///
    /// As for [`Session::recv_any`].
    pub fn recv_any(&self) -> Result<(u32, Vec<u8>), Error> {
        let timeout = self.timeout();
        let (peer, _, sink) = self.receive("recv_any", None, Sink::Vec(Vec::new()), timeout)?;
        Ok((peer, sink.into_vec()))
    }

    /// [`Session::recv_into`], waiting without holding the session.
    ///
    /// # Errors
    ///
    /// As for [`Session::recv_into`]: a message too long for `buffer` is kept.
    pub fn recv_into(&self, rank: u32, buffer: &mut [u8]) -> Result<usize, Error> {
        let timeout = self.timeout();
        let (_, len, _) = self.receive("recv", Some(rank), Sink::Slice(buffer), timeout)?;
        Ok(len as usize)
    }

    /// [`Session::recv_any_into`], waiting without holding the session.
    ///
    /// # Errors
    ///
    /// As for [`Session::recv_any_into`]: a message too long for `buffer` is kept.
    pub fn recv_any_into(&self, buffer: &mut [u8]) -> Result<(u32, usize), Error> {
        let timeout = self.timeout();
        let (peer, len, _) = self.receive("recv_any", None, Sink::Slice(buffer), timeout)?;
        Ok((peer, len as usize))
    }

    /// [`Session::probe`], waiting without holding the session.
    ///
    /// # Errors
    ///
    /// As for [`Session::probe`].
    pub fn probe(&self, rank: u32) -> Result<usize, Error> {
        let timeout = self.timeout();
        self.once_ready("probe", Some(rank), timeout, |session, peer, left| {
            session.with_timeout(left).probe(peer)
        })
    }

    /// [`Session::try_recv`].
    ///
    /// # Errors
    ///
    /// As for [`Session::try_recv`].
    pub fn try_recv(&self, rank: u32) -> Result<Option<Vec<u8>>, Error> {
        let taken = self.try_receive("recv", Some(rank), Sink::Vec(Vec::new()))?;
        Ok(taken.map(|(_, _, sink)| sink.into_vec()))
    }

    /// [`Session::try_recv_any`].
    ///
    /// # Errors
    ///
    /// As for [`Session::try_recv_any`].
    pub fn try_recv_any(&self) -> Result<Option<(u32, Vec<u8>)>, Error> {
        let taken = self.try_receive("recv_any", None, Sink::Vec(Vec::new()))?;
        Ok(taken.map(|(peer, _, sink)| (peer, sink.into_vec())))
    }

    /// [`Session::try_recv_into`].
    ///
    /// # Errors
    ///
    /// As for [`Session::try_recv_into`].
    pub fn try_recv_into(&self, rank: u32, buffer: &mut [u8]) -> Result<Option<usize>, Error> {
        let taken = self.try_receive("recv", Some(rank), Sink::Slice(buffer))?;
        Ok(taken.map(|(_, len, _)| len as usize))
    }

    /// [`Session::try_recv_any_into`].
    ///
    /// # Errors
    ///
    /// As for [`Session::try_recv_any_into`].
    pub fn try_recv_any_into(&self, buffer: &mut [u8]) -> Result<Option<(u32, usize)>, Error> {
        let taken = self.try_receive("recv_any", None, Sink::Slice(buffer))?;
        Ok(taken.map(|(peer, len, _)| (peer, len as usize)))
    }

    /// [`Session::readiness_fd`]: readable when a message is waiting, once
    /// [`Self::try_recv_any`] has returned `None`.
    #[must_use]
    pub fn readiness_fd(&self) -> BorrowedFd<'_> {
        self.shared.readiness.as_fd()
    }
}

// Both halves move to threads of their own, and the whole session does too; the halves are
// also shared by reference between threads (the C ABI's handle does that).
const _: () = {
    const fn is_send<T: Send>() {}
    const fn is_sync<T: Sync>() {}
    is_send::<Session>();
    is_send::<Sender>();
    is_send::<Receiver>();
    is_sync::<Sender>();
    is_sync::<Receiver>();
};
