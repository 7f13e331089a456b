//! Moving file descriptors between workers: `exchange_fds` and `broadcast_fd`.
//!
//! # Protocol
//!
//! 1. Each exporter sends every importer an [`FdTicket`]: its pid, the fd's number, and the
//!    file's `(st_dev, st_ino)`.
//! 2. Unless the relay is forced, each importer takes every fd with
//!    `pidfd_getfd(pidfd_open(pid), fd)` and keeps it only if its `(st_dev, st_ino)` match the
//!    ticket: a number closed and reused in the meantime is refused as stale.
//! 3. All ranks all-gather which imports were refused by the kernel (`EPERM` from Yama or a
//!    non-dumpable or differently privileged exporter, `ENOSYS` on old kernels) and which were
//!    stale. This round is also the acknowledgement: no exporter returns (and so closes its fd)
//!    before every importer has taken what it could.
//! 4. A stale ticket fails the call on every rank. A refused import fails it under
//!    [`FdTransport::Pidfd`]; under [`FdTransport::Auto`] the exporter passes those fds through
//!    the broker instead (`SCM_RIGHTS` both ways), and the importer checks them against the
//!    ticket in the same way.
//!
//! The transport used the first time is reported once on standard error, with the reason.

use super::demux::message;
use super::{Deadline, Error, Session, departure_error, handshake_failed};
use shmbroker_bindings::{FdTicket, INLINE_BYTES, kind};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

/// How long a relayed fd from a peer that has left may still take to be read from this worker's
/// socket (by its watcher thread) before the departure is reported instead.
const RELAYED_GRACE: Duration = Duration::from_millis(50);

/// How file descriptors move between workers. Ordered `Auto < Pidfd < Relay`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FdTransport {
    /// `pidfd_getfd` where the kernel allows it, the broker relay where it does not.
    Auto,
    /// Only `pidfd_getfd`; an import the kernel refuses is an error.
    Pidfd,
    /// Only the broker relay.
    Relay,
}

impl std::str::FromStr for FdTransport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "pidfd" => Ok(Self::Pidfd),
            "relay" => Ok(Self::Relay),
            other => Err(format!(
                "fd transport must be auto, pidfd or relay, not {other:?}"
            )),
        }
    }
}

impl FdTransport {
    /// From `SHMBROKER_FD_TRANSPORT`, or [`FdTransport::Auto`] when it is not set.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when the variable holds anything else than `auto`, `pidfd` or `relay`.
    pub fn from_env() -> Result<Self, Error> {
        match std::env::var("SHMBROKER_FD_TRANSPORT") {
            Err(_) => Ok(Self::Auto),
            Ok(value) => value
                .parse()
                .map_err(|e: String| Error::Misuse(format!("SHMBROKER_FD_TRANSPORT: {e}"))),
        }
    }
}

/// Why one import did not work.
enum ImportFailure {
    /// The kernel would not let us take it (or the exporter is gone): relay can help.
    Refused(nix::errno::Errno),
    /// The fd number names another file than the ticket: an exporter bug, or a forgery.
    Stale { found: (u64, u64) },
}

/// Takes the fd a ticket describes from its exporter (`pidfd`) with `pidfd_getfd`, and checks it.
fn import(pidfd: &OwnedFd, ticket: &FdTicket) -> Result<OwnedFd, ImportFailure> {
    let fd = shmbroker_sys::pidfd::getfd(pidfd.as_fd(), ticket.fd).map_err(|error| {
        match nix::errno::Errno::from_raw(error.raw_os_error().unwrap_or(0)) {
            nix::errno::Errno::EBADF => ImportFailure::Stale { found: (0, 0) },
            other => ImportFailure::Refused(other),
        }
    })?;
    check(&fd, ticket).map(|()| fd)
}

/// Whether `fd` is the file `ticket` describes.
fn check(fd: &OwnedFd, ticket: &FdTicket) -> Result<(), ImportFailure> {
    let stat = nix::sys::stat::fstat(fd).map_err(ImportFailure::Refused)?;
    let found = (stat.st_dev, stat.st_ino);
    if found == (ticket.dev, ticket.ino) {
        Ok(())
    } else {
        Err(ImportFailure::Stale { found })
    }
}

impl Session {
    /// Chooses how fds move from now on (the default comes from `SHMBROKER_FD_TRANSPORT`).
    pub fn set_fd_transport(&mut self, transport: FdTransport) {
        self.fd_transport = transport;
    }

    /// How fds are chosen to move: [`Self::set_fd_transport`]'s value, or
    /// `SHMBROKER_FD_TRANSPORT`'s.
    #[must_use]
    pub fn fd_transport(&self) -> FdTransport {
        self.fd_transport
    }

    /// How this rank's fd exchanges (fds and GPU handles) have moved fds so far: `None` before
    /// the first, [`FdTransport::Pidfd`] while every import was a `pidfd_getfd`, and
    /// [`FdTransport::Relay`] from the first exchange on that went through the broker (the choice
    /// was `relay`, or the kernel refused a `pidfd_getfd` under `auto`: inside containers
    /// without `CAP_SYS_PTRACE`, under Yama's `ptrace_scope` 2 or 3). Never [`FdTransport::Auto`].
    /// Each change is also logged (`info`, or `warn` for a fallback from `pidfd_getfd`).
    #[must_use]
    pub fn fd_transport_used(&self) -> Option<FdTransport> {
        self.fd_transport_used
    }

    /// Every rank's `fd`, indexed by rank (this rank's own as a duplicate).
    ///
    /// # Errors
    ///
    /// [`Error::FdTransport`] when the kernel refuses an import under [`FdTransport::Pidfd`];
    /// [`Error::StaleFdTicket`]; otherwise as for [`Session::all_gather`].
    pub fn exchange_fds(&mut self, fd: BorrowedFd<'_>) -> Result<Vec<OwnedFd>, Error> {
        self.exchange_fds_timeout(fd, self.timeout)
    }

    /// [`Self::exchange_fds`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::exchange_fds`].
    pub fn exchange_fds_timeout(
        &mut self,
        fd: BorrowedFd<'_>,
        timeout: Duration,
    ) -> Result<Vec<OwnedFd>, Error> {
        let deadline = self.track(Deadline::collective("exchange_fds", timeout));
        let exporters: Vec<u32> = (0..self.world_size()).collect();
        let mut imported = self.move_fds(&exporters, Some(fd), &deadline)?;
        let own = fd.try_clone_to_owned().map_err(|source| Error::Io {
            what: "duplicating this rank's fd",
            source,
        })?;
        imported[self.rank() as usize] = Some(own);
        imported
            .into_iter()
            .enumerate()
            .map(|(peer, fd)| fd.ok_or_else(|| Error::Misuse(format!("no fd from rank {peer}"))))
            .collect()
    }

    /// `root`'s fd on every rank: the root passes `Some(fd)` (and gets a duplicate back), the
    /// others `None`.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when the root passes `None` or another rank `Some`; otherwise as for
    /// [`Self::exchange_fds`].
    pub fn broadcast_fd(
        &mut self,
        root: u32,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<OwnedFd, Error> {
        self.broadcast_fd_timeout(root, fd, self.timeout)
    }

    /// [`Self::broadcast_fd`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::broadcast_fd`].
    pub fn broadcast_fd_timeout(
        &mut self,
        root: u32,
        fd: Option<BorrowedFd<'_>>,
        timeout: Duration,
    ) -> Result<OwnedFd, Error> {
        self.check_rank(root)?;
        let rank = self.rank();
        match (root == rank, fd) {
            (true, None) => {
                return Err(Error::Misuse(format!(
                    "rank {root} is the fd broadcast root but gave no fd"
                )));
            }
            (false, Some(_)) => {
                return Err(Error::Misuse(format!(
                    "rank {rank} gave an fd to a broadcast rooted at {root}"
                )));
            }
            _ => {}
        }
        let deadline = self.track(Deadline::collective("broadcast_fd", timeout));
        let mut imported = self.move_fds(&[root], fd, &deadline)?;
        match fd {
            Some(fd) => fd.try_clone_to_owned().map_err(|source| Error::Io {
                what: "duplicating the root's fd",
                source,
            }),
            None => imported[root as usize]
                .take()
                .ok_or_else(|| Error::Misuse(format!("no fd from rank {root}"))),
        }
    }

    /// Moves each exporter's fd to every other rank; returns what this rank imported, by rank.
    pub(super) fn move_fds(
        &mut self,
        exporters: &[u32],
        mine: Option<BorrowedFd<'_>>,
        deadline: &Deadline,
    ) -> Result<Vec<Option<OwnedFd>>, Error> {
        let (rank, world) = (self.rank(), self.world_size());
        let seq = self.next_seq(kind::FD_TICKET)?;
        let exporting = exporters.contains(&rank);
        if exporting {
            let fd = mine.ok_or_else(|| Error::Misuse("an exporter without an fd".into()))?;
            let stat = nix::sys::stat::fstat(fd).map_err(|e| Error::Io {
                what: "fstat of the fd to export",
                source: e.into(),
            })?;
            let ticket = FdTicket {
                pid: std::process::id(),
                fd: fd.as_raw_fd(),
                dev: stat.st_dev,
                ino: stat.st_ino,
                token: seq,
            };
            let mut inline = [0u8; INLINE_BYTES];
            inline[..size_of::<FdTicket>()].copy_from_slice(bytemuck::bytes_of(&ticket));
            let outgoing = message(kind::FD_TICKET, seq, size_of::<FdTicket>() as u32, inline);
            for peer in self.peers() {
                self.send_message(peer, outgoing, deadline)?;
            }
        }
        // Tickets, then every import the kernel allows.
        let mut tickets = vec![None; world as usize];
        let mut imported: Vec<Option<OwnedFd>> = (0..world).map(|_| None).collect();
        let (mut refused, mut stale) = (0u64, 0u64);
        let mut first_refusal = None;
        let mut my_stale = None;
        for &exporter in exporters.iter().filter(|&&e| e != rank) {
            let incoming = self.recv_collective(exporter, kind::FD_TICKET, seq, deadline)?;
            let ticket: FdTicket =
                bytemuck::pod_read_unaligned(&incoming.inline[..size_of::<FdTicket>()]);
            tickets[exporter as usize] = Some(ticket);
            if self.fd_transport == FdTransport::Relay {
                refused |= 1 << exporter;
                continue;
            }
            // Only from the process the broker saw log on as that rank, through the pidfd the
            // broker opened for it then: a ticket naming any other (some other process of this
            // uid, say) would make this rank pull an fd out of it, and a pid alone could have
            // been reused.
            let (pid, pidfd) = self.exporter_process(exporter, deadline)?;
            // The ticket names the exporter as it sees itself (`getpid`, in its own PID
            // namespace): the last of the pidfd's `NSpid` numbers. A process in a namespace
            // this one cannot see into (a sibling container) shows no number; its pidfd still
            // names it, and the import reads the fd through that pidfd alone.
            if let Some(own) = self.inner.peer_own_pid(exporter)
                && i64::from(own) != i64::from(ticket.pid)
            {
                return Err(Error::Protocol {
                    peer: exporter,
                    detail: format!(
                        "fd ticket names pid {}; rank {exporter} logged on as pid {pid} (pid \
                         {own} in its own PID namespace)",
                        ticket.pid
                    ),
                });
            }
            match import(&pidfd, &ticket) {
                Ok(fd) => imported[exporter as usize] = Some(fd),
                Err(ImportFailure::Refused(errno)) => {
                    refused |= 1 << exporter;
                    first_refusal.get_or_insert((exporter, errno));
                }
                Err(ImportFailure::Stale { found }) => {
                    stale |= 1 << exporter;
                    my_stale.get_or_insert((exporter, ticket, found));
                }
            }
        }
        // Who could not take what: every rank learns the same, and decides the same.
        let statuses = self.all_gather_pod_with(&[refused, stale], deadline)?;
        // An exporter that gave this exchange up because a rank died closes its fd, and its
        // ticket then reads as stale: that death is the cause, and is named as in any collective.
        if (my_stale.is_some() || statuses.iter().any(|s| s[1] != 0))
            && let Some(rank) = self.inner.lost_rank()
        {
            return Err(self.collective_lost(rank));
        }
        if let Some((exporter, ticket, found)) = my_stale {
            return Err(Error::StaleFdTicket {
                exporter,
                expected: (ticket.dev, ticket.ino),
                found,
            });
        }
        if let Some((importer, status)) = (0u32..).zip(&statuses).find(|(_, s)| s[1] != 0) {
            return Err(Error::FdTransport(format!(
                "rank {importer} was offered a stale fd ticket by rank {}",
                status[1].trailing_zeros()
            )));
        }
        let any_refused = statuses.iter().any(|s| s[0] != 0);
        self.report_fd_transport(any_refused, first_refusal);
        if !any_refused {
            return Ok(imported);
        }
        if self.fd_transport == FdTransport::Pidfd {
            let (importer, exporter) = (0..)
                .zip(&statuses)
                .find(|(_, s)| s[0] != 0)
                .map(|(i, s): (u32, &[u64; 2])| (i, s[0].trailing_zeros()))
                .unwrap_or((rank, rank));
            return Err(Error::FdTransport(format!(
                "pidfd_getfd of rank {exporter}'s fd by rank {importer} was refused{}; \
                 set SHMBROKER_FD_TRANSPORT=auto (or relay) to pass fds through the broker",
                first_refusal.map_or(String::new(), |(_, errno)| format!(" here with {errno}"))
            )));
        }
        // Relay what was refused: exporters pass their fd to each importer that needs it ...
        if exporting {
            let fd = mine.ok_or_else(|| Error::Misuse("an exporter without an fd".into()))?;
            for (importer, status) in (0..).zip(&statuses) {
                if importer != rank && status[0] & (1 << rank) != 0 {
                    self.inner
                        .relay_fd(importer, seq, fd, deadline.left())
                        .map_err(|e| self.relay_failed(importer, e))?;
                }
            }
        }
        // ... and importers take theirs, checked against the ticket like any other.
        for exporter in 0..world {
            if refused & (1 << exporter) == 0 {
                continue;
            }
            let fd = self.take_relayed_fd_from_live(exporter, seq, deadline)?;
            let ticket = tickets[exporter as usize]
                .ok_or_else(|| Error::Misuse(format!("no ticket from rank {exporter}")))?;
            match check(&fd, &ticket) {
                Ok(()) => imported[exporter as usize] = Some(fd),
                Err(ImportFailure::Stale { found }) => {
                    return Err(Error::StaleFdTicket {
                        exporter,
                        expected: (ticket.dev, ticket.ino),
                        found,
                    });
                }
                Err(ImportFailure::Refused(errno)) => {
                    return Err(Error::FdTransport(format!(
                        "fstat of a relayed fd: {errno}"
                    )));
                }
            }
        }
        Ok(imported)
    }

    /// The fd `exporter` relays with `token`, waiting in slices and checking between them that
    /// `exporter` is still there: a relay from a rank that left or died never comes.
    fn take_relayed_fd_from_live(
        &mut self,
        exporter: u32,
        token: u64,
        deadline: &Deadline,
    ) -> Result<OwnedFd, Error> {
        const SLICE: Duration = Duration::from_millis(5);
        loop {
            let wait = deadline.left().min(SLICE);
            match self.inner.take_relayed_fd(exporter, token, wait) {
                Ok(fd) => return Ok(fd),
                Err(shmbroker_handshake::Error::Timeout { .. }) => {}
                Err(other) => return Err(self.relay_failed(exporter, other)),
            }
            if let Some(departure) = self.inner.departure(exporter) {
                // An exporter leaves only once the broker said its relay was passed on, so the
                // fd is already in this worker's socket; its watcher may not have read it yet
                // (it runs on its own thread), so it gets a moment before the departure counts.
                return match self.inner.take_relayed_fd(exporter, token, RELAYED_GRACE) {
                    Ok(fd) => Ok(fd),
                    Err(_) => Err(departure_error(departure)),
                };
            }
            if deadline.left().is_zero() {
                return Err(self.timed_out(deadline, exporter));
            }
        }
    }

    /// The error for a relay to or from `peer` that failed: who is gone if someone is, else what
    /// the handshake said. A relay is tried when `pidfd_getfd` failed, which it also does for a
    /// process that is exiting (its fds already gone, its pidfd not yet readable): so a death
    /// is waited for a little before the relay's own failure is reported.
    fn relay_failed(&self, peer: u32, error: shmbroker_handshake::Error) -> Error {
        const GRACE: Duration = Duration::from_millis(50);
        let refused = matches!(error, shmbroker_handshake::Error::RelayRefused { .. });
        let give_up = std::time::Instant::now() + if refused { Duration::ZERO } else { GRACE };
        loop {
            if let Some(departure) = self.inner.departure(peer) {
                return departure_error(departure);
            }
            if std::time::Instant::now() >= give_up {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        match error {
            shmbroker_handshake::Error::BrokerLost { .. } => Error::BrokerLost,
            shmbroker_handshake::Error::PeerLost { rank, .. } => Error::PeerLost {
                rank,
                diagnosis: Vec::new(),
            },
            source => Error::Relay { peer, source },
        }
    }

    /// `exporter`'s process id as the broker saw it log on, and a pidfd for that process.
    fn exporter_process(
        &mut self,
        exporter: u32,
        deadline: &Deadline,
    ) -> Result<(i32, std::sync::Arc<OwnedFd>), Error> {
        self.inner
            .peer_process(exporter, deadline.left())
            .map_err(|error| handshake_failed(exporter, error, deadline))
    }

    /// Records which transport moved this exchange's fds (see [`Self::fd_transport_used`]), and
    /// logs it when that changes: a warning when a refused `pidfd_getfd` sent fds through the
    /// broker, or made the exchange fail under `pidfd`; otherwise at `info`.
    fn report_fd_transport(&mut self, relayed: bool, refusal: Option<(u32, nix::errno::Errno)>) {
        let used = match (relayed, self.fd_transport) {
            (false, _) => Some(FdTransport::Pidfd),
            (true, FdTransport::Pidfd) => None,
            (true, _) => Some(FdTransport::Relay),
        };
        if used.is_some() && used <= self.fd_transport_used {
            return;
        }
        if let Some(used) = used {
            self.fd_transport_used = Some(used);
        }
        let rank = self.rank();
        let fell_back = relayed && self.fd_transport != FdTransport::Relay;
        let why = match (self.fd_transport, relayed, refusal) {
            (FdTransport::Relay, _, _) => "relay through the broker (chosen: relay)".to_string(),
            (_, false, _) => "pidfd_getfd (every import was allowed)".to_string(),
            (FdTransport::Auto, true, Some((exporter, errno))) => format!(
                "relay through the broker where needed (pidfd_getfd from rank {exporter}: {errno})"
            ),
            (FdTransport::Auto, true, None) => {
                "relay through the broker where needed (a peer's pidfd_getfd was refused)"
                    .to_string()
            }
            (FdTransport::Pidfd, true, _) => "pidfd_getfd, refused (chosen: pidfd)".to_string(),
        };
        if fell_back {
            tracing::warn!(rank, "fd transport: {why}");
        } else {
            tracing::info!(rank, "fd transport: {why}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn memfd() -> OwnedFd {
        shmbroker_queues::memfd::create_sealed(c"ticket-test", 4096).unwrap()
    }

    fn ticket_for(fd: &OwnedFd, number: std::os::fd::RawFd) -> FdTicket {
        let stat = nix::sys::stat::fstat(fd).unwrap();
        FdTicket {
            pid: std::process::id(),
            fd: number,
            dev: stat.st_dev,
            ino: stat.st_ino,
            token: 0,
        }
    }

    #[test]
    fn a_ticket_is_honoured_only_for_the_file_it_names() {
        let (a, b) = (memfd(), memfd());
        // Taken from this very process: the same file arrives under a new number.
        let me =
            shmbroker_sys::pidfd::open(std::process::id() as i32).expect("pidfd of this process");
        let fd = import(&me, &ticket_for(&a, a.as_raw_fd()))
            .ok()
            .expect("import");
        assert_ne!(fd.as_raw_fd(), a.as_raw_fd());
        // The number now names another file (closed and reused, say): refused as stale.
        match import(&me, &ticket_for(&a, b.as_raw_fd())) {
            Err(ImportFailure::Stale { found }) => {
                let stat = nix::sys::stat::fstat(b.as_fd()).unwrap();
                assert_eq!(found, (stat.st_dev, stat.st_ino));
            }
            _ => panic!("a stale ticket was honoured"),
        }
        // A number that is not open at all is stale too.
        assert!(matches!(
            import(&me, &ticket_for(&a, 999_999)),
            Err(ImportFailure::Stale { .. })
        ));
    }
}
