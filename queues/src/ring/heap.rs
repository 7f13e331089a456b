//! Under `--cfg loom`, a ring on the heap instead of in a memfd, so that loom models every
//! access to it.

use super::shared::{Backing, Block, ConsumerShared, Control, Geometry, Header, RingRef, Slot};
use crate::futex::WaitWord;
use crate::sync::{AtomicU32, AtomicU64, UnsafeCell};
use bytemuck::Pod;
use core::ptr::NonNull;

/// Two views of one heap ring: producer and consumer.
#[cfg(loom)]
pub(super) fn heap_ring<T: Pod>(capacity: u64) -> (RingRef<T>, RingRef<T>) {
    struct HeapRing<T> {
        header: Box<Header>,
        slots: Box<[Slot<T>]>,
    }
    // SAFETY: every field is a loom atomic, cell or lock, whose accesses loom checks; the struct
    // is only reached through `RingRef`, which follows the ring protocol.
    unsafe impl<T> Send for HeapRing<T> {}
    // SAFETY: as for `Send`.
    unsafe impl<T> Sync for HeapRing<T> {}

    #[allow(clippy::disallowed_types)]
    let header = Box::new(Header {
        layout: Block(core::cell::UnsafeCell::new(Geometry::<T>::layout(capacity))),
        consumer_wait: Block(WaitWord::new()),
        consumer: Block(ConsumerShared {
            head: AtomicU64::new(0),
            producer_wait: WaitWord::new(),
        }),
        control: Block(Control {
            producer_closed: AtomicU32::new(0),
            consumer_closed: AtomicU32::new(0),
            producer_joined: AtomicU32::new(1),
            consumer_joined: AtomicU32::new(1),
            cause: AtomicU64::new(0),
        }),
    });
    let slots = (0..capacity)
        .map(|_| Slot {
            seq: AtomicU64::new(0),
            message: UnsafeCell::new(T::zeroed()),
        })
        .collect::<Box<[_]>>();
    let ring = std::sync::Arc::new(HeapRing { header, slots });
    let make = || RingRef {
        header: NonNull::from(&*ring.header),
        slots: NonNull::from(&*ring.slots).cast::<Slot<T>>(),
        mask: capacity - 1,
        capacity,
        notifier: None,
        _backing: Backing::Heap(ring.clone()),
    };
    (make(), make())
}
