//! A logged-on worker's collectives and point-to-point messages, worker to worker over the rings.
//!
//! Every call has the session's default deadline ([`Session::set_timeout`]) and a `_timeout`
//! variant; the broker is not on any of these paths.
//!
//! # Wire protocol
//!
//! Each message is one ring slot ([`Message`]): a kind from [`kind`], a tag and 48 inline bytes.
//! Collectives are tagged with a sequence number that every rank advances once per collective,
//! so a rank that receives another operation or another sequence number than it expects reports
//! [`Error::CollectiveMismatch`] instead of hanging or misreading. Point-to-point messages
//! (`SEND`) and collective messages share a ring; a message that arrives while another kind is
//! awaited waits in a per-peer queue, in order.
//!
//! Data up to 48 bytes travels inline. Larger data (up to [`MAX_PAYLOAD`] bytes) is copied into
//! the session's payload region and the message carries a bounds-checked [`PayloadRef`]; each
//! receiver copies it out and answers `PAYLOAD_ACK`, and the sender frees the block when every
//! receiver has acknowledged it. Acknowledgements are processed whenever the sender reads from
//! that peer, and all at once when the region runs short.
//!
//! # When a peer dies
//!
//! The broker closes every ring of the session with the lost rank as cause; every pending and
//! later call then fails with [`Error::PeerLost`] naming that rank (see
//! [`shmbroker_handshake::Listener`]).

mod fds;
mod gpu;

pub use fds::FdTransport;

use shmbroker_allocator::MAX_PAYLOAD;
use shmbroker_bindings::{ANY_RANK, INLINE_BYTES, LogonFrame, Message, PayloadRef, kind};
use shmbroker_handshake::connect;
use shmbroker_queues::{
    Corruption, RecvTimeoutError, SendTimeoutError, TryRecvError, TrySendError,
};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::time::{Duration, Instant};

/// The default deadline of every call, until [`Session::set_timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a send waits on a full ring before taking in what the peer sent meanwhile, and a
/// receive that owes acknowledgements before trying to send them again.
const SEND_SLICE: Duration = Duration::from_millis(1);

/// How long an allocation waits for acknowledgements before looking again, when the payload
/// region is exhausted (a back-pressure path, not a data path).
const EXHAUSTED_BACKOFF: Duration = Duration::from_micros(200);

/// Why a session call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Logging on failed.
    #[error(transparent)]
    Logon(#[from] shmbroker_handshake::Error),
    /// A worker of the session is gone (it died, or left while others still needed it).
    #[error("peer rank {rank} was lost")]
    PeerLost {
        /// The rank that was lost.
        rank: u32,
    },
    /// The deadline passed.
    #[error("{op} timed out after {timeout:?} waiting for rank {peer}")]
    Timeout {
        /// The call.
        op: &'static str,
        /// The rank waited for.
        peer: u32,
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
    /// Data larger than one payload block.
    #[error("{found} bytes is more than the {max} a message can carry")]
    TooLarge {
        /// [`MAX_PAYLOAD`].
        max: usize,
        /// The size given.
        found: usize,
    },
    /// The ranks called different collectives, or in a different order.
    #[error(
        "collective mismatch with rank {peer}: expected kind {expected_kind} #{expected_seq}, received kind {found_kind} #{found_seq}"
    )]
    CollectiveMismatch {
        /// The peer whose message did not match.
        peer: u32,
        /// The kind this rank is in.
        expected_kind: u32,
        /// This rank's collective sequence number.
        expected_seq: u64,
        /// The kind received.
        found_kind: u32,
        /// The sequence number received.
        found_seq: u64,
    },
    /// A call this rank cannot make (a broadcast root without data, say).
    #[error("misuse: {0}")]
    Misuse(String),
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
    /// The payload region refused (exhausted, or a peer's reference out of bounds).
    #[error(transparent)]
    Payload(#[from] shmbroker_allocator::Error),
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
    /// Handshake-level failure while relaying an fd through the broker.
    #[error("fd relay: {0}")]
    Relay(String),
    /// The launcher's variables do not say where this worker stands.
    #[error("launch environment: {0}")]
    Launch(String),
}

/// A worker's session: its rank, its links to every peer, and the collectives over them.
#[derive(Debug)]
pub struct Session {
    inner: shmbroker_handshake::Session,
    timeout: Duration,
    /// Sequence number of the next collective.
    seq: u64,
    /// Per peer: messages received while waiting for another kind, in arrival order.
    unread: Vec<VecDeque<Message>>,
    /// Per peer: the next point-to-point tag to send, and to expect.
    sent_to: Vec<u64>,
    received_from: Vec<u64>,
    /// Payload blocks sent and not yet acknowledged by every receiver: offset -> (ref, acks due).
    unacked: HashMap<u64, (PayloadRef, u32)>,
    /// Per peer: acknowledgements not yet sent because the ring to that peer was full.
    acks_due: Vec<VecDeque<Message>>,
    /// How fds move, and whether the choice was reported yet.
    fd_transport: FdTransport,
    fd_transport_reported: bool,
    /// Pidfds of exporters' processes, by pid, kept for the session.
    pidfds: HashMap<u32, std::os::fd::OwnedFd>,
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

/// One call's deadline.
struct Deadline {
    op: &'static str,
    at: Instant,
    timeout: Duration,
}

impl Deadline {
    fn new(op: &'static str, timeout: Duration) -> Self {
        let now = Instant::now();
        Self {
            op,
            at: now
                .checked_add(timeout)
                .unwrap_or(now + Duration::from_secs(86_400 * 365)),
            timeout,
        }
    }

    fn left(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    fn timed_out(&self, peer: u32) -> Error {
        Error::Timeout {
            op: self.op,
            peer,
            timeout: self.timeout,
        }
    }
}

impl Session {
    /// Logs on to the broker at `path` as `rank` (or any free rank) within `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Logon`] with the handshake's reason.
    pub fn connect(
        path: impl AsRef<Path>,
        rank: Option<u32>,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let transport = FdTransport::from_env()?;
        let logon = LogonFrame::new(rank.unwrap_or(ANY_RANK));
        let mut session = Self::from_handshake(connect(path, logon, timeout)?);
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

    /// Wraps a session the handshake returned.
    #[must_use]
    pub fn from_handshake(inner: shmbroker_handshake::Session) -> Self {
        let world = inner.world_size() as usize;
        Self {
            inner,
            timeout: DEFAULT_TIMEOUT,
            seq: 0,
            unread: vec![VecDeque::new(); world],
            sent_to: vec![0; world],
            received_from: vec![0; world],
            unacked: HashMap::new(),
            acks_due: vec![VecDeque::new(); world],
            fd_transport: FdTransport::Auto,
            fd_transport_reported: false,
            pidfds: HashMap::new(),
            embedded: None,
        }
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

    /// How many times every wait re-checks before parking: 0 parks at once, `u32::MAX` spins
    /// until the deadline (see [`shmbroker_queues::Producer::set_spin_limit`]).
    pub fn set_spin_limit(&mut self, spins: u32) {
        for peer in self.peers() {
            if let Some(link) = self.inner.link(peer) {
                link.to.set_spin_limit(spins);
                link.from.set_spin_limit(spins);
            }
        }
    }

    /// The handshake-level session: raw rings and the payload region.
    pub fn raw(&mut self) -> &mut shmbroker_handshake::Session {
        &mut self.inner
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
        let arrival = message(kind::BARRIER, seq, 0, [0; INLINE_BYTES]);
        for peer in self.peers() {
            self.send_message(peer, arrival, &deadline)?;
        }
        for peer in self.peers() {
            self.recv_collective(peer, kind::BARRIER, seq, &deadline)?;
        }
        Ok(())
    }

    /// Every rank's `data` (up to [`MAX_PAYLOAD`] bytes each, sizes may differ), indexed by rank.
    ///
    /// # Errors
    ///
    /// [`Error::TooLarge`], [`Error::PeerLost`], [`Error::Timeout`],
    /// [`Error::CollectiveMismatch`], [`Error::Payload`].
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
        let receivers = self.world_size() - 1;
        let outgoing = self.encode(kind::ALL_GATHER, seq, data, receivers, &deadline)?;
        for peer in self.peers() {
            self.send_message(peer, outgoing, &deadline)?;
        }
        let mut gathered = vec![Vec::new(); self.world_size() as usize];
        gathered[self.rank() as usize] = data.to_vec();
        for peer in self.peers() {
            let incoming = self.recv_collective(peer, kind::ALL_GATHER, seq, &deadline)?;
            gathered[peer as usize] = self.decode(peer, incoming)?;
        }
        Ok(gathered)
    }

    /// Every rank's `data`, all of one size, into `out` in rank order (`out` must hold exactly
    /// `world_size * data.len()` bytes).
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
        let gathered = self.all_gather(data)?;
        for ((peer, part), slot) in (0u32..)
            .zip(&gathered)
            .zip(out.chunks_exact_mut(data.len().max(1)))
        {
            if part.len() != data.len() {
                return Err(Error::Protocol {
                    peer,
                    detail: format!("gave {} bytes where {} were due", part.len(), data.len()),
                });
            }
            slot[..part.len()].copy_from_slice(part);
        }
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
                bytemuck::try_pod_read_unaligned(&bytes).map_err(|_| Error::Protocol {
                    peer,
                    detail: format!(
                        "expected {} bytes, received {}",
                        size_of::<T>(),
                        bytes.len()
                    ),
                })
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
        self.check_rank(root)?;
        let deadline = Deadline::new("broadcast", timeout);
        let seq = self.next_seq();
        match (root == self.rank(), data) {
            (true, Some(data)) => {
                let outgoing =
                    self.encode(kind::BROADCAST, seq, data, self.world_size() - 1, &deadline)?;
                for peer in self.peers() {
                    self.send_message(peer, outgoing, &deadline)?;
                }
                Ok(data.to_vec())
            }
            (false, None) => {
                let incoming = self.recv_collective(root, kind::BROADCAST, seq, &deadline)?;
                self.decode(root, incoming)
            }
            (true, None) => Err(Error::Misuse(format!(
                "rank {root} is the broadcast root but gave no data"
            ))),
            (false, Some(_)) => Err(Error::Misuse(format!(
                "rank {} gave data to a broadcast rooted at rank {root}",
                self.rank()
            ))),
        }
    }

    fn next_seq(&mut self) -> u64 {
        let seq = self.seq;
        self.seq += 1;
        seq
    }

    // -----------------------------------------------------------------------------------------
    // Point to point

    /// Sends `data` (up to [`MAX_PAYLOAD`] bytes) to `rank`; it is received, in order, by that
    /// rank's [`Self::recv`] from this one.
    ///
    /// # Errors
    ///
    /// [`Error::RankOutOfRange`] (this rank's own included), [`Error::TooLarge`],
    /// [`Error::PeerLost`], [`Error::Timeout`], [`Error::Payload`].
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
        let deadline = Deadline::new("send", timeout);
        let tag = self.sent_to[rank as usize];
        let outgoing = self.encode(kind::SEND, tag, data, 1, &deadline)?;
        self.send_message(rank, outgoing, &deadline)?;
        self.sent_to[rank as usize] += 1;
        Ok(())
    }

    /// The next message `rank` sent this rank with [`Self::send`].
    ///
    /// # Errors
    ///
    /// As for [`Self::send`].
    pub fn recv(&mut self, rank: u32) -> Result<Vec<u8>, Error> {
        self.recv_from_timeout(rank, self.timeout)
    }

    /// [`Self::recv`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::send`].
    pub fn recv_from_timeout(&mut self, rank: u32, timeout: Duration) -> Result<Vec<u8>, Error> {
        self.check_peer(rank)?;
        let deadline = Deadline::new("recv", timeout);
        let incoming = loop {
            let queue = &mut self.unread[rank as usize];
            if let Some(at) = queue
                .iter()
                .position(|m| m.kind & !kind::IN_PAYLOAD == kind::SEND)
            {
                break queue
                    .remove(at)
                    .unwrap_or_else(|| unreachable!("position is in range"));
            }
            let message = self.recv_message(rank, &deadline)?;
            self.unread[rank as usize].push_back(message);
        };
        let expected = self.received_from[rank as usize];
        if incoming.tag != expected {
            return Err(Error::Protocol {
                peer: rank,
                detail: format!(
                    "message number {} arrived where {expected} was due",
                    incoming.tag
                ),
            });
        }
        self.received_from[rank as usize] += 1;
        self.decode(rank, incoming)
    }

    fn check_peer(&self, rank: u32) -> Result<(), Error> {
        self.check_rank(rank)?;
        if rank == self.rank() {
            return Err(Error::Misuse(format!("rank {rank} cannot message itself")));
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // Messages, payloads and acknowledgements

    /// The message carrying `data`: inline, or through the payload region for `receivers`.
    fn encode(
        &mut self,
        kind: u32,
        tag: u64,
        data: &[u8],
        receivers: u32,
        deadline: &Deadline,
    ) -> Result<Message, Error> {
        if data.len() > MAX_PAYLOAD {
            return Err(Error::TooLarge {
                max: MAX_PAYLOAD,
                found: data.len(),
            });
        }
        let mut inline = [0u8; INLINE_BYTES];
        if data.len() <= INLINE_BYTES || receivers == 0 {
            let len = data.len().min(INLINE_BYTES);
            inline[..len].copy_from_slice(&data[..len]);
            return Ok(message(kind, tag, data.len() as u32, inline));
        }
        let payload = loop {
            match self.inner.payload().alloc(data) {
                Ok(payload) => break payload,
                // Blocks are waiting on acknowledgements: take in what has arrived and try again
                // until the deadline (receivers send them as soon as their rings have room).
                Err(shmbroker_allocator::Error::Exhausted { .. }) if !deadline.left().is_zero() => {
                    let waiting = self.unacked.len();
                    self.drain_acks()?;
                    if self.unacked.len() == waiting {
                        std::thread::sleep(EXHAUSTED_BACKOFF.min(deadline.left()));
                    }
                }
                Err(other) => return Err(other.into()),
            }
        };
        self.unacked.insert(payload.offset, (payload, receivers));
        inline[..size_of::<PayloadRef>()].copy_from_slice(bytemuck::bytes_of(&payload));
        Ok(message(
            kind | kind::IN_PAYLOAD,
            tag,
            data.len() as u32,
            inline,
        ))
    }

    /// The data a message from `peer` carries; a payload is copied out and acknowledged.
    fn decode(&mut self, peer: u32, incoming: Message) -> Result<Vec<u8>, Error> {
        let len = incoming.len as usize;
        if incoming.kind & kind::IN_PAYLOAD == 0 {
            if len > INLINE_BYTES {
                return Err(Error::Protocol {
                    peer,
                    detail: format!("inline length {len}, at most {INLINE_BYTES} fit"),
                });
            }
            return Ok(incoming.inline[..len].to_vec());
        }
        let payload: PayloadRef =
            bytemuck::pod_read_unaligned(&incoming.inline[..size_of::<PayloadRef>()]);
        if payload.len as usize != len {
            return Err(Error::Protocol {
                peer,
                detail: format!(
                    "message says {len} bytes, its payload reference {}",
                    payload.len
                ),
            });
        }
        let data = self.inner.payload().read(payload)?;
        let mut inline = [0u8; INLINE_BYTES];
        inline[..size_of::<PayloadRef>()].copy_from_slice(bytemuck::bytes_of(&payload));
        // The acknowledgement only lets the sender free its block, so it never holds this rank
        // up: it is queued and goes out as soon as the ring to the sender has room.
        self.acks_due[peer as usize].push_back(message(kind::PAYLOAD_ACK, 0, 0, inline));
        self.flush_acks(peer)?;
        Ok(data)
    }

    /// Handles an acknowledgement from `peer`: frees the block once every receiver is done.
    fn acknowledged(&mut self, peer: u32, ack: &Message) -> Result<(), Error> {
        let payload: PayloadRef =
            bytemuck::pod_read_unaligned(&ack.inline[..size_of::<PayloadRef>()]);
        let Some((sent, due)) = self.unacked.get_mut(&payload.offset) else {
            return Err(Error::Protocol {
                peer,
                detail: format!(
                    "acknowledged payload at offset {} that is not awaiting one",
                    payload.offset
                ),
            });
        };
        *due -= 1;
        if *due == 0 {
            let sent = *sent;
            self.unacked.remove(&payload.offset);
            self.inner.payload().free(sent)?;
        }
        Ok(())
    }

    /// Sends the acknowledgements owed to `peer` that fit, in order, without waiting. A peer that
    /// has left needs none: they are dropped (a session that died says so on the next call).
    fn flush_acks(&mut self, peer: u32) -> Result<(), Error> {
        while let Some(&ack) = self.acks_due[peer as usize].front() {
            let link = self.link(peer)?;
            match link.to.try_send(ack) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => return Ok(()),
                Err(TrySendError::Disconnected(_)) => {
                    self.acks_due[peer as usize].clear();
                    return Ok(());
                }
                Err(TrySendError::Corrupted(_, corruption)) => {
                    return Err(Error::Corrupted { peer, corruption });
                }
            }
            self.acks_due[peer as usize].pop_front();
        }
        Ok(())
    }

    /// Reads whatever has arrived from every peer without waiting, handling acknowledgements and
    /// queueing the rest.
    fn drain_acks(&mut self) -> Result<(), Error> {
        for peer in self.peers() {
            self.drain_from(peer)?;
        }
        Ok(())
    }

    /// Reads whatever has arrived from `peer` without waiting: acknowledgements are handled,
    /// everything else is queued in order.
    fn drain_from(&mut self, peer: u32) -> Result<(), Error> {
        self.flush_acks(peer)?;
        loop {
            let link = self.link(peer)?;
            match link.from.try_recv() {
                Ok(message) => self.dispatch(peer, message)?,
                // A closed ring shows on the next send or receive, with its cause.
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return Ok(()),
                Err(TryRecvError::Corrupted(corruption)) => {
                    return Err(Error::Corrupted { peer, corruption });
                }
            }
        }
    }

    /// Acknowledgements are handled at once; everything else waits in the peer's queue.
    fn dispatch(&mut self, peer: u32, message: Message) -> Result<(), Error> {
        if message.kind == kind::PAYLOAD_ACK {
            self.acknowledged(peer, &message)
        } else {
            self.unread[peer as usize].push_back(message);
            Ok(())
        }
    }

    /// The next collective message from `peer`, which must be `kind` number `seq`.
    fn recv_collective(
        &mut self,
        peer: u32,
        kind: u32,
        seq: u64,
        deadline: &Deadline,
    ) -> Result<Message, Error> {
        let message = loop {
            let queue = &mut self.unread[peer as usize];
            if let Some(at) = queue
                .iter()
                .position(|m| m.kind & !kind::IN_PAYLOAD != kind::SEND)
            {
                break queue
                    .remove(at)
                    .unwrap_or_else(|| unreachable!("position is in range"));
            }
            let message = self.recv_message(peer, deadline)?;
            self.unread[peer as usize].push_back(message);
        };
        if message.kind & !kind::IN_PAYLOAD != kind || message.tag != seq {
            return Err(Error::CollectiveMismatch {
                peer,
                expected_kind: kind,
                expected_seq: seq,
                found_kind: message.kind & !kind::IN_PAYLOAD,
                found_seq: message.tag,
            });
        }
        Ok(message)
    }

    /// The next message from `peer` that is not an acknowledgement (which is handled).
    fn recv_message(&mut self, peer: u32, deadline: &Deadline) -> Result<Message, Error> {
        self.flush_acks(peer)?;
        loop {
            // While acknowledgements are owed to this peer, wait in slices and send them as room
            // appears: the peer may be waiting for them to free blocks before it can send more.
            let owing = !self.acks_due[peer as usize].is_empty();
            let wait = if owing {
                deadline.left().min(SEND_SLICE)
            } else {
                deadline.left()
            };
            let link = self.link(peer)?;
            let message = match link.from.recv_timeout(wait) {
                Ok(message) => message,
                Err(RecvTimeoutError::Timeout) if owing && !deadline.left().is_zero() => {
                    self.flush_acks(peer)?;
                    continue;
                }
                Err(RecvTimeoutError::Timeout) => return Err(deadline.timed_out(peer)),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::PeerLost {
                        rank: link.from.close_cause().unwrap_or(peer),
                    });
                }
                Err(RecvTimeoutError::Corrupted(corruption)) => {
                    return Err(Error::Corrupted { peer, corruption });
                }
            };
            if message.kind == kind::PAYLOAD_ACK {
                self.acknowledged(peer, &message)?;
            } else {
                return Ok(message);
            }
        }
    }

    /// Sends one message to `peer`. While the ring to it is full, takes in what `peer` has sent
    /// this rank: a peer blocked on a full ring back to us (with acknowledgements, say) stops
    /// reading, and two ranks each waiting for the other to read would otherwise wait out their
    /// deadlines.
    fn send_message(
        &mut self,
        peer: u32,
        outgoing: Message,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        self.flush_acks(peer)?;
        loop {
            let link = self.link(peer)?;
            let slice = deadline.left().min(SEND_SLICE);
            match link.to.send_timeout(outgoing, slice) {
                Ok(()) => return Ok(()),
                Err(SendTimeoutError::Timeout(_)) if deadline.left().is_zero() => {
                    return Err(deadline.timed_out(peer));
                }
                Err(SendTimeoutError::Timeout(_)) => self.drain_from(peer)?,
                Err(SendTimeoutError::Disconnected(_)) => {
                    return Err(Error::PeerLost {
                        rank: link.to.close_cause().unwrap_or(peer),
                    });
                }
                Err(SendTimeoutError::Corrupted(_, corruption)) => {
                    return Err(Error::Corrupted { peer, corruption });
                }
            }
        }
    }
}

fn message(kind: u32, tag: u64, len: u32, inline: [u8; INLINE_BYTES]) -> Message {
    Message {
        kind,
        len,
        tag,
        inline,
    }
}
