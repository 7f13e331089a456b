//! `shmbroker run`: a broker and N copies of a program, as users of mpirun and torchrun expect:
//! every copy finds the job from its environment, a failure stops the others and sets the exit
//! status, signals are passed on, `--timeout` ends the job, and nothing is left behind.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::TempDir;

/// `shmbroker run ARGS...` with `TMPDIR` set to `tmp`, so whatever it leaves there shows.
fn run(tmp: &Path, args: &[&str]) -> Command {
    let mut command = common::shmbroker(&["run"]);
    command.args(args).env("TMPDIR", tmp);
    command
}

/// Runs to the end (with the tests' deadline): status code, stdout, stderr.
fn finish(mut command: Command) -> (Option<i32>, String, String) {
    let (status, stdout, stderr) = common::finish_status(common::spawn(&mut command));
    (status.code(), stdout, stderr)
}

fn left_in(tmp: &Path) -> Vec<String> {
    std::fs::read_dir(tmp)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Whether `pid` is still a running (not dead, not zombie) process.
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !matches!(
            stat.rsplit(") ").next().and_then(|s| s.chars().next()),
            Some('Z' | 'X')
        )
    })
}

#[test]
fn every_copy_finds_the_job_and_the_collectives_pass() {
    let tmp = TempDir::new("run-selftest").unwrap();
    let program = common::SHMBROKER;
    let (code, stdout, stderr) = finish(run(
        tmp.path(),
        &[
            "-n",
            "4",
            "--",
            program,
            "worker",
            "--from-env",
            "--selftest",
        ],
    ));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    for rank in 0..4 {
        assert!(
            stderr.contains(&format!("rank {rank} of 4"))
                || stdout.contains(&format!("rank {rank} of 4")),
            "{stdout}{stderr}"
        );
    }
    assert_eq!(
        left_in(tmp.path()),
        [] as [String; 0],
        "the socket directory is removed"
    );
}

#[test]
fn tagged_output_names_each_rank_and_the_environment_is_set() {
    let tmp = TempDir::new("run-tags").unwrap();
    let (code, stdout, stderr) = finish(run(
        tmp.path(),
        &[
            "-n",
            "3",
            "--tag-output",
            "--",
            "sh",
            "-c",
            "echo \"$SHMBROKER_RANK of $SHMBROKER_WORLD_SIZE, broker $SHMBROKER_BROKER\"; \
             test -S \"$SHMBROKER_SOCKET\" && echo socket >&2",
        ],
    ));
    assert_eq!(code, Some(0), "{stderr}");
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "[0] 0 of 3, broker external",
            "[1] 1 of 3, broker external",
            "[2] 2 of 3, broker external"
        ]
    );
    let mut errors: Vec<&str> = stderr.lines().collect();
    errors.sort_unstable();
    assert_eq!(errors, ["[0] socket", "[1] socket", "[2] socket"]);
}

#[test]
fn each_copy_gets_torchruns_variables_and_one_free_master_port() {
    let tmp = TempDir::new("run-torch-env").unwrap();
    let mut command = run(
        tmp.path(),
        &[
            "-n",
            "2",
            "--tag-output",
            "--",
            "sh",
            "-c",
            "echo \"$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT\"",
        ],
    );
    command.env_remove("MASTER_ADDR").env_remove("MASTER_PORT");
    let (code, stdout, stderr) = finish(command);
    assert_eq!(code, Some(0), "{stderr}");
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    let ports: Vec<&str> = lines
        .iter()
        .map(|line| line.rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(ports[0], ports[1], "every copy meets on one port: {stdout}");
    let port: u16 = ports[0].parse().expect("MASTER_PORT is a port number");
    assert_ne!(port, 0);
    assert_eq!(
        lines,
        [
            format!("[0] 0 0 2 2 127.0.0.1 {port}"),
            format!("[1] 1 1 2 2 127.0.0.1 {port}")
        ]
    );

    // The launcher's own MASTER_ADDR and MASTER_PORT are kept.
    let mut command = run(
        tmp.path(),
        &[
            "-n",
            "1",
            "--",
            "sh",
            "-c",
            "echo \"$MASTER_ADDR:$MASTER_PORT\"",
        ],
    );
    command
        .env("MASTER_ADDR", "10.1.2.3")
        .env("MASTER_PORT", "4567");
    let (code, stdout, stderr) = finish(command);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.trim(), "10.1.2.3:4567");
}

#[test]
fn the_first_failure_stops_the_others_and_is_the_exit_status() {
    let tmp = TempDir::new("run-fail").unwrap();
    let pids = tmp.path().join("pids");
    std::fs::create_dir(&pids).unwrap();
    let script = format!(
        "echo $$ > {}/$SHMBROKER_RANK; if [ \"$SHMBROKER_RANK\" = 1 ]; then sleep 0.3; exit 7; fi; \
         exec sleep 60",
        pids.display()
    );
    let started = Instant::now();
    let (code, _, stderr) = finish(run(tmp.path(), &["-n", "3", "--", "sh", "-c", &script]));
    assert_eq!(code, Some(7), "{stderr}");
    assert!(stderr.contains("rank 1 exited with 7"), "{stderr}");
    // SIGTERM ends `sleep` at once: the others were stopped, not waited for.
    assert!(started.elapsed() < Duration::from_secs(30));
    for rank in [0, 2] {
        let pid: u32 = std::fs::read_to_string(pids.join(rank.to_string()))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(!running(pid), "rank {rank} (pid {pid}) still runs");
    }
    std::fs::remove_dir_all(&pids).unwrap();
    assert_eq!(left_in(tmp.path()), [] as [String; 0]);
}

#[test]
fn sigterm_and_sigint_reach_every_copy_once() {
    for (signal, name) in [
        (nix::sys::signal::Signal::SIGTERM, "TERM"),
        (nix::sys::signal::Signal::SIGINT, "INT"),
    ] {
        let tmp = TempDir::new("run-signal").unwrap();
        let script = format!(
            "n=0; trap 'n=$((n+1))' {name}; echo ready; \
             while [ $n -eq 0 ]; do sleep 0.02; done; sleep 0.2; echo \"got $n\"; exit 3"
        );
        let mut command = run(
            tmp.path(),
            &["-n", "2", "--tag-output", "--", "sh", "-c", &script],
        );
        let mut launcher = common::spawn(&mut command);
        let mut stdout = std::io::BufReader::new(launcher.take_stdout().unwrap());
        let mut ready = 0;
        while ready < 2 {
            let mut line = String::new();
            assert!(
                std::io::BufRead::read_line(&mut stdout, &mut line).unwrap() > 0,
                "no ready line"
            );
            ready += usize::from(line.ends_with("ready\n"));
        }
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(launcher.id() as i32), signal).unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
        let status = launcher
            .wait_timeout(common::CHILD_DEADLINE)
            .unwrap()
            .unwrap();
        assert_eq!(status.code(), Some(3), "SIG{name}: {rest}");
        let mut lines: Vec<&str> = rest.lines().collect();
        lines.sort_unstable();
        assert_eq!(
            lines,
            ["[0] got 1", "[1] got 1"],
            "SIG{name}: each copy gets it once"
        );
        assert_eq!(left_in(tmp.path()), [] as [String; 0]);
    }
}

#[test]
fn a_timeout_ends_the_job_with_124() {
    let tmp = TempDir::new("run-timeout").unwrap();
    let (code, _, stderr) = finish(run(
        tmp.path(),
        &["-n", "2", "--timeout", "0.5", "--", "sleep", "60"],
    ));
    assert_eq!(code, Some(124), "{stderr}");
    assert!(stderr.contains("timed out"), "{stderr}");
    assert_eq!(left_in(tmp.path()), [] as [String; 0]);
}

/// A copy that runs one barrier as its rank, after `rank_1_first` (a shell command) if it is
/// rank 1 (`sh -c` script).
fn barrier_script(rank_1_first: &str) -> String {
    format!(
        "if [ \"$SHMBROKER_RANK\" = 1 ]; then {rank_1_first}; fi; exec {} worker --from-env \
         --selftest --only barrier --timeout-ms 60000",
        common::SHMBROKER
    )
}

#[test]
fn a_timeout_prints_who_is_where_before_it_stops_the_job() {
    let tmp = TempDir::new("run-timeout-status").unwrap();
    // Rank 0 waits in its barrier for rank 1, which sleeps past the timeout before logging on.
    let script = barrier_script("exec sleep 60");
    let (code, _, stderr) = finish(run(
        tmp.path(),
        &["-n", "2", "--timeout", "1.5", "--", "sh", "-c", &script],
    ));
    assert_eq!(code, Some(124), "{stderr}");
    let table = stderr
        .find("RANK  PID")
        .map(|at| &stderr[at..])
        .unwrap_or_else(|| panic!("no status table: {stderr}"));
    let row = |rank: &str| {
        table
            .lines()
            .find(|line| line.split_whitespace().next() == Some(rank))
            .unwrap_or_else(|| panic!("no row for rank {rank}: {stderr}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(row("0")[2..4], ["running", "barrier"], "{stderr}");
    assert_eq!(row("1")[1..4], ["-", "never", "joined"], "{stderr}");
    assert!(
        stderr.find("RANK  PID") < stderr.find("timed out"),
        "the table comes first: {stderr}"
    );
    assert_eq!(left_in(tmp.path()), [] as [String; 0]);
}

#[test]
fn sigquit_prints_who_is_where_and_the_job_goes_on() {
    let tmp = TempDir::new("run-sigquit").unwrap();
    let script = barrier_script("sleep 1.5");
    let mut command = run(tmp.path(), &["-n", "2", "--", "sh", "-c", &script]);
    let launcher = common::spawn(&mut command);
    std::thread::sleep(Duration::from_millis(700));
    let pid = nix::unistd::Pid::from_raw(launcher.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGQUIT).unwrap();
    let (status, stdout, stderr) = common::finish_status(launcher);
    assert_eq!(status.code(), Some(0), "{stdout}{stderr}");
    assert!(stderr.contains("RANK  PID"), "no status table: {stderr}");
    assert_eq!(left_in(tmp.path()), [] as [String; 0]);
}

#[test]
fn a_program_that_cannot_start_is_127_and_starts_nothing_else() {
    let tmp = TempDir::new("run-missing").unwrap();
    let (code, _, stderr) = finish(run(tmp.path(), &["-n", "2", "--", "/nonexistent/program"]));
    assert_eq!(code, Some(127), "{stderr}");
    assert!(
        stderr.contains("cannot start") && stderr.contains("/nonexistent/program"),
        "{stderr}"
    );
    assert_eq!(left_in(tmp.path()), [] as [String; 0]);
}

#[test]
fn copies_die_with_a_launcher_killed_by_sigkill() {
    let tmp = TempDir::new("run-kill").unwrap();
    let mut command = run(
        tmp.path(),
        &[
            "-n",
            "2",
            "--tag-output",
            "--",
            "sh",
            "-c",
            "echo $$; exec sleep 60",
        ],
    );
    let mut launcher = common::spawn(&mut command);
    let mut stdout = std::io::BufReader::new(launcher.take_stdout().unwrap());
    let mut pids = Vec::new();
    while pids.len() < 2 {
        let mut line = String::new();
        assert!(std::io::BufRead::read_line(&mut stdout, &mut line).unwrap() > 0);
        pids.push(
            line.split_whitespace()
                .last()
                .unwrap()
                .parse::<u32>()
                .unwrap(),
        );
    }
    assert_eq!(left_in(tmp.path()).len(), 1, "the socket directory");
    launcher.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&pid| running(pid)) {
        assert!(
            Instant::now() < deadline,
            "copies outlived their launcher: {pids:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The socket directory goes too, with the socket in it.
    while !left_in(tmp.path()).is_empty() {
        assert!(
            Instant::now() < deadline,
            "left behind: {:?}",
            left_in(tmp.path())
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A generator of small random numbers for the kill test (seeded from the clock, and printed, so
/// that a failing run can be repeated with `SHMBROKER_KILL_SEED`).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

#[test]
fn a_killed_rank_is_named_with_its_signal_never_a_survivor() {
    let seed = std::env::var("SHMBROKER_KILL_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("SHMBROKER_KILL_SEED={seed}");
    let mut random = Lcg(seed);
    let tmp = TempDir::new("run-kill-rank").unwrap();
    // Each copy prints its rank and pid, then loops barriers until a peer dies (then it exits 1,
    // naming the dead rank).
    let script = format!(
        "echo \"$SHMBROKER_RANK $$\"; exec {} worker --from-env --selftest --only barrier \
         --repeat 100000000",
        common::SHMBROKER
    );
    for attempt in 0..50 {
        let mut command = run(tmp.path(), &["-n", "3", "--", "sh", "-c", &script]);
        let mut launcher = common::spawn(&mut command);
        let mut stdout = std::io::BufReader::new(launcher.take_stdout().unwrap());
        let mut pids = [0i32; 3];
        for _ in 0..3 {
            let mut line = String::new();
            assert!(std::io::BufRead::read_line(&mut stdout, &mut line).unwrap() > 0);
            let mut fields = line.split_whitespace().map(|f| f.parse::<i32>().unwrap());
            let (rank, pid) = (fields.next().unwrap(), fields.next().unwrap());
            pids[rank as usize] = pid;
        }
        // Somewhere in the job's barriers (or still logging on).
        std::thread::sleep(Duration::from_millis(20 + random.next(200)));
        let victim = random.next(3) as usize;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pids[victim]),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let (status, _, stderr) = common::finish_status(launcher);
        let what = format!("attempt {attempt}, seed {seed}, rank {victim} killed:\n{stderr}");
        assert_eq!(status.code(), Some(137), "{what}");
        assert!(
            stderr.contains(&format!(
                "shmbroker run: rank {victim} was killed by SIGKILL; stopping the others"
            )),
            "{what}"
        );
        // The survivors the launcher stopped are not reported as deaths.
        for survivor in (0..3).filter(|&rank| rank != victim) {
            assert!(
                !stderr.contains(&format!("died without saying goodbye rank={survivor} ")),
                "{what}"
            );
        }
    }
    assert_eq!(left_in(tmp.path()), [] as [String; 0]);
}

#[test]
fn with_on_failure_continue_the_others_run_to_their_end() {
    let tmp = TempDir::new("run-continue").unwrap();
    let done = tmp.path().join("done");
    std::fs::create_dir(&done).unwrap();
    let script = format!(
        "if [ \"$SHMBROKER_RANK\" = 1 ]; then exit 7; fi; sleep 0.5; touch {}/$SHMBROKER_RANK",
        done.display()
    );
    let (code, _, stderr) = finish(run(
        tmp.path(),
        &[
            "-n",
            "3",
            "--on-failure",
            "continue",
            "--",
            "sh",
            "-c",
            &script,
        ],
    ));
    assert_eq!(code, Some(7), "{stderr}");
    assert!(
        stderr.contains("rank 1 exited with 7; the others go on"),
        "{stderr}"
    );
    for rank in ["0", "2"] {
        assert!(
            done.join(rank).exists(),
            "rank {rank} was stopped: {stderr}"
        );
    }
    std::fs::remove_dir_all(&done).unwrap();
    assert_eq!(left_in(tmp.path()), [] as [String; 0]);
}

/// `farm-worker --job` under `run -n 4 --restart 1`: rank 2 kills itself after its first task
/// (early: a death at the very end, with every other copy done, has nobody to rejoin); the
/// launcher starts it again (with `SHMBROKER_RESTART_COUNT`), the new process rejoins, and the
/// reader, which never stops, gives it tasks again. Every task is answered once, rightly; the
/// one the dead rank held is reported lost, naming it, and given again.
#[test]
fn a_killed_copy_is_started_again_and_rejoins_the_job() {
    let tmp = TempDir::new("run-restart").unwrap();
    let farm = env!("CARGO_BIN_EXE_farm-worker");
    let (code, stdout, stderr) = finish(run(
        tmp.path(),
        &["-n", "4", "--restart", "1", "--", farm, "--job", "2000"],
    ));
    let failed = |what: &str| format!("{what}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(code, Some(0), "{}", failed("no clean exit"));
    let (code, stdout, stderr) = finish(run(
        tmp.path(),
        &[
            "-n",
            "4",
            "--restart",
            "1",
            "--",
            farm,
            "--job",
            "2000",
            "--die-rank",
            "2",
            "--die-after",
            "1",
            // The reader waits for the replacement when it learns of the death: the other
            // workers may otherwise answer all 2,000 tasks before it logs on (seen here once
            // the rings' receive path got faster).
            "--await-replacements",
        ],
    ));
    let failed = |what: &str| format!("{what}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(code, Some(0), "{}", failed("the job failed"));
    // The dead rank held a task if the reader gave it one before it saw the death (it dies
    // right after an answer), and a rank that logged on only after the death held one if the
    // reader gave it one before: each task lost is named, and counted.
    let lost = stdout.matches(" lost with rank ").count();
    for expected in [
        format!(
            "farm done: 2000 tasks answered once each; {lost} lost with a dead rank and given \
             again; 1 replacements"
        ),
        "rank 2 rejoined (replacement 1)".into(),
        "rank 2 (restart 1) answered its first task".into(),
    ] {
        assert!(stdout.contains(&expected), "{}", failed(&expected));
    }
    assert!(
        stderr.contains("rank 2 was killed by SIGKILL; starting it again (1 of 1)"),
        "{}",
        failed("no restart said")
    );
    assert!(left_in(tmp.path()).is_empty(), "{:?}", left_in(tmp.path()));
}

/// A rank that dies in every process runs out of restarts: then it fails the job as any copy
/// does, with its own status, saying so.
#[test]
fn a_rank_out_of_restarts_fails_the_job() {
    let tmp = TempDir::new("run-restarts-spent").unwrap();
    let farm = env!("CARGO_BIN_EXE_farm-worker");
    let (code, stdout, stderr) = finish(run(
        tmp.path(),
        &[
            "-n",
            "3",
            "--restart",
            "2",
            "--",
            farm,
            "--job",
            "100000",
            "--die-rank",
            "1",
            "--die-after",
            "50",
            "--die-always",
        ],
    ));
    let failed = |what: &str| format!("{what}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(
        code,
        Some(128 + 9),
        "{}",
        failed("not the dead rank's status")
    );
    for expected in [
        "rank 1 was killed by SIGKILL; starting it again (1 of 2)",
        "rank 1 was killed by SIGKILL; starting it again (2 of 2)",
        "rank 1 was killed by SIGKILL (started again 2 times: no restarts left); stopping the \
         others",
    ] {
        assert!(stderr.contains(expected), "{}", failed(expected));
    }
}

/// A copy that exits with an error is started again only with `--restart-on-error`.
#[test]
fn an_error_exit_is_restarted_only_when_asked() {
    let tmp = TempDir::new("run-restart-on-error").unwrap();
    // Rank 1's first process exits with 3; rank 0 is still running then.
    let script = r#"if [ "$SHMBROKER_RANK" = 1 ] && [ -z "$SHMBROKER_RESTART_COUNT" ]; then exit 3; fi
echo "rank $SHMBROKER_RANK restart ${SHMBROKER_RESTART_COUNT:-0}"; sleep 0.3"#;
    let (code, stdout, stderr) = finish(run(
        tmp.path(),
        &[
            "-n",
            "2",
            "--restart",
            "1",
            "--restart-on-error",
            "--",
            "sh",
            "-c",
            script,
        ],
    ));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("rank 1 restart 1"), "{stdout}{stderr}");
    assert!(
        stderr.contains("rank 1 exited with 3; starting it again (1 of 1)"),
        "{stderr}"
    );
    let (code, stdout, stderr) = finish(run(
        tmp.path(),
        &["-n", "2", "--restart", "1", "--", "sh", "-c", script],
    ));
    assert_eq!(code, Some(3), "{stdout}{stderr}");
}

/// How many times each ending of the blame test is tried: `BLAME_TRIALS`, 3 by default.
fn blame_trials() -> usize {
    std::env::var("BLAME_TRIALS").map_or(3, |n| n.parse().unwrap())
}

/// Rank 0 of 3 fails first by its cause, in two ways whose exit the launcher may see after its
/// survivors': it leaves cleanly and then exits 3, or its session's process dies and the copy
/// then exits 4. Ranks 1 and 2 fail at once because of it, exit 1, and are never named.
#[test]
fn the_rank_that_failed_first_is_named_even_when_its_survivors_exit_first() {
    let worker =
        "\"$SHMBROKER_BIN\" worker --from-env --selftest --only barrier --timeout-ms 20000";
    let endings = [
        (
            // A clean leave (the worker's session says goodbye), then a failing exit.
            format!("{worker} --repeat 50 >/dev/null; sleep 0.3; exit 3"),
            "rank 0 exited with 3",
            3,
        ),
        (
            // Gone without leaving (the session's process is killed), then a failing exit.
            format!(
                "{worker} --repeat 100000000 >/dev/null & p=$!; sleep 0.2; kill -9 $p; wait; \
                 sleep 0.3; exit 4"
            ),
            "rank 0 exited with 4",
            4,
        ),
    ];
    for (rank_0, named, code) in endings {
        let script = format!(
            "if [ \"$SHMBROKER_RANK\" = 0 ]; then {rank_0}; fi; \
             exec {worker} --repeat 100000000 >/dev/null"
        );
        for trial in 0..blame_trials() {
            let tmp = TempDir::new("run-blame").unwrap();
            let mut command = run(tmp.path(), &["-n", "3", "--", "sh", "-c", &script]);
            command.env("SHMBROKER_BIN", common::SHMBROKER);
            let (status, _, stderr) = finish(command);
            assert_eq!(status, Some(code), "trial {trial}: {stderr}");
            assert!(stderr.contains(named), "trial {trial}: {stderr}");
        }
    }
}

/// `--verbose` says the job's id and socket, and `shmbroker status --pid` finds the job from the
/// launcher's pid alone.
#[test]
fn a_verbose_run_says_where_its_broker_is_and_status_finds_it_by_pid() {
    let tmp = TempDir::new("run-verbose").unwrap();
    let mut command = run(
        tmp.path(),
        &["-n", "2", "--verbose", "--", "sh", "-c", "exec sleep 60"],
    );
    let mut launcher = common::spawn(&mut command);
    let pid = launcher.id();
    let stderr = launcher.take_stderr().unwrap();
    let line = common::read_line_within(stderr, common::CHILD_DEADLINE);
    assert!(
        line.starts_with("shmbroker run: job run-")
            && line.contains("(SHMBROKER_JOB), broker on ")
            && line.contains(&format!("`shmbroker status --pid {pid}`")),
        "{line}"
    );
    let socket = line
        .split("broker on ")
        .nth(1)
        .and_then(|rest| rest.split(" (SHMBROKER_SOCKET)").next())
        .unwrap();
    assert!(
        socket.starts_with(&tmp.path().display().to_string()),
        "{line}"
    );
    let mut status = common::shmbroker(&["status", "--pid", &pid.to_string(), "--json"]);
    let (ok, stdout, stderr) = common::finish(common::spawn(&mut status));
    assert!(ok, "{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    // A process that is no launcher: this test.
    let me = std::process::id().to_string();
    let mut status = common::shmbroker(&["status", "--pid", &me]);
    let (ok, _, stderr) = common::finish(common::spawn(&mut status));
    let said = format!("no job of a `shmbroker run` of pid {me}");
    assert!(!ok && stderr.contains(&said), "{stderr}");
    // Neither socket nor pid: the jobs of this user, found where launchers put them.
    let mut status = common::shmbroker(&["status"]);
    status
        .env("TMPDIR", tmp.path())
        .env("XDG_RUNTIME_DIR", tmp.path())
        .env_remove("SHMBROKER_SOCKET");
    let (ok, stdout, stderr) = common::finish(common::spawn(&mut status));
    assert!(ok, "{stderr}");
    assert!(stdout.starts_with(&format!("{socket}:\n")), "{stdout}");
    launcher.kill();
    // Once it is gone, nothing answers.
    let _ = launcher.wait_timeout(common::CHILD_DEADLINE);
    let mut status = common::shmbroker(&["status"]);
    status
        .env("TMPDIR", tmp.path())
        .env("XDG_RUNTIME_DIR", tmp.path())
        .env_remove("SHMBROKER_SOCKET");
    let (ok, _, stderr) = common::finish(common::spawn(&mut status));
    assert!(
        !ok && stderr.contains("no job of this user answers"),
        "{stderr}"
    );
}
