//! Receiving from any peer: a task farm of real worker processes, flood fairness, a worker killed
//! mid-farm, a rank that never came, a split session driven from two threads (its receives going
//! on while a send waits for a slow peer), and an event loop on the readiness fd.

use shmbroker::Collectives;
use shmbroker::Error;
use shmbroker::session::Session;
use std::collections::HashMap;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;

use common::{Broker, World, farm_worker, farm_worker_with, fnv1a, task};

/// The reader of a farm: hands `tasks` out to whichever worker answers, checks every answer, and
/// returns how many tasks each worker did.
fn run_farm(reader: &mut Session, workers: &[u32], tasks: &[Vec<u8>]) -> HashMap<u32, usize> {
    let mut next = 0;
    let mut expected = HashMap::new();
    let mut done: HashMap<u32, usize> = HashMap::new();
    for &worker in workers {
        reader.send(worker, &tasks[next]).unwrap();
        expected.insert(worker, (next as u64, fnv1a(&tasks[next])));
        next += 1;
    }
    for _ in 0..tasks.len() {
        let (worker, result) = reader.recv_any().unwrap();
        let (id, hash) = expected
            .remove(&worker)
            .expect("an answer nobody was asked for");
        assert_eq!(result.len(), 16);
        assert_eq!(u64::from_le_bytes(result[..8].try_into().unwrap()), id);
        assert_eq!(
            u64::from_le_bytes(result[8..].try_into().unwrap()),
            hash,
            "task {id}"
        );
        *done.entry(worker).or_default() += 1;
        if next < tasks.len() {
            reader.send(worker, &tasks[next]).unwrap();
            expected.insert(worker, (next as u64, fnv1a(&tasks[next])));
            next += 1;
        }
    }
    for &worker in workers {
        reader.send(worker, &[]).unwrap();
    }
    done
}

#[test]
fn a_task_farm_checks_every_result_and_shares_work_by_speed() {
    let broker = Broker::start("farm", 4);
    // Workers 1 and 2 take 500 us a task, worker 3 three times as long.
    let mut children: Vec<_> = [(1, "500"), (2, "500"), (3, "1500")]
        .into_iter()
        .map(|(rank, us)| farm_worker(&broker, rank, &["--task-us", us]))
        .collect();
    let mut reader = Session::connect(broker.socket(), Some(0), Duration::from_secs(60)).unwrap();
    reader.set_timeout(Duration::from_secs(60));
    let tasks: Vec<Vec<u8>> = (0..11_000u64)
        .map(|id| task(id, if id % 11 == 10 { 64 << 10 } else { 64 }))
        .collect();
    let done = run_farm(&mut reader, &[1, 2, 3], &tasks);
    assert_eq!(done.values().sum::<usize>(), tasks.len());
    for child in children.drain(..) {
        let (ok, _, stderr) = common::finish(child);
        assert!(ok, "{stderr}");
    }
    // The slow worker does about a third of what each fast one does. Sleeps are not exact on a
    // loaded machine (with both CPUs taken by other work, the slow worker did up to 0.67 of a
    // fast one's count in 3 runs of 15), so the bounds are wide; a reader that ignored speed
    // (round-robin over workers) would give it a full share, 1.0.
    let slow = done[&3] as f64;
    for fast in [done[&1], done[&2]] {
        let share = slow / fast as f64;
        assert!((0.15..0.8).contains(&share), "{done:?}");
    }
}

#[test]
fn a_flooding_peer_cannot_starve_another() {
    let (_world, mut sessions) = World::start("flood", 3);
    let mut quiet = sessions.pop().unwrap();
    let mut flooder = sessions.pop().unwrap();
    let mut reader = sessions.pop().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooding = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match flooder
                    .with_timeout(Duration::from_millis(50))
                    .send(0, &sent.to_le_bytes())
                {
                    Ok(()) => sent += 1,
                    Err(Error::Timeout { .. }) => {}
                    Err(other) => panic!("{other}"),
                }
            }
            flooder
        })
    };
    // The flood is on: the reader's ring from rank 1 stays full.
    for _ in 0..200 {
        assert_eq!(reader.recv_any().unwrap().0, 1);
    }
    let (sent_tx, sent_rx) = mpsc::channel();
    let quiet_thread = std::thread::spawn(move || {
        quiet.send(0, b"me too").unwrap();
        sent_tx.send(()).unwrap();
        quiet
    });
    sent_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let mut flood_messages = 0;
    loop {
        let (from, bytes) = reader.recv_any().unwrap();
        if from == 2 {
            assert_eq!(bytes, b"me too");
            break;
        }
        flood_messages += 1;
        assert!(
            flood_messages <= 100,
            "rank 2 waited behind 100 messages of rank 1"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // Let the flooder's last send find room, then drop everything.
    while reader.try_recv_any().unwrap().is_some() {}
    let _flooder = flooding.join().unwrap();
    let _quiet = quiet_thread.join().unwrap();
}

#[test]
fn messages_of_every_size_come_from_any_peer_in_order() {
    let (_world, mut sessions) = World::start("any-sizes", 3);
    let sizes = [0usize, 1, 48, 49, 4096, 300 << 10, 2 << 20];
    let mut senders = sessions.split_off(1);
    let mut reader = sessions.pop().unwrap();
    let threads: Vec<_> = senders
        .drain(..)
        .map(|mut session| {
            std::thread::spawn(move || {
                let rank = session.rank();
                for (i, &size) in sizes.iter().enumerate() {
                    session.send(0, &vec![rank as u8 ^ i as u8; size]).unwrap();
                }
                session
            })
        })
        .collect();
    let mut next = [0usize; 3];
    let mut buffer = vec![0u8; 4 << 20];
    for n in 0..2 * sizes.len() {
        // Both ways of receiving from anyone, alternately.
        let (from, bytes) = if n % 2 == 0 {
            reader.recv_any().unwrap()
        } else {
            let (from, len) = reader.recv_any_into(&mut buffer).unwrap();
            (from, buffer[..len].to_vec())
        };
        let i = next[from as usize];
        assert_eq!(
            bytes,
            vec![from as u8 ^ i as u8; sizes[i]],
            "message {i} of rank {from}"
        );
        next[from as usize] += 1;
    }
    assert_eq!(reader.try_recv_any().unwrap(), None);
    assert_eq!(reader.try_recv(1).unwrap(), None);
    for thread in threads {
        thread.join().unwrap();
    }
}

#[test]
fn a_worker_killed_mid_farm_is_named_after_its_last_messages_and_the_farm_goes_on() {
    let broker = Broker::start("farm-kill", 4);
    let mut steady = [farm_worker(&broker, 1, &[]), farm_worker(&broker, 3, &[])];
    let mut doomed = farm_worker_with(&broker, 2, &["--burst-then-hang", "5"], Stdio::piped());
    let mut reader = Session::connect(broker.socket(), Some(0), Duration::from_secs(60)).unwrap();
    reader.set_timeout(Duration::from_secs(30));
    // Every worker must be in before one dies: the broker admits nobody to a job that has lost a
    // worker (a steady worker slow to start would be refused, and never answer).
    reader.await_peers(Duration::from_secs(30)).unwrap();
    reader.send(2, &task(1, 64)).unwrap();
    // Rank 2 has put five answers in its ring; it dies before the reader takes any of them.
    let said = common::read_line_within(doomed.take_stdout().unwrap(), common::CHILD_DEADLINE);
    assert_eq!(said.trim(), "burst sent");
    // The steady workers are busy when it dies: each has a task, and its answer may be taken
    // before or after the death is reported.
    reader.send(1, &task(0, 64)).unwrap();
    reader.send(3, &task(2, 64)).unwrap();
    doomed.kill();
    let _ = doomed.wait_timeout(Duration::from_secs(10)).unwrap();
    let mut from_doomed = Vec::new();
    let mut steady_answers = Vec::new();
    let mut error = None;
    while error.is_none() || steady_answers.len() < 2 {
        match reader.recv_any() {
            Ok((2, answer)) => {
                assert!(error.is_none(), "rank 2's messages come before its death");
                from_doomed.push(u64::from_le_bytes(answer[..8].try_into().unwrap()));
            }
            Ok((from @ (1 | 3), answer)) => {
                steady_answers.push((from, u64::from_le_bytes(answer[..8].try_into().unwrap())));
            }
            Ok((other, _)) => panic!("rank {other} is no worker"),
            Err(found) => {
                assert!(
                    error.is_none(),
                    "a death is reported once; then came {found}"
                );
                error = Some(found);
            }
        }
    }
    let error = error.unwrap();
    assert!(
        matches!(error, Error::PeerLost { rank: 2, .. }),
        "expected rank 2 named as lost, got {error}"
    );
    assert_eq!(
        from_doomed,
        [
            u64::MAX,
            u64::MAX - 1,
            u64::MAX - 2,
            u64::MAX - 3,
            u64::MAX - 4
        ]
    );
    steady_answers.sort_unstable();
    assert_eq!(steady_answers, [(1, 0), (3, 2)]);

    // Whatever needs rank 2 names it, and so does every collective (they need every rank).
    assert!(matches!(
        reader.try_recv(2),
        Err(Error::PeerLost { rank: 2, .. })
    ));
    assert!(matches!(
        reader.send(2, b"more"),
        Err(Error::PeerLost { rank: 2, .. })
    ));
    assert!(matches!(
        reader.with_timeout(Duration::from_secs(5)).barrier(),
        Err(Error::PeerLost { rank: 2, .. })
    ));

    // The reader carries on with the workers still there: small and large tasks, every answer
    // checked, both workers busy; then they are told to stop and exit cleanly.
    let tasks: Vec<Vec<u8>> = (0..600)
        .map(|id| task(id, if id % 6 == 0 { 64 << 10 } else { 64 }))
        .collect();
    let done = run_farm(&mut reader, &[1, 3], &tasks);
    assert_eq!(done.values().sum::<usize>(), tasks.len());
    assert!(done.get(&1).is_some_and(|&n| n > 0), "{done:?}");
    assert!(done.get(&3).is_some_and(|&n| n > 0), "{done:?}");
    for worker in &mut steady {
        let status = worker.wait_timeout(Duration::from_secs(30)).unwrap();
        assert!(status.is_some_and(|status| status.success()), "{status:?}");
    }
}

#[test]
fn a_rank_that_never_came_before_a_death_is_named_at_once_and_the_farm_goes_on_without_it() {
    let broker = Broker::start("farm-never-came", 4);
    let mut steady = farm_worker(&broker, 3, &[]);
    let mut doomed = farm_worker(&broker, 2, &[]);
    let mut reader = Session::connect(broker.socket(), Some(0), Duration::from_secs(60)).unwrap();
    reader.set_timeout(Duration::from_secs(30));
    // Ranks 0, 2 and 3 are in; rank 1 has not come when rank 2 dies.
    broker.await_logons(3);
    doomed.kill();
    let _ = doomed.wait_timeout(Duration::from_secs(10)).unwrap();
    // The broker admits nobody to a job that has lost a worker, so rank 1 never will come: a call
    // that needs it fails naming it and the death, instead of waiting out its 30 s.
    let never_came = |error: &Error| {
        matches!(
            error,
            Error::PeerNeverJoined {
                rank: 1,
                after: 2,
                after_left: false
            }
        )
    };
    let error = reader.recv(1).unwrap_err();
    assert!(never_came(&error), "{error}");
    assert!(
        error.to_string().contains(
            "rank 1 never logged on, and no longer can: the job was closed to newcomers when rank 2 died"
        ),
        "{error}"
    );
    let error = reader.send(1, b"anyone?").unwrap_err();
    assert!(never_came(&error), "{error}");
    // recv_any reports the death once and skips rank 1 without a word; a collective names the
    // death; the farm goes on with rank 3.
    assert!(matches!(
        reader.recv_any(),
        Err(Error::PeerLost { rank: 2, .. })
    ));
    assert!(matches!(
        reader.with_timeout(Duration::from_secs(5)).barrier(),
        Err(Error::PeerLost { rank: 2, .. })
    ));
    let tasks: Vec<Vec<u8>> = (0..100).map(|id| task(id, 64)).collect();
    let done = run_farm(&mut reader, &[3], &tasks);
    assert_eq!(done.get(&3), Some(&tasks.len()));
    // A rank 1 that comes now is turned away, told why.
    let late = Session::connect(broker.socket(), Some(1), Duration::from_secs(10)).unwrap_err();
    assert!(late.to_string().contains("rank 2 died"), "{late}");
    let status = steady.wait_timeout(Duration::from_secs(30)).unwrap();
    assert!(status.is_some_and(|status| status.success()), "{status:?}");
}

#[test]
fn a_rank_that_never_came_before_a_departure_is_named_and_recv_any_names_the_one_that_left() {
    let broker = Broker::start("farm-never-came-left", 3);
    let mut leaving = farm_worker(&broker, 2, &[]);
    let mut reader = Session::connect(broker.socket(), Some(0), Duration::from_secs(60)).unwrap();
    reader.set_timeout(Duration::from_secs(30));
    broker.await_logons(2);
    // Rank 2 is told to stop, and leaves; rank 1 never came.
    reader.send(2, &[]).unwrap();
    let status = leaving.wait_timeout(Duration::from_secs(30)).unwrap();
    assert!(status.is_some_and(|status| status.success()), "{status:?}");
    let error = reader.recv(1).unwrap_err();
    assert!(
        matches!(
            error,
            Error::PeerNeverJoined {
                rank: 1,
                after: 2,
                after_left: true
            }
        ),
        "{error}"
    );
    assert!(error.to_string().ends_with("when rank 2 left"), "{error}");
    // Nobody is left to receive from: the departure is named, not the rank that never came.
    let error = reader.recv_any().unwrap_err();
    assert!(matches!(error, Error::PeerLeft { rank: 2, .. }), "{error}");
}

#[test]
fn a_collective_waiting_on_a_live_peer_ends_when_a_third_rank_dies_and_messages_go_on() {
    let broker = Broker::start("farm-interrupt", 3);
    let mut steady = farm_worker(&broker, 1, &[]);
    let doomed = farm_worker(&broker, 2, &[]);
    let mut reader = Session::connect(broker.socket(), Some(0), Duration::from_secs(60)).unwrap();
    reader.await_peers(Duration::from_secs(30)).unwrap();
    // The reader waits in a broadcast from rank 1, which is alive but never joins it (it waits
    // for a task); rank 2, which the reader does not wait on, dies meanwhile. The broadcast must
    // end naming rank 2, not wait out its 60 s: rank 1 will never send.
    let killer = std::thread::spawn(move || {
        let mut doomed = doomed;
        std::thread::sleep(Duration::from_millis(200));
        doomed.kill();
        doomed.wait_timeout(Duration::from_secs(10)).unwrap()
    });
    let error = reader
        .with_timeout(Duration::from_secs(60))
        .broadcast(1, None)
        .unwrap_err();
    assert!(matches!(error, Error::PeerLost { rank: 2, .. }), "{error}");
    killer.join().unwrap();
    // `recv_any` reports the death once too (rank 2 could have sent something first), then
    // serves rank 1, which is still there, and so are the rings to it.
    assert!(matches!(
        reader.recv_any(),
        Err(Error::PeerLost { rank: 2, .. })
    ));
    let tasks: Vec<Vec<u8>> = (0..200).map(|id| task(id, 64)).collect();
    let done = run_farm(&mut reader, &[1], &tasks);
    assert_eq!(done.get(&1), Some(&tasks.len()));
    let status = steady.wait_timeout(Duration::from_secs(30)).unwrap();
    assert!(status.is_some_and(|status| status.success()), "{status:?}");
}

#[test]
fn an_interrupter_ends_a_wait_from_another_thread_and_the_session_goes_on() {
    let broker = Broker::start("farm-interrupter", 2);
    let mut worker = farm_worker(&broker, 1, &[]);
    let mut reader = Session::connect(broker.socket(), Some(0), Duration::from_secs(60)).unwrap();
    reader.set_timeout(Duration::from_secs(60));
    // Each blocking way of waiting, on a peer that is alive and silent (it waits for a task).
    type Wait = fn(&mut Session) -> Result<(), Error>;
    let waits: [(&str, Wait); 3] = [
        ("recv", |s| s.recv(1).map(drop)),
        ("recv_any", |s| s.recv_any().map(drop)),
        ("broadcast", |s| s.broadcast(1, None).map(drop)),
    ];
    for (name, wait) in waits {
        let interrupter = reader.interrupter();
        let poke = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            interrupter.interrupt();
        });
        let outcome = wait(&mut reader);
        poke.join().unwrap();
        assert!(
            matches!(outcome, Err(Error::Interrupted)),
            "{name}: {outcome:?}"
        );
        if name != "broadcast" {
            // Nothing was lost, and the session carries on.
            let tasks: Vec<Vec<u8>> = (0..50).map(|id| task(id, 64)).collect();
            for task in &tasks {
                reader.send(1, task).unwrap();
                let answer = reader.recv(1).unwrap();
                assert_eq!(
                    u64::from_le_bytes(answer[8..].try_into().unwrap()),
                    fnv1a(task)
                );
            }
        }
    }
    // An interrupt that came when nothing waited is forgotten on request.
    reader.interrupter().interrupt();
    reader.clear_interrupt();
    reader.send(1, &task(7, 64)).unwrap();
    assert_eq!(reader.recv(1).unwrap().len(), 16);
    reader.send(1, &[]).unwrap();
    let status = worker.wait_timeout(Duration::from_secs(30)).unwrap();
    assert!(status.is_some_and(|status| status.success()), "{status:?}");
}

#[test]
fn a_peer_forging_a_leave_that_blames_a_live_rank_is_named_itself_and_that_rank_goes_on() {
    // A death claim about a live rank: not believed, nothing said after "left".
    forged_leave("death", 1, None);
}

#[test]
fn a_peer_leaving_after_a_timeout_says_on_whom_and_a_forged_rank_is_not_named() {
    use shmbroker::handshake::TIMED_OUT;
    use shmbroker::session::LeftAfter;
    // "Timed out waiting for rank 1": its word, taken as said; rank 1 goes on all the same.
    forged_leave("timeout", TIMED_OUT | 1, Some(LeftAfter::TimedOut(1)));
    // A rank outside the world (and the forger itself) is never named.
    forged_leave("outside", TIMED_OUT | 9, None);
    forged_leave("itself", TIMED_OUT | 2, None);
}

/// Rank 2 closes its ring ends writing `cause` as the cause and stays alive; the reader names
/// rank 2 as having left, with `after`, and farms on with rank 1.
fn forged_leave(name: &str, cause: u32, after: Option<shmbroker::session::LeftAfter>) {
    let broker = Broker::start(&format!("farm-forged-{name}"), 3);
    let mut honest = farm_worker(&broker, 1, &[]);
    let cause = cause.to_string();
    let mut forger = farm_worker_with(&broker, 2, &["--leave-citing", &cause], Stdio::piped());
    let mut reader = Session::connect(broker.socket(), Some(0), Duration::from_secs(60)).unwrap();
    reader.set_timeout(Duration::from_secs(30));
    reader.send(2, &task(0, 64)).unwrap();
    let said = common::read_line_within(forger.take_stdout().unwrap(), common::CHILD_DEADLINE);
    assert_eq!(said.trim(), "forged");
    // Rank 2 closed its ends saying rank 1 died, and stays alive. Rank 1 is alive, so the claim
    // does not hold: rank 2 itself is named, as having left.
    let error = reader.recv(2).unwrap_err();
    assert!(
        matches!(error, Error::PeerLeft { rank: 2, after: a, .. } if a == after),
        "{error:?}"
    );
    // Nobody is taken for dead: the farm goes on with rank 1, every answer checked.
    let tasks: Vec<Vec<u8>> = (0..200).map(|id| task(id, 64)).collect();
    let done = run_farm(&mut reader, &[1], &tasks);
    assert_eq!(done.get(&1), Some(&tasks.len()));
    assert_eq!(reader.raw().lost_rank(), None);
    let status = honest.wait_timeout(Duration::from_secs(30)).unwrap();
    assert!(status.is_some_and(|status| status.success()), "{status:?}");
    forger.kill();
}

/// Whether `error` names `rank` as the one gone or at fault.
fn names(error: &Error, rank: u32) -> bool {
    match *error {
        Error::PeerLost { rank: r, .. } | Error::PeerLeft { rank: r, .. } => r == rank,
        Error::Corrupted { peer, .. }
        | Error::Protocol { peer, .. }
        | Error::Outbox { peer, .. } => peer == rank,
        _ => false,
    }
}

/// One trial: the reader farms 64 B tasks to an honest worker (rank 1) with `recv_any` while
/// rank 2, `delay_ms` after logon, scribbles random bytes over every region it can write (its
/// rings with both other ranks among them) and then dies.
///
/// What its garbage may do is decide how it is seen: dead, caught corrupting a ring, or (when
/// the bytes it left say "closed, no cause") as having left, which leaves the others be. So the
/// trial accepts each of these, and checks what must hold in all of them: every answer the reader
/// takes from rank 1 is right, nothing hangs or panics, and whoever stops names rank 2.
fn scribbled_farm_trial(trial: u32, delay_ms: &str) {
    let broker = Broker::start(&format!("farm-scribble{trial}"), 3);
    let mut honest = farm_worker(&broker, 1, &[]);
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_hostile"));
    command
        .args(["scribble", "--socket", &broker.socket(), "--rank", "2"])
        .args(["--delay-ms", delay_ms, "--for-ms", "300"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut attacker = common::spawn(&mut command);
    let mut reader = Session::connect(broker.socket(), Some(0), Duration::from_secs(60)).unwrap();
    reader.set_timeout(Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut id = 0u64;
    // The task being farmed when the attacker was seen to have exited.
    let mut attacker_gone_at = None;
    reader.send(1, &task(id, 64)).unwrap();
    let error = loop {
        assert!(
            Instant::now() < deadline,
            "trial {trial}: the farm never ended"
        );
        if attacker_gone_at.is_none() && attacker.wait_timeout(Duration::ZERO).unwrap().is_some() {
            attacker_gone_at = Some(id);
        }
        if attacker_gone_at.is_some_and(|at| id >= at + 2_000) {
            // Rank 2 is seen as gone while the farm with rank 1 goes on.
            let error = reader.try_recv(2).unwrap_err();
            assert!(names(&error, 2), "trial {trial}: {error}");
            break None;
        }
        match reader.recv_any() {
            // Rank 1's answers stay right, however rank 2's rings look.
            Ok((1, answer)) => {
                assert_eq!(answer[..8], id.to_le_bytes(), "trial {trial}");
                assert_eq!(
                    answer[8..],
                    fnv1a(&task(id, 64)).to_le_bytes(),
                    "trial {trial}"
                );
                id += 1;
                if let Err(error) = reader.send(1, &task(id, 64)) {
                    break Some(error);
                }
            }
            // Whatever rank 2 puts in its ring is its own message to send.
            Ok((2, _)) => {}
            Ok((other, _)) => panic!("trial {trial}: rank {other} is no peer"),
            Err(error) => break Some(error),
        }
    };
    let (status, stdout, _) = common::finish_status(attacker);
    assert_eq!(
        status.code(),
        Some(3),
        "the attacker did not scribble: {stdout}"
    );
    eprintln!("trial {trial}: {id} tasks, then {error:?}");
    match error {
        None => {}
        Some(error) if names(&error, 2) => {}
        // Rank 1 read rank 2's garbage as a death, which ends its session (as a death does);
        // the reader then sees rank 1 go, and rank 1 says why, naming rank 2.
        Some(error) if names(&error, 1) => {
            let status = honest.wait_timeout(common::CHILD_DEADLINE).unwrap();
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut honest.take_stderr().unwrap(), &mut stderr).unwrap();
            assert!(
                status.is_some() && stderr.contains("rank 2"),
                "trial {trial}: {error}; rank 1: {stderr}"
            );
        }
        Some(error) => panic!("trial {trial}: after {id} tasks: {error}"),
    }
    honest.kill();
}

#[test]
fn a_peer_scribbling_its_rings_cannot_disturb_recv_any_from_the_others() {
    for (trial, delay_ms) in [(0, "0"), (1, "40"), (2, "150")] {
        scribbled_farm_trial(trial, delay_ms);
    }
}

#[test]
fn a_split_session_sends_and_receives_a_million_messages_each_way_from_two_threads() {
    const COUNT: u64 = 1_000_000;
    let (_world, sessions) = World::start("split", 2);
    let ends: Vec<_> = sessions
        .into_iter()
        .map(|session| {
            let peer = 1 - session.rank();
            let (sender, receiver) = session.split();
            let sending = std::thread::spawn(move || {
                for n in 0..COUNT {
                    sender.send(peer, &n.to_le_bytes()).unwrap();
                }
                sender
            });
            let receiving = std::thread::spawn(move || {
                for n in 0..COUNT {
                    let bytes = receiver.recv(peer).unwrap();
                    assert_eq!(bytes, n.to_le_bytes());
                }
                receiver
            });
            (sending, receiving)
        })
        .collect();
    for (sending, receiving) in ends {
        let sender = sending.join().unwrap();
        let receiver = receiving.join().unwrap();
        // Whole again, for a collective.
        let mut session = sender.rejoin(receiver).unwrap();
        std::thread::spawn(move || session.barrier().unwrap());
    }
}

/// Bytes that say which message they are and where in it each lies.
fn pattern(id: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (id.wrapping_mul(31).wrapping_add(i as u64 / 7)) as u8)
        .collect()
}

/// A split rank 0 whose sender waits for slow rank 1 (a message larger than its outbox, or
/// broadcasts that fill it), while its receiver takes rank 2's reply. The reply must come
/// first: rank 1 receives only once it has. A sender that held the session while it waited
/// would keep the receiver out until the send ended, which is never: both would time out.
fn receive_beside_a_waiting_send(broadcast: bool) {
    // Four broadcasts of 400 KiB, of which the outbox (1 MiB) holds two; or one 4 MiB send.
    let messages: Vec<Vec<u8>> = if broadcast {
        (0..4).map(|id| pattern(id, 400 << 10)).collect()
    } else {
        vec![pattern(1, 4 << 20)]
    };
    let (_world, mut sessions) = World::start_with_outbox("beside", 3, 1 << 20);
    let mut fast = sessions.pop().unwrap();
    let mut slow = sessions.pop().unwrap();
    let (sender, receiver) = sessions.pop().unwrap().split();
    let (replied_tx, replied_rx) = mpsc::channel::<()>();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sending = {
        let sent = std::sync::Arc::clone(&sent);
        let messages = messages.clone();
        std::thread::spawn(move || {
            for data in &messages {
                if broadcast {
                    sender.broadcast(data).unwrap();
                } else {
                    sender.send(1, data).unwrap();
                }
            }
            sent.store(true, std::sync::atomic::Ordering::SeqCst);
            sender
        })
    };
    let count = messages.len();
    let fast = std::thread::spawn(move || {
        if broadcast {
            fast.broadcast(0, None).unwrap();
            fast.send(0, b"reply").unwrap();
            for _ in 1..count {
                fast.broadcast(0, None).unwrap();
            }
        } else {
            fast.send(0, b"reply").unwrap();
        }
        fast
    });
    let slow = std::thread::spawn(move || {
        // Not receiving until rank 0 has the reply (or gave up on it).
        let _ = replied_rx.recv_timeout(common::SESSION_TIMEOUT);
        let got: Vec<Vec<u8>> = (0..count)
            .map(|_| {
                if broadcast {
                    slow.broadcast(0, None).unwrap()
                } else {
                    slow.recv(0).unwrap()
                }
            })
            .collect();
        (slow, got)
    });
    let reply = receiver.recv_any();
    let still_sending = !sent.load(std::sync::atomic::Ordering::SeqCst);
    replied_tx.send(()).unwrap();
    assert_eq!(reply.unwrap(), (2, b"reply".to_vec()));
    assert!(still_sending, "the sends finished before rank 1 received");
    let sender = sending.join().unwrap();
    let (_slow, got) = slow.join().unwrap();
    assert!(got == messages, "rank 1 got other bytes than were sent");
    let _fast = fast.join().unwrap();
    sender.rejoin(receiver).unwrap();
}

#[test]
fn a_split_receive_goes_on_while_a_send_waits_for_a_slow_peer() {
    receive_beside_a_waiting_send(false);
}

#[test]
fn a_split_receive_goes_on_while_a_broadcast_waits_for_a_slow_peer() {
    receive_beside_a_waiting_send(true);
}

/// Sizes from one slot to several chunks, so that sends that wait give the session up between
/// pieces of eager and pipelined messages alike.
const MIXED: [usize; 7] = [0, 9, 200, 3000, 40_000, 300_000, 1_500_000];

#[test]
fn split_halves_keep_every_message_whole_and_in_order_both_ways() {
    const ROUNDS: u64 = 40;
    let (_world, sessions) = World::start_with_outbox("mixed", 3, 1 << 20);
    let ranks: Vec<_> = sessions
        .into_iter()
        .map(|session| {
            let me = session.rank();
            let (sender, receiver) = session.split();
            let sending = std::thread::spawn(move || {
                for id in 0..ROUNDS {
                    for peer in (0..3).filter(|&p| p != me) {
                        let len = MIXED[(id as usize + peer as usize) % MIXED.len()];
                        sender
                            .send(peer, &pattern(id * 3 + u64::from(me), len))
                            .unwrap();
                    }
                }
                sender
            });
            let receiving = std::thread::spawn(move || {
                let mut next = [0u64; 3];
                for _ in 0..ROUNDS * 2 {
                    let (peer, got) = receiver.recv_any().unwrap();
                    let id = next[peer as usize];
                    let len = MIXED[(id as usize + me as usize) % MIXED.len()];
                    assert!(
                        got == pattern(id * 3 + u64::from(peer), len),
                        "rank {me}: message {id} from rank {peer} ({} bytes) came garbled",
                        got.len()
                    );
                    next[peer as usize] += 1;
                }
                receiver
            });
            (sending, receiving)
        })
        .collect();
    for (sending, receiving) in ranks {
        let sender = sending.join().unwrap();
        let receiver = receiving.join().unwrap();
        sender.rejoin(receiver).unwrap();
    }
}

#[test]
fn a_collective_on_the_sender_waits_out_a_receive_part_way_through_a_message() {
    // Rank 1 sends a pipelined message that fits its outbox, then joins a barrier. Rank 0's
    // receiver takes the message while its sender runs the barrier through `session()`: the
    // barrier must not take messages out of the inbox under the receive. Trials start the
    // barrier at different points of the transfer. (A message larger than the outbox would
    // wait for the receive, which a barrier that started first holds off: the documented
    // limit of a collective on a split session.)
    const BIG: usize = 700 << 10;
    for (trial, delay_us) in (0..20u64).map(|n| n * 25).enumerate() {
        let (_world, mut sessions) = World::start_with_outbox("mid-receive", 2, 1 << 20);
        let mut one = sessions.pop().unwrap();
        let (sender, receiver) = sessions.pop().unwrap().split();
        let data = pattern(trial as u64, BIG);
        let one = {
            let data = data.clone();
            std::thread::spawn(move || {
                one.send(0, &data).unwrap();
                one.barrier().unwrap();
                one.send(0, b"after").unwrap();
                one
            })
        };
        let barrier = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_micros(delay_us));
            sender.session().barrier().unwrap();
            sender
        });
        let got = receiver.recv(1).unwrap();
        assert!(got == data, "trial {trial}: the message came garbled");
        assert_eq!(receiver.recv(1).unwrap(), b"after", "trial {trial}");
        let sender = barrier.join().unwrap();
        let _one = one.join().unwrap();
        sender.rejoin(receiver).unwrap();
    }
}

#[test]
fn a_death_seen_by_the_sender_leaves_a_receive_from_a_live_peer_whole() {
    // Rank 2 is a worker process waiting in its self-test's first collective; rank 1 streams a
    // message 64 times the outbox to rank 0, whose receiver takes it while its sender sends to
    // rank 1. Rank 2 is killed mid-transfer: the sender learns of the death, which ends the
    // world's collectives (their stream closes), but the point-to-point message goes on whole.
    // (Where the death lands in the transfer is up to the machine: the demux unit test
    // `closing_a_stream_leaves_a_point_to_point_message_a_receive_is_taking` pins the case.)
    const BIG: usize = 64 << 20;
    let broker = Broker::start("split-death", 3);
    let connect = |rank| {
        let socket = broker.socket();
        std::thread::spawn(move || {
            let mut session =
                Session::connect_with_outbox(&socket, Some(rank), common::SESSION_TIMEOUT, 1 << 20)
                    .unwrap();
            session.set_timeout(common::SESSION_TIMEOUT);
            session
        })
    };
    let (zero, one) = (connect(0), connect(1));
    let mut doomed = broker.worker(2, &[]);
    let (mut one, zero) = (one.join().unwrap(), zero.join().unwrap());
    let (sender, receiver) = zero.split();
    let data = pattern(7, BIG);
    let streaming = {
        let data = data.clone();
        std::thread::spawn(move || {
            one.send(0, &data).unwrap();
            for n in 0..200u32 {
                assert_eq!(one.recv(0).unwrap(), pattern(u64::from(n), 100));
            }
            one
        })
    };
    let sending = std::thread::spawn(move || {
        // Sends that look at the peers (and so learn of the death) while the receive goes on.
        // Past one slot, so that each send looks for departures first.
        for n in 0..200u32 {
            sender.send(1, &pattern(u64::from(n), 100)).unwrap();
            std::thread::sleep(Duration::from_micros(100));
        }
        sender
    });
    std::thread::sleep(Duration::from_millis(5));
    doomed.kill();
    let got = receiver.recv(1).unwrap();
    assert!(got == data, "the message from live rank 1 came garbled");
    let sender = sending.join().unwrap();
    let _one = streaming.join().unwrap();
    sender.rejoin(receiver).unwrap();
}

#[test]
fn halves_of_different_sessions_do_not_rejoin() {
    let (_world, mut sessions) = World::start("rejoin", 2);
    let (sender, _) = sessions.pop().unwrap().split();
    let (_, receiver) = sessions.pop().unwrap().split();
    let error = sender.rejoin(receiver).unwrap_err();
    assert!(matches!(error, Error::Misuse(_)), "{error}");
}

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD).unwrap();
    let (user, system) = (usage.user_time(), usage.system_time());
    let micros = (user.tv_sec() + system.tv_sec()) * 1_000_000 + user.tv_usec() + system.tv_usec();
    Duration::from_micros(micros as u64)
}

#[test]
fn an_event_loop_sleeps_on_the_readiness_fd_without_spinning() {
    use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
    let (_world, mut sessions) = World::start("epoll", 3);
    let mut late = sessions.pop().unwrap();
    let mut early = sessions.pop().unwrap();
    let (receiver_tx, receiver_rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut reader = sessions.pop().unwrap();
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).unwrap();
        epoll
            .add(
                reader.readiness_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, 0),
            )
            .unwrap();
        let mut got = Vec::new();
        let mut idle = None;
        while got.len() < 2 {
            while let Some(message) = reader.try_recv_any().unwrap() {
                got.push(message);
            }
            if got.len() == 2 {
                break;
            }
            let before = (Instant::now(), thread_cpu());
            let mut events = [EpollEvent::empty()];
            let woke = epoll
                .wait(&mut events, EpollTimeout::from(5000u16))
                .unwrap();
            assert_eq!(woke, 1, "no wake-up within 5 s");
            if got.is_empty() {
                idle = Some((before.0.elapsed(), thread_cpu() - before.1));
                receiver_tx.send(()).unwrap();
            }
        }
        (got, idle.unwrap())
    });
    // The reader sleeps for a second with nothing to read, then rank 1 sends; then rank 2.
    std::thread::sleep(Duration::from_secs(1));
    early.send(0, b"early").unwrap();
    receiver_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    late.send(0, b"late").unwrap();
    let (got, (slept, cpu)) = reader.join().unwrap();
    assert_eq!(got, [(1, b"early".to_vec()), (2, b"late".to_vec())]);
    assert!(
        slept >= Duration::from_millis(800),
        "woke after {slept:?} with nothing to read"
    );
    assert!(
        cpu * 20 < slept,
        "the reader used {cpu:?} of CPU while it slept {slept:?} (5% allowed)"
    );
}

#[test]
fn recv_any_waits_in_the_library_as_well_as_in_epoll() {
    let (_world, mut sessions) = World::start("any-wait", 3);
    let mut two = sessions.pop().unwrap();
    let one = sessions.pop().unwrap();
    let mut reader = sessions.pop().unwrap();
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        two.send(0, b"from two").unwrap();
        (one, two)
    });
    assert_eq!(reader.recv_any().unwrap(), (2, b"from two".to_vec()));
    let error = reader
        .with_timeout(Duration::from_millis(100))
        .recv_any()
        .unwrap_err();
    assert!(
        matches!(&error, Error::Timeout { op: "recv_any", waiting_for, .. } if waiting_for == &[1, 2]),
        "{error}"
    );
    let _ = sender.join().unwrap();
}

#[test]
fn peers_that_left_are_skipped_and_named_once_everyone_has() {
    let (_world, mut sessions) = World::start("any-left", 3);
    let mut two = sessions.pop().unwrap();
    let one = sessions.pop().unwrap();
    let mut reader = sessions.pop().unwrap();
    // Rank 1 leaves with a message still unread: it is delivered, then rank 1 is skipped.
    let mut one = one;
    one.send(0, b"goodbye").unwrap();
    drop(one);
    assert_eq!(reader.recv_any().unwrap(), (1, b"goodbye".to_vec()));
    two.send(0, b"still here").unwrap();
    assert_eq!(reader.recv_any().unwrap(), (2, b"still here".to_vec()));
    let error = reader.try_recv(1).unwrap_err();
    assert!(matches!(error, Error::PeerLeft { rank: 1, .. }), "{error}");
    // A split receiver waiting for the one that left is told at once, not at its deadline.
    let (sender, receiver) = reader.split();
    let started = Instant::now();
    let error = receiver.recv(1).unwrap_err();
    assert!(matches!(error, Error::PeerLeft { rank: 1, .. }), "{error}");
    assert!(started.elapsed() < common::SESSION_TIMEOUT / 2);
    drop(two);
    let mut reader = sender.rejoin(receiver).unwrap();
    let error = reader.recv_any().unwrap_err();
    assert!(matches!(error, Error::PeerLeft { .. }), "{error}");
}
