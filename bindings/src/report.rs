//! `shmbroker status`: a client asks a broker what its job's ranks are doing.
//!
//! The client connects to the broker's socket like a worker and sends a [`crate::LogonFrame`]
//! whose magic is [`STATUS_MAGIC`] (every other field zero but the version). The broker checks
//! the caller's uid as for a logon, answers with a [`StatusReplyHeader`] followed by one
//! [`RankStatus`] per rank of the world, and closes the connection. It never waits for a status
//! client: a reply that does not fit in the socket's buffer at once is cut, and the client sees
//! a short reply.

use crate::{STATUS_SLOT_WORDS, STATUS_SLOTS};
use bytemuck::{Pod, Zeroable};

/// The magic of a status request (in a logon frame's place): `SHMBSTAT`.
pub const STATUS_MAGIC: u64 = u64::from_le_bytes(*b"SHMBSTAT");

/// The first eight bytes of a status reply: `SHMBSTRP`.
pub const STATUS_REPLY_MAGIC: u64 = u64::from_le_bytes(*b"SHMBSTRP");

/// The most peers a [`RankStatus`] has ring fill levels for (the broker's largest world).
pub const STATUS_MAX_PEERS: usize = 64;

/// A ring fill level that is not known: there is no such ring (yet, or any more), or it could not
/// be read.
pub const FILL_UNKNOWN: u32 = u32::MAX;

/// What a rank's worker is, as the broker knows it ([`RankStatus::state`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum RankState {
    /// No worker has logged on as this rank.
    NeverJoined = 0,
    /// Logged on and still there.
    Running = 1,
    /// Said goodbye and went.
    Left = 2,
    /// Went without a goodbye (its socket closed or its process exited).
    Dead = 3,
    /// Logged on and still there, but its process is stopped (`SIGSTOP`, `SIGTSTP`, a
    /// debugger): it runs no code until it is continued.
    Stopped = 4,
}

impl RankState {
    /// The state a code stands for, if any.
    #[must_use]
    pub const fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            0 => Self::NeverJoined,
            1 => Self::Running,
            2 => Self::Left,
            3 => Self::Dead,
            4 => Self::Stopped,
            _ => return None,
        })
    }

    /// As `shmbroker status` prints it: `never joined`, `running`, `left`, `dead`, `stopped`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::NeverJoined => "never joined",
            Self::Running => "running",
            Self::Left => "left",
            Self::Dead => "dead",
            Self::Stopped => "stopped",
        }
    }
}

/// The start of a status reply. 48 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct StatusReplyHeader {
    /// [`STATUS_REPLY_MAGIC`].
    pub magic: u64,
    /// [`crate::PROTOCOL_VERSION`].
    pub version: u32,
    /// Ranks in the world, and so [`RankStatus`] records after this header.
    pub world_size: u32,
    /// How many jobs this broker has ended before the current one.
    pub jobs_ended: u64,
    /// The current job's id from its workers' logons (0: none given, or no worker yet).
    pub job_id: u64,
    /// The broker's pid.
    pub broker_pid: i32,
    /// Slots in every ring.
    pub ring_capacity: u32,
    /// The first rank of the job that died, or [`crate::NO_PEER`].
    pub first_dead: u32,
    /// The first rank of the job that left, or [`crate::NO_PEER`].
    pub first_left: u32,
}

const _: () = assert!(size_of::<StatusReplyHeader>() == 48);

/// One rank, as the broker sees it and as the rank publishes itself. 536 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct RankStatus {
    /// The rank (records come in rank order).
    pub rank: u32,
    /// A [`RankState`] code.
    pub state: u32,
    /// Its worker's pid (from `SO_PEERCRED`), 0 if it never joined.
    pub pid: i32,
    /// Its worker's uid.
    pub uid: u32,
    /// Its outbox's size in bytes (0: not published, or gone with its worker).
    pub outbox_bytes: u64,
    /// Its outbox's status words as the broker copied them (all zero without an outbox): see
    /// [`crate::status_word`]. Whatever the rank wrote; the reader trusts none of it.
    pub status: [[u64; STATUS_SLOT_WORDS]; STATUS_SLOTS],
    /// Messages waiting in the ring from this rank to each peer (index = peer), or
    /// [`FILL_UNKNOWN`].
    pub ring_fill: [u32; STATUS_MAX_PEERS],
}

const _: () = assert!(size_of::<RankStatus>() == 24 + 8 * STATUS_SLOTS * STATUS_SLOT_WORDS + 256);
