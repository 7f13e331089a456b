//! Workers in PID namespaces of their own, as containers that share a volume with the socket
//! run them (`unshare --pid --fork --mount-proc`, as root): they log on, run every collective
//! with fd exchange, and see each other die. Pid numbers differ, or are not visible at all,
//! across namespaces: peers are known by pidfd.
//!
//! Needs root (for `unshare --pid`); elsewhere each test says it skipped. CI runs as root.

mod common;

use common::TempDir;
use shmbroker_test_support::process::ChildGuard;
use std::process::Command;
use std::time::{Duration, Instant};

/// Whether PID namespaces can be made here; `false` (and why, on stderr) when not root.
fn namespaces() -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: PID namespaces need root (unshare --pid)");
        return false;
    }
    let made = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        made,
        "running as root, yet `unshare --pid --fork --mount-proc true` failed"
    );
    true
}

/// `shmbroker worker ARGS...` as rank `rank` of `socket`, in a PID namespace of its own.
fn contained_worker(socket: &str, rank: u32, args: &[&str]) -> ChildGuard {
    let rank = rank.to_string();
    let mut command = Command::new("unshare");
    command
        .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(common::SHMBROKER)
        .args([
            "worker",
            "--socket",
            socket,
            "--rank",
            &rank,
            "--timeout-ms",
            "60000",
        ])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    common::spawn(&mut command)
}

#[test]
fn workers_each_in_a_pid_namespace_of_their_own_run_every_collective_and_exchange_fds() {
    if !namespaces() {
        return;
    }
    let tmp = TempDir::new("containers-selftest").unwrap();
    let socket = tmp.path().join("broker.sock");
    let _broker = common::serve(&socket, &["--workers", "3"]);
    let socket = socket.to_str().unwrap();
    let workers: Vec<ChildGuard> = (0..3)
        .map(|rank| contained_worker(socket, rank, &["--selftest", "--repeat", "3"]))
        .collect();
    for (rank, worker) in workers.into_iter().enumerate() {
        let (ok, stdout, stderr) = common::finish(worker);
        assert!(ok, "rank {rank}:\n{stdout}{stderr}");
        // Each sees itself as pid 1, in its own namespace.
        assert!(stdout.contains("[worker pid 1]"), "rank {rank}: {stdout}");
    }
}

#[test]
fn a_kill_in_another_pid_namespace_is_seen_at_once_and_named() {
    if !namespaces() {
        return;
    }
    let tmp = TempDir::new("containers-kill").unwrap();
    let socket = tmp.path().join("broker.sock");
    let _broker = common::serve(&socket, &["--workers", "3"]);
    let socket = socket.to_str().unwrap();
    let loop_barriers = ["--selftest", "--only", "barrier", "--repeat", "100000000"];
    let survivors: Vec<ChildGuard> = (0..2)
        .map(|rank| contained_worker(socket, rank, &loop_barriers))
        .collect();
    let victim = contained_worker(socket, 2, &loop_barriers);
    // Let the job get going (the barriers need all three), then kill rank 2's process, the
    // first of its namespace, from outside it: the kernel ends everything in the namespace.
    std::thread::sleep(Duration::from_millis(500));
    let unshare = victim.id();
    let children =
        std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).unwrap();
    let worker: i32 = children.split_whitespace().next().unwrap().parse().unwrap();
    let killed = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    for (rank, survivor) in survivors.into_iter().enumerate() {
        let (ok, stdout, stderr) = common::finish(survivor);
        assert!(!ok, "rank {rank} went on: {stdout}");
        assert!(
            stderr.contains("peer rank 2 was lost"),
            "rank {rank} did not name rank 2:\n{stdout}{stderr}"
        );
    }
    // Not at a deadline (the workers' is 60 s): the watcher saw the pidfd across namespaces.
    let seen = killed.elapsed();
    eprintln!("both survivors failed {seen:?} after the kill");
    assert!(seen < Duration::from_secs(30), "{seen:?}");
    drop(victim);
}
