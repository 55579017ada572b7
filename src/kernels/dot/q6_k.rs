//! Q6_K (GGUF super-blocks of 256 six-bit levels, 16 sub-blocks with signed 8-bit scales), its
//! kernels side by side.
//!
//! * `scalar`: the reference, ggml's `vec_dot_q6_K_q8_K` arithmetic.
//! * `avx2`: rows in groups of 4 against the activation's Q8_K blocks: what decode runs on AVX2
//!   and on AVX-512 (`Isa::for_quant`, as for `k4`), and the level unpacking `kquant_batch`
//!   shares.
//! * `avx512`: one row at a time (BW and VNNI builds), run by the tests and benches, not by
//!   decode.
//!
//! The tile dispatch in front of them and the row-group helpers they share are in
//! `kquant_scalar` and `kquant_avx2`; prefill's batched kernels in `kquant_batch` (and
//! `kquant_amx`), the repacked Q6_K kernels in `packed`. All are tested against `scalar` by
//! `testutil::check_kernel`.

/// The scalar reference.
pub mod scalar {
    use crate::kernels::dot::Q8KRef;
    use crate::quant::f16_at;
    use crate::quant::kquants::QK_K;

    /// The 256 levels of a Q6_K block (signed, q − 32) in weight order.
    #[inline]
    pub fn q6k_levels(blk: &[u8]) -> [i8; QK_K] {
        crate::quant::kquants::q6k_levels(blk).map(|l| l as i8 - 32)
    }

    /// Q6_K block `b` · Q8_K block `b`.
    #[inline]
    pub(in crate::kernels::dot) fn dot_q8k(blk: &[u8], k: Q8KRef, b: usize) -> f32 {
        let yq = &k.qs[b * QK_K..(b + 1) * QK_K];
        let yd = k.d[b];
        let l = q6k_levels(blk);
        let mut sumi = 0i32;
        for g in 0..16 {
            let s: i32 = (16 * g..16 * g + 16)
                .map(|i| l[i] as i32 * yq[i] as i32)
                .sum();
            sumi += (blk[192 + g] as i8) as i32 * s;
        }
        f16_at(blk, 208) * yd * sumi as f32
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

    /// Rows `r0..r0 + R` of Q6_K · Q8_K blocks. The −32 offset goes through the bsums: per row
    /// `Σ_g sc_g · bsum_g` with one `vpmaddwd`, folded into the integer sum before the reduction.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::kernels::dot) unsafe fn q6k_group<const R: usize>(r0: usize, t: Rows, k: Q8KRef) {
        if crate::kernels::prefetch::superblock() {
            prefetch_ahead(t.qs.add(r0 * t.rb), R * t.rb);
        }
        let mut acc = _mm_setzero_ps();
        for b in 0..t.nb {
            // SAFETY (all loads): the caller checked `k` covers `nb` blocks and the tile `rows`.
            let bs = _mm256_loadu_si256(k.bsums.as_ptr().add(16 * b) as *const __m256i);
            let yq = k.qs.as_ptr().add(b * QK_K);
            let mut tot = [_mm256_setzero_si256(); 4];
            for (i, tv) in tot.iter_mut().enumerate().take(R) {
                let blk = t.qs.add((r0 + i) * t.rb + b * 210);
                let sc = _mm_loadu_si128(blk.add(192) as *const __m128i);
                let corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc), bs);
                let mut sumi =
                    _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<5>(corr));
                for h in 0..2 {
                    let ql0 = _mm256_loadu_si256(blk.add(64 * h) as *const __m256i);
                    let ql1 = _mm256_loadu_si256(blk.add(64 * h + 32) as *const __m256i);
                    let qh = _mm256_loadu_si256(blk.add(128 + 32 * h) as *const __m256i);
                    let q = q6k_levels(ql0, ql1, qh);
                    for (j, qv) in q.iter().enumerate() {
                        let e0 = 128 * h + 32 * j;
                        let g = (e0 / 16) as i64;
                        let yv = _mm256_loadu_si256(yq.add(e0) as *const __m256i);
                        // Scale g in the low 8 i16 lanes, g+1 in the high 8.
                        let pick = _mm_set_epi64x(
                            0x0101_0101_0101_0101 * (g + 1),
                            0x0101_0101_0101_0101 * g,
                        );
                        let s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, pick));
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(*qv, yv), s);
                        sumi = _mm256_add_epi32(sumi, p);
                    }
                }
                *tv = sumi;
            }
            let total = _mm_cvtepi32_ps(hsum4_i32x8(tot));
            let d = f16_lanes::<R>(t, r0, 210, b, 208);
            let yd = _mm_set1_ps(*k.d.as_ptr().add(b));
            acc = _mm_add_ps(acc, _mm_mul_ps(_mm_mul_ps(d, yd), total));
        }
        add_rows::<R>(acc, t.y.add(r0));
    }

    /// The 6-bit levels (0..63) of one half (128 weights) of a Q6_K block: `ql0`/`ql1` are the half's
    /// 64 low-nibble bytes, `qh` its 32 bytes of high bit pairs. Returns weights 0–31, 32–63,
    /// 64–95 and 96–127 of the half, one byte each (ggml's layout).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(in crate::kernels::dot) unsafe fn q6k_levels(
        ql0: __m256i,
        ql1: __m256i,
        qh: __m256i,
    ) -> [__m256i; 4] {
        let m4 = _mm256_set1_epi8(0x0F);
        let m3 = _mm256_set1_epi8(0x03);
        let m30 = _mm256_set1_epi8(0x30);
        [
            _mm256_or_si256(
                _mm256_and_si256(ql0, m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m3)),
            ),
            _mm256_or_si256(
                _mm256_and_si256(ql1, m4),
                _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m30),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                _mm256_and_si256(qh, m30),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
            ),
        ]
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
    use crate::quant::kquants::QK_K;
    use std::arch::x86_64::*;

    macro_rules! build {
        ($name:ident, $feat:literal, $vnni:literal) => {
            pub(in crate::kernels::dot) mod $name {
                use super::*;

                /// One row of Q6_K · Q8_K blocks.
                #[target_feature(enable = $feat)]
                pub(in crate::kernels::dot) unsafe fn q6k(row: &[u8], k: Q8KRef) -> f32 {
                    let mut acc = 0f32;
                    for (b, blk) in row.chunks_exact(210).enumerate() {
                        let sc = &blk[192..208];
                        let bs = &k.bsums[16 * b..16 * b + 16];
                        let yq = &k.qs[b * QK_K..(b + 1) * QK_K];
                        let corr: i32 = (0..16).map(|g| (sc[g] as i8) as i32 * bs[g] as i32).sum();
                        let mut sumi = _mm512_setzero_si512();
                        for h in 0..2 {
                            // SAFETY: `blk` has 210 bytes (ql 0..128, qh 128..192); `yq` 256.
                            let ql0 =
                                _mm256_loadu_si256(blk.as_ptr().add(64 * h) as *const __m256i);
                            let ql1 =
                                _mm256_loadu_si256(blk.as_ptr().add(64 * h + 32) as *const __m256i);
                            let qh = _mm256_loadu_si256(
                                blk.as_ptr().add(128 + 32 * h) as *const __m256i
                            );
                            let [q0, q1, q2, q3] =
                                crate::kernels::dot::q6_k::avx2::q6k_levels(ql0, ql1, qh);
                            for (j, q) in [join(q0, q1), join(q2, q3)].into_iter().enumerate() {
                                // Weights 128h + 64j .. +64: four groups of 16, one per 128-bit lane.
                                let g = 8 * h + 4 * j;
                                let mut s16 = [0i16; 32];
                                let mut s32 = [0i32; 16];
                                for l in 0..4 {
                                    let s = sc[g + l] as i8;
                                    s16[8 * l..8 * l + 8].fill(s as i16);
                                    s32[4 * l..4 * l + 4].fill(s as i32);
                                }
                                let yv = _mm512_loadu_si512(
                                    yq.as_ptr().add(128 * h + 64 * j) as *const _
                                );
                                let s16 = _mm512_loadu_si512(s16.as_ptr() as *const _);
                                let s32 = _mm512_loadu_si512(s32.as_ptr() as *const _);
                                sumi = _mm512_add_epi32(sumi, dot64::<$vnni>(q, yv, s16, s32));
                            }
                        }
                        let total = _mm512_reduce_add_epi32(sumi) - 32 * corr;
                        acc += f16_at(blk, 208) * k.d[b] * total as f32;
                    }
                    acc
                }
            }
        };
    }

    build!(bw, "avx512f,avx512bw,avx2,fma,f16c", false);
    build!(vnni, "avx512f,avx512bw,avx512vnni,avx2,fma,f16c", true);
}
