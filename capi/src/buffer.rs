//! A C caller's pointer and length as a slice, NULL with a length other than 0 being misuse.

use crate::error::{Failure, misuse};
use std::ffi::c_void;

/// `len` bytes at `data` (empty when `len` is 0, whatever `data` is).
///
/// # Safety
///
/// When `len > 0` and `data` is not null, `data` points at `len` readable bytes.
pub(crate) unsafe fn bytes<'a>(
    data: *const c_void,
    len: usize,
    what: &str,
) -> Result<&'a [u8], Failure> {
    if len == 0 {
        return Ok(&[]);
    }
    if data.is_null() {
        return Err(misuse(format!("{what} is NULL with a length of {len}")));
    }
    // SAFETY: non-null, and per this function's contract `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) })
}

/// `len` writable bytes at `data` (empty when `len` is 0).
///
/// # Safety
///
/// When `len > 0` and `data` is not null, `data` points at `len` writable bytes no one else
/// uses during the call.
pub(crate) unsafe fn bytes_mut<'a>(
    data: *mut c_void,
    len: usize,
    what: &str,
) -> Result<&'a mut [u8], Failure> {
    if len == 0 {
        return Ok(&mut []);
    }
    if data.is_null() {
        return Err(misuse(format!("{what} is NULL with a length of {len}")));
    }
    // SAFETY: non-null, and per this function's contract `len` writable, unshared bytes.
    Ok(unsafe { std::slice::from_raw_parts_mut(data.cast::<u8>(), len) })
}
