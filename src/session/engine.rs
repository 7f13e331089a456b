//! The transport's state: what a session moves data with, kept apart from what it knows about its
//! job (the connection, teams and groups, departures, the deadline).
//!
//! It holds the links to every peer, this rank's outbox and its status words, and the blocks of
//! pipelined chunks not yet acknowledged. It holds a send that an interrupt set aside, and loan
//! views' acknowledgements. It says how waits spin and park, and holds the readiness set that
//! `recv_any` waits on. It keeps buffers between calls: the scratch space of small reductions
//! and the direct slots of eager messages.
//!
//! Its fields are still open to the session's modules: `send`, `receive`, `acks`, `loans`,
//! `any`, `stepwise` and the collectives read and write them through `Session::engine`. Moving
//! those paths behind the engine's own methods is the next step.

use super::peer::Peer;
use super::{FdTransport, Waiting, any, loans::ViewAcks, send, status};
use shmbroker_allocator::Outbox;

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
    pub(super) publisher: std::sync::Arc<status::Publisher>,
    /// Offsets of outbox blocks holding chunks of pipelined transfers, not yet acknowledged.
    pub(super) chunk_blocks: shmbroker_allocator::offsets::OffsetSet,
    /// A point-to-point send an interrupt ended after part of it went out, to be finished by the
    /// next calls (see `send::Session::set_aside_send`).
    pub(super) set_aside: Option<send::Outgoing<'static>>,
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
    pub(super) any: any::Readiness,
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
            publisher: std::sync::Arc::new(status::Publisher::new(outbox.status())),
            outbox,
            chunk_blocks: shmbroker_allocator::offsets::OffsetSet::default(),
            set_aside: None,
            view_acks: ViewAcks::default(),
            fd_transport: FdTransport::Auto,
            fd_transport_used: None,
            cpus,
            waiting,
            any: any::Readiness::new(world),
            read_in_place: 0,
            scratch: Vec::new(),
            direct_slots: Vec::new(),
        }
    }
}
