//! Departures: a worker that left or died, and the end of a job once every worker is gone.

use super::{ENDED_JOBS_KEPT, Event, Listener};
use shmbroker_bindings::{NoticeKind, WorkerNotice};

impl Listener {
    /// `rank`'s process exited. Whatever it sent before is read first; if its socket is still
    /// open (a child it forked holds it), the worker is gone all the same.
    pub(super) fn process_exited(&mut self, rank: usize, events: &mut Vec<Event>) {
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
    pub(super) fn worker_gone(&mut self, rank: u32, events: &mut Vec<Event>) {
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
        let first = self.winding_down().is_none();
        let logged = self.allow_coming(uid);
        if clean {
            self.left.get_or_insert(rank);
            if let Some(suppressed) = logged {
                tracing::info!(rank, pid, uid, suppressed, "left");
            }
        } else {
            self.lost.get_or_insert(rank);
            if let Some(suppressed) = logged {
                if self.expected.load(crate::sync::Ordering::Relaxed) {
                    tracing::info!(rank, pid, uid, suppressed, "stopped");
                } else {
                    tracing::warn!(rank, pid, uid, suppressed, "died without saying goodbye");
                }
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
        if first {
            self.close_to_newcomers(rank, clean);
        }
        events.push(Event::WorkerLeft { rank, pid, clean });
    }

    /// The job starts winding down because `cause` left (`clean`) or died: from now on nobody
    /// logs on to it (see `log_on`), so every worker still there is told which ranks never did
    /// and never will, and closes its rings to them instead of waiting for them to its deadline.
    fn close_to_newcomers(&mut self, cause: u32, clean: bool) {
        let never: Vec<u32> = (0u32..)
            .zip(&self.workers)
            .filter(|(_, worker)| worker.is_none())
            .map(|(rank, _)| rank)
            .collect();
        if never.is_empty() {
            return;
        }
        tracing::info!(
            ?never,
            cause,
            "the job is closed to newcomers: these ranks never logged on"
        );
        let token = u64::from(cause) | u64::from(clean) << 32;
        for &absent in &never {
            let notice = WorkerNotice::new(NoticeKind::NeverJoins, absent, token);
            for peer in 0..self.config.world_size {
                if peer != cause {
                    self.send(peer, notice, None);
                }
            }
        }
    }

    /// Forgets the job once every worker that logged on is gone, so the next one can start.
    pub(super) fn end_job_if_over(&mut self, events: &mut Vec<Event>) {
        let mut logged_on = self.workers.iter().flatten().peekable();
        if logged_on.peek().is_none() || self.workers.iter().flatten().any(|w| w.stream.is_some()) {
            return;
        }
        let workers = self.workers.iter().flatten().count() as u32;
        // A status answer kept from this job must not be given about the next one.
        self.status_answer = None;
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
        self.readiness.clear();
        self.lost = None;
        self.left = None;
        events.push(event);
    }
}
