//! Loans: a buffer handed over by reference, at a cost that does not depend on its size.
//!
//! The lender fills a block of its own outbox ([`Session::loan`]) and sends a one-slot `LOAN`
//! message referring to it; each receiver maps a read-only view of it ([`LoanView`]) or copies it
//! out. Dropping a view acknowledges the block to its owner with the session's next call (views
//! may be dropped on any thread: [`ViewAcks`]), and the owner reuses the block once every
//! receiver has.

use super::ViewAcks;
use crate::error::Error;
use crate::session::demux::{Expect, LoanNote, loan_note, read_ref, with_loan_ref};
use crate::session::state::Deadline;
use crate::session::state::Session;
use shmbroker_allocator::{Loan, Outbox, View};
use shmbroker_bindings::{PayloadRef, kind};

/// A read-only view of a buffer a peer lent this rank ([`Session::recv_loan`]). Dropping it tells
/// the owner it may reuse the buffer (the acknowledgement goes out with this session's next
/// call).
///
/// # Trust
///
/// The view reads the owner's memory in place: it is always in bounds and stays mapped while the
/// view lives, so reading it never faults. Only the owner can write those bytes; an honest owner
/// does not touch a buffer it lent until every receiver has dropped its view, but a buggy or
/// hostile one can change them at any time. Copy out what you must validate before trusting it.
#[derive(Debug)]
pub struct LoanView {
    pub(super) view: View,
    pub(super) owner: u32,
    pub(super) payload: PayloadRef,
    pub(super) acks: ViewAcks,
    /// Which process of `owner` lent it: the session's count when it last took a replacement of
    /// that rank on (see `rejoin`). An acknowledgement for a process since replaced is dropped,
    /// never sent to its replacement.
    pub(super) process: u64,
    /// What its lender said of it: the whole it is a part of, the collective call it is a piece
    /// of (see `Session::views_of_every_peer`).
    pub(in crate::session) note: LoanNote,
}

impl LoanView {
    /// The rank that lent the buffer.
    #[must_use]
    pub fn owner(&self) -> u32 {
        self.owner
    }

    /// Keeps the lender's outbox mapped in this process after the view is dropped (see
    /// [`shmbroker_allocator::Pin`]).
    #[must_use]
    pub fn pin(&self) -> shmbroker_allocator::Pin {
        self.view.pin()
    }
}

impl std::ops::Deref for LoanView {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.view
    }
}

impl Drop for LoanView {
    fn drop(&mut self) {
        self.acks.push(self.owner, self.process, self.payload);
    }
}

impl Session {
    /// [`Self::loan`] within `deadline` (a collective's, which names it).
    pub(in crate::session) fn loan_within(
        &mut self,
        len: usize,
        deadline: &Deadline,
    ) -> Result<Loan, Error> {
        self.flush_view_acks()?;
        let mut since = None;
        loop {
            if let Some(loan) = self.engine.outbox.try_loan(len).map_err(Error::OwnOutbox)? {
                return Ok(loan);
            }
            self.await_acks(deadline, &mut since)?;
        }
    }

    /// One turn of a wait for peers' acknowledgements (room in the outbox, a buffer lent in
    /// place given back): fails on an interrupt or at the deadline, naming the peer that owes
    /// most ([`Error::Misuse`], naming none, when no peer owes anything); otherwise takes in
    /// what arrived, after a pause that grows from `since` on.
    pub(super) fn await_acks(
        &mut self,
        deadline: &Deadline,
        since: &mut Option<std::time::Instant>,
    ) -> Result<(), Error> {
        self.check_interrupted(deadline)?;
        let owing = self.most_owing(self.peers());
        if let Some(rank) = owing {
            // Published, so that a peer whose own wait on this rank times out can say whom this
            // rank waits for (see `status`).
            deadline.waits_for(rank);
        }
        // A peer that gave this collective up gives nothing back: looked for as a receive's
        // wait does, once this wait has lasted a while.
        if deadline.collective
            && let Some(rank) = owing
            && since.is_some_and(|since| since.elapsed() >= super::receive::MISMATCH_LOOK)
        {
            self.look_for_mismatch(rank, deadline)?;
        }
        if deadline.left().is_zero() {
            return Err(match owing {
                Some(rank) => self.timed_out(deadline, rank),
                // No peer holds any of the outbox: only this process can give room back (a
                // loan or symmetric buffer dropped on another thread), so no peer is named.
                None => Error::Misuse(format!(
                    "{} timed out after {:?} waiting for room in this rank's own outbox ({} \
                     bytes), which no peer holds any of: this process's loans and symmetric \
                     buffers fill it",
                    deadline.op,
                    deadline.timeout,
                    self.engine.outbox.capacity()
                )),
            });
        }
        if let Some(waited) = deadline.watchdog_due() {
            let owing: Vec<u32> = self
                .peers()
                .filter(|&peer| self.engine.outbox.owed_by(peer) > 0)
                .collect();
            self.warn_waiting(deadline, waited, &owing);
        }
        self.poll_acks()?;
        // A long wait (with no deadline, it may be long) costs almost no CPU.
        let now = std::time::Instant::now();
        super::receive::idle_wait(now.duration_since(*since.get_or_insert(now)));
        Ok(())
    }

    /// Of `ranks`, the one holding most of this rank's outbox (blocks it has not given back
    /// yet), if any holds some.
    pub(super) fn most_owing(&self, ranks: impl IntoIterator<Item = u32>) -> Option<u32> {
        ranks
            .into_iter()
            .filter(|&rank| self.engine.outbox.owed_by(rank) > 0)
            .max_by_key(|&rank| self.engine.outbox.owed_by(rank))
    }

    /// Sends the reference to `loan` to `targets` as operation `op` number `tag`.
    pub(in crate::session) fn lend(
        &mut self,
        op: u32,
        tag: u64,
        loan: Loan,
        targets: &[u32],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        self.lend_noted(op, tag, loan, targets, LoanNote::default(), deadline)
    }

    /// [`Self::lend`], saying `note` of the loan.
    pub(in crate::session) fn lend_noted(
        &mut self,
        op: u32,
        tag: u64,
        loan: Loan,
        targets: &[u32],
        note: LoanNote,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        self.flush_view_acks()?;
        // A loan that was a symmetric buffer may still be read in place after a failed
        // all-reduce: it goes only once those readers are done.
        let mut since = None;
        while self.engine.outbox.lent_in_place(&loan) {
            self.await_acks(deadline, &mut since)?;
        }
        let receivers = Outbox::receivers(targets.iter().copied());
        let lent = self
            .engine
            .outbox
            .send_loan(loan, receivers)
            .map_err(Error::OwnOutbox)?;
        let refs = targets.iter().map(|&peer| (peer, lent));
        self.send_refs(op, tag, refs, note, deadline)
    }

    /// Sends `lent`, a reference into this rank's outbox recorded as owed by `targets`, to
    /// `targets` as operation `op` number `tag`.
    pub(in crate::session) fn send_ref(
        &mut self,
        op: u32,
        tag: u64,
        lent: PayloadRef,
        targets: &[u32],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let refs = targets.iter().map(|&peer| (peer, lent));
        self.send_refs(op, tag, refs, LoanNote::default(), deadline)
    }

    /// Sends each `(peer, lent)` of `refs` (a reference recorded as owed by that peer) as
    /// operation `op` number `tag`, saying `note` of each. An iterator, not a slice, so that a
    /// loan to a few targets (every `send_loan`) allocates nothing.
    pub(in crate::session) fn send_refs(
        &mut self,
        op: u32,
        tag: u64,
        refs: impl Iterator<Item = (u32, PayloadRef)> + Clone,
        note: LoanNote,
        deadline: &Deadline,
    ) -> Result<(), Error> {
        for (sent, (peer, lent)) in refs.clone().enumerate() {
            let header = with_loan_ref(op | kind::LOAN, tag, lent, note);
            if let Err(error) = self.send_message(peer, header, deadline) {
                // The peers from this one on never got their reference, so none of them will
                // give it back: they are let off, and each block returns once the others are
                // done.
                for (unreached, lent) in refs.skip(sent) {
                    let _ = self.engine.outbox.ack(unreached, lent);
                }
                return Err(error);
            }
        }
        Ok(())
    }

    /// Records `loan` as lent to `rank` alone, once no failed all-reduce reads it in place any
    /// more, and returns its reference, for a record to carry (see `Session::lend_ref`).
    pub(in crate::session) fn lend_as_ref(
        &mut self,
        rank: u32,
        loan: Loan,
        deadline: &Deadline,
    ) -> Result<PayloadRef, Error> {
        self.flush_view_acks()?;
        let mut since = None;
        while self.engine.outbox.lent_in_place(&loan) {
            self.await_acks(deadline, &mut since)?;
        }
        self.engine
            .outbox
            .send_loan(loan, Outbox::receivers([rank]))
            .map_err(Error::OwnOutbox)
    }

    /// A view of the buffer `rank` lent as `lent`, a reference a record carried (see
    /// `Session::view_loan_ref`).
    pub(in crate::session) fn view_lent(
        &mut self,
        rank: u32,
        lent: PayloadRef,
        deadline: &Deadline,
    ) -> Result<LoanView, Error> {
        self.flush_view_acks()?;
        let view = self
            .peer_outbox(rank, deadline)?
            .view(lent)
            .map_err(|source| Error::Outbox { peer: rank, source })?;
        Ok(LoanView {
            view,
            owner: rank,
            payload: lent,
            acks: self.engine.view_acks.clone(),
            process: self.membership.adopted_at(rank),
            note: LoanNote::default(),
        })
    }

    /// The loan group `expect` selects from `peer`, as a view of the lender's buffer. A group
    /// that is not a loan is [`Error::Protocol`] naming `peer` in a collective (the ranks chose
    /// different paths, so their lengths differ), [`Error::Misuse`] for a point-to-point
    /// receive (it stays queued for `recv`).
    pub(in crate::session) fn take_loan(
        &mut self,
        peer: u32,
        expect: Expect,
        deadline: &Deadline,
    ) -> Result<LoanView, Error> {
        self.flush_view_acks()?;
        let at = self.await_group(peer, expect, deadline)?;
        let header = self.engine.peers[peer as usize].inbox.header(at);
        expect.check(peer, &header)?;
        // Queued headers were checked on arrival: eager, pipelined (or a resumption of one), or
        // a loan.
        let transport = header.kind & !kind::OP_MASK;
        if transport != kind::LOAN
            && let Expect::Collective { seq, .. } = expect
        {
            // Ranks pick how a collective's parts travel from what they share (its length and
            // the world): a part in the rings where a loan is due means this peer passed
            // another length.
            return Err(Error::Protocol {
                peer,
                detail: format!(
                    "sent its part of collective #{seq} in ring slots where a lent one was due \
                     (did it pass another length?)"
                ),
            });
        }
        if transport != kind::LOAN {
            return Err(Error::Misuse(format!(
                "the next message from rank {peer} is not a loan (kind {:#x}, {}); receive it \
                 with recv",
                header.kind,
                if transport == 0 { "eager" } else { "pipelined" }
            )));
        }
        // Checked before it leaves the queue: a reference that fails is not lost on the way.
        let lent = read_ref(peer, &header)?;
        let view = self
            .peer_outbox(peer, deadline)?
            .view(lent)
            .map_err(|source| Error::Outbox { peer, source })?;
        self.engine.peers[peer as usize].inbox.remove(at);
        Ok(LoanView {
            view,
            owner: peer,
            payload: lent,
            acks: self.engine.view_acks.clone(),
            process: self.membership.adopted_at(peer),
            note: loan_note(&header),
        })
    }
}
