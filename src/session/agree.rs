//! Making a group is an agreement: every member that finishes a [`Session::group`] call gets
//! the group, or every one gets the same error, whatever dies, rejoins or retries meanwhile.
//!
//! # Attempts
//!
//! A call makes one or more *attempts*. An attempt is named by its *view* and its *ballot*:
//!
//! - the view says, for each member, which process of its rank this member's links lead to
//!   (its *incarnation*: how many processes held the rank before it). Every process writes its
//!   own into its outbox before publishing it (`status_word::INCARNATION`), so a member reads
//!   it for each peer from the outbox its links came with. An entry also says whether that
//!   process has departed, as this member knows ([`DEAD`]); one whose outbox was never read
//!   because it departed first is [`GONE`]. Two entries compare (`order`) by incarnation while
//!   both are alive; two departed ones are the same (an attempt with either fails on the
//!   departure); a departed one is older than a live one of a later incarnation (or of one
//!   not known), and the same as a live one of its own or an earlier incarnation (that member
//!   has not seen the death yet). The comparison uses only the two entries, so both members
//!   of a pair reach the same answer: an attempt in which one member takes the other's message
//!   as its own while the other drops it as stale would leave the first waiting for the
//!   second's decision and the second for the first's next message (`chaos --rejoin` found
//!   that cycle when the dead flag was each member's own knowledge);
//! - the ballot counts this member's attempts on the same ranks, and goes up to any later
//!   ballot a peer is already in (whatever its view): ballots only rise.
//!
//! Every setup message of an attempt carries both, and the ranks. A message from an attempt
//! whose view is older than the receiver's (it reached a process that has since been
//! replaced), or whose ballot is lower, is *stale*: its sender is certain to have left that
//! attempt or to leave it once it reads the receiver's, so it is read and dropped. A message
//! whose view is newer, or whose ballot is higher, is *ahead*: its sender will take no part in
//! the receiver's attempt, and the message is kept for the receiver's next one. So messages
//! of an attempt that failed, or of one a peer never joined, are never taken for another's,
//! and members whose retries ran ahead of each other meet at the highest ballot.
//!
//! # One attempt
//!
//! 1. *Proposals.* Each member sends every other its proposal (the group's stream, as in
//!    `groups`) and reads one current proposal from each (dropping stale ones). Its *estimate*
//!    is [`Outcome::Made`] with the largest stream when every member's proposal came, current;
//!    otherwise why not: a member departed, one is ahead (superseded, or it reaches a newer
//!    process of some rank), one passed other ranks, or one sent what no honest member sends.
//! 2. *Decision.* Then the members agree on one estimate, as `shrink` agrees on who is left:
//!    in round `c` member `c` sends its estimate to the others, which adopt it unless `c`
//!    departed, or is ahead (it left this attempt at its deadline, and sends nothing more for
//!    it). Each member returns the estimate it holds at the end.
//!
//! *Agreement.* Let `c` be the first member that completes its round. Every member still in
//! the attempt adopts `c`'s estimate (per-pair order: what `c` sent before anything later is
//! read first), and from then on every estimate sent is that one. So the members that finish
//! the attempt hold the same outcome.
//!
//! *The group is real.* [`Outcome::Made`] is some member's own estimate, made only when it got
//! every member's current proposal: every member was in this attempt, with the same view (the
//! same processes), and every member goes on to the decision rather than to another attempt.
//!
//! *Termination.* Each read waits for one member, which sends, departs (the watcher reports
//! every departure), or stays alive without taking part: then the call times out naming it.
//! An attempt that ends without a group is followed by another only when a member was ahead or
//! a replacement was taken on, each of which happens finitely often while deaths stop.
//!
//! A liar can waste an attempt (every member then names it), not split the group or exclude a
//! live rank: proposals and decided streams beyond [`MAX_STREAM_JUMP`] of this member's own are
//! refused, naming the sender, and a decision that blames another rank is believed only once
//! this member has seen the same (its own watcher confirms a departure within
//! `CONFIRM_DEPARTURE`); otherwise it names the coordinator that sent it.

use super::demux::Expect;
use super::engine::outgoing::Targets;
use super::setup::{Outcome, Setup, Step};
use super::state::Deadline;
use super::state::Session;
use crate::error::Error;
use shmbroker_bindings::kind;
use std::time::Duration;

/// How long a shrinking rank waits for its own watcher to confirm a departure a coordinator
/// reports.
pub(super) const CONFIRM_DEPARTURE: Duration = Duration::from_secs(1);

/// How far beyond this rank's own proposal a member's proposal (or a decided stream) may lie:
/// a member in this many more groups than this rank is not believed. It bounds how many streams
/// one lie can use up.
pub(super) const MAX_STREAM_JUMP: u32 = 1 << 16;

/// The bit of a view's entry that says its process has departed (see the module docs).
pub(super) const DEAD: u32 = 1 << 31;

/// A view's entry for a member that departed before this rank read its outbox.
pub(super) const GONE: u32 = u32::MAX;

/// How two view entries compare (see the module docs): `theirs` against `ours`.
fn order(theirs: u32, ours: u32) -> std::cmp::Ordering {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let known = |entry: u32| (entry != GONE).then_some(entry & !DEAD);
    match (theirs & DEAD != 0, ours & DEAD != 0) {
        (true, true) => Equal,
        (false, false) => (theirs & !DEAD).cmp(&(ours & !DEAD)),
        (true, false) => match known(theirs) {
            Some(dead) if dead >= ours => Equal,
            _ => Less,
        },
        (false, true) => match known(ours) {
            Some(dead) if dead >= theirs => Equal,
            _ => Greater,
        },
    }
}

/// How a setup message stands to this member's attempt.
#[derive(Debug, PartialEq, Eq)]
enum Fit {
    /// From an attempt its sender has left, or will leave: dropped.
    Stale,
    /// Of this attempt.
    Current,
    /// From an attempt after this one (why this one cannot make the group): kept for the next.
    Ahead(Outcome),
    /// From a call on other ranks.
    Other(Outcome),
}

/// This member's attempt.
#[derive(Debug)]
pub(super) struct Attempt<'a> {
    pub(super) members: &'a [u32],
    /// This member's index among them.
    pub(super) me: usize,
    pub(super) ballot: u64,
    pub(super) view: Vec<u32>,
    /// This member's proposed stream.
    pub(super) proposal: u32,
}

impl Attempt<'_> {
    /// How `message`, from the member at `from`, stands to this attempt; an error for one no
    /// honest member sends.
    fn fit(&self, from: usize, message: &Setup) -> Result<Fit, String> {
        if message.members != self.members {
            return Ok(Fit::Other(Outcome::Mismatch(
                self.members[from],
                message.members.clone(),
            )));
        }
        let (theirs, ours) = (&message.view, &self.view);
        if theirs[from] & DEAD != 0 || (ours[from] != GONE && theirs[from] != ours[from] & !DEAD) {
            return Err(format!(
                "it says it is process {} of its rank; its outbox says {}",
                theirs[from], ours[from]
            ));
        }
        if theirs[self.me] != GONE && theirs[self.me] & !DEAD > ours[self.me] {
            return Err(format!(
                "it reaches process {} of this rank, which is process {}",
                theirs[self.me], ours[self.me]
            ));
        }
        let order = |at: usize| order(theirs[at], ours[at]);
        if let Some(at) = (0..ours.len()).find(|&at| order(at).is_gt()) {
            return Ok(Fit::Ahead(Outcome::Replaced(self.members[at])));
        }
        if (0..ours.len()).any(|at| order(at).is_lt()) {
            return Ok(Fit::Stale);
        }
        Ok(match message.ballot.cmp(&self.ballot) {
            std::cmp::Ordering::Less => Fit::Stale,
            std::cmp::Ordering::Greater => Fit::Ahead(Outcome::Superseded),
            std::cmp::Ordering::Equal => Fit::Current,
        })
    }

    /// Whether a stream a member proposed or decided is one to believe.
    fn believable(&self, stream: u32) -> bool {
        stream <= self.proposal.saturating_add(MAX_STREAM_JUMP)
    }

    /// The ballot of a later attempt on these ranks that `message` is from: what the next
    /// attempt's ballot rises to.
    pub(super) fn joins(members: &[u32], message: &Setup) -> Option<u64> {
        (message.members == members).then_some(message.ballot)
    }
}

/// Where a member stands after the proposals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Standing {
    /// In this attempt.
    In,
    /// Departed, or will send nothing more of this attempt.
    Out,
}

impl Session {
    /// One attempt (see the module docs), on the setup team: what the members agreed it came to.
    pub(super) fn attempt_group(
        &mut self,
        attempt: &Attempt<'_>,
        deadline: &Deadline,
    ) -> Result<Outcome, Error> {
        let members = attempt.members;
        let mut standing = vec![Standing::In; members.len()];
        // Every reason this member saw itself (a decision is checked against them).
        let mut estimate: Vec<Outcome> = Vec::new();
        let note = |estimate: &mut Vec<Outcome>, why: Outcome| estimate.push(why);
        let propose = Setup {
            step: Step::Propose,
            ballot: attempt.ballot,
            members: members.to_vec(),
            view: attempt.view.clone(),
            proposal: attempt.proposal,
            outcome: None,
        }
        .encode();
        let peers: Vec<usize> = (0..members.len()).filter(|&at| at != attempt.me).collect();
        tracing::debug!(
            rank = self.rank(),
            ballot = attempt.ballot,
            view = ?attempt.view,
            "making a group: attempt"
        );
        for &at in &peers {
            let peer = members[at];
            if attempt.view[at] & DEAD != 0 {
                standing[at] = Standing::Out;
                note(&mut estimate, Outcome::Departed(peer));
                continue;
            }
            if !self.send_setup(peer, &propose, deadline)? {
                standing[at] = Standing::Out;
                note(&mut estimate, Outcome::Departed(peer));
            }
        }
        // 1. Proposals.
        let mut stream = attempt.proposal;
        // Members that make a group of other ranks: their ranks and ballot.
        let mut elsewhere: Vec<(u32, Vec<u32>, u64)> = Vec::new();
        for &at in &peers {
            if standing[at] == Standing::Out {
                continue;
            }
            let peer = members[at];
            loop {
                let message = match self.next_setup(peer, deadline)? {
                    Next::Message(message) => message,
                    Next::Departed => {
                        note(&mut estimate, Outcome::Departed(peer));
                        standing[at] = Standing::Out;
                        break;
                    }
                    Next::Forged => {
                        note(&mut estimate, Outcome::Forged(peer));
                        standing[at] = Standing::Out;
                        break;
                    }
                };
                tracing::debug!(
                    rank = self.rank(),
                    peer,
                    step = ?message.step,
                    ballot = message.ballot,
                    view = ?message.view,
                    fit = ?attempt.fit(at, &message),
                    "making a group: proposal read"
                );
                let fit = match attempt.fit(at, &message) {
                    Ok(fit) => fit,
                    Err(detail) => {
                        self.forged_setup(peer, &detail);
                        note(&mut estimate, Outcome::Forged(peer));
                        standing[at] = Standing::Out;
                        break;
                    }
                };
                match fit {
                    Fit::Stale => continue,
                    Fit::Current if message.step == Step::Propose => {
                        if !attempt.believable(message.proposal) {
                            self.forged_setup(
                                peer,
                                &format!(
                                    "it proposed stream {}, more than {MAX_STREAM_JUMP} past this \
                                     rank's {}",
                                    message.proposal, attempt.proposal
                                ),
                            );
                            note(&mut estimate, Outcome::Forged(peer));
                            standing[at] = Standing::Out;
                        } else if let Some(gone) = message.view.iter().position(|&v| v & DEAD != 0)
                        {
                            note(&mut estimate, Outcome::Departed(members[gone]));
                        } else {
                            stream = stream.max(message.proposal);
                        }
                    }
                    Fit::Current => {
                        self.forged_setup(peer, "a decision came before its proposal");
                        note(&mut estimate, Outcome::Forged(peer));
                        standing[at] = Standing::Out;
                    }
                    Fit::Ahead(why) => {
                        self.numbers[peer as usize].setup_stash = Some(Box::new(message));
                        note(&mut estimate, why);
                        standing[at] = Standing::Out;
                    }
                    Fit::Other(why) => {
                        note(&mut estimate, why);
                        standing[at] = Standing::Out;
                        // It makes a group of other ranks, this one among them: its decision
                        // comes here too, and is read once this attempt is over.
                        if message.step == Step::Propose && message.members.contains(&self.rank()) {
                            elsewhere.push((peer, message.members, message.ballot));
                        }
                    }
                }
                break;
            }
        }
        let mut seen = estimate;
        // The weightiest reason, the first seen of equals.
        let mut estimate = seen
            .iter()
            .rev()
            .max_by_key(|why| why.weight())
            .cloned()
            .unwrap_or(Outcome::Made(stream));
        tracing::debug!(
            rank = self.rank(),
            ?estimate,
            ?standing,
            "making a group: estimate"
        );
        // 2. Decision: rotating coordinators, as `shrink`.
        for coordinator in 0..members.len() {
            if coordinator == attempt.me {
                let decide = Setup {
                    step: Step::Decide,
                    ballot: attempt.ballot,
                    members: members.to_vec(),
                    view: attempt.view.clone(),
                    proposal: 0,
                    outcome: Some(estimate.clone()),
                }
                .encode();
                for &at in &peers {
                    if attempt.view[at] & DEAD == 0 && !self.departed_member(members[at]) {
                        self.send_setup(members[at], &decide, deadline)?;
                    }
                }
                continue;
            }
            if standing[coordinator] == Standing::Out {
                continue;
            }
            let peer = members[coordinator];
            while let Next::Message(message) = self.next_setup(peer, deadline)? {
                tracing::debug!(
                    rank = self.rank(),
                    peer,
                    step = ?message.step,
                    ballot = message.ballot,
                    outcome = ?message.outcome,
                    fit = ?attempt.fit(coordinator, &message),
                    "making a group: decision read"
                );
                match attempt.fit(coordinator, &message) {
                    Ok(Fit::Stale) => continue,
                    Ok(Fit::Current) if message.step == Step::Decide => {
                        let decided = message.outcome.unwrap_or(Outcome::Superseded);
                        match decided {
                            Outcome::Made(stream)
                                if stream < attempt.proposal || !attempt.believable(stream) =>
                            {
                                self.forged_setup(
                                    peer,
                                    &format!(
                                        "it decided stream {stream}, which no proposal to this \
                                         rank (of {}) makes",
                                        attempt.proposal
                                    ),
                                );
                                seen.push(Outcome::Forged(peer));
                                estimate = Outcome::Forged(peer);
                            }
                            decided => {
                                estimate = self.believe(peer, decided, &seen, deadline);
                                // A coordinator found lying is a lie this member saw: a later
                                // coordinator that names it is believed.
                                if estimate == Outcome::Forged(peer) {
                                    seen.push(Outcome::Forged(peer));
                                }
                            }
                        }
                    }
                    Ok(Fit::Ahead(_)) => {
                        self.numbers[peer as usize].setup_stash = Some(Box::new(message));
                    }
                    Ok(Fit::Current) => {
                        self.forged_setup(peer, "a second proposal came in one attempt");
                    }
                    Ok(Fit::Other(_)) => {}
                    Err(detail) => self.forged_setup(peer, &detail),
                }
                break;
            }
        }
        tracing::debug!(rank = self.rank(), ?estimate, "making a group: decided");
        // What a member making another group sends this one in that call (its decision) is
        // taken too, so that the next call on these links starts in step (a `shrink` after a
        // mismatch, say); anything else it sent is kept for that call.
        for (peer, theirs, ballot) in elsewhere {
            if let Ok(Next::Message(message)) = self.next_setup(peer, deadline)
                && !(message.step == Step::Decide
                    && message.members == theirs
                    && message.ballot == ballot)
            {
                self.numbers[peer as usize].setup_stash = Some(Box::new(message));
            }
        }
        Ok(estimate)
    }

    /// A coordinator's decision, once this member has confirmed what it says of another rank:
    /// a departure (its own watcher sees it, within `CONFIRM_DEPARTURE`), a replacement, a
    /// mismatch or a forgery (this member saw the same). A decision that cannot be confirmed
    /// names its coordinator instead: a liar cannot make the members blame a live, honest rank.
    fn believe(
        &mut self,
        coordinator: u32,
        decided: Outcome,
        seen: &[Outcome],
        deadline: &Deadline,
    ) -> Outcome {
        let me = self.rank();
        let saw_gone = |rank: u32| {
            seen.iter()
                .any(|why| matches!(why, Outcome::Departed(r) | Outcome::Replaced(r) if *r == rank))
        };
        let saw_lie = |rank: u32| {
            seen.iter().any(
                |why| matches!(why, Outcome::Mismatch(r, _) | Outcome::Forged(r) if *r == rank),
            )
        };
        let doubt = match &decided {
            Outcome::Made(_) | Outcome::Superseded => None,
            Outcome::Departed(rank) | Outcome::Replaced(rank) if *rank == me => Some(format!(
                "it decided that this rank {me}, which is here, departed or was replaced"
            )),
            &Outcome::Departed(rank) | &Outcome::Replaced(rank) => {
                let gone = |session: &Self| {
                    session.departed_member(rank)
                        || session.inner.rejoins_pending() & 1 << rank != 0
                        || session.membership.adopted_at(rank) > 0
                };
                let confirmed = saw_gone(rank) || self.confirm_within(deadline, gone);
                (!confirmed).then(|| {
                    format!(
                        "it decided that rank {rank} departed or was replaced, but rank {rank}'s \
                         process is alive here {} ms later",
                        CONFIRM_DEPARTURE.as_millis()
                    )
                })
            }
            &Outcome::Mismatch(rank, _) | &Outcome::Forged(rank)
                if rank == coordinator || saw_lie(rank) =>
            {
                None
            }
            Outcome::Mismatch(rank, _) | Outcome::Forged(rank) => Some(format!(
                "it says rank {rank} passed other ranks or sent what no honest member sends, \
                 which this rank did not see: one of the two lies"
            )),
        };
        match doubt {
            None => decided,
            Some(detail) => {
                self.forged_setup(coordinator, &detail);
                Outcome::Forged(coordinator)
            }
        }
    }

    /// Whether `holds` comes true within `CONFIRM_DEPARTURE` (and the deadline).
    fn confirm_within(&self, deadline: &Deadline, holds: impl Fn(&Self) -> bool) -> bool {
        let until = std::time::Instant::now() + CONFIRM_DEPARTURE.min(deadline.left());
        loop {
            if holds(self) {
                return true;
            }
            if std::time::Instant::now() >= until {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Sends a setup message to `peer`: `false` when it departed instead.
    fn send_setup(&mut self, peer: u32, bytes: &[u8], deadline: &Deadline) -> Result<bool, Error> {
        let tag = self.setup_tag_to(peer);
        match self.send_to(kind::GROUP, tag, bytes, Targets::One(peer), deadline) {
            Ok(()) => Ok(true),
            Err(_) if self.departed_member(peer) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// The next setup message from `peer`: one kept from an earlier attempt, or the next in its
    /// link.
    fn next_setup(&mut self, peer: u32, deadline: &Deadline) -> Result<Next, Error> {
        if let Some(kept) = self.numbers[peer as usize].setup_stash.take() {
            return Ok(Next::Message(*kept));
        }
        let expect = Expect::Collective {
            op: kind::GROUP,
            seq: self.setup_tag_from(peer),
        };
        let bytes = match self.receive_vec(peer, expect, deadline) {
            Ok(bytes) => bytes,
            Err(_) if self.departed_member(peer) => return Ok(Next::Departed),
            Err(Error::Protocol { detail, .. }) => {
                self.forged_setup(peer, &detail);
                return Ok(Next::Forged);
            }
            Err(error) => return Err(error),
        };
        self.numbers[peer as usize].setup_received += 1;
        match Setup::decode(peer, &bytes, self.world_size()) {
            Ok(message) => Ok(Next::Message(message)),
            Err(error) => {
                self.forged_setup(peer, &error.to_string());
                Ok(Next::Forged)
            }
        }
    }

    /// Whether member `rank` departed (its process as this rank reaches it).
    pub(super) fn departed_member(&self, rank: u32) -> bool {
        self.inner.departure(rank).is_some()
    }

    /// Keeps what `peer` sent that no honest member sends, for the error that names it.
    fn forged_setup(&mut self, peer: u32, detail: &str) {
        tracing::warn!(
            rank = self.rank(),
            "making a group, rank {peer} sent what no honest member sends: {detail}"
        );
        self.groups.forged.get_or_insert((peer, detail.to_string()));
    }
}

/// What reading a member's next setup message came to.
enum Next {
    Message(Setup),
    /// It departed, and nothing more of it is queued.
    Departed,
    /// It sent what no honest member sends (kept by `forged_setup`).
    Forged,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::setup::HEAD;
    use crate::tag::SETUP_STREAM;

    fn propose(ballot: u64, members: &[u32], view: &[u32]) -> Setup {
        Setup {
            step: Step::Propose,
            ballot,
            members: members.to_vec(),
            view: view.to_vec(),
            proposal: 3,
            outcome: None,
        }
    }

    #[test]
    fn every_setup_message_survives_its_bytes() {
        let mut decide = propose(9, &[2, 0, 1], &[0, 4, GONE]);
        decide.step = Step::Decide;
        decide.proposal = 0;
        for outcome in [
            Outcome::Made(7),
            Outcome::Superseded,
            Outcome::Replaced(1),
            Outcome::Departed(2),
            Outcome::Mismatch(0, vec![0, 1]),
            Outcome::Forged(2),
        ] {
            decide.outcome = Some(outcome);
            assert_eq!(Setup::decode(1, &decide.encode(), 3).unwrap(), decide);
        }
        let message = propose(1, &[0, 1], &[0, 0]);
        assert_eq!(Setup::decode(1, &message.encode(), 2).unwrap(), message);
    }

    #[test]
    fn forged_setup_messages_are_refused_naming_their_sender() {
        let good = propose(1, &[0, 1], &[0, 0]).encode();
        let mut cases: Vec<Vec<u8>> = vec![
            Vec::new(),
            good[..HEAD].to_vec(),
            good[..good.len() - 1].to_vec(),
        ];
        let mut with = |at: usize, value: u32| {
            let mut bytes = good.clone();
            bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
            cases.push(bytes);
        };
        with(0, 7); // step
        with(4, 0); // no members
        with(4, 3); // more members than words
        with(16, 0); // stream 0
        with(16, SETUP_STREAM); // the setup stream
        with(HEAD, 5); // a rank outside the world
        let mut decide = propose(1, &[0, 1], &[0, 0]);
        decide.step = Step::Decide;
        decide.outcome = Some(Outcome::Departed(1));
        let mut bad_decision = decide.encode();
        bad_decision[16..20].copy_from_slice(&9u32.to_le_bytes());
        cases.push(bad_decision);
        for bytes in cases {
            match Setup::decode(1, &bytes, 2) {
                Err(Error::Protocol { peer: 1, detail }) => assert!(detail.contains("group")),
                other => panic!("{bytes:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn attempts_tell_stale_current_and_later_messages_apart() {
        let members = [0, 1, 2];
        let attempt = Attempt {
            members: &members,
            me: 0,
            ballot: 4,
            view: vec![0, 1, 0],
            proposal: 5,
        };
        let fit = |message: &Setup| attempt.fit(2, message);
        assert_eq!(fit(&propose(4, &members, &[0, 1, 0])), Ok(Fit::Current));
        // It reached the dead process of rank 1: from an attempt it has left.
        assert_eq!(fit(&propose(4, &members, &[0, 0, 0])), Ok(Fit::Stale));
        assert_eq!(fit(&propose(3, &members, &[0, 1, 0])), Ok(Fit::Stale));
        assert_eq!(
            fit(&propose(5, &members, &[0, 1, 0])),
            Ok(Fit::Ahead(Outcome::Superseded))
        );
        // It reaches rank 1's next process, which this rank has not taken on.
        assert_eq!(
            fit(&propose(1, &members, &[0, 2, 0])),
            Ok(Fit::Ahead(Outcome::Replaced(1)))
        );
        // It reaches no process of rank 1, which this rank reaches alive: it is behind.
        assert_eq!(fit(&propose(4, &members, &[0, GONE, 0])), Ok(Fit::Stale));
        assert!(matches!(
            fit(&propose(4, &[0, 2], &[0, 0])),
            Ok(Fit::Other(Outcome::Mismatch(2, _)))
        ));
        // Lies about itself, or about a later process of this rank.
        assert!(fit(&propose(4, &members, &[0, 1, 3])).is_err());
        assert!(fit(&propose(4, &members, &[1, 1, 0])).is_err());
        assert!(
            attempt.believable(5 + MAX_STREAM_JUMP) && !attempt.believable(6 + MAX_STREAM_JUMP)
        );
        assert_eq!(
            Attempt::joins(&members, &propose(7, &members, &[0, 1, GONE])),
            Some(7)
        );
        assert_eq!(
            Attempt::joins(&members, &propose(7, &[0, 1], &[0, 1])),
            None
        );
        // A member that saw rank 1's process depart, against one that has not yet, or one
        // that reaches its replacement; and both ways round, the same answer.
        assert_eq!(
            fit(&propose(4, &members, &[0, 1 | DEAD, 0])),
            Ok(Fit::Current)
        );
        assert_eq!(fit(&propose(4, &members, &[0, DEAD, 0])), Ok(Fit::Stale));
        let dead = Attempt {
            view: vec![0, GONE, 0],
            ..attempt
        };
        assert_eq!(
            dead.fit(2, &propose(4, &members, &[0, 1, 0])),
            Ok(Fit::Ahead(Outcome::Replaced(1)))
        );
        assert_eq!(
            dead.fit(2, &propose(4, &members, &[0, 1 | DEAD, 0])),
            Ok(Fit::Current)
        );
        for (a, b) in [
            (1, GONE),
            (1 | DEAD, 2),
            (3, 3 | DEAD),
            (GONE, GONE),
            (0, 2),
        ] {
            assert_eq!(order(a, b), order(b, a).reverse(), "{a:#x} {b:#x}");
        }
    }
}
