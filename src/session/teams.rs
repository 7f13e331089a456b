//! The ranks a collective runs among (a [`Team`]: the world's, or a group's) and every group
//! this rank is in ([`Groups`]). State only: making groups is `groups`'s, and agreeing on them
//! `agree`'s.

use crate::tag::{SEQ_BITS, SEQ_MASK};
use std::collections::HashMap;
use std::sync::Arc;

/// The ranks a collective runs among, with the next sequence number of their stream.
#[derive(Clone, Debug)]
pub(super) struct Team {
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

    /// The number of this team's next collective.
    pub(super) fn seq(&self) -> u64 {
        self.seq
    }

    /// The tag of this team's next collective.
    pub(super) fn next_tag(&mut self) -> u64 {
        let tag = (u64::from(self.stream) << SEQ_BITS) | (self.seq & SEQ_MASK);
        self.seq += 1;
        tag
    }
}

/// The groups this rank is in.
#[derive(Debug, Default)]
pub(super) struct Groups {
    /// Each group's team by stream, but the one in use during a call on it.
    pub(super) teams: HashMap<u32, Team>,
    /// The highest stream this rank has been in (see "Streams").
    pub(super) highest: u32,
    /// This rank's last ballot on each list of ranks (see `agree`).
    pub(super) ballots: HashMap<Vec<u32>, u64>,
    /// The first member of the call in progress that sent what no honest member sends, and
    /// what.
    pub(super) forged: Option<(u32, String)>,
}

impl Groups {
    /// The streams of the groups (but the one in use) whose teams `hit` picks.
    pub(super) fn streams_where(&self, hit: impl Fn(&Team) -> bool) -> Vec<u32> {
        self.teams
            .values()
            .filter(|team| hit(team))
            .map(Team::stream)
            .collect()
    }
}
