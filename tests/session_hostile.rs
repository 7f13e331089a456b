//! Bytes from a peer that no correct peer sends, with ranks on threads of this process: forged,
//! duplicate and foreign acknowledgements, stray chunks, cut pipelines, floods and fd tickets
//! naming another process. Each is refused naming the sender, and frees or delivers nothing.

use shmbroker::Collectives;
use shmbroker::bindings::{INLINE_BYTES, Message, PayloadRef, kind};
use shmbroker::session::Error;
use std::time::{Duration, Instant};

mod common;

use common::{World, expect_protocol, pair, raw, raw_send};

/// Rank `peer`'s acknowledgement of `payload`, forged on its raw ring to rank 0.
fn forge_ack(session: &mut shmbroker::Session, payload: PayloadRef) {
    let mut inline = [0u8; INLINE_BYTES];
    inline[..16].copy_from_slice(bytemuck::bytes_of(&payload));
    let ack = Message {
        kind: kind::PAYLOAD_ACK,
        len: 0,
        tag: 0,
        inline,
    };
    session.raw().link(0).unwrap().to.try_send(ack).unwrap();
}

/// The reference in the next message on `session`'s raw ring from rank 0 (a loan).
fn lent_ref(session: &mut shmbroker::Session) -> PayloadRef {
    let message = session
        .raw()
        .link(0)
        .unwrap()
        .from
        .recv_timeout(Duration::from_secs(5))
        .unwrap();
    assert_eq!(message.kind & kind::LOAN, kind::LOAN, "{message:?}");
    bytemuck::pod_read_unaligned(&message.inline[..16])
}

fn expect_refused_ack(zero: &mut shmbroker::Session, from: u32, fault: &str) {
    expect_protocol(zero.poll_acks(), from, fault);
}

#[test]
fn duplicate_foreign_and_altered_acknowledgements_are_refused_and_free_nothing() {
    let (_world, sessions) = World::start("bad-acks", 3);
    let mut sessions = sessions.into_iter();
    let (mut zero, mut one, mut two) = (
        sessions.next().unwrap(),
        sessions.next().unwrap(),
        sessions.next().unwrap(),
    );
    // A loan to ranks 1 and 2: both owe an acknowledgement.
    let mut loan = zero.loan(1000).unwrap();
    loan.fill(9);
    let receiver = std::thread::spawn(move || {
        let view = one.broadcast_loan(0, None).unwrap().unwrap();
        assert!(view.iter().all(|&b| b == 9));
        (one, view)
    });
    zero.broadcast_loan(0, Some(loan)).unwrap();
    let (mut one, view) = receiver.join().unwrap();
    let sent = lent_ref(&mut two);
    assert_eq!(zero.outbox_blocks_owed(), 1);

    // Rank 2 acknowledges, then again: the second is refused, naming rank 2, and the block
    // stays owed by rank 1 (whose view still reads it).
    forge_ack(&mut two, sent);
    forge_ack(&mut two, sent);
    expect_refused_ack(&mut zero, 2, "that rank owes no acknowledgement");
    assert_eq!(zero.outbox_blocks_owed(), 1);
    // An acknowledgement of the right block with another length, and of a block never sent.
    forge_ack(&mut two, PayloadRef { len: 999, ..sent });
    expect_refused_ack(&mut zero, 2, "was sent as 1000 bytes");
    forge_ack(
        &mut two,
        PayloadRef {
            offset: sent.offset + 4096,
            ..sent
        },
    );
    expect_refused_ack(&mut zero, 2, "no block was sent at that offset");
    assert_eq!(zero.outbox_blocks_owed(), 1);
    assert!(view.iter().all(|&b| b == 9), "the block was reused");

    // Rank 1 lets go: its acknowledgement (sent with its next call) frees the block.
    drop(view);
    one.poll_acks().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while zero.outbox_blocks_owed() != 0 && Instant::now() < deadline {
        zero.poll_acks().unwrap();
    }
    assert_eq!(zero.outbox_blocks_owed(), 0);
}

#[test]
fn an_acknowledgement_from_a_rank_the_block_was_not_sent_to_is_refused() {
    let (_world, sessions) = World::start("foreign-ack", 3);
    let mut sessions = sessions.into_iter();
    let (mut zero, mut one, mut two) = (
        sessions.next().unwrap(),
        sessions.next().unwrap(),
        sessions.next().unwrap(),
    );
    let loan = zero.loan(64).unwrap();
    zero.send_loan(1, loan).unwrap();
    let sent = lent_ref(&mut one);
    // Rank 2 never got it, but names it exactly.
    forge_ack(&mut two, sent);
    expect_refused_ack(&mut zero, 2, "that rank owes no acknowledgement");
    assert_eq!(zero.outbox_blocks_owed(), 1);
    forge_ack(&mut one, sent);
    zero.poll_acks().unwrap();
    assert_eq!(zero.outbox_blocks_owed(), 0);
}

#[test]
fn an_eager_message_cut_short_times_out_without_harm_and_completes_later() {
    let (_world, mut zero, mut one) = pair("partial-eager");
    // 48 + 3 * 64 = 240 bytes: a header and three continuation slots, of which one is sent.
    let data: Vec<u8> = (0..240u32).map(|i| i as u8).collect();
    let mut inline = [0u8; INLINE_BYTES];
    inline.copy_from_slice(&data[..48]);
    raw_send(&mut one, raw(kind::SEND, 0, 240, inline));
    let slot = |i: usize| -> Message { bytemuck::pod_read_unaligned(&data[48 + 64 * i..][..64]) };
    raw_send(&mut one, slot(0));
    for _ in 0..2 {
        match zero.with_timeout(Duration::from_millis(50)).recv(1) {
            Err(Error::Timeout {
                op: "recv",
                waiting_for,
                ..
            }) if waiting_for == [1] => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    raw_send(&mut one, slot(1));
    raw_send(&mut one, slot(2));
    assert_eq!(zero.recv(1).unwrap(), data);
}

#[test]
fn a_stray_chunk_or_unknown_kind_in_a_collective_is_a_protocol_error_naming_the_sender() {
    // Written with the tag of the all-gather rank 0 is in: the receive that takes messages
    // straight from the ring leaves them to the inbox, which says what they are.
    for (name, kind, expected) in [
        ("stray-chunk-collective", kind::CHUNK, "kind 0x8"),
        ("unknown-kind-collective", 0x99, "unknown message kind 0x99"),
    ] {
        let (_world, mut zero, mut one) = pair(name);
        let mut inline = [0u8; INLINE_BYTES];
        inline[..8].copy_from_slice(&0u64.to_le_bytes());
        raw_send(&mut one, raw(kind, 0, 8, inline));
        match zero
            .with_timeout(Duration::from_millis(500))
            .all_gather(b"zero")
        {
            Err(Error::Protocol { peer: 1, detail }) => {
                assert!(detail.contains(expected), "{name}: {detail}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn chunks_and_pipelined_headers_no_correct_peer_sends_are_refused() {
    let cases: [(&str, Vec<Message>, &str); 4] = [
        (
            "stray-chunk",
            vec![raw(kind::CHUNK, 0, 0, [0; INLINE_BYTES])],
            "a chunk (tag 0) that no pipelined message announced",
        ),
        (
            "header-bytes",
            vec![raw(kind::SEND | kind::PIPELINED, 0, 0, {
                let mut inline = [7u8; INLINE_BYTES];
                inline[..8].copy_from_slice(&100u64.to_le_bytes());
                inline
            })],
            "a pipelined header must hold only the total length",
        ),
        (
            "cut-off",
            vec![
                raw(kind::SEND | kind::PIPELINED, 0, 0, {
                    let mut inline = [0u8; INLINE_BYTES];
                    inline[..8].copy_from_slice(&100u64.to_le_bytes());
                    inline
                }),
                raw(kind::SEND, 1, 0, [0; INLINE_BYTES]),
            ],
            "expected a chunk of message 0 with 1 to 100 bytes, found kind 0x4 tag 1",
        ),
        (
            "unknown-kind",
            vec![raw(0x99, 0, 0, [0; INLINE_BYTES])],
            "unknown message kind 0x99",
        ),
    ];
    for (name, messages, expected) in cases {
        let (_world, mut zero, mut one) = pair(name);
        for message in messages {
            raw_send(&mut one, message);
        }
        match zero.with_timeout(Duration::from_millis(500)).recv(1) {
            Err(Error::Protocol { peer: 1, detail }) => {
                assert!(detail.contains(expected), "{name}: {detail}");
            }
            other => panic!("{name}: unexpected {other:?}"),
        }
    }
}

#[test]
fn a_pipelined_message_cut_off_by_another_is_refused_while_skipped() {
    let (_world, mut zero, mut one) = pair("cut-off-skipped");
    let mut inline = [0u8; INLINE_BYTES];
    inline[..8].copy_from_slice(&100u64.to_le_bytes());
    raw_send(&mut one, raw(kind::SEND | kind::PIPELINED, 0, 0, inline));
    raw_send(&mut one, raw(kind::BARRIER, 0, 0, [0; INLINE_BYTES]));
    // The barrier looks past the point-to-point message, and finds it cut off.
    expect_protocol(
        zero.with_timeout(Duration::from_millis(500)).barrier(),
        1,
        "was cut off after 0 bytes",
    );
}

#[test]
fn a_peer_flooding_messages_nobody_receives_cannot_hold_a_call_past_its_deadline() {
    let (_world, mut zero, mut one) = pair("flood");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooding = std::sync::Arc::clone(&stop);
    let flooder = std::thread::spawn(move || {
        let mut tag = 0;
        while !flooding.load(std::sync::atomic::Ordering::Relaxed) {
            let link = one.raw().link(0).unwrap();
            if link
                .to
                .try_send(raw(kind::SEND, tag, 0, [0; INLINE_BYTES]))
                .is_ok()
            {
                tag += 1;
            }
        }
        one
    });
    let start = Instant::now();
    let outcome = zero.with_timeout(Duration::from_millis(300)).barrier();
    let took = start.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(flooder.join().unwrap());
    assert!(
        matches!(
            outcome,
            Err(Error::Timeout { ref waiting_for, .. }) if waiting_for == &[1]
        ) || matches!(outcome, Err(Error::Protocol { peer: 1, .. })),
        "{outcome:?}"
    );
    assert!(
        took < Duration::from_secs(3),
        "the flood held the barrier for {took:?}"
    );
}

#[test]
fn an_fd_ticket_naming_another_process_than_the_exporters_is_refused() {
    // A process of this uid with an fd worth stealing (its stdout).
    let mut bystander = std::process::Command::new("sleep")
        .arg("30")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (_world, mut zero, mut one) = pair("fd-steal");
    // Rank 1's ticket for the first collective names the bystander's fd 1, exactly (a process of
    // the same uid can read its (st_dev, st_ino) in /proc), so only the pid check stands between
    // rank 0 and taking it.
    let target = nix::sys::stat::stat(format!("/proc/{}/fd/1", bystander.id()).as_str()).unwrap();
    let ticket = shmbroker::bindings::FdTicket {
        pid: bystander.id(),
        fd: 1,
        dev: target.st_dev,
        ino: target.st_ino,
        token: 0,
    };
    let mut inline = [0u8; INLINE_BYTES];
    inline[..32].copy_from_slice(bytemuck::bytes_of(&ticket));
    raw_send(&mut one, raw(kind::FD_TICKET, 0, 32, inline));
    // Rank 1's status round, as it would send it (nothing failed at rank 1): rank 0 fails at
    // once after it, naming rank 1, as every other rank would.
    raw_send(&mut one, raw(kind::ALL_GATHER, 1, 48, [0u8; INLINE_BYTES]));
    let mine = std::fs::File::open("/dev/null").unwrap();
    zero.set_timeout(Duration::from_secs(2));
    match zero.exchange_fds(std::os::fd::AsFd::as_fd(&mine)) {
        Err(Error::Protocol { peer: 1, detail }) => {
            let expected = format!(
                "fd ticket names pid {}; rank 1 logged on as pid {}",
                bystander.id(),
                std::process::id()
            );
            assert!(detail.contains(&expected), "{detail}");
        }
        other => panic!("unexpected {other:?}"),
    }
    let _ = bystander.kill();
    let _ = bystander.wait();
}

#[test]
fn an_acknowledgement_for_a_block_not_awaiting_one_is_refused() {
    let (_world, mut zero, mut one) = pair("forged-ack");
    let forged = PayloadRef {
        offset: 4096,
        len: 10,
        _pad0: 0,
    };
    let mut inline = [0u8; INLINE_BYTES];
    inline[..16].copy_from_slice(bytemuck::bytes_of(&forged));
    let ack = Message {
        kind: kind::PAYLOAD_ACK,
        len: 0,
        tag: 0,
        inline,
    };
    one.raw().link(0).unwrap().to.try_send(ack).unwrap();
    match zero.with_timeout(Duration::from_millis(200)).recv(1) {
        Err(Error::Protocol { peer: 1, detail }) => {
            assert!(
                detail.contains("offset 4096 (10 bytes) refused: no block was sent"),
                "{detail}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
}
