//! The outbox's public API: what its owner can do, and every error a peer's file or reference
//! can trigger.

use shmbroker_allocator::{AckFault, Error, MIN_OUTBOX_BYTES, Outbox, PeerOutbox, check_ref};
use shmbroker_bindings::{OUTBOX_HEADER_BYTES, OUTBOX_STATUS_OFFSET, PayloadRef};
use shmbroker_queues::memfd::{OWNER_ONLY_SEALS, create_sealed, create_sized, seal_with};
use std::os::fd::AsFd;

fn reference(offset: u64, len: u32) -> PayloadRef {
    PayloadRef {
        offset,
        len,
        _pad0: 0,
    }
}

#[test]
fn bytes_written_by_the_owner_are_read_by_a_peer_and_the_block_comes_back() {
    let mut outbox = Outbox::create(3, 1 << 20).unwrap();
    let peer = PeerOutbox::join(outbox.fd(), 3).unwrap();
    let free = outbox.free_bytes();
    let block = outbox.try_alloc(100_000).unwrap().unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    outbox.write(&block, 0, &data).unwrap();
    let sent = outbox
        .send(block, 100_000, Outbox::receivers([0, 1]))
        .unwrap();
    let mut copy = vec![0; 100_000];
    peer.read_into(sent, &mut copy).unwrap();
    assert_eq!(copy, data);
    assert_eq!(&*peer.view(sent).unwrap(), &data[..]);
    assert!(!outbox.ack(0, sent).unwrap(), "rank 1 still owes one");
    assert_eq!(outbox.blocks_owed(), 1);
    assert!(matches!(
        outbox.ack(0, sent),
        Err(Error::Ack {
            rank: 0,
            fault: AckFault::NotOwed,
            ..
        })
    ));
    assert!(
        outbox.ack(1, sent).unwrap(),
        "the last acknowledgement frees"
    );
    assert_eq!(outbox.free_bytes(), free);
}

#[test]
fn a_loan_dropped_unsent_comes_back_and_a_foreign_one_is_refused() {
    let mut a = Outbox::create(0, 1 << 20).unwrap();
    let mut b = Outbox::create(1, 1 << 20).unwrap();
    let (free_a, free_b) = (a.free_bytes(), b.free_bytes());
    let mut loan = a.try_loan(5000).unwrap().unwrap();
    loan.fill(1);
    drop(loan);
    assert_eq!(a.free_bytes(), free_a);
    let foreign = b.try_loan(10).unwrap().unwrap();
    assert!(matches!(a.send_loan(foreign, 2), Err(Error::ForeignLoan)));
    // Refused and dropped: it went back to the outbox it came from.
    assert_eq!(b.free_bytes(), free_b);
    let too_big = a.capacity() as usize + 1;
    assert!(matches!(a.try_loan(too_big), Err(Error::TooLarge { .. })));
}

#[test]
fn a_held_buffer_lent_in_place_is_read_where_it_lies_and_stays_its_holders() {
    let mut outbox = Outbox::create(0, 1 << 20).unwrap();
    let peer = PeerOutbox::join(outbox.fd(), 0).unwrap();
    let free = outbox.free_bytes();
    let mut loan = outbox.try_loan(4096).unwrap().unwrap();
    for (i, byte) in loan.iter_mut().enumerate() {
        *byte = i as u8;
    }
    let sent = outbox
        .lend_in_place(&loan[1024..3072], Outbox::receivers([1, 2]))
        .expect("a range of a held loan");
    assert_eq!(sent.len, 2048);
    assert_eq!(&*peer.view(sent).unwrap(), &loan[1024..3072]);
    // Still lent: not again, and the loan cannot be sent.
    assert!(outbox.lend_in_place(&loan[2000..2001], 2).is_none());
    assert!(outbox.lent_in_place(&loan));
    assert!(!outbox.ack(1, sent).unwrap());
    assert!(
        !outbox.ack(2, sent).unwrap(),
        "the last acknowledgement frees nothing"
    );
    assert!(!outbox.lent_in_place(&loan));
    assert!(outbox.lend_in_place(&loan[2000..2001], 2).is_some());
    // Dropped while still lent: the block comes back only with the acknowledgement.
    drop(loan);
    let held = outbox.free_bytes();
    assert!(
        held < free,
        "the block is not free while rank 1 may read it"
    );
    assert!(!outbox.ack(1, reference(sent.offset + 976, 1)).unwrap());
    assert_eq!(outbox.free_bytes(), free);
    // Bytes that are no held block: outside the outbox, or a free range.
    assert!(outbox.lend_in_place(&[0u8; 64], 2).is_none());
    let loan = outbox.try_loan(64).unwrap().unwrap();
    let stale = loan.as_ptr() as usize;
    drop(loan);
    assert_eq!(outbox.free_bytes(), free, "the dropped loan is free again");
    // SAFETY: the address is in the outbox's mapping, which `outbox` keeps mapped, and nothing
    // writes those 64 bytes while the slice lives.
    let freed = unsafe { std::slice::from_raw_parts(stale as *const u8, 64) };
    assert!(outbox.lend_in_place(freed, 2).is_none(), "a freed block");
}

#[test]
fn disjoint_ranges_of_a_held_buffer_are_lent_in_place_each_to_its_own_receivers() {
    let mut outbox = Outbox::create(0, 1 << 20).unwrap();
    let loan = outbox.try_loan(4096).unwrap().unwrap();
    // Out of order, overlapping, empty or past the end: refused, and nothing is recorded.
    for parts in [
        vec![(1024..2048, 2), (0..1024, 4)],
        vec![(0..1024, 2), (1000..2048, 4)],
        vec![(0..1024, 2), (1024..1024, 4)],
        vec![(0..1024, 2), (3072..4097, 4)],
    ] {
        assert!(outbox.lend_in_place_parts(&loan, parts).is_none());
        assert!(!outbox.lent_in_place(&loan));
    }
    let sent = outbox
        .lend_in_place_parts(
            &loan,
            [
                (0..1024, Outbox::receivers([1])),
                (2048..4096, Outbox::receivers([2])),
            ],
        )
        .expect("two disjoint ranges of a held loan");
    assert_eq!(sent.len(), 2);
    assert_eq!((sent[0].len, sent[1].offset - sent[0].offset), (1024, 2048));
    assert_eq!(outbox.owed_for(sent[0]), 1 << 1);
    assert_eq!(outbox.owed_for(sent[1]), 1 << 2);
    // The range between them was not lent: it can be, and the others cannot again.
    let middle = outbox
        .lend_in_place(&loan[1024..2048], Outbox::receivers([1, 2]))
        .expect("the range left out");
    assert!(outbox.lend_in_place_parts(&loan, [(0..64, 2)]).is_none());
    // Each is owed by its own receivers only.
    assert!(
        outbox.ack(2, sent[0]).is_err(),
        "rank 2 was not lent the first"
    );
    assert!(!outbox.ack(1, sent[0]).unwrap());
    assert_eq!(outbox.owed_for(sent[0]), 0);
    assert!(outbox.lent_in_place(&loan));
    assert!(!outbox.ack(2, sent[1]).unwrap());
    assert!(!outbox.ack(1, middle).unwrap());
    assert_eq!(outbox.owed_for(middle), 1 << 2);
    assert!(!outbox.ack(2, middle).unwrap());
    assert!(!outbox.lent_in_place(&loan));
}

#[test]
fn a_write_past_its_block_is_refused() {
    let mut outbox = Outbox::create(0, MIN_OUTBOX_BYTES).unwrap();
    let block = outbox.try_alloc(64).unwrap().unwrap();
    assert!(matches!(
        outbox.write(&block, 60, &[1; 5]),
        Err(Error::TooLarge {
            requested: 65,
            capacity: 64
        })
    ));
    outbox.release(block);
}

#[test]
fn references_outside_the_blocks_or_with_padding_are_refused() {
    let size = 1 << 20;
    let cases = [
        reference(0, 1),                       // the header
        reference(OUTBOX_HEADER_BYTES - 1, 2), // reaches into the header
        reference(OUTBOX_STATUS_OFFSET, 8),    // the owner's status words
        reference(size, 1),                    // past the end
        reference(size - 10, 11),              // runs past the end
        reference(u64::MAX - 5, 10),           // overflows
        PayloadRef {
            _pad0: 1,
            ..reference(OUTBOX_HEADER_BYTES, 1)
        }, // padding
    ];
    for case in cases {
        match check_ref(4, case, size) {
            Err(Error::OutOfBounds {
                owner: 4,
                offset,
                len,
                ..
            }) => {
                assert_eq!((offset, len), (case.offset, case.len));
            }
            other => panic!("{case:?}: {other:?}"),
        }
    }
    assert_eq!(
        check_ref(4, reference(OUTBOX_HEADER_BYTES, 10), size).unwrap(),
        (OUTBOX_HEADER_BYTES as usize, 10)
    );
    assert_eq!(
        check_ref(4, reference(size - 1, 1), size).unwrap(),
        ((size - 1) as usize, 1)
    );
    let outbox = Outbox::create(4, size).unwrap();
    let peer = PeerOutbox::join(outbox.fd(), 4).unwrap();
    let mut wrong_length = [0u8; 9];
    assert!(matches!(
        peer.read_into(reference(OUTBOX_HEADER_BYTES, 10), &mut wrong_length),
        Err(Error::LengthMismatch {
            expected: 9,
            found: 10
        })
    ));
}

#[test]
fn a_file_that_is_not_an_owners_outbox_is_refused_before_mapping() {
    // Sealed against resizing only: others could still write it.
    let writable = create_sealed(c"test", 1 << 20).unwrap();
    assert!(matches!(
        PeerOutbox::join(writable.as_fd(), 0),
        Err(Error::Memfd(shmbroker_queues::Error::MissingSeals { .. }))
    ));
    // Sealed, but no outbox header.
    let blank = create_sized(c"test", 1 << 20).unwrap();
    seal_with(blank.as_fd(), OWNER_ONLY_SEALS).unwrap();
    assert!(matches!(
        PeerOutbox::join(blank.as_fd(), 0),
        Err(Error::BadHeader { field: "magic", .. })
    ));
    // Too small to be an outbox.
    let tiny = create_sized(c"test", 64).unwrap();
    seal_with(tiny.as_fd(), OWNER_ONLY_SEALS).unwrap();
    assert!(matches!(
        PeerOutbox::join(tiny.as_fd(), 0),
        Err(Error::BadSize { found: 64, .. })
    ));
    // Another rank's outbox passed off as rank 1's.
    let other = Outbox::create(2, 1 << 20).unwrap();
    assert!(matches!(
        PeerOutbox::join(other.fd(), 1),
        Err(Error::BadHeader {
            field: "owner_rank",
            expected: 1,
            found: 2,
            ..
        })
    ));
}

#[test]
fn a_hugetlb_file_is_refused_as_an_outbox() {
    use nix::sys::memfd::{MFdFlags, memfd_create};
    let flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING | MFdFlags::MFD_HUGETLB;
    let Ok(fd) = memfd_create(c"test-huge", flags) else {
        eprintln!("skipped: this kernel makes no MFD_HUGETLB memfds");
        return;
    };
    // Its size may not be settable without huge pages; the filesystem check comes first anyway.
    let _ = nix::unistd::ftruncate(&fd, 2 << 20);
    let _ = seal_with(fd.as_fd(), OWNER_ONLY_SEALS);
    match PeerOutbox::join(fd.as_fd(), 0) {
        Err(Error::Memfd(
            shmbroker_queues::Error::NotShmem { .. } | shmbroker_queues::Error::MissingSeals { .. },
        )) => {}
        other => panic!("a hugetlb memfd was accepted: {other:?}"),
    }
}
