//! The kernels against references written out element by element.

use super::*;
use std::cell::Cell;

thread_local! {
    /// The widest vectors this thread's reductions may use, whatever the CPU has.
    static WIDEST: Cell<Width> = const { Cell::new(Width::Avx512) };
}

/// The widest vectors this thread's reductions may use (see [`WIDEST`]).
pub(super) fn widest_allowed() -> Width {
    WIDEST.with(Cell::get)
}

/// Inputs of `ranks` contributions of `len` elements from `value(rank, index)`.
fn inputs<T: Copy>(ranks: usize, len: usize, value: impl Fn(usize, usize) -> T) -> Vec<Vec<T>> {
    (0..ranks)
        .map(|rank| (0..len).map(|i| value(rank, i)).collect())
        .collect()
}

fn reduced<T: Element>(op: ReduceOp, inputs: &[Vec<T>]) -> Vec<T> {
    let refs: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
    let mut out = vec![T::zeroed(); inputs[0].len()];
    combine(op, &refs, &mut out).unwrap();
    out
}

#[test]
fn integer_operations_match_a_fold_in_rank_order() {
    // Lengths around LANES and BLOCK, so that partial lane groups and blocks are covered.
    for len in [0, 1, 7, BLOCK - 1, BLOCK, BLOCK + 3, 3 * BLOCK + 5] {
        let data = inputs(5, len, |rank, i| {
            (i as i32 * 7919 - rank as i32 * 104_729) ^ 0x5a5a
        });
        for op in ReduceOp::ALL.into_iter().filter(|&op| op != ReduceOp::Avg) {
            let expected: Vec<i32> = (0..len)
                .map(|i| {
                    (1..5).fold(data[0][i], |acc, rank| {
                        let x = data[rank][i];
                        match op {
                            ReduceOp::Sum => acc.wrapping_add(x),
                            ReduceOp::Prod => acc.wrapping_mul(x),
                            ReduceOp::Min => acc.min(x),
                            ReduceOp::Max => acc.max(x),
                            ReduceOp::BitAnd => acc & x,
                            ReduceOp::BitOr => acc | x,
                            ReduceOp::BitXor => acc ^ x,
                            ReduceOp::Avg => unreachable!(),
                        }
                    })
                })
                .collect();
            assert_eq!(reduced(op, &data), expected, "{op:?} of {len}");
        }
    }
}

#[test]
fn unsigned_sums_and_products_wrap() {
    let data = vec![vec![250u8, 16], vec![10, 16]];
    assert_eq!(reduced(ReduceOp::Sum, &data), [4, 32]);
    assert_eq!(reduced(ReduceOp::Prod, &data), [196, 0]);
}

#[test]
fn float_sums_are_folded_in_rank_order_not_reassociated() {
    // 1e8 + 1 - 1e8 is 0 in f32 in that order, 1 in another.
    let data = vec![vec![1e8f32], vec![1.0], vec![-1e8]];
    assert_eq!(reduced(ReduceOp::Sum, &data), [0.0]);
    let data = vec![vec![1e8f32], vec![-1e8], vec![1.0]];
    assert_eq!(reduced(ReduceOp::Sum, &data), [1.0]);
}

/// The operations defined for floats.
const FLOAT_OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Avg,
];

#[test]
fn nan_propagates_through_every_float_operation_and_infinities_behave() {
    for op in FLOAT_OPS {
        for at in 0..3 {
            let mut data = vec![vec![1.0f64], vec![2.0], vec![3.0]];
            data[at][0] = f64::NAN;
            assert!(
                reduced(op, &data)[0].is_nan(),
                "{op:?} with NaN at rank {at}"
            );
        }
    }
    let data = vec![vec![f32::INFINITY, 1.0], vec![1.0, f32::NEG_INFINITY]];
    assert_eq!(reduced(ReduceOp::Max, &data), [f32::INFINITY, 1.0]);
    assert_eq!(reduced(ReduceOp::Min, &data), [1.0, f32::NEG_INFINITY]);
    assert_eq!(
        reduced(ReduceOp::Sum, &data),
        [f32::INFINITY, f32::NEG_INFINITY]
    );
    let opposite = vec![vec![f32::INFINITY], vec![f32::NEG_INFINITY]];
    assert!(reduced(ReduceOp::Sum, &opposite)[0].is_nan());
}

#[test]
fn every_nan_result_is_the_one_quiet_nan_whatever_the_payloads_and_the_path() {
    // Two NaNs of other payloads and signs meet: which one an addition returns is the
    // compiler's choice, so the kernels return f32::NAN, in the lanes and in the tail alike.
    let (a, b) = (f32::from_bits(0xffc0_1234), f32::from_bits(0x7fa0_0001));
    for len in [1, LANES + 1] {
        for op in FLOAT_OPS {
            let data = vec![vec![a; len], vec![1.0; len], vec![b; len]];
            for (i, x) in reduced(op, &data).iter().enumerate() {
                assert_eq!(
                    x.to_bits(),
                    f32::NAN.to_bits(),
                    "{op:?}, {len} elements, at {i}"
                );
            }
        }
    }
    let data = vec![vec![f64::from_bits(0xfff8_0000_0000_0042); 3]; 2];
    assert!(
        reduced(ReduceOp::Sum, &data)
            .iter()
            .all(|x| x.to_bits() == f64::NAN.to_bits())
    );
    let data = vec![vec![f16::from_bits(0xfe01); LANES + 3]; 2];
    assert!(
        reduced(ReduceOp::Max, &data)
            .iter()
            .all(|x| x.to_bits() == f16::NAN.to_bits())
    );
}

#[test]
fn averages_divide_the_sum_by_the_world() {
    let data = inputs(4, 3, |rank, i| (rank * 10 + i) as f32);
    assert_eq!(reduced(ReduceOp::Avg, &data), [15.0, 16.0, 17.0]);
}

#[test]
fn half_precision_accumulates_in_f32_and_rounds_once() {
    // 2048 + 1 + 1 in f16: pairwise f16 sums round each 2049 back to 2048; f32 keeps 2050.
    let data: Vec<Vec<f16>> = [2048.0, 1.0, 1.0]
        .iter()
        .map(|&x| vec![f16::from_f32(x)])
        .collect();
    assert_eq!(reduced(ReduceOp::Sum, &data)[0].to_f32(), 2050.0);
    let data: Vec<Vec<bf16>> = [128.0, 0.5, 0.5]
        .iter()
        .map(|&x| vec![bf16::from_f32(x)])
        .collect();
    assert_eq!(reduced(ReduceOp::Sum, &data)[0].to_f32(), 129.0);
    // Round to nearest even: 2049 in f16 is a tie between 2048 and 2050, and goes to 2048.
    let data = vec![vec![f16::from_f32(2048.0)], vec![f16::from_f32(1.0)]];
    assert_eq!(reduced(ReduceOp::Sum, &data)[0].to_f32(), 2048.0);
    let data = vec![vec![f16::NAN], vec![f16::from_f32(1.0)]];
    assert!(reduced(ReduceOp::Max, &data)[0].is_nan());
}

#[test]
fn operations_a_type_lacks_are_misuse_naming_both() {
    let out = &mut [0f32; 1];
    let error = combine(ReduceOp::BitXor, &[&[1.0f32]], out)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("bit_xor") && error.contains("float32"),
        "{error}"
    );
    let out = &mut [0i64; 1];
    let error = combine(ReduceOp::Avg, &[&[1i64]], out)
        .unwrap_err()
        .to_string();
    assert!(error.contains("avg") && error.contains("int64"), "{error}");
}

#[test]
fn a_user_operation_is_applied_in_rank_order() {
    // 2x2 matrix products do not commute: the result is m0 m1 m2, not any other order.
    let product = |acc: &mut [[i64; 4]], next: &[[i64; 4]]| {
        for (a, b) in acc.iter_mut().zip(next) {
            *a = [
                a[0] * b[0] + a[1] * b[2],
                a[0] * b[1] + a[1] * b[3],
                a[2] * b[0] + a[3] * b[2],
                a[2] * b[1] + a[3] * b[3],
            ];
        }
    };
    let m = [[1, 1, 0, 1], [1, 0, 1, 1], [2, 0, 0, 1]];
    let inputs: Vec<Vec<[i64; 4]>> = m.iter().map(|&x| vec![x; BLOCK + 2]).collect();
    let refs: Vec<&[[i64; 4]]> = inputs.iter().map(Vec::as_slice).collect();
    let mut out = vec![[0; 4]; BLOCK + 2];
    combine_with(&mut { product }, &refs, &mut out);
    // [[1,1],[0,1]] [[1,0],[1,1]] = [[2,1],[1,1]]; times [[2,0],[0,1]] = [[4,1],[2,1]].
    assert!(out.iter().all(|&x| x == [4, 1, 2, 1]), "{:?}", out[0]);
}

#[test]
fn numbers_name_every_operation_and_type_in_order() {
    for (number, op) in (0..).zip(ReduceOp::ALL) {
        assert_eq!(ReduceOp::from_number(number), Some(op));
    }
    assert_eq!(ReduceOp::from_number(8), None);
    for (number, dtype) in (0..).zip(DType::ALL) {
        assert_eq!(DType::from_number(number), Some(dtype));
    }
    assert_eq!(DType::from_number(12), None);
    assert_eq!(<half::bf16 as Element>::DTYPE.size(), 2);
}

/// Runs `check::<T>()` for every element type.
macro_rules! for_every_type {
    ($check:ident) => {
        $check::<u8>();
        $check::<i8>();
        $check::<u16>();
        $check::<i16>();
        $check::<u32>();
        $check::<i32>();
        $check::<u64>();
        $check::<i64>();
        $check::<f16>();
        $check::<bf16>();
        $check::<f32>();
        $check::<f64>();
    };
}

#[test]
fn the_lanes_give_the_bits_of_one_element_at_a_time_in_every_vector_width() {
    fn check<T: Element + std::fmt::Debug>() {
        // Arbitrary bits, 5 ranks, over two whole lane groups and a part of one.
        let len = 2 * LANES + 5;
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut data: Vec<Vec<u8>> = (0..5)
            .map(|_| {
                let mut bytes = vec![0u8; len * size_of::<T>()];
                for byte in &mut bytes {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    *byte = state.to_le_bytes()[7];
                }
                bytes
            })
            .collect();
        // And, for the floats, a NaN, both infinities, a negative zero and the smallest
        // subnormal at fixed places: in the first lane group, across ranks in the second, and in
        // the tail.
        let special: &[u64] = match T::DTYPE {
            DType::F32 => &[0x7fc0_0000, 0x7f80_0000, 0xff80_0000, 0x8000_0000, 1],
            DType::F64 => &[
                0x7ff8_0000_0000_0000,
                0x7ff0_0000_0000_0000,
                0xfff0_0000_0000_0000,
                0x8000_0000_0000_0000,
                1,
            ],
            DType::F16 => &[0x7e00, 0x7c00, 0xfc00, 0x8000, 1],
            DType::BF16 => &[0x7fc0, 0x7f80, 0xff80, 0x8000, 1],
            _ => &[],
        };
        let size = size_of::<T>();
        for (k, &bits) in special.iter().enumerate() {
            for (rank, at) in [(k, 3 + k), (k, LANES + 7), ((k + 1) % 5, len - 1 - k)] {
                data[rank][at * size..(at + 1) * size].copy_from_slice(&bits.to_le_bytes()[..size]);
            }
        }
        let data: Vec<Vec<T>> = data
            .iter()
            .map(|bytes| bytemuck::cast_slice(bytes).to_vec())
            .collect();
        for op in ReduceOp::ALL.into_iter().filter(|&op| T::supports(op)) {
            // Every build the CPU can run, each against one element at a time (in the tail of
            // the widest build).
            let results: Vec<(Width, Vec<T>)> = [Width::Avx512, Width::Avx2, Width::Portable]
                .into_iter()
                .map(|width| {
                    WIDEST.with(|widest| widest.set(width));
                    (width, reduced(op, &data))
                })
                .collect();
            WIDEST.with(|widest| widest.set(Width::Avx512));
            for i in 0..len {
                let alone: Vec<Vec<T>> = data.iter().map(|rank| vec![rank[i]]).collect();
                let want = reduced(op, &alone)[0];
                for (width, result) in &results {
                    assert_eq!(
                        bytemuck::bytes_of(&result[i]),
                        bytemuck::bytes_of(&want),
                        "{:?} {op:?}, element {i}: {:?} in lanes at most {width:?} wide, {want:?} \
                         alone",
                        T::DTYPE,
                        result[i]
                    );
                }
            }
        }
    }
    for_every_type!(check);
}

/// Every f32 whose high 16 bits (sign, exponent, top of the mantissa) take every value and
/// whose low 16 bits are each of `lows` (where a narrowing's rounding turns).
fn f32_rounding_cases(lows: &'static [u32]) -> impl Iterator<Item = f32> {
    (0..=u32::from(u16::MAX)).flat_map(move |high| {
        lows.iter()
            .map(move |&low| f32::from_bits(high << 16 | low))
    })
}

#[test]
fn bf16_conversions_match_half_bit_for_bit() {
    // Every sign, exponent and top mantissa half, with the low halves where rounding turns:
    // zero, just under, at and just over one half, and the largest.
    for x in f32_rounding_cases(&[0, 1, 0x3fff, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff]) {
        assert_eq!(
            bf16_from_f32(x).to_bits(),
            bf16::from_f32(x).to_bits(),
            "{x:e} ({:#010x})",
            x.to_bits()
        );
    }
    // Every bf16, widened.
    for bits in 0..=u16::MAX {
        let b = bf16::from_bits(bits);
        assert_eq!(
            bf16_to_f32(b).to_bits(),
            b.to_f32().to_bits(),
            "{bits:#06x}"
        );
    }
}

#[test]
fn f16_conversions_match_half_bit_for_bit() {
    // Every f16, widened.
    for bits in 0..=u16::MAX {
        let h = f16::from_bits(bits);
        assert_eq!(f16_to_f32(h).to_bits(), h.to_f32().to_bits(), "{bits:#06x}");
    }
    // Every sign, exponent and top of the mantissa of an f32, with the 13 bits that rounding
    // drops (and the 3 above them) where rounding turns, narrowed.
    let lows = &[
        0, 1, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000, 0x7fff, 0xffff,
    ];
    for x in f32_rounding_cases(lows) {
        assert_eq!(
            f16_from_f32(x).to_bits(),
            f16::from_f32(x).to_bits(),
            "{x:e} ({:#010x})",
            x.to_bits()
        );
    }
}

#[test]
fn no_bytes_at_an_unaligned_address_are_no_elements() {
    let mut words = [0u64; 2];
    let bytes = bytemuck::bytes_of_mut(&mut words);
    // Address 8k + 1: misaligned for f64, and empty.
    assert!(super::cast::<f64>(&bytes[1..1]).unwrap().is_empty());
    assert!(super::cast_mut::<f64>(&mut bytes[1..1]).unwrap().is_empty());
    // Bytes that are there are still checked.
    assert!(super::cast::<f64>(&bytes[1..9]).is_err());
}
