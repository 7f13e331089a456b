//! Moving file descriptors between workers: `exchange_fds`, `broadcast_fd`, and their batches.
//!
//! # Protocol
//!
//! 1. Each exporter sends every other rank one message holding an [`FdTicket`] for each of its
//!    fds: its pid, the fd's number, and the file's `(st_dev, st_ino)`. A batch of `k` fds is
//!    one message of `k` tickets (one ring slot for a single fd).
//! 2. Unless the relay is forced, each importer takes every fd with `pidfd_getfd` through the
//!    pidfd the broker opened for the exporter at logon, and keeps it only if its
//!    `(st_dev, st_ino)` match the ticket: a number closed and reused in the meantime is refused
//!    as stale.
//! 3. All ranks all-gather which exporters' imports were refused by the kernel (`EPERM` from
//!    Yama or a non-dumpable or differently privileged exporter, `ENOSYS` on old kernels), which
//!    were stale, which named another process than the exporter, which found this process out
//!    of fds (or would, relayed), and which sent another number of tickets than the importer
//!    passed fds. This round is also the acknowledgement: no exporter returns
//!    (and so closes its fds) before every importer has taken what it could. A batch has one
//!    such round, not one per fd.
//! 4. A stale or forged ticket, an importer out of fds or a miscounted batch fails the call on
//!    every rank, naming the rank at fault.
//!    A refused import fails it under [`FdTransport::Pidfd`]; under [`FdTransport::Auto`] the
//!    exporter passes those fds through the broker instead (`SCM_RIGHTS` both ways), one fd of
//!    the batch per round (see `relay_refused` for why no round can wait for ever on the
//!    broker's cap of unclaimed relays), and the importer checks them against the ticket in the
//!    same way.
//!
//! # Relays given up on
//!
//! A relayed fd's token is the exchange's sequence number, with the fd's index in the batch in
//! bits 48 and up. Fd exchanges run only on the world's stream (0), and only they relay, so the
//! low 48 bits of tokens rise from one exchange to the next. When this rank's part in an
//! exchange fails after its sequence number is taken, it sets a floor above that number
//! (`Connection::abandon_relays_below`): relayed fds below it, held or still to come from peers
//! that went on, are closed by the watcher as they arrive and claimed with the broker (at the
//! start of the next relay round, and in every wait of one), so they neither stay open nor count
//! against this worker's cap of unclaimed relays.
//!
//! What can fail on one rank alone is done before the exchange's sequence number is taken (the
//! `fstat`s of its own fds), or reported in the status round (no room for its own duplicates,
//! made while its peers import), so such a failure leaves every rank in step.
//!
//! So an exchange of `k` fds costs each rank `k` `fstat`s of its own fds (and `k` duplicates of
//! them, which the caller gets back), and for each imported fd a `pidfd_getfd` and an `fstat`:
//! the ring trips (tickets, then the acknowledgement) are two per call whatever `k` is. No trip can go: the tickets carry what the theft check needs, and
//! the acknowledgement is what keeps an exporter's fds open until they are taken.
//!
//! The transport used is logged when it changes, with the reason.

use super::demux::{Expect, Incoming, Sink};
use super::engine::FdTransport;
use super::engine::outgoing::Targets;
use super::membership::departure_error;
use super::state::Deadline;
use super::state::Session;
use super::teams::Team;
use crate::error::Error;
use shmbroker_bindings::{FdTicket, kind};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

/// How long a relayed fd from a peer that has left may still take to be read from this worker's
/// socket (by its watcher thread) before the departure is reported instead.
const RELAYED_GRACE: Duration = Duration::from_millis(50);

/// The most fds one rank may pass to one exchange.
pub const MAX_FDS_PER_EXCHANGE: usize = 4096;

/// The relay token of fd `index` of exchange `seq`: the sequence number alone for the first,
/// as a single fd's exchange has always used, and the index in bits 48 to 59 for the others.
/// Fd exchanges run on the world's stream (0), so their sequence numbers stay below 2^40 and
/// leave those bits clear.
fn relay_token(seq: u64, index: usize) -> u64 {
    const _: () = assert!(MAX_FDS_PER_EXCHANGE <= 1 << 12);
    debug_assert!(
        seq < 1 << 40,
        "an fd exchange off the world's stream: {seq:#x}"
    );
    seq | (index as u64) << 48
}

/// What this rank made of the tickets it received, exporter by exporter.
#[derive(Default)]
struct Taken {
    /// This rank's part of the status round.
    status: Status,
    /// The first failure this rank saw.
    failure: Option<Failure>,
    /// The first refusal by the kernel, for the log.
    first_refusal: Option<(u32, nix::errno::Errno)>,
    /// The tickets of each exporter whose fds are to come by relay.
    relayed: Vec<(u32, Vec<u8>)>,
}

/// What the relay rounds of an exchange need.
struct Relay<'t, 'fd> {
    /// The exchange's sequence number.
    seq: u64,
    /// This rank's fds, when it exports.
    mine: &'t [BorrowedFd<'fd>],
    /// Each rank's [`Status::refused`]: the exporters it takes by relay.
    refused_by: Vec<u64>,
    /// The tickets each exporter this rank takes by relay sent it, as they came.
    tickets: Vec<(u32, Vec<u8>)>,
}

/// One rank's outcome of an exchange, all-gathered: bit `r` of each word stands for exporter `r`.
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Status {
    /// Exporters some of whose fds the kernel would not let this rank take.
    refused: u64,
    /// Exporters with a ticket that named another file than its fd.
    stale: u64,
    /// Exporters that sent another number of tickets than this rank passed fds.
    miscounted: u64,
    /// Exporters whose fds this rank had no room for (`EMFILE`, `ENFILE`).
    exhausted: u64,
    /// Exporters that sent a ticket naming another process than the one that logged on.
    forged: u64,
    /// This rank's bit when it moves fds by `pidfd_getfd` only ([`FdTransport::Pidfd`]): a
    /// refusal anywhere then fails the exchange on every rank, not only on this one.
    pidfd_only: u64,
}

// On the wire: six words, one ring slot.
const _: () = assert!(size_of::<Status>() == shmbroker_bindings::INLINE_BYTES);

/// What failed for this rank, to be reported once every rank knows.
enum Failure {
    Stale {
        exporter: u32,
        ticket: FdTicket,
        found: (u64, u64),
    },
    Miscounted {
        exporter: u32,
        found: usize,
    },
    Exhausted {
        exporter: u32,
        errno: nix::errno::Errno,
    },
    Forged {
        exporter: u32,
        detail: String,
    },
}

/// Why one import did not work.
enum ImportFailure {
    /// The kernel would not let us take it (or the exporter is gone): relay can help.
    Refused(nix::errno::Errno),
    /// This process (or the system) is out of fds: nothing can help but fewer.
    Exhausted(nix::errno::Errno),
    /// A ticket names another process than the exporter that logged on: a forgery.
    Forged(String),
    /// The fd number names another file than the ticket: an exporter bug, or a forgery.
    Stale { ticket: FdTicket, found: (u64, u64) },
}

/// The fds an exchange moved, by exporter: exporter `r`'s fd `i` at `r * count + i` (this
/// rank's own as duplicates; `None` for ranks that export nothing). One table for the whole
/// exchange, so that a single fd's costs no allocation per rank.
pub(super) struct Moved {
    count: usize,
    fds: Vec<Option<OwnedFd>>,
}

impl Moved {
    fn new(world: u32, count: usize) -> Self {
        Self {
            count,
            fds: (0..world as usize * count).map(|_| None).collect(),
        }
    }

    fn slots(&mut self, rank: u32) -> &mut [Option<OwnedFd>] {
        let at = rank as usize * self.count;
        &mut self.fds[at..at + self.count]
    }

    /// `rank`'s fds, which it exported.
    pub(super) fn take(&mut self, rank: u32) -> Result<Vec<OwnedFd>, Error> {
        self.slots(rank)
            .iter_mut()
            .map(|fd| {
                fd.take()
                    .ok_or_else(|| Error::Misuse(format!("no fd from rank {rank}")))
            })
            .collect()
    }

    /// `rank`'s only fd, if it exported one (a table of one fd a rank).
    pub(super) fn take_one(&mut self, rank: u32) -> Option<OwnedFd> {
        self.slots(rank).first_mut().and_then(Option::take)
    }

    /// Every rank's fds, in rank order and then in each rank's (every rank exported).
    fn into_all(self) -> Result<Vec<OwnedFd>, Error> {
        let count = self.count;
        (0..)
            .zip(self.fds)
            .map(|(at, fd)| {
                fd.ok_or_else(|| Error::Misuse(format!("no fd from rank {}", at / count)))
            })
            .collect()
    }

    /// Each rank's fds, by rank (every rank exported).
    fn into_by_rank(self, world: u32) -> Result<Vec<Vec<OwnedFd>>, Error> {
        let count = self.count;
        let mut all = self.into_all()?.into_iter();
        Ok((0..world)
            .map(|_| all.by_ref().take(count).collect())
            .collect())
    }
}

/// Fds a process keeps free beyond those it is about to be relayed.
const RELAY_ROOM_SPARE: usize = 8;

/// Whether this process can open `needed` more fds (and [`RELAY_ROOM_SPARE`]) under its
/// `RLIMIT_NOFILE`, counting those open in `/proc/self/fd`; `true` when either cannot be read.
fn room_for(needed: usize) -> bool {
    use nix::sys::resource::{Resource, getrlimit};
    let Ok((soft, _)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return true;
    };
    let Ok(open) = std::fs::read_dir("/proc/self/fd") else {
        return true;
    };
    let free = usize::try_from(soft)
        .unwrap_or(usize::MAX)
        .saturating_sub(open.count());
    free >= needed + RELAY_ROOM_SPARE
}

/// Duplicates of `fds` into `slots`, as this rank's own share of an exchange (none when one
/// fails).
fn duplicate_into(
    fds: &[BorrowedFd<'_>],
    slots: &mut [Option<OwnedFd>],
) -> Result<(), nix::errno::Errno> {
    for (at, fd) in fds.iter().enumerate() {
        match fd.try_clone_to_owned() {
            Ok(copy) => slots[at] = Some(copy),
            Err(error) => {
                slots.iter_mut().for_each(|slot| *slot = None);
                return Err(nix::errno::Errno::from_raw(
                    error.raw_os_error().unwrap_or(0),
                ));
            }
        }
    }
    Ok(())
}

/// The tickets of `fds`, in order, into `tickets` (their `token` still to be filled in).
fn fill_tickets(fds: &[BorrowedFd<'_>], tickets: &mut [FdTicket]) -> Result<(), Error> {
    let pid = std::process::id();
    for (fd, ticket) in fds.iter().zip(tickets) {
        let stat = nix::sys::stat::fstat(fd).map_err(|e| Error::Io {
            what: "fstat of an fd to export",
            source: e.into(),
        })?;
        *ticket = FdTicket {
            pid,
            fd: fd.as_raw_fd(),
            dev: stat.st_dev,
            ino: stat.st_ino,
            token: 0,
        };
    }
    Ok(())
}

/// Bytes of one [`FdTicket`] on the wire.
const TICKET: usize = size_of::<FdTicket>();

/// The tickets in `bytes` (a whole number of them, checked by the caller).
fn tickets_in(bytes: &[u8]) -> impl Iterator<Item = FdTicket> + '_ {
    bytes.chunks_exact(TICKET).map(bytemuck::pod_read_unaligned)
}

/// Takes the fd a ticket describes from its exporter (`pidfd`) with `pidfd_getfd`, and checks it.
fn import(pidfd: &OwnedFd, ticket: &FdTicket) -> Result<OwnedFd, ImportFailure> {
    let fd = shmbroker_sys::pidfd::getfd(pidfd.as_fd(), ticket.fd).map_err(|error| {
        match nix::errno::Errno::from_raw(error.raw_os_error().unwrap_or(0)) {
            nix::errno::Errno::EBADF => ImportFailure::Stale {
                ticket: *ticket,
                found: (0, 0),
            },
            errno @ (nix::errno::Errno::EMFILE | nix::errno::Errno::ENFILE) => {
                ImportFailure::Exhausted(errno)
            }
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
        Err(ImportFailure::Stale {
            ticket: *ticket,
            found,
        })
    }
}

impl Session {
    /// Chooses how fds move from now on (the default comes from `SHMBROKER_FD_TRANSPORT`).
    pub fn set_fd_transport(&mut self, transport: FdTransport) {
        self.engine.set_fd_transport(transport);
    }

    /// How fds are chosen to move: [`Self::set_fd_transport`]'s value, or
    /// `SHMBROKER_FD_TRANSPORT`'s.
    #[must_use]
    pub fn fd_transport(&self) -> FdTransport {
        self.engine.fd_transport()
    }

    /// How this rank's fd exchanges (fds and GPU handles) have moved fds so far: `None` before
    /// the first, [`FdTransport::Pidfd`] while every import was a `pidfd_getfd`, and
    /// [`FdTransport::Relay`] from the first exchange on that went through the broker (the choice
    /// was `relay`, or the kernel refused a `pidfd_getfd` under `auto`: inside containers
    /// without `CAP_SYS_PTRACE`, under Yama's `ptrace_scope` 2 or 3). Never [`FdTransport::Auto`].
    /// Each change is also logged (`info`, or `warn` for a fallback from `pidfd_getfd`).
    #[must_use]
    pub fn fd_transport_used(&self) -> Option<FdTransport> {
        self.engine.fd_transport_used()
    }

    /// Every rank's `fd`, indexed by rank (this rank's own as a duplicate).
    ///
    /// # Errors
    ///
    /// On every rank alike (see the module docs): [`Error::FdTransport`] when the kernel
    /// refuses an import and some rank chose [`FdTransport::Pidfd`], or naming a rank with no
    /// room for the fds (which itself gets [`Error::Io`]); [`Error::StaleFdTicket`] on the
    /// importer of a stale ticket ([`Error::FdTransport`] naming it elsewhere);
    /// [`Error::Protocol`] naming a rank that sent a ticket naming another process; otherwise as
    /// for [`Collectives::all_gather`](crate::Collectives::all_gather).
    pub fn exchange_fds(&mut self, fd: BorrowedFd<'_>) -> Result<Vec<OwnedFd>, Error> {
        self.collective("exchange_fds", |session, team, deadline| {
            let exporters: Vec<u32> = (0..session.world_size()).collect();
            session.move_fds(team, &exporters, &[fd], 1, deadline)
        })?
        .into_all()
    }

    /// Every rank's `fds`, indexed by rank and then as each rank passed them (this rank's own as
    /// duplicates): [`Self::exchange_fds`] for many fds at once. Every rank passes the same
    /// number of fds, at most [`MAX_FDS_PER_EXCHANGE`]. The whole batch costs two ring trips,
    /// as one fd does; what is left a fd is its system calls (the importer's `pidfd_getfd` and
    /// `fstat`, the exporter's `fstat` and duplicate).
    ///
    /// # Errors
    ///
    /// [`Error::Protocol`] naming a rank that passed another number of fds (on every rank);
    /// [`Error::Misuse`] for more than [`MAX_FDS_PER_EXCHANGE`]; otherwise as for
    /// [`Self::exchange_fds`].
    pub fn exchange_fd_batch(
        &mut self,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Vec<Vec<OwnedFd>>, Error> {
        self.collective("exchange_fd_batch", |session, team, deadline| {
            session.exchange_fd_batch_with(team, fds, deadline)
        })
    }

    fn exchange_fd_batch_with(
        &mut self,
        team: &Team,
        fds: &[BorrowedFd<'_>],
        deadline: &Deadline,
    ) -> Result<Vec<Vec<OwnedFd>>, Error> {
        let exporters: Vec<u32> = (0..self.world_size()).collect();
        self.move_fds(team, &exporters, fds, fds.len(), deadline)?
            .into_by_rank(self.world_size())
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
        let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
        self.collective("broadcast_fd", |session, team, deadline| {
            session.broadcast_fd_batch_with(team, root, &fds, 1, deadline)
        })?
        .pop()
        .ok_or_else(|| Error::Misuse(format!("no fd from rank {root}")))
    }

    /// `root`'s `count` fds on every rank, in the root's order: [`Self::broadcast_fd`] for many
    /// fds at once, in two ring trips whatever `count` is. The root passes its `count` fds (and
    /// gets duplicates back), the others no fds; every rank passes the same `count`, at most
    /// [`MAX_FDS_PER_EXCHANGE`].
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when the root's fds are not `count`, or another rank passes fds;
    /// [`Error::Protocol`] on every rank when ranks passed different counts, naming the root
    /// on a rank whose count is not the root's, and such a rank elsewhere;
    /// otherwise as for [`Self::exchange_fds`].
    pub fn broadcast_fd_batch(
        &mut self,
        root: u32,
        fds: &[BorrowedFd<'_>],
        count: usize,
    ) -> Result<Vec<OwnedFd>, Error> {
        self.collective("broadcast_fd_batch", |session, team, deadline| {
            session.broadcast_fd_batch_with(team, root, fds, count, deadline)
        })
    }

    fn broadcast_fd_batch_with(
        &mut self,
        team: &Team,
        root: u32,
        fds: &[BorrowedFd<'_>],
        count: usize,
        deadline: &Deadline,
    ) -> Result<Vec<OwnedFd>, Error> {
        self.check_rank(root)?;
        let rank = self.rank();
        if root == rank && fds.len() != count {
            return Err(Error::Misuse(format!(
                "rank {root} is the root of a broadcast of {count} fds but gave {}",
                fds.len()
            )));
        }
        if root != rank && !fds.is_empty() {
            return Err(Error::Misuse(format!(
                "rank {rank} gave {} fds to a broadcast rooted at {root}",
                fds.len()
            )));
        }
        self.move_fds(team, &[root], fds, count, deadline)?
            .take(root)
    }

    /// Moves each exporter's `count` fds to every other rank; returns them by exporter: what
    /// this rank imported, and duplicates of its own `mine` when it exports.
    pub(super) fn move_fds(
        &mut self,
        team: &Team,
        exporters: &[u32],
        mine: &[BorrowedFd<'_>],
        count: usize,
        deadline: &Deadline,
    ) -> Result<Moved, Error> {
        let (rank, world) = (self.rank(), self.world_size());
        if count > MAX_FDS_PER_EXCHANGE {
            return Err(Error::Misuse(format!(
                "an fd exchange moves at most {MAX_FDS_PER_EXCHANGE} fds a rank, not {count}"
            )));
        }
        let exporting = exporters.contains(&rank);
        if exporting && mine.len() != count {
            return Err(Error::Misuse(format!(
                "an exporter of {count} fds gave {}",
                mine.len()
            )));
        }
        // What can fail here alone (the `fstat` of an fd closed under the call) fails before the
        // exchange starts, leaving every rank in step.
        let imported = Moved::new(world, count);
        // (A single fd's ticket on the stack: one allocation fewer on the common path.)
        let mut one: [FdTicket; 1] = [bytemuck::Zeroable::zeroed()];
        let mut many: Vec<FdTicket>;
        let tickets: &mut [FdTicket] = match (exporting, count) {
            (false, _) => &mut [],
            (true, 1) => &mut one,
            (true, _) => {
                many = vec![bytemuck::Zeroable::zeroed(); count];
                &mut many
            }
        };
        fill_tickets(mine, tickets)?;
        let seq = self.next_seq(team, kind::FD_TICKET)?;
        for ticket in tickets.iter_mut() {
            ticket.token = seq;
        }
        let moved = self.move_numbered_fds(team, seq, exporters, mine, tickets, imported, deadline);
        if moved.is_err() {
            // However this rank's exchange ended, nothing relayed for it is waited for any more:
            // what comes later (peers that went on to relay, an exporter stopped past the
            // deadline) is closed as it comes and claimed with the broker.
            self.inner.abandon_relays_below(seq + 1);
        }
        moved
    }

    /// [`Self::move_fds`] from its sequence number `seq` on, with this rank's `tickets` for
    /// `mine` when it exports.
    #[allow(
        clippy::too_many_arguments,
        reason = "one collective's inputs, none to group"
    )]
    fn move_numbered_fds(
        &mut self,
        team: &Team,
        seq: u64,
        exporters: &[u32],
        mine: &[BorrowedFd<'_>],
        tickets: &[FdTicket],
        mut imported: Moved,
        deadline: &Deadline,
    ) -> Result<Moved, Error> {
        let (rank, count) = (self.rank(), imported.count);
        let exporting = exporters.contains(&rank);
        // Tickets: one message from each exporter to every other rank, each taken from as it
        // comes.
        let mut taken = Taken::default();
        let mut pipelined = false;
        if exporting {
            let tickets: &[u8] = bytemuck::cast_slice(tickets);
            let eager =
                self.send_if_eager(kind::FD_TICKET, seq, tickets, Targets::Peers, deadline)?;
            // This rank's own copies, made while its peers import (the root of a broadcast
            // would otherwise make them after, alone). Having no room for them fails the
            // exchange on every rank, by the status round, like an importer's.
            if let Err(errno) = duplicate_into(mine, imported.slots(rank)) {
                taken.status.exhausted |= 1 << rank;
                taken.failure = Some(Failure::Exhausted {
                    exporter: rank,
                    errno,
                });
            }
            if !eager {
                // Too long for eager slots: sent in chunks, every peer's received meanwhile.
                pipelined = true;
                let mut incoming = self.ticket_receives(exporters, seq);
                let targets = (tickets, Targets::Peers);
                self.send_while_receiving(kind::FD_TICKET, seq, targets, &mut incoming, deadline)?;
                for incoming in incoming {
                    let exporter = incoming.peer;
                    if let (_, Sink::Vec(bytes)) = incoming.finish()? {
                        self.take_from(exporter, &bytes, &mut imported, &mut taken, deadline)?;
                    }
                }
            }
        }
        if !pipelined {
            self.receive_and_take(exporters, seq, &mut imported, &mut taken, deadline)?;
        }
        // Room for what is to come by relay, known now and so agreed on in the status round: a
        // worker with no free fd for a relayed one would have the kernel cut it off its message
        // from the broker (`MSG_CTRUNC`), and the fd lost with it.
        let to_relay = count * taken.status.refused.count_ones() as usize;
        if to_relay > 0 && !room_for(to_relay) {
            let exporter = taken.status.refused.trailing_zeros();
            taken.status.exhausted |= taken.status.refused;
            taken.failure.get_or_insert(Failure::Exhausted {
                exporter,
                errno: nix::errno::Errno::EMFILE,
            });
        }
        // Who could not take what: every rank learns the same, and decides the same. This round
        // is also the acknowledgement: no exporter returns (and so closes its fds) before every
        // importer has taken what it could.
        let Taken {
            mut status,
            failure: my_failure,
            first_refusal,
            relayed,
        } = taken;
        if self.engine.fd_transport() == FdTransport::Pidfd {
            status.pidfd_only |= 1 << rank;
        }
        let statuses = self.all_gather_pod_with(team, &status, deadline)?;
        self.agreed_failure(&statuses, my_failure, count)?;
        let any_refused = statuses.iter().any(|s| s.refused != 0);
        let strict = statuses.iter().any(|s| s.pidfd_only != 0);
        // (A rank that would relay reports nothing when another's `pidfd` choice fails it.)
        if !(any_refused && strict) || self.engine.fd_transport() == FdTransport::Pidfd {
            self.report_fd_transport(any_refused, first_refusal);
        }
        if !any_refused {
            return Ok(imported);
        }
        if strict {
            let (importer, exporter) = (0..)
                .zip(&statuses)
                .find(|(_, s)| s.refused != 0)
                .map(|(i, s): (u32, &Status)| (i, s.refused.trailing_zeros()))
                .unwrap_or((rank, rank));
            return Err(Error::FdTransport(format!(
                "pidfd_getfd of rank {exporter}'s fd by rank {importer} was refused{}; \
                 set SHMBROKER_FD_TRANSPORT=auto (or relay) to pass fds through the broker",
                first_refusal.map_or(String::new(), |(_, errno)| format!(" here with {errno}"))
            )));
        }
        let relay = Relay {
            seq,
            mine,
            refused_by: statuses.iter().map(|s| s.refused).collect(),
            tickets: relayed,
        };
        self.relay_refused(&relay, &mut imported, deadline)?;
        Ok(imported)
    }

    /// Relays what `relay` says was refused, one fd of each batch per round: exporters pass fd
    /// `index` to each importer that needs it, then importers take theirs, checked against the
    /// ticket like any other.
    ///
    /// No rank is more than one round ahead of another (it takes every fd of a round, from every
    /// exporter, before it relays the next), so an importer holds at most two rounds' fds
    /// unclaimed: up to `2 (world - 1)`, past the broker's cap from 34 ranks on. An exporter
    /// refused for that reason takes this round's fds that have reached it meanwhile, and so
    /// frees room at its own importers, before it tries again; an importer that is full holds
    /// the next round's fds from at most `world - 2` exporters once it has taken this round's,
    /// so every relay gets through.
    fn relay_refused(
        &mut self,
        relay: &Relay<'_, '_>,
        imported: &mut Moved,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let rank = self.rank();
        let mine = relay.refused_by[rank as usize];
        // Fds closed as they came for an exchange given up on still count at the broker until
        // claimed: claimed first, so that they cannot hold this exchange's relays back.
        self.inner.claim_dropped_relays();
        let mut failed = None;
        for index in 0..imported.count {
            let token = relay_token(relay.seq, index);
            let mut taken: Vec<Option<OwnedFd>> = (0..self.world_size()).map(|_| None).collect();
            if let Some(&fd) = relay.mine.get(index) {
                for (importer, refused) in (0..).zip(&relay.refused_by) {
                    if importer != rank && refused & (1 << rank) != 0 {
                        self.relay_with_retry(importer, token, fd, deadline, |session| {
                            session.take_arrived(mine, token, &mut taken);
                        })?;
                    }
                }
            }
            for exporter in (0..self.world_size()).filter(|&e| mine & (1 << e) != 0) {
                let fd = match taken[exporter as usize].take() {
                    Some(fd) => fd,
                    None => match self.take_relayed_fd_from_live(exporter, token, deadline) {
                        Ok(fd) => fd,
                        // Name every exporter of this round whose fd has not come, not only the
                        // first: the one at fault may be a later one that an earlier one waits
                        // for in its turn.
                        Err(Error::Timeout { .. }) => {
                            self.take_arrived(mine, token, &mut taken);
                            let missing = (exporter..self.world_size())
                                .filter(|&e| mine & (1 << e) != 0 && taken[e as usize].is_none())
                                .collect();
                            return Err(self.timed_out_waiting(deadline, missing));
                        }
                        Err(other) => return Err(other),
                    },
                };
                let ticket = relay
                    .tickets
                    .iter()
                    .find(|(from, _)| *from == exporter)
                    .and_then(|(_, bytes)| tickets_in(bytes.get(index * TICKET..)?).next())
                    .ok_or_else(|| {
                        Error::Misuse(format!("no ticket {index} from rank {exporter}"))
                    })?;
                // A relayed fd that fails its check is closed, and the rounds go on: this rank
                // still relays its own fds and takes every peer's, so the others finish and
                // none of them waits for (and names) this rank.
                match check(&fd, &ticket) {
                    Ok(()) => imported.slots(exporter)[index] = Some(fd),
                    Err(ImportFailure::Stale { found, .. }) => {
                        failed.get_or_insert(Error::StaleFdTicket {
                            exporter,
                            expected: (ticket.dev, ticket.ino),
                            found,
                        });
                    }
                    Err(_) => {
                        failed.get_or_insert(Error::FdTransport(format!(
                            "fstat of an fd relayed by rank {exporter} failed"
                        )));
                    }
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Takes, without waiting, every fd relayed with `token` by the exporters of `from` (a bit
    /// for each) that has arrived and is not in `taken` yet.
    fn take_arrived(&mut self, from: u64, token: u64, taken: &mut [Option<OwnedFd>]) {
        for exporter in (0..self.world_size()).filter(|&e| from & (1 << e) != 0) {
            if taken[exporter as usize].is_none() {
                taken[exporter as usize] = self
                    .inner
                    .take_relayed_fd(exporter, token, Duration::ZERO)
                    .ok();
            }
        }
    }

    /// A receive of the tickets of exchange `seq` from each exporter but this rank.
    fn ticket_receives(&self, exporters: &[u32], seq: u64) -> Vec<Incoming<'static>> {
        let expect = Expect::Collective {
            op: kind::FD_TICKET,
            seq,
        };
        let rank = self.rank();
        exporters
            .iter()
            .filter(|&&exporter| exporter != rank)
            .map(|&exporter| Incoming::new(exporter, expect, Sink::Vec(Vec::new())))
            .collect()
    }

    /// Receives the tickets of exchange `seq` from each exporter but this rank, and takes its
    /// fds as they come: straight from the ring when the tickets fit one slot (a single fd's
    /// always do), otherwise as a whole message.
    fn receive_and_take(
        &mut self,
        exporters: &[u32],
        seq: u64,
        imported: &mut Moved,
        taken: &mut Taken,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let rank = self.rank();
        for (at, &exporter) in exporters.iter().enumerate().filter(|&(_, &e)| e != rank) {
            let received = match self.recv_one_slot(exporter, kind::FD_TICKET, seq, deadline) {
                Ok(Ok(slot)) => {
                    let len = (slot.len as usize).min(slot.inline.len());
                    self.take_from(exporter, &slot.inline[..len], imported, taken, deadline)
                }
                Ok(Err(_longer)) => {
                    let mut whole = self.ticket_receives(&[exporter], seq);
                    self.receive_all(&mut whole, deadline).and_then(|()| {
                        match whole.pop().map(Incoming::finish).transpose()? {
                            Some((_, Sink::Vec(bytes))) => {
                                self.take_from(exporter, &bytes, imported, taken, deadline)
                            }
                            _ => Ok(()),
                        }
                    })
                }
                Err(error) => Err(error),
            };
            if let Err(error) = received {
                let expect = Expect::Collective {
                    op: kind::FD_TICKET,
                    seq,
                };
                let later: Vec<u32> = exporters[at + 1..]
                    .iter()
                    .copied()
                    .filter(|&e| e != rank)
                    .collect();
                return Err(self.still_missing(error, &later, expect, deadline));
            }
        }
        Ok(())
    }

    /// Takes the fds `exporter`'s `tickets` describe into `imported`, noting in `taken` what
    /// could not be (a batch of another length, a refusal, a stale ticket, no room).
    fn take_from(
        &mut self,
        exporter: u32,
        tickets: &[u8],
        imported: &mut Moved,
        taken: &mut Taken,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let bit = 1 << exporter;
        if tickets.len() != imported.count * TICKET {
            taken.status.miscounted |= bit;
            taken.failure.get_or_insert(Failure::Miscounted {
                exporter,
                found: tickets.len(),
            });
            return Ok(());
        }
        if self.engine.fd_transport() == FdTransport::Relay {
            taken.status.refused |= bit;
        } else {
            match self.import_batch(exporter, tickets, imported.slots(exporter), deadline)? {
                Ok(()) => {}
                Err(ImportFailure::Refused(errno)) => {
                    taken.status.refused |= bit;
                    taken.first_refusal.get_or_insert((exporter, errno));
                }
                Err(ImportFailure::Stale { ticket, found }) => {
                    taken.status.stale |= bit;
                    taken.failure.get_or_insert(Failure::Stale {
                        exporter,
                        ticket,
                        found,
                    });
                }
                Err(ImportFailure::Exhausted(errno)) => {
                    taken.status.exhausted |= bit;
                    taken
                        .failure
                        .get_or_insert(Failure::Exhausted { exporter, errno });
                }
                Err(ImportFailure::Forged(detail)) => {
                    taken.status.forged |= bit;
                    taken
                        .failure
                        .get_or_insert(Failure::Forged { exporter, detail });
                }
            }
        }
        if taken.status.refused & bit != 0 {
            taken.relayed.push((exporter, tickets.to_vec()));
        }
        Ok(())
    }

    /// Every fd of `exporter`'s `batch`, taken with `pidfd_getfd` and checked; the outer error
    /// is one that ends the exchange here (the exporter's process cannot be had).
    fn import_batch(
        &mut self,
        exporter: u32,
        batch: &[u8],
        slots: &mut [Option<OwnedFd>],
        deadline: &Deadline,
    ) -> Result<Result<(), ImportFailure>, Error> {
        if batch.is_empty() {
            return Ok(Ok(()));
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
            && let Some(forged) = tickets_in(batch).find(|t| i64::from(t.pid) != i64::from(own))
        {
            return Ok(Err(ImportFailure::Forged(format!(
                "fd ticket names pid {}; rank {exporter} logged on as pid {pid} (pid {own} in \
                 its own PID namespace)",
                forged.pid
            ))));
        }
        for (at, ticket) in tickets_in(batch).enumerate() {
            match import(&pidfd, &ticket) {
                Ok(fd) => slots[at] = Some(fd),
                Err(failure) => {
                    // All or none: what was taken is closed (a relay brings the batch whole).
                    slots.iter_mut().for_each(|slot| *slot = None);
                    return Ok(Err(failure));
                }
            }
        }
        Ok(Ok(()))
    }

    /// The error every rank returns when some ticket was stale or forged, some rank had no
    /// room, or a batch had another length than its importer's, decided from `statuses` alike
    /// everywhere; `mine` is what this rank saw.
    fn agreed_failure(
        &mut self,
        statuses: &[Status],
        mine: Option<Failure>,
        count: usize,
    ) -> Result<(), Error> {
        let any_failed = statuses
            .iter()
            .any(|s| s.stale != 0 || s.miscounted != 0 || s.exhausted != 0 || s.forged != 0);
        // An exporter that gave this exchange up because a rank died closes its fds, and its
        // tickets then read as stale: that death is the cause, and is named as in any collective
        // (a death of this team's: one from before a shrink or a rejoin is no cause).
        if mine.is_some() || any_failed {
            let _ = self.inner.lost_rank();
            if let Some(rank) = self.team_lost_rank(self.groups.world()) {
                return Err(self.collective_lost(rank));
            }
        }
        match mine {
            Some(Failure::Stale {
                exporter,
                ticket,
                found,
            }) => {
                return Err(Error::StaleFdTicket {
                    exporter,
                    expected: (ticket.dev, ticket.ino),
                    found,
                });
            }
            Some(Failure::Miscounted { exporter, found }) => {
                return Err(Error::Protocol {
                    peer: exporter,
                    detail: format!(
                        "{} fd tickets ({found} bytes) where {count} were due (every rank of an \
                         fd exchange passes the same number of fds)",
                        found / size_of::<FdTicket>()
                    ),
                });
            }
            Some(Failure::Forged { exporter, detail }) => {
                return Err(Error::Protocol {
                    peer: exporter,
                    detail,
                });
            }
            Some(Failure::Exhausted { exporter, errno }) => {
                return Err(Error::Io {
                    what: "holding the fds of an exchange: this process has no room for them \
                           (raise RLIMIT_NOFILE, or move fewer at once)",
                    source: std::io::Error::other(format!("rank {exporter}'s fds: {errno}")),
                });
            }
            None => {}
        }
        // Another rank failed: name the forger, or the rank that failed (the root of a
        // broadcast, or a rank that agrees with it, names the importer that disagreed).
        if let Some((importer, status)) = (0u32..).zip(statuses).find(|(_, s)| s.forged != 0) {
            let forger = status.forged.trailing_zeros();
            return Err(Error::Protocol {
                peer: forger,
                detail: format!(
                    "rank {forger} sent rank {importer} an fd ticket naming another process \
                     than its own"
                ),
            });
        }
        if let Some((importer, status)) = (0u32..).zip(statuses).find(|(_, s)| s.miscounted != 0) {
            return Err(Error::Protocol {
                peer: importer,
                detail: format!(
                    "rank {importer} passed another number of fds than rank {} sent ({count} \
                     here; every rank of an fd exchange passes the same number)",
                    status.miscounted.trailing_zeros()
                ),
            });
        }
        if let Some((importer, status)) = (0u32..).zip(statuses).find(|(_, s)| s.stale != 0) {
            return Err(Error::FdTransport(format!(
                "rank {importer} was offered a stale fd ticket by rank {}",
                status.stale.trailing_zeros()
            )));
        }
        if let Some((importer, status)) = (0u32..).zip(statuses).find(|(_, s)| s.exhausted != 0) {
            let exporter = status.exhausted.trailing_zeros();
            let whose = if exporter == importer {
                "for duplicates of its own fds".to_string()
            } else {
                format!("for the fds of rank {exporter}")
            };
            return Err(Error::FdTransport(format!(
                "rank {importer} had no room {whose} (it is out of fds)"
            )));
        }
        Ok(())
    }

    /// Relays `fd` to `importer` through the broker, trying again while the importer only holds
    /// too many relayed fds it has not taken yet; `meanwhile` runs before each new try.
    fn relay_with_retry(
        &mut self,
        importer: u32,
        token: u64,
        fd: BorrowedFd<'_>,
        deadline: &Deadline,
        mut meanwhile: impl FnMut(&mut Self),
    ) -> Result<(), Error> {
        loop {
            // No relay starts past the deadline: its importer no longer waits for it.
            if deadline.left().is_zero() {
                return Err(self.timed_out(deadline, importer));
            }
            match self.inner.relay_fd(importer, token, fd, deadline.left()) {
                Ok(()) => return Ok(()),
                Err(shmbroker_handshake::Error::RelayRefused { full: true, .. }) => {
                    self.check_interrupted(deadline)?;
                    self.inner.claim_dropped_relays();
                    meanwhile(self);
                    std::thread::sleep(Duration::from_millis(1).min(deadline.left()));
                }
                Err(error) => return Err(self.relay_failed(importer, error)),
            }
        }
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
            // A death anywhere ends the exchange, as it does any collective: the rank waited
            // for may itself be stuck behind the dead one.
            if self.inner.departure(exporter).is_none() {
                self.check_interrupted(deadline)?;
            }
            self.inner.claim_dropped_relays();
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

    /// The error for a relay to or from `peer` that failed (an fd's, or a typed channel's ring):
    /// who is gone if someone is, else what the handshake said. A relay is tried when `pidfd_getfd` failed, which it also does for a
    /// process that is exiting (its fds already gone, its pidfd not yet readable): so a death
    /// is waited for a little before the relay's own failure is reported.
    pub(super) fn relay_failed(&self, peer: u32, error: shmbroker_handshake::Error) -> Error {
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
            .map_err(|error| deadline.handshake_failed(exporter, error))
    }

    /// Records which transport moved this exchange's fds (see [`Self::fd_transport_used`]), and
    /// logs it when that changes: a warning when a refused `pidfd_getfd` sent fds through the
    /// broker, or made the exchange fail under `pidfd`; otherwise at `info`.
    fn report_fd_transport(&mut self, relayed: bool, refusal: Option<(u32, nix::errno::Errno)>) {
        let used = match (relayed, self.engine.fd_transport()) {
            (false, _) => Some(FdTransport::Pidfd),
            (true, FdTransport::Pidfd) => None,
            (true, _) => Some(FdTransport::Relay),
        };
        if let Some(used) = used
            && !self.engine.note_fd_transport_used(used)
        {
            return;
        }
        let rank = self.rank();
        let fell_back = relayed && self.engine.fd_transport() != FdTransport::Relay;
        let why = match (self.engine.fd_transport(), relayed, refusal) {
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
            Err(ImportFailure::Stale { found, .. }) => {
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
