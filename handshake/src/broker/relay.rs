//! Notices from logged-on workers: goodbyes, outboxes, fds relayed between workers, and the
//! bounded queue of what the broker sends each worker.

use super::{Event, Listener, MAX_UNCLAIMED_FDS, MAX_UNCLAIMED_RELAYS};
use nix::errno::Errno;
use shmbroker_bindings::{ChannelToken, NOTICE_MAGIC, NoticeKind, WorkerNotice};
use shmbroker_sys::fdpass::{recv_with_fds, send_with_fds};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Instant;

/// Rings a worker may have made for it and not yet read off its socket, and channels it may
/// have offered one peer that the peer has not taken: past either, its requests are refused.
const CHANNELS_IN_FLIGHT: usize = 8;

impl Listener {
    pub(super) fn read_worker(&mut self, rank: usize, events: &mut Vec<Event>) {
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

    /// Reports a complaint about `rank`, unless it has had its share this second.
    pub(super) fn complain(&mut self, rank: u32, detail: String, events: &mut Vec<Event>) {
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
    pub(super) fn on_notice(
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
                if let Some(worker) = self.workers[rank as usize].as_mut()
                    && !worker.said_goodbye
                {
                    worker.said_goodbye = true;
                    events.push(Event::Leaving { rank });
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
            Some(NoticeKind::ChannelRequest) => {
                self.make_channel(rank, notice.peer, notice.token, events);
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
    pub(super) fn relay(
        &mut self,
        from: u32,
        to: u32,
        token: u64,
        fd: OwnedFd,
        events: &mut Vec<Event>,
    ) {
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

    /// Makes the ring of records `from` asked for to rank `to` (a typed channel: `token` is a
    /// [`ChannelToken`]), and passes it to both: to `to` as an offer it claims like a relayed
    /// fd (so an unclaimed one counts against the same limit), to `from` as made. Refused, with
    /// `from` told, when `to` is not there or holds its share, or the token asks for more than
    /// a channel may hold.
    pub(super) fn make_channel(&mut self, from: u32, to: u32, token: u64, events: &mut Vec<Event>) {
        let made = self.channel_ring(from, to, token);
        let fd = match made {
            Ok(fd) => fd,
            Err(detail) => {
                self.send(
                    from,
                    WorkerNotice::new(NoticeKind::ChannelRefused, to, token),
                    None,
                );
                return self.complain(from, detail, events);
            }
        };
        let Ok(copy) = fd.try_clone() else {
            self.send(
                from,
                WorkerNotice::new(NoticeKind::ChannelRefused, to, token),
                None,
            );
            return self.complain(from, "could not duplicate a channel's ring".into(), events);
        };
        if let Some(target) = self.workers[to as usize].as_mut() {
            target.unclaimed.insert((from, token));
            target.outgoing.push_back((
                WorkerNotice::new(NoticeKind::ChannelOffered, from, token),
                Some(copy),
            ));
            self.flush(to as usize);
        }
        self.send(
            from,
            WorkerNotice::new(NoticeKind::ChannelMade, to, token),
            Some(fd),
        );
    }

    /// The ring of a channel request, or why there is none.
    fn channel_ring(&self, from: u32, to: u32, token: u64) -> Result<OwnedFd, String> {
        let Some(request) = ChannelToken::unpack(token) else {
            return Err(format!(
                "a channel request's token {token:#x} asks for records of 1 to {} bytes, 2 to {} of \
                 them",
                ChannelToken::MAX_RECORD_BYTES,
                ChannelToken::MAX_CAPACITY
            ));
        };
        let class = ChannelToken::class_bytes(request.record_bytes);
        let file_bytes = (u64::from(class) + 8).saturating_mul(request.capacity);
        if file_bytes > ChannelToken::MAX_FILE_BYTES {
            return Err(format!(
                "a channel of {} records of {} bytes needs {file_bytes} bytes, more than {}",
                request.capacity,
                request.record_bytes,
                ChannelToken::MAX_FILE_BYTES
            ));
        }
        // The requester's own rings not yet read off its socket: a worker that asks and never
        // reads cannot make the broker hold fds without bound.
        let made = NoticeKind::ChannelMade as u32;
        let queued_here = self.workers[from as usize].as_ref().map_or(0, |w| {
            w.outgoing
                .iter()
                .filter(|(notice, _)| notice.kind == made)
                .count()
        });
        if queued_here >= CHANNELS_IN_FLIGHT {
            return Err(format!(
                "channel refused: {queued_here} rings made for this worker are still queued to \
                 it (it does not read its socket)"
            ));
        }
        let target = self
            .workers
            .get(to as usize)
            .and_then(Option::as_ref)
            .filter(|w| w.stream.is_some() && to != from);
        // A producer's offers a consumer has not taken count against the consumer's relays: a
        // few per producer, so that one cannot take them all.
        if let Some(target) = target {
            let offered = target
                .unclaimed
                .iter()
                .filter(|(peer, _)| *peer == from)
                .count();
            if offered >= CHANNELS_IN_FLIGHT {
                return Err(format!(
                    "channel to rank {to} refused: it has not taken this worker's last \
                     {offered} channels"
                ));
            }
        }
        match target {
            None => return Err(format!("channel to rank {to} refused: it is not logged on")),
            Some(target)
                if target.unclaimed.len() >= MAX_UNCLAIMED_RELAYS
                    || target
                        .outgoing
                        .iter()
                        .filter(|(_, fd)| fd.is_some())
                        .count()
                        >= MAX_UNCLAIMED_RELAYS =>
            {
                return Err(format!(
                    "channel to rank {to} refused: it holds {MAX_UNCLAIMED_RELAYS} fds it has not \
                     taken"
                ));
            }
            Some(_) => {}
        }
        let capacity = usize::try_from(request.capacity).unwrap_or(usize::MAX);
        shmbroker_queues::create_sized(class, 8, capacity)
            .map_err(|e| format!("making a channel's ring: {e}"))
    }

    /// Queues a notice (and its fd) for `to` and sends what its socket has room for.
    pub(super) fn send(&mut self, to: u32, notice: WorkerNotice, fd: Option<OwnedFd>) {
        if let Some(worker) = self.workers[to as usize].as_mut()
            && worker.stream.is_some()
        {
            worker.outgoing.push_back((notice, fd));
            self.flush(to as usize);
        }
    }

    /// Sends `rank` what is queued for it, until its socket is full (the rest goes when `poll`
    /// says it has room) or gone (reading it will say so).
    pub(super) fn flush(&mut self, rank: usize) {
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

    /// Checks and keeps `rank`'s outbox, and passes it to every other logged-on worker.
    pub(super) fn take_outbox(&mut self, rank: u32, fd: OwnedFd) -> Result<(), String> {
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
    pub(super) fn pass_outbox(&mut self, owner: u32, to: u32) -> bool {
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
}
