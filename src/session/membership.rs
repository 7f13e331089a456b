//! Who has departed and who has come back, as this session has taken it in: the state the
//! `departures` and `rejoin` modules keep, behind a narrow API so that no other file writes it,
//! and the errors a departure makes.
//!
//! * **Closed for** is the set of ranks whose streams have been closed in every inbox (see
//!   `departures::close_departed_streams`); a rank leaves it when its replacement is taken on.
//! * **Dead seen** is the watcher's set of dead ranks at the last look, so that one load tells
//!   whether anything is new (`departures::catch_up_on_departures`).
//! * **Closed streams** are every stream closed in the inboxes, so that a collective on one fails
//!   at once, before it looks at a queue.
//! * **Adoptions** count the replacements taken on; **adopted at** holds, per rank, the count when
//!   its current process was taken on (0: the rank's first process). A team formed at count `n`
//!   is over for a rank adopted after `n` (see `rejoin`).

use crate::error::Error;
use shmbroker_handshake::Departure;
use std::collections::HashSet;

/// Departures and rejoins as this session has taken them in (see the module doc).
#[derive(Debug)]
pub(super) struct Membership {
    closed_for: u64,
    dead_seen: u64,
    closed_streams: HashSet<u32>,
    adoptions: u64,
    adopted_at: Vec<u64>,
}

impl Membership {
    /// Nobody departed or replaced, in a world of `world` ranks. A replacement (`replacement` is
    /// its rank) starts having taken itself on: its world is over from the start (see `rejoin`).
    pub(super) fn new(world: usize, replacement: Option<u32>) -> Self {
        let mut membership = Self {
            closed_for: 0,
            dead_seen: 0,
            closed_streams: HashSet::new(),
            adoptions: 0,
            adopted_at: vec![0; world],
        };
        if let Some(me) = replacement {
            membership.adoptions = 1;
            membership.adopted_at[me as usize] = 1;
        }
        membership
    }

    /// The replacements taken on so far: a team formed now is formed at this count.
    pub(super) fn adoptions(&self) -> u64 {
        self.adoptions
    }

    /// The count at which `rank`'s current process was taken on (0: its first process).
    pub(super) fn adopted_at(&self, rank: u32) -> u64 {
        self.adopted_at[rank as usize]
    }

    /// Takes on `rank`'s replacement: its streams are open again, and it is adopted at the next
    /// count.
    pub(super) fn adopt(&mut self, rank: u32) {
        self.closed_for &= !(1 << rank);
        self.adoptions += 1;
        self.adopted_at[rank as usize] = self.adoptions;
    }

    /// Whether `stream` has been closed in the inboxes.
    pub(super) fn is_closed(&self, stream: u32) -> bool {
        !self.closed_streams.is_empty() && self.closed_streams.contains(&stream)
    }

    /// Records `streams` as closed in the inboxes.
    pub(super) fn record_closed(&mut self, streams: &[u32]) {
        self.closed_streams.extend(streams);
    }

    /// Records that the streams of the ranks in `departed` (bit `rank`) are closed; returns
    /// whether that set differs from what was closed before.
    pub(super) fn close_for(&mut self, departed: u64) -> bool {
        if departed == self.closed_for {
            return false;
        }
        self.closed_for = departed;
        true
    }

    /// Takes in the watcher's set of dead ranks; returns whether it holds a rank whose streams
    /// were not closed yet, and records those as closed.
    pub(super) fn catch_up(&mut self, dead: u64) -> bool {
        if dead == self.dead_seen {
            return false;
        }
        self.dead_seen = dead;
        let new = dead & !self.closed_for;
        if new == 0 {
            return false;
        }
        self.closed_for |= new;
        true
    }
}

/// The error for a peer that is gone, as the handshake's watcher established it.
pub(super) fn departure_error(departure: Departure) -> Error {
    match departure {
        Departure::Lost { rank } => lost(rank),
        Departure::Left { rank, after } => Error::PeerLeft {
            rank,
            after,
            diagnosis: Vec::new(),
        },
        Departure::BrokerLost => Error::BrokerLost,
        Departure::NeverJoined {
            rank,
            after,
            after_left,
        } => Error::PeerNeverJoined {
            rank,
            after,
            after_left,
        },
    }
}

/// [`Error::PeerLost`] naming `rank`, with no diagnosis yet.
pub(super) fn lost(rank: u32) -> Error {
    Error::PeerLost {
        rank,
        diagnosis: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::Membership;

    #[test]
    fn a_death_is_new_once_and_a_replacement_opens_its_streams_again() {
        let mut membership = Membership::new(4, None);
        assert!(membership.catch_up(0b100));
        assert!(
            !membership.catch_up(0b100),
            "the same set again is nothing new"
        );
        assert!(!membership.close_for(0b100), "already closed for rank 2");
        membership.adopt(2);
        assert_eq!((membership.adoptions(), membership.adopted_at(2)), (1, 1));
        assert!(
            membership.close_for(0b100),
            "rank 2 is open again after its replacement"
        );
        assert!(!membership.is_closed(7));
        membership.record_closed(&[7]);
        assert!(membership.is_closed(7));
    }

    #[test]
    fn a_replacement_starts_adopted() {
        let membership = Membership::new(3, Some(1));
        assert_eq!(membership.adoptions(), 1);
        assert_eq!(membership.adopted_at(1), 1);
        assert_eq!(membership.adopted_at(0), 0);
    }
}
