//! A logged-on worker's collectives and point-to-point messages, worker to worker over the rings.
//!
//! Every call has the session's default deadline ([`Session::set_timeout`], [`DEFAULT_TIMEOUT`]),
//! or its own through [`Session::with_timeout`]; the broker is not on any of these paths.
//!
//! # How a call is entered
//!
//! Every public call that waits enters through one of three guards in the `status` module:
//! `call` (or `collective`) for the calls that settle, `on_peer` for a call on one peer,
//! `tracked` for the rest (`recv_any`, `loan`). Only the split halves' `send` and `broadcast`
//! track by hand, as they give the session up while they wait. Each reads the call's deadline,
//! publishes the call in this rank's status words until it returns, and closes the streams of
//! ranks recorded dead since the last call; `call` also settles the outcome (a peer that gave
//! the call up named as such, the cause noted for this worker's leaving). Interrupts and
//! departures are checked in the waits themselves, where a call can block, and view
//! acknowledgements are flushed where a call is about to send. Which algorithm a collective
//! runs is asked of the `tuning` module.
//!
//! A collective runs among the team its communicator hands it (`Communicator::on_team`): the
//! world's, or a group's. Its algorithm takes that team as an argument, and its deadline names
//! the team's stream, so that a failure deep in a send or a receive names the team's members
//! (`Session::call_team`). No call changes which team the session is "on": there is no such
//! state. Only making a group keeps the members it is making, for the length of each attempt.
//!
//! # Messages of any size
//!
//! Every operation takes data of any length (up to what memory holds). Small data travels
//! eagerly in ring slots: 48 bytes in the header slot and 64 in each slot behind it, up to half a
//! ring ([`shmbroker_bindings::kind::EAGER_MAX`] at most). Larger data is pipelined through the sender's outbox in
//! chunks that receivers copy out and acknowledge, so both copies overlap and a slow receiver
//! holds the sender back; a message larger than the outbox goes through. [`Session::loan`] and
//! [`Session::send_loan`] hand a buffer over by reference instead, at a cost that does not depend
//! on its size. See the `send` and `receive` modules for the protocol, and `demux` for the framing.
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
//! [`Error::CollectiveMismatch`] instead of hanging or misreading. The tag also carries a
//! *stream*: the world's, or a [`Group`]'s, whose collectives ([`Session::on`]) take only their
//! own stream's messages (see the `groups` module). Point-to-point messages
//! (`SEND`) and collective messages share a ring; a message that arrives while another kind is
//! awaited waits in a per-peer queue, in order. Like `MPI_Send`, a send larger than the sender's
//! outbox returns only once its receiver is receiving it.
//!
//! # When a peer dies
//!
//! Every worker watches every peer's process itself (a pidfd the broker opened at that peer's
//! logon), whether or not the broker is still there. When a peer's process exits without having
//! dropped its session, it was **lost**: the watcher closes the two rings this worker shares with
//! it, waking whatever waits on them, and interrupts every collective (see the handshake's
//! `liveness` module and the queues crate's `interrupt` module). Then
//!
//! * a call that needs the dead rank (`send` to it, `recv` from it, `recv_any`'s turn at it)
//!   receives what it sent before dying, then fails with [`Error::PeerLost`] naming it;
//! * every collective, pending (even one waiting on a live peer, which is stuck on the dead rank
//!   too) or later, fails with [`Error::PeerLost`] naming the first rank that died: a collective
//!   needs every rank, so the session's collectives are over, and so are those of every group
//!   the dead rank is in (other groups carry on); [`Session::shrink`] gives the survivors a group
//!   of their own;
//! * point-to-point calls with the ranks still there go on, so a reader can carry on farming
//!   tasks to the workers left (`recv_any` reports each death once, then skips the dead rank).
//!
//! A peer that dropped its session **left**: calls that need it fail with [`Error::PeerLeft`],
//! others go on (a collective needs every rank). A job that has lost a worker (died or left)
//! admits nobody new, so a rank that had not logged on by then never will: the broker says so,
//! and calls that need it fail at once with [`Error::PeerNeverJoined`], naming it and the rank
//! that closed the job. With the broker gone, what needs it fails with [`Error::BrokerLost`].
//! Blocks of this rank's outbox that a departed peer still owed an acknowledgement for are given
//! back. Blocks that *live* peers owed for a collective cut short by a death come back too: each
//! peer closes the streams the dead rank was in and acknowledges what it drops of them (see the
//! `groups` module).
//!
//! # Who is where
//!
//! Every rank publishes what it is doing in status words at the start of its outbox, which only
//! it can write and its peers map read-only: the call in progress (with its collective number
//! and group, or its peer), since when, whom it waits for, and the last call it finished and
//! when (see the `status` module). A [`Error::Timeout`] reads them for every rank it waited for
//! and says what each is doing (`rank 2 is in no call (its last, all_reduce #11, finished 9.8 s
//! ago)`, `rank 3 is in recv from rank 1 for 3.1 s, waiting for rank 1`); a wait with no
//! deadline (`Duration::MAX`) logs the same as a warning after `SHMBROKER_WARN_AFTER` seconds
//! (60), then at doubling intervals, and keeps waiting. Publishing costs a few relaxed stores
//! per call and no clock read (calls stamp themselves with a coarse clock that each session's
//! watcher thread refreshes every 100 ms); [`Session::set_publishing`] and `SHMBROKER_STATUS=0`
//! turn it off.
//!
//! The words also keep the last collective the rank failed, and which rank its error named. A
//! collective's wait reads them for the rank it waits for every 100 ms: a rank whose last
//! failed collective is this very one has left it for good, and the wait fails at once with
//! [`Error::PeerGaveUp`] naming it (and, as its word, whom it blamed) instead of waiting to
//! its deadline, or for ever.
//!
//! # The module map
//!
//! The modules stack, and none imports one above it (`ci/module_dag.py` checks that in CI):
//!
//! 1. **State, which runs no call.** `tuning` (the choice of algorithm), `membership`
//!    (departures and rejoins taken in), `teams` (the ranks a collective runs among), `setup`
//!    (the layout of setup messages), `numbers` (what the calls number per peer: tags, channels,
//!    setup messages), `publisher` (this rank's status words), `demux` (framing a peer's ring
//!    slots into messages); then `engine` (the transport's state: links, outbox, buffers kept
//!    between calls), with its `peer` and `outgoing`.
//! 2. **`state`:** the [`Session`] struct and the `Deadline` every call runs under, over the
//!    engine, teams and membership.
//! 3. **The transport's paths,** under `engine` (`receive`, `send`, `acks`, `stepwise`, `any`,
//!    `loans`): the only code that reads the engine's fields, which are private to it. The rest
//!    of the session sends, receives and lends through what they define, and reads the engine
//!    through its methods, so the compiler keeps the rest out of its state. They hold no public
//!    call, and call no call guard (`status`): `recv_any` and the loans are `p2p`'s calls over
//!    `any` and `loans`, and `broadcast_loan` is `rooted`'s.
//! 4. **The calls,** each an `impl Session` block over `state` and the layers below it:
//!    departures and groups (`departures`, `agree`, `groups`, `rejoin`), and what users call
//!    (`p2p`, `collectives`, `rooted`, `exchange`, `reductions`, `symmetric`, `fds`, `gpu`,
//!    `channel`, `split`, `tokio_receiver`, `status`, and the [`Collectives`] trait in
//!    `communicator`).
//! 5. **This module:** connecting, the session's own settings, and what the crate exports.

mod agree;
mod channel;
mod collectives;
mod communicator;
/// The demultiplexer of a peer's ring slots, public for the `demux` fuzz target only.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod demux;
#[cfg(not(feature = "fuzzing"))]
mod demux;
mod departures;
mod engine;
mod exchange;
mod fds;
mod gpu;
mod groups;
mod membership;
mod numbers;
mod p2p;
mod publisher;
mod reductions;
mod rejoin;
mod rooted;
mod setup;
mod split;
mod state;
mod status;
mod symmetric;
mod teams;
#[cfg(feature = "tokio")]
mod tokio_receiver;
#[doc(hidden)]
pub mod tuning;

pub use channel::{
    ChannelReceiver, ChannelSender, LOOK_EVERY, RawChannelReceiver, RawChannelSender,
};
pub use communicator::Collectives;
pub use engine::FdTransport;
pub use engine::loans::LoanView;
pub use fds::MAX_FDS_PER_EXCHANGE;
pub use groups::{Group, GroupView};
pub use shmbroker_allocator::{DEFAULT_OUTBOX_BYTES, Loan};
pub use split::{Receiver, Sender, SessionGuard, TimedHalf};
pub use symmetric::Symmetric;
#[cfg(feature = "tokio")]
pub use tokio_receiver::{AsyncReceiver, TimedAsyncReceiver};
pub use tuning::FLAT_BROADCAST_MAX;

use shmbroker_allocator::Outbox;
use shmbroker_bindings::{ANY_RANK, LogonFrame};
use shmbroker_handshake::connect;
pub use shmbroker_handshake::{Interrupter, LeftAfter};
pub use shmbroker_queues::Waiting;
use std::path::Path;
use std::time::Duration;

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

pub use crate::error::{Error, ErrorKind};
pub use state::Session;
use state::{Deadline, EmbeddedBroker};

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
    /// named after the job, for as long as its session lives (unless `SHMBROKER_BROKER=external`
    /// says one already listens, as under `shmbroker run`); every rank logs on within
    /// `timeout`, retrying while the broker comes up.
    ///
    /// # Errors
    ///
    /// [`Error::Launch`] naming the variables that are missing or contradict each other;
    /// [`Error::Logon`] when the broker cannot be started or reached.
    pub fn from_env(timeout: Duration) -> Result<Self, Error> {
        let launch = crate::launch::from_env().map_err(Error::Launch)?;
        Self::from_launch(&launch, timeout)
    }

    /// Joins the job `launch` describes, as [`Self::from_env`] does with what the environment
    /// says: rank 0 hosts the broker on [`Launch::socket`](crate::launch::Launch::socket)
    /// unless [`Launch::external_broker`](crate::launch::Launch::external_broker), and every
    /// rank logs on there as [`Launch::rank`](crate::launch::Launch::rank) within `timeout`.
    /// For programs that agree on the socket path by other means (a torch.distributed store).
    ///
    /// # Errors
    ///
    /// [`Error::Logon`] when the broker cannot be started or reached, when the socket's
    /// directory is not private to this user, or when the broker there runs as another user.
    pub fn from_launch(launch: &crate::launch::Launch, timeout: Duration) -> Result<Self, Error> {
        if let Some(dir) = &launch.private_dir {
            shmbroker_handshake::private_dir(dir)?;
        }
        let embedded = if launch.rank == 0 && !launch.external_broker {
            let config = shmbroker_handshake::Config {
                world_size: launch.world_size,
                ..shmbroker_handshake::Config::default()
            };
            let mut listener = shmbroker_handshake::Listener::bind(&launch.socket, config)
                .map_err(|error| match error {
                    shmbroker_handshake::Error::AddressInUse { path } => Error::Launch(format!(
                        "a broker is already listening on {}, where this process (local rank 0) \
                         was to host one: if it was started for this job (shmbroker serve, a \
                         launcher), set {}=external so that no rank hosts another",
                        path.display(),
                        crate::launch::BROKER_VAR
                    )),
                    other => other.into(),
                })?;
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
    ///
    /// **Unstable:** plumbing for shmbroker's own tests, benchmarks and bindings, hidden from the
    /// documentation and outside the API's stability promise; it may change or go without notice.
    #[doc(hidden)]
    pub fn from_handshake_with(
        mut inner: shmbroker_handshake::Connection,
        outbox_bytes: u64,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let world = inner.world_size() as usize;
        let outbox = Outbox::create(inner.rank(), outbox_bytes).map_err(Error::OwnOutbox)?;
        if world > 1 {
            // Before peers can map it: they read which process of this rank they reach.
            use shmbroker_bindings::status_word::{ALIVE_SLOT, INCARNATION};
            outbox.status().slot(ALIVE_SLOT)[INCARNATION].store(
                u64::from(inner.rejoins()) + 1,
                std::sync::atomic::Ordering::Release,
            );
            inner.publish_outbox(outbox.fd(), timeout)?;
            inner.publish_heartbeat(outbox.status());
        }
        let cpus = cpus_allowed();
        let waiting = match spin_from_env()? {
            Some(spins) => Waiting::Spin(spins),
            None => Waiting::for_load(world, cpus),
        };
        // A replacement's world is over from the start (see `rejoin`).
        let (rank, rejoins) = (inner.rank(), inner.rejoins());
        let mut session = Self {
            inner,
            timeout: DEFAULT_TIMEOUT,
            groups: teams::Groups::new(rank, world as u32),
            membership: membership::Membership::new(world, (rejoins > 0).then_some(rank)),
            engine: engine::Engine::new(world, outbox, cpus, waiting),
            numbers: numbers::PeerNumbers::world(world),
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

    /// Sets the deadline of every call that is not given its own with [`Self::with_timeout`].
    /// `Duration::MAX` (here, in [`Self::with_timeout`], and in [`Self::connect`]) waits
    /// without a deadline, for as long as it takes: a peer's death or departure, a dead broker
    /// and an interrupt still end the wait.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The deadline of every call that is not given its own ([`Self::set_timeout`]).
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The session, with `timeout` as the deadline of every call made through the value
    /// returned, as torch's per-call `timeout` and MPI's lack of one would have it:
    ///
    /// ```no_run
    /// # fn demo(session: &mut shmbroker::Session) -> Result<(), shmbroker::Error> {
    /// use shmbroker::Collectives;
    /// use std::time::Duration;
    /// session.with_timeout(Duration::from_secs(2)).barrier()?;
    /// let reply = session.with_timeout(Duration::from_millis(50)).recv(1)?;
    /// # let _ = reply; Ok(()) }
    /// ```
    ///
    /// The session's own deadline is back when the value is dropped (so a
    /// [`Self::set_timeout`] made through it lasts as long as it does).
    pub fn with_timeout(&mut self, timeout: Duration) -> Timed<'_> {
        let saved = std::mem::replace(&mut self.timeout, timeout);
        Timed {
            session: self,
            saved,
        }
    }

    /// How every wait of this session spends its time before parking. By default
    /// [`Waiting::Adaptive`], crowded when the world has more ranks than this process has CPUs
    /// ([`Self::cpus`]; every rank is taken to be runnable), unless [`SPIN_VAR`] fixes it.
    #[must_use]
    pub fn waiting(&self) -> Waiting {
        self.engine.waiting()
    }

    /// Sets how every wait of this session waits (see [`shmbroker_queues::Waiting`]).
    pub fn set_waiting(&mut self, waiting: Waiting) {
        self.engine.set_waiting(waiting);
        for peer in self.peers() {
            if let Some(link) = self.inner.link(peer) {
                link.to.set_waiting(waiting);
                link.from.set_waiting(waiting);
            }
        }
    }

    /// The CPUs this process was allowed to run on at logon (`sched_getaffinity`), against which
    /// the world size decides whether waits run crowded.
    #[must_use]
    pub fn cpus(&self) -> usize {
        self.engine.cpus()
    }

    /// The handshake-level session: raw rings and the broker socket.
    ///
    /// **Unstable:** plumbing for shmbroker's own tests, benchmarks and bindings, hidden from the
    /// documentation and outside the API's stability promise; it may change or go without notice.
    #[doc(hidden)]
    pub fn raw(&mut self) -> &mut shmbroker_handshake::Connection {
        &mut self.inner
    }

    /// The size of this rank's outbox in bytes (its header included; see
    /// [`Self::max_loan_bytes`]).
    #[must_use]
    pub fn outbox_bytes(&self) -> u64 {
        self.engine.outbox_size()
    }

    /// The largest loan this rank's outbox can ever make ([`Self::loan`]): its capacity, at most
    /// 4 GiB - 1 (a reference's length is 32 bits).
    #[must_use]
    pub fn max_loan_bytes(&self) -> usize {
        let most = self.engine.outbox_capacity().min(u64::from(u32::MAX));
        usize::try_from(most).unwrap_or(usize::MAX)
    }

    /// Blocks of this rank's outbox sent and still awaiting some peer's acknowledgement.
    #[must_use]
    pub fn outbox_blocks_owed(&self) -> usize {
        self.engine.blocks_owed()
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
                .map_err(|error| deadline.handshake_failed(peer, error))
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

    /// A handle that ends this session's current wait from another thread or a signal handler
    /// (its `interrupt` is async-signal-safe): the call returns [`Error::Interrupted`]. With no
    /// call waiting, the next wait ends at once unless [`Self::clear_interrupt`] forgets it.
    /// Waits on the rings end (every message and collective); a wait for the broker (an fd relay,
    /// a peer still to log on) runs to its deadline.
    ///
    /// A large message ends between two of its chunks:
    ///
    /// * a receive returns [`Error::Interrupted`] and keeps what it had: the next receive of the
    ///   message gets it whole (and a `recv_into` too small for it gets
    ///   [`Error::BufferTooSmall`]);
    /// * a point-to-point send whose message has started going out cannot call it back: it
    ///   returns `Ok`, as a buffered send (`MPI_Bsend`), after copying the rest of the message;
    ///   the session's next call finishes it before anything else goes out (or any wait parks),
    ///   so it arrives once, whole and in order. The interrupt stays pending, so that next call
    ///   returns [`Error::Interrupted`] first. A session dropped before then cuts the message off
    ///   (its receiver gets [`Error::PeerLeft`]).
    #[must_use]
    pub fn interrupter(&self) -> Interrupter {
        self.inner.interrupter()
    }

    /// Forgets an interrupt that no wait has taken (it came after the call it was meant for).
    pub fn clear_interrupt(&self) {
        self.inner.clear_interrupt();
    }
}

/// A session whose calls have their own deadline, from [`Session::with_timeout`]: every
/// [`Session`] call works on it, and so does every collective once [`Collectives`] is in
/// scope. Dropping it gives the session its own deadline back.
#[derive(Debug)]
pub struct Timed<'a> {
    session: &'a mut Session,
    saved: Duration,
}

impl std::ops::Deref for Timed<'_> {
    type Target = Session;

    fn deref(&self) -> &Session {
        self.session
    }
}

impl std::ops::DerefMut for Timed<'_> {
    fn deref_mut(&mut self) -> &mut Session {
        self.session
    }
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        self.session.timeout = self.saved;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn cpus_allowed_counts_this_process_cpus() {
        let cpus = cpus_allowed();
        assert!(cpus >= 1);
        assert!(cpus <= std::thread::available_parallelism().unwrap().get());
    }
}
