//! Peers that attack: real processes that try to write other ranks' outboxes, scribble over every
//! region they can write, die in the middle of large transfers, or lie in the setup messages of
//! making a group and shrinking. Nobody else may get a signal, a panic or a hang; the kernel must
//! refuse every write to an outbox but its owner's own mapping, and a liar is named. Every child
//! is waited for with a deadline and killed on the way out.

mod common;

use common::{Broker, finish, finish_status};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use shmbroker::Collectives;
use shmbroker::session::{Error, Group, Session};
use shmbroker_test_support::hostile as hostile_peer;
use shmbroker_test_support::process::{ChildGuard, spawn_with_fds};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// `hostile MODE --socket S --rank R EXTRA...`.
fn hostile(broker: &Broker, mode: &str, rank: u32, extra: &[&str]) -> ChildGuard {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hostile"));
    command
        .args([mode, "--socket", &broker.socket()])
        .args(["--rank", &rank.to_string()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    spawn_with_fds(&mut command, &[]).unwrap()
}

#[test]
fn no_peer_can_write_another_ranks_outbox_by_any_means() {
    let broker = Broker::start("reopen", 3);
    let honest: Vec<ChildGuard> = (0..2)
        .map(|rank| broker.worker(rank, &["--only", "barrier", "--repeat", "1"]))
        .collect();
    let attacker = hostile(&broker, "reopen", 2, &[]);
    let (ok, stdout, stderr) = finish(attacker);
    assert!(ok, "the kernel let a write through:\n{stdout}{stderr}");
    // Two peers' outboxes and its own, each attacked nine ways.
    assert!(
        stdout.contains("all 27 write attempts on 3 outboxes were refused"),
        "{stdout}"
    );
    for (rank, worker) in honest.into_iter().enumerate() {
        let (ok, stdout, stderr) = finish(worker);
        assert!(ok, "rank {rank}: {stdout}{stderr}");
    }
}

/// One trial: two honest ranks loop over every operation at every size to 1 MiB with rank 2,
/// which starts scribbling over everything it can write `delay_ms` in, and dies.
fn scribble_trial(trial: u32, delay_ms: u32) {
    let broker = Broker::start(&format!("scribble{trial}"), 3);
    let victims: Vec<ChildGuard> = (0..2)
        .map(|rank| {
            broker.worker(
                rank,
                &[
                    "--only",
                    "sizes",
                    "--repeat",
                    "1000000",
                    "--timeout-ms",
                    "5000",
                ],
            )
        })
        .collect();
    let delay = delay_ms.to_string();
    let attacker = hostile(
        &broker,
        "scribble",
        2,
        &["--delay-ms", &delay, "--for-ms", "300"],
    );
    let (status, stdout, _) = finish_status(attacker);
    assert_eq!(
        status.code(),
        Some(3),
        "the attacker did not scribble: {stdout}"
    );
    for (rank, victim) in victims.into_iter().enumerate() {
        let (status, stdout, stderr) = finish_status(victim);
        assert_eq!(
            status.signal(),
            None,
            "trial {trial}: rank {rank} was killed by a signal: {stdout}{stderr}"
        );
        assert!(
            !stderr.contains("panicked"),
            "trial {trial}: rank {rank} panicked: {stderr}"
        );
        // A million rounds cannot have passed: each victim stopped with an error that says
        // what went wrong (a peer lost, a corrupted ring, a bad reference, wrong data...).
        assert_eq!(
            status.code(),
            Some(1),
            "trial {trial}: rank {rank}: {stdout}"
        );
        assert!(stderr.starts_with("shmbroker: "), "trial {trial}: {stderr}");
    }
}

#[test]
fn a_peer_scribbling_over_every_region_it_can_write_hurts_nobody() {
    for (trial, delay_ms) in [(0, 0), (1, 17), (2, 60), (3, 150)] {
        scribble_trial(trial, delay_ms);
    }
}

/// Rank 2 fills its own outbox with random bytes while ranks 0 and 1 (threads of this process)
/// and it run reductions at every size and algorithm. Reading contributions in place may give
/// the victims wrong sums, and nothing else: no signal, no panic, no hang, and no error but one
/// naming rank 2 (or, once one victim has failed so and left, its departure, for the other).
/// In every run so far both victims finished every call.
#[test]
fn a_peer_scribbling_its_own_outbox_during_reductions_only_changes_values() {
    const ROUNDS: u64 = 12;
    let broker = Broker::start("garbage", 3);
    let attacker = hostile(
        &broker,
        "outbox-garbage",
        2,
        &["--rounds", &ROUNDS.to_string()],
    );
    let (done, results) = std::sync::mpsc::channel();
    for rank in 0..2u32 {
        let (socket, done) = (broker.socket(), done.clone());
        std::thread::spawn(move || {
            let outcome = (|| {
                let mut session = Session::connect(socket, Some(rank), Duration::from_secs(10))
                    .map_err(|e| ("connect", e))?;
                session.set_timeout(Duration::from_secs(10));
                let mut wrong = 0;
                for round in 0..ROUNDS {
                    wrong += hostile_peer::reductions_round(&mut session, round)?;
                }
                session.barrier().map_err(|e| ("barrier", e))?;
                Ok(wrong)
            })();
            let _ = done.send((rank, outcome));
        });
    }
    let mut outcomes = [None, None];
    for _ in 0..2 {
        let (rank, outcome) = results
            .recv_timeout(Duration::from_secs(120))
            .expect("a victim hung");
        outcomes[rank as usize] = Some(outcome);
    }
    let [Some(zero), Some(one)] = outcomes else {
        unreachable!("both victims answered")
    };
    // An error may only name the attacker (and not for a wait that ran out), or, for a victim
    // whose peer failed so, that peer's departure.
    let names_the_attacker = |outcome: &Result<u64, (&str, Error)>| match outcome {
        Ok(_) => true,
        Err((_, error)) => error.rank() == Some(2) && !matches!(error, Error::Timeout { .. }),
    };
    let mut wrong = 0;
    for (rank, outcome, other) in [(0u32, &zero, &one), (1, &one, &zero)] {
        match outcome {
            Ok(count) => wrong += count,
            Err((call, error)) => {
                let the_other_left_after_the_attacker = other.is_err()
                    && names_the_attacker(other)
                    && matches!(error, Error::PeerLeft { rank: left, .. } if *left == 1 - rank);
                assert!(
                    names_the_attacker(outcome) || the_other_left_after_the_attacker,
                    "rank {rank}: {call}: {error}"
                );
            }
        }
    }
    eprintln!("{wrong} wrong results; victims: {zero:?}, {one:?}");
    let (ok, stdout, stderr) = finish(attacker);
    if zero.is_ok() && one.is_ok() {
        // Both victims went on to the end, and so did the attacker, scribbling.
        assert!(ok, "the attacker failed: {stdout}{stderr}");
        assert!(stdout.contains("scribbled over its outbox"), "{stdout}");
        // The garbage reached the victims' results: the attack was made where it counts.
        assert!(wrong > 0, "no victim saw a wrong value: {stdout}");
    }
}

/// Rank 0 in this process, echoing rank 1 in a child; rank 1 is killed `after` into a loop of
/// 16 MiB round trips (so mid-transfer, one way or the other).
fn death_mid_transfer(trial: u32, after: Duration) {
    let broker = Broker::start(&format!("death{trial}"), 2);
    let mut echo = broker.worker(1, &["--only", "echo", "--repeat", "1000000"]);
    let mut zero = Session::connect(broker.socket(), Some(0), Duration::from_secs(10)).unwrap();
    zero.set_timeout(Duration::from_secs(10));
    let message = vec![7u8; 16 << 20];
    let start = Instant::now();
    let mut killed_at = None;
    let error = loop {
        if killed_at.is_none() && start.elapsed() >= after {
            kill(Pid::from_raw(echo.id() as i32), Signal::SIGKILL).unwrap();
            killed_at = Some(Instant::now());
        }
        if let Err(error) = zero.send(1, &message) {
            break error;
        }
        match zero.recv(1) {
            Ok(echoed) => assert_eq!(echoed.len(), message.len()),
            Err(error) => break error,
        }
    };
    let killed_at = killed_at.expect("rank 0 failed before the kill");
    let detection = killed_at.elapsed();
    assert!(
        matches!(error, Error::PeerLost { rank: 1, .. }),
        "trial {trial}: {error}"
    );
    assert!(
        detection < Duration::from_secs(1),
        "trial {trial}: the death took {detection:?} to be seen"
    );
    // Every block the dead rank still owed an acknowledgement for is back.
    assert_eq!(zero.outbox_blocks_owed(), 0, "trial {trial}");
    echo.kill();
}

#[test]
fn a_peer_dying_mid_transfer_is_named_and_gives_back_every_block() {
    for (trial, ms) in [(0, 5), (1, 37), (2, 120), (3, 301)] {
        death_mid_transfer(trial, Duration::from_millis(ms));
    }
}

/// Trials per run of the liar tests below: `HOSTILE_TRIALS`, 2 unless set.
fn trials() -> u32 {
    std::env::var("HOSTILE_TRIALS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(2)
}

/// What a victim thread of [`lie_then_recover`] reports.
enum Report {
    /// What the call the liar attacked returned.
    Attacked(u32, Result<Group, Error>),
    /// Whether the survivors shrank without the liar, made their group again and summed on
    /// both.
    Recovered(u32, Result<(), String>),
}

/// A victim's life: logs on, waits for the liar's messages (`go`), makes the attacked call,
/// and once the liar is gone (the test kills it when every victim has reported), shrinks to
/// `survivors`, makes their group again and checks an all-reduce on each.
fn victim(
    socket: String,
    rank: u32,
    liar: u32,
    survivors: Vec<u32>,
    attacked: fn(&mut Session) -> Result<Group, Error>,
    go: mpsc::Receiver<()>,
    report: mpsc::Sender<Report>,
) {
    const TIMEOUT: Duration = Duration::from_secs(10);
    let mut session = match Session::connect(socket, Some(rank), TIMEOUT) {
        Ok(session) => session,
        Err(error) => {
            let _ = report.send(Report::Attacked(rank, Err(error)));
            return;
        }
    };
    session.set_timeout(TIMEOUT);
    if go.recv_timeout(common::CHILD_DEADLINE).is_err() {
        return;
    }
    let _ = report.send(Report::Attacked(rank, attacked(&mut session)));
    let recovered = (|| {
        let until = Instant::now() + common::CHILD_DEADLINE;
        while session.raw().departure(liar).is_none() {
            if Instant::now() >= until {
                return Err(format!("rank {liar}'s death was never seen"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let shrunk = session.shrink().map_err(|e| format!("shrink: {e}"))?;
        if shrunk.ranks() != survivors.as_slice() {
            return Err(format!("shrink gave ranks {:?}", shrunk.ranks()));
        }
        let again = session
            .group(&survivors)
            .map_err(|e| format!("group({survivors:?}) after shrink: {e}"))?;
        for group in [&shrunk, &again] {
            let mut data = vec![rank as f32 + 1.0; 16];
            session
                .on(group)
                .all_reduce(&mut data, shmbroker::ReduceOp::Sum)
                .map_err(|e| format!("all_reduce on {:?}: {e}", group.ranks()))?;
            let sum: f32 = survivors.iter().map(|&r| r as f32 + 1.0).sum();
            if data.iter().any(|&value| value != sum) {
                return Err(format!("all_reduce gave {data:?}; {sum} was due"));
            }
        }
        Ok(())
    })();
    let _ = report.send(Report::Recovered(rank, recovered));
}

/// One trial: the hostile `mode` (with `extra` arguments) logs on as rank `liar` of 3 and lies
/// to every other rank, which then make the `attacked` call; `check` judges each victim's
/// outcome. Then the liar is killed, and the victims must shrink without it and carry on.
fn lie_then_recover(
    trial: u32,
    mode: &str,
    extra: &[&str],
    liar: u32,
    attacked: fn(&mut Session) -> Result<Group, Error>,
    check: impl Fn(u32, &Result<Group, Error>),
) {
    let name: String = extra
        .iter()
        .flat_map(|arg| arg.chars())
        .filter(char::is_ascii_alphanumeric)
        .collect();
    let broker = Broker::start(&format!("{mode}{name}{trial}"), 3);
    let mut attacker = hostile(&broker, mode, liar, extra);
    let survivors: Vec<u32> = (0..3).filter(|&rank| rank != liar).collect();
    let (report, reports) = mpsc::channel();
    let mut gos = Vec::new();
    for &rank in &survivors {
        let (go, started) = mpsc::channel();
        gos.push(go);
        let (socket, report, survivors) = (broker.socket(), report.clone(), survivors.clone());
        std::thread::spawn(move || {
            victim(socket, rank, liar, survivors, attacked, started, report);
        });
    }
    let said = common::read_line_within(attacker.take_stdout().unwrap(), common::CHILD_DEADLINE);
    if said.trim() != "forged" {
        attacker.kill();
        let mut stderr = String::new();
        if let Some(mut pipe) = attacker.take_stderr() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        panic!("trial {trial}: the liar said {said:?}: {stderr}");
    }
    for go in gos {
        let _ = go.send(());
    }
    for _ in &survivors {
        match reports.recv_timeout(common::CHILD_DEADLINE) {
            Ok(Report::Attacked(rank, outcome)) => {
                match &outcome {
                    Ok(group) => eprintln!(
                        "{mode} {name}, trial {trial}: rank {rank}: Ok({:?})",
                        group.ranks()
                    ),
                    Err(error) => eprintln!("{mode} {name}, trial {trial}: rank {rank}: {error}"),
                }
                check(rank, &outcome);
            }
            Ok(Report::Recovered(rank, outcome)) => {
                panic!("trial {trial}: rank {rank} skipped the attacked call: {outcome:?}")
            }
            Err(_) => panic!("trial {trial}: a victim hung in the attacked call"),
        }
    }
    attacker.kill();
    for _ in &survivors {
        match reports.recv_timeout(common::CHILD_DEADLINE) {
            Ok(Report::Recovered(rank, outcome)) => {
                assert_eq!(outcome, Ok(()), "trial {trial}: rank {rank}");
            }
            Ok(Report::Attacked(rank, _)) => panic!("trial {trial}: rank {rank} reported twice"),
            Err(_) => panic!("trial {trial}: a victim hung after the liar was killed"),
        }
    }
}

/// Rank 2 sends ranks 0 and 1 one proposal for the group of all three that names the last
/// stream below the setup stream. Each victim's `group` fails with a protocol error naming
/// rank 2 (not a misuse: the lie must not use up this rank's streams), and once rank 2 is gone
/// the victims shrink to [0, 1], make that group again and sum on both.
#[test]
fn a_member_proposing_a_forged_stream_is_named_and_spends_no_streams() {
    for trial in 0..trials() {
        lie_then_recover(
            trial,
            "group-forge",
            &[],
            2,
            |session| {
                session
                    .with_timeout(Duration::from_secs(5))
                    .group(&[0, 1, 2])
            },
            |rank, outcome| {
                assert!(
                    matches!(outcome, Err(Error::Protocol { peer: 2, .. })),
                    "trial {trial}: rank {rank}: {outcome:?}"
                );
            },
        );
    }
}

/// Rank 0, the first coordinator of `shrink`, tells ranks 1 and 2 that rank 2 departed. No
/// victim may shrink to a group without rank 2: rank 1 names rank 0 (rank 2 is alive there),
/// and rank 2 names rank 0 (the estimate names rank 2 itself). Once rank 0 is gone they shrink
/// to [1, 2], make that group again and sum on both.
#[test]
fn a_shrink_coordinator_calling_a_live_rank_departed_is_named() {
    for trial in 0..trials() {
        lie_then_recover(
            trial,
            "shrink-liar",
            &[],
            0,
            |session| session.with_timeout(Duration::from_secs(5)).shrink(),
            |rank, outcome| {
                let Err(Error::Protocol { peer: 0, detail }) = outcome else {
                    panic!("trial {trial}: rank {rank}: {outcome:?}");
                };
                let why = match rank {
                    1 => "rank 2 is alive here",
                    _ => "this rank 2",
                };
                assert!(detail.contains(why), "trial {trial}: rank {rank}: {detail}");
            },
        );
    }
}

/// Rank 0, the first coordinator of making the group of all three, sends ranks 1 and 2 an
/// honest proposal and then a decision blaming rank 1: that it departed, sent a forgery, or
/// passed other ranks. Neither victim may believe it (rank 1 is alive, and nobody saw it lie):
/// each one's `group` fails with a protocol error naming rank 0, never rank 1 or 2. Once rank
/// 0 is gone they shrink to [1, 2], make that group again and sum on both.
#[test]
fn a_coordinator_blaming_a_live_rank_is_named_itself() {
    for outcome in ["departed", "forged", "mismatch"] {
        for trial in 0..trials() {
            lie_then_recover(
                trial,
                "blame-liar",
                &["--outcome", outcome, "--blamed", "1"],
                0,
                |session| {
                    session
                        .with_timeout(Duration::from_secs(5))
                        .group(&[0, 1, 2])
                },
                |rank, result| {
                    assert!(
                        matches!(result, Err(Error::Protocol { peer: 0, .. })),
                        "{outcome}, trial {trial}: rank {rank}: {result:?}"
                    );
                },
            );
        }
    }
}
