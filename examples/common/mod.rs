//! What every example shares: it runs itself as `WORKERS` processes, the way
//! `mpirun -np 4 ./example` would start it, so `cargo run --example NAME` needs nothing else.
//! Each worker calls [`Session::from_env`], which finds its rank, world size and socket in the
//! variables set here, and on rank 0 also starts the broker.
//!
//! A real program skips `launch`: a launcher (`mpirun`, `torchrun`, `srun`) starts it, or it
//! connects to a running `shmbroker serve` with [`Session::connect`].

use shmbroker::Collectives;
use shmbroker::Session;
use std::error::Error;
use std::process::{Child, Command, ExitCode, ExitStatus};
use std::time::{Duration, Instant};

/// Worker processes each example starts.
pub const WORKERS: u32 = 4;

/// How long any worker may take; past it the example kills them all and fails.
const DEADLINE: Duration = Duration::from_secs(60);

/// Runs `work` on each of [`WORKERS`] worker processes: in a worker (its launcher variables
/// set), connects and runs it; otherwise starts the broker and the workers, and waits for them.
#[allow(dead_code, reason = "every example but tokio_server runs through it")]
pub fn run(work: fn(&mut Session) -> Result<(), Box<dyn Error>>) -> ExitCode {
    run_world(WORKERS, |mut session| {
        work(&mut session)?;
        Ok(session)
    })
}

/// [`run`] for `world` processes, with `work` taking the session by value (to split it, say) and
/// giving it back for the last barrier.
pub fn run_world(
    world: u32,
    work: impl Fn(Session) -> Result<Session, Box<dyn Error>>,
) -> ExitCode {
    if std::env::var_os("SHMBROKER_RANK").is_some() {
        let outcome = (|| -> Result<(), Box<dyn Error>> {
            let session = Session::from_env(Duration::from_secs(10))?;
            let mut session = work(session)?;
            // Leave together: no rank departs while another still talks to it.
            Ok(session.barrier()?)
        })();
        return match outcome {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("worker: {error}");
                ExitCode::FAILURE
            }
        };
    }
    match launch(world) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("example: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `world` copies of this program, told to meet on a private socket.
fn launch(world: u32) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("shmbroker-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let socket = dir.join("broker.sock");
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut workers = Vec::new();
    for rank in 0..world {
        let mut command = Command::new(&me);
        command
            .env("SHMBROKER_SOCKET", &socket)
            .env("SHMBROKER_RANK", rank.to_string())
            .env("SHMBROKER_WORLD_SIZE", world.to_string());
        workers.push(Worker(command.spawn().map_err(|e| e.to_string())?));
    }
    // A worker that fails ends the others through their sessions (they see it leave); any still
    // running at the deadline are killed.
    let deadline = Instant::now() + DEADLINE;
    let mut failed = Vec::new();
    for (rank, mut worker) in workers.into_iter().enumerate() {
        match worker.wait_until(deadline) {
            Ok(status) if status.success() => {}
            Ok(status) => failed.push(format!("rank {rank}: {status}")),
            Err(error) => failed.push(format!("rank {rank}: {error}")),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// A worker process, killed and reaped if dropped still running (on any way out of [`launch`]).
struct Worker(Child);

impl Worker {
    /// Its exit status, or an error once `deadline` passes (the worker is then killed on drop).
    fn wait_until(&mut self, deadline: Instant) -> std::io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.0.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("still running after {DEADLINE:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
