//! The broker's side: [`Listener`] accepts logons and hands every worker its fds.
//!
//! One thread runs [`Listener::serve`] (or [`Listener::poll_once`] in a loop of the caller's).
//! It sleeps in `poll(2)` on the listening socket, every connection still logging on, every
//! logged-on worker's socket and a stop eventfd, and never spins. Each connection mid-logon has
//! its own deadline and its own buffer, so a client that is slow or silent delays nobody: it is
//! dropped with a `Deadline` rejection when its time is up, and every other connection is served
//! as soon as its bytes arrive.
//!
//! Rings are created when the first of their two ends logs on and handed to the second when it
//! does. The broker keeps every ring's fd, for liveness: a worker that leaves on purpose says
//! goodbye on its socket first (its `Session` does so when dropped), and the broker then closes
//! only that worker's rings. A socket that closes without a goodbye is a worker that died
//! (killed, crashed): the broker closes *every* ring of the session with the lost rank as cause
//! ([`shmbroker_queues::close`]), waking every parked waiter, so that nobody waits on a peer that
//! is itself waiting on the dead one; each survivor learns which rank was lost from any ring.
//! The rings are closed one after another, so a call that races the closing may still go
//! through on a ring not yet reached (as a call just before the death would have); the next
//! call on it reports the loss.
//!
//! Each worker publishes its outbox once logged on (an `Outbox` notice with the memfd). The broker
//! checks that its seals keep everyone but the owner from writing or resizing it, passes it to every
//! other logged-on worker (`PeerOutbox`), and to each worker that logs on later right after its
//! reply, so every worker gets every peer's outbox once. Passing one is a non-blocking send on the
//! worker's socket; one that fails (a full socket) is reported as a `BadNotice` event, and that
//! worker's first large receive from the owner then ends at its deadline.

use crate::error::{Error, ProtocolError};
use crate::fdpass::{recv_with_fds, send_with_fds};
use crate::wire::{LOGON_LEN, MAX_WORLD_SIZE, decode_logon, manifest_order};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{AddressFamily, Backlog, SockFlag, SockType, UnixAddr, sockopt};
use shmbroker_bindings::{
    ANY_RANK, FdRole, ManifestEntry, Message, NOTICE_MAGIC, NoticeKind, PROTOCOL_VERSION,
    REPLY_MAGIC, RING_LAYOUT_VERSION, RejectReason, ReplyHeader, WorkerNotice,
};
use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a broker serves, and the limits it holds logons to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Ranks in the world, 1 to [`MAX_WORLD_SIZE`].
    pub world_size: u32,
    /// Slots in every ring: a power of two from 2 to 65536.
    pub ring_capacity: u32,
    /// How long a connection may take from accept to a whole logon frame.
    pub logon_timeout: Duration,
    /// Uids allowed to log on; empty means only the broker's own uid.
    pub allowed_uids: Vec<u32>,
    /// Connections mid-logon at once; more are refused at accept.
    pub max_pending: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            world_size: 4,
            ring_capacity: 1024,
            logon_timeout: Duration::from_secs(5),
            allowed_uids: Vec::new(),
            max_pending: 256,
        }
    }
}

impl Config {
    fn validate(&self) -> Result<(), Error> {
        let invalid = |field, reason: String| Err(Error::InvalidConfig { field, reason });
        if self.world_size == 0 || self.world_size > MAX_WORLD_SIZE {
            return invalid(
                "world_size",
                format!("must be 1 to {MAX_WORLD_SIZE}, got {}", self.world_size),
            );
        }
        if !self.ring_capacity.is_power_of_two() || !(2..=65536).contains(&self.ring_capacity) {
            return invalid(
                "ring_capacity",
                format!(
                    "must be a power of two from 2 to 65536, got {}",
                    self.ring_capacity
                ),
            );
        }
        if self.logon_timeout.is_zero() {
            return invalid("logon_timeout", "must be more than zero".into());
        }
        if self.max_pending == 0 {
            return invalid("max_pending", "must be at least 1".into());
        }
        Ok(())
    }
}

/// Something the broker did, for logs and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A worker logged on.
    LoggedOn {
        /// Its rank.
        rank: u32,
        /// Its pid (from `SO_PEERCRED`).
        pid: i32,
        /// Its uid.
        uid: u32,
    },
    /// A connection was refused.
    Rejected {
        /// Why.
        reason: RejectReason,
        /// The caller's pid, when known.
        pid: Option<i32>,
        /// Details.
        detail: String,
    },
    /// A logged-on worker's socket closed. After a goodbye (`clean`), the broker closed the
    /// worker's own rings; without one the worker died, and the broker closed every ring of the
    /// session with the lost rank as cause, ending the session for everyone.
    WorkerLeft {
        /// Its rank.
        rank: u32,
        /// Its pid.
        pid: i32,
        /// Whether it said goodbye first.
        clean: bool,
        /// How many rings were closed.
        rings_closed: usize,
    },
    /// A logged-on worker sent bytes that are not a notice; they were ignored.
    BadNotice {
        /// Its rank.
        rank: u32,
        /// What arrived.
        detail: String,
    },
    /// [`StopHandle::stop`] was called.
    Stopped,
}

/// Stops a [`Listener`] from another thread (or a signal-handling thread).
#[derive(Clone, Debug)]
pub struct StopHandle(Arc<EventFd>);

impl StopHandle {
    /// Makes the listener's `serve` return, and its next `poll_once` report [`Event::Stopped`].
    pub fn stop(&self) {
        let _ = self.0.write(1);
    }
}

struct Pending {
    stream: UnixStream,
    pid: i32,
    uid: u32,
    deadline: Instant,
    frame: [u8; LOGON_LEN],
    filled: usize,
}

struct Worker {
    stream: Option<UnixStream>,
    pid: i32,
    /// Bytes of the notice being received.
    notice: [u8; size_of::<WorkerNotice>()],
    filled: usize,
    /// Fds received and not yet claimed by a `RelayFd` notice.
    fds: VecDeque<OwnedFd>,
    said_goodbye: bool,
    /// The worker's outbox, once published; passed to every worker that logs on later.
    outbox: Option<OwnedFd>,
    /// Held for the liveness checks built on top of the handshake.
    _pidfd: Option<OwnedFd>,
}

/// A broker's listening socket and everything it has handed out.
pub struct Listener {
    socket: UnixListener,
    path: PathBuf,
    /// `(st_dev, st_ino)` of the socket file this listener created, so that drop removes only it.
    identity: (u64, u64),
    config: Config,
    my_uid: u32,
    pending: Vec<Pending>,
    workers: Vec<Option<Worker>>,
    /// Rings created for a pair `(from, to)`, kept until one of their ends leaves.
    rings: HashMap<(u32, u32), OwnedFd>,
    stop: Arc<EventFd>,
    /// The rank whose death ended the session, if one did.
    lost: Option<u32>,
    /// After `accept` failed for want of fds or memory, the listening socket stays readable;
    /// it is left out of the poll until this instant instead of spinning on it.
    accept_paused_until: Option<Instant>,
}

/// Fds a worker may send the broker ahead of the notices that claim them.
const MAX_UNCLAIMED_FDS: usize = 16;

/// How long accepting pauses after `accept` fails for want of resources.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("path", &self.path)
            .field("config", &self.config)
            .field("pending", &self.pending.len())
            .field("logged_on", &self.logged_on().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// Listens on `path` (mode 0600).
    ///
    /// A socket file left by a broker that is gone is replaced; one a live broker listens on is
    /// not (its connect succeeds); a path that is not a socket is never touched.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`], [`Error::AddressInUse`], [`Error::NotASocket`], [`Error::Sys`].
    pub fn bind(path: impl AsRef<Path>, config: Config) -> Result<Self, Error> {
        config.validate()?;
        let path = path.as_ref().to_path_buf();
        remove_stale_socket(&path)?;
        let socket = nix::sys::socket::socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(Error::sys("socket"))?;
        // Linux creates the socket file with the socket inode's mode (less the umask), so setting
        // it before bind leaves no moment in which the file is more open than 0600.
        nix::sys::stat::fchmod(&socket, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(Error::sys("fchmod"))?;
        let address = UnixAddr::new(&path).map_err(Error::sys("socket path"))?;
        nix::sys::socket::bind(socket.as_raw_fd(), &address).map_err(|source| {
            if source == Errno::EADDRINUSE {
                Error::AddressInUse { path: path.clone() }
            } else {
                Error::Sys { op: "bind", source }
            }
        })?;
        nix::sys::socket::listen(&socket, Backlog::new(128).unwrap_or(Backlog::MAXCONN))
            .map_err(Error::sys("listen"))?;
        let metadata =
            std::fs::symlink_metadata(&path).map_err(|e| Error::sys("stat")(io_errno(&e)))?;
        let stop = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(Error::sys("eventfd"))?;
        raise_fd_limit();
        Ok(Self {
            socket: UnixListener::from(socket),
            path,
            identity: (metadata.dev(), metadata.ino()),
            workers: (0..config.world_size).map(|_| None).collect(),
            config,
            my_uid: nix::unistd::getuid().as_raw(),
            pending: Vec::new(),
            rings: HashMap::new(),
            stop: Arc::new(stop),
            lost: None,
            accept_paused_until: None,
        })
    }

    /// The socket path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The configuration served.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A handle that stops [`Self::serve`] from another thread.
    #[must_use]
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(Arc::clone(&self.stop))
    }

    /// Ranks that have logged on (including any whose worker has left since).
    pub fn logged_on(&self) -> impl Iterator<Item = u32> + '_ {
        (0..)
            .zip(&self.workers)
            .filter_map(|(rank, w)| w.as_ref().map(|_| rank))
    }

    /// The rank whose death ended the session, if one did. Logons are refused from then on.
    #[must_use]
    pub fn lost_rank(&self) -> Option<u32> {
        self.lost
    }

    /// Connections accepted and still logging on.
    #[must_use]
    pub fn pending_logons(&self) -> usize {
        self.pending.len()
    }

    /// Serves logons until [`StopHandle::stop`], reporting each [`Event`] to `on_event`.
    ///
    /// # Errors
    ///
    /// [`Error::Sys`] if polling or accepting fails for a reason other than a signal.
    pub fn serve(&mut self, mut on_event: impl FnMut(&Event)) -> Result<(), Error> {
        loop {
            for event in self.poll_once(Duration::from_secs(3600))? {
                on_event(&event);
                if event == Event::Stopped {
                    return Ok(());
                }
            }
        }
    }

    /// Waits up to `timeout` (less if a logon deadline comes sooner) for something to do, does
    /// it, and returns what happened.
    ///
    /// # Errors
    ///
    /// [`Error::Sys`] if `poll` fails for a reason other than a signal.
    pub fn poll_once(&mut self, timeout: Duration) -> Result<Vec<Event>, Error> {
        let now = Instant::now();
        if self.accept_paused_until.is_some_and(|until| until <= now) {
            self.accept_paused_until = None;
        }
        let wait = self
            .pending
            .iter()
            .map(|p| p.deadline)
            .chain(self.accept_paused_until)
            .map(|at| at.saturating_duration_since(now))
            .fold(timeout, Duration::min);
        let (listener_ready, stop_ready, pending_ready, workers_ready) = self.wait(wait)?;
        let mut events = Vec::new();
        for index in (0..pending_ready.len()).rev() {
            if pending_ready[index] {
                self.read_pending(index, &mut events);
            }
        }
        for (rank, ready) in workers_ready.into_iter().enumerate() {
            if ready {
                self.read_worker(rank, &mut events);
            }
        }
        if listener_ready && !stop_ready {
            self.accept_all(&mut events)?;
        }
        self.expire_pending(&mut events);
        // Last, so that what arrived together with the stop (a worker leaving, say) is reported.
        if stop_ready {
            let _ = self.stop.read();
            events.push(Event::Stopped);
        }
        Ok(events)
    }

    /// Polls every socket; returns which are readable.
    fn wait(&self, timeout: Duration) -> Result<(bool, bool, Vec<bool>, Vec<bool>), Error> {
        let readable = PollFlags::POLLIN;
        // While accepting is paused the listening socket is polled for nothing.
        let listen_for = if self.accept_paused_until.is_some() {
            PollFlags::empty()
        } else {
            readable
        };
        let mut fds = vec![
            PollFd::new(self.socket.as_fd(), listen_for),
            PollFd::new(self.stop.as_fd(), readable),
        ];
        fds.extend(
            self.pending
                .iter()
                .map(|p| PollFd::new(p.stream.as_fd(), readable)),
        );
        let worker_streams: Vec<Option<BorrowedFd<'_>>> = self
            .workers
            .iter()
            .map(|w| w.as_ref().and_then(|w| w.stream.as_ref()).map(AsFd::as_fd))
            .collect();
        fds.extend(
            worker_streams
                .iter()
                .flatten()
                .map(|fd| PollFd::new(*fd, readable)),
        );
        let millis = timeout.as_millis().min(i32::MAX as u128) as i32;
        let millis = u16::try_from(millis).unwrap_or(u16::MAX);
        match poll(&mut fds, PollTimeout::from(millis)) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(source) => return Err(Error::Sys { op: "poll", source }),
        }
        let woke = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
        let listener_ready = woke(&fds[0]);
        let stop_ready = woke(&fds[1]);
        let pending_ready = fds[2..2 + self.pending.len()].iter().map(woke).collect();
        let mut worker_fds = fds[2 + self.pending.len()..].iter();
        let workers_ready = worker_streams
            .iter()
            .map(|stream| stream.is_some() && worker_fds.next().is_some_and(woke))
            .collect();
        Ok((listener_ready, stop_ready, pending_ready, workers_ready))
    }

    /// Serves a logon on a stream connected some other way than through this listener's socket
    /// (a socketpair, or a socket inherited from a launcher), with the same checks and deadline.
    pub fn adopt(&mut self, stream: UnixStream) -> Vec<Event> {
        let mut events = Vec::new();
        self.admit(stream, &mut events);
        events
    }

    fn accept_all(&mut self, events: &mut Vec<Event>) -> Result<(), Error> {
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
    fn admit(&mut self, stream: UnixStream, events: &mut Vec<Event>) {
        let Ok(credentials) = nix::sys::socket::getsockopt(&stream, sockopt::PeerCredentials)
        else {
            return;
        };
        let (pid, uid) = (credentials.pid(), credentials.uid());
        if stream.set_nonblocking(true).is_err() {
            return;
        }
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
            events.push(reject(&stream, RejectReason::NotAllowed, Some(pid), text));
            return;
        }
        if self.pending.len() >= self.config.max_pending {
            let text = format!("{} logons already in progress", self.pending.len());
            events.push(reject(&stream, RejectReason::Internal, Some(pid), text));
            return;
        }
        self.pending.push(Pending {
            stream,
            pid,
            uid,
            deadline: Instant::now() + self.config.logon_timeout,
            frame: [0; LOGON_LEN],
            filled: 0,
        });
    }

    fn read_pending(&mut self, index: usize, events: &mut Vec<Event>) {
        let pending = &mut self.pending[index];
        loop {
            match pending.stream.read(&mut pending.frame[pending.filled..]) {
                Ok(0) => {
                    let pending = self.pending.swap_remove(index);
                    let detail = ProtocolError::Truncated {
                        expected: LOGON_LEN,
                        found: pending.filled,
                    }
                    .to_string();
                    events.push(reject(
                        &pending.stream,
                        RejectReason::Truncated,
                        Some(pending.pid),
                        detail,
                    ));
                    return;
                }
                Ok(n) => {
                    pending.filled += n;
                    if pending.filled == LOGON_LEN {
                        let pending = self.pending.swap_remove(index);
                        events.push(self.log_on(pending));
                        return;
                    }
                }
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(error) if error.kind() == ErrorKind::WouldBlock => return,
                Err(_) => {
                    drop(self.pending.swap_remove(index));
                    return;
                }
            }
        }
    }

    fn expire_pending(&mut self, events: &mut Vec<Event>) {
        let now = Instant::now();
        let mut index = 0;
        while index < self.pending.len() {
            if self.pending[index].deadline <= now {
                let pending = self.pending.swap_remove(index);
                let detail = format!(
                    "no whole logon frame within {:?} ({} of {LOGON_LEN} bytes arrived)",
                    self.config.logon_timeout, pending.filled
                );
                events.push(reject(
                    &pending.stream,
                    RejectReason::Deadline,
                    Some(pending.pid),
                    detail,
                ));
            } else {
                index += 1;
            }
        }
    }

    fn read_worker(&mut self, rank: usize, events: &mut Vec<Event>) {
        // Notices arrive as fixed-size frames, an fd riding on the first byte of a frame that
        // passes one; EOF or an error means the worker is gone.
        let mut frames = Vec::new();
        let gone = {
            let Some(worker) = self.workers[rank].as_mut() else {
                return;
            };
            let Some(stream) = worker.stream.as_ref() else {
                return;
            };
            loop {
                let mut fds = Vec::new();
                let received = recv_with_fds(
                    stream.as_fd(),
                    &mut worker.notice[worker.filled..],
                    &mut fds,
                );
                worker.fds.extend(fds);
                // A worker cannot make the broker hoard fds it never claims.
                while worker.fds.len() > MAX_UNCLAIMED_FDS {
                    worker.fds.pop_front();
                }
                match received {
                    Ok(received) if received.bytes == 0 => break true,
                    Ok(received) => {
                        worker.filled += received.bytes;
                        if worker.filled == worker.notice.len() {
                            worker.filled = 0;
                            let notice: WorkerNotice = bytemuck::pod_read_unaligned(&worker.notice);
                            let carries_fd = notice.kind == NoticeKind::RelayFd as u32
                                || notice.kind == NoticeKind::Outbox as u32;
                            let fd = carries_fd.then(|| worker.fds.pop_front()).flatten();
                            frames.push((notice, fd));
                        }
                    }
                    Err(Errno::EINTR) => {}
                    Err(Errno::EAGAIN) => break false,
                    Err(_) => break true,
                }
            }
        };
        for (notice, fd) in frames {
            self.on_notice(rank as u32, notice, fd, events);
        }
        if gone {
            self.worker_gone(rank as u32, events);
        }
    }

    /// Acts on one notice from `rank`.
    fn on_notice(
        &mut self,
        rank: u32,
        notice: WorkerNotice,
        fd: Option<OwnedFd>,
        events: &mut Vec<Event>,
    ) {
        let bad = |detail: String| Event::BadNotice { rank, detail };
        if notice.magic != NOTICE_MAGIC || notice._pad0 != 0 {
            events.push(bad(format!(
                "expected magic {NOTICE_MAGIC:#x} and zero padding, found {:#x} and {:#x}",
                notice.magic, notice._pad0
            )));
            return;
        }
        match NoticeKind::from_code(notice.kind) {
            Some(NoticeKind::Goodbye) => {
                if let Some(worker) = self.workers[rank as usize].as_mut() {
                    worker.said_goodbye = true;
                }
            }
            Some(NoticeKind::RelayFd) => {
                let Some(fd) = fd else {
                    events.push(bad("a relay notice came without an fd".into()));
                    return;
                };
                let to = notice.peer;
                let target = self
                    .workers
                    .get(to as usize)
                    .and_then(Option::as_ref)
                    .and_then(|w| w.stream.as_ref());
                let Some(target) = target.filter(|_| to != rank) else {
                    events.push(bad(format!("cannot relay an fd to rank {to}")));
                    return;
                };
                let relayed = WorkerNotice::new(NoticeKind::RelayedFd, rank, notice.token);
                match send_with_fds(
                    target.as_fd(),
                    &[bytemuck::bytes_of(&relayed)],
                    &[fd.as_fd()],
                ) {
                    Ok(n) if n == size_of::<WorkerNotice>() => {}
                    Ok(_) | Err(_) => {
                        events.push(bad(format!("could not relay an fd to rank {to}")))
                    }
                }
            }
            Some(NoticeKind::Outbox) => {
                let Some(fd) = fd else {
                    events.push(bad("an outbox notice came without an fd".into()));
                    return;
                };
                if let Err(detail) = self.take_outbox(rank, fd) {
                    events.push(bad(detail));
                }
            }
            Some(NoticeKind::RelayedFd | NoticeKind::PeerOutbox) | None => {
                events.push(bad(format!("unexpected notice kind {}", notice.kind)));
            }
        }
    }

    /// `rank`'s socket closed: a goodbye first means only its rings close; otherwise the whole
    /// session ends.
    fn worker_gone(&mut self, rank: u32, events: &mut Vec<Event>) {
        let Some(worker) = self.workers[rank as usize].as_mut() else {
            return;
        };
        worker.stream = None;
        worker.fds.clear();
        worker.outbox = None;
        let (pid, clean) = (worker.pid, worker.said_goodbye);
        let rings_closed = if clean {
            self.close_rings(|from, to| from == rank || to == rank, rank)
        } else {
            // A death: end the session for everyone, so that nobody waits on a peer that is
            // itself waiting on the dead one. Every ring learns which rank was lost.
            self.lost.get_or_insert(rank);
            self.close_rings(|_, _| true, rank)
        };
        events.push(Event::WorkerLeft {
            rank,
            pid,
            clean,
            rings_closed,
        });
    }

    /// Closes every ring whose `(from, to)` matches, with `cause`, and lets go of them; returns
    /// how many.
    fn close_rings(&mut self, matches: impl Fn(u32, u32) -> bool, cause: u32) -> usize {
        let keys: Vec<(u32, u32)> = self
            .rings
            .keys()
            .filter(|&&(from, to)| matches(from, to))
            .copied()
            .collect();
        let mut closed = 0;
        for key in keys {
            if let Some(ring) = self.rings.remove(&key) {
                // Only a ring whose header a worker scribbled over can fail to close; its other
                // end will then meet its deadline instead, which is all that can be done.
                closed +=
                    usize::from(shmbroker_queues::close::<Message>(ring.as_fd(), cause).is_ok());
            }
        }
        closed
    }

    /// Checks and keeps `rank`'s outbox, and passes it to every other logged-on worker.
    fn take_outbox(&mut self, rank: u32, fd: OwnedFd) -> Result<(), String> {
        let Some(worker) = self.workers[rank as usize].as_mut() else {
            return Ok(());
        };
        if worker.outbox.is_some() {
            return Err("a second outbox notice; the first outbox stays".into());
        }
        shmbroker_queues::memfd::check_seals_with(
            fd.as_fd(),
            shmbroker_queues::memfd::OWNER_ONLY_SEALS,
        )
        .and_then(|()| shmbroker_queues::memfd::check_shmem(fd.as_fd()))
        .map_err(|e| format!("outbox refused: {e}"))?;
        worker.outbox = Some(fd);
        let peers: Vec<u32> = (0..self.config.world_size)
            .filter(|&peer| peer != rank)
            .collect();
        let mut failed = Vec::new();
        for peer in peers {
            if !self.pass_outbox(rank, peer) {
                failed.push(peer);
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "could not pass rank {rank}'s outbox to ranks {failed:?}"
            ))
        }
    }

    /// Sends rank `to` every outbox published so far by the other ranks.
    fn send_outboxes_to(&mut self, to: u32) {
        for owner in 0..self.config.world_size {
            if owner != to {
                self.pass_outbox(owner, to);
            }
        }
    }

    /// Passes `owner`'s outbox to rank `to`, if both are there, with the owner's pid as the broker
    /// saw it log on (`SO_PEERCRED`) as the token; `false` only when sending failed.
    fn pass_outbox(&self, owner: u32, to: u32) -> bool {
        let owner_worker = self.workers[owner as usize].as_ref();
        let pid = owner_worker.map_or(0, |w| w.pid);
        let outbox = owner_worker.and_then(|w| w.outbox.as_ref());
        let target = self.workers[to as usize]
            .as_ref()
            .and_then(|w| w.stream.as_ref());
        let (Some(outbox), Some(target)) = (outbox, target) else {
            return true;
        };
        let notice = WorkerNotice::new(NoticeKind::PeerOutbox, owner, pid as u64);
        matches!(
            send_with_fds(target.as_fd(), &[bytemuck::bytes_of(&notice)], &[outbox.as_fd()]),
            Ok(n) if n == size_of::<WorkerNotice>()
        )
    }

    /// Validates a whole logon frame and answers it.
    fn log_on(&mut self, pending: Pending) -> Event {
        let pid = Some(pending.pid);
        let frame = match decode_logon(&pending.frame) {
            Ok(frame) => frame,
            Err((reason, detail)) => {
                return reject(&pending.stream, reason, pid, detail.to_string());
            }
        };
        let world = self.config.world_size;
        if let Some(lost) = self.lost {
            let text = format!("rank {lost} died; this session is over");
            return reject(&pending.stream, RejectReason::SessionLost, pid, text);
        }
        let rank = if frame.requested_rank == ANY_RANK {
            match self.workers.iter().position(Option::is_none) {
                Some(rank) => rank as u32,
                None => {
                    let text = format!("all {world} ranks are taken");
                    return reject(&pending.stream, RejectReason::WorldFull, pid, text);
                }
            }
        } else {
            let rank = frame.requested_rank;
            if rank >= world {
                let text = format!(
                    "rank {rank} requested; the world has ranks 0 to {}",
                    world - 1
                );
                return reject(&pending.stream, RejectReason::RankOutOfRange, pid, text);
            }
            if let Some(holder) = &self.workers[rank as usize] {
                let text = format!("rank {rank} is taken by pid {}", holder.pid);
                return reject(&pending.stream, RejectReason::RankTaken, pid, text);
            }
            rank
        };
        if frame.min_ring_capacity > self.config.ring_capacity {
            let text = format!(
                "needs at least {} ring slots; this broker's rings have {}",
                frame.min_ring_capacity, self.config.ring_capacity
            );
            return reject(
                &pending.stream,
                RejectReason::CapacityOutOfLimits,
                pid,
                text,
            );
        }
        match self.reply(&pending, rank) {
            Ok(pidfd) => {
                self.workers[rank as usize] = Some(Worker {
                    stream: Some(pending.stream),
                    pid: pending.pid,
                    notice: [0; size_of::<WorkerNotice>()],
                    filled: 0,
                    fds: VecDeque::new(),
                    said_goodbye: false,
                    outbox: None,
                    _pidfd: pidfd,
                });
                self.send_outboxes_to(rank);
                Event::LoggedOn {
                    rank,
                    pid: pending.pid,
                    uid: pending.uid,
                }
            }
            Err(error) => reject(
                &pending.stream,
                RejectReason::Internal,
                pid,
                format!("could not serve rank {rank}: {error}"),
            ),
        }
    }

    /// Creates what rank `rank` still lacks and sends it everything in one message.
    fn reply(&mut self, pending: &Pending, rank: u32) -> Result<Option<OwnedFd>, Error> {
        let world = self.config.world_size;
        for (role, peer) in manifest_order(rank, world) {
            let key = match (role, peer) {
                (FdRole::RingToPeer, Some(peer)) => (rank, peer),
                (FdRole::RingFromPeer, Some(peer)) => (peer, rank),
                (_, None) => continue,
            };
            if !self.rings.contains_key(&key) {
                let ring = shmbroker_queues::create::<Message>(self.config.ring_capacity as usize)
                    .map_err(Error::CreateRing)?;
                self.rings.insert(key, ring);
            }
        }
        let mut manifest = Vec::new();
        let mut fds = Vec::new();
        for (role, peer) in manifest_order(rank, world) {
            let Some(peer) = peer else { continue };
            let fd = match role {
                FdRole::RingToPeer => &self.rings[&(rank, peer)],
                FdRole::RingFromPeer => &self.rings[&(peer, rank)],
            };
            let size = shmbroker_queues::memfd::file_size(fd.as_fd()).map_err(Error::CreateRing)?;
            manifest.push(ManifestEntry {
                role: role as u32,
                peer,
                size,
                layout_version: RING_LAYOUT_VERSION,
                _pad0: 0,
            });
            fds.push(fd.as_fd());
        }
        let header = ReplyHeader {
            magic: REPLY_MAGIC,
            version: PROTOCOL_VERSION,
            status: 0,
            rank,
            world_size: world,
            fd_count: manifest.len() as u32,
            ring_capacity: self.config.ring_capacity,
            _pad1: 0,
            reason: [0; shmbroker_bindings::REASON_LEN],
        };
        // A pidfd now, while the caller is certainly alive (it is waiting for this reply), so
        // that later liveness checks cannot be fooled by pid reuse.
        let pidfd = crate::pidfd_open(pending.pid).ok();
        let total = size_of::<ReplyHeader>() + manifest.len() * size_of::<ManifestEntry>();
        let sent = send_with_fds(
            pending.stream.as_fd(),
            &[bytemuck::bytes_of(&header), bytemuck::cast_slice(&manifest)],
            &fds,
        )
        .map_err(Error::sys("sendmsg"))?;
        if sent != total {
            return Err(Error::sys("sendmsg (partial)")(Errno::EAGAIN));
        }
        Ok(pidfd)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Remove the socket file only if it is still the one this listener created.
        if let Ok(metadata) = std::fs::symlink_metadata(&self.path)
            && (metadata.dev(), metadata.ino()) == self.identity
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Sends a rejection (best effort: the caller may be gone) and reports it.
fn reject(stream: &UnixStream, reason: RejectReason, pid: Option<i32>, detail: String) -> Event {
    let header = ReplyHeader::rejection(reason, &detail);
    let _ = send_with_fds(stream.as_fd(), &[bytemuck::bytes_of(&header)], &[]);
    Event::Rejected {
        reason,
        pid,
        detail,
    }
}

/// Removes a socket file no broker listens on; refuses a live one and anything not a socket.
fn remove_stale_socket(path: &Path) -> Result<(), Error> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(Error::sys("stat")(io_errno(&error))),
    };
    if !metadata.file_type().is_socket() {
        return Err(Error::NotASocket {
            path: path.to_path_buf(),
        });
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(Error::AddressInUse {
            path: path.to_path_buf(),
        }),
        Err(error) if error.kind() == ErrorKind::ConnectionRefused => std::fs::remove_file(path)
            .or_else(|e| {
                if e.kind() == ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .map_err(|e| Error::sys("unlink")(io_errno(&e))),
        Err(error) => Err(Error::sys("connect to the existing socket")(io_errno(
            &error,
        ))),
    }
}

fn io_errno(error: &std::io::Error) -> Errno {
    Errno::from_raw(error.raw_os_error().unwrap_or(nix::libc::EIO))
}

/// A broker holds an fd for every ring, N (N - 1) of them for a world of N; lift the soft fd
/// limit to the hard one.
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}
