//! The logon protocol's frames: what a worker sends the broker, and what the broker answers.
//!
//! A worker sends one [`LogonFrame`]. The broker answers with one `sendmsg`: a [`ReplyHeader`],
//! then `fd_count` [`ManifestEntry`] records, with all fds in a single `SCM_RIGHTS` control
//! message, in manifest order. A rejection is a header with a nonzero `status` (a
//! [`RejectReason`] code), a reason text, and no fds.

use bytemuck::{Pod, Zeroable};

/// First eight bytes of a logon frame: `SHMBLOGN`.
pub const LOGON_MAGIC: u64 = u64::from_le_bytes(*b"SHMBLOGN");
/// First eight bytes of a reply: `SHMBRPLY`.
pub const REPLY_MAGIC: u64 = u64::from_le_bytes(*b"SHMBRPLY");
/// Version of the logon protocol (frames, manifest, fd order, notices).
///
/// 2: the broker no longer hands out a shared payload region; each worker publishes its own
/// outbox with a [`NoticeKind::Outbox`] notice.
/// 3: the broker passes every worker a pidfd of every peer ([`NoticeKind::Peer`]), answers every
/// relay ([`NoticeKind::RelayDelivered`] or a refusal), and workers say which relayed fds they
/// took ([`NoticeKind::Claimed`]).
/// 6: a dead rank's replacement may rejoin ([`ReplyHeader::rejoins`], the `Rejoin*` notices).
/// 7: making a group is an agreement (setup messages carry a view and a ballot), and every
/// outbox says which process of its rank it is (`status_word::INCARNATION`): a worker of an
/// older version would not take part in it, so it is refused at logon.
/// 8: typed channels: a worker asks the broker for a ring to a peer ([`NoticeKind::ChannelRequest`]).
pub const PROTOCOL_VERSION: u32 = 8;
/// `requested_rank` meaning "any free rank".
pub const ANY_RANK: u32 = u32::MAX;
/// `peer` in a notice that concerns no other rank.
pub const NO_PEER: u32 = u32::MAX;
/// Bytes of reason text a reply carries (UTF-8, zero-padded).
pub const REASON_LEN: usize = 96;
/// The most fds one reply may carry: the kernel's `SCM_MAX_FD`.
pub const MAX_REPLY_FDS: usize = 253;

/// What a worker sends to log on. 32 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct LogonFrame {
    /// [`LOGON_MAGIC`].
    pub magic: u64,
    /// [`PROTOCOL_VERSION`].
    pub version: u32,
    /// The rank wanted (say, the local rank), or [`ANY_RANK`].
    pub requested_rank: u32,
    /// The fewest ring slots this worker can work with; 0 for the broker's choice.
    pub min_ring_capacity: u32,
    /// Explicit padding; must be zero.
    pub _pad0: u32,
    /// The job this worker belongs to: any number its launcher gives every worker of one job
    /// (see [`job_id`]), or 0 for none. A broker refuses a worker of a job that has already
    /// ended, instead of starting a new job around it that waits for peers that are gone.
    pub job: u64,
}

const _: () = assert!(size_of::<LogonFrame>() == 32);

/// A job id for [`LogonFrame::job`] from any text (a launcher's job id, a UUID): its 64-bit
/// FNV-1a hash, never 0. An id as `shmbroker status` prints it (`0x` and up to 16 hex digits,
/// not 0) is that id itself, so that a process can name a job whose id the broker made.
#[must_use]
pub fn job_id(text: &str) -> u64 {
    if let Some(hex) = text.strip_prefix("0x")
        && (1..=16).contains(&hex.len())
        && let Ok(id) = u64::from_str_radix(hex, 16)
        && id != 0
    {
        return id;
    }
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    hash.max(1)
}

impl LogonFrame {
    /// A logon asking for `requested_rank` (or [`ANY_RANK`]) with the broker's default sizes.
    #[must_use]
    pub const fn new(requested_rank: u32) -> Self {
        Self {
            magic: LOGON_MAGIC,
            version: PROTOCOL_VERSION,
            requested_rank,
            min_ring_capacity: 0,
            _pad0: 0,
            job: 0,
        }
    }
}

/// The broker's answer. 136 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct ReplyHeader {
    /// [`REPLY_MAGIC`].
    pub magic: u64,
    /// [`PROTOCOL_VERSION`].
    pub version: u32,
    /// 0 when accepted; otherwise a [`RejectReason`] code.
    pub status: u32,
    /// The rank given (accepted replies).
    pub rank: u32,
    /// The number of ranks in the world.
    pub world_size: u32,
    /// How many manifest entries and fds follow.
    pub fd_count: u32,
    /// Slots in every ring.
    pub ring_capacity: u32,
    /// How many processes held this rank before this one in the job (accepted replies): 0 for
    /// the first, `n` for the `n`th replacement of a rank that died (a rejoin).
    pub rejoins: u32,
    /// Reserved; must be zero.
    pub _pad1: u32,
    /// Why, for rejections: UTF-8 text, zero-padded.
    pub reason: [u8; REASON_LEN],
}

const _: () = assert!(size_of::<ReplyHeader>() == 136);

impl ReplyHeader {
    /// A rejection for `reason`, with `text` cut to [`REASON_LEN`] bytes on a character boundary.
    #[must_use]
    pub fn rejection(reason: RejectReason, text: &str) -> Self {
        let mut header = Self::zeroed();
        header.magic = REPLY_MAGIC;
        header.version = PROTOCOL_VERSION;
        header.status = reason as u32;
        let mut end = text.len().min(REASON_LEN);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        header.reason[..end].copy_from_slice(&text.as_bytes()[..end]);
        header
    }

    /// The reason text, up to the first zero byte, with invalid UTF-8 replaced.
    #[must_use]
    pub fn reason_text(&self) -> &str {
        let end = self
            .reason
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(REASON_LEN);
        match core::str::from_utf8(&self.reason[..end]) {
            Ok(text) => text,
            Err(error) => {
                // Keep the valid prefix; a peer's bad bytes must not hide the whole message.
                core::str::from_utf8(&self.reason[..error.valid_up_to()]).unwrap_or("")
            }
        }
    }
}

/// What one fd in a reply is. 24 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct ManifestEntry {
    /// A [`FdRole`] code.
    pub role: u32,
    /// The rank at the other end of a ring, or [`NO_PEER`].
    pub peer: u32,
    /// The file's size in bytes.
    pub size: u64,
    /// The layout version of what the file holds (the ring layout).
    pub layout_version: u32,
    /// Explicit padding; must be zero.
    pub _pad0: u32,
}

const _: () = assert!(size_of::<ManifestEntry>() == 24);

/// What an fd in a reply is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum FdRole {
    /// A ring this worker sends on, to `peer`.
    RingToPeer = 1,
    /// A ring this worker receives on, from `peer`.
    RingFromPeer = 2,
    // 3 was the shared payload region of protocol version 1; workers now own their outboxes.
    /// The readiness eventfd of `peer` (this worker's own when `peer` is its rank): signalled by
    /// whoever sends to that worker while it sleeps waiting for a message from anyone.
    Readiness = 4,
}

impl FdRole {
    /// The role for a wire code, if it is one.
    #[must_use]
    pub const fn from_code(code: u32) -> Option<Self> {
        match code {
            1 => Some(Self::RingToPeer),
            2 => Some(Self::RingFromPeer),
            4 => Some(Self::Readiness),
            _ => None,
        }
    }
}

/// Why the broker refused a logon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum RejectReason {
    /// The frame did not start with [`LOGON_MAGIC`].
    BadMagic = 1,
    /// The frame's protocol version is not [`PROTOCOL_VERSION`].
    BadVersion = 2,
    /// The connection closed before a whole frame arrived.
    Truncated = 3,
    /// The requested rank is not below the world size.
    RankOutOfRange = 4,
    /// The requested rank is already logged on.
    RankTaken = 5,
    /// Every rank is taken.
    WorldFull = 6,
    /// A requested minimum size is more than the broker provides.
    CapacityOutOfLimits = 7,
    /// The frame did not arrive before the logon deadline.
    Deadline = 8,
    /// The caller's uid is not allowed.
    NotAllowed = 9,
    /// A padding field was not zero.
    BadPadding = 10,
    /// The broker failed (a system call); the text says which.
    Internal = 11,
    /// A worker of this session died; the session is over.
    SessionLost = 12,
    /// The worker belongs to another job than the one the broker serves now (their
    /// [`LogonFrame::job`] ids differ).
    OtherJob = 13,
    /// A rejoin asked for a rank that left on purpose: only a rank that died is replaced.
    RankLeft = 14,
    /// A rejoin named no job, or a job whose id the broker does not know: a rejoin must name the
    /// job it rejoins ([`LogonFrame::job`]).
    JobUnnamed = 15,
    /// The rank has been replaced as many times as a job allows ([`MAX_REJOINS`]).
    RejoinsExhausted = 16,
}

/// How many times one rank may be replaced in one job: a bound on one rank's crash loop, not on
/// resources (a replacement's old rings are freed in every survivor, see the handshake's
/// `liveness::slots`). It was 1000 until a 30-minute soak, replacing a rank every 1.8 s, reached
/// it.
pub const MAX_REJOINS: u32 = 1_000_000;

impl RejectReason {
    /// The reason for a wire code, if it is one.
    #[must_use]
    pub const fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            1 => Self::BadMagic,
            2 => Self::BadVersion,
            3 => Self::Truncated,
            4 => Self::RankOutOfRange,
            5 => Self::RankTaken,
            6 => Self::WorldFull,
            7 => Self::CapacityOutOfLimits,
            8 => Self::Deadline,
            9 => Self::NotAllowed,
            10 => Self::BadPadding,
            11 => Self::Internal,
            12 => Self::SessionLost,
            13 => Self::OtherJob,
            14 => Self::RankLeft,
            15 => Self::JobUnnamed,
            16 => Self::RejoinsExhausted,
            _ => return None,
        })
    }
}

/// First four bytes of every notice a worker sends the broker on its session socket: `SHMN`.
pub const NOTICE_MAGIC: u32 = u32::from_le_bytes(*b"SHMN");

/// A frame on a logged-on worker's session socket, in either direction. 24 bytes.
///
/// A frame that passes an fd carries it as `SCM_RIGHTS` on its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct WorkerNotice {
    /// [`NOTICE_MAGIC`].
    pub magic: u32,
    /// A [`NoticeKind`] code.
    pub kind: u32,
    /// The other rank: where a relayed fd goes, or where it came from; [`NO_PEER`] otherwise.
    pub peer: u32,
    /// Explicit padding; must be zero.
    pub _pad0: u32,
    /// Chosen by the sender of a relayed fd, to match it to its ticket.
    pub token: u64,
}

const _: () = assert!(size_of::<WorkerNotice>() == 24);

impl WorkerNotice {
    /// A notice of `kind` about `peer` with `token`.
    #[must_use]
    pub const fn new(kind: NoticeKind, peer: u32, token: u64) -> Self {
        Self {
            magic: NOTICE_MAGIC,
            kind: kind as u32,
            peer,
            _pad0: 0,
            token,
        }
    }
}

/// What a [`WorkerNotice`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum NoticeKind {
    /// Worker to broker: the worker is leaving on purpose and has closed its rings itself; when
    /// its socket closes next, the session goes on. A socket that closes without this is a
    /// worker that died.
    Goodbye = 1,
    /// Worker to broker: pass the attached fd to rank `peer`, with `token`.
    RelayFd = 2,
    /// Broker to worker: the attached fd comes from rank `peer`, with the `token` it gave.
    RelayedFd = 3,
    /// Worker to broker: the attached fd is this worker's outbox, sealed so that only it can
    /// write it; the broker checks the seals and passes it to every other worker of the session.
    Outbox = 4,
    /// Broker to worker: the attached fd is rank `peer`'s outbox (map it read-only); `token` is
    /// that rank's process id, as the broker saw it log on.
    PeerOutbox = 5,
    /// Broker to worker: the attached fd is a pidfd of rank `peer`'s process, opened by the
    /// broker while that process waited for its logon reply; `token` is its pid. Every worker
    /// gets one for every peer, to see it exit whether or not the broker is still there.
    Peer = 6,
    /// Broker to worker: the fd this worker relayed to rank `peer` with `token` was passed on.
    RelayDelivered = 7,
    /// Broker to worker: the fd this worker relayed to rank `peer` with `token` was refused,
    /// because that rank already holds as many relayed fds as it may without taking them.
    RelayRefusedFull = 8,
    /// Broker to worker: the fd this worker relayed to rank `peer` with `token` was refused,
    /// because that rank is not logged on (it has not yet, or it is gone).
    RelayRefusedGone = 9,
    /// Worker to broker: this worker took the fd rank `peer` relayed with `token`; it no longer
    /// counts against this worker's limit of relayed fds not yet taken.
    Claimed = 10,
    /// Broker to worker: the relay to rank `peer` with `token` came without an fd (none was
    /// attached, or the broker had no room for it); nothing was passed on.
    RelayFailed = 11,
    /// Broker to worker: rank `peer` is gone as the broker sees it (its socket closed, or its
    /// process exited); `token` is 1 if it said goodbye first, else 0. Workers weigh it like
    /// their own pidfd of that peer: it catches a worker whose socket was inherited (its pidfd
    /// names the process that connected) or that exec'd.
    PeerGone = 12,
    /// Broker to worker: rank `peer` has not logged on, and no longer can, because the job is
    /// winding down (the broker admits nobody new to a job once a worker of it has died or left).
    /// `token` says which worker wound it down: its rank in the low 32 bits, and bit 32 set if
    /// it said goodbye first (it left) or clear (it died). Workers close their rings to `peer`,
    /// so that nothing waits for a rank that will never come.
    NeverJoins = 13,
    /// Broker to worker: rank `peer` died and a new process rejoined in its place; the attached
    /// fd is the fresh ring from this worker to it (this worker produces). `token` is how many
    /// times `peer` has been replaced in this job (0: it had not logged on before the job lost a
    /// worker, and comes late; the same path). The first of four notices of one rejoin,
    /// always sent together and in this order: this, [`Self::RejoinRingFrom`],
    /// [`Self::RejoinReadiness`], [`Self::Rejoined`].
    RejoinRingTo = 14,
    /// Broker to worker: the fresh ring from the rejoined rank `peer` to this worker (this worker
    /// consumes); `token` as for [`Self::RejoinRingTo`].
    RejoinRingFrom = 15,
    /// Broker to worker: the rejoined rank `peer`'s readiness eventfd, which this worker's
    /// producer signals; `token` as for [`Self::RejoinRingTo`].
    RejoinReadiness = 16,
    /// Broker to worker: the last notice of a rejoin: the attached fd is a pidfd of the new
    /// process of rank `peer`, and `token` its pid (as for [`Self::Peer`]).
    Rejoined = 17,
    /// Worker to broker: make a ring of records from this worker to rank `peer`, as `token`
    /// ([`ChannelToken`]) says: the record's size, the ring's capacity and the channel's number.
    ChannelRequest = 18,
    /// Broker to worker: the attached fd is the ring this worker asked for to rank `peer` with
    /// `token` (this worker produces).
    ChannelMade = 19,
    /// Broker to worker: the attached fd is a ring rank `peer` asked for to this worker with
    /// `token` (this worker consumes); it counts as a relayed fd until claimed
    /// ([`Self::Claimed`]).
    ChannelOffered = 20,
    /// Broker to worker: the ring this worker asked for to rank `peer` with `token` was not
    /// made: `peer` is not logged on or holds as many unclaimed fds as it may, or `token` asks
    /// for more than [`ChannelToken`] allows.
    ChannelRefused = 21,
}

/// What a [`NoticeKind::ChannelRequest`] asks for, packed into its token: the record's size in
/// bytes (bits 0 to 15), the base-2 logarithm of the ring's capacity (bits 16 to 20) and the
/// channel's number among those from its producer to its consumer (bits 21 to 63).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelToken {
    /// Bytes of one record: 1 to [`ChannelToken::MAX_RECORD_BYTES`].
    pub record_bytes: u32,
    /// Records the ring holds: a power of two from 2 to [`ChannelToken::MAX_CAPACITY`].
    pub capacity: u64,
    /// The channel's number from its producer to its consumer, from 0.
    pub number: u64,
}

impl ChannelToken {
    /// The largest record a channel carries (larger data travels as a loan a record refers to).
    pub const MAX_RECORD_BYTES: u32 = 4096;
    /// The most records a channel's ring holds.
    pub const MAX_CAPACITY: u64 = 1 << 20;
    /// The largest ring file the broker makes for a channel.
    pub const MAX_FILE_BYTES: u64 = 256 << 20;

    /// The slot class of a record of `record_bytes`: the power of two of at least 8 bytes that
    /// holds it. Every channel's ring holds records of its class.
    #[must_use]
    pub const fn class_bytes(record_bytes: u32) -> u32 {
        let bytes = if record_bytes < 8 { 8 } else { record_bytes };
        bytes.next_power_of_two()
    }

    /// The token's 64 bits.
    #[must_use]
    pub const fn pack(self) -> u64 {
        (self.record_bytes as u64 & 0xffff)
            | ((self.capacity.trailing_zeros() as u64 & 0x1f) << 16)
            | (self.number << 21)
    }

    /// The request a token packs, if it is one a broker serves: a record of 1 to
    /// [`Self::MAX_RECORD_BYTES`], a capacity of 2 to [`Self::MAX_CAPACITY`].
    #[must_use]
    pub const fn unpack(token: u64) -> Option<Self> {
        let record_bytes = (token & 0xffff) as u32;
        let log2 = (token >> 16) & 0x1f;
        let capacity = 1u64 << log2;
        if record_bytes == 0
            || record_bytes > Self::MAX_RECORD_BYTES
            || capacity < 2
            || capacity > Self::MAX_CAPACITY
        {
            return None;
        }
        Some(Self {
            record_bytes,
            capacity,
            number: token >> 21,
        })
    }
}

impl NoticeKind {
    /// Whether the broker sends this kind to workers (the others go from workers to the broker).
    #[must_use]
    pub const fn from_broker(self) -> bool {
        !matches!(
            self,
            Self::Goodbye | Self::RelayFd | Self::Outbox | Self::Claimed | Self::ChannelRequest
        )
    }

    /// The kind for a wire code, if it is one.
    #[must_use]
    pub const fn from_code(code: u32) -> Option<Self> {
        match code {
            1 => Some(Self::Goodbye),
            2 => Some(Self::RelayFd),
            3 => Some(Self::RelayedFd),
            4 => Some(Self::Outbox),
            5 => Some(Self::PeerOutbox),
            6 => Some(Self::Peer),
            7 => Some(Self::RelayDelivered),
            8 => Some(Self::RelayRefusedFull),
            9 => Some(Self::RelayRefusedGone),
            10 => Some(Self::Claimed),
            11 => Some(Self::RelayFailed),
            12 => Some(Self::PeerGone),
            13 => Some(Self::NeverJoins),
            14 => Some(Self::RejoinRingTo),
            15 => Some(Self::RejoinRingFrom),
            16 => Some(Self::RejoinReadiness),
            17 => Some(Self::Rejoined),
            18 => Some(Self::ChannelRequest),
            19 => Some(Self::ChannelMade),
            20 => Some(Self::ChannelOffered),
            21 => Some(Self::ChannelRefused),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_tokens_round_trip_and_refuse_what_no_broker_makes() {
        let token = ChannelToken {
            record_bytes: 60,
            capacity: 1024,
            number: (1 << 43) - 1,
        };
        assert_eq!(ChannelToken::unpack(token.pack()), Some(token));
        for bad in [0u64, 4097 | 4 << 16, 8, 21 << 16 | 8] {
            assert_eq!(ChannelToken::unpack(bad), None, "{bad:#x}");
        }
        assert_eq!(ChannelToken::class_bytes(1), 8);
        assert_eq!(ChannelToken::class_bytes(60), 64);
        assert_eq!(ChannelToken::class_bytes(64), 64);
        assert_eq!(ChannelToken::class_bytes(4096), 4096);
    }

    #[test]
    fn codes_round_trip() {
        for code in 0..30 {
            if let Some(reason) = RejectReason::from_code(code) {
                assert_eq!(reason as u32, code);
            }
            if let Some(role) = FdRole::from_code(code) {
                assert_eq!(role as u32, code);
            }
        }
        assert_eq!(RejectReason::from_code(0), None);
        assert_eq!(FdRole::from_code(0), None);
    }

    #[test]
    fn reason_text_is_cut_on_a_character_boundary_and_read_back() {
        let long = "é".repeat(REASON_LEN);
        let header = ReplyHeader::rejection(RejectReason::Internal, &long);
        assert_eq!(header.reason_text(), "é".repeat(REASON_LEN / 2));
        let mut bad = ReplyHeader::rejection(RejectReason::Internal, "ok");
        bad.reason[2] = 0xff;
        assert_eq!(bad.reason_text(), "ok");
    }
}
