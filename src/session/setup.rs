//! The setup messages that make a group: their layout, and the checks every one from a peer
//! passes before `agree` acts on it.

use crate::error::Error;
use crate::tag::SETUP_STREAM;

/// The bytes before the ranks: step, rank count, ballot, two words of payload.
pub(super) const HEAD: usize = 24;

/// What one attempt came to (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The group is made, on this stream.
    Made(u32),
    /// A member was in a later attempt: try again.
    Superseded,
    /// A member reached a newer process of this rank than this member: take it on, try again.
    Replaced(u32),
    /// This member departed before it took part.
    Departed(u32),
    /// This member passed these other ranks.
    Mismatch(u32, Vec<u32>),
    /// This member sent what no honest member sends.
    Forged(u32),
}

impl Outcome {
    /// Which of two reasons an estimate gives: the one a user must act on first.
    pub(super) fn weight(&self) -> u8 {
        match self {
            Self::Made(_) => 0,
            Self::Superseded => 1,
            Self::Replaced(_) => 2,
            Self::Departed(_) => 3,
            Self::Mismatch(..) => 4,
            Self::Forged(_) => 5,
        }
    }

    pub(super) fn code(&self) -> (u32, u32) {
        match self {
            Self::Made(stream) => (0, *stream),
            Self::Superseded => (1, 0),
            Self::Replaced(rank) => (2, *rank),
            Self::Departed(rank) => (3, *rank),
            Self::Mismatch(rank, _) => (4, *rank),
            Self::Forged(rank) => (5, *rank),
        }
    }
}

/// A setup message's step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    Propose,
    Decide,
}

/// One setup message of making a group, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Setup {
    pub(super) step: Step,
    pub(super) ballot: u64,
    pub(super) members: Vec<u32>,
    pub(super) view: Vec<u32>,
    /// A proposal's stream.
    pub(super) proposal: u32,
    /// A decision's outcome.
    pub(super) outcome: Option<Outcome>,
}

impl Setup {
    pub(super) fn encode(&self) -> Vec<u8> {
        let (a, b) = match (&self.step, &self.outcome) {
            (Step::Decide, Some(outcome)) => outcome.code(),
            _ => (self.proposal, 0),
        };
        let step: u32 = match self.step {
            Step::Propose => 1,
            Step::Decide => 2,
        };
        let mut bytes = Vec::with_capacity(HEAD + 8 * self.members.len());
        bytes.extend(step.to_le_bytes());
        bytes.extend((self.members.len() as u32).to_le_bytes());
        bytes.extend(self.ballot.to_le_bytes());
        bytes.extend(a.to_le_bytes());
        bytes.extend(b.to_le_bytes());
        let tail = match &self.outcome {
            Some(Outcome::Mismatch(_, found)) => found.as_slice(),
            _ => &[],
        };
        for word in self.members.iter().chain(&self.view).chain(tail) {
            bytes.extend(word.to_le_bytes());
        }
        bytes
    }

    /// `bytes` from `peer`, checked against a world of `world` ranks.
    pub(super) fn decode(peer: u32, bytes: &[u8], world: u32) -> Result<Self, Error> {
        let forged = |detail: String| Error::Protocol {
            peer,
            detail: format!("making a group: {detail}"),
        };
        if bytes.len() < HEAD || !bytes.len().is_multiple_of(4) {
            return Err(forged(format!(
                "{} bytes where a setup message ({HEAD} bytes and whole ranks) was due",
                bytes.len()
            )));
        }
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let step = match word(0) {
            1 => Step::Propose,
            2 => Step::Decide,
            other => return Err(forged(format!("step {other}; 1 (propose) or 2 (decide)"))),
        };
        let n = word(4) as usize;
        let words = (bytes.len() - HEAD) / 4;
        if n == 0 || n > world as usize || 2 * n > words {
            return Err(forged(format!(
                "{n} members in a message of {words} rank words, in a world of {world}"
            )));
        }
        let ballot = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        let (a, b) = (word(16), word(20));
        let ranks = |from: usize, count: usize| -> Vec<u32> {
            (0..count).map(|i| word(HEAD + 4 * (from + i))).collect()
        };
        let members = ranks(0, n);
        let view = ranks(n, n);
        let tail = ranks(2 * n, words - 2 * n);
        if let Some(&rank) = members.iter().chain(&tail).find(|&&rank| rank >= world) {
            return Err(forged(format!("rank {rank} in a world of {world} ranks")));
        }
        let stream_ok = |stream: u32| (1..SETUP_STREAM).contains(&stream);
        let (proposal, outcome) = match step {
            Step::Propose if stream_ok(a) && tail.is_empty() => (a, None),
            Step::Propose => {
                return Err(forged(format!(
                    "proposed stream {a} with {} extra words; groups have streams 1 to {}",
                    tail.len(),
                    SETUP_STREAM - 1
                )));
            }
            Step::Decide => {
                let outcome = match (a, tail.is_empty()) {
                    (0, true) if stream_ok(b) => Outcome::Made(b),
                    (1, true) => Outcome::Superseded,
                    (2, true) if b < world => Outcome::Replaced(b),
                    (3, true) if b < world => Outcome::Departed(b),
                    (4, _) if b < world => Outcome::Mismatch(b, tail),
                    (5, true) if b < world => Outcome::Forged(b),
                    _ => {
                        return Err(forged(format!(
                            "decision {a} with value {b} and {} extra words",
                            tail.len()
                        )));
                    }
                };
                (0, Some(outcome))
            }
        };
        Ok(Self {
            step,
            ballot,
            members,
            view,
            proposal,
            outcome,
        })
    }
}
