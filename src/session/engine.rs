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
//! It imports none of the session's modules that run calls (see the module map in `session`):
//! only the state it is made of (`peer`, `outgoing`, `publisher`).
//!
//! Its fields are still open to the session's modules: `send`, `receive`, `acks`, `loans`,
//! `any`, `stepwise` and the collectives read and write them through `Session::engine`. Moving
//! those paths behind the engine's own methods is the next step.
use super::outgoing::Outgoing;
use super::peer::Peer;
use super::publisher::Publisher;
use crate::error::Error;
use shmbroker_allocator::Outbox;
use shmbroker_bindings::PayloadRef;
use shmbroker_handshake::LeftAfter;
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
    pub(super) peers: Vec<Peer>,
    /// This rank's outbox: large data and loans go out through it.
    pub(super) outbox: Outbox,
    /// What this rank says it is doing, in its outbox's status words (see `status`).
    pub(super) publisher: std::sync::Arc<Publisher>,
    /// Offsets of outbox blocks holding chunks of pipelined transfers, not yet acknowledged.
    pub(super) chunk_blocks: shmbroker_allocator::offsets::OffsetSet,
    /// A point-to-point send an interrupt ended after part of it went out, to be finished by the
    /// next calls (see `send::Session::set_aside_send`).
    pub(super) set_aside: Option<Outgoing<'static>>,
    /// Acknowledgements of dropped loan views.
    pub(super) view_acks: ViewAcks,
    /// How fds move (the choice), and how they have moved so far (see
    /// [`super::Session::fd_transport_used`]).
    pub(super) fd_transport: FdTransport,
    pub(super) fd_transport_used: Option<FdTransport>,
    /// CPUs this process may run on (`sched_getaffinity`), at logon.
    pub(super) cpus: usize,
    /// How every ring of this session waits.
    pub(super) waiting: Waiting,
    /// Receiving from any peer: the readiness eventfd's state and the round-robin position.
    pub(super) any: Readiness,
    /// Pieces of all-reduces whose contribution peers read where it lay (see
    /// [`super::Session::symmetric`]).
    pub(super) read_in_place: u64,
    /// Scratch space of small reductions (every rank's contribution, or a copy of this rank's):
    /// kept between calls (see `reductions::Session::with_scratch`).
    pub(super) scratch: Vec<ScratchLine>,
    /// Where an eager message's continuation slots land when taken straight from the ring
    /// (see `receive::Session::take_eager_direct`): kept between calls.
    pub(super) direct_slots: Vec<shmbroker_bindings::Message>,
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
pub(super) struct ViewAcks {
    queue: std::sync::Arc<std::sync::Mutex<VecDeque<(u32, u64, PayloadRef)>>>,
    waiting: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ViewAcks {
    pub(super) fn push(&self, peer: u32, process: u64, payload: PayloadRef) {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push_back((peer, process, payload));
        self.waiting
            .store(true, std::sync::atomic::Ordering::Release);
    }

    pub(super) fn take(&self) -> VecDeque<(u32, u64, PayloadRef)> {
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
pub(super) struct Readiness {
    /// The rings from live peers armed, and the writes wakers owe the eventfd.
    pub(super) rings: ReadySet,
    /// Where the next look for a ready peer starts.
    pub(super) next: u32,
    /// Per peer: gone (and already reported, for a death), so nothing more can come from it.
    pub(super) gone: Vec<Option<Gone>>,
}

impl Readiness {
    pub(super) fn new(world: usize) -> Self {
        Self {
            gone: vec![None; world],
            ..Self::default()
        }
    }
}

/// How a peer left [`Readiness`]'s round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gone {
    Left(Option<LeftAfter>),
    Lost,
    /// It never logged on, and the broker is gone.
    BrokerLost,
    /// It never logged on, and the broker admits nobody new (the job lost `after`).
    NeverJoined {
        after: u32,
        after_left: bool,
    },
}

impl Gone {
    pub(super) fn error(self, rank: u32) -> Error {
        match self {
            Self::Left(after) => Error::PeerLeft {
                rank,
                after,
                diagnosis: Vec::new(),
            },
            Self::Lost => Error::PeerLost {
                rank,
                diagnosis: Vec::new(),
            },
            Self::BrokerLost => Error::BrokerLost,
            Self::NeverJoined { after, after_left } => Error::PeerNeverJoined {
                rank,
                after,
                after_left,
            },
        }
    }

    /// Which is reported when every peer is gone: a death first, then the broker's loss, then a
    /// departure, then a rank that never came.
    pub(super) fn precedence(self) -> u8 {
        match self {
            Self::Lost => 0,
            Self::BrokerLost => 1,
            Self::Left(_) => 2,
            Self::NeverJoined { .. } => 3,
        }
    }
}
