//! Point to point: `send`, `recv` and `probe`, of any size (loans are the `loans` module's).

use super::demux::{Expect, Incoming, Sink};
use super::engine::outgoing::Targets;
use super::state::Session;
use crate::error::Error;
use shmbroker_bindings::kind;
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
}
