//! Who is there, with real processes: a broker that dies, peers that flood another with relayed
//! fds or the broker with idle connections, and limits that used to be reached by accident.

mod common;

use common::{
    CHILD_DEADLINE, TempDir, finish, hostile, listen_on_thread, read_line_within, serve, shmbroker,
    small_world, spawn,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use shmbroker::Collectives;
use shmbroker::bindings::LogonFrame;
use shmbroker::handshake::{Config, MAX_UNCLAIMED_RELAYS};
use shmbroker::session::{Error, Session};
use shmbroker_test_support::process::ChildGuard;
use std::path::Path;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);

fn serve_world(socket: &Path, workers: u32) -> ChildGuard {
    serve(socket, &["--workers", &workers.to_string()])
}

/// Ranks `ranks` of a world, logged on from threads of this process.
fn sessions(socket: &Path, ranks: &[u32]) -> Vec<Session> {
    let joins: Vec<_> = ranks
        .iter()
        .map(|&rank| {
            let socket = socket.to_path_buf();
            std::thread::spawn(move || {
                let mut session =
                    Session::connect_with_outbox(&socket, Some(rank), TIMEOUT, 1 << 20).unwrap();
                session.set_timeout(TIMEOUT);
                session
            })
        })
        .collect();
    joins.into_iter().map(|j| j.join().unwrap()).collect()
}

#[test]
fn with_the_broker_dead_peers_still_talk_what_needs_it_fails_and_a_later_death_is_still_seen() {
    let dir = TempDir::new("broker-death").unwrap();
    let socket = dir.join("broker.sock");
    let mut broker = serve_world(&socket, 4);
    // Ranks 0 and 1 here, rank 2 a real process that logs on and idles; rank 3 never comes.
    let mut rank2 = spawn(&mut hostile(&[
        "relay-flood",
        "--socket",
        socket.to_str().unwrap(),
        "--rank",
        "2",
        "--count",
        "0",
    ]));
    let mut sessions = sessions(&socket, &[0, 1]).into_iter();
    let (mut zero, mut one) = (sessions.next().unwrap(), sessions.next().unwrap());
    // Rank 2 is logged on once it says so (it "relays" none).
    let said = read_line_within(rank2.take_stdout().unwrap(), CHILD_DEADLINE);
    assert!(said.starts_with("delivered 0"), "{said}");
    // A pipelined message (larger than a ring slot holds, within the 1 MiB outbox) each way
    // first: each then has the other's outbox, and needs nothing more from
    // the broker for large messages.
    let big = vec![7u8; 256 << 10];
    zero.send(1, &big).unwrap();
    assert_eq!(one.recv(0).unwrap(), big);
    one.send(0, &big).unwrap();
    assert_eq!(zero.recv(1).unwrap(), big);
    broker.kill();
    let until = Instant::now() + TIMEOUT;
    while !zero.raw().broker_lost() {
        assert!(Instant::now() < until, "rank 0 never saw the broker go");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Peers that logged on still reach each other, small messages and large.
    zero.send(1, b"still here").unwrap();
    assert_eq!(one.recv(0).unwrap(), b"still here");
    one.send(0, &big).unwrap();
    assert_eq!(zero.recv(1).unwrap(), big);
    // Rank 3 can never log on now: waiting for it is BrokerLost, not a timeout.
    match zero.recv(3) {
        Err(Error::BrokerLost) => {}
        other => panic!("expected BrokerLost, got {other:?}"),
    }
    // Relaying an fd needs the broker.
    let file = shmbroker::queues::memfd::create_sealed(c"relay", 4096).unwrap();
    match zero
        .raw()
        .relay_fd(1, 7, std::os::fd::AsFd::as_fd(&file), TIMEOUT)
    {
        Err(shmbroker::handshake::Error::BrokerLost { .. }) => {}
        other => panic!("expected BrokerLost, got {other:?}"),
    }
    // A death after the broker's is still seen, by every survivor, naming the right rank.
    kill(Pid::from_raw(rank2.id() as i32), Signal::SIGKILL).unwrap();
    let waiter = std::thread::spawn(move || one.with_timeout(TIMEOUT).recv(2));
    match waiter.join().unwrap() {
        Err(Error::PeerLost { rank: 2, .. }) => {}
        other => panic!("expected rank 2 lost, got {other:?}"),
    }
    assert_eq!(zero.raw().lost_rank(), Some(2));
    rank2.kill();
}

#[test]
fn a_peer_relaying_fds_nobody_takes_is_refused_past_the_cap_and_told_who_refused() {
    let dir = TempDir::new("relay-flood").unwrap();
    let socket = dir.join("broker.sock");
    let (stop, broker) = listen_on_thread(&socket, small_world(2));
    let victim = shmbroker::handshake::connect(&socket, LogonFrame::new(0), TIMEOUT).unwrap();
    let count = 4 * MAX_UNCLAIMED_RELAYS;
    let mut attacker = spawn(&mut hostile(&[
        "relay-flood",
        "--socket",
        socket.to_str().unwrap(),
        "--to",
        "0",
        "--count",
        &count.to_string(),
    ]));
    let report = read_line_within(attacker.take_stdout().unwrap(), CHILD_DEADLINE);
    let refused = count - MAX_UNCLAIMED_RELAYS;
    assert!(
        report.starts_with(&format!(
            "delivered {MAX_UNCLAIMED_RELAYS} refused {refused}:"
        )),
        "{report}"
    );
    assert!(
        report.contains("refused to relay an fd to rank 0"),
        "{report}"
    );
    // The victim ends up holding exactly the cap: every relay was answered before the attacker
    // reported, so no more are on their way (the relayed memfd is counted by name: other tests
    // of this binary open fds of their own meanwhile).
    let flood_fds = || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter(|target| target.to_string_lossy().contains("shmbroker-flood"))
            .count()
    };
    // The broker runs on a thread of this process too: while it hands a relayed fd over, its copy
    // and the victim's are both open for a moment. So the count is read until it settles.
    let until = Instant::now() + TIMEOUT;
    let mut held = flood_fds();
    while held != MAX_UNCLAIMED_RELAYS && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
        held = flood_fds();
    }
    assert_eq!(held, MAX_UNCLAIMED_RELAYS);
    attacker.kill();
    drop(victim);
    stop.stop();
    broker.join().unwrap().unwrap();
}

#[test]
fn hundreds_of_idle_or_half_sent_connections_do_not_lock_a_real_logon_out() {
    let dir = TempDir::new("idle").unwrap();
    let socket = dir.join("broker.sock");
    let config = Config {
        // Idle connections are never dropped for their deadline during this test: only making
        // room for a newcomer can let it in.
        logon_timeout: Duration::from_secs(3600),
        ..small_world(1)
    };
    let (stop, broker) = listen_on_thread(&socket, config);
    // Half send nothing; half send one byte of their 32 and sit on it: neither kind may hold a
    // place a real logon needs.
    let idle: Vec<_> = (0..300)
        .map(|i| {
            let mut stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
            if i % 2 == 1 {
                std::io::Write::write_all(&mut stream, &[0x53]).unwrap();
            }
            stream
        })
        .collect();
    let session = shmbroker::handshake::connect(&socket, LogonFrame::new(0), TIMEOUT);
    assert!(session.is_ok(), "{session:?}");
    drop(idle);
    stop.stop();
    broker.join().unwrap().unwrap();
}

#[test]
fn rank_u32_max_is_refused_rather_than_taken_to_mean_any() {
    let dir = TempDir::new("rank-max").unwrap();
    let socket = dir.join("broker.sock");
    let broker = serve_world(&socket, 2);
    let (ok, _, stderr) = finish(spawn(&mut shmbroker(&[
        "worker",
        "--socket",
        socket.to_str().unwrap(),
        "--rank",
        "4294967295",
    ])));
    assert!(!ok);
    assert!(stderr.contains("pass no rank"), "{stderr}");
    drop(broker);
}

/// `world` worker processes running `worker --selftest` with `args` under one `serve`, each of
/// which must pass.
fn selftest_processes(world: u32, args: &[&str]) {
    let dir = TempDir::new(&format!("selftest-{world}")).unwrap();
    let socket = dir.join("broker.sock");
    let broker = serve_world(&socket, world);
    let workers: Vec<ChildGuard> = (0..world)
        .map(|_| {
            let mut command = shmbroker(&["worker", "--socket", socket.to_str().unwrap()]);
            command
                .args(["--selftest", "--timeout-ms", "60000"])
                .args(args);
            spawn(&mut command)
        })
        .collect();
    for worker in workers {
        let (ok, stdout, stderr) = finish(worker);
        assert!(ok, "{stdout}{stderr}");
    }
    drop(broker);
}

#[test]
fn the_selftest_passes_with_forty_four_ranks() {
    selftest_processes(44, &["--only", "all_gather"]);
}

#[test]
fn every_collective_checks_out_with_sixty_four_worker_processes() {
    // Past 8 ranks the barrier disseminates, all_gather_into gathers by Bruck's algorithm and
    // broadcasts go down a tree; on 2 CPUs 64 ranks also wait crowded (they yield). The selftest
    // checks every byte, from every root.
    let config = Config {
        world_size: 64,
        ..Config::default()
    };
    let hard = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(0, |(_, hard)| hard);
    if hard < config.fds_needed() {
        println!(
            "skipping: a broker for 64 workers needs {} fds, the hard limit is {hard}",
            config.fds_needed()
        );
        return;
    }
    selftest_processes(64, &["--repeat", "3"]);
}

#[test]
fn a_worker_on_an_inherited_socket_is_seen_dying_though_the_process_that_connected_lives_on() {
    let dir = TempDir::new("inherited").unwrap();
    let socket = dir.join("broker.sock");
    let (stop, broker) = listen_on_thread(&socket, small_world(3));
    // This test process plays the launcher: it connects, hands the socket to the worker at fd 3
    // and closes its own copy. The broker's pidfd for that connection names this process, which
    // outlives the worker.
    let stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let mut command = shmbroker(&[
        "worker",
        "--inherited-socket",
        "--rank",
        "0",
        "--selftest",
        "--only",
        "barrier",
        "--repeat",
        "1000000000",
        "--timeout-ms",
        "60000",
    ]);
    let mut zero = shmbroker_test_support::process::spawn_with_fds(
        &mut command,
        &[std::os::fd::AsFd::as_fd(&stream)],
    )
    .unwrap();
    drop(stream);
    let others = sessions(&socket, &[1, 2]);
    let waits: Vec<_> = others
        .into_iter()
        .map(|mut session| {
            std::thread::spawn(move || {
                loop {
                    if let Err(error) = session.barrier() {
                        return error;
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    kill(Pid::from_raw(zero.id() as i32), Signal::SIGKILL).unwrap();
    for wait in waits {
        match wait.join().unwrap() {
            Error::PeerLost { rank: 0, .. } => {}
            other => panic!("expected rank 0 lost, got {other:?}"),
        }
    }
    zero.kill();
    stop.stop();
    broker.join().unwrap().unwrap();
}

#[test]
fn a_worker_of_a_job_that_already_ended_or_of_another_job_is_refused_at_once() {
    use shmbroker::handshake::Event;
    let dir = TempDir::new("job-ended").unwrap();
    let socket = dir.join("broker.sock");
    let mut listener = shmbroker::handshake::Listener::bind(&socket, small_world(2)).unwrap();
    let stop = listener.stop_handle();
    let (events_tx, events) = std::sync::mpsc::channel();
    let broker = std::thread::spawn(move || {
        listener.serve(|event| {
            let _ = events_tx.send(event.clone());
        })
    });
    let worker = |rank: &str, job: &str| {
        let mut command = shmbroker(&[
            "worker",
            "--socket",
            socket.to_str().unwrap(),
            "--rank",
            rank,
            "--timeout-ms",
            "60000",
        ]);
        command.env("SHMBROKER_JOB", job);
        spawn(&mut command)
    };
    // Rank 0 of job "a" logs on and dies before rank 1 comes: the job ends with it.
    let mut zero = worker("0", "a");
    let wait_for = |wanted: &dyn Fn(&Event) -> bool| loop {
        if wanted(
            &events
                .recv_timeout(TIMEOUT)
                .expect("no event from the broker"),
        ) {
            break;
        }
    };
    wait_for(&|e| matches!(e, Event::LoggedOn { rank: 0, .. }));
    zero.kill();
    wait_for(&|e| matches!(e, Event::JobEnded { .. }));
    // Its rank 1 would otherwise start a new job and wait a minute for a rank 0 that is gone.
    let (ok, _, stderr) = finish(worker("1", "a"));
    assert!(!ok);
    assert!(stderr.contains("SessionLost"), "{stderr}");
    assert!(stderr.contains("already ended (rank 0 died)"), "{stderr}");
    // Another job's worker is welcome.
    let mut other = worker("1", "b");
    wait_for(&|e| matches!(e, Event::LoggedOn { rank: 1, .. }));
    // While job "b" runs, a worker of job "c" is refused at once rather than taken as its rank
    // 0, which "b" is waiting for.
    let (ok, _, stderr) = finish(worker("0", "c"));
    assert!(!ok);
    assert!(stderr.contains("OtherJob"), "{stderr}");
    assert!(stderr.contains("this worker is of job"), "{stderr}");
    // Its own rank 0 still gets in.
    let mut own = worker("0", "b");
    wait_for(&|e| matches!(e, Event::LoggedOn { rank: 0, .. }));
    other.kill();
    own.kill();
    stop.stop();
    broker.join().unwrap().unwrap();
}
