//! The AVX2 tile dispatch of the interleaved types (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), their f32
//! path, and the row-group helpers their kernels share; the kernels themselves sit in each
//! type's file beside its scalar reference (`q5::avx2`, `k4::avx2`, `q6_k::avx2`). Integer paths after
//! llama.cpp's x86 `vec_dot_*`: unsigned levels × signed activation quants with `vpmaddubsw`,
//! sub-block scales applied with `vpmaddwd`, one float multiply per block. The K-quants' minimums
//! (and Q6_K's −32 offset) go through the activation's `bsums`. Rows run in groups of 4: the
//! activation loads and per-block activation values are shared, the f16 scales of the group are
//! converted with one `vcvtph2ps`, the scale/minimum bookkeeping (bsums dots, Q8_K scales) is
//! vector code, and the 4 rows' horizontal sums are reduced together in the order of the
//! one-row `hsum`, so every row's result is bit-identical to the one-row-at-a-time kernel this
//! replaced (tested against a copy of it below). The f32 paths dequantize one block to the stack
//! and dot it with FMA. Tested against the scalar references (`kquant_scalar`).

use super::k4::avx2::k4_group;
use super::q5::avx2::q5_group;
use super::q6_k::avx2::q6k_group;
use super::simd::{hsum, hsum4};
use super::Q8KRef;
use super::Tile;
use super::XqRef;
use crate::quant::kquants::{dequantize_row, QK_K};
use crate::quant::QuantType;
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
                    let (lo, hi) = crate::kernels::dot::k4::avx2::levels(qb, qh, n, five);
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
                    let q = crate::kernels::dot::q6_k::avx2::q6k_levels(ql0, ql1, qh);
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
