//! Groups of ranks and shrinking after a death, between real processes: every rank is this test
//! binary started again (`groups_rank`), checking every result against a reference it computes.

use shmbroker::Collectives;
use shmbroker::ReduceOp;
use shmbroker::session::{Error, Group, Session};
use std::time::{Duration, Instant};

mod common;

/// Rank `rank`'s input for call `call`: `len` values that differ by rank, call and index.
fn input(rank: u32, call: u32, len: usize) -> Vec<i64> {
    (0..len)
        .map(|i| i64::from(rank + 1) * 1_000 + i64::from(call) * 7 + (i % 13) as i64)
        .collect()
}

/// The sum over `ranks` of their inputs for `call`.
fn sum_of(ranks: &[u32], call: u32, len: usize) -> Vec<i64> {
    let mut sum = vec![0i64; len];
    for &rank in ranks {
        for (s, x) in sum.iter_mut().zip(input(rank, call, len)) {
            *s += x;
        }
    }
    sum
}

/// Bytes that say who sent them to whom in which call.
fn block(from: u32, to: u32, call: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (from * 31 + to * 7 + call * 3 + i as u32) as u8)
        .collect()
}

/// Every collective on `group`, call number `call`, checked against references. `len` elements
/// (or bytes) per rank: small ones go in one shot, large ones through the outbox.
fn check_every_collective(session: &mut Session, group: &Group, call: u32, len: usize) {
    let ranks = group.ranks().to_vec();
    let (me, size) = (group.rank(), group.size());
    let world_me = session.rank();
    let mut on = session.on(group);
    assert_eq!((on.rank(), on.size()), (me, size));
    on.barrier().unwrap();

    let mut data = input(world_me, call, len);
    on.all_reduce(&mut data, ReduceOp::Sum).unwrap();
    assert_eq!(data, sum_of(&ranks, call, len), "all_reduce on {ranks:?}");

    let root = call % size;
    let mut data = input(world_me, call + 1, len);
    on.reduce(root, &mut data, ReduceOp::Sum).unwrap();
    if me == root {
        assert_eq!(data, sum_of(&ranks, call + 1, len), "reduce on {ranks:?}");
    } else {
        assert_eq!(
            data,
            input(world_me, call + 1, len),
            "reduce left a non-root's data"
        );
    }

    let blocks: Vec<i64> = (0..size as usize)
        .flat_map(|_| input(world_me, call + 2, len))
        .collect();
    let mut mine = vec![0i64; len];
    on.reduce_scatter(&blocks, &mut mine, ReduceOp::Sum)
        .unwrap();
    assert_eq!(
        mine,
        sum_of(&ranks, call + 2, len),
        "reduce_scatter on {ranks:?}"
    );

    let bytes = block(world_me, 0, call, len);
    let gathered = on.all_gather(&bytes).unwrap();
    for (q, part) in gathered.iter().enumerate() {
        assert_eq!(
            *part,
            block(ranks[q], 0, call, len),
            "all_gather on {ranks:?}"
        );
    }
    let mut out = vec![0u8; len * size as usize];
    on.all_gather_into(&bytes, &mut out).unwrap();
    assert_eq!(out, gathered.concat(), "all_gather_into on {ranks:?}");

    let sent = (me == root).then(|| block(world_me, 1, call, len));
    let got = on.broadcast(root, sent.as_deref()).unwrap();
    assert_eq!(
        got,
        block(ranks[root as usize], 1, call, len),
        "broadcast on {ranks:?}"
    );

    match on.gather(root, &bytes).unwrap() {
        Some(parts) => assert_eq!(parts, gathered, "gather on {ranks:?}"),
        None => assert_ne!(me, root),
    }

    let scattered: Option<Vec<u8>> = (me == root).then(|| {
        (0..size)
            .flat_map(|q| block(world_me, ranks[q as usize], call, len))
            .collect()
    });
    let mut part = vec![0u8; len];
    on.scatter(root, scattered.as_deref(), &mut part).unwrap();
    assert_eq!(
        part,
        block(ranks[root as usize], world_me, call, len),
        "scatter"
    );

    let outgoing: Vec<u8> = (0..size)
        .flat_map(|q| block(world_me, ranks[q as usize], call, len))
        .collect();
    let mut incoming = vec![0u8; outgoing.len()];
    on.all_to_all(&outgoing, &mut incoming).unwrap();
    let expected: Vec<u8> = (0..size)
        .flat_map(|q| block(ranks[q as usize], world_me, call, len))
        .collect();
    assert_eq!(incoming, expected, "all_to_all on {ranks:?}");

    // all_to_all_v: group rank q sends q + 1 bytes to everyone.
    let sends: Vec<usize> = vec![me as usize + 1; size as usize];
    let receives: Vec<usize> = (0..size as usize).map(|q| q + 1).collect();
    let input_v = vec![me as u8; sends.iter().sum()];
    let mut output_v = vec![0u8; receives.iter().sum()];
    on.all_to_all_v(&input_v, &sends, &mut output_v, &receives)
        .unwrap();
    let expected_v: Vec<u8> = (0..size as usize)
        .flat_map(|q| vec![q as u8; q + 1])
        .collect();
    assert_eq!(output_v, expected_v, "all_to_all_v on {ranks:?}");
}

/// The groups of the "overlapping" scenario that `rank` is in, in the order every rank makes
/// them: even and odd ranks (disjoint), neighbouring pairs (overlapping both), and the whole
/// world numbered backwards.
fn overlapping_groups(session: &mut Session) -> Vec<Group> {
    let (rank, world) = (session.rank(), session.world_size());
    let parity: Vec<u32> = (0..world).filter(|q| q % 2 == rank % 2).collect();
    let pair: Vec<u32> = [rank & !1, rank | 1]
        .into_iter()
        .filter(|&q| q < world)
        .collect();
    let backwards: Vec<u32> = (0..world).rev().collect();
    let mut groups = Vec::new();
    for ranks in [parity, pair, backwards] {
        let group = session.group(&ranks).unwrap();
        assert_eq!(group.ranks(), ranks);
        assert_eq!(group.world_rank(group.rank()), Some(rank));
        groups.push(group);
    }
    groups
}

/// One rank: what `SHMBROKER_TEST_SCENARIO` says.
#[test]
#[ignore = "a rank of the group tests, which start it"]
fn groups_rank() {
    let Some((scenario, mut session)) = common::rank_session() else {
        return;
    };
    let rank = session.rank();
    session.set_timeout(Duration::from_secs(30));
    let world = session.world_size();
    match scenario.as_str() {
        "overlapping" => {
            let groups = overlapping_groups(&mut session);
            // Rounds of every collective on each group in turn, and on the world between them,
            // small and past the one-shot and eager limits.
            for (call, len) in [(0, 1), (10, 37), (20, 3000), (30, 70_000)] {
                for group in &groups {
                    check_every_collective(&mut session, group, call, len);
                }
                let mut data = input(rank, call, 5);
                session.all_reduce(&mut data, ReduceOp::Sum).unwrap();
                assert_eq!(data, sum_of(&(0..world).collect::<Vec<_>>(), call, 5));
            }
        }
        "interleaved" => {
            // Groups A = {0, 1} and B = {1, 2}. Rank 1 calls B's all-reduce first, then A's;
            // rank 0's A message reaches rank 1 while it waits on B, and must wait its turn.
            let a = (rank <= 1).then(|| session.group(&[0, 1]).unwrap());
            let b = (rank >= 1).then(|| session.group(&[1, 2]).unwrap());
            for call in 0..50 {
                let run = |session: &mut Session, group: &Group| {
                    let mut data = input(rank, call, 3);
                    session
                        .on(group)
                        .all_reduce(&mut data, ReduceOp::Sum)
                        .unwrap();
                    assert_eq!(data, sum_of(group.ranks(), call, 3), "call {call}");
                };
                match rank {
                    0 => run(&mut session, a.as_ref().unwrap()),
                    1 => {
                        run(&mut session, b.as_ref().unwrap());
                        run(&mut session, a.as_ref().unwrap());
                    }
                    _ => run(&mut session, b.as_ref().unwrap()),
                }
            }
        }
        "mismatch" => {
            // Rank 2 numbers the group otherwise: every rank's call fails naming one that
            // disagrees with it.
            let ranks: &[u32] = if rank == 2 { &[0, 2, 1] } else { &[0, 1, 2] };
            match session.group(ranks) {
                Err(Error::GroupMismatch { peer, found, .. }) => {
                    eprintln!("MISMATCH {peer} {found:?}");
                }
                other => panic!("rank {rank}: {other:?}"),
            }
            // Misuse is refused before anything is sent.
            let error = session.group(&[(rank + 1) % world]).unwrap_err();
            assert!(matches!(error, Error::Misuse(_)), "{error}");
            let error = session.group(&[rank, rank]).unwrap_err();
            assert!(matches!(error, Error::Misuse(_)), "{error}");
            let error = session.group(&[rank, world]).unwrap_err();
            assert!(matches!(error, Error::RankOutOfRange { .. }), "{error}");
        }
        "death-in-another-group" => {
            // A = {0, 1}, B = {2, 3}. Rank 3 dies; B's collective names it; A carries on, and
            // the world's collectives name it.
            let group = session
                .group(if rank < 2 { &[0, 1] } else { &[2, 3] })
                .unwrap();
            common::barrier_before_deaths(&mut session, &[3]);
            if rank == 3 {
                nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).unwrap();
            }
            if rank == 2 {
                let mut data = input(rank, 0, 1000);
                let error = session.on(&group).all_reduce(&mut data, ReduceOp::Sum);
                assert!(
                    matches!(error, Err(Error::PeerLost { rank: 3, .. })),
                    "{error:?}"
                );
                for to in [0, 1] {
                    session.send(to, b"3 died").unwrap();
                }
            } else {
                // Large all-gathers on A while rank 3 dies (their chunks are in flight then),
                // and after.
                let part = vec![rank as u8; 4 << 20];
                for _ in 0..10 {
                    let parts = session.on(&group).all_gather(&part).unwrap();
                    assert!(
                        parts[1 - rank as usize]
                            .iter()
                            .all(|&b| b == 1 - rank as u8)
                    );
                }
                assert_eq!(session.recv(2).unwrap(), b"3 died");
                for call in 0..20 {
                    let mut data = input(rank, call, 1000);
                    session
                        .on(&group)
                        .all_reduce(&mut data, ReduceOp::Sum)
                        .unwrap();
                    assert_eq!(data, sum_of(&[0, 1], call, 1000));
                }
                let error = session.barrier().unwrap_err();
                assert!(matches!(error, Error::PeerLost { rank: 3, .. }), "{error}");
            }
        }
        "shrink" | "shrink-large" => {
            // The last rank dies before it contributes to an all-reduce; the others are told
            // within milliseconds, shrink, and sum among themselves.
            let len = if scenario == "shrink" { 300 } else { 1 << 20 };
            let dead = world - 1;
            let mut data = input(rank, 0, len);
            common::barrier_before_deaths(&mut session, &[dead]);
            if rank == dead {
                nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).unwrap();
            }
            let started = Instant::now();
            let error = session.all_reduce(&mut data, ReduceOp::Sum).unwrap_err();
            assert!(
                matches!(error, Error::PeerLost { rank, .. } if rank == dead),
                "{error}"
            );
            eprintln!("rank {rank}: told in {:?}", started.elapsed());
            let survivors = session.shrink().unwrap();
            let alive: Vec<u32> = (0..dead).collect();
            assert_eq!(survivors.ranks(), alive);
            for call in 1..4 {
                let mut data = input(rank, call, len);
                session
                    .on(&survivors)
                    .all_reduce(&mut data, ReduceOp::Sum)
                    .unwrap();
                assert!(data == sum_of(&alive, call, len), "call {call}");
            }
            check_every_collective(&mut session, &survivors, 40, 100);
        }
        "shrink-after-pipelined" => {
            // The last rank dies a moment into an all-gather of 8 MiB parts, which the others
            // are streaming to each other in chunks: each is cut off mid-message. The survivors
            // shrink, and large collectives among them go through (the chunks of the cut-off
            // messages are dropped, not taken for the new ones').
            let delay: u64 = std::env::var("SHMBROKER_TEST_DELAY_US")
                .unwrap()
                .parse()
                .unwrap();
            let dead = world - 1;
            let part = vec![rank as u8; 8 << 20];
            common::barrier_before_deaths(&mut session, &[dead]);
            if rank == dead {
                std::thread::sleep(Duration::from_micros(delay));
                nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).unwrap();
            }
            let error = session.all_gather(&part).unwrap_err();
            assert!(
                matches!(error, Error::PeerLost { rank, .. } if rank == dead),
                "{error}"
            );
            let survivors = session.shrink().unwrap();
            let alive: Vec<u32> = (0..dead).collect();
            assert_eq!(survivors.ranks(), alive);
            let mut on = session.on(&survivors);
            let parts = on.all_gather(&part).unwrap();
            for (q, got) in parts.iter().enumerate() {
                assert!(
                    got.len() == part.len() && got.iter().all(|&b| b == q as u8),
                    "part {q}"
                );
            }
            let sent = (rank == 0).then(|| vec![7u8; 8 << 20]);
            let got = on.broadcast(0, sent.as_deref()).unwrap();
            assert!(
                got.len() == 8 << 20 && got.iter().all(|&b| b == 7),
                "broadcast"
            );
            let mut data = input(rank, 1, 1 << 20);
            on.all_reduce(&mut data, ReduceOp::Sum).unwrap();
            assert!(data == sum_of(&alive, 1, 1 << 20), "all_reduce");
            // Point-to-point messages among the survivors go on too.
            let peer = 1 - rank;
            session.send(peer, &part).unwrap();
            assert_eq!(session.recv(peer).unwrap(), vec![peer as u8; 8 << 20]);
        }
        "shrink-nobody-died" => {
            let everyone = session.shrink().unwrap();
            assert_eq!(everyone.ranks(), (0..world).collect::<Vec<_>>());
            check_every_collective(&mut session, &everyone, 0, 10);
        }
        "shrink-death-during" => {
            // The last rank dies; then rank 1 dies at a moment of its own (a delay from the
            // environment) around the survivors' shrink. A survivor's shrink gives a group or
            // names a dead rank; once both deaths are known, every survivor decides alike
            // whether to shrink again (a group with a dead rank in it, or an error), and all end
            // with the same group, on which they sum right.
            let delay: u64 = std::env::var("SHMBROKER_TEST_DELAY_US")
                .unwrap()
                .parse()
                .unwrap();
            common::barrier_before_deaths(&mut session, &[1, world - 1]);
            if rank == world - 1 {
                nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).unwrap();
            }
            if rank == 1 {
                std::thread::sleep(Duration::from_micros(delay));
                nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).unwrap();
            }
            let mut data = input(rank, 0, 10);
            let _ = session.all_reduce(&mut data, ReduceOp::Sum).unwrap_err();
            let started = Instant::now();
            let mut outcome = session.shrink();
            let first = started.elapsed();
            let known = Instant::now();
            let dead = [1, world - 1];
            while dead.iter().any(|&q| session.raw().departure(q).is_none()) {
                assert!(
                    known.elapsed() < Duration::from_secs(10),
                    "{dead:?} never seen dead"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            // A survivor may have agreed before it knew of both deaths: then its group has a dead
            // member in it, or making the group named one.
            let mut shrinks = 1;
            let group = loop {
                match outcome {
                    Ok(group) if !group.ranks().iter().any(|q| dead.contains(q)) => break group,
                    Ok(_) | Err(Error::PeerLost { rank: 1 | 4, .. }) => {
                        shrinks += 1;
                        assert!(shrinks <= 3, "rank {rank}: {shrinks} shrinks");
                        outcome = session.shrink();
                    }
                    Err(error) => panic!("rank {rank}: {error}"),
                }
            };
            let mut data = input(rank, 1, 10);
            session
                .on(&group)
                .all_reduce(&mut data, ReduceOp::Sum)
                .unwrap();
            assert_eq!(data, sum_of(group.ranks(), 1, 10));
            eprintln!(
                "GROUP {:?} after {shrinks} shrinks, the first in {first:?}",
                group.ranks()
            );
        }
        other => panic!("no scenario {other}"),
    }
}

/// Runs `scenario` in a world of `world` processes and returns each rank's (success, stderr).
fn run_world(name: &str, world: u32, scenario: &str, env: &[(&str, &str)]) -> Vec<(bool, String)> {
    common::run_ranks("groups_rank", name, world, scenario, env)
}

/// Runs `scenario` and checks that exactly the ranks in `dead` failed.
fn run_expecting(name: &str, world: u32, scenario: &str, dead: &[u32]) -> Vec<String> {
    run_world(name, world, scenario, &[])
        .into_iter()
        .zip(0..)
        .map(|((ok, stderr), rank)| {
            assert_eq!(ok, !dead.contains(&rank), "rank {rank}: {stderr}");
            stderr
        })
        .collect()
}

#[test]
fn overlapping_and_disjoint_groups_run_every_collective_interleaved_with_the_world() {
    for world in [1, 2, 5, 6] {
        run_expecting(&format!("groups-{world}"), world, "overlapping", &[]);
    }
}

#[test]
fn groups_of_more_than_eight_use_the_trees() {
    // Ten ranks: the world numbered backwards is a group of ten, past the flat limits.
    run_expecting("groups-10", 10, "overlapping", &[]);
}

#[test]
fn a_message_of_one_group_waits_while_its_receiver_is_on_another() {
    run_expecting("groups-interleaved", 3, "interleaved", &[]);
}

#[test]
fn a_member_that_passes_other_ranks_is_named() {
    let stderrs = run_expecting("groups-mismatch", 3, "mismatch", &[]);
    let named: Vec<String> = stderrs
        .iter()
        .map(|stderr| {
            stderr
                .lines()
                .find(|line| line.starts_with("MISMATCH"))
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    // Ranks 0 and 1 each hear rank 2's other order; rank 2 hears rank 0's first.
    assert_eq!(named[0], "MISMATCH 2 [0, 2, 1]", "{named:?}");
    assert_eq!(named[1], "MISMATCH 2 [0, 2, 1]", "{named:?}");
    assert_eq!(named[2], "MISMATCH 0 [0, 1, 2]", "{named:?}");
}

#[test]
fn a_death_fails_the_groups_it_is_in_and_no_other() {
    run_expecting("groups-death", 4, "death-in-another-group", &[3]);
}

#[test]
fn survivors_shrink_after_a_death_and_reduce_among_themselves() {
    for (world, scenario) in [
        (2, "shrink"),
        (4, "shrink"),
        (5, "shrink"),
        (3, "shrink-large"),
    ] {
        let stderrs = run_expecting(
            &format!("groups-{scenario}-{world}"),
            world,
            scenario,
            &[world - 1],
        );
        for stderr in &stderrs[..world as usize - 1] {
            let told = stderr.lines().find(|line| line.contains("told in"));
            println!("world {world} {scenario}: {}", told.unwrap_or("?"));
        }
    }
}

#[test]
fn survivors_shrink_after_a_death_that_cut_their_large_transfers_off_between_chunks() {
    for delay in [0, 2_000, 10_000, 40_000] {
        let delay_text = delay.to_string();
        let results = run_world(
            &format!("groups-shrink-pipelined-{delay}"),
            3,
            "shrink-after-pipelined",
            &[("SHMBROKER_TEST_DELAY_US", &delay_text)],
        );
        let all: Vec<&str> = results.iter().map(|(_, stderr)| stderr.as_str()).collect();
        for (rank, (ok, _)) in results.iter().enumerate() {
            assert_eq!(*ok, rank != 2, "delay {delay}, rank {rank}: {all:#?}");
        }
    }
}

#[test]
fn shrinking_with_nobody_dead_gives_the_world() {
    run_expecting("groups-shrink-all", 3, "shrink-nobody-died", &[]);
}

#[test]
fn a_death_during_shrink_still_leaves_every_survivor_the_same_group() {
    // Rank 1 dies at moments spread around the others' shrink: before, during, after.
    for delay in [0, 200, 1_000, 3_000, 10_000, 30_000] {
        let delay_text = delay.to_string();
        let results = run_world(
            &format!("groups-shrink-during-{delay}"),
            5,
            "shrink-death-during",
            &[("SHMBROKER_TEST_DELAY_US", &delay_text)],
        );
        let mut groups = Vec::new();
        let all: Vec<&str> = results.iter().map(|(_, stderr)| stderr.as_str()).collect();
        for (rank, (ok, stderr)) in results.iter().enumerate() {
            assert_eq!(
                *ok,
                rank != 1 && rank != 4,
                "delay {delay}, rank {rank}: {all:#?}"
            );
            if *ok {
                let line = stderr
                    .lines()
                    .find(|line| line.starts_with("GROUP"))
                    .unwrap();
                println!("delay {delay} us, rank {rank}: {line}");
                groups.push(line.split(" after").next().unwrap().to_owned());
            }
        }
        assert!(
            groups.iter().all(|g| *g == "GROUP [0, 2, 3]"),
            "delay {delay}: {groups:?}"
        );
    }
}
