//! The ranks a collective runs among (a [`Team`]: the world's, or a group's) and every group
//! this rank is in ([`Groups`]). State only: making groups is `groups`'s, and agreeing on them
//! `agree`'s.

use crate::error::Error;
use crate::tag::{SEQ_BITS, SEQ_MASK};
use std::collections::HashMap;
use std::sync::Arc;

/// The ranks a collective runs among, with the next sequence number of their stream.
///
/// A collective is handed its team (a copy: the world's has no members list to share, a group's
/// shares its list) and runs among it; only [`Groups::next_tag`] advances a stored team's
/// number, so a copy's `seq` is the number its stream had when the call began.
///
/// `pub` in a private module, so that the sealed `Communicator` trait can name it: nothing
/// outside this crate can.
#[derive(Clone, Debug)]
pub struct Team {
    pub(super) stream: u32,
    /// World ranks by team rank; `None` for the world (team rank r is world rank r).
    pub(super) members: Option<Arc<[u32]>>,
    me: u32,
    size: u32,
    seq: u64,
    /// How many replacements the session had taken on when the team was formed (see `rejoin`).
    formed: u64,
}

impl Team {
    /// The whole world, on stream 0.
    pub(super) fn world(rank: u32, size: u32) -> Self {
        Self {
            stream: 0,
            members: None,
            me: rank,
            size,
            seq: 0,
            formed: 0,
        }
    }

    /// `members` (world ranks, by team rank) on `stream`, as this rank (`me` among them) sees
    /// them.
    pub(super) fn of(stream: u32, members: Arc<[u32]>, me: u32) -> Self {
        Self {
            stream,
            size: members.len() as u32,
            members: Some(members),
            me,
            seq: 0,
            formed: 0,
        }
    }

    /// This team, formed when the session had taken on `adoptions` replacements.
    pub(super) fn formed_at(mut self, adoptions: u64) -> Self {
        self.formed = adoptions;
        self
    }

    /// How many replacements the session had taken on when the team was formed.
    pub(super) fn formed(&self) -> u64 {
        self.formed
    }

    pub(super) fn stream(&self) -> u32 {
        self.stream
    }

    pub(super) fn me(&self) -> u32 {
        self.me
    }

    pub(super) fn size(&self) -> u32 {
        self.size
    }

    /// The world rank of team rank `rank`.
    pub(super) fn member(&self, rank: u32) -> u32 {
        self.members
            .as_ref()
            .map_or(rank, |members| members[rank as usize])
    }

    /// The team rank of world rank `rank`, a member.
    pub(super) fn rank_of(&self, rank: u32) -> u32 {
        self.members.as_ref().map_or(rank, |members| {
            members
                .iter()
                .position(|&member| member == rank)
                .unwrap_or_else(|| unreachable!("rank {rank} is not a member of {members:?}"))
                as u32
        })
    }

    /// Whether world rank `rank` is a member.
    pub(super) fn contains(&self, rank: u32) -> bool {
        self.members
            .as_ref()
            .is_none_or(|members| members.contains(&rank))
    }

    /// The world ranks of every other member, in the team's order.
    pub(super) fn peers(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.size)
            .filter(|&rank| rank != self.me)
            .map(|rank| self.member(rank))
    }

    /// `rank` of this team's ranks: [`Error::RankOutOfRange`] when it is not.
    pub(super) fn check_rank(&self, rank: u32) -> Result<(), Error> {
        rank_below(rank, self.size)
    }

    /// The tag of this team's next collective.
    fn next_tag(&mut self) -> u64 {
        let tag = (u64::from(self.stream) << SEQ_BITS) | (self.seq & SEQ_MASK);
        self.seq += 1;
        tag
    }
}

/// `rank` of ranks numbered from 0 to `size - 1`: [`Error::RankOutOfRange`] when it is not.
pub(super) fn rank_below(rank: u32, size: u32) -> Result<(), Error> {
    if rank < size {
        Ok(())
    } else {
        Err(Error::RankOutOfRange {
            rank,
            world_size: size,
        })
    }
}

/// The world's team and the groups this rank is in.
#[derive(Debug)]
pub(super) struct Groups {
    /// The world's team: stream 0, every rank.
    world: Team,
    /// Each group's team by stream.
    pub(super) teams: HashMap<u32, Team>,
    /// The highest stream this rank has been in (see "Streams").
    pub(super) highest: u32,
    /// The members of the group being made, while an attempt to make it runs (see
    /// `Deadline::among`): the team of the setup stream.
    pub(super) making: Option<Team>,
    /// This rank's last ballot on each list of ranks (see `agree`).
    pub(super) ballots: HashMap<Vec<u32>, u64>,
    /// The first member of the call in progress that sent what no honest member sends, and
    /// what.
    pub(super) forged: Option<(u32, String)>,
}

impl Groups {
    /// No group yet, in a world of `size` ranks seen from `rank`.
    pub(super) fn new(rank: u32, size: u32) -> Self {
        Self {
            world: Team::world(rank, size),
            teams: HashMap::new(),
            highest: 0,
            making: None,
            ballots: HashMap::new(),
            forged: None,
        }
    }

    /// The world's team.
    pub(super) fn world(&self) -> &Team {
        &self.world
    }

    /// The team of `stream`: the world's (0), a group's, or the group being made's (the setup
    /// stream). The world's for a stream this rank has no team of, which no call runs among.
    pub(super) fn of_stream(&self, stream: u32) -> &Team {
        let team = match stream {
            0 => None,
            crate::tag::SETUP_STREAM => self.making.as_ref(),
            _ => self.teams.get(&stream),
        };
        team.unwrap_or(&self.world)
    }

    /// The group on `stream` whose members are `ranks`, if this rank is in it.
    pub(super) fn group(&self, stream: u32, ranks: &[u32]) -> Option<&Team> {
        self.teams
            .get(&stream)
            .filter(|team| team.members.as_deref() == Some(ranks))
    }

    /// The number and tag of the next collective on `stream` (the world's or a group's),
    /// taken: the stored team moves on to the next. `None` for a stream with no stored team
    /// (the setup stream's, whose messages are numbered per pair instead).
    pub(super) fn next_tag(&mut self, stream: u32) -> Option<(u64, u64)> {
        let team = if stream == 0 {
            &mut self.world
        } else {
            self.teams.get_mut(&stream)?
        };
        Some((team.seq, team.next_tag()))
    }

    /// The streams of the groups whose teams `hit` picks.
    pub(super) fn streams_where(&self, hit: impl Fn(&Team) -> bool) -> Vec<u32> {
        self.teams
            .values()
            .filter(|team| hit(team))
            .map(Team::stream)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tag::SETUP_STREAM;

    #[test]
    fn streams_and_sequence_numbers_share_a_tag_without_overlap() {
        let mut team = Team::of(5, Arc::from([3, 1, 4]), 1);
        let first = team.next_tag();
        assert_eq!(crate::tag::stream_of(first), 5);
        assert_eq!(first & SEQ_MASK, 0);
        assert_eq!(team.next_tag() & SEQ_MASK, 1);
        assert_eq!((team.member(0), team.member(2)), (3, 4));
        assert_eq!(team.rank_of(4), 2);
        assert!(team.contains(1) && !team.contains(0));
        assert_eq!(team.peers().collect::<Vec<_>>(), [3, 4]);
        let world = Team::world(2, 4);
        assert!((0..4).all(|rank| world.contains(rank) && world.member(rank) == rank));
        assert_eq!(world.peers().collect::<Vec<_>>(), [0, 1, 3]);
        assert_eq!(SETUP_STREAM, (1 << 24) - 1);
    }

    #[test]
    fn only_stored_teams_number_collectives_and_each_stream_counts_alone() {
        let mut groups = Groups::new(1, 4);
        groups.teams.insert(7, Team::of(7, Arc::from([1, 3]), 0));
        let (seq, tag) = groups.next_tag(0).expect("the world's");
        assert_eq!((seq, crate::tag::stream_of(tag)), (0, 0));
        assert_eq!(groups.next_tag(0).map(|(seq, _)| seq), Some(1));
        let (seq, tag) = groups.next_tag(7).expect("a group's");
        assert_eq!((seq, crate::tag::stream_of(tag)), (0, 7));
        assert_eq!(groups.next_tag(SETUP_STREAM), None);
        assert!(groups.group(7, &[1, 3]).is_some());
        assert!(
            groups.group(7, &[3, 1]).is_none(),
            "the same ranks in another order"
        );
        // A copy handed to a call does not move the stored team on.
        let copy = groups.world().clone();
        assert_eq!(groups.next_tag(0).map(|(seq, _)| seq), Some(2));
        assert_eq!(copy.seq, 2);
    }
}
