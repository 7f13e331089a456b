//! Process fds: [`open`] gives an fd for a process that becomes readable when it exits and
//! cannot be confused with a later process of the same pid; [`getfd`] copies one of that
//! process's fds into this one, as the kernel's ptrace rules allow.

use nix::libc;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `pidfd_open(2)`: an fd for process `pid`.
///
/// # Errors
///
/// The system call's error (`ESRCH` when no such process exists).
pub fn open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; it touches no memory.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    owned(fd)
}

/// `pidfd_getfd(2)`: a close-on-exec copy of fd number `fd` of the process `pidfd` refers to.
///
/// # Errors
///
/// The system call's error: `EPERM` when this process may not ptrace that one (Yama, a
/// non-dumpable process, another uid), `EBADF` when it has no such fd, `ESRCH` when it exited.
pub fn getfd(pidfd: BorrowedFd<'_>, fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_getfd takes a pidfd, an fd number in that process and flags; it returns a
    // new fd in this process or -1, and touches no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    owned(fd)
}

/// The fd a system call returned, owned; or its error.
fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::{getfd, open};
    use std::os::fd::{AsFd, AsRawFd};

    #[test]
    fn this_process_can_take_its_own_fd_and_gets_the_same_file() {
        let me = open(i32::try_from(std::process::id()).unwrap()).unwrap();
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let copy = getfd(me.as_fd(), file.as_raw_fd()).unwrap();
        let (a, b) = (
            nix::sys::stat::fstat(&file).unwrap(),
            nix::sys::stat::fstat(&copy).unwrap(),
        );
        assert_eq!((a.st_dev, a.st_ino), (b.st_dev, b.st_ino));
        assert_ne!(file.as_raw_fd(), copy.as_raw_fd());
        assert_eq!(
            getfd(me.as_fd(), 1 << 20).unwrap_err().raw_os_error(),
            Some(nix::libc::EBADF)
        );
    }

    #[test]
    fn no_process_is_esrch() {
        assert_eq!(
            open(i32::MAX).unwrap_err().raw_os_error(),
            Some(nix::libc::ESRCH)
        );
    }
}
