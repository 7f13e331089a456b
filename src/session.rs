//! A logged-on worker's collectives and point-to-point messages, worker to worker over the rings.
//!
//! Every call has the session's default deadline ([`Session::set_timeout`], [`DEFAULT_TIMEOUT`])
//! and a `_timeout` variant; the broker is not on any of these paths.
//!
//! # Messages of any size
//!
//! Every operation takes data of any length (up to what memory holds). Small data travels
//! eagerly in ring slots: 48 bytes in the header slot and 64 in each slot behind it, up to half a
//! ring ([`kind::EAGER_MAX`] at most). Larger data is pipelined through the sender's outbox in
//! chunks that receivers copy out and acknowledge, so both copies overlap and a slow receiver
//! holds the sender back; a message larger than the outbox goes through. [`Session::loan`] and
//! [`Session::send_loan`] hand a buffer over by reference instead, at a cost that does not depend
//! on its size. See the `transfer` module for the protocol.
//!
//! # Whose memory is whose
//!
//! Each rank owns an outbox ([`shmbroker_allocator::Outbox`]) that only it can write: the kernel
//! refuses every other process, whatever it tries (the seals). Peers map it read-only and copy
//! out of it after checking every reference against its bounds. Which blocks are free, and which
//! ranks still owe an acknowledgement for which block, is recorded in the owner's private memory;
//! an acknowledgement the owner did not expect is an [`Error::Protocol`] naming the rank that sent
//! it, and frees nothing.
//!
//! # Matching
//!
//! Collectives are tagged with a sequence number that every rank advances once per collective,
//! so a rank that receives another operation or another sequence number than it expects reports
//! [`Error::CollectiveMismatch`] instead of hanging or misreading. Point-to-point messages
//! (`SEND`) and collective messages share a ring; a message that arrives while another kind is
//! awaited waits in a per-peer queue, in order. Like `MPI_Send`, a send larger than the sender's
//! outbox returns only once its receiver is receiving it.
//!
//! # When a peer dies
//!
//! Every worker watches every peer's process itself (a pidfd the broker opened at that peer's
//! logon), whether or not the broker is still there. When a peer's process exits without having
//! dropped its session, the watcher closes every ring of this worker, waking whatever call is
//! parked; every pending and later call then fails with [`Error::PeerLost`] naming the first rank
//! that died. A peer that dropped its session **left**: calls that need it fail with
//! [`Error::PeerLeft`], others go on. With the broker gone, what needs it fails with
//! [`Error::BrokerLost`]. See the handshake's `liveness` module. Blocks of this rank's outbox that
//! a departed peer still owed an acknowledgement for are given back.

mod fds;
mod gpu;
mod transfer;

pub use fds::FdTransport;
pub use shmbroker_allocator::{DEFAULT_OUTBOX_BYTES, Loan};

use shmbroker_allocator::{Outbox, PeerOutbox, View};
use shmbroker_bindings::{ANY_RANK, LogonFrame, Message, PayloadRef, kind};
use shmbroker_handshake::connect;
use shmbroker_queues::Corruption;
pub use shmbroker_queues::Waiting;
use std::collections::{HashSet, VecDeque};
use std::path::Path;
use std::time::{Duration, Instant};
use transfer::{Expect, Incoming, Sink, Targets, ViewAcks, message};

// Who owes which acknowledgement is a bit per rank: every rank of the largest world needs one.
const _: () =
    assert!(shmbroker_allocator::ledger::MAX_RANKS >= shmbroker_handshake::MAX_WORLD_SIZE);

/// The default deadline of every call, until [`Session::set_timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The variable naming the job a worker belongs to (any text: a launcher's job id, a UUID).
/// Every worker of one job gives the same; a broker then refuses a worker whose job has already
/// ended instead of starting a new job around it (see `LogonFrame::job`).
pub const JOB_VAR: &str = "SHMBROKER_JOB";

/// The variable that fixes how every wait of a session spends its time before it parks, for
/// users who know better than the adaptive default ([`Waiting::Adaptive`]): a number of spins
/// (`0` parks at once), or `forever` to spin until the deadline. Either way with no yielding.
pub const SPIN_VAR: &str = "SHMBROKER_SPIN";

/// The variable that sets every session's outbox size in bytes (default
/// [`DEFAULT_OUTBOX_BYTES`]).
pub const OUTBOX_BYTES_VAR: &str = "SHMBROKER_OUTBOX_BYTES";

/// Why a session call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Logging on failed.
    #[error(transparent)]
    Logon(#[from] shmbroker_handshake::Error),
    /// A worker of the session died (its process exited without dropping its session): the
    /// session is over, and every pending and later call that needs a peer reports the first rank
    /// that died.
    #[error("peer rank {rank} was lost (its process exited without leaving)")]
    PeerLost {
        /// The rank that was lost.
        rank: u32,
    },
    /// A worker this call needs dropped its session (on purpose). Calls that do not need it go on.
    #[error("peer rank {rank} left the session")]
    PeerLeft {
        /// The rank that left.
        rank: u32,
    },
    /// The broker is gone, and this call needed it: a peer that never logged on while it was
    /// there, an fd relay, or a peer's outbox still to come. Peers already logged on can still
    /// be reached.
    #[error("the broker is gone (its socket closed)")]
    BrokerLost,
    /// The deadline passed.
    #[error(
        "{op} timed out after {timeout:?} waiting for {}",
        ranks_text(waiting_for)
    )]
    Timeout {
        /// The call (`barrier`, `all_gather`, `recv`, ...).
        op: &'static str,
        /// The ranks it was still waiting for, in rank order (never empty): for a collective,
        /// every peer whose part had not arrived when the deadline passed.
        waiting_for: Vec<u32>,
        /// The call's timeout.
        timeout: Duration,
    },
    /// A rank argument outside the world.
    #[error("rank {rank} is out of range for a world of {world_size}")]
    RankOutOfRange {
        /// The rank given.
        rank: u32,
        /// The world size.
        world_size: u32,
    },
    /// A message longer than the buffer given to receive it. It was received to its end (and
    /// acknowledged), so the next message is intact.
    #[error("rank {peer} sent {needed} bytes; the buffer holds {capacity}")]
    BufferTooSmall {
        /// The sender.
        peer: u32,
        /// The message's length.
        needed: u64,
        /// The buffer's length.
        capacity: usize,
    },
    /// The ranks called different collectives, or in a different order. Renders as "rank 1
    /// called all_gather #3 while this rank called barrier #3".
    #[error(
        "rank {peer} called {} #{found_seq} while this rank called {} #{expected_seq}",
        op_text(*found_kind),
        op_text(*expected_kind)
    )]
    CollectiveMismatch {
        /// The peer whose message did not match.
        peer: u32,
        /// The operation this rank is in ([`shmbroker_bindings::kind`]; named by
        /// [`shmbroker_bindings::kind::name`]).
        expected_kind: u32,
        /// This rank's collective sequence number.
        expected_seq: u64,
        /// The operation the peer is in.
        found_kind: u32,
        /// The peer's collective sequence number.
        found_seq: u64,
    },
    /// A call this rank cannot make (a broadcast root without data, say): a mistake in the
    /// calling program, described for the person who fixes it.
    #[error("misuse: {0}")]
    Misuse(String),
    /// The operating system refused what a call needed of it (duplicating an fd, `fstat`).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A peer sent bytes no correct peer sends.
    #[error("bad message from rank {peer}: {detail}")]
    Protocol {
        /// The peer.
        peer: u32,
        /// What was wrong.
        detail: String,
    },
    /// A peer corrupted a ring.
    #[error("ring with rank {peer} corrupted: {corruption}")]
    Corrupted {
        /// The peer.
        peer: u32,
        /// What was found.
        corruption: Corruption,
    },
    /// A peer's outbox is unusable (seals, size or header), or a reference into it is out of
    /// bounds.
    #[error("{source} (from rank {peer})")]
    Outbox {
        /// The rank that owns the outbox.
        peer: u32,
        /// What was wrong.
        #[source]
        source: shmbroker_allocator::Error,
    },
    /// This rank's own outbox refused (it cannot be created, or a loan larger than it).
    #[error("this rank's outbox: {0}")]
    OwnOutbox(#[source] shmbroker_allocator::Error),
    /// An fd could not be moved with the transport chosen.
    #[error("fd exchange: {0}")]
    FdTransport(String),
    /// An fd ticket named a file the fd number no longer (or never) referred to.
    #[error(
        "stale fd ticket from rank {exporter}: expected (st_dev, st_ino) {expected:?}, found {found:?}"
    )]
    StaleFdTicket {
        /// The rank that offered the fd.
        exporter: u32,
        /// What the ticket said.
        expected: (u64, u64),
        /// What the fd number referred to.
        found: (u64, u64),
    },
    /// Relaying an fd through the broker, to or from `peer`, failed.
    #[error("fd relay with rank {peer}: {source}")]
    Relay {
        /// The rank the fd was going to or coming from.
        peer: u32,
        /// What the broker or its socket said.
        #[source]
        source: shmbroker_handshake::Error,
    },
    /// The launcher's variables do not say where this worker stands.
    #[error("launch environment: {0}")]
    Launch(String),
}

/// `op`'s name, or its number when no operation has it.
fn op_text(op: u32) -> String {
    shmbroker_bindings::kind::name(op).map_or_else(|| format!("operation {op}"), str::to_owned)
}

/// "rank 3", or "ranks 1, 2 and 5".
fn ranks_text(ranks: &[u32]) -> String {
    match ranks {
        [] => "no rank".into(),
        [rank] => format!("rank {rank}"),
        [init @ .., last] => {
            let init: Vec<String> = init.iter().map(u32::to_string).collect();
            format!("ranks {} and {last}", init.join(", "))
        }
    }
}

/// The largest world whose barrier is flat: every rank tells every other, and waits for all of
/// them at once (one hop; at most 56 messages in all). Larger worlds disseminate, in
/// ceil(log2(world)) rounds of one message each way: O(n log n) messages instead of O(n²), but
/// one hop per round. Crowded on 2 CPUs both take about as long at 4 and 8 ranks; parked, the
/// hops are wake-ups in a row (8 ranks: 86 µs disseminating, 63 µs flat), hence 8.
pub const FLAT_BARRIER_MAX: u32 = 8;

/// The largest world whose broadcast is flat (the root sends to every rank); larger worlds
/// broadcast down a binomial tree, so the root sends ceil(log2(n)) messages instead of n - 1
/// (see [`Session::broadcast`]).
pub const FLAT_BROADCAST_MAX: u32 = 8;

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

/// The largest world whose [`Session::all_gather_into`] of a small part is flat (every rank
/// sends its part to every other); larger worlds gather by Bruck's algorithm, in ceil(log2(n))
/// rounds, when each part is at most [`BRUCK_MAX_BYTES`] (parts are forwarded, so large ones are
/// cheaper sent once into the outbox, flat). It is also the largest world whose
/// [`Session::gather`] is flat; larger worlds gather up a binomial tree (see [`TREE_PART_MAX`]).
pub const FLAT_GATHER_MAX: u32 = 8;

/// The largest part [`Session::all_gather_into`] gathers by Bruck's algorithm.
pub const BRUCK_MAX_BYTES: usize = 1024;

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

/// The largest part a tree [`Session::gather`] (past [`FLAT_GATHER_MAX`] ranks) forwards up the
/// tree; larger parts go straight to the root.
pub const TREE_PART_MAX: usize = BRUCK_MAX_BYTES;

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

/// A barrier message's inline bytes in dissemination round `round`.
fn round_inline(round: u32) -> [u8; shmbroker_bindings::INLINE_BYTES] {
    let mut inline = [0; shmbroker_bindings::INLINE_BYTES];
    inline[..4].copy_from_slice(&round.to_le_bytes());
    inline
}

/// A worker's session: its rank, its links to every peer, and the collectives over them.
#[derive(Debug)]
pub struct Session {
    inner: shmbroker_handshake::Session,
    timeout: Duration,
    /// Sequence number of the next collective.
    seq: u64,
    /// Per peer: messages received and not yet taken, in arrival order (see `transfer`).
    unread: Vec<VecDeque<Message>>,
    /// Per peer: continuation slots still owed by the eager message last queued from it.
    owed_slots: Vec<usize>,
    /// Per peer: the next point-to-point tag to send, and to expect.
    sent_to: Vec<u64>,
    received_from: Vec<u64>,
    /// This rank's outbox: large data and loans go out through it.
    outbox: Outbox,
    /// Peers' outboxes, mapped read-only when first needed.
    outboxes: Vec<Option<PeerOutbox>>,
    /// Offsets of outbox blocks holding chunks of pipelined transfers, not yet acknowledged.
    chunk_blocks: HashSet<u64>,
    /// Per peer: acknowledgements not yet sent because the ring to that peer was full.
    acks_due: Vec<VecDeque<Message>>,
    /// Acknowledgements of dropped loan views.
    view_acks: ViewAcks,
    /// How fds move, and whether the choice was reported yet.
    fd_transport: FdTransport,
    fd_transport_reported: bool,
    /// CPUs this process may run on (`sched_getaffinity`), at logon.
    cpus: usize,
    /// How every ring of this session waits.
    waiting: Waiting,
    /// The broker this worker hosts (local rank 0 under a launcher). Last, so that it stops
    /// only after this session has said goodbye to it.
    embedded: Option<EmbeddedBroker>,
}

/// A broker on a thread of this process, stopped and joined when dropped.
#[derive(Debug)]
struct EmbeddedBroker {
    stop: shmbroker_handshake::StopHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for EmbeddedBroker {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One call's deadline. It starts when the call first has to wait past spinning: a receive hands
/// the ring its whole timeout and starts this deadline from the moment the ring started its own
/// clock ([`shmbroker_queues::Consumer::clock_started`]), so a call whose messages arrive while
/// it spins reads no clock at all; other waits read the clock when they begin.
struct Deadline {
    op: &'static str,
    at: std::cell::Cell<Option<Instant>>,
    timeout: Duration,
}

impl Deadline {
    fn new(op: &'static str, timeout: Duration) -> Self {
        Self {
            op,
            at: std::cell::Cell::new(None),
            timeout,
        }
    }

    fn left(&self) -> Duration {
        let now = Instant::now();
        let at = self.at.get().unwrap_or_else(|| {
            let at = now
                .checked_add(self.timeout)
                .unwrap_or(now + Duration::from_secs(86_400 * 365));
            self.at.set(Some(at));
            at
        });
        at.saturating_duration_since(now)
    }

    /// What a wait may take now without reading the clock: the whole timeout while the deadline
    /// has not started, what is left otherwise. A wait given the whole timeout must hand its own
    /// clock's start to [`Self::started_at`].
    fn budget(&self) -> Duration {
        if self.at.get().is_none() {
            self.timeout
        } else {
            self.left()
        }
    }

    /// Starts the deadline at `start`, when a wait given [`Self::budget`] started its clock
    /// then and this deadline had not started yet.
    fn started_at(&self, start: Option<Instant>) {
        if let (None, Some(start)) = (self.at.get(), start) {
            self.at.set(start.checked_add(self.timeout));
        }
    }

    fn timed_out(&self, mut waiting_for: Vec<u32>) -> Error {
        waiting_for.sort_unstable();
        waiting_for.dedup();
        Error::Timeout {
            op: self.op,
            waiting_for,
            timeout: self.timeout,
        }
    }
}

/// A read-only view of a buffer a peer lent this rank ([`Session::recv_loan`]). Dropping it tells
/// the owner it may reuse the buffer (the acknowledgement goes out with this session's next
/// call).
///
/// # Trust
///
/// The view reads the owner's memory in place: it is always in bounds and stays mapped while the
/// view lives, so reading it never faults. Only the owner can write those bytes; an honest owner
/// does not touch a buffer it lent until every receiver has dropped its view, but a buggy or
/// hostile one can change them at any time. Copy out what you must validate before trusting it.
#[derive(Debug)]
pub struct LoanView {
    view: View,
    owner: u32,
    payload: PayloadRef,
    acks: ViewAcks,
}

impl LoanView {
    /// The rank that lent the buffer.
    #[must_use]
    pub fn owner(&self) -> u32 {
        self.owner
    }
}

impl std::ops::Deref for LoanView {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.view
    }
}

impl Drop for LoanView {
    fn drop(&mut self) {
        self.acks.push(self.owner, self.payload);
    }
}

/// CPUs this process may run on: its `sched_getaffinity` mask, or what the standard library
/// reckons (cgroup quotas included) when that is fewer.
fn cpus_allowed() -> usize {
    use nix::sched::{CpuSet, sched_getaffinity};
    let parallelism = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let affinity = sched_getaffinity(nix::unistd::Pid::from_raw(0)).map_or(parallelism, |set| {
        (0..CpuSet::count())
            .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
            .count()
    });
    affinity.min(parallelism).max(1)
}

/// The fixed spin count [`SPIN_VAR`] asks for, if it is set.
///
/// # Errors
///
/// [`Error::Misuse`] when it is neither a number nor `forever`.
fn spin_from_env() -> Result<Option<u32>, Error> {
    std::env::var(SPIN_VAR)
        .ok()
        .map(|value| parse_spins(&value))
        .transpose()
}

/// A [`SPIN_VAR`] value: a number of spins, or `forever`.
fn parse_spins(value: &str) -> Result<u32, Error> {
    match value.trim() {
        "forever" => Ok(u32::MAX),
        number => number.parse().map_err(|_| {
            Error::Misuse(format!(
                "{SPIN_VAR} must be a number of spins or \"forever\", not {value:?}"
            ))
        }),
    }
}

/// The outbox size from [`OUTBOX_BYTES_VAR`], or [`DEFAULT_OUTBOX_BYTES`].
///
/// # Errors
///
/// [`Error::Misuse`] when the variable is not a number of bytes.
pub fn outbox_bytes_from_env() -> Result<u64, Error> {
    match std::env::var(OUTBOX_BYTES_VAR) {
        Err(_) => Ok(DEFAULT_OUTBOX_BYTES),
        Ok(value) => value.trim().parse().map_err(|_| {
            Error::Misuse(format!(
                "{OUTBOX_BYTES_VAR} must be a number of bytes, not {value:?}"
            ))
        }),
    }
}

impl Session {
    /// Logs on to the broker at `path` as `rank` (or any free rank) within `timeout`, and
    /// publishes this rank's outbox ([`OUTBOX_BYTES_VAR`] bytes, [`DEFAULT_OUTBOX_BYTES`] when
    /// unset). With [`JOB_VAR`] set, the logon names its job: a broker refuses it if that job
    /// has already ended.
    ///
    /// # Errors
    ///
    /// [`Error::Logon`] with the handshake's reason; [`Error::OwnOutbox`] when the outbox cannot
    /// be created; [`Error::Misuse`] for a bad variable.
    pub fn connect(
        path: impl AsRef<Path>,
        rank: Option<u32>,
        timeout: Duration,
    ) -> Result<Self, Error> {
        Self::connect_with_outbox(path, rank, timeout, outbox_bytes_from_env()?)
    }

    /// [`Self::connect`] with an outbox of `outbox_bytes` bytes, whatever the environment says.
    ///
    /// # Errors
    ///
    /// As for [`Self::connect`].
    pub fn connect_with_outbox(
        path: impl AsRef<Path>,
        rank: Option<u32>,
        timeout: Duration,
        outbox_bytes: u64,
    ) -> Result<Self, Error> {
        let transport = FdTransport::from_env()?;
        if rank == Some(ANY_RANK) {
            return Err(Error::Misuse(format!(
                "rank {ANY_RANK} is the wire's \"any rank\"; pass no rank (None) for any free rank"
            )));
        }
        let mut logon = LogonFrame::new(rank.unwrap_or(ANY_RANK));
        if let Ok(job) = std::env::var(JOB_VAR) {
            logon.job = shmbroker_bindings::job_id(&job);
        }
        let mut session =
            Self::from_handshake_with(connect(path, logon, timeout)?, outbox_bytes, timeout)?;
        session.set_fd_transport(transport);
        Ok(session)
    }

    /// Joins the job this process was launched in, with no socket path and no broker to start
    /// by hand: the local rank, local world size and job id come from Open MPI, MPICH, torchrun
    /// or Slurm (or `SHMBROKER_RANK`, `SHMBROKER_WORLD_SIZE`, `SHMBROKER_SOCKET`; see
    /// [`crate::launch`]). Local rank 0 hosts the broker on a thread of its own, on a socket
    /// named after the job, for as long as its session lives; every rank logs on within
    /// `timeout`, retrying while the broker comes up.
    ///
    /// # Errors
    ///
    /// [`Error::Launch`] naming the variables that are missing or contradict each other;
    /// [`Error::Logon`] when the broker cannot be started or reached.
    pub fn from_env(timeout: Duration) -> Result<Self, Error> {
        let launch = crate::launch::from_env().map_err(Error::Launch)?;
        let embedded = if launch.rank == 0 {
            let config = shmbroker_handshake::Config {
                world_size: launch.world_size,
                ..shmbroker_handshake::Config::default()
            };
            let mut listener = shmbroker_handshake::Listener::bind(&launch.socket, config)?;
            let stop = listener.stop_handle();
            let thread = std::thread::Builder::new()
                .name("shmbroker-broker".into())
                .spawn(move || {
                    let _ = listener.serve(|_| {});
                })
                .map_err(|e| Error::Launch(format!("starting the broker thread: {e}")))?;
            Some(EmbeddedBroker {
                stop,
                thread: Some(thread),
            })
        } else {
            None
        };
        let mut session = Self::connect(&launch.socket, Some(launch.rank), timeout)?;
        session.embedded = embedded;
        Ok(session)
    }

    /// Wraps a session the handshake returned: creates this rank's outbox of `outbox_bytes` bytes
    /// and publishes it to the peers through the broker.
    ///
    /// # Errors
    ///
    /// [`Error::OwnOutbox`] when the outbox cannot be created; [`Error::Logon`] when it cannot be
    /// published within `timeout`.
    pub fn from_handshake_with(
        mut inner: shmbroker_handshake::Session,
        outbox_bytes: u64,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let world = inner.world_size() as usize;
        let outbox = Outbox::create(inner.rank(), outbox_bytes).map_err(Error::OwnOutbox)?;
        if world > 1 {
            inner.publish_outbox(outbox.fd(), timeout)?;
        }
        let cpus = cpus_allowed();
        let waiting = match spin_from_env()? {
            Some(spins) => Waiting::Spin(spins),
            None => Waiting::for_load(world, cpus),
        };
        let mut session = Self {
            inner,
            timeout: DEFAULT_TIMEOUT,
            seq: 0,
            unread: vec![VecDeque::new(); world],
            owed_slots: vec![0; world],
            sent_to: vec![0; world],
            received_from: vec![0; world],
            outbox,
            outboxes: vec![None; world],
            chunk_blocks: HashSet::new(),
            acks_due: vec![VecDeque::new(); world],
            view_acks: ViewAcks::default(),
            fd_transport: FdTransport::Auto,
            fd_transport_reported: false,
            cpus,
            waiting,
            embedded: None,
        };
        session.set_waiting(waiting);
        Ok(session)
    }

    /// This worker's rank.
    #[must_use]
    pub fn rank(&self) -> u32 {
        self.inner.rank()
    }

    /// Ranks in the world.
    #[must_use]
    pub fn world_size(&self) -> u32 {
        self.inner.world_size()
    }

    /// Sets the deadline every call without `_timeout` uses.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// How every wait of this session spends its time before parking. By default
    /// [`Waiting::Adaptive`], crowded when the world has more ranks than this process has CPUs
    /// ([`Self::cpus`]; every rank is taken to be runnable), unless [`SPIN_VAR`] fixes it.
    #[must_use]
    pub fn waiting(&self) -> Waiting {
        self.waiting
    }

    /// Sets how every wait of this session waits (see [`shmbroker_queues::Waiting`]).
    pub fn set_waiting(&mut self, waiting: Waiting) {
        self.waiting = waiting;
        for peer in self.peers() {
            if let Some(link) = self.inner.link(peer) {
                link.to.set_waiting(waiting);
                link.from.set_waiting(waiting);
            }
        }
    }

    /// Every wait re-checks up to `spins` times, then parks, with no yielding and no adapting:
    /// `set_waiting(Waiting::Spin(spins))`. 0 parks at once, `u32::MAX` spins until the deadline.
    pub fn set_spin_limit(&mut self, spins: u32) {
        self.set_waiting(Waiting::Spin(spins));
    }

    /// The CPUs this process was allowed to run on at logon (`sched_getaffinity`), against which
    /// the world size decides whether waits run crowded.
    #[must_use]
    pub fn cpus(&self) -> usize {
        self.cpus
    }

    /// The handshake-level session: raw rings and the broker socket.
    pub fn raw(&mut self) -> &mut shmbroker_handshake::Session {
        &mut self.inner
    }

    /// The size of this rank's outbox in bytes (its header included; see
    /// [`Self::max_loan_bytes`]).
    #[must_use]
    pub fn outbox_bytes(&self) -> u64 {
        self.outbox.size()
    }

    /// The largest loan this rank's outbox can ever make ([`Self::loan`]): its capacity, at most
    /// 4 GiB - 1 (a reference's length is 32 bits).
    #[must_use]
    pub fn max_loan_bytes(&self) -> usize {
        let most = self.outbox.capacity().min(u64::from(u32::MAX));
        usize::try_from(most).unwrap_or(usize::MAX)
    }

    /// Blocks of this rank's outbox sent and still awaiting some peer's acknowledgement.
    #[must_use]
    pub fn outbox_blocks_owed(&self) -> usize {
        self.outbox.blocks_owed()
    }

    /// Waits (up to `timeout`) until the broker has passed on everything of every peer this
    /// session will need from it: each peer's process (for liveness and fd exchange) and outbox
    /// (for large messages and loans), mapping the outboxes. From then on, only fd relays need
    /// the broker; a broker that dies afterwards takes nothing else with it. Every peer must have
    /// logged on.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] naming the first peer still missing; [`Error::BrokerLost`] if the
    /// broker died first; [`Error::PeerLost`]; [`Error::Outbox`] for an outbox that is not one.
    pub fn await_peers(&mut self, timeout: Duration) -> Result<(), Error> {
        let deadline = Deadline::new("await_peers", timeout);
        let peers: Vec<u32> = self.peers().collect();
        for (at, &peer) in peers.iter().enumerate() {
            let arrived = self
                .inner
                .peer_process(peer, deadline.left())
                .map_err(|error| handshake_failed(peer, error, &deadline))
                .and_then(|_| self.peer_outbox(peer, &deadline));
            if let Err(Error::Timeout {
                mut waiting_for, ..
            }) = arrived
            {
                // Name every peer not logged on yet, not only the first.
                waiting_for.extend(
                    peers[at + 1..]
                        .iter()
                        .filter(|&&later| self.inner.peer_process(later, Duration::ZERO).is_err()),
                );
                return Err(self.timed_out_waiting(&deadline, waiting_for));
            }
            arrived?;
        }
        Ok(())
    }

    /// Takes in every acknowledgement peers have sent so far (and sends those this rank owes),
    /// without waiting: afterwards [`Self::outbox_blocks_owed`] is current.
    ///
    /// # Errors
    ///
    /// [`Error::Protocol`] for an acknowledgement this rank did not expect; [`Error::Corrupted`].
    pub fn poll_acks(&mut self) -> Result<(), Error> {
        self.flush_view_acks()?;
        for peer in self.peers() {
            self.drain_from(peer)?;
            self.flush_acks(peer)?;
        }
        Ok(())
    }

    /// The error for a call whose deadline passed waiting for `peer`: who is gone if someone is
    /// (a departure that raced the deadline), otherwise the timeout.
    fn timed_out(&self, deadline: &Deadline, peer: u32) -> Error {
        self.timed_out_waiting(deadline, vec![peer])
    }

    /// [`Self::timed_out`] for a call still waiting for every rank of `waiting_for`.
    fn timed_out_waiting(&self, deadline: &Deadline, waiting_for: Vec<u32>) -> Error {
        match waiting_for
            .iter()
            .find_map(|&peer| self.inner.departure(peer))
        {
            Some(departure) => departure_error(departure),
            None => deadline.timed_out(waiting_for),
        }
    }

    fn peers(&self) -> impl Iterator<Item = u32> + use<> {
        let rank = self.rank();
        (0..self.world_size()).filter(move |&peer| peer != rank)
    }

    /// The rings to and from `peer` (a rank other than this one; callers check).
    fn link(&mut self, peer: u32) -> Result<&mut shmbroker_handshake::Link, Error> {
        self.inner
            .link(peer)
            .ok_or_else(|| Error::Misuse(format!("rank {peer} has no link to this rank")))
    }

    fn check_rank(&self, rank: u32) -> Result<(), Error> {
        if rank < self.world_size() {
            Ok(())
        } else {
            Err(Error::RankOutOfRange {
                rank,
                world_size: self.world_size(),
            })
        }
    }

    fn check_peer(&self, rank: u32) -> Result<(), Error> {
        self.check_rank(rank)?;
        if rank == self.rank() {
            return Err(Error::Misuse(format!("rank {rank} cannot message itself")));
        }
        Ok(())
    }

    fn next_seq(&mut self) -> u64 {
        let seq = self.seq;
        self.seq += 1;
        seq
    }

    /// Sends one single-slot message to `peer` (fd tickets).
    fn send_message(
        &mut self,
        peer: u32,
        outgoing: Message,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        self.send_slots(peer, std::slice::from_ref(&outgoing), deadline)
    }

    // -----------------------------------------------------------------------------------------
    // Collectives

    /// Returns once every rank has entered the barrier.
    ///
    /// # Errors
    ///
    /// [`Error::PeerLost`], [`Error::Timeout`], [`Error::CollectiveMismatch`].
    pub fn barrier(&mut self) -> Result<(), Error> {
        self.barrier_timeout(self.timeout)
    }

    /// [`Self::barrier`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::barrier`].
    pub fn barrier_timeout(&mut self, timeout: Duration) -> Result<(), Error> {
        let deadline = Deadline::new("barrier", timeout);
        let seq = self.next_seq();
        let world = self.world_size();
        if world <= FLAT_BARRIER_MAX {
            let arrival = message(kind::BARRIER, seq, 0, [0; shmbroker_bindings::INLINE_BYTES]);
            for peer in self.peers() {
                self.send_message(peer, arrival, &deadline)?;
            }
            let peers: Vec<u32> = self.peers().collect();
            for (at, &peer) in peers.iter().enumerate() {
                if let Err(error) = self.recv_collective(peer, kind::BARRIER, seq, &deadline) {
                    let expect = Expect::Collective {
                        op: kind::BARRIER,
                        seq,
                    };
                    return Err(self.still_missing(error, &peers[at + 1..], expect, &deadline));
                }
            }
            return Ok(());
        }
        // Dissemination: in round k, tell rank + 2^k and hear from rank - 2^k (mod the world).
        // After round k every rank has heard, directly or through others, from the 2^(k+1) ranks
        // before it, so after ceil(log2(world)) rounds from all of them. 2^k < world in every
        // round, so each round has a peer of its own, and the round travels in `len`.
        let rank = self.rank();
        let mut distance = 1;
        let mut round = 0;
        while distance < world {
            let to = (rank + distance) % world;
            let from = (rank + world - distance) % world;
            let arrival = message(kind::BARRIER, seq, 0, round_inline(round));
            self.send_message(to, arrival, &deadline)?;
            let heard = self.recv_collective(from, kind::BARRIER, seq, &deadline)?;
            if heard.inline != arrival.inline {
                return Err(Error::Protocol {
                    peer: from,
                    detail: format!(
                        "barrier #{seq}: expected the message of dissemination round {round}, \
                         found another"
                    ),
                });
            }
            distance *= 2;
            round += 1;
        }
        Ok(())
    }

    /// Every rank's `data` (any size, sizes may differ), indexed by rank.
    ///
    /// # Errors
    ///
    /// [`Error::PeerLost`], [`Error::Timeout`], [`Error::CollectiveMismatch`],
    /// [`Error::Protocol`], [`Error::Outbox`].
    pub fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        self.all_gather_timeout(data, self.timeout)
    }

    /// [`Self::all_gather`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::all_gather`].
    pub fn all_gather_timeout(
        &mut self,
        data: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, Error> {
        let deadline = Deadline::new("all_gather", timeout);
        let seq = self.next_seq();
        let mut incoming = self.receive_from_every_peer(kind::ALL_GATHER, seq);
        self.transfer(
            kind::ALL_GATHER,
            seq,
            Some((data, Targets::Peers)),
            &mut incoming,
            &deadline,
        )?;
        self.gathered(data, incoming)
    }

    /// A receive into a vector from every peer, of collective `op` number `seq`.
    fn receive_from_every_peer(&self, op: u32, seq: u64) -> Vec<Incoming<'static>> {
        let expect = Expect::Collective { op, seq };
        self.peers()
            .map(|peer| Incoming::new(peer, expect, Sink::Vec(Vec::new())))
            .collect()
    }

    /// Every rank's data by rank: this rank's `data` and what each of `incoming` received.
    fn gathered(&self, data: &[u8], incoming: Vec<Incoming<'_>>) -> Result<Vec<Vec<u8>>, Error> {
        let mut gathered = vec![Vec::new(); self.world_size() as usize];
        gathered[self.rank() as usize] = data.to_vec();
        for incoming in incoming {
            let peer = incoming.peer;
            if let (_, Sink::Vec(bytes)) = incoming.finish()? {
                gathered[peer as usize] = bytes;
            }
        }
        Ok(gathered)
    }

    /// Every rank's `data`, all of one size, into `out` in rank order (`out` must hold exactly
    /// `world_size * data.len()` bytes), with no allocation per peer.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when `out` has another length; [`Error::Protocol`] when a peer's
    /// contribution has another size; otherwise as for [`Self::all_gather`].
    pub fn all_gather_into(&mut self, data: &[u8], out: &mut [u8]) -> Result<(), Error> {
        let expected = data.len() * self.world_size() as usize;
        if out.len() != expected {
            return Err(Error::Misuse(format!(
                "all_gather_into needs a buffer of {expected} bytes, got {}",
                out.len()
            )));
        }
        let deadline = Deadline::new("all_gather", self.timeout);
        let seq = self.next_seq();
        let expect = Expect::Collective {
            op: kind::ALL_GATHER,
            seq,
        };
        let rank = self.rank();
        if self.world_size() > FLAT_GATHER_MAX && data.len() <= BRUCK_MAX_BYTES {
            return self.bruck_all_gather(data, out, seq, &deadline);
        }
        // Small: sent at once, then each peer's part received in turn, with no allocation.
        if self.send_if_eager(kind::ALL_GATHER, seq, data, Targets::Peers, &deadline)? {
            let mut rest = out;
            for peer in 0..self.world_size() {
                let (slot, tail) = std::mem::take(&mut rest).split_at_mut(data.len());
                rest = tail;
                if peer == rank {
                    slot.copy_from_slice(data);
                    continue;
                }
                let mut incoming = Incoming::new(peer, expect, Sink::Slice(slot));
                self.complete(&mut incoming, &deadline)?;
                check_part(incoming, data.len())?;
            }
            return Ok(());
        }
        let mut incoming = Vec::with_capacity(self.world_size() as usize);
        let mut rest = out;
        for peer in 0..self.world_size() {
            let (slot, tail) = std::mem::take(&mut rest).split_at_mut(data.len());
            rest = tail;
            if peer == rank {
                slot.copy_from_slice(data);
            } else {
                incoming.push(Incoming::new(peer, expect, Sink::Slice(slot)));
            }
        }
        self.transfer(
            kind::ALL_GATHER,
            seq,
            Some((data, Targets::Peers)),
            &mut incoming,
            &deadline,
        )?;
        for incoming in incoming {
            check_part(incoming, data.len())?;
        }
        Ok(())
    }

    /// [`Self::all_gather_into`] by Bruck's algorithm: ceil(log2(world)) rounds, in round k
    /// sending the 2^k parts gathered so far (at most what is still missing) to rank - 2^k and
    /// receiving as many from rank + 2^k, so each rank sends O(log n) messages instead of n - 1.
    /// Parts are gathered in `out` in rotated order (this rank's first), then rotated into rank
    /// order.
    /// Every round has a peer of its own (2^k < world), so the collective's sequence number tells
    /// its messages apart; each round's length is checked.
    fn bruck_all_gather(
        &mut self,
        data: &[u8],
        out: &mut [u8],
        seq: u64,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let (rank, world) = (self.rank(), self.world_size());
        let part = data.len();
        let expect = Expect::Collective {
            op: kind::ALL_GATHER,
            seq,
        };
        // Gathered into `out` rotated, with no allocation: part i is rank (rank + i) % world's.
        let rotated = out;
        rotated[..part].copy_from_slice(data);
        let mut have = 1u32;
        while have < world {
            let count = have.min(world - have);
            let to = (rank + world - have) % world;
            let from = (rank + have) % world;
            let (gathered, missing) = rotated.split_at_mut(have as usize * part);
            let bytes = count as usize * part;
            let mut incoming = [Incoming::new(
                from,
                expect,
                Sink::Slice(&mut missing[..bytes]),
            )];
            self.transfer(
                kind::ALL_GATHER,
                seq,
                Some((&gathered[..bytes], Targets::One(to))),
                &mut incoming,
                deadline,
            )?;
            let [incoming] = incoming;
            check_part(incoming, bytes)?;
            have += count;
        }
        // Part i moves to (rank + i) % world: rank order.
        rotated.rotate_right(rank as usize * part);
        Ok(())
    }

    /// Every rank's `value`, indexed by rank.
    ///
    /// # Errors
    ///
    /// As for [`Self::all_gather`], and [`Error::Protocol`] if a peer's value has another size.
    pub fn all_gather_pod<T: bytemuck::Pod>(&mut self, value: &T) -> Result<Vec<T>, Error> {
        let deadline = Deadline::new("all_gather", self.timeout);
        self.all_gather_pod_with(value, &deadline)
    }

    /// [`Self::all_gather_pod`] within an existing deadline (for collectives built on it).
    fn all_gather_pod_with<T: bytemuck::Pod>(
        &mut self,
        value: &T,
        deadline: &Deadline,
    ) -> Result<Vec<T>, Error> {
        let gathered = self.all_gather_timeout(bytemuck::bytes_of(value), deadline.left())?;
        (0..)
            .zip(gathered)
            .map(|(peer, bytes)| {
                bytemuck::try_pod_read_unaligned(&bytes)
                    .map_err(|_| wrong_size(peer, bytes.len() as u64, size_of::<T>()))
            })
            .collect()
    }

    /// `root`'s data on every rank: the root passes `Some(data)`, the others `None`.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when the root passes `None` or another rank `Some`; otherwise as for
    /// [`Self::all_gather`].
    pub fn broadcast(&mut self, root: u32, data: Option<&[u8]>) -> Result<Vec<u8>, Error> {
        self.broadcast_timeout(root, data, self.timeout)
    }

    /// [`Self::broadcast`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::broadcast`].
    pub fn broadcast_timeout(
        &mut self,
        root: u32,
        data: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Vec<u8>, Error> {
        self.check_root(root, data.is_some(), "broadcast")?;
        let deadline = Deadline::new("broadcast", timeout);
        let seq = self.next_seq();
        if self.world_size() > FLAT_BROADCAST_MAX {
            return self.tree_broadcast(root, data, seq, &deadline);
        }
        if let Some(data) = data {
            self.transfer(
                kind::BROADCAST,
                seq,
                Some((data, Targets::Peers)),
                &mut [],
                &deadline,
            )?;
            return Ok(data.to_vec());
        }
        let expect = Expect::Collective {
            op: kind::BROADCAST,
            seq,
        };
        let mut incoming = [Incoming::new(root, expect, Sink::Vec(Vec::new()))];
        self.transfer(kind::BROADCAST, seq, None, &mut incoming, &deadline)?;
        let [incoming] = incoming;
        match incoming.finish()? {
            (_, Sink::Vec(bytes)) => Ok(bytes),
            (_, Sink::Slice(_)) => unreachable!("a vector sink stays a vector"),
        }
    }

    /// [`Self::broadcast`] down a binomial tree rooted at `root` (see [`FLAT_BROADCAST_MAX`]).
    /// Each rank first hears one slot from its parent saying where the data is ([`Route`]): in
    /// that slot, in the next message from the parent (up to the eager limit), or in the root's
    /// outbox, streamed to every rank at once as in a flat broadcast (larger data: forwarding it
    /// would copy it once per level). The rank passes the same word to its children before it
    /// takes the data from the root, so no rank waits on another's large transfer.
    fn tree_broadcast(
        &mut self,
        root: u32,
        data: Option<&[u8]>,
        seq: u64,
        deadline: &Deadline,
    ) -> Result<Vec<u8>, Error> {
        let tree = BinomialTree::new(self.rank(), root, self.world_size());
        // Largest subtree first: it has the most levels still to go.
        let children: Vec<u32> = tree.children().map(|(child, _)| child).rev().collect();
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
                let parent = tree.parent().expect("only the root has data");
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
                self.transfer(
                    kind::BROADCAST,
                    seq,
                    Some((&bytes, Targets::One(child))),
                    &mut [],
                    deadline,
                )?;
            }
        }
        match (route, data) {
            (Route::Root, Some(data)) => {
                self.transfer(
                    kind::BROADCAST,
                    seq,
                    Some((data, Targets::Peers)),
                    &mut [],
                    deadline,
                )?;
                Ok(bytes)
            }
            (Route::Root, None) => self.receive_vec(root, expect, deadline),
            _ => Ok(bytes),
        }
    }

    /// The next group `expect` selects from `peer`, whole, into a vector.
    fn receive_vec(
        &mut self,
        peer: u32,
        expect: Expect,
        deadline: &Deadline,
    ) -> Result<Vec<u8>, Error> {
        let mut incoming = [Incoming::new(peer, expect, Sink::Vec(Vec::new()))];
        self.transfer(kind::BROADCAST, 0, None, &mut incoming, deadline)?;
        let [incoming] = incoming;
        match incoming.finish()? {
            (_, Sink::Vec(bytes)) => Ok(bytes),
            (_, Sink::Slice(_)) => unreachable!("a vector sink stays a vector"),
        }
    }

    /// Every rank's `data` (any size, sizes may differ) at `root`, indexed by rank: `Some` at the
    /// root, `None` elsewhere.
    ///
    /// # Errors
    ///
    /// As for [`Self::all_gather`], and [`Error::RankOutOfRange`] for a bad root.
    pub fn gather(&mut self, root: u32, data: &[u8]) -> Result<Option<Vec<Vec<u8>>>, Error> {
        self.gather_timeout(root, data, self.timeout)
    }

    /// [`Self::gather`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::gather`].
    pub fn gather_timeout(
        &mut self,
        root: u32,
        data: &[u8],
        timeout: Duration,
    ) -> Result<Option<Vec<Vec<u8>>>, Error> {
        self.check_rank(root)?;
        let deadline = Deadline::new("gather", timeout);
        let seq = self.next_seq();
        if self.world_size() > FLAT_GATHER_MAX {
            return self.tree_gather(root, data, seq, &deadline);
        }
        if root != self.rank() {
            self.transfer(
                kind::GATHER,
                seq,
                Some((data, Targets::One(root))),
                &mut [],
                &deadline,
            )?;
            return Ok(None);
        }
        let mut incoming = self.receive_from_every_peer(kind::GATHER, seq);
        self.transfer(kind::GATHER, seq, None, &mut incoming, &deadline)?;
        self.gathered(data, incoming).map(Some)
    }

    /// [`Self::gather`] up a binomial tree rooted at `root` (see [`FLAT_GATHER_MAX`]), so the
    /// root receives ceil(log2(n)) messages instead of n - 1. Each rank sends its parent one
    /// bundle for its subtree (see [`Bundle`]): parts of at most [`TREE_PART_MAX`] bytes travel
    /// in it; a larger part is only marked there and goes straight to the root afterwards, once
    /// (forwarding it would copy it once per level). Sizes may differ between ranks, so only the
    /// world size picks the algorithm and each rank picks its own part's path.
    fn tree_gather(
        &mut self,
        root: u32,
        data: &[u8],
        seq: u64,
        deadline: &Deadline,
    ) -> Result<Option<Vec<Vec<u8>>>, Error> {
        let (rank, world) = (self.rank(), self.world_size());
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
            let bytes = self.receive_vec(child, expect, deadline)?;
            bundle.append(child, parts, &bytes)?;
        }
        if let Some(parent) = tree.parent() {
            self.transfer(
                kind::GATHER,
                seq,
                Some((&bundle.encode(), Targets::One(parent))),
                &mut [],
                deadline,
            )?;
            if data.len() > TREE_PART_MAX {
                self.transfer(
                    kind::GATHER,
                    seq,
                    Some((data, Targets::One(root))),
                    &mut [],
                    deadline,
                )?;
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
                None => direct.push(Incoming::new(peer, expect, Sink::Vec(Vec::new()))),
            }
        }
        self.transfer(kind::GATHER, seq, None, &mut direct, deadline)?;
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
                gathered[peer as usize] = bytes;
            }
        }
        Ok(Some(gathered))
    }

    /// Checks a rooted call: `root` in range, and data given exactly at the root.
    fn check_root(&self, root: u32, has_data: bool, op: &str) -> Result<(), Error> {
        self.check_rank(root)?;
        match (root == self.rank(), has_data) {
            (true, false) => Err(Error::Misuse(format!(
                "rank {root} is the {op} root but gave no data"
            ))),
            (false, true) => Err(Error::Misuse(format!(
                "rank {} gave data to a {op} rooted at rank {root}",
                self.rank()
            ))),
            _ => Ok(()),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Point to point

    /// Sends `data` (any size) to `rank`; it is received, in order, by that rank's
    /// [`Self::recv`] from this one. Returns once the data is copied out of `data` (into the
    /// ring, or into this rank's outbox).
    ///
    /// # Errors
    ///
    /// [`Error::RankOutOfRange`], [`Error::Misuse`] for this rank's own, [`Error::PeerLost`],
    /// [`Error::Timeout`].
    pub fn send(&mut self, rank: u32, data: &[u8]) -> Result<(), Error> {
        self.send_to_timeout(rank, data, self.timeout)
    }

    /// [`Self::send`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::send`].
    pub fn send_to_timeout(
        &mut self,
        rank: u32,
        data: &[u8],
        timeout: Duration,
    ) -> Result<(), Error> {
        self.check_peer(rank)?;
        let tag = self.sent_to[rank as usize];
        if self.send_one_slot(rank, tag, data)? {
            self.sent_to[rank as usize] += 1;
            return Ok(());
        }
        let deadline = Deadline::new("send", timeout);
        self.transfer(
            kind::SEND,
            tag,
            Some((data, Targets::One(rank))),
            &mut [],
            &deadline,
        )?;
        self.sent_to[rank as usize] += 1;
        Ok(())
    }

    /// The next message `rank` sent this rank with [`Self::send`] (or lent with
    /// [`Self::send_loan`], copied).
    ///
    /// # Errors
    ///
    /// As for [`Self::send`], and [`Error::Protocol`] or [`Error::Outbox`] for bad bytes.
    pub fn recv(&mut self, rank: u32) -> Result<Vec<u8>, Error> {
        self.recv_from_timeout(rank, self.timeout)
    }

    /// [`Self::recv`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::recv`].
    pub fn recv_from_timeout(&mut self, rank: u32, timeout: Duration) -> Result<Vec<u8>, Error> {
        match self.recv_with(rank, Sink::Vec(Vec::new()), timeout)? {
            (_, Sink::Vec(bytes)) => Ok(bytes),
            (_, Sink::Slice(_)) => unreachable!("a vector sink stays a vector"),
        }
    }

    /// Like [`Self::recv`], into `buffer`, with no allocation; returns the message's length.
    ///
    /// # Errors
    ///
    /// [`Error::BufferTooSmall`] for a longer message (received to its end and dropped, so the
    /// next one is intact); otherwise as for [`Self::recv`].
    pub fn recv_into(&mut self, rank: u32, buffer: &mut [u8]) -> Result<usize, Error> {
        self.recv_into_timeout(rank, buffer, self.timeout)
    }

    /// [`Self::recv_into`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::recv_into`].
    pub fn recv_into_timeout(
        &mut self,
        rank: u32,
        buffer: &mut [u8],
        timeout: Duration,
    ) -> Result<usize, Error> {
        let (len, _) = self.recv_with(rank, Sink::Slice(buffer), timeout)?;
        Ok(len as usize)
    }

    fn recv_with<'a>(
        &mut self,
        rank: u32,
        sink: Sink<'a>,
        timeout: Duration,
    ) -> Result<(u64, Sink<'a>), Error> {
        self.check_peer(rank)?;
        let deadline = Deadline::new("recv", timeout);
        let expect = Expect::Send {
            tag: self.received_from[rank as usize],
        };
        let mut incoming = [Incoming::new(rank, expect, sink)];
        self.flush_view_acks()?;
        self.take_direct(&mut incoming[0], &deadline)?;
        if !incoming[0].is_done() {
            self.transfer(kind::SEND, 0, None, &mut incoming, &deadline)?;
        }
        self.received_from[rank as usize] += 1;
        let [incoming] = incoming;
        incoming.finish()
    }

    // -----------------------------------------------------------------------------------------
    // Loans: zero-copy hand-off

    /// A writable buffer of `len` bytes in this rank's outbox, to fill and hand to peers by
    /// reference with [`Self::send_loan`] or [`Self::broadcast_loan`]. Waits (up to the session's
    /// deadline) while the outbox is full of buffers peers have not let go of yet. Dropped unsent,
    /// it goes back to the outbox.
    ///
    /// # Errors
    ///
    /// [`Error::OwnOutbox`] when `len` is more than the outbox can ever hold
    /// ([`Self::max_loan_bytes`]); [`Error::Timeout`]; [`Error::Protocol`] or
    /// [`Error::Corrupted`] from what peers sent meanwhile.
    pub fn loan(&mut self, len: usize) -> Result<Loan, Error> {
        let deadline = Deadline::new("loan", self.timeout);
        self.flush_view_acks()?;
        loop {
            if let Some(loan) = self.outbox.try_loan(len).map_err(Error::OwnOutbox)? {
                return Ok(loan);
            }
            if deadline.left().is_zero() {
                let waiting = self
                    .peers()
                    .max_by_key(|&peer| self.outbox.owed_by(peer))
                    .unwrap_or(self.rank());
                return Err(self.timed_out(&deadline, waiting));
            }
            self.poll_acks()?;
            std::thread::yield_now();
        }
    }

    /// Hands `loan` to `rank` by reference: it receives it with [`Self::recv_loan`] (or copies it
    /// with [`Self::recv`]). The buffer comes back to this rank's outbox when `rank` is done.
    ///
    /// # Errors
    ///
    /// [`Error::OwnOutbox`] for a loan of another session; otherwise as for [`Self::send`].
    pub fn send_loan(&mut self, rank: u32, loan: Loan) -> Result<(), Error> {
        self.check_peer(rank)?;
        let deadline = Deadline::new("send_loan", self.timeout);
        let tag = self.sent_to[rank as usize];
        self.lend(kind::SEND, tag, loan, &[rank], &deadline)?;
        self.sent_to[rank as usize] += 1;
        Ok(())
    }

    /// Sends the reference to `loan` to `targets` as operation `op` number `tag`.
    fn lend(
        &mut self,
        op: u32,
        tag: u64,
        loan: Loan,
        targets: &[u32],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        self.flush_view_acks()?;
        let receivers = Outbox::receivers(targets.iter().copied());
        let lent = self
            .outbox
            .send_loan(loan, receivers)
            .map_err(Error::OwnOutbox)?;
        let mut inline = [0u8; shmbroker_bindings::INLINE_BYTES];
        inline[..size_of::<PayloadRef>()].copy_from_slice(bytemuck::bytes_of(&lent));
        let header = message(op | kind::LOAN, tag, 0, inline);
        for &peer in targets {
            self.send_message(peer, header, deadline)?;
        }
        Ok(())
    }

    /// The next message `rank` sent this rank, which must be a loan, as a read-only view of the
    /// lender's buffer; dropping the view gives the buffer back to its owner.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when the next message from `rank` is not a loan (it stays queued, and
    /// [`Self::recv`] takes it); otherwise as for [`Self::recv`].
    pub fn recv_loan(&mut self, rank: u32) -> Result<LoanView, Error> {
        self.check_peer(rank)?;
        let deadline = Deadline::new("recv_loan", self.timeout);
        let expect = Expect::Send {
            tag: self.received_from[rank as usize],
        };
        let view = self.take_loan(rank, expect, &deadline)?;
        self.received_from[rank as usize] += 1;
        Ok(view)
    }

    /// `root`'s loan on every other rank, by reference: the root passes `Some(loan)` and gets
    /// `None`; the others pass `None` and get a view of the root's buffer.
    ///
    /// # Errors
    ///
    /// As for [`Self::broadcast`] and [`Self::recv_loan`].
    pub fn broadcast_loan(
        &mut self,
        root: u32,
        loan: Option<Loan>,
    ) -> Result<Option<LoanView>, Error> {
        self.check_root(root, loan.is_some(), "broadcast_loan")?;
        let deadline = Deadline::new("broadcast_loan", self.timeout);
        let seq = self.next_seq();
        if let Some(loan) = loan {
            let targets: Vec<u32> = self.peers().collect();
            self.lend(kind::BROADCAST, seq, loan, &targets, &deadline)?;
            return Ok(None);
        }
        let expect = Expect::Collective {
            op: kind::BROADCAST,
            seq,
        };
        self.take_loan(root, expect, &deadline).map(Some)
    }
}

/// The session error for a handshake call about `peer` that failed within `deadline`.
fn handshake_failed(peer: u32, error: shmbroker_handshake::Error, deadline: &Deadline) -> Error {
    match error {
        shmbroker_handshake::Error::Timeout { .. } => deadline.timed_out(vec![peer]),
        shmbroker_handshake::Error::PeerLost { rank, .. } => Error::PeerLost { rank },
        shmbroker_handshake::Error::BrokerLost { .. } => Error::BrokerLost,
        other => Error::Logon(other),
    }
}

/// The error for a peer that is gone, as the handshake's watcher established it.
fn departure_error(departure: shmbroker_handshake::Departure) -> Error {
    match departure {
        shmbroker_handshake::Departure::Lost { rank } => Error::PeerLost { rank },
        shmbroker_handshake::Departure::Left { rank } => Error::PeerLeft { rank },
        shmbroker_handshake::Departure::BrokerLost => Error::BrokerLost,
    }
}

/// Checks that `incoming` brought exactly `due` bytes (a part of an `all_gather_into`).
fn check_part(incoming: Incoming<'_>, due: usize) -> Result<(), Error> {
    let peer = incoming.peer;
    let (len, _) = incoming.finish().map_err(|error| match error {
        Error::BufferTooSmall { needed, .. } => wrong_size(peer, needed, due),
        other => other,
    })?;
    if len == due as u64 {
        Ok(())
    } else {
        Err(wrong_size(peer, len, due))
    }
}

fn wrong_size(peer: u32, found: u64, due: usize) -> Error {
    Error::Protocol {
        peer,
        detail: format!("gave {found} bytes where {due} were due"),
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
    fn spin_values_are_numbers_or_forever() {
        assert_eq!(parse_spins("0").unwrap(), 0);
        assert_eq!(parse_spins(" 5000 ").unwrap(), 5000);
        assert_eq!(parse_spins("forever").unwrap(), u32::MAX);
        for bad in ["", "-1", "lots", "1e3"] {
            let error = parse_spins(bad).unwrap_err().to_string();
            assert!(error.contains(SPIN_VAR) && error.contains(bad), "{error}");
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

    #[test]
    fn cpus_allowed_counts_this_process_cpus() {
        let cpus = cpus_allowed();
        assert!(cpus >= 1);
        assert!(cpus <= std::thread::available_parallelism().unwrap().get());
    }
}
