//! A worker's decoder of the notices its broker sends (peers' pidfds and outboxes, relayed fds,
//! relay answers, rejoins, typed channels' rings), fed arbitrary bytes, world sizes, ranks, fd flags and whether the
//! worker is a replacement (the first two bytes): a notice that passed every check, or an
//! error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shmbroker_bindings::{ChannelToken, MAX_REJOINS, NoticeKind};
use shmbroker_handshake::wire::decode_broker_notice;

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let Some((&flags, notice)) = rest.split_first() else {
        return;
    };
    let world = u32::from(head % 64) + 1;
    let rank = u32::from(head / 64) % world;
    let fd_attached = flags & 1 == 1;
    let replacement = flags & 2 == 2;
    if let Ok(decoded) = decode_broker_notice(notice, world, rank, fd_attached, replacement) {
        // What passed is safe to act on: another rank of the world, an fd exactly where the
        // kind carries one, a process id where the token is one.
        assert!(decoded.peer < world && decoded.peer != rank);
        let rejoin_ring = matches!(
            decoded.kind,
            NoticeKind::RejoinRingTo | NoticeKind::RejoinRingFrom | NoticeKind::RejoinReadiness
        );
        let carries_fd = rejoin_ring
            || matches!(
                decoded.kind,
                NoticeKind::RelayedFd
                    | NoticeKind::PeerOutbox
                    | NoticeKind::Peer
                    | NoticeKind::Rejoined
                    | NoticeKind::ChannelMade
                    | NoticeKind::ChannelOffered
            );
        assert_eq!(carries_fd, fd_attached);
        if matches!(
            decoded.kind,
            NoticeKind::ChannelMade | NoticeKind::ChannelOffered | NoticeKind::ChannelRefused
        ) {
            // A channel's ring is one a broker makes: a record size and capacity it serves.
            assert!(ChannelToken::unpack(decoded.token).is_some());
        }
        if matches!(
            decoded.kind,
            NoticeKind::Peer | NoticeKind::PeerOutbox | NoticeKind::Rejoined
        ) {
            assert!(decoded.token > 0 && decoded.token <= i32::MAX as u64);
        }
        if rejoin_ring {
            // How many times the rank was replaced: 0 (it comes late) to the broker's limit.
            assert!(decoded.token <= u64::from(MAX_REJOINS));
        }
        if decoded.kind == NoticeKind::NeverJoins {
            // The rank that wound the job down: another rank of the world than the newcomer,
            // and than this one unless this worker replaced it.
            let cause = (decoded.token & u64::from(u32::MAX)) as u32;
            assert!(decoded.token >> 33 == 0 && cause < world);
            assert!(replacement || cause != rank);
            assert_ne!(cause, decoded.peer);
        }
    }
});
