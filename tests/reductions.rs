//! Reductions, scatter and all-to-all between real processes: every rank is this test binary
//! started again (`reductions_rank`), checking its results against references it computes
//! from every rank's inputs, and that every rank holds the same bits.

use shmbroker::Collectives;
use shmbroker::half::{bf16, f16};
use shmbroker::session::{Error, Session};
use shmbroker::{DType, Element, ReduceOp};
use std::time::Duration;

mod common;

/// Elements of the inputs a world checks every type and operation at: empty, one, odd, not a
/// multiple of any world size here, and past the one-shot limit for every type but `u8`/`i8`.
const LENGTHS: [usize; 5] = [0, 1, 37, 1001, 9001];

/// Rank `rank`'s input element `i` (any bit pattern is a valid input of every type).
fn input<T: Element>(rank: usize, len: usize, seed: u64) -> Vec<T> {
    let size = size_of::<T>();
    let mut bytes = vec![0u8; len * size];
    for (i, element) in bytes.chunks_mut(size).enumerate() {
        let x = (i as u64 ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ ((rank as u64 + 1) * 0x0001_2345);
        element.copy_from_slice(&x.to_le_bytes()[..size]);
    }
    let mut values: Vec<T> = bytes
        .chunks(size)
        .map(bytemuck::pod_read_unaligned)
        .collect();
    // Floats: small numbers with a NaN and infinities now and then (random bits are mostly
    // huge or NaN, and would test little).
    if matches!(T::DTYPE, DType::F16 | DType::BF16 | DType::F32 | DType::F64) {
        for (i, value) in values.iter_mut().enumerate() {
            let x = match (i + rank) % 97 {
                0 if rank == 1 => f64::NAN,
                1 => f64::INFINITY,
                2 if rank == 0 => f64::NEG_INFINITY,
                _ => ((i * 31 + rank * 17) % 41) as f64 / 4.0 - 5.0,
            };
            *value = float::<T>(x);
        }
    }
    values
}

fn float<T: Element>(x: f64) -> T {
    let bytes: Vec<u8> = match T::DTYPE {
        DType::F16 => f16::from_f64(x).to_le_bytes().to_vec(),
        DType::BF16 => bf16::from_f64(x).to_le_bytes().to_vec(),
        DType::F32 => (x as f32).to_le_bytes().to_vec(),
        _ => x.to_le_bytes().to_vec(),
    };
    bytemuck::pod_read_unaligned(&bytes)
}

/// The reference: a fold in rank order, element by element, written out per type.
trait Reference: Element {
    fn fold(op: ReduceOp, values: &[Self]) -> Self;
}

/// Every rank's `inputs` combined by `op`, element by element, as the reference computes it.
fn reference<T: Reference>(op: ReduceOp, inputs: &[Vec<T>]) -> Vec<T> {
    (0..inputs[0].len())
        .map(|i| {
            let column: Vec<T> = inputs.iter().map(|input| input[i]).collect();
            T::fold(op, &column)
        })
        .collect()
}

macro_rules! integer_reference {
    ($($t:ty),*) => {$(
        impl Reference for $t {
            fn fold(op: ReduceOp, values: &[$t]) -> $t {
                values[1..].iter().fold(values[0], |a, &b| match op {
                    ReduceOp::Sum => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::BitAnd => a & b,
                    ReduceOp::BitOr => a | b,
                    ReduceOp::BitXor => a ^ b,
                    _ => unreachable!("no {op:?} of integers"),
                })
            }
        }
    )*};
}
integer_reference!(u8, i8, u16, i16, u32, i32, u64, i64);

macro_rules! float_reference {
    ($($t:ty, $acc:ty, $to:expr, $from:expr);*) => {$(
        impl Reference for $t {
            fn fold(op: ReduceOp, values: &[$t]) -> $t {
                let first: $acc = $to(values[0]);
                let folded = values[1..].iter().fold(first, |a, &b| {
                    let b: $acc = $to(b);
                    if (a.is_nan() || b.is_nan()) && matches!(op, ReduceOp::Min | ReduceOp::Max) {
                        return <$acc>::NAN;
                    }
                    match op {
                        ReduceOp::Sum | ReduceOp::Avg => a + b,
                        ReduceOp::Prod => a * b,
                        ReduceOp::Min => a.min(b),
                        ReduceOp::Max => a.max(b),
                        _ => unreachable!("no {op:?} of floats"),
                    }
                });
                let folded = if op == ReduceOp::Avg { folded / values.len() as $acc } else { folded };
                // Every NaN result is the one quiet NaN (see `shmbroker::reduce`).
                $from(if folded.is_nan() { <$acc>::NAN } else { folded })
            }
        }
    )*};
}
float_reference!(
    f32, f32, |x| x, |x| x;
    f64, f64, |x| x, |x| x;
    f16, f32, f16::to_f32, f16::from_f32;
    bf16, f32, bf16::to_f32, bf16::from_f32
);

fn bits<T: Element>(values: &[T]) -> &[u8] {
    bytemuck::cast_slice(values)
}

/// Every rank's result has the same bits as this rank's.
fn same_everywhere(session: &mut Session, bytes: &[u8], what: &str) {
    let hash = common::fnv1a(bytes);
    let hashes = session.all_gather_pod(&hash).unwrap();
    assert!(
        hashes.iter().all(|&h| h == hash),
        "{what}: ranks differ: {hashes:x?}"
    );
}

fn check_type<T: Reference>(session: &mut Session, len: usize, seed: u64) {
    let (rank, world) = (session.rank() as usize, session.world_size() as usize);
    let inputs: Vec<Vec<T>> = (0..world).map(|q| input::<T>(q, len, seed)).collect();
    for op in ReduceOp::ALL {
        let what = format!("{op:?} of {len} {}", T::DTYPE.name());
        let mut data = inputs[rank].clone();
        let supported = session.all_reduce(&mut data, op);
        if matches!(
            (T::DTYPE, op),
            (
                DType::F16 | DType::BF16 | DType::F32 | DType::F64,
                ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor
            )
        ) || (op == ReduceOp::Avg
            && !matches!(T::DTYPE, DType::F16 | DType::BF16 | DType::F32 | DType::F64))
        {
            assert!(
                matches!(supported, Err(Error::Misuse(_))),
                "{what}: {supported:?}"
            );
            continue;
        }
        supported.unwrap();
        let expected = reference(op, &inputs);
        assert!(
            bits(&data) == bits(&expected),
            "{what}: wrong result on rank {rank}"
        );
        same_everywhere(session, bits(&data), &what);

        // The root alone gets a reduce; the others keep their data.
        let root = (len % world) as u32;
        let mut data = inputs[rank].clone();
        session.reduce(root, &mut data, op).unwrap();
        let want = if rank == root as usize {
            &expected
        } else {
            &inputs[rank]
        };
        assert!(
            bits(&data) == bits(want),
            "reduce {what} at root {root}: rank {rank}"
        );

        // Rank r gets block r of a reduce-scatter of `world` blocks of `len` elements.
        let blocks: Vec<Vec<T>> = (0..world)
            .map(|q| (0..world).flat_map(|_| inputs[q].iter().copied()).collect())
            .collect();
        let mut block = vec![T::zeroed(); len];
        session
            .reduce_scatter(&blocks[rank], &mut block, op)
            .unwrap();
        assert!(
            bits(&block) == bits(&expected),
            "reduce_scatter {what}: rank {rank}"
        );
    }
}

fn check_every_type(session: &mut Session, len: usize) {
    check_type::<u8>(session, len, 1);
    check_type::<i8>(session, len, 2);
    check_type::<u16>(session, len, 3);
    check_type::<i16>(session, len, 4);
    check_type::<u32>(session, len, 5);
    check_type::<i32>(session, len, 6);
    check_type::<u64>(session, len, 7);
    check_type::<i64>(session, len, 8);
    check_type::<f16>(session, len, 9);
    check_type::<bf16>(session, len, 10);
    check_type::<f32>(session, len, 11);
    check_type::<f64>(session, len, 12);
}

/// Block `q` of rank `r`'s all-to-all input: its own bytes.
fn block_of(from: usize, to: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (from * 31 + to * 7 + i) as u8).collect()
}

fn check_moves(session: &mut Session) {
    let (rank, world) = (session.rank() as usize, session.world_size() as usize);
    // all_to_all: 1023 and 300 000 go pairwise; 1024 to 256 KiB are lent (LEND_MIN_BLOCK_BYTES,
    // LEND_MAX_BLOCK_BYTES), in several pieces from 6 ranks up.
    for len in [0, 1, 100, 1023, 1024, 5000, 262_144, 300_000] {
        let input: Vec<u8> = (0..world).flat_map(|to| block_of(rank, to, len)).collect();
        let mut output = vec![0u8; input.len()];
        session.all_to_all(&input, &mut output).unwrap();
        let expected: Vec<u8> = (0..world)
            .flat_map(|from| block_of(from, rank, len))
            .collect();
        assert!(output == expected, "all_to_all of {len}: rank {rank}");

        // Counts that differ per pair: rank r sends (r + q) % 3 * len / 2 bytes to rank q.
        let count = |from: usize, to: usize| (from + to) % 3 * len / 2;
        let sends: Vec<usize> = (0..world).map(|to| count(rank, to)).collect();
        let receives: Vec<usize> = (0..world).map(|from| count(from, rank)).collect();
        let input: Vec<u8> = (0..world)
            .flat_map(|to| block_of(rank, to, count(rank, to)))
            .collect();
        let mut output = vec![0u8; receives.iter().sum()];
        session
            .all_to_all_v(&input, &sends, &mut output, &receives)
            .unwrap();
        let expected: Vec<u8> = (0..world)
            .flat_map(|from| block_of(from, rank, count(from, rank)))
            .collect();
        assert!(output == expected, "all_to_all_v of {len}: rank {rank}");

        let root = (len % world) as u32;
        let blocks: Vec<u8> = (0..world).flat_map(|to| block_of(99, to, len)).collect();
        let mut block = vec![0u8; len];
        let input = (rank == root as usize).then_some(blocks.as_slice());
        session.scatter(root, input, &mut block).unwrap();
        assert!(
            block == block_of(99, rank, len),
            "scatter of {len}: rank {rank}"
        );
    }
}

/// 2x2 matrix products (which do not commute) come out in rank order.
fn check_user_operation(session: &mut Session) {
    let (rank, world) = (session.rank() as usize, session.world_size() as usize);
    let matrix = |q: usize| -> [i64; 4] { [1, (q % 3) as i64, (q % 2) as i64, 1] };
    let product = |acc: &mut [[i64; 4]], next: &[[i64; 4]]| {
        for (a, b) in acc.iter_mut().zip(next) {
            *a = [
                a[0].wrapping_mul(b[0])
                    .wrapping_add(a[1].wrapping_mul(b[2])),
                a[0].wrapping_mul(b[1])
                    .wrapping_add(a[1].wrapping_mul(b[3])),
                a[2].wrapping_mul(b[0])
                    .wrapping_add(a[3].wrapping_mul(b[2])),
                a[2].wrapping_mul(b[1])
                    .wrapping_add(a[3].wrapping_mul(b[3])),
            ];
        }
    };
    let expected = (1..world).fold(matrix(0), |acc, q| {
        let mut acc = [acc];
        product(&mut acc, &[matrix(q)]);
        acc[0]
    });
    for len in [1, 3000] {
        let mut data = vec![matrix(rank); len];
        session.all_reduce_with(&mut data, product).unwrap();
        assert!(
            data.iter().all(|&m| m == expected),
            "matrix product of {len}"
        );
    }
}

/// One rank: what `SHMBROKER_TEST_SCENARIO` says.
#[test]
#[ignore = "a rank of the reduction tests, which start it"]
fn reductions_rank() {
    let Some((scenario, mut session)) = common::rank_session() else {
        return;
    };
    let rank = session.rank();
    session.set_timeout(Duration::from_secs(60));
    match scenario.as_str() {
        "every-type" => {
            for len in LENGTHS {
                check_every_type(&mut session, len);
            }
            check_moves(&mut session);
            check_user_operation(&mut session);
        }
        "large" => {
            // 1 MiB and 64 MiB of f32: the two-shot path, piece by piece.
            for len in [1 << 18, 16 << 20] {
                check_type_op::<f32>(&mut session, len, ReduceOp::Sum);
            }
            check_type_op::<bf16>(&mut session, 1 << 19, ReduceOp::Avg);
            // A reduce-scatter of 1 Mi elements per block (4 MiB, and the input 4 MiB per rank).
            let (rank, world) = (session.rank() as usize, session.world_size() as usize);
            let len = 1 << 20;
            let input: Vec<i32> = (0..len * world)
                .map(|i| (i % 1000) as i32 * (rank as i32 + 1))
                .collect();
            let mut block = vec![0i32; len];
            session
                .reduce_scatter(&input, &mut block, ReduceOp::Sum)
                .unwrap();
            let factor = (world * (world + 1) / 2) as i32;
            let right = (0..len).all(|i| block[i] == ((rank * len + i) % 1000) as i32 * factor);
            assert!(right, "large reduce_scatter: rank {rank}");
            // An all-to-all of 3 MiB blocks (and an odd length): pairwise, in chunks.
            let len = (3 << 20) + 13;
            let input: Vec<u8> = (0..world).flat_map(|to| block_of(rank, to, len)).collect();
            let mut output = vec![0u8; input.len()];
            session.all_to_all(&input, &mut output).unwrap();
            let right =
                (0..world).all(|from| output[from * len..][..len] == block_of(from, rank, len));
            assert!(right, "large all_to_all: rank {rank}");
        }
        "symmetric" => check_symmetric(&mut session),
        "symmetric-killed" => {
            // Rank 2 dies before it contributes to an all-reduce of symmetric buffers; the
            // survivors name it, shrink, and sum on the same buffers.
            let mut data = session.symmetric::<i32>(1 << 20).unwrap();
            data.fill(rank as i32 + 1);
            rank_2_dies_before_it_contributes(&mut session, &mut data);
            let survivors = session.shrink().unwrap();
            let world = session.world_size() as i32;
            for round in 0..3 {
                data.fill(rank as i32 + 1 + round);
                session
                    .on(&survivors)
                    .all_reduce(&mut data, ReduceOp::Sum)
                    .unwrap();
                let want = world * (world + 1) / 2 - 3 + round * (world - 1);
                assert!(
                    data.iter().all(|&x| x == want),
                    "rank {rank}, round {round}: {} where {want} was due",
                    data[0]
                );
            }
        }
        "killed" => {
            // Rank 2 dies before it contributes; every other rank's all-reduce names it.
            rank_2_dies_before_it_contributes(&mut session, &mut vec![1.0f32; 1 << 20]);
        }
        // Rank 1 passes one element more than the others; each rank reports how its call ended
        // (see `a_rank_that_passes_another_length_is_named_by_every_other`).
        "mismatch-small" | "mismatch-edge" | "mismatch-lent" | "mismatch-large" => {
            // One shot through the rings; rank 1 alone one shot read in place (it passes one
            // element past the rings' bound), so the ranks take different paths; one shot read
            // in place; two shots.
            let len = match scenario.as_str() {
                "mismatch-small" => 4,
                "mismatch-edge" => shmbroker::session::tuning::ALL_REDUCE_SLOTS_MAX_BYTES / 4,
                "mismatch-lent" => 1024,
                _ => 1 << 18,
            };
            let mut data = vec![1.0f32; len + usize::from(rank == 1)];
            // Everyone is in before the call: a rank that fails and exits while a slower one is
            // still logging on is another story (see the closing note of this stop).
            session.barrier().unwrap();
            report(rank, &session.all_reduce(&mut data, ReduceOp::Sum));
        }
        "mismatch-symmetric" => {
            // Two shots on symmetric buffers: each peer is lent only its slice, which is as long
            // on rank 1 (3n + 1 elements) as on the others (3n) for rank 0; the loan says how
            // long the whole is.
            let len = 3 * (1 << 16) + usize::from(rank == 1);
            let mut data = session.symmetric::<f32>(len).unwrap();
            data.fill(1.0);
            session.barrier().unwrap();
            report(rank, &session.all_reduce(&mut data, ReduceOp::Sum));
        }
        "mismatch-pieces" => {
            // Rank 1 makes two calls of 1 MiB where the others make one of 2 MiB: the same
            // pieces, which say how long their call is (found by a red team: before, every call
            // returned Ok with rank 1's second call in the others' second half).
            let mut data = vec![1.0f32; 1 << 19];
            session.barrier().unwrap();
            let mut ended = Ok(());
            for half in data.chunks_mut(if rank == 1 { 1 << 18 } else { 1 << 19 }) {
                ended = session.all_reduce(half, ReduceOp::Sum);
                if ended.is_err() {
                    break;
                }
            }
            report(rank, &ended);
        }
        "mismatch-reduce-scatter" => {
            // Rank 1's whole loan (3 blocks of n) is as long as one block of the others' (3n).
            let world = session.world_size() as usize;
            let block = if rank == 1 { 1 << 13 } else { 3 << 13 };
            let input = vec![1.0f32; block * world];
            let mut output = vec![0f32; block];
            session.barrier().unwrap();
            report(
                rank,
                &session.reduce_scatter(&input, &mut output, ReduceOp::Sum),
            );
        }
        "mismatch-lent-blocks" => {
            // all_to_all of lent blocks: rank 1's blocks are one byte longer.
            let world = session.world_size() as usize;
            let block =
                shmbroker::session::tuning::LEND_MIN_BLOCK_BYTES * 4 + usize::from(rank == 1);
            let input = vec![7u8; block * world];
            let mut output = vec![0u8; block * world];
            session.barrier().unwrap();
            report(rank, &session.all_to_all(&input, &mut output));
        }
        "mismatch-blocks" => {
            // all_to_all_v: rank 1 sends 3 bytes where every other rank expects 2.
            let world = session.world_size() as usize;
            let sends = vec![if rank == 1 { 3 } else { 2 }; world];
            let receives = vec![2; world];
            let input = vec![7u8; sends.iter().sum()];
            let mut output = vec![0u8; receives.iter().sum()];
            session.barrier().unwrap();
            report(
                rank,
                &session.all_to_all_v(&input, &sends, &mut output, &receives),
            );
        }
        other => panic!("no scenario {other}"),
    }
}

/// Symmetric buffers: ranks with and without them in one call, sizes from none to many pieces,
/// rounds that rewrite the buffer at once, a group, and every piece read in place.
fn check_symmetric(session: &mut Session) {
    let (rank, world) = (session.rank() as usize, session.world_size() as usize);
    // Rank 1 (and every third from it) keeps its data in a Vec; the others in symmetric
    // buffers. Then every rank does.
    for mixed in [true, false] {
        let symmetric = !mixed || rank % 3 != 1;
        for len in [0, 1, 1000, 20_000, (3 << 18) + 5] {
            // A world of one sends nothing.
            // Up to LENT_ONE_SHOT_MAX_BYTES of all contributions, one shot copies them.
            let pieces = if world == 1
                || len * 4 <= shmbroker::session::tuning::ONE_SHOT_MAX_BYTES
                || len * 4 * world <= shmbroker::session::tuning::LENT_ONE_SHOT_MAX_BYTES
            {
                0
            } else {
                (len * 4).div_ceil(shmbroker::session::tuning::PIECE_MAX_BYTES) as u64
            };
            let mut sym = session.symmetric::<i32>(len).unwrap();
            let mut plain = vec![0i32; len];
            for round in 0..5 {
                let data: &mut [i32] = if symmetric { &mut sym } else { &mut plain };
                let value = |q: usize, i: usize| ((i * 7 + round) % 1000) as i32 * (q as i32 + 1);
                for (i, x) in data.iter_mut().enumerate() {
                    *x = value(rank, i);
                }
                let before = session.reductions_read_in_place();
                session.all_reduce(data, ReduceOp::Sum).unwrap();
                let factor = (world * (world + 1) / 2) as i32;
                let wrong = (0..len).find(|&i| data[i] != value(0, i) * factor);
                assert!(
                    wrong.is_none(),
                    "mixed {mixed}, {len} elements, round {round}: rank {rank} element {wrong:?}"
                );
                let read = session.reductions_read_in_place() - before;
                let due = if symmetric { pieces } else { 0 };
                assert_eq!(
                    read, due,
                    "{len} elements, round {round}: pieces read in place"
                );
            }
        }
    }
    // f32 and bf16 against the reference, bit for bit on every rank, on a group of all ranks.
    let everyone: Vec<u32> = (0..world as u32).collect();
    let group = session.group(&everyone).unwrap();
    for (len, op) in [(1 << 18, ReduceOp::Sum), ((1 << 18) + 3, ReduceOp::Max)] {
        let inputs: Vec<Vec<f32>> = (0..world).map(|q| input::<f32>(q, len, 5)).collect();
        let mut sym = session.symmetric::<f32>(len).unwrap();
        sym.copy_from_slice(&inputs[rank]);
        session.on(&group).all_reduce(&mut sym, op).unwrap();
        let expected = reference(op, &inputs);
        assert!(
            bits(&sym) == bits(&expected),
            "{op:?} of {len} f32: rank {rank}"
        );
        same_everywhere(session, bits(&sym), "symmetric f32");
    }
    let inputs: Vec<Vec<bf16>> = (0..world).map(|q| input::<bf16>(q, 1 << 19, 6)).collect();
    let mut sym = session.symmetric::<bf16>(1 << 19).unwrap();
    sym.copy_from_slice(&inputs[rank]);
    session.all_reduce(&mut sym, ReduceOp::Avg).unwrap();
    let expected = reference(ReduceOp::Avg, &inputs);
    assert!(bits(&sym) == bits(&expected), "Avg of bf16: rank {rank}");
    // A symmetric buffer sent by reference afterwards: its bytes as they are.
    let sum = sym.to_vec();
    if world > 1 {
        if rank == 0 {
            session.send_loan(1, sym.into_loan()).unwrap();
        } else if rank == 1 {
            let view = session.recv_loan(0).unwrap();
            assert!(&*view == bits(&sum), "the loan's bytes");
        }
    }
}

/// Rank 2 dies after a barrier, before it contributes to an all-reduce of `data`; every other
/// rank's all-reduce fails naming it.
fn rank_2_dies_before_it_contributes<T: Element>(session: &mut Session, data: &mut [T]) {
    let rank = session.rank();
    common::barrier_before_deaths(session, &[2]);
    if rank == 2 {
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).unwrap();
    }
    let error = session.all_reduce(data, ReduceOp::Sum).unwrap_err();
    assert!(
        matches!(error, Error::PeerLost { rank: 2, .. }),
        "rank {rank}: {error}"
    );
}

/// Says on stderr how this rank's call ended: `ENDED protocol R`, `ENDED left R` or `ENDED other`.
fn report<T: std::fmt::Debug>(rank: u32, outcome: &Result<T, Error>) {
    match outcome {
        Err(Error::Protocol { peer, .. }) => eprintln!("ENDED protocol {peer}"),
        Err(Error::PeerLeft { rank: left, .. }) => eprintln!("ENDED left {left}"),
        other => eprintln!("ENDED other (rank {rank}: {other:?})"),
    }
}

fn check_type_op<T: Reference>(session: &mut Session, len: usize, op: ReduceOp) {
    let (rank, world) = (session.rank() as usize, session.world_size() as usize);
    let inputs: Vec<Vec<T>> = (0..world).map(|q| input::<T>(q, len, 77)).collect();
    let mut data = inputs[rank].clone();
    session.all_reduce(&mut data, op).unwrap();
    let expected = reference(op, &inputs);
    assert!(
        bits(&data) == bits(&expected),
        "{op:?} of {len}: rank {rank}"
    );
    same_everywhere(session, bits(&data), "large");
}

/// Runs `scenario` in a world of `world` processes and returns each rank's (success, stderr).
fn run_world(name: &str, world: u32, scenario: &str) -> Vec<(bool, String)> {
    run_world_with(name, world, scenario, &[])
}

/// [`run_world`] with variables `env` set for every rank.
fn run_world_with(
    name: &str,
    world: u32,
    scenario: &str,
    env: &[(&str, &str)],
) -> Vec<(bool, String)> {
    common::run_ranks("reductions_rank", name, world, scenario, env)
}

fn all_pass(name: &str, world: u32, scenario: &str) {
    for (rank, (ok, stderr)) in run_world(name, world, scenario).into_iter().enumerate() {
        assert!(ok, "world {world}, rank {rank}: {stderr}");
    }
}

#[test]
fn every_type_and_operation_in_worlds_of_one_to_nine_and_sixteen() {
    for world in (1..=9).chain([16]) {
        let started = std::time::Instant::now();
        all_pass(&format!("reduce-{world}"), world, "every-type");
        eprintln!("world {world}: {:?}", started.elapsed());
    }
}

#[test]
fn large_reductions_in_worlds_of_two_and_four() {
    for world in [2, 4] {
        all_pass(&format!("reduce-large-{world}"), world, "large");
    }
}

#[test]
fn symmetric_buffers_are_read_in_place_beside_ranks_without_them() {
    for world in [1, 2, 3, 4] {
        all_pass(&format!("reduce-symmetric-{world}"), world, "symmetric");
    }
}

#[test]
fn a_death_during_a_symmetric_all_reduce_is_named_and_the_survivors_sum_on() {
    let results = run_world("reduce-symmetric-killed", 4, "symmetric-killed");
    for (rank, (ok, stderr)) in results.into_iter().enumerate() {
        assert_eq!(ok, rank != 2, "rank {rank}: {stderr}");
    }
}

#[test]
fn reductions_larger_than_the_outbox_go_through_piece_by_piece() {
    // A 2 MiB outbox: the 64 MiB all-reduce and the 12 MiB reduce-scatter input do not fit.
    let results = run_world_with(
        "reduce-small-outbox",
        3,
        "large",
        &[("SHMBROKER_OUTBOX_BYTES", "2097152")],
    );
    for (rank, (ok, stderr)) in results.into_iter().enumerate() {
        assert!(ok, "rank {rank}: {stderr}");
    }
}

#[test]
fn a_rank_that_passes_another_length_is_named_by_every_other() {
    // Every honest rank's call fails naming rank 1 (the rank whose bytes it refused, or rank 1's
    // departure), or naming an honest rank that left because its own call failed so: following
    // who named whom always leads to rank 1. (`PeerLeft` cites a death or a timeout behind a
    // departure, not a refusal: see the closing note.)
    for scenario in [
        "mismatch-small",
        "mismatch-edge",
        "mismatch-lent",
        "mismatch-large",
        "mismatch-symmetric",
        "mismatch-reduce-scatter",
        "mismatch-pieces",
        "mismatch-blocks",
        "mismatch-lent-blocks",
    ] {
        let results = run_world(&format!("reduce-{scenario}"), 3, scenario);
        let ended: Vec<String> = results
            .iter()
            .map(|(ok, stderr)| {
                assert!(ok, "{scenario}: {stderr}");
                let line = stderr
                    .lines()
                    .find(|l| l.starts_with("ENDED"))
                    .unwrap_or("");
                line.to_owned()
            })
            .collect();
        // The rank a report names, if it names one.
        let names = |how: &str| -> Option<usize> {
            match how.split(' ').collect::<Vec<_>>()[..] {
                ["ENDED", "protocol" | "left", named] => named.parse().ok(),
                _ => None,
            }
        };
        // Rank 1's own call fails as a disagreement with a peer too, never as a misuse of the
        // API (but in all_to_all_v, where its counts disagree with themselves).
        if scenario != "mismatch-blocks" {
            assert!(
                names(&ended[1]).is_some(),
                "{scenario}: rank 1 {:?}",
                ended[1]
            );
        }
        for (rank, how) in ended.iter().enumerate().filter(|&(rank, _)| rank != 1) {
            // Follow departures back: each must lead to rank 1 without a loop.
            let mut named = names(how);
            for _ in 0..ended.len() {
                match named {
                    Some(1) | None => break,
                    Some(other) => named = names(&ended[other]),
                }
            }
            let named = named == Some(1);
            assert!(named, "{scenario}: rank {rank} {how:?}; all: {ended:?}");
        }
    }
}

#[test]
fn a_rank_killed_before_it_contributes_is_named_by_every_other() {
    let results = run_world("reduce-killed", 4, "killed");
    for (rank, (ok, stderr)) in results.into_iter().enumerate() {
        assert_eq!(ok, rank != 2, "rank {rank}: {stderr}");
    }
}
