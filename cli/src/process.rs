//! Starting helper processes that inherit file descriptors, and waiting for them with a deadline.
//!
//! [`spawn_with_fds`] puts the given fds at numbers 3, 4, ... in the child, which is how the demo
//! and the multi-process tests hand a ring to another process without a broker. The returned
//! [`ChildGuard`] kills and reaps the child if it is dropped before it was waited for, so no test
//! or command leaves a process behind on any path (`shmbroker run` supervises its copies with
//! it). Plumbing of the command and the tests, not of the library: `shmbroker` does not export it.

use nix::fcntl::{FcntlArg, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The fd number the first inherited fd gets in the child.
pub const FIRST_INHERITED_FD: RawFd = 3;

/// A child process that is killed and reaped if dropped while still running.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
    pidfd: OwnedFd,
    reaped: bool,
}

/// Spawns `command` with `fds[i]` open as fd `3 + i` in the child (and no other fd of ours).
///
/// # Errors
///
/// Any error from duplicating the fds, `fork`/`exec`, or `pidfd_open`.
pub fn spawn_with_fds(command: &mut Command, fds: &[BorrowedFd<'_>]) -> io::Result<ChildGuard> {
    let count =
        RawFd::try_from(fds.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // Copies numbered above every target, so that placing one can never overwrite another.
    let above_targets = FIRST_INHERITED_FD + count;
    let staged = fds
        .iter()
        .map(|fd| fcntl(fd, FcntlArg::F_DUPFD_CLOEXEC(above_targets)).map(raw_to_owned))
        .collect::<Result<Vec<OwnedFd>, _>>()?;
    let sources: Vec<RawFd> = staged.iter().map(AsRawFd::as_raw_fd).collect();
    let place_fds = move || {
        for (target, &source) in (FIRST_INHERITED_FD..).zip(&sources) {
            // dup2 clears close-on-exec on the target, so exactly these fds survive exec.
            // SAFETY: dup2 takes two ints; `source` is open (staged above), and replacing
            // `target` in the child's own table is the point.
            if unsafe { nix::libc::dup2(source, target) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: `place_fds` runs in the forked child before exec and calls only dup2, which is
    // async-signal-safe; it allocates nothing and touches no lock.
    let command = unsafe { command.pre_exec(place_fds) };
    let child = command.spawn()?;
    drop(staged);
    let pidfd = match shmbroker::sys::pidfd::open(child.id() as i32) {
        Ok(pidfd) => pidfd,
        Err(error) => {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
            return Err(error);
        }
    };
    Ok(ChildGuard {
        child,
        pidfd,
        reaped: false,
    })
}

fn raw_to_owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by F_DUPFD_CLOEXEC, so it is open and owned by no one else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

impl ChildGuard {
    /// The child's process id.
    #[must_use]
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The child's standard output, if it was piped.
    pub fn stdout(&mut self) -> Option<&mut std::process::ChildStdout> {
        self.child.stdout.as_mut()
    }

    /// Takes the child's standard output, if it was piped.
    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.stdout.take()
    }

    /// Takes the child's standard error, if it was piped.
    pub fn take_stderr(&mut self) -> Option<std::process::ChildStderr> {
        self.child.stderr.take()
    }

    /// Waits up to `timeout` for the child to exit. `Ok(None)`: still running at the deadline.
    ///
    /// # Errors
    ///
    /// Errors from `poll` or `waitpid`.
    pub fn wait_timeout(&mut self, timeout: Duration) -> io::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.reaped = true;
                return Ok(Some(status));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let millis = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.pidfd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(millis)) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Waits up to `timeout`; if the child is still running then, kills it and reports that.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::TimedOut`] naming the child when it had to be killed; errors from
    /// `poll` or `waitpid`.
    pub fn wait_or_kill(mut self, timeout: Duration) -> io::Result<ExitStatus> {
        match self.wait_timeout(timeout)? {
            Some(status) => Ok(status),
            None => {
                self.kill();
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "child {} still running after {timeout:?}; killed it",
                        self.id()
                    ),
                ))
            }
        }
    }

    /// Sends SIGKILL and reaps the child.
    pub fn kill(&mut self) {
        if !self.reaped {
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
            let _ = self.child.wait();
            self.reaped = true;
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Which inherited fds this process has taken ownership of, one bit per index.
static TAKEN: AtomicU64 = AtomicU64::new(0);

/// The fd at `FIRST_INHERITED_FD + index` in a process started by [`spawn_with_fds`], taking
/// ownership of it. Each index can be taken once per process.
///
/// # Errors
///
/// [`io::ErrorKind::NotFound`] when that fd is not open, [`io::ErrorKind::AlreadyExists`] when
/// it was taken before, [`io::ErrorKind::InvalidInput`] for an index of 64 or more.
pub fn inherited_fd(index: usize) -> io::Result<OwnedFd> {
    if index >= 64 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let fd = FIRST_INHERITED_FD + index as RawFd;
    if TAKEN.fetch_or(1 << index, Ordering::AcqRel) & (1 << index) != 0 {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("inherited fd {fd} was already taken"),
        ));
    }
    // SAFETY: F_GETFD only inspects the descriptor table entry; any int is a valid argument.
    let open = unsafe { nix::libc::fcntl(fd, nix::libc::F_GETFD) } >= 0;
    if !open {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("fd {fd} was not inherited"),
        ));
    }
    // Mark it close-on-exec so it does not leak into this process's own children.
    // SAFETY: as above, fd is open; F_SETFD changes only its flags.
    unsafe { nix::libc::fcntl(fd, nix::libc::F_SETFD, nix::libc::FD_CLOEXEC) };
    // SAFETY: the fd is open and was placed here for this process by its parent, and the `TAKEN`
    // bit just claimed guarantees no other `OwnedFd` for it was made through this function.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
