//! `farm-worker`: a task farm's worker: takes tasks from rank 0, answers each with its id and a
//! checksum. For the farm tests (`tests/farm.rs`).
//!
//! With `--job TASKS` it is a whole farm under a launcher (`shmbroker run -n N --restart 1 --
//! farm-worker --job 2000 ...`): rank 0 reads, the others work, and a worker may die on
//! purpose (`--die-rank`, `--die-after`). The reader keeps every worker busy with one task at a
//! time, takes answers from any of them, and never stops: a task whose worker died is reported
//! lost, naming that rank, and given to another; a worker's replacement (`PeerRejoined`) is given
//! tasks again at once. At the end every task must have been answered exactly once, rightly.
//!
//! A task is its id (8 bytes, little-endian) followed by any bytes; the answer is the id and the
//! FNV-1a hash of the whole task. An empty task means "stop".

use shmbroker::Session;
use std::time::Duration;

/// `farm-worker`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Log on to the broker at PATH (without `--job`).
    #[arg(long, value_name = "PATH", required_unless_present = "job")]
    socket: Option<String>,
    /// The rank to ask for (without `--job`).
    #[arg(long, required_unless_present = "job")]
    rank: Option<u32>,
    /// A whole farm of TASKS tasks under a launcher (see the module docs).
    #[arg(long, value_name = "TASKS")]
    job: Option<u64>,
    /// With `--job`: this rank kills itself (SIGKILL) after `--die-after` tasks, in its first
    /// process only (no `SHMBROKER_RESTART_COUNT`), or in every one with `--die-always`.
    #[arg(long, value_name = "RANK")]
    die_rank: Option<u32>,
    /// With `--die-rank`: tasks answered before dying.
    #[arg(long, value_name = "N", default_value_t = 100)]
    die_after: u64,
    /// With `--die-rank`: die in every process of that rank, restarted or not.
    #[arg(long)]
    die_always: bool,
    /// With `--job`: the reader waits for a dead worker's replacement as soon as it learns of
    /// the death, and gives it the next task, so that a test sees the replacement work however
    /// fast the other workers finish the farm.
    #[arg(long)]
    await_replacements: bool,
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
    /// Instead of working: make a channel of u64 records to rank 0 (tag 7), send 0 to N - 1
    /// on it, print `streamed`, and hang with the channel open (for a test that kills this
    /// worker and expects rank 0 to receive every record, then its death).
    #[arg(long, value_name = "N")]
    channel_records: Option<u64>,
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
    if let Some(tasks) = args.job {
        return job(args, tasks, timeout);
    }
    let (Some(socket), Some(rank)) = (&args.socket, args.rank) else {
        return Err("--socket and --rank are needed without --job".into());
    };
    let mut session =
        Session::connect(socket, Some(rank), timeout).map_err(|error| format!("logon: {error}"))?;
    session.set_timeout(timeout);
    if let Some(records) = args.channel_records {
        let mut channel = session
            .channel_to::<u64>(0, 7, 1 << 16)
            .map_err(|error| format!("channel_to: {error}"))?;
        for n in 0..records {
            channel
                .send(&n)
                .map_err(|error| format!("channel send: {error}"))?;
        }
        println!("streamed");
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    serve(&mut session, args).map_err(|error| format!("rank {rank}: {error}"))
}

/// `--job`: the whole farm, this process being the rank its launcher says.
fn job(args: &Args, tasks: u64, timeout: Duration) -> Result<(), String> {
    let started = std::time::Instant::now();
    let mut session = Session::from_env(timeout).map_err(|error| format!("logon: {error}"))?;
    session.set_timeout(timeout);
    let rank = session.rank();
    if rank == 0 {
        return read(&mut session, tasks, args.await_replacements)
            .map_err(|error| format!("reader: {error}"));
    }
    let restarted = std::env::var_os("SHMBROKER_RESTART_COUNT").is_some();
    if restarted != session.rejoined() {
        return Err(format!(
            "rank {rank}: restarted by the launcher: {restarted}; rejoined: {}",
            session.rejoined()
        ));
    }
    let dies = args.die_rank == Some(rank) && (args.die_always || !restarted);
    let mut answered = 0u64;
    loop {
        let task = session
            .recv(0)
            .map_err(|error| format!("rank {rank}: {error}"))?;
        if task.is_empty() {
            return Ok(());
        }
        session
            .send(0, &answer(&task))
            .map_err(|error| format!("rank {rank}: {error}"))?;
        answered += 1;
        if answered == 1 && restarted {
            say(&format!(
                "rank {rank} (restart {}) answered its first task {:.1} ms after it started",
                session.rejoins(),
                started.elapsed().as_secs_f64() * 1e3
            ));
        }
        if dies && answered == args.die_after {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// The reader of `--job`: `tasks` tasks, one at a time per worker, answers from any worker.
fn read(
    session: &mut Session,
    tasks: u64,
    await_replacements: bool,
) -> Result<(), shmbroker::Error> {
    use std::collections::{BTreeMap, HashSet, VecDeque};
    let world = session.world_size();
    let mut queue: VecDeque<u64> = (0..tasks).collect();
    // The task each worker holds, and the workers free for one.
    let mut holding: BTreeMap<u32, u64> = BTreeMap::new();
    let mut free: VecDeque<u32> = (1..world).collect();
    let mut answered: HashSet<u64> = HashSet::new();
    let (mut lost, mut rejoined) = (0u64, 0u64);
    // Replacements taken on by waiting for them, per rank.
    let mut awaited: BTreeMap<u32, u32> = BTreeMap::new();
    let task = |id: u64| {
        let mut bytes = id.to_le_bytes().to_vec();
        bytes.extend((0..56u64).map(|i| (i ^ id.wrapping_mul(31)) as u8));
        bytes
    };
    while (answered.len() as u64) < tasks {
        while let (Some(&worker), Some(&id)) = (free.front(), queue.front()) {
            free.pop_front();
            match session.send(worker, &task(id)) {
                Ok(()) => {
                    queue.pop_front();
                    holding.insert(worker, id);
                }
                // It died since its last answer: `recv_any` reports it (once) and its
                // replacement; the task goes to another worker.
                Err(shmbroker::Error::PeerLost { rank, .. }) if rank == worker => {}
                Err(other) => return Err(other),
            }
        }
        match session.recv_any() {
            Ok((worker, reply)) => {
                let Some(id) = holding.remove(&worker) else {
                    return Err(shmbroker::Error::Misuse(format!(
                        "rank {worker} answered a task it was not given"
                    )));
                };
                if reply[..] != answer(&task(id)) {
                    return Err(shmbroker::Error::Misuse(format!(
                        "rank {worker} answered task {id} wrongly"
                    )));
                }
                if !answered.insert(id) {
                    return Err(shmbroker::Error::Misuse(format!(
                        "task {id} answered twice (by rank {worker})"
                    )));
                }
                free.push_back(worker);
            }
            Err(shmbroker::Error::PeerLost { rank, .. }) => {
                if let Some(id) = holding.remove(&rank) {
                    say(&format!(
                        "task {id} lost with rank {rank}, which died; given again"
                    ));
                    queue.push_front(id);
                    lost += 1;
                }
                free.retain(|&worker| worker != rank);
                if await_replacements {
                    // Taken on here, so `recv_any` reports no `PeerRejoined` for it.
                    session.wait_for_rank(rank)?;
                    let times = awaited.entry(rank).or_default();
                    *times += 1;
                    say(&format!("rank {rank} rejoined (replacement {times})"));
                    free.push_front(rank);
                    rejoined += 1;
                } else if holding.is_empty() && free.is_empty() {
                    // With every worker dead, each look says so until one comes back.
                    session.wait_for_rank(rank)?;
                    free.push_back(rank);
                    rejoined += 1;
                }
            }
            Err(shmbroker::Error::PeerRejoined { rank, times }) => {
                // A task given to the rank before it came back went to a process that never
                // took it (one that died, or one that never logged on): it is given again.
                if let Some(id) = holding.remove(&rank) {
                    say(&format!(
                        "task {id} lost with rank {rank}'s last process; given again"
                    ));
                    queue.push_front(id);
                    lost += 1;
                }
                say(&format!("rank {rank} rejoined (replacement {times})"));
                free.retain(|&worker| worker != rank);
                free.push_back(rank);
                if times > 0 {
                    rejoined += 1;
                }
            }
            Err(other) => return Err(other),
        }
    }
    // Every worker is told to stop, a replacement that has not rejoined yet included.
    for worker in 1..world {
        loop {
            match session.send(worker, &[]) {
                Ok(()) => break,
                Err(shmbroker::Error::PeerLost { rank, .. }) if rank == worker => {
                    session.wait_for_rank(worker)?;
                    rejoined += 1;
                }
                Err(other) => return Err(other),
            }
        }
    }
    say(&format!(
        "farm done: {tasks} tasks answered once each; {lost} lost with a dead rank and given \
         again; {rejoined} replacements"
    ));
    Ok(())
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
