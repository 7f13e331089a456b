//! Waiting without a deadline (`Duration::MAX`), with real processes: a wait outlasts a slow
//! peer and ends when the peer comes, for messages and collectives alike, and a peer's death
//! still ends it at once, naming the rank. Every rank is waited for with the tests' deadline.

mod common;

use shmbroker::ReduceOp;
use shmbroker::session::{Error, Session};
use std::time::Duration;

/// One rank: what `SHMBROKER_TEST_SCENARIO` says.
#[test]
#[ignore = "a rank of the deadline tests, which start it"]
fn deadlines_rank() {
    let Ok(scenario) = std::env::var("SHMBROKER_TEST_SCENARIO") else {
        return;
    };
    let socket = std::env::var("SHMBROKER_TEST_SOCKET").unwrap();
    let rank: u32 = std::env::var("SHMBROKER_TEST_RANK")
        .unwrap()
        .parse()
        .unwrap();
    // Logging on without a deadline too.
    let mut session = Session::connect(&socket, Some(rank), Duration::MAX).unwrap();
    session.set_timeout(Duration::MAX);
    let slow = Duration::from_millis(300);
    match scenario.as_str() {
        "slow-peer" => {
            if rank == 1 {
                std::thread::sleep(slow);
                session.send(0, b"late").unwrap();
                std::thread::sleep(slow);
                let mut data = [1u64; 3];
                session.all_reduce(&mut data, ReduceOp::Sum).unwrap();
                std::thread::sleep(slow);
                session.barrier().unwrap();
                return;
            }
            // (Each wait ends with what the slow peer did only after it slept: no deadline
            // passed early, and adding Duration::MAX to the clock did not panic.)
            assert_eq!(session.recv_timeout(1, Duration::MAX).unwrap(), b"late");
            let mut data = [2u64; 3];
            session
                .all_reduce_timeout(&mut data, ReduceOp::Sum, Duration::MAX)
                .unwrap();
            assert_eq!(data, [3; 3]);
            session.barrier_timeout(Duration::MAX).unwrap();
        }
        "death" => {
            session.barrier().unwrap();
            if rank == 1 {
                std::thread::sleep(slow);
                nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).unwrap();
            }
            let error = session.barrier_timeout(Duration::MAX).unwrap_err();
            assert!(matches!(error, Error::PeerLost { rank: 1, .. }), "{error}");
            // What rank 1 last published: the barrier it finished before it slept and died.
            assert!(
                error.to_string().contains(
                    "was lost (its process exited without leaving): rank 1 was in no call \
                     (its last, barrier #0, finished "
                ),
                "{error}"
            );
            let error = session.recv_timeout(1, Duration::MAX).unwrap_err();
            assert!(matches!(error, Error::PeerLost { rank: 1, .. }), "{error}");
        }
        // Rank 0 calls broadcast (root 1) and rank 1 gather (root 1): each waits for the other,
        // forever, unless the mismatch is seen. With no deadline (`forever-mismatch`) or a long
        // one (`mismatch`), both fail at once, naming both calls.
        "mismatch" | "forever-mismatch" => {
            if scenario == "mismatch" {
                session.set_timeout(Duration::from_secs(60));
            }
            session.barrier().unwrap();
            let started = std::time::Instant::now();
            let error = if rank == 0 {
                session.broadcast(1, None).unwrap_err()
            } else {
                session.gather(1, b"mine").unwrap_err()
            };
            let (mine, theirs) = if rank == 0 {
                ("broadcast #1", "gather #1")
            } else {
                ("gather #1", "broadcast #1")
            };
            let peer = 1 - rank;
            assert_eq!(
                error.to_string(),
                format!("rank {peer} called {theirs} while this rank called {mine}")
            );
            assert!(
                matches!(error, Error::CollectiveMismatch { .. }),
                "{error:?}"
            );
            // Far sooner than any deadline (the look comes every 100 ms).
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{:?}",
                started.elapsed()
            );
            // Both stay, making no other call (which would replace the failed call's record that
            // the other rank may still need to see), until both have seen it.
            let dir = std::path::Path::new(&socket).parent().unwrap();
            std::fs::write(dir.join(format!("{scenario}-seen-{rank}")), b"").unwrap();
            let other = dir.join(format!("{scenario}-seen-{peer}"));
            while !other.exists() {
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "rank {peer} never saw it"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        other => panic!("no scenario {other}"),
    }
}

fn run(name: &str, scenario: &str) -> Vec<(bool, String)> {
    common::run_ranks("deadlines_rank", name, 2, scenario, &[])
}

#[test]
fn with_no_deadline_a_wait_lasts_until_the_peer_comes() {
    for (rank, (ok, stderr)) in run("forever-slow", "slow-peer").into_iter().enumerate() {
        assert!(ok, "rank {rank}: {stderr}");
    }
}

#[test]
fn mismatched_collectives_fail_at_once_naming_both_calls() {
    for scenario in ["mismatch", "forever-mismatch"] {
        for (rank, (ok, stderr)) in run(scenario, scenario).into_iter().enumerate() {
            assert!(ok, "{scenario}, rank {rank}: {stderr}");
        }
    }
}

#[test]
fn with_no_deadline_a_death_still_ends_the_wait_naming_the_rank() {
    let ranks = run("forever-death", "death");
    assert!(ranks[0].0, "rank 0: {}", ranks[0].1);
    assert!(!ranks[1].0, "rank 1 was to die");
}
