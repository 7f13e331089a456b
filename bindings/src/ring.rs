//! The layout descriptor at the start of every shared-memory ring.

use bytemuck::{Pod, Zeroable};

/// First eight bytes of every ring: the ASCII bytes `SHMBRING` read as a little-endian `u64`.
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"SHMBRING");

/// Version of the ring's shared-memory layout (header, slot format and cursor protocol).
///
/// Bump it whenever a process built from the new code could misread a ring made by the old code.
pub const RING_LAYOUT_VERSION: u32 = 1;

/// Describes a ring's memory: written once by the creator, read and checked by every joiner.
///
/// The rest of the ring header (cursors, wait words, close flags) is atomics owned by the queue
/// crate; this part is plain data so that a joiner can copy it out once and validate the copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct RingLayout {
    /// Always [`RING_MAGIC`].
    pub magic: u64,
    /// Always [`RING_LAYOUT_VERSION`] for rings this build can use.
    pub version: u32,
    /// `size_of` the message type.
    pub elem_size: u32,
    /// `align_of` the message type.
    pub elem_align: u32,
    /// Bytes from one slot to the next (sequence word, message, padding).
    pub slot_size: u32,
    /// Number of slots; a power of two.
    pub capacity: u64,
    /// Byte offset of slot 0 from the start of the file.
    pub slots_offset: u64,
    /// Exact size of the file: `slots_offset + capacity * slot_size`.
    pub file_size: u64,
}

const _: () = assert!(size_of::<RingLayout>() == 48);
const _: () = assert!(align_of::<RingLayout>() == 8);

impl RingLayout {
    /// The layout of a ring of `capacity` slots of `slot_size` bytes starting at `slots_offset`,
    /// carrying messages of `elem_size` bytes aligned to `elem_align`.
    ///
    /// The file size saturates at `u64::MAX` rather than wrapping, so a nonsensical request can
    /// never describe a small file.
    #[must_use]
    pub const fn new(
        elem_size: u32,
        elem_align: u32,
        slot_size: u32,
        capacity: u64,
        slots_offset: u64,
    ) -> Self {
        let slots_bytes = capacity.saturating_mul(slot_size as u64);
        Self {
            magic: RING_MAGIC,
            version: RING_LAYOUT_VERSION,
            elem_size,
            elem_align,
            slot_size,
            capacity,
            slots_offset,
            file_size: slots_offset.saturating_add(slots_bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_spells_the_name_in_memory_order() {
        assert_eq!(&RING_MAGIC.to_le_bytes(), b"SHMBRING");
    }

    #[test]
    fn file_size_saturates_instead_of_wrapping() {
        let layout = RingLayout::new(8, 8, u32::MAX, u64::MAX, 384);
        assert_eq!(layout.file_size, u64::MAX);
    }

    #[test]
    fn round_trips_through_bytes() {
        let layout = RingLayout::new(64, 8, 72, 1 << 10, 384);
        let bytes = bytemuck::bytes_of(&layout);
        assert_eq!(bytes.len(), 48);
        assert_eq!(bytemuck::pod_read_unaligned::<RingLayout>(bytes), layout);
    }
}
