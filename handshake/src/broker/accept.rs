//! Accepting connections: who is calling (credentials, pidfd, caps per uid), reading each logon
//! frame against its own deadline, and refusing what cannot be served.

use super::{ACCEPT_BACKOFF, Event, Listener, Pending, RateLimit};
use crate::error::{Error, ProtocolError, io_errno};
use crate::wire::LOGON_LEN;
use nix::errno::Errno;
use nix::sys::socket::sockopt;
use shmbroker_bindings::{RejectReason, ReplyHeader};
use shmbroker_sys::fdpass::send_with_fds;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

impl Listener {
    /// Serves a logon on a stream connected some other way than through this listener's socket
    /// (a socketpair, or a socket inherited from a launcher), with the same checks and deadline.
    pub fn adopt(&mut self, stream: UnixStream) -> Vec<Event> {
        let mut events = Vec::new();
        self.admit(stream, &mut events);
        events
    }

    pub(super) fn accept_all(&mut self, events: &mut Vec<Event>) -> Result<(), Error> {
        loop {
            let stream = match self.socket.accept() {
                Ok((stream, _)) => stream,
                Err(error) if error.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                // The caller vanished between connect and accept (skip it), or fds or memory ran
                // out (pause accepting rather than spin on a socket that stays readable). Either
                // way, everyone already connected is still served.
                Err(error) => {
                    let exhausted = matches!(
                        error.raw_os_error(),
                        Some(
                            nix::libc::EMFILE
                                | nix::libc::ENFILE
                                | nix::libc::ENOBUFS
                                | nix::libc::ENOMEM
                        )
                    );
                    if exhausted {
                        self.accept_paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                    }
                    events.push(Event::Rejected {
                        reason: RejectReason::Internal,
                        pid: None,
                        detail: format!("accept failed: {error}"),
                    });
                    if exhausted {
                        return Ok(());
                    }
                    continue;
                }
            };
            self.admit(stream, events);
        }
    }

    /// Checks who is calling and queues the connection for its logon frame.
    pub(super) fn admit(&mut self, stream: UnixStream, events: &mut Vec<Event>) {
        let Ok(credentials) = nix::sys::socket::getsockopt(&stream, sockopt::PeerCredentials)
        else {
            return;
        };
        let (pid, uid) = (credentials.pid(), credentials.uid());
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        // The caller's process, from the connection itself: the pid alone could be reused by
        // the time anyone looks.
        let pidfd = match peer_pidfd(&stream, pid) {
            Ok(pidfd) => pidfd,
            Err(errno) => {
                let text = format!("no pidfd for the caller (pid {pid}): {errno}");
                self.refuse(&stream, RejectReason::Internal, (pid, uid), text, events);
                return;
            }
        };
        let allowed = if self.config.allowed_uids.is_empty() {
            uid == self.my_uid
        } else {
            self.config.allowed_uids.contains(&uid)
        };
        if !allowed {
            let text = format!(
                "uid {uid} may not log on (allowed: {})",
                if self.config.allowed_uids.is_empty() {
                    format!("the broker's own uid {}", self.my_uid)
                } else {
                    format!("{:?}", self.config.allowed_uids)
                }
            );
            self.refuse(&stream, RejectReason::NotAllowed, (pid, uid), text, events);
            return;
        }
        // Room for the newcomer: past a cap, the oldest connection of that uid (or of anyone,
        // for the overall cap) that has sent nothing yet goes, or failing that the oldest one
        // still short of a whole frame (a real worker sends its 32 bytes at once; one that sits
        // on a part of them must not lock everyone else out).
        let of_uid = self.pending.iter().filter(|p| p.uid == uid).count();
        let evict = if of_uid >= self.config.max_pending_per_uid {
            Some(Some(uid))
        } else if self.pending.len() >= self.config.max_pending {
            Some(None)
        } else {
            None
        };
        if let Some(which) = evict {
            let candidates: Vec<usize> = (0..self.pending.len())
                .filter(|&i| which.is_none_or(|uid| self.pending[i].uid == uid))
                .collect();
            let deadline = |i: &usize| self.pending[*i].deadline;
            let oldest_idle = candidates
                .iter()
                .copied()
                .filter(|&i| self.pending[i].filled == 0)
                .min_by_key(deadline);
            let oldest = oldest_idle.or_else(|| candidates.iter().copied().min_by_key(deadline));
            if let Some(index) = oldest {
                let old = self.pending.remove(index);
                let text = format!(
                    "dropped after {} of {LOGON_LEN} bytes: the oldest connection still logging on \
                     made room for a new one",
                    old.filled
                );
                self.refuse(
                    &old.stream,
                    RejectReason::Deadline,
                    (old.pid, old.uid),
                    text,
                    events,
                );
            }
        }
        self.pending.push(Pending {
            stream,
            pid,
            uid,
            pidfd,
            deadline: crate::client::deadline_after(self.config.logon_timeout),
            frame: [0; LOGON_LEN],
            filled: 0,
        });
    }

    /// Refuses a connection with `reason`, reports it, and logs it unless that uid has had its
    /// share of log lines this second.
    pub(super) fn refuse(
        &mut self,
        stream: &UnixStream,
        reason: RejectReason,
        (pid, uid): (i32, u32),
        detail: String,
        events: &mut Vec<Event>,
    ) {
        if let Some(suppressed) = self
            .rejections
            .entry(uid)
            .or_default()
            .allow(Instant::now())
        {
            tracing::warn!(pid, uid, ?reason, suppressed, "refused a logon: {detail}");
        }
        events.push(reject(stream, reason, Some(pid), detail));
    }

    pub(super) fn read_pending(&mut self, index: usize, events: &mut Vec<Event>) {
        let pending = &mut self.pending[index];
        loop {
            match pending.stream.read(&mut pending.frame[pending.filled..]) {
                Ok(0) => {
                    let pending = self.pending.remove(index);
                    let detail = ProtocolError::Truncated {
                        expected: LOGON_LEN,
                        found: pending.filled,
                    }
                    .to_string();
                    let who = (pending.pid, pending.uid);
                    self.refuse(
                        &pending.stream,
                        RejectReason::Truncated,
                        who,
                        detail,
                        events,
                    );
                    return;
                }
                Ok(n) => {
                    pending.filled += n;
                    if pending.filled == LOGON_LEN {
                        let pending = self.pending.remove(index);
                        self.log_on(pending, events);
                        return;
                    }
                }
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(error) if error.kind() == ErrorKind::WouldBlock => return,
                Err(_) => {
                    drop(self.pending.remove(index));
                    return;
                }
            }
        }
    }

    pub(super) fn expire_pending(&mut self, events: &mut Vec<Event>) {
        let now = Instant::now();
        let mut index = 0;
        while index < self.pending.len() {
            if self.pending[index].deadline <= now {
                let pending = self.pending.remove(index);
                let detail = format!(
                    "no whole logon frame within {:?} ({} of {LOGON_LEN} bytes arrived)",
                    self.config.logon_timeout, pending.filled
                );
                let who = (pending.pid, pending.uid);
                self.refuse(&pending.stream, RejectReason::Deadline, who, detail, events);
            } else {
                index += 1;
            }
        }
    }

    /// Whether a line about a logon or departure by `uid` may be logged now (a burst of two a
    /// second per rank of the world), and how many were left out before it.
    pub(super) fn allow_coming(&mut self, uid: u32) -> Option<u64> {
        let burst = 2 * self.config.world_size + RateLimit::BURST;
        self.comings
            .entry(uid)
            .or_default()
            .allow_burst(Instant::now(), burst)
    }
}

/// Sends a rejection (best effort: the caller may be gone) and reports it.
pub(super) fn reject(
    stream: &UnixStream,
    reason: RejectReason,
    pid: Option<i32>,
    detail: String,
) -> Event {
    let header = ReplyHeader::rejection(reason, &detail);
    let _ = send_with_fds(stream.as_fd(), &[bytemuck::bytes_of(&header)], &[]);
    Event::Rejected {
        reason,
        pid,
        detail,
    }
}

/// A pidfd for the process at the other end of `stream`: `SO_PEERPIDFD` (Linux 6.5), which names
/// the process that connected whatever happened since; on older kernels `pidfd_open` of the
/// `SO_PEERCRED` pid, taken at accept.
pub(super) fn peer_pidfd(stream: &UnixStream, pid: i32) -> Result<OwnedFd, Errno> {
    use std::os::fd::FromRawFd;
    const SO_PEERPIDFD: nix::libc::c_int = 77;
    let mut fd: nix::libc::c_int = -1;
    let mut len = size_of::<nix::libc::c_int>() as nix::libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes (one int) to `fd` and the new length to
    // `len`, both live locals; the socket fd is open for the call.
    let result = unsafe {
        nix::libc::getsockopt(
            stream.as_raw_fd(),
            nix::libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&raw mut fd).cast(),
            &raw mut len,
        )
    };
    if result == 0 && fd >= 0 {
        // SAFETY: the kernel just installed this fd for us; nothing else owns it.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    shmbroker_sys::pidfd::open(pid).map_err(|e| io_errno(&e))
}
