//! `regroup-worker`: the scenario of issue 44, run by `shmbroker run -n 3 --restart 1`.
//!
//! Rank 1 sends rank 0 a message and kills itself (SIGKILL) `--die-after-ms` later, in its
//! first process only; the launcher starts it again. Rank 2, which has nothing to say to rank
//! 1, sends rank 0 its own message and makes the whole world's group at once. Each survivor
//! and the replacement then recover the world's group in the way `--way` names, pass a barrier
//! on it and check it with an all-gather of each member's incarnation (`[0, 1, 0]`: rank 1 is
//! the replacement). On an error they start again, until `--timeout-ms`.
//!
//! Each rank prints one line, `rank R done at T ms: group [0, 1, 2], incarnations [0, 1, 0]`
//! (T in `CLOCK_REALTIME` milliseconds), and the replacement also `rank 1 logged on at T ms`,
//! so that a test measures the time from the replacement's logon to the last barrier.

use shmbroker::Collectives;
use shmbroker::{Error, Group, ReduceOp, Session};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How the ranks recover the world's group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Way {
    /// `regroup`, the one recovery call.
    Regroup,
    /// `group`, called again on every error.
    Group,
    /// `wait_for_rank` for every rank, then `group`, again on every error.
    WaitThenGroup,
}

/// The worker's arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// How to recover the world's group.
    #[arg(long, value_enum, default_value = "regroup")]
    way: Way,
    /// How long rank 1's first process lives after sending its message.
    #[arg(long, value_name = "MS", default_value_t = 300)]
    die_after_ms: u64,
    /// How long each rank keeps trying.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    timeout_ms: u64,
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis())
}

/// Runs one rank of the scenario.
///
/// # Errors
///
/// The last error when the group was not recovered in time.
pub fn run(args: &Args) -> Result<(), String> {
    run_rank(args).map_err(|error| error.to_string())
}

fn run_rank(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let timeout = Duration::from_millis(args.timeout_ms);
    let mut session = Session::from_env(timeout)?;
    session.set_timeout(Duration::from_secs(5));
    let (rank, world) = (session.rank(), session.world_size());
    if world != 3 {
        return Err(format!("the scenario needs 3 ranks, not {world}").into());
    }
    if session.rejoined() {
        println!("rank {rank} logged on at {} ms", now_ms());
    } else {
        match rank {
            0 => {
                // Rank 1's message and rank 2's, whatever happens to rank 1 afterwards.
                for from in [1, 2] {
                    let message = session.recv(from)?;
                    if message != format!("hello from {from}").as_bytes() {
                        return Err(format!("rank {from} sent {message:?}").into());
                    }
                }
            }
            1 => {
                session.send(0, b"hello from 1")?;
                std::thread::sleep(Duration::from_millis(args.die_after_ms));
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
                unreachable!("SIGKILL returned");
            }
            _ => session.send(0, b"hello from 2")?,
        }
    }
    let ranks: Vec<u32> = (0..world).collect();
    let deadline = Instant::now() + timeout;
    let mut last = None;
    while Instant::now() < deadline {
        match recover(&mut session, args.way, &ranks, deadline) {
            Ok(incarnations) => {
                println!(
                    "rank {rank} done at {} ms: group {ranks:?}, incarnations {incarnations:?}",
                    now_ms()
                );
                return Ok(());
            }
            Err(error) => {
                // Once per new error: `group` called again at once can fail many times.
                let text = error.to_string();
                if last.as_ref() != Some(&text) {
                    eprintln!("rank {rank}: {text}; again");
                }
                last = Some(text);
            }
        }
    }
    Err(last.unwrap_or_else(|| "no time to try".into()).into())
}

/// One try: the world's group, a barrier on it, and every member's incarnation.
fn recover(
    session: &mut Session,
    way: Way,
    ranks: &[u32],
    deadline: Instant,
) -> Result<Vec<u32>, Error> {
    let left = deadline.saturating_duration_since(Instant::now());
    let group: Group = match way {
        Way::Regroup => session.regroup(ranks, left)?,
        Way::Group => session.group(ranks)?,
        Way::WaitThenGroup => {
            let me = session.rank();
            for &rank in ranks.iter().filter(|&&rank| rank != me) {
                session.with_timeout(left).wait_for_rank(rank)?;
            }
            session.group(ranks)?
        }
    };
    session.on(&group).barrier()?;
    let mut incarnation = [0u32; 3];
    incarnation[group.rank() as usize] = session.rejoins();
    session
        .on(&group)
        .all_reduce(&mut incarnation, ReduceOp::Sum)?;
    Ok(incarnation.to_vec())
}
