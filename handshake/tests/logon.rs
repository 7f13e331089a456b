//! The logon protocol end to end, broker and clients in one process: every rejection reason
//! triggered and its code asserted, concurrency, silent and vanishing clients, fd accounting,
//! and a fake broker that breaks the protocol in each way a client must catch.
//!
//! Each test drives its broker on a thread of its own, stopped and joined on the way out.

mod common;

use common::{TempDir, config};
use shmbroker_bindings::{
    ANY_RANK, LOGON_MAGIC, LogonFrame, Message, NoticeKind, PROTOCOL_VERSION, RejectReason,
    ReplyHeader,
};
use shmbroker_handshake::{Config, Error, Event, Listener, connect, connect_stream};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(10);

/// A broker serving on its own thread; its events arrive on `events`. Stops on drop.
struct Broker {
    stop: shmbroker_handshake::StopHandle,
    thread: Option<thread::JoinHandle<()>>,
    events: mpsc::Receiver<Event>,
    _dir: TempDir,
    path: PathBuf,
}

impl Broker {
    fn start(name: &str, config: Config) -> Self {
        let dir = TempDir::new(name).unwrap();
        let path = common::socket(&dir);
        let mut listener = Listener::bind(&path, config).unwrap();
        let stop = listener.stop_handle();
        let (tx, events) = mpsc::channel();
        let thread = thread::spawn(move || {
            listener
                .serve(|event| {
                    let _ = tx.send(event.clone());
                })
                .unwrap();
        });
        Self {
            stop,
            thread: Some(thread),
            events,
            _dir: dir,
            path,
        }
    }

    /// The next event that is not a `LoggedOn`.
    fn next_rejection(&self) -> (RejectReason, String) {
        loop {
            match self
                .events
                .recv_timeout(TIMEOUT)
                .expect("no event from the broker")
            {
                Event::Rejected { reason, detail, .. } => return (reason, detail),
                Event::LoggedOn { .. }
                | Event::Leaving { .. }
                | Event::WorkerLeft { .. }
                | Event::JobEnded { .. }
                | Event::BadNotice { .. } => {}
                Event::Stopped => panic!("broker stopped"),
            }
        }
    }

    /// The next event `matches` picks, skipping the others.
    fn wait_for(&self, matches: impl Fn(&Event) -> bool) -> Event {
        loop {
            let event = self
                .events
                .recv_timeout(TIMEOUT)
                .expect("no event from the broker");
            if matches(&event) {
                return event;
            }
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}

fn rejected(result: Result<shmbroker_handshake::Connection, Error>) -> (RejectReason, String) {
    match result {
        Err(Error::Rejected { reason, text }) => (reason, text),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn a_world_of_four_logs_on_and_every_pair_talks() {
    let broker = Broker::start("world4", config(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let path = broker.path.clone();
            thread::spawn(move || connect(&path, LogonFrame::new(ANY_RANK), TIMEOUT).unwrap())
        })
        .collect();
    let mut sessions: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    sessions.sort_by_key(|s| s.rank());
    for (rank, session) in sessions.iter().enumerate() {
        assert_eq!(session.rank(), rank as u32);
        assert_eq!(session.world_size(), 4);
        assert_eq!(session.ring_capacity(), 64);
    }
    for from in 0..4u32 {
        for to in 0..4u32 {
            if from == to {
                assert!(sessions[from as usize].link(to).is_none());
                continue;
            }
            let message = Message {
                kind: from,
                len: to,
                tag: u64::from(from * 10 + to),
                inline: [from as u8; 48],
            };
            sessions[from as usize]
                .link(to)
                .unwrap()
                .to
                .try_send(message)
                .unwrap();
            let received = sessions[to as usize].link(from).unwrap().from.try_recv();
            assert_eq!(received, Ok(message), "{from} -> {to}");
        }
    }
    // An outbox rank 0 publishes reaches every peer, through the broker, as the same file.
    let outbox = owner_only_memfd();
    sessions[0].publish_outbox(outbox.as_fd(), TIMEOUT).unwrap();
    let published = nix::sys::stat::fstat(&outbox).unwrap();
    for peer in &mut sessions[1..] {
        let received = peer.take_peer_outbox(0, TIMEOUT).unwrap();
        let stat = nix::sys::stat::fstat(&received).unwrap();
        assert_eq!(
            (stat.st_dev, stat.st_ino),
            (published.st_dev, published.st_ino)
        );
    }
    // Each peer's outbox is handed over once.
    assert!(matches!(
        sessions[1].take_peer_outbox(0, Duration::from_millis(50)),
        Err(shmbroker_handshake::Error::Timeout { .. })
    ));
}

/// A memfd sealed so that only mappings made before the seal can write it.
fn owner_only_memfd() -> std::os::fd::OwnedFd {
    use shmbroker_queues::memfd::{OWNER_ONLY_SEALS, create_sized, seal_with};
    let fd = create_sized(c"test-outbox", 1 << 16).unwrap();
    seal_with(fd.as_fd(), OWNER_ONLY_SEALS).unwrap();
    fd
}

#[test]
fn an_outbox_others_could_write_is_refused_and_never_passed_on() {
    let broker = Broker::start("outbox-seals", config(2));
    let mut zero = connect(&broker.path, LogonFrame::new(0), TIMEOUT).unwrap();
    let mut one = connect(&broker.path, LogonFrame::new(1), TIMEOUT).unwrap();
    // Sealed against resizing only: another process could still write it.
    let writable = shmbroker_queues::memfd::create_sealed(c"test-outbox", 1 << 16).unwrap();
    zero.publish_outbox(writable.as_fd(), TIMEOUT).unwrap();
    assert!(matches!(
        one.take_peer_outbox(0, Duration::from_millis(200)),
        Err(shmbroker_handshake::Error::Timeout { .. })
    ));
    let refused = broker.wait_for(|event| matches!(event, Event::BadNotice { rank: 0, .. }));
    assert!(
        format!("{refused:?}").contains("outbox refused"),
        "{refused:?}"
    );
    // A proper one published later still goes through.
    zero.publish_outbox(owner_only_memfd().as_fd(), TIMEOUT)
        .unwrap();
    one.take_peer_outbox(0, TIMEOUT).unwrap();
}

#[test]
fn fifty_concurrent_logons_all_succeed_with_distinct_ranks() {
    let broker = Broker::start("fifty", config(50));
    let handles: Vec<_> = (0..50)
        .map(|_| {
            let path = broker.path.clone();
            thread::spawn(move || connect(&path, LogonFrame::new(ANY_RANK), TIMEOUT))
        })
        .collect();
    // Every session is held until all are in: one leaving would wind the job down.
    let sessions: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    let mut ranks: Vec<u32> = sessions.iter().map(|s| s.rank()).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, (0..50).collect::<Vec<_>>());
}

#[test]
fn a_bad_magic_is_refused_and_the_broker_keeps_serving() {
    let broker = Broker::start("magic", config(2));
    let mut frame = LogonFrame::new(0);
    frame.magic = u64::from_le_bytes(*b"NOTLOGON");
    let (reason, text) = rejected(connect(&broker.path, frame, TIMEOUT));
    assert_eq!(reason, RejectReason::BadMagic);
    assert!(
        text.contains(&format!("expected {LOGON_MAGIC:#018x}")),
        "{text}"
    );
    assert_eq!(broker.next_rejection().0, RejectReason::BadMagic);
    // Rank 0 is still free for a good logon.
    assert_eq!(
        connect(&broker.path, LogonFrame::new(0), TIMEOUT)
            .unwrap()
            .rank(),
        0
    );
}

#[test]
fn another_protocol_version_is_refused() {
    let broker = Broker::start("version", config(2));
    let mut frame = LogonFrame::new(0);
    frame.version = PROTOCOL_VERSION + 1;
    let (reason, text) = rejected(connect(&broker.path, frame, TIMEOUT));
    assert_eq!(reason, RejectReason::BadVersion);
    assert!(text.contains(&format!(
        "expected {PROTOCOL_VERSION}, found {}",
        PROTOCOL_VERSION + 1
    )));
}

#[test]
fn nonzero_padding_is_refused() {
    let broker = Broker::start("padding", config(2));
    let mut frame = LogonFrame::new(0);
    frame._pad0 = 7;
    assert_eq!(
        rejected(connect(&broker.path, frame, TIMEOUT)).0,
        RejectReason::BadPadding
    );
}

#[test]
fn a_truncated_frame_is_refused() {
    let broker = Broker::start("truncated", config(2));
    let mut stream = UnixStream::connect(&broker.path).unwrap();
    stream
        .write_all(&bytemuck::bytes_of(&LogonFrame::new(0))[..10])
        .unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let header = read_reply_header(&mut stream);
    assert_eq!(header.status, RejectReason::Truncated as u32);
    assert!(
        header
            .reason_text()
            .contains("expected 32 bytes, the stream ended after 10")
    );
}

#[test]
fn a_rank_out_of_range_is_refused() {
    let broker = Broker::start("range", config(2));
    let (reason, text) = rejected(connect(&broker.path, LogonFrame::new(2), TIMEOUT));
    assert_eq!(reason, RejectReason::RankOutOfRange);
    assert!(
        text.contains("rank 2 requested; the world has ranks 0 to 1"),
        "{text}"
    );
}

#[test]
fn a_duplicate_rank_is_refused() {
    let broker = Broker::start("duplicate", config(2));
    let _first = connect(&broker.path, LogonFrame::new(1), TIMEOUT).unwrap();
    let (reason, text) = rejected(connect(&broker.path, LogonFrame::new(1), TIMEOUT));
    assert_eq!(reason, RejectReason::RankTaken);
    assert!(
        text.contains(&format!("rank 1 is taken by pid {}", std::process::id())),
        "{text}"
    );
}

#[test]
fn a_full_world_is_refused() {
    let broker = Broker::start("full", config(2));
    let (path, path2) = (broker.path.clone(), broker.path.clone());
    let a = thread::spawn(move || connect(&path, LogonFrame::new(ANY_RANK), TIMEOUT).unwrap());
    let b = thread::spawn(move || connect(&path2, LogonFrame::new(ANY_RANK), TIMEOUT).unwrap());
    let (_a, _b) = (a.join().unwrap(), b.join().unwrap());
    let (reason, text) = rejected(connect(&broker.path, LogonFrame::new(ANY_RANK), TIMEOUT));
    assert_eq!(reason, RejectReason::WorldFull);
    assert!(text.contains("all 2 ranks are taken"), "{text}");
}

#[test]
fn capacities_beyond_the_brokers_are_refused() {
    let broker = Broker::start("capacity", config(2));
    let mut frame = LogonFrame::new(0);
    frame.min_ring_capacity = 128;
    let (reason, text) = rejected(connect(&broker.path, frame, TIMEOUT));
    assert_eq!(reason, RejectReason::CapacityOutOfLimits);
    assert!(
        text.contains("needs at least 128 ring slots; this broker's rings have 64"),
        "{text}"
    );
    let mut frame = LogonFrame::new(0);
    frame._pad0 = 1 << 30;
    let (reason, text) = rejected(connect(&broker.path, frame, TIMEOUT));
    assert_eq!(reason, RejectReason::BadPadding);
    assert!(text.contains("_pad0"), "{text}");
    // Within limits is fine.
    let mut frame = LogonFrame::new(0);
    frame.min_ring_capacity = 64;
    assert!(connect(&broker.path, frame, TIMEOUT).is_ok());
}

#[test]
fn a_silent_client_is_dropped_at_its_deadline_and_delays_nobody() {
    let broker = Broker::start(
        "silent",
        Config {
            logon_timeout: Duration::from_millis(300),
            ..config(2)
        },
    );
    let mut silent = UnixStream::connect(&broker.path).unwrap();
    // While the silent client holds its connection open, a real logon goes straight through.
    let session = connect(
        &broker.path,
        LogonFrame::new(ANY_RANK),
        Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(session.rank(), 0);
    let header = read_reply_header(&mut silent);
    assert_eq!(header.status, RejectReason::Deadline as u32);
    assert!(
        header.reason_text().contains("0 of 32 bytes arrived"),
        "{}",
        header.reason_text()
    );
}

#[test]
fn a_job_winds_down_when_a_worker_leaves_and_the_next_one_starts_once_all_are_gone() {
    let broker = Broker::start("leaving", config(2));
    let zero = connect(&broker.path, LogonFrame::new(0), TIMEOUT).unwrap();
    let one = connect(&broker.path, LogonFrame::new(1), TIMEOUT).unwrap();
    drop(one);
    let wait_for = |wanted: &dyn Fn(&Event) -> bool| loop {
        let event = broker.events.recv_timeout(TIMEOUT).unwrap();
        if wanted(&event) {
            return event;
        }
    };
    // A dropped session says goodbye: a clean exit.
    let left = wait_for(&|e| matches!(e, Event::WorkerLeft { .. }));
    assert_eq!(
        left,
        Event::WorkerLeft {
            rank: 1,
            pid: std::process::id() as i32,
            clean: true
        }
    );
    // Rank 0 is still there: the job winds down, and a newcomer would wait for rank 1 in vain.
    let (reason, text) = rejected(connect(&broker.path, LogonFrame::new(ANY_RANK), TIMEOUT));
    assert_eq!(reason, RejectReason::SessionLost);
    assert!(text.contains("rank 1 left"), "{text}");
    drop(zero);
    let ended = wait_for(&|e| matches!(e, Event::JobEnded { .. }));
    assert_eq!(
        ended,
        Event::JobEnded {
            job: 0,
            workers: 2,
            lost: None
        }
    );
    // The next job, on the same socket, with every rank free again.
    let again = connect(&broker.path, LogonFrame::new(1), TIMEOUT).unwrap();
    assert_eq!(again.rank(), 1);
    let zero = connect(&broker.path, LogonFrame::new(ANY_RANK), TIMEOUT).unwrap();
    assert_eq!(zero.rank(), 0);
}

#[test]
fn every_worker_of_a_job_names_the_same_job_or_none_does() {
    let named = |rank, job| {
        let mut frame = LogonFrame::new(rank);
        frame.job = job;
        frame
    };
    // A named job: a worker that names none is a stranger, as one that names another is.
    let broker = Broker::start("job-named", config(3));
    let _zero = connect(&broker.path, named(0, 0x51), TIMEOUT).unwrap();
    for (job, said) in [(0, "names no job"), (0x52, "is of job 0x52")] {
        let (reason, text) = rejected(connect(&broker.path, named(1, job), TIMEOUT));
        assert_eq!(reason, RejectReason::OtherJob, "{text}");
        assert!(
            text.contains("serves job 0x51") && text.contains(said),
            "{text}"
        );
    }
    let _one = connect(&broker.path, named(1, 0x51), TIMEOUT).unwrap();
    // A job whose workers named none: a worker that names one is a stranger to it.
    let broker = Broker::start("job-unnamed", config(2));
    let _zero = connect(&broker.path, named(0, 0), TIMEOUT).unwrap();
    let (reason, text) = rejected(connect(&broker.path, named(1, 0x53), TIMEOUT));
    assert_eq!(reason, RejectReason::OtherJob, "{text}");
    assert!(text.contains("named no job"), "{text}");
    let _one = connect(&broker.path, named(1, 0), TIMEOUT).unwrap();
}

#[test]
fn a_live_broker_is_not_replaced_a_stale_socket_is_and_other_files_are_left_alone() {
    let dir = TempDir::new("socketfile").unwrap();
    let path = common::socket(&dir);
    let live = Listener::bind(&path, config(1)).unwrap();
    assert!(matches!(
        Listener::bind(&path, config(1)),
        Err(Error::AddressInUse { .. })
    ));
    drop(live);
    assert!(!path.exists(), "the socket file is removed on drop");
    // A stale socket: bound, then its listener gone without cleanup.
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let listener = Listener::bind(&path, config(1)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    drop(listener);
    std::fs::write(&path, b"precious").unwrap();
    assert!(matches!(
        Listener::bind(&path, config(1)),
        Err(Error::NotASocket { .. })
    ));
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
}

#[test]
fn bad_configs_are_refused() {
    let dir = TempDir::new("config").unwrap();
    for bad in [
        Config {
            world_size: 0,
            ..config(1)
        },
        Config {
            world_size: 65,
            ..config(1)
        },
        Config {
            ring_capacity: 100,
            ..config(1)
        },
        Config {
            logon_timeout: Duration::ZERO,
            ..config(1)
        },
    ] {
        assert!(matches!(
            Listener::bind(common::socket(&dir), bad),
            Err(Error::InvalidConfig { .. })
        ));
    }
}

#[test]
fn connect_gives_up_at_its_deadline_when_no_broker_appears() {
    let dir = TempDir::new("nobroker").unwrap();
    let error = connect(
        common::socket(&dir),
        LogonFrame::new(0),
        Duration::from_millis(100),
    )
    .unwrap_err();
    assert!(
        matches!(
            error,
            Error::Unreachable {
                last: nix::errno::Errno::ENOENT,
                ..
            }
        ),
        "{error}"
    );
    // The message names the path, the wait and what the last attempt found.
    let text = error.to_string();
    let want = format!(
        "no broker at {} after 100 ms (No such file or directory)",
        common::socket(&dir).display()
    );
    assert_eq!(text, want);
}

#[test]
fn connect_fails_at_once_on_a_file_that_is_not_a_socket_or_a_stale_socket() {
    let dir = TempDir::new("notsock").unwrap();
    let wait = Duration::from_secs(10);
    let refused_at_once = |errno: Option<nix::errno::Errno>, says: &str| {
        let started = std::time::Instant::now();
        let error = connect(common::socket(&dir), LogonFrame::new(0), wait).unwrap_err();
        let took = started.elapsed();
        match (&error, errno) {
            (Error::NotASocket { .. }, None) => {}
            (Error::Connect { source, .. }, Some(errno)) if *source == errno => {}
            _ => panic!("expected {errno:?}: {error}"),
        }
        let text = error.to_string();
        assert!(
            text.contains(&common::socket(&dir).display().to_string()),
            "{text}"
        );
        assert!(text.contains(says), "{text}");
        assert!(took < wait / 2, "gave up only after {took:?}");
    };
    // A regular file where the socket should be.
    std::fs::write(common::socket(&dir), b"not a socket").unwrap();
    refused_at_once(None, "is not a socket");
    // A socket file nobody listens on: what a broker that died leaves behind.
    std::fs::remove_file(common::socket(&dir)).unwrap();
    drop(std::os::unix::net::UnixListener::bind(common::socket(&dir)).unwrap());
    refused_at_once(Some(nix::errno::Errno::ECONNREFUSED), "Connection refused");
}

fn read_reply_header(stream: &mut UnixStream) -> ReplyHeader {
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut bytes = [0u8; size_of::<ReplyHeader>()];
    stream.read_exact(&mut bytes).unwrap();
    bytemuck::pod_read_unaligned(&bytes)
}

#[test]
fn a_logon_over_a_socketpair_is_served_like_any_other() {
    let dir = TempDir::new("adopt").unwrap();
    let mut listener = Listener::bind(common::socket(&dir), config(2)).unwrap();
    let (ours, theirs) = UnixStream::pair().unwrap();
    let client = thread::spawn(move || connect_stream(theirs, LogonFrame::new(1), TIMEOUT));
    let mut events = listener.adopt(ours);
    while !events
        .iter()
        .any(|e| matches!(e, Event::LoggedOn { .. } | Event::Rejected { .. }))
    {
        events = listener.poll_once(Duration::from_millis(100)).unwrap();
    }
    assert!(
        matches!(events[..], [Event::LoggedOn { rank: 1, .. }]),
        "{events:?}"
    );
    assert_eq!(client.join().unwrap().unwrap().rank(), 1);
}

#[test]
fn a_caller_refused_at_accept_still_learns_why() {
    // The allow-list leaves out our own uid, so the broker refuses at accept and closes. A client
    // whose frame comes after that finds its write failing (EPIPE); it must still report the
    // broker's reason, which is waiting to be read.
    let me = nix::unistd::getuid().as_raw();
    let broker = Broker::start(
        "refused-at-accept",
        Config {
            allowed_uids: vec![me.wrapping_add(1)],
            ..config(2)
        },
    );
    let stream = UnixStream::connect(&broker.path).unwrap();
    // Wait until the refusal has arrived, so the frame is certainly written after the close.
    let mut fds = [nix::poll::PollFd::new(
        std::os::fd::AsFd::as_fd(&stream),
        nix::poll::PollFlags::POLLIN,
    )];
    assert_eq!(
        nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(10_000u16)),
        Ok(1)
    );
    assert_eq!(broker.next_rejection().0, RejectReason::NotAllowed);
    let (reason, text) = rejected(connect_stream(stream, LogonFrame::new(0), TIMEOUT));
    assert_eq!(reason, RejectReason::NotAllowed);
    assert!(text.contains(&format!("uid {me} may not log on")), "{text}");
}

#[test]
fn a_worker_leaving_on_purpose_ends_only_its_own_rings() {
    let broker = Broker::start("clean-exit", config(3));
    let path = broker.path.clone();
    let joins: Vec<_> = (0..3)
        .map(|rank| {
            let path = path.clone();
            thread::spawn(move || connect(&path, LogonFrame::new(rank), TIMEOUT).unwrap())
        })
        .collect();
    let mut sessions: Vec<_> = joins.into_iter().map(|j| j.join().unwrap()).collect();
    drop(sessions.pop()); // rank 2 says goodbye and closes its rings
    loop {
        if let Event::WorkerLeft { rank, clean, .. } = broker.events.recv_timeout(TIMEOUT).unwrap()
        {
            assert_eq!((rank, clean), (2, true));
            break;
        }
    }
    let (zero, rest) = sessions.split_at_mut(1);
    let (zero, one) = (&mut zero[0], &mut rest[0]);
    assert_eq!(
        zero.link(2).unwrap().from.try_recv(),
        Err(shmbroker_queues::TryRecvError::Disconnected)
    );
    // Ranks 0 and 1 carry on.
    let message = Message {
        kind: 9,
        len: 0,
        tag: 1,
        inline: [0; 48],
    };
    zero.link(1).unwrap().to.try_send(message).unwrap();
    assert_eq!(one.link(0).unwrap().from.try_recv(), Ok(message));
    assert_eq!(zero.link(1).unwrap().from.close_cause(), None);
    // Both know rank 2 left (not died), and nobody else is gone.
    assert_eq!(
        zero.departure(2),
        Some(shmbroker_handshake::Departure::Left {
            rank: 2,
            after: None
        })
    );
    assert_eq!(zero.departure(1), None);
    assert_eq!(zero.lost_rank(), None);
}

#[test]
fn fds_relayed_through_the_broker_arrive_as_the_same_files_in_any_order() {
    use std::os::fd::AsFd;
    let broker = Broker::start("relay", config(2));
    let path = broker.path.clone();
    let other = thread::spawn(move || connect(&path, LogonFrame::new(1), TIMEOUT).unwrap());
    let mut zero = connect(&broker.path, LogonFrame::new(0), TIMEOUT).unwrap();
    let mut one = other.join().unwrap();
    let files: Vec<_> = (0..2)
        .map(|_| shmbroker_queues::memfd::create_sealed(c"relay-test", 4096).unwrap())
        .collect();
    zero.relay_fd(1, 1, files[0].as_fd(), TIMEOUT).unwrap();
    zero.relay_fd(1, 2, files[1].as_fd(), TIMEOUT).unwrap();
    // Taken out of order: the first to arrive waits for its turn.
    for (token, sent) in [(2u64, &files[1]), (1, &files[0])] {
        let got = one.take_relayed_fd(0, token, TIMEOUT).unwrap();
        let (s, g) = (
            nix::sys::stat::fstat(sent).unwrap(),
            nix::sys::stat::fstat(&got).unwrap(),
        );
        assert_eq!((s.st_dev, s.st_ino), (g.st_dev, g.st_ino));
    }
    // A relay to a rank that does not exist is refused, to the sender, and goes nowhere.
    match zero.relay_fd(7, 3, files[0].as_fd(), TIMEOUT) {
        Err(Error::RelayRefused { to: 7, reason, .. }) => {
            assert!(reason.contains("no such rank"), "{reason}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        one.take_relayed_fd(0, 3, Duration::from_millis(50)),
        Err(Error::Timeout { .. })
    ));
}

#[test]
fn garbage_on_a_workers_socket_is_reported_and_the_worker_stays() {
    use std::io::Write;
    let broker = Broker::start("bad-notice", config(1));
    let session = connect(&broker.path, LogonFrame::new(0), TIMEOUT).unwrap();
    // 24 bytes that are no notice, then a notice with a kind nobody defined.
    let mut socket = session.broker_socket();
    socket.write_all(&[0xAB; 24]).unwrap();
    let unknown = shmbroker_bindings::WorkerNotice {
        magic: shmbroker_bindings::NOTICE_MAGIC,
        kind: 99,
        peer: 0,
        _pad0: 0,
        token: 0,
    };
    socket.write_all(bytemuck::bytes_of(&unknown)).unwrap();
    // A relay with no fd attached (it is answered as failed), a claim of a relay it was never
    // passed, and notices only the broker sends.
    for (kind, peer, token) in [
        (NoticeKind::RelayFd, 0, 5),
        (NoticeKind::Claimed, 0, 6),
        (NoticeKind::PeerGone, 0, 0),
        (NoticeKind::NeverJoins, 0, 0),
    ] {
        let forged = shmbroker_bindings::WorkerNotice::new(kind, peer, token);
        socket.write_all(bytemuck::bytes_of(&forged)).unwrap();
    }
    let mut details = Vec::new();
    while details.len() < 6 {
        match broker.events.recv_timeout(TIMEOUT).unwrap() {
            Event::BadNotice {
                rank: 0, detail, ..
            } => details.push(detail),
            Event::LoggedOn { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(details[0].contains("expected magic"), "{details:?}");
    assert!(
        details[1].contains("unexpected notice kind 99"),
        "{details:?}"
    );
    assert!(details[2].contains("came without an fd"), "{details:?}");
    assert!(
        details[3].contains("claimed a relay from rank 0 with token 6 that it was never passed"),
        "{details:?}"
    );
    assert!(
        details[4].contains("unexpected notice kind 12"),
        "{details:?}"
    );
    assert!(
        details[5].contains("unexpected notice kind 13"),
        "{details:?}"
    );
    // The worker was not dropped for it: no WorkerLeft until it really leaves.
    assert!(
        broker
            .events
            .recv_timeout(Duration::from_millis(100))
            .is_err()
    );
}

#[test]
fn a_worker_that_floods_the_broker_and_never_reads_its_answers_is_held_back_and_others_get_in() {
    let broker = Broker::start("never-reads", config(2));
    // Rank 0 logs on by hand and then never reads its socket again.
    let mut flooder = UnixStream::connect(&broker.path).unwrap();
    flooder
        .write_all(bytemuck::bytes_of(&LogonFrame::new(0)))
        .unwrap();
    assert_eq!(read_reply_header(&mut flooder).status, 0);
    // Relay notices with no fd attached: each one is answered (RelayFailed), into a socket nobody
    // reads. A broker that queued every answer would read all of them, growing without bound.
    let notice = shmbroker_bindings::WorkerNotice::new(NoticeKind::RelayFd, 1, 0);
    let sent_all = 200_000usize;
    flooder.set_nonblocking(true).unwrap();
    let (mut sent, mut blocked_since) = (0usize, None);
    while sent < sent_all {
        match flooder.write(bytemuck::bytes_of(&notice)) {
            Ok(n) => {
                assert_eq!(n, size_of_val(&notice));
                sent += 1;
                blocked_since = None;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // The broker stopped taking them: held back for half a second, it is done.
                let since = *blocked_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > Duration::from_millis(500) {
                    break;
                }
                thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("after {sent} notices: {e}"),
        }
    }
    assert!(
        sent < sent_all,
        "the broker took all {sent_all} notices from a worker that reads none of its answers"
    );
    // Everyone else is still served.
    let one = connect(&broker.path, LogonFrame::new(1), TIMEOUT).unwrap();
    assert_eq!(one.rank(), 1);
}
