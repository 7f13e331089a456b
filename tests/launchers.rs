//! Zero-config start: workers started the way launchers start them, with nothing but
//! environment variables: no socket path, no broker started by hand. Each worker gets a cleared
//! environment plus the launcher's variables. Every child is waited for with a deadline.

mod common;

use common::{TempDir, finish};
use shmbroker_test_support::process::{ChildGuard, spawn_with_fds};
use std::path::Path;
use std::process::{Command, Stdio};

/// A `worker --from-env --selftest` with only `vars` (and `XDG_RUNTIME_DIR`) in its environment.
fn worker(runtime_dir: &Path, vars: &[(&str, String)]) -> ChildGuard {
    let mut command = Command::new(common::SHMBROKER);
    command
        .args([
            "worker",
            "--from-env",
            "--selftest",
            "--repeat",
            "2",
            "--timeout-ms",
            "60000",
        ])
        .env_clear()
        .env("XDG_RUNTIME_DIR", runtime_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in vars {
        command.env(name, value);
    }
    spawn_with_fds(&mut command, &[]).unwrap()
}

fn torchrun(rank: u32, world: u32, run_id: &str) -> Vec<(&'static str, String)> {
    vec![
        ("LOCAL_RANK", rank.to_string()),
        ("LOCAL_WORLD_SIZE", world.to_string()),
        ("TORCHELASTIC_RUN_ID", run_id.to_owned()),
    ]
}

fn all_pass(workers: Vec<ChildGuard>, world: u32) {
    for (rank, worker) in (0..).zip(workers) {
        let (ok, stdout, stderr) = finish(worker);
        assert!(ok, "rank {rank}: {stdout}{stderr}");
        assert!(
            stdout.contains(&format!("rank {rank} of {world}")),
            "{stdout}"
        );
    }
}

#[test]
fn torchrun_variables_start_a_world_with_no_broker_started_by_hand() {
    let dir = TempDir::new("torchrun").unwrap();
    let run_id = format!("run-{}", std::process::id());
    // Rank 0 last: the others wait for its broker, retrying within their deadlines.
    let workers: Vec<ChildGuard> = [1, 2, 0]
        .into_iter()
        .map(|rank| worker(dir.path(), &torchrun(rank, 3, &run_id)))
        .collect();
    let mut ordered: Vec<(u32, ChildGuard)> = [1, 2, 0].into_iter().zip(workers).collect();
    ordered.sort_by_key(|(rank, _)| *rank);
    all_pass(ordered.into_iter().map(|(_, w)| w).collect(), 3);
    assert!(
        !dir.path()
            .join(format!("shmbroker-torchrun-{run_id}.sock"))
            .exists(),
        "rank 0's broker left its socket behind"
    );
}

#[test]
fn slurm_variables_start_a_world() {
    let dir = TempDir::new("slurm").unwrap();
    let workers = (0..2)
        .map(|rank: u32| {
            worker(
                dir.path(),
                &[
                    ("SLURM_LOCALID", rank.to_string()),
                    ("SLURM_TASKS_PER_NODE", "2(x3)".into()),
                    ("SLURM_NODEID", "1".into()),
                    ("SLURM_JOB_ID", std::process::id().to_string()),
                    ("SLURM_STEP_ID", "0".into()),
                ],
            )
        })
        .collect();
    all_pass(workers, 2);
}

#[test]
fn two_jobs_on_one_node_never_meet() {
    let dir = TempDir::new("twojobs").unwrap();
    let jobs: Vec<Vec<ChildGuard>> = ["a", "b"]
        .iter()
        .map(|job| {
            let run_id = format!("{job}-{}", std::process::id());
            (0..2)
                .map(|rank| worker(dir.path(), &torchrun(rank, 2, &run_id)))
                .collect()
        })
        .collect();
    // Both worlds of 2 complete: had they met, one broker would have seen 4 logons for 2 ranks.
    for job in jobs {
        all_pass(job, 2);
    }
}

#[test]
fn a_socket_left_by_a_crashed_job_does_not_block_a_new_one() {
    let dir = TempDir::new("leftover").unwrap();
    let run_id = format!("crashed-{}", std::process::id());
    // What a job killed with SIGKILL leaves: a socket file nobody listens on.
    drop(
        std::os::unix::net::UnixListener::bind(
            dir.join(format!("shmbroker-torchrun-{run_id}.sock")),
        )
        .unwrap(),
    );
    let workers = (0..2)
        .map(|rank| worker(dir.path(), &torchrun(rank, 2, &run_id)))
        .collect();
    all_pass(workers, 2);
}

#[test]
fn missing_or_contradicting_variables_are_named() {
    let dir = TempDir::new("badenv").unwrap();
    let (ok, _, stderr) = finish(worker(dir.path(), &[("LOCAL_RANK", "0".into())]));
    assert!(!ok);
    assert!(
        stderr.contains("LOCAL_RANK is set but LOCAL_WORLD_SIZE is not"),
        "{stderr}"
    );
    let (ok, _, stderr) = finish(worker(dir.path(), &[]));
    assert!(!ok);
    assert!(
        stderr.contains("set SHMBROKER_RANK and SHMBROKER_WORLD_SIZE"),
        "{stderr}"
    );
}

#[test]
fn rank_0_that_finds_a_broker_already_there_says_to_set_shmbroker_broker() {
    let dir = TempDir::new("already").unwrap();
    let socket = dir.join("served.sock");
    let _broker = common::serve(&socket, &["--workers", "2"]);
    let vars = [
        ("SHMBROKER_RANK", "0".to_owned()),
        ("SHMBROKER_WORLD_SIZE", "2".to_owned()),
        ("SHMBROKER_SOCKET", socket.display().to_string()),
    ];
    let (ok, _, stderr) = finish(worker(dir.path(), &vars));
    assert!(!ok);
    assert!(
        stderr.contains("a broker is already listening on")
            && stderr.contains("set SHMBROKER_BROKER=external"),
        "{stderr}"
    );
}
