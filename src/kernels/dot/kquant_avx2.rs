//! AVX2 kernels of the interleaved types (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), integer paths after
//! llama.cpp's x86 `vec_dot_*`: unsigned levels × signed activation quants with `vpmaddubsw`,
//! sub-block scales applied with `vpmaddwd`, one float multiply per block. The K-quants' minimums
//! (and Q6_K's −32 offset) go through the activation's `bsums`. Rows run in groups of 4: the
//! activation loads and per-block activation values are shared, the f16 scales of the group are
//! converted with one `vcvtph2ps`, the scale/minimum bookkeeping (bsums dots, Q8_K scales) is
//! vector code, and the 4 rows' horizontal sums are reduced together in the order of the
//! one-row `hsum`, so every row's result is bit-identical to the one-row-at-a-time kernel this
//! replaced (tested against a copy of it below). The f32 paths dequantize one block to the stack
//! and dot it with FMA. Tested against `kquant_scalar`.

use super::simd::{hsum, hsum4, hsum4_i32, hsum4_i32x8, prefetch_ahead};
use super::Q8KRef;
use super::Tile;
use super::XqRef;
use crate::quant::kquants::{dequantize_row, QK_K};
use crate::quant::{QuantType, QK};
use std::arch::x86_64::*;

/// Rows per group of the integer kernels: each activation load and per-block activation value
/// is shared by the rows of one group, and their sums are reduced together.
pub(crate) const G: usize = 4;

/// Runs `$f::<R>($r0, ...)` over the tile's rows in groups of [`G`] (tail groups of 1–3 rows).
macro_rules! row_groups {
    ($rows:expr, $f:ident :: <$($c:literal),*> ($($arg:expr),*)) => {{
        let rows = $rows;
        let mut r0 = 0;
        while r0 + $crate::kernels::dot::kquant_avx2::G <= rows {
            $f::<$($c,)* { $crate::kernels::dot::kquant_avx2::G }>(r0, $($arg),*);
            r0 += $crate::kernels::dot::kquant_avx2::G;
        }
        match rows - r0 {
            1 => $f::<$($c,)* 1>(r0, $($arg),*),
            2 => $f::<$($c,)* 2>(r0, $($arg),*),
            3 => $f::<$($c,)* 3>(r0, $($arg),*),
            _ => {}
        }
    }};
    ($rows:expr, $f:ident ($($arg:expr),*)) => {
        row_groups!($rows, $f::<>($($arg),*))
    };
}
pub(super) use row_groups;

/// `y[r] += W[r]·x` for one interleaved tile (AVX2).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C, and the slices must satisfy the contract checked by
/// `kquant::tile_matvec` (`qs` holds `rows × cols` weights of type `q`, `xq`/`xk` cover `cols`
/// when given, else `x.len() >= cols`, `y.len() >= rows`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_matvec(t: Tile, x: &[f32], xq: XqRef, xk: Option<Q8KRef>, y: &mut [f32]) {
    let Tile {
        quant: q,
        rows,
        cols,
        qs,
        ..
    } = t;
    let t = Rows {
        qs: qs.as_ptr(),
        rb: q.matrix_bytes(1, cols),
        nb: cols / q.block_len(),
        y: y.as_mut_ptr(),
    };
    match (q, xq, xk) {
        (QuantType::Q5_0, Some((d, s, xqs)), _) => {
            row_groups!(
                rows,
                q5_group::<false>(t, d.as_ptr(), s.as_ptr(), xqs.as_ptr())
            )
        }
        (QuantType::Q5_1, Some((d, s, xqs)), _) => {
            row_groups!(
                rows,
                q5_group::<true>(t, d.as_ptr(), s.as_ptr(), xqs.as_ptr())
            )
        }
        (QuantType::Q4_K, _, Some(k)) => row_groups!(rows, k4_group::<false>(t, k)),
        (QuantType::Q5_K, _, Some(k)) => row_groups!(rows, k4_group::<true>(t, k)),
        (QuantType::Q6_K, _, Some(k)) => row_groups!(rows, q6k_group(t, k)),
        _ => {
            for (r, yr) in y.iter_mut().enumerate().take(rows) {
                *yr += f32_row(q, &qs[r * t.rb..(r + 1) * t.rb], &x[..cols]);
            }
        }
    }
}

/// Raw view of one interleaved tile: `rb` bytes per row of `nb` blocks.
#[derive(Clone, Copy)]
pub(super) struct Rows {
    pub(super) qs: *const u8,
    pub(super) rb: usize,
    pub(super) nb: usize,
    pub(super) y: *mut f32,
}

/// 16-byte aligned scratch for the per-row scales of a group.
#[repr(C, align(16))]
pub(super) struct Lanes4(pub(super) [f32; 4]);

/// The f16 at byte `off` of block `b` of rows `r0..r0 + R` as f32 lanes (lanes ≥ R are 0).
/// `vcvtph2ps` converts exactly, as `half` does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_lanes<const R: usize>(
    t: Rows,
    r0: usize,
    bb: usize,
    b: usize,
    off: usize,
) -> __m128 {
    let h = |i: usize| -> i16 {
        if i < R {
            // SAFETY: row r0 + i of the tile has `nb` blocks of `bb` bytes; `off + 2 <= bb`.
            t.qs.add((r0 + i) * t.rb + b * bb + off)
                .cast::<i16>()
                .read_unaligned()
        } else {
            0
        }
    };
    _mm_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), 0, 0, 0, 0))
}

/// Lane `i` (0..4) of `v` in all 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn lane(v: __m128, i: usize) -> __m256 {
    _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), _mm256_set1_epi32(i as i32))
}

/// `y[r0 + i] += hsum(acc[i]) ± extra[i]` for the `R` rows of a group ([`hsum4`]), so a group
/// gives the same bits as one row at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn finish<const R: usize>(
    acc: &[__m256; R],
    extra: __m128,
    sub: bool,
    y: *mut f32,
) {
    let v = |i: usize| if i < R { acc[i] } else { _mm256_setzero_ps() };
    let h = hsum4([v(0), v(1), v(2), v(3)]);
    let r = if sub {
        _mm_sub_ps(h, extra)
    } else {
        _mm_add_ps(h, extra)
    };
    add_rows::<R>(r, y);
}

/// `y[i] += v[i]` for `i < R`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn add_rows<const R: usize>(v: __m128, y: *mut f32) {
    if R == 4 {
        _mm_storeu_ps(y, _mm_add_ps(_mm_loadu_ps(y), v));
    } else {
        let mut t = [0f32; 4];
        _mm_storeu_ps(t.as_mut_ptr(), v);
        for (i, v) in t.iter().enumerate().take(R) {
            *y.add(i) += v;
        }
    }
}

/// 0xFF in byte i where bit i of the little-endian u32 at `p` is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_bits(p: *const u8) -> __m256i {
    let v = _mm256_set1_epi32(p.cast::<i32>().read_unaligned());
    let shuf = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let b = _mm256_shuffle_epi8(v, shuf);
    let m = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(b, m), m)
}

/// Rows `r0..r0 + R` of Q5_0 · Q8_0 (`ONE` false) or Q5_1 · Q8_1 blocks. Per block the
/// activation quants are loaded once for the group. Q5_0's `q − 16` goes through the unsigned
/// levels: `Σ q·y − Σ 16·y` per pair of bytes, in i16, is exactly the pair sum of the
/// sign-trick product `|q − 16| · sign(y, q − 16)` (no saturation: |Σ| ≤ 2·31·127).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_group<const ONE: bool, const R: usize>(
    r0: usize,
    t: Rows,
    xd: *const f32,
    xs: *const f32,
    xq: *const i8,
) {
    if crate::kernels::prefetch::superblock() {
        prefetch_ahead(t.qs.add(r0 * t.rb), R * t.rb);
    }
    let bb = if ONE { 24 } else { 22 };
    let off = if ONE { 4 } else { 2 };
    let m4 = _mm256_set1_epi8(0x0F);
    // The 16 packed bytes sit in both 128-bit halves (`vbroadcasti128`, a load with no shuffle);
    // shifting the high half's 64-bit lanes by 4 puts the high nibbles there, so one `vpand`
    // gives [low nibbles | high nibbles] (was two 128-bit ands, a shift and a `vinserti128`).
    let nib_shift = _mm256_setr_epi64x(0, 0, 4, 4);
    let b16 = _mm256_set1_epi8(0x10);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut mins = _mm_setzero_ps();
    let mut dd = Lanes4([0.0; 4]);
    for b in 0..t.nb {
        let yv = _mm256_loadu_si256(xq.add(b * QK) as *const __m256i);
        let y16 = _mm256_maddubs_epi16(b16, yv);
        // Each row's scale is broadcast from memory (a load, not a shuffle-port `vpermps`).
        _mm_store_ps(
            dd.0.as_mut_ptr(),
            _mm_mul_ps(f16_lanes::<R>(t, r0, bb, b, 0), _mm_set1_ps(*xd.add(b))),
        );
        if ONE {
            let m = f16_lanes::<R>(t, r0, bb, b, 2);
            mins = _mm_add_ps(mins, _mm_mul_ps(m, _mm_set1_ps(*xs.add(b))));
        }
        for (i, a) in acc.iter_mut().enumerate() {
            let p = t.qs.add((r0 + i) * t.rb + b * bb);
            let bits = q5_bits(p.add(off));
            let q = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(off + 4) as *const __m128i));
            let nib = _mm256_and_si256(_mm256_srlv_epi64(q, nib_shift), m4);
            let qv = _mm256_or_si256(nib, _mm256_and_si256(bits, b16));
            let s = _mm256_maddubs_epi16(qv, yv);
            let s = if ONE { s } else { _mm256_sub_epi16(s, y16) };
            let p32 = _mm256_madd_epi16(s, ones);
            *a = _mm256_fmadd_ps(_mm256_broadcast_ss(&dd.0[i]), _mm256_cvtepi32_ps(p32), *a);
        }
    }
    finish::<R>(&acc, mins, false, t.y.add(r0));
}

/// The 8 scales and 8 minimums (6 bits each) of a Q4_K/Q5_K block from its 12 packed bytes at
/// `p`, as two little-endian u64 (byte j = sub-block j); ggml's `get_scale_min_k4` for all j at
/// once with 32-bit masks.
#[inline]
pub(super) unsafe fn scales_mins_u64(p: *const u8) -> (u64, u64) {
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
unsafe fn k4_group<const FIVE: bool, const R: usize>(r0: usize, t: Rows, k: Q8KRef) {
    if crate::kernels::prefetch::superblock() {
        prefetch_ahead(t.qs.add(r0 * t.rb), R * t.rb);
    }
    let bb = if FIVE { 176 } else { 144 };
    let m4 = _mm256_set1_epi8(0x0F);
    let m16 = _mm256_set1_epi8(0x10);
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
                let mut lo = _mm256_and_si256(qb, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qb), m4);
                if FIVE {
                    let bl = _mm256_set1_epi8(1 << (2 * n));
                    let bh = _mm256_set1_epi8(1 << (2 * n + 1));
                    let hl = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bl), bl);
                    let hh = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bh), bh);
                    lo = _mm256_or_si256(lo, _mm256_and_si256(hl, m16));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(hh, m16));
                }
                let ylo = _mm256_loadu_si256(yq.add(64 * n) as *const __m256i);
                let yhi = _mm256_loadu_si256(yq.add(64 * n + 32) as *const __m256i);
                // Scales 2n and 2n+1 as i16 in every lane.
                let sl =
                    _mm256_shuffle_epi8(scv, _mm256_set1_epi16((0x0100 + 0x0202 * 2 * n) as i16));
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

/// Rows `r0..r0 + R` of Q6_K · Q8_K blocks. The −32 offset goes through the bsums: per row
/// `Σ_g sc_g · bsum_g` with one `vpmaddwd`, folded into the integer sum before the reduction.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_group<const R: usize>(r0: usize, t: Rows, k: Q8KRef) {
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
            let mut sumi = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<5>(corr));
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
                    let pick =
                        _mm_set_epi64x(0x0101_0101_0101_0101 * (g + 1), 0x0101_0101_0101_0101 * g);
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

/// The 6-bit levels (0..63) of one half (128 weights) of a Q6_K block: `ql0`/`ql1` are the half's
/// 64 low-nibble bytes, `qh` its 32 bytes of high bit pairs. Returns weights 0–31, 32–63,
/// 64–95 and 96–127 of the half, one byte each (ggml's layout).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn q6k_levels(ql0: __m256i, ql1: __m256i, qh: __m256i) -> [__m256i; 4] {
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

#[cfg(test)]
mod tests {
    use super::super::testutil::{check_kernel, INTERLEAVED};
    use super::super::Isa;
    use crate::kernels::dot::Tile;

    #[test]
    fn avx2_matches_scalar_reference() {
        if !Isa::Avx2.available() {
            println!("SKIP: this CPU lacks AVX2/FMA/F16C");
            return;
        }
        check_kernel(
            // SAFETY: features detected above; `check_one` builds valid tiles.
            &|t, x, xq, xk, y| unsafe { super::tile_matvec(t, x, xq, xk, y) },
            &INTERLEAVED,
            17,
        );
    }

    #[test]
    fn dispatch_matches_scalar_reference_on_every_isa() {
        for isa in [Isa::Avx2, Isa::Avx512] {
            check_kernel(
                &|t, x, xq, xk, y| super::super::kquant::tile_matvec(isa, t, x, xq, xk, y),
                &INTERLEAVED,
                23,
            );
        }
    }

    /// The one-row-at-a-time integer kernels this module had before the row groups, kept
    /// verbatim as the bit-exact reference of `grouped_kernels_match_one_row_kernels_bit_for_bit`.
    #[allow(clippy::needless_range_loop)]
    mod legacy {
        use super::super::super::Q8KRef;
        use crate::kernels::dot::simd::hsum;
        use crate::quant::kquants::{scales_mins_k4, QK_K};
        use crate::quant::{f16_at, QK};
        use std::arch::x86_64::*;

        /// Horizontal sum of 8 i32.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn hsum_i32(v: __m256i) -> i32 {
            let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
            _mm_cvtsi128_si32(s)
        }

        /// 0xFF in byte i where bit i of the Q5 block's `qh` (at `blk[off..off + 4]`) is set.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn q5_bits(blk: &[u8], off: usize) -> __m256i {
            let qh = u32::from_le_bytes([blk[off], blk[off + 1], blk[off + 2], blk[off + 3]]);
            let v = _mm256_set1_epi32(qh as i32);
            let shuf = _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                3, 3, 3, 3,
            );
            let b = _mm256_shuffle_epi8(v, shuf);
            let m = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            _mm256_cmpeq_epi8(_mm256_and_si256(b, m), m)
        }

        /// One row of Q5_0 · Q8_0 or Q5_1 · Q8_1 blocks.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn q5_q8(
            one: bool,
            row: &[u8],
            (xd, xs, xqs): (&[f32], &[f32], &[i8]),
        ) -> f32 {
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
        pub(super) unsafe fn k4_q8k(five: bool, row: &[u8], k: Q8KRef) -> f32 {
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
        pub(super) unsafe fn q6k_q8k(row: &[u8], k: Q8KRef) -> f32 {
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
                    let q = super::super::q6k_levels(ql0, ql1, qh);
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
    }

    /// The 4-row groups give every row the same bits as the one-row kernels they replaced, for
    /// row counts around the group size (1–9, 37, 128), Gemma 3's 640 = 2.5 × 256 columns (Q5
    /// tiles of 20 blocks) and K-quant widths of 1–8 blocks.
    #[test]
    fn grouped_kernels_match_one_row_kernels_bit_for_bit() {
        use super::super::testutil::Rng;
        use super::super::testutil::{acts, random_body_tile, INTERLEAVED};
        use crate::quant::QuantType;
        if !Isa::Avx2.available() {
            println!("SKIP: this CPU lacks AVX2/FMA/F16C");
            return;
        }
        let mut rng = Rng::new(31);
        for q in INTERLEAVED {
            let widths: &[usize] = if q.is_k() {
                &[256, 512, 768, 2048]
            } else {
                &[32, 96, 256, 640]
            };
            for &cols in widths {
                for rows in [1, 2, 3, 4, 5, 6, 7, 8, 9, 37, 128] {
                    let (qs, _) = random_body_tile(&mut rng, q, rows, cols);
                    let x: Vec<f32> = (0..cols).map(|_| rng.uniform() * 2.0).collect();
                    let a = acts(&x);
                    let xq = (!q.is_k()).then(|| a.tile_slice(0, cols));
                    let xk = if q.is_k() { a.k.slice(0, cols) } else { None };
                    let y0: Vec<f32> = (0..rows).map(|_| rng.uniform()).collect();
                    let mut want = y0.clone();
                    let rb = q.matrix_bytes(1, cols);
                    for (r, yr) in want.iter_mut().enumerate() {
                        let row = &qs[r * rb..(r + 1) * rb];
                        // SAFETY: AVX2/FMA/F16C detected above; the row and activation cover
                        // `cols`.
                        *yr += unsafe {
                            match (q, xq, xk) {
                                (QuantType::Q5_0 | QuantType::Q5_1, Some(a), _) => {
                                    legacy::q5_q8(q == QuantType::Q5_1, row, a)
                                }
                                (QuantType::Q6_K, _, Some(k)) => legacy::q6k_q8k(row, k),
                                (_, _, Some(k)) => legacy::k4_q8k(q == QuantType::Q5_K, row, k),
                                _ => unreachable!(),
                            }
                        };
                    }
                    let mut got = y0.clone();
                    // SAFETY: as above; `random_body_tile` built `rows × cols` weights of type `q`.
                    unsafe {
                        super::tile_matvec(Tile::body(q, rows, cols, &qs), &x, xq, xk, &mut got)
                    };
                    let (w, g): (Vec<u32>, Vec<u32>) = (
                        want.iter().map(|v| v.to_bits()).collect(),
                        got.iter().map(|v| v.to_bits()).collect(),
                    );
                    assert_eq!(w, g, "{q} {rows}x{cols}");
                }
            }
        }
    }
}
