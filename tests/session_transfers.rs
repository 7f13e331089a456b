//! The session's messages, payload blocks, fds and GPU handles, with ranks on threads of this
//! process: order around collectives, references and blocks, fd exchange by pidfd_getfd and by
//! the broker, and GPU handles with their fds.

use shmbroker::Collectives;
use shmbroker::bindings::{INLINE_BYTES, Message, PayloadRef, kind};
use shmbroker::session::Error;
use std::time::{Duration, Instant};

mod common;

use common::{World, expect_protocol, memfd_with, pair, raw, raw_send, text_of};

#[test]
fn point_to_point_messages_keep_their_order_around_collectives() {
    let (_world, mut zero, mut one) = pair("p2p");
    let sender = std::thread::spawn(move || {
        one.send(0, b"first").unwrap();
        one.send(0, &[7; 3000]).unwrap();
        one.barrier().unwrap();
        one.send(0, b"third").unwrap();
        one
    });
    // The barrier is taken first although both sends came before it on the ring.
    zero.barrier().unwrap();
    assert_eq!(zero.recv(1).unwrap(), b"first");
    assert_eq!(zero.recv(1).unwrap(), vec![7; 3000]);
    assert_eq!(zero.recv(1).unwrap(), b"third");
    drop(sender.join().unwrap());
}

#[test]
fn a_payload_reference_outside_the_senders_outbox_is_refused() {
    let (_world, mut zero, mut one) = pair("badref");
    // Rank 1 forges a loan pointing far outside its outbox.
    let forged = PayloadRef {
        offset: 1 << 40,
        len: 100,
        _pad0: 0,
    };
    let mut inline = [0u8; INLINE_BYTES];
    inline[..16].copy_from_slice(bytemuck::bytes_of(&forged));
    let message = Message {
        kind: kind::ALL_GATHER | kind::LOAN,
        len: 0,
        tag: 0,
        inline,
    };
    one.raw().link(0).unwrap().to.try_send(message).unwrap();
    match zero
        .with_timeout(Duration::from_millis(500))
        .all_gather(b"mine")
    {
        Err(Error::Outbox {
            peer: 1,
            source:
                shmbroker::allocator::Error::OutOfBounds {
                    offset, len: 100, ..
                },
        }) => {
            assert_eq!(offset, 1 << 40);
        }
        other => panic!("unexpected {other:?}"),
    }
    // An eager length longer than an eager message can be is refused as well.
    let message = Message {
        kind: kind::SEND,
        len: kind::EAGER_MAX as u32 + 1,
        tag: 0,
        inline: [0; INLINE_BYTES],
    };
    one.raw().link(0).unwrap().to.try_send(message).unwrap();
    expect_protocol(zero.recv(1), 1, "eager message of 4081 bytes");
}

#[test]
fn payload_blocks_are_freed_once_every_receiver_is_done() {
    let (_world, sessions) = World::start("acks", 3);
    let handles: Vec<_> = sessions
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                // Far more large broadcasts than the region holds at once: only freeing keeps
                // this going.
                for round in 0..2000u32 {
                    let root = round % 3;
                    let data = vec![round as u8; 4000];
                    let got = s
                        .broadcast(root, (s.rank() == root).then_some(&data[..]))
                        .unwrap();
                    assert_eq!(got, data);
                }
                s.barrier().unwrap();
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
}

#[test]
fn a_root_broadcasting_without_reading_is_not_deadlocked_by_acknowledgements() {
    // Rings of 64 slots: the acknowledgements of 3000 large broadcasts fill the ring back to the
    // root long before the root reads anything, while the root fills the ring to the receiver.
    let (_world, sessions) = World::start("ack-flood", 2);
    let mut sessions = sessions.into_iter();
    let (mut root, mut receiver) = (sessions.next().unwrap(), sessions.next().unwrap());
    let data = vec![9u8; 4000];
    let expected = data.clone();
    let receiving = std::thread::spawn(move || {
        for _ in 0..3000 {
            assert_eq!(receiver.broadcast(0, None).unwrap(), expected);
        }
        receiver
    });
    for _ in 0..3000 {
        root.broadcast(0, Some(&data)).unwrap();
    }
    let _receiver = receiving.join().unwrap();
}

fn exchange_and_broadcast_fds(name: &str, transport: shmbroker::session::FdTransport) {
    use shmbroker::session::FdTransport;
    use std::os::fd::AsFd;
    let (_world, sessions) = World::start(name, 3);
    let handles: Vec<_> = sessions
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                s.set_fd_transport(transport);
                assert_eq!(s.fd_transport(), transport);
                assert_eq!(s.fd_transport_used(), None, "before any exchange");
                let rank = s.rank();
                let mine = memfd_with(&format!("file of rank {rank}"));
                let all = s.exchange_fds(mine.as_fd()).unwrap();
                // Under `auto`, pidfd_getfd unless the kernel refuses it (Yama, a container).
                let used = s.fd_transport_used();
                match transport {
                    FdTransport::Relay => assert_eq!(used, Some(FdTransport::Relay)),
                    FdTransport::Pidfd => assert_eq!(used, Some(FdTransport::Pidfd)),
                    FdTransport::Auto => assert!(used.is_some_and(|u| u != FdTransport::Auto)),
                }
                let texts: Vec<String> = all.iter().map(text_of).collect();
                let root_fd = (rank == 2).then(|| memfd_with("broadcast by rank 2"));
                let got = s
                    .broadcast_fd(2, root_fd.as_ref().map(|fd| fd.as_fd()))
                    .unwrap();
                // Batches: five fds from every rank, then more fds from one root than the
                // broker lets a worker hold unclaimed (relayed, they go one per round).
                let batch: Vec<_> = (0..5)
                    .map(|i| memfd_with(&format!("file {i} of rank {rank}")))
                    .collect();
                let borrowed: Vec<_> = batch.iter().map(AsFd::as_fd).collect();
                let batches = s.exchange_fd_batch(&borrowed).unwrap();
                let batch_texts: Vec<Vec<String>> = batches
                    .iter()
                    .map(|fds| fds.iter().map(text_of).collect())
                    .collect();
                let many = shmbroker::handshake::MAX_UNCLAIMED_RELAYS + 6;
                let roots: Vec<_> = (0..many)
                    .filter(|_| rank == 1)
                    .map(|i| memfd_with(&format!("batch file {i}")))
                    .collect();
                let borrowed: Vec<_> = roots.iter().map(AsFd::as_fd).collect();
                let broadcast = s.broadcast_fd_batch(1, &borrowed, many).unwrap();
                let broadcast_texts: Vec<String> = broadcast.iter().map(text_of).collect();
                (texts, text_of(&got), batch_texts, broadcast_texts)
            })
        })
        .collect();
    for handle in handles {
        let (texts, broadcast, batches, broadcast_batch) = handle.join().unwrap();
        assert_eq!(
            texts,
            ["file of rank 0", "file of rank 1", "file of rank 2"]
        );
        assert_eq!(broadcast, "broadcast by rank 2");
        let expected: Vec<Vec<String>> = (0..3)
            .map(|rank| (0..5).map(|i| format!("file {i} of rank {rank}")).collect())
            .collect();
        assert_eq!(batches, expected);
        let many = shmbroker::handshake::MAX_UNCLAIMED_RELAYS + 6;
        let expected: Vec<String> = (0..many).map(|i| format!("batch file {i}")).collect();
        assert_eq!(broadcast_batch, expected);
    }
}

#[test]
fn fd_batches_of_different_lengths_fail_on_every_rank_naming_one_that_disagrees() {
    use std::os::fd::AsFd;
    let (_world, sessions) = World::start("fds-miscounted", 3);
    let joins: Vec<_> = sessions
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                let rank = s.rank();
                // An exchange where rank 2 passes 3 fds and the others 2; then a broadcast from
                // rank 0 of 2 fds that rank 2 expects 3 of.
                let files: Vec<_> = (0..if rank == 2 { 3 } else { 2 })
                    .map(|_| memfd_with("x"))
                    .collect();
                let borrowed: Vec<_> = files.iter().map(AsFd::as_fd).collect();
                let exchanged = s.exchange_fd_batch(&borrowed).map(|_| ());
                let offered = if rank == 0 { &borrowed[..] } else { &[] };
                let broadcast = s
                    .broadcast_fd_batch(0, offered, if rank == 2 { 3 } else { 2 })
                    .map(|_| ());
                // Every rank is still in step: the next collective works.
                s.barrier().unwrap();
                (exchanged, broadcast)
            })
        })
        .collect();
    let outcomes = joins.into_iter().map(|join| join.join().unwrap());
    for (rank, (exchanged, broadcast)) in (0u32..).zip(outcomes) {
        // Ranks 0 and 1 name rank 2, which names the first rank it disagrees with.
        let named = if rank == 2 { 0 } else { 2 };
        for (call, outcome) in [("exchange", exchanged), ("broadcast", broadcast)] {
            match outcome {
                Err(Error::Protocol { peer, detail }) => {
                    assert_eq!(peer, named, "rank {rank}, {call}: {detail}");
                    assert!(
                        detail.contains("same number"),
                        "rank {rank}, {call}: {detail}"
                    );
                }
                other => panic!("rank {rank}, {call}: {other:?}"),
            }
        }
    }
}

#[test]
fn a_rank_that_allows_only_pidfd_fails_an_exchange_others_would_relay_on_every_rank() {
    use shmbroker::session::FdTransport;
    use std::os::fd::AsFd;
    let (_world, sessions) = World::start("fds-mixed", 3);
    let joins: Vec<_> = sessions
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                // Rank 0 allows only pidfd_getfd; the others relay everything they import.
                let rank = s.rank();
                let transport = if rank == 0 {
                    FdTransport::Pidfd
                } else {
                    FdTransport::Relay
                };
                s.set_fd_transport(transport);
                s.set_timeout(Duration::from_secs(10));
                let mine = memfd_with("x");
                let outcome = s.exchange_fds(mine.as_fd()).map(drop);
                s.barrier().unwrap();
                outcome
            })
        })
        .collect();
    for (rank, join) in (0u32..).zip(joins) {
        match join.join().unwrap() {
            Err(Error::FdTransport(detail)) => {
                assert!(
                    detail.contains("SHMBROKER_FD_TRANSPORT"),
                    "rank {rank}: {detail}"
                );
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
}

#[test]
fn a_stale_fd_ticket_fails_the_exchange_naming_its_exporter() {
    use std::os::fd::{AsFd, AsRawFd};
    let (_world, mut zero, mut one) = pair("fd-stale");
    // Rank 1's ticket names its fd `a` by number but the file of `b`: a number closed and
    // reused between the ticket and the import looks just so.
    let (a, b) = (memfd_with("a"), memfd_with("b"));
    let named = nix::sys::stat::fstat(b.as_fd()).unwrap();
    let found = nix::sys::stat::fstat(a.as_fd()).unwrap();
    let ticket = shmbroker::bindings::FdTicket {
        pid: std::process::id(),
        fd: a.as_raw_fd(),
        dev: named.st_dev,
        ino: named.st_ino,
        token: 0,
    };
    let mut inline = [0u8; INLINE_BYTES];
    inline[..32].copy_from_slice(bytemuck::bytes_of(&ticket));
    raw_send(&mut one, raw(kind::FD_TICKET, 0, 32, inline));
    // The status round (the next collective), as an honest exporter's would be: nothing
    // refused, stale, miscounted, short of fds or forged at rank 1.
    raw_send(&mut one, raw(kind::ALL_GATHER, 1, 48, [0u8; INLINE_BYTES]));
    zero.set_timeout(Duration::from_secs(5));
    match zero.exchange_fds(memfd_with("mine").as_fd()) {
        Err(Error::StaleFdTicket {
            exporter: 1,
            expected,
            found: seen,
        }) => {
            assert_eq!(expected, (named.st_dev, named.st_ino));
            assert_eq!(seen, (found.st_dev, found.st_ino));
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn fds_move_by_pidfd_getfd() {
    exchange_and_broadcast_fds("fds-auto", shmbroker::session::FdTransport::Auto);
}

#[test]
fn fds_move_through_the_broker_relay() {
    exchange_and_broadcast_fds("fds-relay", shmbroker::session::FdTransport::Relay);
}

#[test]
fn an_fd_broadcast_root_without_an_fd_is_misuse() {
    let (_world, mut sessions) = World::start("fds-misuse", 2);
    assert!(matches!(
        sessions[0].broadcast_fd(0, None),
        Err(Error::Misuse(_))
    ));
}

fn gpu_handle(
    kind: shmbroker::bindings::GpuHandleKind,
    rank: u32,
) -> shmbroker::bindings::GpuHandle {
    shmbroker::bindings::GpuHandle {
        kind: kind as u32,
        flags: 0,
        device_uuid: [rank as u8; 16],
        handle: [rank as u8 + 100; 64],
        size: 64,
        offset: 0,
        buffer_id: 1000 + u64::from(rank),
    }
}

#[test]
fn gpu_handles_travel_with_their_fds_when_the_kind_has_one() {
    use shmbroker::bindings::GpuHandleKind::{CudaIpcMemory, HostMemfd};
    use std::os::fd::AsFd;
    let (_world, sessions) = World::start("gpu", 3);
    let handles: Vec<_> = sessions
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                let rank = s.rank();
                // Rank 0 shares a legacy CUDA IPC handle (no fd); the others host memfds.
                let kind = if rank == 0 { CudaIpcMemory } else { HostMemfd };
                let memory = memfd_with(&format!("device memory of rank {rank}"));
                let fd = (kind == HostMemfd).then(|| memory.as_fd());
                let gathered = s
                    .all_gather_gpu_handles(&gpu_handle(kind, rank), fd)
                    .unwrap();
                let offered = (rank == 2).then(|| (gpu_handle(HostMemfd, 2), memory.as_fd()));
                let (root_handle, root_fd) = s
                    .broadcast_gpu_handle(2, offered.as_ref().map(|(h, fd)| (h, Some(*fd))))
                    .unwrap();
                let cuda = (rank == 1).then(|| gpu_handle(CudaIpcMemory, 1));
                let (cuda_handle, cuda_fd) = s
                    .broadcast_gpu_handle(1, cuda.as_ref().map(|h| (h, None)))
                    .unwrap();
                (gathered, (root_handle, root_fd), (cuda_handle, cuda_fd))
            })
        })
        .collect();
    for handle in handles {
        let (gathered, (root_handle, root_fd), (cuda_handle, cuda_fd)) = handle.join().unwrap();
        for (peer, (handle, fd)) in (0u32..).zip(&gathered) {
            let kind = if peer == 0 { CudaIpcMemory } else { HostMemfd };
            assert_eq!(handle, &gpu_handle(kind, peer));
            match fd {
                None => assert_eq!(peer, 0),
                Some(fd) => assert_eq!(text_of(fd), format!("device memory of rank {peer}")),
            }
        }
        assert_eq!(root_handle, gpu_handle(HostMemfd, 2));
        assert_eq!(text_of(&root_fd.unwrap()), "device memory of rank 2");
        assert_eq!(
            (cuda_handle, cuda_fd.is_none()),
            (gpu_handle(CudaIpcMemory, 1), true)
        );
    }
}

#[test]
fn a_gpu_handle_with_the_wrong_fd_is_misuse() {
    use shmbroker::bindings::GpuHandleKind::{CudaIpcMemory, HostMemfd};
    use std::os::fd::AsFd;
    let (_world, mut sessions) = World::start("gpu-misuse", 2);
    let memory = memfd_with("x");
    let zero = &mut sessions[0];
    assert!(matches!(
        zero.all_gather_gpu_handles(&gpu_handle(HostMemfd, 0), None),
        Err(Error::Misuse(_))
    ));
    assert!(matches!(
        zero.all_gather_gpu_handles(&gpu_handle(CudaIpcMemory, 0), Some(memory.as_fd())),
        Err(Error::Misuse(_))
    ));
}

#[test]
fn a_receiver_that_never_reads_holds_the_sender_back_until_its_deadline() {
    let (_world, mut sessions) = World::start("never-reads", 2);
    let zero = &mut sessions[0];
    // Large: the chunks it may have in flight fill, then the window widens until the outbox is
    // full; the send gives up at its deadline, with every block still accounted for.
    let start = Instant::now();
    let outcome = zero
        .with_timeout(Duration::from_millis(300))
        .send(1, &vec![1u8; 256 << 20]);
    let waited = start.elapsed();
    match outcome {
        Err(Error::Timeout {
            op: "send",
            waiting_for,
            ..
        }) if waiting_for == [1] => {}
        other => panic!("unexpected {other:?}"),
    }
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(3));
    let blocks = zero.outbox_blocks_owed();
    assert!(blocks > 0 && blocks as u64 <= zero.outbox_bytes() / (64 << 10));
    // Small: the ring fills, and the send gives up at its deadline as well.
    let small = loop {
        if let Err(error) = zero
            .with_timeout(Duration::from_millis(100))
            .send(1, &[2u8; 1000])
        {
            break error;
        }
    };
    assert!(
        matches!(&small, Error::Timeout { waiting_for, .. } if waiting_for == &[1]),
        "{small:?}"
    );
}

#[test]
fn a_gpu_handle_of_an_unknown_kind_from_a_peer_is_refused() {
    use shmbroker::bindings::GpuHandleKind::CudaIpcMemory;
    let (_world, mut zero, mut one) = pair("gpu-kind");
    // Rank 1 sends a handle of kind 99 (as a forger would, under the handle's all-gather).
    let forger = std::thread::spawn(move || {
        let mut forged = gpu_handle(CudaIpcMemory, 1);
        forged.kind = 99;
        one.all_gather_pod(&forged).unwrap();
        one
    });
    expect_protocol(
        zero.all_gather_gpu_handles(&gpu_handle(CudaIpcMemory, 0), None),
        1,
        "unknown GPU handle kind 99",
    );
    drop(forger.join().unwrap());
}
