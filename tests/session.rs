//! The session's errors, triggered one by one with ranks on threads of this process: misuse,
//! mismatched collectives, and bytes from a peer that no correct peer sends.

use shmbroker::ReduceOp;
use shmbroker::bindings::{INLINE_BYTES, Message, PayloadRef, kind};
use shmbroker::session::{Error, Session, Waiting};
use std::time::{Duration, Instant};

mod common;

use common::{World, memfd_with, text_of};

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
            .all_gather_into_timeout(&part, &mut out, Duration::from_secs(5))
            .unwrap_or_else(|error| panic!("rank {rank}: {error}"));
        for (peer, got) in out.chunks(1024).enumerate() {
            assert!(
                got.iter().all(|&byte| byte == peer as u8 + 1),
                "rank {rank}: {peer}"
            );
        }
        let mut data = [1.0f32; 256];
        match session.all_reduce_timeout(&mut data, ReduceOp::Sum, Duration::from_millis(300)) {
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
        let failed = session.group_timeout(&[0, 1, 2, 3], Duration::from_secs(3));
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
        let failed = zero.all_gather_into_timeout(&part(0), &mut out, Duration::from_secs(2));
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
    let failed = two.all_gather_into_timeout(&part(2), &mut out, Duration::from_secs(1));
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
    let sizes = [0usize, 1, 8, 100, shmbroker::session::BRUCK_MAX_BYTES, 3000];
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
    let max = shmbroker::session::TREE_PART_MAX;
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
    let outcome = sessions[1].broadcast_timeout(0, None, short);
    expect_protocol(outcome, 0, "names route 7");

    // In round 0 of a dissemination barrier rank 1 hears from rank 0: a round-3 message.
    let (_world, mut sessions) = World::start("forged-round", 9);
    forge(&mut sessions, 0, 1, slot(kind::BARRIER, 0, 3));
    let outcome = sessions[1].barrier_timeout(short);
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
        leaf.gather_timeout(0, b"", short).map(drop)
    });
    let outcome = sessions[0].gather_timeout(0, b"", short);
    expect_protocol(outcome, 2, "part 1 claims 30 bytes");
    helper.join().unwrap().unwrap();

    // Rank 1, a leaf under the root, sends a one-part bundle with a byte left over after it.
    let (_world, mut sessions) = World::start("forged-leftover", 9);
    let mut bundle = slot(kind::GATHER, 5, 0);
    bundle.inline[..4].copy_from_slice(&0u32.to_le_bytes());
    forge(&mut sessions, 1, 0, bundle);
    let outcome = sessions[0].gather_timeout(0, b"", short);
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
        .map(|mut session| std::thread::spawn(move || session.gather_timeout(0, b"", short)))
        .collect();
    let outcome = sessions[0].gather_timeout(0, b"", short);
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
    match zero.recv_timeout(1, Duration::from_millis(50)) {
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
        let result = one.all_gather_timeout(b"x", Duration::from_millis(500));
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
        let _ = one.barrier_timeout(Duration::from_millis(300));
        let _ = one.all_gather_timeout(&[1; 100_000], Duration::from_millis(300));
        one
    });
    for (op, outcome) in [
        ("barrier", zero.barrier_timeout(Duration::from_millis(200))),
        (
            "all_gather",
            zero.all_gather_timeout(&[0; 100_000], Duration::from_millis(200))
                .map(drop),
        ),
    ] {
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

/// A deadline long enough for anything in these tests.
const SESSION: Duration = Duration::from_secs(30);

#[test]
fn point_to_point_messages_keep_their_order_around_collectives() {
    let (_world, mut zero, mut one) = pair("p2p");
    let sender = std::thread::spawn(move || {
        one.send(0, b"first").unwrap();
        one.send(0, &[7; 3000]).unwrap();
        one.barrier().unwrap();
        one.send(0, b"third").unwrap();
        one
    });
    // The barrier is taken first although both sends came before it on the ring.
    zero.barrier().unwrap();
    assert_eq!(zero.recv(1).unwrap(), b"first");
    assert_eq!(zero.recv(1).unwrap(), vec![7; 3000]);
    assert_eq!(zero.recv(1).unwrap(), b"third");
    drop(sender.join().unwrap());
}

#[test]
fn a_payload_reference_outside_the_senders_outbox_is_refused() {
    let (_world, mut zero, mut one) = pair("badref");
    // Rank 1 forges a loan pointing far outside its outbox.
    let forged = PayloadRef {
        offset: 1 << 40,
        len: 100,
        _pad0: 0,
    };
    let mut inline = [0u8; INLINE_BYTES];
    inline[..16].copy_from_slice(bytemuck::bytes_of(&forged));
    let message = Message {
        kind: kind::ALL_GATHER | kind::LOAN,
        len: 0,
        tag: 0,
        inline,
    };
    one.raw().link(0).unwrap().to.try_send(message).unwrap();
    match zero.all_gather_timeout(b"mine", Duration::from_millis(500)) {
        Err(Error::Outbox {
            peer: 1,
            source:
                shmbroker::allocator::Error::OutOfBounds {
                    offset, len: 100, ..
                },
        }) => {
            assert_eq!(offset, 1 << 40);
        }
        other => panic!("unexpected {other:?}"),
    }
    // An eager length longer than an eager message can be is refused as well.
    let message = Message {
        kind: kind::SEND,
        len: kind::EAGER_MAX as u32 + 1,
        tag: 0,
        inline: [0; INLINE_BYTES],
    };
    one.raw().link(0).unwrap().to.try_send(message).unwrap();
    expect_protocol(zero.recv(1), 1, "eager message of 4081 bytes");
}

#[test]
fn payload_blocks_are_freed_once_every_receiver_is_done() {
    let (_world, sessions) = World::start("acks", 3);
    let handles: Vec<_> = sessions
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                // Far more large broadcasts than the region holds at once: only freeing keeps
                // this going.
                for round in 0..2000u32 {
                    let root = round % 3;
                    let data = vec![round as u8; 4000];
                    let got = s
                        .broadcast(root, (s.rank() == root).then_some(&data[..]))
                        .unwrap();
                    assert_eq!(got, data);
                }
                s.barrier().unwrap();
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
}

#[test]
fn a_root_broadcasting_without_reading_is_not_deadlocked_by_acknowledgements() {
    // Rings of 64 slots: the acknowledgements of 3000 large broadcasts fill the ring back to the
    // root long before the root reads anything, while the root fills the ring to the receiver.
    let (_world, sessions) = World::start("ack-flood", 2);
    let mut sessions = sessions.into_iter();
    let (mut root, mut receiver) = (sessions.next().unwrap(), sessions.next().unwrap());
    let data = vec![9u8; 4000];
    let expected = data.clone();
    let receiving = std::thread::spawn(move || {
        for _ in 0..3000 {
            assert_eq!(receiver.broadcast(0, None).unwrap(), expected);
        }
        receiver
    });
    for _ in 0..3000 {
        root.broadcast(0, Some(&data)).unwrap();
    }
    let _receiver = receiving.join().unwrap();
}

fn exchange_and_broadcast_fds(name: &str, transport: shmbroker::session::FdTransport) {
    use shmbroker::session::FdTransport;
    use std::os::fd::AsFd;
    let (_world, sessions) = World::start(name, 3);
    let handles: Vec<_> = sessions
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                s.set_fd_transport(transport);
                assert_eq!(s.fd_transport(), transport);
                assert_eq!(s.fd_transport_used(), None, "before any exchange");
                let rank = s.rank();
                let mine = memfd_with(&format!("file of rank {rank}"));
                let all = s.exchange_fds(mine.as_fd()).unwrap();
                // Under `auto`, pidfd_getfd unless the kernel refuses it (Yama, a container).
                let used = s.fd_transport_used();
                match transport {
                    FdTransport::Relay => assert_eq!(used, Some(FdTransport::Relay)),
                    FdTransport::Pidfd => assert_eq!(used, Some(FdTransport::Pidfd)),
                    FdTransport::Auto => assert!(used.is_some_and(|u| u != FdTransport::Auto)),
                }
                let texts: Vec<String> = all.iter().map(text_of).collect();
                let root_fd = (rank == 2).then(|| memfd_with("broadcast by rank 2"));
                let got = s
                    .broadcast_fd(2, root_fd.as_ref().map(|fd| fd.as_fd()))
                    .unwrap();
                // Batches: five fds from every rank, then more fds from one root than the
                // broker lets a worker hold unclaimed (relayed, they go one per round).
                let batch: Vec<_> = (0..5)
                    .map(|i| memfd_with(&format!("file {i} of rank {rank}")))
                    .collect();
                let borrowed: Vec<_> = batch.iter().map(AsFd::as_fd).collect();
                let batches = s.exchange_fd_batch(&borrowed).unwrap();
                let batch_texts: Vec<Vec<String>> = batches
                    .iter()
                    .map(|fds| fds.iter().map(text_of).collect())
                    .collect();
                let many = shmbroker::handshake::MAX_UNCLAIMED_RELAYS + 6;
                let roots: Vec<_> = (0..many)
                    .filter(|_| rank == 1)
                    .map(|i| memfd_with(&format!("batch file {i}")))
                    .collect();
                let borrowed: Vec<_> = roots.iter().map(AsFd::as_fd).collect();
                let broadcast = s.broadcast_fd_batch(1, &borrowed, many).unwrap();
                let broadcast_texts: Vec<String> = broadcast.iter().map(text_of).collect();
                (texts, text_of(&got), batch_texts, broadcast_texts)
            })
        })
        .collect();
    for handle in handles {
        let (texts, broadcast, batches, broadcast_batch) = handle.join().unwrap();
        assert_eq!(
            texts,
            ["file of rank 0", "file of rank 1", "file of rank 2"]
        );
        assert_eq!(broadcast, "broadcast by rank 2");
        let expected: Vec<Vec<String>> = (0..3)
            .map(|rank| (0..5).map(|i| format!("file {i} of rank {rank}")).collect())
            .collect();
        assert_eq!(batches, expected);
        let many = shmbroker::handshake::MAX_UNCLAIMED_RELAYS + 6;
        let expected: Vec<String> = (0..many).map(|i| format!("batch file {i}")).collect();
        assert_eq!(broadcast_batch, expected);
    }
}

#[test]
fn fd_batches_of_different_lengths_fail_on_every_rank_naming_one_that_disagrees() {
    use std::os::fd::AsFd;
    let (_world, sessions) = World::start("fds-miscounted", 3);
    let joins: Vec<_> = sessions
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                let rank = s.rank();
                // An exchange where rank 2 passes 3 fds and the others 2; then a broadcast from
                // rank 0 of 2 fds that rank 2 expects 3 of.
                let files: Vec<_> = (0..if rank == 2 { 3 } else { 2 })
                    .map(|_| memfd_with("x"))
                    .collect();
                let borrowed: Vec<_> = files.iter().map(AsFd::as_fd).collect();
                let exchanged = s.exchange_fd_batch(&borrowed).map(|_| ());
                let offered = if rank == 0 { &borrowed[..] } else { &[] };
                let broadcast = s
                    .broadcast_fd_batch(0, offered, if rank == 2 { 3 } else { 2 })
                    .map(|_| ());
                // Every rank is still in step: the next collective works.
                s.barrier().unwrap();
                (exchanged, broadcast)
            })
        })
        .collect();
    let outcomes = joins.into_iter().map(|join| join.join().unwrap());
    for (rank, (exchanged, broadcast)) in (0u32..).zip(outcomes) {
        // Ranks 0 and 1 name rank 2, which names the first rank it disagrees with.
        let named = if rank == 2 { 0 } else { 2 };
        for (call, outcome) in [("exchange", exchanged), ("broadcast", broadcast)] {
            match outcome {
                Err(Error::Protocol { peer, detail }) => {
                    assert_eq!(peer, named, "rank {rank}, {call}: {detail}");
                    assert!(
                        detail.contains("same number"),
                        "rank {rank}, {call}: {detail}"
                    );
                }
                other => panic!("rank {rank}, {call}: {other:?}"),
            }
        }
    }
}

#[test]
fn a_rank_that_allows_only_pidfd_fails_an_exchange_others_would_relay_on_every_rank() {
    use shmbroker::session::FdTransport;
    use std::os::fd::AsFd;
    let (_world, sessions) = World::start("fds-mixed", 3);
    let joins: Vec<_> = sessions
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                // Rank 0 allows only pidfd_getfd; the others relay everything they import.
                let rank = s.rank();
                let transport = if rank == 0 {
                    FdTransport::Pidfd
                } else {
                    FdTransport::Relay
                };
                s.set_fd_transport(transport);
                s.set_timeout(Duration::from_secs(10));
                let mine = memfd_with("x");
                let outcome = s.exchange_fds(mine.as_fd()).map(drop);
                s.barrier().unwrap();
                outcome
            })
        })
        .collect();
    for (rank, join) in (0u32..).zip(joins) {
        match join.join().unwrap() {
            Err(Error::FdTransport(detail)) => {
                assert!(
                    detail.contains("SHMBROKER_FD_TRANSPORT"),
                    "rank {rank}: {detail}"
                );
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
}

#[test]
fn a_stale_fd_ticket_fails_the_exchange_naming_its_exporter() {
    use std::os::fd::{AsFd, AsRawFd};
    let (_world, mut zero, mut one) = pair("fd-stale");
    // Rank 1's ticket names its fd `a` by number but the file of `b`: a number closed and
    // reused between the ticket and the import looks just so.
    let (a, b) = (memfd_with("a"), memfd_with("b"));
    let named = nix::sys::stat::fstat(b.as_fd()).unwrap();
    let found = nix::sys::stat::fstat(a.as_fd()).unwrap();
    let ticket = shmbroker::bindings::FdTicket {
        pid: std::process::id(),
        fd: a.as_raw_fd(),
        dev: named.st_dev,
        ino: named.st_ino,
        token: 0,
    };
    let mut inline = [0u8; INLINE_BYTES];
    inline[..32].copy_from_slice(bytemuck::bytes_of(&ticket));
    raw_send(&mut one, raw(kind::FD_TICKET, 0, 32, inline));
    // The status round (the next collective), as an honest exporter's would be: nothing
    // refused, stale, miscounted, short of fds or forged at rank 1.
    raw_send(&mut one, raw(kind::ALL_GATHER, 1, 48, [0u8; INLINE_BYTES]));
    zero.set_timeout(Duration::from_secs(5));
    match zero.exchange_fds(memfd_with("mine").as_fd()) {
        Err(Error::StaleFdTicket {
            exporter: 1,
            expected,
            found: seen,
        }) => {
            assert_eq!(expected, (named.st_dev, named.st_ino));
            assert_eq!(seen, (found.st_dev, found.st_ino));
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn fds_move_by_pidfd_getfd() {
    exchange_and_broadcast_fds("fds-auto", shmbroker::session::FdTransport::Auto);
}

#[test]
fn fds_move_through_the_broker_relay() {
    exchange_and_broadcast_fds("fds-relay", shmbroker::session::FdTransport::Relay);
}

#[test]
fn an_fd_broadcast_root_without_an_fd_is_misuse() {
    let (_world, mut sessions) = World::start("fds-misuse", 2);
    assert!(matches!(
        sessions[0].broadcast_fd(0, None),
        Err(Error::Misuse(_))
    ));
}

fn gpu_handle(
    kind: shmbroker::bindings::GpuHandleKind,
    rank: u32,
) -> shmbroker::bindings::GpuHandle {
    shmbroker::bindings::GpuHandle {
        kind: kind as u32,
        flags: 0,
        device_uuid: [rank as u8; 16],
        handle: [rank as u8 + 100; 64],
        size: 64,
        offset: 0,
        buffer_id: 1000 + u64::from(rank),
    }
}

#[test]
fn gpu_handles_travel_with_their_fds_when_the_kind_has_one() {
    use shmbroker::bindings::GpuHandleKind::{CudaIpcMemory, HostMemfd};
    use std::os::fd::AsFd;
    let (_world, sessions) = World::start("gpu", 3);
    let handles: Vec<_> = sessions
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                let rank = s.rank();
                // Rank 0 shares a legacy CUDA IPC handle (no fd); the others host memfds.
                let kind = if rank == 0 { CudaIpcMemory } else { HostMemfd };
                let memory = memfd_with(&format!("device memory of rank {rank}"));
                let fd = (kind == HostMemfd).then(|| memory.as_fd());
                let gathered = s
                    .all_gather_gpu_handles(&gpu_handle(kind, rank), fd)
                    .unwrap();
                let offered = (rank == 2).then(|| (gpu_handle(HostMemfd, 2), memory.as_fd()));
                let (root_handle, root_fd) = s
                    .broadcast_gpu_handle(2, offered.as_ref().map(|(h, fd)| (h, Some(*fd))))
                    .unwrap();
                let cuda = (rank == 1).then(|| gpu_handle(CudaIpcMemory, 1));
                let (cuda_handle, cuda_fd) = s
                    .broadcast_gpu_handle(1, cuda.as_ref().map(|h| (h, None)))
                    .unwrap();
                (gathered, (root_handle, root_fd), (cuda_handle, cuda_fd))
            })
        })
        .collect();
    for handle in handles {
        let (gathered, (root_handle, root_fd), (cuda_handle, cuda_fd)) = handle.join().unwrap();
        for (peer, (handle, fd)) in (0u32..).zip(&gathered) {
            let kind = if peer == 0 { CudaIpcMemory } else { HostMemfd };
            assert_eq!(handle, &gpu_handle(kind, peer));
            match fd {
                None => assert_eq!(peer, 0),
                Some(fd) => assert_eq!(text_of(fd), format!("device memory of rank {peer}")),
            }
        }
        assert_eq!(root_handle, gpu_handle(HostMemfd, 2));
        assert_eq!(text_of(&root_fd.unwrap()), "device memory of rank 2");
        assert_eq!(
            (cuda_handle, cuda_fd.is_none()),
            (gpu_handle(CudaIpcMemory, 1), true)
        );
    }
}

#[test]
fn a_gpu_handle_with_the_wrong_fd_is_misuse() {
    use shmbroker::bindings::GpuHandleKind::{CudaIpcMemory, HostMemfd};
    use std::os::fd::AsFd;
    let (_world, mut sessions) = World::start("gpu-misuse", 2);
    let memory = memfd_with("x");
    let zero = &mut sessions[0];
    assert!(matches!(
        zero.all_gather_gpu_handles(&gpu_handle(HostMemfd, 0), None),
        Err(Error::Misuse(_))
    ));
    assert!(matches!(
        zero.all_gather_gpu_handles(&gpu_handle(CudaIpcMemory, 0), Some(memory.as_fd())),
        Err(Error::Misuse(_))
    ));
}

#[test]
fn an_acknowledgement_for_a_block_not_awaiting_one_is_refused() {
    let (_world, mut zero, mut one) = pair("forged-ack");
    let forged = PayloadRef {
        offset: 4096,
        len: 10,
        _pad0: 0,
    };
    let mut inline = [0u8; INLINE_BYTES];
    inline[..16].copy_from_slice(bytemuck::bytes_of(&forged));
    let ack = Message {
        kind: kind::PAYLOAD_ACK,
        len: 0,
        tag: 0,
        inline,
    };
    one.raw().link(0).unwrap().to.try_send(ack).unwrap();
    match zero.recv_timeout(1, Duration::from_millis(200)) {
        Err(Error::Protocol { peer: 1, detail }) => {
            assert!(
                detail.contains("offset 4096 (10 bytes) refused: no block was sent"),
                "{detail}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_gpu_handle_of_an_unknown_kind_from_a_peer_is_refused() {
    use shmbroker::bindings::GpuHandleKind::CudaIpcMemory;
    let (_world, mut zero, mut one) = pair("gpu-kind");
    // Rank 1 sends a handle of kind 99 (as a forger would, under the handle's all-gather).
    let forger = std::thread::spawn(move || {
        let mut forged = gpu_handle(CudaIpcMemory, 1);
        forged.kind = 99;
        one.all_gather_pod(&forged).unwrap();
        one
    });
    expect_protocol(
        zero.all_gather_gpu_handles(&gpu_handle(CudaIpcMemory, 0), None),
        1,
        "unknown GPU handle kind 99",
    );
    drop(forger.join().unwrap());
}

/// Rank `peer`'s acknowledgement of `payload`, forged on its raw ring to rank 0.
fn forge_ack(session: &mut shmbroker::Session, payload: PayloadRef) {
    let mut inline = [0u8; INLINE_BYTES];
    inline[..16].copy_from_slice(bytemuck::bytes_of(&payload));
    let ack = Message {
        kind: kind::PAYLOAD_ACK,
        len: 0,
        tag: 0,
        inline,
    };
    session.raw().link(0).unwrap().to.try_send(ack).unwrap();
}

/// The reference in the next message on `session`'s raw ring from rank 0 (a loan).
fn lent_ref(session: &mut shmbroker::Session) -> PayloadRef {
    let message = session
        .raw()
        .link(0)
        .unwrap()
        .from
        .recv_timeout(Duration::from_secs(5))
        .unwrap();
    assert_eq!(message.kind & kind::LOAN, kind::LOAN, "{message:?}");
    bytemuck::pod_read_unaligned(&message.inline[..16])
}

fn expect_refused_ack(zero: &mut shmbroker::Session, from: u32, fault: &str) {
    expect_protocol(zero.poll_acks(), from, fault);
}

/// `outcome` must be [`Error::Protocol`] from rank `from`, saying `text`.
fn expect_protocol<T: std::fmt::Debug>(outcome: Result<T, Error>, from: u32, text: &str) {
    match outcome {
        Err(Error::Protocol { peer, detail }) => {
            assert_eq!(peer, from, "{detail}");
            assert!(detail.contains(text), "{detail}");
        }
        other => panic!("expected a protocol error from rank {from} saying {text:?}: {other:?}"),
    }
}

/// A fresh world of two ranks: its broker (keep it alive) and sessions 0 and 1.
fn pair(name: &str) -> (World, shmbroker::Session, shmbroker::Session) {
    let (world, sessions) = World::start(name, 2);
    let mut sessions = sessions.into_iter();
    (world, sessions.next().unwrap(), sessions.next().unwrap())
}

#[test]
fn duplicate_foreign_and_altered_acknowledgements_are_refused_and_free_nothing() {
    let (_world, sessions) = World::start("bad-acks", 3);
    let mut sessions = sessions.into_iter();
    let (mut zero, mut one, mut two) = (
        sessions.next().unwrap(),
        sessions.next().unwrap(),
        sessions.next().unwrap(),
    );
    // A loan to ranks 1 and 2: both owe an acknowledgement.
    let mut loan = zero.loan(1000).unwrap();
    loan.fill(9);
    let receiver = std::thread::spawn(move || {
        let view = one.broadcast_loan(0, None).unwrap().unwrap();
        assert!(view.iter().all(|&b| b == 9));
        (one, view)
    });
    zero.broadcast_loan(0, Some(loan)).unwrap();
    let (mut one, view) = receiver.join().unwrap();
    let sent = lent_ref(&mut two);
    assert_eq!(zero.outbox_blocks_owed(), 1);

    // Rank 2 acknowledges, then again: the second is refused, naming rank 2, and the block
    // stays owed by rank 1 (whose view still reads it).
    forge_ack(&mut two, sent);
    forge_ack(&mut two, sent);
    expect_refused_ack(&mut zero, 2, "that rank owes no acknowledgement");
    assert_eq!(zero.outbox_blocks_owed(), 1);
    // An acknowledgement of the right block with another length, and of a block never sent.
    forge_ack(&mut two, PayloadRef { len: 999, ..sent });
    expect_refused_ack(&mut zero, 2, "was sent as 1000 bytes");
    forge_ack(
        &mut two,
        PayloadRef {
            offset: sent.offset + 4096,
            ..sent
        },
    );
    expect_refused_ack(&mut zero, 2, "no block was sent at that offset");
    assert_eq!(zero.outbox_blocks_owed(), 1);
    assert!(view.iter().all(|&b| b == 9), "the block was reused");

    // Rank 1 lets go: its acknowledgement (sent with its next call) frees the block.
    drop(view);
    one.poll_acks().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while zero.outbox_blocks_owed() != 0 && Instant::now() < deadline {
        zero.poll_acks().unwrap();
    }
    assert_eq!(zero.outbox_blocks_owed(), 0);
}

#[test]
fn an_acknowledgement_from_a_rank_the_block_was_not_sent_to_is_refused() {
    let (_world, sessions) = World::start("foreign-ack", 3);
    let mut sessions = sessions.into_iter();
    let (mut zero, mut one, mut two) = (
        sessions.next().unwrap(),
        sessions.next().unwrap(),
        sessions.next().unwrap(),
    );
    let loan = zero.loan(64).unwrap();
    zero.send_loan(1, loan).unwrap();
    let sent = lent_ref(&mut one);
    // Rank 2 never got it, but names it exactly.
    forge_ack(&mut two, sent);
    expect_refused_ack(&mut zero, 2, "that rank owes no acknowledgement");
    assert_eq!(zero.outbox_blocks_owed(), 1);
    forge_ack(&mut one, sent);
    zero.poll_acks().unwrap();
    assert_eq!(zero.outbox_blocks_owed(), 0);
}

#[test]
fn a_receiver_that_never_reads_holds_the_sender_back_until_its_deadline() {
    let (_world, mut sessions) = World::start("never-reads", 2);
    let zero = &mut sessions[0];
    // Large: the chunks it may have in flight fill, then the window widens until the outbox is
    // full; the send gives up at its deadline, with every block still accounted for.
    let start = Instant::now();
    let outcome = zero.send_timeout(1, &vec![1u8; 256 << 20], Duration::from_millis(300));
    let waited = start.elapsed();
    match outcome {
        Err(Error::Timeout {
            op: "send",
            waiting_for,
            ..
        }) if waiting_for == [1] => {}
        other => panic!("unexpected {other:?}"),
    }
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(3));
    let blocks = zero.outbox_blocks_owed();
    assert!(blocks > 0 && blocks as u64 <= zero.outbox_bytes() / (64 << 10));
    // Small: the ring fills, and the send gives up at its deadline as well.
    let small = loop {
        if let Err(error) = zero.send_timeout(1, &[2u8; 1000], Duration::from_millis(100)) {
            break error;
        }
    };
    assert!(
        matches!(&small, Error::Timeout { waiting_for, .. } if waiting_for == &[1]),
        "{small:?}"
    );
}

/// A raw ring message from `from` to rank 0.
fn raw_send(session: &mut shmbroker::Session, message: Message) {
    session
        .raw()
        .link(0)
        .unwrap()
        .to
        .send_timeout(message, Duration::from_secs(5))
        .unwrap();
}

fn raw(kind: u32, tag: u64, len: u32, inline: [u8; INLINE_BYTES]) -> Message {
    Message {
        kind,
        len,
        tag,
        inline,
    }
}

#[test]
fn an_eager_message_cut_short_times_out_without_harm_and_completes_later() {
    let (_world, mut zero, mut one) = pair("partial-eager");
    // 48 + 3 * 64 = 240 bytes: a header and three continuation slots, of which one is sent.
    let data: Vec<u8> = (0..240u32).map(|i| i as u8).collect();
    let mut inline = [0u8; INLINE_BYTES];
    inline.copy_from_slice(&data[..48]);
    raw_send(&mut one, raw(kind::SEND, 0, 240, inline));
    let slot = |i: usize| -> Message { bytemuck::pod_read_unaligned(&data[48 + 64 * i..][..64]) };
    raw_send(&mut one, slot(0));
    for _ in 0..2 {
        match zero.recv_timeout(1, Duration::from_millis(50)) {
            Err(Error::Timeout {
                op: "recv",
                waiting_for,
                ..
            }) if waiting_for == [1] => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    raw_send(&mut one, slot(1));
    raw_send(&mut one, slot(2));
    assert_eq!(zero.recv(1).unwrap(), data);
}

#[test]
fn a_stray_chunk_or_unknown_kind_in_a_collective_is_a_protocol_error_naming_the_sender() {
    // Written with the tag of the all-gather rank 0 is in: the receive that takes messages
    // straight from the ring leaves them to the inbox, which says what they are.
    for (name, kind, expected) in [
        ("stray-chunk-collective", kind::CHUNK, "kind 0x8"),
        ("unknown-kind-collective", 0x99, "unknown message kind 0x99"),
    ] {
        let (_world, mut zero, mut one) = pair(name);
        let mut inline = [0u8; INLINE_BYTES];
        inline[..8].copy_from_slice(&0u64.to_le_bytes());
        raw_send(&mut one, raw(kind, 0, 8, inline));
        match zero.all_gather_timeout(b"zero", Duration::from_millis(500)) {
            Err(Error::Protocol { peer: 1, detail }) => {
                assert!(detail.contains(expected), "{name}: {detail}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn chunks_and_pipelined_headers_no_correct_peer_sends_are_refused() {
    let cases: [(&str, Vec<Message>, &str); 4] = [
        (
            "stray-chunk",
            vec![raw(kind::CHUNK, 0, 0, [0; INLINE_BYTES])],
            "a chunk (tag 0) that no pipelined message announced",
        ),
        (
            "header-bytes",
            vec![raw(kind::SEND | kind::PIPELINED, 0, 0, {
                let mut inline = [7u8; INLINE_BYTES];
                inline[..8].copy_from_slice(&100u64.to_le_bytes());
                inline
            })],
            "a pipelined header must hold only the total length",
        ),
        (
            "cut-off",
            vec![
                raw(kind::SEND | kind::PIPELINED, 0, 0, {
                    let mut inline = [0u8; INLINE_BYTES];
                    inline[..8].copy_from_slice(&100u64.to_le_bytes());
                    inline
                }),
                raw(kind::SEND, 1, 0, [0; INLINE_BYTES]),
            ],
            "expected a chunk of message 0 with 1 to 100 bytes, found kind 0x4 tag 1",
        ),
        (
            "unknown-kind",
            vec![raw(0x99, 0, 0, [0; INLINE_BYTES])],
            "unknown message kind 0x99",
        ),
    ];
    for (name, messages, expected) in cases {
        let (_world, mut zero, mut one) = pair(name);
        for message in messages {
            raw_send(&mut one, message);
        }
        match zero.recv_timeout(1, Duration::from_millis(500)) {
            Err(Error::Protocol { peer: 1, detail }) => {
                assert!(detail.contains(expected), "{name}: {detail}");
            }
            other => panic!("{name}: unexpected {other:?}"),
        }
    }
}

#[test]
fn a_pipelined_message_cut_off_by_another_is_refused_while_skipped() {
    let (_world, mut zero, mut one) = pair("cut-off-skipped");
    let mut inline = [0u8; INLINE_BYTES];
    inline[..8].copy_from_slice(&100u64.to_le_bytes());
    raw_send(&mut one, raw(kind::SEND | kind::PIPELINED, 0, 0, inline));
    raw_send(&mut one, raw(kind::BARRIER, 0, 0, [0; INLINE_BYTES]));
    // The barrier looks past the point-to-point message, and finds it cut off.
    expect_protocol(
        zero.barrier_timeout(Duration::from_millis(500)),
        1,
        "was cut off after 0 bytes",
    );
}

#[test]
fn a_peer_flooding_messages_nobody_receives_cannot_hold_a_call_past_its_deadline() {
    let (_world, mut zero, mut one) = pair("flood");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooding = std::sync::Arc::clone(&stop);
    let flooder = std::thread::spawn(move || {
        let mut tag = 0;
        while !flooding.load(std::sync::atomic::Ordering::Relaxed) {
            let link = one.raw().link(0).unwrap();
            if link
                .to
                .try_send(raw(kind::SEND, tag, 0, [0; INLINE_BYTES]))
                .is_ok()
            {
                tag += 1;
            }
        }
        one
    });
    let start = Instant::now();
    let outcome = zero.barrier_timeout(Duration::from_millis(300));
    let took = start.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(flooder.join().unwrap());
    assert!(
        matches!(
            outcome,
            Err(Error::Timeout { ref waiting_for, .. }) if waiting_for == &[1]
        ) || matches!(outcome, Err(Error::Protocol { peer: 1, .. })),
        "{outcome:?}"
    );
    assert!(
        took < Duration::from_secs(3),
        "the flood held the barrier for {took:?}"
    );
}

#[test]
fn an_fd_ticket_naming_another_process_than_the_exporters_is_refused() {
    // A process of this uid with an fd worth stealing (its stdout).
    let mut bystander = std::process::Command::new("sleep")
        .arg("30")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (_world, mut zero, mut one) = pair("fd-steal");
    // Rank 1's ticket for the first collective names the bystander's fd 1, exactly (a process of
    // the same uid can read its (st_dev, st_ino) in /proc), so only the pid check stands between
    // rank 0 and taking it.
    let target = nix::sys::stat::stat(format!("/proc/{}/fd/1", bystander.id()).as_str()).unwrap();
    let ticket = shmbroker::bindings::FdTicket {
        pid: bystander.id(),
        fd: 1,
        dev: target.st_dev,
        ino: target.st_ino,
        token: 0,
    };
    let mut inline = [0u8; INLINE_BYTES];
    inline[..32].copy_from_slice(bytemuck::bytes_of(&ticket));
    raw_send(&mut one, raw(kind::FD_TICKET, 0, 32, inline));
    // Rank 1's status round, as it would send it (nothing failed at rank 1): rank 0 fails at
    // once after it, naming rank 1, as every other rank would.
    raw_send(&mut one, raw(kind::ALL_GATHER, 1, 48, [0u8; INLINE_BYTES]));
    let mine = std::fs::File::open("/dev/null").unwrap();
    zero.set_timeout(Duration::from_secs(2));
    match zero.exchange_fds(std::os::fd::AsFd::as_fd(&mine)) {
        Err(Error::Protocol { peer: 1, detail }) => {
            let expected = format!(
                "fd ticket names pid {}; rank 1 logged on as pid {}",
                bystander.id(),
                std::process::id()
            );
            assert!(detail.contains(&expected), "{detail}");
        }
        other => panic!("unexpected {other:?}"),
    }
    let _ = bystander.kill();
    let _ = bystander.wait();
}

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
            let got = receiver.recv_timeout(1, Duration::from_secs(20)).unwrap();
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
        .recv_timeout(2, Duration::from_millis(50))
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
        let result = receiver.recv_timeout(1, Duration::from_secs(30));
        (result, receiver)
    });
    let barrier = {
        let sender = std::sync::Arc::clone(&sender);
        std::thread::spawn(move || sender.session().barrier_timeout(Duration::from_secs(30)))
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
        receiver.recv_timeout(1, Duration::from_secs(10)).unwrap(),
        b"after"
    );
    drop((receiver, sender));
    // The barrier cut short leaves the other ranks to find rank 0 gone.
    assert!(quiet.barrier_timeout(Duration::from_secs(10)).is_err());
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
