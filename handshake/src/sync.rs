//! The one place this crate's atomics come from, so that `--cfg loom` can swap in loom's models.
//!
//! The state a session shares with its watcher thread (`liveness::state`) uses these names:
//! under `cfg(loom)` they are loom's instrumented atomics, otherwise thin wrappers of the core
//! ones exposing only the operations used. `clippy.toml` forbids the core types everywhere else in
//! the crate: an atomic that bypassed this module would be invisible to loom.

// The one module that may name the core types.
#![allow(clippy::disallowed_types)]

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};

pub(crate) use core::sync::atomic::Ordering;

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
            pub(crate) fn compare_exchange(
                &self,
                current: $int,
                new: $int,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$int, $int> {
                self.0.compare_exchange(current, new, success, failure)
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
            pub(crate) fn fetch_add(&self, value: $int, order: Ordering) -> $int {
                self.0.fetch_add(value, order)
            }

            #[inline(always)]
            pub(crate) fn fetch_or(&self, value: $int, order: Ordering) -> $int {
                self.0.fetch_or(value, order)
            }

            #[inline(always)]
            pub(crate) fn fetch_and(&self, value: $int, order: Ordering) -> $int {
                self.0.fetch_and(value, order)
            }

            #[inline(always)]
            pub(crate) fn fetch_sub(&self, value: $int, order: Ordering) -> $int {
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

/// A pointer wrapper exposing only the operations this crate uses.
#[cfg(not(loom))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct AtomicPtr<T>(core::sync::atomic::AtomicPtr<T>);

#[cfg(not(loom))]
impl<T> AtomicPtr<T> {
    pub(crate) const fn new(value: *mut T) -> Self {
        Self(core::sync::atomic::AtomicPtr::new(value))
    }

    #[inline(always)]
    pub(crate) fn load(&self, order: Ordering) -> *mut T {
        self.0.load(order)
    }

    #[inline(always)]
    pub(crate) fn swap(&self, value: *mut T, order: Ordering) -> *mut T {
        self.0.swap(value, order)
    }
}
