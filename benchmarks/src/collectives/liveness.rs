//! `dead_peer_detection`: from `kill -9` of a worker to a survivor's `PeerLost`.

use crate::workers::{connect, fork_workers, reap, start_broker};
use crate::{Comparison, Measure, Plan, Report, Size};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::waitpid;
use shmbroker::Collectives;
use shmbroker::session::Error;
use std::path::Path;
use std::time::Instant;

/// `dead_peer_detection`: from `kill -9` to `PeerLost`, 3 workers.
pub(super) fn dead_peer_detection(
    plan: Plan<'_>,
    report: &mut Report,
    dir: &Path,
) -> Result<(), String> {
    report.progress("dead_peer, 3 workers");
    let mut samples = Vec::new();
    for repeat in 0..plan.size(20, 3) {
        samples.push(dead_peer(&dir.join(format!("dead-{repeat}.sock")))?);
    }
    report.add(Comparison {
        bench: "dead_peer_detection".into(),
        size: Size::Workers(3),
        contenders: vec![("shmbroker: kill -9 to PeerLost", Measure::latency(samples))],
    });
    Ok(())
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
