//! Q4_K and Q5_K (GGUF super-blocks of 256 four- or five-bit levels, 8 sub-blocks with 6-bit
//! scales and minimums), their kernels side by side: one body serves both types on each ISA
//! (`five`/`FIVE`: Q5_K's fifth bit).
//!
//! * `scalar`: the reference, ggml's `vec_dot_q4_K_q8_K` / `vec_dot_q5_K_q8_K` arithmetic.
//! * `avx2`: rows in groups of 4 against the activation's Q8_K blocks: what decode runs on AVX2
//!   and on AVX-512 (`Isa::for_quant` maps AVX-512 to AVX2 here: twice as fast as the one-row
//!   AVX-512 kernel).
//! * `avx512`: one row at a time, 64 weights per 512-bit step (BW and VNNI builds), run by the
//!   tests and benches, not by decode.
//!
//! The tile dispatch in front of them and the row-group helpers they share are in
//! `kquant_scalar` and `kquant_avx2`; prefill's batched kernels in `kquant_batch` (and
//! `kquant_amx`), the repacked Q4_K kernels in `packed`. All are tested against `scalar` by
//! `testutil::check_kernel`.

/// The scalar reference.
pub mod scalar {
    use crate::kernels::dot::Q8KRef;
    use crate::quant::f16_at;
    use crate::quant::kquants::{scales_mins_k4, QK_K};

    /// The 256 levels of a Q4_K/Q5_K block (unsigned) in weight order.
    #[inline]
    pub fn k4_levels(five: bool, blk: &[u8]) -> [u8; QK_K] {
        let (qh, ql) = if five {
            (&blk[16..48], &blk[48..176])
        } else {
            (&blk[0..0], &blk[16..144])
        };
        let mut l = [0u8; QK_K];
        for n in 0..4 {
            for i in 0..32 {
                let b = ql[32 * n + i];
                let (mut lo, mut hi) = (b & 0xF, b >> 4);
                if five {
                    lo |= ((qh[i] >> (2 * n)) & 1) << 4;
                    hi |= ((qh[i] >> (2 * n + 1)) & 1) << 4;
                }
                l[64 * n + i] = lo;
                l[64 * n + 32 + i] = hi;
            }
        }
        l
    }

    /// Q4_K (`five` false) or Q5_K block `b` · Q8_K block `b`.
    #[inline]
    pub(in crate::kernels::dot) fn dot_q8k(five: bool, blk: &[u8], k: Q8KRef, b: usize) -> f32 {
        let yq = &k.qs[b * QK_K..(b + 1) * QK_K];
        let bs = &k.bsums[16 * b..16 * (b + 1)];
        let yd = k.d[b];
        let l = k4_levels(five, blk);
        let (sc, mn) = scales_mins_k4(&blk[4..16]);
        let mut sumi = 0i32;
        let mut summ = 0i32;
        for j in 0..8 {
            let s: i32 = (32 * j..32 * j + 32)
                .map(|i| l[i] as i32 * yq[i] as i32)
                .sum();
            sumi += sc[j] as i32 * s;
            summ += mn[j] as i32 * (bs[2 * j] as i32 + bs[2 * j + 1] as i32);
        }
        f16_at(blk, 0) * yd * sumi as f32 - f16_at(blk, 2) * yd * summ as f32
    }
}

/// AVX2 + FMA + F16C (see `kquant_avx2` for the row groups).
#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use crate::kernels::dot::kquant_avx2::*;
    use crate::kernels::dot::simd::*;
    use crate::kernels::dot::Q8KRef;
    use crate::quant::kquants::QK_K;
    use std::arch::x86_64::*;

    /// The 64 unsigned levels of quarter `n` of a Q4_K/Q5_K block from its 32 packed bytes
    /// `qb`: weights `64n ..+32` (`lo`, low nibbles) and `64n+32 ..+32` (`hi`, high nibbles),
    /// with `five` (Q5_K) each one's fifth bit from `qh` (the block's 32 high-bit bytes, bits
    /// `2n` and `2n+1`). The one home of this unpacking: decode's row groups, the f32 path's
    /// rows (`kquant_avx2`) and prefill's batched kernels (`kquant_batch`) all use it.
    #[inline(always)]
    pub(in crate::kernels::dot) unsafe fn levels(
        qb: __m256i,
        qh: __m256i,
        n: usize,
        five: bool,
    ) -> (__m256i, __m256i) {
        let m4 = _mm256_set1_epi8(0x0F);
        let mut lo = _mm256_and_si256(qb, m4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qb), m4);
        if five {
            let m16 = _mm256_set1_epi8(0x10);
            let bl = _mm256_set1_epi8(1 << (2 * n));
            let bh = _mm256_set1_epi8(1 << (2 * n + 1));
            let hl = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bl), bl);
            let hh = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bh), bh);
            lo = _mm256_or_si256(lo, _mm256_and_si256(hl, m16));
            hi = _mm256_or_si256(hi, _mm256_and_si256(hh, m16));
        }
        (lo, hi)
    }

    /// The 8 scales and 8 minimums (6 bits each) of a Q4_K/Q5_K block from its 12 packed bytes at
    /// `p`, as two little-endian u64 (byte j = sub-block j); ggml's `get_scale_min_k4` for all j at
    /// once with 32-bit masks.
    #[inline]
    pub(in crate::kernels::dot) unsafe fn scales_mins_u64(p: *const u8) -> (u64, u64) {
        let u = |k: usize| p.add(4 * k).cast::<u32>().read_unaligned();
        let (u0, u1, u2) = (u(0), u(1), u(2));
        let (m6, m4, m2) = (0x3F3F_3F3Fu32, 0x0F0F_0F0Fu32, 0x0303_0303u32);
        let sc_lo = u0 & m6;
        let sc_hi = (u2 & m4) | (((u0 >> 6) & m2) << 4);
        let mn_lo = u1 & m6;
        let mn_hi = ((u2 >> 4) & m4) | (((u1 >> 6) & m2) << 4);
        (
            sc_lo as u64 | (sc_hi as u64) << 32,
            mn_lo as u64 | (mn_hi as u64) << 32,
        )
    }

    /// Rows `r0..r0 + R` of Q4_K (`FIVE` false) or Q5_K · Q8_K blocks.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::kernels::dot) unsafe fn k4_group<const FIVE: bool, const R: usize>(
        r0: usize,
        t: Rows,
        k: Q8KRef,
    ) {
        if crate::kernels::prefetch::superblock() {
            prefetch_ahead(t.qs.add(r0 * t.rb), R * t.rb);
        }
        let bb = if FIVE { 176 } else { 144 };
        let mut acc = [_mm256_setzero_ps(); R];
        let mut mins = _mm_setzero_ps();
        for b in 0..t.nb {
            // SAFETY (all loads): the caller checked `k` covers `nb` blocks and the tile `rows`.
            let bs = _mm256_loadu_si256(k.bsums.as_ptr().add(16 * b) as *const __m256i);
            // Sums of the bsums pairs (2j, 2j+1), the 32 quants of sub-block j (|·| ≤ 4064).
            let bsp = _mm_hadd_epi16(
                _mm256_castsi256_si128(bs),
                _mm256_extracti128_si256::<1>(bs),
            );
            let yd = _mm_set1_ps(*k.d.as_ptr().add(b));
            let yq = k.qs.as_ptr().add(b * QK_K);
            let mut summ = [_mm_setzero_si128(); 4];
            let mut sumi = [_mm256_setzero_si256(); R];
            for i in 0..R {
                let blk = t.qs.add((r0 + i) * t.rb + b * bb);
                let (sc, mn) = scales_mins_u64(blk.add(4));
                summ[i] = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64)), bsp);
                let sc16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64));
                let scv = _mm256_set_m128i(sc16, sc16);
                let ql = blk.add(if FIVE { 48 } else { 16 });
                let qh = if FIVE {
                    _mm256_loadu_si256(blk.add(16) as *const __m256i)
                } else {
                    _mm256_setzero_si256()
                };
                for n in 0..4 {
                    let qb = _mm256_loadu_si256(ql.add(32 * n) as *const __m256i);
                    let (lo, hi) = levels(qb, qh, n, FIVE);
                    let ylo = _mm256_loadu_si256(yq.add(64 * n) as *const __m256i);
                    let yhi = _mm256_loadu_si256(yq.add(64 * n + 32) as *const __m256i);
                    // Scales 2n and 2n+1 as i16 in every lane.
                    let sl = _mm256_shuffle_epi8(
                        scv,
                        _mm256_set1_epi16((0x0100 + 0x0202 * 2 * n) as i16),
                    );
                    let sh = _mm256_shuffle_epi8(
                        scv,
                        _mm256_set1_epi16((0x0100 + 0x0202 * (2 * n + 1)) as i16),
                    );
                    let plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo), sl);
                    let phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi), sh);
                    sumi[i] = _mm256_add_epi32(sumi[i], _mm256_add_epi32(plo, phi));
                }
            }
            let summ = _mm_cvtepi32_ps(hsum4_i32(summ));
            let dmin = f16_lanes::<R>(t, r0, bb, b, 2);
            mins = _mm_add_ps(mins, _mm_mul_ps(_mm_mul_ps(dmin, yd), summ));
            let d = _mm_mul_ps(f16_lanes::<R>(t, r0, bb, b, 0), yd);
            for (i, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(lane(d, i), _mm256_cvtepi32_ps(sumi[i]), *a);
            }
        }
        finish::<R>(&acc, mins, true, t.y.add(r0));
    }
}

/// The one-row AVX-512 kernels (BW and VNNI builds): 64 weights per step, one row at a time.
/// Tested and benchmarked; decode runs the 4-row AVX2 kernel instead (twice as fast on Zen 5).
/// Safety contract: as `kquant_avx512`'s, whose `tile_matvec` is the only caller (the CPU
/// features of the build were detected; a row holds whole blocks and `k` covers them).
#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    use crate::kernels::dot::simd::{dot64, join512 as join};
    use crate::kernels::dot::Q8KRef;
    use crate::quant::f16_at;
    use crate::quant::kquants::{scales_mins_k4, QK_K};
    use std::arch::x86_64::*;

    /// Σ_j m_j · (bsums[2j] + bsums[2j+1]) of a Q4_K/Q5_K block.
    #[inline(always)]
    pub(super) fn k4_mins(mn: &[u8; 8], bs: &[i16]) -> i32 {
        (0..8)
            .map(|j| mn[j] as i32 * (bs[2 * j] as i32 + bs[2 * j + 1] as i32))
            .sum()
    }

    macro_rules! build {
        ($name:ident, $feat:literal, $vnni:literal) => {
            pub(in crate::kernels::dot) mod $name {
                use super::*;

                /// One row of Q4_K (`five` false) or Q5_K · Q8_K blocks.
                #[target_feature(enable = $feat)]
                pub(in crate::kernels::dot) unsafe fn k4(five: bool, row: &[u8], k: Q8KRef) -> f32 {
                    let bb = if five { 176 } else { 144 };
                    let m4 = _mm256_set1_epi8(0x0F);
                    let m16 = _mm512_set1_epi8(0x10);
                    let mut acc = _mm512_setzero_ps();
                    let mut mins = 0f32;
                    for (b, blk) in row.chunks_exact(bb).enumerate() {
                        let (sc, mn) = scales_mins_k4(&blk[4..16]);
                        let yd = k.d[b];
                        mins += f16_at(blk, 2)
                            * yd
                            * super::k4_mins(&mn, &k.bsums[16 * b..16 * b + 16]) as f32;
                        let ql = if five { &blk[48..176] } else { &blk[16..144] };
                        let yq = &k.qs[b * QK_K..(b + 1) * QK_K];
                        // SAFETY (loads): `ql` has 128 bytes, `qh` (blk[16..48]) 32, `yq` 256.
                        let qh = if five {
                            _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                blk.as_ptr().add(16) as *const __m256i
                            ))
                        } else {
                            _mm512_setzero_si512()
                        };
                        let mut sumi = _mm512_setzero_si512();
                        for n in 0..4 {
                            let qb = _mm256_loadu_si256(ql.as_ptr().add(32 * n) as *const __m256i);
                            let lo = _mm256_and_si256(qb, m4);
                            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qb), m4);
                            let mut q = join(lo, hi);
                            if five {
                                let mb = join(
                                    _mm256_set1_epi8(1 << (2 * n)),
                                    _mm256_set1_epi8(1 << (2 * n + 1)),
                                );
                                let bits = _mm512_test_epi8_mask(qh, mb);
                                q = _mm512_or_si512(q, _mm512_maskz_mov_epi8(bits, m16));
                            }
                            let yv = _mm512_loadu_si512(yq.as_ptr().add(64 * n) as *const _);
                            let (s0, s1) = (sc[2 * n], sc[2 * n + 1]);
                            let s16 =
                                join(_mm256_set1_epi16(s0 as i16), _mm256_set1_epi16(s1 as i16));
                            let s32 =
                                join(_mm256_set1_epi32(s0 as i32), _mm256_set1_epi32(s1 as i32));
                            sumi = _mm512_add_epi32(sumi, dot64::<$vnni>(q, yv, s16, s32));
                        }
                        let d = f16_at(blk, 0) * yd;
                        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
                    }
                    _mm512_reduce_add_ps(acc) - mins
                }
            }
        };
    }

    build!(bw, "avx512f,avx512bw,avx2,fma,f16c", false);
    build!(vnni, "avx512f,avx512bw,avx512vnni,avx2,fma,f16c", true);
}
