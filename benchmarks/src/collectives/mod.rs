//! `bench collectives`: the session's collectives, point-to-point round trip, fd exchange and C
//! ABI against what people would use instead, and how fast a dead worker is noticed. One file an
//! area; this one keeps the table of rows and the order they run in.
//!
//! | bench | ours | baselines |
//! |---|---|---|
//! | `barrier` (2, 4, 8; 16 outside `--quick`) | `Session::barrier` with its own (adaptive) waiting; also spinning where the CPUs hold the world | `MPI_Barrier` (`mpi/barrier.c`), `--oversubscribe` |
//! | `sendrecv_pingpong` (8 B) | `send` + `recv_into` round trip | the raw ring the session sends on (one 64-byte slot each way, spinning); `MPI_Send`/`MPI_Recv` (`mpi/bulk.c`) |
//! | `status_cost_barrier`, `status_cost_sendrecv` (2 workers) | `Session::barrier`, and an 8 B `send` + `recv_into` round trip, spinning, each rank publishing what it is doing | the same with publishing switched off (`Session::set_publishing(false)`) |
//! | `barrier_hot` (2 workers) | `Session::barrier`, spinning | a shared-memory sense-reversing barrier that polls with `usleep(1)` (as KittensBroker's does); the same with waiters parked in `FUTEX_WAIT`; a star relay over UNIX sockets |
//! | `barrier_parked` (2, 4, 8 workers) | `Session::barrier`, parking at once | the same two |
//! | `all_gather_{hot,parked,crowded}_{8,64,1024}B` (2 hot; 2, 4, 8 parked; 16 crowded outside `--quick`, against Open MPI only) | `Session::all_gather_into` | each rank writes a slot in shared memory between two futex barriers; a star relay over UNIX sockets |
//! | `reduce_kernel_{f32_sum,f32_max,f64_sum,i32_sum,bf16_sum,f16_sum}` (2 and 4 inputs of 512 KiB, in this process) | `shmbroker::reduce::combine` | one core's `memcpy` of the output's bytes |
//! | `capi_all_gather_{8,64,1024}B` (2 workers; 4 at 64 B; 64 B on 2 with `--quick`) | `shmbroker_all_gather` from a C program through `libshmbroker.so`, under `shmbroker run` | the same loop in Rust, `Session::all_gather_into`, under `shmbroker run` too; the Rust call with ranks forked by the bench, as in `all_gather_*` |
//! | `capi_all_reduce_{8,64,1024}B` (as above) | `shmbroker_all_reduce`, f32 sum in place, from the C program | the same loop in Rust, `Session::all_reduce` |
//! | `capi_recv_any_{8,64,1024}B` (2 workers) | a round trip of `shmbroker_send` + `shmbroker_recv_any` on each side, from the C program | the same loop in Rust, `Session::send` + `recv_any_into` |
//! | `fd_exchange_per_fd` (2 workers) | `Session::exchange_fds` by `pidfd_getfd` (each rank imports one fd) | one raw `pidfd_getfd` with a cached pidfd; an `SCM_RIGHTS` ping-pong, per fd |
//! | `fd_exchange_batch16_per_fd` (2 workers) | `Session::exchange_fd_batch` of 16 fds by `pidfd_getfd`, per fd | one raw `pidfd_getfd` with a cached pidfd (the same samples) |
//! | `fd_broadcast_batch16_per_fd` (2 workers) | `Session::broadcast_fd_batch` of 16 fds from rank 0 by `pidfd_getfd`, per fd | one raw `pidfd_getfd` with a cached pidfd (the same samples) |
//! | `dead_peer` (3 workers) | from `kill -9` of one worker to the survivor's `PeerLost` in a barrier | none: the target is an absolute bound |
//!
//! Every worker is its own process (see `workers`).

use crate::{Plan, Report};
use shmbroker::session::Session;
use shmbroker_sys::TempDir;
use std::path::Path;

use crate::workers::{connect, time_loop, warmup, with_broker};

mod barriers;
mod c_abi;
mod fds;
mod gathers;
mod liveness;
mod p2p;

pub fn run(plan: Plan<'_>, report: &mut Report) -> Result<(), String> {
    let dir = TempDir::new("bench-collectives").map_err(|e| e.to_string())?;
    let dir = dir.path();
    if plan.wants("barrier_hot") {
        barriers::hot(plan, report, dir)?;
    }
    if plan.wants("barrier") {
        barriers::barrier_against_mpi(plan, report, dir)?;
    }
    if plan.wants("status_cost") {
        barriers::status_cost(plan, report, dir)?;
    }
    if plan.wants("sendrecv_pingpong") {
        p2p::sendrecv_pingpong(plan, report, dir)?;
    }
    if plan.wants("barrier_parked") {
        barriers::parked(plan, report, dir)?;
    }
    if plan.wants("all_gather") {
        gathers::all_gather(plan, report, dir)?;
    }
    crate::reductions::reductions(plan, report, dir)?;
    c_abi::capi_calls(plan, report, dir)?;
    if plan.wants("fd_exchange") {
        fds::fd_exchange(plan, report, dir)?;
    }
    if plan.wants("dead_peer") {
        liveness::dead_peer_detection(plan, report, dir)?;
    }
    Ok(())
}

/// CPUs this process may run on.
pub(super) fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// Nanoseconds of each of `rounds` calls of `op` on rank 0, after warm-up calls, with every one
/// of `workers` forked workers calling it as often.
pub(super) fn ours_timed(
    socket: &Path,
    workers: u32,
    rounds: usize,
    spin_limit: Option<u32>,
    op: impl Fn(&mut Session) -> Result<(), String>,
) -> Result<Vec<u64>, String> {
    let warmup = warmup(rounds);
    with_broker(
        socket,
        workers,
        |rank| {
            let mut session = connect(socket, rank, spin_limit)?;
            for _ in 0..warmup + rounds {
                op(&mut session)?;
            }
            Ok(())
        },
        || {
            let mut session = connect(socket, 0, spin_limit)?;
            time_loop(rounds, || op(&mut session))
        },
    )
}
