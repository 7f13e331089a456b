//! Black-box tests of the ring's public API: every join error, the seals, what a corrupting peer
//! can and cannot do, close, timeouts, batches, and streaming between threads.
//!
//! Corruption is injected the way a hostile process would: by writing into the shared file.

#![cfg(not(loom))]

use bytemuck::{Pod, Zeroable};
use nix::errno::Errno;
use shmbroker_bindings::{RING_LAYOUT_VERSION, RING_MAGIC, RingLayout};
use shmbroker_queues::Waiting;
use shmbroker_queues::memfd::{REQUIRED_SEALS, create_sealed};
use shmbroker_queues::{
    Consumer, Corruption, Error, HEADER_SIZE, Producer, RecvTimeoutError, Role, SendTimeoutError,
    TryRecvError, TrySendError, create, pair,
};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::thread;
use std::time::{Duration, Instant};

// Byte offsets in the ring file, as documented in the ring module.
const OFFSET_VERSION: u64 = 8;
const OFFSET_CAPACITY: u64 = 24;
const OFFSET_HEAD: u64 = 256;
const OFFSET_SLOTS: u64 = HEADER_SIZE as u64;

const SHORT: Duration = Duration::from_millis(20);
const LONG: Duration = Duration::from_secs(30);

fn poke(fd: &OwnedFd, offset: u64, bytes: &[u8]) {
    let file = File::from(fd.try_clone().unwrap());
    file.write_all_at(bytes, offset).unwrap();
}

fn join_error<T: Pod>(fd: &OwnedFd) -> Error {
    Consumer::<T>::join(fd.as_fd()).expect_err("join should fail")
}

#[test]
fn join_rejects_a_different_message_size() {
    let fd = create::<u64>(4).unwrap();
    match join_error::<u32>(&fd) {
        Error::ElementSize { expected, found } => assert_eq!((expected, found), (4, 8)),
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn join_rejects_a_different_message_alignment() {
    let fd = create::<[u8; 8]>(4).unwrap();
    match join_error::<u64>(&fd) {
        Error::ElementAlign { expected, found } => assert_eq!((expected, found), (8, 1)),
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn join_rejects_a_wrong_magic_number() {
    let fd = create::<u64>(4).unwrap();
    poke(&fd, 0, b"NOTARING");
    match join_error::<u64>(&fd) {
        Error::BadMagic { expected, found } => {
            assert_eq!(expected, RING_MAGIC);
            assert_eq!(found, u64::from_le_bytes(*b"NOTARING"));
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn join_rejects_another_layout_version() {
    let fd = create::<u64>(4).unwrap();
    poke(
        &fd,
        OFFSET_VERSION,
        &(RING_LAYOUT_VERSION + 1).to_le_bytes(),
    );
    let error = join_error::<u64>(&fd);
    assert!(
        matches!(error, Error::VersionMismatch { expected, found } if expected == RING_LAYOUT_VERSION && found == RING_LAYOUT_VERSION + 1),
        "{error}"
    );
    assert_eq!(
        error.to_string(),
        format!(
            "ring layout version mismatch: expected {RING_LAYOUT_VERSION}, found {}",
            RING_LAYOUT_VERSION + 1
        )
    );
}

#[test]
fn join_rejects_a_file_too_short_for_a_header() {
    let fd = create_sealed(c"short", 100).unwrap();
    match join_error::<u64>(&fd) {
        Error::FileTooSmall { minimum, found } => {
            assert_eq!((minimum, found), (HEADER_SIZE as u64, 100));
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn join_rejects_a_header_that_claims_more_slots_than_the_file_holds() {
    let fd = create::<u64>(4).unwrap();
    poke(&fd, OFFSET_CAPACITY, &1024u64.to_le_bytes());
    match join_error::<u64>(&fd) {
        Error::FileSize { expected, found } => {
            assert_eq!(expected, OFFSET_SLOTS + 1024 * 16);
            assert_eq!(found, OFFSET_SLOTS + 4 * 16);
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn join_rejects_a_capacity_that_is_not_a_power_of_two() {
    let fd = create::<u64>(4).unwrap();
    poke(&fd, OFFSET_CAPACITY, &3u64.to_le_bytes());
    assert!(matches!(
        join_error::<u64>(&fd),
        Error::InvalidCapacity { found: 3, .. }
    ));
}

#[test]
fn join_rejects_an_unsealed_memfd() {
    let fd = nix::sys::memfd::memfd_create(
        c"unsealed",
        nix::sys::memfd::MFdFlags::MFD_CLOEXEC | nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING,
    )
    .unwrap();
    // A perfectly good header: only the seals are missing.
    let layout = RingLayout::new(8, 8, 16, 4, OFFSET_SLOTS);
    nix::unistd::ftruncate(&fd, layout.file_size as i64).unwrap();
    poke(&fd, 0, bytemuck::bytes_of(&layout));
    match join_error::<u64>(&fd) {
        Error::MissingSeals { expected, found } => {
            assert_eq!(expected, REQUIRED_SEALS.bits());
            assert_eq!(found, 0);
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn join_rejects_something_that_is_not_a_memfd() {
    let file = File::open("/dev/null").unwrap();
    let error = Consumer::<u64>::join(file.as_fd()).unwrap_err();
    assert!(
        matches!(
            error,
            Error::Sys {
                op: "fcntl(F_GET_SEALS)",
                source: Errno::EINVAL
            }
        ),
        "{error}"
    );
}

#[test]
fn create_rejects_bad_capacities() {
    for capacity in [0, 3, 1000] {
        let error = create::<u64>(capacity).unwrap_err();
        assert!(matches!(error, Error::InvalidCapacity { found, .. } if found == capacity as u64));
    }
}

#[test]
fn each_role_can_be_joined_once() {
    let fd = create::<u64>(4).unwrap();
    let _producer = Producer::<u64>::join(fd.as_fd()).unwrap();
    let _consumer = Consumer::<u64>::join(fd.as_fd()).unwrap();
    let error = Producer::<u64>::join(fd.as_fd()).unwrap_err();
    assert!(
        matches!(
            error,
            Error::AlreadyJoined {
                role: Role::Producer
            }
        ),
        "{error}"
    );
    let error = Consumer::<u64>::join(fd.as_fd()).unwrap_err();
    assert!(
        matches!(
            error,
            Error::AlreadyJoined {
                role: Role::Consumer
            }
        ),
        "{error}"
    );
}

#[test]
fn a_ring_file_cannot_be_resized_or_unsealed() {
    let fd = create::<u64>(4).unwrap();
    let size = 512 + 4 * 16;
    assert_eq!(nix::unistd::ftruncate(&fd, 0), Err(Errno::EPERM));
    assert_eq!(nix::unistd::ftruncate(&fd, size * 2), Err(Errno::EPERM));
    let file = File::from(fd.try_clone().unwrap());
    assert!(
        file.write_all_at(&[1], size as u64 + 10).is_err(),
        "grew by writing past the end"
    );
    let unseal = nix::fcntl::fcntl(
        &fd,
        nix::fcntl::FcntlArg::F_ADD_SEALS(nix::fcntl::SealFlag::F_SEAL_WRITE),
    );
    assert_eq!(unseal, Err(Errno::EPERM));
    assert_eq!(file.metadata().unwrap().len(), size as u64);
}

#[test]
fn an_impossible_consumer_cursor_is_reported_not_used() {
    let fd = create::<u64>(4).unwrap();
    let mut tx = Producer::<u64>::join(fd.as_fd()).unwrap();
    for value in 0..4 {
        tx.try_send(value).unwrap();
    }
    // The "consumer" claims to have read 1000 messages of the 4 sent.
    poke(&fd, OFFSET_HEAD, &1000u64.to_le_bytes());
    match tx.try_send(99) {
        Err(TrySendError::Corrupted(
            99,
            Corruption::ConsumerCursor {
                head,
                tail,
                capacity,
            },
        )) => {
            assert_eq!((head, tail, capacity), (1000, 4, 4));
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn an_impossible_slot_sequence_is_reported() {
    let fd = create::<u64>(4).unwrap();
    let mut rx = Consumer::<u64>::join(fd.as_fd()).unwrap();
    poke(&fd, OFFSET_SLOTS, &0xdead_beefu64.to_le_bytes());
    assert_eq!(
        rx.try_recv(),
        Err(TryRecvError::Corrupted(Corruption::SlotSequence {
            position: 0,
            ready: 1,
            pending: 1u64.wrapping_sub(4),
            found: 0xdead_beef,
        }))
    );
    let error = rx.recv_timeout(SHORT).unwrap_err();
    assert!(matches!(error, RecvTimeoutError::Corrupted(_)), "{error}");
}

#[test]
fn garbage_message_bytes_read_back_as_garbage_values() {
    let (fd, mut tx, mut rx) = joined::<[u32; 3]>(4);
    tx.try_send([1, 2, 3]).unwrap();
    poke(&fd, OFFSET_SLOTS + 8, &[0xff; 12]);
    assert_eq!(rx.try_recv(), Ok([u32::MAX; 3]));
}

#[test]
fn a_batch_interrupted_by_corruption_hands_over_what_was_intact() {
    let (fd, mut tx, mut rx) = joined::<u64>(4);
    tx.try_send_batch(&[1, 2, 3]).unwrap();
    poke(&fd, OFFSET_SLOTS + 2 * 16, &77u64.to_le_bytes());
    let mut buffer = [0; 4];
    assert_eq!(rx.try_recv_batch(&mut buffer), Ok(2));
    assert_eq!(&buffer[..2], &[1, 2]);
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Corrupted(_))));
}

fn joined<T: Pod>(capacity: usize) -> (OwnedFd, Producer<T>, Consumer<T>) {
    let fd = create::<T>(capacity).unwrap();
    let tx = Producer::join(fd.as_fd()).unwrap();
    let rx = Consumer::join(fd.as_fd()).unwrap();
    (fd, tx, rx)
}

#[test]
fn full_and_empty_are_reported_and_wrap_around_keeps_order() {
    let (mut tx, mut rx) = pair::<u64>(4).unwrap();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    for lap in 0..5u64 {
        for i in 0..4 {
            tx.try_send(lap * 10 + i).unwrap();
        }
        assert_eq!(tx.try_send(99), Err(TrySendError::Full(99)));
        for i in 0..4 {
            assert_eq!(rx.try_recv(), Ok(lap * 10 + i));
        }
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    }
}

#[test]
fn batches_send_what_fits_and_receive_what_is_there() {
    let (mut tx, mut rx) = pair::<u64>(4).unwrap();
    assert_eq!(tx.try_send_batch(&[]), Ok(0));
    assert_eq!(tx.try_send_batch(&[1, 2, 3, 4, 5, 6]), Ok(4));
    assert_eq!(tx.try_send_batch(&[5, 6]), Err(TrySendError::Full(())));
    let mut buffer = [0; 3];
    assert_eq!(rx.try_recv_batch(&mut buffer), Ok(3));
    assert_eq!(buffer, [1, 2, 3]);
    assert_eq!(tx.try_send_batch(&[5, 6]), Ok(2));
    let mut buffer = [0; 8];
    assert_eq!(rx.try_recv_batch(&mut buffer), Ok(3));
    assert_eq!(&buffer[..3], &[4, 5, 6]);
    assert_eq!(rx.try_recv_batch(&mut []), Ok(0));
    assert_eq!(rx.try_recv_batch(&mut buffer), Err(TryRecvError::Empty));
}

#[test]
fn a_whole_batch_goes_all_at_once_or_not_at_all() {
    let (mut tx, mut rx) = pair::<u64>(4).unwrap();
    assert_eq!(tx.try_send_whole(&[]), Ok(()));
    tx.try_send(1).unwrap();
    // Three slots wanted, three free: all of them.
    assert_eq!(tx.try_send_whole(&[2, 3, 4]), Ok(()));
    assert_eq!(tx.try_send_whole(&[5]), Err(TrySendError::Full(())));
    let mut buffer = [0; 2];
    assert_eq!(rx.try_recv_batch(&mut buffer), Ok(2));
    // Two free, three wanted: nothing is written (a batch would have sent two).
    assert_eq!(tx.try_send_whole(&[5, 6, 7]), Err(TrySendError::Full(())));
    let mut buffer = [0; 8];
    assert_eq!(rx.try_recv_batch(&mut buffer), Ok(2));
    assert_eq!(&buffer[..2], &[3, 4]);
    assert_eq!(rx.try_recv_batch(&mut buffer), Err(TryRecvError::Empty));
    // More than the ring holds never fits.
    assert_eq!(tx.try_send_whole(&[0; 5]), Err(TrySendError::Full(())));
    assert_eq!(tx.try_send_whole(&[5, 6, 7, 8]), Ok(()));
    assert_eq!(rx.try_recv_batch(&mut buffer), Ok(4));
    assert_eq!(&buffer[..4], &[5, 6, 7, 8]);
}

#[test]
fn dropping_the_producer_lets_the_consumer_drain_then_disconnects() {
    let (mut tx, mut rx) = pair::<u64>(8).unwrap();
    tx.try_send_batch(&[1, 2, 3]).unwrap();
    drop(tx);
    assert_eq!(rx.recv_timeout(SHORT), Ok(1));
    let mut buffer = [0; 8];
    assert_eq!(rx.try_recv_batch(&mut buffer), Ok(2));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    assert_eq!(rx.recv_timeout(SHORT), Err(RecvTimeoutError::Disconnected));
}

#[test]
fn dropping_the_consumer_disconnects_the_producer_and_returns_messages() {
    let (mut tx, rx) = pair::<u64>(8).unwrap();
    assert!(!tx.is_disconnected());
    drop(rx);
    assert!(tx.is_disconnected());
    assert_eq!(tx.try_send(5), Err(TrySendError::Disconnected(5)));
    assert_eq!(
        tx.send_timeout(6, SHORT),
        Err(SendTimeoutError::Disconnected(6))
    );
    assert_eq!(tx.try_send_batch(&[1]), Err(TrySendError::Disconnected(())));
}

#[test]
fn blocking_calls_return_at_their_deadline() {
    let (mut tx, mut rx) = pair::<u64>(1).unwrap();
    for spin_limit in [0, 100, u32::MAX] {
        rx.set_waiting(Waiting::Spin(spin_limit));
        tx.set_waiting(Waiting::Spin(spin_limit));
        let start = Instant::now();
        assert_eq!(rx.recv_timeout(SHORT), Err(RecvTimeoutError::Timeout));
        assert!(start.elapsed() >= SHORT);
        tx.try_send(1).unwrap();
        assert_eq!(tx.send_timeout(2, SHORT), Err(SendTimeoutError::Timeout(2)));
        assert_eq!(
            tx.send_batch_timeout(&[2, 3], SHORT),
            Err(SendTimeoutError::Timeout(0))
        );
        assert_eq!(rx.try_recv(), Ok(1));
    }
}

/// A message type with padding-free fields and a large alignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C, align(64))]
struct Aligned {
    words: [u64; 8],
}

#[test]
fn over_aligned_messages_land_aligned() {
    let (mut tx, mut rx) = pair::<Aligned>(4).unwrap();
    let message = Aligned { words: [7; 8] };
    tx.try_send(message).unwrap();
    assert_eq!(rx.try_recv(), Ok(message));
}

/// Streams `count` numbered messages from a thread, in batches or one by one, with the given spin
/// limit on both sides, and checks that every one arrives once and in order.
fn stream_between_threads(count: u64, batch: usize, spin_limit: u32) {
    let (mut tx, mut rx) = pair::<u64>(64).unwrap();
    tx.set_waiting(Waiting::Spin(spin_limit));
    rx.set_waiting(Waiting::Spin(spin_limit));
    let producer = thread::spawn(move || {
        let mut next = 0;
        let mut chunk = vec![0; batch];
        while next < count {
            let n = batch.min((count - next) as usize);
            for (i, slot) in chunk[..n].iter_mut().enumerate() {
                *slot = next + i as u64;
            }
            tx.send_batch_timeout(&chunk[..n], LONG).unwrap();
            next += n as u64;
        }
    });
    let mut expected = 0;
    let mut buffer = vec![0; batch];
    loop {
        match rx.recv_batch_timeout(&mut buffer, LONG) {
            Ok(n) => {
                for &value in &buffer[..n] {
                    assert_eq!(value, expected);
                    expected += 1;
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
            Err(other) => panic!("after {expected} messages: {other}"),
        }
    }
    assert_eq!(expected, count);
    producer.join().unwrap();
}

#[test]
fn threads_stream_in_order_spinning() {
    stream_between_threads(200_000, 1, u32::MAX);
}

#[test]
fn threads_stream_in_order_parked() {
    stream_between_threads(200_000, 1, 0);
}

#[test]
fn threads_stream_in_order_in_batches_parked() {
    stream_between_threads(200_000, 16, 0);
}

/// The file layout is what the `ring` module documents (and what the fuzz seed corpus assumes):
/// a 48-byte `RingLayout` at 0, zeroed control blocks to 512, then `{seq, message}` slots, all
/// zero (a zero sequence word is "pending" in the first lap).
#[test]
fn a_new_ring_file_has_the_documented_layout() {
    let fd = create::<[u64; 2]>(4).unwrap();
    let file = File::from(fd.try_clone().unwrap());
    let mut bytes = vec![0u8; file.metadata().unwrap().len() as usize];
    file.read_exact_at(&mut bytes, 0).unwrap();

    let mut expected = Vec::new();
    expected.extend_from_slice(b"SHMBRING");
    for field in [RING_LAYOUT_VERSION, 16, 8, 24] {
        expected.extend_from_slice(&field.to_le_bytes());
    }
    for field in [4u64, 512, 512 + 4 * 24] {
        expected.extend_from_slice(&field.to_le_bytes());
    }
    expected.resize(512, 0);
    expected.resize(512 + 4 * 24, 0);
    assert_eq!(bytes, expected);
}

/// A zero sequence word is "pending" only in the first lap; later, zero is corruption.
#[test]
fn a_zero_sequence_word_after_the_first_lap_is_corruption() {
    let (fd, mut tx, mut rx) = joined::<u64>(2);
    for value in 0..2 {
        tx.try_send(value).unwrap();
        assert_eq!(rx.try_recv(), Ok(value));
    }
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    poke(&fd, OFFSET_SLOTS, &0u64.to_le_bytes());
    assert!(matches!(
        rx.try_recv(),
        Err(TryRecvError::Corrupted(Corruption::SlotSequence {
            position: 2,
            found: 0,
            ..
        }))
    ));
}

/// `close` acts for a peer that cannot: both ends see exactly what dropping them would show, and
/// a parked receiver is woken.
#[test]
fn closing_on_behalf_of_a_dead_peer_wakes_and_disconnects_both_ends() {
    let (fd, mut tx, mut rx) = joined::<u64>(4);
    tx.try_send_batch(&[1, 2]).unwrap();
    assert_eq!((tx.close_cause(), rx.close_cause()), (None, None));
    shmbroker_queues::close::<u64>(fd.as_fd(), 5).unwrap();
    assert_eq!((tx.close_cause(), rx.close_cause()), (Some(5), Some(5)));
    assert_eq!(tx.try_send(3), Err(TrySendError::Disconnected(3)));
    assert_eq!(rx.try_recv(), Ok(1));
    assert_eq!(rx.try_recv(), Ok(2));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));

    let (fd, tx, mut rx) = joined::<u64>(4);
    rx.set_waiting(Waiting::Spin(0));
    let waiter = thread::spawn(move || rx.recv_timeout(LONG));
    thread::sleep(Duration::from_millis(20)); // most likely parked by now; correct either way
    shmbroker_queues::close::<u64>(fd.as_fd(), 0).unwrap();
    assert_eq!(waiter.join().unwrap(), Err(RecvTimeoutError::Disconnected));
    drop(tx);

    // Only rings of the right type can be closed.
    assert!(matches!(
        shmbroker_queues::close::<u32>(fd.as_fd(), 0),
        Err(Error::ElementSize { .. })
    ));
}

#[test]
fn a_third_process_reads_how_full_a_ring_is_without_taking_an_end() {
    let fd = create::<u64>(8).unwrap();
    assert_eq!(shmbroker_queues::fill::<u64>(fd.as_fd()).unwrap(), 0);
    let mut tx = Producer::<u64>::join(fd.as_fd()).unwrap();
    let mut rx = Consumer::<u64>::join(fd.as_fd()).unwrap();
    for i in 0..5 {
        tx.try_send(i).unwrap();
    }
    assert_eq!(shmbroker_queues::fill::<u64>(fd.as_fd()).unwrap(), 5);
    assert_eq!(rx.try_recv(), Ok(0));
    assert_eq!(rx.try_recv(), Ok(1));
    assert_eq!(shmbroker_queues::fill::<u64>(fd.as_fd()).unwrap(), 3);
    for i in 5..10 {
        tx.try_send(i).unwrap();
    }
    assert_eq!(shmbroker_queues::fill::<u64>(fd.as_fd()).unwrap(), 8);
    // A head pushed anywhere by a hostile consumer reads as some count up to the capacity.
    poke(&fd, OFFSET_HEAD, &u64::MAX.to_le_bytes());
    assert!(shmbroker_queues::fill::<u64>(fd.as_fd()).unwrap() <= 8);
    // Not a ring of this message type: an error, as for joining.
    assert!(shmbroker_queues::fill::<u32>(fd.as_fd()).is_err());
}
