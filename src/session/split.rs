//! A session split in two halves for two threads: a [`Sender`] and a [`Receiver`].
//!
//! # What runs concurrently, and why the rings stay SPSC
//!
//! Both halves share the session behind one mutex. Every ring end is touched only while that
//! mutex is held, so each ring still has exactly one producer and one consumer at any instant,
//! and the ring protocol (and its loom models) apply unchanged. What makes two threads useful is
//! where the halves *wait*: a [`Receiver`] waiting for a message holds nothing while it sleeps
//! (on the readiness eventfd, see the `any` module), so a [`Sender`] sends meanwhile; it takes
//! the lock only to look at the rings and to copy a message out. A send holds the lock while it
//! copies its message in; when a ring is full it keeps it while it waits for room (taking in what
//! that peer sent meanwhile, as every send does), so a receive waits for that send.
//!
//! So: a send and a receive run concurrently except for the moments each touches the rings. A
//! large pipelined message holds the lock for its whole transfer, in either direction.
//! Collectives need every ring at once and the whole session: [`Sender::session`] lends it (a
//! receive that waits meanwhile goes on when it is given back), and [`Sender::rejoin`] gives it
//! back for good.
//!
//! # A receive asleep while the session is lent
//!
//! A receive sleeps on the readiness eventfd with every ring armed. A call that waits on a ring
//! itself takes those registrations back first (its futex wait replaces them), so a message that
//! arrives afterwards writes nothing to the eventfd. When the session comes back from such a call
//! ([`SessionGuard`]'s drop: the [`Sender`]'s calls and [`Sender::session`] go through it), it writes the eventfd
//! once, counted as owed like any waker's write, and the sleeping receive looks again.

use super::any::{Access, wait_for_sender};
use super::{Deadline, Error, Interrupter, Session};
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
    publisher: Arc<super::status::Publisher>,
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
        }
    }
}

/// The whole session of a split pair, lent by [`Sender::session`]: every [`Session`] call works
/// on it. Dropping it gives the session back, and wakes a receive asleep meanwhile if the rings
/// it armed were taken back (see the module docs).
#[derive(Debug)]
pub struct SessionGuard<'a> {
    session: MutexGuard<'a, Session>,
    was_armed: bool,
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
}

/// The receiving half of a split session ([`Session::split`]).
#[derive(Debug)]
pub struct Receiver {
    shared: Arc<Shared>,
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
            publisher: Arc::clone(&self.publisher),
            session: Mutex::new(self),
        });
        (
            Sender {
                shared: Arc::clone(&shared),
            },
            Receiver { shared },
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
        self.send_timeout(rank, data, self.shared.timeout())
    }

    /// [`Session::send_timeout`].
    ///
    /// # Errors
    ///
    /// As for [`Session::send`].
    pub fn send_timeout(&self, rank: u32, data: &[u8], timeout: Duration) -> Result<(), Error> {
        self.shared.lend().send_timeout(rank, data, timeout)
    }

    /// Sets the deadline of every call on either half given none, from the next call on
    /// ([`Session::set_timeout`]; `Duration::MAX`: none). A call already waiting keeps its own.
    pub fn set_timeout(&self, timeout: Duration) {
        self.shared.set_timeout(timeout);
    }

    /// [`Session::wait_for_rank`], with the session's deadline.
    ///
    /// # Errors
    ///
    /// As for [`Session::wait_for_rank`].
    pub fn wait_for_rank(&self, rank: u32) -> Result<(), Error> {
        self.wait_for_rank_timeout(rank, self.shared.timeout())
    }

    /// [`Session::wait_for_rank_timeout`]: waits until `rank` is there, taking on a
    /// replacement of it (the session is held meanwhile, as for [`Self::session`]).
    ///
    /// # Errors
    ///
    /// As for [`Session::wait_for_rank`].
    pub fn wait_for_rank_timeout(&self, rank: u32, timeout: Duration) -> Result<(), Error> {
        self.session().wait_for_rank_timeout(rank, timeout)
    }

    /// The whole session, for a collective (or any [`Session`] call) while the halves are apart:
    /// waits for the [`Receiver`] to finish looking at the rings (never for a receive asleep
    /// waiting for a message), and holds it off until the guard is dropped. Do not call the
    /// [`Receiver`] from the same thread while holding it.
    pub fn session(&self) -> SessionGuard<'_> {
        self.shared.lend()
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

    /// The deadline its receives use when given none: the session's timeout (as
    /// [`Sender::set_timeout`] last set it).
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.shared.timeout()
    }

    /// [`Session::recv`], waiting without holding the session (a [`Sender`] sends meanwhile).
    ///
    /// # Errors
    ///
    /// As for [`Session::recv`].
    pub fn recv(&self, rank: u32) -> Result<Vec<u8>, Error> {
        self.recv_timeout(rank, self.shared.timeout())
    }

    /// [`Self::recv`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Session::recv`].
    pub fn recv_timeout(&self, rank: u32, timeout: Duration) -> Result<Vec<u8>, Error> {
        self.once_ready("recv", Some(rank), timeout, |session, peer, left| {
            session.recv_timeout(peer, left)
        })
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
        let deadline = Deadline::new(op, timeout)
            .noting_interrupts(self.shared.interrupter.count())
            .tracked_by(&self.shared.publisher);
        if let Some(rank) = only {
            self.shared.publisher.peer(op, rank);
        }
        if let Some(rank) = only {
            self.shared.lock().check_peer(rank)?;
        }
        let peer = wait_for_sender(&mut &*self.shared, self.readiness_fd(), only, &deadline)?;
        take(&mut self.shared.lock(), peer, deadline.left())
    }

    /// [`Session::recv_any`], waiting without holding the session.
    ///
    /// # Errors
    ///
    /// As for [`Session::recv_any`].
    pub fn recv_any(&self) -> Result<(u32, Vec<u8>), Error> {
        self.recv_any_timeout(self.shared.timeout())
    }

    /// [`Self::recv_any`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Session::recv_any`].
    pub fn recv_any_timeout(&self, timeout: Duration) -> Result<(u32, Vec<u8>), Error> {
        self.once_ready("recv_any", None, timeout, |session, peer, left| {
            Ok((peer, session.recv_timeout(peer, left)?))
        })
    }

    /// [`Session::recv_into`], waiting without holding the session.
    ///
    /// # Errors
    ///
    /// As for [`Session::recv_into`]: a message too long for `buffer` is kept.
    pub fn recv_into(&self, rank: u32, buffer: &mut [u8]) -> Result<usize, Error> {
        self.recv_into_timeout(rank, buffer, self.shared.timeout())
    }

    /// [`Self::recv_into`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Session::recv_into`].
    pub fn recv_into_timeout(
        &self,
        rank: u32,
        buffer: &mut [u8],
        timeout: Duration,
    ) -> Result<usize, Error> {
        self.once_ready("recv", Some(rank), timeout, |session, peer, left| {
            session.recv_into_timeout(peer, buffer, left)
        })
    }

    /// [`Session::recv_any_into`], waiting without holding the session.
    ///
    /// # Errors
    ///
    /// As for [`Session::recv_any_into`]: a message too long for `buffer` is kept.
    pub fn recv_any_into(&self, buffer: &mut [u8]) -> Result<(u32, usize), Error> {
        self.recv_any_into_timeout(buffer, self.shared.timeout())
    }

    /// [`Self::recv_any_into`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Session::recv_any_into`].
    pub fn recv_any_into_timeout(
        &self,
        buffer: &mut [u8],
        timeout: Duration,
    ) -> Result<(u32, usize), Error> {
        self.once_ready("recv_any", None, timeout, |session, peer, left| {
            Ok((peer, session.recv_into_timeout(peer, buffer, left)?))
        })
    }

    /// [`Session::probe`], waiting without holding the session.
    ///
    /// # Errors
    ///
    /// As for [`Session::probe`].
    pub fn probe(&self, rank: u32) -> Result<usize, Error> {
        self.probe_timeout(rank, self.shared.timeout())
    }

    /// [`Self::probe`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Session::probe`].
    pub fn probe_timeout(&self, rank: u32, timeout: Duration) -> Result<usize, Error> {
        self.once_ready("probe", Some(rank), timeout, |session, peer, left| {
            session.probe_timeout(peer, left)
        })
    }

    /// [`Session::try_recv`].
    ///
    /// # Errors
    ///
    /// As for [`Session::try_recv`].
    pub fn try_recv(&self, rank: u32) -> Result<Option<Vec<u8>>, Error> {
        self.shared.lock().try_recv(rank)
    }

    /// [`Session::try_recv_any`].
    ///
    /// # Errors
    ///
    /// As for [`Session::try_recv_any`].
    pub fn try_recv_any(&self) -> Result<Option<(u32, Vec<u8>)>, Error> {
        self.shared.lock().try_recv_any()
    }

    /// [`Session::try_recv_into`].
    ///
    /// # Errors
    ///
    /// As for [`Session::try_recv_into`].
    pub fn try_recv_into(&self, rank: u32, buffer: &mut [u8]) -> Result<Option<usize>, Error> {
        self.shared.lock().try_recv_into(rank, buffer)
    }

    /// [`Session::try_recv_any_into`].
    ///
    /// # Errors
    ///
    /// As for [`Session::try_recv_any_into`].
    pub fn try_recv_any_into(&self, buffer: &mut [u8]) -> Result<Option<(u32, usize)>, Error> {
        self.shared.lock().try_recv_any_into(buffer)
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
