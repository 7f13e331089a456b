//! This rank's side of its status words: what it publishes about the call in progress (see
//! `status` for what peers read of them and how).

use crate::status::{NONE, RECEIVE_SLOT};
use shmbroker_allocator::StatusWords;
use shmbroker_allocator::status::Slot;
use shmbroker_bindings::{STATUS_SLOTS, status_word as w};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// This rank's side of its status words, shared by the session and (for a split session) its
/// receiving half.
#[derive(Debug)]
pub(super) struct Publisher {
    words: StatusWords,
    /// Calls in progress per slot, outermost first (see the module docs).
    depth: [AtomicU32; STATUS_SLOTS],
    /// Whether to publish at all (`SHMBROKER_STATUS=0` or `Session::set_publishing` turns it
    /// off, to measure what it costs).
    on: AtomicBool,
}

impl Publisher {
    pub(super) fn new(words: StatusWords) -> Self {
        let on = std::env::var("SHMBROKER_STATUS").map_or(true, |value| value != "0");
        for slot in 0..STATUS_SLOTS {
            let words = words.slot(slot);
            for at in [
                w::SEQ,
                w::GROUP_PEER,
                w::LAST_SEQ,
                w::LAST_GROUP_PEER,
                w::WAITING_FOR,
                w::KIND,
                w::LAST_KIND,
            ] {
                words[at].store(NONE, Ordering::Relaxed);
            }
        }
        // Slot 0 only: slot `ALIVE_SLOT` holds `ALIVE` where slot 0 holds `FAILED_SEQ`.
        for at in [w::FAILED_SEQ, w::FAILED_STREAM_NAMED] {
            words.slot(0)[at].store(NONE, Ordering::Relaxed);
        }
        Self {
            words,
            depth: Default::default(),
            on: AtomicBool::new(on),
        }
    }

    /// Whether calls are published.
    pub(super) fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Turns publishing on or off (see `Session::set_publishing`).
    pub(super) fn set_on(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// The words of slot 0 (the collective in progress, and the last one), while calls are
    /// published; `None` while they are not, as nothing there is current then.
    pub(super) fn published(&self) -> Option<&Slot> {
        self.on().then(|| self.words.slot(0))
    }

    /// The slot `op` publishes in.
    fn slot_of(op: &str) -> usize {
        match op {
            "recv" | "recv_any" | "probe" | "recv_loan" => RECEIVE_SLOT,
            _ => 0,
        }
    }

    /// `op` starts (see [`Deadline::tracked_by`](super::state::Deadline::tracked_by)); returns
    /// the slot it publishes in, which only its outermost call of that slot writes.
    pub(super) fn enter(&self, op: &'static str) -> usize {
        let slot = Self::slot_of(op);
        let depth = self.depth[slot].load(Ordering::Relaxed);
        self.depth[slot].store(depth + 1, Ordering::Relaxed);
        if depth == 0 && self.on() {
            let words = self.words.slot(slot);
            let [first, second] = name_words(op);
            words[w::CALL].store(first, Ordering::Relaxed);
            words[w::CALL + 1].store(second, Ordering::Relaxed);
            words[w::SEQ].store(NONE, Ordering::Relaxed);
            words[w::GROUP_PEER].store(NONE, Ordering::Relaxed);
            words[w::WAITING_FOR].store(NONE, Ordering::Relaxed);
            words[w::KIND].store(NONE, Ordering::Relaxed);
            words[w::SINCE].store(shmbroker_handshake::clock::now(), Ordering::Relaxed);
        }
        slot
    }

    /// The call of `slot` that [`Self::enter`] started ends: returning its result when `failed`
    /// is `NONE`, else failing (naming the rank `failed` holds, or none: `u32::MAX`). A
    /// collective that fails after taking its number is recorded in `FAILED_SEQ` and
    /// `FAILED_STREAM_NAMED` (the stream and rank first, then the number that makes them a
    /// match).
    pub(super) fn leave(&self, slot: usize, failed: u64) {
        let depth = self.depth[slot].load(Ordering::Relaxed).saturating_sub(1);
        self.depth[slot].store(depth, Ordering::Relaxed);
        if depth == 0 && self.on() {
            let words = self.words.slot(slot);
            for (from, to) in [
                (w::CALL, w::LAST_CALL),
                (w::CALL + 1, w::LAST_CALL + 1),
                (w::SEQ, w::LAST_SEQ),
                (w::GROUP_PEER, w::LAST_GROUP_PEER),
                (w::KIND, w::LAST_KIND),
            ] {
                words[to].store(words[from].load(Ordering::Relaxed), Ordering::Relaxed);
            }
            let seq = words[w::SEQ].load(Ordering::Relaxed);
            if failed != NONE && seq != NONE {
                let stream = words[w::GROUP_PEER].load(Ordering::Relaxed) & u64::from(u32::MAX);
                let named = failed & u64::from(u32::MAX);
                words[w::FAILED_STREAM_NAMED]
                    .store(w::FAILED_RECORD | stream << 32 | named, Ordering::Relaxed);
                words[w::FAILED_SEQ].store(seq, Ordering::Relaxed);
            }
            words[w::LAST_DONE].store(shmbroker_handshake::clock::now(), Ordering::Relaxed);
            words[w::CALL].store(0, Ordering::Relaxed);
            words[w::CALL + 1].store(0, Ordering::Relaxed);
        }
    }

    /// The collective in progress in slot 0 is number `seq` of group `stream`, of message kind
    /// `kind`. A call that takes several numbers (a two-shot reduction takes two a piece, an fd
    /// exchange one for its tickets and one for its status) is published by its first, so that
    /// ranks in the same call publish the same number whichever stage each is in.
    pub(super) fn collective(&self, stream: u32, seq: u64, kind: u32) {
        if self.on() && self.depth[0].load(Ordering::Relaxed) == 1 {
            let words = self.words.slot(0);
            if words[w::SEQ].load(Ordering::Relaxed) != NONE {
                return;
            }
            words[w::KIND].store(u64::from(kind), Ordering::Relaxed);
            words[w::SEQ].store(seq, Ordering::Relaxed);
            words[w::GROUP_PEER].store(
                u64::from(u32::MAX) << 32 | u64::from(stream),
                Ordering::Relaxed,
            );
        }
    }

    /// The point-to-point call `op` in progress is with `peer`.
    pub(super) fn peer(&self, op: &str, peer: u32) {
        let slot = Self::slot_of(op);
        if self.on() && self.depth[slot].load(Ordering::Relaxed) == 1 {
            self.words.slot(slot)[w::GROUP_PEER].store(u64::from(peer) << 32, Ordering::Relaxed);
        }
    }
    /// The call of `slot` waits for `rank` (one store).
    pub(super) fn waits_for(&self, slot: usize, rank: u32) {
        if self.on() {
            self.words.slot(slot)[w::WAITING_FOR].store(u64::from(rank), Ordering::Relaxed);
        }
    }
}

/// `op`'s name as two words of ASCII, zero-padded (cut at 16 bytes).
pub(super) fn name_words(op: &str) -> [u64; 2] {
    let mut bytes = [0u8; 16];
    let len = op.len().min(16);
    bytes[..len].copy_from_slice(&op.as_bytes()[..len]);
    let (first, second) = bytes.split_at(8);
    [first, second].map(|half| u64::from_le_bytes(half.try_into().unwrap_or_default()))
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds: system-wide (every process and PID namespace of a
/// machine reads the same clock), a few milliseconds coarse, and read without a system call.
pub(super) fn coarse_now() -> u64 {
    shmbroker_handshake::clock::read()
}

/// What `Session::look_for_mismatch` saw of the peer a collective waits for, to be seen again
/// `status::MISMATCH_SURE` later before the wait fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Seen {
    /// In (or last in) another collective, of this message kind, at this call's number.
    Kind(u32),
    /// Failed this very collective, naming this rank (its word, if a rank of the world).
    GaveUp(Option<u32>),
}
