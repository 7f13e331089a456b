//! The watcher thread: sleeps in `poll(2)` on every peer's pidfd, the broker's socket and a stop
//! eventfd, files what the broker sends and records the exits it sees (see the liveness module).
//! It also wakes every `clock::TICK` to refresh the coarse clock calls stamp themselves with.

use super::{PeerProcess, RelayAnswer, Shared};
use crate::error::{Error, ProtocolError};
use crate::wire::{BrokerNotice, decode_broker_notice};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use shmbroker_bindings::{NoticeKind, WorkerNotice};
use shmbroker_sys::fdpass::recv_with_fds;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

/// The watcher thread, stopped and joined when dropped.
#[derive(Debug)]
pub(crate) struct Watcher {
    stop: Arc<EventFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    /// Starts watching, reading notices from `socket` (a duplicate of the session's).
    pub fn start(
        shared: Arc<Shared>,
        socket: UnixStream,
        world_size: u32,
        replacement: bool,
    ) -> Result<Self, Error> {
        let stop = Arc::new(
            EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .map_err(Error::sys("eventfd"))?,
        );
        // The broker's pid numbers mean the same here only in its PID namespace (see
        // `check_pidfd`); a broker outside this one shows as pid 0.
        let broker =
            nix::sys::socket::getsockopt(&socket, nix::sys::socket::sockopt::PeerCredentials)
                .map_or(0, |credentials| credentials.pid());
        let reader = Reader {
            shared,
            broker_in_my_namespace: shmbroker_sys::pidfd::same_pid_namespace(broker),
            socket,
            world_size,
            replacement,
            frame: Vec::with_capacity(size_of::<WorkerNotice>()),
            fds: std::collections::VecDeque::new(),
        };
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("shmbroker-watch".into())
            .spawn(move || reader.run(&thread_stop))
            .map_err(Error::io("spawning the watcher thread"))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The watcher thread's state: the socket and the part of a notice read so far.
struct Reader {
    shared: Arc<Shared>,
    /// Whether the broker is in this process's PID namespace.
    broker_in_my_namespace: bool,
    socket: UnixStream,
    world_size: u32,
    /// Whether this worker replaced a rank that died (see `decode_broker_notice`).
    replacement: bool,
    frame: Vec<u8>,
    fds: std::collections::VecDeque<OwnedFd>,
}

impl Reader {
    fn run(mut self, stop: &EventFd) {
        loop {
            // The coarse clock every call of this process stamps itself with (see `clock`).
            crate::clock::tick();
            // That this process still runs, for readers who find it stopped.
            if let Some(words) = self.shared.heartbeat.get() {
                use shmbroker_bindings::status_word::{ALIVE, ALIVE_SLOT};
                words.slot(ALIVE_SLOT)[ALIVE]
                    .store(crate::clock::now(), std::sync::atomic::Ordering::Relaxed);
            }
            let reading = !self.shared.broker_lost() && self.shared.lock().fault.is_none();
            let dead = self.shared.state.gone();
            let peers: Vec<(u32, Arc<OwnedFd>)> = self
                .shared
                .lock()
                .peers
                .iter()
                .filter(|(rank, _)| dead & (1 << (**rank % 64)) == 0)
                .map(|(&rank, process)| (rank, Arc::clone(&process.pidfd)))
                .collect();
            // Once the broker is lost (or broke the protocol) its socket is left out: a socket
            // that hung up is always ready, and polling it would spin.
            let mut fds = vec![PollFd::new(stop.as_fd(), PollFlags::POLLIN)];
            if reading {
                fds.push(PollFd::new(self.socket.as_fd(), PollFlags::POLLIN));
            }
            let first_pidfd = fds.len();
            fds.extend(
                peers
                    .iter()
                    .map(|(_, pidfd)| PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)),
            );
            let tick = PollTimeout::try_from(crate::clock::TICK).unwrap_or(PollTimeout::MAX);
            match poll(&mut fds, tick) {
                Ok(_) | Err(Errno::EINTR) => {}
                // Only ENOMEM is possible with valid fds: try again in a moment, never give up
                // watching (nor spin).
                Err(_) => {
                    drop(fds);
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
            }
            let woke = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
            if woke(&fds[0]) {
                return;
            }
            let socket_ready = reading && woke(&fds[1]);
            let exited: Vec<super::Exit> = peers
                .iter()
                .zip(&fds[first_pidfd..])
                .filter(|(_, fd)| woke(fd))
                .map(|((rank, pidfd), _)| (*rank, Some(Arc::clone(pidfd))))
                .collect();
            drop(fds);
            // Notices first: a peer that logged on and died at once has its pidfd filed here.
            if socket_ready {
                self.read_notices();
            }
            self.shared.record_exits(&exited);
        }
    }

    /// Reads every notice there is; on end of file, the broker is lost.
    fn read_notices(&mut self) {
        loop {
            let mut buffer = [0u8; size_of::<WorkerNotice>()];
            let want = buffer.len() - self.frame.len();
            let mut fds = Vec::new();
            let received = recv_with_fds(self.socket.as_fd(), &mut buffer[..want], &mut fds);
            self.fds.extend(fds);
            if matches!(&received, Ok(r) if r.control_truncated) {
                // This process had no room for an fd the broker sent (its fd limit): what it
                // was for can never be filed, so say exactly that.
                self.shared
                    .lock()
                    .fault
                    .get_or_insert(ProtocolError::ControlTruncated);
                self.shared.wake_waiters();
                return;
            }
            match received {
                Ok(received) if received.bytes == 0 => {
                    self.shared.lose_broker();
                    return;
                }
                Ok(received) => {
                    self.frame.extend_from_slice(&buffer[..received.bytes]);
                    if self.frame.len() == size_of::<WorkerNotice>() {
                        let fd = self.fds.pop_front();
                        let filed = decode_broker_notice(
                            &self.frame,
                            self.world_size,
                            self.shared.rank,
                            fd.is_some(),
                            self.replacement,
                        )
                        .and_then(|notice| self.file(notice, fd));
                        self.frame.clear();
                        let mut inbox = self.shared.lock();
                        let faulted = match filed {
                            Ok(()) => false,
                            Err(fault) => {
                                inbox.fault.get_or_insert(fault);
                                true
                            }
                        };
                        drop(inbox);
                        self.shared.arrived.notify_all();
                        if faulted {
                            return;
                        }
                    }
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return,
                Err(_) => {
                    self.shared.lose_broker();
                    return;
                }
            }
        }
    }

    /// Files one decoded notice from the broker with the fd that came with it (the decoder
    /// checked that one came exactly when the kind carries one).
    fn file(&self, notice: BrokerNotice, fd: Option<OwnedFd>) -> Result<(), ProtocolError> {
        let own_pid = match (notice.kind, &fd) {
            (NoticeKind::Peer | NoticeKind::Rejoined, Some(pidfd)) => check_pidfd(
                pidfd.as_fd(),
                notice.token as i32,
                self.broker_in_my_namespace,
            )?,
            _ => None,
        };
        let mut inbox = self.shared.lock();
        let key = (notice.peer, notice.token);
        match (notice.kind, fd) {
            (NoticeKind::Peer, Some(pidfd)) => {
                let pid = notice.token as i32;
                let pidfd = Arc::new(pidfd);
                inbox.peers.insert(
                    notice.peer,
                    PeerProcess {
                        pid,
                        pidfd,
                        own_pid,
                    },
                );
            }
            (NoticeKind::PeerOutbox, Some(fd)) => {
                inbox.outboxes.insert(notice.peer, fd);
            }
            (NoticeKind::RelayedFd, Some(fd)) => {
                if notice.token & crate::client::RELAY_ORDER_MASK < inbox.relay_floor {
                    // Of an exchange this worker gave up on: closed here, claimed later.
                    drop(fd);
                    inbox.relays_to_claim.push(key);
                } else {
                    inbox.relayed.insert(key, fd);
                }
            }
            (NoticeKind::NeverJoins, None) => {
                if inbox.peers.contains_key(&notice.peer) {
                    return Err(ProtocolError::Field {
                        field: "never-joins notice's peer",
                        expected: "a rank that has not logged on (the broker passed its process)"
                            .into(),
                        found: u64::from(notice.peer),
                    });
                }
                drop(inbox);
                self.shared.never_joins(notice.peer, notice.token);
            }
            (NoticeKind::PeerGone, None) => {
                // Nothing the broker passes on from it comes after this: waits for its relays
                // and channels end (see `Shared::wait_for`).
                inbox.gone.insert(notice.peer, notice.token == 1);
                // Weighed like this worker's own pidfd: the ring ends it left say whether it
                // left or died.
                drop(inbox);
                self.shared.peer_gone(notice.peer, notice.token == 1);
            }
            (
                kind @ (NoticeKind::RejoinRingTo
                | NoticeKind::RejoinRingFrom
                | NoticeKind::RejoinReadiness
                | NoticeKind::Rejoined),
                Some(fd),
            ) => {
                let complete =
                    file_rejoin(&mut inbox, kind, notice.peer, notice.token, fd, own_pid)?;
                // The pending bit under the lock, as the adoption reads and clears it.
                if complete {
                    inbox.gone.remove(&notice.peer);
                    self.shared.note_rejoin(notice.peer);
                }
                drop(inbox);
                if complete {
                    self.shared.signal_rejoin();
                }
            }
            (NoticeKind::ChannelMade, fd @ Some(_)) | (NoticeKind::ChannelRefused, fd @ None) => {
                inbox.channel_answers.insert(key, fd);
            }
            (NoticeKind::ChannelOffered, Some(fd)) => {
                // The decoder checked the token is one.
                let number = shmbroker_bindings::ChannelToken::unpack(notice.token)
                    .map_or(0, |token| token.number);
                inbox
                    .channel_offers
                    .insert((notice.peer, number), (notice.token, fd));
            }
            (NoticeKind::RelayDelivered, None) => {
                inbox.relay_answers.insert(key, RelayAnswer::Delivered);
            }
            (kind, None) => {
                inbox.relay_answers.insert(key, RelayAnswer::Refused(kind));
            }
            (_, Some(_)) => unreachable!("the decoder checked which kinds carry an fd"),
        }
        Ok(())
    }
}

/// Files one of the four notices of a rejoin of rank `peer` (see [`NoticeKind::RejoinRingTo`]):
/// they come in order, and the first starts a new rejoin, in place of one of the same rank not
/// yet adopted (that replacement died and another came). Returns whether the rejoin is now
/// complete. What the dead process left in the inbox (its outbox, fds it relayed, answers about
/// fds relayed to it) is dropped when its first notice comes: everything about the old process
/// came before it.
fn file_rejoin(
    inbox: &mut super::Inbox,
    kind: NoticeKind,
    peer: u32,
    token: u64,
    fd: OwnedFd,
    own_pid: Option<i32>,
) -> Result<bool, ProtocolError> {
    let out_of_order = |expected: &str| ProtocolError::Field {
        field: "rejoin notice",
        expected: format!("{expected} for rank {peer}"),
        found: kind as u64,
    };
    if kind == NoticeKind::RejoinRingTo {
        let times = token as u32;
        if let Some(pending) = inbox.rejoins.get(&peer)
            && (!pending.complete() || pending.times >= times)
        {
            return Err(ProtocolError::Field {
                field: "rejoin notice token (times replaced)",
                expected: format!("more than {} for rank {peer}", pending.times),
                found: token,
            });
        }
        inbox.outboxes.remove(&peer);
        inbox.relayed.retain(|(from, _), _| *from != peer);
        inbox.relay_answers.retain(|(to, _), _| *to != peer);
        inbox.channel_offers.retain(|(from, _), _| *from != peer);
        inbox.channel_answers.retain(|(to, _), _| *to != peer);
        inbox.rejoins.insert(
            peer,
            super::Rejoin {
                times,
                to: Some(fd),
                ..super::Rejoin::default()
            },
        );
        return Ok(false);
    }
    let Some(rejoin) = inbox.rejoins.get_mut(&peer).filter(|r| !r.complete()) else {
        return Err(out_of_order("a rejoin-ring-to notice first"));
    };
    match kind {
        NoticeKind::RejoinRingFrom if rejoin.from.is_none() && u64::from(rejoin.times) == token => {
            rejoin.from = Some(fd);
        }
        NoticeKind::RejoinReadiness
            if rejoin.from.is_some()
                && rejoin.readiness.is_none()
                && u64::from(rejoin.times) == token =>
        {
            rejoin.readiness = Some(fd);
        }
        NoticeKind::Rejoined if rejoin.readiness.is_some() => {
            rejoin.process = Some(PeerProcess {
                pid: token as i32,
                pidfd: Arc::new(fd),
                own_pid,
            });
            return Ok(true);
        }
        _ => {
            return Err(out_of_order(
                "rejoin-ring-from, rejoin-readiness, then rejoined, with the same token",
            ));
        }
    }
    Ok(false)
}

/// Checks that an fd the broker says is a pidfd of `pid` (a pid in the broker's PID namespace)
/// is one: anything else could never become readable, and the watcher would miss that death.
/// Where this process sees the same pid numbers as the broker, the pidfd must name `pid` (or a
/// process already reaped); across PID namespaces (containers) the numbers differ or are not
/// visible at all, and the pidfd itself is what names the process. Returns the pid the process
/// sees itself as (its own namespace's, the last of the pidfd's `NSpid`), when it can be seen.
fn check_pidfd(
    fd: BorrowedFd<'_>,
    pid: i32,
    broker_in_my_namespace: bool,
) -> Result<Option<i32>, ProtocolError> {
    use shmbroker_sys::pidfd::{Named, named};
    use std::os::fd::AsRawFd;
    match named(fd) {
        Some(Named::Reaped | Named::Elsewhere) => Ok(None),
        // The first number is this namespace's, the broker's when it shares it.
        Some(Named::Process(pids)) if pids.first() == Some(&pid) || !broker_in_my_namespace => {
            Ok(pids.last().copied())
        }
        Some(Named::Process(pids)) => Err(ProtocolError::Field {
            field: "peer notice pidfd's process",
            expected: format!("process {pid}"),
            found: pids.first().copied().unwrap_or(0) as u64,
        }),
        None => Err(ProtocolError::Field {
            field: "peer notice fd",
            expected: format!("a pidfd of process {pid} (an fd whose fdinfo has a Pid line)"),
            found: fd.as_raw_fd() as u64,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::liveness::Inbox;

    fn fd() -> OwnedFd {
        shmbroker_sys::eventfd::create().unwrap()
    }

    /// Files `kind` about rank 2 with `token`.
    fn file(inbox: &mut Inbox, kind: NoticeKind, token: u64) -> Result<bool, ProtocolError> {
        file_rejoin(inbox, kind, 2, token, fd(), None)
    }

    /// The four notices of a rejoin of rank 2, replaced `times` times.
    fn rejoin(inbox: &mut Inbox, times: u64) -> Result<bool, ProtocolError> {
        assert!(!file(inbox, NoticeKind::RejoinRingTo, times)?);
        assert!(!file(inbox, NoticeKind::RejoinRingFrom, times)?);
        assert!(!file(inbox, NoticeKind::RejoinReadiness, times)?);
        file(inbox, NoticeKind::Rejoined, 4242)
    }

    #[test]
    fn a_rejoin_is_complete_after_its_four_notices_in_order() {
        let mut inbox = Inbox::default();
        // What the dead process left goes when its replacement's first notice comes.
        inbox.outboxes.insert(2, fd());
        inbox.relayed.insert((2, 7), fd());
        inbox.relayed.insert((1, 7), fd());
        assert!(rejoin(&mut inbox, 1).unwrap());
        assert!(!inbox.outboxes.contains_key(&2));
        assert_eq!(inbox.relayed.len(), 1);
        let filed = &inbox.rejoins[&2];
        assert_eq!(filed.times, 1);
        assert_eq!(filed.process.as_ref().map(|p| p.pid), Some(4242));
        // A newer replacement (the first died before it was taken on) takes its place.
        assert!(rejoin(&mut inbox, 2).unwrap());
        assert_eq!(inbox.rejoins[&2].times, 2);
    }

    #[test]
    fn rejoin_notices_out_of_order_or_out_of_step_are_refused() {
        for kind in [
            NoticeKind::RejoinRingFrom,
            NoticeKind::RejoinReadiness,
            NoticeKind::Rejoined,
        ] {
            let mut inbox = Inbox::default();
            assert!(file(&mut inbox, kind, 1).is_err(), "{kind:?} first");
        }
        // Another token than the first notice's.
        let mut inbox = Inbox::default();
        file(&mut inbox, NoticeKind::RejoinRingTo, 1).unwrap();
        assert!(file(&mut inbox, NoticeKind::RejoinRingFrom, 2).is_err());
        // Twice the same notice.
        let mut inbox = Inbox::default();
        file(&mut inbox, NoticeKind::RejoinRingTo, 1).unwrap();
        file(&mut inbox, NoticeKind::RejoinRingFrom, 1).unwrap();
        assert!(file(&mut inbox, NoticeKind::RejoinRingFrom, 1).is_err());
        // A new rejoin while one is half filed, or one not newer than the one filed.
        let mut inbox = Inbox::default();
        file(&mut inbox, NoticeKind::RejoinRingTo, 1).unwrap();
        assert!(file(&mut inbox, NoticeKind::RejoinRingTo, 2).is_err());
        let mut inbox = Inbox::default();
        assert!(rejoin(&mut inbox, 3).unwrap());
        assert!(file(&mut inbox, NoticeKind::RejoinRingTo, 3).is_err());
        assert!(file(&mut inbox, NoticeKind::RejoinRingTo, 2).is_err());
    }
}
