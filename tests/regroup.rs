//! Issue 44's scenario, with real processes under `shmbroker run -n 3 --restart 1`: rank 1 is
//! killed 300 ms after sending rank 0 a message, while rank 2 is already making the world's
//! group. Whichever way the survivors recover (`regroup`; `group` again on every error;
//! `wait_for_rank` then `group`), every rank ends in one group of the same processes and passes
//! a barrier on it. `REGROUP_TRIALS` runs each way that many times (2 by default) and prints the
//! time from the replacement's logon to the last rank's barrier, median and worst.

use std::process::Command;

mod common;

use common::TempDir;

/// One run of the scenario recovered `way`: milliseconds from the replacement's logon to the
/// last rank done.
fn scenario(way: &str, trial: u32) -> i128 {
    let tmp = TempDir::new("regroup").unwrap();
    let worker = env!("CARGO_BIN_EXE_regroup-worker");
    let mut command: Command = common::shmbroker(&["run"]);
    command
        .args(["-n", "3", "--restart", "1", "--", worker, "--way", way])
        .env("TMPDIR", tmp.path());
    let (status, stdout, stderr) = common::finish_status(common::spawn(&mut command));
    let failed =
        |what: &str| format!("{way}, trial {trial}: {what}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(status.code(), Some(0), "{}", failed("the job failed"));
    let time_of = |line: &str| -> i128 {
        let at = line.split(" at ").nth(1).unwrap();
        at.split(" ms").next().unwrap().parse().unwrap()
    };
    let logon = stdout
        .lines()
        .find(|line| line.starts_with("rank 1 logged on at "))
        .map(time_of)
        .unwrap_or_else(|| panic!("{}", failed("no replacement logged on")));
    let mut last = logon;
    for rank in 0..3 {
        let done = format!("rank {rank} done at ");
        let line = stdout
            .lines()
            .find(|line| line.starts_with(&done))
            .unwrap_or_else(|| panic!("{}", failed(&format!("rank {rank} did not finish"))));
        assert!(
            line.ends_with(": group [0, 1, 2], incarnations [0, 1, 0]"),
            "{}",
            failed(line)
        );
        last = last.max(time_of(line));
    }
    last - logon
}

fn ways(way: &str) {
    let trials: u32 = std::env::var("REGROUP_TRIALS").map_or(2, |n| n.parse().unwrap());
    let mut took: Vec<i128> = (0..trials).map(|trial| scenario(way, trial)).collect();
    took.sort_unstable();
    eprintln!(
        "{way}: {trials} of {trials} recovered; replacement's logon to the last barrier: median \
         {} ms, worst {} ms",
        took[took.len() / 2],
        took[took.len() - 1]
    );
}

#[test]
fn survivors_that_regroup_meet_the_replacement_in_one_group() {
    ways("regroup");
}

#[test]
fn survivors_that_call_group_again_on_every_error_converge() {
    ways("group");
}

#[test]
fn survivors_that_wait_for_every_rank_then_group_converge() {
    ways("wait-then-group");
}
