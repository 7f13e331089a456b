//! The worker's side: [`connect`] logs on and returns a [`Connection`] holding everything received.
//!
//! This file is the plumbing: logging on, the socket to the broker, the rings, and what the
//! broker relays (outboxes, peers' processes, fds, channels). Who is there (deaths, departures,
//! interrupts, rejoins) is `membership`.

mod membership;

use crate::error::{Error, ProtocolError, io_errno};
use crate::liveness::{RelayAnswer, Shared, Watcher};
use crate::wire::{MANIFEST_ENTRY_LEN, REPLY_HEADER_LEN, decode_manifest, decode_reply_header};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr};
use shmbroker_bindings::{
    FdRole, LogonFrame, ManifestEntry, Message, NO_PEER, NoticeKind, RING_LAYOUT_VERSION,
    WorkerNotice,
};
use shmbroker_queues::{Consumer, Interrupt, Notifier, Producer, Role};
use shmbroker_sys::fdpass::{recv_with_fds, send_with_fds};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The instant `timeout` from now: see [`deadline_from`].
pub fn deadline_after(timeout: Duration) -> Instant {
    deadline_from(Instant::now(), timeout)
}

/// The instant `timeout` after `start`. A timeout longer than a century (`Duration::MAX`, which
/// callers pass to wait without a deadline) counts as a century, which no wait outlives, so the
/// sum never overflows.
pub fn deadline_from(start: Instant, timeout: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
    // (No clock on Linux overflows a century on; were one to, a year, then an hour: never a
    // deadline already past.)
    [
        timeout.min(CENTURY),
        timeout.min(YEAR),
        timeout.min(Duration::from_secs(3600)),
    ]
    .into_iter()
    .find_map(|timeout| start.checked_add(timeout))
    .unwrap_or(start)
}

/// How long to wait between attempts while the broker's socket is missing or its backlog is full.
const CONNECT_RETRY: Duration = Duration::from_millis(5);

/// The two rings between this worker and one peer.
#[derive(Debug)]
pub struct Link {
    /// Messages to the peer.
    pub to: Producer<Message>,
    /// Messages from the peer.
    pub from: Consumer<Message>,
}

/// A logged-on worker: its rank, its rings to and from every peer, its socket to the broker, and
/// the watcher that sees peers and the broker go (see the `liveness` module).
#[derive(Debug)]
pub struct Connection {
    rank: u32,
    world_size: u32,
    ring_capacity: u32,
    /// How many processes held this rank before this one (see [`Self::rejoins`]).
    rejoins: u32,
    socket: UnixStream,
    links: Vec<Option<Link>>,
    /// This worker's readiness eventfd (see [`Self::readiness_fd`]).
    readiness: Notifier,
    /// What the broker sent and who is gone, shared with the watcher thread.
    shared: Arc<Shared>,
    /// Stopped (and joined) first when the session drops.
    watcher: Option<Watcher>,
}

impl Connection {
    /// This worker's rank.
    #[must_use]
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Ranks in the world.
    #[must_use]
    pub fn world_size(&self) -> u32 {
        self.world_size
    }

    /// This worker's readiness eventfd: every peer's producer signals it when it sends while this
    /// worker's consumers are armed ([`shmbroker_queues::Consumer::arm`]; the queues crate's
    /// `readiness` module has the protocol).
    #[must_use]
    pub fn readiness_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.readiness.as_fd()
    }

    /// A shared handle on [`Self::readiness_fd`], for a thread that waits on it without
    /// borrowing the connection.
    #[must_use]
    pub fn readiness(&self) -> Notifier {
        Arc::clone(&self.readiness)
    }

    /// Slots in every ring.
    #[must_use]
    pub fn ring_capacity(&self) -> u32 {
        self.ring_capacity
    }

    /// The rings to and from `peer`; `None` for this worker's own rank or one out of range.
    pub fn link(&mut self, peer: u32) -> Option<&mut Link> {
        self.links.get_mut(peer as usize)?.as_mut()
    }

    /// The socket to the broker, open for the whole session (its closing tells the broker this
    /// worker is gone). It is non-blocking, and only the session's watcher thread reads it.
    #[must_use]
    pub fn broker_socket(&self) -> &UnixStream {
        &self.socket
    }

    /// Has the watcher thread stamp `status_word::ALIVE` in `words` (this worker's own) every
    /// `clock::TICK`, so that a reader who finds this process stopped can say for how long.
    /// Only the first call counts. The first stamp is made now: a process stopped before its
    /// watcher's next tick still says since when.
    pub fn publish_heartbeat(&self, words: shmbroker_allocator::StatusWords) {
        use shmbroker_bindings::status_word::{ALIVE, ALIVE_SLOT};
        words.slot(ALIVE_SLOT)[ALIVE]
            .store(crate::clock::now(), std::sync::atomic::Ordering::Relaxed);
        let _ = self.shared.heartbeat.set(words);
    }

    /// Publishes this worker's outbox: the broker checks its seals and passes it to every peer.
    /// Call it once, with a memfd sealed so that only this process can write it.
    ///
    /// # Errors
    ///
    /// As for [`Self::relay_fd`].
    pub fn publish_outbox(&mut self, fd: BorrowedFd<'_>, timeout: Duration) -> Result<(), Error> {
        let notice = WorkerNotice::new(NoticeKind::Outbox, NO_PEER, 0);
        self.send_notice(notice, Some(fd), "publishing the outbox", timeout)
    }

    /// Rank `owner`'s outbox, waiting up to `timeout` for the broker to pass it on. Each peer's
    /// outbox is handed over once.
    ///
    /// # Errors
    ///
    /// As for [`Self::take_relayed_fd`].
    pub fn take_peer_outbox(&mut self, owner: u32, timeout: Duration) -> Result<OwnedFd, Error> {
        let deadline = deadline_after(timeout);
        self.shared.wait_for(
            owner,
            deadline,
            "waiting for a peer's outbox",
            timeout,
            |inbox| inbox.outboxes.remove(&owner),
        )
    }

    /// Rank `peer`'s process id as the broker saw it log on, waiting up to `timeout` for it to
    /// arrive. Not a pid a peer claims: one to trust.
    ///
    /// # Errors
    ///
    /// As for [`Self::take_relayed_fd`].
    pub fn peer_pid(&mut self, peer: u32, timeout: Duration) -> Result<i32, Error> {
        self.peer_process(peer, timeout).map(|(pid, _)| pid)
    }

    /// Rank `peer`'s pid and a pidfd for that very process (the broker opened it while the peer
    /// waited for its logon reply, so it cannot name another process that reused the pid),
    /// waiting up to `timeout` for the broker to pass them on.
    ///
    /// # Errors
    ///
    /// As for [`Self::take_relayed_fd`].
    pub fn peer_process(
        &mut self,
        peer: u32,
        timeout: Duration,
    ) -> Result<(i32, Arc<OwnedFd>), Error> {
        let deadline = deadline_after(timeout);
        self.shared.wait_for(
            peer,
            deadline,
            "waiting for a peer's process",
            timeout,
            |inbox| {
                inbox
                    .peers
                    .get(&peer)
                    .map(|process| (process.pid, Arc::clone(&process.pidfd)))
            },
        )
    }

    /// The pid `peer`'s process sees itself as (`getpid`, in its own PID namespace), once the
    /// broker has passed its process on ([`Self::peer_process`]) and if this process can see
    /// into that namespace; `None` otherwise (a sibling container's process). Never waits.
    #[must_use]
    pub fn peer_own_pid(&self, peer: u32) -> Option<i32> {
        self.shared
            .lock()
            .peers
            .get(&peer)
            .and_then(|process| process.own_pid)
    }

    /// Sends one notice (with an fd, or none) to the broker, waiting up to `timeout` for room.
    fn send_notice(
        &mut self,
        notice: WorkerNotice,
        fd: Option<BorrowedFd<'_>>,
        stage: &'static str,
        timeout: Duration,
    ) -> Result<(), Error> {
        let deadline = deadline_after(timeout);
        let bytes = bytemuck::bytes_of(&notice);
        let mut fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
        let mut sent = 0;
        // The fd rides on the first byte; a notice cut short is finished without it.
        while sent < bytes.len() {
            if self.shared.broker_lost() {
                return Err(Error::BrokerLost { stage });
            }
            match send_with_fds(self.socket.as_fd(), &[&bytes[sent..]], &fds) {
                Ok(n) => {
                    sent += n;
                    fds.clear();
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => {
                    if !wait_for(&self.socket, PollFlags::POLLOUT, deadline)
                        .map_err(Error::sys("poll"))?
                    {
                        return Err(if sent == 0 {
                            Error::Timeout { stage, timeout }
                        } else {
                            Error::ShortSend {
                                what: "a notice to the broker",
                                expected: bytes.len(),
                                sent,
                            }
                        });
                    }
                }
                Err(Errno::EPIPE | Errno::ECONNRESET) => {
                    return Err(Error::BrokerLost { stage });
                }
                Err(other) => return Err(Error::sys("sendmsg")(other)),
            }
        }
        Ok(())
    }

    /// Passes `fd` to rank `to` through the broker (`SCM_RIGHTS` both ways), tagged `token`, and
    /// waits for the broker to say it did; `to` takes it with [`Self::take_relayed_fd`]. For
    /// when `pidfd_getfd` is not allowed.
    ///
    /// # Errors
    ///
    /// [`Error::RelayRefused`] when `to` is not logged on or already holds as many relayed fds
    /// as it may without taking them; [`Error::Timeout`] if the socket stays full or the answer
    /// does not come; [`Error::BrokerLost`]; [`Error::Sys`] if sending fails.
    pub fn relay_fd(
        &mut self,
        to: u32,
        token: u64,
        fd: BorrowedFd<'_>,
        timeout: Duration,
    ) -> Result<(), Error> {
        if to >= self.world_size || to == self.rank {
            return Err(Error::RelayRefused {
                to,
                reason: "no such rank: another rank of this world is needed",
                full: false,
            });
        }
        let deadline = deadline_after(timeout);
        let stage = "relaying an fd through the broker";
        let notice = WorkerNotice::new(NoticeKind::RelayFd, to, token);
        self.send_notice(notice, Some(fd), stage, timeout)?;
        let answer = self
            .shared
            .wait_for(to, deadline, stage, timeout, |inbox| {
                inbox.relay_answers.remove(&(to, token))
            })?;
        match answer {
            RelayAnswer::Delivered => Ok(()),
            RelayAnswer::Refused(NoticeKind::RelayRefusedFull) => Err(Error::RelayRefused {
                to,
                reason: "it already holds as many relayed fds as it may without taking them",
                full: true,
            }),
            RelayAnswer::Refused(NoticeKind::RelayRefusedGone) => Err(Error::RelayRefused {
                to,
                reason: "it is not logged on",
                full: false,
            }),
            RelayAnswer::Refused(_) => Err(Error::RelayRefused {
                to,
                reason: "the fd did not reach the broker (it may be short of fds)",
                full: false,
            }),
        }
    }

    /// The fd rank `from` relayed with `token`, waiting up to `timeout` for it to arrive. The
    /// broker is told it was taken, so that it no longer counts against this worker's limit.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`]; [`Error::BrokerLost`]; [`Error::Protocol`] if the broker sent
    /// something that is not a notice.
    pub fn take_relayed_fd(
        &mut self,
        from: u32,
        token: u64,
        timeout: Duration,
    ) -> Result<OwnedFd, Error> {
        let deadline = deadline_after(timeout);
        let fd = self.shared.wait_for(
            from,
            deadline,
            "waiting for a relayed fd",
            timeout,
            |inbox| inbox.relayed.remove(&(from, token)),
        )?;
        self.claim(from, token);
        Ok(fd)
    }

    /// Asks the broker for the ring of a typed channel from this worker to rank `to` (`token`
    /// is a [`ChannelToken`](shmbroker_bindings::ChannelToken)), and waits for it: this worker
    /// produces; `to` is offered the same ring ([`Self::take_channel`]).
    ///
    /// # Errors
    ///
    /// [`Error::RelayRefused`] when the broker made none (`to` is not logged on, or holds as
    /// many fds it has not taken as it may); [`Error::Timeout`]; [`Error::BrokerLost`];
    /// [`Error::PeerLost`] if `to` died.
    pub fn request_channel(
        &mut self,
        to: u32,
        token: u64,
        timeout: Duration,
    ) -> Result<OwnedFd, Error> {
        if to >= self.world_size || to == self.rank {
            return Err(Error::RelayRefused {
                to,
                reason: "no such rank: a channel goes to another rank of this world",
                full: false,
            });
        }
        let deadline = deadline_after(timeout);
        let stage = "asking the broker for a channel";
        let notice = WorkerNotice::new(NoticeKind::ChannelRequest, to, token);
        self.send_notice(notice, None, stage, timeout)?;
        let answer = self
            .shared
            .wait_for(to, deadline, stage, timeout, |inbox| {
                inbox.channel_answers.remove(&(to, token))
            })?;
        answer.ok_or(Error::RelayRefused {
            to,
            reason: "it is not logged on, or holds as many fds it has not taken as it may",
            full: false,
        })
    }

    /// The ring of channel number `number` that rank `from` asked for to this worker, waiting
    /// up to `timeout` for the broker's offer: the request's token and the ring (this worker
    /// consumes). The broker is told it was taken.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`]; [`Error::BrokerLost`]; [`Error::PeerLost`] if `from` died.
    pub fn take_channel(
        &mut self,
        from: u32,
        number: u64,
        timeout: Duration,
    ) -> Result<(u64, OwnedFd), Error> {
        let deadline = deadline_after(timeout);
        let (token, fd) = self.shared.wait_for(
            from,
            deadline,
            "waiting for a channel's ring",
            timeout,
            |inbox| inbox.channel_offers.remove(&(from, number)),
        )?;
        self.claim(from, token);
        Ok((token, fd))
    }

    /// Tells the broker the fd `from` relayed with `token` was taken (or closed), within
    /// [`CLAIM_TIMEOUT`] whatever the caller's wait was; a claim that cannot go now is kept
    /// for the next [`Self::claim_dropped_relays`] (a lost one would count against this
    /// worker's limit for good).
    fn claim(&mut self, from: u32, token: u64) {
        let claimed = WorkerNotice::new(NoticeKind::Claimed, from, token);
        let stage = "saying a relayed fd was taken";
        // Nothing went (the socket stayed full): kept for later. A broker that is gone has
        // nothing left to count; a notice cut short has broken the stream whatever follows.
        if let Err(Error::Timeout { .. }) = self.send_notice(claimed, None, stage, CLAIM_TIMEOUT) {
            self.shared.lock().relays_to_claim.push((from, token));
        }
    }

    /// Tells the broker of every relayed fd this worker closed without a claim yet: those
    /// [`Self::abandon_relays_below`] made its watcher close as they came.
    pub fn claim_dropped_relays(&mut self) {
        let claims = std::mem::take(&mut self.shared.lock().relays_to_claim);
        for (from, token) in claims {
            self.claim(from, token);
        }
    }

    /// Gives up on every relayed fd whose token's low 48 bits ([`RELAY_ORDER_MASK`]) are below
    /// `floor`, for good: those held are closed now, those still to come are closed as they
    /// come, and the broker is told each was taken (so they stop counting against this worker's
    /// limit). A session calls it when its part in an exchange fails, with tokens ordered by
    /// exchange in those bits, so that a relay it no longer waits for (from an exporter stopped
    /// past the deadline, or one that went on after this rank failed) leaves nothing behind.
    pub fn abandon_relays_below(&mut self, floor: u64) {
        let claims: Vec<(u32, u64)> = {
            let mut inbox = self.shared.lock();
            inbox.relay_floor = inbox.relay_floor.max(floor);
            let floor = inbox.relay_floor;
            let stale: Vec<(u32, u64)> = inbox
                .relayed
                .keys()
                .filter(|(_, token)| token & RELAY_ORDER_MASK < floor)
                .copied()
                .collect();
            for key in &stale {
                inbox.relayed.remove(key);
            }
            stale
        };
        for (from, token) in claims {
            self.claim(from, token);
        }
        self.claim_dropped_relays();
    }
}

/// How long a claim of a relayed fd may take to reach the broker's socket.
const CLAIM_TIMEOUT: Duration = Duration::from_millis(100);

/// The bits of a relay token that order it: [`Connection::abandon_relays_below`] compares these.
pub const RELAY_ORDER_MASK: u64 = (1 << 48) - 1;

impl Drop for Connection {
    /// Leaves on purpose: tells the broker first (before any peer can see this worker go, so the
    /// broker hears of leaves in the order they happen), closes this worker's ends of every ring
    /// (peers that see its process exit afterwards know it left, not died), and stops the
    /// watcher. The ends are closed citing why this worker's last failed call failed, if one did:
    /// a death, so the peers still there know it left because of that death (see the `liveness`
    /// module), or a rank a timed-out call waited for (the `TIMED_OUT` flag set), so they say it
    /// left after timing out on that rank.
    fn drop(&mut self) {
        let notice = WorkerNotice::new(NoticeKind::Goodbye, NO_PEER, 0);
        // Never block in drop (the socket is non-blocking): a notice fits in any socket buffer;
        // if not, the broker treats this worker as lost, which is the safe side.
        let _ = (&self.socket).write(bytemuck::bytes_of(&notice));
        let cause = self.shared.departure_cause();
        for link in self.links.iter().flatten() {
            let (to, from) = (link.to.closer(), link.from.closer());
            match cause {
                Some(rank) => {
                    to.close_end_citing(Role::Producer, rank);
                    from.close_end_citing(Role::Consumer, rank);
                }
                None => {
                    to.close_end(Role::Producer);
                    from.close_end(Role::Consumer);
                }
            }
        }
        drop(self.watcher.take());
    }
}

/// Logs on to the broker at `path` with `logon`. One deadline, `timeout` from now, covers
/// reaching the broker (retrying while its socket does not exist yet or refuses), sending the
/// frame and receiving the reply.
///
/// Every fd received is closed on every error path. Seals, sizes and layouts are checked before
/// anything is mapped.
///
/// # Errors
///
/// [`Error::Unreachable`] naming the path when no broker answered in time; [`Error::Timeout`]
/// naming the stage; [`Error::Connect`]; [`Error::Rejected`] with the broker's reason;
/// [`Error::Protocol`] for a malformed reply; [`Error::Ring`] when a received file is not what
/// its manifest entry says.
pub fn connect(
    path: impl AsRef<Path>,
    logon: LogonFrame,
    timeout: Duration,
) -> Result<Connection, Error> {
    let deadline = deadline_after(timeout);
    let stream = reach(path.as_ref(), deadline, timeout)?;
    log_on(stream, logon, deadline, timeout)
}

/// Logs on over `stream`, already connected to a broker some other way (a socketpair, an
/// inherited socket; the broker side uses [`Listener::adopt`](crate::Listener::adopt)). The
/// same checks and a deadline `timeout` from now apply as in [`connect`].
///
/// # Errors
///
/// As for [`connect`], less the connection errors.
pub fn connect_stream(
    stream: UnixStream,
    logon: LogonFrame,
    timeout: Duration,
) -> Result<Connection, Error> {
    stream
        .set_nonblocking(true)
        .map_err(|e| Error::sys("fcntl")(io_errno(&e)))?;
    log_on(stream, logon, deadline_after(timeout), timeout)
}

/// Sends the frame, receives and checks the reply, joins everything: the logon after connecting.
fn log_on(
    mut stream: UnixStream,
    logon: LogonFrame,
    deadline: Instant,
    timeout: Duration,
) -> Result<Connection, Error> {
    match send_until(&mut stream, bytemuck::bytes_of(&logon), deadline) {
        Ok(()) => {}
        // A broker that refuses a caller at accept (its uid, say) answers and closes before the
        // frame arrives, so the write fails; its answer is still waiting to be read.
        Err(Some(Error::Sys {
            op,
            source: source @ (Errno::EPIPE | Errno::ECONNRESET),
        })) => {
            return match receive_reply(&stream, deadline, timeout) {
                Err(rejected @ Error::Rejected { .. }) => Err(rejected),
                _ => Err(Error::Sys { op, source }),
            };
        }
        Err(error) => {
            return Err(error.unwrap_or(Error::Timeout {
                stage: "sending the logon frame",
                timeout,
            }));
        }
    }
    let (header, manifest, fds) = receive_reply(&stream, deadline, timeout)?;
    // The socket stays non-blocking: every wait on it is a poll with a deadline.
    Connection::from_reply(stream, &header, &manifest, fds)
}

/// Asks the broker at `path` what its job's ranks are doing (`shmbroker status`). One deadline,
/// `timeout` from now, covers connecting, asking and reading the whole answer.
///
/// # Errors
///
/// As for [`connect`]: [`Error::Unreachable`], [`Error::Timeout`], [`Error::Connect`],
/// [`Error::Rejected`] (a uid the broker does not admit, say) and [`Error::Protocol`] for an
/// answer that is cut or malformed.
pub fn status(
    path: impl AsRef<Path>,
    timeout: Duration,
) -> Result<crate::wire::StatusReport, Error> {
    let deadline = deadline_after(timeout);
    let mut stream = reach(path.as_ref(), deadline, timeout)?;
    let request = crate::wire::status_request();
    let timed_out = |stage| Error::Timeout { stage, timeout };
    // A refusal at accept comes before the request is read; it is read below all the same.
    match send_until(&mut stream, bytemuck::bytes_of(&request), deadline) {
        Ok(()) | Err(Some(Error::Sys { .. })) => {}
        Err(error) => return Err(error.unwrap_or(timed_out("sending the status request"))),
    }
    // The answer, up to the broker's close: never more than its largest world's.
    let most = crate::wire::status_reply_len(crate::wire::MAX_WORLD_SIZE);
    let mut answer = Vec::with_capacity(4096);
    let mut buffer = [0u8; 16384];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buffer[..n]);
                if answer.len() > most {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if !wait_for(&stream, PollFlags::POLLIN, deadline).map_err(Error::sys("poll"))? {
                    return Err(timed_out("reading the status answer"));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // A reset after the whole answer arrived (the broker closed with the request unread).
            Err(_) if !answer.is_empty() => break,
            Err(e) => return Err(Error::sys("read")(io_errno(&e))),
        }
    }
    crate::wire::decode_status_reply(&answer)
}

/// Connects to the broker at `path` by `deadline` (`timeout` from the call's start), with the
/// error a caller reports.
/// The broker's credentials are checked before the caller sends anything.
fn reach(path: &Path, deadline: Instant, timeout: Duration) -> Result<UnixStream, Error> {
    let stream = connect_until(path, deadline).map_err(|e| match e {
        Retried::GaveUp(last) => Error::Unreachable {
            path: path.to_path_buf(),
            timeout,
            last,
        },
        Retried::Failed(Errno::ENOTSOCK) => Error::NotASocket {
            path: path.to_path_buf(),
        },
        Retried::Failed(source) => Error::Connect {
            path: path.to_path_buf(),
            source,
        },
    })?;
    crate::trust::check_broker(&stream, path)?;
    Ok(stream)
}

/// Why connecting stopped.
enum Retried {
    /// The deadline passed; the last attempt's error.
    GaveUp(Errno),
    /// An error retrying cannot help.
    Failed(Errno),
}

/// Connects without blocking past `deadline`, retrying while the socket is missing or refuses.
fn connect_until(path: &Path, deadline: Instant) -> Result<UnixStream, Retried> {
    let address = UnixAddr::new(path).map_err(Retried::Failed)?;
    // When connecting to a socket file started being refused, in the current run of refusals.
    let mut refused_since = None;
    loop {
        let socket = nix::sys::socket::socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(Retried::Failed)?;
        let last = match nix::sys::socket::connect(socket.as_raw_fd(), &address) {
            Ok(()) => return Ok(UnixStream::from(socket)),
            // Refused: a file that is no socket, or a socket nobody listens on (a broker that
            // died and left it, or one between its bind and its listen). Only the last is worth
            // a short wait.
            Err(Errno::ECONNREFUSED) => {
                if !is_socket(path) {
                    return Err(Retried::Failed(Errno::ENOTSOCK));
                }
                let refused = *refused_since.get_or_insert_with(Instant::now);
                if refused.elapsed() >= STALE_AFTER {
                    return Err(Retried::Failed(Errno::ECONNREFUSED));
                }
                Errno::ECONNREFUSED
            }
            // Not there yet, or its backlog is full: try again in a moment.
            Err(errno @ (Errno::ENOENT | Errno::EAGAIN)) => {
                refused_since = None;
                errno
            }
            Err(other) => return Err(Retried::Failed(other)),
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Retried::GaveUp(last));
        }
        std::thread::sleep(CONNECT_RETRY.min(left));
    }
}

/// How long a socket file may refuse connections before it counts as stale (left by a broker
/// that is gone) rather than one whose broker has bound it but not yet listens.
const STALE_AFTER: Duration = Duration::from_millis(50);

/// Whether `path` is a socket file (following links, as `connect` does).
fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|meta| meta.file_type().is_socket())
}

/// Waits until `stream` is ready for `flags` or `deadline` passes (`false`).
fn wait_for(stream: &UnixStream, flags: PollFlags, deadline: Instant) -> Result<bool, Errno> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let millis = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(stream.as_fd(), flags)];
        match poll(&mut fds, PollTimeout::from(millis)) {
            Ok(0) | Err(Errno::EINTR) => {}
            Ok(_) => return Ok(true),
            Err(other) => return Err(other),
        }
    }
}

/// Writes all of `bytes`. `Err(None)`: the deadline passed.
fn send_until(
    stream: &mut UnixStream,
    bytes: &[u8],
    deadline: Instant,
) -> Result<(), Option<Error>> {
    let mut sent = 0;
    while sent < bytes.len() {
        match stream.write(&bytes[sent..]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if !wait_for(stream, PollFlags::POLLOUT, deadline)
                    .map_err(|e| Some(Error::sys("poll")(e)))?
                {
                    return Err(None);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Some(Error::sys("write")(io_errno(&e)))),
        }
    }
    Ok(())
}

/// Receives a whole reply: the header, the manifest it announces, and the fds.
fn receive_reply(
    stream: &UnixStream,
    deadline: Instant,
    timeout: Duration,
) -> Result<
    (
        shmbroker_bindings::ReplyHeader,
        Vec<ManifestEntry>,
        Vec<OwnedFd>,
    ),
    Error,
> {
    let mut bytes = Vec::new();
    let mut fds = Vec::new();
    let mut scratch =
        vec![0u8; REPLY_HEADER_LEN + 2 * shmbroker_bindings::MAX_REPLY_FDS * MANIFEST_ENTRY_LEN];
    let mut expected = REPLY_HEADER_LEN;
    let mut header = None;
    while bytes.len() < expected {
        let want = (expected - bytes.len()).min(scratch.len());
        match recv_with_fds(stream.as_fd(), &mut scratch[..want], &mut fds) {
            Ok(received) => {
                if received.control_truncated {
                    return Err(ProtocolError::ControlTruncated.into());
                }
                if received.bytes == 0 {
                    // A rejection is a bare header; anything shorter than announced is truncated.
                    return Err(match decode_reply_header(&bytes) {
                        Err(error) => error,
                        Ok(_) => ProtocolError::Truncated {
                            expected,
                            found: bytes.len(),
                        }
                        .into(),
                    });
                }
                bytes.extend_from_slice(&scratch[..received.bytes]);
            }
            Err(Errno::EAGAIN) => {
                if !wait_for(stream, PollFlags::POLLIN, deadline).map_err(Error::sys("poll"))? {
                    return Err(Error::Timeout {
                        stage: "waiting for the broker's reply",
                        timeout,
                    });
                }
            }
            Err(Errno::EINTR) => {}
            Err(other) => return Err(Error::sys("recvmsg")(other)),
        }
        if header.is_none() && bytes.len() >= REPLY_HEADER_LEN {
            let decoded = decode_reply_header(&bytes)?;
            expected = REPLY_HEADER_LEN + decoded.fd_count as usize * MANIFEST_ENTRY_LEN;
            header = Some(decoded);
        }
    }
    let header = header.ok_or(ProtocolError::Truncated {
        expected: REPLY_HEADER_LEN,
        found: bytes.len(),
    })?;
    let manifest = decode_manifest(&header, &bytes[REPLY_HEADER_LEN..])?;
    if fds.len() != manifest.len() {
        return Err(ProtocolError::FdCount {
            expected: manifest.len(),
            found: fds.len(),
        }
        .into());
    }
    Ok((header, manifest, fds))
}

/// The two ends of a link as they are joined, in manifest order.
type HalfLink = (Option<Producer<Message>>, Option<Consumer<Message>>);

impl Connection {
    fn from_reply(
        socket: UnixStream,
        header: &shmbroker_bindings::ReplyHeader,
        manifest: &[ManifestEntry],
        fds: Vec<OwnedFd>,
    ) -> Result<Self, Error> {
        let mut links: Vec<HalfLink> = (0..header.world_size).map(|_| (None, None)).collect();
        let mut readiness: Vec<Option<Notifier>> = vec![None; header.world_size as usize];
        for (index, (entry, fd)) in manifest.iter().zip(&fds).enumerate() {
            let role = FdRole::from_code(entry.role);
            let expected_version = RING_LAYOUT_VERSION;
            let value = |field, expected: u64, found: u64| ProtocolError::ManifestValue {
                index,
                field,
                expected,
                found,
            };
            if entry.layout_version != expected_version {
                return Err(value(
                    "layout_version",
                    u64::from(expected_version),
                    u64::from(entry.layout_version),
                )
                .into());
            }
            let size =
                shmbroker_queues::memfd::file_size(fd.as_fd()).map_err(|source| Error::Ring {
                    role: "size of",
                    peer: entry.peer,
                    source,
                })?;
            if size != entry.size {
                return Err(value("size", entry.size, size).into());
            }
            let peer = entry.peer as usize;
            match role {
                Some(FdRole::RingToPeer) => {
                    let ring = Producer::join(fd.as_fd()).map_err(|source| Error::Ring {
                        role: "to",
                        peer: entry.peer,
                        source,
                    })?;
                    links[peer].0 = Some(ring);
                }
                Some(FdRole::RingFromPeer) => {
                    let ring = Consumer::join(fd.as_fd()).map_err(|source| Error::Ring {
                        role: "from",
                        peer: entry.peer,
                        source,
                    })?;
                    links[peer].1 = Some(ring);
                }
                Some(FdRole::Readiness) => {
                    // Signalled by writing 8 bytes: it must be what it says, not any file.
                    if !shmbroker_sys::eventfd::is_eventfd(fd.as_fd()) {
                        return Err(ProtocolError::NotAnEventFd {
                            index,
                            peer: entry.peer,
                        }
                        .into());
                    }
                    let own = fd
                        .try_clone()
                        .map_err(|e| Error::sys("dup of a readiness eventfd")(io_errno(&e)))?;
                    readiness[peer] = Some(Arc::new(own));
                }
                // `decode_manifest` checked every role against the protocol's order.
                None => {
                    return Err(value("role", 1, u64::from(entry.role)).into());
                }
            }
        }
        let own = readiness[header.rank as usize]
            .clone()
            .ok_or(ProtocolError::FdCount {
                expected: manifest.len(),
                found: 0,
            })?;
        // Every producer holds its consumer's eventfd and every consumer its own, before the
        // closers are made (they keep the notifier they are made with).
        let interrupt = Arc::new(Interrupt::new());
        let links: Vec<Option<Link>> = links
            .into_iter()
            .zip(&readiness)
            .map(|((to, from), theirs)| {
                let (mut to, mut from) = (to?, from?);
                to.set_notify(theirs.clone()?);
                from.set_notify(own.clone());
                from.set_interrupt(Arc::clone(&interrupt));
                Some(Link { to, from })
            })
            .collect();
        let closers = links
            .iter()
            .map(|link| {
                link.as_ref()
                    .map(|link| (link.to.closer(), link.from.closer()))
            })
            .collect();
        let shared = Arc::new(Shared::new(header.rank, closers, interrupt, own.clone()));
        let reader = socket
            .try_clone()
            .map_err(|e| Error::sys("dup of the broker socket")(io_errno(&e)))?;
        let watcher = Watcher::start(
            Arc::clone(&shared),
            reader,
            header.world_size,
            header.rejoins > 0,
        )?;
        Ok(Self {
            rank: header.rank,
            world_size: header.world_size,
            ring_capacity: header.ring_capacity,
            rejoins: header.rejoins,
            socket,
            links,
            readiness: own,
            shared,
            watcher: Some(watcher),
        })
    }
}
