//! The one place shmbroker's atomics and cells come from, so that `--cfg loom` can swap in loom's
//! models. This crate uses it, and so does `shmbroker-handshake` (its liveness state), through
//! `shmbroker_queues::sync`: the two crates with loom models share one shim.
//!
//! Everything shared between threads or processes goes through these names: under `cfg(loom)`
//! they are loom's instrumented types, otherwise thin `#[repr(transparent)]` wrappers of the core
//! ones, which have the same in-memory representation as the plain integers and so can live in a
//! mapping. The wrappers expose only the operations used, and exist so that each crate's
//! `clippy.toml` can forbid the core types everywhere else: an atomic that bypassed this module
//! would be invisible to loom.

// The one module that may name the core types.
#![allow(clippy::disallowed_types)]

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};

pub use core::sync::atomic::Ordering;

/// Defines a wrapper exposing only the operations the crates use.
#[cfg(not(loom))]
macro_rules! atomic {
    ($name:ident, $int:ty) => {
        #[derive(Debug)]
        #[repr(transparent)]
        pub struct $name(core::sync::atomic::$name);

        #[allow(dead_code)]
        impl $name {
            pub const fn new(value: $int) -> Self {
                Self(core::sync::atomic::$name::new(value))
            }

            #[inline(always)]
            pub fn load(&self, order: Ordering) -> $int {
                self.0.load(order)
            }

            #[inline(always)]
            pub fn store(&self, value: $int, order: Ordering) {
                self.0.store(value, order)
            }

            #[inline(always)]
            pub fn swap(&self, value: $int, order: Ordering) -> $int {
                self.0.swap(value, order)
            }

            #[inline(always)]
            pub fn compare_exchange(
                &self,
                current: $int,
                new: $int,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$int, $int> {
                self.0.compare_exchange(current, new, success, failure)
            }

            /// The core atomic, for system calls such as futex(2) (`shmbroker_sys::futex`).
            pub const fn as_core(&self) -> &core::sync::atomic::$name {
                &self.0
            }
        }
    };
}

/// Adds the integer operations.
#[cfg(not(loom))]
macro_rules! integer {
    ($name:ident, $int:ty) => {
        atomic!($name, $int);

        #[allow(dead_code)]
        impl $name {
            #[inline(always)]
            pub fn fetch_add(&self, value: $int, order: Ordering) -> $int {
                self.0.fetch_add(value, order)
            }

            #[inline(always)]
            pub fn fetch_or(&self, value: $int, order: Ordering) -> $int {
                self.0.fetch_or(value, order)
            }

            #[inline(always)]
            pub fn fetch_and(&self, value: $int, order: Ordering) -> $int {
                self.0.fetch_and(value, order)
            }

            #[inline(always)]
            pub fn fetch_sub(&self, value: $int, order: Ordering) -> $int {
                self.0.fetch_sub(value, order)
            }
        }
    };
}

#[cfg(not(loom))]
atomic!(AtomicBool, bool);
#[cfg(not(loom))]
integer!(AtomicU32, u32);
#[cfg(not(loom))]
integer!(AtomicU64, u64);
#[cfg(not(loom))]
integer!(AtomicUsize, usize);

/// A pointer wrapper exposing only the operations the crates use.
#[cfg(not(loom))]
#[derive(Debug)]
#[repr(transparent)]
pub struct AtomicPtr<T>(core::sync::atomic::AtomicPtr<T>);

#[cfg(not(loom))]
impl<T> AtomicPtr<T> {
    pub const fn new(value: *mut T) -> Self {
        Self(core::sync::atomic::AtomicPtr::new(value))
    }

    #[inline(always)]
    pub fn load(&self, order: Ordering) -> *mut T {
        self.0.load(order)
    }

    #[inline(always)]
    pub fn swap(&self, value: *mut T, order: Ordering) -> *mut T {
        self.0.swap(value, order)
    }
}

#[cfg(loom)]
pub use loom::cell::UnsafeCell;

/// `core::cell::UnsafeCell` with loom's closure-based accessors, so the same code compiles both ways.
#[cfg(not(loom))]
#[derive(Debug)]
#[repr(transparent)]
pub struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// Runs `f` with a pointer for reading the contents.
    #[inline(always)]
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a pointer for writing the contents.
    #[inline(always)]
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// One iteration of a busy-wait: a CPU pause hint, or a yield to loom's scheduler.
#[inline(always)]
pub fn spin_loop() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}
