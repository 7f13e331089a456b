//! Receiving from whichever peer is ready: `recv_any`, `try_recv`, `try_recv_any` and the
//! readiness fd an event loop waits on.
//!
//! # Which peer is served
//!
//! A call looks at the peers in turn, starting after the one it served last (round-robin), and
//! takes the first point-to-point message it finds. A peer that keeps sending is served once per
//! turn like every other, so it cannot starve them. Looking at a peer costs atomic loads on its
//! ring (and a look at what is already queued from it): no system call, no clock.
//!
//! # Sleeping on one fd for every peer
//!
//! When nothing is waiting, a blocking call *arms* the ring from every peer (see the queues
//! crate's `readiness` module: the consumer's wait word says "asleep on the eventfd"), checks
//! every ring once more, and sleeps in `poll` on this rank's readiness eventfd, which the broker
//! gave every peer. A peer that publishes into an armed ring signals it; one that finds nothing
//! armed makes no system call. An event loop does the same with [`Session::readiness_fd`]:
//! `try_recv_any` returning `None` leaves every ring armed, so the fd becomes readable as soon as
//! a message is there.
//!
//! # Keeping the eventfd's count honest
//!
//! Every registration a waker takes is followed by exactly one write to the eventfd, but that
//! write may land after this rank has looked. So the session counts the writes it is owed (one per
//! registration it finds taken when it disarms or re-arms a ring) and subtracts what each `read`
//! returns. While writes are owed, a call that finds nothing reads the eventfd (a system call, only
//! after a wake-up was set in motion); once none are, the fd stays quiet and a call that finds
//! nothing makes no system call at all. So a late write can cause one spurious wake-up of an
//! event loop, never a busy loop. A peer that writes the eventfd on its own (it holds a copy) can
//! only cause wake-ups that find nothing. That state and the order of arming, looking and
//! resetting are the queues crate's [`ReadySet`], which the loom models drive; this module gives
//! it the rings from the peers ([`PeerRings`]).
//!
//! # Departed peers
//!
//! Everything a peer sent before it died is delivered first; the next call that comes to it then
//! fails with [`Error::PeerLost`] naming it, once. From then on it is skipped like a peer that
//! left, and the calls go on with the others (a death closes only the rings shared with the dead
//! rank, see the handshake's `liveness` module): a reader can keep farming tasks to the workers
//! still there. A peer that left, or that never logged on and no longer can, is skipped without an
//! error. Once every peer is gone, a call fails instead of waiting for nobody: [`Error::PeerLost`]
//! naming a rank that died if one did, otherwise [`Error::PeerLeft`] (or
//! [`Error::PeerNeverJoined`] if no peer ever came).

use crate::error::Error;
use crate::session::demux::Expect;
use crate::session::membership::departure_error;
use crate::session::state::Deadline;
use crate::session::state::Session;
use shmbroker_bindings::Message;
use shmbroker_handshake::Departure;
use shmbroker_queues::{CROWDED_SPIN_MAX, Consumer, ReadyRings, ReadySet, SPIN_MAX, Waiting};
use shmbroker_sys::eventfd;
use std::os::fd::{AsFd, BorrowedFd};

impl Session {
    /// [`wait_for_sender`] for any peer, on this session's own eventfd.
    pub(in crate::session) fn wait_any(&mut self, deadline: &Deadline) -> Result<u32, Error> {
        let fd = self.inner.readiness();
        wait_for_sender(self, fd.as_fd(), None, deadline)
    }

    /// Whether a point-to-point message from `peer` is queued or has started in its ring: takes
    /// in what the ring holds (without waiting) until one is, or the ring is empty.
    ///
    /// # Errors
    ///
    /// [`Error::PeerLeft`] or [`Error::PeerLost`] once `peer` has left or died and everything
    /// it sent is taken, [`Error::BrokerLost`] if it never logged on and cannot any more (it is
    /// then marked, so that [`Self::scan`] skips it); as for [`Self::recv`] otherwise.
    pub(in crate::session) fn sender_ready(&mut self, peer: u32) -> Result<bool, Error> {
        // As every call that waits does as it begins (see `Session::track`): no receive is under
        // way here.
        self.catch_up_on_departures();
        if let Some(gone) = self.engine.any.gone[peer as usize] {
            return Err(departure_error(gone));
        }
        let expect = Expect::Send {
            tag: self.numbers[peer as usize].recv_tag,
        };
        loop {
            if self.find_send(peer, expect)?.is_some() {
                return Ok(true);
            }
            match self.pull(peer, None) {
                Ok(true) => {}
                Ok(false) => return Ok(false),
                Err(error) => {
                    let gone = match error {
                        Error::PeerLeft { rank, after, .. } if rank == peer => {
                            Some(Departure::Left { rank, after })
                        }
                        Error::PeerLost { rank, .. } if rank == peer => {
                            Some(Departure::Lost { rank })
                        }
                        Error::BrokerLost => Some(Departure::BrokerLost),
                        Error::PeerNeverJoined {
                            rank,
                            after,
                            after_left,
                        } if rank == peer => Some(Departure::NeverJoined {
                            rank,
                            after,
                            after_left,
                        }),
                        _ => None,
                    };
                    if gone.is_some() {
                        self.engine.any.gone[peer as usize] = gone;
                    }
                    return Err(error);
                }
            }
        }
    }

    /// The first peer, round-robin from where the last look stopped, with a message ready; `None`
    /// (every live ring armed) when there is none.
    ///
    /// A look that finds nothing resets the eventfd's count when wakers owe it writes, so that an
    /// event loop does not wake again for signals already accounted for; and then it arms and
    /// looks once more, with no second reset. The reset may read back the write of a waker that
    /// took an arming of this very look, and that waker's ring is left with no registration: its
    /// message, or the next one its producer sends with no write, would then wake nobody. The
    /// second arming registers such a ring again; a message published before it is seen, one
    /// published after it writes the eventfd anew. (The `loom_readiness_look_then_wait_never_
    /// misses_a_message` model checks this order; without either step after the reset it finds
    /// the lost wake-up, which `examples/tokio_server` hit about one run in five.)
    pub(in crate::session) fn next_sender(&mut self) -> Result<Option<u32>, Error> {
        // Before the shortcut of a quiet set (every live ring armed and empty), which would
        // never look: a replacement that rejoined is reported (see `rejoin`).
        self.report_rejoin()?;
        ReadySet::try_next(&mut self.rings(None))
    }

    /// The rings from this session's peers, for its [`ReadySet`]; a look looks at `only`, or
    /// at every live peer.
    fn rings(&mut self, only: Option<u32>) -> PeerRings<'_> {
        PeerRings {
            session: self,
            only,
        }
    }

    /// Looks at every live peer once, round-robin; the first with a message ready.
    pub(super) fn scan(&mut self) -> Result<Option<u32>, Error> {
        let world = self.world_size();
        if world < 2 {
            return Err(Error::Misuse(
                "a world of one rank has nobody to receive from".into(),
            ));
        }
        // A dead peer's replacement, once the death was reported (see `rejoin`).
        self.report_rejoin()?;
        let start = self.engine.any.next % world;
        for step in 0..world {
            let peer = (start + step) % world;
            if peer == self.rank() || self.engine.any.gone[peer as usize].is_some() {
                continue;
            }
            match self.sender_ready(peer) {
                Ok(true) => {
                    self.engine.any.next = peer + 1;
                    return Ok(Some(peer));
                }
                Ok(false) => {}
                // Skipped without an error: nothing was lost by them.
                Err(Error::PeerLeft { rank, .. } | Error::PeerNeverJoined { rank, .. })
                    if rank == peer => {}
                // Reported once (the peer is marked gone now), the next look starting after it.
                Err(error) => {
                    self.engine.any.next = peer + 1;
                    return Err(error);
                }
            }
        }
        if let Some(error) = self.every_peer_gone() {
            return Err(error);
        }
        Ok(None)
    }

    /// When every peer is gone: a death if there was one, else the broker's loss, else the last
    /// peer's departure, else the last rank that never came.
    fn every_peer_gone(&self) -> Option<Error> {
        let precedence = |departure: &Departure| match departure {
            Departure::Lost { .. } => 0,
            Departure::BrokerLost => 1,
            Departure::Left { .. } => 2,
            Departure::NeverJoined { .. } => 3,
        };
        let gone: Vec<Departure> = self
            .peers()
            .map(|peer| self.engine.any.gone[peer as usize])
            .collect::<Option<_>>()?;
        gone.into_iter()
            .rev()
            .min_by_key(precedence)
            .map(departure_error)
    }

    /// Takes the registration back from every ring, counting those wakers took. Called before
    /// anything else waits on one of these rings (its futex wait would replace the registration).
    pub(in crate::session) fn disarm(&mut self) {
        ReadySet::disarm(&mut self.rings(None));
    }

    /// Whether the rings are armed for a wait on the readiness eventfd.
    pub(in crate::session) fn readiness_armed(&self) -> bool {
        self.engine.any.rings.is_armed()
    }

    /// Writes the readiness eventfd once, and counts the write as owed (so the count stays
    /// honest, see the module docs): a thread asleep on the fd wakes and looks again. For a call
    /// that took the rings' registrations back (its own ring wait replaced them) while the other
    /// half of a split session slept on the fd: a message that arrived meanwhile signalled
    /// nobody.
    pub(in crate::session) fn nudge_readiness(&mut self) {
        eventfd::signal(self.inner.readiness_fd());
        self.engine.any.rings.count_signal();
    }
}

/// The rings from a session's peers, as its [`ReadySet`] sees them: those from live peers are
/// waited for, every peer's may hold a registration, and a look is [`Session::scan`] (or
/// [`Session::sender_ready`] for `only`).
struct PeerRings<'a> {
    session: &'a mut Session,
    only: Option<u32>,
}

impl ReadyRings for PeerRings<'_> {
    type Message = Message;
    type Found = u32;
    type Error = Error;

    fn ready_set(&mut self) -> &mut ReadySet {
        &mut self.session.engine.any.rings
    }

    fn each_ring(&mut self, mut f: impl FnMut(&Consumer<Message>)) -> Result<(), Error> {
        for peer in self.session.peers() {
            if self.session.engine.any.gone[peer as usize].is_none() {
                f(&self.session.link(peer)?.from);
            }
        }
        Ok(())
    }

    fn each_registered(&mut self, mut f: impl FnMut(&Consumer<Message>)) {
        for peer in self.session.peers() {
            if let Some(link) = self.session.inner.link(peer) {
                f(&link.from);
            }
        }
    }

    fn has_buffered(&mut self) -> bool {
        let session = &*self.session;
        session.peers().any(|peer| {
            let p = peer as usize;
            session.engine.any.gone[p].is_none() && !session.engine.peers[p].inbox.is_empty()
        })
    }

    fn look(&mut self) -> Result<Option<u32>, Error> {
        match self.only {
            None => self.session.scan(),
            Some(peer) => Ok(self.session.sender_ready(peer)?.then_some(peer)),
        }
    }

    fn drain(&mut self) -> u64 {
        eventfd::drain(self.session.inner.readiness_fd())
    }
}

/// A session reached directly, or through the lock the halves of a split session share: the
/// waits below hold it only while they look at rings, never while they sleep.
pub(in crate::session) trait Access {
    /// Runs `f` on the session.
    fn with<R>(&mut self, f: impl FnOnce(&mut Session) -> R) -> R;
}

impl Access for Session {
    fn with<R>(&mut self, f: impl FnOnce(&mut Session) -> R) -> R {
        f(self)
    }
}

/// Waits up to `deadline` for a peer with a message ready (any peer, or `only` that one): spins
/// on the rings for a while, then sleeps on the readiness eventfd `fd` with no access held.
pub(in crate::session) fn wait_for_sender(
    access: &mut impl Access,
    fd: BorrowedFd<'_>,
    only: Option<u32>,
    deadline: &Deadline,
) -> Result<u32, Error> {
    let spins = access.with(|session| {
        session.flush_view_acks()?;
        // A send set aside by an interrupt goes first: its receiver may be a sender awaited here.
        session.finish_set_aside(deadline)?;
        Ok::<_, Error>(match session.engine.waiting {
            Waiting::Spin(spins) => spins,
            Waiting::Adaptive { crowded: true } => CROWDED_SPIN_MAX,
            Waiting::Adaptive { crowded: false } => SPIN_MAX,
        })
    })?;
    let look = |session: &mut Session| session.rings(only).look();
    for turn in 0..spins / 16 {
        if let Some(peer) = access.with(look)? {
            return Ok(peer);
        }
        // Under `Waiting::Spin(u32::MAX)` this phase is long: it must not outlast the deadline.
        if turn % 256 == 255 && deadline.left().is_zero() {
            break;
        }
        std::hint::spin_loop();
    }
    loop {
        let slice = access.with(|session| {
            if let Some(peer) = ReadySet::find_or_arm(&mut session.rings(only))? {
                return Ok(Err(peer));
            }
            // After arming: an `Interrupter` that asks later writes the eventfd (it wakes every
            // armed ring's consumer), one that asked sooner is seen here.
            if let Err(error) = session.check_interrupted(deadline) {
                session.disarm();
                return Err(error);
            }
            // Peers may be waiting for acknowledgements before they can send more.
            session.flush_all_acks()?;
            let left = deadline.left();
            let waited = deadline.watchdog_due();
            if left.is_zero() || waited.is_some() {
                let waiting_for: Vec<u32> = match only {
                    Some(peer) => vec![peer],
                    None => session
                        .peers()
                        .filter(|&peer| session.engine.any.gone[peer as usize].is_none())
                        .collect(),
                };
                if let Some(waited) = waited {
                    session.warn_waiting(deadline, waited, &waiting_for);
                } else {
                    session.disarm();
                    return Err(session.timed_out_waiting(deadline, waiting_for));
                }
            }
            Ok(Ok(deadline.watched(if session.owes_acks() {
                left.min(super::receive::SEND_SLICE)
            } else {
                left
            })))
        })?;
        let slice = match slice {
            Err(peer) => return Ok(peer),
            Ok(slice) => slice,
        };
        let readable = eventfd::wait_readable(fd, Some(slice)).map_err(|source| Error::Io {
            what: "waiting on the readiness eventfd",
            source,
        })?;
        if readable {
            // Counts the registrations taken before reading what their wakers wrote.
            access.with(|session| ReadySet::woke(&mut session.rings(only)))?;
        }
    }
}
