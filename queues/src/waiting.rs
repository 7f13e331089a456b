//! How a blocking call spends its time before the thing it waits for arrives: spin, then yield
//! the CPU, then park on the futex — and how long each phase lasts.
//!
//! # Why three phases
//!
//! * **Spinning** re-checks the ring in a tight loop. It answers fastest (a cache-line transfer,
//!   some hundred nanoseconds) when the other side is running on another CPU, and only then.
//! * **Yielding** (`sched_yield`) re-checks between handing the CPU to whatever else is runnable
//!   on it. When more processes are runnable than there are CPUs ("crowded": 4 ranks on 2
//!   cores), the process this one waits for is often queued on *this* CPU; spinning keeps it off
//!   the CPU until the scheduler preempts the spinner (milliseconds), while a yield lets it run at
//!   once. Open MPI yields for the same reason when it finds itself oversubscribed.
//! * **Parking** sleeps in `FUTEX_WAIT` (see the `futex` module): no CPU at all, but being woken
//!   costs a scheduler round trip (about 55–65 µs on these virtual machines). Past that long,
//!   neither spinning nor yielding can pay for itself: a wait that has already lasted as long as
//!   a wake-up costs gives the classic 2-competitive bound by parking now.
//!
//! # What adapts, and to what
//!
//! [`Waiting::Adaptive`] (the default) starts from limits set by whether the machine is crowded
//! ([`Waiting::Adaptive::crowded`], which a session works out at logon from its world size and the
//! CPUs in `sched_getaffinity`): uncrowded, up to [`SPIN_MAX`] spins and [`YIELD_MAX`] of
//! yielding; crowded, only [`CROWDED_SPIN_MAX`] spins (the CPU is better given away) and up to
//! [`CROWDED_YIELD_MAX`] of yielding. Within those limits each ring end keeps its own budgets and
//! moves them after every wait that went past its spin phase, by what that wait shows:
//!
//! * it was **long** — more than [`LONG_WAIT_FACTOR`] times what the spin and yield limits
//!   together cover: neither phase could have paid, and each cost a CPU (or this rank's share of
//!   one) for nothing, so both budgets halve. A ring end whose waits are long (a peer computing
//!   for milliseconds between messages) soon parks almost at once.
//! * otherwise spinning or yielding longer would have paid, or come close: both budgets double
//!   (up to their limits), and at least cover this wait with a quarter to spare.
//!
//! A wait that ends within the spin phase leaves the budgets as they are. One that ended while
//! yielding, right after a yield that **gave the CPU away** (it took [`GAVE_WAY`] or more:
//! another process ran here meanwhile), halves the spin budget whatever its length: the process
//! it waited for, or one it needed, shares this CPU, and spinning only kept it off. The
//! scheduler often puts the two ends of a ping-pong on one CPU (a wake-up lands the woken
//! process beside its waker); without this rule each would spin out its budget while the other
//! waits for the CPU (measured: one round trip in a hundred took 85 µs and more).
//!
//! Only clearly long waits shrink a budget, and not merely waits longer than a phase, because
//! what a waiter sees includes its peer's own waiting: in a ping-pong, a peer that parked wakes
//! only a wake-up later, so this side's wait lasts a wake-up however early it started spinning.
//! Judging that wait "spinning did not pay" would make this side park too, and both would then
//! keep parking because the other does (measured: one round trip in a hundred took 90 µs). The
//! budgets never fall to zero for good: a short wait after a run of long ones parks, is
//! measured, and brings them back. The clock is read only once a wait has gone past its spin
//! phase.
//!
//! [`Waiting::Spin`] is the knob for users who know better (`SHMBROKER_SPIN` in a session): a
//! fixed number of spins and then parking, no yielding, no adapting.
//!
//! None of this changes the wake-up protocol: the yield phase only calls the same `check` more
//! often before the waiter registers on the futex word, so the loom-checked argument of the
//! `futex` module covers it unchanged.

#[cfg(not(loom))]
use std::time::{Duration, Instant};

#[cfg(doc)]
use crate::futex::GAVE_WAY;

/// Spins before parking under [`Waiting::Spin`] when nobody chose (the ring's default before
/// adaptive waiting), and the most an uncrowded [`Waiting::Adaptive`] spins: roughly the cost of
/// one futex wake-up.
pub const SPIN_MAX: u32 = 2_000;

/// The most a crowded [`Waiting::Adaptive`] spins before yielding: about a microsecond.
pub const CROWDED_SPIN_MAX: u32 = 64;

/// The longest an uncrowded [`Waiting::Adaptive`] yields before parking: not at all. A yield
/// never moves this process to another CPU, while a park lets the wake-up put it on an idle one:
/// two ends of a ping-pong that the scheduler placed on one CPU stay there for as long as they
/// yield, each spinning out its budget while the other waits for the CPU (measured with a
/// 50 µs window: one round trip in a hundred took 60–160 µs; spinning and then parking: 0.4 µs).
#[cfg(not(loom))]
pub const YIELD_MAX: Duration = Duration::ZERO;

/// The longest a crowded [`Waiting::Adaptive`] yields before parking. Longer than a wake-up:
/// when crowded, a yield hands the CPU to a process that needs it, and a parked waiter's wake-up
/// waits behind those same processes.
#[cfg(not(loom))]
pub const CROWDED_YIELD_MAX: Duration = Duration::from_millis(1);

/// A wait is long, and shrinks the budgets, when it lasts more than this many times what the
/// spin and yield limits together cover.
#[cfg(not(loom))]
pub const LONG_WAIT_FACTOR: u32 = 4;

/// How a blocking call waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// Re-check up to this many times, then park: 0 parks at once, `u32::MAX` spins until the
    /// deadline. No yielding, no adapting.
    Spin(u32),
    /// Spin, yield, then park, each phase as long as recent waits show it pays (see the module
    /// docs).
    Adaptive {
        /// More processes are runnable than there are CPUs for them: spin little, yield long.
        crowded: bool,
    },
}

impl Default for Waiting {
    fn default() -> Self {
        Self::Adaptive { crowded: false }
    }
}

impl Waiting {
    /// Adaptive waiting for `runnable` processes sharing `cpus` CPUs.
    #[must_use]
    pub fn for_load(runnable: usize, cpus: usize) -> Self {
        Self::Adaptive {
            crowded: runnable > cpus.max(1),
        }
    }
}

/// One ring end's waiting policy and, when adaptive, its current budgets.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Patience {
    waiting: Waiting,
    /// Spins of the next wait.
    spins: u32,
    /// Nanoseconds the next wait yields (after spinning) before it parks (always 0 under loom,
    /// which models no clock).
    #[cfg_attr(loom, allow(dead_code))]
    yield_ns: u32,
}

impl Patience {
    pub(crate) fn new(waiting: Waiting) -> Self {
        let (spins, yield_ns) = Self::limits(waiting);
        Self {
            waiting,
            spins,
            yield_ns,
        }
    }

    pub(crate) fn waiting(&self) -> Waiting {
        self.waiting
    }

    /// The spin and yield limits of `waiting`.
    fn limits(waiting: Waiting) -> (u32, u32) {
        match waiting {
            Waiting::Spin(spins) => (spins, 0),
            Waiting::Adaptive { crowded } => {
                let spins = if crowded { CROWDED_SPIN_MAX } else { SPIN_MAX };
                #[cfg(not(loom))]
                let yield_max = if crowded {
                    CROWDED_YIELD_MAX
                } else {
                    YIELD_MAX
                };
                #[cfg(not(loom))]
                let yield_ns = u32::try_from(yield_max.as_nanos()).unwrap_or(u32::MAX);
                #[cfg(loom)]
                let yield_ns = 0;
                (spins, yield_ns)
            }
        }
    }

    /// Spins the next wait makes before it yields or parks.
    #[inline(always)]
    pub(crate) fn spins(&self) -> u32 {
        self.spins
    }

    /// How long the next wait yields before it parks (zero: it parks at once).
    #[cfg(not(loom))]
    pub(crate) fn yield_window(&self) -> Duration {
        Duration::from_nanos(u64::from(self.yield_ns))
    }

    /// Learns from a wait that went past its spin phase and then took `after` more to end,
    /// `gave_way` when one of its yields gave the CPU to another process (see the module docs).
    /// Fixed policies learn nothing.
    #[cfg(not(loom))]
    pub(crate) fn learn(&mut self, after: Duration, gave_way: bool) {
        let Waiting::Adaptive { .. } = self.waiting else {
            return;
        };
        if gave_way {
            self.spins /= 2;
            return;
        }
        let (spin_max, yield_max) = Self::limits(self.waiting);
        let after_ns = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
        let per_spin = u64::from(ns_per_spin());
        let covered = u64::from(spin_max) * per_spin + u64::from(yield_max);
        if after_ns > covered.saturating_mul(u64::from(LONG_WAIT_FACTOR)) {
            self.spins /= 2;
            self.yield_ns /= 2;
            return;
        }
        // Spins this wait needed in all, and time past the spin phase, each with a quarter more.
        let needed = u64::from(self.spins) + after_ns / per_spin;
        let spins = (u64::from(self.spins) * 2).max(needed + needed / 4);
        self.spins = spins.min(u64::from(spin_max)) as u32;
        let yield_ns = (u64::from(self.yield_ns) * 2).max(after_ns + after_ns / 4);
        self.yield_ns = yield_ns.min(u64::from(yield_max)) as u32;
    }
}

/// Nanoseconds one spin (a pause and a check) takes on this machine, measured once per process.
#[cfg(not(loom))]
fn ns_per_spin() -> u32 {
    use std::sync::OnceLock;
    static NS: OnceLock<u32> = OnceLock::new();
    *NS.get_or_init(|| {
        const ROUNDS: u32 = 1_000;
        let word = crate::sync::AtomicU32::new(0);
        let start = Instant::now();
        for _ in 0..ROUNDS {
            crate::sync::spin_loop();
            if word.load(crate::sync::Ordering::Acquire) == u32::MAX {
                break;
            }
        }
        let total = u32::try_from(start.elapsed().as_nanos()).unwrap_or(u32::MAX);
        (total / ROUNDS).max(1)
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn fixed_spinning_neither_yields_nor_learns() {
        let mut patience = Patience::new(Waiting::Spin(10));
        patience.learn(Duration::from_nanos(1), false);
        patience.learn(Duration::from_secs(1), false);
        assert_eq!(patience.spins(), 10);
        assert_eq!(patience.yield_window(), Duration::ZERO);
    }

    #[test]
    fn long_waits_shrink_the_budgets_and_a_short_one_restores_them() {
        let mut patience = Patience::new(Waiting::Adaptive { crowded: false });
        assert_eq!(patience.spins(), SPIN_MAX);
        assert_eq!(patience.yield_window(), YIELD_MAX);
        for _ in 0..20 {
            patience.learn(Duration::from_millis(100), false);
        }
        assert_eq!(patience.spins(), 0);
        assert_eq!(patience.yield_window(), Duration::ZERO);
        // A wait that ended a moment after parking: spinning would have caught it.
        patience.learn(Duration::from_nanos(u64::from(ns_per_spin()) * 100), false);
        assert!(
            (100..=SPIN_MAX).contains(&patience.spins()),
            "{}",
            patience.spins()
        );
        // A few waits the length of a wake-up (a parked peer's) restore the limits.
        for _ in 0..20 {
            patience.learn(Duration::from_micros(60), false);
        }
        assert_eq!(patience.spins(), SPIN_MAX);
        assert_eq!(patience.yield_window(), YIELD_MAX);
    }

    #[test]
    fn a_yield_that_gave_the_cpu_away_halves_the_spins_only() {
        let mut patience = Patience::new(Waiting::Adaptive { crowded: false });
        patience.learn(Duration::from_micros(1), true);
        assert_eq!(patience.spins(), SPIN_MAX / 2);
        assert_eq!(patience.yield_window(), YIELD_MAX);
    }

    #[test]
    fn crowded_spins_little_and_yields_long() {
        let crowded = Patience::new(Waiting::for_load(4, 2));
        let roomy = Patience::new(Waiting::for_load(2, 2));
        assert_eq!(roomy.yield_window(), Duration::ZERO);
        assert_eq!(crowded.waiting(), Waiting::Adaptive { crowded: true });
        assert_eq!(roomy.waiting(), Waiting::Adaptive { crowded: false });
        assert!(crowded.spins() < roomy.spins());
        assert!(crowded.yield_window() > roomy.yield_window());
        // Waits longer than any spin limit never grow the spin budget past the crowded limit.
        let mut crowded = crowded;
        crowded.learn(Duration::from_micros(1), false);
        assert!(crowded.spins() <= CROWDED_SPIN_MAX);
    }
}
