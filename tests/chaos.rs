//! The chaos suite: `shmbroker chaos` kills and corrupts real worker processes at random moments
//! (every scenario, every operation) and must find no hang, no leaked fd, no misnamed rank and no
//! process killed by a signal the trial did not send. Timings are reported, never asserted: see
//! the README for a 500-trial run.

mod common;

use common::{finish, spawn};
use std::process::{Command, Stdio};

#[test]
fn thirty_trials_of_kills_broker_deaths_scribbles_forks_and_leaves_hang_leak_and_misname_nothing() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_shmbroker"));
    command
        // A hang here is a survivor still running 10 s after the kill (the calls' deadline is
        // 20 s): generous for a loaded machine; the README's runs use 1 s.
        .args(["chaos", "--trials", "30", "--json", "--hang-ms", "10000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (ok, stdout, stderr) = finish(spawn(&mut command));
    // The report line, for the log of whoever runs this.
    eprintln!("{stderr}{}", stdout.lines().last().unwrap_or_default());
    assert!(ok, "{stdout}\n{stderr}");
    let json = stdout.lines().next().unwrap_or_default();
    for wanted in [
        "\"trials\":30,",
        "\"hangs\":0,",
        "\"misnamed\":0,",
        "\"broker_fds_leaked\":0,",
        "\"survivor_fds_leaked\":0,",
        "\"signalled\":0,",
    ] {
        assert!(json.contains(wanted), "{wanted} missing from {json}");
    }
    // Every scenario ran, each with three survivors reporting.
    for scenario in ["kill", "broker", "scribble", "fork", "leave"] {
        assert!(
            json.contains(&format!("\"scenario\":\"{scenario}\"")),
            "{scenario} never ran: {json}"
        );
    }
    assert_eq!(json.matches("\"detection_ms\":[").count(), 30);
    assert!(
        !json.contains("\"detection_ms\":[]"),
        "a trial with no survivor report: {json}"
    );
}
