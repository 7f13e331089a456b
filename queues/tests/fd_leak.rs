//! Creating, joining, using and dropping rings leaves no fd and no mapping behind. Alone in its own
//! test binary, so that no concurrently running test changes the counts.

#![cfg(not(loom))]

use shmbroker_queues::{Consumer, Producer, TryRecvError, create, pair};
use std::os::fd::AsFd;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

#[test]
fn rings_leave_no_fd_or_mapping_behind() {
    // Warm up whatever the standard library opens lazily.
    drop(pair::<u64>(8).unwrap());
    let (fds, maps) = (open_fds(), mappings());
    for _ in 0..200 {
        let fd = create::<[u8; 24]>(64).unwrap();
        let mut tx = Producer::<[u8; 24]>::join(fd.as_fd()).unwrap();
        let mut rx = Consumer::<[u8; 24]>::join(fd.as_fd()).unwrap();
        // A failed join must not leak its mapping either.
        assert!(Producer::<[u8; 24]>::join(fd.as_fd()).is_err());
        assert!(Consumer::<u64>::join(fd.as_fd()).is_err());
        tx.try_send([1; 24]).unwrap();
        drop(tx);
        assert_eq!(rx.try_recv(), Ok([1; 24]));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
        let (_tx, _rx) = pair::<u64>(16).unwrap();
    }
    assert_eq!(open_fds(), fds, "fds leaked");
    assert_eq!(mappings(), maps, "mappings leaked");
}
