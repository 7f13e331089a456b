//! Reductions, scatter and all-to-all on the sending half, on the whole world (`shmbroker_X`)
//! or among a group's members (`shmbroker_group_X`, the same call with a group after the
//! session: ranks, roots, blocks and counts are then the group's). Element types and operations are
//! numbers: `SHMBROKER_DTYPE_*` and `SHMBROKER_OP_*` (the Rust `DType` and `ReduceOp` in order).

use crate::buffer::{bytes, bytes_mut};
use crate::error::{Failure, guard, misuse};
use crate::groups::{group_of, on_comm, rank_and_size, shmbroker_group};
use crate::handle::{enter, shmbroker_session};
use shmbroker::Collectives;
use shmbroker::{DType, ReduceOp};
use std::ffi::{c_int, c_void};

/// Unsigned 8-bit integers.
pub const SHMBROKER_DTYPE_U8: c_int = 0;
/// Signed 8-bit integers.
pub const SHMBROKER_DTYPE_I8: c_int = 1;
/// Unsigned 16-bit integers.
pub const SHMBROKER_DTYPE_U16: c_int = 2;
/// Signed 16-bit integers.
pub const SHMBROKER_DTYPE_I16: c_int = 3;
/// Unsigned 32-bit integers.
pub const SHMBROKER_DTYPE_U32: c_int = 4;
/// Signed 32-bit integers.
pub const SHMBROKER_DTYPE_I32: c_int = 5;
/// Unsigned 64-bit integers.
pub const SHMBROKER_DTYPE_U64: c_int = 6;
/// Signed 64-bit integers.
pub const SHMBROKER_DTYPE_I64: c_int = 7;
/// IEEE half precision (summed in single precision, rounded once).
pub const SHMBROKER_DTYPE_F16: c_int = 8;
/// bfloat16 (summed in single precision, rounded once).
pub const SHMBROKER_DTYPE_BF16: c_int = 9;
/// `float`.
pub const SHMBROKER_DTYPE_F32: c_int = 10;
/// `double`.
pub const SHMBROKER_DTYPE_F64: c_int = 11;

/// The sum (integers wrap).
pub const SHMBROKER_OP_SUM: c_int = 0;
/// The product (integers wrap).
pub const SHMBROKER_OP_PROD: c_int = 1;
/// The least (NaN if any is NaN).
pub const SHMBROKER_OP_MIN: c_int = 2;
/// The greatest (NaN if any is NaN).
pub const SHMBROKER_OP_MAX: c_int = 3;
/// Bitwise and (integers).
pub const SHMBROKER_OP_BIT_AND: c_int = 4;
/// Bitwise or (integers).
pub const SHMBROKER_OP_BIT_OR: c_int = 5;
/// Bitwise exclusive or (integers).
pub const SHMBROKER_OP_BIT_XOR: c_int = 6;
/// The sum divided by the number of ranks (floats).
pub const SHMBROKER_OP_AVG: c_int = 7;

fn dtype_of(number: c_int) -> Result<DType, Failure> {
    u32::try_from(number)
        .ok()
        .and_then(DType::from_number)
        .ok_or_else(|| misuse(format!("dtype {number} is none of SHMBROKER_DTYPE_*")))
}

fn op_of(number: c_int) -> Result<ReduceOp, Failure> {
    u32::try_from(number)
        .ok()
        .and_then(ReduceOp::from_number)
        .ok_or_else(|| misuse(format!("op {number} is none of SHMBROKER_OP_*")))
}

/// `count` elements of `dtype`, in bytes.
fn size(count: usize, dtype: DType) -> Result<usize, Failure> {
    count
        .checked_mul(dtype.size())
        .ok_or_else(|| misuse(format!("{count} elements of {} overflow", dtype.name())))
}

/// Combines every rank's `count` elements of `dtype` at `data` with `op`, in rank order, into
/// every rank's `data` (in place). Every rank passes the same `count`, `dtype` and `op`; every
/// rank gets the same bits. When `data` is the bytes of a loan this rank holds
/// (`shmbroker_loan_create`), the peers read it where it lies, with no copy in (a symmetric
/// buffer: see `shmbroker_reductions_read_in_place`). Threads: as `shmbroker_barrier`.
///
/// # Safety
///
/// `s` is null or a live session; `data` has `count` elements of `dtype`, aligned for them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_all_reduce(
    s: *mut shmbroker_session,
    data: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
) -> c_int {
    // SAFETY: as this function's contract; a null group is the world.
    unsafe {
        all_reduce(
            "shmbroker_all_reduce",
            s,
            std::ptr::null(),
            data,
            count,
            dtype,
            op,
        )
    }
}

/// As `shmbroker_all_reduce`, among the members of group `g` (NULL: the world).
///
/// # Safety
///
/// As for `shmbroker_all_reduce`; `g` is null or a live group of `s`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_group_all_reduce(
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    data: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
) -> c_int {
    // SAFETY: as this function's contract.
    unsafe { all_reduce("shmbroker_group_all_reduce", s, g, data, count, dtype, op) }
}

/// How many pieces of this session's all-reduces were read by the peers where they lay, with no
/// copy in: those whose `data` was the bytes of a loan (`shmbroker_loan_create`) this rank still
/// holds, a *symmetric buffer*. An all-reduce in one shot (up to 2 KiB, or 128 KiB of all
/// ranks' contributions together) has none; a larger one has one per MiB or part of it. A
/// program checks with it that its buffers are on that path. `*out` gets the count. Threads: as
/// [`shmbroker_barrier`].
///
/// Errors: `SHMBROKER_E_MISUSE` for a NULL session or `out`.
///
/// # Safety
///
/// `s` is null or a live session; `out` is null or points at a writable `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_reductions_read_in_place(
    s: *mut shmbroker_session,
    out: *mut u64,
) -> c_int {
    guard("shmbroker_reductions_read_in_place", || {
        // SAFETY: null or writable, per the contract.
        let out = unsafe { out.as_mut() }.ok_or_else(|| misuse("out is NULL"))?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        *out = entered.handle.sender.session().reductions_read_in_place();
        Ok(())
    })
}

/// The body of `shmbroker_all_reduce` and `shmbroker_group_all_reduce`, whose errors say which one
/// the caller called.
///
/// # Safety
///
/// As for `shmbroker_group_all_reduce`.
unsafe fn all_reduce(
    name: &str,
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    data: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
) -> c_int {
    guard(name, || {
        let (dtype, op) = (dtype_of(dtype)?, op_of(op)?);
        // SAFETY: null or a live group, per the contract.
        let group = unsafe { group_of(g) };
        // SAFETY: `count` elements of `dtype`, writable, at `data`, per the contract.
        let data = unsafe { bytes_mut(data, size(count, dtype)?, "data") }?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        Ok(on_comm!(entered, group, |c| c.all_reduce_bytes(data, dtype, op))?)
    })
}

/// As `shmbroker_all_reduce`, the result into the root's `data` only; the other ranks'
/// `data` is unchanged. Threads: as `shmbroker_barrier`.
///
/// # Safety
///
/// As for `shmbroker_all_reduce`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_reduce(
    s: *mut shmbroker_session,
    root: u32,
    data: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
) -> c_int {
    // SAFETY: as this function's contract; a null group is the world.
    unsafe {
        reduce(
            "shmbroker_reduce",
            s,
            std::ptr::null(),
            root,
            data,
            count,
            dtype,
            op,
        )
    }
}

/// As `shmbroker_reduce`, among the members of group `g` (NULL: the world); `root` is a group
/// rank.
///
/// # Safety
///
/// As for `shmbroker_reduce`; `g` is null or a live group of `s`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_group_reduce(
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    root: u32,
    data: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
) -> c_int {
    // SAFETY: as this function's contract.
    unsafe { reduce("shmbroker_group_reduce", s, g, root, data, count, dtype, op) }
}

/// The body of `shmbroker_reduce` and `shmbroker_group_reduce`, whose errors say which one
/// the caller called.
///
/// # Safety
///
/// As for `shmbroker_group_reduce`.
#[allow(
    clippy::too_many_arguments,
    reason = "the C call's arguments, and its name for errors"
)]
unsafe fn reduce(
    name: &str,
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    root: u32,
    data: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
) -> c_int {
    guard(name, || {
        let (dtype, op) = (dtype_of(dtype)?, op_of(op)?);
        // SAFETY: null or a live group, per the contract.
        let group = unsafe { group_of(g) };
        // SAFETY: `count` elements of `dtype`, writable, at `data`, per the contract.
        let data = unsafe { bytes_mut(data, size(count, dtype)?, "data") }?;
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        Ok(on_comm!(entered, group, |c| c.reduce_bytes(root, data, dtype, op))?)
    })
}

/// Combines every rank's `input` (`world_size` blocks of `count` elements of `dtype`) with `op`,
/// in rank order, and gives rank `r` block `r` of the result in `output` (`count` elements).
/// Threads: as `shmbroker_barrier`.
///
/// # Safety
///
/// `s` is null or a live session; `input` has `count * world_size` elements of `dtype` and
/// `output` `count`, aligned for them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_reduce_scatter(
    s: *mut shmbroker_session,
    input: *const c_void,
    output: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
) -> c_int {
    // SAFETY: as this function's contract; a null group is the world.
    unsafe {
        reduce_scatter(
            "shmbroker_reduce_scatter",
            s,
            std::ptr::null(),
            input,
            output,
            count,
            dtype,
            op,
        )
    }
}

/// As `shmbroker_reduce_scatter`, among the members of group `g` (NULL: the world): `input`
/// holds one block per member.
///
/// # Safety
///
/// As for `shmbroker_reduce_scatter` with the group's size; `g` is null or a live group of `s`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_group_reduce_scatter(
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    input: *const c_void,
    output: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
) -> c_int {
    // SAFETY: as this function's contract.
    unsafe {
        reduce_scatter(
            "shmbroker_group_reduce_scatter",
            s,
            g,
            input,
            output,
            count,
            dtype,
            op,
        )
    }
}

/// The body of `shmbroker_reduce_scatter` and `shmbroker_group_reduce_scatter`, whose errors say
/// which one the caller called.
///
/// # Safety
///
/// As for `shmbroker_group_reduce_scatter`.
#[allow(
    clippy::too_many_arguments,
    reason = "the C call's arguments, and its name for errors"
)]
unsafe fn reduce_scatter(
    name: &str,
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    input: *const c_void,
    output: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
) -> c_int {
    guard(name, || {
        let (dtype, op) = (dtype_of(dtype)?, op_of(op)?);
        // SAFETY: null or a live group, per the contract.
        let group = unsafe { group_of(g) };
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let (_, ranks) = rank_and_size(entered.handle, group);
        let block = size(count, dtype)?;
        let total = block
            .checked_mul(ranks as usize)
            .ok_or_else(|| misuse(format!("{block} bytes times the number of ranks overflow")))?;
        // SAFETY: `count * size` elements at `input`, per the contract.
        let input = unsafe { bytes(input, total, "input") }?;
        // SAFETY: `count` writable elements at `output`, per the contract.
        let output = unsafe { bytes_mut(output, block, "output") }?;
        Ok(on_comm!(entered, group, |c| c
            .reduce_scatter_bytes(input, output, dtype, op))?)
    })
}

/// The root's `input` (`world_size` blocks of `block` bytes; NULL on other ranks) cut into
/// blocks, block `r` into rank `r`'s `output` (`block` bytes). Threads: as `shmbroker_barrier`.
///
/// # Safety
///
/// `s` is null or a live session; on the root `input` has `block * world_size` readable bytes;
/// `output` has `block` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_scatter(
    s: *mut shmbroker_session,
    root: u32,
    input: *const c_void,
    output: *mut c_void,
    block: usize,
) -> c_int {
    // SAFETY: as this function's contract; a null group is the world.
    unsafe {
        scatter(
            "shmbroker_scatter",
            s,
            std::ptr::null(),
            root,
            input,
            output,
            block,
        )
    }
}

/// As `shmbroker_scatter`, among the members of group `g` (NULL: the world); `root` is a group
/// rank and its `input` holds one block per member.
///
/// # Safety
///
/// As for `shmbroker_scatter` with the group's size; `g` is null or a live group of `s`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_group_scatter(
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    root: u32,
    input: *const c_void,
    output: *mut c_void,
    block: usize,
) -> c_int {
    // SAFETY: as this function's contract.
    unsafe { scatter("shmbroker_group_scatter", s, g, root, input, output, block) }
}

/// The body of `shmbroker_scatter` and `shmbroker_group_scatter`, whose errors say which one
/// the caller called.
///
/// # Safety
///
/// As for `shmbroker_group_scatter`.
unsafe fn scatter(
    name: &str,
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    root: u32,
    input: *const c_void,
    output: *mut c_void,
    block: usize,
) -> c_int {
    guard(name, || {
        // SAFETY: null or a live group, per the contract.
        let group = unsafe { group_of(g) };
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let (rank, ranks) = rank_and_size(entered.handle, group);
        let input = if rank == root {
            let total = block.checked_mul(ranks as usize).ok_or_else(|| {
                misuse(format!("{block} bytes times the number of ranks overflow"))
            })?;
            // SAFETY: on the root, `block * size` readable bytes, per the contract.
            Some(unsafe { bytes(input, total, "input") }?)
        } else {
            None
        };
        // SAFETY: `block` writable bytes at `output`, per the contract.
        let output = unsafe { bytes_mut(output, block, "output") }?;
        Ok(on_comm!(entered, group, |c| c.scatter(root, input, output))?)
    })
}

/// Block `q` of `input` to rank `q`, and block `q` of `output` from rank `q`: both hold
/// `world_size` blocks of `block` bytes. Threads: as `shmbroker_barrier`.
///
/// # Safety
///
/// `s` is null or a live session; `input` has `block * world_size` readable bytes and `output`
/// as many writable ones.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_all_to_all(
    s: *mut shmbroker_session,
    input: *const c_void,
    output: *mut c_void,
    block: usize,
) -> c_int {
    // SAFETY: as this function's contract; a null group is the world.
    unsafe {
        all_to_all(
            "shmbroker_all_to_all",
            s,
            std::ptr::null(),
            input,
            output,
            block,
        )
    }
}

/// As `shmbroker_all_to_all`, among the members of group `g` (NULL: the world): one block per
/// member, in group rank order.
///
/// # Safety
///
/// As for `shmbroker_all_to_all` with the group's size; `g` is null or a live group of `s`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_group_all_to_all(
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    input: *const c_void,
    output: *mut c_void,
    block: usize,
) -> c_int {
    // SAFETY: as this function's contract.
    unsafe { all_to_all("shmbroker_group_all_to_all", s, g, input, output, block) }
}

/// The body of `shmbroker_all_to_all` and `shmbroker_group_all_to_all`, whose errors say which one
/// the caller called.
///
/// # Safety
///
/// As for `shmbroker_group_all_to_all`.
unsafe fn all_to_all(
    name: &str,
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    input: *const c_void,
    output: *mut c_void,
    block: usize,
) -> c_int {
    guard(name, || {
        // SAFETY: null or a live group, per the contract.
        let group = unsafe { group_of(g) };
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let (_, ranks) = rank_and_size(entered.handle, group);
        let total = block
            .checked_mul(ranks as usize)
            .ok_or_else(|| misuse(format!("{block} bytes times the number of ranks overflow")))?;
        // SAFETY: `block * size` readable bytes at `input`, per the contract.
        let input = unsafe { bytes(input, total, "input") }?;
        // SAFETY: `block * size` writable bytes at `output`, per the contract.
        let output = unsafe { bytes_mut(output, total, "output") }?;
        Ok(on_comm!(entered, group, |c| c.all_to_all(input, output))?)
    })
}

/// Block `q` of `input` (`send_counts[q]` bytes, in rank order) to rank `q`, and
/// `recv_counts[q]` bytes from rank `q` into `output`, in rank order. Both count arrays have
/// `world_size` entries; a block of another length than expected is `SHMBROKER_E_PROTOCOL`
/// naming its sender. Threads: as `shmbroker_barrier`.
///
/// # Safety
///
/// `s` is null or a live session; `send_counts` and `recv_counts` have `world_size` readable
/// entries; `input` has as many readable bytes as `send_counts` adds up to, `output` as many
/// writable bytes as `recv_counts` adds up to.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_all_to_all_v(
    s: *mut shmbroker_session,
    input: *const c_void,
    send_counts: *const usize,
    output: *mut c_void,
    recv_counts: *const usize,
) -> c_int {
    // SAFETY: as this function's contract; a null group is the world.
    unsafe {
        all_to_all_v(
            "shmbroker_all_to_all_v",
            s,
            std::ptr::null(),
            input,
            send_counts,
            output,
            recv_counts,
        )
    }
}

/// As `shmbroker_all_to_all_v`, among the members of group `g` (NULL: the world): one count
/// per member, in group rank order.
///
/// # Safety
///
/// As for `shmbroker_all_to_all_v` with the group's size; `g` is null or a live group of `s`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmbroker_group_all_to_all_v(
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    input: *const c_void,
    send_counts: *const usize,
    output: *mut c_void,
    recv_counts: *const usize,
) -> c_int {
    // SAFETY: as this function's contract.
    unsafe {
        all_to_all_v(
            "shmbroker_group_all_to_all_v",
            s,
            g,
            input,
            send_counts,
            output,
            recv_counts,
        )
    }
}

/// The body of `shmbroker_all_to_all_v` and `shmbroker_group_all_to_all_v`, whose errors say
/// which one the caller called.
///
/// # Safety
///
/// As for `shmbroker_group_all_to_all_v`.
unsafe fn all_to_all_v(
    name: &str,
    s: *mut shmbroker_session,
    g: *const shmbroker_group,
    input: *const c_void,
    send_counts: *const usize,
    output: *mut c_void,
    recv_counts: *const usize,
) -> c_int {
    guard(name, || {
        // SAFETY: null or a live group, per the contract.
        let group = unsafe { group_of(g) };
        // SAFETY: null or a live session, per the contract.
        let entered = unsafe { enter(s) }?;
        let (_, ranks) = rank_and_size(entered.handle, group);
        // SAFETY: one readable count per rank at `send_counts`, per the contract.
        let sends = unsafe { counts(send_counts, ranks as usize, "send_counts") }?;
        // SAFETY: one readable count per rank at `recv_counts`, per the contract.
        let receives = unsafe { counts(recv_counts, ranks as usize, "recv_counts") }?;
        let total = |counts: &[usize]| {
            counts
                .iter()
                .try_fold(0usize, |sum, &count| sum.checked_add(count))
                .ok_or_else(|| misuse("the counts overflow".to_string()))
        };
        // SAFETY: as many readable bytes at `input` as the send counts add up to.
        let input = unsafe { bytes(input, total(sends)?, "input") }?;
        // SAFETY: as many writable bytes at `output` as the receive counts add up to.
        let output = unsafe { bytes_mut(output, total(receives)?, "output") }?;
        Ok(on_comm!(entered, group, |c| c
            .all_to_all_v(input, sends, output, receives))?)
    })
}

/// `world` counts at `counts`, NULL being misuse.
///
/// # Safety
///
/// When not null, `counts` points at `world` readable `size_t`s.
unsafe fn counts<'a>(
    counts: *const usize,
    world: usize,
    what: &str,
) -> Result<&'a [usize], Failure> {
    if counts.is_null() {
        return Err(misuse(format!("{what} is NULL")));
    }
    // SAFETY: non-null, and per this function's contract `world` readable counts.
    Ok(unsafe { std::slice::from_raw_parts(counts, world) })
}
