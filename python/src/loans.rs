//! Loans in Python: `Loan` (a writable buffer in this rank's outbox, handed to peers by
//! reference) and `LoanView` (a read-only view of a buffer a peer lent), each with a `buffer`
//! memoryview and a `with` block that gives it back.
//!
//! # Why no memoryview can outlive its memory
//!
//! The stable ABI this package is built for (abi3, Python 3.9) has no way for a class of ours to
//! export a buffer, and `PyMemoryView_FromMemory` makes a memoryview that keeps no owner alive:
//! a slice of it (or a NumPy array made from it) could outlive the loan, and the session, and
//! read an unmapped address. So the memory is exported by a `ctypes` array at the loan's address
//! instead, and that array carries a [`Pinned`] mapping as an attribute: every memoryview, slice
//! and array made from it holds the ctypes array, which holds the mapping. Reading or writing
//! through one after its loan was sent (or its view released) therefore never faults; it reaches
//! bytes that may by then belong to another message, which the documentation forbids. The
//! `buffer` memoryview this module hands out is released when its loan is sent or released
//! (unless arrays made from it are still alive), so the usual mistake raises instead.

use crate::errors;
use pyo3::prelude::*;
use shmbroker::allocator::{Loan, Pin};
use shmbroker::session::LoanView;
use std::sync::{Mutex, PoisonError};

/// Keeps a mapping alive for the ctypes array (and every buffer made from it) that holds it.
#[pyclass(frozen, module = "shmbroker._shmbroker")]
#[derive(Debug)]
struct Pinned(#[expect(dead_code, reason = "held for its Drop only")] Pin);

/// A memoryview of `len` bytes at `address`, read-only unless `writable`, that keeps `pin` (the
/// mapping holding them) alive for as long as it or anything made from it lives.
fn pinned_buffer<'py>(
    py: Python<'py>,
    address: usize,
    len: usize,
    pin: Pin,
    writable: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let ctypes = py.import("ctypes")?;
    let array = ctypes
        .getattr("c_ubyte")?
        .call_method1("__mul__", (len,))?
        .call_method1("from_address", (address,))?;
    array.setattr("_shmbroker_pinned", Pinned(pin))?;
    let view = py
        .import("builtins")?
        .getattr("memoryview")?
        .call1((array,))?
        .call_method1("cast", ("B",))?;
    if writable {
        Ok(view)
    } else {
        view.call_method0("toreadonly")
    }
}

/// Releases the memoryview handed out as `buffer`, so that using it after its loan is gone
/// raises; when arrays made from it still live, it cannot be released and is left as it is
/// (pinned: see the module docs).
fn release_buffer(buffer: &Bound<'_, PyAny>) {
    let _ = buffer.call_method0("release");
}

/// A writable buffer of ``len(loan)`` bytes in this rank's outbox (:meth:`Session.loan`):
/// fill ``loan.buffer``, then hand it to peers by reference with :meth:`Session.send_loan` or
/// :meth:`Session.broadcast_loan`, at a cost that does not depend on its size. Leaving its
/// ``with`` block (or :meth:`release`) gives an unsent loan back to the outbox. After it is sent
/// or released, ``buffer`` raises, and nothing made from it may be used: its bytes may belong to
/// another message.
#[pyclass(name = "Loan", module = "shmbroker._shmbroker")]
#[derive(Debug)]
pub struct PyLoan {
    loan: Mutex<Option<Loan>>,
    buffer: Py<PyAny>,
    len: usize,
}

impl PyLoan {
    pub fn new(py: Python<'_>, mut loan: Loan) -> PyResult<Self> {
        let len = loan.len();
        let address = loan.as_mut_ptr() as usize;
        let buffer = pinned_buffer(py, address, len, loan.pin(), true)?.unbind();
        Ok(Self {
            loan: Mutex::new(Some(loan)),
            buffer,
            len,
        })
    }

    /// The loan, to send: taken out, so that it is sent once.
    pub fn take(&self, py: Python<'_>) -> PyResult<Loan> {
        let loan = self
            .loan
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| errors::misuse("this loan was already sent or released"))?;
        release_buffer(self.buffer.bind(py));
        Ok(loan)
    }
}

#[pymethods]
impl PyLoan {
    /// The loan's bytes, writable (a ``memoryview`` of format ``B``; ``numpy.frombuffer`` makes
    /// an array of it). Raises :class:`MisuseError` once the loan is sent or released.
    #[getter]
    fn buffer(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if self
            .loan
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
        {
            return Err(errors::misuse("this loan was already sent or released"));
        }
        Ok(self.buffer.clone_ref(py))
    }

    fn __len__(&self) -> usize {
        self.len
    }

    /// Gives the loan back to the outbox unsent; nothing if it was sent or released already.
    fn release(&self, py: Python<'_>) {
        let _ = self.take(py);
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release(py);
        false
    }

    fn __repr__(&self) -> String {
        let state = if self
            .loan
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
        {
            "unsent"
        } else {
            "sent or released"
        };
        format!("<shmbroker.Loan of {} bytes, {state}>", self.len)
    }
}

/// A read-only view of a buffer rank ``owner`` lent this rank (:meth:`Session.recv_loan`,
/// :meth:`Session.broadcast_loan`), read in place in the lender's outbox. Leaving its ``with``
/// block (or :meth:`release`) tells the lender it may reuse the buffer; ``buffer`` then raises,
/// and nothing made from it may be used. Only the lender can write those bytes, but a buggy or
/// hostile lender can change them at any time: copy out what you must validate.
#[pyclass(name = "LoanView", module = "shmbroker._shmbroker")]
#[derive(Debug)]
pub struct PyLoanView {
    view: Mutex<Option<LoanView>>,
    buffer: Py<PyAny>,
    owner: u32,
    len: usize,
}

impl PyLoanView {
    pub fn new(py: Python<'_>, view: LoanView) -> PyResult<Self> {
        let (owner, len) = (view.owner(), view.len());
        let buffer = pinned_buffer(py, view.as_ptr() as usize, len, view.pin(), false)?.unbind();
        Ok(Self {
            view: Mutex::new(Some(view)),
            buffer,
            owner,
            len,
        })
    }
}

#[pymethods]
impl PyLoanView {
    /// The lent bytes, read-only (a ``memoryview`` of format ``B``). Raises
    /// :class:`MisuseError` once the view is released.
    #[getter]
    fn buffer(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if self
            .view
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
        {
            return Err(errors::misuse("this loan view was already released"));
        }
        Ok(self.buffer.clone_ref(py))
    }

    /// The rank that lent the buffer.
    #[getter]
    fn owner(&self) -> u32 {
        self.owner
    }

    fn __len__(&self) -> usize {
        self.len
    }

    /// Gives the buffer back to its lender (with the session's next call); nothing if released
    /// already.
    fn release(&self, py: Python<'_>) {
        let view = self
            .view
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if view.is_some() {
            release_buffer(self.buffer.bind(py));
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release(py);
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "<shmbroker.LoanView of {} bytes from rank {}>",
            self.len, self.owner
        )
    }
}
