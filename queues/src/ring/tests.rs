//! Wake-up system calls: none while nobody waits, one for a parked consumer.

use super::*;
use crate::Waiting;
use crate::futex::WAKE_SYSCALLS;
use std::time::{Duration, Instant};

fn wake_syscalls() -> u64 {
    WAKE_SYSCALLS.with(|count| count.get())
}

#[test]
fn no_wake_syscall_while_nobody_waits() {
    let (mut tx, mut rx) = pair::<u64>(8).unwrap();
    let before = wake_syscalls();
    for i in 0..10_000 {
        tx.try_send(i).unwrap();
        tx.send_timeout(i, Duration::from_secs(1)).unwrap();
        assert_eq!(rx.try_recv(), Ok(i));
        assert_eq!(rx.recv_timeout(Duration::from_secs(1)), Ok(i));
    }
    assert_eq!(wake_syscalls(), before);
}

#[test]
fn one_wake_syscall_for_a_parked_consumer() {
    let (mut tx, mut rx) = pair::<u64>(8).unwrap();
    rx.set_waiting(Waiting::Spin(0));
    let consumer = std::thread::spawn(move || {
        let received = rx.recv_timeout(Duration::from_secs(30));
        (rx, received)
    });
    // Wait (with a deadline) until the consumer has registered; from then on it stays
    // registered until it is woken or its 30 s run out.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !tx.ring.header().consumer_wait.0.has_waiter() {
        assert!(Instant::now() < deadline, "consumer never parked");
        std::thread::yield_now();
    }
    let before = wake_syscalls();
    tx.try_send(42).unwrap();
    assert_eq!(wake_syscalls(), before + 1);
    let (mut rx, received) = consumer.join().unwrap();
    assert_eq!(received, Ok(42));
    // The consumer unregistered: the next publication makes no system call.
    tx.try_send(43).unwrap();
    assert_eq!(wake_syscalls(), before + 1);
    assert_eq!(rx.try_recv(), Ok(43));
}

#[test]
fn a_ring_made_from_a_size_is_the_ring_of_a_type_of_that_size() {
    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(C, align(16))]
    struct Wide([u8; 48]);
    fn same<T: Pod>() {
        for capacity in [2u64, 64, 1024] {
            assert_eq!(
                shared::layout_sized(size_of::<T>() as u32, align_of::<T>() as u32, capacity),
                shared::Geometry::<T>::layout(capacity),
                "{} x {capacity}",
                std::any::type_name::<T>()
            );
        }
        // And one end of each kind joins it.
        let fd = create_sized(size_of::<T>() as u32, align_of::<T>() as u32, 64).unwrap();
        let mut tx = Producer::<T>::join(std::os::fd::AsFd::as_fd(&fd)).unwrap();
        let mut rx = Consumer::<T>::join(std::os::fd::AsFd::as_fd(&fd)).unwrap();
        assert!(tx.try_send(T::zeroed()).is_ok());
        assert!(rx.try_recv().is_ok());
    }
    same::<u8>();
    same::<u64>();
    same::<[u8; 60]>();
    same::<[u64; 8]>();
    same::<Wide>();
    same::<[u8; 4096]>();
}
