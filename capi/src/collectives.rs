//! Collectives on the sending half: barrier, all-gather, broadcast and gather, on the whole
//! world (`shmbroker_X`) or among a group's members (`shmbroker_group_X`, the same call with a
//! group after the session: ranks, roots and sizes are then the group's).

use crate::SHMBROKER_E_PROTOCOL;
use crate::buffer::{bytes, bytes_mut};
use crate::error::{Failure, guard, misuse};
use crate::groups::{group_of, on_comm, rank_and_size, shmbroker_group};
use crate::handle::{enter, shmbroker_session};
use shmbroker::Collectives;
use std::ffi::{c_int, c_void};

/// The most ranks a world broadcast's root serves without holding the session while it waits
/// for a slow rank's room (see [`shmbroker_broadcast`]); a larger world's goes down a tree.
pub const SHMBROKER_FLAT_BROADCAST_MAX: u32 = 8;
const _: () = assert!(SHMBROKER_FLAT_BROADCAST_MAX == shmbroker::session::FLAT_BROADCAST_MAX);

/// Waits until every rank has called it. Threads: one collective or send at a time; the
/// collective holds the session while it waits, so a receive on another thread waits for it.
///
/// # Safety
///
/// `s` is null or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_barrier(s: *mut shmbroker_session) -> c_int {
    // SAFETY: as this function's contract; a null group is the world.
    unsafe { barrier("shmbroker_barrier", s, std::ptr::null()) }
}

/// [`shmbroker_barrier`] with a deadline of its own: `timeout_ms` milliseconds, or
/// `SHMBROKER_TIMEOUT_FOREVER` for none, instead of the session's (see
/// `shmbroker_set_timeout` for every other collective). Errors: as [`shmbroker_barrier`], and
/// `SHMBROKER_E_MISUSE` for a `timeout_ms` of 0. Threads: as [`shmbroker_barrier`].
///
/// # Safety
///
/// `s` is null or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_barrier_timeout(
    s: *mut shmbroker_session,
    timeout_ms: u64,
) -> c_int {
    guard("shmbroker_barrier_timeout", || {
        let timeout = crate::session::timeout_of(timeout_ms)?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        Ok(entered
            .handle
            .sender
            .session()
            .with_timeout(timeout)
            .barrier()?)
    })
}

/// As `shmbroker_barrier`, among the members of group `g` (NULL: the world).
///
/// # Safety
///
/// `s` is null or a live session; `g` is null or a live group of `s`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_group_barrier(
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
) -> c_int {
    // SAFETY: as this function's contract.
    unsafe { barrier("shmbroker_group_barrier", s, g) }
}

/// The body of `shmbroker_barrier` and `shmbroker_group_barrier`, whose errors say which one
/// the caller called.
///
/// # Safety
///
/// As for `shmbroker_group_barrier`.
unsafe fn barrier(name: &str, s: *mut shmbroker_session, g: *const shmbroker_group) -> c_int {
    guard(name, || {
        // SAFETY: null or a live group, per the contract.
        let group = unsafe { group_of(g) };
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        Ok(on_comm!(entered, group, |c| c.barrier())?)
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
    // SAFETY: as this function's contract; a null group is the world.
    unsafe { all_gather("shmbroker_all_gather", s, std::ptr::null(), data, len, out) }
}

/// As `shmbroker_all_gather`, among the members of group `g` (NULL: the world): `out` holds
/// `len` bytes per member, in group rank order.
///
/// # Safety
///
/// As for `shmbroker_all_gather` with the group's size; `g` is null or a live group of `s`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_group_all_gather(
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    data: *const c_void,
    len: usize,
    out: *mut c_void,
) -> c_int {
    // SAFETY: as this function's contract.
    unsafe { all_gather("shmbroker_group_all_gather", s, g, data, len, out) }
}

/// The body of `shmbroker_all_gather` and `shmbroker_group_all_gather`, whose errors say which one
/// the caller called.
///
/// # Safety
///
/// As for `shmbroker_group_all_gather`.
unsafe fn all_gather(
    name: &str,
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    data: *const c_void,
    len: usize,
    out: *mut c_void,
) -> c_int {
    guard(name, || {
        // SAFETY: null or a live group, per the contract.
        let group = unsafe { group_of(g) };
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let (_, size) = rank_and_size(entered.handle, group);
        let total = len
            .checked_mul(size as usize)
            .ok_or_else(|| misuse(format!("len {len} times the number of ranks overflows")))?;
        // SAFETY: `len` readable bytes at `data`, per the contract.
        let data = unsafe { bytes(data, len, "data") }?;
        // SAFETY: `len * size` writable bytes at `out`, per the contract.
        let out = unsafe { bytes_mut(out, total, "out") }?;
        Ok(on_comm!(entered, group, |c| c.all_gather_into(data, out))?)
    })
}

/// `root`'s `len` bytes into every rank's `buf`: the root's `buf` is what is sent, every other
/// rank's is filled. Every rank passes the same `len`. Threads: as [`shmbroker_barrier`], but
/// the root of a world of up to `SHMBROKER_FLAT_BROADCAST_MAX` ranks waits for a slow rank's
/// room as a send does, holding nothing a receive on another thread needs.
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
    // SAFETY: as this function's contract; a null group is the world.
    unsafe { broadcast("shmbroker_broadcast", s, std::ptr::null(), root, buf, len) }
}

/// As `shmbroker_broadcast`, among the members of group `g` (NULL: the world); `root` is a
/// group rank.
///
/// # Safety
///
/// As for `shmbroker_broadcast`; `g` is null or a live group of `s`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_group_broadcast(
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    root: u32,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    // SAFETY: as this function's contract.
    unsafe { broadcast("shmbroker_group_broadcast", s, g, root, buf, len) }
}

/// The body of `shmbroker_broadcast` and `shmbroker_group_broadcast`, whose errors say which one
/// the caller called.
///
/// # Safety
///
/// As for `shmbroker_group_broadcast`.
unsafe fn broadcast(
    name: &str,
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    root: u32,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    guard(name, || {
        // SAFETY: null or a live group, per the contract.
        let group = unsafe { group_of(g) };
        // SAFETY: `len` bytes at `buf`, writable, per the contract.
        let buf = unsafe { bytes_mut(buf, len, "buf") }?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let (rank, _) = rank_and_size(entered.handle, group);
        if rank == root {
            // The world's root waits for slow ranks' room without holding the session, so a
            // receive on another thread goes on (see `Sender::broadcast`).
            match group {
                None => entered.handle.sender.broadcast(buf)?,
                Some(_) => drop(on_comm!(entered, group, |c| c.broadcast(root, Some(&*buf)))?),
            }
            return Ok(());
        }
        let received = on_comm!(entered, group, |c| c.broadcast(root, None))?;
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
    // SAFETY: as this function's contract; a null group is the world.
    unsafe {
        gather(
            "shmbroker_gather",
            s,
            std::ptr::null(),
            root,
            data,
            len,
            out,
        )
    }
}

/// As `shmbroker_gather`, among the members of group `g` (NULL: the world); `root` is a group
/// rank and the root's `out` holds `len` bytes per member.
///
/// # Safety
///
/// As for `shmbroker_gather` with the group's size; `g` is null or a live group of `s`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_group_gather(
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    root: u32,
    data: *const c_void,
    len: usize,
    out: *mut c_void,
) -> c_int {
    // SAFETY: as this function's contract.
    unsafe { gather("shmbroker_group_gather", s, g, root, data, len, out) }
}

/// The body of `shmbroker_gather` and `shmbroker_group_gather`, whose errors say which one
/// the caller called.
///
/// # Safety
///
/// As for `shmbroker_group_gather`.
unsafe fn gather(
    name: &str,
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    root: u32,
    data: *const c_void,
    len: usize,
    out: *mut c_void,
) -> c_int {
    guard(name, || {
        // SAFETY: null or a live group, per the contract.
        let group = unsafe { group_of(g) };
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        // SAFETY: `len` readable bytes at `data`, per the contract.
        let data = unsafe { bytes(data, len, "data") }?;
        let (rank, size) = rank_and_size(entered.handle, group);
        let out = if rank == root {
            let total = len
                .checked_mul(size as usize)
                .ok_or_else(|| misuse(format!("len {len} times the number of ranks overflows")))?;
            // SAFETY: on the root, `len * size` writable bytes at `out`, per the contract.
            Some(unsafe { bytes_mut(out, total, "out") }?)
        } else {
            None
        };
        let parts = on_comm!(entered, group, |c| c.gather(root, data))?;
        if let (Some(out), Some(parts)) = (out, parts) {
            for (from, part) in (0u32..).zip(&parts) {
                if part.len() != len {
                    let peer = group.map_or(Some(from), |group| group.world_rank(from));
                    return Err(Failure(
                        SHMBROKER_E_PROTOCOL,
                        format!(
                            "rank {} gave {} bytes; this root expected {len} (every rank \
                             passes the same len)",
                            peer.unwrap_or(from),
                            part.len()
                        ),
                        peer,
                    ));
                }
                let at = from as usize * len;
                out[at..at + len].copy_from_slice(part);
            }
        }
        Ok(())
    })
}
