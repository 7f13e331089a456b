//! How data of any size moves between two ranks: eager slots, pipelined chunks, loans, and the
//! acknowledgements that give outbox blocks back.
//!
//! # Reading a peer's ring
//!
//! Everything a peer sends goes through one function, [`Session::pull`]: acknowledgements are
//! handed to this rank's outbox ledger at once; every other message (with the continuation slots
//! of an eager message, read in the same breath) is appended to that peer's `unread` queue. The
//! operations then take whole *groups* out of `unread`: an eager header and its continuation
//! slots, a pipelined header and its chunks (some of which may still be in the ring), or a loan.
//! Collectives take the first group that is not a point-to-point `SEND`; `recv` takes the first
//! `SEND`; either checks the group's operation and sequence number before using a byte of it.
//!
//! # Sending
//!
//! Up to the session's eager limit, a message is a header slot plus continuation slots, written to
//! each receiver's ring back to back: nothing else is sent on that ring until the last slot is in,
//! so the receiver reads the continuation as raw bytes right behind its header. Larger data is *pipelined*: a header with the
//! total length, then chunks (a quarter of the message, from [`MIN_CHUNK_BYTES`] to
//! [`CHUNK_BYTES`]) written into this rank's outbox one after the other, each announced with a
//! `CHUNK` message carrying its [`PayloadRef`]; receivers copy each chunk out and acknowledge it,
//! which frees the block for the next chunk. At most
//! [`CHUNKS_IN_FLIGHT`] chunks are unacknowledged by any one receiver at once (counted per
//! receiver, so a rank feeding several workers keeps that many in flight to each), so the sender's copy of chunk `n + 1`
//! overlaps the receivers' copies of chunk `n`, the chunks stay warm in cache, a slow receiver
//! holds the sender back, and a message larger than the outbox goes through. A transfer that
//! stalls widens its window up to the whole outbox: a message that fits is then buffered there
//! even when its receiver is not receiving yet (two ranks sending to each other first, say); a
//! larger one waits for its receiver, as `MPI_Send` does.
//!
//! # Progress without deadlock
//!
//! A collective whose own data is pipelined drives its outgoing transfer and its incoming
//! transfers together ([`Session::drive`]), one non-blocking step at a time, so two ranks that
//! each send more than their outbox holds to the other both make progress. Incoming transfers
//! alone wait on the ring they need: parked while waiting for a message to start, spinning and
//! then yielding between the chunks of one (a wake-up per chunk would cost more than the chunk).
//! A transfer in which nothing has moved for [`PARK_AFTER`] (its peer stopped, say) sleeps in
//! short steps instead of yielding, so a stopped peer costs its waiters almost no CPU.
//! Every loop looks at the deadline now and then even while messages keep coming, and a peer may
//! have at most [`MAX_UNREAD`] messages queued that no call has taken: a peer that floods cannot
//! hold a call past its deadline or grow this process's memory without bound.
//!
//! # What an interrupted transfer leaves
//!
//! A call that fails in the middle of a transfer (`Timeout`, `PeerLost`) leaves that link out of
//! step: blocks sent to a peer that never acknowledges them stay owed (a lost peer's are given
//! back), and chunks already queued from the peer no longer belong to any receive. Drop the
//! session after such an error. A rank that leaves or dies is dropped from every owed set, so
//! its blocks are reused even if a `LoanView` of them outlives its session there: a view must not
//! outlive the session that received it.

use super::{Deadline, Error, Session, handshake_failed};
use shmbroker_allocator::{Outbox, PeerOutbox};
use shmbroker_bindings::{INLINE_BYTES, Message, PayloadRef, kind};
use shmbroker_queues::{Corruption, RecvTimeoutError, TryRecvError, TrySendError};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Bytes per chunk of a pipelined transfer: small enough to stay in a core's L2 cache between the
/// sender's copy and the receivers' copy, large enough that a message costs few ring messages.
pub const CHUNK_BYTES: usize = 256 << 10;

/// The smallest chunk a message is cut into (unless the outbox is smaller still).
pub const MIN_CHUNK_BYTES: usize = 16 << 10;

/// Chunks a pipelined transfer keeps unacknowledged at once.
pub const CHUNKS_IN_FLIGHT: usize = 8;

/// The most messages queued from one peer that no call has taken yet; past it the peer is
/// refused with [`Error::Protocol`] rather than this process's memory growing without bound.
pub const MAX_UNREAD: usize = 1 << 20;

/// How long a pipelined transfer may make no progress before it widens its window.
const STALL: Duration = Duration::from_millis(1);

/// How long nothing may move in a transfer before its wait sleeps instead of yielding the core.
/// A peer copying the next chunk, or sharing this core, moves well within it; one that is
/// stopped (SIGSTOP, a debugger) or descheduled for long does not, and must not cost its waiters
/// a core each.
const PARK_AFTER: Duration = Duration::from_millis(2);

/// The longest sleep of a stalled transfer's wait: the most it adds to noticing that the peer
/// moved again, and 500 look-ups a second at most while it does not (well under 1% of a core).
const PARK_MAX: Duration = Duration::from_millis(2);

/// Gives the core away while a transfer has made no progress for `stalled`: yields at first;
/// past [`PARK_AFTER`], sleeps an eighth of the time waited so far (at most [`PARK_MAX`]), so a
/// long stall costs almost no CPU and a short one little latency.
fn idle_wait(stalled: Duration) {
    if stalled < PARK_AFTER {
        std::thread::yield_now();
    } else {
        std::thread::sleep((stalled / 8).clamp(Duration::from_micros(50), PARK_MAX));
    }
}

/// Slots of the largest eager message: a header and [`kind::continuation_slots`] of
/// [`kind::EAGER_MAX`].
const MAX_EAGER_SLOTS: usize = 1 + kind::continuation_slots(kind::EAGER_MAX);

/// How long a receive that owes acknowledgements waits before trying to send them again, and a
/// send on a full ring before taking in what the peer sent meanwhile.
pub(super) const SEND_SLICE: Duration = Duration::from_millis(1);

/// Which group a receive takes from a peer's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Expect {
    /// The first non-`SEND` group, which must be operation `op` number `seq`.
    Collective { op: u32, seq: u64 },
    /// The first `SEND` group, which must carry point-to-point number `tag`.
    Send { tag: u64 },
}

impl Expect {
    fn selects(self, message: &Message) -> bool {
        let op = message.kind & kind::OP_MASK;
        match self {
            Self::Collective { .. } => op != kind::SEND,
            Self::Send { .. } => op == kind::SEND,
        }
    }

    /// Whether `header` (a group [`Self::selects`]) is the one expected, naming what differs.
    fn check(self, peer: u32, header: &Message) -> Result<(), Error> {
        let op = header.kind & kind::OP_MASK;
        match self {
            Self::Collective { op: want, seq } if op != want || header.tag != seq => {
                Err(Error::CollectiveMismatch {
                    peer,
                    expected_kind: want,
                    expected_seq: seq,
                    found_kind: op,
                    found_seq: header.tag,
                })
            }
            Self::Send { tag } if header.tag != tag => Err(Error::Protocol {
                peer,
                detail: format!("message number {} arrived where {tag} was due", header.tag),
            }),
            _ => Ok(()),
        }
    }
}

/// Whom a message goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Targets {
    /// Every other rank.
    Peers,
    /// One rank.
    One(u32),
}

/// Where the bytes of an incoming message go.
#[derive(Debug)]
pub(super) enum Sink<'a> {
    /// A vector sized when the header says how much is coming.
    Vec(Vec<u8>),
    /// A caller's buffer; a longer message is read to its end and reported as too large for it.
    Slice(&'a mut [u8]),
}

impl Sink<'_> {
    /// Makes room for `len` bytes; `false` when they cannot all be kept.
    fn prepare(&mut self, peer: u32, len: u64) -> Result<bool, Error> {
        match self {
            Self::Vec(bytes) => {
                let len = usize::try_from(len).map_err(|_| too_big(peer, len))?;
                bytes.clear();
                bytes
                    .try_reserve_exact(len)
                    .map_err(|_| too_big(peer, len as u64))?;
                Ok(true)
            }
            Self::Slice(buffer) => Ok(len <= buffer.len() as u64),
        }
    }

    /// The `len` bytes from `at` on, to be filled (after a successful [`Self::prepare`]).
    fn window(&mut self, at: usize, len: usize) -> &mut [u8] {
        match self {
            Self::Vec(bytes) => {
                if bytes.len() < at + len {
                    bytes.resize(at + len, 0);
                }
                &mut bytes[at..at + len]
            }
            Self::Slice(buffer) => &mut buffer[at..at + len],
        }
    }
}

fn too_big(peer: u32, len: u64) -> Error {
    Error::Protocol {
        peer,
        detail: format!(
            "announced a message of {len} bytes; this process could not reserve that much memory"
        ),
    }
}

/// One message being received from `peer`, step by step.
#[derive(Debug)]
pub(super) struct Incoming<'a> {
    pub(super) peer: u32,
    expect: Expect,
    pub(super) sink: Sink<'a>,
    state: InState,
    /// A message too long for a [`Sink::Slice`] is left queued, whole, and the receive fails
    /// with [`Error::BufferTooSmall`] at once (a point-to-point receive: the caller may retry with
    /// a larger buffer). Otherwise it is received to its end and dropped (a collective, whose
    /// sequence must move on).
    keep_too_long: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InState {
    /// Waiting for the header.
    Header,
    /// Taking chunks: the group continues at `unread[at]`.
    Chunks {
        at: usize,
        tag: u64,
        total: u64,
        done: u64,
        fits: bool,
    },
    /// Complete: `len` bytes arrived (and fit, unless `fits` is false).
    Done { len: u64, fits: bool },
}

impl<'a> Incoming<'a> {
    pub(super) fn new(peer: u32, expect: Expect, sink: Sink<'a>) -> Self {
        Self {
            peer,
            expect,
            sink,
            state: InState::Header,
            keep_too_long: false,
        }
    }

    /// A point-to-point receive: a message too long for the caller's buffer stays queued.
    pub(super) fn keeping_too_long(peer: u32, expect: Expect, sink: Sink<'a>) -> Self {
        Self {
            keep_too_long: true,
            ..Self::new(peer, expect, sink)
        }
    }

    /// [`Error::BufferTooSmall`] when the message `header` opens does not fit and is to be
    /// kept. Its length is read only then: collectives and vector sinks pay nothing.
    fn refuse_too_long(&self, header: &Message) -> Result<(), Error> {
        let Sink::Slice(buffer) = &self.sink else {
            return Ok(());
        };
        if !self.keep_too_long {
            return Ok(());
        }
        let len = message_len(self.peer, header)?;
        if len > buffer.len() as u64 {
            return Err(Error::BufferTooSmall {
                peer: self.peer,
                needed: len,
                capacity: buffer.len(),
            });
        }
        Ok(())
    }

    pub(super) fn is_done(&self) -> bool {
        matches!(self.state, InState::Done { .. })
    }

    /// Whether the header of a pipelined message arrived and chunks are still due.
    fn mid_transfer(&self) -> bool {
        matches!(self.state, InState::Chunks { .. })
    }

    /// The length received, or [`Error::BufferTooSmall`] when it did not fit the caller's buffer.
    pub(super) fn finish(self) -> Result<(u64, Sink<'a>), Error> {
        match self.state {
            InState::Done { len, fits: true } => Ok((len, self.sink)),
            InState::Done { len, fits: false } => Err(Error::BufferTooSmall {
                peer: self.peer,
                needed: len,
                capacity: match self.sink {
                    Sink::Slice(buffer) => buffer.len(),
                    Sink::Vec(bytes) => bytes.len(),
                },
            }),
            _ => Err(Error::Misuse(
                "a receive was finished before it completed".into(),
            )),
        }
    }
}

/// One pipelined message being sent to `targets`, step by step.
#[derive(Debug)]
pub(super) struct Outgoing<'d> {
    data: &'d [u8],
    targets: Vec<u32>,
    receivers: u64,
    tag: u64,
    /// The header, then one `CHUNK` message per chunk written so far.
    messages: Vec<Message>,
    /// Per target: how many of `messages` it has been sent.
    delivered: Vec<usize>,
    /// Bytes of `data` written into the outbox so far.
    written: usize,
    /// Chunks allowed unacknowledged: [`CHUNKS_IN_FLIGHT`], doubled each time the transfer
    /// stalls, so that a receiver that is not receiving yet (it is sending to this rank too, say)
    /// cannot hold this send up while the outbox has room.
    window: usize,
    /// A collective's (any operation but `SEND`): a death anywhere ends it.
    collective: bool,
}

impl<'d> Outgoing<'d> {
    pub(super) fn new(op: u32, tag: u64, data: &'d [u8], targets: Vec<u32>) -> Self {
        let mut inline = [0u8; INLINE_BYTES];
        inline[..8].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let header = message(op | kind::PIPELINED, tag, 0, inline);
        Self {
            data,
            receivers: Outbox::receivers(targets.iter().copied()),
            delivered: vec![0; targets.len()],
            targets,
            tag,
            messages: vec![header],
            written: 0,
            window: CHUNKS_IN_FLIGHT,
            collective: op & kind::OP_MASK != kind::SEND,
        }
    }

    fn is_done(&self) -> bool {
        self.written == self.data.len() && self.delivered.iter().all(|&d| d == self.messages.len())
    }

    /// The targets not yet sent the whole message: those a ring message is still due to, and
    /// while chunks are still to be written (the window is full), those whose acknowledgements
    /// the window waits for (`chunks_owed`, per peer).
    fn undelivered<'a>(&'a self, chunks_owed: &'a [usize]) -> impl Iterator<Item = u32> + 'a {
        let unwritten = self.written < self.data.len();
        self.targets
            .iter()
            .zip(&self.delivered)
            .filter(move |&(&t, &d)| {
                d < self.messages.len() || (unwritten && chunks_owed[t as usize] > 0)
            })
            .map(|(&t, _)| t)
    }
}

/// How far `outgoing` and every `incoming` have come, as one number that grows with each byte
/// written, each message delivered and each byte received (and with nothing else).
fn transfer_progress(outgoing: &Outgoing<'_>, incoming: &[Incoming<'_>]) -> u64 {
    let out = outgoing.written as u64 + outgoing.delivered.iter().sum::<usize>() as u64;
    incoming.iter().fold(out, |sum, incoming| {
        sum + match incoming.state {
            InState::Header => 0,
            InState::Chunks { done, .. } => 1 + done,
            InState::Done { len, .. } => 2 + len,
        }
    })
}

/// The ranks a transfer still waits for: targets not yet sent the whole message, and senders not
/// yet received from. Never empty while the transfer is not done: if no target owes anything
/// (which no wait should end on), every target is named.
fn waiting(outgoing: &Outgoing<'_>, incoming: &[Incoming<'_>], chunks_owed: &[usize]) -> Vec<u32> {
    let mut ranks: Vec<u32> = outgoing
        .undelivered(chunks_owed)
        .chain(incoming.iter().filter(|i| !i.is_done()).map(|i| i.peer))
        .collect();
    if ranks.is_empty() && !outgoing.is_done() {
        ranks.clone_from(&outgoing.targets);
    }
    ranks
}

/// The slots of an eager message: a header and its continuation, in a stack buffer of `N`.
pub(super) struct EagerSlots<const N: usize> {
    slots: [Message; N],
    count: usize,
}

impl<const N: usize> EagerSlots<N> {
    /// `data` as operation `op` with `tag`; `data` must take at most `N` slots.
    pub(super) fn new(op: u32, tag: u64, data: &[u8]) -> Self {
        let mut slots = [message(0, 0, 0, [0; INLINE_BYTES]); N];
        let head = data.len().min(INLINE_BYTES);
        slots[0].kind = op;
        slots[0].len = data.len() as u32;
        slots[0].tag = tag;
        slots[0].inline[..head].copy_from_slice(&data[..head]);
        let count = 1 + kind::continuation_slots(data.len());
        let body: &mut [u8] = bytemuck::cast_slice_mut(&mut slots[1..count]);
        body[..data.len() - head].copy_from_slice(&data[head..]);
        Self { slots, count }
    }

    pub(super) fn as_slice(&self) -> &[Message] {
        &self.slots[..self.count]
    }
}

pub(super) fn message(kind: u32, tag: u64, len: u32, inline: [u8; INLINE_BYTES]) -> Message {
    Message {
        kind,
        len,
        tag,
        inline,
    }
}

/// A message whose `inline` holds `payload` and zeros.
fn with_ref(kind: u32, tag: u64, payload: PayloadRef) -> Message {
    let mut inline = [0u8; INLINE_BYTES];
    inline[..size_of::<PayloadRef>()].copy_from_slice(bytemuck::bytes_of(&payload));
    message(kind, tag, 0, inline)
}

/// The reference in a message's `inline`, after checking that the rest of it is zero.
fn read_ref(peer: u32, message: &Message) -> Result<PayloadRef, Error> {
    let (head, rest) = message.inline.split_at(size_of::<PayloadRef>());
    if message.len != 0 || rest.iter().any(|&b| b != 0) {
        return Err(Error::Protocol {
            peer,
            detail: format!(
                "a reference message (kind {:#x}) must have len 0 and zeros after the reference; \
                 found len {} and {} nonzero bytes",
                message.kind,
                message.len,
                rest.iter().filter(|&&b| b != 0).count()
            ),
        });
    }
    Ok(bytemuck::pod_read_unaligned(head))
}

/// The length of the message `header` opens, as it announces it (a group [`Session::find`]
/// returned).
fn message_len(peer: u32, header: &Message) -> Result<u64, Error> {
    Ok(match transport(peer, header)? {
        0 => u64::from(header.len),
        kind::PIPELINED => u64::from_le_bytes(header.inline[..8].try_into().unwrap_or([0; 8])),
        _ => u64::from(read_ref(peer, header)?.len),
    })
}

/// The transport flags of a kind, checked: eager (0), pipelined or loan, and nothing else.
fn transport(peer: u32, message: &Message) -> Result<u32, Error> {
    let flags = message.kind & !kind::OP_MASK;
    let op = message.kind & kind::OP_MASK;
    let known_op = matches!(
        op,
        kind::BARRIER
            | kind::ALL_GATHER
            | kind::BROADCAST
            | kind::SEND
            | kind::FD_TICKET
            | kind::GATHER
    );
    if known_op && matches!(flags, 0 | kind::PIPELINED | kind::LOAN) {
        Ok(flags)
    } else {
        Err(Error::Protocol {
            peer,
            detail: format!("unknown message kind {:#x}", message.kind),
        })
    }
}

impl Session {
    /// The most bytes this session sends eagerly: what fits in half a ring, up to
    /// [`kind::EAGER_MAX`].
    pub(super) fn eager_limit(&self) -> usize {
        let half = (self.inner.ring_capacity() as usize / 2).max(1);
        (INLINE_BYTES + (half - 1) * size_of::<Message>()).min(kind::EAGER_MAX)
    }

    /// Bytes per chunk of a `total`-byte message: [`CHUNK_BYTES`], but at most a quarter of the
    /// message (at least [`MIN_CHUNK_BYTES`]), so that even a message of a few chunks overlaps the
    /// sender's copy with the receivers', and at most a quarter of the outbox, so that several
    /// chunks are always in flight.
    fn chunk_bytes(&self, total: usize) -> usize {
        let quarter_outbox = (self.outbox.capacity() / 4 / 64 * 64).max(64);
        let quarter_message = (total / 4).next_multiple_of(4096).max(MIN_CHUNK_BYTES);
        CHUNK_BYTES
            .min(quarter_message)
            .min(usize::try_from(quarter_outbox).unwrap_or(usize::MAX))
    }

    /// `peer`'s outbox, mapped read-only the first time it is needed.
    pub(super) fn peer_outbox(
        &mut self,
        peer: u32,
        deadline: &Deadline,
    ) -> Result<&PeerOutbox, Error> {
        let slot = peer as usize;
        if self.outboxes[slot].is_none() {
            let fd = self
                .inner
                .take_peer_outbox(peer, deadline.left())
                .map_err(|error| handshake_failed(peer, error, deadline))?;
            let outbox = PeerOutbox::join(std::os::fd::AsFd::as_fd(&fd), peer)
                .map_err(|source| Error::Outbox { peer, source })?;
            self.outboxes[slot] = Some(outbox);
        }
        Ok(self.outboxes[slot]
            .as_ref()
            .unwrap_or_else(|| unreachable!("set above")))
    }

    // -----------------------------------------------------------------------------------------
    // Reading rings

    /// Takes in what `peer` sent next: an acknowledgement is handled, anything else is queued.
    /// An eager message's continuation slots are taken as they come, never waited for here: a
    /// message whose slots are still owed stays invisible to [`Self::find`] until it is whole. With
    /// `wait`, waits up to its deadline (parked) for something to arrive; without, returns
    /// `false` at once when nothing is there.
    pub(super) fn pull(&mut self, peer: u32, wait: Option<&Deadline>) -> Result<bool, Error> {
        let p = peer as usize;
        if self.unread[p].len() >= MAX_UNREAD {
            return Err(Error::Protocol {
                peer,
                detail: format!(
                    "sent more than {MAX_UNREAD} messages that nobody receives yet; expected them \
                     to be received first"
                ),
            });
        }
        let owed = self.owed_slots[p];
        // One message at a time, unless continuation slots are owed: a header must be looked at
        // before what follows it can be told apart.
        if owed == 0 {
            let mut one = [message(0, 0, 0, [0; INLINE_BYTES])];
            if self.receive(peer, &mut one, wait)? == 0 {
                return Ok(false);
            }
            self.take_in(peer, one[0])?;
            return Ok(true);
        }
        let mut slots = [message(0, 0, 0, [0; INLINE_BYTES]); 8];
        let got = self.receive(peer, &mut slots[..owed.min(8)], wait)?;
        self.unread[p].extend(&slots[..got]);
        self.owed_slots[p] = owed - got;
        Ok(got > 0)
    }

    /// Up to `buffer.len()` messages from `peer`'s ring: those already there (no clock read), or
    /// with `wait` the first ones to arrive before its deadline. 0 when nothing is there and
    /// there is no `wait`, or after a slice spent waiting while acknowledgements are owed (they
    /// are sent meanwhile: a peer may be waiting for them to free blocks before it sends more).
    fn receive(
        &mut self,
        peer: u32,
        buffer: &mut [Message],
        wait: Option<&Deadline>,
    ) -> Result<usize, Error> {
        let collective = wait.is_some_and(|deadline| deadline.collective);
        match self.link(peer)?.from.try_recv_batch(buffer) {
            Ok(got) => return Ok(got),
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => return Err(self.closed(peer, collective)),
            Err(TryRecvError::Corrupted(corruption)) => {
                return Err(self.corrupted(peer, corruption));
            }
        }
        let Some(deadline) = wait else {
            return Ok(0);
        };
        // The ring's own wait replaces a readiness registration: take them back first.
        self.disarm();
        let owing = self.owes_acks();
        // No clock read here: the ring's own wait reads it once it goes past its spin phase.
        let slice = if owing {
            deadline.budget().min(SEND_SLICE)
        } else {
            deadline.budget()
        };
        // Every wait ends on an `Interrupter`'s request, and a collective's when any rank dies:
        // the generation is read before looking for either, so one made after the look
        // interrupts the wait (see the queues crate's `interrupt` module). Atomic loads, no
        // system call.
        let seen = self.inner.interrupt_generation();
        self.check_interrupted(deadline)?;
        let from = &mut self.link(peer)?.from;
        let received = from.recv_batch_interruptible(buffer, slice, seen);
        deadline.started_at(from.clock_started());
        match received {
            Ok(got) => Ok(got),
            Err(RecvTimeoutError::Timeout) if owing && !deadline.left().is_zero() => {
                self.flush_all_acks()?;
                Ok(0)
            }
            // A death or an interrupt was recorded: the next call looks again (and fails if it
            // must).
            Err(RecvTimeoutError::Interrupted) => {
                self.check_interrupted(deadline)?;
                Ok(0)
            }
            Err(RecvTimeoutError::Timeout) => Err(self.timed_out(deadline, peer)),
            Err(RecvTimeoutError::Disconnected) => Err(self.closed(peer, collective)),
            Err(RecvTimeoutError::Corrupted(corruption)) => Err(self.corrupted(peer, corruption)),
        }
    }

    /// The next message from `peer` other than an acknowledgement, taken straight from its ring
    /// (waiting up to `deadline`), when nothing from `peer` is queued; `None`, taking nothing,
    /// when something is (the caller then takes the queue's path). Acknowledgements that come
    /// first are handled on the way. This is the hot path of a lock-step exchange: no queue is
    /// touched.
    fn next_direct(&mut self, peer: u32, deadline: &Deadline) -> Result<Option<Message>, Error> {
        let p = peer as usize;
        loop {
            if !self.unread[p].is_empty() || self.owed_slots[p] != 0 {
                return Ok(None);
            }
            let mut one = [message(0, 0, 0, [0; INLINE_BYTES])];
            if self.receive(peer, &mut one, Some(deadline))? == 0 {
                continue;
            }
            if one[0].kind == kind::PAYLOAD_ACK {
                self.take_in(peer, one[0])?;
                continue;
            }
            return Ok(Some(one[0]));
        }
    }

    /// Receives `incoming` at once if the next message from its peer, straight from the ring, is
    /// the one-slot message it expects; otherwise files that message for the queue's path and
    /// leaves `incoming` as it was.
    pub(super) fn take_direct(
        &mut self,
        incoming: &mut Incoming<'_>,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let peer = incoming.peer;
        if incoming.state != InState::Header {
            return Ok(());
        }
        let Some(next) = self.next_direct(peer, deadline)? else {
            return Ok(());
        };
        let one_slot = next.kind & !kind::OP_MASK == 0 && next.len as usize <= INLINE_BYTES;
        if !one_slot || !incoming.expect.selects(&next) {
            return self.take_in(peer, next);
        }
        incoming.expect.check(peer, &next)?;
        let len = next.len as usize;
        if let Err(too_long) = incoming.refuse_too_long(&next) {
            // Nothing is queued from `peer` (`next_direct` took this from the ring only then):
            // queued, it is the next message again.
            self.unread[peer as usize].push_back(next);
            return Err(too_long);
        }
        let fits = incoming.sink.prepare(peer, len as u64)?;
        if fits {
            incoming
                .sink
                .window(0, len)
                .copy_from_slice(&next.inline[..len]);
        }
        incoming.state = InState::Done {
            len: len as u64,
            fits,
        };
        Ok(())
    }

    /// Files one message from `peer` (not a continuation slot).
    fn take_in(&mut self, peer: u32, received: Message) -> Result<(), Error> {
        if received.kind == kind::PAYLOAD_ACK {
            let acked = read_ref(peer, &received)?;
            return self.acknowledged(peer, acked);
        }
        if received.kind == kind::CHUNK {
            read_ref(peer, &received)?;
            self.unread[peer as usize].push_back(received);
            return Ok(());
        }
        let eager = transport(peer, &received)? == 0;
        let len = received.len as usize;
        if eager && len > kind::EAGER_MAX {
            return Err(Error::Protocol {
                peer,
                detail: format!(
                    "eager message of {len} bytes; at most {} travel eagerly",
                    kind::EAGER_MAX
                ),
            });
        }
        self.unread[peer as usize].push_back(received);
        if eager {
            self.owed_slots[peer as usize] = kind::continuation_slots(len);
        }
        Ok(())
    }

    /// The error for a link to `peer` that closed: who is gone, as this worker's watcher
    /// established it from the kernel (see the handshake's `liveness` module), never from what a
    /// peer wrote into a ring header. Blocks `peer` owed acknowledgements for are freed: none can
    /// arrive any more.
    pub(super) fn lost_from(&mut self, peer: u32) -> Error {
        let error = match self.inner.departure(peer) {
            Some(departure) => super::departure_error(departure),
            None => Error::PeerLost { rank: peer },
        };
        self.forget_peer(peer);
        error
    }

    /// Whether a wait under `deadline` must end: an `Interrupter` asked (the request is taken),
    /// or, for a collective, a rank died.
    ///
    /// An interrupt ends every call that was waiting when it came, not only the first to look:
    /// the call notes the interrupt count at its first look, and any later count ends it. At that
    /// first look, a request no wait has taken (it came while no call was waiting) ends it too.
    pub(super) fn check_interrupted(&mut self, deadline: &Deadline) -> Result<(), Error> {
        let count = self.inner.interrupt_count();
        let interrupted = match deadline.interrupts_at.get() {
            None => {
                deadline.interrupts_at.set(Some(count));
                self.inner.take_interrupt()
            }
            Some(at) if at != count => {
                // Taken, if no other call has yet: it was meant for the waits in progress.
                let _ = self.inner.take_interrupt();
                true
            }
            // A request from before this call began that no wait has taken.
            Some(_) => self.inner.take_interrupt(),
        };
        if interrupted {
            return Err(Error::Interrupted);
        }
        if deadline.collective
            && let Some(rank) = self.inner.recorded_lost_rank()
        {
            return Err(self.collective_lost(rank));
        }
        Ok(())
    }

    /// [`Self::lost_from`] for a ring with `peer` found closed by a call, which in a collective
    /// names the first rank that died if any did: a peer that gave up on the collective because
    /// of that death (and left) is not the cause.
    fn closed(&mut self, peer: u32, collective: bool) -> Error {
        let error = self.lost_from(peer);
        match self.inner.recorded_lost_rank() {
            Some(rank) if collective => self.collective_lost(rank),
            _ => error,
        }
    }

    /// The error for a ring with `peer` found corrupted: if `peer` is known to have died
    /// meanwhile (a dying peer may scribble on its way out), its death; otherwise the corruption.
    fn corrupted(&self, peer: u32, corruption: Corruption) -> Error {
        match self.inner.departure(peer) {
            Some(shmbroker_handshake::Departure::Lost { rank }) => Error::PeerLost { rank },
            _ => Error::Corrupted { peer, corruption },
        }
    }

    /// The error for a collective that cannot finish because `rank` (the first rank recorded
    /// dead) died. Blocks the dead ranks owed acknowledgements for are given back: none can
    /// arrive any more.
    pub(super) fn collective_lost(&mut self, rank: u32) -> Error {
        for dead in self.inner.dead_ranks() {
            self.forget_peer(dead);
        }
        Error::PeerLost { rank }
    }

    /// Gives back every block `peer` still owed an acknowledgement for.
    pub(super) fn forget_peer(&mut self, peer: u32) {
        for offset in self.outbox.forget(peer) {
            self.chunk_blocks.remove(&offset);
        }
        self.chunks_owed[peer as usize] = 0;
        self.acks_due[peer as usize].clear();
    }

    /// Reads whatever has arrived from `peer` without waiting (acknowledgements, and messages
    /// for later), for a call that does not itself need `peer`. At most a ringful, so that a peer
    /// that keeps sending cannot keep this rank here. A peer that left or died (its ring read to
    /// the end), or never logged on before the broker went, has nothing more to send: only calls
    /// that need it say so. Bad bytes end this call too.
    pub(super) fn drain_from(&mut self, peer: u32) -> Result<(), Error> {
        for _ in 0..self.inner.ring_capacity() {
            match self.pull(peer, None) {
                Ok(true) => {}
                // A peer that is gone has nothing more to take in; a call that needs it says so.
                Ok(false)
                | Err(Error::PeerLeft { .. } | Error::PeerNeverJoined { .. } | Error::BrokerLost) =>
                {
                    break;
                }
                Err(Error::PeerLost { rank }) if rank == peer => break,
                Err(other) => return Err(other),
            }
        }
        Ok(())
    }

    /// The first queued group from `peer` that `expect` selects: its index, or `None`.
    pub(super) fn find(&self, peer: u32, expect: Expect) -> Result<Option<usize>, Error> {
        let queue = &self.unread[peer as usize];
        let mut at = 0;
        while let Some(header) = queue.get(at) {
            if header.kind == kind::CHUNK {
                return Err(Error::Protocol {
                    peer,
                    detail: format!(
                        "a chunk (tag {}) that no pipelined message announced; expected a message \
                         header",
                        header.tag
                    ),
                });
            }
            let eager = header.kind & !kind::OP_MASK == 0;
            let extent = 1 + kind::continuation_slots(header.len as usize);
            if eager && at + extent > queue.len() {
                // Its continuation is still owed: the last group, and not whole yet.
                return Ok(None);
            }
            if expect.selects(header) {
                return Ok(Some(at));
            }
            at += match header.kind & !kind::OP_MASK {
                0 => extent,
                kind::PIPELINED => {
                    let total = u64::from_le_bytes(header.inline[..8].try_into().unwrap_or([0; 8]));
                    let mut seen = 0u64;
                    let mut next = at + 1;
                    while seen < total {
                        let Some(chunk) = queue.get(next) else {
                            // The rest of this message is still in the ring: nothing queued
                            // after it.
                            return Ok(None);
                        };
                        if chunk.kind != kind::CHUNK || chunk.tag != header.tag {
                            return Err(Error::Protocol {
                                peer,
                                detail: format!(
                                    "message {} of {total} bytes was cut off after {seen} bytes \
                                     by kind {:#x} tag {}; expected its next chunk",
                                    header.tag, chunk.kind, chunk.tag
                                ),
                            });
                        }
                        seen += u64::from(read_ref(peer, chunk)?.len.max(1));
                        next += 1;
                    }
                    next - at
                }
                _ => 1,
            };
        }
        Ok(None)
    }

    // -----------------------------------------------------------------------------------------
    // Receiving

    /// Advances `incoming` with what is queued, without waiting. Returns whether it moved.
    pub(super) fn step_in(
        &mut self,
        incoming: &mut Incoming<'_>,
        deadline: &Deadline,
    ) -> Result<bool, Error> {
        let peer = incoming.peer;
        let mut moved = false;
        loop {
            match incoming.state {
                InState::Done { .. } => return Ok(moved),
                InState::Header => {
                    let Some(at) = self.find(peer, incoming.expect)? else {
                        return Ok(moved);
                    };
                    let header = self.unread[peer as usize][at];
                    incoming.expect.check(peer, &header)?;
                    incoming.refuse_too_long(&header)?;
                    moved = true;
                    incoming.state = match transport(peer, &header)? {
                        0 => self.take_eager(peer, at, &header, &mut incoming.sink)?,
                        kind::PIPELINED => {
                            let (total, rest) = header.inline.split_at(8);
                            let total = u64::from_le_bytes(total.try_into().unwrap_or([0; 8]));
                            if header.len != 0 || rest.iter().any(|&b| b != 0) {
                                return Err(Error::Protocol {
                                    peer,
                                    detail: "a pipelined header must hold only the total length"
                                        .into(),
                                });
                            }
                            let fits = incoming.sink.prepare(peer, total)?;
                            self.unread[peer as usize].remove(at);
                            InState::Chunks {
                                at,
                                tag: header.tag,
                                total,
                                done: 0,
                                fits,
                            }
                        }
                        _ => {
                            let lent = read_ref(peer, &header)?;
                            let len = u64::from(lent.len);
                            let fits = incoming.sink.prepare(peer, len)?;
                            if fits {
                                let window = incoming.sink.window(0, lent.len as usize);
                                self.peer_outbox(peer, deadline)?
                                    .read_into(lent, window)
                                    .map_err(|source| Error::Outbox { peer, source })?;
                            }
                            self.unread[peer as usize].remove(at);
                            self.queue_ack(peer, lent)?;
                            InState::Done { len, fits }
                        }
                    };
                }
                InState::Chunks {
                    at,
                    tag,
                    total,
                    done,
                    fits,
                } => {
                    if done == total {
                        incoming.state = InState::Done { len: total, fits };
                        continue;
                    }
                    let Some(&chunk) = self.unread[peer as usize].get(at) else {
                        return Ok(moved);
                    };
                    let piece = read_ref(peer, &chunk)?;
                    let len = u64::from(piece.len);
                    if chunk.kind != kind::CHUNK
                        || chunk.tag != tag
                        || len == 0
                        || len > total - done
                    {
                        return Err(Error::Protocol {
                            peer,
                            detail: format!(
                                "expected a chunk of message {tag} with 1 to {} bytes, found kind {:#x} tag {} with {len} bytes",
                                total - done,
                                chunk.kind,
                                chunk.tag
                            ),
                        });
                    }
                    if fits {
                        let window = incoming.sink.window(done as usize, piece.len as usize);
                        self.peer_outbox(peer, deadline)?
                            .read_into(piece, window)
                            .map_err(|source| Error::Outbox { peer, source })?;
                    }
                    self.unread[peer as usize].remove(at);
                    self.queue_ack(peer, piece)?;
                    moved = true;
                    incoming.state = InState::Chunks {
                        at,
                        tag,
                        total,
                        done: done + len,
                        fits,
                    };
                }
            }
        }
    }

    /// Copies out the eager group at `unread[at]` and removes it.
    fn take_eager(
        &mut self,
        peer: u32,
        at: usize,
        header: &Message,
        sink: &mut Sink<'_>,
    ) -> Result<InState, Error> {
        let len = header.len as usize;
        let slots = kind::continuation_slots(len);
        let fits = sink.prepare(peer, len as u64)?;
        let queue = &mut self.unread[peer as usize];
        if fits {
            let head = len.min(INLINE_BYTES);
            let out = sink.window(0, len);
            out[..head].copy_from_slice(&header.inline[..head]);
            let mut filled = head;
            let end = (at + 1 + slots).min(queue.len());
            for slot in queue.range(at + 1..end) {
                let bytes = bytemuck::bytes_of(slot);
                let take = (len - filled).min(bytes.len());
                out[filled..filled + take].copy_from_slice(&bytes[..take]);
                filled += take;
            }
        }
        let end = (at + 1 + slots).min(queue.len());
        queue.drain(at..end);
        Ok(InState::Done {
            len: len as u64,
            fits,
        })
    }

    /// Receives `incoming` to the end, waiting parked on its ring.
    pub(super) fn complete(
        &mut self,
        incoming: &mut Incoming<'_>,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let mut idle = 0u32;
        let mut turns = 0u32;
        let mut idle_since: Option<Instant> = None;
        while !incoming.is_done() {
            turns = turns.wrapping_add(1);
            // A peer that keeps sending what nobody waits for must not keep this call past its
            // deadline: look at the clock now and then even while things move.
            if turns.is_multiple_of(1024) && deadline.left().is_zero() {
                return Err(self.timed_out(deadline, incoming.peer));
            }
            if self.step_in(incoming, deadline)? {
                idle = 0;
                idle_since = None;
                continue;
            }
            if !incoming.mid_transfer() {
                self.pull(incoming.peer, Some(deadline))?;
                continue;
            }
            // Between chunks the sender is busy copying the next one: parking would add a
            // wake-up (tens of microseconds here) to every chunk, so spin, then yield the core
            // (to the sender, when both share it), and sleep only once the sender has stalled.
            if self.pull(incoming.peer, None)? {
                idle = 0;
                idle_since = None;
                continue;
            }
            idle += 1;
            if idle < 64 {
                std::hint::spin_loop();
            } else {
                if deadline.left().is_zero() {
                    return Err(self.timed_out(deadline, incoming.peer));
                }
                self.flush_all_acks()?;
                let now = Instant::now();
                idle_wait(now.duration_since(*idle_since.get_or_insert(now)));
            }
        }
        Ok(())
    }

    /// The next collective message from `peer`, which must be one eager slot of `op` number `seq`.
    pub(super) fn recv_collective(
        &mut self,
        peer: u32,
        op: u32,
        seq: u64,
        deadline: &Deadline,
    ) -> Result<Message, Error> {
        let expect = Expect::Collective { op, seq };
        if let Some(next) = self.next_direct(peer, deadline)? {
            if next.kind == op && next.tag == seq && next.len as usize <= INLINE_BYTES {
                return Ok(next);
            }
            self.take_in(peer, next)?;
        }
        let at = self.await_group(peer, expect, deadline)?;
        let header = self.unread[peer as usize][at];
        expect.check(peer, &header)?;
        if header.kind != op || header.len as usize > INLINE_BYTES {
            return Err(Error::Protocol {
                peer,
                detail: format!(
                    "{} travels in one slot; found kind {:#x} with {} bytes",
                    super::error::op_text(op),
                    header.kind,
                    header.len
                ),
            });
        }
        self.unread[peer as usize].remove(at);
        Ok(header)
    }

    /// `error`, and when it is a timeout, one that also names every rank of `later` (peers this
    /// call would have waited for next) with nothing of `expect` arrived yet: the ranks a
    /// collective was still missing when its deadline passed, not only the first.
    pub(super) fn still_missing(
        &mut self,
        error: Error,
        later: &[u32],
        expect: Expect,
        deadline: &Deadline,
    ) -> Error {
        let Error::Timeout {
            mut waiting_for, ..
        } = error
        else {
            return error;
        };
        for &peer in later {
            // Whatever the ring holds, without waiting; a peer whose bytes cannot be read counts
            // as missing (the call that reads them next will say what is wrong).
            let mut arrived = Ok(None);
            for _ in 0..MAX_UNREAD {
                arrived = self.find(peer, expect);
                if !matches!(arrived, Ok(None)) || !matches!(self.pull(peer, None), Ok(true)) {
                    break;
                }
            }
            if !matches!(arrived, Ok(Some(_))) {
                waiting_for.push(peer);
            }
        }
        self.timed_out_waiting(deadline, waiting_for)
    }

    /// The length of the next point-to-point message from `peer`, once its header (and, for an
    /// eager message, its whole body) is queued, waiting up to `deadline`; it stays queued.
    pub(super) fn probe_send(&mut self, peer: u32, deadline: &Deadline) -> Result<u64, Error> {
        let expect = Expect::Send {
            tag: self.received_from[peer as usize],
        };
        let at = self.await_group(peer, expect, deadline)?;
        let header = self.unread[peer as usize][at];
        expect.check(peer, &header)?;
        message_len(peer, &header)
    }

    /// Waits until a whole group `expect` selects is queued from `peer`; returns its index.
    fn await_group(
        &mut self,
        peer: u32,
        expect: Expect,
        deadline: &Deadline,
    ) -> Result<usize, Error> {
        let mut turns = 0u32;
        loop {
            if let Some(at) = self.find(peer, expect)? {
                return Ok(at);
            }
            turns = turns.wrapping_add(1);
            if turns.is_multiple_of(1024) && deadline.left().is_zero() {
                return Err(self.timed_out(deadline, peer));
            }
            self.pull(peer, Some(deadline))?;
        }
    }

    // -----------------------------------------------------------------------------------------
    // Sending

    /// Sends `slots` (one message) to `peer` as one unit. While the ring is full, takes in what
    /// `peer` sent meanwhile (but sends nothing else on this ring until the message is whole): a
    /// peer blocked on a full ring back to us stops reading, and two ranks each waiting for the
    /// other would otherwise wait out their deadlines.
    pub(super) fn send_slots(
        &mut self,
        peer: u32,
        slots: &[Message],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        self.flush_acks(peer)?;
        let mut sent = 0;
        while sent < slots.len() {
            match self.link(peer)?.to.try_send_batch(&slots[sent..]) {
                Ok(count) => {
                    sent += count;
                    continue;
                }
                Err(TrySendError::Full(())) => {}
                Err(TrySendError::Disconnected(())) => {
                    return Err(self.closed(peer, deadline.collective));
                }
                Err(TrySendError::Corrupted((), corruption)) => {
                    return Err(self.corrupted(peer, corruption));
                }
            }
            // Full: wait a slice for room, then take in what the peer sent.
            let slice = deadline.left().min(SEND_SLICE);
            match self
                .link(peer)?
                .to
                .send_batch_timeout(&slots[sent..sent + 1], slice)
            {
                Ok(()) => sent += 1,
                Err(shmbroker_queues::SendTimeoutError::Timeout(_)) => {
                    self.check_interrupted(deadline)?;
                    if deadline.left().is_zero() {
                        return Err(self.timed_out(deadline, peer));
                    }
                    // Every peer, not only this one: in a ring of ranks each sending to the next,
                    // the rank this one waits for is itself waiting on a third.
                    for other in self.peers() {
                        self.drain_from(other)?;
                    }
                }
                Err(shmbroker_queues::SendTimeoutError::Disconnected(_)) => {
                    return Err(self.closed(peer, deadline.collective));
                }
                Err(shmbroker_queues::SendTimeoutError::Corrupted(_, corruption)) => {
                    return Err(self.corrupted(peer, corruption));
                }
            }
        }
        Ok(())
    }

    /// Sends `data` to every rank in `targets` as operation `op` with `tag`: eagerly when it is
    /// small, otherwise pipelined while `incoming` are received (see the module docs).
    pub(super) fn transfer(
        &mut self,
        op: u32,
        tag: u64,
        data: Option<(&[u8], Targets)>,
        incoming: &mut [Incoming<'_>],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let mut outgoing = None;
        if let Some((data, targets)) = data {
            if !self.send_if_eager(op, tag, data, targets, deadline)? {
                let targets: Vec<u32> = match targets {
                    Targets::Peers => self.peers().collect(),
                    Targets::One(peer) => vec![peer],
                };
                // A world of one: nobody to send to.
                if !targets.is_empty() {
                    outgoing = Some(Outgoing::new(op, tag, data, targets));
                }
            }
        } else {
            self.flush_view_acks()?;
        }
        match outgoing {
            Some(mut outgoing) => match self.drive(&mut outgoing, incoming, deadline) {
                // Whichever wait ran out (a full ring, a silent sender), name every rank the
                // transfer still waits for.
                Err(Error::Timeout {
                    mut waiting_for, ..
                }) => {
                    waiting_for.extend(waiting(&outgoing, incoming, &self.chunks_owed));
                    Err(self.timed_out_waiting(deadline, waiting_for))
                }
                other => other,
            },
            None => {
                for at in 0..incoming.len() {
                    if let Err(error) = self.complete(&mut incoming[at], deadline) {
                        let later: Vec<u32> = incoming[at + 1..].iter().map(|i| i.peer).collect();
                        let expect = incoming[at].expect;
                        return Err(self.still_missing(error, &later, expect, deadline));
                    }
                }
                Ok(())
            }
        }
    }

    /// The hot path of a small point-to-point send: `data` fits one slot, nothing is owed to
    /// `rank` (acknowledgements go first, in order), and the ring has room. Then it is sent as
    /// message `tag` and this returns `true`; otherwise it sends nothing and returns `false`, for
    /// the general path (which waits, and names whatever went wrong).
    pub(super) fn send_one_slot(
        &mut self,
        rank: u32,
        tag: u64,
        data: &[u8],
    ) -> Result<bool, Error> {
        if data.len() > INLINE_BYTES || !self.acks_due[rank as usize].is_empty() {
            return Ok(false);
        }
        self.flush_view_acks()?;
        if !self.acks_due[rank as usize].is_empty() {
            return Ok(false);
        }
        let mut inline = [0u8; INLINE_BYTES];
        inline[..data.len()].copy_from_slice(data);
        let slot = message(kind::SEND, tag, data.len() as u32, inline);
        Ok(self.link(rank)?.to.try_send(slot).is_ok())
    }

    /// Sends `data` eagerly to `targets` if it is small enough (then `true`), from a stack buffer
    /// no larger than the message needs; `false`, sending nothing, for a pipelined message.
    pub(super) fn send_if_eager(
        &mut self,
        op: u32,
        tag: u64,
        data: &[u8],
        targets: Targets,
        deadline: &Deadline,
    ) -> Result<bool, Error> {
        self.flush_view_acks()?;
        if data.len() > self.eager_limit() {
            return Ok(false);
        }
        match kind::continuation_slots(data.len()) {
            0 => self.send_each(&EagerSlots::<1>::new(op, tag, data), targets, deadline)?,
            1 => self.send_each(&EagerSlots::<2>::new(op, tag, data), targets, deadline)?,
            2..8 => self.send_each(&EagerSlots::<8>::new(op, tag, data), targets, deadline)?,
            _ => self.send_each(
                &EagerSlots::<MAX_EAGER_SLOTS>::new(op, tag, data),
                targets,
                deadline,
            )?,
        }
        Ok(true)
    }

    fn send_each<const N: usize>(
        &mut self,
        slots: &EagerSlots<N>,
        targets: Targets,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        match targets {
            Targets::One(peer) => self.send_slots(peer, slots.as_slice(), deadline),
            Targets::Peers => {
                for peer in self.peers() {
                    self.send_slots(peer, slots.as_slice(), deadline)?;
                }
                Ok(())
            }
        }
    }

    /// Runs `outgoing` and every `incoming` to completion together, a non-blocking step of each
    /// at a time; spins, then yields, then sleeps (see [`idle_wait`]) while nothing moves.
    fn drive(
        &mut self,
        outgoing: &mut Outgoing<'_>,
        incoming: &mut [Incoming<'_>],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let mut idle = 0u32;
        let mut turns = 0u32;
        let mut stalled_since = None;
        // Since when this transfer's own bytes have not advanced: acknowledgements and messages
        // from third parties move something without bringing it closer to its end, and must not
        // keep a wait whose peer stopped from sleeping.
        let mut idle_since: Option<Instant> = None;
        let mut progress = transfer_progress(outgoing, incoming);
        loop {
            let mut moved = self.step_out(outgoing)?;
            for incoming in incoming.iter_mut() {
                if !incoming.is_done() {
                    moved |= self.pull(incoming.peer, None)?;
                    moved |= self.step_in(incoming, deadline)?;
                }
            }
            if outgoing.is_done() {
                break;
            }
            turns = turns.wrapping_add(1);
            if moved && (!turns.is_multiple_of(1024) || !deadline.left().is_zero()) {
                idle = 0;
                stalled_since = None;
                let now = transfer_progress(outgoing, incoming);
                if now != progress {
                    progress = now;
                    idle_since = None;
                }
                continue;
            }
            if moved {
                return Err(self
                    .timed_out_waiting(deadline, waiting(outgoing, incoming, &self.chunks_owed)));
            }
            idle += 1;
            if idle < 64 {
                std::hint::spin_loop();
                continue;
            }
            // Nothing moves: the clock is read only here.
            let now = Instant::now();
            if deadline.left().is_zero() {
                return Err(self
                    .timed_out_waiting(deadline, waiting(outgoing, incoming, &self.chunks_owed)));
            }
            let since = *stalled_since.get_or_insert(now);
            if now.duration_since(since) >= STALL {
                outgoing.window = outgoing.window.saturating_mul(2);
                stalled_since = Some(now);
            }
            idle_wait(now.duration_since(*idle_since.get_or_insert(now)));
        }
        for incoming in incoming.iter_mut() {
            self.complete(incoming, deadline)?;
        }
        Ok(())
    }

    /// Writes the next chunks `outgoing` has room for and delivers every message its targets
    /// have room for, without waiting. Returns whether anything moved.
    fn step_out(&mut self, outgoing: &mut Outgoing<'_>) -> Result<bool, Error> {
        let mut moved = false;
        // Acknowledgements from every peer, not only the targets: blocks of earlier transfers
        // that another peer still holds count against the window.
        for peer in self.peers() {
            self.drain_from(peer)?;
            self.flush_acks(peer)?;
        }
        while outgoing.written < outgoing.data.len() && self.chunks_in_window(outgoing) {
            let len = self
                .chunk_bytes(outgoing.data.len())
                .min(outgoing.data.len() - outgoing.written);
            let Some(block) = self
                .outbox
                .try_alloc(len as u64)
                .map_err(Error::OwnOutbox)?
            else {
                break;
            };
            let piece = &outgoing.data[outgoing.written..outgoing.written + len];
            self.outbox
                .write(&block, 0, piece)
                .map_err(Error::OwnOutbox)?;
            let sent = self
                .outbox
                .send(block, len as u64, outgoing.receivers)
                .map_err(Error::OwnOutbox)?;
            if outgoing.receivers != 0 {
                self.chunk_blocks.insert(sent.offset);
                for &peer in &outgoing.targets {
                    self.chunks_owed[peer as usize] += 1;
                }
            }
            outgoing
                .messages
                .push(with_ref(kind::CHUNK, outgoing.tag, sent));
            outgoing.written += len;
            moved = true;
        }
        for (index, &peer) in outgoing.targets.iter().enumerate() {
            let from = outgoing.delivered[index];
            if from == outgoing.messages.len() {
                continue;
            }
            match self
                .link(peer)?
                .to
                .try_send_batch(&outgoing.messages[from..])
            {
                Ok(count) => {
                    outgoing.delivered[index] += count;
                    moved = true;
                }
                Err(TrySendError::Full(())) => {}
                Err(TrySendError::Disconnected(())) => {
                    return Err(self.closed(peer, outgoing.collective));
                }
                Err(TrySendError::Corrupted((), corruption)) => {
                    return Err(self.corrupted(peer, corruption));
                }
            }
        }
        Ok(moved)
    }

    // -----------------------------------------------------------------------------------------
    // Acknowledgements

    /// Handles `peer`'s acknowledgement of a block of this rank's outbox.
    fn acknowledged(&mut self, peer: u32, acked: PayloadRef) -> Result<(), Error> {
        let freed = self
            .outbox
            .ack(peer, acked)
            .map_err(|source| Error::Protocol {
                peer,
                detail: source.to_string(),
            })?;
        if self.chunk_blocks.contains(&acked.offset) {
            let owed = &mut self.chunks_owed[peer as usize];
            *owed = owed.saturating_sub(1);
        }
        if freed {
            self.chunk_blocks.remove(&acked.offset);
        }
        Ok(())
    }

    /// Whether `outgoing` may write another chunk: every one of its targets holds fewer
    /// unacknowledged chunks (of this transfer or earlier ones) than its window. Counted per
    /// receiver, so a slow receiver holds back only what is sent to it: a rank feeding several
    /// workers keeps a window in flight to each.
    fn chunks_in_window(&self, outgoing: &Outgoing<'_>) -> bool {
        outgoing
            .targets
            .iter()
            .all(|&peer| self.chunks_owed[peer as usize] < outgoing.window)
    }

    /// Acknowledges `payload` to its owner `peer`: queued, and sent as soon as the ring has room.
    pub(super) fn queue_ack(&mut self, peer: u32, payload: PayloadRef) -> Result<(), Error> {
        self.acks_due[peer as usize].push_back(with_ref(kind::PAYLOAD_ACK, 0, payload));
        self.flush_acks(peer)
    }

    pub(super) fn owes_acks(&self) -> bool {
        self.acks_due.iter().any(|due| !due.is_empty())
    }

    pub(super) fn flush_all_acks(&mut self) -> Result<(), Error> {
        for peer in self.peers() {
            self.flush_acks(peer)?;
        }
        Ok(())
    }

    /// Sends the acknowledgements owed to `peer` that fit, in order, without waiting. A peer that
    /// has left needs none: they are dropped (a session that died says so on the next call).
    pub(super) fn flush_acks(&mut self, peer: u32) -> Result<(), Error> {
        let due = &mut self.acks_due[peer as usize];
        if due.is_empty() {
            return Ok(());
        }
        let link = self
            .inner
            .link(peer)
            .ok_or_else(|| Error::Misuse(format!("rank {peer} has no link to this rank")))?;
        match link.to.try_send_batch(due.make_contiguous()) {
            Ok(count) => {
                self.acks_due[peer as usize].drain(..count);
                Ok(())
            }
            Err(TrySendError::Full(())) => Ok(()),
            Err(TrySendError::Disconnected(())) => {
                self.acks_due[peer as usize].clear();
                Ok(())
            }
            Err(TrySendError::Corrupted((), corruption)) => Err(self.corrupted(peer, corruption)),
        }
    }

    /// Queues the acknowledgements of loan views dropped since the last call.
    pub(super) fn flush_view_acks(&mut self) -> Result<(), Error> {
        for (peer, payload) in self.view_acks.take() {
            if peer < self.world_size() && peer != self.rank() {
                self.queue_ack(peer, payload)?;
            }
        }
        Ok(())
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
    queue: std::sync::Arc<std::sync::Mutex<VecDeque<(u32, PayloadRef)>>>,
    waiting: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ViewAcks {
    pub(super) fn push(&self, peer: u32, payload: PayloadRef) {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push_back((peer, payload));
        self.waiting
            .store(true, std::sync::atomic::Ordering::Release);
    }

    fn take(&self) -> VecDeque<(u32, PayloadRef)> {
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

impl Session {
    /// The loan group `expect` selects from `peer`, as a view of the lender's buffer.
    pub(super) fn take_loan(
        &mut self,
        peer: u32,
        expect: Expect,
        deadline: &Deadline,
    ) -> Result<super::LoanView, Error> {
        self.flush_view_acks()?;
        let at = self.await_group(peer, expect, deadline)?;
        let header = self.unread[peer as usize][at];
        expect.check(peer, &header)?;
        let transport = transport(peer, &header)?;
        if transport != kind::LOAN {
            return Err(Error::Misuse(format!(
                "the next message from rank {peer} is not a loan (kind {:#x}, {}); receive it \
                 with recv",
                header.kind,
                if transport == 0 { "eager" } else { "pipelined" }
            )));
        }
        // Checked before it leaves the queue: a reference that fails is not lost on the way.
        let lent = read_ref(peer, &header)?;
        let view = self
            .peer_outbox(peer, deadline)?
            .view(lent)
            .map_err(|source| Error::Outbox { peer, source })?;
        self.unread[peer as usize].remove(at);
        Ok(super::LoanView {
            view,
            owner: peer,
            payload: lent,
            acks: self.view_acks.clone(),
        })
    }
}
