//! A dead rank's replacement: how a survivor takes it on, and how the replacement itself starts.
//!
//! # The survivor's side
//!
//! When a rank dies while the job goes on, the broker admits a new process with its number that
//! names the job (see the handshake's broker, `logon::rejoin`). A rank that had not logged on
//! yet when the job lost a worker (a slow starter beside an early crash) comes late the same
//! way: the survivors had closed their rings to it, and take it on as they take on a
//! replacement (`PeerRejoined` with `times` 0). It makes fresh rings between the
//! newcomer and every survivor and passes each survivor its two rings, the newcomer's readiness
//! eventfd and pidfd; the survivor's watcher files them (the handshake's `liveness` module). The
//! session takes them on (*adopts* the replacement) at one of these moments, never in the middle
//! of another call:
//!
//! - [`Session::recv_any`] and its kin, once they have reported the dead process's
//!   [`Error::PeerLost`] (after everything it sent), report [`Error::PeerRejoined`] once, having
//!   adopted it. A farm's reader learns of its new worker where it learns of the death;
//! - [`Session::wait_for_rank`] waits for it and adopts it.
//!
//! - [`Session::group`] and [`Session::regroup`] take on every member's replacement that has
//!   rejoined before each attempt (`regroup` also waits for one); an attempt whose members
//!   reach different processes of a rank fails on every member, and the next takes the
//!   replacement on (see `agree`).
//!
//! Adopting forgets everything about the dead process: its rings (and what it sent that nobody
//! took), the point-to-point numbers both ways, its outbox, the blocks it owed. Messages to and
//! from the newcomer then start afresh at full speed, and nothing the dead process sent, or was
//! sent, ever reaches the newcomer or comes back as if from it.
//!
//! # Collectives
//!
//! A collective needs every member in step: the survivors' world (and every group formed before
//! the death) had a number of collectives behind it that the newcomer never saw. So a team
//! whose member was replaced after it was formed is over: its collectives fail at once, before
//! sending anything, with [`Error::PeerLost`] naming that member and saying why. The newcomer's
//! own world is over in the same way (naming its own rank). Every rank, newcomer included, makes
//! a new group of whoever it needs ([`Session::group`] with every rank gives the whole world
//! back), and collectives run on it. Each team records the number of replacements this session
//! had adopted when it was formed (`Team::formed`), and each rank the number at which it was
//! last adopted; a team is over when one of its members was adopted after it was formed.

use super::numbers::PeerNumbers;
use super::state::Deadline;
use super::state::Session;
use super::teams::Team;
use crate::error::Error;
use shmbroker_handshake::Departure;
use std::time::Duration;

impl Session {
    /// Whether this process replaced a rank that died: the broker admitted it into a running
    /// job, with the number of a rank whose process had died (see [`Error::PeerRejoined`] for
    /// the survivors' side). Its world's collectives are over (see [`Session::group`]).
    #[must_use]
    pub fn rejoined(&self) -> bool {
        self.inner.rejoins() > 0
    }

    /// How many processes held this rank before this one in the job: 0 for the job's first.
    #[must_use]
    pub fn rejoins(&self) -> u32 {
        self.inner.rejoins()
    }

    /// Waits until `rank` is there, up to the session's deadline: at once if its process is
    /// alive; if it died, until a replacement rejoins, which this session then takes on (see
    /// the module docs). Point-to-point with it works afterwards; make a new group for
    /// collectives.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] naming `rank` when no replacement came in time (or, for a rank that
    /// had not logged on when the job lost a worker, when it did not come late);
    /// [`Error::PeerLeft`] for a rank that left (nobody replaces it); [`Error::BrokerLost`] when
    /// the broker is gone (nobody can rejoin);
    /// [`Error::RankOutOfRange`]; [`Error::Misuse`] for this session's own rank.
    pub fn wait_for_rank(&mut self, rank: u32) -> Result<(), Error> {
        self.on_peer("wait_for_rank", rank, self.timeout, |session, deadline| {
            session.await_rank(rank, deadline)
        })
    }

    /// [`Self::wait_for_rank`] within `deadline`.
    pub(super) fn await_rank(&mut self, rank: u32, deadline: &Deadline) -> Result<(), Error> {
        loop {
            if self.adopt_rejoin(rank)?.is_some() {
                return Ok(());
            }
            match self.inner.departure(rank) {
                None => return Ok(()),
                // Dead, or never come: either may come (see the module docs).
                Some(
                    shmbroker_handshake::Departure::Lost { .. }
                    | shmbroker_handshake::Departure::NeverJoined { .. },
                ) => {}
                Some(other) => return Err(super::membership::departure_error(other)),
            }
            if self.inner.broker_lost() {
                return Err(Error::BrokerLost);
            }
            self.check_interrupted(deadline)?;
            let left = deadline.left();
            if left.is_zero() {
                // The rank is dead, and no replacement came: that is the timeout.
                return Err(deadline.timed_out(vec![rank]));
            }
            self.inner
                .wait_for_rejoin(rank, left.min(Duration::from_millis(100)));
        }
    }

    /// Takes on `rank`'s replacement if one has rejoined (see the module docs): how many times
    /// `rank` has been replaced, or `None` when none waits.
    pub(super) fn adopt_rejoin(&mut self, rank: u32) -> Result<Option<u32>, Error> {
        if self.inner.rejoins_pending() & 1 << rank == 0 || !self.inner.rejoin_ready(rank) {
            return Ok(None);
        }
        // Registrations on the old ring are taken back while it is still there to count them.
        self.disarm();
        let Some(times) = self.inner.adopt(rank)? else {
            return Ok(None);
        };
        // The watcher's writes to the readiness eventfd for rejoins are owed like any waker's.
        for _ in 0..self.inner.take_rejoin_signals() {
            self.engine.count_signal();
        }
        // The blocks it owed come back; then everything about it starts afresh.
        self.engine.forget_peer(rank);
        self.engine.renew_peer(rank);
        // Its outbox says the same once mapped (see `agree`).
        self.numbers[rank as usize] = PeerNumbers {
            incarnation: Some(times),
            ..PeerNumbers::default()
        };
        self.membership.adopt(rank);
        // The collectives of every team it was in are over (see "Collectives"): what their
        // messages leave in the links, from any peer, is dropped and acknowledged now and as it
        // comes, as after a departure, so that no sender's outbox blocks stay held by them.
        let mut streams = vec![0];
        streams.extend(self.groups.streams_where(|team| team.contains(rank)));
        self.close_streams(&streams);
        Ok(Some(times))
    }

    /// For a receive from any peer: the first replacement waiting whose dead process has been
    /// reported gone, adopted, as the error that reports it. One load while none waits.
    pub(super) fn report_rejoin(&mut self) -> Result<(), Error> {
        let pending = self.inner.rejoins_pending();
        if pending == 0 {
            return Ok(());
        }
        for rank in self.peers() {
            let reported = self
                .engine
                .gone(rank)
                .is_some_and(|gone| gone != Departure::BrokerLost);
            if pending & 1 << rank != 0
                && reported
                && let Some(times) = self.adopt_rejoin(rank)?
            {
                return Err(Error::PeerRejoined { rank, times });
            }
        }
        Ok(())
    }

    /// The first member of `team` replaced after the team was formed, if any (its
    /// collectives are over). One comparison while this session has adopted nobody.
    pub(super) fn team_replaced(&self, team: &Team) -> Option<u32> {
        if self.membership.adoptions() == 0 {
            return None;
        }
        let formed = team.formed();
        (0..team.size())
            .map(|index| team.member(index))
            .find(|&rank| self.membership.adopted_at(rank) > formed)
    }

    /// The error for a collective of a team whose member `rank` was replaced after it formed.
    pub(super) fn replaced_error(&self, rank: u32) -> Error {
        let why = if rank == self.rank() {
            format!(
                "this process replaced rank {rank} after it died (it is replacement {}): the \
                 collectives it was in ended with its death; Session::regroup makes the group \
                 of the ranks needed now",
                self.inner.rejoins()
            )
        } else {
            let times = self.numbers[rank as usize].incarnation.unwrap_or(0);
            let what = if times == 0 {
                "came late".to_string()
            } else {
                format!("was replaced (replacement {times})")
            };
            format!(
                "rank {rank} {what} after this team was formed: its collectives are over; \
                 Session::regroup makes the group of the ranks needed now"
            )
        };
        Error::PeerLost {
            rank,
            diagnosis: vec![why],
        }
    }

    /// What to do about `error` when it reports a death whose replacement has logged on already.
    pub(super) fn with_rejoin_advice(&self, error: &mut Error) {
        if let Error::PeerLost { rank, diagnosis } = error
            && *rank < 64
            && self.inner.rejoins_pending() & 1 << *rank != 0
            && !diagnosis
                .iter()
                .any(|line| line.contains("Session::regroup"))
        {
            diagnosis.push(format!(
                "rank {rank}'s replacement has logged on: Session::regroup (or \
                 Session::wait_for_rank) takes it on"
            ));
        }
    }

    /// Whether `rank` is gone as far as `team` is concerned: dead now, or replaced after the
    /// team was formed.
    pub(super) fn gone_for_team(&self, rank: u32, team: &Team) -> bool {
        self.inner.is_dead(rank) || self.membership.adopted_at(rank) > team.formed()
    }
}
