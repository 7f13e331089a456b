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
//! does. The broker keeps every ring's fd until its job ends.
//!
//! # Who is there
//!
//! The broker opens a pidfd for each worker while it waits for its reply, so the pidfd names that
//! very process. It watches both the worker's socket and its pidfd (a worker that forked a child
//! which holds the socket still shows its own exit), and passes each worker a duplicate of every
//! peer's pidfd (a `Peer` notice), so that workers see each other exit whether or not the broker
//! is still there (see the client's `liveness` module). A worker that says goodbye before its
//! socket closes **left**; one whose socket closes or process exits without it **died**. Either
//! way the broker only updates its own records: it never writes into rings or reads headers a
//! worker could have scribbled on; survivors close their own rings.
//!
//! # Jobs
//!
//! Once a worker of a job has left or died, the job is winding down: logons are refused with
//! [`RejectReason::SessionLost`] (a late rank would wait for a peer that is gone). Once every
//! worker that logged on is gone, the broker forgets the job (its rings, ranks and records) and
//! serves the next one on the same socket ([`Event::JobEnded`]).
//!
//! # Notices, bounded
//!
//! Each worker publishes its outbox once logged on (an `Outbox` notice with the memfd). The broker
//! checks that its seals keep everyone but the owner from writing or resizing it, and passes it to
//! every other worker (`PeerOutbox`), and to each worker that logs on later right after its reply.
//! Everything the broker sends a worker goes through that worker's queue: what its socket has no
//! room for now is sent when it has, never dropped. Fds relayed to a worker and not yet taken
//! (`Claimed`) are capped per receiver ([`MAX_UNCLAIMED_RELAYS`]); past the cap the sender is told
//! (`RelayRefusedFull`), and every relay is answered. Connections still logging on are capped
//! per uid and in all, and the oldest idle one makes room for a newcomer.
//!
//! # Logs
//!
//! Everything the broker does is also a `tracing` event with structured fields (rank, pid, uid,
//! reason). Complaints about one worker or one uid are rate-limited (a burst, then one line per
//! second with how many were suppressed), so a hostile worker cannot flood the log.

use crate::error::{Error, ProtocolError, io_errno};
use crate::wire::{LOGON_LEN, MAX_WORLD_SIZE, decode_logon, manifest_order};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{AddressFamily, Backlog, SockFlag, SockType, UnixAddr, sockopt};
use shmbroker_bindings::{
    ANY_RANK, FdRole, ManifestEntry, Message, NOTICE_MAGIC, NoticeKind, PROTOCOL_VERSION,
    REPLY_MAGIC, RING_LAYOUT_VERSION, RejectReason, ReplyHeader, WorkerNotice,
};
use shmbroker_sys::fdpass::{recv_with_fds, send_with_fds};
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
    /// Connections mid-logon at once; past it, the oldest that has sent nothing yet is dropped
    /// to make room (or the newcomer is refused when none is idle).
    pub max_pending: usize,
    /// Connections mid-logon at once from one uid, with the same rule.
    pub max_pending_per_uid: usize,
    /// Permission bits of the socket file (0600 by default: only the broker's uid can connect).
    pub socket_mode: u32,
    /// Group to give the socket file (with a mode such as 0660, so that `allowed_uids` in that
    /// group can connect).
    pub socket_group: Option<u32>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            world_size: 4,
            ring_capacity: 1024,
            logon_timeout: Duration::from_secs(5),
            allowed_uids: Vec::new(),
            max_pending: 256,
            max_pending_per_uid: 64,
            socket_mode: 0o600,
            socket_group: None,
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
        if self.max_pending == 0 || self.max_pending_per_uid == 0 {
            return invalid(
                "max_pending",
                "must be at least 1 in all and per uid".into(),
            );
        }
        if self.socket_mode & !0o777 != 0 {
            return invalid(
                "socket_mode",
                format!(
                    "must be permission bits (0 to 0777), got {:#o}",
                    self.socket_mode
                ),
            );
        }
        Ok(())
    }

    /// The fds a broker may need to serve a full world of this config: every ring; for each
    /// worker its socket, pidfd and outbox, the fds it may send ahead of their notices, and the
    /// relayed fds (at most [`MAX_UNCLAIMED_RELAYS`]) and peers' pidfds and outboxes queued for
    /// it while it reads slowly; two for each connection logging on; a few of its own. A
    /// relayed fd it has no room for anyway is answered as failed, never half-passed.
    #[must_use]
    pub fn fds_needed(&self) -> u64 {
        let world = u64::from(self.world_size);
        let per_worker =
            3 + MAX_UNCLAIMED_FDS as u64 + MAX_UNCLAIMED_RELAYS as u64 + 2 * (world - 1);
        // A connection logging on holds its socket and its caller's pidfd.
        32 + 2 * self.max_pending as u64 + world * (world - 1) + world * per_worker
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
    /// A logged-on worker is gone: it said goodbye before its socket closed (`clean`), or its
    /// socket closed or its process exited without one (it died). The job winds down: later
    /// logons are refused until every worker of it is gone.
    WorkerLeft {
        /// Its rank.
        rank: u32,
        /// Its pid.
        pid: i32,
        /// Whether it said goodbye first.
        clean: bool,
    },
    /// Every worker of a job is gone; the broker forgot it and takes the next job.
    JobEnded {
        /// The job's number, from 0.
        job: u64,
        /// How many workers had logged on.
        workers: u32,
        /// The first rank that died, if one did.
        lost: Option<u32>,
    },
    /// A logged-on worker sent something the broker refused; it was ignored. At most a burst of
    /// these per worker, then one a second (`suppressed` counts those left out before this one).
    BadNotice {
        /// Its rank.
        rank: u32,
        /// What arrived.
        detail: String,
        /// How many complaints about this worker were not reported since the last one.
        suppressed: u64,
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
    /// The caller's process, taken from the connection itself (see [`peer_pidfd`]).
    pidfd: OwnedFd,
    deadline: Instant,
    frame: [u8; LOGON_LEN],
    filled: usize,
}

struct Worker {
    /// `None` once the worker is gone.
    stream: Option<UnixStream>,
    pid: i32,
    uid: u32,
    /// Bytes of the notice being received.
    notice: [u8; size_of::<WorkerNotice>()],
    filled: usize,
    /// Fds received and not yet claimed by a `RelayFd` or `Outbox` notice.
    fds: VecDeque<OwnedFd>,
    said_goodbye: bool,
    /// The worker's outbox, once published; passed to every worker that logs on later.
    outbox: Option<OwnedFd>,
    /// Opened while the worker waited for its reply: readable once that process has exited.
    pidfd: OwnedFd,
    /// Whether the pidfd has shown the exit.
    exited: bool,
    /// Notices (each with its fd, if any) waiting for room on the worker's socket, in order.
    outgoing: VecDeque<(WorkerNotice, Option<OwnedFd>)>,
    /// Relays passed to this worker, by (sender, token), that it has not said it took.
    unclaimed: std::collections::HashSet<(u32, u64)>,
    /// Complaints about this worker.
    complaints: RateLimit,
}

/// A burst of `BURST` reports, then one a second; counts what it holds back.
#[derive(Debug, Default)]
pub(crate) struct RateLimit {
    window: Option<Instant>,
    reported: u32,
    suppressed: u64,
}

impl RateLimit {
    const BURST: u32 = 10;

    /// `Some(suppressed since the last report)` when this one may be reported, `None` if not.
    pub(crate) fn allow(&mut self, now: Instant) -> Option<u64> {
        self.allow_burst(now, Self::BURST)
    }

    /// [`Self::allow`] with a burst of `burst` a second.
    pub(crate) fn allow_burst(&mut self, now: Instant, burst: u32) -> Option<u64> {
        let window = *self.window.get_or_insert(now);
        if now.duration_since(window) >= Duration::from_secs(1) {
            self.window = Some(now);
            self.reported = 0;
        }
        if self.reported < burst {
            self.reported += 1;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
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
    /// Rings created for a pair `(from, to)`, kept until the job ends.
    rings: HashMap<(u32, u32), OwnedFd>,
    stop: Arc<EventFd>,
    /// The first rank of the current job that died, and the first that left.
    lost: Option<u32>,
    left: Option<u32>,
    /// Jobs ended so far.
    jobs: u64,
    /// The current job's id (from its first worker that gave one), and the ids of the last
    /// [`ENDED_JOBS_KEPT`] jobs that ended, with how: a worker of a job that ended is refused.
    job_id: Option<u64>,
    ended: VecDeque<(u64, String)>,
    /// Complaints about connections that never logged on, by uid.
    rejections: HashMap<u32, RateLimit>,
    /// Log lines about logons and departures, by uid: a process logging on and off in a loop
    /// must not fill the log either.
    comings: HashMap<u32, RateLimit>,
    /// After `accept` failed for want of fds or memory, the listening socket stays readable;
    /// it is left out of the poll until this instant instead of spinning on it.
    accept_paused_until: Option<Instant>,
}

/// Fds a worker may send the broker ahead of the notices that claim them.
const MAX_UNCLAIMED_FDS: usize = 16;

/// How many ended jobs' ids the broker remembers, to refuse their late workers.
const ENDED_JOBS_KEPT: usize = 256;

/// Fds relayed to one worker that it has not taken yet; past this, relays to it are refused.
pub const MAX_UNCLAIMED_RELAYS: usize = 64;

/// Notices queued for one worker (it is not reading its socket). Past this the broker stops
/// reading what that worker sends until it reads, so the queue stays bounded (by this and one
/// batch of answers).
const MAX_OUTGOING: usize = 1024;

/// How long accepting pauses after `accept` fails for want of resources.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What one `poll` found ready.
struct Ready {
    listener: bool,
    stop: bool,
    pending: Vec<bool>,
    workers: Vec<WorkerReady>,
}

#[derive(Default)]
struct WorkerReady {
    readable: bool,
    writable: bool,
    exited: bool,
}

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
    /// Listens on `path` (mode [`Config::socket_mode`], 0600 by default, and group
    /// [`Config::socket_group`]), after raising the fd limit to its hard limit.
    ///
    /// A socket file left by a broker that is gone is replaced; one a live broker listens on is
    /// not (its connect succeeds); a path that is not a socket is never touched.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`], [`Error::FdLimit`] when the world cannot fit in the fd limit,
    /// [`Error::AddressInUse`], [`Error::NotASocket`], [`Error::Sys`].
    pub fn bind(path: impl AsRef<Path>, config: Config) -> Result<Self, Error> {
        config.validate()?;
        let limit = raise_fd_limit();
        let needed = config.fds_needed();
        if needed > limit {
            return Err(Error::FdLimit {
                world_size: config.world_size,
                needed,
                limit,
            });
        }
        let path = path.as_ref().to_path_buf();
        remove_stale_socket(&path)?;
        // Every fd the broker holds while idle exists once the socket file does (tests count
        // them from then on).
        let stop = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(Error::sys("eventfd"))?;
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
                Error::Path {
                    op: "binding the socket at",
                    path: path.clone(),
                    source,
                }
            }
        })?;
        nix::sys::socket::listen(&socket, Backlog::new(128).unwrap_or(Backlog::MAXCONN))
            .map_err(Error::sys("listen"))?;
        // Group first, while the file is still 0600, then the mode: no moment in which the file
        // is open to a group it is not meant for.
        if let Some(gid) = config.socket_group {
            std::os::unix::fs::lchown(&path, None, Some(gid))
                .map_err(Error::io("chown of the socket file"))?;
        }
        if config.socket_mode != 0o600 {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(config.socket_mode))
                .map_err(Error::io("chmod of the socket file"))?;
        }
        let metadata = std::fs::symlink_metadata(&path).map_err(Error::io("stat"))?;
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
            left: None,
            jobs: 0,
            job_id: None,
            ended: VecDeque::new(),
            rejections: HashMap::new(),
            comings: HashMap::new(),
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

    /// Ranks of the current job that have logged on (including any whose worker has left
    /// since).
    pub fn logged_on(&self) -> impl Iterator<Item = u32> + '_ {
        (0..)
            .zip(&self.workers)
            .filter_map(|(rank, w)| w.as_ref().map(|_| rank))
    }

    /// The first rank of the current job that died, if one did. Logons are refused until the job
    /// ends.
    #[must_use]
    pub fn lost_rank(&self) -> Option<u32> {
        self.lost
    }

    /// How many jobs have ended on this listener.
    #[must_use]
    pub fn jobs_ended(&self) -> u64 {
        self.jobs
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
        let ready = self.wait(wait)?;
        let mut events = Vec::new();
        for index in (0..ready.pending.len()).rev() {
            if ready.pending[index] {
                self.read_pending(index, &mut events);
            }
        }
        for (rank, worker) in ready.workers.into_iter().enumerate() {
            if worker.writable {
                self.flush(rank);
            }
            if worker.readable {
                self.read_worker(rank, &mut events);
            }
            if worker.exited {
                self.process_exited(rank, &mut events);
            }
        }
        self.end_job_if_over(&mut events);
        if ready.listener && !ready.stop {
            self.accept_all(&mut events)?;
        }
        self.expire_pending(&mut events);
        // Last, so that what arrived together with the stop (a worker leaving, say) is reported.
        if ready.stop {
            let _ = self.stop.read();
            events.push(Event::Stopped);
        }
        Ok(events)
    }

    /// Polls every socket and pidfd; returns which are ready.
    fn wait(&self, timeout: Duration) -> Result<Ready, Error> {
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
        // Per worker: its socket (and whether there is something to write), its pidfd.
        let mut watched = Vec::with_capacity(self.workers.len());
        for worker in &self.workers {
            let Some(worker) = worker else {
                watched.push((false, false));
                continue;
            };
            let stream = worker.stream.as_ref().map(|stream| {
                let mut flags = PollFlags::empty();
                if worker.outgoing.len() < MAX_OUTGOING {
                    flags |= readable;
                }
                if !worker.outgoing.is_empty() {
                    flags |= PollFlags::POLLOUT;
                }
                PollFd::new(stream.as_fd(), flags)
            });
            let pidfd = (!worker.exited).then(|| PollFd::new(worker.pidfd.as_fd(), readable));
            watched.push((stream.is_some(), pidfd.is_some()));
            fds.extend(stream);
            fds.extend(pidfd);
        }
        let millis = timeout.as_millis().min(i32::MAX as u128) as i32;
        let millis = u16::try_from(millis).unwrap_or(u16::MAX);
        match poll(&mut fds, PollTimeout::from(millis)) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(source) => return Err(Error::Sys { op: "poll", source }),
        }
        let revents = |fd: &PollFd<'_>| fd.revents().unwrap_or(PollFlags::empty());
        let woke = |fd: &PollFd<'_>| !revents(fd).is_empty();
        let mut rest = fds[2 + self.pending.len()..].iter();
        let workers = watched
            .into_iter()
            .map(|(has_stream, has_pidfd)| {
                let stream = if has_stream { rest.next() } else { None };
                let pidfd = if has_pidfd { rest.next() } else { None };
                let stream = stream.map_or(PollFlags::empty(), revents);
                WorkerReady {
                    readable: stream
                        .intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR),
                    writable: stream.contains(PollFlags::POLLOUT),
                    exited: pidfd.is_some_and(woke),
                }
            })
            .collect();
        Ok(Ready {
            listener: woke(&fds[0]),
            stop: woke(&fds[1]),
            pending: fds[2..2 + self.pending.len()].iter().map(woke).collect(),
            workers,
        })
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
            deadline: Instant::now() + self.config.logon_timeout,
            frame: [0; LOGON_LEN],
            filled: 0,
        });
    }

    /// Refuses a connection with `reason`, reports it, and logs it unless that uid has had its
    /// share of log lines this second.
    fn refuse(
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

    fn read_pending(&mut self, index: usize, events: &mut Vec<Event>) {
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

    fn expire_pending(&mut self, events: &mut Vec<Event>) {
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

    fn read_worker(&mut self, rank: usize, events: &mut Vec<Event>) {
        // Notices arrive as fixed-size frames, an fd riding on the first byte of a frame that
        // passes one; EOF or an error means the worker is gone. At most `BATCH` frames per call,
        // so that one busy worker cannot keep the broker from everyone else.
        const BATCH: usize = 256;
        let mut frames = Vec::new();
        let gone = {
            let Some(worker) = self.workers[rank].as_mut() else {
                return;
            };
            let Some(stream) = worker.stream.as_ref() else {
                return;
            };
            loop {
                if frames.len() == BATCH {
                    break false;
                }
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

    /// Whether a line about a logon or departure by `uid` may be logged now (a burst of two a
    /// second per rank of the world), and how many were left out before it.
    fn allow_coming(&mut self, uid: u32) -> Option<u64> {
        let burst = 2 * self.config.world_size + RateLimit::BURST;
        self.comings
            .entry(uid)
            .or_default()
            .allow_burst(Instant::now(), burst)
    }

    /// Reports a complaint about `rank`, unless it has had its share this second.
    fn complain(&mut self, rank: u32, detail: String, events: &mut Vec<Event>) {
        let Some(worker) = self.workers[rank as usize].as_mut() else {
            return;
        };
        if let Some(suppressed) = worker.complaints.allow(Instant::now()) {
            let (pid, uid) = (worker.pid, worker.uid);
            tracing::warn!(rank, pid, uid, suppressed, "refused a notice: {detail}");
            events.push(Event::BadNotice {
                rank,
                detail,
                suppressed,
            });
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
        if notice.magic != NOTICE_MAGIC || notice._pad0 != 0 {
            let detail = format!(
                "expected magic {NOTICE_MAGIC:#x} and zero padding, found {:#x} and {:#x}",
                notice.magic, notice._pad0
            );
            return self.complain(rank, detail, events);
        }
        match NoticeKind::from_code(notice.kind) {
            Some(NoticeKind::Goodbye) => {
                if let Some(worker) = self.workers[rank as usize].as_mut() {
                    worker.said_goodbye = true;
                }
            }
            Some(NoticeKind::RelayFd) => {
                let Some(fd) = fd else {
                    // No fd with it: the worker sent none, or the broker had no room for it
                    // (the kernel drops what does not fit). Either way the sender is answered.
                    let failed =
                        WorkerNotice::new(NoticeKind::RelayFailed, notice.peer, notice.token);
                    self.send(rank, failed, None);
                    return self.complain(rank, "a relay notice came without an fd".into(), events);
                };
                self.relay(rank, notice.peer, notice.token, fd, events);
            }
            Some(NoticeKind::Claimed) => {
                let taken = self.workers[rank as usize]
                    .as_mut()
                    .is_some_and(|w| w.unclaimed.remove(&(notice.peer, notice.token)));
                if !taken {
                    let detail = format!(
                        "claimed a relay from rank {} with token {} that it was never passed",
                        notice.peer, notice.token
                    );
                    self.complain(rank, detail, events);
                }
            }
            Some(NoticeKind::Outbox) => {
                let Some(fd) = fd else {
                    let detail = "an outbox notice came without an fd".into();
                    return self.complain(rank, detail, events);
                };
                if let Err(detail) = self.take_outbox(rank, fd) {
                    self.complain(rank, detail, events);
                }
            }
            // What only the broker sends, or no kind at all.
            Some(_) | None => {
                let detail = format!("unexpected notice kind {}", notice.kind);
                self.complain(rank, detail, events);
            }
        }
    }

    /// Passes `fd` from `from` to rank `to` with `token`, unless `to` is not there or holds its
    /// share of relayed fds; answers `from` either way.
    fn relay(&mut self, from: u32, to: u32, token: u64, fd: OwnedFd, events: &mut Vec<Event>) {
        let target = self
            .workers
            .get_mut(to as usize)
            .and_then(Option::as_mut)
            .filter(|w| w.stream.is_some() && to != from);
        let answer = match target {
            None => NoticeKind::RelayRefusedGone,
            // Taken and not claimed, or still queued here because it does not read: either
            // way it holds its share.
            Some(target)
                if target.unclaimed.len() >= MAX_UNCLAIMED_RELAYS
                    || target
                        .outgoing
                        .iter()
                        .filter(|(_, fd)| fd.is_some())
                        .count()
                        >= MAX_UNCLAIMED_RELAYS =>
            {
                NoticeKind::RelayRefusedFull
            }
            Some(target) => {
                target.unclaimed.insert((from, token));
                let relayed = WorkerNotice::new(NoticeKind::RelayedFd, from, token);
                target.outgoing.push_back((relayed, Some(fd)));
                self.flush(to as usize);
                NoticeKind::RelayDelivered
            }
        };
        if answer != NoticeKind::RelayDelivered {
            let detail = match answer {
                NoticeKind::RelayRefusedFull => format!(
                    "relay to rank {to} refused: it holds {MAX_UNCLAIMED_RELAYS} relayed fds it \
                     has not taken"
                ),
                _ => format!("relay to rank {to} refused: it is not logged on"),
            };
            self.complain(from, detail, events);
        }
        self.send(from, WorkerNotice::new(answer, to, token), None);
    }

    /// Queues a notice (and its fd) for `to` and sends what its socket has room for.
    fn send(&mut self, to: u32, notice: WorkerNotice, fd: Option<OwnedFd>) {
        if let Some(worker) = self.workers[to as usize].as_mut()
            && worker.stream.is_some()
        {
            worker.outgoing.push_back((notice, fd));
            self.flush(to as usize);
        }
    }

    /// Sends `rank` what is queued for it, until its socket is full (the rest goes when `poll`
    /// says it has room) or gone (reading it will say so).
    fn flush(&mut self, rank: usize) {
        let Some(worker) = self.workers[rank].as_mut() else {
            return;
        };
        let Some(stream) = worker.stream.as_ref() else {
            worker.outgoing.clear();
            return;
        };
        while let Some((notice, fd)) = worker.outgoing.front() {
            let fds: Vec<BorrowedFd<'_>> = fd.iter().map(AsFd::as_fd).collect();
            match send_with_fds(stream.as_fd(), &[bytemuck::bytes_of(notice)], &fds) {
                Ok(n) if n == size_of::<WorkerNotice>() => {
                    worker.outgoing.pop_front();
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return,
                // A notice cut short (its stream is out of step from here) or a broken socket:
                // the worker cannot be told anything any more. Shutting the socket down makes
                // the next poll report it gone.
                Ok(_) | Err(_) => {
                    worker.outgoing.clear();
                    let _ = stream.shutdown(std::net::Shutdown::Both);
                    return;
                }
            }
        }
    }

    /// `rank`'s process exited. Whatever it sent before is read first; if its socket is still
    /// open (a child it forked holds it), the worker is gone all the same.
    fn process_exited(&mut self, rank: usize, events: &mut Vec<Event>) {
        let Some(worker) = self.workers[rank].as_mut() else {
            return;
        };
        worker.exited = true;
        if worker.stream.is_some() {
            self.read_worker(rank, events);
            self.worker_gone(rank as u32, events);
        }
    }

    /// `rank` is gone: with a goodbye first it left, otherwise it died. Either way only the
    /// broker's records change, and the job winds down.
    fn worker_gone(&mut self, rank: u32, events: &mut Vec<Event>) {
        let Some(worker) = self.workers[rank as usize].as_mut() else {
            return;
        };
        if worker.stream.take().is_none() {
            return;
        }
        worker.fds.clear();
        worker.outgoing.clear();
        worker.outbox = None;
        let (pid, uid, clean) = (worker.pid, worker.uid, worker.said_goodbye);
        let logged = self.allow_coming(uid);
        if clean {
            self.left.get_or_insert(rank);
            if let Some(suppressed) = logged {
                tracing::info!(rank, pid, uid, suppressed, "left");
            }
        } else {
            self.lost.get_or_insert(rank);
            if let Some(suppressed) = logged {
                tracing::warn!(rank, pid, uid, suppressed, "died without saying goodbye");
            }
        }
        // Tell everyone still there: their own pidfd of this worker names the process that
        // connected, which is not always the one that is gone (an inherited socket, an exec).
        let gone = WorkerNotice::new(NoticeKind::PeerGone, rank, u64::from(clean));
        for peer in 0..self.config.world_size {
            if peer != rank {
                self.send(peer, gone, None);
            }
        }
        events.push(Event::WorkerLeft { rank, pid, clean });
    }

    /// Forgets the job once every worker that logged on is gone, so the next one can start.
    fn end_job_if_over(&mut self, events: &mut Vec<Event>) {
        let mut logged_on = self.workers.iter().flatten().peekable();
        if logged_on.peek().is_none() || self.workers.iter().flatten().any(|w| w.stream.is_some()) {
            return;
        }
        let workers = self.workers.iter().flatten().count() as u32;
        let event = Event::JobEnded {
            job: self.jobs,
            workers,
            lost: self.lost,
        };
        tracing::info!(job = self.jobs, workers, lost = ?self.lost, "job ended");
        if let Some(id) = self.job_id.take() {
            let how = self
                .winding_down()
                .unwrap_or_else(|| "every worker left".to_string());
            if self.ended.len() == ENDED_JOBS_KEPT {
                self.ended.pop_front();
            }
            self.ended.push_back((id, how));
        }
        self.jobs += 1;
        self.workers.iter_mut().for_each(|w| *w = None);
        self.rings.clear();
        self.lost = None;
        self.left = None;
        events.push(event);
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
        let mut failed = Vec::new();
        for peer in 0..self.config.world_size {
            if peer != rank && !self.pass_outbox(rank, peer) {
                failed.push(peer);
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "could not duplicate rank {rank}'s outbox for ranks {failed:?}"
            ))
        }
    }

    /// Queues `owner`'s outbox for rank `to`, if both are there, with the owner's pid as the
    /// broker saw it log on (`SO_PEERCRED`) as the token; `false` only when it could not be
    /// duplicated.
    fn pass_outbox(&mut self, owner: u32, to: u32) -> bool {
        let Some(owner_worker) = self.workers[owner as usize].as_ref() else {
            return true;
        };
        let Some(outbox) = owner_worker.outbox.as_ref() else {
            return true;
        };
        let pid = owner_worker.pid;
        let Ok(copy) = outbox.try_clone() else {
            return false;
        };
        self.send(
            to,
            WorkerNotice::new(NoticeKind::PeerOutbox, owner, pid as u64),
            Some(copy),
        );
        true
    }

    /// Why the current job is winding down (its first death, or else its first departure), if it
    /// is.
    fn winding_down(&self) -> Option<String> {
        match (self.lost, self.left) {
            (Some(rank), _) => Some(format!("rank {rank} died")),
            (None, Some(rank)) => Some(format!("rank {rank} left")),
            (None, None) => None,
        }
    }

    /// Validates a whole logon frame and answers it.
    fn log_on(&mut self, pending: Pending, events: &mut Vec<Event>) {
        let who = (pending.pid, pending.uid);
        let frame = match decode_logon(&pending.frame) {
            Ok(frame) => frame,
            Err((reason, detail)) => {
                return self.refuse(&pending.stream, reason, who, detail.to_string(), events);
            }
        };
        let world = self.config.world_size;
        // A worker of a job that already ended, or of the job winding down now.
        let ended = self
            .ended
            .iter()
            .find(|(job, _)| frame.job != 0 && *job == frame.job)
            .map(|(job, how)| {
                format!("job {job:#x} already ended ({how}); a new job needs a new id")
            });
        let over = ended.or_else(|| {
            self.winding_down().map(|why| {
                format!(
                    "{why}: this job is over; the next one starts once all of its workers are gone"
                )
            })
        });
        if let Some(text) = over {
            return self.refuse(
                &pending.stream,
                RejectReason::SessionLost,
                who,
                text,
                events,
            );
        }
        let rank = if frame.requested_rank == ANY_RANK {
            match self.workers.iter().position(Option::is_none) {
                Some(rank) => rank as u32,
                None => {
                    let text = format!("all {world} ranks are taken");
                    return self.refuse(
                        &pending.stream,
                        RejectReason::WorldFull,
                        who,
                        text,
                        events,
                    );
                }
            }
        } else {
            let rank = frame.requested_rank;
            if rank >= world {
                let text = format!(
                    "rank {rank} requested; the world has ranks 0 to {}",
                    world - 1
                );
                let reason = RejectReason::RankOutOfRange;
                return self.refuse(&pending.stream, reason, who, text, events);
            }
            if let Some(holder) = &self.workers[rank as usize] {
                let text = format!("rank {rank} is taken by pid {}", holder.pid);
                return self.refuse(&pending.stream, RejectReason::RankTaken, who, text, events);
            }
            rank
        };
        if frame.min_ring_capacity > self.config.ring_capacity {
            let text = format!(
                "needs at least {} ring slots; this broker's rings have {}",
                frame.min_ring_capacity, self.config.ring_capacity
            );
            let reason = RejectReason::CapacityOutOfLimits;
            return self.refuse(&pending.stream, reason, who, text, events);
        }
        match self.reply(&pending, rank) {
            Ok((pidfd, introductions)) => {
                self.workers[rank as usize] = Some(Worker {
                    stream: Some(pending.stream),
                    pid: pending.pid,
                    uid: pending.uid,
                    notice: [0; size_of::<WorkerNotice>()],
                    filled: 0,
                    fds: VecDeque::new(),
                    said_goodbye: false,
                    outbox: None,
                    pidfd,
                    exited: false,
                    outgoing: VecDeque::new(),
                    unclaimed: std::collections::HashSet::new(),
                    complaints: RateLimit::default(),
                });
                if frame.job != 0 {
                    self.job_id.get_or_insert(frame.job);
                }
                for (to, notice, fd) in introductions {
                    self.send(to, notice, Some(fd));
                }
                for owner in 0..world {
                    if owner != rank {
                        self.pass_outbox(owner, rank);
                    }
                }
                if let Some(suppressed) = self.allow_coming(pending.uid) {
                    tracing::info!(
                        rank,
                        pid = pending.pid,
                        uid = pending.uid,
                        suppressed,
                        "logged on"
                    );
                }
                events.push(Event::LoggedOn {
                    rank,
                    pid: pending.pid,
                    uid: pending.uid,
                });
            }
            Err(error) => {
                let text = format!("could not serve rank {rank}: {error}");
                self.refuse(&pending.stream, RejectReason::Internal, who, text, events);
            }
        }
    }

    /// Creates what rank `rank` still lacks and sends it everything in one message. Returns its
    /// pidfd and the `Peer` notices that introduce it to every logged-on worker and them to it,
    /// all made before the reply is sent: a logon that cannot be finished is refused whole.
    #[allow(clippy::type_complexity)]
    fn reply(
        &mut self,
        pending: &Pending,
        rank: u32,
    ) -> Result<(OwnedFd, Vec<(u32, WorkerNotice, OwnedFd)>), Error> {
        let world = self.config.world_size;
        let pidfd = pending
            .pidfd
            .try_clone()
            .map_err(Error::io("dup of a pidfd"))?;
        let mut introductions = Vec::new();
        for (peer, worker) in (0..).zip(&self.workers) {
            let Some(worker) = worker.as_ref().filter(|w| w.stream.is_some()) else {
                continue;
            };
            let dup = |fd: &OwnedFd| fd.try_clone().map_err(Error::io("dup"));
            introductions.push((
                peer,
                WorkerNotice::new(NoticeKind::Peer, rank, pending.pid as u64),
                dup(&pidfd)?,
            ));
            introductions.push((
                rank,
                WorkerNotice::new(NoticeKind::Peer, peer, worker.pid as u64),
                dup(&worker.pidfd)?,
            ));
        }
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
        let total = size_of::<ReplyHeader>() + manifest.len() * size_of::<ManifestEntry>();
        let sent = send_with_fds(
            pending.stream.as_fd(),
            &[bytemuck::bytes_of(&header), bytemuck::cast_slice(&manifest)],
            &fds,
        )
        .map_err(Error::sys("sendmsg"))?;
        if sent != total {
            return Err(Error::ShortSend {
                what: "the logon reply",
                expected: total,
                sent,
            });
        }
        Ok((pidfd, introductions))
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
        Err(error) => {
            return Err(Error::Path {
                op: "looking at",
                path: path.to_path_buf(),
                source: io_errno(&error),
            });
        }
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

/// A broker holds an fd for every ring, N (N - 1) of them for a world of N: lifts the soft fd
/// limit to the hard one, and returns the limit now in force.
fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
                hard
            } else {
                soft
            }
        }
        Ok((soft, _)) => soft,
        Err(_) => u64::MAX,
    }
}

/// A pidfd for the process at the other end of `stream`: `SO_PEERPIDFD` (Linux 6.5), which names
/// the process that connected whatever happened since; on older kernels `pidfd_open` of the
/// `SO_PEERCRED` pid, taken at accept.
fn peer_pidfd(stream: &UnixStream, pid: i32) -> Result<OwnedFd, Errno> {
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
