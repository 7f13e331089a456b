//! A ring in a sealed memfd: `create` writes its layout, joining maps the file and checks
//! everything in it against `T` before trusting any of it (see "Memory another process
//! writes" in the `ring` module docs), and `close` closes both ends for a dead peer.

use super::shared::{Backing, Geometry, Header, RingRef, Slot};
#[cfg(doc)]
use super::{Closer, Consumer, Producer};
use super::{HEADER_SIZE, MAX_CAPACITY, check_capacity};
use crate::error::{Error, Role};
use crate::sync::Ordering;
use bytemuck::Pod;
use shmbroker_bindings::{RING_LAYOUT_VERSION, RING_MAGIC, RingLayout};
use std::os::fd::{BorrowedFd, OwnedFd};

/// Maps a ring file and checks everything in it against `T` before trusting any of it, then
/// claims `role` (each role can be claimed once).
#[cfg(not(loom))]
pub(super) fn join_ring<T: Pod>(fd: BorrowedFd<'_>, role: Role) -> Result<RingRef<T>, Error> {
    let ring = map_ring::<T>(fd)?;
    let control = &ring.header().control.0;
    let flag = match role {
        Role::Producer => &control.producer_joined,
        Role::Consumer => &control.consumer_joined,
    };
    if flag.swap(1, Ordering::AcqRel) != 0 {
        return Err(Error::AlreadyJoined { role });
    }
    Ok(ring)
}

/// Maps a ring file and checks everything in it against `T`, claiming no role.
#[cfg(not(loom))]
fn map_ring<T: Pod>(fd: BorrowedFd<'_>) -> Result<RingRef<T>, Error> {
    use crate::memfd::{Mapping, check_seals, file_size};

    check_seals(fd)?;
    let size = file_size(fd)?;
    if size < HEADER_SIZE as u64 {
        return Err(Error::FileTooSmall {
            minimum: HEADER_SIZE as u64,
            found: size,
        });
    }
    let mapping = Mapping::map(fd, size)?;
    let header = mapping.as_ptr().cast::<Header>();
    // SAFETY: the mapping is page-aligned and at least `HEADER_SIZE` bytes long. A volatile copy
    // reads the bytes once, whatever a peer does to them meanwhile; every bit pattern is a valid
    // `RingLayout`.
    let found = unsafe { core::ptr::read_volatile(header.cast::<RingLayout>().as_ptr()) };
    let layout = validate_layout::<T>(&found, size)?;
    let ring = RingRef {
        header,
        // `slots_offset + capacity * slot_size == size` was checked, so all slots are mapped.
        slots: mapping.at(layout.slots_offset as usize).cast::<Slot<T>>(),
        mask: layout.capacity - 1,
        capacity: layout.capacity,
        notifier: None,
        _backing: Backing::Mapped(std::sync::Arc::new(mapping)),
    };
    Ok(ring)
}

/// Closes both ends of the ring in `fd` on behalf of processes that cannot close them
/// themselves (a peer that died without dropping its end), exactly as if both ends had been
/// dropped: the consumer still receives everything sent, then `Disconnected`; the producer gets
/// `Disconnected`; whichever side is parked is woken. Either end can then read `cause`
/// (`close_cause`), a number the closer chose (a hint: whoever can write the file can write it
/// too). Safe on a ring already closed. Within a process holding an end, [`Closer`] does the same
/// without mapping the file again.
///
/// # Errors
///
/// As for [`Producer::join`], less [`Error::AlreadyJoined`]: the file must be a ring of `T`.
#[cfg(not(loom))]
pub fn close<T: Pod>(fd: BorrowedFd<'_>, cause: u32) -> Result<(), Error> {
    map_ring::<T>(fd)?.close_with_cause(cause);
    Ok(())
}

/// How many messages wait in the ring of `T` in `fd`, for a third process that holds the file
/// (the broker, for `shmbroker status`): it claims no role and writes nothing. It counts the slots
/// ready from the consumer's cursor on, so the answer is at most the capacity whatever either end
/// wrote (and counts the few a consumer releasing in batches has read but not yet given back);
/// it is a picture for people, not a number to act on.
///
/// # Errors
///
/// As for [`close`]: the file must be a ring of `T`.
#[cfg(not(loom))]
pub fn fill<T: Pod>(fd: BorrowedFd<'_>) -> Result<u64, Error> {
    let ring = map_ring::<T>(fd)?;
    let head = ring.header().consumer.0.head.load(Ordering::Acquire);
    let mut count = 0;
    while count < ring.capacity {
        let position = head.wrapping_add(count);
        if ring.slot(position).seq.load(Ordering::Acquire) != position.wrapping_add(1) {
            break;
        }
        count += 1;
    }
    Ok(count)
}

/// Checks a layout read from a peer's file of `file_size` bytes against what `T` needs.
#[cfg(not(loom))]
fn validate_layout<T: Pod>(found: &RingLayout, file_size: u64) -> Result<RingLayout, Error> {
    if found.magic != RING_MAGIC {
        return Err(Error::BadMagic {
            expected: RING_MAGIC,
            found: found.magic,
        });
    }
    if found.version != RING_LAYOUT_VERSION {
        return Err(Error::VersionMismatch {
            expected: RING_LAYOUT_VERSION,
            found: found.version,
        });
    }
    let capacity = found.capacity;
    if !capacity.is_power_of_two() || capacity > MAX_CAPACITY {
        return Err(Error::InvalidCapacity {
            max: MAX_CAPACITY,
            found: capacity,
        });
    }
    let expected = Geometry::<T>::layout(capacity);
    if found.elem_size != expected.elem_size {
        return Err(Error::ElementSize {
            expected: expected.elem_size,
            found: found.elem_size,
        });
    }
    if found.elem_align != expected.elem_align {
        return Err(Error::ElementAlign {
            expected: expected.elem_align,
            found: found.elem_align,
        });
    }
    if found.slot_size != expected.slot_size || found.slots_offset != expected.slots_offset {
        return Err(Error::SlotGeometry {
            expected_size: expected.slot_size,
            found_size: found.slot_size,
            expected_offset: expected.slots_offset,
            found_offset: found.slots_offset,
        });
    }
    for size in [found.file_size, file_size] {
        if size != expected.file_size {
            return Err(Error::FileSize {
                expected: expected.file_size,
                found: size,
            });
        }
    }
    Ok(expected)
}

/// Creates a ring of `capacity` slots for messages of type `T` in a fresh sealed memfd.
///
/// The returned fd can be sent to another process (over `SCM_RIGHTS`, or inherited); one process
/// then calls [`Producer::join`] and one [`Consumer::join`]. The file holds nothing but the ring:
/// it disappears when the last process holding it closes it.
///
/// # Errors
///
/// [`Error::InvalidCapacity`] unless `capacity` is a power of two from 1 to [`MAX_CAPACITY`];
/// [`Error::Sys`] if the memfd cannot be created, sized, sealed or mapped.
#[cfg(not(loom))]
pub fn create<T: Pod>(capacity: usize) -> Result<OwnedFd, Error> {
    let capacity = check_capacity(capacity)?;
    create_with_layout(Geometry::<T>::layout(capacity))
}

/// [`create`] for messages known only at run time: `elem_size` bytes aligned to `elem_align`
/// (a power of two up to 4096), as a type of that size and alignment would have them. For a
/// process that makes rings for others without their types (the broker makes typed channels'
/// rings); they join with the type.
///
/// # Errors
///
/// As for [`create`], and [`Error::ElementAlign`] for an alignment that is not a power of two
/// up to 4096.
#[cfg(not(loom))]
pub fn create_sized(elem_size: u32, elem_align: u32, capacity: usize) -> Result<OwnedFd, Error> {
    let capacity = check_capacity(capacity)?;
    if !elem_align.is_power_of_two() || elem_align > 4096 {
        return Err(Error::ElementAlign {
            expected: 8,
            found: elem_align,
        });
    }
    create_with_layout(super::shared::layout_sized(elem_size, elem_align, capacity))
}

/// A fresh sealed memfd holding a ring of `layout`.
#[cfg(not(loom))]
fn create_with_layout(layout: RingLayout) -> Result<OwnedFd, Error> {
    let fd = crate::memfd::create_sealed(c"shmbroker-ring", layout.file_size)?;
    // Only the layout: every other byte of a fresh file is zero, which is what the control
    // blocks start as and what slot sequence words read as "pending" in the first lap.
    let file = std::fs::File::from(fd);
    std::os::unix::fs::FileExt::write_all_at(&file, bytemuck::bytes_of(&layout), 0).map_err(
        |e| Error::sys("pwrite")(nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0))),
    )?;
    Ok(OwnedFd::from(file))
}
