//! Collectives with a root: broadcast and gather, flat in small worlds and down (or up) a
//! binomial tree in large ones; and `broadcast_loan`, a root's loan to every other rank.

use super::demux::{Expect, Incoming, Sink, message};
use super::engine::loans::LoanView;
use super::engine::outgoing::Targets;
use super::state::Deadline;
use super::state::Session;
use super::teams::Team;
use super::tuning::TREE_PART_MAX;
use crate::error::Error;
use shmbroker_allocator::Loan;
use shmbroker_bindings::{Message, kind};

/// Bytes of a tree broadcast's routing slot before any data it carries: the route and the
/// length.
const ROUTE_HEADER: usize = 8;

/// Where a rank of a tree broadcast finds the data, as its parent's routing slot says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// In the routing slot itself, after [`ROUTE_HEADER`].
    Inline,
    /// In the next broadcast message from the parent.
    Parent,
    /// Streamed by the root to every rank at once.
    Root,
}

impl Route {
    /// How `len` bytes travel down the tree, with this session's eager limit.
    fn for_len(len: usize, eager_limit: usize) -> Self {
        if len <= shmbroker_bindings::INLINE_BYTES - ROUTE_HEADER {
            Self::Inline
        } else if len <= eager_limit {
            Self::Parent
        } else {
            Self::Root
        }
    }

    /// The routing slot for message `seq`, carrying `data` when it is [`Self::Inline`].
    fn word(self, seq: u64, data: &[u8]) -> Message {
        let mut inline = [0u8; shmbroker_bindings::INLINE_BYTES];
        inline[0] = match self {
            Self::Inline => 1,
            Self::Parent => 2,
            Self::Root => 3,
        };
        let mut len = ROUTE_HEADER;
        if self == Self::Inline {
            inline[ROUTE_HEADER..][..data.len()].copy_from_slice(data);
            len += data.len();
        }
        message(kind::BROADCAST, seq, len as u32, inline)
    }

    /// The route a parent's routing slot names, checked.
    fn read(parent: u32, word: &Message) -> Result<Self, Error> {
        let route = match word.inline[0] {
            1 => Self::Inline,
            2 => Self::Parent,
            3 => Self::Root,
            other => {
                return Err(Error::Protocol {
                    peer: parent,
                    detail: format!(
                        "a broadcast routing slot names route {other}; expected 1 (inline), 2 \
                         (from the parent) or 3 (from the root)"
                    ),
                });
            }
        };
        let len = word.len as usize;
        let fits = if route == Self::Inline {
            (ROUTE_HEADER..=shmbroker_bindings::INLINE_BYTES).contains(&len)
        } else {
            len == ROUTE_HEADER
        };
        if !fits || word.inline[1..ROUTE_HEADER].iter().any(|&b| b != 0) {
            return Err(Error::Protocol {
                peer: parent,
                detail: format!(
                    "a broadcast routing slot of {len} bytes for route {route:?}; expected \
                     {ROUTE_HEADER} bytes of header (zeros after the route) and, inline, the data"
                ),
            });
        }
        Ok(route)
    }
}

/// One rank's place in a binomial tree of `world` ranks rooted at `root`, by relative rank
/// (`rank - root`, modulo the world): the lowest set bit of the relative rank leads to the
/// parent, and the children hang off the lower bits, child `relative + m` heading the subtree
/// of relative ranks `relative + m .. relative + 2m` (cut at the world).
#[derive(Clone, Copy, Debug)]
struct BinomialTree {
    root: u32,
    world: u32,
    relative: u32,
    /// The lowest set bit of `relative`; for the root, the first power of two not below the
    /// world.
    mask: u32,
}

impl BinomialTree {
    fn new(rank: u32, root: u32, world: u32) -> Self {
        let relative = (rank + world - root) % world;
        let mut mask = 1u32;
        while mask < world && relative & mask == 0 {
            mask <<= 1;
        }
        Self {
            root,
            world,
            relative,
            mask,
        }
    }

    fn rank_of(&self, relative: u32) -> u32 {
        (relative + self.root) % self.world
    }

    /// The parent's rank; `None` at the root.
    fn parent(&self) -> Option<u32> {
        (self.relative != 0).then(|| self.rank_of(self.relative - self.mask))
    }

    /// Every child's rank and the number of ranks in its subtree, smallest subtree first.
    fn children(&self) -> impl DoubleEndedIterator<Item = (u32, u32)> + '_ {
        let mask = self.mask;
        (0..mask.trailing_zeros())
            .map(|bit| 1u32 << bit)
            .filter(|&m| self.relative + m < self.world)
            .map(move |m| {
                let size = m.min(self.world - self.relative - m);
                (self.rank_of(self.relative + m), size)
            })
    }
}

/// A subtree's parts on their way up a tree gather, in relative rank order.
///
/// On the wire: one little-endian `u32` per part, its length, or [`Bundle::DIRECT`] for a part
/// sent straight to the root; then the forwarded parts, back to back. The receiver knows how
/// many parts the subtree has, and checks every length against [`TREE_PART_MAX`] and the total.
#[derive(Debug, Default)]
struct Bundle {
    /// Each part's bytes, or `None` for one sent straight to the root.
    parts: Vec<Option<Vec<u8>>>,
}

impl Bundle {
    /// The length word of a part sent straight to the root.
    const DIRECT: u32 = u32::MAX;

    fn new() -> Self {
        Self::default()
    }

    /// This rank's own part: forwarded if small, else marked as sent directly.
    fn push(&mut self, data: &[u8]) {
        self.parts
            .push((data.len() <= TREE_PART_MAX).then(|| data.to_vec()));
    }

    /// The bundle of `child`'s subtree of `parts` parts, decoded and checked.
    fn append(&mut self, child: u32, parts: u32, bytes: &[u8]) -> Result<(), Error> {
        let forged = |detail: String| Error::Protocol {
            peer: child,
            detail: format!("a gather bundle for a subtree of {parts} ranks: {detail}"),
        };
        let header = parts as usize * 4;
        if bytes.len() < header {
            return Err(forged(format!(
                "{} bytes, short of the {header}-byte length table",
                bytes.len()
            )));
        }
        let (table, mut body) = bytes.split_at(header);
        for (index, word) in table.chunks_exact(4).enumerate() {
            let len = u32::from_le_bytes(word.try_into().expect("chunks of four"));
            if len == Self::DIRECT {
                self.parts.push(None);
                continue;
            }
            let len = len as usize;
            if len > TREE_PART_MAX || len > body.len() {
                return Err(forged(format!(
                    "part {index} claims {len} bytes; expected at most {TREE_PART_MAX} and at most \
                     the {} bytes left",
                    body.len()
                )));
            }
            let (part, rest) = body.split_at(len);
            self.parts.push(Some(part.to_vec()));
            body = rest;
        }
        if !body.is_empty() {
            return Err(forged(format!(
                "{} bytes left over after its parts",
                body.len()
            )));
        }
        Ok(())
    }

    /// The wire form (see [`Bundle`]).
    fn encode(&self) -> Vec<u8> {
        let body: usize = self.parts.iter().flatten().map(Vec::len).sum();
        let mut bytes = Vec::with_capacity(self.parts.len() * 4 + body);
        for part in &self.parts {
            let word = part.as_ref().map_or(Self::DIRECT, |part| part.len() as u32);
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        for part in self.parts.iter().flatten() {
            bytes.extend_from_slice(part);
        }
        bytes
    }

    /// Every part, in relative rank order.
    fn into_parts(self) -> Vec<Option<Vec<u8>>> {
        self.parts
    }
}

impl Session {
    /// `root`'s loan on every other rank, by reference: the root passes `Some(loan)` and gets
    /// `None`; the others pass `None` and get a view of the root's buffer.
    ///
    /// # Errors
    ///
    /// As for [`Collectives::broadcast`](crate::Collectives::broadcast) and [`Self::recv_loan`].
    pub fn broadcast_loan(
        &mut self,
        root: u32,
        loan: Option<Loan>,
    ) -> Result<Option<LoanView>, Error> {
        self.collective("broadcast_loan", |session, team, deadline| {
            session.broadcast_loan_tracked(team, root, loan, deadline)
        })
    }

    /// [`Self::broadcast_loan`] within its tracked deadline (which [`Deadline::settle`] then
    /// notes the outcome of).
    fn broadcast_loan_tracked(
        &mut self,
        team: &Team,
        root: u32,
        loan: Option<Loan>,
        deadline: &Deadline,
    ) -> Result<Option<LoanView>, Error> {
        self.check_root(team, root, loan.is_some(), "broadcast_loan")?;
        let seq = self.next_seq(team, kind::BROADCAST)?;
        if let Some(loan) = loan {
            let targets: Vec<u32> = self.peers().collect();
            self.lend(kind::BROADCAST, seq, loan, &targets, deadline)?;
            return Ok(None);
        }
        let expect = Expect::Collective {
            op: kind::BROADCAST,
            seq,
        };
        self.take_loan(root, expect, deadline).map(Some)
    }

    /// [`Collectives::broadcast`](crate::Collectives::broadcast) straight from the root to
    /// every rank (small worlds).
    pub(super) fn flat_broadcast(
        &mut self,
        team: &Team,
        root: u32,
        data: Option<&[u8]>,
        seq: u64,
        deadline: &Deadline,
    ) -> Result<Vec<u8>, Error> {
        if let Some(data) = data {
            self.send_to(kind::BROADCAST, seq, data, Targets::Peers, deadline)?;
            return Ok(data.to_vec());
        }
        let expect = Expect::Collective {
            op: kind::BROADCAST,
            seq,
        };
        let root = team.member(root);
        let mut incoming = [Incoming::new(root, expect, Sink::Vec(Vec::new()))];
        self.receive_all(&mut incoming, deadline)?;
        let [incoming] = incoming;
        Ok(incoming.finish()?.1.into_vec())
    }

    /// [`Collectives::broadcast`](crate::Collectives::broadcast) down a binomial tree rooted at
    /// `root` (see [`FLAT_BROADCAST_MAX`](super::tuning::FLAT_BROADCAST_MAX)). Each rank first
    /// hears one slot from its parent saying where the data is ([`Route`]): in that slot, in the
    /// next message from the parent (up to the eager limit), or in the root's outbox, streamed to
    /// every rank at once as in a flat broadcast (larger data: forwarding it would copy it once per
    /// level). The rank passes the same word to its children before it takes the data from the
    /// root, so no rank waits on another's large transfer.
    pub(super) fn tree_broadcast(
        &mut self,
        team: &Team,
        root: u32,
        data: Option<&[u8]>,
        seq: u64,
        deadline: &Deadline,
    ) -> Result<Vec<u8>, Error> {
        let tree = BinomialTree::new(team.me(), root, team.size());
        // Largest subtree first: it has the most levels still to go.
        let children: Vec<u32> = tree
            .children()
            .map(|(child, _)| team.member(child))
            .rev()
            .collect();
        let root = team.member(root);
        let expect = Expect::Collective {
            op: kind::BROADCAST,
            seq,
        };
        let (route, bytes) = match data {
            Some(data) => (
                Route::for_len(data.len(), self.eager_limit()),
                data.to_vec(),
            ),
            None => {
                let parent = team.member(tree.parent().expect("only the root has data"));
                let word = self.recv_collective(parent, kind::BROADCAST, seq, deadline)?;
                let route = Route::read(parent, &word)?;
                let bytes = match route {
                    Route::Inline => {
                        word.inline[ROUTE_HEADER..][..word.len as usize - ROUTE_HEADER].to_vec()
                    }
                    Route::Parent => self.receive_vec(parent, expect, deadline)?,
                    // Taken from the root once the children have been told.
                    Route::Root => Vec::new(),
                };
                (route, bytes)
            }
        };
        for &child in &children {
            let word = route.word(seq, &bytes);
            self.send_message(child, word, deadline)?;
            if route == Route::Parent {
                self.send_to(kind::BROADCAST, seq, &bytes, Targets::One(child), deadline)?;
            }
        }
        match (route, data) {
            (Route::Root, Some(data)) => {
                self.send_to(kind::BROADCAST, seq, data, Targets::Peers, deadline)?;
                Ok(bytes)
            }
            (Route::Root, None) => self.receive_vec(root, expect, deadline),
            _ => Ok(bytes),
        }
    }

    /// The next group `expect` selects from `peer`, whole, into a vector.
    pub(super) fn receive_vec(
        &mut self,
        peer: u32,
        expect: Expect,
        deadline: &Deadline,
    ) -> Result<Vec<u8>, Error> {
        let mut incoming = [Incoming::new(peer, expect, Sink::Vec(Vec::new()))];
        self.receive_all(&mut incoming, deadline)?;
        let [incoming] = incoming;
        Ok(incoming.finish()?.1.into_vec())
    }

    /// [`Collectives::gather`](crate::Collectives::gather) straight from every rank to the root
    /// (small worlds).
    pub(super) fn flat_gather(
        &mut self,
        team: &Team,
        root: u32,
        data: &[u8],
        seq: u64,
        deadline: &Deadline,
    ) -> Result<Option<Vec<Vec<u8>>>, Error> {
        if root != team.me() {
            let root = team.member(root);
            self.send_to(kind::GATHER, seq, data, Targets::One(root), deadline)?;
            return Ok(None);
        }
        let mut incoming = self.receive_from_every_peer(team, kind::GATHER, seq);
        self.receive_all(&mut incoming, deadline)?;
        self.gathered(team, data, incoming).map(Some)
    }

    /// [`Collectives::gather`](crate::Collectives::gather) up a binomial tree rooted at `root` (see
    /// [`FLAT_GATHER_MAX`](super::tuning::FLAT_GATHER_MAX)), so the root receives ceil(log2(n))
    /// messages instead of n - 1. Each rank sends its parent one bundle for its subtree (see
    /// [`Bundle`]): parts of at most [`TREE_PART_MAX`] bytes travel in it; a larger part is only
    /// marked there and goes straight to the root afterwards, once (forwarding it would copy it
    /// once per level). Sizes may differ between ranks, so only the world size picks the algorithm
    /// and each rank picks its own part's path.
    pub(super) fn tree_gather(
        &mut self,
        team: &Team,
        root: u32,
        data: &[u8],
        seq: u64,
        deadline: &Deadline,
    ) -> Result<Option<Vec<Vec<u8>>>, Error> {
        let (rank, world) = (team.me(), team.size());
        let tree = BinomialTree::new(rank, root, world);
        let expect = Expect::Collective {
            op: kind::GATHER,
            seq,
        };
        let mut bundle = Bundle::new();
        bundle.push(data);
        // Smallest subtree (soonest done) first; each child's bundle follows this rank's part and
        // the smaller subtrees' in relative rank order.
        for (child, parts) in tree.children() {
            let child = team.member(child);
            let bytes = self.receive_vec(child, expect, deadline)?;
            bundle.append(child, parts, &bytes)?;
        }
        if let Some(parent) = tree.parent() {
            let (parent, root) = (team.member(parent), team.member(root));
            self.send_to(
                kind::GATHER,
                seq,
                &bundle.encode(),
                Targets::One(parent),
                deadline,
            )?;
            if data.len() > TREE_PART_MAX {
                self.send_to(kind::GATHER, seq, data, Targets::One(root), deadline)?;
            }
            return Ok(None);
        }
        // At the root the bundle holds every part in relative order; large ones come now.
        let mut gathered = vec![Vec::new(); world as usize];
        let mut direct = Vec::new();
        for (offset, part) in (0..world).zip(bundle.into_parts()) {
            let peer = (offset + root) % world;
            match part {
                Some(bytes) => gathered[peer as usize] = bytes,
                None if peer == rank => gathered[peer as usize] = data.to_vec(),
                None => direct.push(Incoming::new(
                    team.member(peer),
                    expect,
                    Sink::Vec(Vec::new()),
                )),
            }
        }
        self.receive_all(&mut direct, deadline)?;
        for incoming in direct {
            let peer = incoming.peer;
            if let (_, Sink::Vec(bytes)) = incoming.finish()? {
                if bytes.len() <= TREE_PART_MAX {
                    return Err(Error::Protocol {
                        peer,
                        detail: format!(
                            "sent its gather part of {} bytes straight to the root; parts of at \
                             most {TREE_PART_MAX} bytes travel up the tree",
                            bytes.len()
                        ),
                    });
                }
                gathered[team.rank_of(peer) as usize] = bytes;
            }
        }
        Ok(Some(gathered))
    }

    /// Checks a rooted call: `root` in range, and data given exactly at the root.
    pub(super) fn check_root(
        &self,
        team: &Team,
        root: u32,
        has_data: bool,
        op: &str,
    ) -> Result<(), Error> {
        team.check_rank(root)?;
        match (root == team.me(), has_data) {
            (true, false) => Err(Error::Misuse(format!(
                "rank {root} is the {op} root but gave no data"
            ))),
            (false, true) => Err(Error::Misuse(format!(
                "rank {} gave data to a {op} rooted at rank {root}",
                team.me()
            ))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_binomial_tree_links_each_rank_once_to_its_parent() {
        for world in 1..=70u32 {
            for root in [0, world / 2, world - 1] {
                let trees: Vec<_> = (0..world)
                    .map(|rank| BinomialTree::new(rank, root, world))
                    .collect();
                assert_eq!(trees[root as usize].parent(), None);
                // A subtree's size is one (its head) plus its children's subtrees.
                let size = |rank: u32| -> u32 {
                    1 + trees[rank as usize].children().map(|(_, n)| n).sum::<u32>()
                };
                for rank in 0..world {
                    for (child, parts) in trees[rank as usize].children() {
                        assert_eq!(trees[child as usize].parent(), Some(rank), "world {world}");
                        assert_eq!(size(child), parts, "world {world}, root {root}");
                    }
                }
                assert_eq!(size(root), world, "world {world}, root {root}");
            }
        }
    }

    #[test]
    fn a_routing_slot_is_read_back_and_a_forged_one_refused() {
        let data = [7u8; 40];
        for (route, payload) in [
            (Route::Inline, &data[..]),
            (Route::Parent, &[][..]),
            (Route::Root, &[][..]),
        ] {
            let word = route.word(9, payload);
            assert_eq!(Route::read(2, &word).unwrap(), route);
        }
        let good = Route::Parent.word(9, &[]);
        let mut forged = Vec::new();
        for route in [0u8, 4, 255] {
            let mut word = good;
            word.inline[0] = route;
            forged.push(word);
        }
        let mut long = Route::Inline.word(9, &data);
        long.len = 49;
        let mut padded = good;
        padded.inline[3] = 1;
        let mut parent_with_data = good;
        parent_with_data.len = 9;
        forged.extend([long, padded, parent_with_data]);
        for word in forged {
            match Route::read(2, &word) {
                Err(Error::Protocol { peer: 2, detail }) => assert!(detail.contains("route")),
                other => panic!("{word:?}: {other:?}"),
            }
        }
    }
}
