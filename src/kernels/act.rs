//! The gated FFN activations `g ← act(g) · u`: SiLU (SwiGLU) and GELU with the tanh
//! approximation (GeGLU). One home for both formulas: the scalar reference and the AVX2 kernel
//! (a vector `exp`) sit side by side here and are tested against each other and against f64.
//!
//! GELU is computed as `x · σ(2z)` = `x / (1 + e^(−2z))`, `z = √(2/π)·(x + 0.044715·x³)`, which is
//! the same function as `0.5·x·(1 + tanh z)` (since `1 + tanh z = 2σ(2z)`) without the
//! cancellation of `1 + tanh z` near −1 for negative x. Per token these run over the FFN width of
//! every layer (Gemma 3 270M: 18 × 2,048 values; SmolLM2: 30 × 1,536): through libm's `tanhf`
//! or `expf` one value at a time that was ~0.7 ms per token on this machine's Zen 3.

use super::Isa;

/// √(2/π), GELU's tanh-approximation factor.
const GELU_K: f32 = 0.797_884_6;
/// GELU's cubic coefficient.
const GELU_C: f32 = 0.044_715;

/// SiLU, `x · σ(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU, tanh approximation, as `x · σ(2z)` (see the module doc).
#[inline]
pub fn gelu(x: f32) -> f32 {
    x / (1.0 + (-2.0 * GELU_K * (x + GELU_C * x * x * x)).exp())
}

/// `g[i] ← silu(g[i]) · u[i]` over `min(g.len(), u.len())` values.
pub fn silu_mul(isa: Isa, g: &mut [f32], u: &[f32]) {
    gated_mul::<false>(isa, g, u);
}

/// `g[i] ← gelu(g[i]) · u[i]` over `min(g.len(), u.len())` values.
pub fn gelu_mul(isa: Isa, g: &mut [f32], u: &[f32]) {
    gated_mul::<true>(isa, g, u);
}

/// `g ← act(g) · u`, GELU when `GELU`, else SiLU: the AVX2 kernel unless `isa` is scalar or the
/// CPU lacks AVX2/FMA, else the scalar formulas.
fn gated_mul<const GELU: bool>(isa: Isa, g: &mut [f32], u: &[f32]) {
    let n = g.len().min(u.len());
    let (g, u) = (&mut g[..n], &u[..n]);
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && Isa::Avx2.available() {
        // SAFETY: AVX2/FMA available (checked above); `g` and `u` have the same length.
        unsafe { avx2::gated::<GELU>(g, u) };
        return;
    }
    let _ = isa;
    let act = if GELU { gelu } else { silu };
    g.iter_mut().zip(u).for_each(|(g, u)| *g = act(*g) * u);
}

/// The AVX2 vector `e^x` of the activations, shared with the attention softmax.
#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::exp as exp_avx2;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{gelu, silu, GELU_C, GELU_K};
    use std::arch::x86_64::*;

    /// `e^x` for 8 lanes: Cody–Waite reduction by ln 2 (in two parts) and Cephes' degree-6
    /// polynomial for `e^r` on [−ln2/2, ln2/2] (about 1 ulp), scaled by 2^n through the exponent
    /// bits. x is clamped to [−87.3, 88.3] (the normal range), so the result never overflows to
    /// infinity; a NaN x gives a finite e, and the callers keep the NaN through their numerator.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn exp(x: __m256) -> __m256 {
        let x = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(-87.3)),
            _mm256_set1_ps(88.3),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let e = _mm256_fmadd_ps(
            _mm256_mul_ps(p, r),
            r,
            _mm256_add_ps(r, _mm256_set1_ps(1.0)),
        );
        // 2^n: n ∈ [−126, 128) after the clamp, so n + 127 is a valid biased exponent except at
        // the very top, where e ≤ 2 keeps the product finite.
        let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        )));
        _mm256_mul_ps(e, pow2)
    }

    /// `g ← act(g) · u`, GELU when `GELU`, else SiLU; the tail (< 8 values) uses the scalar
    /// formulas.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `u.len() == g.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gated<const GELU: bool>(g: &mut [f32], u: &[f32]) {
        let n = g.len();
        let one = _mm256_set1_ps(1.0);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n = g.len() = u.len().
            let x = _mm256_loadu_ps(g.as_ptr().add(i));
            let a = if GELU {
                // −2z = −2k·(x + c·x³) = x · (−2k − 2kc·x²)
                let x2 = _mm256_mul_ps(x, x);
                let t = _mm256_fmadd_ps(
                    x2,
                    _mm256_set1_ps(-2.0 * GELU_K * GELU_C),
                    _mm256_set1_ps(-2.0 * GELU_K),
                );
                _mm256_mul_ps(x, t)
            } else {
                _mm256_sub_ps(_mm256_setzero_ps(), x)
            };
            let y = _mm256_div_ps(x, _mm256_add_ps(one, exp(a)));
            // Past exp's clamp the true value is x·e^(−a) ≈ 0 (and x/(1 + e^88.3) would not be
            // small for a huge x): flush those lanes. A NaN compares false and stays.
            let y = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(a, _mm256_set1_ps(88.0)), y);
            let y = _mm256_mul_ps(y, _mm256_loadu_ps(u.as_ptr().add(i)));
            _mm256_storeu_ps(g.as_mut_ptr().add(i), y);
            i += 8;
        }
        for j in i..n {
            g[j] = if GELU { gelu(g[j]) } else { silu(g[j]) } * u[j];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exponent `a` of `x / (1 + e^a)`, in f64.
    fn exponent(gelu_: bool, x: f32) -> f64 {
        let x = x as f64;
        if gelu_ {
            -2.0 * (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)
        } else {
            -x
        }
    }

    /// The exact value in f64 (σ form: `0.5·x·(1 + tanh z)` itself cancels to 0 in f64 for
    /// x ≲ −9).
    fn exact(gelu_: bool, x: f32) -> f64 {
        x as f64 / (1.0 + exponent(gelu_, x).exp())
    }

    /// Allowed error: e^a amplifies the rounding of `a` (|a|·2^−24 each way) on top of a few
    /// ulp in exp, the division and the product; plus 1e−30 absolute where the value underflows.
    fn tol(gelu_: bool, x: f32, want: f64) -> f64 {
        want.abs() * 2.4e-7 * (exponent(gelu_, x).abs().min(90.0) + 8.0) + 1e-30
    }

    /// Inputs over the FFN's range and beyond: a dense sweep of [−12, 12], large magnitudes,
    /// zeros, subnormals, and a length that leaves a scalar tail.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (0..4801).map(|i| (i as f32 - 2400.0) * 0.005).collect();
        v.extend([
            0.0, -0.0, 1e-30, -1e-30, 1e-40, 30.0, -30.0, 90.0, -90.0, 1e4, -1e4, 1e30, -1e30,
        ]);
        v
    }

    #[test]
    fn every_isa_is_within_a_few_ulp_of_f64() {
        for gelu_ in [false, true] {
            for isa in [Isa::Scalar, Isa::Avx2] {
                if !isa.available() {
                    println!("SKIP: this CPU lacks {isa:?}");
                    continue;
                }
                let x = inputs();
                let u: Vec<f32> = (0..x.len()).map(|i| 1.0 + (i % 3) as f32).collect();
                let mut g = x.clone();
                if gelu_ {
                    gelu_mul(isa, &mut g, &u);
                } else {
                    silu_mul(isa, &mut g, &u);
                }
                for ((&xi, &ui), &gi) in x.iter().zip(&u).zip(&g) {
                    let want = exact(gelu_, xi) * ui as f64;
                    let err = (gi as f64 - want).abs();
                    assert!(
                        err <= tol(gelu_, xi, want),
                        "{isa:?} gelu={gelu_} x={xi}: got {gi}, want {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn avx2_matches_the_scalar_reference() {
        if !Isa::Avx2.available() {
            println!("SKIP: this CPU lacks AVX2/FMA");
            return;
        }
        for gelu_ in [false, true] {
            let x = inputs();
            let u = vec![1.0f32; x.len()];
            let (mut a, mut s) = (x.clone(), x.clone());
            let f = if gelu_ { gelu_mul } else { silu_mul };
            f(Isa::Avx2, &mut a, &u);
            f(Isa::Scalar, &mut s, &u);
            for ((&xi, &ai), &si) in x.iter().zip(&a).zip(&s) {
                assert!(
                    ((ai - si) as f64).abs() <= 2.0 * tol(gelu_, xi, si as f64),
                    "gelu={gelu_} x={xi}: avx2 {ai}, scalar {si}"
                );
            }
        }
    }

    #[test]
    fn a_nan_stays_a_nan_and_infinities_saturate() {
        for isa in [Isa::Scalar, Isa::Avx2] {
            if !isa.available() {
                continue;
            }
            let mut g = vec![f32::NAN; 9];
            g[1] = f32::INFINITY;
            g[2] = f32::NEG_INFINITY;
            let u = vec![1.0; 9];
            let mut h = g.clone();
            silu_mul(isa, &mut g, &u);
            gelu_mul(isa, &mut h, &u);
            for v in [&g, &h] {
                assert!(v[0].is_nan() && v[8].is_nan(), "{isa:?} {v:?}");
                assert_eq!(v[1], f32::INFINITY, "{isa:?} {v:?}");
            }
        }
    }
}
