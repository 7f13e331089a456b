//! Receives that wait: a message too long for the buffer, a receive asleep beside collectives, a
//! rank that leaves after a timeout, and interrupts that end waits (one between the chunks of a
//! large receive and of a large send, against a second process that this test binary becomes).

use shmbroker::Collectives;
use shmbroker::session::{Error, Session};
use std::time::{Duration, Instant};

mod common;

use common::World;

#[test]
fn a_message_too_long_for_the_buffer_is_kept_whole_for_the_next_receive() {
    // One slot and eager with continuation slots (both straight from the ring), and pipelined
    // chunks: each refused by a short buffer, twice, then received whole; `probe` sizes it
    // first.
    let (_world, mut sessions) = World::start("too-long", 2);
    let mut b = sessions.pop().unwrap();
    let mut a = sessions.pop().unwrap();
    // In rings of 64 slots: one slot, eager with continuation slots (at most 2,032 bytes there),
    // pipelined.
    let sizes = [40usize, 1000, 3000, 1 << 20];
    for (n, &size) in sizes.iter().enumerate() {
        let message: Vec<u8> = (0..size).map(|i| (i * 7 + n) as u8).collect();
        b.send(0, &message).unwrap();
        b.send(0, b"after").unwrap();
        let mut short = [0u8; 16];
        for _ in 0..2 {
            match a.recv_into(1, &mut short) {
                Err(Error::BufferTooSmall {
                    peer: 1,
                    needed,
                    capacity: 16,
                }) => assert_eq!(needed, size as u64),
                other => panic!("{size} bytes into 16: {other:?}"),
            }
        }
        assert_eq!(a.probe(1).unwrap(), size);
        let mut whole = vec![0u8; size];
        assert_eq!(a.recv_into(1, &mut whole).unwrap(), size);
        assert_eq!(
            whole, message,
            "{size} bytes arrive intact after the refusals"
        );
        assert_eq!(a.recv(1).unwrap(), b"after");
    }
    // recv_any_into keeps it too, naming the sender.
    b.send(0, &[9u8; 100]).unwrap();
    let mut short = [0u8; 10];
    assert!(matches!(
        a.recv_any_into(&mut short),
        Err(Error::BufferTooSmall {
            peer: 1,
            needed: 100,
            ..
        })
    ));
    assert_eq!(a.recv(1).unwrap(), vec![9u8; 100]);
}

#[test]
fn a_receive_asleep_on_one_thread_goes_on_while_another_runs_collectives() {
    // The receiver sleeps on the readiness eventfd; the other thread's barriers wait on rings
    // (taking the registrations back). Messages sent meanwhile must wake the receiver, not
    // leave it to its deadline.
    let (_world, mut sessions) = World::start("lend", 2);
    let mut b = sessions.pop().unwrap();
    let a = sessions.pop().unwrap();
    let (sender, receiver) = a.split();
    let rounds = 50;
    let peer = std::thread::spawn(move || {
        for round in 0..rounds {
            std::thread::sleep(Duration::from_millis(2));
            b.barrier().unwrap();
            b.send(0, &[round as u8; 8]).unwrap();
        }
        b
    });
    let reader = std::thread::spawn(move || {
        let started = Instant::now();
        for round in 0..rounds {
            let got = receiver
                .with_timeout(Duration::from_secs(20))
                .recv(1)
                .unwrap();
            assert_eq!(got, vec![round as u8; 8]);
        }
        (receiver, started.elapsed())
    });
    for _ in 0..rounds {
        sender.session().barrier().unwrap();
    }
    let (receiver, took) = reader.join().unwrap();
    peer.join().unwrap();
    // 50 rounds of 2 ms: a lost wake-up would cost a whole 20 s deadline.
    assert!(took < Duration::from_secs(15), "took {took:?}");
    sender.rejoin(receiver).unwrap();
}

#[test]
fn a_rank_that_leaves_after_a_timeout_is_named_with_whom_it_gave_up_on() {
    use shmbroker::session::LeftAfter;
    // Rank 1 gives up on rank 2 (which never sends) and leaves: rank 0, waiting on rank 1,
    // learns that it left, and why. A rank that leaves with no timeout behind it says nothing.
    let (_world, mut sessions) = World::start("left-after", 3);
    let quiet = sessions.pop().unwrap();
    let mut giver_up = sessions.pop().unwrap();
    let mut waiter = sessions.pop().unwrap();
    let error = giver_up
        .with_timeout(Duration::from_millis(50))
        .recv(2)
        .unwrap_err();
    assert!(matches!(&error, Error::Timeout { waiting_for, .. } if waiting_for == &[2]));
    drop(giver_up);
    let error = waiter.recv(1).unwrap_err();
    assert!(
        matches!(
            error,
            Error::PeerLeft {
                rank: 1,
                after: Some(LeftAfter::TimedOut(2)),
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "peer rank 1 left the session after timing out waiting for rank 2"
    );
    drop(quiet);
    let error = waiter.recv(2).unwrap_err();
    assert!(
        matches!(
            error,
            Error::PeerLeft {
                rank: 2,
                after: None,
                ..
            }
        ),
        "{error:?}"
    );
}

#[test]
fn one_interrupt_ends_every_wait_in_progress_and_nothing_more() {
    // A split session's receiver waits for a message and its sender half runs a barrier that
    // the other ranks never join: one interrupt ends both (before, the first to look took it and
    // the other waited out its deadline). The next call is not interrupted.
    let (_world, mut sessions) = World::start("interrupt-all", 3);
    let mut quiet = sessions.pop().unwrap();
    let mut peer = sessions.pop().unwrap();
    let session = sessions.pop().unwrap();
    let interrupter = session.interrupter();
    let (sender, receiver) = session.split();
    let sender = std::sync::Arc::new(sender);
    let receiving = std::thread::spawn(move || {
        let result = receiver.with_timeout(Duration::from_secs(30)).recv(1);
        (result, receiver)
    });
    let barrier = {
        let sender = std::sync::Arc::clone(&sender);
        std::thread::spawn(move || {
            sender
                .session()
                .with_timeout(Duration::from_secs(30))
                .barrier()
        })
    };
    std::thread::sleep(Duration::from_millis(200)); // both are waiting
    let started = Instant::now();
    interrupter.interrupt();
    let (received, receiver) = receiving.join().unwrap();
    let barred = barrier.join().unwrap();
    assert!(matches!(received, Err(Error::Interrupted)), "{received:?}");
    assert!(matches!(barred, Err(Error::Interrupted)), "{barred:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // Nothing is left over: the next receive gets what rank 1 sends.
    peer.send(0, b"after").unwrap();
    assert_eq!(
        receiver
            .with_timeout(Duration::from_secs(10))
            .recv(1)
            .unwrap(),
        b"after"
    );
    drop((receiver, sender));
    // The barrier cut short leaves the other ranks to find rank 0 gone.
    assert!(
        quiet
            .with_timeout(Duration::from_secs(10))
            .barrier()
            .is_err()
    );
}

/// Bytes of the large message of the interrupt tests: far more than either side can copy in the
/// 20 ms before its peer is stopped.
const LARGE: usize = 512 << 20;

/// The large message: each 4 KiB page holds its number, then that number's low byte.
fn large() -> Vec<u8> {
    let mut bytes = vec![0u8; LARGE];
    for (page, bytes) in bytes.chunks_mut(4096).enumerate() {
        bytes.fill(page as u8);
        bytes[..8].copy_from_slice(&(page as u64).to_le_bytes());
    }
    bytes
}

/// Rank 1 of an interrupt test: this test binary again, as its own process, playing `role`.
fn other_process(
    broker: &common::Broker,
    role: &str,
) -> shmbroker_test_support::process::ChildGuard {
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args(["--ignored", "--exact", "interrupt_test_peer", "--nocapture"])
        .env("SHMBROKER_TEST_ROLE", role)
        .env("SHMBROKER_TEST_SOCKET", broker.socket())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    common::spawn(&mut command)
}

/// Stops `child` (SIGSTOP) 20 ms from now, then interrupts `session` 100 ms later: the session's
/// transfer with it is then stalled between two chunks.
fn stop_then_interrupt(
    child: &shmbroker_test_support::process::ChildGuard,
    session: &Session,
) -> std::thread::JoinHandle<()> {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let interrupter = session.interrupter();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        interrupter.interrupt();
    })
}

fn resume(child: &shmbroker_test_support::process::ChildGuard) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
}

#[test]
#[ignore = "the second process of the interrupt tests, which start it"]
fn interrupt_test_peer() {
    let (Ok(role), Ok(socket)) = (
        std::env::var("SHMBROKER_TEST_ROLE"),
        std::env::var("SHMBROKER_TEST_SOCKET"),
    ) else {
        return;
    };
    let mut session = Session::connect(&socket, Some(1), Duration::from_secs(60)).unwrap();
    session.set_timeout(Duration::from_secs(60));
    session.barrier().unwrap();
    match role.as_str() {
        "send" => {
            session.send(0, &large()).unwrap();
            session.send(0, b"end").unwrap();
        }
        "receive" => {
            let received = session.recv(0).unwrap();
            assert!(received == large(), "the large message arrived changed");
            // The next message is the one sent after it: the large one came once.
            assert_eq!(session.recv(0).unwrap(), b"end");
            session.send(0, b"whole, once").unwrap();
        }
        other => panic!("no role {other}"),
    }
    session.barrier().unwrap();
}

#[test]
fn an_interrupt_ends_a_large_receive_between_chunks_and_the_next_receive_gets_it_whole() {
    let broker = common::Broker::start("interrupt-receive", 2);
    let child = other_process(&broker, "send");
    let mut session = Session::connect(broker.socket(), Some(0), Duration::from_secs(60)).unwrap();
    session.set_timeout(Duration::from_secs(60));
    session.barrier().unwrap();
    // Its header is in: the transfer has begun.
    assert_eq!(session.probe(1).unwrap(), LARGE);
    let mut buffer = vec![0u8; LARGE];
    let stopping = stop_then_interrupt(&child, &session);
    let started = Instant::now();
    let first = session.recv_into(1, &mut buffer);
    let waited = started.elapsed();
    stopping.join().unwrap();
    resume(&child);
    assert!(matches!(first, Err(Error::Interrupted)), "{first:?}");
    // Ended by the interrupt, not by the deadline.
    assert!(waited < Duration::from_secs(20), "{waited:?}");
    // Nothing was lost: the next receive gets the whole message, once.
    buffer.fill(0);
    assert_eq!(session.recv_into(1, &mut buffer).unwrap(), LARGE);
    assert!(buffer == large(), "the message resumed changed");
    assert_eq!(session.recv(1).unwrap(), b"end");
    session.barrier().unwrap();
    let (ok, _, stderr) = common::finish(child);
    assert!(ok, "{stderr}");
}

#[test]
fn an_interrupt_ends_a_large_send_between_chunks_which_is_then_delivered_once() {
    let broker = common::Broker::start("interrupt-send", 2);
    let child = other_process(&broker, "receive");
    let mut session = Session::connect(broker.socket(), Some(0), Duration::from_secs(60)).unwrap();
    session.set_timeout(Duration::from_secs(60));
    session.barrier().unwrap();
    let data = large();
    let stopping = stop_then_interrupt(&child, &session);
    let started = Instant::now();
    // Part of it went out before the interrupt: it cannot be called back, so it is set aside
    // and reported sent.
    let sent = session.send(1, &data);
    let waited = started.elapsed();
    stopping.join().unwrap();
    assert!(sent.is_ok(), "{sent:?}");
    assert!(waited < Duration::from_secs(20), "{waited:?}");
    drop(data);
    // The interrupt still ends the next call, which sends nothing.
    let next = session.send(1, b"end");
    assert!(matches!(next, Err(Error::Interrupted)), "{next:?}");
    resume(&child);
    // The call after it finishes the large message first, then sends its own.
    session.send(1, b"end").unwrap();
    assert_eq!(session.recv(1).unwrap(), b"whole, once");
    session.barrier().unwrap();
    let (ok, _, stderr) = common::finish(child);
    assert!(ok, "{stderr}");
}

/// The deadline `err` reports, for a [`Error::Timeout`] of `op`.
fn timed_out_after(err: Result<impl std::fmt::Debug, Error>, op: &str) -> Duration {
    match err {
        Err(Error::Timeout {
            op: named, timeout, ..
        }) if named == op => timeout,
        other => panic!("{op}: expected a timeout, got {other:?}"),
    }
}

#[test]
fn a_call_given_its_own_deadline_keeps_it_to_itself() {
    // Each handle: the call made through `with_timeout` times out at its deadline, and the next
    // call, made on the handle itself, has the session's again.
    let (_world, mut sessions) = World::start("own-deadline", 3);
    let mut two = sessions.pop().unwrap();
    let _one = sessions.pop().unwrap();
    let mut zero = sessions.pop().unwrap();
    zero.set_timeout(Duration::from_millis(400));
    let short = Duration::from_millis(30);

    // The session, and a `set_timeout` made through the view lasting only as long as the view.
    assert_eq!(
        timed_out_after(zero.with_timeout(short).recv(1), "recv"),
        short
    );
    assert_eq!(
        timed_out_after(zero.recv(1), "recv"),
        Duration::from_millis(400)
    );
    {
        let mut timed = zero.with_timeout(short);
        timed.set_timeout(Duration::from_secs(9));
        assert_eq!(timed.timeout(), Duration::from_secs(9));
    }
    assert_eq!(zero.timeout(), Duration::from_millis(400));

    // A group view: rank 2 is a member that never calls.
    let helper = std::thread::spawn(move || {
        two.group(&[0, 2]).unwrap();
        two
    });
    let group = zero.group(&[0, 2]).unwrap();
    let two = helper.join().unwrap();
    let barrier = zero.on(&group).with_timeout(short).barrier();
    assert_eq!(timed_out_after(barrier, "barrier"), short);
    drop(two);

    // The halves of a split session: each timed value is a handle of its own.
    let (sender, receiver) = zero.split();
    assert_eq!(
        timed_out_after(receiver.with_timeout(short).recv_any(), "recv_any"),
        short
    );
    assert_eq!(receiver.timeout(), Duration::from_millis(400));
    assert_eq!(
        timed_out_after(receiver.recv(1), "recv"),
        Duration::from_millis(400)
    );
    assert_eq!(sender.with_timeout(short).timeout(), short);
    assert_eq!(sender.timeout(), Duration::from_millis(400));
    let whole = sender.rejoin(receiver).unwrap();
    assert_eq!(whole.timeout(), Duration::from_millis(400));
}
