//! Groups of ranks: made by every member (`shmbroker_group_create`) or by the survivors of a
//! death (`shmbroker_shrink`), and passed to the `shmbroker_group_*` collectives, which run among
//! the members with the group's own rank numbering.

use crate::error::{guard, misuse};
use crate::handle::{enter, shmbroker_session};
use shmbroker::session::Group;
use std::ffi::c_int;

/// A group of ranks: opaque, made by `shmbroker_group_create` or `shmbroker_shrink`, freed by
/// `shmbroker_group_free`. It belongs to the session that made it, and does not keep that
/// session alive: free it first. Read-only once made, so any thread may use it.
#[derive(Debug)]
pub struct shmbroker_group {
    pub(crate) group: Group,
}

/// The group `g` points at; `None` for NULL (the whole world).
///
/// # Safety
///
/// `g` is null or a live group.
pub(crate) unsafe fn group_of<'a>(g: *const shmbroker_group) -> Option<&'a Group> {
    // SAFETY: null or a live group, per the contract.
    unsafe { g.as_ref() }.map(|handle| &handle.group)
}

/// Stores `group` in `*out`.
///
/// # Safety
///
/// `out` is a writable `shmbroker_group *` (checked not null by the caller).
unsafe fn give(out: *mut *mut shmbroker_group, group: Group) {
    let handle = Box::into_raw(Box::new(shmbroker_group { group }));
    // SAFETY: not null (checked by the caller) and writable, per the contract.
    unsafe { out.write(handle) };
}

/// Makes a group of the `n` world ranks at `ranks` (their order numbers them in the group) and
/// stores it in `*out`. Every member calls it with the same ranks; other ranks do not. A member
/// that passed other ranks is named (`SHMBROKER_E_PROTOCOL`, `shmbroker_last_error_rank`).
/// Making a group is an agreement: every member gets the group, or every member gets the same
/// error (a member that died meanwhile: `SHMBROKER_E_PEER_LOST`, naming it). A member's
/// replacement that has rejoined is taken on first; `shmbroker_regroup` also waits for one.
/// Threads: as `shmbroker_barrier`.
///
/// # Safety
///
/// `s` is null or a live session; `ranks` has `n` readable entries; `out` is a writable
/// `shmbroker_group *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_group_create(
    s: *mut shmbroker_session,
    ranks: *const u32,
    n: usize,
    out: *mut *mut shmbroker_group,
) -> c_int {
    guard("shmbroker_group_create", || {
        if out.is_null() || ranks.is_null() {
            return Err(misuse("ranks and out must not be NULL"));
        }
        // SAFETY: `n` readable ranks, per the contract (not null, checked above).
        let ranks = unsafe { std::slice::from_raw_parts(ranks, n) };
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let group = entered.handle.sender.session().group(ranks)?;
        // SAFETY: `out` is writable, per the contract, and not null.
        unsafe { give(out, group) };
        Ok(())
    })
}

/// After deaths: waits until every one of the `n` world ranks at `ranks` is alive (a dead one
/// replaced, as `shmbroker_wait_for_rank`), makes their group by agreement and stores it in
/// `*out`, trying again through deaths and rejoins that happen meanwhile, up to `timeout_ms`
/// milliseconds (`SHMBROKER_TIMEOUT_FOREVER`: no deadline). Every member calls it, replacements
/// included; it replaces the loop of `shmbroker_wait_for_rank` and `shmbroker_group_create`
/// retried on `SHMBROKER_E_PEER_LOST`. Errors: `SHMBROKER_E_TIMEOUT` naming a member still dead,
/// or not calling it, at the deadline; `SHMBROKER_E_PEER_LEFT` for a member that left (nobody
/// replaces it); `SHMBROKER_E_BROKER_LOST`; and as for `shmbroker_group_create`. Threads: as
/// `shmbroker_barrier`.
///
/// # Safety
///
/// `s` is null or a live session; `ranks` has `n` readable entries; `out` is a writable
/// `shmbroker_group *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_regroup(
    s: *mut shmbroker_session,
    ranks: *const u32,
    n: usize,
    timeout_ms: u64,
    out: *mut *mut shmbroker_group,
) -> c_int {
    guard("shmbroker_regroup", || {
        if out.is_null() || ranks.is_null() {
            return Err(misuse("ranks and out must not be NULL"));
        }
        let timeout = crate::session::timeout_of(timeout_ms)?;
        // SAFETY: `n` readable ranks, per the contract (not null, checked above).
        let ranks = unsafe { std::slice::from_raw_parts(ranks, n) };
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let group = entered.handle.sender.session().regroup(ranks, timeout)?;
        // SAFETY: `out` is writable, per the contract, and not null.
        unsafe { give(out, group) };
        Ok(())
    })
}

/// After a death: the group of every rank still there, agreed on by every survivor that calls
/// it, stored in `*out`. A live rank that does not call it is named by `SHMBROKER_E_TIMEOUT`;
/// `SHMBROKER_E_PEER_LOST` names a rank that died after the survivors agreed: call it again.
/// Threads: as `shmbroker_barrier`.
///
/// # Safety
///
/// `s` is null or a live session; `out` is a writable `shmbroker_group *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_shrink(
    s: *mut shmbroker_session,
    out: *mut *mut shmbroker_group,
) -> c_int {
    guard("shmbroker_shrink", || {
        if out.is_null() {
            return Err(misuse("out must not be NULL"));
        }
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let group = entered.handle.sender.session().shrink()?;
        // SAFETY: `out` is writable, per the contract, and not null.
        unsafe { give(out, group) };
        Ok(())
    })
}

/// This rank's rank in group `g` (`UINT32_MAX` for NULL). Threads: any, at any time (a group
/// does not change once made).
///
/// # Safety
///
/// `g` is null or a live group.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_group_rank(g: *const shmbroker_group) -> u32 {
    // SAFETY: null or a live group, per the contract.
    unsafe { group_of(g) }.map_or(u32::MAX, Group::rank)
}

/// The number of ranks in group `g` (0 for NULL). Threads: any.
///
/// # Safety
///
/// `g` is null or a live group.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_group_size(g: *const shmbroker_group) -> u32 {
    // SAFETY: null or a live group, per the contract.
    unsafe { group_of(g) }.map_or(0, Group::size)
}

/// The world rank of rank `rank` of group `g`, or -1 when there is none. Threads: any.
///
/// # Safety
///
/// `g` is null or a live group.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_group_world_rank(g: *const shmbroker_group, rank: u32) -> i64 {
    // SAFETY: null or a live group, per the contract.
    unsafe { group_of(g) }
        .and_then(|group| group.world_rank(rank))
        .map_or(-1, i64::from)
}

/// Frees group `g` (nothing for NULL). Threads: once no call on any thread uses `g`.
///
/// # Safety
///
/// `g` is null or a group no call is using, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_group_free(g: *mut shmbroker_group) {
    if !g.is_null() {
        // SAFETY: made by Box::into_raw in `give`, freed once, per the contract.
        drop(unsafe { Box::from_raw(g) });
    }
}

/// Runs `$call` with `$c` the session of the entered call `$entered`, or its view through the
/// group `$group` (`Option<&Group>`; `None` for the whole world): the methods share their names.
macro_rules! on_comm {
    ($entered:expr, $group:expr, |$c:ident| $call:expr) => {{
        let mut session = $entered.handle.sender.session();
        match $group {
            None => {
                let $c = &mut *session;
                $call
            }
            Some(group) => {
                let mut view = session.on(group);
                let $c = &mut view;
                $call
            }
        }
    }};
}
pub(crate) use on_comm;

/// This rank's rank and the number of ranks: in the group, or in the world for `None`.
pub(crate) fn rank_and_size(handle: &shmbroker_session, group: Option<&Group>) -> (u32, u32) {
    group.map_or_else(
        || (handle.sender.rank(), handle.sender.world_size()),
        |group| (group.rank(), group.size()),
    )
}
