//! The session's collectives and their errors, with ranks on threads of this process: worlds of
//! one to seventeen, groups, departures and interrupts between chunks, misuse, mismatched
//! collectives, deadlines, and forged messages of the scalable collectives.
//!
//! The rest of the session's suite: `session_transfers.rs` (messages, payloads, fds and GPU
//! handles), `session_hostile.rs` (bytes no correct peer sends), `session_waits.rs` (receives
//! that wait, leave or are interrupted).

use shmbroker::Collectives;
use shmbroker::ReduceOp;
use shmbroker::bindings::{INLINE_BYTES, Message, kind};
use shmbroker::session::{Error, Session, Waiting};
use std::time::{Duration, Instant};

mod common;

use common::{SESSION, World, expect_protocol, pair};

#[test]
fn collectives_work_between_threads_too() {
    let (_world, sessions) = World::start("threads", 3);
    let handles: Vec<_> = sessions
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                s.barrier().unwrap();
                let rank = s.rank();
                let gathered = s
                    .all_gather(&vec![rank as u8; 100 + rank as usize])
                    .unwrap();
                let got = s
                    .broadcast(1, (rank == 1).then_some(&b"from one"[..]))
                    .unwrap();
                (gathered, got)
            })
        })
        .collect();
    for handle in handles {
        let (gathered, got) = handle.join().unwrap();
        for (peer, data) in gathered.iter().enumerate() {
            assert_eq!(data, &vec![peer as u8; 100 + peer]);
        }
        assert_eq!(got, b"from one");
    }
}

/// An element aligned to 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(16))]
struct Wide([u64; 2]);

/// An element aligned to 128 bytes, more than small reductions' scratch space promises.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(128))]
struct Huge([u64; 16]);

#[test]
fn user_reductions_of_elements_aligned_to_16_and_128_bytes_work_at_every_size() {
    // One shot through the rings (1 and 100 elements), one shot read in place (2,000: 32 KiB
    // of all contributions at 3 ranks), two shots (10,000).
    let (_world, sessions) = World::start("wide", 3);
    each_on_a_thread(sessions, |s| {
        let rank = u64::from(s.rank());
        for len in [1usize, 100, 2_000, 10_000] {
            let mut data: Vec<Wide> = (0..len as u64).map(|i| Wide([i + rank, rank])).collect();
            s.all_reduce_with(&mut data, |acc: &mut [Wide], next: &[Wide]| {
                for (a, b) in acc.iter_mut().zip(next) {
                    *a = Wide([a.0[0] + b.0[0], a.0[1] * 10 + b.0[1]]);
                }
            })
            .unwrap();
            // Ranks 0, 1, 2 in order: sums 3i + 3 and digits 0, 1, 2 (12).
            let expected: Vec<Wide> = (0..len as u64).map(|i| Wide([3 * i + 3, 12])).collect();
            assert_eq!(data, expected, "{len} elements at rank {rank}");
        }
        // One shot through the rings (2 and 10 elements: 1,280 bytes): in scratch space
        // or, when it does not suit, a buffer of their own.
        for len in [2usize, 10] {
            let mut data = vec![Huge([rank + 1; 16]); len];
            s.all_reduce_with(&mut data, |acc: &mut [Huge], next: &[Huge]| {
                for (a, b) in acc.iter_mut().zip(next) {
                    a.0[0] = a.0[0] * 10 + b.0[0];
                }
            })
            .unwrap();
            let mut first = [1u64; 16];
            first[0] = 123;
            assert_eq!(
                data,
                vec![Huge(first); len],
                "{len} elements at rank {rank}"
            );
        }
        // Larger, they would be read from outbox blocks, aligned to 64 bytes only:
        // refused alike on every rank, before anything is sent.
        let mut data = vec![Huge([0; 16]); 100];
        match s.all_reduce_with(&mut data, |_: &mut [Huge], _: &[Huge]| {}) {
            Err(Error::Misuse(text)) => assert!(text.contains("at most 64"), "{text}"),
            other => panic!("rank {rank}: {other:?}"),
        }
        s.barrier().unwrap();
    });
}

#[test]
fn a_rank_that_finished_its_all_gather_and_left_is_not_blamed_by_a_slower_one() {
    // Bruck's all-gather (past 8 ranks) lets a rank finish a call, and leave, while a slower
    // one has yet to take the part it sent. A slower rank that had taken that part into its
    // inbox early (looking for acknowledgements from every peer) once looked at the leaver's
    // closed ring before its inbox, and failed with "peer rank N left the session" (`bench
    // collectives` under load, 1 run in 6). Twelve ranks on this machine's cores, beside two
    // busy threads, each leaving as soon as its last call returns.
    finish_and_leave(12, 15);
    // Four ranks lend their 1 KiB parts from their outboxes (`ALL_GATHER_SLOTS_MAX_BYTES`): a
    // slower rank reads the part of one that has left from its outbox, and acknowledges it
    // into a closed ring.
    finish_and_leave(4, 30);
}

/// `trials` worlds of `world` ranks, each making 60 all-gathers of 1 KiB and leaving as soon as
/// its last one returns, beside two busy threads: no rank may fail.
fn finish_and_leave(world: u32, trials: u32) {
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let spinners: Vec<_> = (0..2)
        .map(|_| {
            let busy = busy.clone();
            std::thread::spawn(move || {
                while busy.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    for trial in 0..trials {
        let (_world, sessions) = World::start(&format!("leave-after-{world}-{trial}"), world);
        let joins: Vec<_> = sessions
            .into_iter()
            .map(|mut session| {
                std::thread::spawn(move || {
                    let rank = session.rank();
                    let part = [rank as u8; 1024];
                    let mut out = vec![0u8; 1024 * world as usize];
                    for call in 0..60 {
                        session
                            .all_gather_into(&part, &mut out)
                            .map_err(|error| format!("rank {rank}, call {call}: {error}"))?;
                        for (peer, got) in out.chunks(1024).enumerate() {
                            if got.iter().any(|&byte| byte != peer as u8) {
                                return Err(format!(
                                    "rank {rank}, call {call}: rank {peer}'s part is wrong"
                                ));
                            }
                        }
                    }
                    drop(session);
                    Ok::<_, String>(())
                })
            })
            .collect();
        let failures: Vec<String> = joins
            .into_iter()
            .filter_map(|join| join.join().unwrap().err())
            .collect();
        assert!(
            failures.is_empty(),
            "{world} ranks, trial {trial}: {failures:#?}"
        );
    }
    busy.store(false, std::sync::atomic::Ordering::Relaxed);
    for spinner in spinners {
        spinner.join().unwrap();
    }
}

#[test]
fn a_rank_whose_own_loans_fill_its_outbox_gathers_in_slots_and_blames_no_peer() {
    // Every rank holds a loan of its whole outbox, which nobody will give back.
    // - A 1 KiB all-gather part is lent (`ALL_GATHER_SLOTS_MAX_BYTES`) when there is room; here
    //   it goes in ring slots, and the call completes at once instead of waiting for room.
    // - A 1 KiB all-reduce is always lent (`ALL_REDUCE_SLOTS_MAX_BYTES`): it waits for room to
    //   its deadline, and the error names no peer (none owes this rank anything; it used to
    //   name the last one), since the room is this rank's own to give back.
    let (_world, sessions) = World::start_with_outbox("own-outbox-full", 3, 1 << 20);
    each_on_a_thread(sessions, |session| {
        let rank = session.rank();
        let held = session.loan(session.max_loan_bytes()).unwrap();
        let part = [rank as u8 + 1; 1024];
        let mut out = vec![0u8; 3 * 1024];
        session
            .with_timeout(Duration::from_secs(5))
            .all_gather_into(&part, &mut out)
            .unwrap_or_else(|error| panic!("rank {rank}: {error}"));
        for (peer, got) in out.chunks(1024).enumerate() {
            assert!(
                got.iter().all(|&byte| byte == peer as u8 + 1),
                "rank {rank}: {peer}"
            );
        }
        let mut data = [1.0f32; 256];
        match session
            .with_timeout(Duration::from_millis(300))
            .all_reduce(&mut data, ReduceOp::Sum)
        {
            Err(Error::Misuse(text)) => assert!(
                text.contains("own outbox") && !text.contains("  "),
                "rank {rank}: {text}"
            ),
            other => panic!("rank {rank}: {other:?}"),
        }
        drop(held);
        // With room again, the same calls lend.
        session.all_gather_into(&part, &mut out).unwrap();
        session.all_reduce(&mut data, ReduceOp::Sum).unwrap();
        assert_eq!(data, [3.0; 256], "rank {rank}");
        session.barrier().unwrap();
    });
}

#[test]
fn making_a_group_with_a_member_that_left_names_it_and_the_others_group_after() {
    // Rank 1 leaves; ranks 0, 2 and 3 then try to make a group of all four. Each takes the
    // proposals of the live members and fails naming rank 1, not a live member, and the three
    // then make their group and use it. (A failed setup receive from the leaver must not close
    // the setup stream: a live member's proposal already queued would be dropped and the call
    // would time out naming that member. Here the proposals are mostly still in the rings when
    // the leaver's receive fails, so this checks the outcome more than that case.)
    let (_world, mut sessions) = World::start("group-with-a-leaver", 4);
    drop(sessions.remove(1));
    let results = each_on_a_thread(sessions, |session| {
        let rank = session.rank();
        let failed = session
            .with_timeout(Duration::from_secs(3))
            .group(&[0, 1, 2, 3]);
        assert!(
            matches!(failed, Err(Error::PeerLeft { rank: 1, .. })),
            "rank {rank}: {failed:?}"
        );
        let group = session.group(&[0, 2, 3]).unwrap();
        let parts = session.on(&group).all_gather(&[rank as u8; 8]).unwrap();
        assert_eq!(parts, [[0u8; 8], [2; 8], [3; 8]]);
    });
    assert_eq!(results.len(), 3);
}

#[test]
fn a_collective_a_departure_cut_short_leaves_nothing_in_the_way_of_the_next_messages() {
    // Rank 2 leaves (drops its session: nobody died, so no death names the collective's end).
    // Ranks 0 and 1 then all-gather 4 MiB each: each delivers the first chunks of its part to
    // the other before its delivery to rank 2 fails, and the call fails on both naming rank 2.
    // What those cut-off parts leave in the links must not stand in the way of what follows:
    // before, each rank's next `recv` from the other failed ("message ... was cut off",
    // naming the other) because a departure that is not a death closed no stream. Then a group
    // of the two carries on with collectives of the same size.
    let (_world, mut sessions) = World::start("cut-short-by-a-leaver", 3);
    drop(sessions.pop());
    let results = each_on_a_thread(sessions, |session| {
        let rank = session.rank();
        let peer = 1 - rank;
        let part = vec![rank as u8 + 1; 4 << 20];
        let mut out = vec![0u8; 3 * part.len()];
        let failed = session.all_gather_into(&part, &mut out);
        assert!(
            matches!(failed, Err(Error::PeerLeft { rank: 2, .. })),
            "rank {rank}: {failed:?}"
        );
        // Point to point both ways first: making a group would clear the links anyway.
        if rank == 0 {
            session.send(peer, b"after").unwrap();
        }
        let got = session
            .recv(peer)
            .unwrap_or_else(|error| panic!("rank {rank}: {error}"));
        assert_eq!(got, b"after");
        if rank == 1 {
            session.send(peer, b"after").unwrap();
        }
        let group = session.group(&[0, 1]).unwrap();
        for _ in 0..5 {
            let mut two = vec![0u8; 2 * part.len()];
            session.on(&group).all_gather_into(&part, &mut two).unwrap();
            assert!(two[..part.len()].iter().all(|&b| b == 1));
            assert!(two[part.len()..].iter().all(|&b| b == 2));
        }
    });
    assert_eq!(results.len(), 2);
}

#[test]
fn a_collective_interrupted_between_chunks_leaves_nothing_in_the_way_of_the_next_message() {
    // Outboxes of 4 MiB and parts of 16 MiB: with rank 2 not in the call yet, ranks 0 and 1 fill
    // their outboxes and stall between chunks. Rank 1 is interrupted there; rank 2 then joins
    // (until its deadline), which frees rank 0 to deliver the rest of its part to rank 1, whose
    // call is over. Rank 0 times out (rank 1's part never comes) and sends rank 1 a message.
    // Before, rank 1 found the rest of rank 0's part where that message's header belonged: "a
    // chunk (tag ...) that no pipelined message announced", naming rank 0, which did nothing
    // wrong. Then ranks 0's and 1's outbox blocks all come back. (Rank 2's part, sent after
    // rank 1's call was over, stays queued at rank 1 until a collective on the world drops it:
    // see "What an interrupted transfer leaves" in the session's departures docs.)
    let (_world, sessions) = World::start_with_outbox("interrupted-between-chunks", 3, 4 << 20);
    let mut sessions = sessions.into_iter();
    let (mut zero, mut one, mut two) = (
        sessions.next().unwrap(),
        sessions.next().unwrap(),
        sessions.next().unwrap(),
    );
    let part = |rank: u8| vec![rank + 1; 16 << 20];
    let interrupter = one.interrupter();
    let zero = std::thread::spawn(move || {
        let mut out = vec![0u8; 3 * (16 << 20)];
        let failed = zero
            .with_timeout(Duration::from_secs(2))
            .all_gather_into(&part(0), &mut out);
        assert!(matches!(failed, Err(Error::Timeout { .. })), "{failed:?}");
        zero.send(1, b"after").unwrap();
        zero
    });
    let one = std::thread::spawn(move || {
        let mut out = vec![0u8; 3 * (16 << 20)];
        let failed = one.all_gather_into(&part(1), &mut out);
        assert!(matches!(failed, Err(Error::Interrupted)), "{failed:?}");
        let got = one
            .recv(0)
            .unwrap_or_else(|error| panic!("rank 1: {error}"));
        assert_eq!(got, b"after");
        one
    });
    std::thread::sleep(Duration::from_millis(300));
    interrupter.interrupt();
    std::thread::sleep(Duration::from_millis(200));
    let mut out = vec![0u8; 3 * (16 << 20)];
    let failed = two
        .with_timeout(Duration::from_secs(1))
        .all_gather_into(&part(2), &mut out);
    assert!(matches!(failed, Err(Error::Timeout { .. })), "{failed:?}");
    let mut sessions = [zero.join().unwrap(), one.join().unwrap(), two];
    let deadline = Instant::now() + Duration::from_secs(5);
    while sessions[..2].iter().any(|s| s.outbox_blocks_owed() != 0) && Instant::now() < deadline {
        for session in &mut sessions {
            session.poll_acks().unwrap();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let owed: Vec<usize> = sessions[..2]
        .iter()
        .map(Session::outbox_blocks_owed)
        .collect();
    assert_eq!(owed, [0, 0]);
}

#[test]
fn chunks_a_failed_collective_never_delivered_do_not_hold_the_outbox() {
    // Rank 1 is not reading and its ring from rank 0 is full, so rank 0's all-gather writes its
    // first chunks into its outbox for ranks 1 and 2 but delivers none to rank 1 before the
    // delivery to rank 2, which left, fails the call. Rank 1 never learns of those blocks, so
    // it can never acknowledge them: before, they stayed owed by it for the rest of the session.
    let (_world, mut sessions) = World::start("undelivered-chunks", 3);
    drop(sessions.pop());
    let mut one = sessions.pop().unwrap();
    let mut zero = sessions.pop().unwrap();
    let fill = zero.raw().ring_capacity();
    for n in 0..fill {
        zero.send(1, &n.to_le_bytes()).unwrap();
    }
    let part = vec![7u8; 4 << 20];
    let mut out = vec![0u8; 3 * part.len()];
    let failed = zero.all_gather_into(&part, &mut out);
    assert!(
        matches!(failed, Err(Error::PeerLeft { rank: 2, .. })),
        "{failed:?}"
    );
    for n in 0..fill {
        assert_eq!(one.recv(0).unwrap(), n.to_le_bytes());
    }
    zero.send(1, b"after").unwrap();
    assert_eq!(one.recv(0).unwrap(), b"after");
    let deadline = Instant::now() + Duration::from_secs(5);
    while zero.outbox_blocks_owed() != 0 && Instant::now() < deadline {
        zero.poll_acks().unwrap();
        one.poll_acks().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(zero.outbox_blocks_owed(), 0);
}

#[test]
fn waits_run_crowded_exactly_when_the_world_outnumbers_the_cpus() {
    // One rank more than this process's CPUs: crowded; two ranks on two or more CPUs: not.
    let (_world, sessions) = World::start("crowded", 3);
    for session in &sessions {
        let crowded = 3 > session.cpus();
        assert_eq!(session.waiting(), Waiting::Adaptive { crowded });
    }
    let mut sessions = barrier_on_threads(sessions);
    sessions[0].set_waiting(Waiting::Spin(0));
    assert_eq!(sessions[0].waiting(), Waiting::Spin(0));
    barrier_on_threads(sessions);
}

#[test]
fn no_rank_leaves_a_barrier_before_every_rank_has_entered_it_in_worlds_of_one_to_seventeen() {
    // Flat up to FLAT_BARRIER_MAX, dissemination beyond (non-powers of two included). Each rank
    // counts itself in before each barrier and, once out, must find every rank counted.
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    for world in (1..=9).chain([16, 17]) {
        let (_world, sessions) = World::start(&format!("barrier-{world}"), world);
        let arrived = Arc::new(AtomicU64::new(0));
        each_on_a_thread(sessions, move |session| {
            for round in 1..=50u64 {
                arrived.fetch_add(1, Ordering::SeqCst);
                session.barrier().unwrap();
                let seen = arrived.load(Ordering::SeqCst);
                assert!(
                    seen >= round * u64::from(world),
                    "world {world}: rank {} left barrier {round} having seen {seen} arrivals",
                    session.rank()
                );
            }
        });
    }
}

#[test]
fn all_gather_into_gives_every_part_in_rank_order_in_worlds_of_one_to_seventeen() {
    // Flat up to FLAT_GATHER_MAX ranks, Bruck beyond (non-powers of two included), at part sizes
    // on both sides of BRUCK_MAX_BYTES, and of zero bytes.
    let sizes = [
        0usize,
        1,
        8,
        100,
        shmbroker::session::tuning::BRUCK_MAX_BYTES,
        3000,
    ];
    for world in (1..=9).chain([12, 16, 17]) {
        let (_world, sessions) = World::start(&format!("gather-into-{world}"), world);
        each_on_a_thread(sessions, move |session| {
            let rank = session.rank();
            for round in 0..3u8 {
                for size in sizes {
                    let part = |r: u32| -> Vec<u8> {
                        (0..size).map(|i| (r as u8) ^ (i as u8) ^ round).collect()
                    };
                    let mut out = vec![0xEE; size * world as usize];
                    session.all_gather_into(&part(rank), &mut out).unwrap();
                    for r in 0..world {
                        let got = &out[r as usize * size..(r as usize + 1) * size];
                        let want = part(r);
                        assert_eq!(got, want, "world {world}, rank {rank}: rank {r}'s {size} B");
                    }
                }
            }
        });
    }
}

#[test]
fn every_root_broadcasts_every_size_in_worlds_of_one_to_seventeen() {
    // Flat up to FLAT_BROADCAST_MAX ranks, a binomial tree beyond: data in the routing slot, in
    // the parent's next message, or streamed by the root (larger than the eager limit).
    let sizes = [0usize, 1, 40, 41, 1000, 20_000, 300_000];
    for world in (1..=9).chain([12, 16, 17]) {
        let (_world, sessions) = World::start(&format!("bcast-{world}"), world);
        each_on_a_thread(sessions, move |session| {
            let rank = session.rank();
            for root in 0..world {
                for size in sizes {
                    let want: Vec<u8> =
                        (0..size).map(|i| (root as u8) ^ (i as u8) ^ 0x5A).collect();
                    let data = (rank == root).then_some(&want[..]);
                    let got = session.broadcast(root, data).unwrap();
                    assert!(
                        got == want,
                        "world {world}, rank {rank}: broadcast of {size} B from {root}"
                    );
                }
            }
        });
    }
}

#[test]
fn every_root_gathers_parts_of_mixed_sizes_in_worlds_of_one_to_seventeen() {
    // Flat up to FLAT_GATHER_MAX ranks, a binomial tree beyond: parts up to TREE_PART_MAX ride in
    // the bundles, larger ones go straight to the root, and ranks of one gather mix both.
    let max = shmbroker::session::tuning::TREE_PART_MAX;
    for world in (1..=9).chain([12, 16, 17]) {
        let (_world, sessions) = World::start(&format!("gather-{world}"), world);
        each_on_a_thread(sessions, move |session| {
            let rank = session.rank();
            let sizes = |r: u32, round: usize| match round {
                0 => 0,
                1 => 8,
                2 => max,
                3 => max + 1,
                4 => [0, 40, max, max + 1, 70_000][r as usize % 5],
                _ => [max + 1, 3, 0][r as usize % 3],
            };
            for root in 0..world {
                for round in 0..6 {
                    let part = |r: u32| -> Vec<u8> {
                        (0..sizes(r, round))
                            .map(|i| (r as u8) ^ (i as u8) ^ (round as u8) ^ (root as u8))
                            .collect()
                    };
                    let got = session.gather(root, &part(rank)).unwrap();
                    let Some(got) = got else {
                        assert_ne!(rank, root);
                        continue;
                    };
                    assert_eq!(rank, root);
                    assert_eq!(got.len(), world as usize);
                    for (r, got) in (0..world).zip(&got) {
                        assert!(
                            *got == part(r),
                            "world {world}, root {root}, round {round}: rank {r}'s part"
                        );
                    }
                }
            }
        });
    }
}

/// One barrier on every session, each on its own thread; gives the sessions back.
fn barrier_on_threads(sessions: Vec<Session>) -> Vec<Session> {
    each_on_a_thread(sessions, |session| session.barrier().unwrap())
}

/// Runs `work` on every session, each on a thread of its own (a rank's panic fails the test);
/// gives the sessions back in rank order.
fn each_on_a_thread(
    sessions: Vec<Session>,
    work: impl Fn(&mut Session) + Clone + Send + 'static,
) -> Vec<Session> {
    let joins: Vec<_> = sessions
        .into_iter()
        .map(|mut session| {
            let work = work.clone();
            std::thread::spawn(move || {
                work(&mut session);
                session
            })
        })
        .collect();
    joins.into_iter().map(|join| join.join().unwrap()).collect()
}

#[test]
fn forged_messages_of_the_scalable_collectives_are_refused_naming_the_forger() {
    // Nine ranks: past 8 the barrier disseminates, broadcasts go down a tree and small
    // all_gather_into parts go by Bruck's algorithm. One rank writes, straight into a ring, what
    // no correct peer sends at that point; the receiver says so, naming it, within its deadline.
    let forge = |sessions: &mut [Session], from: usize, to: u32, message: Message| {
        let link = sessions[from].raw().link(to).unwrap();
        link.to.try_send(message).unwrap();
    };
    let short = Duration::from_millis(500);
    let slot = |kind: u32, len: u32, first: u8| {
        let mut inline = [0u8; INLINE_BYTES];
        inline[0] = first;
        Message {
            kind,
            len,
            tag: 0,
            inline,
        }
    };

    // Rank 1's parent in a tree rooted at 0 is rank 0: a routing slot naming route 7.
    let (_world, mut sessions) = World::start("forged-route", 9);
    forge(&mut sessions, 0, 1, slot(kind::BROADCAST, 8, 7));
    let outcome = sessions[1].with_timeout(short).broadcast(0, None);
    expect_protocol(outcome, 0, "names route 7");

    // In round 0 of a dissemination barrier rank 1 hears from rank 0: a round-3 message.
    let (_world, mut sessions) = World::start("forged-round", 9);
    forge(&mut sessions, 0, 1, slot(kind::BARRIER, 0, 3));
    let outcome = sessions[1].with_timeout(short).barrier();
    expect_protocol(outcome, 0, "dissemination round 0");

    // In Bruck's round 0 rank 1 receives one 8-byte part from rank 2: 16 bytes instead.
    let (_world, mut sessions) = World::start("forged-part", 9);
    forge(&mut sessions, 2, 1, slot(kind::ALL_GATHER, 16, 0));
    let mut out = [0u8; 8 * 9];
    let outcome = sessions[1].all_gather_into(&[1; 8], &mut out);
    expect_protocol(outcome, 2, "gave 16 bytes where 8 were due");

    // In a tree gather rooted at 0, rank 2 (a subtree of ranks 2 and 3) sends rank 0 a bundle
    // whose second part claims more bytes than follow its length table.
    let (_world, mut sessions) = World::start("forged-bundle", 9);
    let mut table = [0u8; INLINE_BYTES];
    table[..4].copy_from_slice(&1u32.to_le_bytes());
    table[4..8].copy_from_slice(&30u32.to_le_bytes());
    let mut bundle = slot(kind::GATHER, 9, 0);
    bundle.inline = table;
    forge(&mut sessions, 2, 0, bundle);
    // Rank 1, a leaf, gives rank 0 its own one-part bundle first.
    let leaf = sessions.remove(1);
    let helper = std::thread::spawn(move || {
        let mut leaf = leaf;
        leaf.with_timeout(short).gather(0, b"").map(drop)
    });
    let outcome = sessions[0].with_timeout(short).gather(0, b"");
    expect_protocol(outcome, 2, "part 1 claims 30 bytes");
    helper.join().unwrap().unwrap();

    // Rank 1, a leaf under the root, sends a one-part bundle with a byte left over after it.
    let (_world, mut sessions) = World::start("forged-leftover", 9);
    let mut bundle = slot(kind::GATHER, 5, 0);
    bundle.inline[..4].copy_from_slice(&0u32.to_le_bytes());
    forge(&mut sessions, 1, 0, bundle);
    let outcome = sessions[0].with_timeout(short).gather(0, b"");
    expect_protocol(outcome, 1, "1 bytes left over");

    // Rank 1 marks its part as sent straight to the root, then sends one byte that way: small
    // parts travel up the tree.
    let (_world, mut sessions) = World::start("forged-direct", 9);
    let mut bundle = slot(kind::GATHER, 4, 0);
    bundle.inline[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    forge(&mut sessions, 1, 0, bundle);
    forge(&mut sessions, 1, 0, slot(kind::GATHER, 1, 9));
    let others: Vec<Session> = sessions.drain(1..).collect();
    let helpers: Vec<_> = others
        .into_iter()
        .filter(|session| session.rank() != 1)
        .map(|mut session| std::thread::spawn(move || session.with_timeout(short).gather(0, b"")))
        .collect();
    let outcome = sessions[0].with_timeout(short).gather(0, b"");
    expect_protocol(outcome, 1, "straight to the root");
    for helper in helpers {
        helper.join().unwrap().unwrap();
    }
}

#[test]
fn misuse_is_an_error_not_a_hang() {
    let (_world, mut sessions) = World::start("misuse", 2);
    let zero = &mut sessions[0];
    assert!(matches!(
        zero.send(2, b"x"),
        Err(Error::RankOutOfRange {
            rank: 2,
            world_size: 2
        })
    ));
    assert!(matches!(zero.send(0, b"x"), Err(Error::Misuse(_))));
    assert!(matches!(
        zero.broadcast(5, None),
        Err(Error::RankOutOfRange { .. })
    ));
    assert!(matches!(zero.broadcast(0, None), Err(Error::Misuse(_))));
    assert!(matches!(
        zero.broadcast(1, Some(b"x")),
        Err(Error::Misuse(_))
    ));
    let too_large = zero.outbox_bytes() as usize + 1;
    match zero.loan(too_large) {
        Err(Error::OwnOutbox(shmbroker::allocator::Error::TooLarge { requested, .. })) => {
            assert_eq!(requested, too_large as u64);
        }
        other => panic!("unexpected {other:?}"),
    }
    match zero.with_timeout(Duration::from_millis(50)).recv(1) {
        Err(Error::Timeout {
            op: "recv",
            waiting_for,
            ..
        }) if waiting_for == [1] => {}
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn ranks_in_different_collectives_get_a_mismatch_naming_both() {
    let (_world, mut zero, mut one) = pair("mismatch");
    let other = std::thread::spawn(move || {
        let result = one
            .with_timeout(Duration::from_millis(500))
            .all_gather(b"x");
        (result.map(|_| ()), one)
    });
    match zero.barrier() {
        Err(
            error @ Error::CollectiveMismatch {
                peer: 1,
                expected_kind,
                expected_seq: 0,
                found_kind,
                found_seq: 0,
            },
        ) => {
            assert_eq!(
                (expected_kind, found_kind),
                (kind::BARRIER, kind::ALL_GATHER)
            );
            assert_eq!(
                error.to_string(),
                "rank 1 called all_gather #0 while this rank called barrier #0"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    let (result, _one) = other.join().unwrap();
    assert!(
        matches!(result, Err(Error::CollectiveMismatch { peer: 0, .. })),
        "{result:?}"
    );
}

#[test]
fn a_collective_timeout_names_every_rank_still_missing() {
    // Rank 1 enters each collective; ranks 2 and 3 never do. Rank 0's timeout names 2 and 3,
    // not only the first it waited for, and not rank 1.
    let (_world, sessions) = World::start("missing", 4);
    let mut sessions = sessions.into_iter();
    let mut zero = sessions.next().unwrap();
    let mut one = sessions.next().unwrap();
    let _silent: Vec<Session> = sessions.collect();
    let helper = std::thread::spawn(move || {
        let _ = one.with_timeout(Duration::from_millis(300)).barrier();
        let _ = one
            .with_timeout(Duration::from_millis(300))
            .all_gather(&[1; 100_000]);
        one
    });
    let barrier = zero.with_timeout(Duration::from_millis(200)).barrier();
    let all_gather = zero
        .with_timeout(Duration::from_millis(200))
        .all_gather(&[0; 100_000])
        .map(drop);
    for (op, outcome) in [("barrier", barrier), ("all_gather", all_gather)] {
        match outcome {
            Err(error @ Error::Timeout { .. }) => {
                let Error::Timeout {
                    op: named,
                    waiting_for,
                    ..
                } = &error
                else {
                    unreachable!()
                };
                assert_eq!(
                    (*named, waiting_for.as_slice()),
                    (op, &[2, 3][..]),
                    "{error}"
                );
                // Both are idle (never called anything): the diagnosis says so.
                assert!(
                    error.to_string().ends_with(
                        "waiting for ranks 2 and 3: rank 2 is in no call (it has finished none \
                         yet); rank 3 is in no call (it has finished none yet)"
                    ),
                    "{error}"
                );
            }
            other => panic!("{op}: unexpected {other:?}"),
        }
    }
    drop(helper.join().unwrap());
}

#[test]
fn waiting_for_peers_that_never_log_on_names_every_one() {
    let dir = common::TempDir::new("never-log-on").unwrap();
    let path = dir.join("broker.sock");
    let config = shmbroker::handshake::Config {
        world_size: 4,
        ..Default::default()
    };
    let (stop, broker) = common::listen_on_thread(&path, config);
    let one_path = path.clone();
    let one = std::thread::spawn(move || Session::connect(&one_path, Some(1), SESSION));
    let mut zero = Session::connect(&path, Some(0), SESSION).unwrap();
    let one = one.join().unwrap().unwrap();
    match zero.await_peers(Duration::from_millis(200)) {
        Err(error @ Error::Timeout { .. }) => assert_eq!(
            error.to_string(),
            "await_peers timed out after 200ms waiting for ranks 2 and 3: rank 2 has not \
             logged on; rank 3 has not logged on"
        ),
        other => panic!("unexpected {other:?}"),
    }
    drop((zero, one));
    stop.stop();
    broker.join().unwrap().unwrap();
}
