//! A dead rank's replacement rejoins a running job, with real processes: the survivors learn of
//! it (`PeerRejoined` after `PeerLost`, or `wait_for_rank`), point-to-point works with it afresh
//! (nothing the dead process sent or was sent reaches it or comes back as from it), a group of
//! the whole world runs collectives again, and deaths during the rejoin (the newcomer's, a
//! survivor's) leave nobody waiting. The broker's refusals (a rank alive, one that left, a
//! second replacement, a rejoin naming no job or another) are checked against a live job.
//!
//! Survivors run on threads of this test; the ranks that die and their replacements are this
//! test binary started again (`rejoin_rank`, with a scenario).

use shmbroker::Collectives;
use shmbroker::ReduceOp;
use shmbroker::bindings::{LogonFrame, RejectReason, job_id};
use shmbroker::handshake::Error as HandshakeError;
use shmbroker::session::{Error, Session};
use shmbroker_test_support::process::ChildGuard;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{Broker, finish, spawn};

const TIMEOUT: Duration = Duration::from_secs(30);

/// Logs on as `rank` of job `job` (`None`: naming no job), from this process.
fn log_on(socket: &str, rank: u32, job: Option<&str>) -> Result<Session, Error> {
    let mut logon = LogonFrame::new(rank);
    if let Some(job) = job {
        logon.job = job_id(job);
    }
    let connection = shmbroker::handshake::connect(socket, logon, TIMEOUT)?;
    Session::from_handshake_with(connection, 1 << 20, TIMEOUT)
}

/// This test binary as rank `rank` of job `job`, playing `scenario` (see `rejoin_rank`).
fn child(broker: &Broker, rank: u32, job: &str, scenario: &str) -> ChildGuard {
    spawn(&mut rank_command(broker, rank, job, scenario))
}

/// The command that starts [`child`].
fn rank_command(broker: &Broker, rank: u32, job: &str, scenario: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--ignored", "--exact", "rejoin_rank", "--nocapture"])
        .env("SHMBROKER_TEST_SCENARIO", scenario)
        .env("SHMBROKER_TEST_SOCKET", broker.socket())
        .env("SHMBROKER_TEST_RANK", rank.to_string())
        .env("SHMBROKER_JOB", job)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// This test binary replacing rank `rank` of job `job`: it says hello to rank 0, runs an
/// all-reduce on a group of `group`, and then dies if `then_die`.
fn hello(broker: &Broker, rank: u32, job: &str, group: &str, then_die: bool) -> ChildGuard {
    let mut command = rank_command(broker, rank, job, "hello");
    command.env("SHMBROKER_TEST_GROUP", group);
    if then_die {
        command.env("SHMBROKER_TEST_DIE", "1");
    }
    spawn(&mut command)
}

/// Waits for `child` to be killed by SIGKILL (as its scenario does to itself).
fn killed(child: ChildGuard) {
    use std::os::unix::process::ExitStatusExt;
    let (status, _, stderr) = common::finish_status(child);
    assert_eq!(status.signal(), Some(9), "{status:?}: {stderr}");
}

/// Dies as a crash does: no goodbye, no destructor.
fn die() -> ! {
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    unreachable!("SIGKILL returned");
}

/// The whole world's sum of `[rank + 1; 4]` (as u32), on a group of `ranks`.
fn group_sum(session: &mut Session, ranks: &[u32]) -> Vec<u32> {
    let group = session.group(ranks).unwrap();
    let mut data = vec![session.rank() + 1; 4];
    session
        .on(&group)
        .all_reduce(&mut data, ReduceOp::Sum)
        .unwrap();
    data
}

/// A rank started by a test of this file; nothing when run directly.
#[test]
#[ignore = "a rank of another test of this file"]
fn rejoin_rank() {
    let Some((scenario, mut session)) = common::rank_session() else {
        return;
    };
    let rank = session.rank();
    session.set_timeout(TIMEOUT);
    match scenario.as_str() {
        // Says something to every peer, meets them, and dies with their messages unread.
        "victim" => {
            for peer in (0..session.world_size()).filter(|&p| p != rank) {
                session
                    .send(peer, format!("old to {peer}").as_bytes())
                    .unwrap();
            }
            session.barrier().unwrap();
            die();
        }
        // Dies right after logging on (a replacement that crashes at once).
        "die_at_once" => die(),
        // Meets the others, then waits (alive) for the test to kill it.
        "linger" => {
            session.barrier().unwrap();
            std::thread::sleep(TIMEOUT);
        }
        // Meets the others, then dies.
        "die_after_barrier" => {
            session.barrier().unwrap();
            die();
        }
        // Rank 1 of `kill_rejoin_all_reduce_trials`: for every "go" from rank 0, a group of
        // the whole world with rank 2's latest replacement and an all-reduce on it.
        "steady" => {
            session.barrier().unwrap();
            while session.recv(0).unwrap() == b"go" {
                loop {
                    session.wait_for_rank(2).unwrap();
                    match session.group(&[0, 1, 2]) {
                        Ok(group) => {
                            let mut data = vec![2u32; 4];
                            session
                                .on(&group)
                                .all_reduce(&mut data, ReduceOp::Sum)
                                .unwrap();
                            assert_eq!(data, vec![6; 4]);
                            break;
                        }
                        // The last replacement, seen dead only now: the next one comes.
                        Err(Error::PeerLost { rank: 2, .. }) => {}
                        Err(other) => panic!("{other}"),
                    }
                }
                session.send(0, b"done").unwrap();
            }
        }
        // Replaces rank 2 of `a_dead_ranks_replacement_rejoins_the_job`.
        "newcomer" => {
            assert!(session.rejoined());
            assert_eq!(session.rejoins(), 1);
            // The world's collectives ended with the death this process replaces: a `PeerLost`
            // saying so (the peers are alive, so anything else would be a 30 s `Timeout`).
            match session.barrier() {
                Err(Error::PeerLost { rank: 2, diagnosis }) => {
                    assert!(diagnosis[0].contains("replaced rank 2"), "{diagnosis:?}");
                }
                other => panic!("a replacement's world barrier: {other:?}"),
            }
            session.send(0, b"new to 0").unwrap();
            session.send(1, b"new to 1").unwrap();
            // Only what was sent to this process: nothing the dead one was sent.
            assert_eq!(session.recv(1).unwrap(), b"after from 1");
            assert_eq!(session.recv(0).unwrap(), b"after from 0");
            assert_eq!(group_sum(&mut session, &[0, 1, 2]), vec![6; 4]);
            println!("newcomer done");
        }
        // Comes late, after the job lost a worker: no replacement, yet taken on the same way.
        "late" => {
            assert!(!session.rejoined());
            session.send(0, b"late").unwrap();
            assert_eq!(group_sum(&mut session, &[0, 2]), vec![4; 4]);
        }
        // Replaces a rank, then says hello to rank 0 and runs a group with the ranks in
        // SHMBROKER_TEST_GROUP.
        "hello" => {
            assert!(session.rejoined());
            session.send(0, b"hello").unwrap();
            let ranks: Vec<u32> = std::env::var("SHMBROKER_TEST_GROUP")
                .unwrap()
                .split(',')
                .map(|r| r.parse().unwrap())
                .collect();
            let group = session.group(&ranks).unwrap();
            let mut data = vec![session.rank() + 1; 4];
            session
                .on(&group)
                .all_reduce(&mut data, ReduceOp::Sum)
                .unwrap();
            let want: u32 = ranks.iter().map(|r| r + 1).sum();
            assert_eq!(data, vec![want; 4]);
            if std::env::var_os("SHMBROKER_TEST_DIE").is_some() {
                die();
            }
        }
        other => panic!("unknown scenario {other}"),
    }
}

/// Rank 2 dies with messages unread both ways; its replacement rejoins. Rank 0 hears of it
/// through `recv_any` (what the dead process sent, then `PeerLost`, then `PeerRejoined`), rank 1
/// through `wait_for_rank`. Both then exchange messages with the newcomer, numbered afresh, and
/// the three run an all-reduce on a group of the whole world; the world's own collectives fail
/// at once naming rank 2.
#[test]
fn a_dead_ranks_replacement_rejoins_the_job() {
    let broker = Broker::start("rejoin", 3);
    let job = "rejoin-job";
    let victim = child(&broker, 2, job, "victim");
    let socket = broker.socket();
    let one = std::thread::spawn(move || {
        let mut session = log_on(&socket, 1, Some(job)).unwrap();
        session.set_timeout(TIMEOUT);
        session.send(2, b"never read").unwrap();
        session.barrier().unwrap();
        // Once rank 2 is dead (a live rank needs no waiting for), its replacement.
        assert_eq!(session.recv(0).unwrap(), b"rank 2 is dead");
        session.wait_for_rank(2).unwrap();
        match session.barrier() {
            Err(Error::PeerLost { rank: 2, diagnosis }) => {
                assert!(diagnosis[0].contains("was replaced"), "{diagnosis:?}");
            }
            other => panic!("the world's barrier after a rejoin: {other:?}"),
        }
        session.send(2, b"after from 1").unwrap();
        // Not "old to 1", which the dead process sent and nobody took.
        assert_eq!(session.recv(2).unwrap(), b"new to 1");
        assert_eq!(group_sum(&mut session, &[0, 1, 2]), vec![6; 4]);
    });
    let mut zero = log_on(&broker.socket(), 0, Some(job)).unwrap();
    zero.set_timeout(TIMEOUT);
    zero.barrier().unwrap();
    assert_eq!(zero.recv_any().unwrap(), (2, b"old to 0".to_vec()));
    match zero.recv_any() {
        Err(Error::PeerLost { rank: 2, .. }) => {}
        other => panic!("after the victim's message: {other:?}"),
    }
    killed(victim);
    zero.send(1, b"rank 2 is dead").unwrap();
    let newcomer = child(&broker, 2, job, "newcomer");
    match zero.recv_any() {
        Err(Error::PeerRejoined { rank: 2, times: 1 }) => {}
        other => panic!("after the death: {other:?}"),
    }
    assert_eq!(zero.recv_any().unwrap(), (2, b"new to 0".to_vec()));
    zero.send(2, b"after from 0").unwrap();
    assert_eq!(group_sum(&mut zero, &[0, 1, 2]), vec![6; 4]);
    one.join().unwrap();
    let (ok, stdout, stderr) = finish(newcomer);
    assert!(ok && stdout.contains("newcomer done"), "{stdout}{stderr}");
}

/// The broker's refusals, against a live job of two ranks: a rank alive, a rejoin naming no
/// job or another job, a second replacement for one death, and a rank that left.
#[test]
fn the_broker_refuses_what_is_no_rejoin() {
    let broker = Broker::start("rejoin-refusals", 3);
    let job = "refusals";
    let socket = broker.socket();
    let refused = |rank, job| match log_on(&socket, rank, job) {
        Err(Error::Logon(HandshakeError::Rejected { reason, text })) => (reason, text),
        other => panic!("rank {rank} of {job:?}: {other:?}"),
    };
    let victim = child(&broker, 2, job, "die_after_barrier");
    let socket_for_one = socket.clone();
    let one = std::thread::spawn(move || {
        let mut one = log_on(&socket_for_one, 1, Some(job)).unwrap();
        one.barrier().unwrap();
        one
    });
    let mut zero = log_on(&socket, 0, Some(job)).unwrap();
    zero.barrier().unwrap();
    let one = one.join().unwrap();
    killed(victim);
    // Rank 0 sees the death before anyone asks to replace it.
    zero.set_timeout(TIMEOUT);
    assert!(matches!(
        zero.with_timeout(TIMEOUT).recv(2),
        Err(Error::PeerLost { rank: 2, .. })
    ));
    let (reason, text) = refused(1, Some(job));
    assert_eq!(reason, RejectReason::RankTaken, "{text}");
    let (reason, text) = refused(2, None);
    assert_eq!(reason, RejectReason::JobUnnamed, "{text}");
    assert!(text.contains("must name the job"), "{text}");
    let (reason, text) = refused(2, Some("another job"));
    assert_eq!(reason, RejectReason::OtherJob, "{text}");
    let replacement = log_on(&socket, 2, Some(job)).unwrap();
    assert!(replacement.rejoined());
    let (reason, text) = refused(2, Some(job));
    assert_eq!(reason, RejectReason::RankTaken, "{text}");
    assert!(text.contains("replaced the process that died"), "{text}");
    // Rank 1 leaves: nobody takes its place.
    drop(one);
    assert!(matches!(
        zero.with_timeout(TIMEOUT).recv(1),
        Err(Error::PeerLeft { rank: 1, .. })
    ));
    // The broker hears of the goodbye on its own socket, a moment after rank 0 may: until then
    // the rank is still alive to it.
    let started = Instant::now();
    let (reason, text) = loop {
        let (reason, text) = refused(1, Some(job));
        if reason != RejectReason::RankTaken || started.elapsed() > TIMEOUT {
            break (reason, text);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(reason, RejectReason::RankLeft, "{text}");
    drop(replacement);
}

/// A job whose workers named no id has one all the same: the broker made it, `status` shows
/// it, and a replacement that names it (`SHMBROKER_JOB=0x…`) rejoins; one that names none is
/// refused, told the id.
#[test]
fn a_job_that_named_no_id_is_rejoined_by_the_id_the_broker_made() {
    let broker = Broker::start("rejoin-made-id", 3);
    let socket = broker.socket();
    let mut victim = rank_command(&broker, 2, "", "die_after_barrier");
    victim.env_remove("SHMBROKER_JOB");
    let victim = spawn(&mut victim);
    let socket_for_one = socket.clone();
    let one = std::thread::spawn(move || {
        let mut one = log_on(&socket_for_one, 1, None).unwrap();
        one.barrier().unwrap();
        one
    });
    let mut zero = log_on(&socket, 0, None).unwrap();
    zero.barrier().unwrap();
    let mut one = one.join().unwrap();
    killed(victim);
    zero.set_timeout(TIMEOUT);
    assert!(matches!(
        zero.with_timeout(TIMEOUT).recv(2),
        Err(Error::PeerLost { rank: 2, .. })
    ));
    let id = shmbroker::status::query(&socket, TIMEOUT)
        .unwrap()
        .header
        .job_id;
    assert_ne!(id, 0, "the job has no id");
    match log_on(&socket, 2, None) {
        Err(Error::Logon(HandshakeError::Rejected { reason, text })) => {
            assert_eq!(reason, RejectReason::JobUnnamed, "{text}");
            assert!(text.contains(&format!("SHMBROKER_JOB={id:#x}")), "{text}");
        }
        other => panic!("a replacement naming no job: {other:?}"),
    }
    let name = format!("{id:#x}");
    let mut replacement = log_on(&socket, 2, Some(&name)).unwrap();
    assert!(replacement.rejoined());
    // Every rank meets the replacement in one group, and a barrier on it passes.
    let recover = |session: &mut Session| {
        let group = session.regroup(&[0, 1, 2], TIMEOUT).unwrap();
        session.on(&group).barrier().unwrap();
        group.rank()
    };
    let ranks = std::thread::scope(|scope| {
        let two = scope.spawn(|| recover(&mut replacement));
        let one = scope.spawn(|| recover(&mut one));
        [recover(&mut zero), one.join().unwrap(), two.join().unwrap()]
    });
    assert_eq!(ranks, [0, 1, 2]);
}

/// The newcomer dies right after logging on, before rank 0 takes it on: rank 0 hears of the
/// rejoin and then of that death too, and a second replacement rejoins and works.
#[test]
fn a_replacement_that_dies_at_once_is_replaced_again() {
    let broker = Broker::start("rejoin-twice", 2);
    let job = "twice";
    let socket = broker.socket();
    let first = child(&broker, 1, job, "die_after_barrier");
    let mut zero = log_on(&socket, 0, Some(job)).unwrap();
    zero.set_timeout(TIMEOUT);
    zero.barrier().unwrap();
    killed(first);
    let second = child(&broker, 1, job, "die_at_once");
    killed(second);
    let third = hello(&broker, 1, job, "0,1", false);
    // Whatever rank 0 saw of the second process (it may have adopted it before it died, or
    // the third's notices may have replaced it unadopted), it ends with the third.
    let mut seen = Vec::new();
    let started = Instant::now();
    let hello = loop {
        match zero.recv_any() {
            Ok(message) => break message,
            // With every peer gone, each call says so until a replacement rejoins.
            Err(Error::PeerLost { rank: 1, .. }) => {
                if seen.last() != Some(&"lost") {
                    seen.push("lost");
                }
                assert!(started.elapsed() < TIMEOUT, "no replacement came: {seen:?}");
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(Error::PeerRejoined { rank: 1, times }) => {
                seen.push(if times == 2 { "rejoined 2" } else { "rejoined" })
            }
            Err(other) => panic!("{other} after {seen:?}"),
        }
    };
    assert_eq!(hello, (1, b"hello".to_vec()), "{seen:?}");
    assert_eq!(seen.first(), Some(&"lost"), "{seen:?}");
    assert_eq!(seen.last(), Some(&"rejoined 2"), "{seen:?}");
    assert_eq!(group_sum(&mut zero, &[0, 1]), vec![3; 4]);
    let (ok, stdout, stderr) = finish(third);
    assert!(ok, "{stdout}{stderr}");
}

/// Rank 2 dies, and rank 1, a survivor, is killed once rank 2's replacement has logged on (the
/// broker has sent rank 1 the rejoin's notices, which it never takes on): rank 0 and the
/// newcomer carry on as a group of two, and neither waits for rank 1.
#[test]
fn a_survivor_that_dies_during_a_rejoin_holds_nobody_up() {
    let broker = Broker::start("rejoin-survivor-dies", 3);
    let job = "survivor-dies";
    let socket = broker.socket();
    let victim = child(&broker, 2, job, "die_after_barrier");
    let mut doomed = child(&broker, 1, job, "linger");
    let mut zero = log_on(&socket, 0, Some(job)).unwrap();
    zero.set_timeout(TIMEOUT);
    zero.barrier().unwrap();
    // The three logons so far, then the newcomer's.
    broker.await_logons(3);
    killed(victim);
    let newcomer = hello(&broker, 2, job, "0,2", false);
    broker.await_logons(1);
    doomed.kill();
    zero.wait_for_rank(2).unwrap();
    assert_eq!(zero.recv(2).unwrap(), b"hello");
    assert_eq!(group_sum(&mut zero, &[0, 2]), vec![4; 4]);
    let (ok, stdout, stderr) = finish(newcomer);
    assert!(ok, "{stdout}{stderr}");
    // Rank 1 is gone for good: nobody replaces it, so waiting for it times out.
    assert!(matches!(
        zero.with_timeout(Duration::from_millis(200))
            .wait_for_rank(1),
        Err(Error::Timeout { .. })
    ));
}

/// Kill, rejoin, whole-world group all-reduce, many times over (`SHMBROKER_REJOIN_TRIALS`,
/// 100 by default, the target): every result right, nothing hangs (every wait
/// has a deadline), and the survivor that is a process of its own (rank 1) holds as many fds
/// after the last trial as after the first.
#[test]
fn kill_rejoin_all_reduce_trials() {
    let trials: u32 = std::env::var("SHMBROKER_REJOIN_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let broker = Broker::start("rejoin-trials", 3);
    let job = "trials";
    let socket = broker.socket();
    let one = child(&broker, 1, job, "steady");
    let fds_of_one = || {
        std::fs::read_dir(format!("/proc/{}/fd", one.id()))
            .unwrap()
            .count()
    };
    let mut zero = log_on(&socket, 0, Some(job)).unwrap();
    zero.set_timeout(TIMEOUT);
    let first = child(&broker, 2, job, "die_after_barrier");
    zero.barrier().unwrap();
    killed(first);
    let mut fds_after_first = None;
    let started = Instant::now();
    for trial in 0..trials {
        let replacement = hello(&broker, 2, job, "0,1,2", true);
        zero.wait_for_rank(2).unwrap();
        assert_eq!(zero.recv(2).unwrap(), b"hello", "trial {trial}");
        zero.send(1, b"go").unwrap();
        let mut data = vec![1u32; 4];
        let group = zero.group(&[0, 1, 2]).unwrap();
        zero.on(&group)
            .all_reduce(&mut data, ReduceOp::Sum)
            .unwrap();
        assert_eq!(data, vec![6; 4], "trial {trial}");
        match zero.recv(1) {
            Ok(done) => assert_eq!(done, b"done", "trial {trial}"),
            Err(error) => {
                let (_, stdout, stderr) = finish(one);
                panic!("trial {trial}: rank 1 is gone ({error}): {stdout}{stderr}");
            }
        }
        killed(replacement);
        let fds = fds_of_one();
        let first = *fds_after_first.get_or_insert(fds);
        assert!(
            fds <= first + 2,
            "trial {trial}: rank 1 holds {fds} fds, {first} after the first trial"
        );
    }
    let fds_of_one_at_end = fds_of_one();
    zero.send(1, b"stop").unwrap();
    let (ok, stdout, stderr) = finish(one);
    assert!(ok, "{stdout}{stderr}");
    eprintln!(
        "{trials} trials of kill, rejoin and all-reduce in {:.2?}; rank 1 held {} fds after \
         the first and {} after the last",
        started.elapsed(),
        fds_after_first.unwrap_or(0),
        fds_of_one_at_end,
    );
}

/// An event loop's reader: it sleeps in `poll(2)` on the readiness fd and takes what is there
/// with `try_recv_any`, while its other peer (rank 1) is alive and silent. The death, then the
/// replacement, then the replacement's message each wake it: nothing waits for another peer to
/// speak first.
#[test]
fn an_event_loop_hears_the_death_then_the_rejoin_then_the_newcomer() {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let broker = Broker::start("rejoin-event-loop", 3);
    let job = "event-loop";
    let socket = broker.socket();
    let victim = child(&broker, 2, job, "die_after_barrier");
    let mut quiet = child(&broker, 1, job, "linger");
    let mut zero = log_on(&socket, 0, Some(job)).unwrap();
    zero.set_timeout(TIMEOUT);
    zero.barrier().unwrap();
    killed(victim);
    let newcomer = hello(&broker, 2, job, "0,2", false);
    let started = Instant::now();
    let mut seen = Vec::new();
    let message = 'wait: loop {
        assert!(started.elapsed() < TIMEOUT, "still waiting after {seen:?}");
        loop {
            match zero.try_recv_any() {
                Ok(Some(message)) => break 'wait message,
                Ok(None) => break,
                Err(Error::PeerLost { rank: 2, .. }) => seen.push("lost"),
                Err(Error::PeerRejoined { rank: 2, times: 1 }) => seen.push("rejoined"),
                Err(other) => panic!("{other} after {seen:?}"),
            }
        }
        let mut fds = [PollFd::new(zero.readiness_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::from(1000u16)).unwrap();
    };
    assert_eq!(seen, ["lost", "rejoined"]);
    assert_eq!(message, (2, b"hello".to_vec()));
    assert_eq!(group_sum(&mut zero, &[0, 2]), vec![4; 4]);
    let (ok, stdout, stderr) = finish(newcomer);
    assert!(ok, "{stdout}{stderr}");
    quiet.kill();
}

/// Rank 2 has not logged on yet when rank 1 dies (a slow starter beside an early crash, as
/// `run --restart` meets it): it comes late all the same, naming the job, and rank 0 takes it on
/// as a replacement (`PeerRejoined` with `times` 0), hears from it and sums with it.
#[test]
fn a_rank_that_comes_after_a_death_is_taken_on_late() {
    let broker = Broker::start("rejoin-late", 3);
    let job = "late";
    let socket = broker.socket();
    let mut zero = log_on(&socket, 0, Some(job)).unwrap();
    zero.set_timeout(TIMEOUT);
    let early = child(&broker, 1, job, "die_at_once");
    killed(early);
    let late = child(&broker, 2, job, "late");
    let started = Instant::now();
    let mut seen = Vec::new();
    let message = loop {
        assert!(started.elapsed() < TIMEOUT, "still waiting after {seen:?}");
        match zero.recv_any() {
            Ok(message) => break message,
            // With every peer gone, each call says so until one comes.
            Err(Error::PeerLost { rank: 1, .. }) => {
                if seen.last() != Some(&"lost") {
                    seen.push("lost");
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(Error::PeerRejoined { rank: 2, times: 0 }) => seen.push("came late"),
            Err(other) => panic!("{other} after {seen:?}"),
        }
    };
    assert_eq!(seen, ["lost", "came late"]);
    assert_eq!(message, (2, b"late".to_vec()));
    assert_eq!(group_sum(&mut zero, &[0, 2]), vec![4; 4]);
    let (ok, stdout, stderr) = finish(late);
    assert!(ok, "{stdout}{stderr}");
}
