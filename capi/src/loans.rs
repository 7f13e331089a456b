//! Loans: a buffer handed to peers by reference, at a cost that does not depend on its size.
//!
//! The lender fills a block of its own outbox (`shmbroker_loan_create`) and hands it over
//! (`shmbroker_send_loan`, `shmbroker_broadcast_loan`); a receiver reads it in place through a
//! view (`shmbroker_recv_loan`) and frees the view when done, which gives the block back to its
//! owner. Loans and views are objects of their own: each is freed once, from any thread, before
//! or after its session is closed (memory stays mapped as long as they live; but once this rank
//! leaves, a lender may reuse the block a view shows, so read views before closing).

use crate::error::{guard, misuse};
use crate::handle::{enter, shmbroker_session};
#[cfg(doc)]
use crate::shmbroker_barrier;
use shmbroker::session::{Loan, LoanView};
use std::ffi::{c_int, c_void};

/// A block of this rank's outbox, lent out by `shmbroker_loan_create`: opaque. It goes to a peer with
/// `shmbroker_send_loan` or `shmbroker_broadcast_loan`, or back with `shmbroker_loan_free`.
#[derive(Debug)]
pub struct shmbroker_loan {
    loan: Loan,
}

/// A read-only view of a buffer a peer lent this rank (`shmbroker_recv_loan`,
/// `shmbroker_broadcast_loan`): opaque. `shmbroker_loan_view_free` gives the buffer back to its
/// owner.
#[derive(Debug)]
pub struct shmbroker_loan_view {
    /// Held, never read from Rust: C reads its bytes; dropping it gives the buffer back.
    _view: LoanView,
}

/// Lends `len` bytes of this rank's outbox: `*data` is where to write them, and `*out` the loan,
/// which `shmbroker_send_loan` or `shmbroker_broadcast_loan` hands over (or
/// `shmbroker_loan_free` gives back). Waits, within the session's deadline, while peers still
/// hold earlier loans and the outbox is full. Threads: as [`shmbroker_barrier`].
///
/// Errors: `SHMBROKER_E_IO` when `len` is more than the outbox can ever hold;
/// `SHMBROKER_E_TIMEOUT` naming the rank that holds the most of it.
///
/// # Safety
///
/// `s` is null or a live session; `out` and `data` point at a writable `shmbroker_loan *` and
/// `void *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_loan_create(
    s: *mut shmbroker_session,
    len: usize,
    out: *mut *mut shmbroker_loan,
    data: *mut *mut c_void,
) -> c_int {
    guard("shmbroker_loan_create", || {
        if out.is_null() || data.is_null() {
            return Err(misuse("out or data is NULL"));
        }
        // SAFETY: checked non-null above, writable per the contract: NULL until it succeeds.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: as above.
        unsafe { data.write(std::ptr::null_mut()) };
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let mut loan = entered.handle.sender.session().loan(len)?;
        let start = loan.as_mut_ptr().cast::<c_void>();
        let handle = Box::into_raw(Box::new(shmbroker_loan { loan }));
        // SAFETY: checked non-null above; writable per the contract.
        unsafe { data.write(start) };
        // SAFETY: checked non-null above; writable per the contract.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Hands `loan` to `rank` by reference: `rank` reads it with `shmbroker_recv_loan` (or copies it
/// with `shmbroker_recv`). `loan` is consumed, whatever the result: on failure its block goes
/// back to the outbox. Do not write to the loan's bytes after this call. Threads: as
/// [`shmbroker_barrier`].
///
/// Errors: `SHMBROKER_E_MISUSE` for a NULL loan or a rank out of range; `SHMBROKER_E_IO` for a
/// loan of another session; otherwise as `shmbroker_send`.
///
/// # Safety
///
/// `s` is null or a live session; `loan` is null or a loan `shmbroker_loan_create` made and nothing
/// has consumed or freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_send_loan(
    s: *mut shmbroker_session,
    rank: u32,
    loan: *mut shmbroker_loan,
) -> c_int {
    guard("shmbroker_send_loan", || {
        // SAFETY: per the contract, a pointer from Box::into_raw that nothing has taken back.
        let loan = unsafe { take(loan) }.ok_or_else(|| misuse("loan is NULL"))?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        Ok(entered.handle.sender.session().send_loan(rank, loan.loan)?)
    })
}

/// Gives `loan` back to the outbox unsent (NULL: nothing). Any thread.
///
/// # Safety
///
/// `loan` is null or a loan `shmbroker_loan_create` made and nothing has consumed or freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_loan_free(loan: *mut shmbroker_loan) {
    // SAFETY: per the contract, a pointer from Box::into_raw that nothing has taken back.
    drop(unsafe { take(loan) });
}

/// Receives the next message from `rank`, which must be a loan, as a read-only view of the
/// lender's buffer: `*data` and `*len` are its bytes, readable until `*out` is freed with
/// `shmbroker_loan_view_free` (and stable until this session closes). Threads: a receive, as
/// `shmbroker_recv` (`SHMBROKER_E_BUSY` beside another receive), that also holds the session
/// while it waits, as [`shmbroker_barrier`] does. On failure `*out`, `*data` and `*len` are
/// NULL, NULL and 0.
///
/// The bytes are the lender's memory, which only the lender can write: an honest one does not
/// touch them until the view is freed; copy out what you must validate before trusting it.
///
/// Errors: `SHMBROKER_E_MISUSE` when the next message from `rank` is not a loan (it stays
/// queued for `shmbroker_recv`); otherwise as `shmbroker_recv`.
///
/// # Safety
///
/// `s` is null or a live session; `out`, `data` and `len` point at a writable
/// `shmbroker_loan_view *`, `const void *` and `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_recv_loan(
    s: *mut shmbroker_session,
    rank: u32,
    out: *mut *mut shmbroker_loan_view,
    data: *mut *const c_void,
    len: *mut usize,
) -> c_int {
    guard("shmbroker_recv_loan", || {
        // SAFETY: the three are null or writable, per the contract.
        unsafe { clear(out, data, len) }?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        // A receive, as `shmbroker_recv`: one at a time (SHMBROKER_E_BUSY for a second), so it
        // cannot take the message another thread's receive was woken for.
        let _receiving = entered.handle.receiver()?;
        let view = entered.handle.sender.session().recv_loan(rank)?;
        // SAFETY: all three checked non-null above, writable per the contract.
        unsafe { give_view(view, out, data, len) };
        Ok(())
    })
}

/// `root`'s loan on every other rank, by reference: the root passes `loan` (consumed, whatever
/// the result) and gets `*out` = NULL; the others pass NULL and get a view, as from
/// `shmbroker_recv_loan`. Threads: as [`shmbroker_barrier`].
///
/// Errors: `SHMBROKER_E_MISUSE` for a root without a loan (or another rank with one) or a root
/// out of range; otherwise as `shmbroker_broadcast`.
///
/// # Safety
///
/// `s` is null or a live session; on the root, `loan` is a loan `shmbroker_loan_create` made and
/// nothing has consumed or freed (elsewhere NULL); `out`, `data` and `len` as for
/// `shmbroker_recv_loan`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_broadcast_loan(
    s: *mut shmbroker_session,
    root: u32,
    loan: *mut shmbroker_loan,
    out: *mut *mut shmbroker_loan_view,
    data: *mut *const c_void,
    len: *mut usize,
) -> c_int {
    guard("shmbroker_broadcast_loan", || {
        // SAFETY: per the contract, a pointer from Box::into_raw that nothing has taken back.
        let loan = unsafe { take(loan) }.map(|loan| loan.loan);
        // SAFETY: the three are null or writable, per the contract.
        unsafe { clear(out, data, len) }?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let view = entered.handle.sender.session().broadcast_loan(root, loan)?;
        match view {
            // SAFETY: all three checked non-null above, writable per the contract.
            Some(view) => unsafe { give_view(view, out, data, len) },
            // SAFETY: checked non-null above, writable per the contract.
            None => unsafe { out.write(std::ptr::null_mut()) },
        }
        Ok(())
    })
}

/// A loan lent by reference (`shmbroker_lend_ref`): where it is in its lender's outbox. Plain
/// data, 16 bytes, to carry in a typed channel's record; the receiving rank views it with
/// `shmbroker_view_loan_ref`, once.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct shmbroker_loan_ref {
    /// Byte offset in the lender's outbox.
    pub offset: u64,
    /// Bytes lent.
    pub len: u32,
    /// Zero.
    pub _pad0: u32,
}

/// Lends `loan` to `rank` by reference: `*out` is what a typed channel's record carries, and
/// `rank` views it with `shmbroker_view_loan_ref`. Nothing is sent. `loan` is consumed,
/// whatever the result. Threads: as [`shmbroker_barrier`].
///
/// Errors: `SHMBROKER_E_MISUSE` for a NULL loan or out, or a rank out of range;
/// `SHMBROKER_E_IO` for a loan of another session.
///
/// # Safety
///
/// `s` is null or a live session; `loan` as for `shmbroker_send_loan`; `out` points at a
/// writable `shmbroker_loan_ref`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_lend_ref(
    s: *mut shmbroker_session,
    rank: u32,
    loan: *mut shmbroker_loan,
    out: *mut shmbroker_loan_ref,
) -> c_int {
    guard("shmbroker_lend_ref", || {
        // SAFETY: per the contract, a pointer from Box::into_raw that nothing has taken back.
        let loan = unsafe { take(loan) }.ok_or_else(|| misuse("loan is NULL"))?;
        if out.is_null() {
            return Err(misuse("out is NULL"));
        }
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let lent = entered.handle.sender.session().lend_ref(rank, loan.loan)?;
        // SAFETY: checked non-null above, writable per the contract.
        unsafe {
            out.write(shmbroker_loan_ref {
                offset: lent.offset,
                len: lent.len,
                _pad0: 0,
            });
        }
        Ok(())
    })
}

/// A view of the loan `rank` lent this rank as `*lent` (from a record of a typed channel), as
/// from `shmbroker_recv_loan`: `*data` and `*len` are its bytes until `*out` is freed with
/// `shmbroker_loan_view_free`. View each reference once. Threads: as [`shmbroker_barrier`].
///
/// Errors: `SHMBROKER_E_PROTOCOL` naming `rank` for a reference outside its outbox;
/// `SHMBROKER_E_MISUSE` for a NULL argument.
///
/// # Safety
///
/// `s` is null or a live session; `lent` is null or readable; `out`, `data` and `len` as for
/// `shmbroker_recv_loan`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_view_loan_ref(
    s: *mut shmbroker_session,
    rank: u32,
    lent: *const shmbroker_loan_ref,
    out: *mut *mut shmbroker_loan_view,
    data: *mut *const c_void,
    len: *mut usize,
) -> c_int {
    guard("shmbroker_view_loan_ref", || {
        // SAFETY: the three are null or writable, per the contract.
        unsafe { clear(out, data, len) }?;
        // SAFETY: null or readable, per the contract.
        let lent = unsafe { lent.as_ref() }.ok_or_else(|| misuse("lent is NULL"))?;
        let payload = shmbroker::bindings::PayloadRef {
            offset: lent.offset,
            len: lent.len,
            _pad0: 0,
        };
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let view = entered
            .handle
            .sender
            .session()
            .view_loan_ref(rank, payload)?;
        // SAFETY: all three checked non-null above, writable per the contract.
        unsafe { give_view(view, out, data, len) };
        Ok(())
    })
}

/// Frees `view` (NULL: nothing), which gives the buffer back to its owner with the session's
/// next call. Any thread.
///
/// # Safety
///
/// `view` is null or a view `shmbroker_recv_loan` or `shmbroker_broadcast_loan` made and
/// nothing has freed; its bytes are not read after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_loan_view_free(view: *mut shmbroker_loan_view) {
    if view.is_null() {
        return;
    }
    // SAFETY: per the contract, a pointer from Box::into_raw that nothing has taken back.
    drop(unsafe { Box::from_raw(view) });
}

/// Checks a view's out-pointers and sets them to NULL and 0, what a failed call leaves.
///
/// # Safety
///
/// Each is null or writable.
unsafe fn clear(
    out: *mut *mut shmbroker_loan_view,
    data: *mut *const c_void,
    len: *mut usize,
) -> Result<(), crate::error::Failure> {
    if out.is_null() || data.is_null() || len.is_null() {
        return Err(misuse("out, data or len is NULL"));
    }
    // SAFETY: non-null (checked above), writable per the contract.
    unsafe { out.write(std::ptr::null_mut()) };
    // SAFETY: as above.
    unsafe { data.write(std::ptr::null()) };
    // SAFETY: as above.
    unsafe { len.write(0) };
    Ok(())
}

/// The loan behind `loan`, taken back from C (None for NULL).
///
/// # Safety
///
/// `loan` is null or a pointer `shmbroker_loan_create` made that nothing has taken back.
unsafe fn take(loan: *mut shmbroker_loan) -> Option<Box<shmbroker_loan>> {
    // SAFETY: per the contract, a pointer from Box::into_raw, taken back once.
    (!loan.is_null()).then(|| unsafe { Box::from_raw(loan) })
}

/// Hands `view` to C: the handle in `*out`, its bytes in `*data` and `*len`.
///
/// # Safety
///
/// `out`, `data` and `len` are non-null and writable.
unsafe fn give_view(
    view: LoanView,
    out: *mut *mut shmbroker_loan_view,
    data: *mut *const c_void,
    len: *mut usize,
) {
    let (start, bytes) = (view.as_ptr().cast::<c_void>(), view.len());
    let handle = Box::into_raw(Box::new(shmbroker_loan_view { _view: view }));
    // SAFETY: non-null and writable, per the contract.
    unsafe { data.write(start) };
    // SAFETY: non-null and writable, per the contract.
    unsafe { len.write(bytes) };
    // SAFETY: non-null and writable, per the contract.
    unsafe { out.write(handle) };
}
