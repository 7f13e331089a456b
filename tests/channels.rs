//! Typed channels: records streamed in order one at a time and in batches, records that do not
//! fill their slots, a tag or size the other end does not share, closing from either end, a
//! producer killed with records still in the ring, records taken ahead of the caller, and a
//! channel beside the session's own calls.

use bytemuck::{Pod, Zeroable};
use shmbroker::Collectives;
use shmbroker::Error;
use std::time::{Duration, Instant};

mod common;

use common::{Broker, World, farm_worker_with, read_line_within};

#[test]
fn records_stream_in_order_one_at_a_time_and_in_batches() {
    const COUNT: u64 = 200_000;
    let (_world, mut sessions) = World::start("channel-stream", 2);
    let mut consumer = sessions.pop().unwrap();
    let mut producer = sessions.pop().unwrap();
    let sending = std::thread::spawn(move || {
        let mut tx = producer.channel_to::<u64>(1, 42, 256).unwrap();
        for n in 0..COUNT {
            tx.send(&n).unwrap();
        }
        let batch: Vec<u64> = (COUNT..COUNT * 2).collect();
        for part in batch.chunks(1000) {
            tx.send_batch(part).unwrap();
        }
        // The session goes on with its own calls beside the channel.
        producer.send(1, b"done").unwrap();
        (producer, tx)
    });
    let mut rx = consumer.channel_from::<u64>(0, 42).unwrap();
    for n in 0..COUNT {
        assert_eq!(rx.recv().unwrap(), n);
    }
    let mut next = COUNT;
    let mut buffer = vec![0u64; 300];
    while next < COUNT * 2 {
        let got = rx.recv_batch(&mut buffer).unwrap();
        assert!(got >= 1);
        for &value in &buffer[..got] {
            assert_eq!(value, next);
            next += 1;
        }
    }
    assert_eq!(rx.try_recv().unwrap(), None);
    assert_eq!(consumer.recv(0).unwrap(), b"done");
    let (_producer, _tx) = sending.join().unwrap();
}

/// A record of 60 bytes: its slots are 64, and only its own bytes travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
struct Transaction {
    id: u32,
    payload: [u8; 56],
}

fn transaction(id: u32) -> Transaction {
    let mut payload = [0u8; 56];
    for (i, byte) in payload.iter_mut().enumerate() {
        *byte = (id as u8).wrapping_mul(7).wrapping_add(i as u8);
    }
    Transaction { id, payload }
}

#[test]
fn records_that_do_not_fill_their_slots_arrive_whole() {
    let (_world, mut sessions) = World::start("channel-odd", 2);
    let mut consumer = sessions.pop().unwrap();
    let mut producer = sessions.pop().unwrap();
    let sending = std::thread::spawn(move || {
        let mut tx = producer.channel_to::<Transaction>(1, 9, 64).unwrap();
        let all: Vec<Transaction> = (0..5000).map(transaction).collect();
        tx.send_batch(&all).unwrap();
        for id in 5000..5100 {
            while !tx.try_send(&transaction(id)).unwrap() {
                std::thread::yield_now();
            }
        }
        producer
    });
    let mut rx = consumer.channel_from::<Transaction>(0, 9).unwrap();
    let mut buffer = vec![Transaction::zeroed(); 37];
    let mut next = 0;
    while next < 5100 {
        let got = rx.recv_batch(&mut buffer).unwrap();
        for record in &buffer[..got] {
            assert_eq!(*record, transaction(next));
            next += 1;
        }
    }
    let _producer = sending.join().unwrap();
}

#[test]
fn a_tag_or_size_the_ends_do_not_share_fails_at_both_naming_what_each_has() {
    let (_world, mut sessions) = World::start("channel-mismatch", 2);
    let mut consumer = sessions.pop().unwrap();
    let mut producer = sessions.pop().unwrap();
    let sending = std::thread::spawn(move || {
        let mut tagged = producer.channel_to::<u64>(1, 1, 16).unwrap();
        let mut sized = producer.channel_to::<u32>(1, 2, 16).unwrap();
        (
            producer,
            tagged.send(&5).err(),
            sized.send(&5).err(),
            tagged,
            sized,
        )
    });
    let error = consumer.channel_from::<u64>(0, 99).unwrap_err();
    assert!(
        matches!(&error, Error::Misuse(text) if text.contains("0x1") && text.contains("0x63")),
        "{error}"
    );
    let error = consumer.channel_from::<u64>(0, 2).unwrap_err();
    assert!(
        matches!(&error, Error::Misuse(text) if text.contains("records of 4 bytes") && text.contains("expects 8")),
        "{error}"
    );
    let (mut producer, first, second, mut tagged, mut sized) = sending.join().unwrap();
    // Each send raced the refusal; by now both are refused.
    for (error, tx) in [
        (first, tagged.send(&6).err()),
        (second, sized.send(&6).err()),
    ] {
        let error = tx.or(error).expect("a refused channel keeps failing");
        assert!(
            matches!(&error, Error::Misuse(text) if text.contains("refused channel")),
            "{error}"
        );
    }
    // The session goes on, and the next channel between them is numbered past the refused ones.
    let next = std::thread::spawn(move || {
        let mut tx = producer.channel_to::<u64>(1, 3, 16).unwrap();
        tx.send(&77).unwrap();
        (producer, tx)
    });
    let mut rx = consumer.channel_from::<u64>(0, 3).unwrap();
    assert_eq!(rx.recv().unwrap(), 77);
    let _ = next.join().unwrap();
}

/// A record of 64 bytes: a receive of one takes what has arrived ahead of its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
struct Wide {
    id: u64,
    words: [u64; 7],
}

#[test]
fn records_released_in_batches_come_in_order_whatever_call_takes_them() {
    const COUNT: u64 = 20_000;
    let (_world, mut sessions) = World::start("channel-batches", 2);
    let mut consumer = sessions.pop().unwrap();
    let mut producer = sessions.pop().unwrap();
    let sending = std::thread::spawn(move || {
        let mut tx = producer.channel_to::<Wide>(1, 9, 64).unwrap();
        for id in 0..COUNT {
            tx.send(&Wide { id, words: [id; 7] }).unwrap();
        }
        // Closed with records still in the ring: they come before `ChannelClosed`.
        drop(tx);
        producer
    });
    let mut rx = consumer.channel_from::<Wide>(0, 9).unwrap();
    let mut next = 0u64;
    let mut buffer = [Wide::zeroed(); 5];
    let check = |record: Wide, next: &mut u64| {
        assert_eq!(
            record,
            Wide {
                id: *next,
                words: [*next; 7]
            }
        );
        *next += 1;
    };
    // Each call in turn, so that slots one call kept are given back by the others.
    let closed = loop {
        let taken = match next % 4 {
            0 => rx.recv().map(|record| check(record, &mut next)),
            1 => rx.try_recv().map(|record| {
                if let Some(record) = record {
                    check(record, &mut next);
                }
            }),
            2 => rx.try_recv_batch(&mut buffer[..3]).map(|count| {
                buffer[..count]
                    .iter()
                    .for_each(|&record| check(record, &mut next));
            }),
            _ => rx.recv_batch(&mut buffer).map(|count| {
                assert!(count >= 1);
                buffer[..count]
                    .iter()
                    .for_each(|&record| check(record, &mut next));
            }),
        };
        if let Err(error) = taken {
            break error;
        }
    };
    assert_eq!(next, COUNT, "{closed}");
    assert!(
        matches!(closed, Error::ChannelClosed { peer: 0, .. }),
        "{closed}"
    );
    let _producer = sending.join().unwrap();
}

#[test]
fn a_producer_waiting_for_room_gets_the_slots_a_receiver_kept_once_it_reads_on() {
    // 64-byte records in a ring of 64: the receiver keeps up to 16 read slots while the next
    // record is there. What that costs, and that it costs no wake-up: a full ring stays full
    // after one receive, and a send parked on it goes once the receiver has read on.
    let (_world, mut sessions) = World::start("channel-kept", 2);
    let mut consumer = sessions.pop().unwrap();
    let mut producer = sessions.pop().unwrap();
    let (to_producer, go) = std::sync::mpsc::channel::<()>();
    let (to_consumer, filled) = std::sync::mpsc::channel::<bool>();
    let sending = std::thread::spawn(move || {
        let mut tx = producer.channel_to::<Wide>(1, 4, 64).unwrap();
        go.recv().unwrap();
        let mut id = 0;
        while tx.try_send(&Wide { id, words: [id; 7] }).unwrap() {
            id += 1;
        }
        assert_eq!(id, 64, "a ring of 64 slots takes 64 records");
        to_consumer.send(true).unwrap();
        go.recv().unwrap();
        // One record taken, its slot kept: still full.
        let after_one = tx.try_send(&Wide { id, words: [id; 7] }).unwrap();
        to_consumer.send(after_one).unwrap();
        // Parked until the receiver gives its batch back.
        tx.send(&Wide { id, words: [id; 7] }).unwrap();
        producer
    });
    let mut rx = consumer.channel_from::<Wide>(0, 4).unwrap();
    to_producer.send(()).unwrap();
    assert!(filled.recv().unwrap());
    assert_eq!(rx.recv().unwrap().id, 0);
    to_producer.send(()).unwrap();
    assert!(
        !filled.recv().unwrap(),
        "a kept slot is not free room until the batch is given back"
    );
    for id in 1..=64 {
        let record = rx.recv().unwrap();
        assert_eq!(record, Wide { id, words: [id; 7] });
    }
    let _producer = sending.join().unwrap();
    assert!(matches!(
        rx.try_recv(),
        Err(Error::ChannelClosed { peer: 0, .. })
    ));
}

#[test]
fn closing_either_end_is_channel_closed_after_what_was_sent() {
    let (_world, mut sessions) = World::start("channel-close", 2);
    let mut consumer = sessions.pop().unwrap();
    let mut producer = sessions.pop().unwrap();
    let sending = std::thread::spawn(move || {
        let mut tx = producer.channel_to::<u64>(1, 5, 16).unwrap();
        tx.send_batch(&[1, 2, 3]).unwrap();
        drop(tx);
        // And one the consumer drops.
        let mut second = producer.channel_to::<u64>(1, 6, 16).unwrap();
        let deadline = Instant::now() + common::SESSION_TIMEOUT;
        loop {
            match second.try_send(&1) {
                Ok(_) => assert!(Instant::now() < deadline, "the consumer never closed"),
                Err(error) => return (producer, error),
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    let mut rx = consumer.channel_from::<u64>(0, 5).unwrap();
    let mut got = [0u64; 8];
    let mut all = Vec::new();
    loop {
        match rx.recv_batch(&mut got) {
            Ok(n) => all.extend_from_slice(&got[..n]),
            Err(Error::ChannelClosed {
                peer: 0, number: 0, ..
            }) => break,
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(all, [1, 2, 3]);
    drop(consumer.channel_from::<u64>(0, 6).unwrap());
    let (_producer, error) = sending.join().unwrap();
    assert!(
        matches!(
            error,
            Error::ChannelClosed {
                peer: 1,
                number: 1,
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(error.kind(), shmbroker::ErrorKind::ChannelClosed);
}

#[test]
fn a_killed_producers_records_arrive_then_its_death_is_peer_lost() {
    const RECORDS: &str = "5000";
    let broker = Broker::start("channel-death", 2);
    let socket = broker.socket();
    let connecting = std::thread::spawn(move || {
        let mut session =
            shmbroker::Session::connect(&socket, Some(0), common::SESSION_TIMEOUT).unwrap();
        session.set_timeout(common::SESSION_TIMEOUT);
        session
    });
    let mut producer = farm_worker_with(
        &broker,
        1,
        &["--channel-records", RECORDS],
        std::process::Stdio::piped(),
    );
    let mut consumer = connecting.join().unwrap();
    let mut rx = consumer.channel_from::<u64>(1, 7).unwrap();
    let line = read_line_within(producer.take_stdout().unwrap(), common::CHILD_DEADLINE);
    assert_eq!(line.trim(), "streamed");
    producer.kill();
    let killed = Instant::now();
    for n in 0..5000u64 {
        assert_eq!(rx.recv().unwrap(), n);
    }
    let error = rx.recv().unwrap_err();
    assert!(matches!(error, Error::PeerLost { rank: 1, .. }), "{error}");
    assert!(
        killed.elapsed() < common::SESSION_TIMEOUT / 2,
        "the death was seen at the deadline, not as it happened"
    );
}

#[test]
fn a_channel_to_a_rank_out_of_range_or_with_a_bad_shape_is_misuse() {
    let (_world, mut sessions) = World::start("channel-misuse", 2);
    let mut session = sessions.remove(0);
    for error in [
        session.channel_to::<u64>(0, 1, 16).unwrap_err(),
        session.channel_to::<u64>(5, 1, 16).unwrap_err(),
        session.channel_to::<u64>(1, 1, 3).unwrap_err(),
        session.raw_channel_to(1, 1, 5000, 16).unwrap_err(),
        // 4096-byte records, 2^20 of them: past the most ring a channel may have.
        session.raw_channel_to(1, 1, 4096, 1 << 20).unwrap_err(),
    ] {
        assert_eq!(error.kind(), shmbroker::ErrorKind::Misuse, "{error}");
    }
}

#[test]
fn a_payload_travels_by_a_reference_in_a_record_and_a_forged_one_is_refused() {
    use shmbroker::bindings::PayloadRef;
    let (_world, mut sessions) = World::start("channel-loan", 2);
    let mut consumer = sessions.pop().unwrap();
    let mut producer = sessions.pop().unwrap();
    let sending = std::thread::spawn(move || {
        let mut refs = producer.channel_to::<PayloadRef>(1, 4, 16).unwrap();
        for round in 0..50u8 {
            let mut loan = producer.loan(10_000).unwrap();
            loan.fill(round);
            let lent = producer.lend_ref(1, loan).unwrap();
            refs.send(&lent).unwrap();
        }
        producer.barrier().unwrap();
        (producer, refs)
    });
    let mut refs = consumer.channel_from::<PayloadRef>(0, 4).unwrap();
    for round in 0..50u8 {
        let lent = refs.recv().unwrap();
        let view = consumer.view_loan_ref(0, lent).unwrap();
        assert_eq!(view.len(), 10_000);
        assert!(view.iter().all(|&b| b == round), "round {round}");
    }
    let forged = PayloadRef {
        offset: 1 << 40,
        len: 16,
        _pad0: 0,
    };
    let error = consumer.view_loan_ref(0, forged).unwrap_err();
    assert_eq!(error.rank(), Some(0), "{error}");
    assert_eq!(error.kind(), shmbroker::ErrorKind::Protocol, "{error}");
    consumer.barrier().unwrap();
    let _ = sending.join().unwrap();
}

#[test]
fn a_channel_to_or_from_a_rank_that_left_fails_at_once_naming_it() {
    // Rank 1 logs on, meets rank 0 at a barrier, and drops its session (its process goes on).
    // The broker then has no worker to pass a ring to (it refuses the request), and its word
    // that rank 1 is gone comes after anything it passed on from it: both calls fail well
    // before their deadline with `PeerLeft` naming rank 1. (`channel_from` waited for its
    // deadline, and failed as a logon timeout, before.)
    let (_world, mut sessions) = World::start("channel-left", 2);
    let mut leaver = sessions.pop().unwrap();
    let mut stayer = sessions.pop().unwrap();
    let leaving = std::thread::spawn(move || {
        leaver.barrier().unwrap();
        drop(leaver);
    });
    stayer.barrier().unwrap();
    leaving.join().unwrap();
    // Once this rank has the broker's word that rank 1 left, the broker has it too. (Asked
    // sooner, the broker may still pass rank 1 a ring, and the channel is made.)
    let seen = Instant::now();
    loop {
        match stayer.try_recv(1) {
            Err(Error::PeerLeft { rank: 1, .. }) => break,
            Ok(None) if seen.elapsed() < common::SESSION_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(1));
            }
            other => panic!("rank 1's leaving not seen: {other:?}"),
        }
    }
    for attempt in ["channel_to", "channel_from"] {
        let started = Instant::now();
        let error = if attempt == "channel_to" {
            stayer.channel_to::<u64>(1, 3, 16).map(drop).unwrap_err()
        } else {
            stayer.channel_from::<u64>(1, 3).map(drop).unwrap_err()
        };
        assert!(
            matches!(error, Error::PeerLeft { rank: 1, .. }),
            "{attempt}: {error}"
        );
        assert!(
            started.elapsed() < common::SESSION_TIMEOUT / 2,
            "{attempt} waited for its deadline: {error}"
        );
    }
}

#[test]
fn a_channel_its_producer_made_before_it_left_is_still_taken_whole() {
    // The broker's word that rank 1 is gone comes after the channel it offered: taking the
    // channel after rank 1 left gets it, and every record, then `ChannelClosed`.
    let (_world, mut sessions) = World::start("channel-made-then-left", 2);
    let mut producer = sessions.pop().unwrap();
    let mut consumer = sessions.pop().unwrap();
    std::thread::spawn(move || {
        let mut tx = producer.channel_to::<u64>(0, 4, 128).unwrap();
        tx.send_batch(&(0..100).collect::<Vec<u64>>()).unwrap();
        drop(tx);
        drop(producer);
    })
    .join()
    .unwrap();
    // Until rank 1 is seen gone, and a while more for the broker's word of it: the offer could
    // be overtaken by either.
    let deadline = Instant::now() + common::SESSION_TIMEOUT;
    while consumer.raw().departure(1).is_none() {
        assert!(Instant::now() < deadline, "rank 1 never seen gone");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    let mut rx = consumer.channel_from::<u64>(1, 4).unwrap();
    let mut got = Vec::new();
    let mut buffer = [0u64; 16];
    let closed = loop {
        match rx.recv_batch(&mut buffer) {
            Ok(count) => got.extend_from_slice(&buffer[..count]),
            Err(error) => break error,
        }
    };
    assert_eq!(got, (0..100).collect::<Vec<u64>>());
    assert!(
        matches!(closed, Error::ChannelClosed { peer: 1, .. }),
        "{closed}"
    );
}

#[test]
fn a_producer_cannot_offer_a_consumer_more_channels_than_it_takes() {
    // Rank 1 never takes its channels: past 8 offered and not taken, the broker makes no more
    // for rank 0, which is told so; other ranks' channels to rank 1 are not held up by them.
    let (_world, mut sessions) = World::start("channel-flood", 3);
    let mut third = sessions.pop().unwrap();
    let mut idle = sessions.pop().unwrap();
    let mut flooder = sessions.pop().unwrap();
    let mut kept = Vec::new();
    for _ in 0..8 {
        kept.push(flooder.channel_to::<u64>(1, 1, 16).unwrap());
    }
    let error = flooder.channel_to::<u64>(1, 1, 16).unwrap_err();
    assert!(matches!(error, Error::Relay { peer: 1, .. }), "{error}");
    let other = std::thread::spawn(move || {
        let mut tx = third.channel_to::<u64>(1, 2, 16).unwrap();
        tx.send(&5).unwrap();
        (third, tx)
    });
    // Rank 1 takes rank 2's channel (its own numbering from rank 2), and one of rank 0's.
    let mut rx = idle.channel_from::<u64>(2, 2).unwrap();
    assert_eq!(rx.recv().unwrap(), 5);
    let _first = idle.channel_from::<u64>(0, 1).unwrap();
    let _ = other.join().unwrap();
}
