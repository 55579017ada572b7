//! The activation as the integer kernels read it, quantized once per matvec: Q8 blocks of 32
//! ([`Q8Act`]: per block a f32 scale, 32 i8 quants and their scaled sum) for Q4_0, Q4_1, Q8_0,
//! Q5_0 and Q5_1, and Q8_K blocks of 256 ([`Q8K`], bit-identical to ggml's
//! `quantize_row_q8_K_ref`) for the K-quants. The scalar quantizers (`scalar`) are the
//! reference; the AVX2 ones (`avx2`) give the same bytes (tested below).

use super::Isa;
use crate::quant::kquants::QK_K;
use crate::quant::{QuantType, QK};

/// Borrowed Q8 activation blocks `(d, s, qs)` as passed to the tile kernels.
pub type XqRef<'a> = Option<(&'a [f32], &'a [f32], &'a [i8])>;

/// An activation vector quantized to Q8 blocks of 32: per block a f32 scale `d`, 32 i8 quants and
/// `s = d · Σq` (used by the Q4_1 integer path).
#[derive(Clone, Debug, Default)]
pub struct Q8Act {
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub qs: Vec<i8>,
    /// The same activation as Q8_K blocks of 256, for the K-quants; empty unless
    /// [`Q8Act::quantize_k_from`] ran after the last [`Q8Act::quantize_from`].
    pub k: Q8K,
}

impl Q8Act {
    /// Quantizes `x` (length a multiple of 32) into `self`, reusing its buffers.
    /// Uses the best ISA of this CPU ([`Isa::cached`]); the result is bit-identical on every path.
    /// Drops the Q8_K part (see [`Q8Act::quantize_k_from`]).
    pub fn quantize_from(&mut self, x: &[f32]) {
        self.k.clear();
        quantize_act(Isa::cached(), x, self);
    }

    /// Also quantizes `x` to Q8_K (for K-quant weights) when its length is a multiple of 256.
    pub fn quantize_k_from(&mut self, x: &[f32]) {
        if x.len().is_multiple_of(crate::quant::kquants::QK_K) {
            self.k.quantize_from(x);
        } else {
            self.k.clear();
        }
    }

    /// Quantizes `x` into the forms that matrices of the given types read: Q8 blocks unless
    /// every one is a K-quant, Q8_K blocks when one is. K-quant rows are whole super-blocks of
    /// 256, so their Q8_K form always exists; an input that only K-quants read (a K-quant
    /// model's FFN down projection) skips the Q8 blocks it would never use, which leaves
    /// [`Q8Act::blocks`] at zero.
    pub fn quantize_for(&mut self, x: &[f32], types: impl IntoIterator<Item = QuantType>) {
        let (mut q8, mut k) = (false, false);
        for q in types {
            if q.is_k() {
                k = true;
            } else {
                q8 = true;
            }
        }
        if q8 || !k {
            self.quantize_from(x);
        } else {
            self.d.clear();
            self.s.clear();
            self.qs.clear();
        }
        if k {
            self.quantize_k_from(x);
        }
    }

    /// Number of 32-element blocks.
    pub fn blocks(&self) -> usize {
        self.d.len()
    }

    /// The blocks covering columns `col..col + cols` (both multiples of 32), in the form
    /// [`tile_matvec`] takes as `xq`. Quantize the whole activation once per matvec, then hand each
    /// tile its slice.
    #[inline]
    pub fn tile_slice(&self, col: usize, cols: usize) -> (&[f32], &[f32], &[i8]) {
        assert!(
            col.is_multiple_of(QK) && cols.is_multiple_of(QK),
            "unaligned tile slice"
        );
        let (b0, nb) = (col / QK, cols / QK);
        (
            &self.d[b0..b0 + nb],
            &self.s[b0..b0 + nb],
            &self.qs[col..col + cols],
        )
    }
}

/// Quantizes `x` (length a multiple of 32) to Q8 blocks with the given ISA (falls back to scalar
/// when `isa` is not available). All paths produce identical bytes.
pub fn quantize_act(isa: Isa, x: &[f32], out: &mut Q8Act) {
    assert!(
        x.len().is_multiple_of(QK),
        "activation length {} not a multiple of 32",
        x.len()
    );
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && Isa::Avx2.available() {
        // SAFETY: AVX2, FMA and F16C were just detected; `avx2::quantize_act` only reads `x`
        // within its length and sizes `out`'s buffers itself.
        unsafe { avx2::quantize_act(x, out) };
        return;
    }
    let _ = isa;
    scalar::quantize_act(x, out);
}

/// Borrowed Q8 activation blocks of one token (as in [`XqRef`], present).
pub type XqBlocks<'a> = (&'a [f32], &'a [f32], &'a [i8]);

/// An activation quantized to Q8_K blocks of 256 (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct Q8K {
    pub d: Vec<f32>,
    /// 16 per block: the sum of each 16 consecutive quants.
    pub bsums: Vec<i16>,
    pub qs: Vec<i8>,
}

/// Borrowed Q8_K blocks covering one tile's columns.
#[derive(Clone, Copy, Debug)]
pub struct Q8KRef<'a> {
    pub d: &'a [f32],
    pub bsums: &'a [i16],
    pub qs: &'a [i8],
}

impl Q8K {
    /// Quantizes `x` (length a multiple of 256) into `self`, reusing its buffers.
    /// Uses AVX2 when this CPU has it ([`Isa::cached`]); bit-identical to the scalar code.
    pub fn quantize_from(&mut self, x: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if Isa::Avx2.available() && Isa::cached() != Isa::Scalar {
            // SAFETY: AVX2 and FMA were detected just above (`Isa::available`).
            unsafe { avx2::quantize_q8k(x, self) };
            return;
        }
        scalar::quantize_q8k(x, self);
    }

    /// Empties the activation (no K-quant integer path until quantized again).
    pub fn clear(&mut self) {
        self.d.clear();
        self.bsums.clear();
        self.qs.clear();
    }

    /// The blocks covering columns `col..col + cols` (multiples of 256), or `None` when this
    /// activation does not cover them (not quantized for this matvec).
    pub fn slice(&self, col: usize, cols: usize) -> Option<Q8KRef<'_>> {
        if !col.is_multiple_of(QK_K) || !cols.is_multiple_of(QK_K) || col + cols > self.qs.len() {
            return None;
        }
        let (b0, nb) = (col / QK_K, cols / QK_K);
        Some(Q8KRef {
            d: &self.d[b0..b0 + nb],
            bsums: &self.bsums[16 * b0..16 * (b0 + nb)],
            qs: &self.qs[col..col + cols],
        })
    }
}

/// The scalar quantizers: the reference.
pub mod scalar {
    use super::*;

    /// The factor a block's values are scaled by before rounding: 1/d, or 0 when that is not
    /// finite (d = 0, or d below 1/f32::MAX ≈ 2⁻¹²⁸, whose reciprocal overflows): such a block
    /// quantizes to zeros rather than to the saturated conversions of ±inf and NaN, which differ
    /// between instruction sets. Its contribution to a dot product, d · Σ q·w, is lost.
    pub fn inverse_scale(d: f32) -> f32 {
        let inv = 1.0 / d;
        if inv.is_finite() {
            inv
        } else {
            0.0
        }
    }

    /// Quantizes `x` to Q8 blocks (d = max|x|/127, q = x · [`inverse_scale`]`(d)` rounded to
    /// nearest, half away from zero).
    pub fn quantize_act(x: &[f32], out: &mut Q8Act) {
        let nb = x.len() / QK;
        out.d.clear();
        out.s.clear();
        out.qs.clear();
        for blk in x.chunks_exact(QK).take(nb) {
            let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inv = inverse_scale(d);
            let mut sum = 0i32;
            for v in blk {
                let q = (v * inv).round() as i32;
                sum += q;
                out.qs.push(q as i8);
            }
            out.d.push(d);
            out.s.push(d * sum as f32);
        }
    }

    /// ggml's `quantize_row_q8_K_ref`: per 256 values d = max/−127 (max = the value of largest
    /// magnitude), q = nearest(x · −127/max) (ties to even) clamped at 127, bsums of 16.
    pub fn quantize_q8k(x: &[f32], out: &mut Q8K) {
        assert!(
            x.len().is_multiple_of(QK_K),
            "activation length {} not a multiple of 256",
            x.len()
        );
        out.clear();
        for blk in x.chunks_exact(QK_K) {
            let (mut amax, mut max) = (0f32, 0f32);
            for &v in blk {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            if amax == 0.0 {
                out.d.push(0.0);
                out.qs.extend(std::iter::repeat_n(0i8, QK_K));
                out.bsums.extend(std::iter::repeat_n(0i16, 16));
                continue;
            }
            let iscale = -127.0 / max;
            let q0 = out.qs.len();
            for &v in blk {
                let q = (iscale * v).round_ties_even() as i32;
                out.qs.push(q.min(127) as i8);
            }
            for g in out.qs[q0..].chunks_exact(16) {
                out.bsums.push(g.iter().map(|&q| q as i16).sum());
            }
            out.d.push(1.0 / iscale);
        }
    }
}

/// The AVX2 quantizers, bit-identical to [`scalar`]'s.
#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// AVX2 activation quantization; bit-identical to `scalar::quantize_act` on finite values
    /// and infinities (a block with a NaN may differ: its maximum is taken in another order;
    /// the forward pass stops at the first NaN, `engine::finite`) (d = max|x|/127,
    /// q = round-half-away-from-zero(x · `scalar::inverse_scale(d)`), s = d·Σq).
    ///
    /// Blocks go 8 at a time ([`group8`]): their maxima, scales and sums as 8-lane vectors, so
    /// the per-block divisions and horizontal reductions, a chain of ~50 cycles each, overlap
    /// instead of running one block after another (criterion `act/q8`: 576 values 276 → 142–164
    /// ns, Zen 4). The rest, and any group holding a NaN or an infinity, one block at a time
    /// ([`block`]).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_act(x: &[f32], out: &mut Q8Act) {
        let nb = x.len() / QK;
        // Every block below writes its `d`, `s` and 32 quants, so the buffers only need the right
        // length: no zero fill when they already have it (four calls per layer in decode).
        out.d.resize(nb, 0.0);
        out.s.resize(nb, 0.0);
        out.qs.resize(nb * QK, 0);
        let mut b = 0;
        while b + 8 <= nb {
            if !group8(x.as_ptr().add(b * QK), out, b) {
                for j in b..b + 8 {
                    block(x, out, j);
                }
            }
            b += 8;
        }
        for j in b..nb {
            block(x, out, j);
        }
    }

    /// The 32 values of a block from `p` rounded half away from zero after scaling by `inv`
    /// (like `f32::round`: truncate, then step away from zero when the dropped fraction is
    /// ≥ 0.5), stored as 32 quants at `q`; returns their sum in 8 lanes. With `NAN0` a product
    /// that is NaN (an infinite value times `inv` = 0) becomes 0, as the scalar `as i32` makes
    /// it (the conversion instruction would give −128); only [`block`] can meet one.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn round_store<const NAN0: bool>(v: &[__m256; 4], inv: f32, q: *mut i8) -> __m256i {
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        let sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
        let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
        let invv = _mm256_set1_ps(inv);
        let mut qi = [_mm256_setzero_si256(); 4];
        let mut sum = _mm256_setzero_si256();
        for (k, vi) in v.iter().enumerate() {
            let s = _mm256_mul_ps(*vi, invv);
            let tr = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(s);
            let frac = _mm256_and_ps(_mm256_sub_ps(s, tr), abs_mask);
            let up = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, half);
            let step = _mm256_or_ps(_mm256_and_ps(s, sign_mask), one);
            let mut r = _mm256_add_ps(tr, _mm256_and_ps(up, step));
            if NAN0 {
                r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(s, s));
            }
            qi[k] = _mm256_cvttps_epi32(r);
            sum = _mm256_add_epi32(sum, qi[k]);
        }
        let p16a = _mm256_packs_epi32(qi[0], qi[1]);
        let p16b = _mm256_packs_epi32(qi[2], qi[3]);
        let p8 = _mm256_packs_epi16(p16a, p16b);
        // packs works per 128-bit lane: dwords come out as [0,2,4,6,1,3,5,7] groups of 4 bytes.
        let p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q as *mut __m256i, p8);
        sum
    }

    /// Blocks `b .. b + 8` of `x` from `p` into `out`, with the operations of [`block`]: the
    /// maxima are taken on the bit patterns of the magnitudes (for finite values the same order
    /// as the floats', so the same maximum whatever the order of reduction), the sums are exact,
    /// and each lane's division is the scalar one. Returns false, writing nothing, when a value in
    /// them is a NaN or an infinity, whose maxima [`block`] takes in its own order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group8(p: *const f32, out: &mut Q8Act, b: usize) -> bool {
        let abs_mask = _mm256_set1_epi32(0x7FFF_FFFF);
        let mut mx = [_mm256_setzero_si256(); 8];
        for (j, m) in mx.iter_mut().enumerate() {
            let q = p.add(j * QK);
            let a = |k: usize| {
                _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(q.add(8 * k))), abs_mask)
            };
            *m = _mm256_max_epi32(_mm256_max_epi32(a(0), a(1)), _mm256_max_epi32(a(2), a(3)));
        }
        // Lane j: the largest magnitude of block b + j, as bits; from +inf's up: not finite.
        let amax = reduce8::<true>(&mx);
        let bad = _mm256_cmpgt_epi32(amax, _mm256_set1_epi32(0x7F7F_FFFF));
        if _mm256_movemask_epi8(bad) != 0 {
            return false;
        }
        let d = _mm256_div_ps(_mm256_castsi256_ps(amax), _mm256_set1_ps(127.0));
        // `scalar::inverse_scale` in 8 lanes: 1/d where finite (d = 0 gives +inf), else 0.
        let inv = _mm256_div_ps(_mm256_set1_ps(1.0), d);
        let finite = _mm256_cmp_ps::<_CMP_LT_OQ>(inv, _mm256_set1_ps(f32::INFINITY));
        let inv = _mm256_and_ps(inv, finite);
        let mut invs = [0f32; 8];
        _mm256_storeu_ps(invs.as_mut_ptr(), inv);
        let mut sums = [_mm256_setzero_si256(); 8];
        for (j, sum) in sums.iter_mut().enumerate() {
            let q = p.add(j * QK);
            let v = [0, 1, 2, 3].map(|k| _mm256_loadu_ps(q.add(8 * k)));
            *sum = round_store::<false>(&v, invs[j], out.qs.as_mut_ptr().add((b + j) * QK));
        }
        let total = _mm256_cvtepi32_ps(reduce8::<false>(&sums));
        _mm256_storeu_ps(out.d.as_mut_ptr().add(b), d);
        _mm256_storeu_ps(out.s.as_mut_ptr().add(b), _mm256_mul_ps(d, total));
        true
    }

    /// Lane j: the largest (`MAX`) or the sum of the 8 signed lanes of `v[j]`. Both are exact,
    /// so the order of reduction does not matter.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn reduce8<const MAX: bool>(v: &[__m256i; 8]) -> __m256i {
        let op = |a: __m256i, b: __m256i| {
            if MAX {
                _mm256_max_epi32(a, b)
            } else {
                _mm256_add_epi32(a, b)
            }
        };
        // Per 128-bit half: [a0 ∘ a2, b0 ∘ b2, a1 ∘ a3, b1 ∘ b3], then [w, x, y, z] over the half.
        let pair = |a, b| op(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
        let quad = |a, b| op(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
        let t0 = quad(pair(v[0], v[1]), pair(v[2], v[3]));
        let t1 = quad(pair(v[4], v[5]), pair(v[6], v[7]));
        op(
            _mm256_permute2x128_si256::<0x20>(t0, t1),
            _mm256_permute2x128_si256::<0x31>(t0, t1),
        )
    }

    /// Block `b` of `x` into `out`, alone.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn block(x: &[f32], out: &mut Q8Act, b: usize) {
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        let p = x.as_ptr().add(b * QK);
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let mut mx = _mm256_and_ps(v[0], abs_mask);
        for vi in &v[1..] {
            mx = _mm256_max_ps(mx, _mm256_and_ps(*vi, abs_mask));
        }
        let h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps::<1>(mx));
        let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_max_ss(h, _mm_movehdup_ps(h));
        let amax = _mm_cvtss_f32(h);
        let d = amax / 127.0;
        let inv = scalar::inverse_scale(d);
        let sum = round_store::<true>(&v, inv, out.qs.as_mut_ptr().add(b * QK));
        let s4 = _mm_add_epi32(
            _mm256_castsi256_si128(sum),
            _mm256_extracti128_si256::<1>(sum),
        );
        let s4 = _mm_add_epi32(s4, _mm_shuffle_epi32::<0b01_00_11_10>(s4));
        let s4 = _mm_add_epi32(s4, _mm_shuffle_epi32::<0b10_11_00_01>(s4));
        let total = _mm_cvtsi128_si32(s4);
        out.d[b] = d;
        out.s[b] = d * total as f32;
    }

    /// AVX2 form of `scalar::quantize_q8k`, bit-identical to it (tested below): the block's
    /// largest magnitude and products `x · −127/max` in 8 lanes, rounded to nearest-even with
    /// `vroundps` (what `round_ties_even` does), converted and packed. A block that is all zeros,
    /// holds a NaN or an infinity, or whose scale `−127/max` is not finite (max subnormal), goes to
    /// the scalar code, whose conversions of NaN and ±inf these instructions would not reproduce.
    ///
    /// # Safety
    /// The CPU must support AVX2 (callers check with `Isa::available`).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn quantize_q8k(x: &[f32], out: &mut Q8K) {
        assert!(
            x.len().is_multiple_of(QK_K),
            "activation length {} not a multiple of 256",
            x.len()
        );
        out.clear();
        let sign = _mm256_set1_ps(-0.0);
        for blk in x.chunks_exact(QK_K) {
            let p = blk.as_ptr();
            let (mut m, mut nan) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for i in (0..QK_K).step_by(8) {
                // SAFETY: i + 8 <= 256 = blk.len().
                let v = _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(i)));
                nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
                m = _mm256_max_ps(m, v);
            }
            let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            let amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
            // The value of largest magnitude: the first one reaching it, as the scalar scan keeps.
            let max = blk.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
            let iscale = -127.0 / max;
            if _mm256_movemask_ps(nan) != 0
                || amax == 0.0
                || !amax.is_finite()
                || !iscale.is_finite()
            {
                let mut one = Q8K::default();
                super::scalar::quantize_q8k(blk, &mut one);
                out.d.extend_from_slice(&one.d);
                out.qs.extend_from_slice(&one.qs);
                out.bsums.extend_from_slice(&one.bsums);
                continue;
            }
            let vi = _mm256_set1_ps(iscale);
            let q0 = out.qs.len();
            out.qs.resize(q0 + QK_K, 0);
            let dst = out.qs.as_mut_ptr().add(q0);
            for i in (0..QK_K).step_by(32) {
                let q = |j: usize| {
                    let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                        _mm256_mul_ps(vi, _mm256_loadu_ps(p.add(i + 8 * j))),
                    );
                    _mm256_min_epi32(_mm256_cvtps_epi32(r), _mm256_set1_epi32(127))
                };
                // |x · iscale| ≤ 127 here, so the saturating packs are exact; they interleave the
                // 128-bit halves, which the final permute puts back in order.
                let a = _mm256_packs_epi32(q(0), q(1));
                let b = _mm256_packs_epi32(q(2), q(3));
                let v = _mm256_permutevar8x32_epi32(
                    _mm256_packs_epi16(a, b),
                    _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7),
                );
                // SAFETY: dst + i .. + 32 lies inside the 256 bytes just resized.
                _mm256_storeu_si256(dst.add(i) as *mut __m256i, v);
            }
            for g in out.qs[q0..].chunks_exact(16) {
                out.bsums.push(g.iter().map(|&q| q as i16).sum());
            }
            out.d.push(1.0 / iscale);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dot::testutil::{check_quantize, Rng};

    /// `quantize_for` makes exactly the forms its matrices read, and each form equals the one
    /// made on its own.
    #[test]
    fn quantize_for_makes_the_forms_its_matrices_read() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let mut alone = Q8Act::default();
        alone.quantize_from(&x);
        alone.quantize_k_from(&x);
        let mut a = Q8Act::default();
        for (types, q8, k) in [
            (vec![QuantType::Q4_0], true, false),
            (vec![QuantType::Q6_K, QuantType::Q4_K], false, true),
            (vec![QuantType::Q4_K, QuantType::Q8_0], true, true),
            (vec![QuantType::F32], true, false),
        ] {
            a.quantize_for(&x, types.iter().copied());
            assert_eq!(a.blocks() > 0, q8, "{types:?}");
            assert_eq!(a.k.slice(0, 512).is_some(), k, "{types:?}");
            if q8 {
                assert_eq!((&a.d, &a.s, &a.qs), (&alone.d, &alone.s, &alone.qs));
            }
            if k {
                let (got, want) = (a.k.slice(0, 512).unwrap(), alone.k.slice(0, 512).unwrap());
                assert_eq!((got.d, got.qs, got.bsums), (want.d, want.qs, want.bsums));
            }
        }
    }

    /// Q8_K quantization follows ggml's reference: d = max/−127, nearest (ties to even), clamp
    /// at 127, bsums of 16.
    #[test]
    fn q8k_follows_ggml_reference() {
        let mut x = vec![0f32; 256];
        x[3] = -2.54; // largest magnitude, negative: iscale = −127/max = +50, d = 0.02
        x[4] = 1.27; // 63.5 → 64 (ties to even)
        x[5] = 0.01; // 0.5 → 0 (ties to even)
        x[6] = 0.03; // 1.5 → 2
        let mut k = Q8K::default();
        k.quantize_from(&x);
        assert_eq!(k.d, vec![1.0 / (-127.0 / -2.54f32)]);
        assert_eq!(k.qs[3], -127);
        assert_eq!(k.qs[4], 64);
        assert_eq!(k.qs[5], 0);
        assert_eq!(k.qs[6], 2);
        assert_eq!(k.bsums[0], -127 + 64 + 2);
        // A positive maximum: iscale < 0, the quants flip sign and the largest clamps at 127.
        let mut x = vec![0f32; 256];
        x[0] = 1.0;
        x[1] = -1.0;
        k.quantize_from(&x);
        assert_eq!((k.qs[0], k.qs[1]), (-127, 127));
        assert_eq!(k.d[0], 1.0 / (-127.0f32));
        assert!(k.bsums[1..].iter().all(|&s| s == 0));
        k.quantize_from(&[0.0; 256]);
        assert_eq!((k.d[0], k.bsums[0]), (0.0, 0));
    }

    #[test]
    fn avx2_quantize_act_is_bit_identical() {
        if !Isa::Avx2.available() {
            println!("SKIP: no AVX2/FMA/F16C on this CPU");
            return;
        }
        check_quantize(&|x, out| {
            // SAFETY: AVX2, FMA and F16C detected above.
            unsafe { super::avx2::quantize_act(x, out) }
        });
    }

    /// A group of 8 blocks holding a NaN or an infinity is quantized block by block: the same
    /// bytes as [`super::avx2::block`] on every block, wherever in the group the value sits.
    #[test]
    fn avx2_quantize_act_takes_non_finite_groups_block_by_block() {
        if !Isa::Avx2.available() {
            println!("SKIP: no AVX2/FMA/F16C on this CPU");
            return;
        }
        let mut rng = Rng::new(7);
        let bads = [
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7F80_0001), // a signaling NaN
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        for bad in bads {
            // Group 0, group 1 (blocks 8..16) and the tail (16, 17).
            for at in [
                0,
                31,
                32 * 3 + 5,
                32 * 7 + 31,
                32 * 8 + 2,
                32 * 13 + 17,
                32 * 17 + 9,
            ] {
                let mut x: Vec<f32> = (0..32 * 18).map(|_| rng.uniform() * 4.0).collect();
                x[at] = bad;
                let (mut want, mut got) = (Q8Act::default(), Q8Act::default());
                want.d.resize(18, 0.0);
                want.s.resize(18, 0.0);
                want.qs.resize(32 * 18, 0);
                // SAFETY: AVX2, FMA and F16C detected above; `want` holds 18 blocks.
                unsafe {
                    for b in 0..18 {
                        super::avx2::block(&x, &mut want, b);
                    }
                    super::avx2::quantize_act(&x, &mut got);
                }
                let bits = |v: &[f32]| v.iter().map(|d| d.to_bits()).collect::<Vec<_>>();
                assert_eq!(want.qs, got.qs, "{bad} at {at}");
                assert_eq!(bits(&want.d), bits(&got.d), "{bad} at {at}");
                assert_eq!(bits(&want.s), bits(&got.s), "{bad} at {at}");
            }
        }
    }

    /// The AVX2 Q8_K quantizer gives the scalar reference's bytes on random activations of
    /// several scales and on the blocks it hands back to the scalar code (zeros, NaN, ±inf, a
    /// subnormal maximum), on exact ties (x · −127/max = k + ½) and ±max ties (first one wins).
    #[test]
    fn avx2_quantize_q8k_is_bit_identical_to_scalar() {
        if !Isa::Avx2.available() {
            println!("SKIP: this CPU lacks AVX2/FMA/F16C");
            return;
        }
        let mut rng = Rng::new(97);
        let mut cases: Vec<Vec<f32>> = Vec::new();
        for scale in [1e-30f32, 1e-3, 1.0, 37.0, 1e30] {
            for n in [256, 512, 2048] {
                cases.push((0..n).map(|_| rng.uniform() * scale).collect());
            }
        }
        let mut odd = vec![0f32; 256 * 8];
        // block 1: a NaN; 2: +inf; 3: −inf; 4: subnormal max; 5: ties to even; 6: ±max tie.
        odd[256 + 7] = f32::NAN;
        odd[512] = 1.0;
        odd[512 + 9] = f32::INFINITY;
        odd[768 + 3] = f32::NEG_INFINITY;
        odd[1024 + 5] = 1e-40;
        odd[1024 + 6] = -3e-41;
        for i in 0..256 {
            // max = −127 → iscale = 1: values k + 0.5 land exactly on ties.
            odd[1280 + i] = (i as f32 - 128.0) * 0.5;
        }
        odd[1280] = -127.0;
        odd[1536 + 10] = 2.0;
        odd[1536 + 20] = -2.0;
        odd[1536 + 30] = 1.0;
        cases.push(odd);
        for x in &cases {
            let (mut want, mut got) = (Q8K::default(), Q8K::default());
            super::scalar::quantize_q8k(x, &mut want);
            // SAFETY: AVX2 and FMA detected above.
            unsafe { super::avx2::quantize_q8k(x, &mut got) };
            assert_eq!(want.qs, got.qs);
            assert_eq!(want.bsums, got.bsums);
            let bits = |v: &[f32]| v.iter().map(|d| d.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&want.d), bits(&got.d));
        }
    }
}
