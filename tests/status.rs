//! `shmbroker status`: a running broker says what every rank of its job is doing, while the job
//! is stuck, and a rank that forges its status words changes nothing but its own row.

use shmbroker::Collectives;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::TempDir;
use shmbroker_test_support::process::ChildGuard;

/// A worker of `socket` as rank `rank` that runs one barrier (which waits for every rank).
fn barrier_worker(socket: &str, rank: u32) -> ChildGuard {
    let rank = rank.to_string();
    common::spawn(&mut common::shmbroker(&[
        "worker",
        "--socket",
        socket,
        "--rank",
        &rank,
        "--selftest",
        "--only",
        "barrier",
        "--timeout-ms",
        "120000",
    ]))
}

/// `shmbroker status --socket SOCKET ARGS...` to its end: stdout, after checking it succeeded.
fn status(socket: &str, args: &[&str]) -> String {
    let mut command: Command = common::shmbroker(&["status", "--socket", socket]);
    command.args(args);
    let (ok, stdout, stderr) = common::finish(common::spawn(&mut command));
    assert!(ok, "shmbroker status failed: {stderr}");
    stdout
}

/// The `--json` line of rank `rank`.
fn json_of(lines: &str, rank: u32) -> &str {
    let key = format!(",\"rank\":{rank},");
    lines
        .lines()
        .find(|line| line.contains(&key))
        .unwrap_or_else(|| panic!("no line for rank {rank} in {lines}"))
}

/// Asks until `done` holds for the `--json` answer (within the tests' deadline).
fn status_until(socket: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + common::CHILD_DEADLINE;
    loop {
        let lines = status(socket, &["--json"]);
        if done(&lines) {
            return lines;
        }
        assert!(Instant::now() < deadline, "never {what}: {lines}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_stuck_16_rank_job_shows_every_rank_and_who_never_came() {
    let tmp = TempDir::new("status-16").unwrap();
    let socket = tmp.path().join("broker.sock");
    let _broker = common::serve(&socket, &["--workers", "16"]);
    let socket = socket.to_str().unwrap();
    // Ranks 0 to 14 wait in a barrier for rank 15, which never logs on.
    let _workers: Vec<ChildGuard> = (0..15).map(|rank| barrier_worker(socket, rank)).collect();
    let lines = status_until(socket, "saw 15 ranks in their barrier", |lines| {
        (0..15).all(|rank| {
            lines.lines().any(|line| {
                line.contains(&format!(",\"rank\":{rank},"))
                    && line.contains("\"state\":\"running\"")
                    && line.contains("\"call\":\"barrier #")
            })
        })
    });
    assert_eq!(lines.lines().count(), 16, "{lines}");
    let never = json_of(&lines, 15);
    assert!(
        never.contains("\"pid\":null,\"state\":\"never joined\",\"call\":null"),
        "{never}"
    );
    for rank in 0..15 {
        let line = json_of(&lines, rank);
        assert!(line.contains("\"seconds\":"), "{line}");
        assert!(!line.contains("\"seconds\":null"), "{line}");
        assert!(line.contains("\"readable\":true"), "{line}");
        assert!(line.contains("\"outbox_bytes\":"), "{line}");
    }
    // How long one answer takes while the job is stuck (the target is 100 ms; timing
    // is reported, not asserted).
    let started = Instant::now();
    let report = shmbroker::status::query(socket, Duration::from_secs(5)).unwrap();
    eprintln!(
        "status of 16 stuck ranks answered in {:?}",
        started.elapsed()
    );
    assert_eq!(report.ranks.len(), 16);
    let table = status(socket, &[]);
    let rows: Vec<&str> = table.lines().collect();
    assert!(rows[0].starts_with("broker pid "), "{table}");
    assert!(rows[1].starts_with("RANK  PID"), "{table}");
    assert_eq!(rows.len(), 2 + 16, "{table}");
    assert!(
        rows[2 + 15].starts_with("15  ") && rows[2 + 15].contains("never joined"),
        "{table}"
    );
    for rank in 0..15 {
        let row = rows[2 + rank];
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[0], rank.to_string(), "{table}");
        assert_eq!(cells[2..4], ["running", "barrier"], "{table}");
    }
}

/// A forger (rank 1) whose words say it gave barrier #0 up, naming `named`, and which never
/// takes part: rank 0's barrier fails at once naming the forger, and the forger's word only
/// when it is a rank of the world.
#[test]
fn a_rank_that_forges_a_given_up_collective_can_end_it_only_naming_itself() {
    for (named, expected) in [(0, Some(0)), (1, Some(1)), (2, None), (u64::MAX - 1, None)] {
        let tmp = TempDir::new("status-gave-up").unwrap();
        let socket = tmp.path().join("broker.sock");
        let _broker = common::serve(&socket, &["--workers", "2"]);
        let socket = socket.to_str().unwrap();
        let mut forger = common::spawn(&mut common::hostile(&[
            "gave-up-forge",
            "--socket",
            socket,
            "--rank",
            "1",
            "--named",
            &named.to_string(),
        ]));
        let mut session =
            shmbroker::Session::connect(socket, Some(0), Duration::from_secs(30)).unwrap();
        let said = common::read_line_within(forger.take_stdout().unwrap(), common::CHILD_DEADLINE);
        assert_eq!(said.trim(), "forging");
        let started = std::time::Instant::now();
        let error = session
            .with_timeout(Duration::from_secs(30))
            .barrier()
            .unwrap_err();
        assert!(
            matches!(
                error,
                shmbroker::Error::PeerGaveUp { rank: 1, op: "barrier", named: n, .. }
                    if n == expected
            ),
            "named {named}: {error:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(10), "{error}");
    }
}

#[test]
fn a_rank_that_forges_its_status_words_spoils_only_its_own_row() {
    let tmp = TempDir::new("status-forge").unwrap();
    let socket = tmp.path().join("broker.sock");
    let _broker = common::serve(&socket, &["--workers", "3"]);
    let socket = socket.to_str().unwrap();
    let _workers: Vec<ChildGuard> = (0..2).map(|rank| barrier_worker(socket, rank)).collect();
    let mut forger = common::spawn(&mut common::hostile(&[
        "status-forge",
        "--socket",
        socket,
        "--rank",
        "2",
    ]));
    let said = common::read_line_within(forger.take_stdout().unwrap(), common::CHILD_DEADLINE);
    assert_eq!(said.trim(), "forging");
    let mut unreadable = 0;
    for _ in 0..20 {
        let lines = status(socket, &["--json"]);
        let forged = json_of(&lines, 2);
        if forged.contains("\"readable\":false") {
            unreadable += 1;
            assert!(forged.contains("\"call\":null"), "{forged}");
        }
        assert!(
            !lines.contains('\x1b'),
            "a forged name reached the output: {lines:?}"
        );
        let table = status(socket, &[]);
        assert!(
            !table.contains('\x1b'),
            "a forged name reached the output: {table:?}"
        );
        assert!(table.lines().count() == 5, "{table}");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Torn copies may read as a rank in no call now and then; forgeries, mostly.
    assert!(
        unreadable > 0,
        "the forgeries were never seen as unreadable"
    );
    // The honest ranks are shown as they are, and the broker still answers.
    status_until(socket, "saw ranks 0 and 1 in their barrier", |lines| {
        (0..2).all(|rank| json_of(lines, rank).contains("\"call\":\"barrier #"))
    });
}

/// How many times the stop test stops a rank: `STOP_TRIALS`, 4 by default.
fn stop_trials() -> u64 {
    std::env::var("STOP_TRIALS").map_or(4, |n| n.parse().unwrap())
}

/// A rank stopped (SIGSTOP) at a random moment of a job that runs every collective at many
/// sizes: `status` reads it as stopped, and every survivor's timeout names it as stopped, even
/// when the survivor waited for another rank that waits for it.
#[test]
fn a_stopped_rank_reads_stopped_and_every_timeout_names_it() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    const WORLD: u32 = 4;
    let seed = std::process::id();
    for trial in 0..stop_trials() {
        let tmp = TempDir::new(&format!("status-stop-{trial}")).unwrap();
        let socket = tmp.path().join("broker.sock");
        let _broker = common::serve(&socket, &["--workers", &WORLD.to_string()]);
        let socket = socket.to_str().unwrap();
        let workers: Vec<ChildGuard> = (0..WORLD)
            .map(|rank| {
                common::spawn(&mut common::shmbroker(&[
                    "worker",
                    "--socket",
                    socket,
                    "--rank",
                    &rank.to_string(),
                    "--selftest",
                    "--only",
                    "sizes",
                    "--max-bytes",
                    "1048576",
                    "--repeat",
                    "1000000",
                    "--timeout-ms",
                    "1500",
                ]))
            })
            .collect();
        // A victim and a moment from the seed: every rank running, then somewhere in its loop.
        let mix = u64::from(seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ trial.wrapping_mul(31);
        let victim = (mix % u64::from(WORLD)) as u32;
        status_until(socket, "saw every rank in a call", |lines| {
            (0..WORLD).all(|rank| json_of(lines, rank).contains("\"call\":\""))
        });
        std::thread::sleep(Duration::from_millis(20 + (mix >> 8) % 300));
        let victim_pid = Pid::from_raw(workers[victim as usize].id() as i32);
        kill(victim_pid, Signal::SIGSTOP).unwrap();
        let lines = status_until(socket, "saw the victim stopped", |lines| {
            json_of(lines, victim).contains("\"state\":\"stopped\"")
        });
        let line = json_of(&lines, victim);
        assert!(!line.contains("\"stopped_seconds\":null"), "{line}");
        let table = status(socket, &[]);
        let row = table
            .lines()
            .find(|row| row.starts_with(&format!("{victim}  ")))
            .unwrap();
        assert!(row.contains("stopped"), "{table}");
        // Every survivor fails within its deadline, naming the victim as stopped. The victim's
        // guard kills it only after them.
        let mut stopped_one = None;
        for (rank, worker) in (0..WORLD).zip(workers) {
            if rank == victim {
                stopped_one = Some(worker);
                continue;
            }
            let (ok, stdout, stderr) = common::finish(worker);
            assert!(!ok, "trial {trial}: rank {rank} ran on: {stdout}");
            // A timeout says the victim is stopped, and so does a departure of a survivor that
            // timed out on it. A survivor whose peer gave the collective up over the victim
            // names it as that peer's word.
            let chained = format!("rank {victim}, which is stopped");
            let said = [
                format!("rank {victim} is stopped"),
                chained.clone(),
                format!("failed naming rank {victim})"),
            ];
            assert!(
                said.iter().any(|text| stderr.contains(text.as_str())),
                "trial {trial}: rank {rank} of {WORLD}, victim {victim}: {stderr}"
            );
            let form = if stderr.contains("left the session") {
                "a departure"
            } else if stderr.contains(&chained) {
                "a timeout, through a chain"
            } else if stderr.contains("timed out") {
                "a timeout"
            } else {
                "a peer that gave up"
            };
            eprintln!("stop trial {trial}: rank {rank} named victim {victim} in {form}");
        }
        drop(stopped_one);
    }
}
