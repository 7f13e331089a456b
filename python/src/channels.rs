//! Typed channels: `Session.channel_to` and `Session.channel_from`, and their ends.

use crate::buffer::Bytes;
use crate::errors;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use shmbroker::Error;
use shmbroker::session::{RawChannelReceiver, RawChannelSender};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// A record's size from what the caller gave: a number of bytes, or anything with an
/// ``itemsize`` (a NumPy dtype, structured or not).
pub fn record_bytes(record: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(bytes) = record.extract::<usize>() {
        return Ok(bytes);
    }
    match record
        .getattr("itemsize")
        .and_then(|size| size.extract::<usize>())
    {
        Ok(bytes) => Ok(bytes),
        Err(_) => Err(errors::misuse(format!(
            "record {record:?}: a number of bytes, or a NumPy dtype (anything with an itemsize)"
        ))),
    }
}

/// The end in `slot`, or an error while another thread is in a call on it or once it is closed.
fn lock<'a, T>(slot: &'a Mutex<Option<T>>) -> PyResult<MutexGuard<'a, Option<T>>> {
    let end = match slot.try_lock() {
        Ok(end) => end,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => {
            return Err(errors::plain(
                "another thread is in a call on this channel end (one at a time)",
            ));
        }
    };
    if end.is_none() {
        return Err(errors::plain("the channel end is closed"));
    }
    Ok(end)
}

/// Runs `call` on the end in `slot` with the GIL released (the lock is only ever taken with
/// `try_lock`, so holding it across the GIL's return blocks nobody).
fn waiting<E: Send, T: Send>(
    py: Python<'_>,
    slot: &Mutex<Option<E>>,
    call: impl FnOnce(&mut E) -> Result<T, Error> + Send,
) -> PyResult<T> {
    let mut end = lock(slot)?;
    let end = end
        .as_mut()
        .ok_or_else(|| errors::plain("the channel end is closed"))?;
    py.detach(|| call(end)).map_err(errors::to_py)
}

/// The sending end of a typed channel (:meth:`Session.channel_to`). One thread at a time; a
/// call that waits releases the GIL. :meth:`close` (or dropping it) closes the channel: the
/// receiver gets what was sent, then :class:`ChannelClosed`.
#[pyclass(module = "shmbroker", name = "ChannelSender", frozen)]
#[derive(Debug)]
pub struct PyChannelSender {
    end: Mutex<Option<RawChannelSender>>,
    record: usize,
}

/// The receiving end of a typed channel (:meth:`Session.channel_from`).
#[pyclass(module = "shmbroker", name = "ChannelReceiver", frozen)]
#[derive(Debug)]
pub struct PyChannelReceiver {
    end: Mutex<Option<RawChannelReceiver>>,
    record: usize,
}

impl PyChannelSender {
    pub fn new(end: RawChannelSender) -> Self {
        Self {
            record: end.record_bytes(),
            end: Mutex::new(Some(end)),
        }
    }
}

impl PyChannelReceiver {
    pub fn new(end: RawChannelReceiver) -> Self {
        Self {
            record: end.record_bytes(),
            end: Mutex::new(Some(end)),
        }
    }
}

#[pymethods]
impl PyChannelSender {
    /// Bytes per record.
    #[getter]
    fn record_bytes(&self) -> usize {
        self.record
    }

    /// Sends one record (a buffer of ``record_bytes``) if the ring has room now: whether it
    /// went.
    ///
    /// Raises :class:`ChannelClosed` once the receiver closed the channel,
    /// :class:`MisuseError` once it refused it or for a record of another size. (A call that
    /// waits also raises :class:`PeerLost` once the receiver's process is gone.)
    fn try_send(&self, record: &Bound<'_, PyAny>) -> PyResult<bool> {
        let record = Bytes::get(record)?;
        let mut end = lock(&self.end)?;
        let end = end
            .as_mut()
            .ok_or_else(|| errors::plain("the channel end is closed"))?;
        end.try_send(record.as_slice()).map_err(errors::to_py)
    }

    /// Sends one record, waiting for room within the session's deadline (as it was when the
    /// channel was made).
    ///
    /// Raises as :meth:`try_send` does, and :class:`Timeout`.
    fn send(&self, py: Python<'_>, record: &Bound<'_, PyAny>) -> PyResult<()> {
        let record = Bytes::get(record)?;
        let bytes = record.as_slice();
        waiting(py, &self.end, |end| end.send(bytes))
    }

    /// Sends every record of ``records`` (a buffer of whole records: a NumPy array of the
    /// channel's dtype, ``bytes``, ...), waiting for room as it needs.
    ///
    /// Raises as :meth:`send` does; the records before the one that failed went.
    fn send_batch(&self, py: Python<'_>, records: &Bound<'_, PyAny>) -> PyResult<()> {
        let records = Bytes::get(records)?;
        let bytes = records.as_slice();
        waiting(py, &self.end, |end| end.send_batch(bytes))
    }

    /// Sends as many records of ``records`` as the ring has room for now: how many.
    fn try_send_batch(&self, records: &Bound<'_, PyAny>) -> PyResult<usize> {
        let records = Bytes::get(records)?;
        let mut end = lock(&self.end)?;
        let end = end
            .as_mut()
            .ok_or_else(|| errors::plain("the channel end is closed"))?;
        end.try_send_batch(records.as_slice())
            .map_err(errors::to_py)
    }

    /// Closes the channel (the receiver gets what was sent, then :class:`ChannelClosed`).
    fn close(&self) -> PyResult<()> {
        drop(lock(&self.end)?.take());
        Ok(())
    }
}

#[pymethods]
impl PyChannelReceiver {
    /// Bytes per record.
    #[getter]
    fn record_bytes(&self) -> usize {
        self.record
    }

    /// The next record as ``bytes`` if one has arrived, else ``None`` (``numpy.frombuffer``
    /// with the channel's dtype reads it).
    ///
    /// Raises :class:`ChannelClosed` once the sender closed the channel and everything it
    /// sent was received. (A call that waits also raises :class:`PeerLost` once the sender's
    /// process is gone and everything it sent was received.)
    fn try_recv<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let mut record = vec![0u8; self.record];
        let mut end = lock(&self.end)?;
        let end = end
            .as_mut()
            .ok_or_else(|| errors::plain("the channel end is closed"))?;
        let got = end.try_recv(&mut record).map_err(errors::to_py)?;
        Ok(got.then(|| PyBytes::new(py, &record)))
    }

    /// The next record as ``bytes``, waiting for it within the deadline.
    ///
    /// Raises as :meth:`try_recv` does, and :class:`Timeout`.
    fn recv<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let mut record = vec![0u8; self.record];
        let buffer = &mut record;
        waiting(py, &self.end, |end| end.recv(buffer))?;
        Ok(PyBytes::new(py, &record))
    }

    /// Receives into ``records`` (a writable buffer of whole records: a NumPy array of the
    /// channel's dtype) those that have arrived, up to its length, waiting for the first: how
    /// many.
    ///
    /// Raises as :meth:`recv` does.
    fn recv_batch(&self, py: Python<'_>, records: &Bound<'_, PyAny>) -> PyResult<usize> {
        let mut records = Bytes::get_mut(records)?;
        let out = records.as_mut_slice();
        waiting(py, &self.end, |end| end.recv_batch(out))
    }

    /// :meth:`recv_batch` without waiting: may be 0.
    fn try_recv_batch(&self, records: &Bound<'_, PyAny>) -> PyResult<usize> {
        let mut records = Bytes::get_mut(records)?;
        let mut end = lock(&self.end)?;
        let end = end
            .as_mut()
            .ok_or_else(|| errors::plain("the channel end is closed"))?;
        end.try_recv_batch(records.as_mut_slice())
            .map_err(errors::to_py)
    }

    /// Closes the channel (the sender's next call raises :class:`ChannelClosed`).
    fn close(&self) -> PyResult<()> {
        drop(lock(&self.end)?.take());
        Ok(())
    }
}
