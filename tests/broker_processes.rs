//! The broker and its workers as real processes: `shmbroker serve` and `shmbroker worker`.
//! Every child is waited for with a deadline and killed on the way out.

mod common;

use common::{TempDir, finish, listen_on_thread, serve, shmbroker, small_world};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use shmbroker_test_support::process::{ChildGuard, spawn_with_fds};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

#[test]
fn four_worker_processes_log_on_and_greet_each_other_then_the_broker_stops_cleanly() {
    let dir = TempDir::new("serve4").unwrap();
    let socket = dir.join("broker.sock");
    let broker = serve(&socket, &["--workers", "4", "--ring-capacity", "64"]);
    let workers: Vec<ChildGuard> = (0..4)
        .map(|_| {
            let mut command = shmbroker(&["worker", "--socket", socket.to_str().unwrap()]);
            spawn_with_fds(&mut command, &[]).unwrap()
        })
        .collect();
    let mut ranks = Vec::new();
    for worker in workers {
        let (ok, stdout, stderr) = finish(worker);
        assert!(ok, "worker failed: {stdout}{stderr}");
        assert!(
            stdout.contains("exchanged a message with each of 3 peers"),
            "{stdout}"
        );
        let rank: u32 = stdout
            .split("] rank ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|rank| rank.parse().ok())
            .unwrap_or_else(|| panic!("no rank in {stdout}"));
        ranks.push(rank);
    }
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1, 2, 3]);

    kill(Pid::from_raw(broker.id() as i32), Signal::SIGTERM).unwrap();
    let (ok, stdout, stderr) = finish(broker);
    assert!(ok, "broker failed: {stdout}{stderr}");
    // Its log (standard error) has a structured line per logon and per departure.
    assert!(stderr.contains("logged on rank=3"), "{stderr}");
    assert!(stderr.contains("job ended job=0 workers=4"), "{stderr}");
    assert!(stderr.contains("socket removed"), "{stderr}");
    assert!(!socket.exists(), "the socket file outlived the broker");
}

#[test]
fn a_worker_with_a_rank_out_of_range_exits_with_the_brokers_reason() {
    let dir = TempDir::new("range").unwrap();
    let socket = dir.join("broker.sock");
    let broker = serve(&socket, &["--workers", "2"]);
    let mut command = shmbroker(&[
        "worker",
        "--socket",
        socket.to_str().unwrap(),
        "--rank",
        "5",
    ]);
    let (ok, _, stderr) = finish(spawn_with_fds(&mut command, &[]).unwrap());
    assert!(!ok);
    assert!(stderr.contains("RankOutOfRange"), "{stderr}");
    assert!(
        stderr.contains("rank 5 requested; the world has ranks 0 to 1"),
        "{stderr}"
    );
    drop(broker);
}

#[test]
fn a_worker_killed_with_sigkill_disconnects_its_peers_at_once() {
    use shmbroker::bindings::LogonFrame;
    use shmbroker::handshake::{Config, Event, Listener, connect};
    use shmbroker::queues::{RecvTimeoutError, SendTimeoutError};

    let dir = TempDir::new("sigkill").unwrap();
    let socket = dir.join("broker.sock");
    let mut listener = Listener::bind(
        &socket,
        Config {
            world_size: 2,
            ring_capacity: 64,
            ..Config::default()
        },
    )
    .unwrap();
    let stop = listener.stop_handle();
    let (events_tx, events) = std::sync::mpsc::channel();
    let broker = std::thread::spawn(move || {
        listener.serve(|event| {
            let _ = events_tx.send(event.clone());
        })
    });

    // Rank 1, a real process: it greets rank 0, then waits a minute for rank 0's greeting.
    let mut command = shmbroker(&[
        "worker",
        "--socket",
        socket.to_str().unwrap(),
        "--rank",
        "1",
        "--timeout-ms",
        "60000",
    ]);
    let mut child = spawn_with_fds(&mut command, &[]).unwrap();
    let mut session = connect(&socket, LogonFrame::new(0), DEADLINE).unwrap();
    let link = session.link(1).unwrap();
    let greeting = link.from.recv_timeout(DEADLINE).unwrap();
    assert_eq!(greeting.tag, 1);

    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    // Blocked on the dead peer with a long deadline: this worker's own watcher sees the peer's
    // pidfd and closes the rings, which wakes us with `Disconnected` (the deadline would have said
    // `Timeout`); the ring names the lost rank, and so does the session.
    assert_eq!(
        link.from.recv_timeout(Duration::from_secs(20)),
        Err(RecvTimeoutError::Disconnected)
    );
    assert_eq!(link.from.close_cause(), Some(1));
    let sent = link.to.send_timeout(greeting, Duration::from_secs(20));
    assert!(
        matches!(sent, Err(SendTimeoutError::Disconnected(_))),
        "{sent:?}"
    );
    assert_eq!(
        session.departure(1),
        Some(shmbroker::handshake::Departure::Lost { rank: 1 })
    );
    // The broker saw it too, from its own records.
    let left = loop {
        let event = events
            .recv_timeout(DEADLINE)
            .expect("the broker never reported the death");
        if matches!(event, Event::WorkerLeft { .. }) {
            break event;
        }
    };
    assert!(
        matches!(
            left,
            Event::WorkerLeft {
                rank: 1,
                clean: false,
                ..
            }
        ),
        "{left:?}"
    );

    child.kill();
    stop.stop();
    broker.join().unwrap().unwrap();
}

#[test]
fn a_death_closes_the_dead_ranks_rings_and_interrupts_waits_on_live_peers() {
    use shmbroker::bindings::{LogonFrame, Message, RejectReason};
    use shmbroker::handshake::{Departure, Error, connect};
    use shmbroker::queues::RecvTimeoutError;

    let dir = TempDir::new("poison").unwrap();
    let socket = dir.join("broker.sock");
    let (stop, broker) = listen_on_thread(&socket, small_world(3));

    // Rank 2 is a real process that will be killed; ranks 0 and 1 live here.
    let mut command = shmbroker(&[
        "worker",
        "--socket",
        socket.to_str().unwrap(),
        "--rank",
        "2",
        "--timeout-ms",
        "60000",
    ]);
    let mut child = spawn_with_fds(&mut command, &[]).unwrap();
    let one_path = socket.clone();
    let one = std::thread::spawn(move || connect(&one_path, LogonFrame::new(1), DEADLINE));
    let mut zero = connect(&socket, LogonFrame::new(0), DEADLINE).unwrap();
    let mut one = one.join().unwrap().unwrap();
    // Rank 2 has greeted rank 0; it is now waiting for greetings that never come.
    assert_eq!(
        zero.link(2)
            .unwrap()
            .from
            .recv_timeout(DEADLINE)
            .unwrap()
            .tag,
        2
    );

    // Rank 0 waits on rank 1, which is alive but silent, when rank 2 dies: an interruptible wait
    // (a collective's) ends, and the ring from rank 1 stays open.
    let seen = zero.interrupt_generation();
    assert_eq!(zero.recorded_lost_rank(), None);
    let waiter = std::thread::spawn(move || {
        let mut one_slot = [<Message as bytemuck::Zeroable>::zeroed()];
        let result = zero.link(1).unwrap().from.recv_batch_interruptible(
            &mut one_slot,
            Duration::from_secs(30),
            seen,
        );
        (result, zero)
    });
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    let (result, mut zero) = waiter.join().unwrap();
    assert_eq!(result, Err(RecvTimeoutError::Interrupted));
    assert_eq!(zero.recorded_lost_rank(), Some(2));
    assert_eq!(zero.departure(2), Some(Departure::Lost { rank: 2 }));
    assert_eq!(zero.departure(1), None, "rank 1 is still there");
    assert_eq!(zero.link(1).unwrap().from.close_cause(), None);

    // The rings with the dead rank are closed, naming it; those between the survivors carry on.
    assert_eq!(
        zero.link(2)
            .unwrap()
            .from
            .recv_timeout(Duration::from_secs(5)),
        Err(RecvTimeoutError::Disconnected)
    );
    assert_eq!(zero.link(2).unwrap().from.close_cause(), Some(2));
    let mut hello = <Message as bytemuck::Zeroable>::zeroed();
    hello.tag = 41;
    one.link(0).unwrap().to.try_send(hello).unwrap();
    assert_eq!(
        zero.link(1)
            .unwrap()
            .from
            .recv_timeout(Duration::from_secs(5))
            .unwrap()
            .tag,
        41
    );

    // Nobody new gets in: a replacement of rank 2 must name the job it rejoins (this one has
    // no id), and nobody else may come.
    match connect(&socket, LogonFrame::new(2), DEADLINE) {
        Err(Error::Rejected {
            reason: RejectReason::JobUnnamed,
            text,
        }) => assert!(text.contains("rank 2 died"), "{text}"),
        other => panic!("unexpected {other:?}"),
    }
    drop((zero, one));
    child.kill();
    stop.stop();
    broker.join().unwrap().unwrap();
}
