//! A worker's decoder of the notices its broker sends (peers' pidfds and outboxes, relayed fds,
//! relay answers), fed arbitrary bytes, world sizes, ranks and fd flags: a notice that passed
//! every check, or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shmbroker_bindings::NoticeKind;
use shmbroker_handshake::wire::decode_broker_notice;

fuzz_target!(|data: &[u8]| {
    let Some((&head, notice)) = data.split_first() else {
        return;
    };
    let world = u32::from(head % 64) + 1;
    let rank = u32::from(head / 64) % world;
    let fd_attached = head & 1 == 1;
    if let Ok(decoded) = decode_broker_notice(notice, world, rank, fd_attached) {
        // What passed is safe to act on: another rank of the world, an fd exactly where the
        // kind carries one, a process id where the token is one.
        assert!(decoded.peer < world && decoded.peer != rank);
        let carries_fd = matches!(
            decoded.kind,
            NoticeKind::RelayedFd | NoticeKind::PeerOutbox | NoticeKind::Peer
        );
        assert_eq!(carries_fd, fd_attached);
        if matches!(decoded.kind, NoticeKind::Peer | NoticeKind::PeerOutbox) {
            assert!(decoded.token > 0 && decoded.token <= i32::MAX as u64);
        }
        if decoded.kind == NoticeKind::NeverJoins {
            // The rank that wound the job down: another rank of the world, not the newcomer.
            let cause = (decoded.token & u64::from(u32::MAX)) as u32;
            assert!(decoded.token >> 33 == 0 && cause < world && cause != rank);
            assert_ne!(cause, decoded.peer);
        }
    }
});
