//! Waiting without a deadline (`Duration::MAX`), with real processes: a wait outlasts a slow
//! peer and ends when the peer comes, for messages and collectives alike, and a peer's death
//! still ends it at once, naming the rank. Every rank is waited for with the tests' deadline.

mod common;

use shmbroker::Collectives;
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
            assert_eq!(
                session.with_timeout(Duration::MAX).recv(1).unwrap(),
                b"late"
            );
            let mut data = [2u64; 3];
            session
                .with_timeout(Duration::MAX)
                .all_reduce(&mut data, ReduceOp::Sum)
                .unwrap();
            assert_eq!(data, [3; 3]);
            session.with_timeout(Duration::MAX).barrier().unwrap();
        }
        "death" => {
            session.barrier().unwrap();
            if rank == 1 {
                std::thread::sleep(slow);
                nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).unwrap();
            }
            let error = session.with_timeout(Duration::MAX).barrier().unwrap_err();
            assert!(matches!(error, Error::PeerLost { rank: 1, .. }), "{error}");
            // What rank 1 last published: the barrier it finished before it slept and died.
            assert!(
                error.to_string().contains(
                    "was lost (its process exited without leaving): rank 1 was in no call \
                     (its last, barrier #0, finished "
                ),
                "{error}"
            );
            let error = session.with_timeout(Duration::MAX).recv(1).unwrap_err();
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
            stay_until_all_have_seen(&socket, &scenario, rank, 2, started);
        }
        // Rank 1 gives a two-shot all-reduce up after 100 ms, waiting for rank 2, which comes
        // at 500 ms; ranks 0 and 2 have no deadline and then wait for rank 1's result slice,
        // which never comes. Both fail at once, naming rank 1 and, as its word, rank 2, though
        // rank 1 has made another call since (a send to rank 0: its failed collective stays
        // recorded).
        "gave-up" => {
            session.barrier().unwrap();
            let mut data = vec![1.0f32; 1 << 20];
            if rank == 2 {
                std::thread::sleep(Duration::from_millis(500));
            }
            let started = std::time::Instant::now();
            let result = if rank == 1 {
                session
                    .with_timeout(Duration::from_millis(100))
                    .all_reduce(&mut data, ReduceOp::Sum)
            } else {
                session.all_reduce(&mut data, ReduceOp::Sum)
            };
            let error = result.unwrap_err();
            if rank == 1 {
                assert!(
                    matches!(&error, Error::Timeout { waiting_for, .. } if waiting_for == &[2]),
                    "{error:?}"
                );
                session.send(0, b"after").unwrap();
            } else {
                assert!(
                    matches!(
                        error,
                        Error::PeerGaveUp {
                            rank: 1,
                            op: "all_reduce",
                            named: Some(2),
                            ..
                        }
                    ),
                    "{error:?}"
                );
                assert_eq!(
                    error.to_string(),
                    "peer rank 1 gave up on all_reduce #1 (its own call failed naming rank 2)"
                );
                assert_eq!(error.rank(), Some(1));
                assert!(started.elapsed() < Duration::from_secs(20), "{error}");
                if rank == 0 {
                    assert_eq!(session.recv(1).unwrap(), b"after");
                }
            }
            stay_until_all_have_seen(&socket, &scenario, rank, 3, started);
        }
        // A broadcast down the binomial tree of 10 ranks (root 0 sends to 1, 2, 4 and 8; 4 to 5
        // and 6; 6 to 7): rank 4 gives up after 100 ms, before root 0 comes at 500 ms. Its
        // subtree fails link by link, each naming its parent: 5 and 6 name rank 4 (which named
        // rank 0), 7 names rank 6 (which named rank 4). The others get the data.
        // "gave-up-next": rank 4 then goes straight on to a broadcast of its own, whose message
        // reaches ranks 5 and 6 where the first one's was due. They still name rank 4 as having
        // given the first one up, not a mismatch.
        "gave-up-tree" | "gave-up-next" => {
            session.barrier().unwrap();
            if rank == 0 {
                std::thread::sleep(Duration::from_millis(500));
            }
            let started = std::time::Instant::now();
            let data = (rank == 0).then_some(&b"down the tree"[..]);
            let result = if rank == 4 {
                let result = session
                    .with_timeout(Duration::from_millis(100))
                    .broadcast(0, data);
                if scenario == "gave-up-next" {
                    let _ = session.broadcast(4, Some(b"next".as_slice()));
                }
                result
            } else {
                session.broadcast(0, data)
            };
            let expected = match rank {
                4 => Some((0, None)),
                5 | 6 => Some((4, Some(0))),
                7 => Some((6, Some(4))),
                _ => None,
            };
            match (expected, result) {
                (None, Ok(data)) => assert_eq!(data, b"down the tree"),
                (Some((0, None)), Err(Error::Timeout { waiting_for, .. })) => {
                    assert_eq!(waiting_for, [0]);
                }
                (
                    Some((parent, named)),
                    Err(Error::PeerGaveUp {
                        rank, named: said, ..
                    }),
                ) => {
                    assert_eq!((rank, said), (parent, named));
                    assert!(started.elapsed() < Duration::from_secs(20));
                }
                (expected, other) => panic!("rank {rank}: expected {expected:?}, got {other:?}"),
            }
            stay_until_all_have_seen(&socket, &scenario, rank, 10, started);
        }
        "left-after-own-work" => {
            // Rank 2 dies; rank 1 sees the death but no call of its fails on it: it finishes its
            // own work with rank 0 and leaves. Rank 0 must not read that as a leave caused by
            // the death.
            session.barrier().unwrap();
            match rank {
                2 => nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).unwrap(),
                1 => {
                    let started = std::time::Instant::now();
                    while session.raw().lost_rank().is_none() {
                        assert!(started.elapsed() < Duration::from_secs(60), "no death seen");
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    session.send(0, b"done").unwrap();
                }
                _ => {
                    assert_eq!(session.recv(1).unwrap(), b"done");
                    let error = session.recv(1).unwrap_err();
                    assert!(
                        matches!(
                            error,
                            Error::PeerLeft {
                                rank: 1,
                                after: None,
                                ..
                            }
                        ),
                        "{error}"
                    );
                    assert_eq!(error.to_string(), "peer rank 1 left the session");
                }
            }
        }
        other => panic!("no scenario {other}"),
    }
}

/// Keeps this rank from making another call (which would replace the failed call's record
/// that a peer may still need to see) until all `world` ranks have their outcome.
fn stay_until_all_have_seen(
    socket: &str,
    scenario: &str,
    rank: u32,
    world: u32,
    started: std::time::Instant,
) {
    let dir = std::path::Path::new(socket).parent().unwrap();
    std::fs::write(dir.join(format!("{scenario}-seen-{rank}")), b"").unwrap();
    for peer in 0..world {
        let other = dir.join(format!("{scenario}-seen-{peer}"));
        while !other.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "rank {peer} never saw it"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
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
fn with_no_deadline_a_peer_that_gave_a_collective_up_ends_the_wait_naming_it() {
    let ranks = common::run_ranks("deadlines_rank", "forever-gave-up", 3, "gave-up", &[]);
    for (rank, (ok, stderr)) in ranks.into_iter().enumerate() {
        assert!(ok, "rank {rank}: {stderr}");
    }
}

#[test]
fn a_peer_that_gave_up_and_went_on_to_the_next_collective_is_named_as_giving_up() {
    let ranks = common::run_ranks("deadlines_rank", "gave-up-next", 10, "gave-up-next", &[]);
    let failed: Vec<String> = (0..)
        .zip(ranks)
        .filter(|(_, (ok, _))| !ok)
        .map(|(rank, (_, stderr))| format!("rank {rank}: {stderr}"))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn a_tree_broadcast_given_up_midway_fails_its_subtree_link_by_link() {
    let ranks = common::run_ranks("deadlines_rank", "gave-up-tree", 10, "gave-up-tree", &[]);
    for (rank, (ok, stderr)) in ranks.into_iter().enumerate() {
        assert!(ok, "rank {rank}: {stderr}");
    }
}

#[test]
fn a_rank_that_leaves_after_its_own_work_cites_no_death_it_did_not_fail_on() {
    let ranks = common::run_ranks(
        "deadlines_rank",
        "left-own-work",
        3,
        "left-after-own-work",
        &[],
    );
    assert!(ranks[0].0, "rank 0: {}", ranks[0].1);
    assert!(ranks[1].0, "rank 1: {}", ranks[1].1);
}

#[test]
fn with_no_deadline_a_death_still_ends_the_wait_naming_the_rank() {
    let ranks = run("forever-death", "death");
    assert!(ranks[0].0, "rank 0: {}", ranks[0].1);
    assert!(!ranks[1].0, "rank 1 was to die");
}
