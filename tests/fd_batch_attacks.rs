//! Attacks on the batched fd exchange (`exchange_fd_batch`, `broadcast_fd_batch`): forged and
//! malformed tickets from a peer (ranks on threads, one of them writing raw ring slots), ranks
//! that disagree, and real worker processes that run out of fds, are killed or are stopped in
//! the middle of an exchange. Every wait has a deadline; every child is killed on drop.
//!
//! The tests here count `/proc/self/fd`, so they run one at a time (`SERIAL`).

mod common;

use common::{Broker, World, memfd_with, spawn, text_of};
use shmbroker::Collectives;
use shmbroker::bindings::{FdTicket, INLINE_BYTES, Message, kind};
use shmbroker::session::{Error, FdTransport, Session};
use shmbroker_test_support::process::ChildGuard;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Every open fd of this process and what it is.
fn fd_table() -> std::collections::BTreeMap<u64, String> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let n = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            Some((n, target.display().to_string()))
        })
        .collect()
}

/// What `after` holds that `before` did not.
fn gained(
    before: &std::collections::BTreeMap<u64, String>,
    after: &std::collections::BTreeMap<u64, String>,
) -> Vec<String> {
    after
        .iter()
        .filter(|(n, t)| before.get(n) != Some(t) && !t.starts_with("/proc/"))
        .map(|(n, t)| format!("{n}:{t}"))
        .collect()
}

fn ticket(fd: BorrowedFd<'_>) -> FdTicket {
    let stat = nix::sys::stat::fstat(fd).unwrap();
    FdTicket {
        pid: std::process::id(),
        fd: fd.as_raw_fd(),
        dev: stat.st_dev,
        ino: stat.st_ino,
        token: 0,
    }
}

/// The tickets of `fds`, this process's, in order.
fn tickets_of(fds: &[OwnedFd]) -> Vec<FdTicket> {
    fds.iter().map(|fd| ticket(fd.as_fd())).collect()
}

/// The ring slots of the ticket message of the exchange numbered [`FIRST`], holding `tickets`.
fn ticket_slots(tickets: &[FdTicket]) -> Vec<Message> {
    let bytes: &[u8] = bytemuck::cast_slice(tickets);
    eager(kind::FD_TICKET, FIRST, bytes.len() as u32, bytes)
}

/// The ring slots of an eager message of `bytes` (a header, then continuation slots), as a
/// correct sender writes them, whatever `len` it declares.
fn eager(op: u32, tag: u64, len: u32, bytes: &[u8]) -> Vec<Message> {
    let mut inline = [0u8; INLINE_BYTES];
    let head = bytes.len().min(INLINE_BYTES);
    inline[..head].copy_from_slice(&bytes[..head]);
    let mut slots = vec![Message {
        kind: op,
        len,
        tag,
        inline,
    }];
    for chunk in bytes[head..].chunks(size_of::<Message>()) {
        let mut raw = [0u8; size_of::<Message>()];
        raw[..chunk.len()].copy_from_slice(chunk);
        slots.push(bytemuck::pod_read_unaligned(&raw));
    }
    slots
}

fn raw_send_to(session: &mut Session, to: u32, slots: &[Message]) {
    for slot in slots {
        session
            .raw()
            .link(to)
            .unwrap()
            .to
            .send_timeout(*slot, Duration::from_secs(5))
            .unwrap();
    }
}

/// The sequence number of the first collective after [`pair`]'s warm-up (an fd exchange: its
/// tickets and status round; an all-gather).
const FIRST: u64 = 3;

/// Rank `from`'s part of the status round of an exchange whose tickets had sequence `seq`, in a
/// world of two: all clear, or `refused` exporters to take by relay.
fn raw_status(session: &mut Session, seq: u64, refused: u64) {
    let seq = seq + FIRST;
    let mut words = [0u8; 48];
    words[..8].copy_from_slice(&refused.to_le_bytes());
    raw_send_to(session, 0, &eager(kind::ALL_GATHER, seq + 1, 48, &words));
}

/// A world of two ranks on threads, warmed up: each has exchanged an fd and a message too big
/// for the rings with the other, so that every fd a session opens (peers' pidfds and outboxes)
/// is open before a test counts them.
fn pair(name: &str) -> (World, Session, Session) {
    let (world, sessions) = World::start(name, 2);
    let mut sessions = sessions.into_iter();
    let (zero, mut one) = (sessions.next().unwrap(), sessions.next().unwrap());
    let warm = std::thread::spawn(move || {
        let fd = memfd_with("warm");
        drop(one.exchange_fds(fd.as_fd()).unwrap());
        drop(one.all_gather(&vec![1u8; 1 << 20]).unwrap());
        one
    });
    let mut zero = zero;
    let fd = memfd_with("warm");
    drop(zero.exchange_fds(fd.as_fd()).unwrap());
    drop(zero.all_gather(&vec![0u8; 1 << 20]).unwrap());
    let one = warm.join().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    (world, zero, one)
}

/// Rank 0 of a pair exchanges `count` fds while rank 1 sends `slots` (and, with `status`, an
/// all-clear status round); returns rank 0's outcome, how long it took, and how many fds the
/// process gained across the call.
fn victim_of(
    name: &str,
    count: usize,
    slots: &[Message],
    status: bool,
) -> (Result<(), Error>, Duration, isize) {
    let (_world, mut zero, mut one) = pair(name);
    let mine: Vec<OwnedFd> = (0..count).map(|i| memfd_with(&format!("z{i}"))).collect();
    let borrowed: Vec<_> = mine.iter().map(AsFd::as_fd).collect();
    raw_send_to(&mut one, 0, slots);
    if status {
        raw_status(&mut one, 0, 0);
    }
    let before = fd_table();
    let start = Instant::now();
    let outcome = zero
        .with_timeout(Duration::from_millis(800))
        .exchange_fd_batch(&borrowed)
        .map(drop);
    let took = start.elapsed();
    let new = gained(&before, &fd_table());
    if !new.is_empty() {
        eprintln!("{name}: gained {new:?}");
    }
    (outcome, took, new.len() as isize)
}

#[test]
fn a_ticket_naming_another_process_is_refused_in_every_position_of_a_batch() {
    let _serial = serial();
    let mut bystander = std::process::Command::new("sleep")
        .arg("30")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let target = nix::sys::stat::stat(format!("/proc/{}/fd/1", bystander.id()).as_str()).unwrap();
    let own: Vec<OwnedFd> = (0..3).map(|i| memfd_with(&format!("o{i}"))).collect();
    for at in 0..3 {
        let mut tickets = tickets_of(&own);
        tickets[at] = FdTicket {
            pid: bystander.id(),
            fd: 1,
            dev: target.st_dev,
            ino: target.st_ino,
            token: 0,
        };
        let (outcome, took, gained) = victim_of("fdb-pid", 3, &ticket_slots(&tickets), true);
        match &outcome {
            Err(Error::Protocol { peer: 1, detail }) if detail.contains("fd ticket names pid") => {}
            other => panic!("position {at}: {other:?}"),
        }
        assert!(took < Duration::from_secs(3), "position {at}: {took:?}");
        assert_eq!(gained, 0, "position {at}: fds leaked");
    }
    let _ = bystander.kill();
    let _ = bystander.wait();
}

#[test]
fn a_stale_ticket_in_any_position_of_a_batch_fails_and_leaks_nothing() {
    let _serial = serial();
    let own: Vec<OwnedFd> = (0..4).map(|i| memfd_with(&format!("o{i}"))).collect();
    let other = memfd_with("other");
    for at in 0..4 {
        let mut tickets = tickets_of(&own);
        // Names fd `at` by number, but another file.
        let named = ticket(other.as_fd());
        tickets[at].dev = named.dev;
        tickets[at].ino = named.ino;
        let (outcome, took, gained) = victim_of("fdb-stale", 4, &ticket_slots(&tickets), true);
        match &outcome {
            Err(Error::StaleFdTicket { exporter: 1, .. }) => {}
            other => panic!("position {at}: {other:?}"),
        }
        assert!(took < Duration::from_secs(3), "position {at}: {took:?}");
        assert_eq!(gained, 0, "position {at}: fds leaked");
    }
}

#[test]
fn malformed_ticket_messages_name_the_sender_within_the_deadline_and_leak_nothing() {
    let _serial = serial();
    let own: Vec<OwnedFd> = (0..3).map(|i| memfd_with(&format!("o{i}"))).collect();
    let tickets = tickets_of(&own);
    let good: Vec<u8> = bytemuck::cast_slice(&tickets).to_vec();
    let one_slot = |len: u32| eager(kind::FD_TICKET, FIRST, len, &good[..(len as usize).min(32)]);
    // (what, count rank 0 passes, slots, whether rank 1 also sends its status)
    let cases: Vec<(&str, usize, Vec<Message>, bool)> = vec![
        ("no tickets", 1, one_slot(0), true),
        ("33 bytes", 1, one_slot(33), true),
        ("40 bytes", 1, one_slot(40), true),
        ("31 bytes", 1, one_slot(31), true),
        (
            "97 bytes for 3",
            3,
            eager(
                kind::FD_TICKET,
                FIRST,
                97,
                &[&good[..], &[0u8][..]].concat(),
            ),
            true,
        ),
        (
            "2 tickets for 3",
            3,
            eager(kind::FD_TICKET, FIRST, 64, &good[..64]),
            true,
        ),
        (
            "4 tickets for 3",
            3,
            eager(kind::FD_TICKET, 0, 128, &[&good[..], &good[..32]].concat()),
            true,
        ),
        (
            "eager length past EAGER_MAX",
            2,
            eager(kind::FD_TICKET, FIRST, u32::MAX, &good[..48]),
            false,
        ),
        (
            "the status kind in the tickets' place",
            1,
            eager(kind::ALL_GATHER, FIRST, 32, &good[..32]),
            false,
        ),
        (
            "a far sequence number",
            1,
            eager(kind::FD_TICKET, 1 << 39, 32, &good[..32]),
            false,
        ),
        (
            "the status before the tickets",
            1,
            eager(kind::ALL_GATHER, FIRST + 1, 32, &[0u8; 32]),
            false,
        ),
    ];
    for (what, count, slots, status) in cases {
        let (outcome, took, gained) = victim_of("fdb-malformed", count, &slots, status);
        let error = outcome.expect_err(what);
        assert_eq!(error.rank(), Some(1), "{what}: {error:?}");
        assert!(took < Duration::from_secs(3), "{what}: {took:?}");
        assert_eq!(gained, 0, "{what}: fds leaked ({error:?})");
    }
}

/// Ranks 0 and 2 exchange 3 fds each, among 3; rank 1 sends rank 2 good tickets and an
/// all-clear status, and rank 0 a ticket message longer than any eager one. Rank 0 fails at
/// once naming rank 1; rank 2, left waiting for rank 0's part, fails at once too, naming rank 0
/// and, as rank 0's word, rank 1, instead of timing out naming rank 0 alone.
#[test]
fn a_rank_waiting_for_the_victim_of_a_malformed_ticket_fails_at_once_naming_both() {
    let _serial = serial();
    let (_world, sessions) = World::start("fdb-three", 3);
    // The warm-up of `pair`, among three: the exchange takes numbers FIRST and FIRST + 1.
    let warmed: Vec<_> = sessions
        .into_iter()
        .map(|mut session| {
            std::thread::spawn(move || {
                let fd = memfd_with("warm");
                drop(session.exchange_fds(fd.as_fd()).unwrap());
                drop(session.all_gather(&vec![1u8; 1 << 20]).unwrap());
                session
            })
        })
        .collect();
    let mut sessions: Vec<Session> = warmed.into_iter().map(|j| j.join().unwrap()).collect();
    let two = sessions.pop().unwrap();
    let mut one = sessions.pop().unwrap();
    let zero = sessions.pop().unwrap();
    let exchange = |mut session: Session| {
        std::thread::spawn(move || {
            let mine: Vec<OwnedFd> = (0..3).map(|i| memfd_with(&format!("f{i}"))).collect();
            let borrowed: Vec<_> = mine.iter().map(AsFd::as_fd).collect();
            let start = Instant::now();
            let outcome = session
                .with_timeout(Duration::from_secs(20))
                .exchange_fd_batch(&borrowed)
                .map(drop);
            (outcome, start.elapsed(), session)
        })
    };
    let own: Vec<OwnedFd> = (0..3).map(|i| memfd_with(&format!("o{i}"))).collect();
    let tickets = tickets_of(&own);
    let good: &[u8] = bytemuck::cast_slice(&tickets);
    raw_send_to(&mut one, 2, &ticket_slots(&tickets));
    raw_send_to(
        &mut one,
        2,
        &eager(kind::ALL_GATHER, FIRST + 1, 48, &[0u8; 48]),
    );
    raw_send_to(
        &mut one,
        0,
        &eager(kind::FD_TICKET, FIRST, u32::MAX, &good[..48]),
    );
    let (zero, two) = (exchange(zero), exchange(two));
    let (victim, took, _zero) = zero.join().unwrap();
    assert!(
        matches!(victim, Err(Error::Protocol { peer: 1, .. })),
        "{victim:?}"
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
    let (waiter, took, _two) = two.join().unwrap();
    match waiter {
        Err(error @ Error::PeerGaveUp { .. }) => {
            assert_eq!(
                error.to_string(),
                format!(
                    "peer rank 0 gave up on exchange_fd_batch #{FIRST} (its own call failed \
                     naming rank 1)"
                )
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn ranks_passing_different_counts_all_fail_naming_one_that_disagreed_and_stay_in_step() {
    let _serial = serial();
    // (exchange counts by rank, broadcast counts by rank; root 0 gives its count's fds)
    let rounds: [([usize; 4], [usize; 4]); 3] = [
        ([2, 2, 2, 0], [3, 3, 0, 3]),
        ([0, 1, 1, 1], [0, 2, 2, 2]),
        ([5, 5, 4, 5], [1, 1, 1, 70]),
    ];
    for (exchange, broadcast) in rounds {
        let (_world, sessions) = World::start("fdb-miscount", 4);
        let joins: Vec<_> = sessions
            .into_iter()
            .map(|mut s| {
                std::thread::spawn(move || {
                    s.set_timeout(Duration::from_secs(3));
                    let rank = s.rank() as usize;
                    let files: Vec<_> = (0..exchange[rank].max(broadcast[rank]))
                        .map(|i| memfd_with(&format!("{i}")))
                        .collect();
                    let borrowed: Vec<_> = files.iter().map(AsFd::as_fd).collect();
                    let exchanged = s.exchange_fd_batch(&borrowed[..exchange[rank]]).map(drop);
                    let offered = if rank == 0 {
                        &borrowed[..broadcast[0]]
                    } else {
                        &[]
                    };
                    let broadcasted = s.broadcast_fd_batch(0, offered, broadcast[rank]).map(drop);
                    (exchanged, broadcasted, s.barrier())
                })
            })
            .collect();
        for (rank, join) in joins.into_iter().enumerate() {
            let (exchanged, broadcasted, barrier) = join.join().unwrap();
            for (call, outcome, counts) in [
                ("exchange", exchanged, exchange),
                ("broadcast", broadcasted, broadcast),
            ] {
                match outcome {
                    Err(Error::Protocol { peer, detail }) => assert_ne!(
                        counts[peer as usize], counts[rank],
                        "{counts:?} rank {rank} {call}: {detail}"
                    ),
                    other => panic!("{counts:?} rank {rank} {call}: {other:?}"),
                }
            }
            barrier.unwrap_or_else(|e| panic!("rank {rank}: barrier after: {e:?}"));
        }
    }
}

#[test]
fn a_relayed_fd_that_comes_after_the_importer_gave_up_is_not_kept() {
    let _serial = serial();
    // Rank 1 is an honest exporter that stalls (SIGSTOP, a page-in, a descheduled VM) in the
    // relay rounds of a 3-fd exchange and then goes on: it relays fd 0, stalls past rank 0's
    // deadline, then relays fd 1, which is what its code does once it runs again (one relay try
    // even past its own deadline). Done here by hand, slot for slot as the library sends them.
    let (_world, mut zero, mut one) = pair("fdb-late-relay");
    zero.set_fd_transport(FdTransport::Relay);
    let theirs: Vec<OwnedFd> = (0..3).map(|i| memfd_with(&format!("t{i}"))).collect();
    raw_send_to(&mut one, 0, &ticket_slots(&tickets_of(&theirs)));
    // Rank 1 imports nothing by relay (it would take rank 0's otherwise: not the point).
    raw_status(&mut one, 0, 0);
    let mine: Vec<OwnedFd> = (0..3).map(|i| memfd_with(&format!("m{i}"))).collect();
    let borrowed: Vec<_> = mine.iter().map(AsFd::as_fd).collect();
    let before = fd_table();
    let token = |index: u64| FIRST | index << 48;
    one.raw()
        .relay_fd(0, token(0), theirs[0].as_fd(), Duration::from_secs(5))
        .unwrap();
    let outcome = zero
        .with_timeout(Duration::from_millis(500))
        .exchange_fd_batch(&borrowed)
        .map(drop);
    assert!(
        matches!(&outcome, Err(Error::Timeout { waiting_for, .. }) if waiting_for == &[1]),
        "{outcome:?}"
    );
    assert_eq!(
        gained(&before, &fd_table()),
        Vec::<String>::new(),
        "rank 0 holds fds of the exchange it gave up"
    );
    // Rank 1 runs again.
    one.raw()
        .relay_fd(0, token(1), theirs[1].as_fd(), Duration::from_secs(5))
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        gained(&before, &fd_table()),
        Vec::<String>::new(),
        "the fd relayed late is kept for ever by rank 0's session"
    );
}

#[test]
fn a_relayed_fd_other_than_its_ticket_names_is_refused_naming_the_exporter_and_leaks_nothing() {
    let _serial = serial();
    // Under the relay, rank 1's tickets are honest, but for fd 1 it relays another file: the
    // check against the ticket refuses it; rank 0 still takes fd 2 (the rounds go on) and then
    // fails naming rank 1, keeping nothing.
    let (_world, mut zero, mut one) = pair("fdb-relay-stale");
    zero.set_fd_transport(FdTransport::Relay);
    let theirs: Vec<OwnedFd> = (0..3).map(|i| memfd_with(&format!("t{i}"))).collect();
    let other = memfd_with("other");
    raw_send_to(&mut one, 0, &ticket_slots(&tickets_of(&theirs)));
    raw_status(&mut one, 0, 0);
    let token = |index: u64| FIRST | index << 48;
    let relayed = [theirs[0].as_fd(), other.as_fd(), theirs[2].as_fd()];
    for (index, fd) in (0..).zip(relayed) {
        one.raw()
            .relay_fd(0, token(index), fd, Duration::from_secs(5))
            .unwrap();
    }
    let mine: Vec<OwnedFd> = (0..3).map(|i| memfd_with(&format!("m{i}"))).collect();
    let borrowed: Vec<_> = mine.iter().map(AsFd::as_fd).collect();
    let before = fd_table();
    let outcome = zero
        .with_timeout(Duration::from_secs(5))
        .exchange_fd_batch(&borrowed)
        .map(drop);
    let named = ticket(theirs[1].as_fd());
    let found = ticket(other.as_fd());
    match outcome {
        Err(Error::StaleFdTicket {
            exporter: 1,
            expected,
            found: seen,
        }) => {
            assert_eq!(expected, (named.dev, named.ino));
            assert_eq!(seen, (found.dev, found.ino));
        }
        other => panic!("{other:?}"),
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(gained(&before, &fd_table()), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// Real processes: each rank is this test binary, re-run as the ignored test `fd_batch_rank`.

/// What one rank process does, by `FDB_SCENARIO`: log on, a barrier, a warm-up exchange, then
/// the exchange under attack. It prints `READY` before that exchange, `DONE <outcome>` after
/// it, then (once `FDB_GO` exists, when set) `FDS <before> <after>`, then with `FDB_BARRIER` a
/// barrier's outcome `BARRIER <outcome>`.
#[test]
#[ignore = "a rank of the multi-process tests in this file, which run it themselves"]
fn fd_batch_rank() {
    let Ok(scenario) = std::env::var("FDB_SCENARIO") else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap();
    let rank: u32 = var("FDB_RANK").parse().unwrap();
    let count: usize = var("FDB_COUNT").parse().unwrap();
    let timeout = Duration::from_millis(var("FDB_TIMEOUT_MS").parse().unwrap());
    let mut s = Session::connect(var("FDB_SOCKET"), Some(rank), Duration::from_secs(20)).unwrap();
    s.set_timeout(Duration::from_secs(20));
    if let Ok(transport) = std::env::var("FDB_TRANSPORT") {
        s.set_fd_transport(transport.parse().unwrap());
    }
    s.barrier().unwrap();
    let warm = memfd_with("warm");
    drop(s.exchange_fd_batch(&[warm.as_fd()]).unwrap());
    // Every peer's outbox fd reaches this process through the broker and waits in the inbox
    // until a message first needs that outbox. One that arrived after the fd table is read
    // below would look like a leak of the exchange (CI saw it: a late
    // `memfd:shmbroker-outbox`). A payload too big for the rings maps every peer's outbox now
    // (the broker sent each peer's pidfd before its outbox, on the same stream).
    drop(s.all_gather(&vec![0u8; 1 << 20]).unwrap());
    let outboxes = fd_table()
        .values()
        .filter(|target| target.contains("shmbroker-outbox"))
        .count();
    assert_eq!(
        outboxes, 1,
        "this rank's own outbox fd only: the peers' are mapped"
    );
    let files: Vec<OwnedFd> = (0..count)
        .map(|i| memfd_with(&format!("file {i} of rank {rank}")))
        .collect();
    let borrowed: Vec<_> = files.iter().map(AsFd::as_fd).collect();
    s.set_timeout(timeout);
    let before = fd_count();
    let table = fd_table();
    if let Ok(limited) = std::env::var("FDB_LIMITED")
        && limited.parse::<u32>().unwrap() == rank
    {
        // Room for `FDB_ROOM` fds more than it holds (new fds take the lowest free numbers
        // under the limit), fewer than the exchange brings.
        let (_, hard) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        nix::sys::resource::setrlimit(
            nix::sys::resource::Resource::RLIMIT_NOFILE,
            fd_count() as u64 + var("FDB_ROOM").parse::<u64>().unwrap(),
            hard,
        )
        .unwrap();
    }
    println!("READY");
    let outcome = match scenario.as_str() {
        "exchange" => s.exchange_fd_batch(&borrowed).map(|all| {
            let world = s.world_size();
            assert_eq!(all.len(), world as usize);
            for (from, fds) in all.iter().enumerate() {
                let texts: Vec<String> = fds.iter().map(text_of).collect();
                let expected: Vec<String> = (0..count)
                    .map(|i| format!("file {i} of rank {from}"))
                    .collect();
                assert_eq!(texts, expected, "from rank {from}");
            }
        }),
        "broadcast" => {
            let offered = if rank == 0 { &borrowed[..] } else { &[] };
            s.broadcast_fd_batch(0, offered, count).map(|fds| {
                let texts: Vec<String> = fds.iter().map(text_of).collect();
                let expected: Vec<String> =
                    (0..count).map(|i| format!("file {i} of rank 0")).collect();
                assert_eq!(texts, expected);
            })
        }
        other => panic!("no scenario {other}"),
    };
    println!("DONE {outcome:?}");
    if let Ok(go) = std::env::var("FDB_GO") {
        let until = Instant::now() + Duration::from_secs(20);
        while !std::path::Path::new(&go).exists() {
            assert!(Instant::now() < until, "no go");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "FDS {before} {} {:?}",
        fd_count(),
        gained(&table, &fd_table())
    );
    if std::env::var("FDB_BARRIER").is_ok() {
        s.set_timeout(Duration::from_secs(5));
        println!("BARRIER {:?}", s.barrier());
    }
}

/// A rank process and its stdout, line by line.
struct Rank {
    child: ChildGuard,
    lines: mpsc::Receiver<String>,
}

impl Rank {
    fn line(&self, prefix: &str) -> String {
        let until = Instant::now() + Duration::from_secs(25);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line[prefix.len()..].to_owned(),
                Ok(_) => {}
                Err(_) => panic!("rank {}: no {prefix} line", self.child.id()),
            }
        }
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, signal);
    }
}

fn start_ranks(broker: &Broker, world: u32, env: &[(&str, String)]) -> Vec<Rank> {
    (0..world)
        .map(|rank| {
            let mut command = Command::new(std::env::current_exe().unwrap());
            command
                .args(["--ignored", "--exact", "fd_batch_rank", "--nocapture"])
                .env("FDB_SOCKET", broker.socket())
                .env("FDB_RANK", rank.to_string())
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            let mut child = spawn(&mut command);
            let stdout = child.take_stdout().unwrap();
            let (tx, lines) = mpsc::channel();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            Rank { child, lines }
        })
        .collect()
}

/// The fds rank `rank` opened in its exchange and still holds after it (none unless a leak).
fn fds_gained(rank: &Rank) -> String {
    let line = rank.line("FDS ");
    line.splitn(3, ' ').nth(2).unwrap_or_default().to_owned()
}

#[test]
fn relayed_batches_past_the_cap_complete_among_three_to_eight_processes() {
    let _serial = serial();
    for (world, scenario, count) in [
        (3, "exchange", 70),
        (8, "exchange", 66),
        (5, "broadcast", 140),
    ] {
        let broker = Broker::start("fdb-relay-big", world);
        let env = [
            ("FDB_SCENARIO", scenario.to_string()),
            ("FDB_COUNT", count.to_string()),
            ("FDB_TIMEOUT_MS", "20000".to_string()),
            ("FDB_TRANSPORT", "relay".to_string()),
        ];
        let ranks = start_ranks(&broker, world, &env);
        for (rank, r) in ranks.iter().enumerate() {
            let done = r.line("DONE ");
            assert_eq!(done, "Ok(())", "{world} ranks {scenario}, rank {rank}");
            assert_eq!(
                fds_gained(r),
                "[]",
                "{world} ranks, rank {rank}: fds leaked"
            );
        }
    }
}

/// Ranks 0 to 2 exchange 16 fds each under `transport`; rank 1 has room for `room` more fds
/// than it holds. Every rank must fail (not time out) naming rank 1, leak nothing and meet the
/// others at a barrier after.
fn out_of_fds(transport: &str, room: u32) {
    let broker = Broker::start("fdb-nofile", 3);
    let env = [
        ("FDB_SCENARIO", "exchange".to_string()),
        ("FDB_COUNT", "16".to_string()),
        ("FDB_TIMEOUT_MS", "2000".to_string()),
        ("FDB_TRANSPORT", transport.to_string()),
        ("FDB_LIMITED", "1".to_string()),
        ("FDB_ROOM", room.to_string()),
        ("FDB_BARRIER", String::new()),
    ];
    let ranks = start_ranks(&broker, 3, &env);
    let seen: Vec<(String, String, String)> = ranks
        .iter()
        .map(|r| (r.line("DONE "), fds_gained(r), r.line("BARRIER ")))
        .collect();
    for (rank, (done, fds, barrier)) in seen.iter().enumerate() {
        let what = format!("{transport}, room {room}: rank {rank}: {seen:#?}");
        assert!(
            done.starts_with("Err")
                && !done.contains("Timeout")
                && (done.contains("rank 1") || rank == 1 && done.contains("no room")),
            "{what}"
        );
        assert_eq!(fds, "[]", "{what}: fds leaked");
        assert_eq!(barrier, "Ok(())", "{what}");
    }
}

#[test]
fn a_rank_out_of_fds_fails_every_rank_naming_it_and_leaks_nothing() {
    let _serial = serial();
    // Room for 4 fds: the rank's duplicates of its own fail; for 20, its imports.
    out_of_fds("auto", 4);
    out_of_fds("relay", 4);
    out_of_fds("auto", 20);
}

#[test]
fn a_rank_out_of_fds_for_relayed_fds_fails_every_rank_naming_it() {
    let _serial = serial();
    out_of_fds("relay", 20);
}

/// Kills (or stops) rank 2 of 4, `delay` after every rank said it is about to exchange
/// relayed batches of 70 fds; the survivors must end naming rank 2 and leak nothing.
fn lose_rank_two_mid_relay(delay: Duration, stop: bool) {
    let dir = common::TempDir::new("fdb-go").unwrap();
    let go = dir.join("go");
    let broker = Broker::start("fdb-lose", 4);
    let env = [
        ("FDB_SCENARIO", "exchange".to_string()),
        ("FDB_COUNT", "70".to_string()),
        ("FDB_TIMEOUT_MS", "1500".to_string()),
        ("FDB_TRANSPORT", "relay".to_string()),
        ("FDB_GO", go.to_str().unwrap().to_string()),
    ];
    let ranks = start_ranks(&broker, 4, &env);
    for r in &ranks {
        r.line("READY");
    }
    std::thread::sleep(delay);
    let victim = &ranks[2];
    victim.signal(if stop {
        nix::sys::signal::Signal::SIGSTOP
    } else {
        nix::sys::signal::Signal::SIGKILL
    });
    let survivors = [0usize, 1, 3];
    for &rank in &survivors {
        let done = ranks[rank].line("DONE ");
        // A timeout names every rank whose fd has not come, rank 2 among them (or rank 2
        // only, when no other rank is left waiting for it).
        let named_two = done.contains("waiting_for: [")
            && done
                .split("waiting_for: [")
                .nth(1)
                .and_then(|rest| rest.split(']').next())
                .is_some_and(|ranks| ranks.split(", ").any(|r| r == "2"));
        assert!(
            done == "Ok(())" || done.contains("PeerLost { rank: 2") || named_two,
            "{delay:?} stop={stop}: rank {rank}: {done}"
        );
    }
    if stop {
        // It runs again, late: what it still sends must not stay with the survivors.
        victim.signal(nix::sys::signal::Signal::SIGCONT);
        std::thread::sleep(Duration::from_millis(300));
    }
    std::fs::write(&go, b"").unwrap();
    for &rank in &survivors {
        assert_eq!(
            fds_gained(&ranks[rank]),
            "[]",
            "{delay:?} stop={stop}: rank {rank} leaked fds"
        );
    }
}

#[test]
fn a_rank_killed_mid_relay_ends_the_exchange_naming_it_without_leaks() {
    let _serial = serial();
    for delay_ms in [0, 3, 15, 40] {
        lose_rank_two_mid_relay(Duration::from_millis(delay_ms), false);
    }
}

#[test]
fn a_rank_stopped_mid_relay_and_continued_leaves_no_fd_with_the_survivors() {
    let _serial = serial();
    for delay_ms in [5, 20] {
        lose_rank_two_mid_relay(Duration::from_millis(delay_ms), true);
    }
}
