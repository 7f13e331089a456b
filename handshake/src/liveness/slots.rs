//! One value per rank that any thread, a signal handler included, may read while the session's
//! thread replaces it: the closers of the rings shared with each peer, which a rejoin replaces.
//!
//! An [`Interrupter`](super::Interrupter) wakes every ring's consumer from a signal handler, so
//! reading must take no lock and allocate nothing; the watcher closes a dead peer's rings from
//! its own thread. When a peer rejoins, the session's thread puts the closers of the fresh rings
//! in its place, and the old ones (which keep the old rings mapped and the old eventfd open)
//! must not wait for the end of the session to be freed: a job that replaces a rank again and
//! again must not grow. They are freed by the next replacement that finds no reader counted
//! (or when the set drops), so at most the values of the last replacements are kept.
//!
//! # The protocol
//!
//! Each slot is an [`AtomicPtr`] to a boxed value (null for none). A reader counts itself in
//! `readers` for as long as it holds a [`Guard`]:
//!
//! ```text
//! reader:   I: readers.fetch_add(1, AcqRel); L: p = slot.load(Acquire); ... use *p ...;
//!           D: readers.fetch_sub(1, Release)
//! replacer: S: old = slot.swap(new, AcqRel); retire old;
//!           C: if readers.fetch_add(0, AcqRel) == 0 { free every retired value }
//! ```
//!
//! The replacer's look at `readers` is a read-modify-write (adding 0), not a load: that is what
//! makes acquire and release enough (a plain load would need `SeqCst` on all four, the
//! store-buffering pattern, which loom does not model).
//!
//! # Why no value is freed while a reader uses it
//!
//! Every operation on `readers` is a read-modify-write, so each reads the value just before it
//! in `readers`' modification order, and each continues the release sequence of those before
//! it. Every `D` comes after its own `I` in that order. Say `C` read 0; take any reader whose
//! `L` returned the old pointer `p`. The value `C` read counts the increments before `C` less
//! the decrements before it, so the reader's `I` and `D` are either both before `C` or both
//! after it:
//!
//! - both before: `C` reads from `D` or from a later read-modify-write, so `D` (Release)
//!   synchronises with `C` (Acquire), and everything the reader did with `p` happens before the
//!   free;
//! - both after: `I` reads from `C` or a later read-modify-write, so `C` (Release) synchronises
//!   with `I` (Acquire); the swap `S`, before `C`, then happens before `L`, which cannot read a
//!   value older than `S`'s: it read the new pointer, not `p`. So this case has no such reader.
//!
//! A count above 0 keeps the retired values for the next replacement, or for the drop of the
//! whole set.
//!
//! A signal handler that reads on the replacer's own thread runs to its end before the replacer
//! goes on: if it ran before the swap it is done; if after, it loads only the new pointer.
//!
//! `loom_a_replaced_value_is_freed_only_after_its_reader` checks the protocol with a value that
//! records its own drop.

use crate::sync::{AtomicPtr, AtomicUsize, Ordering};
use std::ptr::NonNull;
use std::sync::Mutex;

/// A value per index, replaceable while read (see the module docs).
pub(crate) struct Slots<T> {
    slots: Box<[AtomicPtr<T>]>,
    readers: AtomicUsize,
    /// Values replaced and not yet freed (a reader was counted when they were retired).
    retired: Mutex<Retired<T>>,
}

/// Replaced values, owned here alone (no slot points to them any more).
struct Retired<T>(Vec<NonNull<T>>);

// SAFETY: the pointers are owned boxes that only this set frees; moving them to another thread
// moves ownership of values that may be sent (`T: Send`).
unsafe impl<T: Send> Send for Retired<T> {}

// SAFETY: `Slots` owns boxed `T`s, handed out only as `&T` through a `Guard`; sending the set
// sends the values (`T: Send`), sharing it shares `&T` across threads (`T: Sync`).
unsafe impl<T: Send + Sync> Send for Slots<T> {}
// SAFETY: as for `Send`: every method takes `&self`, readers get `&T`, and a replacement's free
// waits until no reader counted (see the module docs).
unsafe impl<T: Send + Sync> Sync for Slots<T> {}

impl<T> Slots<T> {
    /// One slot per item.
    pub(crate) fn new(items: Vec<Option<T>>) -> Self {
        let slots = items
            .into_iter()
            .map(|item| AtomicPtr::new(item.map_or(std::ptr::null_mut(), into_raw)))
            .collect();
        Self {
            slots,
            readers: AtomicUsize::new(0),
            retired: Mutex::new(Retired(Vec::new())),
        }
    }

    /// How many slots there are.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Counts a reader in until the guard drops. Lock-free and async-signal-safe.
    pub(crate) fn read(&self) -> Guard<'_, T> {
        self.readers.fetch_add(1, Ordering::AcqRel);
        Guard { slots: self }
    }

    /// Puts `item` in slot `index`, and frees the values replaced so far if no reader is counted.
    /// Does nothing for an index out of range.
    pub(crate) fn replace(&self, index: usize, item: T) {
        let Some(slot) = self.slots.get(index) else {
            return;
        };
        let old = slot.swap(into_raw(item), Ordering::AcqRel);
        let mut retired = self
            .retired
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        retired.0.extend(NonNull::new(old));
        // A read-modify-write, not a load (see the module docs).
        if self.readers.fetch_add(0, Ordering::AcqRel) == 0 {
            for value in retired.0.drain(..) {
                // SAFETY: `value` came from `Box::into_raw`, no slot points to it any more (it
                // was swapped out before the count was read), and no reader that loaded it is
                // still counted (module docs); it is freed once, as it leaves `retired`.
                drop(unsafe { Box::from_raw(value.as_ptr()) });
            }
        }
    }
}

impl<T> Drop for Slots<T> {
    fn drop(&mut self) {
        let retired = std::mem::take(
            &mut self
                .retired
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0,
        );
        let current = self
            .slots
            .iter()
            .filter_map(|slot| NonNull::new(slot.load(Ordering::Acquire)));
        for value in retired.into_iter().chain(current.collect::<Vec<_>>()) {
            // SAFETY: with `&mut self` no reader holds a guard; every pointer came from
            // `Box::into_raw`, and each is in exactly one of the two lists.
            drop(unsafe { Box::from_raw(value.as_ptr()) });
        }
    }
}

impl<T> std::fmt::Debug for Slots<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("len", &self.slots.len())
            .finish_non_exhaustive()
    }
}

fn into_raw<T>(item: T) -> *mut T {
    Box::into_raw(Box::new(item))
}

/// A counted reader of [`Slots`]: the values it reads stay alive until it drops.
pub(crate) struct Guard<'a, T> {
    slots: &'a Slots<T>,
}

impl<'a, T> Guard<'a, T> {
    /// The value in slot `index`, if there is one.
    pub(crate) fn get(&self, index: usize) -> Option<&T> {
        let pointer = self.slots.slots.get(index)?.load(Ordering::Acquire);
        // SAFETY: a non-null pointer in a slot is a live box, and this guard is counted in
        // `readers`, so it is not freed before the guard drops (module docs); `&T` is all
        // anyone gets.
        unsafe { pointer.as_ref() }
    }

    /// Every value there is.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        (0..self.slots.slots.len()).filter_map(|index| self.get(index))
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        self.slots.readers.fetch_sub(1, Ordering::Release);
    }
}

/// The loom model of the protocol. Run with the liveness state's models (see `state`).
#[cfg(all(test, loom))]
mod loom_tests {
    use super::Slots;
    use loom::sync::atomic::{AtomicBool, Ordering};
    use loom::thread;
    use std::sync::Arc;

    /// A value that records its drop.
    struct Watched(Arc<AtomicBool>);

    impl Drop for Watched {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    /// A reader (the watcher, or a signal handler's interrupt) uses the value in a slot while
    /// the session's thread replaces it: the old value is never freed while the reader holds it,
    /// and once the reader is done, the next replacement (or the drop) frees it.
    #[test]
    fn loom_a_replaced_value_is_freed_only_after_its_reader() {
        loom::model(|| {
            let first = Arc::new(AtomicBool::new(false));
            let second = Arc::new(AtomicBool::new(false));
            let slots = Arc::new(Slots::new(vec![Some(Watched(Arc::clone(&first)))]));
            let reader = {
                let slots = Arc::clone(&slots);
                thread::spawn(move || {
                    let guard = slots.read();
                    let value = guard.get(0).expect("a slot is never emptied");
                    assert!(!value.0.load(Ordering::Relaxed), "read after free");
                })
            };
            slots.replace(0, Watched(Arc::clone(&second)));
            reader.join().unwrap();
            assert!(!second.load(Ordering::Relaxed));
            // The reader is gone: the next replacement frees whatever was retired.
            let third = Arc::new(AtomicBool::new(false));
            slots.replace(0, Watched(Arc::clone(&third)));
            assert!(first.load(Ordering::Relaxed) && second.load(Ordering::Relaxed));
            drop(slots);
            assert!(third.load(Ordering::Relaxed));
        });
    }
}
