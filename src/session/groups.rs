//! Groups of ranks: collectives among some of the world's ranks, numbered among themselves, that
//! never mix with the world's collectives or another group's (as `MPI_Comm_create_group`,
//! `ncclCommSplit` and torch's `new_group`); and [`Session::shrink`], the group of every rank
//! still there after a death (as ULFM's `MPI_Comm_shrink`).
//!
//! # Streams
//!
//! A collective message's tag is its *stream* (the bits above [`SEQ_BITS`]) and the stream's
//! sequence number (low [`SEQ_BITS`]); see [`crate::tag`]. The world's collectives are stream 0; each group has its own; making
//! groups and shrinking use [`SETUP_STREAM`]. A collective's receive takes from a peer's queue
//! only messages of its own stream (`Expect::selects`), and checks operation and sequence number
//! as before, so a collective on one group never takes another's messages, even when the
//! groups' collectives interleave.
//!
//! **Why no two groups that share a rank share a stream.** Every rank keeps the highest stream
//! it has been in (`Groups::highest`). Making a group, every member proposes one more than its
//! own, and the group takes the largest proposal; every member then records it as its highest.
//! So the streams of the groups one rank is in strictly increase in the order it made them, and
//! two groups with a common rank differ in stream. Nothing needs the whole world, and no rank
//! outside a group hears of it.
//!
//! **Making a group** is an agreement among its members on [`SETUP_STREAM`] (see `agree`): each
//! sends every other its proposal, the ranks it passed and which process of each member's rank
//! it reaches, and then the members agree on one outcome, so that every member gets the group
//! or every member gets the same error ([`Error::GroupMismatch`] naming a member that passed
//! other ranks; a departure naming a member that died). Setup messages between two ranks are
//! numbered per pair and direction (`PeerNumbers::setup_sent`, `setup_received`), like
//! point-to-point messages: two ranks that make groups together must make them in the same order
//! (MPI asks the same of communicators).
//!
//! # Deaths
//!
//! A collective on a group fails when a *member* has died, naming it (`team_lost_rank`); deaths
//! elsewhere do not disturb it (the watcher's interrupt wakes its waits, which look, find no
//! dead member, and wait on).
//!
//! # Shrinking: agreeing on who is left
//!
//! [`Session::shrink`] is consensus with a perfect failure detector: a rank is known to have
//! departed only once it has (its process exited or it dropped its session, as the kernel and
//! the broker tell this worker's watcher), never on suspicion. Each survivor starts from its own
//! estimate (the ranks it knows departed) and goes through rounds `c = 0 .. world`: in round `c`,
//! rank `c` sends its current estimate to every rank it does not know departed, and every other
//! rank waits for that estimate and adopts it, unless it learns that `c` departed (then `c`'s
//! round is skipped; what `c` sent before it died is still taken, as every message is). Estimates
//! are replaced, never merged.
//!
//! *Agreement.* Let `c` be the first coordinator that completes its round. Every rank still in
//! the call adopted `c`'s estimate (a rank skips a round only for a coordinator that departed).
//! From then on every estimate is the same, so every later coordinator sends that same value,
//! even one that dies halfway through its sends: every survivor ends with `c`'s estimate. Some
//! survivor completes its round (a survivor is a rank that does not depart), so `c` exists.
//!
//! *Termination.* A round waits for one rank, which either sends or departs (and the watcher
//! reports every departure), or stays alive without calling `shrink`: then the call times out
//! naming it. So it never hangs.
//!
//! *Validity.* The estimate holds only ranks that did depart. One that departed after `c`'s
//! estimate was taken is still among the ranks agreed on. Making their group then fails,
//! naming it, on the survivors that needed its message and had not got it, and succeeds on the
//! others, whose group's first collective fails naming it: either way every survivor learns of
//! it and calls `shrink` again, and the setup messages of the pairs still there stay in step
//! for that call (making a group takes every message still coming before it fails).
//!
//! The agreed ranks then make a group as any group is made (which also checks, once more, that
//! they agree).
//!
//! # What a death leaves in the links
//!
//! A collective cut short by a death can leave messages of its stream in the survivors' links,
//! down to a message cut off between its chunks (its sender gave up on it) or half taken (its
//! receiver did). Once a rank has died, every stream it was in is *closed* in every inbox
//! (`Session::close_departed_streams`, run when a collective fails on the death, when a call
//! begins after it, and before making a group or shrinking; a member that left closes only the
//! stream of the collective that failed on it, and the setup stream is never closed): what is
//! queued of those streams goes, and pipelined and lent messages of theirs that come later are
//! dropped as they come, chunks and all (see `demux::Inbox::close_stream`); the blocks they
//! referred to are acknowledged, so their senders free them. A collective of a closed stream
//! fails at once, naming the departure. A receive between chunks that meets another message
//! where its next chunk belongs then looks for a death before it calls the message malformed:
//! its sender saw the death first. So collectives after [`Session::shrink`] work whatever was
//! cut short, and so do point-to-point messages.

use super::agree;
use super::agree::CONFIRM_DEPARTURE;
use super::demux::Expect;
use super::engine::outgoing::Targets;
use super::setup::Outcome;
use super::state::{Deadline, Session};
use super::teams::Team;
use crate::error::Error;
use crate::tag::SEQ_BITS;
use shmbroker_bindings::kind;
use std::sync::Arc;
use std::time::Duration;

use crate::tag::SEQ_MASK;
pub(super) use crate::tag::SETUP_STREAM;

/// A group of ranks, made by [`Session::group`] or [`Session::shrink`]: a small handle that does
/// not borrow the session, so that a program holds as many as it likes (a tensor-parallel and a
/// pipeline-parallel group that overlap, say). Its collectives run on [`Session::on`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    stream: u32,
    ranks: Arc<[u32]>,
    rank: u32,
}

impl Group {
    /// This rank's rank in the group: its position in the ranks given to [`Session::group`].
    #[must_use]
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks in the group.
    #[must_use]
    pub fn size(&self) -> u32 {
        self.ranks.len() as u32
    }

    /// The members' world ranks, by group rank.
    #[must_use]
    pub fn ranks(&self) -> &[u32] {
        &self.ranks
    }

    /// The world rank of group rank `rank`, if there is one.
    #[must_use]
    pub fn world_rank(&self, rank: u32) -> Option<u32> {
        self.ranks.get(rank as usize).copied()
    }

    /// The group rank of world rank `rank`, if it is a member.
    #[must_use]
    pub fn group_rank(&self, rank: u32) -> Option<u32> {
        self.ranks
            .iter()
            .position(|&member| member == rank)
            .map(|at| at as u32)
    }
}

/// The session seen through a group ([`Session::on`]): every collective of
/// [`Collectives`](crate::Collectives), under the same name and with the same arguments as on
/// the session, among the group's members only. Ranks, roots, blocks and counts are group
/// ranks; errors name world ranks.
#[derive(Debug)]
pub struct GroupView<'s> {
    session: &'s mut Session,
    group: &'s Group,
    /// The deadline of its calls, when [`Self::with_timeout`] gave it one.
    timeout: Option<Duration>,
}

impl GroupView<'_> {
    /// This rank's rank in the group.
    #[must_use]
    pub fn rank(&self) -> u32 {
        self.group.rank()
    }

    /// The number of ranks in the group.
    #[must_use]
    pub fn size(&self) -> u32 {
        self.group.size()
    }

    /// The group.
    #[must_use]
    pub fn group(&self) -> &Group {
        self.group
    }

    /// The view with its own deadline for every call made through it, in place of the
    /// session's ([`Session::set_timeout`]), as [`Session::with_timeout`] gives one to the
    /// session's calls.
    #[must_use]
    pub fn with_timeout(self, timeout: Duration) -> Self {
        Self {
            timeout: Some(timeout),
            ..self
        }
    }

    /// Runs `call` among the group's team (and with the view's deadline, if it has one).
    pub(super) fn run<R>(
        &mut self,
        call: impl FnOnce(&mut Session, &Team) -> Result<R, Error>,
    ) -> Result<R, Error> {
        if let Some(timeout) = self.timeout {
            let mut timed = self.session.with_timeout(timeout);
            return GroupView {
                session: &mut timed,
                group: self.group,
                timeout: None,
            }
            .run(call);
        }
        let Some(team) = self
            .session
            .groups
            .group(self.group.stream, &self.group.ranks)
            .cloned()
        else {
            return Err(Error::Misuse(format!(
                "ranks {:?} are not a group of this session (was it made on another one?)",
                self.group.ranks
            )));
        };
        call(self.session, &team)
    }
}

impl Session {
    /// Makes a group of `ranks` (world ranks, in the order that numbers them in the group).
    /// Every member calls it with the same ranks; others do not call it. Groups sharing two
    /// ranks must be made in the same order by both.
    ///
    /// Making a group is an agreement: every member gets the group, or every member gets the
    /// same error, whatever dies or rejoins meanwhile. A member's replacement that has already
    /// rejoined is taken on first (as [`Self::wait_for_rank`] would), so calling `group` again
    /// after an error converges once the replacements are in; [`Self::regroup`] does that loop.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] for an empty list, a repeated rank or one that leaves out this rank;
    /// [`Error::RankOutOfRange`]; [`Error::GroupMismatch`] naming a member that passed other
    /// ranks; [`Error::Timeout`] naming members that did not call it in time; [`Error::PeerLost`]
    /// and the other departures naming a member that departed (on every member alike);
    /// [`Error::Protocol`] naming a member that sent what no honest member sends.
    pub fn group(&mut self, ranks: &[u32]) -> Result<Group, Error> {
        self.call(Deadline::new("group", self.timeout), |session, deadline| {
            session.group_tracked(ranks, deadline)
        })
    }

    /// Recovers the group of `ranks` after deaths: waits until every member is alive (a dead
    /// one replaced: [`Self::wait_for_rank`]), makes their group by agreement, and returns it,
    /// trying again through deaths and rejoins that happen meanwhile, until `timeout`. Every
    /// member calls it, newcomers included. It replaces the loop a survivor would write:
    ///
    /// ```text
    /// loop {
    ///     for rank in ranks { session.wait_for_rank(rank)? }   // every member there
    ///     match session.group(ranks) {                         // made by agreement
    ///         Ok(group) => break group,
    ///         Err(Error::PeerLost { .. }) => continue,         // a member died meanwhile
    ///         Err(error) => return Err(error),
    ///     }
    /// }
    /// ```
    ///
    /// A program that does not wait for replacements calls [`Self::shrink`] instead.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] naming the members still dead, or not calling it, at the deadline;
    /// [`Error::PeerLeft`] for a member that left (nobody replaces it);
    /// [`Error::BrokerLost`] when the broker is gone; and, as for [`Self::group`], misuse,
    /// mismatches and forgeries.
    pub fn regroup(&mut self, ranks: &[u32], timeout: Duration) -> Result<Group, Error> {
        self.call(Deadline::new("regroup", timeout), |session, deadline| {
            session.make_group(ranks, true, deadline)
        })
    }

    /// [`Self::group`] within its tracked deadline (which [`Deadline::settle`] then
    /// notes the outcome of).
    fn group_tracked(&mut self, ranks: &[u32], deadline: &Deadline) -> Result<Group, Error> {
        self.make_group(ranks, false, deadline)
    }

    /// Makes the group of `ranks` by agreement (see `agree`), taking on every member's
    /// replacement that has rejoined first; `wait`ing for each dead member's replacement too
    /// ([`Self::regroup`]), or failing on every member when one departed ([`Self::group`]).
    fn make_group(
        &mut self,
        ranks: &[u32],
        wait: bool,
        deadline: &Deadline,
    ) -> Result<Group, Error> {
        let me = self.check_group(ranks)?;
        let members: Arc<[u32]> = ranks.into();
        self.groups.forged = None;
        loop {
            let mine = self.rank();
            for &rank in ranks.iter().filter(|&&rank| rank != mine) {
                if wait {
                    self.await_rank(rank, deadline)?;
                } else {
                    self.adopt_rejoin(rank)?;
                }
            }
            // What collectives cut short by a departure left in the links goes first.
            self.close_departed_streams();
            let proposal = self.groups.highest + 1;
            if proposal >= SETUP_STREAM {
                return Err(Error::Misuse(format!(
                    "this rank has been in {} groups, as many as there are streams",
                    self.groups.highest
                )));
            }
            let view = self.member_view(&members, deadline)?;
            let ballot = self.next_ballot(&members);
            let attempt = agree::Attempt {
                members: &members,
                me: me as usize,
                ballot,
                view,
                proposal,
            };
            // Among the members only: a death elsewhere is none of this call's business.
            let setup =
                Team::of(SETUP_STREAM, members.clone(), me).formed_at(self.membership.adoptions());
            let outcome = {
                self.groups.making = Some(setup);
                let outer = deadline.among(SETUP_STREAM);
                let outcome = self.attempt_group(&attempt, deadline);
                deadline.among(outer);
                self.groups.making = None;
                if let Err(error) = &outcome {
                    tracing::debug!(rank = self.rank(), %error, "making a group: attempt failed");
                }
                outcome?
            };
            match outcome {
                Outcome::Made(stream) => {
                    self.groups.highest = stream;
                    self.groups.teams.insert(
                        stream,
                        Team::of(stream, members.clone(), me)
                            .formed_at(self.membership.adoptions()),
                    );
                    return Ok(Group {
                        stream,
                        ranks: members,
                        rank: me,
                    });
                }
                Outcome::Superseded => {}
                // A member reaches a newer process of `rank`: taken on here if it has rejoined here
                // too (a rejoin is noted only once complete, so there is nothing to wait for);
                // otherwise the member may only have seen the death first, and the next attempt
                // says.
                Outcome::Replaced(rank) => {
                    self.adopt_rejoin(rank)?;
                }
                Outcome::Departed(_) if wait => {}
                Outcome::Departed(rank) => return Err(self.departed_from_group(rank)),
                Outcome::Mismatch(peer, found) => {
                    return Err(Error::GroupMismatch {
                        peer,
                        expected: ranks.to_vec(),
                        found,
                    });
                }
                Outcome::Forged(peer) => {
                    let detail = match self.groups.forged.take() {
                        Some((liar, detail)) if liar == peer => detail,
                        Some((liar, detail)) => format!(
                            "another member saw what no honest member sends (this rank saw \
                             rank {liar}: {detail})"
                        ),
                        None => "another member saw what no honest member sends".to_string(),
                    };
                    return Err(Error::Protocol {
                        peer,
                        detail: format!("making a group: {detail}"),
                    });
                }
            }
            if deadline.left().is_zero() {
                return Err(deadline.timed_out(Vec::new()));
            }
        }
    }

    /// Which process of each member's rank this rank reaches (see `agree`): read from each
    /// peer's outbox (once per process), [`agree::GONE`] for one that departed before it came.
    fn member_view(&mut self, members: &[u32], deadline: &Deadline) -> Result<Vec<u32>, Error> {
        use shmbroker_bindings::status_word::{ALIVE_SLOT, INCARNATION};
        let mut view = Vec::with_capacity(members.len());
        for &rank in members {
            if rank == self.rank() {
                view.push(self.inner.rejoins());
                continue;
            }
            // A process this rank knows departed says so (see `agree`).
            let dead = if self.departed_member(rank) {
                agree::DEAD
            } else {
                0
            };
            if let Some(known) = self.numbers[rank as usize].incarnation {
                view.push(known | dead);
                continue;
            }
            let word = match self
                .peer_outbox(rank, deadline)
                .map(|outbox| outbox.status()[ALIVE_SLOT][INCARNATION])
            {
                Ok(word) => word,
                Err(_) if self.departed_member(rank) => {
                    view.push(agree::GONE);
                    continue;
                }
                Err(error) => return Err(error),
            };
            let incarnation = word
                .checked_sub(1)
                .and_then(|value| u32::try_from(value).ok())
                .filter(|&value| value & agree::DEAD == 0)
                .ok_or_else(|| Error::Protocol {
                    peer: rank,
                    detail: format!(
                        "its outbox says it is process {word} of its rank (1-based); a process \
                         writes a number from 1 before it publishes its outbox"
                    ),
                })?;
            self.numbers[rank as usize].incarnation = Some(incarnation);
            view.push(incarnation | dead);
        }
        Ok(view)
    }

    /// The ballot of this rank's next attempt on `members`: one more than its last on them, or
    /// the highest a member is already in, whatever its view (see `agree`): ballots only rise,
    /// so every member reaches the highest one in use, and no two attempts of one member share
    /// one.
    fn next_ballot(&mut self, members: &[u32]) -> u64 {
        let last = self.groups.ballots.get(members).copied().unwrap_or(0);
        let joined = members
            .iter()
            .filter_map(|&rank| self.numbers.get(rank as usize))
            .filter_map(|numbers| numbers.setup_stash.as_deref())
            .filter_map(|kept| agree::Attempt::joins(members, kept))
            .max()
            .unwrap_or(0);
        let ballot = (last + 1).max(joined);
        self.groups.ballots.insert(members.to_vec(), ballot);
        ballot
    }

    /// The error every member of a group returns when member `rank` departed while it was
    /// made.
    fn departed_from_group(&self, rank: u32) -> Error {
        let advice = format!(
            "rank {rank} departed while the group was being made, and no member made it; \
             Session::regroup waits for its replacement, Session::shrink goes on without it"
        );
        match self.inner.departure(rank) {
            Some(departure) => {
                let mut error = super::membership::departure_error(departure);
                if let Error::PeerLost { diagnosis, .. } | Error::PeerLeft { diagnosis, .. } =
                    &mut error
                {
                    diagnosis.push(advice);
                }
                error
            }
            None => Error::PeerLost {
                rank,
                diagnosis: vec![advice],
            },
        }
    }

    /// Checks the ranks of a group this rank makes: its rank among them.
    fn check_group(&self, ranks: &[u32]) -> Result<u32, Error> {
        for &rank in ranks {
            self.check_rank(rank)?;
        }
        let mut sorted = ranks.to_vec();
        sorted.sort_unstable();
        if let Some(twice) = sorted.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(Error::Misuse(format!(
                "rank {} appears twice in the group {ranks:?}",
                twice[0]
            )));
        }
        ranks
            .iter()
            .position(|&rank| rank == self.rank())
            .map(|at| at as u32)
            .ok_or_else(|| {
                Error::Misuse(format!(
                    "rank {} makes a group of ranks {ranks:?} that leaves it out; only members \
                     make a group",
                    self.rank()
                ))
            })
    }

    /// The view of this session through `group`, whose collectives run among its members only:
    /// `session.on(&tp).all_reduce(&mut activations, ReduceOp::Sum)`.
    #[must_use]
    pub fn on<'s>(&'s mut self, group: &'s Group) -> GroupView<'s> {
        GroupView {
            session: self,
            group,
            timeout: None,
        }
    }

    /// The group of every rank still there, in rank order, once the survivors agree on it (see
    /// the module docs): after a death, the survivors call it and carry on with collectives on
    /// the group. Every survivor that calls it gets the same group, and no call hangs: a rank
    /// that stays alive without calling it is named by a timeout.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] naming a live rank that did not call it; [`Error::PeerLost`] naming a
    /// rank that died after the survivors agreed (call it again); [`Error::Protocol`] for an
    /// estimate no honest rank sends.
    pub fn shrink(&mut self) -> Result<Group, Error> {
        self.call(Deadline::new("shrink", self.timeout), Self::shrink_tracked)
    }

    /// [`Self::shrink`] within its tracked deadline (which [`Deadline::settle`] then
    /// notes the outcome of).
    fn shrink_tracked(&mut self, deadline: &Deadline) -> Result<Group, Error> {
        let (me, world) = (self.rank(), self.world_size());
        self.close_departed_streams();
        let departed = |session: &Self, rank: u32| session.inner.departure(rank).is_some();
        let mut estimate = self
            .peers()
            .filter(|&rank| departed(self, rank))
            .fold(0u64, |set, rank| set | 1 << rank);
        for coordinator in 0..world {
            if coordinator == me {
                for peer in self.peers() {
                    if departed(self, peer) {
                        continue;
                    }
                    let tag = self.setup_tag_to(peer);
                    let bytes = estimate.to_le_bytes();
                    match self.send_to(kind::SHRINK, tag, &bytes, Targets::One(peer), deadline) {
                        Err(_) if departed(self, peer) => {}
                        sent => sent?,
                    }
                }
            } else if !departed(self, coordinator) {
                let tag = self.setup_tag_from(coordinator);
                let expect = Expect::Collective {
                    op: kind::SHRINK,
                    seq: tag,
                };
                match self.receive_vec(coordinator, expect, deadline) {
                    Ok(bytes) => {
                        self.numbers[coordinator as usize].setup_received += 1;
                        let theirs = read_estimate(coordinator, &bytes, me, world)?;
                        self.confirm_departures(coordinator, theirs, deadline)?;
                        estimate = theirs;
                    }
                    Err(_) if departed(self, coordinator) => {}
                    Err(error) => return Err(error),
                }
            }
        }
        let ranks: Vec<u32> = (0..world)
            .filter(|&rank| estimate & 1 << rank == 0)
            .collect();
        self.make_group(&ranks, false, deadline)
    }

    /// Checks a shrink coordinator's estimate against what this rank's own watcher says: each
    /// rank it calls departed must have departed (or been replaced) here too, within
    /// [`CONFIRM_DEPARTURE`] (the watchers of two ranks learn of a death a moment apart). A
    /// coordinator that calls a live rank departed is named.
    fn confirm_departures(
        &mut self,
        coordinator: u32,
        estimate: u64,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let until = std::time::Instant::now() + CONFIRM_DEPARTURE.min(deadline.left());
        for rank in self.peers().filter(|&rank| estimate & 1 << rank != 0) {
            while self.inner.departure(rank).is_none() && self.membership.adopted_at(rank) == 0 {
                if std::time::Instant::now() >= until {
                    return Err(Error::Protocol {
                        peer: coordinator,
                        detail: format!(
                            "shrinking: it says rank {rank} departed, but rank {rank} is alive \
                             here {} ms later",
                            CONFIRM_DEPARTURE.as_millis()
                        ),
                    });
                }
                self.check_interrupted(deadline)?;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(())
    }

    /// The tag of the next setup message to `peer`.
    pub(super) fn setup_tag_to(&mut self, peer: u32) -> u64 {
        let sent = &mut self.numbers[peer as usize].setup_sent;
        *sent += 1;
        (u64::from(SETUP_STREAM) << SEQ_BITS) | ((*sent - 1) & SEQ_MASK)
    }

    /// The tag of the next setup message due from `peer` (counted once it is taken).
    pub(super) fn setup_tag_from(&self, peer: u32) -> u64 {
        let received = self.numbers[peer as usize].setup_received;
        (u64::from(SETUP_STREAM) << SEQ_BITS) | (received & SEQ_MASK)
    }
}

/// A coordinator's estimate of the departed ranks, checked: ranks of the world, and not this
/// one (which is here to read it).
fn read_estimate(peer: u32, bytes: &[u8], me: u32, world: u32) -> Result<u64, Error> {
    let forged = |detail: String| Error::Protocol {
        peer,
        detail: format!("shrinking: {detail}"),
    };
    let estimate = u64::from_le_bytes(
        bytes
            .try_into()
            .map_err(|_| forged(format!("{} bytes where an 8-byte set was due", bytes.len())))?,
    );
    let outside = if world >= 64 { 0 } else { !0u64 << world };
    if estimate & outside != 0 || estimate & 1 << me != 0 {
        return Err(forged(format!(
            "departed ranks {estimate:#x} name a rank outside the world of {world} or this \
             rank {me}, which is here"
        )));
    }
    Ok(estimate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forged_estimate_is_refused_naming_its_sender() {
        assert_eq!(
            read_estimate(1, &0b100u64.to_le_bytes(), 0, 4).unwrap(),
            0b100
        );
        for (bad, me, world) in [(1u64 << 4, 0, 4), (1, 0, 4), (0, 0, 4)] {
            let bytes = if bad == 0 {
                vec![0; 7]
            } else {
                bad.to_le_bytes().to_vec()
            };
            match read_estimate(1, &bytes, me, world) {
                Err(Error::Protocol { peer: 1, .. }) => {}
                other => panic!("{bad:#x}: {other:?}"),
            }
        }
        assert_eq!(
            read_estimate(1, &(1u64 << 63).to_le_bytes(), 0, 64).unwrap(),
            1 << 63
        );
    }
}
