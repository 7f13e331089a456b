//! Another user on the node cannot host your job. A launcher's socket lies in a directory
//! private to its user, and every client checks the broker's uid before it sends a byte.
//!
//! The attacker here is a real process running as uid 65534 ("nobody"). It takes paths first in
//! a shared, sticky, world-writable directory, as any user can in `/tmp`. The tests need root
//! (to run a process as another uid) and skip, saying so, without it.

mod common;

use common::{TempDir, binary_for_any_uid, finish, spawn};
use shmbroker_test_support::process::ChildGuard;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NOBODY: u32 = 65534;

/// How many times each attack is made: `SQUAT_TRIALS`, 3 by default.
fn trials() -> usize {
    std::env::var("SQUAT_TRIALS").map_or(3, |n| n.parse().unwrap())
}

/// A shared directory as `/tmp` is (sticky, world-writable), and a copy of the binary that
/// uid 65534 can run.
struct Node {
    shared: TempDir,
    _bin: TempDir,
    program: PathBuf,
}

impl Node {
    fn new(name: &str) -> Self {
        let shared = TempDir::new(&format!("{name}-tmp")).unwrap();
        std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let bin = TempDir::new(&format!("{name}-bin")).unwrap();
        let program = binary_for_any_uid(bin.path());
        Self {
            shared,
            _bin: bin,
            program,
        }
    }

    /// `shmbroker ARGS` as `uid`, with only `vars` and this node's runtime directory in its
    /// environment.
    fn command(&self, uid: u32, args: &[&str], vars: &[(&str, String)]) -> Command {
        let mut command = Command::new(&self.program);
        command
            .args(args)
            .env_clear()
            .env("XDG_RUNTIME_DIR", self.shared.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, value) in vars {
            command.env(name, value);
        }
        if uid != 0 {
            command.uid(uid).gid(uid);
        }
        command
    }

    /// A worker of a torchrun job `run_id` as `uid`: rank `rank` of `world`.
    fn torchrun_worker(&self, uid: u32, rank: u32, world: u32, run_id: &str) -> ChildGuard {
        let vars = [
            ("LOCAL_RANK", rank.to_string()),
            ("LOCAL_WORLD_SIZE", world.to_string()),
            ("TORCHELASTIC_RUN_ID", run_id.to_owned()),
            ("TORCHELASTIC_RESTART_COUNT", "0".to_owned()),
        ];
        spawn(&mut self.command(uid, &worker_args(), &vars))
    }

    /// The squatter's broker on `socket`, open to everyone and admitting root, once it listens.
    fn squatter_broker(&self, socket: &Path) -> ChildGuard {
        let args = [
            "serve",
            "--socket",
            socket.to_str().unwrap(),
            "--workers",
            "2",
            "--socket-mode",
            "0666",
            "--allow-uid",
            "0",
        ];
        let child = spawn(&mut self.command(NOBODY, &args, &[]));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "the squatter never listened");
            std::thread::sleep(Duration::from_millis(5));
        }
        child
    }

    /// Runs `command` as uid 65534 and checks it succeeded.
    fn as_nobody(&self, program: &str, args: &[&str]) {
        let status = Command::new(program)
            .args(args)
            .uid(NOBODY)
            .gid(NOBODY)
            .status()
            .unwrap();
        assert!(status.success(), "{program} {args:?} as nobody: {status}");
    }
}

fn worker_args() -> Vec<&'static str> {
    vec![
        "worker",
        "--from-env",
        "--selftest",
        "--repeat",
        "2",
        "--timeout-ms",
        "20000",
    ]
}

fn is_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("skipped: running the attacker as another uid needs root");
    false
}

/// Waits for every worker (with the tests' deadline): each must fail saying all of `texts`.
fn all_fail_saying(workers: Vec<ChildGuard>, texts: &[&str]) {
    for (rank, worker) in workers.into_iter().enumerate() {
        let (ok, stdout, stderr) = finish(worker);
        assert!(!ok, "rank {rank} ran: {stdout}");
        assert!(
            texts.iter().all(|text| stderr.contains(text)),
            "rank {rank}: {stderr}"
        );
    }
}

/// Stops the squatter and returns what it logged.
fn squatter_log(broker: ChildGuard) -> String {
    let pid = nix::unistd::Pid::from_raw(broker.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let (_, stdout, stderr) = finish(broker);
    stdout + &stderr
}

#[test]
fn a_squatted_socket_directory_fails_the_job_closed_naming_its_owner() {
    if !is_root() {
        return;
    }
    for trial in 0..trials() {
        let node = Node::new(&format!("squat-dir-{trial}"));
        let run_id = "none";
        // The attacker makes root's directory first and listens where rank 0 would.
        let dir = node.shared.join("shmbroker-0");
        node.as_nobody("mkdir", &["-m", "0777", dir.to_str().unwrap()]);
        let ppid = std::process::id();
        let socket = dir.join(format!("torchrun-none-ppid{ppid}-r0.sock"));
        let squatter = node.squatter_broker(&socket);
        let workers: Vec<ChildGuard> = (0..2)
            .map(|rank| node.torchrun_worker(0, rank, 2, run_id))
            .collect();
        all_fail_saying(
            workers,
            &["is not a private directory", "owned by uid 65534"],
        );
        let log = squatter_log(squatter);
        assert!(!log.contains("INFO logged on"), "trial {trial}: {log}");
    }
}

#[test]
fn a_plain_file_in_place_of_the_directory_fails_the_job_closed() {
    if !is_root() {
        return;
    }
    let node = Node::new("squat-file");
    let dir = node.shared.join("shmbroker-0");
    node.as_nobody("touch", &[dir.to_str().unwrap()]);
    let workers: Vec<ChildGuard> = (0..2)
        .map(|rank| node.torchrun_worker(0, rank, 2, "job"))
        .collect();
    all_fail_saying(workers, &["is not a private directory", "not a directory"]);
}

#[test]
fn a_broker_of_another_user_is_refused_before_anything_is_sent() {
    if !is_root() {
        return;
    }
    for trial in 0..trials() {
        let node = Node::new(&format!("squat-sock-{trial}"));
        let socket = node.shared.join("job.sock");
        let squatter = node.squatter_broker(&socket);
        // The job was told this path, and its broker is "external": only the check stands
        // between its ranks and the squatter.
        let vars = |rank: u32| {
            vec![
                ("SHMBROKER_RANK", rank.to_string()),
                ("SHMBROKER_WORLD_SIZE", "2".to_owned()),
                ("SHMBROKER_SOCKET", socket.display().to_string()),
                ("SHMBROKER_BROKER", "external".to_owned()),
            ]
        };
        let workers: Vec<ChildGuard> = (0..2)
            .map(|rank| spawn(&mut node.command(0, &worker_args(), &vars(rank))))
            .collect();
        all_fail_saying(workers, &["runs as uid 65534", "SHMBROKER_BROKER_UID"]);
        // `status` asks nothing of it either.
        let args = ["status", "--socket", socket.to_str().unwrap()];
        let (ok, _, stderr) = finish(spawn(&mut node.command(0, &args, &[])));
        assert!(!ok && stderr.contains("runs as uid 65534"), "{stderr}");
        // Trusted by name, the same broker is reached (and admits root).
        let mut trusted = vars(0);
        trusted.push(("SHMBROKER_BROKER_UID", NOBODY.to_string()));
        let mut worker = node.command(
            0,
            &["worker", "--from-env", "--timeout-ms", "300"],
            &trusted,
        );
        let (_, _, stderr) = finish(spawn(&mut worker));
        assert!(!stderr.contains("runs as uid"), "{stderr}");
        let log = squatter_log(squatter);
        assert_eq!(
            log.matches("INFO logged on").count(),
            1,
            "trial {trial}: only the worker that trusted it: {log}"
        );
    }
}

#[test]
fn two_users_jobs_with_one_launcher_id_never_meet() {
    if !is_root() {
        return;
    }
    for trial in 0..trials() {
        let node = Node::new(&format!("two-users-{trial}"));
        // torchrun's default run id, and one parent for both jobs: the same job name.
        let jobs: Vec<Vec<ChildGuard>> = [0, NOBODY]
            .into_iter()
            .map(|uid| {
                (0..2)
                    .map(|rank| node.torchrun_worker(uid, rank, 2, "none"))
                    .collect()
            })
            .collect();
        for (uid, job) in [0, NOBODY].into_iter().zip(jobs) {
            for (rank, worker) in job.into_iter().enumerate() {
                let (ok, stdout, stderr) = finish(worker);
                assert!(ok, "trial {trial}: uid {uid} rank {rank}: {stdout}{stderr}");
                assert!(stdout.contains(&format!("rank {rank} of 2")), "{stdout}");
            }
        }
        for uid in [0, NOBODY] {
            let dir = node.shared.join(format!("shmbroker-{uid}"));
            let meta = std::fs::symlink_metadata(&dir).unwrap();
            assert_eq!(meta.permissions().mode() & 0o777, 0o700, "{dir:?}");
            assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), uid, "{dir:?}");
        }
    }
}
