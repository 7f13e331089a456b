//! Point to point: `send` and `recv` of any size, and zero-copy loans.

use super::transfer::{Expect, Incoming, Sink, Targets, ViewAcks, message};
use super::{Deadline, Error, Session};
use shmbroker_allocator::{Loan, Outbox, View};
use shmbroker_bindings::{PayloadRef, kind};
use std::time::Duration;

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
}

impl LoanView {
    /// The rank that lent the buffer.
    #[must_use]
    pub fn owner(&self) -> u32 {
        self.owner
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
        self.acks.push(self.owner, self.payload);
    }
}

impl Session {
    // -----------------------------------------------------------------------------------------
    // Point to point

    /// Sends `data` (any size) to `rank`; it is received, in order, by that rank's
    /// [`Self::recv`] from this one. Returns once the data is copied out of `data` (into the
    /// ring, or into this rank's outbox).
    ///
    /// # Errors
    ///
    /// [`Error::RankOutOfRange`], [`Error::Misuse`] for this rank's own, [`Error::PeerLost`],
    /// [`Error::Timeout`].
    pub fn send(&mut self, rank: u32, data: &[u8]) -> Result<(), Error> {
        self.send_to_timeout(rank, data, self.timeout)
    }

    /// [`Self::send`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::send`].
    pub fn send_to_timeout(
        &mut self,
        rank: u32,
        data: &[u8],
        timeout: Duration,
    ) -> Result<(), Error> {
        self.check_peer(rank)?;
        let tag = self.sent_to[rank as usize];
        if self.send_one_slot(rank, tag, data)? {
            self.sent_to[rank as usize] += 1;
            return Ok(());
        }
        let deadline = Deadline::new("send", timeout);
        self.transfer(
            kind::SEND,
            tag,
            Some((data, Targets::One(rank))),
            &mut [],
            &deadline,
        )?;
        self.sent_to[rank as usize] += 1;
        Ok(())
    }

    /// The next message `rank` sent this rank with [`Self::send`] (or lent with
    /// [`Self::send_loan`], copied).
    ///
    /// # Errors
    ///
    /// As for [`Self::send`], and [`Error::Protocol`] or [`Error::Outbox`] for bad bytes.
    pub fn recv(&mut self, rank: u32) -> Result<Vec<u8>, Error> {
        self.recv_from_timeout(rank, self.timeout)
    }

    /// [`Self::recv`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::recv`].
    pub fn recv_from_timeout(&mut self, rank: u32, timeout: Duration) -> Result<Vec<u8>, Error> {
        match self.recv_with(rank, Sink::Vec(Vec::new()), timeout)? {
            (_, Sink::Vec(bytes)) => Ok(bytes),
            (_, Sink::Slice(_)) => unreachable!("a vector sink stays a vector"),
        }
    }

    /// Like [`Self::recv`], into `buffer`, with no allocation; returns the message's length.
    ///
    /// # Errors
    ///
    /// [`Error::BufferTooSmall`] for a longer message, which is kept: the next receive from
    /// `rank` gets it whole (with a buffer of at least `needed` bytes, see also [`Self::probe`]);
    /// otherwise as for [`Self::recv`].
    pub fn recv_into(&mut self, rank: u32, buffer: &mut [u8]) -> Result<usize, Error> {
        self.recv_into_timeout(rank, buffer, self.timeout)
    }

    /// [`Self::recv_into`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::recv_into`].
    pub fn recv_into_timeout(
        &mut self,
        rank: u32,
        buffer: &mut [u8],
        timeout: Duration,
    ) -> Result<usize, Error> {
        let (len, _) = self.recv_with(rank, Sink::Slice(buffer), timeout)?;
        Ok(len as usize)
    }

    /// The length of the next message from `rank`, waiting (up to the session's deadline) for
    /// it to arrive, without receiving it: the next [`Self::recv`] or [`Self::recv_into`] from
    /// `rank` gets it (as `MPI_Probe` does). For sizing a buffer before [`Self::recv_into`].
    ///
    /// # Errors
    ///
    /// As for [`Self::recv`].
    pub fn probe(&mut self, rank: u32) -> Result<usize, Error> {
        self.probe_timeout(rank, self.timeout)
    }

    /// [`Self::probe`] with its own deadline.
    ///
    /// # Errors
    ///
    /// As for [`Self::recv`].
    pub fn probe_timeout(&mut self, rank: u32, timeout: Duration) -> Result<usize, Error> {
        self.check_peer(rank)?;
        let deadline = Deadline::new("probe", timeout);
        self.flush_view_acks()?;
        let len = self.probe_send(rank, &deadline)?;
        usize::try_from(len).map_err(|_| Error::Protocol {
            peer: rank,
            detail: format!(
                "announced a message of {len} bytes, more than this process can address"
            ),
        })
    }

    fn recv_with<'a>(
        &mut self,
        rank: u32,
        sink: Sink<'a>,
        timeout: Duration,
    ) -> Result<(u64, Sink<'a>), Error> {
        self.check_peer(rank)?;
        let deadline = Deadline::new("recv", timeout);
        let expect = Expect::Send {
            tag: self.received_from[rank as usize],
        };
        let mut incoming = [Incoming::keeping_too_long(rank, expect, sink)];
        self.flush_view_acks()?;
        self.take_direct(&mut incoming[0], &deadline)?;
        if !incoming[0].is_done() {
            self.transfer(kind::SEND, 0, None, &mut incoming, &deadline)?;
        }
        self.received_from[rank as usize] += 1;
        let [incoming] = incoming;
        incoming.finish()
    }

    // -----------------------------------------------------------------------------------------
    // Loans: zero-copy hand-off

    /// A writable buffer of `len` bytes in this rank's outbox, to fill and hand to peers by
    /// reference with [`Self::send_loan`] or [`Self::broadcast_loan`]. Waits (up to the session's
    /// deadline) while the outbox is full of buffers peers have not let go of yet. Dropped unsent,
    /// it goes back to the outbox.
    ///
    /// # Errors
    ///
    /// [`Error::OwnOutbox`] when `len` is more than the outbox can ever hold
    /// ([`Self::max_loan_bytes`]); [`Error::Timeout`]; [`Error::Protocol`] or
    /// [`Error::Corrupted`] from what peers sent meanwhile.
    pub fn loan(&mut self, len: usize) -> Result<Loan, Error> {
        let deadline = Deadline::new("loan", self.timeout);
        self.flush_view_acks()?;
        loop {
            if let Some(loan) = self.outbox.try_loan(len).map_err(Error::OwnOutbox)? {
                return Ok(loan);
            }
            if deadline.left().is_zero() {
                let waiting = self
                    .peers()
                    .max_by_key(|&peer| self.outbox.owed_by(peer))
                    .unwrap_or(self.rank());
                return Err(self.timed_out(&deadline, waiting));
            }
            self.poll_acks()?;
            std::thread::yield_now();
        }
    }

    /// Hands `loan` to `rank` by reference: it receives it with [`Self::recv_loan`] (or copies it
    /// with [`Self::recv`]). The buffer comes back to this rank's outbox when `rank` is done.
    ///
    /// # Errors
    ///
    /// [`Error::OwnOutbox`] for a loan of another session; otherwise as for [`Self::send`].
    pub fn send_loan(&mut self, rank: u32, loan: Loan) -> Result<(), Error> {
        self.check_peer(rank)?;
        let deadline = Deadline::new("send_loan", self.timeout);
        let tag = self.sent_to[rank as usize];
        self.lend(kind::SEND, tag, loan, &[rank], &deadline)?;
        self.sent_to[rank as usize] += 1;
        Ok(())
    }

    /// Sends the reference to `loan` to `targets` as operation `op` number `tag`.
    fn lend(
        &mut self,
        op: u32,
        tag: u64,
        loan: Loan,
        targets: &[u32],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        self.flush_view_acks()?;
        let receivers = Outbox::receivers(targets.iter().copied());
        let lent = self
            .outbox
            .send_loan(loan, receivers)
            .map_err(Error::OwnOutbox)?;
        let mut inline = [0u8; shmbroker_bindings::INLINE_BYTES];
        inline[..size_of::<PayloadRef>()].copy_from_slice(bytemuck::bytes_of(&lent));
        let header = message(op | kind::LOAN, tag, 0, inline);
        for &peer in targets {
            self.send_message(peer, header, deadline)?;
        }
        Ok(())
    }

    /// The next message `rank` sent this rank, which must be a loan, as a read-only view of the
    /// lender's buffer; dropping the view gives the buffer back to its owner.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when the next message from `rank` is not a loan (it stays queued, and
    /// [`Self::recv`] takes it); otherwise as for [`Self::recv`].
    pub fn recv_loan(&mut self, rank: u32) -> Result<LoanView, Error> {
        self.check_peer(rank)?;
        let deadline = Deadline::new("recv_loan", self.timeout);
        let expect = Expect::Send {
            tag: self.received_from[rank as usize],
        };
        let view = self.take_loan(rank, expect, &deadline)?;
        self.received_from[rank as usize] += 1;
        Ok(view)
    }

    /// `root`'s loan on every other rank, by reference: the root passes `Some(loan)` and gets
    /// `None`; the others pass `None` and get a view of the root's buffer.
    ///
    /// # Errors
    ///
    /// As for [`Self::broadcast`] and [`Self::recv_loan`].
    pub fn broadcast_loan(
        &mut self,
        root: u32,
        loan: Option<Loan>,
    ) -> Result<Option<LoanView>, Error> {
        self.check_root(root, loan.is_some(), "broadcast_loan")?;
        let deadline = Deadline::collective("broadcast_loan", self.timeout);
        let seq = self.next_seq();
        if let Some(loan) = loan {
            let targets: Vec<u32> = self.peers().collect();
            self.lend(kind::BROADCAST, seq, loan, &targets, &deadline)?;
            return Ok(None);
        }
        let expect = Expect::Collective {
            op: kind::BROADCAST,
            seq,
        };
        self.take_loan(root, expect, &deadline).map(Some)
    }
}
