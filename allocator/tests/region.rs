//! The payload region's public API: every error a peer's reference or a caller can trigger.

use shmbroker_allocator::{Error, MAX_PAYLOAD, PayloadRegion, create};
use shmbroker_bindings::PayloadRef;
use std::os::fd::AsFd;

fn region(bytes: u64) -> (std::os::fd::OwnedFd, PayloadRegion) {
    let fd = create(4, bytes).unwrap();
    let region = PayloadRegion::join(fd.as_fd()).unwrap();
    (fd, region)
}

#[test]
fn payloads_travel_between_two_handles() {
    let (fd, mut a) = region(1 << 20);
    let b = PayloadRegion::join(fd.as_fd()).unwrap();
    for len in [1, 100, 256, 257, 4095, MAX_PAYLOAD] {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        let payload = a.alloc(&bytes).unwrap();
        assert_eq!(payload.len as usize, len);
        assert_eq!(b.read(payload).unwrap(), bytes);
        a.free(payload).unwrap();
    }
    assert_eq!(a.live_blocks(), 0);
}

#[test]
fn an_empty_payload_needs_no_block() {
    let (_fd, mut a) = region(1 << 20);
    let empty = a.alloc(&[]).unwrap();
    assert_eq!((empty.offset, empty.len), (0, 0));
    assert_eq!(a.read(empty).unwrap(), Vec::<u8>::new());
    a.free(empty).unwrap();
}

#[test]
fn a_payload_above_the_largest_block_is_refused() {
    let (_fd, mut a) = region(1 << 20);
    match a.alloc(&vec![0; MAX_PAYLOAD + 1]) {
        Err(Error::TooLarge { max, found }) => {
            assert_eq!((max, found), (MAX_PAYLOAD, MAX_PAYLOAD + 1))
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn an_exhausted_region_says_so_and_recovers_after_a_free() {
    let (_fd, mut a) = region(1 << 20);
    let mut blocks = Vec::new();
    let error = loop {
        match a.alloc(&[1; MAX_PAYLOAD]) {
            Ok(block) => blocks.push(block),
            Err(error) => break error,
        }
        assert!(blocks.len() < 1 << 20, "never exhausted");
    };
    assert!(
        matches!(
            error,
            Error::Exhausted {
                requested: MAX_PAYLOAD
            }
        ),
        "{error}"
    );
    assert!(!blocks.is_empty());
    a.free(blocks.pop().unwrap()).unwrap();
    blocks.push(a.alloc(&[2; MAX_PAYLOAD]).unwrap());
}

#[test]
fn references_outside_the_region_are_refused_before_any_read() {
    let (_fd, a) = region(1 << 20);
    let size = a.size();
    let bad = [
        PayloadRef {
            offset: size,
            len: 1,
            _pad0: 0,
        },
        PayloadRef {
            offset: size - 10,
            len: 11,
            _pad0: 0,
        },
        PayloadRef {
            offset: u64::MAX,
            len: 2,
            _pad0: 0,
        },
        PayloadRef {
            offset: 0,
            len: MAX_PAYLOAD as u32 + 1,
            _pad0: 0,
        },
        PayloadRef {
            offset: 0,
            len: 8,
            _pad0: 1,
        },
    ];
    for payload in bad {
        match a.read(payload) {
            Err(Error::OutOfBounds {
                offset,
                len,
                pad,
                region,
            }) => {
                assert_eq!(
                    (offset, len, pad, region),
                    (payload.offset, payload.len, payload._pad0, size)
                );
            }
            other => panic!("{payload:?}: unexpected {other:?}"),
        }
    }
}

#[test]
fn only_the_allocating_process_frees_and_only_once() {
    let (fd, mut a) = region(1 << 20);
    let mut b = PayloadRegion::join(fd.as_fd()).unwrap();
    let payload = a.alloc(b"mine").unwrap();
    // A peer's reference, or garbage, never reaches the allocator.
    assert!(matches!(
        b.free(payload),
        Err(Error::NotAllocatedHere { .. })
    ));
    let garbage = PayloadRef {
        offset: 12345,
        len: 4,
        _pad0: 0,
    };
    assert!(matches!(
        a.free(garbage),
        Err(Error::NotAllocatedHere { offset: 12345 })
    ));
    a.free(payload).unwrap();
    assert!(matches!(
        a.free(payload),
        Err(Error::NotAllocatedHere { .. })
    ));
}

#[test]
fn joining_an_unsealed_file_is_refused() {
    let fd = shmbroker_queues::memfd::create_unsealed(c"unsealed").unwrap();
    match PayloadRegion::join(fd.as_fd()) {
        Err(Error::Memfd(shmbroker_queues::Error::MissingSeals { .. })) => {}
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn joining_a_ring_instead_of_a_region_is_refused() {
    let ring = shmbroker_queues::create::<u64>(1024).unwrap();
    match PayloadRegion::join(ring.as_fd()) {
        Err(Error::Allocator(_)) => {}
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_region_too_small_for_its_workers_is_refused() {
    assert!(matches!(create(64, 4096), Err(Error::Allocator(_))));
}
