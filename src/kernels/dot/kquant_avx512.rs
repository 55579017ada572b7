//! AVX-512 kernels of the interleaved types' integer paths.
//!
//! * K-quants (Q4_K, Q5_K, Q6_K · Q8_K): 64 weights per 512-bit step, `vpmaddubsw` +
//!   `vpmaddwd` (AVX-512 BW) or `vpdpbusd` (VNNI) per sub-block, then the sub-block scales;
//!   minimums and Q6_K's −32 offset through the activation's `bsums`, as in `kquant_avx2`.
//!   One row at a time, so decode keeps the AVX2 kernels' rows-in-groups for them
//!   (`Isa::for_quant`).
//! * Q5_0 · Q8_0 (`q5::avx512::q5_0`, VNNI + VBMI; in Q5_0's own file, `q5.rs`, beside its
//!   scalar reference), the decode kernel of Q5_0 on such CPUs: rows in
//!   groups of 4, two blocks per 512-bit step. Per row and block pair: one masked 44-byte load;
//!   `vpermb` puts each block's 16 packed bytes in two 16-byte quarters, and a shift by 0 or 4
//!   per 64-bit lane and a mask leave the 64 low 4-bit levels in weight order; the fifth bits
//!   (the blocks' two `qh` words as one 64-bit mask) add 16 under mask; one `vpdpbusd` on the
//!   activation's 64 bytes, started from −16·Σy of each 4-byte group (one more `vpdpbusd` per
//!   pair, shared by the rows), gives `Σ (u − 16)·y`, exact. Then per lane
//!   `acc += dot · (d_w·d_x)`, lanes 0–7 with the first block's scales and 8–15 with the
//!   second's (`vpermw` of the loaded bytes, `vcvtph2ps`), and one horizontal sum per row. It
//!   sums in another order than the AVX2 kernel, within the same bound of the scalar
//!   reference. Gemma 3 270M's Q4_K_M file holds 81 Q5_0 matrices.
//!
//! Q5_1 and every f32 path run the AVX2 kernels. [`tile_matvec`] dispatches to both. Tested
//! against the scalar references (`kquant_scalar`; the tests
//! SKIP on a CPU without AVX-512 F/BW).

use super::Q8KRef;
use super::Tile;
use super::XqRef;
use crate::quant::kquants::{scales_mins_k4, QK_K};
use crate::quant::{f16_at, QuantType};
use std::arch::x86_64::*;

/// `y[r] += W[r]·x` for one interleaved tile (AVX-512; `vnni` selects `vpdpbusd`).
///
/// # Safety
/// The CPU must support AVX-512 F and BW plus AVX2, FMA and F16C (and AVX512-VNNI when `vnni`),
/// and the slices must satisfy the contract checked by `kquant::tile_matvec`.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub unsafe fn tile_matvec(
    t: Tile,
    x: &[f32],
    xq: XqRef,
    xk: Option<Q8KRef>,
    y: &mut [f32],
    vnni: bool,
) {
    let Tile {
        quant: q,
        rows,
        cols,
        qs,
        ..
    } = t;
    if let (QuantType::Q5_0, Some(xq), true) = (q, xq, vnni && super::q5::avx512::q5_0_available())
    {
        // SAFETY: AVX-512 F/BW/VNNI/VBMI detected (`q5_0_available`); `qs` holds `rows` rows
        // of `cols / 32` blocks and `xq` covers `cols` (checked by `kquant::tile_matvec`).
        return super::q5::avx512::q5_0(rows, cols, qs, xq, y);
    }
    let Some(k) = xk.filter(|_| q.is_k()) else {
        // SAFETY: AVX2/FMA/F16C are part of the caller's guarantee.
        return super::kquant_avx2::tile_matvec(t, x, xq, xk, y);
    };
    let rb = q.matrix_bytes(1, cols);
    for (r, yr) in y.iter_mut().enumerate().take(rows) {
        let row = &qs[r * rb..(r + 1) * rb];
        *yr += match (q, vnni) {
            (QuantType::Q6_K, true) => vnni::q6k(row, k),
            (QuantType::Q6_K, false) => bw::q6k(row, k),
            (_, true) => vnni::k4(q == QuantType::Q5_K, row, k),
            (_, false) => bw::k4(q == QuantType::Q5_K, row, k),
        };
    }
}

/// Σ_j m_j · (bsums[2j] + bsums[2j+1]) of a Q4_K/Q5_K block.
#[inline(always)]
fn k4_mins(mn: &[u8; 8], bs: &[i16]) -> i32 {
    (0..8)
        .map(|j| mn[j] as i32 * (bs[2 * j] as i32 + bs[2 * j + 1] as i32))
        .sum()
}

/// Two 256-bit halves as one 512-bit vector (low, high).
#[inline]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

macro_rules! kquant_avx512 {
    ($name:ident, $feat:literal, $vnni:literal) => {
        mod $name {
            use super::*;

            /// Integer dot of 64 unsigned levels with 64 activation quants, scaled per 128-bit
            /// lane group by the i16 (`s16`) or i32 (`s32`) scale vectors.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot(q: __m512i, y: __m512i, s16: __m512i, s32: __m512i) -> __m512i {
                if $vnni {
                    _mm512_mullo_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, y), s32)
                } else {
                    let _ = s32;
                    _mm512_madd_epi16(_mm512_maddubs_epi16(q, y), s16)
                }
            }

            /// One row of Q4_K (`five` false) or Q5_K · Q8_K blocks.
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn k4(five: bool, row: &[u8], k: Q8KRef) -> f32 {
                let bb = if five { 176 } else { 144 };
                let m4 = _mm256_set1_epi8(0x0F);
                let m16 = _mm512_set1_epi8(0x10);
                let mut acc = _mm512_setzero_ps();
                let mut mins = 0f32;
                for (b, blk) in row.chunks_exact(bb).enumerate() {
                    let (sc, mn) = scales_mins_k4(&blk[4..16]);
                    let yd = k.d[b];
                    mins +=
                        f16_at(blk, 2) * yd * k4_mins(&mn, &k.bsums[16 * b..16 * b + 16]) as f32;
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
                        let s16 = join(_mm256_set1_epi16(s0 as i16), _mm256_set1_epi16(s1 as i16));
                        let s32 = join(_mm256_set1_epi32(s0 as i32), _mm256_set1_epi32(s1 as i32));
                        sumi = _mm512_add_epi32(sumi, dot(q, yv, s16, s32));
                    }
                    let d = f16_at(blk, 0) * yd;
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
                }
                _mm512_reduce_add_ps(acc) - mins
            }

            /// One row of Q6_K · Q8_K blocks.
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn q6k(row: &[u8], k: Q8KRef) -> f32 {
                let mut acc = 0f32;
                for (b, blk) in row.chunks_exact(210).enumerate() {
                    let sc = &blk[192..208];
                    let bs = &k.bsums[16 * b..16 * b + 16];
                    let yq = &k.qs[b * QK_K..(b + 1) * QK_K];
                    let corr: i32 = (0..16).map(|g| (sc[g] as i8) as i32 * bs[g] as i32).sum();
                    let mut sumi = _mm512_setzero_si512();
                    for h in 0..2 {
                        // SAFETY: `blk` has 210 bytes (ql 0..128, qh 128..192); `yq` 256.
                        let ql0 = _mm256_loadu_si256(blk.as_ptr().add(64 * h) as *const __m256i);
                        let ql1 =
                            _mm256_loadu_si256(blk.as_ptr().add(64 * h + 32) as *const __m256i);
                        let qh =
                            _mm256_loadu_si256(blk.as_ptr().add(128 + 32 * h) as *const __m256i);
                        let [q0, q1, q2, q3] = super::super::q6_k::avx2::q6k_levels(ql0, ql1, qh);
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
                            let yv =
                                _mm512_loadu_si512(yq.as_ptr().add(128 * h + 64 * j) as *const _);
                            let s16 = _mm512_loadu_si512(s16.as_ptr() as *const _);
                            let s32 = _mm512_loadu_si512(s32.as_ptr() as *const _);
                            sumi = _mm512_add_epi32(sumi, dot(q, yv, s16, s32));
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

kquant_avx512!(bw, "avx512f,avx512bw,avx2,fma,f16c", false);
kquant_avx512!(vnni, "avx512f,avx512bw,avx512vnni,avx2,fma,f16c", true);

#[cfg(test)]
mod tests {
    use super::super::testutil::{check_kernel, INTERLEAVED};
    use super::super::Isa;

    #[test]
    fn avx512_matches_scalar_reference() {
        if !Isa::Avx512.available() {
            println!("SKIP: this CPU lacks AVX-512 F/BW (the AVX-512 K-quant kernels did not run)");
            return;
        }
        for vnni in [false, true] {
            if vnni && !Isa::Avx512.has_vnni() {
                println!("SKIP: this CPU lacks AVX512-VNNI (the vpdpbusd variant did not run)");
                continue;
            }
            check_kernel(
                // SAFETY: features detected above; `check_one` builds valid tiles.
                &|t, x, xq, xk, y| unsafe { super::tile_matvec(t, x, xq, xk, y, vnni) },
                &INTERLEAVED,
                29,
            );
        }
    }
}
