//! The transport's state: what a session moves data with, kept apart from what it knows about its
//! job (the connection, teams and groups, departures, the deadline).
//!
//! It holds the links to every peer, this rank's outbox and its status words, and the blocks of
//! pipelined chunks not yet acknowledged. It holds a send that an interrupt set aside, and loan
//! views' acknowledgements ([`ViewAcks`]). It says how waits spin and park, how fds move
//! ([`FdTransport`]), and holds the readiness set that `recv_any` waits on ([`Readiness`]). It
//! keeps buffers between calls: the scratch space of small reductions and the direct slots of
//! eager messages.
//!
//! The engine is this module and its children: `peer` (a link's state), `outgoing` (a pipelined
//! send on its way out), `send`, `stepwise` (a send in steps, for a split session), `receive`,
//! `acks`, `loans` and `any` (a receive from any peer). Only they read the engine's fields,
//! which are private to this module; the rest of the session moves data through the calls they
//! define, and reads the rest through the methods here.
//!
//! `engine.rs` imports none of the session's modules that run calls (see the module map in
//! `session`): only the state it is made of (`peer`, `outgoing`, `publisher`).
//!
//! # Why the paths are the session's methods
//!
//! The paths are `impl Session` blocks, not `Engine`'s methods, because they take in what the
//! session learns of its job as they go, and that changes the job's state and the engine's
//! together, in the middle of a wait:
//! - a send that finds a peer's ring closed forgets that peer's blocks and, in a collective,
//!   closes the streams the departure ends (`departures`), before it gives back what its
//!   transfer still held;
//! - a point-to-point receive that meets a collective message cut off by a death closes the
//!   dead rank's streams, then looks at the queue again (`receive::Session::find_send`);
//! - a receive from any peer takes on a replacement of a rank whose death it has reported, as
//!   it looks for a sender (`rejoin`).
//!
//! For the same reason the sending and the receiving paths are not two halves that two threads
//! could each hold. Acknowledgements of what a receive took go out on the ring that sends
//! write, and a send that waits for room takes in what its peers sent meanwhile, or two ranks
//! sending to each other would both wait out their deadlines. Threads share a session through
//! `Session::split` instead: its halves share the session behind one mutex, which neither holds
//! while it waits, so a receive never waits behind a send (see `split`).

pub(super) mod acks;
pub(super) mod any;
pub(super) mod loans;
pub(super) mod outgoing;
pub(super) mod peer;
pub(super) mod receive;
pub(super) mod send;
pub(super) mod stepwise;

use super::publisher::Publisher;
use crate::error::Error;
use outgoing::Outgoing;
use peer::Peer;
use shmbroker_allocator::Outbox;
use shmbroker_bindings::PayloadRef;
use shmbroker_handshake::Departure;
use shmbroker_queues::{ReadySet, Waiting};
use std::collections::VecDeque;

/// 64 bytes of the reductions' scratch space, aligned to 64 so that any element type up to that
/// alignment can be laid over it.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
pub(super) struct ScratchLine(pub(super) [u8; 64]);

/// The transport's state (see the module doc).
#[derive(Debug)]
pub(super) struct Engine {
    /// One per rank of the world, indexed by rank (this rank's own stays unused).
    peers: Vec<Peer>,
    /// This rank's outbox: large data and loans go out through it.
    outbox: Outbox,
    /// What this rank says it is doing, in its outbox's status words (see `status`).
    publisher: std::sync::Arc<Publisher>,
    /// Offsets of outbox blocks holding chunks of pipelined transfers, not yet acknowledged.
    chunk_blocks: shmbroker_allocator::offsets::OffsetSet,
    /// A point-to-point send an interrupt ended after part of it went out, to be finished by the
    /// next calls (see `send::Session::set_aside_send`).
    set_aside: Option<Outgoing<'static>>,
    /// Acknowledgements of dropped loan views.
    view_acks: ViewAcks,
    /// How fds move (the choice), and how they have moved so far (see
    /// [`super::Session::fd_transport_used`]).
    fd_transport: FdTransport,
    fd_transport_used: Option<FdTransport>,
    /// CPUs this process may run on (`sched_getaffinity`), at logon.
    cpus: usize,
    /// How every ring of this session waits.
    waiting: Waiting,
    /// Receiving from any peer: the readiness eventfd's state and the round-robin position.
    any: Readiness,
    /// Pieces of all-reduces whose contribution peers read where it lay (see
    /// [`super::Session::symmetric`]).
    read_in_place: u64,
    /// Scratch space of small reductions (every rank's contribution, or a copy of this rank's):
    /// kept between calls (see `reductions::Session::with_scratch`).
    scratch: Vec<ScratchLine>,
    /// Where an eager message's continuation slots land when taken straight from the ring
    /// (see `receive::Session::take_eager_direct`): kept between calls.
    direct_slots: Vec<shmbroker_bindings::Message>,
}

impl Engine {
    /// The state of a fresh session of `world` ranks sending through `outbox`.
    pub(super) fn new(world: usize, outbox: Outbox, cpus: usize, waiting: Waiting) -> Self {
        Self {
            peers: (0..world as u32).map(Peer::new).collect(),
            publisher: std::sync::Arc::new(Publisher::new(outbox.status())),
            outbox,
            chunk_blocks: shmbroker_allocator::offsets::OffsetSet::default(),
            set_aside: None,
            view_acks: ViewAcks::default(),
            fd_transport: FdTransport::Auto,
            fd_transport_used: None,
            cpus,
            waiting,
            any: Readiness::new(world),
            read_in_place: 0,
            scratch: Vec::new(),
            direct_slots: Vec::new(),
        }
    }

    /// What this rank says it is doing (see `status`).
    pub(super) fn publisher(&self) -> &std::sync::Arc<Publisher> {
        &self.publisher
    }

    /// The size of this rank's outbox in bytes, its header included.
    pub(super) fn outbox_size(&self) -> u64 {
        self.outbox.size()
    }

    /// The most bytes one block (and so one loan) of this rank's outbox can have.
    pub(super) fn outbox_capacity(&self) -> u64 {
        self.outbox.capacity()
    }

    /// Blocks of this rank's outbox sent and still awaiting some peer's acknowledgement.
    pub(super) fn blocks_owed(&self) -> usize {
        self.outbox.blocks_owed()
    }

    /// The ranks (a bit each) that still owe an acknowledgement of `sent`; 0 once none does.
    pub(super) fn owed_for(&self, sent: PayloadRef) -> u64 {
        self.outbox.owed_for(sent)
    }

    /// A loan of `len` bytes of this rank's outbox, or `None` while it has no room.
    pub(super) fn try_loan(
        &mut self,
        len: usize,
    ) -> Result<Option<shmbroker_allocator::Loan>, shmbroker_allocator::Error> {
        self.outbox.try_loan(len)
    }

    /// `bytes`, which lie in this rank's outbox, lent in place to `receivers` (a mask of ranks);
    /// `None` when they do not lie there whole.
    pub(super) fn lend_in_place(&mut self, bytes: &[u8], receivers: u64) -> Option<PayloadRef> {
        self.outbox.lend_in_place(bytes, receivers)
    }

    /// [`Self::lend_in_place`] for parts of `bytes`, each to its own receivers.
    pub(super) fn lend_in_place_parts(
        &mut self,
        bytes: &[u8],
        parts: impl IntoIterator<Item = (std::ops::Range<usize>, u64)>,
    ) -> Option<Vec<PayloadRef>> {
        self.outbox.lend_in_place_parts(bytes, parts)
    }

    /// Counts one piece of an all-reduce whose contribution peers read where it lay.
    pub(super) fn note_read_in_place(&mut self) {
        self.read_in_place += 1;
    }

    /// Pieces of all-reduces whose contribution peers read where it lay.
    pub(super) fn read_in_place(&self) -> u64 {
        self.read_in_place
    }

    /// How every ring of this session waits.
    pub(super) fn waiting(&self) -> Waiting {
        self.waiting
    }

    /// Sets how the rings made from now on wait; the caller sets the rings already made.
    pub(super) fn set_waiting(&mut self, waiting: Waiting) {
        self.waiting = waiting;
    }

    /// CPUs this process may run on, at logon.
    pub(super) fn cpus(&self) -> usize {
        self.cpus
    }

    /// How fds move (the choice).
    pub(super) fn fd_transport(&self) -> FdTransport {
        self.fd_transport
    }

    /// Chooses how fds move from now on.
    pub(super) fn set_fd_transport(&mut self, transport: FdTransport) {
        self.fd_transport = transport;
    }

    /// The most relay-like transport that has moved fds so far (`Pidfd < Relay`).
    pub(super) fn fd_transport_used(&self) -> Option<FdTransport> {
        self.fd_transport_used
    }

    /// Notes that `used` moved an exchange's fds: whether that is further toward the relay than
    /// any before.
    pub(super) fn note_fd_transport_used(&mut self, used: FdTransport) -> bool {
        if Some(used) <= self.fd_transport_used {
            return false;
        }
        self.fd_transport_used = Some(used);
        true
    }

    /// The reductions' scratch space, taken for one call; given back with
    /// [`Self::keep_scratch`].
    pub(super) fn take_scratch(&mut self) -> Vec<ScratchLine> {
        std::mem::take(&mut self.scratch)
    }

    /// Keeps `lines` as the scratch space of the next call.
    pub(super) fn keep_scratch(&mut self, lines: Vec<ScratchLine>) {
        self.scratch = lines;
    }

    /// Drops from now on what `peer` sends on `stream` (its collectives are over), and what it
    /// sent there already.
    pub(super) fn close_stream(&mut self, peer: u32, stream: u32) {
        self.peers[peer as usize].inbox.close_stream(stream);
    }

    /// The references of `peer`'s messages dropped since the last call: blocks of its outbox
    /// to acknowledge.
    pub(super) fn take_dropped(&mut self, peer: u32) -> Vec<PayloadRef> {
        self.peers[peer as usize].inbox.take_dropped()
    }

    /// Gives back every block `peer` still owed an acknowledgement for.
    pub(super) fn forget_peer(&mut self, peer: u32) {
        for offset in self.outbox.forget(peer) {
            self.chunk_blocks.remove(&offset);
        }
        let peer = &mut self.peers[peer as usize];
        peer.chunks_owed = 0;
        peer.acks_due.clear();
        peer.forgotten = true;
    }

    /// Starts `rank`'s link state afresh, for its replacement (after [`Self::forget_peer`]).
    pub(super) fn renew_peer(&mut self, rank: u32) {
        self.peers[rank as usize] = Peer::new(rank);
        self.any.gone[rank as usize] = None;
    }

    /// How `rank` was found gone by a receive from any peer, if it was.
    pub(super) fn gone(&self, rank: u32) -> Option<Departure> {
        self.any.gone[rank as usize]
    }

    /// Counts a write to the readiness eventfd that no ring's registration made (a rejoin's):
    /// it is owed like any waker's.
    pub(super) fn count_signal(&mut self) {
        self.any.rings.count_signal();
    }
}

/// How file descriptors move between workers. Ordered `Auto < Pidfd < Relay`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FdTransport {
    /// `pidfd_getfd` where the kernel allows it, the broker relay where it does not.
    Auto,
    /// Only `pidfd_getfd`; an import the kernel refuses is an error.
    Pidfd,
    /// Only the broker relay.
    Relay,
}

impl std::str::FromStr for FdTransport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "pidfd" => Ok(Self::Pidfd),
            "relay" => Ok(Self::Relay),
            other => Err(format!(
                "fd transport must be auto, pidfd or relay, not {other:?}"
            )),
        }
    }
}

impl FdTransport {
    /// From `SHMBROKER_FD_TRANSPORT`, or [`FdTransport::Auto`] when it is not set.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when the variable holds anything else than `auto`, `pidfd` or `relay`.
    pub fn from_env() -> Result<Self, Error> {
        match std::env::var("SHMBROKER_FD_TRANSPORT") {
            Err(_) => Ok(Self::Auto),
            Ok(value) => value
                .parse()
                .map_err(|e: String| Error::Misuse(format!("SHMBROKER_FD_TRANSPORT: {e}"))),
        }
    }
}

/// Acknowledgements of dropped loan views, waiting for their session's next call.
///
/// Views may be dropped on any thread of this process; the queue is behind a mutex and `waiting`
/// only spares the session a lock when nothing is queued. A push stores `waiting` after it queued
/// (Release); a take that sees it unset skips this time and the acknowledgement goes with the
/// next call, so none is lost. This is an in-process protocol on the standard library's own
/// primitives: the cross-process protocols (rings, parking) are the queue crate's, loom-checked;
/// the outboxes add none (their ledger is private, and acknowledgements travel on the rings).
#[derive(Debug, Default, Clone)]
struct ViewAcks {
    queue: std::sync::Arc<std::sync::Mutex<VecDeque<(u32, u64, PayloadRef)>>>,
    waiting: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ViewAcks {
    fn push(&self, peer: u32, process: u64, payload: PayloadRef) {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push_back((peer, process, payload));
        self.waiting
            .store(true, std::sync::atomic::Ordering::Release);
    }

    fn take(&self) -> VecDeque<(u32, u64, PayloadRef)> {
        // A plain load first: the common case (no view dropped) costs no read-modify-write.
        if !self.waiting.load(std::sync::atomic::Ordering::Relaxed)
            || !self
                .waiting
                .swap(false, std::sync::atomic::Ordering::Acquire)
        {
            return VecDeque::new();
        }
        std::mem::take(
            &mut *self
                .queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// Where the session stands with its readiness eventfd.
#[derive(Debug, Default)]
struct Readiness {
    /// The rings from live peers armed, and the writes wakers owe the eventfd.
    rings: ReadySet,
    /// Where the next look for a ready peer starts.
    next: u32,
    /// Per peer: gone (and already reported, for a death), so nothing more can come from it.
    gone: Vec<Option<Departure>>,
}

impl Readiness {
    fn new(world: usize) -> Self {
        Self {
            gone: vec![None; world],
            ..Self::default()
        }
    }
}
