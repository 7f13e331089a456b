//! File-descriptor accounting of the logon protocol: a broker keeps nothing of clients that
//! vanish, and a client closes every fd of a reply it refuses (a fake broker sends each kind of
//! bad reply). The tests here count this process's fds, so they take turns (`SERIAL`) and share
//! the binary with no other test.

mod common;

use common::{TempDir, config};
use shmbroker_bindings::{LogonFrame, REPLY_MAGIC, RejectReason, ReplyHeader};
use shmbroker_handshake::{Error, Listener, ProtocolError, connect};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(10);

/// Held by every test here: fd counts mean something only while nothing else opens or closes fds.
static SERIAL: Mutex<()> = Mutex::new(());

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// The fd numbers open in this process (the directory's own fd among them, at the lowest free
/// number, as it is in every listing taken the same way).
fn open_fd_numbers() -> std::collections::BTreeSet<i32> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

#[test]
fn a_client_that_vanishes_mid_logon_leaves_no_fd_in_the_broker() {
    // This test drives the broker itself (no thread), so it can count fds between steps.
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("vanish").unwrap();
    let mut listener = Listener::bind(common::socket(&dir), config(2)).unwrap();
    let before = open_fds();
    for _ in 0..20 {
        let mut client = UnixStream::connect(common::socket(&dir)).unwrap();
        client.write_all(&[1, 2, 3]).unwrap();
        // Until the broker has accepted and read what arrived, the connection is pending.
        while listener.pending_logons() == 0 {
            listener.poll_once(Duration::from_millis(100)).unwrap();
        }
        drop(client);
        while listener.pending_logons() > 0 {
            listener.poll_once(Duration::from_millis(100)).unwrap();
        }
    }
    assert_eq!(
        open_fds(),
        before,
        "the broker kept fds of vanished clients"
    );
}

// ---------------------------------------------------------------------------------------------
// A fake broker that answers one logon with whatever the test gives it.

/// Serves one connection on `path` with `reply` (bytes) and `fds`, then keeps it open until the
/// client is done.
fn fake_broker(
    path: &Path,
    reply: Vec<u8>,
    fds: Vec<std::os::fd::OwnedFd>,
) -> thread::JoinHandle<()> {
    let listener = UnixListener::bind(path).unwrap();
    thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut frame = [0u8; 32];
        stream.read_exact(&mut frame).unwrap();
        let borrowed: Vec<_> = fds.iter().map(std::os::fd::AsFd::as_fd).collect();
        let sent = shmbroker_sys::fdpass::send_with_fds(
            std::os::fd::AsFd::as_fd(&stream),
            &[&reply],
            &borrowed,
        )
        .unwrap();
        assert_eq!(sent, reply.len());
        // Hold the connection until the client closes it.
        let _ = stream.read(&mut [0u8; 1]);
    })
}

fn accepted_header(world_size: u32, fd_count: u32) -> ReplyHeader {
    let mut header = ReplyHeader::rejection(RejectReason::Internal, "");
    header.status = 0;
    header.world_size = world_size;
    header.fd_count = fd_count;
    header.ring_capacity = 64;
    header
}

/// Runs one logon against a fake broker sending `reply` with `fds`; returns the error, after
/// checking that every fd the client received was closed.
fn client_error(
    name: &str,
    reply: Vec<u8>,
    fds: impl FnOnce() -> Vec<std::os::fd::OwnedFd>,
) -> Error {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new(name).unwrap();
    let before = open_fd_numbers();
    let fake = fake_broker(&common::socket(&dir), reply, fds());
    let error = connect(common::socket(&dir), LogonFrame::new(0), TIMEOUT).unwrap_err();
    // The fake broker's socket and files are closed when its thread ends; ours must be too. No
    // fd may be open that was not open before. (Not a count: the test harness has closed one of
    // its own in the middle of such a test at least once, which a count took for a leak.)
    fake.join().unwrap();
    let kept: Vec<i32> = open_fd_numbers().difference(&before).copied().collect();
    assert_eq!(
        kept,
        [] as [i32; 0],
        "the client kept fds after a bad reply"
    );
    error
}

/// The manifest of rank 0 of a world of 2, as (role, peer, size) with rings of 4096 bytes: its
/// own readiness eventfd, the rings to and from rank 1, and rank 1's readiness eventfd.
const RANK_0_OF_2: [(u32, u32, u64); 4] = [(4, 0, 0), (1, 1, 4096), (2, 1, 4096), (4, 1, 0)];

/// An accepted reply for rank 0 of a world of 2 with a manifest of `entries` (role, peer, size),
/// each with the layout version its role should have.
fn reply_for_rank_0_of_2(entries: [(u32, u32, u64); 4]) -> Vec<u8> {
    let mut reply = bytemuck::bytes_of(&accepted_header(2, 4)).to_vec();
    for (role, peer, size) in entries {
        let entry = shmbroker_bindings::ManifestEntry {
            role,
            peer,
            size,
            layout_version: shmbroker_bindings::RING_LAYOUT_VERSION,
            _pad0: 0,
        };
        reply.extend_from_slice(bytemuck::bytes_of(&entry));
    }
    reply
}

fn memfds(count: usize) -> Vec<std::os::fd::OwnedFd> {
    (0..count)
        .map(|_| shmbroker_queues::memfd::create_sealed(c"fake", 4096).unwrap())
        .collect()
}

/// The fds for [`RANK_0_OF_2`]: eventfds where it says readiness, blank sealed memfds (no rings)
/// where it says ring.
fn fds_for_rank_0_of_2() -> Vec<std::os::fd::OwnedFd> {
    let eventfd = || shmbroker_sys::eventfd::create().unwrap();
    let mut rings = memfds(2);
    let from = rings.pop().unwrap();
    let to = rings.pop().unwrap();
    vec![eventfd(), to, from, eventfd()]
}

#[test]
fn a_reply_with_a_bad_magic_is_a_protocol_error() {
    let mut header = accepted_header(1, 0);
    header.magic = 7;
    let error = client_error("fake-magic", bytemuck::bytes_of(&header).to_vec(), || {
        memfds(1)
    });
    assert!(
        matches!(
            error,
            Error::Protocol(ProtocolError::BadMagic {
                expected: REPLY_MAGIC,
                found: 7
            })
        ),
        "{error}"
    );
}

#[test]
fn a_reply_with_fewer_fds_than_its_manifest_is_a_protocol_error() {
    // World of 2: 4 fds announced, manifest of 4, only 1 fd attached.
    let reply = reply_for_rank_0_of_2(RANK_0_OF_2);
    let error = client_error("fake-fdcount", reply, || memfds(1));
    assert!(
        matches!(
            error,
            Error::Protocol(ProtocolError::FdCount {
                expected: 4,
                found: 1
            })
        ),
        "{error}"
    );
}

#[test]
fn a_reply_with_a_manifest_out_of_order_is_a_protocol_error() {
    let [own, to, from, theirs] = RANK_0_OF_2;
    let reply = reply_for_rank_0_of_2([own, from, to, theirs]);
    let error = client_error("fake-order", reply, fds_for_rank_0_of_2);
    assert!(
        matches!(
            error,
            Error::Protocol(ProtocolError::ManifestOrder { index: 1, .. })
        ),
        "{error}"
    );
}

#[test]
fn a_reply_cut_short_is_a_protocol_error() {
    let header = accepted_header(2, 4);
    let reply = bytemuck::bytes_of(&header)[..100].to_vec();
    // The fake keeps the connection open, so the client waits for the rest until its deadline.
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("fake-short").unwrap();
    let fake = fake_broker(&common::socket(&dir), reply, fds_for_rank_0_of_2());
    let error = connect(
        common::socket(&dir),
        LogonFrame::new(0),
        Duration::from_millis(300),
    )
    .unwrap_err();
    assert!(
        matches!(
            error,
            Error::Timeout {
                stage: "waiting for the broker's reply",
                ..
            }
        ),
        "{error}"
    );
    fake.join().unwrap();
}

#[test]
fn a_manifest_size_that_disagrees_with_the_file_is_a_protocol_error() {
    let mut entries = RANK_0_OF_2;
    entries[1].2 = 8192;
    let reply = reply_for_rank_0_of_2(entries);
    let error = client_error("fake-size", reply, fds_for_rank_0_of_2);
    assert!(
        matches!(
            error,
            Error::Protocol(ProtocolError::ManifestValue {
                index: 1,
                field: "size",
                expected: 8192,
                found: 4096
            })
        ),
        "{error}"
    );
}

#[test]
fn files_that_are_not_rings_are_refused_before_use() {
    // Right sizes, right manifest, but the "rings" are blank sealed memfds.
    let reply = reply_for_rank_0_of_2(RANK_0_OF_2);
    let error = client_error("fake-blank", reply, fds_for_rank_0_of_2);
    assert!(
        matches!(
            error,
            Error::Ring {
                role: "to",
                peer: 1,
                source: shmbroker_queues::Error::BadMagic { .. }
            }
        ),
        "{error}"
    );
}

#[test]
fn a_readiness_entry_that_is_not_an_eventfd_is_refused_before_anything_writes_to_it() {
    // The broker's "eventfd" for rank 1 is a memfd: writing 8 bytes to it would scribble on a
    // file, so the client refuses the reply instead.
    let ring = || shmbroker_queues::create::<shmbroker_bindings::Message>(64).unwrap();
    // Under the lock: the memfd made to measure a ring must not open while another test here
    // compares this process's fds (a full test run caught one doing so).
    let ring_size = {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        shmbroker_queues::memfd::file_size(std::os::fd::AsFd::as_fd(&ring())).unwrap()
    };
    let reply_with_size = reply_for_rank_0_of_2([
        (4, 0, 0),
        (1, 1, ring_size),
        (2, 1, ring_size),
        (4, 1, 4096),
    ]);
    let fds = move || {
        let eventfd = shmbroker_sys::eventfd::create().unwrap();
        vec![eventfd, ring(), ring(), memfds(1).pop().unwrap()]
    };
    let error = client_error("fake-eventfd", reply_with_size, fds);
    assert!(
        matches!(
            error,
            Error::Protocol(ProtocolError::NotAnEventFd { index: 3, peer: 1 })
        ),
        "{error}"
    );
}

#[test]
fn a_broker_out_of_fds_pauses_accepting_instead_of_spinning_and_recovers() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    use shmbroker_handshake::Event;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("emfile").unwrap();
    let mut listener = Listener::bind(common::socket(&dir), config(4)).unwrap();
    // Three callers wait in the backlog.
    let clients: Vec<UnixStream> = (0..3)
        .map(|_| UnixStream::connect(common::socket(&dir)).unwrap())
        .collect();
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    // No fd left for accept to return.
    setrlimit(Resource::RLIMIT_NOFILE, open_fds() as u64 - 1, hard).unwrap();
    let first = listener.poll_once(Duration::from_millis(50));
    let second = listener.poll_once(Duration::ZERO);
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
    let first = first.unwrap();
    assert!(
        matches!(&first[..], [Event::Rejected { detail, .. }] if detail.contains("accept failed")),
        "{first:?}"
    );
    // Paused: the still-readable listening socket is not polled, so nothing new happens.
    assert_eq!(second.unwrap(), []);
    // After the pause every waiting caller is accepted.
    let deadline = std::time::Instant::now() + TIMEOUT;
    while listener.pending_logons() < clients.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "accepting never resumed"
        );
        listener.poll_once(Duration::from_millis(50)).unwrap();
    }
}
