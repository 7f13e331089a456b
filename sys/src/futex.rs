//! `futex(2)` on a word of shared memory: [`wait`] sleeps while the word holds a value, [`wake`]
//! wakes sleepers. Both use the shared (not `FUTEX_PRIVATE_FLAG`) form, so a process can wake
//! another through a word they both map.
//!
//! A futex is only a place to sleep: every protocol built on it keeps its state in the word (or
//! beside it) and re-checks it after every return, since a wait also returns on a signal, a
//! spurious wake-up, a value that changed before it slept, or its timeout.

use nix::libc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `word` holds `expected`, for at most `timeout` (forever with `None`). Returns
/// when woken, when the word did not hold `expected`, on a signal, or at the timeout: the caller
/// tells them apart by re-checking its state.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let timespec = timeout.map(|timeout| libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos()),
    });
    let timespec_ptr = timespec
        .as_ref()
        .map_or(core::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT only reads the 4-byte aligned word, which `word` keeps alive for the
    // call, and the timespec, which lives on this stack frame. Its result is deliberately
    // ignored: woken, EAGAIN, EINTR and ETIMEDOUT all mean "re-check".
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            timespec_ptr,
        )
    };
}

/// Wakes up to `waiters` processes or threads sleeping in [`wait`] on `word`; returns how many
/// it woke.
pub fn wake(word: &AtomicU32, waiters: u32) -> usize {
    let waiters = i32::try_from(waiters).unwrap_or(i32::MAX);
    // SAFETY: FUTEX_WAKE only uses the word's address as a key; it never reads or writes it.
    let woken = unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, waiters) };
    usize::try_from(woken).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::{wait, wake};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{Duration, Instant};

    #[test]
    fn a_wait_returns_at_once_when_the_word_differs_and_at_its_timeout_otherwise() {
        let word = AtomicU32::new(1);
        let start = Instant::now();
        wait(&word, 0, Some(Duration::from_secs(10)));
        assert!(start.elapsed() < Duration::from_secs(5));
        let start = Instant::now();
        wait(&word, 1, Some(Duration::from_millis(20)));
        assert!(start.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn a_wake_ends_a_wait() {
        let word = Arc::new(AtomicU32::new(0));
        let sleeper = {
            let word = Arc::clone(&word);
            std::thread::spawn(move || {
                while word.load(Ordering::Acquire) == 0 {
                    wait(&word, 0, Some(Duration::from_secs(10)));
                }
            })
        };
        std::thread::sleep(Duration::from_millis(10));
        word.store(1, Ordering::Release);
        wake(&word, u32::MAX);
        sleeper.join().unwrap();
    }
}
