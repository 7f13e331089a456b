//! Logon: validating a whole frame, giving the worker a rank, and the reply with every fd.

use super::{Event, Listener, Pending, RateLimit, Worker};
use crate::error::Error;
use crate::wire::{decode_logon, decode_status_request, manifest_order};
use shmbroker_bindings::{
    ANY_RANK, FdRole, ManifestEntry, Message, NoticeKind, PROTOCOL_VERSION, REPLY_MAGIC,
    RING_LAYOUT_VERSION, RejectReason, ReplyHeader, STATUS_MAGIC, WorkerNotice,
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
        // stranger as one of its ranks (both ids must be known; a launcher that gives none
        // claims nothing).
        if let Some(current) = self.job_id
            && frame.job != 0
            && frame.job != current
        {
            let text = format!(
                "this broker serves job {current:#x}, and this worker is of job {:#x}; the next \
                 job starts once every worker of this one is gone",
                frame.job
            );
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
    pub(super) fn reply(
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
