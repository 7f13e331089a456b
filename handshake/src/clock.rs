//! A coarse clock that costs one load to read, for stamping every call a session makes (see
//! `shmbroker::session`'s status): each session's watcher thread refreshes it every [`TICK`]
//! from `CLOCK_MONOTONIC_COARSE`, which every process and PID namespace of a machine shares.
//! Reading the real clock costs 6 to 20 ns here, a fifth of a hot barrier's time for the two
//! reads a call needs; the ticked value is at most a tick (and the coarse clock's own few
//! milliseconds) behind, which is nothing for saying that a rank has waited 3.1 s.
//!
//! Until a watcher has ticked (a session's first calls, before its watcher thread has run; a
//! world of one, which has no watcher), [`now`] reads the clock itself.

use crate::sync::{AtomicU64, Ordering};
use std::time::Duration;

/// How often the watcher threads refresh [`now`].
pub const TICK: Duration = Duration::from_millis(100);

/// The last value a watcher thread read from the coarse clock (nanoseconds), or 0.
static NOW: AtomicU64 = AtomicU64::new(0);

/// `CLOCK_MONOTONIC_COARSE` now, in nanoseconds (0 if it cannot be read).
#[must_use]
pub fn read() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE).map_or(0, |time| {
        u64::try_from(Duration::from(time).as_nanos()).unwrap_or(u64::MAX)
    })
}

/// Refreshes [`now`] (the watcher threads call this every [`TICK`]).
pub fn tick() {
    NOW.store(read(), Ordering::Relaxed);
}

/// The coarse clock as of the last tick, in nanoseconds; read from the clock itself while no
/// watcher has ticked (0 only if it cannot be read).
#[must_use]
#[inline]
pub fn now() -> u64 {
    match NOW.load(Ordering::Relaxed) {
        0 => read(),
        now => now,
    }
}
