//! Point to point: `send`, `recv` and `probe`, of any size; receiving from whichever peer is
//! ready (`recv_any`, `try_recv` and the readiness fd, over the engine's `any`); and loans
//! (`loan`, `send_loan`, `recv_loan` and references for channels, over the engine's `loans`).

use super::demux::{Expect, Incoming, Sink};
use super::engine::loans::LoanView;
use super::engine::outgoing::Targets;
use super::state::Session;
use crate::error::Error;
use shmbroker_allocator::Loan;
use shmbroker_bindings::{PayloadRef, kind};
use std::os::fd::BorrowedFd;
use std::time::Duration;

impl Session {
    /// Sends `data` (any size) to `rank`; it is received, in order, by that rank's
    /// [`Self::recv`] from this one. Returns once the data is copied out of `data` (into the
    /// ring, or into this rank's outbox).
    ///
    /// # Errors
    ///
    /// [`Error::RankOutOfRange`], [`Error::Misuse`] for this rank's own, [`Error::PeerLost`],
    /// [`Error::Timeout`].
    pub fn send(&mut self, rank: u32, data: &[u8]) -> Result<(), Error> {
        let timeout = self.timeout;
        self.check_peer(rank)?;
        let tag = self.numbers[rank as usize].send_tag;
        if self.send_one_slot(rank, tag, data)? {
            self.numbers[rank as usize].send_tag += 1;
            return Ok(());
        }
        self.on_peer("send", rank, timeout, |session, deadline| {
            session.send_to(kind::SEND, tag, data, Targets::One(rank), deadline)
        })?;
        self.numbers[rank as usize].send_tag += 1;
        Ok(())
    }

    /// The next message `rank` sent this rank with [`Self::send`] (or lent with
    /// [`Self::send_loan`], copied).
    ///
    /// # Errors
    ///
    /// As for [`Self::send`], and [`Error::Protocol`] or [`Error::Outbox`] for bad bytes.
    pub fn recv(&mut self, rank: u32) -> Result<Vec<u8>, Error> {
        let timeout = self.timeout;
        let (_, sink) = self.recv_with(rank, Sink::Vec(Vec::new()), timeout)?;
        Ok(sink.into_vec())
    }

    /// Like [`Self::recv`], into `buffer`, with no allocation; returns the message's length.
    ///
    /// # Errors
    ///
    /// [`Error::BufferTooSmall`] for a longer message, which is kept: the next receive from
    /// `rank` gets it whole (with a buffer of at least `needed` bytes, see also [`Self::probe`]);
    /// otherwise as for [`Self::recv`].
    pub fn recv_into(&mut self, rank: u32, buffer: &mut [u8]) -> Result<usize, Error> {
        let timeout = self.timeout;
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
        let timeout = self.timeout;
        self.probe_as("probe", rank, timeout)
    }

    /// [`Self::probe`] as the first half of a receive: published, and timed out, as a
    /// `recv` from `rank`. For a binding that sizes a new buffer for the message before it
    /// receives it with [`Self::recv_into`] (Python's `recv` does), so that what its
    /// peers read about it, and its timeout, name the call its user made.
    ///
    /// # Errors
    ///
    /// As for [`Self::recv`].
    ///
    /// **Unstable:** plumbing for shmbroker's own tests, benchmarks and bindings, hidden from the
    /// documentation and outside the API's stability promise; it may change or go without notice.
    #[doc(hidden)]
    pub fn probe_for_recv(&mut self, rank: u32, timeout: Duration) -> Result<usize, Error> {
        self.probe_as("recv", rank, timeout)
    }

    fn probe_as(&mut self, op: &'static str, rank: u32, timeout: Duration) -> Result<usize, Error> {
        let len = self.on_peer(op, rank, timeout, |session, deadline| {
            session.flush_view_acks()?;
            session.probe_send(rank, deadline)
        })?;
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
        self.on_peer("recv", rank, timeout, |session, deadline| {
            let expect = Expect::Send {
                tag: session.numbers[rank as usize].recv_tag,
            };
            let mut incoming = [Incoming::keeping_too_long(rank, expect, sink)];
            session.flush_view_acks()?;
            session.take_direct(&mut incoming[0], deadline)?;
            if !incoming[0].is_done() {
                session.receive_all(&mut incoming, deadline)?;
            }
            session.numbers[rank as usize].recv_tag += 1;
            let [incoming] = incoming;
            incoming.finish()
        })
    }

    // Receiving from whichever peer is ready (how: the `any` module).

    /// The next point-to-point message from any peer, and who sent it: whichever has one waiting,
    /// served round-robin (see the `any` module); waits up to the session's deadline.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] naming every peer still there; [`Error::PeerLost`] once a dead peer's
    /// last messages have been taken; [`Error::PeerLeft`] when every peer has left;
    /// [`Error::Protocol`] or [`Error::Outbox`] for bad bytes.
    pub fn recv_any(&mut self) -> Result<(u32, Vec<u8>), Error> {
        self.tracked("recv_any", |session, deadline| {
            let peer = session.wait_any(deadline)?;
            Ok((peer, session.with_timeout(deadline.left()).recv(peer)?))
        })
    }

    /// Like [`Self::recv_any`], into `buffer`, with no allocation; returns the sender and the
    /// message's length.
    ///
    /// # Errors
    ///
    /// [`Error::BufferTooSmall`] for a longer message, which is kept (its sender is the error's
    /// `peer`: [`Self::recv_into`] from it with a large enough buffer gets it); otherwise as for
    /// [`Self::recv_any`].
    pub fn recv_any_into(&mut self, buffer: &mut [u8]) -> Result<(u32, usize), Error> {
        self.tracked("recv_any", |session, deadline| {
            let peer = session.wait_any(deadline)?;
            let len = session
                .with_timeout(deadline.left())
                .recv_into(peer, buffer)?;
            Ok((peer, len))
        })
    }

    /// The next message from `rank` if one has started to arrive, without waiting for one: no
    /// system call and no clock read when nothing is there. A large message that has started is
    /// received whole (waiting for its remaining chunks up to the session's deadline).
    ///
    /// # Errors
    ///
    /// As for [`Self::recv`].
    pub fn try_recv(&mut self, rank: u32) -> Result<Option<Vec<u8>>, Error> {
        self.check_peer(rank)?;
        if !self.sender_ready(rank)? {
            return Ok(None);
        }
        self.recv(rank).map(Some)
    }

    /// [`Self::try_recv`] into `buffer`, with no allocation: the message's length, or `None`
    /// when nothing has started to arrive.
    ///
    /// # Errors
    ///
    /// As for [`Self::recv_into`]: a message too long for `buffer` is kept.
    pub fn try_recv_into(&mut self, rank: u32, buffer: &mut [u8]) -> Result<Option<usize>, Error> {
        self.check_peer(rank)?;
        if !self.sender_ready(rank)? {
            return Ok(None);
        }
        self.recv_into(rank, buffer).map(Some)
    }

    /// [`Self::try_recv_any`] into `buffer`, with no allocation: the sender and the message's
    /// length, or `None` when nothing has started to arrive.
    ///
    /// # Errors
    ///
    /// As for [`Self::recv_any_into`]: a message too long for `buffer` is kept.
    pub fn try_recv_any_into(&mut self, buffer: &mut [u8]) -> Result<Option<(u32, usize)>, Error> {
        match self.next_sender()? {
            Some(peer) => Ok(Some((peer, self.recv_into(peer, buffer)?))),
            None => Ok(None),
        }
    }

    /// The next message from any peer if one has started to arrive (round-robin, as
    /// [`Self::recv_any`]), without waiting for one. When nothing is there it leaves every ring
    /// armed, so [`Self::readiness_fd`] becomes readable once something arrives; it makes no
    /// system call then unless a wake-up is still owed to the eventfd (see the `any` module).
    ///
    /// # Errors
    ///
    /// As for [`Self::recv_any`], but never [`Error::Timeout`] for want of a message.
    pub fn try_recv_any(&mut self) -> Result<Option<(u32, Vec<u8>)>, Error> {
        match self.next_sender()? {
            Some(peer) => Ok(Some((peer, self.recv(peer)?))),
            None => Ok(None),
        }
    }

    /// This rank's readiness eventfd, for `poll`, `epoll` or an async runtime: it becomes
    /// readable when a message is waiting from any peer, once [`Self::try_recv_any`] has returned
    /// `None` (which arms it). Take what is there with [`Self::try_recv_any`] until it returns
    /// `None` again before waiting on the fd. Reading the fd is the session's business: do not.
    #[must_use]
    pub fn readiness_fd(&self) -> BorrowedFd<'_> {
        self.inner.readiness_fd()
    }

    // Loans: buffers handed over by reference (how: the `loans` module).

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
        self.tracked("loan", |session, deadline| {
            session.loan_within(len, deadline)
        })
    }

    /// Hands `loan` to `rank` by reference: it receives it with [`Self::recv_loan`] (or copies it
    /// with [`Self::recv`]). The buffer comes back to this rank's outbox when `rank` is done.
    ///
    /// # Errors
    ///
    /// [`Error::OwnOutbox`] for a loan of another session; otherwise as for [`Self::send`].
    pub fn send_loan(&mut self, rank: u32, loan: Loan) -> Result<(), Error> {
        self.on_peer("send_loan", rank, self.timeout, |session, deadline| {
            let tag = session.numbers[rank as usize].send_tag;
            session.lend(kind::SEND, tag, loan, &[rank], deadline)?;
            session.numbers[rank as usize].send_tag += 1;
            Ok(())
        })
    }

    /// Lends `loan` to `rank` by a reference to carry in a record of a typed channel (see the
    /// `channel` module), as Agave's transaction regions travel: `rank` views it in place with
    /// [`Self::view_loan_ref`], and dropping that view gives the buffer back. Nothing is sent:
    /// the reference is the record's to carry, once.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] for a rank out of range or this rank; [`Error::OwnOutbox`] for a loan
    /// of another session; [`Error::Timeout`] while the loan is still read in place by a
    /// collective that failed.
    pub fn lend_ref(&mut self, rank: u32, loan: Loan) -> Result<PayloadRef, Error> {
        self.on_peer("lend_ref", rank, self.timeout, |session, deadline| {
            session.lend_as_ref(rank, loan, deadline)
        })
    }

    /// A read-only view of the buffer `rank` lent this rank with [`Self::lend_ref`] as
    /// `lent` (the reference a channel record carried); dropping it gives the buffer back.
    /// Take each reference once.
    ///
    /// # Errors
    ///
    /// [`Error::Outbox`] naming `rank` for a reference outside its outbox; `rank`'s departure,
    /// [`Error::Timeout`] while its outbox has not arrived.
    pub fn view_loan_ref(&mut self, rank: u32, lent: PayloadRef) -> Result<LoanView, Error> {
        self.on_peer("view_loan_ref", rank, self.timeout, |session, deadline| {
            session.view_lent(rank, lent, deadline)
        })
    }

    /// The next message `rank` sent this rank, which must be a loan, as a read-only view of the
    /// lender's buffer; dropping the view gives the buffer back to its owner.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when the next message from `rank` is not a loan (it stays queued, and
    /// [`Self::recv`] takes it); otherwise as for [`Self::recv`].
    pub fn recv_loan(&mut self, rank: u32) -> Result<LoanView, Error> {
        self.on_peer("recv_loan", rank, self.timeout, |session, deadline| {
            let expect = Expect::Send {
                tag: session.numbers[rank as usize].recv_tag,
            };
            let view = session.take_loan(rank, expect, deadline)?;
            session.numbers[rank as usize].recv_tag += 1;
            Ok(view)
        })
    }
}
