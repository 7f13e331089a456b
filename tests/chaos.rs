//! The chaos suite: `chaos` (a binary of this crate) kills and corrupts real worker processes at random moments
//! (every scenario, every operation) and must find no hang, no leaked fd, no misnamed rank and no
//! process killed by a signal the trial did not send. Timings are reported, never asserted: see
//! the guide (docs/guide, "Guarantees") for a 500-trial run.

mod common;

use common::{finish, spawn};
use std::process::{Command, Stdio};

#[test]
fn thirty_trials_of_kills_broker_deaths_scribbles_forks_and_leaves_hang_leak_and_misname_nothing() {
    chaos_finds_nothing(4, 30);
}

#[test]
fn ten_workers_past_the_flat_algorithms_hang_leak_and_misname_nothing() {
    // Ten ranks: the barrier disseminates, broadcasts and gathers go down (and up) a binomial
    // tree and all_gather_into goes by Bruck's algorithm, all while a rank in the middle of them
    // is killed; on 2 CPUs the ranks also wait crowded (yielding).
    chaos_finds_nothing(10, 10);
}

/// `chaos --soak 12`: one job of 4 ranks for 12 s, every operation at random sizes, workers
/// killed and started again at random moments, each replacement rejoining: no wrong result, no
/// hang, and the long-lived processes' memory and fds within the soak's bounds.
#[test]
fn a_short_soak_with_kills_and_rejoins_finds_nothing() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_chaos"));
    command
        .args(["--soak", "12", "--workers", "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (ok, stdout, stderr) = finish(spawn(&mut command));
    eprintln!("{stderr}");
    assert!(ok, "{stdout}\n{stderr}");
    // "soak: 12 s, 4 ranks, seed S: R rounds checked, K kills and rejoins": both above 0.
    let (checked, kills) = stderr
        .lines()
        .find_map(|line| line.rsplit_once(": ")?.1.strip_suffix(" kills and rejoins"))
        .and_then(|counts| counts.split_once(" rounds checked, "))
        .map_or((0, 0), |(rounds, kills)| {
            (
                rounds.parse::<u64>().unwrap_or(0),
                kills.parse::<u64>().unwrap_or(0),
            )
        });
    assert!(checked > 0 && kills > 0, "{stderr}");
}

/// `chaos --rejoin 10`: jobs of 4 ranks under `shmbroker run --restart 3` in which ranks die at
/// random moments (inside `regroup`, collectives, logons and rejoins) while every rank recovers
/// the world's group: no hang, no failed job, every rank ending in the same group.
#[test]
fn ten_jobs_of_deaths_and_rejoins_during_regroup_end_in_one_group() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_chaos"));
    command
        .args(["--rejoin", "10", "--workers", "4", "--launcher"])
        .arg(env!("CARGO_BIN_EXE_shmbroker-under-test"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (ok, stdout, stderr) = finish(spawn(&mut command));
    eprintln!("{stderr}");
    assert!(ok, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("10 trials of 4 ranks") && stderr.contains(": 0 hangs, 0 failed"),
        "{stderr}"
    );
}

/// Symmetric all-reduces of 4 ranks at every piece size (the chaos module's
/// `SYMMETRIC_LENGTHS`): 170 trials with a rank killed at a random moment (510 survivor
/// reports), then 100 with a rank leaving between two calls. Every survivor names the victim, or
/// after a leave a rank that left before it. A rank may give a result slice back and depart
/// before the last wait reads its acknowledgement: that acknowledgement is no protocol error.
#[test]
fn kills_during_symmetric_all_reduces_at_every_piece_size() {
    for (scenario, trials) in [("kill", 170), ("leave", 100)] {
        let json = chaos_json(4, trials, &["--scenario", scenario, "--op", "symmetric"]);
        assert!(
            json.contains(&format!("\"scenario\":\"{scenario}\",\"op\":\"symmetric\"")),
            "{json}"
        );
    }
}

/// `trials` chaos trials of `workers` workers, every scenario: no hang, no leaked fd, no
/// misnamed rank, no stray signal, and every survivor reporting.
fn chaos_finds_nothing(workers: u32, trials: u32) {
    let json = chaos_json(workers, trials, &[]);
    // Every scenario ran.
    for scenario in ["kill", "broker", "scribble", "fork", "leave"] {
        assert!(
            json.contains(&format!("\"scenario\":\"{scenario}\"")),
            "{scenario} never ran: {json}"
        );
    }
}

/// Runs `trials` chaos trials of `workers` workers, with `args` besides, and checks their report:
/// no hang, no leaked fd, no misnamed rank, no stray signal, and every survivor reporting.
/// Returns the report as JSON.
fn chaos_json(workers: u32, trials: u32, args: &[&str]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_chaos"));
    let (workers_arg, trials_arg) = (workers.to_string(), trials.to_string());
    command
        // A hang here is a survivor still running 10 s after the kill (the calls' deadline is
        // 20 s): generous for a loaded machine; the README's runs use 1 s.
        .args(["--trials", &trials_arg, "--workers", &workers_arg])
        .args(["--json", "--hang-ms", "10000"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (ok, stdout, stderr) = finish(spawn(&mut command));
    // The report line, for the log of whoever runs this.
    eprintln!("{stderr}{}", stdout.lines().last().unwrap_or_default());
    assert!(ok, "{stdout}\n{stderr}");
    let json = stdout.lines().next().unwrap_or_default().to_owned();
    for wanted in [
        format!("\"trials\":{trials},"),
        "\"hangs\":0,".into(),
        "\"misnamed\":0,".into(),
        "\"broker_fds_leaked\":0,".into(),
        "\"survivor_fds_leaked\":0,".into(),
        "\"signalled\":0,".into(),
    ] {
        assert!(json.contains(&wanted), "{wanted} missing from {json}");
    }
    // Each trial with its survivors reporting.
    assert_eq!(json.matches("\"detection_ms\":[").count(), trials as usize);
    assert!(
        !json.contains("\"detection_ms\":[]"),
        "a trial with no survivor report: {json}"
    );
    json
}
