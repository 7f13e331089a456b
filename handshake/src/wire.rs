//! Decoding and checking the logon protocol's frames: every byte here came from another process.

use crate::error::{Error, ProtocolError};
use bytemuck::Zeroable;
use shmbroker_bindings::{
    FdRole, LOGON_MAGIC, LogonFrame, MAX_REPLY_FDS, ManifestEntry, PROTOCOL_VERSION, REPLY_MAGIC,
    RankState, RankStatus, RejectReason, ReplyHeader, STATUS_MAGIC, STATUS_REPLY_MAGIC,
    StatusReplyHeader,
};

/// Bytes in a logon frame.
pub const LOGON_LEN: usize = size_of::<LogonFrame>();
/// Bytes in a reply header.
pub const REPLY_HEADER_LEN: usize = size_of::<ReplyHeader>();
/// Bytes in one manifest entry.
pub const MANIFEST_ENTRY_LEN: usize = size_of::<ManifestEntry>();
/// The largest world a reply can serve: `2 (N - 1)` fds must fit in one message.
pub const MAX_WORLD_SIZE: u32 = 64;

const _: () = assert!(reply_fd_count(MAX_WORLD_SIZE) as usize <= MAX_REPLY_FDS);

/// Fds in the logon reply of a world of `world_size`: two rings and a readiness eventfd per peer,
/// and the worker's own readiness eventfd.
#[must_use]
pub const fn reply_fd_count(world_size: u32) -> u32 {
    3 * (world_size - 1) + 1
}

/// Decodes a logon frame. The error pairs the code to send back with what was wrong.
///
/// # Errors
///
/// Truncated, bad magic, bad version or nonzero padding, with expected and found values.
pub fn decode_logon(bytes: &[u8]) -> Result<LogonFrame, (RejectReason, ProtocolError)> {
    let Some(frame) = bytes.get(..LOGON_LEN) else {
        return Err((
            RejectReason::Truncated,
            ProtocolError::Truncated {
                expected: LOGON_LEN,
                found: bytes.len(),
            },
        ));
    };
    let frame: LogonFrame = bytemuck::pod_read_unaligned(frame);
    if frame.magic != LOGON_MAGIC {
        return Err((
            RejectReason::BadMagic,
            ProtocolError::BadMagic {
                expected: LOGON_MAGIC,
                found: frame.magic,
            },
        ));
    }
    if frame.version != PROTOCOL_VERSION {
        return Err((
            RejectReason::BadVersion,
            ProtocolError::BadVersion {
                expected: PROTOCOL_VERSION,
                found: frame.version,
            },
        ));
    }
    for (field, found) in [("logon _pad0", u64::from(frame._pad0))] {
        if found != 0 {
            return Err((
                RejectReason::BadPadding,
                ProtocolError::BadPadding { field, found },
            ));
        }
    }
    Ok(frame)
}

/// The manifest a worker of `rank` in a world of `world_size` receives, in order: for each rank,
/// the ring to it, the ring from it and its readiness eventfd (for its own rank, only the
/// eventfd). The broker builds replies from this and the client checks them against it.
pub fn manifest_order(rank: u32, world_size: u32) -> impl Iterator<Item = (FdRole, Option<u32>)> {
    (0..world_size).flat_map(move |peer| {
        let rings = [
            (FdRole::RingToPeer, Some(peer)),
            (FdRole::RingFromPeer, Some(peer)),
        ];
        let rings = if peer == rank {
            &rings[..0]
        } else {
            &rings[..]
        };
        rings
            .iter()
            .copied()
            .chain([(FdRole::Readiness, Some(peer))])
            .collect::<Vec<_>>()
    })
}

/// Decodes a reply header. A rejection becomes [`Error::Rejected`].
///
/// # Errors
///
/// [`Error::Rejected`] for a rejection; [`Error::Protocol`] for a truncated or malformed header:
/// bad magic or version, an unknown rejection code, or counts that do not fit the protocol.
pub fn decode_reply_header(bytes: &[u8]) -> Result<ReplyHeader, Error> {
    let Some(header) = bytes.get(..REPLY_HEADER_LEN) else {
        return Err(ProtocolError::Truncated {
            expected: REPLY_HEADER_LEN,
            found: bytes.len(),
        }
        .into());
    };
    let header: ReplyHeader = bytemuck::pod_read_unaligned(header);
    if header.magic != REPLY_MAGIC {
        return Err(ProtocolError::BadMagic {
            expected: REPLY_MAGIC,
            found: header.magic,
        }
        .into());
    }
    if header.version != PROTOCOL_VERSION {
        return Err(ProtocolError::BadVersion {
            expected: PROTOCOL_VERSION,
            found: header.version,
        }
        .into());
    }
    if header.status != 0 {
        let text = header.reason_text().to_owned();
        return Err(match RejectReason::from_code(header.status) {
            Some(reason) => Error::Rejected { reason, text },
            None => ProtocolError::UnknownRejection {
                code: header.status,
                text,
            }
            .into(),
        });
    }
    let field = |field, expected: String, found: u32| ProtocolError::Field {
        field,
        expected,
        found: u64::from(found),
    };
    if header.world_size == 0 || header.world_size > MAX_WORLD_SIZE {
        return Err(field(
            "world_size",
            format!("1 to {MAX_WORLD_SIZE}"),
            header.world_size,
        )
        .into());
    }
    if header.rank >= header.world_size {
        return Err(field(
            "rank",
            format!("below world_size {}", header.world_size),
            header.rank,
        )
        .into());
    }
    let fds = reply_fd_count(header.world_size);
    if header.fd_count != fds {
        return Err(field("fd_count", format!("{fds}"), header.fd_count).into());
    }
    if !header.ring_capacity.is_power_of_two() {
        return Err(field(
            "ring_capacity",
            "a power of two".into(),
            header.ring_capacity,
        )
        .into());
    }
    if header._pad1 != 0 {
        return Err(ProtocolError::BadPadding {
            field: "reply _pad1",
            found: u64::from(header._pad1),
        }
        .into());
    }
    if header.rejoins > shmbroker_bindings::MAX_REJOINS {
        return Err(field(
            "rejoins",
            format!("0 to {}", shmbroker_bindings::MAX_REJOINS),
            header.rejoins,
        )
        .into());
    }
    if header.reason != ReplyHeader::zeroed().reason {
        return Err(ProtocolError::BadPadding {
            field: "reason of an accepted reply",
            found: 1,
        }
        .into());
    }
    Ok(header)
}

/// Decodes the manifest that follows `header` and checks its order and padding.
///
/// # Errors
///
/// [`ProtocolError::Truncated`], [`ProtocolError::TrailingBytes`],
/// [`ProtocolError::ManifestOrder`] or [`ProtocolError::BadPadding`].
pub fn decode_manifest(
    header: &ReplyHeader,
    bytes: &[u8],
) -> Result<Vec<ManifestEntry>, ProtocolError> {
    let expected = header.fd_count as usize * MANIFEST_ENTRY_LEN;
    if bytes.len() < expected {
        return Err(ProtocolError::Truncated {
            expected: REPLY_HEADER_LEN + expected,
            found: REPLY_HEADER_LEN + bytes.len(),
        });
    }
    if bytes.len() > expected {
        return Err(ProtocolError::TrailingBytes {
            extra: bytes.len() - expected,
        });
    }
    let entries: Vec<ManifestEntry> = bytes
        .chunks_exact(MANIFEST_ENTRY_LEN)
        .map(bytemuck::pod_read_unaligned)
        .collect();
    for (index, (entry, (role, peer))) in entries
        .iter()
        .zip(manifest_order(header.rank, header.world_size))
        .enumerate()
    {
        let want_peer = peer.unwrap_or(shmbroker_bindings::NO_PEER);
        if entry.role != role as u32 || entry.peer != want_peer {
            return Err(ProtocolError::ManifestOrder {
                index,
                expected: format!("{role:?} peer {want_peer}"),
                role: entry.role,
                peer: entry.peer,
            });
        }
        if entry._pad0 != 0 {
            return Err(ProtocolError::BadPadding {
                field: "manifest _pad0",
                found: u64::from(entry._pad0),
            });
        }
    }
    Ok(entries)
}

/// A notice from the broker that passed every check, as a worker's watcher files it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BrokerNotice {
    /// What it says.
    pub kind: shmbroker_bindings::NoticeKind,
    /// The other rank: checked to be another rank of the world.
    pub peer: u32,
    /// The token: for `Peer` and `PeerOutbox` a process id, checked to be a positive `i32`; for
    /// `NeverJoins` another rank of the world (and bit 32), checked.
    pub token: u64,
}

/// Decodes a whole notice the broker sent a worker of rank `rank` in a world of `world_size`,
/// with `fd_attached` saying whether an fd came with it: magic, zero padding, a kind the broker
/// sends, another rank of the world, an fd exactly for the kinds that carry one, and a process id
/// for the kinds whose token is one. `replacement` says the worker replaced a rank that died (a
/// rejoin): only such a worker may hear that its own rank wound the job down.
///
/// # Errors
///
/// The first check that fails, with what was expected and what arrived.
pub fn decode_broker_notice(
    bytes: &[u8],
    world_size: u32,
    rank: u32,
    fd_attached: bool,
    replacement: bool,
) -> Result<BrokerNotice, ProtocolError> {
    use shmbroker_bindings::{NOTICE_MAGIC, NoticeKind, WorkerNotice};
    let len = size_of::<WorkerNotice>();
    let Some(bytes) = bytes.get(..len) else {
        return Err(ProtocolError::Truncated {
            expected: len,
            found: bytes.len(),
        });
    };
    let notice: WorkerNotice = bytemuck::pod_read_unaligned(bytes);
    if notice.magic != NOTICE_MAGIC {
        return Err(ProtocolError::BadMagic {
            expected: u64::from(NOTICE_MAGIC),
            found: u64::from(notice.magic),
        });
    }
    if notice._pad0 != 0 {
        return Err(ProtocolError::BadPadding {
            field: "notice _pad0",
            found: u64::from(notice._pad0),
        });
    }
    let kind = match NoticeKind::from_code(notice.kind) {
        Some(kind) if kind.from_broker() => kind,
        _ => {
            return Err(ProtocolError::Field {
                field: "notice kind",
                expected: "one the broker sends (3, 5 to 9, 11 to 17, 19 to 21)".into(),
                found: u64::from(notice.kind),
            });
        }
    };
    if notice.peer >= world_size || notice.peer == rank {
        return Err(ProtocolError::Field {
            field: "notice peer",
            expected: format!("a rank below {world_size} other than {rank}"),
            found: u64::from(notice.peer),
        });
    }
    let carries_fd = matches!(
        kind,
        NoticeKind::RelayedFd
            | NoticeKind::PeerOutbox
            | NoticeKind::Peer
            | NoticeKind::RejoinRingTo
            | NoticeKind::RejoinRingFrom
            | NoticeKind::RejoinReadiness
            | NoticeKind::Rejoined
            | NoticeKind::ChannelMade
            | NoticeKind::ChannelOffered
    );
    if carries_fd != fd_attached {
        return Err(ProtocolError::FdCount {
            expected: usize::from(carries_fd),
            found: usize::from(fd_attached),
        });
    }
    let token_is_pid = matches!(
        kind,
        NoticeKind::PeerOutbox | NoticeKind::Peer | NoticeKind::Rejoined
    );
    let rejoin_ring = matches!(
        kind,
        NoticeKind::RejoinRingTo | NoticeKind::RejoinRingFrom | NoticeKind::RejoinReadiness
    );
    if rejoin_ring && notice.token > u64::from(shmbroker_bindings::MAX_REJOINS) {
        return Err(ProtocolError::Field {
            field: "rejoin notice token (how many times the rank was replaced)",
            expected: format!("0 to {}", shmbroker_bindings::MAX_REJOINS),
            found: notice.token,
        });
    }
    if token_is_pid && !(1..=i64::from(i32::MAX)).contains(&(notice.token as i64)) {
        return Err(ProtocolError::Field {
            field: "notice token (a peer's pid)",
            expected: "a process id".into(),
            found: notice.token,
        });
    }
    let channel = matches!(
        kind,
        NoticeKind::ChannelMade | NoticeKind::ChannelOffered | NoticeKind::ChannelRefused
    );
    if channel && shmbroker_bindings::ChannelToken::unpack(notice.token).is_none() {
        return Err(ProtocolError::Field {
            field: "channel notice token (record size, capacity, number)",
            expected: "records of 1 to 4096 bytes, 2 to 2^20 of them".into(),
            found: notice.token,
        });
    }
    if kind == NoticeKind::PeerGone && notice.token > 1 {
        return Err(ProtocolError::Field {
            field: "peer gone token (said goodbye)",
            expected: "0 or 1".into(),
            found: notice.token,
        });
    }
    if kind == NoticeKind::NeverJoins {
        let cause = notice.token & u64::from(u32::MAX);
        // The cause may be this very rank only for a replacement of the rank whose death wound
        // the job down: it hears of the ranks that never came.
        let own = cause == u64::from(rank) && !replacement;
        if notice.token >> 33 != 0 || cause >= u64::from(world_size) || own {
            return Err(ProtocolError::Field {
                field: "never-joins token (the rank that wound the job down, bit 32: it left)",
                expected: format!(
                    "a rank below {world_size}{}, with no bit above 32 set",
                    if replacement {
                        ""
                    } else {
                        " other than this one"
                    }
                ),
                found: notice.token,
            });
        }
        if cause == u64::from(notice.peer) {
            return Err(ProtocolError::Field {
                field: "never-joins token (the rank that wound the job down)",
                expected: format!("a rank other than {}, which never logged on", notice.peer),
                found: notice.token,
            });
        }
    }
    Ok(BrokerNotice {
        kind,
        peer: notice.peer,
        token: notice.token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shmbroker_bindings::{NoticeKind, WorkerNotice};

    fn never_joins(peer: u32, token: u64) -> Result<BrokerNotice, ProtocolError> {
        let notice = WorkerNotice::new(NoticeKind::NeverJoins, peer, token);
        decode_broker_notice(bytemuck::bytes_of(&notice), 4, 0, false, false)
    }

    fn notice(
        kind: NoticeKind,
        peer: u32,
        token: u64,
        fd: bool,
    ) -> Result<BrokerNotice, ProtocolError> {
        let notice = WorkerNotice::new(kind, peer, token);
        decode_broker_notice(bytemuck::bytes_of(&notice), 4, 0, fd, false)
    }

    #[test]
    fn rejoin_notices_carry_an_fd_and_a_count_of_replacements_or_a_pid() {
        for kind in [
            NoticeKind::RejoinRingTo,
            NoticeKind::RejoinRingFrom,
            NoticeKind::RejoinReadiness,
        ] {
            // 0: a rank that comes late, after the job lost a worker.
            assert_eq!(notice(kind, 2, 0, true).unwrap().token, 0);
            let most = u64::from(shmbroker_bindings::MAX_REJOINS);
            assert_eq!(notice(kind, 2, most, true).unwrap().token, most);
            for bad in [most + 1, u64::MAX] {
                assert!(
                    matches!(notice(kind, 2, bad, true), Err(ProtocolError::Field { found, .. }) if found == bad),
                    "{kind:?} with token {bad}"
                );
            }
            assert!(matches!(
                notice(kind, 2, 1, false),
                Err(ProtocolError::FdCount { .. })
            ));
        }
        assert_eq!(
            notice(NoticeKind::Rejoined, 2, 4242, true).unwrap().token,
            4242
        );
        assert!(notice(NoticeKind::Rejoined, 2, 0, true).is_err());
        assert!(notice(NoticeKind::Rejoined, 2, 1 << 40, true).is_err());
        assert!(matches!(
            notice(NoticeKind::Rejoined, 2, 4242, false),
            Err(ProtocolError::FdCount { .. })
        ));
        // About this rank itself: never.
        assert!(notice(NoticeKind::RejoinRingTo, 0, 1, true).is_err());
    }

    #[test]
    fn a_never_joins_notice_names_the_rank_that_wound_the_job_down() {
        // Rank 1 never came; rank 2 died (bit 32 clear) or left (set).
        assert_eq!(never_joins(1, 2).unwrap().token, 2);
        assert_eq!(never_joins(1, 2 | 1 << 32).unwrap().token, 2 | 1 << 32);
        // The receiver itself: only for a replacement of the rank whose death wound the job down.
        let own = WorkerNotice::new(NoticeKind::NeverJoins, 1, 0);
        let own = bytemuck::bytes_of(&own);
        assert_eq!(
            decode_broker_notice(own, 4, 0, false, true).unwrap().token,
            0
        );
        assert!(decode_broker_notice(own, 4, 0, false, false).is_err());
        for (token, why) in [
            (0, "the receiver itself"),
            (4, "a rank outside the world"),
            (1, "the newcomer itself"),
            (2 | 1 << 33, "a bit above 32"),
        ] {
            let error = never_joins(1, token).unwrap_err();
            assert!(
                matches!(error, ProtocolError::Field { found, .. } if found == token),
                "{why}: {error}"
            );
        }
        let with_fd = WorkerNotice::new(NoticeKind::NeverJoins, 1, 2);
        assert!(matches!(
            decode_broker_notice(bytemuck::bytes_of(&with_fd), 4, 0, true, false),
            Err(ProtocolError::FdCount { .. })
        ));
    }
}

/// What a broker answered a status request ([`crate::status`]): its header and one record per
/// rank, checked for shape. What the ranks published in them (status words, fill levels) is
/// still theirs to vouch for: readers check it before they believe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusReport {
    /// The broker's header.
    pub header: StatusReplyHeader,
    /// Every rank of the world, in rank order.
    pub ranks: Vec<RankStatus>,
}

impl StatusReport {
    /// The state of `record` (its code was checked when the report was decoded).
    #[must_use]
    pub fn state(record: &RankStatus) -> RankState {
        RankState::from_code(record.state).unwrap_or(RankState::NeverJoined)
    }
}

/// A status request: a logon frame with [`STATUS_MAGIC`] and no other field set.
#[must_use]
pub fn status_request() -> LogonFrame {
    let mut frame = LogonFrame::zeroed();
    frame.magic = STATUS_MAGIC;
    frame.version = PROTOCOL_VERSION;
    frame
}

/// Checks a status request (a logon frame with [`STATUS_MAGIC`]): the version, and every other
/// field zero.
///
/// # Errors
///
/// What was wrong, with the code to refuse it with.
pub fn decode_status_request(bytes: &[u8]) -> Result<(), (RejectReason, ProtocolError)> {
    let Some(frame) = bytes.get(..LOGON_LEN) else {
        let found = bytes.len();
        let error = ProtocolError::Truncated {
            expected: LOGON_LEN,
            found,
        };
        return Err((RejectReason::Truncated, error));
    };
    let frame: LogonFrame = bytemuck::pod_read_unaligned(frame);
    if frame.version != PROTOCOL_VERSION {
        let error = ProtocolError::BadVersion {
            expected: PROTOCOL_VERSION,
            found: frame.version,
        };
        return Err((RejectReason::BadVersion, error));
    }
    for (field, found) in [
        (
            "status request requested_rank",
            u64::from(frame.requested_rank),
        ),
        (
            "status request min_ring_capacity",
            u64::from(frame.min_ring_capacity),
        ),
        ("status request _pad0", u64::from(frame._pad0)),
        ("status request job", frame.job),
    ] {
        if found != 0 {
            return Err((
                RejectReason::BadPadding,
                ProtocolError::BadPadding { field, found },
            ));
        }
    }
    Ok(())
}

/// Bytes in the status answer of a world of `world_size`.
#[must_use]
pub const fn status_reply_len(world_size: u32) -> usize {
    size_of::<StatusReplyHeader>() + world_size as usize * size_of::<RankStatus>()
}

/// Decodes a broker's whole answer to a status request: a refusal becomes [`Error::Rejected`].
///
/// # Errors
///
/// [`Error::Rejected`]; [`Error::Protocol`] for an answer cut short or too long, bad magic or
/// version, a world out of range, or a record out of order or with an unknown state.
pub fn decode_status_reply(bytes: &[u8]) -> Result<StatusReport, Error> {
    if bytes.len() >= 8 && bytes[..8] == REPLY_MAGIC.to_le_bytes() {
        // A refusal (a uid it does not admit, say) is a logon reply header.
        decode_reply_header(bytes)?;
        return Err(ProtocolError::BadMagic {
            expected: STATUS_REPLY_MAGIC,
            found: REPLY_MAGIC,
        }
        .into());
    }
    let header_len = size_of::<StatusReplyHeader>();
    let Some(header) = bytes.get(..header_len) else {
        let found = bytes.len();
        return Err(ProtocolError::Truncated {
            expected: header_len,
            found,
        }
        .into());
    };
    let header: StatusReplyHeader = bytemuck::pod_read_unaligned(header);
    if header.magic != STATUS_REPLY_MAGIC {
        let found = header.magic;
        let expected = STATUS_REPLY_MAGIC;
        return Err(ProtocolError::BadMagic { expected, found }.into());
    }
    if header.version != PROTOCOL_VERSION {
        let found = header.version;
        let expected = PROTOCOL_VERSION;
        return Err(ProtocolError::BadVersion { expected, found }.into());
    }
    let world = header.world_size;
    if world == 0 || world > MAX_WORLD_SIZE {
        return Err(ProtocolError::Field {
            field: "status world_size",
            expected: format!("1 to {MAX_WORLD_SIZE}"),
            found: u64::from(world),
        }
        .into());
    }
    let expected = status_reply_len(world);
    if bytes.len() != expected {
        let found = bytes.len();
        return Err(if found < expected {
            ProtocolError::Truncated { expected, found }
        } else {
            ProtocolError::Field {
                field: "status answer length",
                expected: format!("{expected} bytes"),
                found: found as u64,
            }
        }
        .into());
    }
    let mut ranks = Vec::with_capacity(world as usize);
    for (rank, record) in (0..world).zip(bytes[header_len..].chunks_exact(size_of::<RankStatus>()))
    {
        let record: RankStatus = bytemuck::pod_read_unaligned(record);
        if record.rank != rank {
            return Err(ProtocolError::Field {
                field: "status record rank",
                expected: format!("rank {rank}"),
                found: u64::from(record.rank),
            }
            .into());
        }
        if RankState::from_code(record.state).is_none() {
            return Err(ProtocolError::Field {
                field: "status record state",
                expected: "0 to 4".into(),
                found: u64::from(record.state),
            }
            .into());
        }
        ranks.push(record);
    }
    Ok(StatusReport { header, ranks })
}
