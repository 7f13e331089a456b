//! The unit tests drive the ABI as a C program does: a block of calls on one session at a time.

use super::*;
use shmbroker::handshake::{Config, Listener};
use std::ffi::{CStr, CString};
use std::ptr::{null, null_mut};
use std::time::Duration;

fn last_error() -> String {
    // SAFETY: the pointer is this thread's, valid until the next call here.
    unsafe { CStr::from_ptr(shmbroker_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A broker for `world` ranks on a thread, and `world` sessions made through the C ABI.
fn world(world: u32) -> (shmbroker_sys::TempDir, Vec<usize>) {
    world_with_timeout(world, 10_000)
}

/// [`world`] with sessions whose deadline is `timeout_ms`.
fn world_with_timeout(world: u32, timeout_ms: u64) -> (shmbroker_sys::TempDir, Vec<usize>) {
    let dir = shmbroker_sys::TempDir::new("capi").unwrap();
    let socket = dir.path().join("broker.sock");
    let config = Config {
        world_size: world,
        ..Config::default()
    };
    let mut listener = Listener::bind(&socket, config).unwrap();
    std::thread::spawn(move || listener.serve(|_| {}));
    let path = CString::new(socket.to_str().unwrap()).unwrap();
    let joins: Vec<_> = (0..world)
        .map(|rank| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut s = null_mut();
                // SAFETY: a NUL-terminated path and a writable out pointer.
                let rc =
                    unsafe { shmbroker_connect(path.as_ptr(), rank as i32, timeout_ms, &mut s) };
                assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                s as usize
            })
        })
        .collect();
    let sessions = joins.into_iter().map(|j| j.join().unwrap()).collect();
    (dir, sessions)
}

#[test]
fn the_version_macros_are_the_crates_version() {
    let version =
        format!("{SHMBROKER_VERSION_MAJOR}.{SHMBROKER_VERSION_MINOR}.{SHMBROKER_VERSION_PATCH}");
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    assert_eq!(shmbroker_version(), 100);
}

#[test]
fn with_timeout_forever_a_receive_waits_for_a_late_sender() {
    let (_dir, sessions) = world_with_timeout(2, SHMBROKER_TIMEOUT_FOREVER);
    let late = sessions[1];
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: a live session used by this thread alone; 4 readable bytes.
        let rc = unsafe { shmbroker_send(late as *mut _, 0, b"late".as_ptr().cast(), 4) };
        assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
    });
    let mut buffer = [0u8; 8];
    let mut len = 0usize;
    let started = std::time::Instant::now();
    // SAFETY: a live session; a writable buffer of its length and a writable length.
    let rc = unsafe {
        shmbroker_recv(
            sessions[0] as *mut _,
            1,
            buffer.as_mut_ptr().cast(),
            buffer.len(),
            &mut len,
        )
    };
    assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
    assert_eq!(&buffer[..len], b"late");
    assert!(started.elapsed() >= Duration::from_millis(250));
    sender.join().unwrap();
    for s in sessions {
        // SAFETY: live sessions, closed once, by this thread alone now.
        assert_eq!(unsafe { shmbroker_close(s as *mut _) }, SHMBROKER_OK);
    }
}

#[test]
fn a_per_call_timeout_overrides_the_sessions_both_ways() {
    // The session's deadline is 10 s; each call below has its own.
    let (_dir, sessions) = world(2);
    let (zero, one) = (sessions[0], sessions[1]);
    let late = std::thread::spawn(move || {
        let s = one as *mut shmbroker_session;
        // SAFETY: rank 1's session, used by this thread alone; readable bytes as long as said.
        unsafe {
            assert_eq!(shmbroker_barrier_timeout(s, 5_000), SHMBROKER_OK);
            std::thread::sleep(Duration::from_millis(300));
            let rc = shmbroker_send_timeout(s, 0, b"late".as_ptr().cast(), 4, 5_000);
            assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
            assert_eq!(shmbroker_barrier_timeout(s, 0), SHMBROKER_E_MISUSE);
            assert_eq!(
                shmbroker_barrier_timeout(s, SHMBROKER_TIMEOUT_FOREVER),
                SHMBROKER_OK
            );
        }
    });
    let s = zero as *mut shmbroker_session;
    let (mut buffer, mut len, mut from) = ([0u8; 8], 0usize, u32::MAX);
    // SAFETY: rank 0's session, used by this thread alone; writable buffers as long as said.
    unsafe {
        assert_eq!(shmbroker_barrier_timeout(s, 5_000), SHMBROKER_OK);
        // 50 ms, not the session's 10 s: a timeout naming the rank it waited for.
        let started = std::time::Instant::now();
        assert_eq!(
            shmbroker_probe_timeout(s, 1, &mut len, 50),
            SHMBROKER_E_TIMEOUT
        );
        assert_eq!(shmbroker_last_error_rank(), 1);
        let rc = shmbroker_recv_timeout(s, 1, buffer.as_mut_ptr().cast(), 8, &mut len, 50);
        assert_eq!(rc, SHMBROKER_E_TIMEOUT, "{}", last_error());
        // What rank 1 is doing meanwhile (sleeping after its barrier), from what it publishes.
        assert!(
            last_error().contains("rank 1 is in no call (its last, barrier #0, finished"),
            "{}",
            last_error()
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(
            shmbroker_recv_timeout(s, 1, buffer.as_mut_ptr().cast(), 8, &mut len, 0),
            SHMBROKER_E_MISUSE
        );
        assert!(last_error().contains("timeout_ms is 0"), "{}", last_error());
        // No deadline: the late message arrives.
        let rc = shmbroker_recv_any_timeout(
            s,
            &mut from,
            buffer.as_mut_ptr().cast(),
            8,
            &mut len,
            SHMBROKER_TIMEOUT_FOREVER,
        );
        assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
        assert_eq!((from, &buffer[..len]), (1, &b"late"[..]));
        assert_eq!(shmbroker_barrier_timeout(s, 5_000), SHMBROKER_OK);
    }
    late.join().unwrap();
    for s in sessions {
        // SAFETY: live sessions, closed once, by this thread alone now.
        assert_eq!(unsafe { shmbroker_close(s as *mut _) }, SHMBROKER_OK);
    }
}

#[test]
fn null_pointers_and_bad_arguments_are_misuse_with_a_message() {
    let mut s = null_mut();
    // SAFETY: each call is given a null pointer on purpose; none is dereferenced.
    unsafe {
        assert_eq!(
            shmbroker_connect(null(), 0, 1000, &mut s),
            SHMBROKER_E_MISUSE
        );
        assert!(last_error().contains("path is NULL"), "{}", last_error());
        let path = CString::new("/nonexistent/broker.sock").unwrap();
        assert_eq!(
            shmbroker_connect(path.as_ptr(), 0, 1000, null_mut()),
            SHMBROKER_E_MISUSE
        );
        assert_eq!(
            shmbroker_connect(path.as_ptr(), -2, 1000, &mut s),
            SHMBROKER_E_MISUSE
        );
        assert!(last_error().contains("rank -2"), "{}", last_error());
        assert_eq!(
            shmbroker_connect(path.as_ptr(), 0, 0, &mut s),
            SHMBROKER_E_MISUSE
        );
        assert_eq!(shmbroker_barrier(null_mut()), SHMBROKER_E_MISUSE);
        assert!(last_error().contains("shmbroker_barrier: the session is NULL"));
        assert_eq!(shmbroker_rank(null()), 0);
        assert_eq!(shmbroker_world_size(null()), 0);
        assert_eq!(shmbroker_close(null_mut()), SHMBROKER_OK);
        assert_eq!(shmbroker_interrupt(null()), SHMBROKER_E_MISUSE);
        assert_eq!(
            shmbroker_probe(null_mut(), 0, null_mut()),
            SHMBROKER_E_MISUSE
        );
    }
    assert!(s.is_null(), "no session was made");
}

#[test]
fn short_buffers_bad_fds_and_departures_are_reported_naming_the_rank() {
    let (_dir, sessions) = world(2);
    let (a, b) = (
        sessions[0] as *mut shmbroker_session,
        sessions[1] as *mut shmbroker_session,
    );
    let big = [7u8; 100];
    let mut small = [0u8; 10];
    let mut len;
    // SAFETY: live sessions, used from this thread only; buffers as long as said.
    unsafe {
        assert_eq!(
            shmbroker_send(b, 0, big.as_ptr().cast(), big.len()),
            SHMBROKER_OK
        );
        assert_eq!(
            shmbroker_send(b, 0, b"next".as_ptr().cast(), 4),
            SHMBROKER_OK
        );
        for _ in 0..2 {
            len = 0;
            let rc = shmbroker_recv(a, 1, small.as_mut_ptr().cast(), small.len(), &mut len);
            assert_eq!(rc, SHMBROKER_E_TOO_SMALL);
            assert_eq!(len, 100, "the length needed");
            assert!(
                last_error().contains("rank 1 sent 100 bytes") && last_error().contains("kept"),
                "{}",
                last_error()
            );
        }
        // The message was kept: probe sizes it, a large enough buffer gets it whole.
        len = 0;
        assert_eq!(shmbroker_probe(a, 1, &mut len), SHMBROKER_OK);
        assert_eq!(len, 100);
        let mut whole = [0u8; 100];
        let rc = shmbroker_recv(a, 1, whole.as_mut_ptr().cast(), whole.len(), &mut len);
        assert_eq!((rc, len, whole), (SHMBROKER_OK, 100, big));
        // And the next message is intact.
        let rc = shmbroker_recv(a, 1, small.as_mut_ptr().cast(), small.len(), &mut len);
        assert_eq!((rc, &small[..len]), (SHMBROKER_OK, &b"next"[..]));
        // recv_any too: the sender and the length, the message kept.
        assert_eq!(
            shmbroker_send(b, 0, big.as_ptr().cast(), big.len()),
            SHMBROKER_OK
        );
        let mut from = u32::MAX;
        let rc = shmbroker_recv_any(a, &mut from, small.as_mut_ptr().cast(), 10, &mut len);
        assert_eq!((rc, from, len), (SHMBROKER_E_TOO_SMALL, 1, 100));
        let rc = shmbroker_recv_any(a, &mut from, whole.as_mut_ptr().cast(), 100, &mut len);
        assert_eq!((rc, from, len, whole), (SHMBROKER_OK, 1, 100, big));
        // A null buffer with a length, a null length, a closed fd, a rank out of range.
        assert_eq!(
            shmbroker_recv(a, 1, null_mut(), 5, &mut len),
            SHMBROKER_E_MISUSE
        );
        assert_eq!(
            shmbroker_recv(a, 1, small.as_mut_ptr().cast(), 10, null_mut()),
            SHMBROKER_E_MISUSE
        );
        let mut fds = [0; 2];
        assert_eq!(
            shmbroker_exchange_fds(a, 987_654, fds.as_mut_ptr()),
            SHMBROKER_E_MISUSE
        );
        assert!(last_error().contains("fd 987654"), "{}", last_error());
        assert_eq!(
            shmbroker_send(a, 5, big.as_ptr().cast(), 1),
            SHMBROKER_E_MISUSE
        );
        assert!(last_error().contains("rank 5"), "{}", last_error());
        assert_eq!(
            shmbroker_all_gather(a, big.as_ptr().cast(), 8, null_mut()),
            SHMBROKER_E_MISUSE
        );
        // Nothing waiting: try_recv_any says AGAIN and arms the readiness fd, which
        // becomes readable once rank 1 sends; then try_recv_any takes the message.
        let mut from = u32::MAX;
        let rc = shmbroker_try_recv_any(a, &mut from, whole.as_mut_ptr().cast(), 100, &mut len);
        assert_eq!(rc, SHMBROKER_E_AGAIN, "{}", last_error());
        let fd = shmbroker_readiness_fd(a);
        assert!(fd >= 0);
        assert_eq!(
            shmbroker_send(b, 0, b"ping".as_ptr().cast(), 4),
            SHMBROKER_OK
        );
        let mut poll = nix::libc::pollfd {
            fd,
            events: nix::libc::POLLIN,
            revents: 0,
        };
        assert_eq!(
            nix::libc::poll(&mut poll, 1, 10_000),
            1,
            "the readiness fd woke"
        );
        let rc = shmbroker_try_recv_any(a, &mut from, whole.as_mut_ptr().cast(), 100, &mut len);
        assert_eq!((rc, from, &whole[..len]), (SHMBROKER_OK, 1, &b"ping"[..]));
        assert_eq!(shmbroker_readiness_fd(null()), -1);
        // Rank 1 leaves: rank 0 waiting for it is told, naming it.
        assert_eq!(shmbroker_close(b), SHMBROKER_OK);
        let rc = shmbroker_recv(a, 1, small.as_mut_ptr().cast(), small.len(), &mut len);
        assert_eq!(rc, SHMBROKER_E_PEER_LEFT, "{}", last_error());
        assert!(last_error().contains("rank 1"), "{}", last_error());
        assert_eq!(shmbroker_last_error_rank(), 1);
        assert_eq!(shmbroker_barrier(null_mut()), SHMBROKER_E_MISUSE);
        assert_eq!(shmbroker_last_error_rank(), -1, "a misuse names no rank");
        assert_eq!(shmbroker_close(a), SHMBROKER_OK);
    }
}

#[test]
fn collectives_and_fds_move_through_the_c_calls() {
    let (_dir, sessions) = world(2);
    let joins: Vec<_> = sessions
        .into_iter()
        .map(|s| {
            std::thread::spawn(move || {
                let s = s as *mut shmbroker_session;
                // SAFETY: a live session, used by this thread only; buffers as long as said.
                unsafe {
                    let rank = shmbroker_rank(s);
                    let mine = [rank as u8 + 1; 64];
                    let mut all = [0u8; 128];
                    assert_eq!(
                        shmbroker_all_gather(s, mine.as_ptr().cast(), 64, all.as_mut_ptr().cast()),
                        SHMBROKER_OK
                    );
                    assert_eq!((all[0], all[64]), (1, 2));
                    let mut at_root = [0u8; 128];
                    let out = if rank == 1 {
                        at_root.as_mut_ptr().cast()
                    } else {
                        null_mut()
                    };
                    assert_eq!(
                        shmbroker_gather(s, 1, mine.as_ptr().cast(), 64, out),
                        SHMBROKER_OK,
                        "{}",
                        last_error()
                    );
                    if rank == 1 {
                        assert_eq!((at_root[0], at_root[64], at_root[127]), (1, 2, 2));
                    }
                    // A part of another size is refused at the root, naming its sender.
                    let odd = [9u8; 65];
                    let part = if rank == 0 { &odd[..] } else { &mine[..] };
                    let rc = shmbroker_gather(s, 1, part.as_ptr().cast(), part.len(), out);
                    if rank == 1 {
                        assert_eq!(rc, SHMBROKER_E_PROTOCOL, "{}", last_error());
                        assert_eq!(shmbroker_last_error_rank(), 0);
                        assert!(last_error().contains("rank 0 gave 65 bytes"));
                    } else {
                        assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                    }
                    let mut word = if rank == 0 { *b"hello" } else { [0; 5] };
                    assert_eq!(
                        shmbroker_broadcast(s, 0, word.as_mut_ptr().cast(), 5),
                        SHMBROKER_OK
                    );
                    assert_eq!(&word, b"hello");
                    let file = std::fs::File::open("/proc/self/exe").unwrap();
                    let mut fds = [-1; 2];
                    assert_eq!(
                        shmbroker_exchange_fds(
                            s,
                            std::os::fd::AsRawFd::as_raw_fd(&file),
                            fds.as_mut_ptr()
                        ),
                        SHMBROKER_OK,
                        "{}",
                        last_error()
                    );
                    assert!(fds.iter().all(|&fd| fd >= 0));
                    for fd in fds {
                        nix::libc::close(fd);
                    }
                    let mut got = -1;
                    assert_eq!(
                        shmbroker_broadcast_fd(
                            s,
                            1,
                            std::os::fd::AsRawFd::as_raw_fd(&file),
                            &mut got
                        ),
                        SHMBROKER_OK,
                        "{}",
                        last_error()
                    );
                    assert!(got >= 0);
                    nix::libc::close(got);
                    assert_eq!(shmbroker_barrier(s), SHMBROKER_OK);
                    assert_eq!(shmbroker_close(s), SHMBROKER_OK);
                }
            })
        })
        .collect();
    for join in joins {
        join.join().unwrap();
    }
}

#[test]
fn a_peer_that_gave_an_all_reduce_up_is_named_with_its_own_code() {
    // Rank 1 gives a two-shot all-reduce up after 100 ms, waiting for rank 2, which comes at
    // 500 ms; ranks 0 and 2 (60 s) then wait for rank 1's result slice, and fail at once.
    static SEEN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    on_each_rank(3, |s| {
        // SAFETY: `s` is this thread's session, live until it is closed at the end.
        unsafe {
            let rank = shmbroker_rank(s);
            let mut data = vec![1.0f32; 1 << 20];
            // Every rank is in step before rank 1's short deadline starts.
            assert_eq!(shmbroker_barrier(s), SHMBROKER_OK, "{}", last_error());
            let timeout = if rank == 1 { 100 } else { 60_000 };
            assert_eq!(shmbroker_set_timeout(s, timeout), SHMBROKER_OK);
            if rank == 2 {
                std::thread::sleep(Duration::from_millis(500));
            }
            let rc = shmbroker_all_reduce(
                s,
                data.as_mut_ptr().cast(),
                data.len(),
                SHMBROKER_DTYPE_F32,
                SHMBROKER_OP_SUM,
            );
            if rank == 1 {
                assert_eq!(rc, SHMBROKER_E_TIMEOUT, "{}", last_error());
                assert_eq!(shmbroker_last_error_rank(), 2);
            } else {
                assert_eq!(rc, SHMBROKER_E_PEER_GAVE_UP, "{}", last_error());
                assert_eq!(shmbroker_last_error_rank(), 1);
                assert_eq!(
                    last_error(),
                    "shmbroker_all_reduce: peer rank 1 gave up on all_reduce #1 (its own call \
                     failed naming rank 2)"
                );
            }
            // No rank closes (which the others would see as leaving) before all have seen it;
            // a rank that failed an assertion above never comes, and the wait ends all the same.
            SEEN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while SEEN.load(std::sync::atomic::Ordering::SeqCst) < 3 {
                assert!(std::time::Instant::now() < deadline, "a rank never came");
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(shmbroker_close(s), SHMBROKER_OK);
        }
    });
}

#[test]
fn fd_batches_move_through_the_c_calls_and_a_count_that_disagrees_is_named() {
    on_each_rank(2, |s| {
        use std::os::fd::AsRawFd;
        // SAFETY: a live session of this thread's own, and arrays of the sizes given.
        unsafe {
            let rank = shmbroker_rank(s);
            let files: Vec<std::fs::File> = (0..3)
                .map(|i| tempfile_with(&[rank as u8 * 10 + i]))
                .collect();
            let raw: Vec<i32> = files.iter().map(AsRawFd::as_raw_fd).collect();
            let mut out = [-1; 6];
            assert_eq!(
                shmbroker_exchange_fd_batch(s, raw.as_ptr(), 3, out.as_mut_ptr()),
                SHMBROKER_OK,
                "{}",
                last_error()
            );
            let tags: Vec<u8> = out.iter().map(|&fd| first_byte_closing(fd)).collect();
            assert_eq!(tags, [0, 1, 2, 10, 11, 12]);
            // From rank 1, two fds; rank 0 passes none (NULL).
            let mut two = [-1; 2];
            let offered = if rank == 1 { raw.as_ptr() } else { null() };
            assert_eq!(
                shmbroker_broadcast_fd_batch(s, 1, offered, 2, two.as_mut_ptr()),
                SHMBROKER_OK,
                "{}",
                last_error()
            );
            let tags: Vec<u8> = two.iter().map(|&fd| first_byte_closing(fd)).collect();
            assert_eq!(tags, [10, 11]);
            // Rank 1 passes 3 fds, rank 0 two: both fail naming the other, and nothing
            // is written.
            let count = 2 + rank as usize;
            let mut out = [-1; 6];
            let rc = shmbroker_exchange_fd_batch(s, raw.as_ptr(), count, out.as_mut_ptr());
            assert_eq!(rc, SHMBROKER_E_PROTOCOL, "{}", last_error());
            assert_eq!(shmbroker_last_error_rank(), 1 - rank as i64);
            assert!(
                last_error().contains("same number of fds"),
                "{}",
                last_error()
            );
            assert!(out.iter().all(|&fd| fd == -1));
            // Misuse: a closed fd, a NULL array with a count.
            assert_eq!(
                shmbroker_exchange_fd_batch(s, [987_654].as_ptr(), 1, out.as_mut_ptr()),
                SHMBROKER_E_MISUSE
            );
            assert_eq!(
                shmbroker_exchange_fd_batch(s, null(), 1, out.as_mut_ptr()),
                SHMBROKER_E_MISUSE
            );
            assert_eq!(shmbroker_barrier(s), SHMBROKER_OK, "{}", last_error());
            assert_eq!(shmbroker_close(s), SHMBROKER_OK);
            drop(files);
        }
    });
}

/// Runs `work` for each rank of a new world of `size`, on a thread of its own with that rank's
/// session, and waits for every one (a panic on any thread fails the test).
fn on_each_rank(size: u32, work: fn(*mut shmbroker_session)) {
    let (_dir, sessions) = world(size);
    let joins: Vec<_> = sessions
        .into_iter()
        .map(|s| std::thread::spawn(move || work(s as *mut shmbroker_session)))
        .collect();
    for join in joins {
        join.join().unwrap();
    }
}

/// An anonymous file holding `bytes`.
fn tempfile_with(bytes: &[u8]) -> std::fs::File {
    use std::os::unix::fs::FileExt;
    let fd = shmbroker::queues::memfd::create_unsealed(c"capi-batch").unwrap();
    let file = std::fs::File::from(fd);
    file.write_all_at(bytes, 0).unwrap();
    file
}

/// The first byte of the file `fd` opens, which is then closed.
fn first_byte_closing(fd: i32) -> u8 {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::FileExt;
    assert!(fd >= 0);
    // SAFETY: a new fd the C call gave this test to own.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, 0).unwrap();
    byte[0]
}

/// A handle shared by threads as a pointer value (the C program's view of it).
#[derive(Clone, Copy)]
struct Shared(usize);

impl Shared {
    fn get(self) -> *mut shmbroker_session {
        self.0 as *mut shmbroker_session
    }
}

/// The message number `i` of `len` bytes, different in every byte.
fn numbered(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|at| (i * 31 + at) as u8).collect()
}

fn message_len(i: usize) -> usize {
    // Mostly one slot, now and then eager over several slots or pipelined in chunks.
    match i % 50 {
        7 => 3000,
        29 => 200_000,
        _ => 8 + i % 40,
    }
}

#[test]
fn one_handle_used_by_two_threads_loses_nothing_and_blames_no_one() {
    // The attack from the languages issue: on rank 0 a response thread receives while the
    // main thread sends and runs barriers, all on one handle. Every message is checked.
    const N: usize = 600;
    let (_dir, sessions) = world(2);
    let (a, b) = (Shared(sessions[0]), Shared(sessions[1]));
    let peer = std::thread::spawn(move || {
        let s = b.get();
        let mut buf = vec![0u8; 1 << 20];
        for i in 0..N {
            let mut len = 0;
            // SAFETY: a live session, used by this thread only; buffers as long as said.
            let rc = unsafe { shmbroker_recv(s, 0, buf.as_mut_ptr().cast(), buf.len(), &mut len) };
            assert_eq!(rc, SHMBROKER_OK, "rank 1 recv {i}: {}", last_error());
            assert_eq!(
                &buf[..len],
                numbered(i, message_len(i)),
                "rank 1 got message {i}"
            );
            let reply = numbered(i + 1, message_len(i));
            // SAFETY: as above.
            let rc = unsafe { shmbroker_send(s, 0, reply.as_ptr().cast(), reply.len()) };
            assert_eq!(rc, SHMBROKER_OK, "rank 1 send {i}: {}", last_error());
            if i % 10 == 9 {
                // SAFETY: as above.
                let rc = unsafe { shmbroker_barrier(s) };
                assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
            }
        }
        // SAFETY: as above, not used again.
        assert_eq!(unsafe { shmbroker_close(s) }, SHMBROKER_OK);
    });
    let responses = std::thread::spawn(move || {
        let s = a.get();
        let mut buf = vec![0u8; 1 << 20];
        for i in 0..N {
            let (mut from, mut len) = (u32::MAX, 0);
            // SAFETY: a live session; this thread is its only receiver; buffers as said.
            let rc = unsafe {
                shmbroker_recv_any(s, &mut from, buf.as_mut_ptr().cast(), buf.len(), &mut len)
            };
            assert_eq!(rc, SHMBROKER_OK, "rank 0 recv_any {i}: {}", last_error());
            assert_eq!(from, 1);
            assert_eq!(
                &buf[..len],
                numbered(i + 1, message_len(i)),
                "rank 0 got reply {i}"
            );
        }
    });
    let s = a.get();
    for i in 0..N {
        let message = numbered(i, message_len(i));
        // SAFETY: a live session, shared with the response thread (the handle allows it).
        let rc = unsafe { shmbroker_send(s, 1, message.as_ptr().cast(), message.len()) };
        assert_eq!(rc, SHMBROKER_OK, "rank 0 send {i}: {}", last_error());
        if i % 10 == 9 {
            // SAFETY: as above.
            let rc = unsafe { shmbroker_barrier(s) };
            assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
        }
    }
    responses.join().unwrap();
    peer.join().unwrap();
    // SAFETY: no other thread uses it any more; not used again.
    assert_eq!(unsafe { shmbroker_close(s) }, SHMBROKER_OK);
}

#[test]
fn a_second_receive_and_a_close_during_a_wait_are_busy_and_an_interrupt_frees_the_handle() {
    let (_dir, sessions) = world(2);
    let (a, b) = (Shared(sessions[0]), Shared(sessions[1]));
    let waiter = std::thread::spawn(move || {
        let mut buf = [0u8; 8];
        let mut len = 0;
        // SAFETY: a live session; buffers as long as said.
        let rc = unsafe { shmbroker_recv(a.get(), 1, buf.as_mut_ptr().cast(), 8, &mut len) };
        (rc, last_error())
    });
    // The waiter is receiving once it holds the receiving half.
    let s = a.get();
    let mut buf = [0u8; 8];
    let mut len = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    // SAFETY: a live session, shared with the waiter.
    while unsafe { &*s }.receiver.try_lock().is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the waiter never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: as above.
    let rc = unsafe { shmbroker_probe(s, 1, &mut len) };
    assert_eq!(rc, SHMBROKER_E_BUSY);
    assert!(
        last_error().contains("another thread is receiving"),
        "{}",
        last_error()
    );
    // SAFETY: as above.
    let rc = unsafe { shmbroker_recv(s, 1, buf.as_mut_ptr().cast(), 8, &mut len) };
    assert_eq!(rc, SHMBROKER_E_BUSY);
    // Sends and collectives go on beside the waiting receive.
    // SAFETY: as above.
    let rc = unsafe { shmbroker_send(s, 1, b"hi".as_ptr().cast(), 2) };
    assert_eq!(rc, SHMBROKER_OK);
    // Closing now would free what the waiter uses: refused, nothing freed.
    // SAFETY: as above.
    assert_eq!(unsafe { shmbroker_close(s) }, SHMBROKER_E_BUSY);
    assert!(
        last_error().contains("shmbroker_interrupt"),
        "{}",
        last_error()
    );
    // SAFETY: as above; interrupt takes a const pointer and may run in a signal handler.
    assert_eq!(unsafe { shmbroker_interrupt(s) }, SHMBROKER_OK);
    let (rc, message) = waiter.join().unwrap();
    assert_eq!(rc, SHMBROKER_E_INTERRUPTED, "{message}");
    // Nothing was lost by the interrupt: rank 1 got the message sent meanwhile, and a
    // message rank 1 sends now reaches rank 0.
    let mut got = [0u8; 8];
    // SAFETY: rank 1's session, used by this thread only now.
    unsafe {
        assert_eq!(
            shmbroker_recv(b.get(), 0, got.as_mut_ptr().cast(), 8, &mut len),
            SHMBROKER_OK
        );
        assert_eq!(&got[..len], b"hi");
        assert_eq!(
            shmbroker_send(b.get(), 0, b"back".as_ptr().cast(), 4),
            SHMBROKER_OK
        );
        assert_eq!(
            shmbroker_recv(s, 1, got.as_mut_ptr().cast(), 8, &mut len),
            SHMBROKER_OK
        );
        assert_eq!(&got[..len], b"back");
        assert_eq!(shmbroker_close(s), SHMBROKER_OK);
        assert_eq!(shmbroker_close(b.get()), SHMBROKER_OK);
    }
}

#[test]
fn reductions_scatter_and_all_to_all_through_the_c_abi() {
    let (_dir, sessions) = world(3);
    let joins: Vec<_> = sessions
        .into_iter()
        .map(|s| {
            std::thread::spawn(move || {
                let s = s as *mut shmbroker_session;
                // SAFETY: a live session, used by this thread alone, with buffers of the lengths
                // passed; closed once at the end.
                unsafe {
                    let rank = shmbroker_rank(s);
                    // Sums of f32, in place, small (one shot) and large (two shots).
                    for count in [3usize, 100_000] {
                        let mut data: Vec<f32> =
                            (0..count).map(|i| (i + rank as usize) as f32).collect();
                        let rc = shmbroker_all_reduce(
                            s,
                            data.as_mut_ptr().cast(),
                            count,
                            SHMBROKER_DTYPE_F32,
                            SHMBROKER_OP_SUM,
                        );
                        assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                        assert!(
                            data.iter()
                                .enumerate()
                                .all(|(i, &x)| x == (3 * i + 3) as f32)
                        );
                    }
                    // The maximum of i64 at root 2 only.
                    let mut data = [i64::from(rank) * 10, -1];
                    let rc = shmbroker_reduce(
                        s,
                        2,
                        data.as_mut_ptr().cast(),
                        2,
                        SHMBROKER_DTYPE_I64,
                        SHMBROKER_OP_MAX,
                    );
                    assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                    let want = if rank == 2 {
                        [20, -1]
                    } else {
                        [i64::from(rank) * 10, -1]
                    };
                    assert_eq!(data, want);
                    // Rank r gets block r of the XOR of every rank's three blocks.
                    let input: Vec<u16> = (0..6).map(|i| (i as u16) << rank).collect();
                    let mut block = [0u16; 2];
                    let rc = shmbroker_reduce_scatter(
                        s,
                        input.as_ptr().cast(),
                        block.as_mut_ptr().cast(),
                        2,
                        SHMBROKER_DTYPE_U16,
                        SHMBROKER_OP_BIT_XOR,
                    );
                    assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                    let xor = |i: u16| i ^ (i << 1) ^ (i << 2);
                    let r = rank as u16;
                    assert_eq!(block, [xor(2 * r), xor(2 * r + 1)]);
                    // An operation the type lacks, or a number that is none, is misuse.
                    let rc = shmbroker_all_reduce(
                        s,
                        data.as_mut_ptr().cast(),
                        2,
                        SHMBROKER_DTYPE_F64,
                        SHMBROKER_OP_BIT_AND,
                    );
                    assert_eq!(rc, SHMBROKER_E_MISUSE);
                    assert!(last_error().contains("bit_and"), "{}", last_error());
                    let rc = shmbroker_all_reduce(s, data.as_mut_ptr().cast(), 2, 99, 0);
                    assert_eq!(rc, SHMBROKER_E_MISUSE);
                    // Root 0 scatters 4-byte blocks; every rank swaps blocks with every other.
                    let blocks: Vec<u8> = (0..12).collect();
                    let mut mine = [0u8; 4];
                    let input = if rank == 0 {
                        blocks.as_ptr().cast()
                    } else {
                        null()
                    };
                    let rc = shmbroker_scatter(s, 0, input, mine.as_mut_ptr().cast(), 4);
                    assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                    let start = rank as u8 * 4;
                    assert_eq!(mine, [start, start + 1, start + 2, start + 3]);
                    let outgoing: Vec<u8> = (0..3u8).map(|to| rank as u8 * 10 + to).collect();
                    let mut incoming = [0u8; 3];
                    let rc = shmbroker_all_to_all(
                        s,
                        outgoing.as_ptr().cast(),
                        incoming.as_mut_ptr().cast(),
                        1,
                    );
                    assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                    let r = rank as u8;
                    assert_eq!(incoming, [r, 10 + r, 20 + r]);
                    // Rank r sends q + 1 bytes to rank q, and gets r + 1 from each.
                    let sends = [1usize, 2, 3];
                    let receives = [rank as usize + 1; 3];
                    let outgoing: Vec<u8> = (0..3u8)
                        .flat_map(|q| std::iter::repeat_n(r * 10 + q, usize::from(q) + 1))
                        .collect();
                    let mut incoming = vec![0u8; 3 * (rank as usize + 1)];
                    let rc = shmbroker_all_to_all_v(
                        s,
                        outgoing.as_ptr().cast(),
                        sends.as_ptr(),
                        incoming.as_mut_ptr().cast(),
                        receives.as_ptr(),
                    );
                    assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                    let want: Vec<u8> = (0..3u8)
                        .flat_map(|q| std::iter::repeat_n(q * 10 + r, rank as usize + 1))
                        .collect();
                    assert_eq!(incoming, want);
                    assert_eq!(shmbroker_close(s), SHMBROKER_OK);
                }
            })
        })
        .collect();
    for join in joins {
        join.join().unwrap();
    }
}

#[test]
fn groups_through_the_c_abi_and_a_member_that_disagrees_is_named() {
    let (_dir, sessions) = world(4);
    let joins: Vec<_> = sessions
        .into_iter()
        .map(|s| {
            std::thread::spawn(move || {
                let s = s as *mut shmbroker_session;
                // SAFETY: a live session, used by this thread alone, with buffers of the lengths
                // passed; groups freed once, the session closed once at the end.
                unsafe {
                    let rank = shmbroker_rank(s);
                    // The odd and even ranks, each numbered backwards.
                    let ranks: Vec<u32> = (0..4).rev().filter(|q| q % 2 == rank % 2).collect();
                    let mut g = null_mut();
                    let rc = shmbroker_group_create(s, ranks.as_ptr(), ranks.len(), &mut g);
                    assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                    assert_eq!(shmbroker_group_size(g), 2);
                    assert_eq!(shmbroker_group_rank(g), u32::from(rank < 2));
                    assert_eq!(shmbroker_group_world_rank(g, 0), i64::from(ranks[0]));
                    assert_eq!(shmbroker_group_world_rank(g, 2), -1);
                    let mut sum = [i64::from(rank), 1];
                    let rc = shmbroker_group_all_reduce(
                        s,
                        g,
                        sum.as_mut_ptr().cast(),
                        2,
                        SHMBROKER_DTYPE_I64,
                        SHMBROKER_OP_SUM,
                    );
                    assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                    assert_eq!(sum, [i64::from(ranks[0] + ranks[1]), 2]);
                    // Group rank 0's byte to both; then every member's byte, in group order.
                    let mut byte = [rank as u8];
                    let rc = shmbroker_group_broadcast(s, g, 0, byte.as_mut_ptr().cast(), 1);
                    assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                    assert_eq!(byte[0], ranks[0] as u8);
                    let mut both = [0u8; 2];
                    let mine = [rank as u8];
                    let rc = shmbroker_group_all_gather(
                        s,
                        g,
                        mine.as_ptr().cast(),
                        1,
                        both.as_mut_ptr().cast(),
                    );
                    assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                    assert_eq!(both, [ranks[0] as u8, ranks[1] as u8]);
                    assert_eq!(shmbroker_group_barrier(s, g), SHMBROKER_OK);
                    shmbroker_group_free(g);
                    // Rank 3 passes its ranks in another order: each member names the first
                    // member it hears from that disagrees (in its own order: rank 3 hears rank 2
                    // first), by code and by shmbroker_last_error_rank.
                    let everyone: [u32; 4] = if rank == 3 {
                        [3, 2, 1, 0]
                    } else {
                        [0, 1, 2, 3]
                    };
                    let mut g = null_mut();
                    let rc = shmbroker_group_create(s, everyone.as_ptr(), 4, &mut g);
                    assert_eq!(rc, SHMBROKER_E_PROTOCOL, "{}", last_error());
                    let named = if rank == 3 { 2 } else { 3 };
                    assert_eq!(shmbroker_last_error_rank(), named, "{}", last_error());
                    assert!(
                        last_error().contains("made a group of ranks"),
                        "{}",
                        last_error()
                    );
                    assert!(g.is_null());
                    // Nobody has died: shrinking gives the world, on which a barrier runs.
                    let mut g = null_mut();
                    assert_eq!(
                        shmbroker_shrink(s, &mut g),
                        SHMBROKER_OK,
                        "{}",
                        last_error()
                    );
                    assert_eq!(shmbroker_group_size(g), 4);
                    assert_eq!(shmbroker_group_rank(g), rank);
                    assert_eq!(shmbroker_group_barrier(s, g), SHMBROKER_OK);
                    shmbroker_group_free(g);
                    assert_eq!(shmbroker_close(s), SHMBROKER_OK);
                }
            })
        })
        .collect();
    for join in joins {
        join.join().unwrap();
    }
}

#[test]
fn loans_go_by_reference_come_back_and_a_message_that_is_no_loan_stays_queued() {
    let (_dir, sessions) = world(3);
    let (a, b, c) = (sessions[0], sessions[1], sessions[2]);
    let len = 1 << 20;
    let pattern = |i: usize| (i % 251) as u8;
    // Rank 0 lends 1 MiB to rank 1, twice (the block comes back between), from a thread.
    let lender = std::thread::spawn(move || {
        for round in 0..2usize {
            let (mut loan, mut data) = (null_mut(), null_mut());
            // SAFETY: rank 0's session, used by this thread alone; writable out pointers; the
            // loan's `len` bytes are written before it is sent, and not after.
            unsafe {
                assert_eq!(
                    shmbroker_loan_create(a as *mut _, len, &mut loan, &mut data),
                    SHMBROKER_OK,
                    "{}",
                    last_error()
                );
                let bytes = std::slice::from_raw_parts_mut(data.cast::<u8>(), len);
                for (i, byte) in bytes.iter_mut().enumerate() {
                    *byte = pattern(i + round);
                }
                assert_eq!(shmbroker_send_loan(a as *mut _, 1, loan), SHMBROKER_OK);
            }
        }
        // A plain message, where rank 1 asks for a loan next.
        // SAFETY: as above; 5 readable bytes.
        let rc = unsafe { shmbroker_send(a as *mut _, 1, b"plain".as_ptr().cast(), 5) };
        assert_eq!(rc, SHMBROKER_OK);
        // A loan given back unsent, and one too large for any outbox.
        let (mut loan, mut data) = (null_mut(), null_mut());
        // SAFETY: as above.
        unsafe {
            assert_eq!(
                shmbroker_loan_create(a as *mut _, 64, &mut loan, &mut data),
                SHMBROKER_OK
            );
            shmbroker_loan_free(loan);
            assert_eq!(
                shmbroker_loan_create(a as *mut _, usize::MAX / 2, &mut loan, &mut data),
                SHMBROKER_E_IO
            );
        }
    });
    for round in 0..2usize {
        let (mut view, mut data, mut got) = (null_mut(), null(), 0usize);
        // SAFETY: rank 1's session, this thread's alone; writable out pointers; the view's
        // bytes are read before it is freed.
        unsafe {
            assert_eq!(
                shmbroker_recv_loan(b as *mut _, 0, &mut view, &mut data, &mut got),
                SHMBROKER_OK,
                "{}",
                last_error()
            );
            assert_eq!(got, len);
            let bytes = std::slice::from_raw_parts(data.cast::<u8>(), got);
            assert!(
                bytes
                    .iter()
                    .enumerate()
                    .all(|(i, &byte)| byte == pattern(i + round))
            );
            shmbroker_loan_view_free(view);
        }
    }
    let (mut view, mut data, mut got) = (null_mut(), null(), 0usize);
    // SAFETY: as above; then a plain receive into 8 writable bytes.
    unsafe {
        assert_eq!(
            shmbroker_recv_loan(b as *mut _, 0, &mut view, &mut data, &mut got),
            SHMBROKER_E_MISUSE
        );
        let mut buffer = [0u8; 8];
        assert_eq!(
            shmbroker_recv(b as *mut _, 0, buffer.as_mut_ptr().cast(), 8, &mut got),
            SHMBROKER_OK,
            "the message that was no loan stayed queued: {}",
            last_error()
        );
        assert_eq!(&buffer[..got], b"plain");
    }
    lender.join().unwrap();
    // A broadcast loan from rank 2 to ranks 0 and 1.
    let joins: Vec<_> = [a, b, c]
        .into_iter()
        .enumerate()
        .map(|(rank, s)| {
            std::thread::spawn(move || {
                let (mut view, mut data, mut got) = (null_mut(), null(), 0usize);
                let mut loan = null_mut();
                // SAFETY: each session is used by its own thread alone; writable out pointers;
                // the root writes its loan before handing it over, the others read their view
                // before freeing it.
                unsafe {
                    if rank == 2 {
                        let mut start = null_mut();
                        assert_eq!(
                            shmbroker_loan_create(s as *mut _, 3, &mut loan, &mut start),
                            0
                        );
                        std::ptr::copy_nonoverlapping(b"abc".as_ptr(), start.cast::<u8>(), 3);
                    }
                    let rc = shmbroker_broadcast_loan(
                        s as *mut _,
                        2,
                        loan,
                        &mut view,
                        &mut data,
                        &mut got,
                    );
                    assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                    if rank == 2 {
                        assert!(view.is_null());
                    } else {
                        assert_eq!(std::slice::from_raw_parts(data.cast::<u8>(), got), b"abc");
                        shmbroker_loan_view_free(view);
                    }
                }
            })
        })
        .collect();
    for join in joins {
        join.join().unwrap();
    }
    for s in sessions {
        // SAFETY: live sessions, closed once, by this thread alone now.
        assert_eq!(unsafe { shmbroker_close(s as *mut _) }, SHMBROKER_OK);
    }
}

#[test]
fn a_loan_waiting_for_room_without_a_deadline_ends_on_an_interrupt_and_a_refused_one_comes_back() {
    let (_dir, sessions) = world_with_timeout(2, SHMBROKER_TIMEOUT_FOREVER);
    let (a, b) = (sessions[0], sessions[1]);
    let big = 40 << 20; // more than half of a 64 MiB outbox
    let (mut loan, mut data) = (null_mut(), null_mut());
    // SAFETY: each session is used by one thread at a time here; writable out pointers.
    unsafe {
        // Refused (a rank out of range): the loan is consumed and its block comes back, so a
        // second one as large fits at once.
        assert_eq!(
            shmbroker_loan_create(a as *mut _, big, &mut loan, &mut data),
            0
        );
        assert_eq!(
            shmbroker_send_loan(a as *mut _, 7, loan),
            SHMBROKER_E_MISUSE
        );
        assert_eq!(
            shmbroker_loan_create(a as *mut _, big, &mut loan, &mut data),
            0
        );
        // Handed to rank 1, which holds it: no room for another.
        assert_eq!(shmbroker_send_loan(a as *mut _, 1, loan), SHMBROKER_OK);
    }
    let waiter = std::thread::spawn(move || {
        let (mut loan, mut data) = (null_mut(), null_mut());
        // SAFETY: rank 0's session; this thread is its only caller meanwhile.
        let rc = unsafe { shmbroker_loan_create(a as *mut _, big, &mut loan, &mut data) };
        (rc, loan.is_null() && data.is_null(), last_error())
    });
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: interrupt takes a live session from any thread.
    assert_eq!(unsafe { shmbroker_interrupt(a as *const _) }, SHMBROKER_OK);
    let (rc, cleared, message) = waiter.join().unwrap();
    assert_eq!(rc, SHMBROKER_E_INTERRUPTED, "{message}");
    assert!(cleared, "a failed loan leaves NULL behind");
    let (mut view, mut seen, mut len) = (null_mut(), null(), 0usize);
    // SAFETY: rank 1's session, then rank 0's, each by this thread alone now; writable outs.
    unsafe {
        assert_eq!(
            shmbroker_recv_loan(b as *mut _, 0, &mut view, &mut seen, &mut len),
            0
        );
        assert_eq!(len, big);
        shmbroker_loan_view_free(view);
        // Rank 1 gives the block back with its next call; then rank 0 has room again.
        assert_eq!(
            shmbroker_send(b as *mut _, 0, b"done".as_ptr().cast(), 4),
            0
        );
        assert_eq!(shmbroker_clear_interrupt(a as *mut _), 0);
        let mut buffer = [0u8; 4];
        assert_eq!(
            shmbroker_recv(a as *mut _, 1, buffer.as_mut_ptr().cast(), 4, &mut len),
            0
        );
        assert_eq!(
            shmbroker_loan_create(a as *mut _, big, &mut loan, &mut data),
            0
        );
        shmbroker_loan_free(loan);
    }
    for s in sessions {
        // SAFETY: live sessions, closed once, by this thread alone now.
        assert_eq!(unsafe { shmbroker_close(s as *mut _) }, SHMBROKER_OK);
    }
}

#[test]
fn gpu_handles_with_their_fds_reach_every_rank_and_a_kind_that_disagrees_is_misuse() {
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::fs::FileExt;
    let (_dir, sessions) = world(3);
    let joins: Vec<_> = sessions
        .iter()
        .copied()
        .enumerate()
        .map(|(rank, s)| {
            std::thread::spawn(move || {
                // Host memory in a memfd stands in for device memory (no GPU here).
                let memfd = nix::sys::memfd::memfd_create(
                    c"gpu-handle",
                    nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
                )
                .unwrap();
                let mut file = std::fs::File::from(memfd);
                std::io::Write::write_all(&mut file, format!("memory of rank {rank}").as_bytes())
                    .unwrap();
                let mut own = shmbroker_gpu_handle {
                    kind: SHMBROKER_GPU_HOST_MEMFD,
                    flags: 0,
                    device_uuid: [rank as u8; 16],
                    handle: [0; 64],
                    size: 15,
                    offset: 0,
                    buffer_id: 100 + rank as u64,
                };
                let mut handles = [own; 3];
                let mut fds = [-2; 3];
                let (mut chosen, mut used) = (-1, -1);
                // SAFETY: this thread's session alone; two writable ints.
                let rc = unsafe { shmbroker_fd_transport(s as *mut _, &mut chosen, &mut used) };
                assert_eq!(rc, SHMBROKER_OK);
                assert_eq!(
                    (chosen, used),
                    (SHMBROKER_FD_TRANSPORT_AUTO, SHMBROKER_FD_TRANSPORT_NONE)
                );
                // SAFETY: this thread's session alone; a readable handle, 3 writable entries.
                let rc = unsafe {
                    shmbroker_all_gather_gpu_handles(
                        s as *mut _,
                        &own,
                        file.as_raw_fd(),
                        handles.as_mut_ptr(),
                        fds.as_mut_ptr(),
                    )
                };
                assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                // SAFETY: as above; `chosen` may be NULL.
                let rc =
                    unsafe { shmbroker_fd_transport(s as *mut _, std::ptr::null_mut(), &mut used) };
                assert_eq!(rc, SHMBROKER_OK);
                // pidfd_getfd unless the kernel refuses it (Yama, a container): then relay.
                assert!(
                    used == SHMBROKER_FD_TRANSPORT_PIDFD || used == SHMBROKER_FD_TRANSPORT_RELAY
                );
                for (peer, (handle, fd)) in handles.iter().zip(fds).enumerate() {
                    assert_eq!(handle.buffer_id, 100 + peer as u64);
                    assert_eq!(handle.device_uuid, [peer as u8; 16]);
                    // SAFETY: a new fd the call handed over, owned here from now on.
                    let theirs = unsafe { std::fs::File::from_raw_fd(fd) };
                    // Every thread holds a dup of the same open file, so they share one
                    // offset: read at an offset (pread), never seek-then-read.
                    let mut text = [0u8; 64];
                    let n = theirs.read_at(&mut text, 0).unwrap();
                    assert_eq!(&text[..n], format!("memory of rank {peer}").as_bytes());
                }
                // Rank 1's handle to every rank; then a legacy CUDA handle with an fd: misuse.
                let (mut got, mut got_fd) = (own, -2);
                let offered = if rank == 1 {
                    &own as *const _
                } else {
                    std::ptr::null()
                };
                let fd = if rank == 1 { file.as_raw_fd() } else { -1 };
                // SAFETY: as above; a writable handle and int.
                let rc = unsafe {
                    shmbroker_broadcast_gpu_handle(
                        s as *mut _,
                        1,
                        offered,
                        fd,
                        &mut got,
                        &mut got_fd,
                    )
                };
                assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                assert_eq!(got.buffer_id, 101);
                // SAFETY: a new fd the call handed over.
                drop(unsafe { std::fs::File::from_raw_fd(got_fd) });
                own.kind = SHMBROKER_GPU_CUDA_IPC_MEMORY;
                // SAFETY: as above.
                let rc = unsafe {
                    shmbroker_all_gather_gpu_handles(
                        s as *mut _,
                        &own,
                        file.as_raw_fd(),
                        handles.as_mut_ptr(),
                        fds.as_mut_ptr(),
                    )
                };
                assert_eq!(rc, SHMBROKER_E_MISUSE);
                assert!(last_error().contains("carries no fd"), "{}", last_error());
            })
        })
        .collect();
    for join in joins {
        join.join().unwrap();
    }
    for s in sessions {
        // SAFETY: live sessions, closed once, by this thread alone now.
        assert_eq!(unsafe { shmbroker_close(s as *mut _) }, SHMBROKER_OK);
    }
}

#[test]
fn the_deadline_set_on_a_session_holds_for_later_calls_on_either_half() {
    let (_dir, sessions) = world(2);
    let (a, b) = (sessions[0], sessions[1]);
    let mut buffer = [0u8; 8];
    let mut len = 0usize;
    // SAFETY: each session is used by this thread alone; 8 writable bytes and a length.
    unsafe {
        assert_eq!(shmbroker_set_timeout(a as *mut _, 0), SHMBROKER_E_MISUSE);
        assert_eq!(shmbroker_set_timeout(a as *mut _, 50), SHMBROKER_OK);
        let started = std::time::Instant::now();
        let rc = shmbroker_recv(a as *mut _, 1, buffer.as_mut_ptr().cast(), 8, &mut len);
        assert_eq!(rc, SHMBROKER_E_TIMEOUT, "{}", last_error());
        assert!(last_error().contains("50ms"), "{}", last_error());
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(
            shmbroker_set_timeout(a as *mut _, SHMBROKER_TIMEOUT_FOREVER),
            0
        );
    }
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: rank 1's session, this thread's alone; 4 readable bytes.
        unsafe { shmbroker_send(b as *mut _, 0, b"late".as_ptr().cast(), 4) }
    });
    // SAFETY: as above.
    let rc = unsafe { shmbroker_recv(a as *mut _, 1, buffer.as_mut_ptr().cast(), 8, &mut len) };
    assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
    assert_eq!(&buffer[..len], b"late");
    assert_eq!(late.join().unwrap(), SHMBROKER_OK);
    for s in sessions {
        // SAFETY: live sessions, closed once, by this thread alone now.
        assert_eq!(unsafe { shmbroker_close(s as *mut _) }, SHMBROKER_OK);
    }
}

/// Lines `record_log` was given: (the `user` pointer's value, level, target, message).
static LOGGED: std::sync::Mutex<Vec<(usize, c_int, String, String)>> =
    std::sync::Mutex::new(Vec::new());

unsafe extern "C" fn record_log(
    user: *mut std::ffi::c_void,
    level: c_int,
    target: *const std::ffi::c_char,
    message: *const std::ffi::c_char,
) {
    // SAFETY: shmbroker_set_log passes NUL-terminated strings that live for this call.
    let (target, message) = unsafe { (CStr::from_ptr(target), CStr::from_ptr(message)) };
    LOGGED.lock().unwrap().push((
        user as usize,
        level,
        target.to_string_lossy().into_owned(),
        message.to_string_lossy().into_owned(),
    ));
}

#[test]
fn log_events_reach_the_callback_with_its_user_pointer_until_it_is_switched_off() {
    let mut user = 0u8;
    let user = (&raw mut user).cast::<std::ffi::c_void>();
    // SAFETY: a level out of range changes nothing.
    let rc = unsafe { shmbroker_set_log(9, Some(record_log), user) };
    assert_eq!(rc, SHMBROKER_E_MISUSE);
    assert!(last_error().contains("log level 9"), "{}", last_error());
    // SAFETY: a thread-safe callback that stays callable for the whole test binary.
    let rc = unsafe { shmbroker_set_log(SHMBROKER_LOG_INFO, Some(record_log), user) };
    assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
    let (_dir, sessions) = world(2);
    let joins: Vec<_> = sessions
        .iter()
        .map(|&s| {
            std::thread::spawn(move || {
                let file = std::fs::File::open("/proc/self/exe").unwrap();
                let mut fds = [-1; 2];
                // SAFETY: this thread's session alone; an open fd; two writable ints.
                let rc = unsafe {
                    shmbroker_exchange_fds(
                        s as *mut _,
                        std::os::fd::AsRawFd::as_raw_fd(&file),
                        fds.as_mut_ptr(),
                    )
                };
                assert_eq!(rc, SHMBROKER_OK, "{}", last_error());
                for fd in fds {
                    // SAFETY: fds the call handed over, closed once.
                    unsafe { nix::libc::close(fd) };
                }
            })
        })
        .collect();
    for join in joins {
        join.join().unwrap();
    }
    for s in sessions {
        // SAFETY: live sessions, closed once, by this thread alone now.
        assert_eq!(unsafe { shmbroker_close(s as *mut _) }, SHMBROKER_OK);
    }
    // SAFETY: switching off needs no callback.
    let rc = unsafe { shmbroker_set_log(SHMBROKER_LOG_OFF, None, std::ptr::null_mut()) };
    assert_eq!(rc, SHMBROKER_OK);
    let logged = std::mem::take(&mut *LOGGED.lock().unwrap());
    // Each rank logs how its fds moved (other tests of this binary may log meanwhile too).
    let transports: Vec<_> = logged
        .iter()
        .filter(|(_, _, _, message)| message.contains("fd transport: "))
        .collect();
    assert!(transports.len() >= 2, "{logged:?}");
    for (got_user, level, target, message) in transports {
        assert_eq!(*got_user, user as usize);
        assert!(
            *level == SHMBROKER_LOG_INFO || *level == SHMBROKER_LOG_WARN,
            "{message}"
        );
        assert_eq!(target, "shmbroker::session::fds");
        assert!(message.contains("rank="), "{message}");
    }
    // Nothing more once switched off (an event other threads were logging as it was switched
    // off may still land: only this one, logged after, is checked).
    tracing::warn!("after the log was switched off");
    assert!(
        !LOGGED
            .lock()
            .unwrap()
            .iter()
            .any(|(_, _, _, message)| message.contains("after the log was switched off"))
    );
}

#[test]
fn mismatched_collectives_fail_at_once_naming_both_calls() {
    // No deadline: rank 0 in a broadcast from rank 1 and rank 1 gathering at itself each wait
    // for the other, until each sees what the other published.
    let (_dir, sessions) = world_with_timeout(2, SHMBROKER_TIMEOUT_FOREVER);
    let (zero, one) = (sessions[0], sessions[1]);
    let seen = std::sync::Arc::new(std::sync::Barrier::new(2));
    let seen_by_one = std::sync::Arc::clone(&seen);
    let gatherer = std::thread::spawn(move || {
        let s = one as *mut shmbroker_session;
        let mut out = [0u8; 8];
        // SAFETY: rank 1's session, used by this thread alone; 4 readable and 8 writable bytes.
        let rc =
            unsafe { shmbroker_gather(s, 1, b"mine".as_ptr().cast(), 4, out.as_mut_ptr().cast()) };
        let said = (rc, shmbroker_last_error_rank(), last_error());
        // Both stay in no other call until both have seen it.
        seen_by_one.wait();
        said
    });
    let s = zero as *mut shmbroker_session;
    let mut buffer = [0u8; 4];
    let started = std::time::Instant::now();
    // SAFETY: rank 0's session, used by this thread alone; 4 writable bytes.
    let rc = unsafe { shmbroker_broadcast(s, 1, buffer.as_mut_ptr().cast(), 4) };
    assert_eq!(rc, SHMBROKER_E_PROTOCOL, "{}", last_error());
    assert_eq!(shmbroker_last_error_rank(), 1);
    assert!(
        last_error().contains("rank 1 called gather #0 while this rank called broadcast #0"),
        "{}",
        last_error()
    );
    seen.wait();
    let (rc, rank, text) = gatherer.join().unwrap();
    assert_eq!((rc, rank), (SHMBROKER_E_PROTOCOL, 0), "{text}");
    assert!(
        text.contains("rank 0 called broadcast #0 while this rank called gather #0"),
        "{text}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    for s in sessions {
        // SAFETY: live sessions, closed once, by this thread alone now.
        assert_eq!(unsafe { shmbroker_close(s as *mut _) }, SHMBROKER_OK);
    }
}

/// A socket listening at `path` as effective uid `uid`: `SO_PEERCRED` names that uid to whoever
/// connects. Only this thread's uid changes (a raw `setresuid`, not libc's, which changes every
/// thread's), and it is put back before the thread ends. Needs root.
fn listen_as(uid: u32, path: std::path::PathBuf) -> std::os::unix::net::UnixListener {
    std::thread::spawn(move || {
        let set_euid = |euid: u32| {
            let keep = nix::libc::uid_t::MAX;
            // SAFETY: setresuid takes three integers; only the effective uid changes, and only
            // this thread's (the raw system call).
            let rc = unsafe { nix::libc::syscall(nix::libc::SYS_setresuid, keep, euid, keep) };
            assert_eq!(rc, 0, "setresuid: {}", std::io::Error::last_os_error());
        };
        set_euid(uid);
        let listener = std::os::unix::net::UnixListener::bind(&path);
        set_euid(0);
        listener.unwrap()
    })
    .join()
    .unwrap()
}

#[test]
fn a_broker_of_another_user_is_refused_naming_its_uid() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: listening as another uid needs root");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = shmbroker_sys::TempDir::new("capi-squat").unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let socket = dir.path().join("broker.sock");
    // It never answers: without the check, the logon would wait for it to its deadline.
    let _squatter = listen_as(65534, socket.clone());
    let path = CString::new(socket.to_str().unwrap()).unwrap();
    let mut s = null_mut();
    let started = std::time::Instant::now();
    // SAFETY: a NUL-terminated path and a writable out pointer.
    let rc = unsafe { shmbroker_connect(path.as_ptr(), 0, 60_000, &mut s) };
    assert_eq!(rc, SHMBROKER_E_LOGON);
    assert!(s.is_null());
    let error = last_error();
    assert!(
        error.contains("runs as uid 65534") && error.contains("SHMBROKER_BROKER_UID"),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(30), "{error}");
}
