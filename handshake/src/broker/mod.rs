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
//! # Where things are
//!
//! This file holds the [`Listener`], its records and the poll loop; each step of a worker's life
//! has a file of its own: `accept` (who is calling, the frame read against a deadline,
//! refusals), `logon` (the frame validated, the rank given, the reply with every fd), `relay`
//! (notices from logged-on workers: outboxes, fds passed between workers, the bounded queue of
//! what goes back) and `liveness` (a worker that left or died, and the end of a job).
//!
//! # Logs
//!
//! Everything the broker does is also a `tracing` event with structured fields (rank, pid, uid,
//! reason). Complaints about one worker or one uid are rate-limited (a burst, then one line per
//! second with how many were suppressed), so a hostile worker cannot flood the log.

mod accept;
mod liveness;
mod logon;
mod relay;
mod status;

use crate::error::{Error, io_errno};
use crate::wire::{LOGON_LEN, MAX_WORLD_SIZE};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{AddressFamily, Backlog, SockFlag, SockType, UnixAddr};
use shmbroker_bindings::{RejectReason, WorkerNotice};
use std::collections::{HashMap, VecDeque};
use std::io::ErrorKind;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
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
        32 + 2 * self.max_pending as u64 + world * (world - 1) + world + world * per_worker
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
        /// How many processes held its rank before it in this job: more than 0 for a process
        /// that replaced one that died.
        rejoins: u32,
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
    /// A logged-on worker said goodbye: it is leaving on purpose. A worker says it before any
    /// peer can see it go, so these come in the order the workers left; [`Self::WorkerLeft`]
    /// follows once its socket closes.
    Leaving {
        /// Its rank.
        rank: u32,
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
pub struct StopHandle(Arc<EventFd>, Arc<crate::sync::AtomicBool>);

impl StopHandle {
    /// Makes the listener's `serve` return, and its next `poll_once` report [`Event::Stopped`].
    pub fn stop(&self) {
        let _ = self.0.write(1);
    }

    /// Says that the workers still there are being stopped on purpose (a launcher ending the job
    /// after a failure or its timeout): their departures without a goodbye are logged as
    /// stopped, at `info`, not as deaths. Events are reported as before.
    pub fn expect_departures(&self) {
        self.1.store(true, crate::sync::Ordering::Relaxed);
    }
}

struct Pending {
    stream: UnixStream,
    pid: i32,
    uid: u32,
    /// The caller's process, taken from the connection itself (see [`accept::peer_pidfd`]).
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
    /// How many processes held its rank before it in this job (see `logon::rejoin`).
    rejoins: u32,
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
    /// Every rank's readiness eventfd, made when the first worker that needs it logs on, kept
    /// until the job ends.
    readiness: HashMap<u32, OwnedFd>,
    stop: Arc<EventFd>,
    /// Set by [`StopHandle::expect_departures`]: departures are stops, not deaths.
    expected: Arc<crate::sync::AtomicBool>,
    /// The first rank of the current job that died, and the first that left.
    lost: Option<u32>,
    left: Option<u32>,
    /// Jobs ended so far.
    jobs: u64,
    /// The current job's id (from its first worker that gave one, or made by this broker when
    /// its first worker gave none), and the ids of the last [`ENDED_JOBS_KEPT`] jobs that ended,
    /// with how: a worker of a job that ended is refused.
    job_id: Option<u64>,
    /// Whether the current job's workers named its id (rather than this broker making it).
    job_named: bool,
    ended: VecDeque<(u64, String)>,
    /// Complaints about connections that never logged on, by uid.
    rejections: HashMap<u32, RateLimit>,
    /// Log lines about logons and departures, by uid: a process logging on and off in a loop
    /// must not fill the log either.
    comings: HashMap<u32, RateLimit>,
    /// The last status answer built, and when (see `status`); and the log budget of status
    /// requests, their own, so that a status client in a loop never uses up the one that
    /// reports deaths.
    status_answer: Option<(Instant, Vec<u8>)>,
    status_log: RateLimit,
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
    /// Which process of the rank was polled (its pid and how many held the rank before it):
    /// a logon handled first in the same round may have replaced it, and what was found then
    /// is about the old one.
    process: Option<(i32, u32)>,
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
            // SO_PEERCRED gives callers' effective uids.
            my_uid: nix::unistd::geteuid().as_raw(),
            pending: Vec::new(),
            rings: HashMap::new(),
            readiness: HashMap::new(),
            stop: Arc::new(stop),
            expected: Arc::new(crate::sync::AtomicBool::new(false)),
            lost: None,
            left: None,
            jobs: 0,
            job_id: None,
            job_named: false,
            ended: VecDeque::new(),
            rejections: HashMap::new(),
            comings: HashMap::new(),
            status_answer: None,
            status_log: RateLimit::default(),
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
        StopHandle(Arc::clone(&self.stop), Arc::clone(&self.expected))
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
            // Found about a process that a rejoin handled above replaced: nothing to do with
            // the new one (it is polled next round).
            let now = self.workers[rank].as_ref().map(|w| (w.pid, w.rejoins));
            if now != worker.process {
                continue;
            }
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
                watched.push((None, false, false));
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
            watched.push((
                Some((worker.pid, worker.rejoins)),
                stream.is_some(),
                pidfd.is_some(),
            ));
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
            .map(|(process, has_stream, has_pidfd)| {
                let stream = if has_stream { rest.next() } else { None };
                let pidfd = if has_pidfd { rest.next() } else { None };
                let stream = stream.map_or(PollFlags::empty(), revents);
                WorkerReady {
                    process,
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
