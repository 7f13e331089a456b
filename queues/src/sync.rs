//! The one place atomics and cells come from, so that `--cfg loom` can swap in loom's models.
//!
//! Everything in this crate that is shared between threads or processes goes through these names:
//! under `cfg(loom)` they are loom's instrumented types, otherwise thin `#[repr(transparent)]`
//! wrappers of the core ones, which have the same in-memory representation as the plain integers
//! and so can live in a mapping. The wrappers exist so that `clippy.toml` can forbid the core types
//! everywhere else in the crate: an atomic that bypassed this module would be invisible to loom.

// The one module that may name the core types.
#![allow(clippy::disallowed_types)]

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64};

/// Defines a wrapper exposing only the operations this crate uses.
#[cfg(not(loom))]
macro_rules! atomic {
    ($name:ident, $int:ty) => {
        #[derive(Debug)]
        #[repr(transparent)]
        pub(crate) struct $name(core::sync::atomic::$name);

        #[allow(dead_code)]
        impl $name {
            pub(crate) const fn new(value: $int) -> Self {
                Self(core::sync::atomic::$name::new(value))
            }

            #[inline(always)]
            pub(crate) fn load(&self, order: Ordering) -> $int {
                self.0.load(order)
            }

            #[inline(always)]
            pub(crate) fn store(&self, value: $int, order: Ordering) {
                self.0.store(value, order)
            }

            #[inline(always)]
            pub(crate) fn swap(&self, value: $int, order: Ordering) -> $int {
                self.0.swap(value, order)
            }

            #[inline(always)]
            pub(crate) fn fetch_add(&self, value: $int, order: Ordering) -> $int {
                self.0.fetch_add(value, order)
            }

            /// The core atomic, for system calls such as futex(2) (`shmbroker_sys::futex`).
            pub(crate) const fn as_core(&self) -> &core::sync::atomic::$name {
                &self.0
            }
        }
    };
}

#[cfg(not(loom))]
atomic!(AtomicU32, u32);
#[cfg(not(loom))]
atomic!(AtomicU64, u64);

pub(crate) use core::sync::atomic::Ordering;

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// `core::cell::UnsafeCell` with loom's closure-based accessors, so the same code compiles both ways.
#[cfg(not(loom))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// Runs `f` with a pointer for reading the contents.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a pointer for writing the contents.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// One iteration of a busy-wait: a CPU pause hint, or a yield to loom's scheduler.
#[inline(always)]
pub(crate) fn spin_loop() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}
