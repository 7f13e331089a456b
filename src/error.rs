//! Why a session call failed: [`Error`], its fields, and how it reads.

use shmbroker_handshake::LeftAfter;
use shmbroker_queues::Corruption;
use std::time::Duration;

/// Why a session call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Logging on failed.
    #[error(transparent)]
    Logon(#[from] shmbroker_handshake::Error),
    /// A worker of the session died (its process exited without dropping its session). Calls
    /// that need it fail naming it, once what it sent before dying has been received; every
    /// collective, pending or later, fails naming the first rank that died (a collective needs
    /// every rank). Point-to-point calls with the ranks still there go on.
    ///
    /// Renders as "peer rank 2 was lost (its process exited without leaving): rank 2 was in
    /// all_reduce #5 for 1.2 s" when what it last published could be read.
    ///
    /// Also for a collective of a team (the world, or a group) formed before one of its members
    /// was replaced (see [`Error::PeerRejoined`]): the process that was that member died. The
    /// rank may be alive again, or be this very rank in the replacement itself; `diagnosis` says
    /// so, and that a new group is what to make.
    #[error(
        "peer rank {rank} was lost (its process exited without leaving){}",
        diagnosis_text(diagnosis)
    )]
    PeerLost {
        /// The rank that was lost.
        rank: u32,
        /// What it was doing when it died, read from what it last published (see "Who is
        /// where" in the `Session` docs): one sentence, or none when that could not be read.
        diagnosis: Vec<String>,
    },
    /// Rank `rank` died and a new process took its place (it rejoined the job): reported once
    /// by [`Session::recv_any`](crate::Session::recv_any) and its kin, after the
    /// [`Error::PeerLost`] for the dead process, when this session takes the replacement on.
    /// Point-to-point with `rank` works again from then on, numbered afresh; what the dead
    /// process never read is gone. Collectives of groups it was in stay over: make a new group
    /// (see [`Session::wait_for_rank`](crate::Session::wait_for_rank)).
    #[error("peer rank {rank} rejoined{}", rejoined_text(*times))]
    PeerRejoined {
        /// The rank.
        rank: u32,
        /// How many times it has been replaced in this job: 0 for a rank that had not logged on
        /// when the job lost a worker, and came late (it is taken on the same way).
        times: u32,
    },
    /// A worker this call needs dropped its session (on purpose). Calls that do not need it go on.
    /// Renders as "peer rank 0 left the session after rank 2 died" or "... after timing out
    /// waiting for rank 2" when it said what it gave up on, and then, when that rank's process
    /// is stopped, ": rank 2 is stopped (it has not run for 1.4 s): ...".
    #[error(
        "peer rank {rank} left the session{}{}",
        left_after_text(*after),
        diagnosis_text(diagnosis)
    )]
    PeerLeft {
        /// The rank that left.
        rank: u32,
        /// What it had given up on when it left: a death this worker saw too, or (its word) a
        /// call of its that timed out waiting for a rank.
        after: Option<LeftAfter>,
        /// When it timed out on a rank whose process this worker finds stopped: one sentence
        /// naming it (see [`Error::Timeout`]'s `stopped`). Otherwise empty.
        diagnosis: Vec<String>,
    },
    /// A rank this call needs never logged on, and no longer can: the broker closed the job to
    /// newcomers when rank `after` died or left (a job that has lost a worker admits nobody new).
    /// Calls that do not need it go on; [`Session::recv_any`](crate::Session::recv_any) skips it.
    #[error(
        "peer rank {rank} never logged on, and no longer can: the job was closed to newcomers when rank {after} {}",
        if *after_left { "left" } else { "died" }
    )]
    PeerNeverJoined {
        /// The rank that never came.
        rank: u32,
        /// The rank whose death or departure closed the job to newcomers.
        after: u32,
        /// Whether `after` left (rather than died).
        after_left: bool,
    },
    /// The broker is gone, and this call needed it: a peer that never logged on while it was
    /// there, an fd relay, or a peer's outbox still to come. Peers already logged on can still
    /// be reached.
    #[error("the broker is gone (its socket closed)")]
    BrokerLost,
    /// An [`Interrupter`](crate::session::Interrupter) ended the wait (a Ctrl-C, say). Nothing
    /// was lost: a message not yet received is still there, and one cut off between its chunks
    /// is received whole by the next receive. (A point-to-point send ended by an interrupt after
    /// part of its message went out is reported done instead, and finished by the session's next
    /// calls: see [`Session::interrupter`](crate::Session::interrupter).) A collective cut short
    /// this way is left on this rank: the ranks waiting for its part there fail with
    /// [`Error::PeerGaveUp`] naming it. Do not go on with collectives after one: the ranks are
    /// out of step.
    #[error("interrupted while waiting")]
    Interrupted,
    /// The other end of a typed channel closed it (dropped its end). What it sent before is
    /// received first; a peer whose process died is [`Error::PeerLost`] instead.
    #[error("rank {peer} closed channel #{number} {direction} this rank")]
    ChannelClosed {
        /// The rank at the other end.
        peer: u32,
        /// The channel's number among those between the two ranks in its direction.
        number: u64,
        /// `"from"` (this rank produces) or `"to"` (this rank consumes).
        direction: &'static str,
    },
    /// The deadline passed.
    #[error(
        "{op} timed out after {timeout:?} waiting for {}{}",
        ranks_text(waiting_for),
        diagnosis_text(diagnosis)
    )]
    Timeout {
        /// The call (`barrier`, `all_gather`, `recv`, ...).
        op: &'static str,
        /// The ranks it was still waiting for, in rank order (never empty): for a collective,
        /// every peer whose part had not arrived when the deadline passed.
        waiting_for: Vec<u32>,
        /// The call's timeout.
        timeout: Duration,
        /// What each rank of `waiting_for` was doing then, one sentence each, in the same order,
        /// from what it publishes: `rank 2 is in no call (its last, all_reduce #11, finished
        /// 9.8 s ago)`, `rank 3 is in recv from rank 1 for 3.1 s` (see `Session`'s "Who is
        /// where"). Empty when nothing could be read. Then, for a process found stopped along
        /// the waits of those ranks, a sentence naming it: `rank 1 waits for rank 3, which is
        /// stopped (it has not run for 2.1 s): ...`.
        diagnosis: Vec<String>,
        /// A rank whose process is stopped (`SIGSTOP`, a debugger) that this call's wait leads
        /// to: one of `waiting_for`, or a rank one of them waits for, and so on. The rank this
        /// error names ([`Error::rank`]) when there is one.
        stopped: Option<u32>,
    },
    /// A rank argument outside the world.
    #[error("rank {rank} is out of range for a world of {world_size}")]
    RankOutOfRange {
        /// The rank given.
        rank: u32,
        /// The world size.
        world_size: u32,
    },
    /// A message longer than the buffer given to receive it. A point-to-point receive
    /// (`recv_into`, `recv_any_into`) keeps it: the next receive from `peer` gets it whole. In
    /// a collective it was received to its end and dropped.
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
        "rank {peer} called {} {} while this rank called {} {}",
        op_text(*found_kind),
        crate::tag::seq_text(*found_seq),
        op_text(*expected_kind),
        crate::tag::seq_text(*expected_seq)
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
    /// A peer this collective waits for failed its own part of it and left it (its deadline
    /// passed, a peer sent it bad bytes, an interrupt ended it): it will send nothing more for
    /// it, so this rank fails at once instead of at its deadline, or never. Renders as "peer
    /// rank 1 gave up on all_reduce #5 (its own call failed naming rank 2)".
    ///
    /// Seen in what the peer publishes (see "Who is where" in the `Session` docs), within a few
    /// hundred milliseconds of its failure. `named` is the peer's word, not checked here: a
    /// hostile peer can end this call early, as it could by never taking part.
    #[error(
        "peer rank {rank} gave up on {op} {} (its own call failed{})",
        crate::tag::seq_text(*seq),
        named.map_or_else(String::new, |named| format!(" naming rank {named}"))
    )]
    PeerGaveUp {
        /// The peer that left the collective (a world rank).
        rank: u32,
        /// The collective (this rank's call).
        op: &'static str,
        /// Its number (its first, for a call that takes several), tagged with its group as in
        /// [`Error::CollectiveMismatch`].
        seq: u64,
        /// The rank the peer's error named, if it named one: the rank it timed out waiting for,
        /// that sent it bad bytes, that died.
        named: Option<u32>,
    },
    /// Members of a group passed different ranks to [`crate::Session::group`]. Renders as
    /// "rank 2 made a group of ranks [0, 1, 2] where this rank made one of ranks [0, 2]".
    #[error(
        "rank {peer} made a group of ranks {found:?} where this rank made one of ranks {expected:?}"
    )]
    GroupMismatch {
        /// The member that disagreed (a world rank).
        peer: u32,
        /// The ranks this rank passed.
        expected: Vec<u32>,
        /// The ranks `peer` passed.
        found: Vec<u32>,
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

/// What kind of failure an [`Error`] is: the one table every language maps from, one to one
/// (the C ABI's `SHMBROKER_E_*` codes, which the C++ header's `shmbroker::Error::code()`
/// carries, and the Python exception classes). [`Error::kind`] is the only place that sorts
/// errors into kinds.
///
/// | kind | errors | C | Python |
/// |---|---|---|---|
/// | `PeerLost` | `PeerLost`; a logon or fd relay that saw a peer die | `SHMBROKER_E_PEER_LOST` | `PeerLost` |
/// | `PeerRejoined` | `PeerRejoined` | `SHMBROKER_E_PEER_REJOINED` | `PeerRejoined` |
/// | `PeerLeft` | `PeerLeft` | `SHMBROKER_E_PEER_LEFT` | `PeerLeft` |
/// | `PeerNeverJoined` | `PeerNeverJoined`; a logon or relay that waited for it | `SHMBROKER_E_PEER_NEVER_JOINED` | `PeerNeverJoined` |
/// | `PeerGaveUp` | `PeerGaveUp` | `SHMBROKER_E_PEER_GAVE_UP` | `PeerGaveUp` |
/// | `Timeout` | `Timeout` | `SHMBROKER_E_TIMEOUT` | `Timeout` |
/// | `BrokerLost` | `BrokerLost`; a logon or relay that found the broker gone | `SHMBROKER_E_BROKER_LOST` | `BrokerLost` |
/// | `Logon` | `Logon` (otherwise), `Launch` | `SHMBROKER_E_LOGON` | `LogonError` |
/// | `BufferTooSmall` | `BufferTooSmall` | `SHMBROKER_E_TOO_SMALL` | `BufferTooSmall` |
/// | `Misuse` | `Misuse`, `RankOutOfRange` | `SHMBROKER_E_MISUSE` | `MisuseError` |
/// | `Resource` | `Io`, `OwnOutbox`, `FdTransport`, `Relay` (otherwise) | `SHMBROKER_E_IO` | `ResourceError` |
/// | `Interrupted` | `Interrupted` | `SHMBROKER_E_INTERRUPTED` | `Error` (a signal's own exception, such as `KeyboardInterrupt`, comes first) |
/// | `Protocol` | `Protocol`, `Corrupted`, `CollectiveMismatch`, `GroupMismatch`, `Outbox`, `StaleFdTicket` | `SHMBROKER_E_PROTOCOL` | `ProtocolError` |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A peer's process died.
    PeerLost,
    /// A dead peer's replacement was taken on.
    PeerRejoined,
    /// A peer dropped its session.
    PeerLeft,
    /// A peer never logged on, and no longer can.
    PeerNeverJoined,
    /// A peer failed its part of this collective and left it.
    PeerGaveUp,
    /// The call's deadline passed.
    Timeout,
    /// The broker is gone, and the call needed it.
    BrokerLost,
    /// Logging on (or finding the job from the environment) failed.
    Logon,
    /// A receive's buffer is smaller than the message, which is kept.
    BufferTooSmall,
    /// A mistake of the calling program.
    Misuse,
    /// The operating system refused what the call needed (memory, fds, a system call).
    Resource,
    /// An interrupt ended the call.
    Interrupted,
    /// The other end of a typed channel closed it.
    ChannelClosed,
    /// A peer sent what the protocol does not allow, or called another collective.
    Protocol,
}

impl Error {
    /// What kind of failure this is (see [`ErrorKind`]).
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        use shmbroker_handshake::Error as Handshake;
        match self {
            Self::PeerLost { .. }
            | Self::Logon(Handshake::PeerLost { .. } | Handshake::PeerGone { left: false, .. })
            | Self::Relay {
                source: Handshake::PeerLost { .. } | Handshake::PeerGone { left: false, .. },
                ..
            } => ErrorKind::PeerLost,
            Self::PeerRejoined { .. } => ErrorKind::PeerRejoined,
            Self::PeerLeft { .. }
            | Self::Logon(Handshake::PeerGone { left: true, .. })
            | Self::Relay {
                source: Handshake::PeerGone { left: true, .. },
                ..
            } => ErrorKind::PeerLeft,
            Self::PeerNeverJoined { .. }
            | Self::Logon(Handshake::PeerNeverJoined { .. })
            | Self::Relay {
                source: Handshake::PeerNeverJoined { .. },
                ..
            } => ErrorKind::PeerNeverJoined,
            Self::PeerGaveUp { .. } => ErrorKind::PeerGaveUp,
            Self::Timeout { .. } => ErrorKind::Timeout,
            Self::BrokerLost
            | Self::Logon(Handshake::BrokerLost { .. })
            | Self::Relay {
                source: Handshake::BrokerLost { .. },
                ..
            } => ErrorKind::BrokerLost,
            Self::Logon(_) | Self::Launch(_) => ErrorKind::Logon,
            Self::BufferTooSmall { .. } => ErrorKind::BufferTooSmall,
            Self::Misuse(_) | Self::RankOutOfRange { .. } => ErrorKind::Misuse,
            Self::Io { .. } | Self::OwnOutbox(_) | Self::FdTransport(_) | Self::Relay { .. } => {
                ErrorKind::Resource
            }
            Self::Interrupted => ErrorKind::Interrupted,
            Self::ChannelClosed { .. } => ErrorKind::ChannelClosed,
            Self::Protocol { .. }
            | Self::Corrupted { .. }
            | Self::CollectiveMismatch { .. }
            | Self::GroupMismatch { .. }
            | Self::Outbox { .. }
            | Self::StaleFdTicket { .. } => ErrorKind::Protocol,
        }
    }

    /// The rank this error is about, when it names one: the peer that died, left, never came,
    /// sent bad bytes or disagreed (also when a logon or an fd relay failed on it); for a
    /// timeout, the stopped rank its wait leads to if it found one, else the first rank it
    /// waited for; a rank out of range.
    #[must_use]
    pub fn rank(&self) -> Option<u32> {
        use shmbroker_handshake::Error as Handshake;
        match self {
            Self::Logon(
                Handshake::PeerLost { rank, .. }
                | Handshake::PeerNeverJoined { rank, .. }
                | Handshake::PeerGone { rank, .. },
            ) => Some(*rank),
            Self::Relay {
                source:
                    Handshake::PeerLost { rank, .. }
                    | Handshake::PeerNeverJoined { rank, .. }
                    | Handshake::PeerGone { rank, .. },
                ..
            } => Some(*rank),
            Self::PeerLost { rank, .. }
            | Self::PeerRejoined { rank, .. }
            | Self::PeerLeft { rank, .. }
            | Self::PeerNeverJoined { rank, .. }
            | Self::PeerGaveUp { rank, .. }
            | Self::RankOutOfRange { rank, .. } => Some(*rank),
            Self::BufferTooSmall { peer, .. }
            | Self::CollectiveMismatch { peer, .. }
            | Self::GroupMismatch { peer, .. }
            | Self::Protocol { peer, .. }
            | Self::Corrupted { peer, .. }
            | Self::Outbox { peer, .. }
            | Self::ChannelClosed { peer, .. }
            | Self::Relay { peer, .. } => Some(*peer),
            Self::StaleFdTicket { exporter, .. } => Some(*exporter),
            Self::Timeout {
                waiting_for,
                stopped,
                ..
            } => stopped.or_else(|| waiting_for.first().copied()),
            Self::Logon(_)
            | Self::BrokerLost
            | Self::Interrupted
            | Self::Misuse(_)
            | Self::Io { .. }
            | Self::OwnOutbox(_)
            | Self::FdTransport(_)
            | Self::Launch(_) => None,
        }
    }
}

fn left_after_text(after: Option<LeftAfter>) -> String {
    match after {
        None => String::new(),
        Some(LeftAfter::Died(rank)) => format!(" after rank {rank} died"),
        Some(LeftAfter::TimedOut(rank)) => format!(" after timing out waiting for rank {rank}"),
    }
}

pub(crate) fn op_text(op: u32) -> String {
    shmbroker_bindings::kind::name(op).map_or_else(|| format!("operation {op}"), str::to_owned)
}

/// `: ` and the diagnosis sentences, or nothing.
fn diagnosis_text(diagnosis: &[String]) -> String {
    if diagnosis.is_empty() {
        String::new()
    } else {
        format!(": {}", diagnosis.join("; "))
    }
}

/// "rank 3", or "ranks 1, 2 and 5".
pub(crate) fn ranks_text(ranks: &[u32]) -> String {
    match ranks {
        [] => "no rank".into(),
        [rank] => format!("rank {rank}"),
        [init @ .., last] => {
            let init: Vec<String> = init.iter().map(u32::to_string).collect();
            format!("ranks {} and {last}", init.join(", "))
        }
    }
}

/// What [`Error::PeerRejoined`] says of how the rank came back.
fn rejoined_text(times: u32) -> String {
    if times == 0 {
        ": it had not logged on when the job lost a worker, and came late".into()
    } else {
        format!(": a new process took the place of the one that died (replacement {times})")
    }
}
