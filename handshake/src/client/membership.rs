//! Who is there, as the watcher thread sees it (see the `liveness` module): deaths, departures
//! and the broker's loss; the interrupts that end waits; the replacements of dead ranks that
//! rejoin.

use super::{Connection, Link};
use crate::error::{Error, ProtocolError};
use crate::liveness::{Departure, Interrupter};
use shmbroker_queues::{Consumer, Producer};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

impl Connection {
    /// Why the link to `peer` closed, or why a call on it failed: `peer` died or left, or the
    /// broker went before `peer` ever logged on. `None` while `peer` is there (whoever else is
    /// gone). It checks every peer's process first, so it is current.
    #[must_use]
    pub fn departure(&self, peer: u32) -> Option<Departure> {
        self.shared.departure(peer)
    }

    /// The first rank this worker saw die, if any (checked now).
    #[must_use]
    pub fn lost_rank(&self) -> Option<u32> {
        self.shared.check_now();
        self.shared.first_dead()
    }

    /// The first rank this worker's watcher (or a call) recorded dead, if any, without checking
    /// again: one atomic load, for hot paths. Read [`Self::interrupt_generation`] first and hand
    /// it to an interruptible wait, which then ends if a death is recorded after this look.
    #[must_use]
    pub fn recorded_lost_rank(&self) -> Option<u32> {
        self.shared.first_dead()
    }

    /// The generation of the interrupt fired after every death (see
    /// [`shmbroker_queues::Interrupt`]): for [`shmbroker_queues::Consumer::recv_batch_interruptible`]
    /// on this connection's rings.
    #[must_use]
    pub fn interrupt_generation(&self) -> u64 {
        self.shared.interrupt_generation()
    }

    /// Records that a call timed out waiting for `rank`: cited if this worker then leaves.
    pub fn note_gave_up_on(&self, rank: u32) {
        self.shared.note_gave_up_on(rank);
    }

    /// Records that a call failed because `rank` died: cited if this worker then leaves.
    pub fn note_failed_on_death(&self, rank: u32) {
        self.shared.note_failed_on_death(rank);
    }

    /// A handle that ends this connection's waits from another thread or a signal handler.
    #[must_use]
    pub fn interrupter(&self) -> Interrupter {
        Interrupter::new(Arc::clone(&self.shared))
    }

    /// A handle on who is gone and on interrupts, for a thread that does not hold the
    /// connection (a typed channel's end).
    #[must_use]
    pub fn peer_watch(&self) -> crate::liveness::PeerWatch {
        crate::liveness::PeerWatch::new(Arc::clone(&self.shared))
    }

    /// How many times an [`Interrupter`] has asked so far: a call compares the number it saw
    /// first with the number now, so that one request ends every call waiting when it came.
    #[must_use]
    pub fn interrupt_count(&self) -> u64 {
        self.shared.interrupt_count()
    }

    /// Whether an [`Interrupter`] asked for the current wait to end; taking it clears it.
    /// Read [`Self::interrupt_generation`] first, as for deaths.
    #[must_use]
    pub fn take_interrupt(&self) -> bool {
        self.shared.take_interrupt()
    }

    /// Puts back an interrupt request a call took but did not end on (a send reported done once
    /// part of it had gone out): the next wait ends with it.
    pub fn keep_interrupt(&self) {
        self.shared.keep_interrupt();
    }

    /// Forgets an interrupt no wait has taken yet (one that came after the call it was meant
    /// for had ended).
    pub fn clear_interrupt(&self) {
        let _ = self.shared.take_interrupt();
    }

    /// How many processes held this rank before this one in the job: 0 for a worker of the
    /// job's first start, `n` for the `n`th replacement of the rank after deaths (a rejoin: the
    /// broker admits a logon with a dead rank's number while the job has survivors).
    #[must_use]
    pub fn rejoins(&self) -> u32 {
        self.rejoins
    }

    /// The peers whose replacement has rejoined and waits for [`Self::adopt`] (bit `rank`): one
    /// atomic load.
    #[must_use]
    pub fn rejoins_pending(&self) -> u64 {
        self.shared.rejoins_pending()
    }

    /// Takes `peer`'s replacement in place of its dead process, if one has rejoined: joins the
    /// fresh rings the broker made between them (dropping the old ones, and whatever the dead
    /// process sent that was not taken), watches the new process, and counts `peer` as there
    /// again. Returns how many times `peer` has been replaced, or `None` when no replacement
    /// waits. The caller starts afresh with it: numbering, outbox, what each owes the other.
    ///
    /// # Errors
    ///
    /// [`Error::Ring`] or [`Error::Protocol`] when a file the broker passed is not what it
    /// should be; the replacement is then dropped, and `peer` stays gone.
    pub fn adopt(&mut self, peer: u32) -> Result<Option<u32>, Error> {
        // The files are taken out; the rest stays in the inbox until the replacement is in place,
        // so that the broker's word that it is gone, if it comes meanwhile, is kept on it.
        let (times, to, from, readiness) = {
            let mut inbox = self.shared.lock();
            let Some(rejoin) = inbox.rejoins.get_mut(&peer).filter(|r| r.complete()) else {
                return Ok(None);
            };
            let files = (
                rejoin.to.take(),
                rejoin.from.take(),
                rejoin.readiness.take(),
            );
            let (Some(to), Some(from), Some(readiness)) = files else {
                // Only this connection's owner adopts, one call at a time: never half taken.
                return Ok(None);
            };
            (rejoin.times, to, from, readiness)
        };
        let joined = (|| {
            let ring = |role| move |source| Error::Ring { role, peer, source };
            let mut to = Producer::join(to.as_fd()).map_err(ring("to"))?;
            let mut from = Consumer::join(from.as_fd()).map_err(ring("from"))?;
            if !shmbroker_sys::eventfd::is_eventfd(readiness.as_fd()) {
                return Err(Error::from(ProtocolError::NotAnEventFd { index: 0, peer }));
            }
            to.set_notify(Arc::new(readiness));
            from.set_notify(self.readiness.clone());
            from.set_interrupt(self.shared.interrupt());
            Ok(Link { to, from })
        })();
        let link = match joined {
            Ok(link) => link,
            Err(error) => {
                self.shared.drop_rejoin(peer, times);
                return Err(error);
            }
        };
        let closers = (link.to.closer(), link.from.closer());
        // Not adopted: a newer replacement came meanwhile (this one died); it is adopted next.
        if !self.shared.adopt(peer, times, closers) {
            return Ok(None);
        }
        self.links[peer as usize] = Some(link);
        Ok(Some(times))
    }

    /// Whether a complete rejoin of `peer` waits to be adopted (takes the inbox lock).
    #[must_use]
    pub fn rejoin_ready(&self, peer: u32) -> bool {
        self.shared.rejoin_ready(peer)
    }

    /// The writes to this worker's readiness eventfd made for rejoins since the last call: the
    /// session counts them as owed, so that its next look resets the eventfd.
    #[must_use]
    pub fn take_rejoin_signals(&self) -> u64 {
        self.shared.take_rejoin_signals()
    }

    /// Waits up to `timeout` for `peer`'s replacement to rejoin (for [`Self::adopt`]), or for
    /// the broker to be lost. Returns whether one waits now.
    pub fn wait_for_rejoin(&self, peer: u32, timeout: Duration) -> bool {
        self.shared.wait_for_rejoin(peer, timeout)
    }

    /// Whether `rank`'s death is recorded (one atomic load).
    #[must_use]
    pub fn is_dead(&self, rank: u32) -> bool {
        self.shared.is_dead(rank)
    }

    /// The ranks this worker has recorded dead (bit `rank % 64`), as of the watcher's last
    /// look: one atomic load, no system call. What a session compares with what it saw last, to
    /// learn cheaply that someone died. A replacement's adoption clears its rank's bit.
    #[must_use]
    pub fn recorded_dead(&self) -> u64 {
        self.shared.dead_mask()
    }

    /// Every rank this worker has recorded dead.
    #[must_use]
    pub fn dead_ranks(&self) -> Vec<u32> {
        (0..self.world_size)
            .filter(|&rank| self.shared.is_dead(rank))
            .collect()
    }

    /// Whether the broker's socket has closed.
    #[must_use]
    pub fn broker_lost(&self) -> bool {
        self.shared.broker_lost()
    }
}
