//! Typed channels: a dedicated ring of fixed-size records from one rank to another (see the
//! Rust `channel` module). Records are `record_bytes` each (1 to 4096), passed as `void *`; both
//! ends declare the same size and type tag. An end is an object of its own, used by one thread
//! at a time (a second thread's call returns `SHMBROKER_E_BUSY`), freed once, before or after
//! its session is closed.

use crate::error::{Failure, guard, misuse};
use crate::handle::{enter, shmbroker_session};
#[cfg(doc)]
use crate::shmbroker_barrier;
use crate::{SHMBROKER_E_AGAIN, SHMBROKER_E_BUSY};
use shmbroker::session::{RawChannelReceiver, RawChannelSender};
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// The sending end of a typed channel (`shmbroker_channel_to`): opaque; freed with
/// `shmbroker_channel_tx_free`, which closes the channel.
#[derive(Debug)]
pub struct shmbroker_channel_tx {
    end: Mutex<RawChannelSender>,
}

/// The receiving end of a typed channel (`shmbroker_channel_from`): opaque; freed with
/// `shmbroker_channel_rx_free`, which closes the channel.
#[derive(Debug)]
pub struct shmbroker_channel_rx {
    end: Mutex<RawChannelReceiver>,
}

/// The end behind `end`, or `SHMBROKER_E_BUSY` while another thread is in a call on it.
fn lock<'a, T>(end: Option<&'a Mutex<T>>) -> Result<MutexGuard<'a, T>, Failure> {
    let end = end.ok_or_else(|| misuse("the channel end is NULL"))?;
    match end.try_lock() {
        Ok(end) => Ok(end),
        Err(TryLockError::Poisoned(poisoned)) => Ok(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => Err(Failure(
            SHMBROKER_E_BUSY,
            "another thread is in a call on this channel end (one at a time)".into(),
            None,
        )),
    }
}

/// "Nothing now": `SHMBROKER_E_AGAIN`.
fn again(what: &str) -> Failure {
    Failure(SHMBROKER_E_AGAIN, what.into(), None)
}

/// Makes a channel of records of `record_bytes` bytes (1 to 4096) from this rank to `peer`,
/// holding `capacity` of them (a power of two from 2 to 2^20): the broker makes its ring and
/// passes it to both ends. `peer` calls `shmbroker_channel_from` with the same `tag` and
/// `record_bytes`. Calls on the end that wait have the session's deadline as it is now.
/// Threads: as [`shmbroker_barrier`].
///
/// Errors: `SHMBROKER_E_MISUSE` for a bad size, capacity or peer; `SHMBROKER_E_IO` when the
/// broker made no ring (`peer` is not logged on, or holds as many fds it has not taken as it
/// may); `SHMBROKER_E_TIMEOUT`; `SHMBROKER_E_BROKER_LOST`.
///
/// # Safety
///
/// `s` is null or a live session; `out` points at a writable `shmbroker_channel_tx *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_channel_to(
    s: *mut shmbroker_session,
    peer: u32,
    tag: u64,
    record_bytes: usize,
    capacity: usize,
    out: *mut *mut shmbroker_channel_tx,
) -> c_int {
    guard("shmbroker_channel_to", || {
        if out.is_null() {
            return Err(misuse("out is NULL"));
        }
        // SAFETY: checked non-null above, writable per the contract: NULL until it succeeds.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let end =
            entered
                .handle
                .sender
                .session()
                .raw_channel_to(peer, tag, record_bytes, capacity)?;
        let end = Box::into_raw(Box::new(shmbroker_channel_tx {
            end: Mutex::new(end),
        }));
        // SAFETY: checked non-null above; writable per the contract.
        unsafe { out.write(end) };
        Ok(())
    })
}

/// The channel `peer` makes to this rank with `shmbroker_channel_to`, its next one: waits for
/// it within the session's deadline, then checks that `peer`'s tag and record size are `tag`
/// and `record_bytes`. Threads: as [`shmbroker_barrier`].
///
/// Errors: `SHMBROKER_E_MISUSE` when they are not (the message says what each end has; the
/// channel is closed, and `peer`'s next call on it fails too) or for a bad size or peer;
/// `SHMBROKER_E_TIMEOUT`; `peer`'s departure; `SHMBROKER_E_BROKER_LOST`.
///
/// # Safety
///
/// `s` is null or a live session; `out` points at a writable `shmbroker_channel_rx *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_channel_from(
    s: *mut shmbroker_session,
    peer: u32,
    tag: u64,
    record_bytes: usize,
    out: *mut *mut shmbroker_channel_rx,
) -> c_int {
    guard("shmbroker_channel_from", || {
        if out.is_null() {
            return Err(misuse("out is NULL"));
        }
        // SAFETY: checked non-null above, writable per the contract: NULL until it succeeds.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let end = entered
            .handle
            .sender
            .session()
            .raw_channel_from(peer, tag, record_bytes)?;
        let end = Box::into_raw(Box::new(shmbroker_channel_rx {
            end: Mutex::new(end),
        }));
        // SAFETY: checked non-null above; writable per the contract.
        unsafe { out.write(end) };
        Ok(())
    })
}

/// Sends `count` records from `records` (`count * record_bytes` bytes), waiting for room as
/// it needs within the deadline. Threads: one call at a time on an end (another thread's
/// returns `SHMBROKER_E_BUSY`); the session's calls go on beside it. Errors:
/// `SHMBROKER_E_CLOSED` once the consumer closed the channel; the consumer's departure
/// (`SHMBROKER_E_PEER_LOST`, ...); `SHMBROKER_E_TIMEOUT`; `SHMBROKER_E_INTERRUPTED`; the
/// records before the one that failed went.
///
/// # Safety
///
/// `tx` is null or a live end; `records` has `count * record_bytes` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_channel_send_batch(
    tx: *mut shmbroker_channel_tx,
    records: *const c_void,
    count: usize,
) -> c_int {
    guard("shmbroker_channel_send_batch", || {
        // SAFETY: null or a live end, per the contract.
        let mut end = lock(unsafe { tx.as_ref() }.map(|tx| &tx.end))?;
        let len = count
            .checked_mul(end.record_bytes())
            .ok_or_else(|| misuse(format!("{count} records overflow the address space")))?;
        // SAFETY: `len` readable bytes, per the contract.
        let records = unsafe { crate::buffer::bytes(records, len, "records") }?;
        Ok(end.send_batch(records)?)
    })
}

/// Sends one record (`record_bytes` bytes at `record`), waiting for room within the deadline.
/// Threads: as [`shmbroker_channel_send_batch`].
/// Errors: as [`shmbroker_channel_send_batch`].
///
/// # Safety
///
/// As for [`shmbroker_channel_send_batch`], with `count` 1.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_channel_send(
    tx: *mut shmbroker_channel_tx,
    record: *const c_void,
) -> c_int {
    // SAFETY: as this function's contract.
    unsafe { shmbroker_channel_send_batch(tx, record, 1) }
}

/// Sends as many of `count` records as the ring has room for now, without waiting: `*sent`
/// says how many (0 to `count`). Threads: as [`shmbroker_channel_send_batch`]. Errors: as
/// [`shmbroker_channel_send_batch`], less the timeout.
///
/// # Safety
///
/// As for [`shmbroker_channel_send_batch`]; `sent` points at a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_channel_try_send_batch(
    tx: *mut shmbroker_channel_tx,
    records: *const c_void,
    count: usize,
    sent: *mut usize,
) -> c_int {
    guard("shmbroker_channel_try_send_batch", || {
        if sent.is_null() {
            return Err(misuse("sent is NULL"));
        }
        // SAFETY: checked non-null above, writable per the contract.
        unsafe { sent.write(0) };
        // SAFETY: null or a live end, per the contract.
        let mut end = lock(unsafe { tx.as_ref() }.map(|tx| &tx.end))?;
        let len = count
            .checked_mul(end.record_bytes())
            .ok_or_else(|| misuse(format!("{count} records overflow the address space")))?;
        // SAFETY: `len` readable bytes, per the contract.
        let records = unsafe { crate::buffer::bytes(records, len, "records") }?;
        let went = end.try_send_batch(records)?;
        // SAFETY: checked non-null above, writable per the contract.
        unsafe { sent.write(went) };
        Ok(())
    })
}

/// Sends one record if the ring has room now; `SHMBROKER_E_AGAIN` if not. Threads: as
/// [`shmbroker_channel_send_batch`]. Errors: as
/// [`shmbroker_channel_try_send_batch`].
///
/// # Safety
///
/// As for [`shmbroker_channel_send`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_channel_try_send(
    tx: *mut shmbroker_channel_tx,
    record: *const c_void,
) -> c_int {
    guard("shmbroker_channel_try_send", || {
        // SAFETY: null or a live end, per the contract.
        let mut end = lock(unsafe { tx.as_ref() }.map(|tx| &tx.end))?;
        let len = end.record_bytes();
        // SAFETY: `len` readable bytes, per the contract.
        let record = unsafe { crate::buffer::bytes(record, len, "record") }?;
        if end.try_send(record)? {
            Ok(())
        } else {
            Err(again("the channel's ring is full"))
        }
    })
}

/// Receives into `records` (room for `max` records) those that have arrived, waiting for the
/// first within the deadline: `*received` says how many (1 to `max`). Threads: as
/// [`shmbroker_channel_send_batch`]. Errors:
/// `SHMBROKER_E_CLOSED` once the producer closed the channel and everything it sent was
/// received; the producer's departure once everything it sent was received;
/// `SHMBROKER_E_TIMEOUT`; `SHMBROKER_E_INTERRUPTED`.
///
/// # Safety
///
/// `rx` is null or a live end; `records` has `max * record_bytes` writable bytes; `received`
/// points at a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_channel_recv_batch(
    rx: *mut shmbroker_channel_rx,
    records: *mut c_void,
    max: usize,
    received: *mut usize,
) -> c_int {
    guard("shmbroker_channel_recv_batch", || {
        // SAFETY: as this function's contract.
        unsafe { receive(rx, records, max, received, true) }
    })
}

/// [`shmbroker_channel_recv_batch`] without waiting: `*received` may be 0. Threads: as
/// [`shmbroker_channel_send_batch`].
///
/// # Safety
///
/// As for [`shmbroker_channel_recv_batch`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_channel_try_recv_batch(
    rx: *mut shmbroker_channel_rx,
    records: *mut c_void,
    max: usize,
    received: *mut usize,
) -> c_int {
    guard("shmbroker_channel_try_recv_batch", || {
        // SAFETY: as this function's contract.
        unsafe { receive(rx, records, max, received, false) }
    })
}

/// Receives one record into `record` (`record_bytes` writable bytes), waiting for it within
/// the deadline. Threads: as [`shmbroker_channel_send_batch`]. Errors: as
/// [`shmbroker_channel_recv_batch`].
///
/// # Safety
///
/// `rx` is null or a live end; `record` has `record_bytes` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_channel_recv(
    rx: *mut shmbroker_channel_rx,
    record: *mut c_void,
) -> c_int {
    let mut received = 0;
    // SAFETY: as this function's contract, with room for one record.
    unsafe { shmbroker_channel_recv_batch(rx, record, 1, &raw mut received) }
}

/// Receives one record if one has arrived; `SHMBROKER_E_AGAIN` if none. Threads: as
/// [`shmbroker_channel_send_batch`]. Errors: as
/// [`shmbroker_channel_recv_batch`], less the timeout.
///
/// # Safety
///
/// As for [`shmbroker_channel_recv`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_channel_try_recv(
    rx: *mut shmbroker_channel_rx,
    record: *mut c_void,
) -> c_int {
    guard("shmbroker_channel_try_recv", || {
        let mut received = 0;
        // SAFETY: as this function's contract, with room for one record.
        unsafe { receive(rx, record, 1, &raw mut received, false) }?;
        if received == 0 {
            return Err(again("nothing has arrived on the channel"));
        }
        Ok(())
    })
}

/// The body of the receives: `wait` for the first record or not.
///
/// # Safety
///
/// As for [`shmbroker_channel_recv_batch`].
unsafe fn receive(
    rx: *mut shmbroker_channel_rx,
    records: *mut c_void,
    max: usize,
    received: *mut usize,
    wait: bool,
) -> Result<(), Failure> {
    if received.is_null() {
        return Err(misuse("received is NULL"));
    }
    // SAFETY: checked non-null above, writable per the contract.
    unsafe { received.write(0) };
    // SAFETY: null or a live end, per the contract.
    let mut end = lock(unsafe { rx.as_ref() }.map(|rx| &rx.end))?;
    let len = max
        .checked_mul(end.record_bytes())
        .ok_or_else(|| misuse(format!("{max} records overflow the address space")))?;
    // SAFETY: `len` writable bytes, per the contract.
    let records = unsafe { crate::buffer::bytes_mut(records, len, "records") }?;
    let got = if wait {
        end.recv_batch(records)?
    } else {
        end.try_recv_batch(records)?
    };
    // SAFETY: checked non-null above, writable per the contract.
    unsafe { received.write(got) };
    Ok(())
}

/// Closes the channel from the sending end and frees it (NULL: nothing): the consumer receives
/// what was sent, then `SHMBROKER_E_CLOSED`. Any thread, with no call on it in progress.
///
/// # Safety
///
/// `tx` is null or an end `shmbroker_channel_to` made that nothing has freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_channel_tx_free(tx: *mut shmbroker_channel_tx) {
    if !tx.is_null() {
        // SAFETY: per the contract, a pointer from Box::into_raw, taken back once.
        drop(unsafe { Box::from_raw(tx) });
    }
}

/// Closes the channel from the receiving end and frees it (NULL: nothing): the producer's next
/// call fails with `SHMBROKER_E_CLOSED`. Any thread, with no call on it in progress.
///
/// # Safety
///
/// `rx` is null or an end `shmbroker_channel_from` made that nothing has freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_channel_rx_free(rx: *mut shmbroker_channel_rx) {
    if !rx.is_null() {
        // SAFETY: per the contract, a pointer from Box::into_raw, taken back once.
        drop(unsafe { Box::from_raw(rx) });
    }
}
