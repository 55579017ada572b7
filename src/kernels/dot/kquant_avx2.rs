//! AVX2 kernels of the interleaved types (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), integer paths after
//! llama.cpp's x86 `vec_dot_*`: unsigned levels × signed activation quants with `vpmaddubsw`,
//! sub-block scales applied with `vpmaddwd`, one float multiply per block. The K-quants' minimums
//! (and Q6_K's −32 offset) go through the activation's `bsums`. The f32 paths dequantize one block
//! to the stack and dot it with FMA. Tested against `kquant_scalar`.

use super::kquant::Q8KRef;
use super::XqRef;
use crate::quant::kquants::{dequantize_row, scales_mins_k4, QK_K};
use crate::quant::{f16_at, QuantType, QK};
use std::arch::x86_64::*;

/// `y[r] += W[r]·x` for one interleaved tile (AVX2).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C, and the slices must satisfy the contract checked by
/// `kquant::tile_matvec` (`qs` holds `rows × cols` weights of type `q`, `xq`/`xk` cover `cols`
/// when given, else `x.len() >= cols`, `y.len() >= rows`).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_matvec(
    q: QuantType,
    rows: usize,
    cols: usize,
    qs: &[u8],
    x: &[f32],
    xq: XqRef,
    xk: Option<Q8KRef>,
    y: &mut [f32],
) {
    let rb = q.matrix_bytes(1, cols);
    for (r, yr) in y.iter_mut().enumerate().take(rows) {
        let row = &qs[r * rb..(r + 1) * rb];
        *yr += match (q, xq, xk) {
            (QuantType::Q5_0 | QuantType::Q5_1, Some(a), _) => q5_q8(q == QuantType::Q5_1, row, a),
            (QuantType::Q4_K | QuantType::Q5_K, _, Some(k)) => k4_q8k(q == QuantType::Q5_K, row, k),
            (QuantType::Q6_K, _, Some(k)) => q6k_q8k(row, k),
            _ => f32_row(q, row, &x[..cols]),
        };
    }
}

/// Horizontal sum of 8 floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// Horizontal sum of 8 i32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// 0xFF in byte i where bit i of the Q5 block's `qh` (at `blk[off..off + 4]`) is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_bits(blk: &[u8], off: usize) -> __m256i {
    let qh = u32::from_le_bytes([blk[off], blk[off + 1], blk[off + 2], blk[off + 3]]);
    let v = _mm256_set1_epi32(qh as i32);
    let shuf = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let b = _mm256_shuffle_epi8(v, shuf);
    let m = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(b, m), m)
}

/// One row of Q5_0 · Q8_0 or Q5_1 · Q8_1 blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_q8(one: bool, row: &[u8], (xd, xs, xqs): (&[f32], &[f32], &[i8])) -> f32 {
    let bb = if one { 24 } else { 22 };
    let off = if one { 4 } else { 2 };
    let m4 = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0f32;
    for (b, blk) in row.chunks_exact(bb).enumerate() {
        let bits = q5_bits(blk, off);
        // SAFETY: `blk` has `off + 4 + 16` bytes; `xqs` covers block b (checked by the caller).
        let q = _mm_loadu_si128(blk.as_ptr().add(off + 4) as *const __m128i);
        let lo = _mm_and_si128(q, m4);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), m4);
        let nib = _mm256_set_m128i(hi, lo);
        let yv = _mm256_loadu_si256(xqs.as_ptr().add(b * QK) as *const __m256i);
        let d = f16_at(blk, 0) * xd[b];
        let p32 = if one {
            let qv = _mm256_or_si256(nib, _mm256_and_si256(bits, _mm256_set1_epi8(0x10)));
            mins += f16_at(blk, 2) * xs[b];
            _mm256_madd_epi16(_mm256_maddubs_epi16(qv, yv), ones)
        } else {
            // q − 16: OR 0xF0 into the levels whose 5th bit is clear (two's complement).
            let qv = _mm256_or_si256(nib, _mm256_andnot_si256(bits, _mm256_set1_epi8(-16)));
            let ax = _mm256_sign_epi8(qv, qv);
            let sy = _mm256_sign_epi8(yv, qv);
            _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones)
        };
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p32), acc);
    }
    hsum(acc) + mins
}

/// One row of Q4_K (`five` false) or Q5_K · Q8_K blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_q8k(five: bool, row: &[u8], k: Q8KRef) -> f32 {
    let bb = if five { 176 } else { 144 };
    let m4 = _mm256_set1_epi8(0x0F);
    let m16 = _mm256_set1_epi8(0x10);
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0f32;
    for (b, blk) in row.chunks_exact(bb).enumerate() {
        let (sc, mn) = scales_mins_k4(&blk[4..16]);
        let bs = &k.bsums[16 * b..16 * b + 16];
        let mut summ = 0i32;
        for j in 0..8 {
            summ += mn[j] as i32 * (bs[2 * j] as i32 + bs[2 * j + 1] as i32);
        }
        let yd = k.d[b];
        mins += f16_at(blk, 2) * yd * summ as f32;
        let ql = if five { &blk[48..176] } else { &blk[16..144] };
        let yq = &k.qs[b * QK_K..(b + 1) * QK_K];
        // SAFETY (loads below): `ql` has 128 bytes, `qh` 32, `yq` 256 (sliced above).
        let qh = if five {
            _mm256_loadu_si256(blk.as_ptr().add(16) as *const __m256i)
        } else {
            _mm256_setzero_si256()
        };
        let mut sumi = _mm256_setzero_si256();
        for n in 0..4 {
            let qb = _mm256_loadu_si256(ql.as_ptr().add(32 * n) as *const __m256i);
            let mut lo = _mm256_and_si256(qb, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qb), m4);
            if five {
                let bl = _mm256_set1_epi8(1 << (2 * n));
                let bh = _mm256_set1_epi8(1 << (2 * n + 1));
                let hl = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bl), bl);
                let hh = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bh), bh);
                lo = _mm256_or_si256(lo, _mm256_and_si256(hl, m16));
                hi = _mm256_or_si256(hi, _mm256_and_si256(hh, m16));
            }
            let ylo = _mm256_loadu_si256(yq.as_ptr().add(64 * n) as *const __m256i);
            let yhi = _mm256_loadu_si256(yq.as_ptr().add(64 * n + 32) as *const __m256i);
            let plo = _mm256_madd_epi16(
                _mm256_maddubs_epi16(lo, ylo),
                _mm256_set1_epi16(sc[2 * n] as i16),
            );
            let phi = _mm256_madd_epi16(
                _mm256_maddubs_epi16(hi, yhi),
                _mm256_set1_epi16(sc[2 * n + 1] as i16),
            );
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
        }
        let d = f16_at(blk, 0) * yd;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc) - mins
}

/// One row of Q6_K · Q8_K blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_q8k(row: &[u8], k: Q8KRef) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(0x03);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = 0f32;
    for (b, blk) in row.chunks_exact(210).enumerate() {
        let sc = &blk[192..208];
        let bs = &k.bsums[16 * b..16 * b + 16];
        let yq = &k.qs[b * QK_K..(b + 1) * QK_K];
        let corr: i32 = sc
            .iter()
            .zip(bs)
            .map(|(&s, &b)| (s as i8) as i32 * b as i32)
            .sum();
        let mut sumi = _mm256_setzero_si256();
        for h in 0..2 {
            // SAFETY: `blk` has 210 bytes (ql 0..128, qh 128..192); `yq` 256.
            let ql0 = _mm256_loadu_si256(blk.as_ptr().add(64 * h) as *const __m256i);
            let ql1 = _mm256_loadu_si256(blk.as_ptr().add(64 * h + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(blk.as_ptr().add(128 + 32 * h) as *const __m256i);
            let q = [
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
            ];
            for (j, qv) in q.iter().enumerate() {
                let e0 = 128 * h + 32 * j;
                let g = e0 / 16;
                let yv = _mm256_loadu_si256(yq.as_ptr().add(e0) as *const __m256i);
                let s = _mm256_set_m128i(
                    _mm_set1_epi16((sc[g + 1] as i8) as i16),
                    _mm_set1_epi16((sc[g] as i8) as i16),
                );
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(*qv, yv), s);
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        let total = hsum_i32(sumi) - 32 * corr;
        acc += f16_at(blk, 208) * k.d[b] * total as f32;
    }
    acc
}

/// f32 path: each block dequantized to the stack, then an FMA dot with `x`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_row(q: QuantType, row: &[u8], x: &[f32]) -> f32 {
    let (bl, bb) = (q.block_len(), q.block_bytes());
    let mut w = [0f32; QK_K];
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for (blk, xb) in row.chunks_exact(bb).zip(x.chunks_exact(bl)) {
        dequantize_row(q, blk, &mut w[..bl]);
        for i in (0..bl).step_by(16) {
            // SAFETY: `bl` is a multiple of 16 and both `w[..bl]` and `xb` have `bl` elements.
            let w0 = _mm256_loadu_ps(w.as_ptr().add(i));
            let w1 = _mm256_loadu_ps(w.as_ptr().add(i + 8));
            a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xb.as_ptr().add(i)), a0);
            a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb.as_ptr().add(i + 8)), a1);
        }
    }
    hsum(_mm256_add_ps(a0, a1))
}

#[cfg(test)]
mod tests {
    use super::super::kquant::testutil::check_kernel;
    use super::super::Isa;

    #[test]
    fn avx2_matches_scalar_reference() {
        if !Isa::Avx2.available() {
            println!("SKIP: this CPU lacks AVX2/FMA/F16C");
            return;
        }
        check_kernel(
            &|q, rows, cols, qs, x, xq, xk, y| {
                // SAFETY: features detected above; `check_one` builds valid tiles.
                unsafe { super::tile_matvec(q, rows, cols, qs, x, xq, xk, y) }
            },
            17,
        );
    }

    #[test]
    fn dispatch_matches_scalar_reference_on_every_isa() {
        for isa in [Isa::Avx2, Isa::Avx512] {
            check_kernel(
                &|q, rows, cols, qs, x, xq, xk, y| {
                    super::super::kquant::tile_matvec(isa, q, rows, cols, qs, x, xq, xk, y)
                },
                23,
            );
        }
    }
}
