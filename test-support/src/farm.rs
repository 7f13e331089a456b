//! `farm-worker`: a task farm's worker: takes tasks from rank 0, answers each with its id and a
//! checksum. For the farm tests (`tests/farm.rs`).
//!
//! A task is its id (8 bytes, little-endian) followed by any bytes; the answer is the id and the
//! FNV-1a hash of the whole task. An empty task means "stop".

use shmbroker::Session;
use std::time::Duration;

/// `farm-worker`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Log on to the broker at PATH.
    #[arg(long, value_name = "PATH")]
    socket: String,
    /// The rank to ask for.
    #[arg(long)]
    rank: u32,
    /// Deadline of the logon and of every call.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    timeout_ms: u64,
    /// Time each task takes, in microseconds (a sleep: it costs no CPU).
    #[arg(long, value_name = "US", default_value_t = 0)]
    task_us: u64,
    /// On the first task, answer N made-up tasks at once, print `burst sent`, and hang (for a
    /// test that kills this worker with its last answers still unread).
    #[arg(long, value_name = "N")]
    burst_then_hang: Option<u64>,
    /// Hostile: on the first task, close this worker's ends of every ring with CAUSE written as
    /// the cause (a rank: its death, a lie while it is alive; with bit 31 set, a timeout waiting
    /// for the rank in the other bits), print `forged`, and hang, alive, without answering.
    #[arg(long, value_name = "CAUSE")]
    leave_citing: Option<u32>,
}

/// FNV-1a, 64 bits.
#[must_use]
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The answer to `task`.
#[must_use]
pub fn answer(task: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    let id = task.len().min(8);
    out[..id].copy_from_slice(&task[..id]);
    out[8..].copy_from_slice(&fnv1a(task).to_le_bytes());
    out
}

pub fn run(args: &Args) -> Result<(), String> {
    let timeout = Duration::from_millis(args.timeout_ms);
    let mut session = Session::connect(&args.socket, Some(args.rank), timeout)
        .map_err(|error| format!("logon: {error}"))?;
    session.set_timeout(timeout);
    serve(&mut session, args).map_err(|error| format!("rank {}: {error}", args.rank))
}

fn serve(session: &mut Session, args: &Args) -> Result<(), shmbroker::Error> {
    loop {
        let task = session.recv(0)?;
        if task.is_empty() {
            return Ok(());
        }
        if let Some(cited) = args.leave_citing {
            forge_leaving(session, cited);
            say("forged");
            std::thread::sleep(Duration::from_millis(args.timeout_ms));
            return Ok(());
        }
        if let Some(burst) = args.burst_then_hang {
            for id in 0..burst {
                let mut made_up = (u64::MAX - id).to_le_bytes().to_vec();
                made_up.extend_from_slice(b"last words");
                session.send(0, &answer(&made_up))?;
            }
            say("burst sent");
            // Until the test kills it, and never past its own deadline.
            std::thread::sleep(Duration::from_millis(args.timeout_ms));
            return Ok(());
        }
        if args.task_us > 0 {
            std::thread::sleep(Duration::from_micros(args.task_us));
        }
        session.send(0, &answer(&task))?;
    }
}

/// Closes this worker's ends of every ring the way a worker leaving after `cited` died does,
/// without that death or the leaving: the claim peers must check before believing it.
fn forge_leaving(session: &mut Session, cited: u32) {
    use shmbroker::queues::Role;
    let connection = session.raw();
    for peer in 0..connection.world_size() {
        if let Some(link) = connection.link(peer) {
            link.to.closer().close_end_citing(Role::Producer, cited);
            link.from.closer().close_end_citing(Role::Consumer, cited);
        }
    }
}

/// Prints `line` on standard output at once (a test waits for it).
fn say(line: &str) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_shorter_than_an_id_is_answered_not_a_panic() {
        let short = answer(&[1, 2, 3]);
        assert_eq!(&short[..8], &[1, 2, 3, 0, 0, 0, 0, 0]);
        assert_eq!(&short[8..], &fnv1a(&[1, 2, 3]).to_le_bytes());
    }
}
