//! Logon: validating a whole frame, giving the worker a rank, and the reply with every fd.

use super::{Event, Listener, Pending, RateLimit, Worker};
use crate::error::Error;
use crate::wire::{decode_logon, decode_status_request, manifest_order};
use shmbroker_bindings::{
    ANY_RANK, FdRole, MAX_REJOINS, ManifestEntry, Message, NoticeKind, PROTOCOL_VERSION,
    REPLY_MAGIC, RING_LAYOUT_VERSION, RejectReason, ReplyHeader, STATUS_MAGIC, WorkerNotice,
};
use shmbroker_sys::fdpass::send_with_fds;
use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};

impl Listener {
    /// Why the current job is winding down (its first death, or else its first departure), if it
    /// is.
    pub(super) fn winding_down(&self) -> Option<String> {
        match (self.lost, self.left) {
            (Some(rank), _) => Some(format!("rank {rank} died")),
            (None, Some(rank)) => Some(format!("rank {rank} left")),
            (None, None) => None,
        }
    }

    /// Validates a whole logon frame and answers it.
    pub(super) fn log_on(&mut self, pending: Pending, events: &mut Vec<Event>) {
        let who = (pending.pid, pending.uid);
        if pending.frame[..8] == STATUS_MAGIC.to_le_bytes() {
            return match decode_status_request(&pending.frame) {
                Ok(()) => self.answer_status(pending),
                Err((reason, detail)) => {
                    self.refuse(&pending.stream, reason, who, detail.to_string(), events);
                }
            };
        }
        let frame = match decode_logon(&pending.frame) {
            Ok(frame) => frame,
            Err((reason, detail)) => {
                return self.refuse(&pending.stream, reason, who, detail.to_string(), events);
            }
        };
        let world = self.config.world_size;
        // The rank's process may have exited a moment ago without this broker having seen it
        // yet (a launcher restarting a crashed rank at once): looked at now, so that the logon
        // is answered for what is true, not refused as taken.
        let asked = frame.requested_rank as usize;
        if let Some(worker) = self.workers.get(asked).and_then(Option::as_ref)
            && worker.stream.is_some()
            && !worker.exited
            && exited_now(&worker.pidfd)
        {
            self.process_exited(asked, events);
        }
        // A replacement for a rank that died, or a rank that had not logged on yet when the job
        // lost a worker (it comes late), while the job goes on (see `rejoin`).
        let asked = self.workers.get(frame.requested_rank as usize);
        let gone = asked
            .and_then(Option::as_ref)
            .filter(|w| w.stream.is_none());
        let late = asked.is_some_and(Option::is_none) && self.winding_down().is_some();
        if (gone.is_some() || late) && self.workers.iter().flatten().any(|w| w.stream.is_some()) {
            let rank = frame.requested_rank;
            let said_goodbye = gone.is_some_and(|worker| worker.said_goodbye);
            let rejoins = gone.map_or(0, |worker| worker.rejoins);
            let refusal = if said_goodbye {
                Some((
                    RejectReason::RankLeft,
                    format!(
                        "rank {rank} left (its process {} said goodbye): only a rank that died \
                         can be replaced",
                        gone.map_or(0, |worker| worker.pid)
                    ),
                ))
            } else if rejoins >= MAX_REJOINS {
                Some((
                    RejectReason::RejoinsExhausted,
                    format!("rank {rank} has been replaced {MAX_REJOINS} times in this job"),
                ))
            } else {
                match self.job_id {
                    Some(current) if frame.job == current => None,
                    Some(current) if frame.job != 0 => Some((
                        RejectReason::OtherJob,
                        format!(
                            "this broker serves job {current:#x}, and this process for rank \
                             {rank} is of job {:#x}",
                            frame.job
                        ),
                    )),
                    // The id first: a reason is cut at `REASON_LEN` bytes.
                    current => Some((
                        RejectReason::JobUnnamed,
                        format!(
                            "must name the job to join after a death: {} ({})",
                            current.map_or_else(
                                || "SHMBROKER_JOB".to_string(),
                                |id| format!("SHMBROKER_JOB={id:#x}")
                            ),
                            if late {
                                self.winding_down().unwrap_or_default()
                            } else {
                                format!("rank {rank} died")
                            },
                        ),
                    )),
                }
            };
            if let Some((reason, text)) = refusal {
                return self.refuse(&pending.stream, reason, who, text, events);
            }
            if let Some(text) = self.too_small(&frame) {
                let reason = RejectReason::CapacityOutOfLimits;
                return self.refuse(&pending.stream, reason, who, text, events);
            }
            return self.rejoin(pending, rank, events);
        }
        // A rank alive now: the same answer whether or not the job is winding down.
        if let Some(holder) = self
            .workers
            .get(frame.requested_rank as usize)
            .and_then(Option::as_ref)
            .filter(|worker| worker.stream.is_some())
            && self.winding_down().is_some()
        {
            let rank = frame.requested_rank;
            let text = if holder.rejoins == 0 {
                format!(
                    "rank {rank} is alive (pid {}): only a rank that died can be replaced",
                    holder.pid
                )
            } else {
                format!(
                    "rank {rank} is alive: pid {} replaced the process that died (one \
                     replacement per death)",
                    holder.pid
                )
            };
            return self.refuse(&pending.stream, RejectReason::RankTaken, who, text, events);
        }
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
        // A worker of another job than the one served now: taking it would give that job a
        // stranger as one of its ranks. Every worker of a job names the same id, or none does:
        // a worker that names none is no more of a named job than one that names another.
        let anyone_in = self.workers.iter().any(Option::is_some);
        let stranger = match (self.job_id, frame.job) {
            // The broker made the id: its workers named none, as this one.
            (Some(_), 0) if !self.job_named => None,
            (Some(current), 0) => Some(format!(
                "this broker serves job {current:#x}, and this worker names no job (set \
                 SHMBROKER_JOB to the job's id)"
            )),
            (Some(current), job) if job != current && !self.job_named => Some(format!(
                "this broker serves job {current:#x}, whose workers named no job, and this \
                 worker is of job {job:#x}"
            )),
            (Some(current), job) if job != current => Some(format!(
                "this broker serves job {current:#x}, and this worker is of job {job:#x}"
            )),
            (None, job) if job != 0 && anyone_in => Some(format!(
                "this broker serves a job whose workers named no job, and this worker is of \
                 job {job:#x}"
            )),
            _ => None,
        };
        if let Some(stranger) = stranger {
            let text =
                format!("{stranger}; the next job starts once every worker of this one is gone");
            return self.refuse(&pending.stream, RejectReason::OtherJob, who, text, events);
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
                let text = if holder.rejoins == 0 {
                    format!("rank {rank} is taken by pid {}", holder.pid)
                } else {
                    format!(
                        "rank {rank} is taken by pid {}, which replaced the process that died \
                         (one replacement per death)",
                        holder.pid
                    )
                };
                return self.refuse(&pending.stream, RejectReason::RankTaken, who, text, events);
            }
            rank
        };
        if let Some(text) = self.too_small(&frame) {
            let reason = RejectReason::CapacityOutOfLimits;
            return self.refuse(&pending.stream, reason, who, text, events);
        }
        match self.reply(&pending, rank, 0) {
            Ok((pidfd, introductions)) => {
                if frame.job != 0 && self.job_id.is_none() {
                    self.job_id = Some(frame.job);
                    self.job_named = true;
                } else if self.job_id.is_none() {
                    // A job always has an id: a replacement names it to rejoin.
                    self.job_id = Some(made_job_id());
                    self.job_named = false;
                }
                self.welcome(pending, rank, 0, pidfd, introductions, events);
            }
            Err(error) => {
                let text = format!("could not serve rank {rank}: {error}");
                self.refuse(&pending.stream, RejectReason::Internal, who, text, events);
            }
        }
    }

    /// Why this broker's rings are too small for `frame`, if they are.
    fn too_small(&self, frame: &shmbroker_bindings::LogonFrame) -> Option<String> {
        (frame.min_ring_capacity > self.config.ring_capacity).then(|| {
            format!(
                "needs at least {} ring slots; this broker's rings have {}",
                frame.min_ring_capacity, self.config.ring_capacity
            )
        })
    }

    /// Records a worker whose reply went out, introduces it, passes it every outbox there is,
    /// and reports it.
    fn welcome(
        &mut self,
        pending: Pending,
        rank: u32,
        rejoins: u32,
        pidfd: OwnedFd,
        introductions: Vec<(u32, WorkerNotice, OwnedFd)>,
        events: &mut Vec<Event>,
    ) {
        let (pid, uid) = (pending.pid, pending.uid);
        self.workers[rank as usize] = Some(Worker {
            stream: Some(pending.stream),
            pid,
            uid,
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
            rejoins,
        });
        for (to, notice, fd) in introductions {
            self.send(to, notice, Some(fd));
        }
        for owner in 0..self.config.world_size {
            if owner != rank {
                self.pass_outbox(owner, rank);
            }
        }
        if let Some(suppressed) = self.allow_coming(uid) {
            if rejoins == 0 {
                tracing::info!(rank, pid, uid, suppressed, "logged on");
            } else {
                tracing::info!(
                    rank,
                    pid,
                    uid,
                    rejoins,
                    suppressed,
                    "rejoined in place of the rank's process that died"
                );
            }
        }
        events.push(Event::LoggedOn {
            rank,
            pid,
            uid,
            rejoins,
        });
    }

    /// Admits `pending` as rank `rank`, whose process died while the job goes on, or which had
    /// not logged on yet when the job lost a worker (`log_on` has checked which, that the logon
    /// names this job, and the limits). The two are one path: the survivors closed their rings
    /// to such a rank either way, and take the newcomer on the same way.
    ///
    /// The rings of the dead process are dropped here (each survivor closed and keeps its own
    /// mapping of them), and fresh ones made between `rank` and every other rank, with a fresh
    /// readiness eventfd for it: nothing the dead process left in them can reach the newcomer,
    /// and nothing sent to it reaches the newcomer as if it were for it. The newcomer gets the
    /// usual reply (saying how many processes held the rank before), the survivors' pidfds and
    /// outboxes, and a word about every rank that is gone or never came. Every survivor gets
    /// its two new rings, the newcomer's eventfd and its pidfd, in four notices in a row
    /// (`RejoinRingTo`, `RejoinRingFrom`, `RejoinReadiness`, `Rejoined`); its outbox follows
    /// once the newcomer publishes it, as for any worker. Everything is made before the reply
    /// goes out, so a rejoin that cannot be finished is refused whole.
    fn rejoin(&mut self, pending: Pending, rank: u32, events: &mut Vec<Event>) {
        let who = (pending.pid, pending.uid);
        // A rank that had not logged on before comes as its first process (0 before it).
        let rejoins = self.workers[rank as usize]
            .as_ref()
            .map_or(0, |worker| worker.rejoins + 1);
        self.rings
            .retain(|&(from, to), _| from != rank && to != rank);
        self.readiness.remove(&rank);
        let prepared = self.make_rings(rank).and_then(|()| {
            let survivors: Vec<u32> = (0u32..)
                .zip(&self.workers)
                .filter(|(peer, worker)| {
                    *peer != rank && worker.as_ref().is_some_and(|w| w.stream.is_some())
                })
                .map(|(peer, _)| peer)
                .collect();
            let dup = |fd: &OwnedFd| fd.try_clone().map_err(Error::io("dup"));
            let mut notices = Vec::new();
            for peer in survivors {
                for (kind, fd) in [
                    (NoticeKind::RejoinRingTo, &self.rings[&(peer, rank)]),
                    (NoticeKind::RejoinRingFrom, &self.rings[&(rank, peer)]),
                    (NoticeKind::RejoinReadiness, &self.readiness[&rank]),
                    (NoticeKind::Rejoined, &pending.pidfd),
                ] {
                    let token = if kind == NoticeKind::Rejoined {
                        pending.pid as u64
                    } else {
                        u64::from(rejoins)
                    };
                    notices.push((peer, WorkerNotice::new(kind, rank, token), dup(fd)?));
                }
            }
            Ok(notices)
        });
        let replied =
            prepared.and_then(|notices| Ok((self.reply(&pending, rank, rejoins)?, notices)));
        let ((pidfd, introductions), notices) = match replied {
            Ok(done) => done,
            Err(error) => {
                let text = format!("could not serve rank {rank}'s replacement: {error}");
                return self.refuse(&pending.stream, RejectReason::Internal, who, text, events);
            }
        };
        // The newcomer meets the survivors; the survivors meet it through the rejoin notices.
        let introductions = introductions
            .into_iter()
            .filter(|(to, _, _)| *to == rank)
            .collect();
        let cause = self.lost.or(self.left);
        let gone: Vec<WorkerNotice> = (0u32..)
            .zip(&self.workers)
            .filter(|(peer, _)| *peer != rank)
            .filter_map(|(peer, worker)| match worker {
                Some(worker) if worker.stream.is_none() => Some(WorkerNotice::new(
                    NoticeKind::PeerGone,
                    peer,
                    u64::from(worker.said_goodbye),
                )),
                Some(_) => None,
                None => cause.map(|cause| {
                    let clean = self.lost.is_none();
                    WorkerNotice::new(
                        NoticeKind::NeverJoins,
                        peer,
                        u64::from(cause) | u64::from(clean) << 32,
                    )
                }),
            })
            .collect();
        self.welcome(pending, rank, rejoins, pidfd, introductions, events);
        for notice in gone {
            self.send(rank, notice, None);
        }
        for (to, notice, fd) in notices {
            self.send(to, notice, Some(fd));
        }
    }

    /// Makes the rings `rank` needs and lacks, and its readiness eventfd and its peers'.
    fn make_rings(&mut self, rank: u32) -> Result<(), Error> {
        for (role, peer) in manifest_order(rank, self.config.world_size) {
            let key = match (role, peer) {
                (FdRole::RingToPeer, Some(peer)) => (rank, peer),
                (FdRole::RingFromPeer, Some(peer)) => (peer, rank),
                (FdRole::Readiness, Some(peer)) => {
                    if let std::collections::hash_map::Entry::Vacant(entry) =
                        self.readiness.entry(peer)
                    {
                        entry.insert(
                            shmbroker_sys::eventfd::create().map_err(Error::io("eventfd"))?,
                        );
                    }
                    continue;
                }
                (_, None) => continue,
            };
            if !self.rings.contains_key(&key) {
                let ring = shmbroker_queues::create::<Message>(self.config.ring_capacity as usize)
                    .map_err(Error::CreateRing)?;
                self.rings.insert(key, ring);
            }
        }
        Ok(())
    }

    /// Creates what rank `rank` still lacks and sends it everything in one message. Returns its
    /// pidfd and the `Peer` notices that introduce it to every logged-on worker and them to it,
    /// all made before the reply is sent: a logon that cannot be finished is refused whole.
    #[allow(clippy::type_complexity)]
    pub(super) fn reply(
        &mut self,
        pending: &Pending,
        rank: u32,
        rejoins: u32,
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
        self.make_rings(rank)?;
        let mut manifest = Vec::new();
        let mut fds = Vec::new();
        for (role, peer) in manifest_order(rank, world) {
            let Some(peer) = peer else { continue };
            let fd = match role {
                FdRole::RingToPeer => &self.rings[&(rank, peer)],
                FdRole::RingFromPeer => &self.rings[&(peer, rank)],
                FdRole::Readiness => &self.readiness[&peer],
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
            rejoins,
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

/// Whether the process of `pidfd` has exited (it is readable), looked at without waiting.
fn exited_now(pidfd: &OwnedFd) -> bool {
    let mut fds = [nix::poll::PollFd::new(
        pidfd.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).is_ok_and(|ready| ready > 0)
}

/// A job id for a job whose first worker named none: not 0, and unlike any other job's (a
/// process of the broker's user that names it may rejoin the job; see `log_on`).
fn made_job_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    if let Ok(since) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(since.as_nanos());
    }
    hasher.finish().max(1)
}
