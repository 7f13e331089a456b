//! Collectives on the sending half: barrier, all-gather, broadcast and gather.

use crate::SHMBROKER_E_PROTOCOL;
use crate::buffer::{bytes, bytes_mut};
use crate::error::{Failure, guard, misuse};
use crate::handle::{enter, shmbroker_session};
use std::ffi::{c_int, c_void};

/// Waits until every rank has called it. Threads: as a send (one collective or send at a time;
/// a receive on another thread goes on).
///
/// # Safety
///
/// `s` is null or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_barrier(s: *mut shmbroker_session) -> c_int {
    guard("shmbroker_barrier", || {
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        Ok(entered.handle.sender.session().barrier()?)
    })
}

/// Every rank's `len` bytes, in rank order, into `out` (`len * world_size` bytes). Every rank
/// passes the same `len`. Threads: as [`shmbroker_barrier`].
///
/// # Safety
///
/// `s` is null or a live session; `data` has `len` readable bytes and `out` `len * world_size`
/// writable ones (either may be null when its length is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_all_gather(
    s: *mut shmbroker_session,
    data: *const c_void,
    len: usize,
    out: *mut c_void,
) -> c_int {
    guard("shmbroker_all_gather", || {
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let total = len
            .checked_mul(entered.handle.sender.world_size() as usize)
            .ok_or_else(|| misuse(format!("len {len} times the world size overflows")))?;
        // SAFETY: `len` readable bytes at `data`, per the contract.
        let data = unsafe { bytes(data, len, "data") }?;
        // SAFETY: `len * world_size` writable bytes at `out`, per the contract.
        let out = unsafe { bytes_mut(out, total, "out") }?;
        Ok(entered.handle.sender.session().all_gather_into(data, out)?)
    })
}

/// `root`'s `len` bytes into every rank's `buf`: the root's `buf` is what is sent, every other
/// rank's is filled. Every rank passes the same `len`. Threads: as [`shmbroker_barrier`].
///
/// # Safety
///
/// `s` is null or a live session; `buf` has `len` bytes (readable on the root, writable
/// elsewhere).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_broadcast(
    s: *mut shmbroker_session,
    root: u32,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    guard("shmbroker_broadcast", || {
        // SAFETY: `len` bytes at `buf`, writable, per the contract.
        let buf = unsafe { bytes_mut(buf, len, "buf") }?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let mut session = entered.handle.sender.session();
        if session.rank() == root {
            session.broadcast(root, Some(&*buf))?;
            return Ok(());
        }
        let received = session.broadcast(root, None)?;
        if received.len() != len {
            return Err(misuse(format!(
                "rank {root} broadcast {} bytes; this rank's buffer holds {len} (every rank \
                 passes the same len)",
                received.len()
            )));
        }
        buf.copy_from_slice(&received);
        Ok(())
    })
}

/// Every rank's `len` bytes, in rank order, into the root's `out` (`len * world_size` bytes;
/// ignored, and may be NULL, on other ranks). Every rank passes the same `len`: a part of
/// another size is `SHMBROKER_E_PROTOCOL` naming its rank. Threads: as [`shmbroker_barrier`].
///
/// # Safety
///
/// `s` is null or a live session; `data` has `len` readable bytes; on the root `out` has
/// `len * world_size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_gather(
    s: *mut shmbroker_session,
    root: u32,
    data: *const c_void,
    len: usize,
    out: *mut c_void,
) -> c_int {
    guard("shmbroker_gather", || {
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        // SAFETY: `len` readable bytes at `data`, per the contract.
        let data = unsafe { bytes(data, len, "data") }?;
        let rank = entered.handle.sender.rank();
        let out = if rank == root {
            let total = len
                .checked_mul(entered.handle.sender.world_size() as usize)
                .ok_or_else(|| misuse(format!("len {len} times the world size overflows")))?;
            // SAFETY: on the root, `len * world_size` writable bytes at `out`, per the contract.
            Some(unsafe { bytes_mut(out, total, "out") }?)
        } else {
            None
        };
        let parts = entered.handle.sender.session().gather(root, data)?;
        if let (Some(out), Some(parts)) = (out, parts) {
            for (peer, part) in (0u32..).zip(&parts) {
                if part.len() != len {
                    return Err(Failure(
                        SHMBROKER_E_PROTOCOL,
                        format!(
                            "rank {peer} gave {} bytes; this root expected {len} (every rank \
                             passes the same len)",
                            part.len()
                        ),
                        Some(peer),
                    ));
                }
                let at = peer as usize * len;
                out[at..at + len].copy_from_slice(part);
            }
        }
        Ok(())
    })
}
