//! `shmbroker serve` as a long-running service, with real processes: job after job on one socket,
//! `--once`, required `--workers`, the fd limit, a flood of bad notices into a stalled log, and
//! `--socket-mode` that makes `--allow-uid` usable.

mod common;

use common::{CHILD_DEADLINE, TempDir, finish, finish_status, hostile, serve, shmbroker, spawn};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use shmbroker_test_support::process::ChildGuard;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn fds_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Waits (up to 10 s) until process `pid` holds `count` fds; returns what it holds then.
fn settle_fds(pid: u32, count: usize) -> usize {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let now = fds_of(pid);
        if now == count || Instant::now() > until {
            return now;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs one job of two `worker` processes (they greet each other and leave) to its end.
fn job(socket: &Path) {
    let workers: Vec<ChildGuard> = (0..2)
        .map(|_| {
            spawn(&mut shmbroker(&[
                "worker",
                "--socket",
                socket.to_str().unwrap(),
            ]))
        })
        .collect();
    for worker in workers {
        let (ok, stdout, stderr) = finish(worker);
        assert!(ok, "a worker failed: {stdout}{stderr}");
    }
}

#[test]
fn one_broker_serves_a_hundred_jobs_and_holds_no_more_fds_after_them_than_after_one() {
    let dir = TempDir::new("hundred-jobs").unwrap();
    let socket = dir.join("broker.sock");
    let broker = serve(&socket, &["--workers", "2"]);
    let pid = broker.id();
    let idle = fds_of(pid);
    job(&socket);
    let after_one = settle_fds(pid, idle);
    for _ in 1..100 {
        job(&socket);
    }
    let after_hundred = settle_fds(pid, after_one);
    assert_eq!(
        (after_one, after_hundred),
        (idle, idle),
        "fds held by the broker: idle, after 1 job, after 100 jobs"
    );
    kill(Pid::from_raw(pid as i32), Signal::SIGTERM).unwrap();
    let (ok, _, stderr) = finish(broker);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("job ended job=99 workers=2"), "{stderr}");
}

#[test]
fn logs_come_as_json_lines_with_log_format_json() {
    let dir = TempDir::new("json-logs").unwrap();
    let socket = dir.join("broker.sock");
    let broker = serve(&socket, &["--workers=2", "--once", "--log-format=json"]);
    job(&socket);
    let (status, _, stderr) = finish_status(broker);
    assert!(status.success(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(lines.len() >= 5, "{stderr}");
    for line in &lines {
        assert!(
            line.starts_with(r#"{"timestamp":""#) && line.ends_with('}'),
            "not a JSON object: {line}"
        );
    }
    assert!(
        lines.iter().any(|line| line.contains(r#""level":"INFO""#)
            && line.contains(r#""message":"logged on","rank":1"#)),
        "{stderr}"
    );
}

#[test]
fn the_command_line_follows_the_conventions() {
    let run = |args: &[&str]| finish_status(spawn(&mut shmbroker(args)));
    let (status, stdout, _) = run(&["--version"]);
    assert!(status.success());
    assert_eq!(
        stdout.trim(),
        format!("shmbroker {}", env!("CARGO_PKG_VERSION"))
    );
    // Every subcommand has its --help.
    for command in ["demo", "run", "serve", "worker", "completions"] {
        let (status, stdout, stderr) = run(&[command, "--help"]);
        assert!(status.success(), "{command} --help: {stderr}");
        assert!(
            stdout.contains("Usage: shmbroker"),
            "{command} --help: {stdout}"
        );
    }
    // Usage errors exit 2 and say what was wrong; failures exit 1.
    for (args, says) in [
        (&["bogus"][..], "unrecognized subcommand 'bogus'"),
        (
            &["demo", "--workers=none"],
            "invalid value 'none' for '--workers <WORKERS>'",
        ),
        (&["worker"], "--socket <PATH>|--from-env|--inherited-socket"),
        (
            &["serve", "--socket=x", "--workers=2", "--socket-mode=999"],
            "octal",
        ),
    ] {
        let (status, _, stderr) = run(args);
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let missing = dir_that_does_not_exist();
    let (status, _, stderr) = run(&["worker", "--socket", &missing, "--timeout-ms=100"]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&missing), "{stderr}");
    // Completions for the common shells.
    for shell in ["bash", "zsh", "fish"] {
        let (status, stdout, stderr) = run(&["completions", shell]);
        assert!(status.success(), "{shell}: {stderr}");
        assert!(stdout.contains("serve"), "{shell}: {stdout}");
    }
    // The workshop is not in the product: the benchmarks and the chaos suite are binaries of
    // their own crates, and so are the test helpers.
    for command in [
        "bench",
        "chaos",
        "hostile",
        "farm-worker",
        "chaos-worker",
        "gather-rank",
    ] {
        let (status, _, stderr) = run(&[command, "--help"]);
        assert_eq!(status.code(), Some(2), "{command}: {stderr}");
        assert!(
            stderr.contains("unrecognized subcommand"),
            "{command}: {stderr}"
        );
    }
    // The chaos suite's own command line keeps the conventions.
    let chaos = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_chaos"));
        command
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        finish_status(spawn(&mut command))
    };
    let (status, stdout, stderr) = chaos(&["--help"]);
    assert!(status.success(), "chaos --help: {stderr}");
    assert!(stdout.contains("Usage: chaos"), "chaos --help: {stdout}");
    let (status, _, stderr) = chaos(&["--workers", "1"]);
    assert_eq!(status.code(), Some(2), "chaos --workers 1: {stderr}");
    assert!(
        stderr.contains("--workers <N>"),
        "chaos --workers 1: {stderr}"
    );
}

fn dir_that_does_not_exist() -> String {
    format!("/nonexistent-{}/broker.sock", std::process::id())
}

#[test]
fn serve_once_exits_after_its_first_job() {
    let dir = TempDir::new("once").unwrap();
    let socket = dir.join("broker.sock");
    let broker = serve(&socket, &["--workers", "2", "--once"]);
    job(&socket);
    let (status, stdout, stderr) = finish_status(broker);
    assert!(status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("one job"), "{stdout}");
    assert!(!socket.exists(), "the socket file outlived the broker");
}

#[test]
fn serve_needs_a_world_size_and_says_so() {
    let dir = TempDir::new("no-workers").unwrap();
    let socket = dir.join("broker.sock");
    let mut command = shmbroker(&["serve", "--socket", socket.to_str().unwrap()]);
    command.env_remove("SHMBROKER_WORLD_SIZE");
    let (status, _, stderr) = finish_status(spawn(&mut command));
    // A usage error: exit code 2, naming the missing option.
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--workers <N>"), "{stderr}");
    // The environment can give it instead.
    let mut command = shmbroker(&["serve", "--socket", socket.to_str().unwrap(), "--once"]);
    command.env("SHMBROKER_WORLD_SIZE", "2");
    let broker = spawn(&mut command);
    let until = Instant::now() + CHILD_DEADLINE;
    while !socket.exists() {
        assert!(Instant::now() < until);
        std::thread::sleep(Duration::from_millis(5));
    }
    job(&socket);
    let (ok, stdout, stderr) = finish(broker);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("jobs of 2 ranks"), "{stdout}");
    // And `serve --help` documents the service.
    let (ok, stdout, _) = finish(spawn(&mut shmbroker(&["serve", "--help"])));
    assert!(ok);
    for documented in [
        "--once",
        "--socket-mode",
        "--group",
        "a replacement for a rank that died",
        "SHMBROKER_JOB",
        "SHMBROKER_LOG",
    ] {
        assert!(
            stdout.contains(documented),
            "{documented} missing from:\n{stdout}"
        );
    }
}

#[test]
fn a_broker_that_cannot_fit_the_world_in_its_fd_limit_refuses_to_start() {
    let dir = TempDir::new("fd-limit").unwrap();
    let socket = dir.join("broker.sock");
    let mut command = shmbroker(&[
        "serve",
        "--socket",
        socket.to_str().unwrap(),
        "--workers",
        "64",
    ]);
    let limit_fds = || {
        use nix::sys::resource::{Resource, setrlimit};
        setrlimit(Resource::RLIMIT_NOFILE, 512, 512).map_err(std::io::Error::from)
    };
    // SAFETY: the closure runs in the forked child before exec and makes one system call
    // (setrlimit), which is async-signal-safe; it allocates nothing and takes no lock.
    unsafe { std::os::unix::process::CommandExt::pre_exec(&mut command, limit_fds) };
    let (status, _, stderr) = finish_status(spawn(&mut command));
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("a world of 64 needs up to"), "{stderr}");
    assert!(
        stderr.contains("its limit (RLIMIT_NOFILE, hard) is 512"),
        "{stderr}"
    );
    assert!(!socket.exists());
}

#[test]
fn a_flood_of_bad_notices_into_a_stalled_log_neither_blocks_the_broker_nor_floods_the_log() {
    let dir = TempDir::new("log-flood").unwrap();
    let socket = dir.join("broker.sock");
    // Standard error is a pipe nobody reads until the end: a broker that wrote its log there
    // itself would block once the pipe is full.
    let broker = serve(&socket, &["--workers", "2"]);
    let mut flooder = spawn(&mut hostile(&[
        "notice-flood",
        "--socket",
        socket.to_str().unwrap(),
        "--rank",
        "0",
        "--count",
        "300000",
    ]));
    let line = common::read_line_within(flooder.take_stdout().unwrap(), CHILD_DEADLINE);
    assert_eq!(line.trim(), "sent 300000");
    // The broker still serves: rank 1 logs on.
    let one = shmbroker::handshake::connect(
        &socket,
        shmbroker::bindings::LogonFrame::new(1),
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(one.rank(), 1);
    drop(one);
    flooder.kill();
    kill(Pid::from_raw(broker.id() as i32), Signal::SIGTERM).unwrap();
    let (ok, _, log) = finish(broker);
    assert!(ok, "{log}");
    // 300 000 complaints about one worker: a burst, then one a second, with counts (under 1 %
    // of them logged unless the flood took more than half an hour).
    let complaints = log.matches("refused a notice").count();
    assert!(
        (1..3000).contains(&complaints),
        "{complaints} complaint lines in {} bytes of log",
        log.len()
    );
    assert!(log.contains("suppressed="), "{log}");
    assert!(log.len() < 1 << 20, "{} bytes of log", log.len());
}

/// A worker as uid/gid 65534 ("nobody") against `serve` with `extra` options.
fn worker_as_nobody(name: &str, extra: &[&str]) -> (bool, String, String) {
    let dir = TempDir::new(name).unwrap();
    let program: PathBuf = common::binary_for_any_uid(dir.path());
    let socket = dir.join("broker.sock");
    let mut args = vec!["--workers", "1"];
    args.extend_from_slice(extra);
    let broker = serve(&socket, &args);
    let mut command = Command::new(program);
    command
        .args(["worker", "--socket", socket.to_str().unwrap()])
        .args(["--timeout-ms", "3000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    std::os::unix::process::CommandExt::uid(&mut command, 65534);
    std::os::unix::process::CommandExt::gid(&mut command, 65534);
    let result = finish(spawn(&mut command));
    drop(broker);
    result
}

#[test]
fn another_uid_gets_in_with_allow_uid_and_a_socket_mode_that_lets_it_reach_the_socket() {
    if !nix::unistd::getuid().is_root() {
        eprintln!("skipped: running a worker as another uid needs root");
        return;
    }
    // Allowed, but the socket is 0600: the kernel refuses the connection before the broker sees
    // it.
    let (ok, stdout, stderr) = worker_as_nobody("uid-0600", &["--allow-uid", "65534"]);
    assert!(!ok, "{stdout}");
    assert!(
        stderr.contains("EACCES") || stderr.contains("denied"),
        "{stderr}"
    );
    // Reachable but not allowed: the broker refuses with its reason.
    let (ok, stdout, stderr) = worker_as_nobody("uid-refused", &["--socket-mode", "0666"]);
    assert!(!ok, "{stdout}");
    assert!(stderr.contains("uid 65534 may not log on"), "{stderr}");
    // Both: in.
    let (ok, stdout, stderr) = worker_as_nobody(
        "uid-allowed",
        &["--allow-uid", "65534", "--socket-mode", "0666"],
    );
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("rank 0 of 1"), "{stdout}");
    // A group instead of the world: group 65534 and 0660.
    let (ok, stdout, stderr) = worker_as_nobody(
        "uid-group",
        &[
            "--allow-uid",
            "65534",
            "--group",
            "65534",
            "--socket-mode",
            "0660",
        ],
    );
    assert!(ok, "{stdout}{stderr}");
}

#[test]
fn a_socket_path_that_cannot_be_bound_is_an_error_naming_it() {
    let dir = TempDir::new("no-dir").unwrap();
    let socket = dir.join("missing").join("broker.sock");
    let mut command = shmbroker(&[
        "serve",
        "--socket",
        socket.to_str().unwrap(),
        "--workers",
        "2",
    ]);
    let (status, _, stderr) = finish_status(spawn(&mut command));
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&socket.display().to_string()), "{stderr}");
    assert!(stderr.contains("ENOENT"), "{stderr}");
}
