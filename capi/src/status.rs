//! `shmbroker_status`: what a running job's ranks are doing, asked of its broker, as the JSON
//! lines of `shmbroker status --json`.

use crate::error::{Failure, guard, misuse};
use shmbroker::session::Error;
use std::ffi::{CStr, c_char};
use std::os::unix::ffi::OsStrExt;

/// Asks the broker listening at `socket` what every rank of its job is doing, within
/// `timeout_ms` milliseconds, and writes the answer into `buf` (`cap` bytes) as
/// `shmbroker status --json` prints it: one JSON object per rank, one per line (`job`, `rank`,
/// `pid`, `state`, `call`, `seconds`, `waiting_for`, ...), then a NUL. `*len` is the text's
/// length without the NUL. A `buf` too small is `SHMBROKER_E_TOO_SMALL` with `*len` set to the
/// length needed (ask again with more than that). Only the broker's uid and the uids it admits
/// may ask. Threads: any; it uses no session.
///
/// Errors: `SHMBROKER_E_LOGON` when no broker answers or it refuses; `SHMBROKER_E_MISUSE` for
/// NULL pointers or a timeout of 0.
///
/// # Safety
///
/// `socket` is a NUL-terminated path; `buf` has `cap` writable bytes (or is NULL with `cap` 0);
/// `len` points at a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_status(
    socket: *const c_char,
    timeout_ms: u64,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> std::ffi::c_int {
    guard("shmbroker_status", || {
        if socket.is_null() {
            return Err(misuse("socket is NULL"));
        }
        if len.is_null() {
            return Err(misuse("len is NULL"));
        }
        // SAFETY: non-null and, per the contract, NUL-terminated.
        let socket = unsafe { CStr::from_ptr(socket) };
        let socket = std::path::Path::new(std::ffi::OsStr::from_bytes(socket.to_bytes()));
        let timeout = crate::session::timeout_of(timeout_ms)?;
        let report = shmbroker::status::query(socket, timeout)
            .map_err(|e| Failure::from(Error::Logon(e)))?;
        let text = shmbroker::status::json_lines(&report);
        // SAFETY: checked non-null above; writable per the contract.
        unsafe { len.write(text.len()) };
        if text.len() >= cap {
            return Err(Failure(
                crate::SHMBROKER_E_TOO_SMALL,
                format!(
                    "the status is {} bytes and a NUL; the buffer holds {cap}",
                    text.len()
                ),
                None,
            ));
        }
        // SAFETY: `cap > text.len()`, so `buf` is not NULL (a NULL buffer has cap 0) and has
        // room for the text and its NUL, per the contract; the text is private memory.
        let out = unsafe { crate::buffer::bytes_mut(buf.cast(), text.len() + 1, "buf") }?;
        out[..text.len()].copy_from_slice(text.as_bytes());
        out[text.len()] = 0;
        Ok(())
    })
}
