//! The element-wise parts of the encoder, over rows of `f32`: layer norm,
//! GELU, softmax, and the matrix product (the `gemm` crate, which picks its
//! AVX-512 or AVX2 kernels at run time).
//!
//! `erf` and `exp` are polynomial approximations instead of the C library's
//! functions, so that the loops over a row vectorise (a call to `erff` or
//! `expf` per number kept the GELU and softmax scalar, a third of the
//! encoder's time). Each kernel is compiled three times, for AVX-512, for
//! AVX2 with FMA and for the baseline, and runs the widest the CPU has.

use gemm::Parallelism;

/// Defines `pub(super) fn $name` running `$body` compiled for the widest
/// vector instructions of the CPU it runs on. The body is inlined into
/// functions with AVX-512 or AVX2 enabled, so its loops are vectorised for
/// them; the checks cost an atomic load each (the standard library caches
/// the CPU's features).
macro_rules! vectorised {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$doc])*
        pub(super) fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn body($($arg: $ty),*) $body

            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512($($arg: $ty),*) {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) {
                    body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has the features `avx512` is compiled for.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: the CPU has the features `avx2` is compiled for.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

/// Lanes of the partial sums: floating-point sums are only vectorised when
/// the code itself keeps independent partial sums (the compiler may not
/// reorder additions). 16 fills one AVX-512 register.
const LANES: usize = 16;

/// The sum of `xs`, in `LANES` partial sums.
#[inline(always)]
fn sum(xs: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest: f32 = chunks.remainder().iter().sum();
    for chunk in chunks {
        for (lane, x) in lanes.iter_mut().zip(chunk) {
            *lane += x;
        }
    }
    lanes.iter().sum::<f32>() + rest
}

/// The largest number of `xs` (`-inf` for none).
#[inline(always)]
fn max(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(x);
        }
    }
    lanes.iter().fold(rest, |a, &b| a.max(b))
}

/// e^x to within 1e-7 relative (Cephes' `expf`: x = n·ln 2 + r, e^r by a
/// polynomial, 2^n put in the exponent bits). Inputs are clamped to
/// [-87, 88], the range of normal results.
#[inline(always)]
fn exp(x: f32) -> f32 {
    // 1.5 · 2^23: adding it rounds to an integer, held in the low mantissa bits.
    const ROUNDER: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * std::f32::consts::LOG2_E + ROUNDER;
    let n = shifted - ROUNDER;
    // ln 2 in two parts, so that r keeps its precision.
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    let n = shifted.to_bits() as i32 - ROUNDER.to_bits() as i32;
    e_r * f32::from_bits(((n + 127) << 23) as u32)
}

/// erf(x) to within 5e-7 (Eigen's rational approximation for `float`; erf
/// is ±1 in `f32` past ±4).
#[inline(always)]
fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10;
    p = p * x2 + 2.770_681_4e-8;
    p = p * x2 - 2.101_024e-6;
    p = p * x2 - 5.692_506_4e-5;
    p = p * x2 - 7.349_906_3e-4;
    p = p * x2 - 2.954_6e-3;
    p = p * x2 - 1.609_603_3e-2;
    let mut q = -1.456_607_2e-5;
    q = q * x2 - 2.133_740_6e-4;
    q = q * x2 - 1.682_827e-3;
    q = q * x2 - 7.373_329e-3;
    q = q * x2 - 1.426_474e-2;
    x * p / q
}

vectorised! {
    /// GELU in place, the exact form BERT uses: x · (1 + erf(x / √2)) / 2.
    fn gelu(xs: &mut [f32]) {
        for x in xs {
            *x = 0.5 * *x * (1.0 + erf(*x * std::f32::consts::FRAC_1_SQRT_2));
        }
    }
}

vectorised! {
    /// ReLU in place.
    fn relu(xs: &mut [f32]) {
        for x in xs {
            *x = x.max(0.0);
        }
    }
}

vectorised! {
    /// Softmax of each row of `rows` (rows of `width` numbers), in place.
    fn softmax(rows: &mut [f32], width: usize) {
        for row in rows.chunks_exact_mut(width) {
            let largest = max(row);
            for x in row.iter_mut() {
                *x = exp(*x - largest);
            }
            let scale = 1.0 / sum(row);
            for x in row.iter_mut() {
                *x *= scale;
            }
        }
    }
}

vectorised! {
    /// Layer norm of each row of `rows` (rows of `gamma.len()` numbers), in
    /// place: (x - mean) / √(variance + eps) · gamma + beta, the variance
    /// biased (divided by the width), as PyTorch's `LayerNorm`.
    fn layer_norm(rows: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
        let width = gamma.len();
        for row in rows.chunks_exact_mut(width) {
            let mean = sum(row) / width as f32;
            for x in row.iter_mut() {
                *x -= mean;
            }
            let mut squares = [0f32; LANES];
            let chunks = row.chunks_exact(LANES);
            let rest: f32 = chunks.remainder().iter().map(|x| x * x).sum();
            for chunk in chunks {
                for (square, x) in squares.iter_mut().zip(chunk) {
                    *square += x * x;
                }
            }
            let variance = (squares.iter().sum::<f32>() + rest) / width as f32;
            let scale = 1.0 / (variance + eps).sqrt();
            for ((x, g), b) in row.iter_mut().zip(gamma).zip(beta) {
                *x = *x * scale * g + b;
            }
        }
    }
}

vectorised! {
    /// Each row of `rows` set to the same row of `residual` plus `bias`.
    fn residual_plus_bias(rows: &mut [f32], residual: &[f32], bias: &[f32]) {
        let width = bias.len();
        for (row, residual) in rows.chunks_exact_mut(width).zip(residual.chunks_exact(width)) {
            for ((x, r), b) in row.iter_mut().zip(residual).zip(bias) {
                *x = r + b;
            }
        }
    }
}

/// A matrix inside a slice: element (i, j) at `i * row_stride + j *
/// col_stride`.
#[derive(Clone, Copy)]
pub(super) struct Strides {
    pub row: usize,
    pub col: usize,
}

/// `dst` (m × n, rows `dst_row_stride` apart, columns contiguous) becomes
/// `scale · lhs · rhs`, or has it added if `accumulate`; `lhs` is m × k,
/// `rhs` k × n.
///
/// # Panics
/// If a matrix reaches past the end of its slice.
#[allow(clippy::too_many_arguments)] // the three matrices' shapes and strides
pub(super) fn matmul(
    (m, n, k): (usize, usize, usize),
    dst: &mut [f32],
    dst_row_stride: usize,
    lhs: (&[f32], Strides),
    rhs: (&[f32], Strides),
    scale: f32,
    accumulate: bool,
    parallelism: Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    let reach = |rows: usize, cols: usize, s: Strides| (rows - 1) * s.row + (cols - 1) * s.col + 1;
    assert!(
        dst.len()
            >= reach(
                m,
                n,
                Strides {
                    row: dst_row_stride,
                    col: 1
                }
            )
    );
    if k > 0 {
        assert!(lhs.0.len() >= reach(m, k, lhs.1));
        assert!(rhs.0.len() >= reach(k, n, rhs.1));
    }
    // SAFETY: the asserts keep every element gemm reads or writes inside the
    // slices; `dst` is borrowed mutably, so nothing else reads it meanwhile.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_row_stride as isize,
            accumulate,
            lhs.0.as_ptr(),
            lhs.1.col as isize,
            lhs.1.row as isize,
            rhs.0.as_ptr(),
            rhs.1.col as isize,
            rhs.1.row as isize,
            1.0,
            scale,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_2e_7_relative() {
        for i in 0..=20_000 {
            let x = -87.0 + i as f32 * (87.0 + 10.0) / 20_000.0;
            let expected = (x as f64).exp();
            let error = ((exp(x) as f64 - expected) / expected).abs();
            assert!(error < 2e-7, "exp({x}): {} vs {expected}", exp(x));
        }
    }

    #[test]
    fn erf_matches_known_values() {
        // erf to 16 digits (Abramowitz & Stegun, table 7.1).
        let known = [
            (0.0, 0.0),
            (0.01, 0.011_283_415_555_849_618),
            (0.1, 0.112_462_916_018_284_9),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (1.5, 0.966_105_146_475_310_7),
            (2.0, 0.995_322_265_018_952_7),
            (3.0, 0.999_977_909_503_001_4),
            (5.0, 0.999_999_999_998_462_5),
        ];
        for (x, expected) in known {
            assert!(
                (erf(x) as f64 - expected).abs() < 5e-7,
                "erf({x}) = {}",
                erf(x)
            );
            assert!(
                (erf(-x) as f64 + expected).abs() < 5e-7,
                "erf(-{x}) = {}",
                erf(-x)
            );
        }
    }

    #[test]
    fn softmax_rows_sum_to_one_and_keep_order() {
        let mut rows = vec![1.0, 2.0, 3.0, -1000.0, 0.0, 0.0];
        softmax(&mut rows, 3);
        let e = [1f32.exp(), 2f32.exp(), 3f32.exp()];
        let total: f32 = e.iter().sum();
        for (got, want) in rows[..3].iter().zip(e) {
            assert!((got - want / total).abs() < 1e-6, "{rows:?}");
        }
        assert!(rows[3] < 1e-30, "{rows:?}");
        assert!((rows[4] - 0.5).abs() < 1e-7 && (rows[5] - 0.5).abs() < 1e-7);
    }

    #[test]
    fn layer_norm_centres_and_scales_each_row() {
        // Two rows of 20 (more than one chunk of lanes, and a remainder).
        let mut rows: Vec<f32> = (0..40).map(|i| i as f32).collect();
        let gamma = vec![2.0; 20];
        let beta = vec![1.0; 20];
        layer_norm(&mut rows, &gamma, &beta, 0.0);
        for row in rows.chunks(20) {
            let normalised: Vec<f32> = row.iter().map(|y| (y - 1.0) / 2.0).collect();
            let mean: f32 = normalised.iter().sum::<f32>() / 20.0;
            let variance: f32 = normalised.iter().map(|x| x * x).sum::<f32>() / 20.0;
            assert!(
                mean.abs() < 1e-6 && (variance - 1.0).abs() < 1e-5,
                "{row:?}"
            );
        }
    }

    #[test]
    fn matmul_with_transposed_rhs_and_accumulation() {
        // lhs 2 × 3; rhs given as its transpose (2 × 3), as linear layers store it.
        let lhs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let weight = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0];
        let mut dst = vec![10.0, 20.0, 30.0, 40.0];
        matmul(
            (2, 2, 3),
            &mut dst,
            2,
            (&lhs, Strides { row: 3, col: 1 }),
            (&weight, Strides { row: 1, col: 3 }),
            0.5,
            true,
            Parallelism::None,
        );
        assert_eq!(dst, vec![12.0, 21.0, 35.0, 42.5]);
    }
}
