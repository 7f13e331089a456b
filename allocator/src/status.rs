//! The status words at the start of every outbox (`shmbroker_bindings::status_word`): the
//! owner's side writes them, its peers' side reads them.
//!
//! Both sides reach the words only through `AtomicU64`s, relaxed: the owner stores one word at a
//! time and a reader loads them, in another process, through its own mapping. Nothing is
//! synchronised by them; a reader that wants a consistent picture copies a slot until two copies
//! agree (`PeerOutbox::status` does). The owner's stores are plain moves on the targets this runs on, and
//! loads of a read-only mapping never write it.

use shmbroker_bindings::{OUTBOX_STATUS_OFFSET, STATUS_SLOT_WORDS, STATUS_SLOTS, status_word};
use shmbroker_queues::memfd::Mapping;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// One status slot's words.
pub type Slot = [AtomicU64; STATUS_SLOT_WORDS];

/// A copy of every status slot of an outbox.
pub type Snapshot = [[u64; STATUS_SLOT_WORDS]; STATUS_SLOTS];

/// The status slots of `map` (an outbox mapping, at least `OUTBOX_HEADER_BYTES` long).
fn slots(map: &Mapping) -> &[Slot; STATUS_SLOTS] {
    let start = map.at(OUTBOX_STATUS_OFFSET as usize);
    // SAFETY: every outbox mapping is at least MIN_OUTBOX_BYTES long (checked where it is made
    // or joined), which covers the status words after the 64-byte header; the start is the
    // page-aligned mapping plus 64, so 8-byte aligned. The memory stays mapped as long as `map`
    // is borrowed, and it is only ever reached through these atomics (by this process, and by
    // others through their own mappings), so no non-atomic access races with them.
    unsafe { &*start.as_ptr().cast::<[Slot; STATUS_SLOTS]>() }
}

/// The owner's handle on its own status words: cheap to clone, keeps the outbox mapped.
#[derive(Clone, Debug)]
pub struct StatusWords(pub(crate) Arc<Mapping>);

impl StatusWords {
    /// Slot `slot`'s words (`slot < STATUS_SLOTS`; a larger index gives the last slot).
    #[must_use]
    pub fn slot(&self, slot: usize) -> &Slot {
        &slots(&self.0)[slot.min(STATUS_SLOTS - 1)]
    }
}

/// Stores `used` in `map`'s `status_word::OUTBOX_USED` (slot 0).
pub(crate) fn publish_use(map: &Mapping, used: u64) {
    slots(map)[0][status_word::OUTBOX_USED].store(used, Ordering::Relaxed);
}

/// Copies every slot of `map`'s status until two copies in a row agree (at most a few tries; the
/// last copy otherwise).
pub(crate) fn read_slots(map: &Mapping) -> Snapshot {
    let copy = || {
        slots(map)
            .each_ref()
            .map(|slot| slot.each_ref().map(|word| word.load(Ordering::Relaxed)))
    };
    let mut last = copy();
    for _ in 0..4 {
        let again = copy();
        if again == last {
            break;
        }
        last = again;
    }
    last
}
