//! The memory both ends of a ring share, as the `ring` module docs lay it out (the header's
//! 128-byte blocks, then the slots), its geometry for a message type, and one endpoint's view
//! of it (`RingRef`).

use super::HEADER_SIZE;
#[cfg(doc)]
use super::{Closer, close};
use crate::error::Role;
use crate::futex::WaitWord;
use crate::readiness::Notifier;
use crate::sync::{AtomicU32, AtomicU64, Ordering, UnsafeCell};
use bytemuck::Pod;
use core::marker::PhantomData;
use core::ptr::NonNull;
use shmbroker_bindings::RingLayout;

/// Pads and aligns its contents to a 128-byte block.
#[repr(C, align(128))]
pub(super) struct Block<T>(pub(super) T);

// The layout is plain data written before any other process can see the file and only ever read
// by copying, never concurrently with a write by this protocol: loom has nothing to check there.
#[allow(clippy::disallowed_types)]
#[repr(C)]
pub(super) struct Header {
    /// Plain data, written before any other process can see the file; read only by copying.
    pub(super) layout: Block<core::cell::UnsafeCell<RingLayout>>,
    pub(super) consumer_wait: Block<WaitWord>,
    pub(super) consumer: Block<ConsumerShared>,
    pub(super) control: Block<Control>,
}

#[repr(C)]
pub(super) struct ConsumerShared {
    pub(super) head: AtomicU64,
    pub(super) producer_wait: WaitWord,
}

#[repr(C)]
pub(super) struct Control {
    pub(super) producer_closed: AtomicU32,
    pub(super) consumer_closed: AtomicU32,
    pub(super) producer_joined: AtomicU32,
    pub(super) consumer_joined: AtomicU32,
    /// Set by [`close`] before the close flags: `CAUSE_SET | cause`, or 0.
    pub(super) cause: AtomicU64,
}

/// Marks `Control::cause` as holding a cause (so that cause 0 is distinguishable from none).
pub(super) const CAUSE_SET: u64 = 1 << 32;

#[cfg(not(loom))]
const _: () = assert!(size_of::<Header>() == HEADER_SIZE);

#[repr(C)]
pub(super) struct Slot<T> {
    pub(super) seq: AtomicU64,
    pub(super) message: UnsafeCell<T>,
}

/// Geometry of a ring of `T`, computed at compile time.
pub(super) struct Geometry<T>(PhantomData<T>);

impl<T> Geometry<T> {
    const SLOT_SIZE: usize = size_of::<Slot<T>>();
    const SLOTS_OFFSET: usize = HEADER_SIZE.next_multiple_of(align_of::<Slot<T>>());
    /// Mappings are page-aligned, so any alignment up to a page holds in shared memory.
    const CHECK: () = {
        assert!(
            align_of::<Slot<T>>() <= 4096,
            "message alignment above 4096 is unsupported"
        );
        assert!(
            Self::SLOT_SIZE <= u32::MAX as usize,
            "message too large for a ring slot"
        );
    };

    pub(super) fn layout(capacity: u64) -> RingLayout {
        let () = Self::CHECK;
        RingLayout::new(
            size_of::<T>() as u32,
            align_of::<T>() as u32,
            Self::SLOT_SIZE as u32,
            capacity,
            Self::SLOTS_OFFSET as u64,
        )
    }
}

/// The layout [`Geometry::layout`] gives a type of `elem_size` bytes aligned to `elem_align`
/// (a power of two), worked out at run time: a slot is the sequence word, then the message at
/// the next multiple of its alignment, padded to the slot's alignment (the larger of 8 and the
/// message's); the slots start at the first multiple of that alignment past the header.
#[cfg(not(loom))]
pub(super) fn layout_sized(elem_size: u32, elem_align: u32, capacity: u64) -> RingLayout {
    let slot_align = u64::from(elem_align.max(8));
    let message_at = 8u64.next_multiple_of(u64::from(elem_align));
    let slot_size = (message_at + u64::from(elem_size)).next_multiple_of(slot_align);
    RingLayout::new(
        elem_size,
        elem_align,
        u32::try_from(slot_size).unwrap_or(u32::MAX),
        capacity,
        (HEADER_SIZE as u64).next_multiple_of(slot_align),
    )
}

/// What keeps a ring's memory alive: shared by the endpoint and any [`Closer`] made from it.
#[derive(Clone)]
pub(super) enum Backing {
    #[cfg(not(loom))]
    Mapped(#[allow(dead_code)] std::sync::Arc<crate::memfd::Mapping>),
    #[cfg(loom)]
    Heap(#[allow(dead_code)] std::sync::Arc<dyn Send + Sync>),
}

/// One endpoint's view of a ring: validated geometry plus pointers into the backing memory.
pub(super) struct RingRef<T> {
    pub(super) header: NonNull<Header>,
    pub(super) slots: NonNull<Slot<T>>,
    pub(super) mask: u64,
    pub(super) capacity: u64,
    /// The eventfd of this ring's consumer, when it has one: what a waker signals when the
    /// consumer sleeps on it (see the `readiness` module).
    pub(super) notifier: Option<Notifier>,
    pub(super) _backing: Backing,
}

impl<T: Pod> RingRef<T> {
    pub(super) fn header(&self) -> &Header {
        // SAFETY: `header` points to a live, aligned `Header` for as long as `_backing` lives,
        // which is as long as `self`. Everything in it except `layout` is atomics, and `layout`
        // sits in an `UnsafeCell` and is only read by copying.
        unsafe { self.header.as_ref() }
    }

    pub(super) fn slot(&self, position: u64) -> &Slot<T> {
        // `index < capacity` because `mask == capacity - 1` and capacity is a power of two.
        let index = (position & self.mask) as usize;
        // SAFETY: `index < capacity`, and the backing holds `capacity` slots from `slots`.
        let slot = unsafe { self.slots.add(index) };
        // SAFETY: the slot is live and aligned as above; its fields are an atomic and a cell.
        unsafe { slot.as_ref() }
    }
}

impl<T> RingRef<T> {
    /// Another view of the same memory, for a [`Closer`].
    pub(super) fn share(&self) -> Self {
        Self {
            header: self.header,
            slots: self.slots,
            mask: self.mask,
            capacity: self.capacity,
            notifier: self.notifier.clone(),
            _backing: self._backing.clone(),
        }
    }

    pub(super) fn control(&self) -> &Control {
        // SAFETY: as in `header` above (this impl has no `Pod` bound, so it cannot call it).
        let header = unsafe { self.header.as_ref() };
        &header.control.0
    }

    /// The cause a third party closed the ring with, if it did (Acquire: pairs with the Release
    /// store in [`Self::close_with_cause`], made before the close flags).
    pub(super) fn close_cause(&self) -> Option<u32> {
        let cause = self.control().cause.load(Ordering::Acquire);
        (cause & CAUSE_SET != 0).then_some(cause as u32)
    }

    /// Records `cause`, then closes both ends. The cause is stored before the close flags, so
    /// whoever sees the ring closed sees the cause too.
    pub(super) fn close_with_cause(&self, cause: u32) {
        self.control()
            .cause
            .store(CAUSE_SET | u64::from(cause), Ordering::Release);
        self.close_end(Role::Producer);
        self.close_end(Role::Consumer);
    }

    /// Wakes the `role` side if it parked, without publishing anything of the ring's own.
    pub(super) fn wake(&self, role: Role) {
        // SAFETY: as in `header` above (repeated here because this impl has no `Pod` bound).
        let header = unsafe { self.header.as_ref() };
        match role {
            Role::Consumer => header
                .consumer_wait
                .0
                .wake_or_notify(self.notifier.as_ref()),
            Role::Producer => header.consumer.0.producer_wait.wake(),
        }
    }

    /// Closes one end: stores its close flag (Release) and wakes the other side if it parked.
    /// What dropping that end does, and what [`close`] does for both ends on a dead peer's behalf.
    pub(super) fn close_end(&self, role: Role) {
        // SAFETY: as in `header` above (repeated here because this impl has no `Pod` bound).
        let header = unsafe { self.header.as_ref() };
        match role {
            Role::Producer => {
                header.control.0.producer_closed.store(1, Ordering::Release);
                header
                    .consumer_wait
                    .0
                    .wake_or_notify(self.notifier.as_ref());
            }
            Role::Consumer => {
                header.control.0.consumer_closed.store(1, Ordering::Release);
                header.consumer.0.producer_wait.wake();
            }
        }
    }
}
