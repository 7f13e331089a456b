//! `Session.split()`: a sending half and a receiving half for two threads, each releasing the
//! GIL while it waits, and `Sender.rejoin` to put them back together.

use crate::buffer::Bytes;
use crate::{CallTimeout, PySession, deadline_arg, errors, process, rank_arg, sigint};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use shmbroker::session::Interrupter;
use shmbroker::{Error, Receiver, Sender};
use std::os::fd::RawFd;
use std::sync::{Mutex, PoisonError, TryLockError};
use std::time::Duration;

/// What both halves know of their session.
#[derive(Debug, Clone)]
struct Facts {
    rank: u32,
    world_size: u32,
    timeout: Duration,
    interrupter: Interrupter,
    /// The process that split the session: a forked child's copy is not used.
    pid: u32,
    /// The session's readiness eventfd, open as long as the session is.
    readiness: RawFd,
}

impl Facts {
    fn deadline(&self, timeout: CallTimeout) -> PyResult<Duration> {
        match timeout {
            CallTimeout::Session => Ok(self.timeout),
            CallTimeout::Given(secs) => deadline_arg(secs),
        }
    }

    /// Runs `call` with the GIL released. On the main thread a Ctrl-C ends its wait
    /// (``KeyboardInterrupt``), as for a :class:`Session`'s calls.
    fn wait<T: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce() -> Result<T, Error> + Send,
    ) -> PyResult<T> {
        if process::pid() != self.pid {
            return Err(errors::plain(format!(
                "this half belongs to process {}, of which this process is a fork; connect again \
                 in this process",
                self.pid
            )));
        }
        let armed = process::on_main_thread()
            .then(|| sigint::Armed::arm(&self.interrupter))
            .flatten();
        let result = py.detach(call);
        let caught = armed.is_some_and(sigint::Armed::disarm);
        let interrupted = matches!(result, Err(Error::Interrupted));
        sigint::settle(py, caught, interrupted, result.map_err(errors::to_py))
    }
}

/// The sending half of a split session (:meth:`Session.split`): :meth:`send` and the root's
/// side of :meth:`broadcast`, from one thread while another receives on the
/// :class:`Receiver`. While a send waits for a slow peer's room it holds nothing the receiver
/// needs, so a receive never waits behind it. Calls on one sender run one at a time.
#[pyclass(module = "shmbroker", name = "Sender", frozen)]
#[derive(Debug)]
pub struct PySender {
    facts: Facts,
    /// `None` once rejoined.
    half: Mutex<Option<Sender>>,
}

/// The receiving half of a split session (:meth:`Session.split`): receives, one at a time (a
/// second thread's receive raises :class:`shmbroker.Error`), never waiting behind the
/// :class:`Sender`'s calls on another thread.
#[pyclass(module = "shmbroker", name = "Receiver", frozen)]
#[derive(Debug)]
pub struct PyReceiver {
    facts: Facts,
    /// `None` once rejoined.
    half: Mutex<Option<Receiver>>,
}

/// Splits `session` (taken from its Python object) into its two halves.
pub fn split(session: shmbroker::Session, timeout: Duration, pid: u32) -> (PySender, PyReceiver) {
    let facts = Facts {
        rank: session.rank(),
        world_size: session.world_size(),
        timeout,
        interrupter: session.interrupter(),
        pid,
        readiness: std::os::fd::AsRawFd::as_raw_fd(&session.readiness_fd()),
    };
    let (sender, receiver) = session.split();
    (
        PySender {
            facts: facts.clone(),
            half: Mutex::new(Some(sender)),
        },
        PyReceiver {
            facts,
            half: Mutex::new(Some(receiver)),
        },
    )
}

/// The error of a call on a half that was rejoined.
fn rejoined() -> PyErr {
    errors::plain("this half was rejoined to its session: use the session")
}

impl PySender {
    /// Runs `call` on the sender with the GIL released; the lock is taken without the GIL, so
    /// that a second thread's call waits for the first without holding the GIL.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&Sender) -> Result<T, Error> + Send,
    ) -> PyResult<T> {
        let half = &self.half;
        self.facts
            .wait(py, || {
                let sender = half.lock().unwrap_or_else(PoisonError::into_inner);
                Ok(sender.as_ref().map(call))
            })?
            .ok_or_else(rejoined)?
            .map_err(errors::to_py)
    }
}

#[pymethods]
impl PySender {
    /// This worker's rank.
    #[getter]
    fn rank(&self) -> u32 {
        self.facts.rank
    }

    /// The number of ranks in the session.
    #[getter]
    fn world_size(&self) -> u32 {
        self.facts.world_size
    }

    /// :meth:`Session.send`: ``data`` (any size) to ``rank``. While ``rank``'s ring or this
    /// rank's outbox is full, waits holding nothing the :class:`Receiver` needs.
    ///
    /// Raises as :meth:`Session.send` does.
    #[pyo3(signature = (rank, data, *, timeout=CallTimeout::Session))]
    fn send(
        &self,
        py: Python<'_>,
        rank: i64,
        data: &Bound<'_, PyAny>,
        timeout: CallTimeout,
    ) -> PyResult<()> {
        let rank = rank_arg(rank)?;
        let data = Bytes::get(data)?;
        let timeout = self.facts.deadline(timeout)?;
        let bytes = data.as_slice();
        self.with(py, |sender| sender.with_timeout(timeout).send(rank, bytes))
    }

    /// :meth:`Session.broadcast` with this rank as the root, to the whole world: every other
    /// rank calls ``broadcast(this rank)``. In a world of up to ``FLAT_BROADCAST_MAX`` (8) ranks, while a slow rank's
    /// room is short, waits holding nothing the :class:`Receiver` needs (a larger world's
    /// broadcast holds the session for the whole call).
    ///
    /// Raises as :meth:`Session.broadcast` does.
    #[pyo3(signature = (data, *, timeout=CallTimeout::Session))]
    fn broadcast(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        timeout: CallTimeout,
    ) -> PyResult<()> {
        let data = Bytes::get(data)?;
        let timeout = self.facts.deadline(timeout)?;
        let bytes = data.as_slice();
        self.with(py, |sender| sender.with_timeout(timeout).broadcast(bytes))
    }

    /// Puts the two halves back together: the :class:`Session` they were split from (this
    /// half and ``receiver`` can no longer be used).
    ///
    /// Raises :class:`MisuseError` for the receiver of another session, and
    /// :class:`shmbroker.Error` while either half is in a call on another thread.
    fn rejoin(&self, py: Python<'_>, receiver: &PyReceiver) -> PyResult<PySession> {
        let busy = || errors::plain("a half is in a call on another thread: rejoin after it");
        let mut sender = match self.half.try_lock() {
            Ok(sender) => sender,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(busy()),
        };
        let mut receiver_half = match receiver.half.try_lock() {
            Ok(receiver) => receiver,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(busy()),
        };
        if sender.is_none() || receiver_half.is_none() {
            return Err(rejoined());
        }
        // Checked before either half is taken: a mismatch leaves both usable.
        if self.facts.readiness != receiver.facts.readiness || self.facts.pid != receiver.facts.pid
        {
            return Err(errors::misuse(format!(
                "rank {}'s sender cannot rejoin rank {}'s receiver: they are halves of different \
                 sessions",
                self.facts.rank, receiver.facts.rank
            )));
        }
        let (Some(tx), Some(rx)) = (sender.take(), receiver_half.take()) else {
            return Err(rejoined());
        };
        let session = py.detach(|| tx.rejoin(rx)).map_err(errors::to_py)?;
        Ok(PySession::new(session, self.facts.timeout))
    }

    fn __repr__(&self) -> String {
        format!(
            "<shmbroker.Sender rank {} of {}>",
            self.facts.rank, self.facts.world_size
        )
    }
}

impl PyReceiver {
    /// Runs `call` on the receiver with the GIL released, or raises at once while another
    /// thread is receiving. The lock is held across the GIL's release and return: safe because
    /// nothing takes it but with `try_lock` (a thread blocked on it holding the GIL would keep
    /// this one from returning).
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&Receiver) -> Result<T, Error> + Send,
    ) -> PyResult<T> {
        let receiver = match self.half.try_lock() {
            Ok(receiver) => receiver,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                return Err(errors::plain(
                    "another thread is receiving on this receiver (one receive at a time)",
                ));
            }
        };
        let receiver = receiver.as_ref().ok_or_else(rejoined)?;
        self.facts.wait(py, || call(receiver))
    }
}

#[pymethods]
impl PyReceiver {
    /// This worker's rank.
    #[getter]
    fn rank(&self) -> u32 {
        self.facts.rank
    }

    /// The number of ranks in the session.
    #[getter]
    fn world_size(&self) -> u32 {
        self.facts.world_size
    }

    /// :meth:`Session.recv`: the next message from ``rank``, as ``bytes``.
    #[pyo3(signature = (rank, *, timeout=CallTimeout::Session))]
    fn recv<'py>(
        &self,
        py: Python<'py>,
        rank: i64,
        timeout: CallTimeout,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let rank = rank_arg(rank)?;
        let timeout = self.facts.deadline(timeout)?;
        let received = self.with(py, |receiver| receiver.with_timeout(timeout).recv(rank))?;
        Ok(PyBytes::new(py, &received))
    }

    /// :meth:`Session.recv_into`: the next message from ``rank`` into ``buffer``; its length.
    #[pyo3(signature = (rank, buffer, *, timeout=CallTimeout::Session))]
    fn recv_into(
        &self,
        py: Python<'_>,
        rank: i64,
        buffer: &Bound<'_, PyAny>,
        timeout: CallTimeout,
    ) -> PyResult<usize> {
        let rank = rank_arg(rank)?;
        let mut buffer = Bytes::get_mut(buffer)?;
        let timeout = self.facts.deadline(timeout)?;
        let out = buffer.as_mut_slice();
        self.with(py, |receiver| {
            receiver.with_timeout(timeout).recv_into(rank, out)
        })
    }

    /// :meth:`Session.recv_any`: the next message from whichever peer has one, as ``(rank,
    /// bytes)``.
    #[pyo3(signature = (*, timeout=CallTimeout::Session))]
    fn recv_any<'py>(
        &self,
        py: Python<'py>,
        timeout: CallTimeout,
    ) -> PyResult<(u32, Bound<'py, PyBytes>)> {
        let timeout = self.facts.deadline(timeout)?;
        let (rank, received) =
            self.with(py, |receiver| receiver.with_timeout(timeout).recv_any())?;
        Ok((rank, PyBytes::new(py, &received)))
    }

    /// :meth:`Session.recv_any_into`: into ``buffer``, as ``(rank, length)``.
    #[pyo3(signature = (buffer, *, timeout=CallTimeout::Session))]
    fn recv_any_into(
        &self,
        py: Python<'_>,
        buffer: &Bound<'_, PyAny>,
        timeout: CallTimeout,
    ) -> PyResult<(u32, usize)> {
        let mut buffer = Bytes::get_mut(buffer)?;
        let timeout = self.facts.deadline(timeout)?;
        let out = buffer.as_mut_slice();
        self.with(py, |receiver| {
            receiver.with_timeout(timeout).recv_any_into(out)
        })
    }

    /// :meth:`Session.try_recv`: the next message from ``rank`` if one has started to arrive,
    /// else ``None`` at once.
    fn try_recv<'py>(&self, py: Python<'py>, rank: i64) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let rank = rank_arg(rank)?;
        let received = self.with(py, |receiver| receiver.try_recv(rank))?;
        Ok(received.map(|bytes| PyBytes::new(py, &bytes)))
    }

    /// :meth:`Session.probe`: the length of the next message from ``rank``, waiting for it to
    /// arrive, without receiving it.
    #[pyo3(signature = (rank, *, timeout=CallTimeout::Session))]
    fn probe(&self, py: Python<'_>, rank: i64, timeout: CallTimeout) -> PyResult<usize> {
        let rank = rank_arg(rank)?;
        let timeout = self.facts.deadline(timeout)?;
        self.with(py, |receiver| receiver.with_timeout(timeout).probe(rank))
    }

    /// :meth:`Session.try_recv_any`: ``(rank, bytes)`` if a message has started to arrive,
    /// else ``None`` at once.
    fn try_recv_any<'py>(&self, py: Python<'py>) -> PyResult<Option<(u32, Bound<'py, PyBytes>)>> {
        let received = self.with(py, Receiver::try_recv_any)?;
        Ok(received.map(|(rank, bytes)| (rank, PyBytes::new(py, &bytes))))
    }

    /// :meth:`Session.readiness_fd`: readable when a message is waiting, once
    /// :meth:`try_recv_any` has returned ``None``. Open as long as the session is (rejoined
    /// too).
    fn readiness_fd(&self) -> RawFd {
        // Not through the lock: a receive may hold it, waiting, with the GIL released.
        self.facts.readiness
    }

    fn __repr__(&self) -> String {
        format!(
            "<shmbroker.Receiver rank {} of {}>",
            self.facts.rank, self.facts.world_size
        )
    }
}
