//! `shmbroker status`: answering a client that asks what the job's ranks are doing (see
//! `shmbroker_bindings::StatusReplyHeader`).
//!
//! The answer is built from the broker's records (state, pid, uid), each live rank's outbox
//! status words (copied through a read-only mapping of the outbox it published) and the fill of
//! every ring (counted through the broker's own fd of it, claiming no end). All of it is what the
//! ranks wrote, copied and passed on as found: the client validates it. The broker writes the
//! reply once, without waiting: a client that has not room for it gets a short reply, and the
//! job is never held up by a status client. Building an answer maps every ring and outbox
//! (milliseconds for a large world), so an answer is kept for [`STATUS_FRESH`] and given again
//! to whoever asks meanwhile: clients polling in a loop cost the broker a bounded share of its
//! time, whatever their number.

use super::{Listener, Pending};
use shmbroker_allocator::PeerOutbox;
use shmbroker_bindings::{
    FILL_UNKNOWN, Message, NO_PEER, PROTOCOL_VERSION, RankState, RankStatus, STATUS_MAX_PEERS,
    STATUS_REPLY_MAGIC, StatusReplyHeader,
};
use std::io::Write;
use std::os::fd::AsFd;
use std::time::Duration;

/// How long a status answer is given again instead of built anew.
pub(super) const STATUS_FRESH: Duration = Duration::from_millis(100);

impl Listener {
    /// Answers a status request from `pending` (its uid was checked at accept) and closes it.
    pub(super) fn answer_status(&mut self, mut pending: Pending) {
        let now = std::time::Instant::now();
        let (built, reply) = match self.status_answer.take() {
            Some((built, reply)) if now.duration_since(built) < STATUS_FRESH => (built, reply),
            _ => (now, self.build_status()),
        };
        // The socket is non-blocking: what does not fit now is not sent.
        let sent = pending.stream.write(&reply).unwrap_or(0);
        if let Some(suppressed) = self.status_log.allow(now) {
            tracing::debug!(
                pid = pending.pid,
                uid = pending.uid,
                sent,
                len = reply.len(),
                suppressed,
                "answered a status request"
            );
        }
        self.status_answer = Some((built, reply));
    }

    /// A fresh answer: the header and every rank's record.
    fn build_status(&self) -> Vec<u8> {
        let world = self.config.world_size;
        let header = StatusReplyHeader {
            magic: STATUS_REPLY_MAGIC,
            version: PROTOCOL_VERSION,
            world_size: world,
            jobs_ended: self.jobs,
            job_id: self.job_id.unwrap_or(0),
            broker_pid: std::process::id() as i32,
            ring_capacity: self.config.ring_capacity,
            first_dead: self.lost.unwrap_or(NO_PEER),
            first_left: self.left.unwrap_or(NO_PEER),
        };
        let mut reply = bytemuck::bytes_of(&header).to_vec();
        for rank in 0..world {
            reply.extend_from_slice(bytemuck::bytes_of(&self.rank_status(rank)));
        }
        reply
    }

    /// What the broker knows of `rank`, and what it publishes.
    fn rank_status(&self, rank: u32) -> RankStatus {
        let mut status = RankStatus {
            rank,
            state: RankState::NeverJoined as u32,
            pid: 0,
            uid: 0,
            outbox_bytes: 0,
            status: Default::default(),
            ring_fill: [FILL_UNKNOWN; STATUS_MAX_PEERS],
        };
        for (peer, fill) in (0..self.config.world_size).zip(&mut status.ring_fill) {
            if let Some(ring) = self.rings.get(&(rank, peer)) {
                *fill = shmbroker_queues::fill::<Message>(ring.as_fd())
                    .map_or(FILL_UNKNOWN, |n| u32::try_from(n).unwrap_or(FILL_UNKNOWN));
            }
        }
        let Some(worker) = &self.workers[rank as usize] else {
            return status;
        };
        (status.pid, status.uid) = (worker.pid, worker.uid);
        status.state = match (&worker.stream, worker.said_goodbye) {
            (Some(_), _) if shmbroker_sys::pidfd::stopped(worker.pidfd.as_fd()) => {
                RankState::Stopped
            }
            (Some(_), _) => RankState::Running,
            (None, true) => RankState::Left,
            (None, false) => RankState::Dead,
        } as u32;
        // The broker checked the outbox's seals when it took it; joining checks its header.
        if let Some(outbox) = &worker.outbox
            && let Ok(outbox) = PeerOutbox::join(outbox.as_fd(), rank)
        {
            status.outbox_bytes = outbox.size();
            status.status = outbox.status();
        }
        status
    }
}
