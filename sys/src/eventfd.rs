//! Eventfds: a counter in the kernel that `poll`/`epoll` report readable while it is non-zero.
//! shmbroker uses one per worker as its *readiness* fd: peers [`signal`] it when a message waits
//! for a worker that said it is about to sleep, and the worker [`drain`]s it once awake.
//!
//! Every eventfd made here is non-blocking and close-on-exec, so neither [`signal`] nor
//! [`drain`] ever blocks.

use nix::errno::Errno;
use nix::sys::eventfd::{EfdFlags, EventFd};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

/// A new eventfd with a zero count (non-blocking, close-on-exec).
///
/// # Errors
///
/// The OS error (`EMFILE`, `ENFILE`, `ENOMEM`).
pub fn create() -> io::Result<OwnedFd> {
    let fd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
    Ok(OwnedFd::from(fd))
}

/// Adds 1 to the count, making the fd readable. A count already at its maximum stays readable
/// (the write's `EAGAIN` is ignored), and so does any other failure: a signal is a hint that the
/// waiter re-checks.
pub fn signal(fd: BorrowedFd<'_>) {
    let _ = nix::unistd::write(fd, &1u64.to_ne_bytes());
}

/// Resets the count to zero; returns what it was (0 when nothing signalled it since).
pub fn drain(fd: BorrowedFd<'_>) -> u64 {
    let mut count = [0u8; 8];
    match nix::unistd::read(fd, &mut count) {
        Ok(8) => u64::from_ne_bytes(count),
        _ => 0,
    }
}

/// Waits up to `timeout` for `fd` to become readable (forever with `None`); returns whether it
/// is. A signal that interrupts the wait returns `false` early: callers re-check and wait again.
///
/// # Errors
///
/// The OS error of `poll` other than `EINTR`.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let timeout = match timeout {
        None => PollTimeout::NONE,
        // Round up, so that a short remainder does not become a busy poll with timeout 0.
        Some(left) => {
            let millis = left.as_micros().div_ceil(1000);
            PollTimeout::try_from(millis.min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX)
        }
    };
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    match poll(&mut fds, timeout) {
        Ok(ready) => Ok(ready > 0),
        Err(Errno::EINTR) => Ok(false),
        Err(errno) => Err(errno.into()),
    }
}

/// Whether `fd` is an eventfd (its `/proc/self/fd` link reads `anon_inode:[eventfd]`): checked
/// before a process writes to an fd another process handed it as one.
#[must_use]
pub fn is_eventfd(fd: BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()))
        .is_ok_and(|target| target.as_os_str() == "anon_inode:[eventfd]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_makes_it_readable_and_drain_resets_it() {
        let fd = create().unwrap();
        assert!(is_eventfd(fd.as_fd()));
        assert!(!wait_readable(fd.as_fd(), Some(Duration::ZERO)).unwrap());
        assert_eq!(drain(fd.as_fd()), 0, "a fresh eventfd has nothing to drain");
        signal(fd.as_fd());
        signal(fd.as_fd());
        assert!(wait_readable(fd.as_fd(), Some(Duration::from_secs(5))).unwrap());
        assert_eq!(drain(fd.as_fd()), 2, "two signals");
        assert!(!wait_readable(fd.as_fd(), Some(Duration::from_millis(1))).unwrap());
    }

    #[test]
    fn other_fds_are_not_eventfds() {
        let file = std::fs::File::open("/proc/self/status").unwrap();
        assert!(!is_eventfd(file.as_fd()));
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(!is_eventfd(a.as_fd()));
    }
}
