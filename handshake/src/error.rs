//! Errors of the logon protocol, on both sides.

use nix::errno::Errno;
use shmbroker_bindings::RejectReason;
use std::path::PathBuf;
use std::time::Duration;

/// Why binding, serving or connecting failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is out of its limits.
    #[error("invalid broker config: {field} {reason}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A broker is already listening on the path.
    #[error("a broker is already listening on {}", path.display())]
    AddressInUse {
        /// The socket path.
        path: PathBuf,
    },
    /// The broker listening on the path runs as another user: nothing was sent to it. A job's
    /// broker runs as the job's user or as root; [`BROKER_UID_VAR`](crate::BROKER_UID_VAR)
    /// trusts one more uid.
    #[error(
        "the broker at {} runs as uid {uid} (pid {pid}), not as this user (uid {mine}) or root: \
         refusing to log on to another user's broker (set {var}={uid} if you trust it)",
        path.display(),
        var = crate::BROKER_UID_VAR
    )]
    UntrustedBroker {
        /// The socket path.
        path: PathBuf,
        /// The broker's uid (`SO_PEERCRED`).
        uid: u32,
        /// The broker's pid, as this process's namespace sees it (0 outside it).
        pid: i32,
        /// This process's effective uid.
        mine: u32,
    },
    /// A private socket directory is not private: another user owns it, or others may write
    /// it. Nothing was bound or reached there.
    #[error(
        "{} is not a private directory of this user (uid {mine}): {why}; set XDG_RUNTIME_DIR \
         (or TMPDIR) to a directory of your own, or SHMBROKER_SOCKET to a path in one",
        path.display()
    )]
    NotPrivate {
        /// The directory.
        path: PathBuf,
        /// What is wrong: its owner or its mode.
        why: String,
        /// This process's effective uid.
        mine: u32,
    },
    /// The path exists and is not a socket: a broker will not bind over it (it is left alone),
    /// and a worker will not wait for a broker there.
    #[error("{} exists and is not a socket (is the path right?)", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A system call on a path failed (binding the socket, say: a missing directory is
    /// `ENOENT`, one the broker may not write is `EACCES`).
    #[error("{op} {}: {source}", path.display())]
    Path {
        /// The call.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// What it returned.
        #[source]
        source: Errno,
    },
    /// A system call failed.
    #[error("{op} failed: {source}")]
    Sys {
        /// The call.
        op: &'static str,
        /// What it returned.
        #[source]
        source: Errno,
    },
    /// The broker could not be reached, and waiting would not help: the path is a socket nobody
    /// listens on (`ECONNREFUSED`, left by a broker that is gone), or unusable (too long, no
    /// permission).
    #[error("connecting to {}: {}", path.display(), connect_reason(*source))]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// Why.
        #[source]
        source: Errno,
    },
    /// The deadline passed.
    #[error("logon timed out after {timeout:?} while {stage}")]
    Timeout {
        /// What was being waited for.
        stage: &'static str,
        /// The whole logon's timeout.
        timeout: Duration,
    },
    /// The broker refused the logon.
    #[error("broker refused the logon ({reason:?}): {text}")]
    Rejected {
        /// Why, as a code.
        reason: RejectReason,
        /// Why, in words.
        text: String,
    },
    /// The broker's reply broke the protocol; every fd it carried has been closed.
    #[error("bad reply from the broker: {0}")]
    Protocol(#[from] ProtocolError),
    /// A ring in the reply could not be joined.
    #[error("joining the ring {role} rank {peer}: {source}")]
    Ring {
        /// "to" or "from".
        role: &'static str,
        /// The peer rank.
        peer: u32,
        /// Why.
        #[source]
        source: shmbroker_queues::Error,
    },
    /// A ring could not be created.
    #[error("creating a ring: {0}")]
    CreateRing(#[source] shmbroker_queues::Error),
    /// No broker answered at the path before the deadline.
    #[error("no broker at {} after {} ({})", path.display(), seconds(*timeout), last.desc())]
    Unreachable {
        /// The socket path.
        path: PathBuf,
        /// The whole logon's timeout.
        timeout: Duration,
        /// What the last attempt to connect returned (`ENOENT`: no socket file there yet).
        last: Errno,
    },
    /// A message went out cut short: the other side's stream is out of step from there on.
    #[error("{what} cut short: {sent} of {expected} bytes sent")]
    ShortSend {
        /// What was being sent.
        what: &'static str,
        /// Its length.
        expected: usize,
        /// What went out.
        sent: usize,
    },
    /// A peer died while this call waited for something the broker was to pass on.
    #[error("peer rank {rank} was lost while {stage}")]
    PeerLost {
        /// The first rank seen to die.
        rank: u32,
        /// What was being waited for.
        stage: &'static str,
    },
    /// The broker said the peer is gone (it left, or its process ended) while this call waited
    /// for something that peer was to send through the broker. The broker sends its word after
    /// everything it passed on from that peer, so nothing more will come.
    #[error("peer rank {rank} is gone (the broker saw it {}) while {stage}", if *left { "leave" } else { "end" })]
    PeerGone {
        /// The rank.
        rank: u32,
        /// Whether it said goodbye first (it left) rather than its process ending without one.
        left: bool,
        /// What was being waited for.
        stage: &'static str,
    },
    /// The peer this call waited for never logged on, and no longer can: the broker closed the
    /// job to newcomers when rank `after` died or left.
    #[error(
        "peer rank {rank} never logged on while {stage}, and no longer can: the job was closed to newcomers when rank {after} {}",
        if *after_left { "left" } else { "died" }
    )]
    PeerNeverJoined {
        /// The rank that never came.
        rank: u32,
        /// The rank whose death or departure wound the job down.
        after: u32,
        /// Whether `after` left (rather than died).
        after_left: bool,
        /// What was being waited for.
        stage: &'static str,
    },
    /// The broker's socket closed: what needs the broker cannot happen any more.
    #[error("the broker is gone (its socket closed) while {stage}")]
    BrokerLost {
        /// What was being done.
        stage: &'static str,
    },
    /// The broker would not pass an fd on.
    #[error("the broker refused to relay an fd to rank {to}: {reason}")]
    RelayRefused {
        /// The receiver.
        to: u32,
        /// Why, in words.
        reason: &'static str,
        /// Whether the receiver only holds too many relayed fds it has not taken yet: it may
        /// take them, and the relay can then be tried again.
        full: bool,
    },
    /// The broker cannot hold the fds a world of this size needs.
    #[error(
        "a world of {world_size} needs up to {needed} fds in the broker; its limit (RLIMIT_NOFILE, hard) is {limit}: raise it (ulimit -n) or serve fewer workers"
    )]
    FdLimit {
        /// The world size asked for.
        world_size: u32,
        /// Fds needed at most.
        needed: u64,
        /// The hard limit.
        limit: u64,
    },
}

impl Error {
    pub(crate) fn sys(op: &'static str) -> impl FnOnce(Errno) -> Self {
        move |source| Self::Sys { op, source }
    }

    /// [`Self::sys`] for a call that failed with an `std::io::Error`.
    pub(crate) fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |error| Self::Sys {
            op,
            source: io_errno(&error),
        }
    }
}

/// The errno behind an `std::io::Error` (`EIO` when it has none).
pub(crate) fn io_errno(error: &std::io::Error) -> Errno {
    Errno::from_raw(error.raw_os_error().unwrap_or(nix::libc::EIO))
}

/// What was wrong with bytes that came from the other side of the logon socket.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// Wrong magic number.
    #[error("magic mismatch: expected {expected:#018x}, found {found:#018x}")]
    BadMagic {
        /// Expected.
        expected: u64,
        /// Found.
        found: u64,
    },
    /// Wrong protocol version.
    #[error("protocol version mismatch: expected {expected}, found {found}")]
    BadVersion {
        /// Expected.
        expected: u32,
        /// Found.
        found: u32,
    },
    /// A padding field is not zero.
    #[error("{field} must be zero, found {found:#x}")]
    BadPadding {
        /// The field.
        field: &'static str,
        /// Found.
        found: u64,
    },
    /// The stream ended before the whole message.
    #[error("truncated: expected {expected} bytes, the stream ended after {found}")]
    Truncated {
        /// Expected.
        expected: usize,
        /// Found.
        found: usize,
    },
    /// A rejection with a reason code this build does not know.
    #[error("unknown rejection code {code}: {text}")]
    UnknownRejection {
        /// The code.
        code: u32,
        /// The text.
        text: String,
    },
    /// A field is out of range.
    #[error("{field}: expected {expected}, found {found}")]
    Field {
        /// The field.
        field: &'static str,
        /// What was expected, in words.
        expected: String,
        /// Found.
        found: u64,
    },
    /// The kernel cut the control message: more fds were sent than there was room for.
    #[error("control message truncated (MSG_CTRUNC): fds were lost")]
    ControlTruncated,
    /// The number of fds received differs from the manifest's.
    #[error("manifest lists {expected} fds, {found} arrived")]
    FdCount {
        /// From the manifest.
        expected: usize,
        /// Received.
        found: usize,
    },
    /// A manifest entry says readiness eventfd and its fd is something else.
    #[error(
        "manifest entry {index} is the readiness eventfd of rank {peer}, but its fd is not an eventfd"
    )]
    NotAnEventFd {
        /// Index of the entry in the manifest.
        index: usize,
        /// The rank the entry names.
        peer: u32,
    },
    /// A manifest entry is not the one the protocol puts at its place.
    #[error("manifest entry {index}: expected {expected}, found role {role} peer {peer}")]
    ManifestOrder {
        /// The entry's index.
        index: usize,
        /// What belongs there, in words.
        expected: String,
        /// The role code found.
        role: u32,
        /// The peer found.
        peer: u32,
    },
    /// A manifest entry's size or layout version disagrees with the fd or this build.
    #[error("manifest entry {index}: {field} expected {expected}, found {found}")]
    ManifestValue {
        /// The entry's index.
        index: usize,
        /// The field.
        field: &'static str,
        /// Expected.
        expected: u64,
        /// Found.
        found: u64,
    },
    /// Bytes after the reply.
    #[error("{extra} unexpected bytes after the reply")]
    TrailingBytes {
        /// How many.
        extra: usize,
    },
}

/// Why connecting failed at once, as a sentence.
fn connect_reason(errno: Errno) -> String {
    match errno {
        Errno::ECONNREFUSED => "a socket nobody listens on (left by a broker that is gone?) \
                                (Connection refused)"
            .into(),
        other => format!("{} ({})", other.desc(), other),
    }
}

/// A duration as people say it: `10 s`, `1.5 s`, `250 ms`.
fn seconds(duration: Duration) -> String {
    if duration < Duration::from_secs(1) {
        format!("{} ms", duration.as_millis())
    } else {
        let secs = duration.as_secs_f64();
        if secs.fract() == 0.0 {
            format!("{secs:.0} s")
        } else {
            format!("{secs:.1} s")
        }
    }
}
