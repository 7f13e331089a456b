//! The bytes of any object with the buffer protocol, read in place.
//!
//! PyO3 offers the buffer protocol only where it is part of the limited API, which is CPython
//! 3.11 and later; this package is built for the stable ABI of 3.9 and later. So this module
//! declares the two functions and the struct itself. They are exported by every CPython 3
//! (`PyAPI_FUNC`), and `Py_buffer` has had this layout since 3.3; 3.11 made all three part of the
//! stable ABI as they are, so later versions keep them. (Linux only, as is shmbroker: there an
//! abi3 extension resolves these symbols from the interpreter that loads it.)

use crate::errors;
use pyo3::prelude::*;
use std::ffi::{c_char, c_int, c_void};

/// `Py_buffer`, as CPython lays it out.
#[repr(C)]
#[derive(Debug)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut pyo3::ffi::PyObject,
    len: isize,
    itemsize: isize,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut isize,
    strides: *mut isize,
    suboffsets: *mut isize,
    internal: *mut c_void,
}

/// `PyBUF_FULL_RO`: shape, strides and suboffsets (so any exporter can answer, and
/// contiguity is checked here, with a message of ours), read-only is enough.
const PYBUF_FULL_RO: c_int = 0x0100 | 0x0010 | 0x0008 | 0x0004;

/// `PyBUF_FULL`: as [`PYBUF_FULL_RO`], and writable (a read-only exporter raises `BufferError`).
const PYBUF_FULL: c_int = PYBUF_FULL_RO | 0x0001;

unsafe extern "C" {
    fn PyObject_GetBuffer(
        obj: *mut pyo3::ffi::PyObject,
        view: *mut RawBuffer,
        flags: c_int,
    ) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

/// A C-contiguous buffer of any element type (`bytes`, `bytearray`, `memoryview`, `array.array`,
/// NumPy arrays), exported (so the object cannot be resized or freed) until dropped.
#[derive(Debug)]
pub struct Bytes {
    /// Boxed: exporters may point `shape` or `strides` into the struct itself, so it must not
    /// move while exported.
    view: Box<RawBuffer>,
}

impl Bytes {
    /// The buffer of `data`.
    ///
    /// # Errors
    ///
    /// What the exporter raises (`TypeError` for an object without the buffer protocol);
    /// `MisuseError` (a `ValueError`) for a buffer that is not C-contiguous.
    pub fn get(data: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::get_with(data, PYBUF_FULL_RO)
    }

    /// The buffer of `data`, to be written: `bytearray`, a writable `memoryview`, a NumPy array
    /// or a torch CPU tensor's `.numpy()`, ...
    ///
    /// # Errors
    ///
    /// As for [`Self::get`]; `BufferError` (from the exporter) for a read-only one (`bytes`).
    pub fn get_mut(data: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::get_with(data, PYBUF_FULL)
    }

    fn get_with(data: &Bound<'_, PyAny>, flags: c_int) -> PyResult<Self> {
        let mut view = Box::new(RawBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        // SAFETY: `data` is a live object and the GIL is held (its `Bound`); `view` points at a
        // writable `Py_buffer` that stays where it is (boxed) until `Drop` releases it.
        let got = unsafe { PyObject_GetBuffer(data.as_ptr(), &raw mut *view, flags) };
        if got != 0 {
            return Err(PyErr::fetch(data.py()));
        }
        // From here on, dropping `bytes` releases the buffer, whatever happens.
        let bytes = Self { view };
        if !bytes.is_c_contiguous() {
            return Err(errors::misuse(format!(
                "data must be a C-contiguous buffer; this {} (shape {:?}, strides {:?}) is not: \
                 pass bytes(data), or numpy.ascontiguousarray(data)",
                data.get_type().name()?,
                bytes.dims(bytes.view.shape),
                bytes.dims(bytes.view.strides)
            )));
        }
        Ok(bytes)
    }

    /// The `ndim` numbers at `array` (the shape or the strides), or none when it is null.
    fn dims(&self, array: *const isize) -> &[isize] {
        let ndim = usize::try_from(self.view.ndim).unwrap_or(0);
        if array.is_null() || ndim == 0 {
            return &[];
        }
        // SAFETY: a non-null shape or strides array of an exported buffer holds `ndim` numbers,
        // valid until the buffer is released (when `self` drops, after this borrow).
        unsafe { std::slice::from_raw_parts(array, ndim) }
    }

    /// As CPython's `PyBuffer_IsContiguous(view, 'C')`.
    fn is_c_contiguous(&self) -> bool {
        let view = &self.view;
        if !view.suboffsets.is_null() {
            return false;
        }
        if view.len == 0 || view.strides.is_null() {
            return true;
        }
        let (shape, strides) = (self.dims(view.shape), self.dims(view.strides));
        let mut expected = view.itemsize;
        for (&dim, &stride) in shape.iter().zip(strides).rev() {
            if dim > 1 && stride != expected {
                return false;
            }
            expected = expected.saturating_mul(dim);
        }
        true
    }

    /// The bytes, for use while the GIL is released.
    ///
    /// As with CPython's own `socket.send` or `hashlib`, which read a buffer without the GIL,
    /// the program must not write to the object from another thread during the call
    /// (documented on the `Session` class): the bytes sent would be a mix of old and new.
    pub fn as_slice(&self) -> &[u8] {
        let len = usize::try_from(self.view.len).unwrap_or(0);
        if len == 0 || self.view.buf.is_null() {
            return &[];
        }
        // SAFETY: the exporter keeps `len` bytes at `buf` valid and in place until the buffer is
        // released, which happens only when `self` drops, after this borrow; C-contiguity
        // (checked in `get`) makes them one block; `u8` has no alignment or validity
        // requirement. Writes by other threads are excluded by the contract above.
        unsafe { std::slice::from_raw_parts(self.view.buf.cast::<u8>(), len) }
    }
}

impl Bytes {
    /// The element type the exporter declares (its `struct` format without byte-order prefix,
    /// `"f"`, `"d"`, `"e"`, `"B"`, ...) and the size of one element; `None` for a format that
    /// is not one plain number.
    pub fn element_format(&self) -> Option<(char, usize)> {
        if self.view.format.is_null() {
            // No format asked or given: unsigned bytes.
            return Some(('B', 1));
        }
        // SAFETY: an exported buffer's non-null `format` is a NUL-terminated string, valid
        // until the buffer is released (when `self` drops, after this borrow).
        let format = unsafe { std::ffi::CStr::from_ptr(self.view.format) }
            .to_str()
            .ok()?;
        let code = format.trim_start_matches(['@', '=', '<']);
        let mut chars = code.chars();
        let (Some(code), None) = (chars.next(), chars.next()) else {
            return None;
        };
        Some((code, usize::try_from(self.view.itemsize).ok()?))
    }

    /// The bytes, to be written while the GIL is released (a buffer from [`Self::get_mut`]).
    ///
    /// As for [`Self::as_slice`], the program must not use the object from another thread
    /// during the call.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = usize::try_from(self.view.len).unwrap_or(0);
        if len == 0 || self.view.buf.is_null() || self.view.readonly != 0 {
            return &mut [];
        }
        // SAFETY: as in `as_slice`, and the exporter granted a writable buffer (`get_mut` asked
        // for PyBUF_WRITABLE; a read-only one is refused by the exporter, and checked above);
        // `&mut self` makes this the only borrow of it here.
        unsafe { std::slice::from_raw_parts_mut(self.view.buf.cast::<u8>(), len) }
    }
}

impl Drop for Bytes {
    fn drop(&mut self) {
        Python::attach(|_py| {
            // SAFETY: exported by `PyObject_GetBuffer` in `get` and released only here, once,
            // with the GIL held.
            unsafe { PyBuffer_Release(&raw mut *self.view) };
        });
    }
}
