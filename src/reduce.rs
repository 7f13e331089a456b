//! What the reductions combine: element types ([`Element`], [`DType`]), operations
//! ([`ReduceOp`]), and the kernels that combine contributions.
//!
//! # Determinism
//!
//! Every reduction combines its contributions in rank order, `x0 ⊕ x1 ⊕ … ⊕ x(n-1)`, whatever
//! the algorithm, and every rank ends with the same bits: either each rank combines every
//! contribution itself with the same code in the same order, or one rank combines a slice and
//! the others copy its bits. So results are bit-identical across ranks and run to run, and a
//! user operation need not be commutative (it must be associative only in the sense that the
//! result is defined by this left-to-right order).
//!
//! A NaN result is always the one quiet NaN, `f32::NAN` (`f64::NAN`, and for `f16`/`bf16` their
//! rounding of it): when two NaNs meet, which one an operation returns is the compiler's choice
//! (it may swap the operands of a sum), and could differ between the vector lanes and the tail,
//! so between a library built into a C program and one in a Python wheel, or between two ways of
//! cutting the data into pieces. Payloads are not kept. This costs a compare and a blend per
//! vector: an AVX2 `f32` sum of two 512 KiB inputs from L2 took 19-20 µs without it and 23-29
//! µs with it; with AVX-512, 18.9 µs.
//!
//! # Kernels
//!
//! One pass over the `n` inputs per [`LANES`] elements: their accumulators stay in registers
//! (or, for wide elements, partly in L1), each input is read once and the output written once,
//! and the loops have lengths the compiler knows, so it vectorises them, with AVX-512 or AVX2
//! where the CPU has them (chosen at run time; every element sees the same operations in the
//! same order whatever the width, and the unit tests compare every width the CPU has). `f16`
//! and `bf16` accumulate in `f32` and round to nearest even once, at the end: `f16` with F16C
//! where the CPU has it (8 elements per instruction), `bf16` and `f16` elsewhere with
//! branch-free code that gives `half`'s bits. Integer sums and products wrap. `Min` and `Max` of
//! floats propagate NaN (unlike `f32::min`), as `Sum` and `Prod` do. `bench collectives --only
//! reduce_kernel` times them against a `memcpy`.

use crate::error::Error;
use half::{bf16, f16};

/// Elements per block of a user operation: it is called on blocks this long.
pub const BLOCK: usize = 1024;

/// Elements the kernels combine at once, in a fixed-length loop the compiler vectorises. With
/// AVX2, the accumulators of 64 `f32` fill 8 registers and stay there across the inputs (4 with
/// AVX-512); wider elements (64 `f64` fill all 16 AVX2 registers) and the SSE2 build spill some
/// to the stack, which is in L1.
/// Fewer measured slower for 1-byte elements and for `Min`/`Max` (`bench collectives --only
/// reduce_kernel` times the kernels).
pub const LANES: usize = 64;

/// How contributions combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceOp {
    /// The sum (integers wrap).
    Sum,
    /// The product (integers wrap).
    Prod,
    /// The least (NaN if any contribution is NaN).
    Min,
    /// The greatest (NaN if any contribution is NaN).
    Max,
    /// Bitwise and, of integers.
    BitAnd,
    /// Bitwise or, of integers.
    BitOr,
    /// Bitwise exclusive or, of integers.
    BitXor,
    /// The sum divided by the number of contributions, of floats.
    Avg,
}

impl ReduceOp {
    /// Every operation, in the order of their numbers (see [`Self::from_number`]).
    pub const ALL: [Self; 8] = [
        Self::Sum,
        Self::Prod,
        Self::Min,
        Self::Max,
        Self::BitAnd,
        Self::BitOr,
        Self::BitXor,
        Self::Avg,
    ];

    /// The operation numbered `number` in the C ABI and Python (its index in [`Self::ALL`]).
    #[must_use]
    pub fn from_number(number: u32) -> Option<Self> {
        Self::ALL.get(number as usize).copied()
    }

    /// Its name as the API spells it (`"sum"`, `"bit_and"`, ...).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Prod => "prod",
            Self::Min => "min",
            Self::Max => "max",
            Self::BitAnd => "bit_and",
            Self::BitOr => "bit_or",
            Self::BitXor => "bit_xor",
            Self::Avg => "avg",
        }
    }
}

/// An element type, as the byte-level forms name it (the C ABI's and Python's `dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)] // the names say it
pub enum DType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F16,
    BF16,
    F32,
    F64,
}

impl DType {
    /// Every type, in the order of their numbers (see [`Self::from_number`]).
    pub const ALL: [Self; 12] = [
        Self::U8,
        Self::I8,
        Self::U16,
        Self::I16,
        Self::U32,
        Self::I32,
        Self::U64,
        Self::I64,
        Self::F16,
        Self::BF16,
        Self::F32,
        Self::F64,
    ];

    /// The type numbered `number` in the C ABI and Python (its index in [`Self::ALL`]).
    #[must_use]
    pub fn from_number(number: u32) -> Option<Self> {
        Self::ALL.get(number as usize).copied()
    }

    /// Bytes per element.
    #[must_use]
    pub fn size(self) -> usize {
        match self {
            Self::U8 | Self::I8 => 1,
            Self::U16 | Self::I16 | Self::F16 | Self::BF16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 => 8,
        }
    }

    /// Its name as numpy and torch spell it (`"float32"`, `"bfloat16"`, ...).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::U8 => "uint8",
            Self::I8 => "int8",
            Self::U16 => "uint16",
            Self::I16 => "int16",
            Self::U32 => "uint32",
            Self::I32 => "int32",
            Self::U64 => "uint64",
            Self::I64 => "int64",
            Self::F16 => "float16",
            Self::BF16 => "bfloat16",
            Self::F32 => "float32",
            Self::F64 => "float64",
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A type the reductions combine: `u8 i8 u16 i16 u32 i32 u64 i64 f32 f64`, [`half::f16`] and
/// [`half::bf16`]. Sealed: the operations are defined for these alone (a user operation,
/// [`Session::all_reduce_with`](crate::Session::all_reduce_with), takes any `Pod` type).
pub trait Element: bytemuck::Pod + sealed::Sealed + Send + Sync {
    /// This type's [`DType`].
    const DTYPE: DType;
    /// What the kernels accumulate in: `f32` for the half-precision types, the type itself
    /// otherwise.
    #[doc(hidden)]
    type Acc: bytemuck::Pod + Default;
    #[doc(hidden)]
    fn widen(self) -> Self::Acc;
    #[doc(hidden)]
    fn narrow(acc: Self::Acc) -> Self;
    /// [`Self::widen`] of [`LANES`] elements at once.
    #[doc(hidden)]
    #[inline(always)]
    fn widen_lanes(lanes: &[Self; LANES]) -> [Self::Acc; LANES] {
        let mut acc = [Self::Acc::default(); LANES];
        for (a, &x) in acc.iter_mut().zip(lanes) {
            *a = x.widen();
        }
        acc
    }
    /// [`Self::narrow`] of [`LANES`] accumulators at once, into `out`.
    #[doc(hidden)]
    #[inline(always)]
    fn narrow_lanes(acc: &[Self::Acc; LANES], out: &mut [Self; LANES]) {
        for (o, &a) in out.iter_mut().zip(acc) {
            *o = Self::narrow(a);
        }
    }
    /// Whether `op` is defined for this type.
    #[doc(hidden)]
    fn supports(op: ReduceOp) -> bool;
    #[doc(hidden)]
    fn sum(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    #[doc(hidden)]
    fn prod(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    #[doc(hidden)]
    fn min(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    #[doc(hidden)]
    fn max(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// Bitwise and (integers; never called for floats, which [`Self::supports`] refuses).
    #[doc(hidden)]
    fn and(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    #[doc(hidden)]
    fn or(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    #[doc(hidden)]
    fn xor(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// The accumulated sum of `n` contributions divided by `n` (floats).
    #[doc(hidden)]
    fn average(sum: Self::Acc, n: usize) -> Self::Acc;
    /// `acc`, but any NaN as the one quiet NaN `f32::NAN` (or `f64::NAN`): which of two NaNs
    /// an operation returns is up to the compiler (it may swap the operands of a sum), so the
    /// kernels give every NaN the same bits, wherever in the data and whatever the path.
    #[doc(hidden)]
    fn canonical(acc: Self::Acc) -> Self::Acc {
        acc
    }
}

macro_rules! integer {
    ($($t:ty => $dtype:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$dtype;
            type Acc = $t;
            #[inline]
            fn widen(self) -> $t { self }
            #[inline]
            fn narrow(acc: $t) -> $t { acc }
            fn supports(op: ReduceOp) -> bool { !matches!(op, ReduceOp::Avg) }
            #[inline]
            fn sum(a: $t, b: $t) -> $t { a.wrapping_add(b) }
            #[inline]
            fn prod(a: $t, b: $t) -> $t { a.wrapping_mul(b) }
            #[inline]
            fn min(a: $t, b: $t) -> $t { Ord::min(a, b) }
            #[inline]
            fn max(a: $t, b: $t) -> $t { Ord::max(a, b) }
            #[inline]
            fn and(a: $t, b: $t) -> $t { a & b }
            #[inline]
            fn or(a: $t, b: $t) -> $t { a | b }
            #[inline]
            fn xor(a: $t, b: $t) -> $t { a ^ b }
            fn average(sum: $t, _n: usize) -> $t { sum }
        }
    )*};
}

integer!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64, i64 => I64);

macro_rules! float {
    ($($t:ty => $dtype:ident, $acc:ty, $widen:expr, $narrow:expr);*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$dtype;
            type Acc = $acc;
            #[inline]
            fn widen(self) -> $acc { $widen(self) }
            #[inline]
            fn narrow(acc: $acc) -> $t { $narrow(acc) }
            fn supports(op: ReduceOp) -> bool {
                !matches!(op, ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor)
            }
            #[inline]
            fn sum(a: $acc, b: $acc) -> $acc { a + b }
            #[inline]
            fn prod(a: $acc, b: $acc) -> $acc { a * b }
            // NaN unless both are numbers: `a + b` is NaN when either is.
            #[inline]
            fn min(a: $acc, b: $acc) -> $acc { if a <= b { a } else if b < a { b } else { a + b } }
            #[inline]
            fn max(a: $acc, b: $acc) -> $acc { if a >= b { a } else if b > a { b } else { a + b } }
            fn and(a: $acc, _: $acc) -> $acc { a }
            fn or(a: $acc, _: $acc) -> $acc { a }
            fn xor(a: $acc, _: $acc) -> $acc { a }
            #[allow(clippy::cast_precision_loss)] // a world has at most 64 ranks
            fn average(sum: $acc, n: usize) -> $acc { sum / n as $acc }
            #[inline]
            fn canonical(acc: $acc) -> $acc { if acc.is_nan() { <$acc>::NAN } else { acc } }
        }
    )*};
}

// The half-precision types convert with the functions below, which give `half`'s bits and which
// the compiler vectorises (the default `widen_lanes`/`narrow_lanes` loop over them). `half`
// converts one element at a time: with branches for `bf16`, and for `f16` through F16C calls
// that do not inline into the kernel, or software with branches where the CPU lacks F16C.
float!(
    f32 => F32, f32, |x| x, |x| x;
    f64 => F64, f64, |x| x, |x| x;
    f16 => F16, f32, f16_to_f32, f16_from_f32;
    bf16 => BF16, f32, bf16_to_f32, bf16_from_f32
);

/// `x` as `f32`: `half`'s `f16::to_f32`, bit for bit (a NaN comes out quiet), without branches.
#[inline(always)]
fn f16_to_f32(x: f16) -> f32 {
    let bits = u32::from(x.to_bits());
    let sign = (bits & 0x8000) << 16;
    let exponent = bits & 0x7c00;
    let mantissa = bits & 0x03ff;
    // A normal number: the exponent rebiased (15 to 127), the mantissa widened.
    let normal = ((bits & 0x7fff) + (112 << 10)) << 13;
    // Infinity, or a NaN made quiet.
    let quiet = if mantissa == 0 { 0 } else { 0x0040_0000 };
    let special = 0x7f80_0000 | quiet | (mantissa << 13);
    // Zero or a subnormal: the mantissa times 2^-24, exactly.
    #[allow(clippy::cast_precision_loss)] // the mantissa has 10 bits
    let small = (mantissa as f32 * (1.0 / 16_777_216.0)).to_bits();
    let magnitude = if exponent == 0x7c00 {
        special
    } else if exponent == 0 {
        small
    } else {
        normal
    };
    f32::from_bits(sign | magnitude)
}

/// `x` rounded to nearest even: `half`'s `f16::from_f32`, bit for bit (a NaN keeps its sign and
/// top payload bits and comes out quiet; from 65520 up, infinity), without branches.
#[inline(always)]
fn f16_from_f32(x: f32) -> f16 {
    let bits = x.to_bits();
    let sign = (bits >> 16) & 0x8000;
    let magnitude = bits & 0x7fff_ffff;
    let nan = 0x7e00 | ((magnitude >> 13) & 0x03ff);
    // A normal result: rebiased (127 to 15) and rounded to nearest even on the 13 bits dropped;
    // a carry runs on into the exponent, up to infinity.
    let odd = (magnitude >> 13) & 1;
    let normal = magnitude.wrapping_sub(112 << 23).wrapping_add(0x0fff + odd) >> 13;
    // A subnormal or zero result: adding one half puts the units of the smallest subnormal
    // (2^-24) at the last mantissa bit, so the addition itself rounds to nearest even.
    let half = 0.5f32;
    let small = (f32::from_bits(magnitude) + half).to_bits() - half.to_bits();
    let result = if magnitude > 0x7f80_0000 {
        nan
    } else if magnitude >= 0x4780_0000 {
        // 65536 and up, and infinity.
        0x7c00
    } else if magnitude < 0x3880_0000 {
        // Under 2^-14, the smallest normal.
        small
    } else {
        normal
    };
    // `result` is at most 0x7fff.
    f16::from_bits((sign | result) as u16)
}

/// `x` as `f32`: `half`'s `bf16::to_f32`, bit for bit (a NaN comes out quiet), without branches.
#[inline(always)]
fn bf16_to_f32(x: bf16) -> f32 {
    let bits = u32::from(x.to_bits());
    let quiet = if bits & 0x7fff > 0x7f80 { 0x40 } else { 0 };
    f32::from_bits((bits | quiet) << 16)
}

/// `x` rounded to nearest even: `half`'s `bf16::from_f32`, bit for bit (a NaN keeps its sign
/// and top payload bits and comes out quiet), without branches.
#[inline(always)]
fn bf16_from_f32(x: f32) -> bf16 {
    let bits = x.to_bits();
    let high = bits >> 16;
    // Up when the dropped half is over one half, or exactly one half and `high` is odd.
    let up = u32::from((bits & 0x8000 != 0) & (bits & 0x1_7fff != 0));
    let nan = bits & 0x7fff_ffff > 0x7f80_0000;
    // `high` is 16 bits, and a finite one rounds up to at most 0xff80 (minus infinity).
    bf16::from_bits(if nan { high | 0x40 } else { high + up } as u16)
}

/// [`Error::Misuse`] unless `op` is defined for `T`.
pub(crate) fn check_op<T: Element>(op: ReduceOp) -> Result<(), Error> {
    if T::supports(op) {
        return Ok(());
    }
    Err(Error::Misuse(format!(
        "{} is not defined for {} ({})",
        op.name(),
        T::DTYPE.name(),
        if matches!(op, ReduceOp::Avg) {
            "averages are of floats"
        } else {
            "bitwise operations are of integers"
        }
    )))
}

/// Combines `inputs` (one per rank, in rank order, each as long as `out`) with `op` into `out`.
///
/// # Errors
///
/// [`Error::Misuse`] when `op` is not defined for `T`.
#[doc(hidden)] // public for `bench collectives` (its reduce_kernel rows) only
pub fn combine<T: Element>(op: ReduceOp, inputs: &[&[T]], out: &mut [T]) -> Result<(), Error> {
    check_op::<T>(op)?;
    // One monomorphised kernel per operation: the operation inlines into the loop.
    match op {
        ReduceOp::Sum => kernel(inputs, out, T::sum, false),
        ReduceOp::Avg => kernel(inputs, out, T::sum, true),
        ReduceOp::Prod => kernel(inputs, out, T::prod, false),
        ReduceOp::Min => kernel(inputs, out, T::min, false),
        ReduceOp::Max => kernel(inputs, out, T::max, false),
        ReduceOp::BitAnd => kernel(inputs, out, T::and, false),
        ReduceOp::BitOr => kernel(inputs, out, T::or, false),
        ReduceOp::BitXor => kernel(inputs, out, T::xor, false),
    }
    Ok(())
}

fn kernel<T: Element>(
    inputs: &[&[T]],
    out: &mut [T],
    binary: impl Fn(T::Acc, T::Acc) -> T::Acc,
    average: bool,
) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let most = widest_allowed();
        if most >= Width::Avx2 && has!("avx2") {
            if T::DTYPE == DType::F16 && has!("f16c") {
                // SAFETY: this CPU has AVX2 and F16C, checked just above.
                unsafe { kernel_f16c(inputs, out, binary, average) };
            } else if most >= Width::Avx512 && has!("avx512f") && has!("avx512bw") {
                // SAFETY: this CPU has AVX-512 F and BW, checked just above.
                unsafe { kernel_avx512(inputs, out, binary, average) };
            } else {
                // SAFETY: this CPU has AVX2, checked just above.
                unsafe { kernel_avx2(inputs, out, binary, average) };
            }
            return;
        }
    }
    kernel_plain(inputs, out, binary, average);
}

/// The widest vectors a kernel may use (the unit tests cap it, to compare every build).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Width {
    /// The build's baseline (SSE2 on x86-64); only the unit tests ask for it.
    #[cfg_attr(not(test), allow(dead_code))]
    Portable,
    Avx2,
    Avx512,
}

/// [`kernel_lanes`] with the element type's own lane conversions.
#[inline(always)]
fn kernel_plain<T: Element>(
    inputs: &[&[T]],
    out: &mut [T],
    binary: impl Fn(T::Acc, T::Acc) -> T::Acc,
    average: bool,
) {
    kernel_lanes(
        inputs,
        out,
        (binary, T::widen_lanes, T::narrow_lanes),
        average,
    );
}

/// Defines `$name`, [`kernel_plain`] compiled with the target features `$features`.
macro_rules! kernel_for {
    ($(#[$doc:meta])* $name:ident, $features:literal) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        fn $name<T: Element>(
            inputs: &[&[T]],
            out: &mut [T],
            binary: impl Fn(T::Acc, T::Acc) -> T::Acc,
            average: bool,
        ) {
            kernel_plain(inputs, out, binary, average);
        }
    };
}

kernel_for!(
    /// [`kernel_lanes`] compiled for AVX2: twice the lanes of the SSE2 baseline per
    /// instruction. The same operations on the same elements in the same order, so the same bits.
    kernel_avx2,
    "avx2"
);

kernel_for!(
    /// [`kernel_lanes`] compiled for AVX-512 (F and BW): twice AVX2's lanes again, which halves
    /// the time of the `bf16` conversions (`bench collectives --only reduce_kernel`: a `bf16` sum
    /// of two 512 KiB inputs took 67-78 µs against 153-183 µs with AVX2). The same bits, as for
    /// AVX2.
    kernel_avx512,
    "avx512f,avx512bw"
);

/// [`kernel_avx2`] for `f16` (`T` is `f16`, `T::Acc` is `f32`), converting 8 elements per
/// instruction with F16C, which rounds to nearest even as [`f16_from_f32`] does: the same bits
/// (the conversion tests check the software against `half`, which uses these instructions).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn kernel_f16c<T: Element>(
    inputs: &[&[T]],
    out: &mut [T],
    binary: impl Fn(T::Acc, T::Acc) -> T::Acc,
    average: bool,
) {
    use std::arch::x86_64::_mm256_cvtps_ph;
    use std::arch::x86_64::{__m128i, __m256, _MM_FROUND_TO_NEAREST_INT, _mm256_cvtph_ps};
    // By value: the lanes need not be aligned as the vector types are.
    let widen = |lanes: &[T; LANES]| -> [T::Acc; LANES] {
        let halves: [__m128i; LANES / 8] = bytemuck::cast(*lanes);
        bytemuck::cast(halves.map(|eight| _mm256_cvtph_ps(eight)))
    };
    let narrow = |acc: &[T::Acc; LANES], out: &mut [T; LANES]| {
        let floats: [__m256; LANES / 8] = bytemuck::cast(*acc);
        *out =
            bytemuck::cast(floats.map(|eight| _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(eight)));
    };
    kernel_lanes(inputs, out, (binary, widen, narrow), average);
}

/// The kernel: [`LANES`] elements at a time, their accumulators in registers, every input read
/// once and the output written once; `widen` and `narrow` convert lanes to and from the
/// accumulator type ([`Element::widen_lanes`] and [`Element::narrow_lanes`], or faster ones
/// with the same results).
#[inline(always)]
fn kernel_lanes<T: Element>(
    inputs: &[&[T]],
    out: &mut [T],
    (binary, widen, narrow): (
        impl Fn(T::Acc, T::Acc) -> T::Acc,
        impl Fn(&[T; LANES]) -> [T::Acc; LANES],
        impl Fn(&[T::Acc; LANES], &mut [T; LANES]),
    ),
    average: bool,
) {
    let Some((first, rest)) = inputs.split_first() else {
        return;
    };
    let n = inputs.len();
    let finish = |acc: T::Acc| {
        if average {
            T::narrow(T::canonical(T::average(acc, n)))
        } else {
            T::narrow(T::canonical(acc))
        }
    };
    let whole = out.len() - out.len() % LANES;
    let (body, tail) = out.split_at_mut(whole);
    for (start, out) in (0..).step_by(LANES).zip(body.chunks_exact_mut(LANES)) {
        let mut acc = widen(lanes_of(first, start));
        for input in rest {
            let next = widen(lanes_of(input, start));
            for k in 0..LANES {
                acc[k] = binary(acc[k], next[k]);
            }
        }
        if average {
            for a in &mut acc {
                *a = T::average(*a, n);
            }
        }
        for a in &mut acc {
            *a = T::canonical(*a);
        }
        narrow(&acc, out.try_into().expect("chunks of LANES elements"));
    }
    for (i, o) in (whole..).zip(tail) {
        let acc = rest
            .iter()
            .fold(first[i].widen(), |acc, input| binary(acc, input[i].widen()));
        *o = finish(acc);
    }
}

/// The [`LANES`] elements of `input` from `start`: an array, whose length the compiler knows.
#[inline(always)]
fn lanes_of<T>(input: &[T], start: usize) -> &[T; LANES] {
    input[start..start + LANES]
        .try_into()
        .expect("a range of LANES elements")
}

/// Combines `inputs` into `out` with a user operation, in rank order: `out` starts as the first
/// input, then `op(out_block, input_block)` folds in each next one, block by block.
pub(crate) fn combine_with<T: bytemuck::Pod>(
    op: &mut impl FnMut(&mut [T], &[T]),
    inputs: &[&[T]],
    out: &mut [T],
) {
    let Some((first, rest)) = inputs.split_first() else {
        return;
    };
    for start in (0..out.len()).step_by(BLOCK) {
        let end = (start + BLOCK).min(out.len());
        let out = &mut out[start..end];
        out.copy_from_slice(&first[start..end]);
        for input in rest {
            op(out, &input[start..end]);
        }
    }
}

/// Runs `$body` with `$t` standing for the element type `$dtype` names (for the byte-level
/// forms of the reductions).
macro_rules! for_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            $crate::reduce::DType::U8 => {
                type $t = u8;
                $body
            }
            $crate::reduce::DType::I8 => {
                type $t = i8;
                $body
            }
            $crate::reduce::DType::U16 => {
                type $t = u16;
                $body
            }
            $crate::reduce::DType::I16 => {
                type $t = i16;
                $body
            }
            $crate::reduce::DType::U32 => {
                type $t = u32;
                $body
            }
            $crate::reduce::DType::I32 => {
                type $t = i32;
                $body
            }
            $crate::reduce::DType::U64 => {
                type $t = u64;
                $body
            }
            $crate::reduce::DType::I64 => {
                type $t = i64;
                $body
            }
            $crate::reduce::DType::F16 => {
                type $t = half::f16;
                $body
            }
            $crate::reduce::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            $crate::reduce::DType::F32 => {
                type $t = f32;
                $body
            }
            $crate::reduce::DType::F64 => {
                type $t = f64;
                $body
            }
        }
    };
}
pub(crate) use for_dtype;

/// A caller's bytes as elements of `T`, or [`Error::Misuse`]. No bytes are no elements,
/// wherever they are (an empty buffer's address need not be aligned: Python's empty
/// `bytearray`, an empty tensor's).
pub(crate) fn cast<T: bytemuck::Pod>(bytes: &[u8]) -> Result<&[T], Error> {
    if bytes.is_empty() {
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(bytes).map_err(|_| misaligned::<T>(bytes.len()))
}

/// A caller's bytes as elements of `T`, or [`Error::Misuse`] (no bytes: no elements, as in
/// [`cast`]).
pub(crate) fn cast_mut<T: bytemuck::Pod>(bytes: &mut [u8]) -> Result<&mut [T], Error> {
    if bytes.is_empty() {
        return Ok(&mut []);
    }
    let len = bytes.len();
    bytemuck::try_cast_slice_mut(bytes).map_err(|_| misaligned::<T>(len))
}

fn misaligned<T>(len: usize) -> Error {
    Error::Misuse(format!(
        "{len} bytes are not whole elements of {} bytes, aligned for them",
        size_of::<T>()
    ))
}

#[cfg(test)]
mod tests;

/// The widest vectors the kernels may use: outside the unit tests, whatever the CPU has.
#[cfg(not(test))]
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn widest_allowed() -> Width {
    Width::Avx512
}

#[cfg(test)]
use tests::widest_allowed;
