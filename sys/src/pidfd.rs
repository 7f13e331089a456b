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

/// Who a pidfd names, from `/proc/self/fdinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Named {
    /// A process: its pid in each PID namespace from the one of this process's `/proc` down to
    /// its own (the `NSpid:` line; one entry where namespaces are not nested). The first is the
    /// number this process would use, the last the one the process itself sees from `getpid`.
    Process(Vec<i32>),
    /// A process in a PID namespace this `/proc` cannot see into (a sibling container's): the
    /// kernel shows its pid as 0. The pidfd still names it, and shows its exit.
    Elsewhere,
    /// A process that has exited and been reaped (`Pid: -1`).
    Reaped,
}

/// What `fd` names if it is a pidfd (`None`: not a pidfd, or no `/proc` to ask).
#[must_use]
pub fn named(fd: BorrowedFd<'_>) -> Option<Named> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name))
            .map(|value| {
                value
                    .split_whitespace()
                    .map(str::parse::<i32>)
                    .collect::<Result<Vec<_>, _>>()
            })
    };
    let pid = field("Pid:")?.ok()?;
    Some(match pid.as_slice() {
        [-1] => Named::Reaped,
        [0] => Named::Elsewhere,
        [_] => match field("NSpid:") {
            Some(Ok(nspid)) if !nspid.is_empty() => Named::Process(nspid),
            _ => Named::Process(pid),
        },
        _ => return None,
    })
}

/// Whether the process `pidfd` names is stopped (`SIGSTOP`, `SIGTSTP`, a debugger: state `T` or
/// `t` in `/proc/PID/stat`). `false` when that cannot be read: a process this `/proc` cannot
/// see, one that has exited. The pid is read from the pidfd and the pidfd is checked again after
/// `/proc` is read, so a pid reused meanwhile is never taken for the process.
#[must_use]
pub fn stopped(pidfd: BorrowedFd<'_>) -> bool {
    let Some(Named::Process(pids)) = named(pidfd) else {
        return false;
    };
    let Some(stat) = pids
        .first()
        .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
    else {
        return false;
    };
    let state = stat_state(&stat);
    matches!(state, Some('T' | 't')) && matches!(named(pidfd), Some(Named::Process(_)))
}

/// The state letter of a `/proc/PID/stat` line: the first field after the command name, which
/// is in parentheses and may itself hold spaces and parentheses.
fn stat_state(stat: &str) -> Option<char> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().next()?.chars().next()
}

/// Whether process `pid` (a number in this process's PID namespace, as `SO_PEERCRED` gives it;
/// 0 for a process this namespace cannot see) is in this process's PID namespace: then pid
/// numbers it reports mean the same here. `false` when that cannot be read.
#[must_use]
pub fn same_pid_namespace(pid: i32) -> bool {
    use std::os::unix::fs::MetadataExt;
    if pid <= 0 {
        return false;
    }
    let inode = |path: String| std::fs::metadata(path).map(|m| (m.dev(), m.ino())).ok();
    match (
        inode("/proc/self/ns/pid".into()),
        inode(format!("/proc/{pid}/ns/pid")),
    ) {
        (Some(mine), Some(theirs)) => mine == theirs,
        _ => false,
    }
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
    use super::{getfd, open, stat_state, stopped};

    #[test]
    fn a_stopped_child_reads_stopped_and_a_running_one_does_not() {
        let signal = |name: &str, pid: i32| {
            let status = std::process::Command::new("kill")
                .args([name, &pid.to_string()])
                .status()
                .unwrap();
            assert!(status.success());
        };
        /// Kills and reaps the child however the test ends (a stopped child would stay).
        struct Reaped(std::process::Child);
        impl Drop for Reaped {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let mut child = Reaped(
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap(),
        );
        let pid = i32::try_from(child.0.id()).unwrap();
        let pidfd = open(pid).unwrap();
        assert!(!stopped(pidfd.as_fd()));
        signal("-STOP", pid);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !stopped(pidfd.as_fd()) {
            assert!(
                std::time::Instant::now() < deadline,
                "never read as stopped"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        signal("-CONT", pid);
        child.0.kill().unwrap();
        child.0.wait().unwrap();
        assert!(!stopped(pidfd.as_fd()), "a reaped process is not stopped");
    }

    #[test]
    fn the_state_follows_a_command_name_with_parentheses_and_spaces() {
        assert_eq!(stat_state("42 (a) b) T 1 2"), Some('T'));
        assert_eq!(stat_state("42 (sleep) S 1 2"), Some('S'));
        assert_eq!(stat_state("garbage"), None);
    }
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
