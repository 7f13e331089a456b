//! `bench collectives`: barriers against the barriers people write by hand, and how
//! fast a dead worker is noticed.
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

use super::{Comparison, Measure, Plan, Report, Run, Size, alternate};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;
use shmbroker::Collectives;
use shmbroker::queues::memfd::{Mapping, create_sealed};
use shmbroker::session::{Error, Session};
use shmbroker::sys::{futex, pidfd};
use shmbroker_sys::TempDir;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::workers::{
    TIMEOUT, connect, fork_workers, open_mpi, reap, start_broker, time_loop, warmup, with_broker,
};

pub fn run(plan: Plan<'_>, report: &mut Report) -> Result<(), String> {
    let dir = TempDir::new("bench-collectives").map_err(|e| e.to_string())?;
    let rounds = plan.size(5_000, 500);
    if plan.wants("barrier_hot") {
        report.progress("barrier_hot, 2 workers");
        let contenders = barrier_contenders(plan, dir.path(), 2, rounds, u32::MAX)?;
        report.add(Comparison {
            bench: "barrier_hot".into(),
            size: Size::Workers(2),
            contenders,
        });
    }
    if plan.wants("barrier") {
        barrier_against_mpi(plan, report, dir.path())?;
    }
    if plan.wants("status_cost") {
        status_cost(plan, report, dir.path())?;
    }
    if plan.wants("sendrecv_pingpong") {
        sendrecv_pingpong(plan, report, dir.path())?;
    }
    if plan.wants("barrier_parked") {
        for workers in [2u32, 4, 8] {
            report.progress(&format!("barrier_parked, {workers} workers"));
            let rounds = plan.size(1_000, 100);
            let contenders = barrier_contenders(plan, dir.path(), workers, rounds, 0)?;
            report.add(Comparison {
                bench: "barrier_parked".into(),
                size: Size::Workers(workers),
                contenders,
            });
        }
    }
    if plan.wants("all_gather") {
        let mpi = open_mpi("allgather", super::mpi::ALLGATHER_C);
        // 2 workers spinning, then 2, 4 and 8 parked, at each size; outside --quick, 16 workers
        // crowded (the session's own waiting, Bruck's algorithm) against Open MPI alone.
        let mut setups = vec![
            (2u32, Some(u32::MAX), "hot"),
            (2, Some(0), "parked"),
            (4, Some(0), "parked"),
            (8, Some(0), "parked"),
        ];
        if !plan.quick {
            setups.push((16, None, "crowded"));
        }
        for (workers, spin_limit, mode) in setups {
            for bytes in [8usize, 64, 1024] {
                report.progress(&format!(
                    "all_gather_{mode}, {workers} workers, {bytes} bytes"
                ));
                let rounds = if mode == "hot" {
                    plan.size(3_000, 300)
                } else {
                    plan.size(1_000, 100)
                };
                let mut ours = Vec::new();
                let mut shared = Vec::new();
                let mut star = Vec::new();
                let mut open_mpi = Vec::new();
                // Open MPI always spins: it is compared with the spinning figures, at the sizes
                // the payload issue names.
                let with_mpi = mpi
                    .as_ref()
                    .filter(|_| (mode == "hot" && bytes != 8) || mode == "crowded");
                let crowded = mode == "crowded";
                for round in 0..plan.rounds {
                    let socket = dir
                        .path()
                        .join(format!("gather-{mode}-{workers}-{bytes}-{round}.sock"));
                    let mut order: Vec<u8> = vec![0, 1, 2, 3];
                    order.rotate_left(round % 4);
                    for contender in order {
                        match contender {
                            0 => ours.extend(ours_all_gather(
                                &socket, workers, rounds, bytes, spin_limit,
                            )?),
                            1 if !crowded => {
                                shared.extend(shared_all_gather(workers, rounds, bytes)?);
                            }
                            2 if !crowded => star.extend(star_relay(workers, rounds, bytes)?),
                            1 | 2 => {}
                            _ => {
                                if let Some(program) = with_mpi {
                                    open_mpi
                                        .extend(mpi_all_gather(program, workers, rounds, bytes)?);
                                }
                            }
                        }
                    }
                }
                let mut contenders = vec![("shmbroker", Measure::latency(ours))];
                if !crowded {
                    contenders.push((
                        "shared memory slots, futex barriers",
                        Measure::latency(shared),
                    ));
                    contenders.push(("star relay over UNIX sockets", Measure::latency(star)));
                }
                if with_mpi.is_some() {
                    contenders.push(("open-mpi", Measure::latency(open_mpi)));
                }
                report.add(Comparison {
                    bench: format!("all_gather_{mode}_{bytes}B"),
                    size: Size::Workers(workers),
                    contenders,
                });
            }
        }
    }
    super::reductions::reductions(plan, report, dir.path())?;
    capi_calls(plan, report, dir.path())?;
    if plan.wants("fd_exchange") {
        report.progress("fd_exchange, 2 workers");
        let rounds = plan.size(2_000, 200);
        let mut ours = Vec::new();
        let mut pidfd = Vec::new();
        let mut rights = Vec::new();
        let (mut batched, mut broadcast) = (Vec::new(), Vec::new());
        for round in 0..plan.rounds {
            let socket = dir.path().join(format!("fds-{round}.sock"));
            let mut order: Vec<u8> = vec![0, 1, 2, 3, 4];
            order.rotate_left(round % 5);
            let calls = (rounds / FD_BATCH).max(1);
            for contender in order {
                match contender {
                    0 => ours.extend(ours_fd_exchange(&socket, rounds)?),
                    1 => pidfd.extend(raw_pidfd_getfd(rounds)?),
                    2 => rights.extend(raw_scm_rights(rounds)?),
                    3 => batched.extend(ours_fd_batch(&socket, calls, false)?),
                    _ => broadcast.extend(ours_fd_batch(&socket, calls, true)?),
                }
            }
        }
        let batches = [
            (
                "exchange",
                "shmbroker exchange_fd_batch (pidfd), per fd",
                batched,
            ),
            (
                "broadcast",
                "shmbroker broadcast_fd_batch (pidfd), per fd",
                broadcast,
            ),
        ];
        for (call, ours_label, samples) in batches {
            report.add(Comparison {
                bench: format!("fd_{call}_batch{FD_BATCH}_per_fd"),
                size: Size::Workers(2),
                contenders: vec![
                    (ours_label, Measure::latency(samples)),
                    ("raw pidfd_getfd", Measure::latency(pidfd.clone())),
                ],
            });
        }
        report.add(Comparison {
            bench: "fd_exchange_per_fd".into(),
            size: Size::Workers(2),
            contenders: vec![
                ("shmbroker exchange_fds (pidfd)", Measure::latency(ours)),
                ("raw pidfd_getfd", Measure::latency(pidfd)),
                ("raw SCM_RIGHTS ping-pong, per fd", Measure::latency(rights)),
            ],
        });
    }
    if plan.wants("dead_peer") {
        report.progress("dead_peer, 3 workers");
        let mut samples = Vec::new();
        for repeat in 0..plan.size(20, 3) {
            samples.push(dead_peer(&dir.path().join(format!("dead-{repeat}.sock")))?);
        }
        report.add(Comparison {
            bench: "dead_peer_detection".into(),
            size: Size::Workers(3),
            contenders: vec![("shmbroker: kill -9 to PeerLost", Measure::latency(samples))],
        });
    }
    Ok(())
}

/// CPUs this process may run on.
fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// `Session::barrier` with its default waiting against `MPI_Barrier`, at 2, 4 and 8 workers (and
/// 16 outside `--quick`), alternating, whatever the number of CPUs: past it both oversubscribe.
/// Spinning (hot) barriers too, at every world size the CPUs can hold without oversubscribing.
fn barrier_against_mpi(plan: Plan<'_>, report: &mut Report, dir: &Path) -> Result<(), String> {
    let mpi = open_mpi("barrier", super::mpi::BARRIER_C);
    let mut worlds = vec![2u32, 4, 8];
    if !plan.quick {
        worlds.push(16);
    }
    for workers in worlds {
        report.progress(&format!("barrier, {workers} workers"));
        // Oversubscribed barriers take microseconds each: fewer rounds keep the run short.
        let rounds = if workers as usize > cpus() {
            plan.size(2_000, 200)
        } else {
            plan.size(5_000, 500)
        };
        let hot = workers > 2 && workers as usize <= cpus();
        let sockets = std::cell::Cell::new(0u32);
        let socket = || {
            sockets.set(sockets.get() + 1);
            dir.join(format!("barrier-{workers}-{}.sock", sockets.get()))
        };
        let ours = || ours_barrier(&socket(), workers, rounds, None).map(Measure::latency);
        let spinning =
            || ours_barrier(&socket(), workers, rounds, Some(u32::MAX)).map(Measure::latency);
        let mut runs: Vec<(&'static str, Run<'_>)> = vec![("shmbroker", &ours)];
        if hot {
            runs.push(("shmbroker, spinning", &spinning));
        }
        let open_mpi = mpi
            .as_ref()
            .map(|program| move || mpi_barrier(program, workers, rounds).map(Measure::latency));
        if let Some(open_mpi) = &open_mpi {
            runs.push(("open-mpi", open_mpi));
        }
        let contenders = alternate(plan, &runs)?;
        report.add(Comparison {
            bench: "barrier".into(),
            size: Size::Workers(workers),
            contenders,
        });
    }
    Ok(())
}

/// Rank 0's nanoseconds per `MPI_Barrier` among `workers` ranks.
fn mpi_barrier(
    program: &super::mpi::Program,
    workers: u32,
    rounds: usize,
) -> Result<Vec<u64>, String> {
    let args = [rounds, warmup(rounds)].map(|n| n.to_string());
    let stdout = program.run(workers, &args, Duration::from_secs(120))?;
    Ok(super::mpi::parse_lines(&stdout, "barrier_sample")
        .into_iter()
        .filter_map(|fields| fields.get(1).copied())
        .collect())
}

/// An 8-byte `send` and `recv_into` round trip between two workers, against the raw ring the
/// session sends on (one 64-byte slot each way) and `MPI_Send`/`MPI_Recv`.
fn sendrecv_pingpong(plan: Plan<'_>, report: &mut Report, dir: &Path) -> Result<(), String> {
    report.progress("sendrecv_pingpong, 8 bytes");
    let mpi = open_mpi("bulk", super::mpi::BULK_C);
    let rounds = plan.size(20_000, 2_000);
    let sockets = std::cell::Cell::new(0u32);
    let ours = || {
        sockets.set(sockets.get() + 1);
        let socket = dir.join(format!("sendrecv-{}.sock", sockets.get()));
        ours_sendrecv(&socket, rounds).map(Measure::latency)
    };
    let ring = || super::queue::message_pingpong(rounds).map(Measure::latency);
    let mut contenders: Vec<(&'static str, Run<'_>)> =
        vec![("shmbroker", &ours), ("raw ring round trip", &ring)];
    let open_mpi = mpi.as_ref().map(|program| {
        move || {
            let args = [rounds, warmup(rounds), 8].map(|n| n.to_string());
            let stdout = program.run(2, &args, Duration::from_secs(120))?;
            let samples = super::mpi::parse_lines(&stdout, "pingpong_sample")
                .into_iter()
                .filter_map(|fields| fields.get(1).copied());
            Ok(Measure::latency(samples.collect()))
        }
    });
    if let Some(open_mpi) = &open_mpi {
        contenders.push(("open-mpi", open_mpi));
    }
    let contenders = alternate(plan, &contenders)?;
    report.add(Comparison {
        bench: "sendrecv_pingpong".into(),
        size: Size::Bytes(8),
        contenders,
    });
    Ok(())
}

/// Nanoseconds per 8-byte round trip on rank 0: `send` to rank 1, `recv_into` its answer, each
/// rank pinned to its own CPU where two are available, as the raw ring's two sides are.
fn ours_sendrecv(socket: &Path, rounds: usize) -> Result<Vec<u64>, String> {
    let cpus = super::cpu_pair();
    let original = nix::sched::sched_getaffinity(Pid::from_raw(0)).ok();
    let pinned = std::cell::Cell::new(false);
    let samples = ours_timed(socket, 2, rounds, None, |session| {
        if !pinned.replace(true)
            && let Some((zero, one)) = cpus
        {
            super::pin_to(if session.rank() == 0 { zero } else { one });
        }
        let peer = 1 - session.rank();
        let mut buffer = [0u8; 8];
        let error = |e: Error| e.to_string();
        if session.rank() == 0 {
            session.send(peer, &[7; 8]).map_err(error)?;
            session.recv_into(peer, &mut buffer).map_err(error)?;
        } else {
            session.recv_into(peer, &mut buffer).map_err(error)?;
            session.send(peer, &buffer).map_err(error)?;
        }
        if buffer == [7; 8] {
            Ok(())
        } else {
            Err(format!("ping-pong carried {buffer:?}"))
        }
    });
    if let Some(original) = original {
        let _ = nix::sched::sched_setaffinity(Pid::from_raw(0), &original);
    }
    samples
}

/// What publishing each rank's status costs (issue 29's budget: 5 %): the 2-rank spinning
/// barrier and the 8 B send/recv round trip with publishing on and off
/// (`Session::set_publishing`), alternating over the plan's rounds.
fn status_cost(plan: Plan<'_>, report: &mut Report, dir: &Path) -> Result<(), String> {
    let rounds = plan.size(20_000, 2_000);
    let runs = std::cell::Cell::new(0u32);
    let socket = || {
        runs.set(runs.get() + 1);
        dir.join(format!("status-{}.sock", runs.get()))
    };
    let error = |e: Error| e.to_string();
    let barrier = |on: bool| {
        ours_timed(&socket(), 2, rounds, Some(u32::MAX), |session| {
            session.set_publishing(on);
            session.barrier().map_err(error)
        })
        .map(Measure::latency)
    };
    let pingpong = |on: bool| {
        ours_timed(&socket(), 2, rounds, Some(u32::MAX), |session| {
            session.set_publishing(on);
            let (peer, mut buffer) = (1 - session.rank(), [0u8; 8]);
            if session.rank() == 0 {
                session.send(peer, &[7; 8]).map_err(error)?;
                session.recv_into(peer, &mut buffer).map_err(error)?;
            } else {
                session.recv_into(peer, &mut buffer).map_err(error)?;
                session.send(peer, &buffer).map_err(error)?;
            }
            Ok(())
        })
        .map(Measure::latency)
    };
    report.progress("status_cost, barrier, 2 workers");
    let (on, off) = (|| barrier(true), || barrier(false));
    let contenders: Vec<(&'static str, Run<'_>)> = vec![
        ("barrier, publishing", &on),
        ("barrier, not publishing", &off),
    ];
    report.add(Comparison {
        bench: "status_cost_barrier".into(),
        size: Size::Workers(2),
        contenders: alternate(plan, &contenders)?,
    });
    report.progress("status_cost, send/recv 8 B");
    let (on, off) = (|| pingpong(true), || pingpong(false));
    let contenders: Vec<(&'static str, Run<'_>)> = vec![
        ("send/recv 8 B, publishing", &on),
        ("send/recv 8 B, not publishing", &off),
    ];
    report.add(Comparison {
        bench: "status_cost_sendrecv".into(),
        size: Size::Bytes(8),
        contenders: alternate(plan, &contenders)?,
    });
    report.note(
        "status_cost",
        "each rank publishes what it is doing in its outbox's status words (a few relaxed stores \
         and a coarse clock read per call); the baseline is the same loop with publishing \
         switched off (Session::set_publishing), alternating in one run; issue 29's budget is 5%",
    );
    Ok(())
}

/// Ours and both hand-written barriers, alternating over the plan's rounds.
fn barrier_contenders(
    plan: Plan<'_>,
    dir: &Path,
    workers: u32,
    rounds: usize,
    spin_limit: u32,
) -> Result<Vec<(&'static str, Measure)>, String> {
    let mut ours = Vec::new();
    let mut polling = Vec::new();
    let mut futex = Vec::new();
    let mut star = Vec::new();
    for round in 0..plan.rounds {
        let socket = dir.join(format!("barrier-{workers}-{spin_limit}-{round}.sock"));
        let mut order: Vec<u8> = vec![0, 1, 2, 3];
        order.rotate_left(round % 4);
        for contender in order {
            match contender {
                0 => ours.extend(ours_barrier(&socket, workers, rounds, Some(spin_limit))?),
                1 => polling.extend(shared_barrier(workers, rounds, Wait::Usleep)?),
                2 => futex.extend(shared_barrier(workers, rounds, Wait::Futex)?),
                _ => star.extend(star_relay(workers, rounds, 0)?),
            }
        }
    }
    Ok(vec![
        ("shmbroker", Measure::latency(ours)),
        (
            "shared memory, polls with usleep(1)",
            Measure::latency(polling),
        ),
        ("star relay over UNIX sockets", Measure::latency(star)),
        ("shared memory, futex wait/wake", Measure::latency(futex)),
    ])
}

/// Nanoseconds of each of `rounds` calls of `op` on rank 0, after warm-up calls, with every one
/// of `workers` forked workers calling it as often.
fn ours_timed(
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

/// Nanoseconds of each of `rounds` barriers on rank 0.
fn ours_barrier(
    socket: &Path,
    workers: u32,
    rounds: usize,
    spin_limit: Option<u32>,
) -> Result<Vec<u64>, String> {
    ours_timed(socket, workers, rounds, spin_limit, |session| {
        session.barrier().map_err(|e| e.to_string())
    })
}

#[derive(Clone, Copy)]
enum Wait {
    Usleep,
    Futex,
}

/// A sense-reversing barrier in a shared page: the last to arrive resets the count and flips the
/// sense; the others wait for the flip, polling with `usleep(1)` or sleeping in `FUTEX_WAIT`.
struct SharedBarrier<'a> {
    count: &'a AtomicU32,
    sense: &'a AtomicU32,
    workers: u32,
    wait: Wait,
}

impl SharedBarrier<'_> {
    fn arrive(&self, local_sense: &mut u32) -> Result<(), String> {
        *local_sense ^= 1;
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.workers {
            self.count.store(0, Ordering::Relaxed);
            self.sense.store(*local_sense, Ordering::Release);
            if let Wait::Futex = self.wait {
                futex::wake(self.sense, u32::MAX);
            }
            return Ok(());
        }
        let deadline = Instant::now() + TIMEOUT;
        while self.sense.load(Ordering::Acquire) != *local_sense {
            match self.wait {
                // SAFETY: usleep has no memory effects on this process.
                Wait::Usleep => unsafe {
                    nix::libc::usleep(1);
                },
                Wait::Futex => futex::wait(
                    self.sense,
                    *local_sense ^ 1,
                    Some(Duration::from_millis(100)),
                ),
            }
            if Instant::now() > deadline {
                return Err("barrier partner silent".into());
            }
        }
        Ok(())
    }
}

/// Nanoseconds of each of `rounds` shared-memory barriers on rank 0.
fn shared_barrier(workers: u32, rounds: usize, wait: Wait) -> Result<Vec<u64>, String> {
    let warmup = warmup(rounds);
    let fd = create_sealed(c"bench-barrier", 4096).map_err(|e| e.to_string())?;
    let page = Mapping::map(&fd, 4096).map_err(|e| e.to_string())?;
    // SAFETY: the mapping is 4096 bytes, page-aligned and outlives every use below (children
    // inherit it); offsets 0 and 128 hold 4-byte atomics, which may alias shared memory.
    let count = unsafe { page.at(0).cast::<AtomicU32>().as_ref() };
    // SAFETY: as above.
    let sense = unsafe { page.at(128).cast::<AtomicU32>().as_ref() };
    let barrier = SharedBarrier {
        count,
        sense,
        workers,
        wait,
    };
    let pids = fork_workers(workers, |_| {
        let mut local = 0;
        for _ in 0..warmup + rounds {
            barrier.arrive(&mut local)?;
        }
        Ok(())
    })?;
    let mut local = 0;
    let measured = time_loop(rounds, || barrier.arrive(&mut local));
    let reaped = reap(&pids);
    let samples = measured?;
    reaped?;
    Ok(samples)
}

/// Nanoseconds from `kill -9` of rank 2 to rank 0's `PeerLost` in a barrier loop.
fn dead_peer(socket: &Path) -> Result<u64, String> {
    let pids = fork_workers(3, |rank| {
        let mut session = connect(socket, rank, None)?;
        loop {
            if let Err(error) = session.barrier() {
                // Rank 1 survives; rank 2 is killed before it gets here.
                return match error {
                    Error::PeerLost { rank: 2, .. } => Ok(()),
                    other => Err(other.to_string()),
                };
            }
        }
    })?;
    let (stop, broker) = start_broker(socket, 3)?;
    let measured = (|| {
        let mut session = connect(socket, 0, None)?;
        for _ in 0..100 {
            session.barrier().map_err(|e| e.to_string())?;
        }
        let victim = pids[1];
        let killed = Instant::now();
        kill(victim, Signal::SIGKILL).map_err(|e| format!("kill: {e}"))?;
        loop {
            match session.barrier() {
                Ok(()) => {}
                Err(Error::PeerLost { rank: 2, .. }) => {
                    return Ok(killed.elapsed().as_nanos() as u64);
                }
                Err(other) => return Err(other.to_string()),
            }
        }
    })();
    let _ = waitpid(pids[1], None);
    let reaped = reap(&pids[..1]);
    stop.stop();
    let _ = broker.join();
    let elapsed = measured?;
    reaped?;
    Ok(elapsed)
}

/// `shmbroker_all_gather` from a C program against the Rust call it wraps,
/// `Session::all_gather_into`, in the same loop, both as fresh processes under `shmbroker run`
/// with the session's own waiting and a 20 s deadline, alternating which runs first each round
/// (see `capi.rs`). Ours is the C ABI here: the ratio is C over Rust.
/// The C ABI against the Rust calls it wraps (`capi_all_gather`, `capi_all_reduce`,
/// `capi_recv_any`; see `capi.rs`), each as fresh processes under `shmbroker run`; the
/// all-gather also against the Rust call in the all_gather benches' setup.
fn capi_calls(plan: Plan<'_>, report: &mut Report, dir: &Path) -> Result<(), String> {
    use super::capi::{Call, Side};
    let wanted: Vec<Call> = [Call::AllGather, Call::AllReduce, Call::RecvAny]
        .into_iter()
        .filter(|call| plan.wants(&format!("capi_{}", call.name())))
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let program = match super::capi::available() {
        Ok(lib) => super::capi::build(&lib)?,
        Err(why) => {
            eprintln!("bench: no C ABI contender for the capi_* benches ({why})");
            return Ok(());
        }
    };
    // 64 B is the size the C ABI's target names; 8 B is where a fixed cost shows most.
    let setups: &[(u32, usize)] = if plan.quick {
        &[(2, 64)]
    } else {
        &[(2, 8), (2, 64), (2, 1024), (4, 64)]
    };
    let rounds = plan.size(3_000, 300);
    for call in wanted {
        for &(workers, bytes) in setups {
            // A ping-pong has two parties; a sum needs whole f32.
            if call == Call::RecvAny && workers != 2 || call == Call::AllReduce && bytes % 4 != 0 {
                continue;
            }
            let name = call.name();
            report.progress(&format!("capi_{name}, {workers} workers, {bytes} bytes"));
            // Every order of the contenders in turn: C runs before Rust in half the rounds.
            const ORDERS: [[u8; 3]; 6] = [
                [0, 1, 2],
                [1, 0, 2],
                [2, 0, 1],
                [2, 1, 0],
                [0, 2, 1],
                [1, 2, 0],
            ];
            let launched = |side| {
                super::capi::time(&program, side, call, workers, rounds, warmup(rounds), bytes)
            };
            let (mut c, mut rust, mut forked) = (Vec::new(), Vec::new(), Vec::new());
            for round in 0..plan.rounds {
                let socket = dir.join(format!("capi-{name}-{workers}-{bytes}-{round}.sock"));
                for contender in ORDERS[round % 6] {
                    match contender {
                        0 => c.push(launched(Side::C)?),
                        1 => rust.push(launched(Side::Rust)?),
                        _ if call == Call::AllGather => {
                            forked.push(ours_all_gather(&socket, workers, rounds, bytes, None)?);
                        }
                        _ => {}
                    }
                }
            }
            let (c_name, rust_name) = match call {
                Call::AllGather => (
                    "C ABI: shmbroker_all_gather",
                    "Rust: Session::all_gather_into",
                ),
                Call::AllReduce => (
                    "C ABI: shmbroker_all_reduce (f32 sum)",
                    "Rust: Session::all_reduce (f32 sum)",
                ),
                Call::RecvAny => (
                    "C ABI: shmbroker_send + shmbroker_recv_any, round trip",
                    "Rust: Session::send + recv_any_into, round trip",
                ),
            };
            let mut contenders = vec![
                (c_name, Measure::Latency(c)),
                (rust_name, Measure::Latency(rust)),
            ];
            if call == Call::AllGather {
                contenders.push(("Rust, ranks forked by the bench", Measure::Latency(forked)));
            }
            report.add(Comparison {
                bench: format!("capi_{name}_{bytes}B"),
                size: Size::Workers(workers),
                contenders,
            });
        }
    }
    report.note(
        "capi_all_gather",
        "ours is a C program calling the C ABI through libshmbroker.so, the first baseline the \
         same loop in Rust calling the Rust API, both as fresh processes under `shmbroker run`, so \
         that ratio is C over Rust (issue 28's target for the C ABI: within 1.05); \
         capi_all_reduce and capi_recv_any are the same comparison for an f32 sum in place and a \
         send/recv_any round trip between ranks 0 and 1. The all-gather's second baseline is the \
         Rust call in the setup of the all_gather benches (ranks forked from this process, rank \
         0 this process itself, with the session's own waiting), which shows what the process \
         setup alone changes",
    );
    Ok(())
}

/// Nanoseconds of each of `rounds` all-gathers of `bytes` bytes on rank 0.
fn ours_all_gather(
    socket: &Path,
    workers: u32,
    rounds: usize,
    bytes: usize,
    spin_limit: Option<u32>,
) -> Result<Vec<u64>, String> {
    // Into buffers made once, as MPI_Allgather and the other baselines do; the first byte of
    // every rank's part is checked.
    let buffers = std::cell::RefCell::new((Vec::new(), Vec::new()));
    ours_timed(socket, workers, rounds, spin_limit, |session| {
        let mut buffers = buffers.borrow_mut();
        let (data, out) = &mut *buffers;
        if data.len() != bytes {
            *data = vec![session.rank() as u8; bytes];
            *out = vec![0u8; bytes * workers as usize];
        }
        session
            .all_gather_into(data, out)
            .map_err(|e| e.to_string())?;
        for (peer, part) in out.chunks(bytes.max(1)).enumerate() {
            if part.first().is_some_and(|&b| b != peer as u8) {
                return Err(format!("all_gather_into: rank {peer}'s part is wrong"));
            }
        }
        Ok(())
    })
}

/// Rank 0's nanoseconds per `MPI_Allgather` of `bytes` bytes among `workers` ranks.
fn mpi_all_gather(
    program: &super::mpi::Program,
    workers: u32,
    rounds: usize,
    bytes: usize,
) -> Result<Vec<u64>, String> {
    let args = [rounds, warmup(rounds), bytes].map(|n| n.to_string());
    let stdout = program.run(workers, &args, Duration::from_secs(120))?;
    Ok(super::mpi::parse_lines(&stdout, "allgather_sample")
        .into_iter()
        .filter_map(|fields| fields.get(2).copied())
        .collect())
}

/// A hand-written shared-memory all-gather: each rank writes its slot, a futex barrier, every
/// rank copies all slots out, a second barrier before the slots are written again.
fn shared_all_gather(workers: u32, rounds: usize, bytes: usize) -> Result<Vec<u64>, String> {
    let warmup = warmup(rounds);
    let size = 4096 + workers as usize * 1024;
    let fd = create_sealed(c"bench-gather", size as u64).map_err(|e| e.to_string())?;
    let page = Mapping::map(&fd, size as u64).map_err(|e| e.to_string())?;
    // SAFETY: the mapping is `size` bytes and page-aligned; offsets 0 and 128 hold atomics.
    let count = unsafe { page.at(0).cast::<AtomicU32>().as_ref() };
    // SAFETY: as above.
    let sense = unsafe { page.at(128).cast::<AtomicU32>().as_ref() };
    let barrier = SharedBarrier {
        count,
        sense,
        workers,
        wait: Wait::Futex,
    };
    let round_trip = |rank: u32, local: &mut u32, out: &mut Vec<u8>| -> Result<(), String> {
        let mine = vec![rank as u8; bytes];
        // SAFETY: slot `rank` lies inside the mapping (4096 + rank * 1024 + bytes <= size), and
        // between the barriers only this rank writes it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                mine.as_ptr(),
                page.at(4096 + rank as usize * 1024).as_ptr(),
                bytes,
            );
        }
        barrier.arrive(local)?;
        out.clear();
        for peer in 0..workers as usize {
            // SAFETY: every slot lies inside the mapping; no rank writes until the next barrier.
            let slot =
                unsafe { std::slice::from_raw_parts(page.at(4096 + peer * 1024).as_ptr(), bytes) };
            out.extend_from_slice(slot);
        }
        barrier.arrive(local)
    };
    let pids = fork_workers(workers, |rank| {
        let (mut local, mut out) = (0, Vec::new());
        for _ in 0..warmup + rounds {
            round_trip(rank, &mut local, &mut out)?;
        }
        Ok(())
    })?;
    let (mut local, mut out) = (0, Vec::new());
    let measured = time_loop(rounds, || round_trip(0, &mut local, &mut out));
    let reaped = reap(&pids);
    let samples = measured?;
    reaped?;
    Ok(samples)
}

/// A star relay over UNIX sockets: every worker writes its `bytes` (one byte for a barrier) to
/// rank 0, which answers each with everything gathered.
fn star_relay(workers: u32, rounds: usize, bytes: usize) -> Result<Vec<u64>, String> {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    let warmup = warmup(rounds);
    let each = bytes.max(1);
    let mut hub_ends = Vec::new();
    let mut worker_ends = Vec::new();
    for _ in 1..workers {
        let (hub, worker) = UnixStream::pair().map_err(|e| e.to_string())?;
        for end in [&hub, &worker] {
            end.set_read_timeout(Some(TIMEOUT))
                .map_err(|e| e.to_string())?;
        }
        hub_ends.push(hub);
        worker_ends.push(worker);
    }
    let pids = fork_workers(workers, |rank| {
        let mut stream = &worker_ends[rank as usize - 1];
        let mine = vec![rank as u8; each];
        let mut all = vec![0u8; each * workers as usize];
        for _ in 0..warmup + rounds {
            stream.write_all(&mine).map_err(|e| e.to_string())?;
            stream.read_exact(&mut all).map_err(|e| e.to_string())?;
        }
        Ok(())
    })?;
    drop(worker_ends);
    let mut all = vec![0u8; each * workers as usize];
    let measured = time_loop(rounds, || {
        for (i, mut stream) in hub_ends.iter().enumerate() {
            let at = (i + 1) * each;
            stream
                .read_exact(&mut all[at..at + each])
                .map_err(|e| e.to_string())?;
        }
        for mut stream in &hub_ends {
            stream.write_all(&all).map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    drop(hub_ends);
    let reaped = reap(&pids);
    let samples = measured?;
    reaped?;
    Ok(samples)
}

/// Nanoseconds per fd for `exchange_fds` between 2 workers (each imports one fd per call).
fn ours_fd_exchange(socket: &Path, rounds: usize) -> Result<Vec<u64>, String> {
    // One file for the whole run, as the raw baselines use: this measures moving it.
    let file = create_sealed(c"bench-fd", 4096).map_err(|e| e.to_string())?;
    ours_timed(socket, 2, rounds, Some(u32::MAX), |session| {
        session
            .exchange_fds(std::os::fd::AsFd::as_fd(&file))
            .map(drop)
            .map_err(|e| e.to_string())
    })
}

/// Fds per call of the batched fd exchange benchmark.
const FD_BATCH: usize = 16;

/// Nanoseconds per fd for `exchange_fd_batch` of [`FD_BATCH`] fds between 2 workers (each
/// imports that many per call), or for `broadcast_fd_batch` of as many from rank 0 (rank 1
/// imports them), one sample per call.
fn ours_fd_batch(socket: &Path, calls: usize, broadcast: bool) -> Result<Vec<u64>, String> {
    let files = (0..FD_BATCH)
        .map(|_| create_sealed(c"bench-fd", 4096).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, String>>()?;
    let fds: Vec<_> = files.iter().map(std::os::fd::AsFd::as_fd).collect();
    let per_call = ours_timed(socket, 2, calls, Some(u32::MAX), |session| {
        let moved = if broadcast {
            let offered = if session.rank() == 0 { &fds[..] } else { &[] };
            session.broadcast_fd_batch(0, offered, FD_BATCH).map(drop)
        } else {
            session.exchange_fd_batch(&fds).map(drop)
        };
        moved.map_err(|e| e.to_string())
    })?;
    Ok(per_call
        .into_iter()
        .map(|ns| ns / FD_BATCH as u64)
        .collect())
}

/// Nanoseconds of one `pidfd_getfd` of a child's fd (the pidfd opened once), and the close.
fn raw_pidfd_getfd(rounds: usize) -> Result<Vec<u64>, String> {
    use std::os::fd::AsRawFd;
    let target = create_sealed(c"bench-fd", 4096).map_err(|e| e.to_string())?;
    let (done_reader, done_writer) = std::io::pipe().map_err(|e| e.to_string())?;
    let writer = std::cell::Cell::new(Some(done_writer));
    let pids = fork_workers(2, |_| {
        drop(writer.take());
        // Hold the fd until the parent is done (its end of the pipe closes).
        let mut byte = [0u8; 1];
        let _ = std::io::Read::read(&mut &done_reader, &mut byte);
        Ok(())
    })?;
    let measured = (|| {
        let pidfd = pidfd::open(pids[0].as_raw()).map_err(|e| format!("pidfd_open: {e}"))?;
        let mut samples = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let start = Instant::now();
            let fd = pidfd::getfd(std::os::fd::AsFd::as_fd(&pidfd), target.as_raw_fd())
                .map_err(|e| format!("pidfd_getfd: {e}"))?;
            drop(fd);
            samples.push(start.elapsed().as_nanos() as u64);
        }
        Ok::<_, String>(samples)
    })();
    // Closing the last write end lets the child go.
    drop((writer.take(), done_reader));
    let reaped = reap(&pids);
    let samples = measured?;
    reaped?;
    Ok(samples)
}

/// Nanoseconds per fd of an `SCM_RIGHTS` ping-pong: one fd to the child, one back.
fn raw_scm_rights(rounds: usize) -> Result<Vec<u64>, String> {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;
    let (parent_end, child_end) = UnixStream::pair().map_err(|e| e.to_string())?;
    let file = create_sealed(c"bench-fd", 4096).map_err(|e| e.to_string())?;
    let pass = |stream: &UnixStream| -> Result<(), String> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match shmbroker::sys::fdpass::send_with_fds(stream.as_fd(), &[b"f"], &[file.as_fd()]) {
                Ok(_) => return Ok(()),
                Err(nix::errno::Errno::EAGAIN) if Instant::now() < deadline => {
                    std::thread::yield_now()
                }
                Err(error) => return Err(format!("sendmsg: {error}")),
            }
        }
    };
    let take = |stream: &UnixStream| -> Result<(), String> {
        let deadline = Instant::now() + TIMEOUT;
        let mut byte = [0u8; 1];
        let mut fds = Vec::new();
        loop {
            match shmbroker::sys::fdpass::recv_with_fds(stream.as_fd(), &mut byte, &mut fds) {
                Ok(received) if received.bytes == 1 && fds.len() == 1 => return Ok(()),
                Ok(_) => return Err("lost the passed fd".into()),
                Err(nix::errno::Errno::EAGAIN) if Instant::now() < deadline => {
                    let mut poll = [nix::poll::PollFd::new(
                        stream.as_fd(),
                        nix::poll::PollFlags::POLLIN,
                    )];
                    let _ = nix::poll::poll(&mut poll, nix::poll::PollTimeout::from(100u16));
                }
                Err(error) => return Err(format!("recvmsg: {error}")),
            }
        }
    };
    let warmup = warmup(rounds);
    let pids = fork_workers(2, |_| {
        for _ in 0..warmup + rounds {
            take(&child_end)?;
            pass(&child_end)?;
        }
        Ok(())
    })?;
    let measured = time_loop(rounds, || {
        pass(&parent_end).and_then(|()| take(&parent_end))
    });
    drop((parent_end, child_end));
    let reaped = reap(&pids);
    // Two fds moved per round: report the time per fd.
    let samples = measured?.into_iter().map(|ns| ns / 2).collect();
    reaped?;
    Ok(samples)
}
