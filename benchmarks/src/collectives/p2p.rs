//! `sendrecv_pingpong`: an 8-byte round trip against the raw ring and Open MPI.

use super::ours_timed;
use crate::workers::{open_mpi, warmup};
use crate::{Comparison, Measure, Plan, Report, Run, Size, alternate};
use nix::unistd::Pid;
use shmbroker::session::Error;
use std::path::Path;
use std::time::Duration;

/// An 8-byte `send` and `recv_into` round trip between two workers, against the raw ring the
/// session sends on (one 64-byte slot each way) and `MPI_Send`/`MPI_Recv`.
pub(super) fn sendrecv_pingpong(
    plan: Plan<'_>,
    report: &mut Report,
    dir: &Path,
) -> Result<(), String> {
    report.progress("sendrecv_pingpong, 8 bytes");
    let mpi = open_mpi("bulk", crate::mpi::BULK_C);
    let rounds = plan.size(20_000, 2_000);
    let sockets = std::cell::Cell::new(0u32);
    let ours = || {
        sockets.set(sockets.get() + 1);
        let socket = dir.join(format!("sendrecv-{}.sock", sockets.get()));
        ours_sendrecv(&socket, rounds).map(Measure::latency)
    };
    let ring = || crate::queue::message_pingpong(rounds).map(Measure::latency);
    let mut contenders: Vec<(&'static str, Run<'_>)> =
        vec![("shmbroker", &ours), ("raw ring round trip", &ring)];
    let open_mpi = mpi.as_ref().map(|program| {
        move || {
            let args = [rounds, warmup(rounds), 8].map(|n| n.to_string());
            let stdout = program.run(2, &args, Duration::from_secs(120))?;
            let samples = crate::mpi::parse_lines(&stdout, "pingpong_sample")
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
pub(super) fn ours_sendrecv(socket: &Path, rounds: usize) -> Result<Vec<u64>, String> {
    let cpus = crate::cpu_pair();
    let original = nix::sched::sched_getaffinity(Pid::from_raw(0)).ok();
    let pinned = std::cell::Cell::new(false);
    let samples = ours_timed(socket, 2, rounds, None, |session| {
        if !pinned.replace(true)
            && let Some((zero, one)) = cpus
        {
            crate::pin_to(if session.rank() == 0 { zero } else { one });
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
