//! Rings between real processes: the test process on one end, the `shmbroker ring-peer` binary on
//! the other, the ring's memfd inherited at fd 3. Every child is waited for with a deadline and
//! killed on the way out (`ChildGuard`), so no failure here can hang or leak a process.

use shmbroker::queues::Waiting;
use shmbroker::queues::{Producer, create};
use shmbroker_test_support::process::spawn_with_fds;
use std::io::Read;
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::time::Duration;

const CHILD_DEADLINE: Duration = Duration::from_secs(300);
const SEND_TIMEOUT: Duration = Duration::from_secs(60);
const BATCH: usize = 64;

/// The payload the peer expects with message `i` (splitmix64's output function), written out
/// again here so that the test does not trust the binary's own copy.
fn mix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn peer() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_shmbroker-under-test"));
    command.arg("ring-peer");
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

fn output_of(mut child: shmbroker_test_support::process::ChildGuard) -> (bool, String) {
    // Read stdout to the end first (the child exits after printing), bounded by the wait below.
    let mut stdout = String::new();
    if let Some(pipe) = child.stdout() {
        let _ = pipe.read_to_string(&mut stdout);
    }
    let status = child
        .wait_or_kill(CHILD_DEADLINE)
        .expect("child did not finish");
    (status.success(), stdout)
}

/// Streams `count` messages [i, mix(i)] to a child process, in batches, and checks the checksum
/// the child computed over what it received against the one computed here over what was sent.
fn stream_to_child(count: u64, spin_limit: u32) {
    let ring = create::<[u64; 2]>(4096).unwrap();
    let mut command = peer();
    command.args(["sink", "--count", &count.to_string(), "--batch", "64"]);
    command.args(["--spin", &spin_limit.to_string()]);
    let child = spawn_with_fds(&mut command, &[ring.as_fd()]).unwrap();
    let mut tx = Producer::<[u64; 2]>::join(ring.as_fd()).unwrap();
    drop(ring);
    tx.set_waiting(Waiting::Spin(spin_limit));

    let mut checksum = 0u64;
    let mut batch = [[0u64; 2]; BATCH];
    let mut next = 0u64;
    while next < count {
        let n = BATCH.min((count - next) as usize);
        for message in &mut batch[..n] {
            *message = [next, mix(next)];
            checksum = (checksum ^ message[1]).rotate_left(7).wrapping_add(next);
            next += 1;
        }
        tx.send_batch_timeout(&batch[..n], SEND_TIMEOUT)
            .unwrap_or_else(|e| panic!("sending message {next}: {e}"));
    }
    drop(tx);
    let (ok, stdout) = output_of(child);
    assert!(ok, "child failed; stdout: {stdout}");
    assert_eq!(
        stdout.trim(),
        format!("received {count} checksum {checksum:#018x}")
    );
}

#[test]
fn ten_million_messages_to_another_process_spinning() {
    stream_to_child(10_000_000, u32::MAX);
}

#[test]
fn ten_million_messages_to_another_process_parked() {
    stream_to_child(10_000_000, 0);
}

#[test]
fn a_process_joining_with_another_message_type_is_refused() {
    // The peer reads [u64; 2] (16 bytes); this ring carries u64.
    let ring = create::<u64>(16).unwrap();
    let mut command = peer();
    command.args(["sink", "--count", "1"]);
    let child = spawn_with_fds(&mut command, &[ring.as_fd()]).unwrap();
    let stderr = stderr_of_failure(child);
    assert!(
        stderr.contains("ring message size mismatch: expected 16 bytes, found 8"),
        "stderr: {stderr}"
    );
}

/// Waits (with a deadline) for a child that must fail, and returns what it said on stderr.
fn stderr_of_failure(mut child: shmbroker_test_support::process::ChildGuard) -> String {
    let status = child
        .wait_timeout(CHILD_DEADLINE)
        .unwrap()
        .expect("child hung");
    assert!(!status.success(), "child should have failed");
    let mut stderr = String::new();
    let _ = child
        .take_stderr()
        .expect("stderr was piped")
        .read_to_string(&mut stderr);
    stderr
}

#[test]
fn a_peer_gives_up_with_an_error_when_its_partner_goes_quiet() {
    // The sink wants two messages; only one arrives and the sender then closes its end. The sink
    // must report the early close, not wait forever.
    let ring = create::<[u64; 2]>(16).unwrap();
    let mut command = peer();
    command.args(["sink", "--count", "2"]);
    let child = spawn_with_fds(&mut command, &[ring.as_fd()]).unwrap();
    let mut tx = Producer::<[u64; 2]>::join(ring.as_fd()).unwrap();
    tx.try_send([0, mix(0)]).unwrap();
    drop(tx);
    let stderr = stderr_of_failure(child);
    assert!(
        stderr.contains("after 1 of 2 messages: ring producer is gone"),
        "stderr: {stderr}"
    );
}

#[test]
fn the_demo_runs_to_completion() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_shmbroker-under-test"));
    command.args([
        "demo",
        "--workers",
        "3",
        "--messages",
        "20000",
        "--round-trips",
        "2000",
    ]);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = spawn_with_fds(&mut command, &[]).unwrap();
    let (ok, stdout) = output_of(child);
    assert!(ok, "demo failed; stdout: {stdout}");
    assert_eq!(stdout.matches("all passed").count(), 3, "{stdout}");
    assert!(
        stdout.contains("collectives across 3 worker processes on"),
        "{stdout}"
    );
    assert!(stdout.contains("barrier"), "{stdout}");
    assert!(
        stdout.contains("all 3 workers done; socket removed"),
        "{stdout}"
    );
    assert!(stdout.contains("all 20000 answers checked"), "{stdout}");
    assert!(
        stdout.contains("ring A closed after 22000 messages; all drained"),
        "{stdout}"
    );
    assert!(stdout.contains("child exited cleanly"), "{stdout}");
}
