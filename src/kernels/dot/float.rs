//! F16 and F32 weights (the split layout without scales: `cols` weights per row, any width),
//! their kernels side by side: the scalar reference, AVX2 (F16C's `vcvtph2ps` fused into FMAs,
//! 4 rows sharing the activation loads) and AVX-512 (16 lanes). On each ISA the split layout's
//! tile entry (`split`) sends these two types here. Tested against `scalar` by
//! `testutil::check_kernel` through that entry.

/// The scalar reference.
pub mod scalar {
    use crate::kernels::dot::Tile;
    use crate::quant::{f16_at, QuantType};

    /// `y[r] += W[r]·x` over one F16/F32 tile.
    pub fn tile_matvec(t: Tile, x: &[f32], y: &mut [f32]) {
        let Tile {
            quant: q,
            rows,
            cols,
            qs,
            ..
        } = t;
        for (r, yr) in y.iter_mut().enumerate().take(rows) {
            let mut acc = 0f32;
            if q == QuantType::F32 {
                let row = &qs[r * cols * 4..(r + 1) * cols * 4];
                for (wb, xc) in row.chunks_exact(4).zip(&x[..cols]) {
                    let w = f32::from_le_bytes([wb[0], wb[1], wb[2], wb[3]]);
                    acc += w * xc;
                }
            } else {
                let row = &qs[r * cols * 2..(r + 1) * cols * 2];
                for (c, xc) in x[..cols].iter().enumerate() {
                    acc += f16_at(row, 2 * c) * xc;
                }
            }
            *yr += acc;
        }
    }
}

/// AVX2 + FMA + F16C. Safety contract: as `split::avx2`'s (reached only from its `tile_matvec`,
/// after the features were detected and the tile checked by `check_tile`).
#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use crate::kernels::dot::split::avx2::{store_rows, RawTile};
    use crate::quant::QK;
    use core::arch::x86_64::*;

    /// F16 weights: `vcvtph2ps` fused into FMAs, 4 rows sharing the activation loads.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::kernels::dot) unsafe fn f16_rows(t: &RawTile, x: *const f32) {
        let mut r0 = 0;
        while r0 + 4 <= t.rows {
            float_group::<true, 4>(t, x, r0);
            r0 += 4;
        }
        match t.rows - r0 {
            1 => float_group::<true, 1>(t, x, r0),
            2 => float_group::<true, 2>(t, x, r0),
            3 => float_group::<true, 3>(t, x, r0),
            _ => {}
        }
    }

    /// F32 weights.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::kernels::dot) unsafe fn f32_rows(t: &RawTile, x: *const f32) {
        let mut r0 = 0;
        while r0 + 4 <= t.rows {
            float_group::<false, 4>(t, x, r0);
            r0 += 4;
        }
        match t.rows - r0 {
            1 => float_group::<false, 1>(t, x, r0),
            2 => float_group::<false, 2>(t, x, r0),
            3 => float_group::<false, 3>(t, x, r0),
            _ => {}
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_w<const HALF: bool>(p: *const u8, e: usize) -> __m256 {
        if HALF {
            _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * e) as *const __m128i))
        } else {
            _mm256_loadu_ps(p.add(4 * e) as *const f32)
        }
    }

    /// `R` rows of F16 (`HALF`) or F32 weights; two accumulators per row for FMA latency. Columns
    /// in steps of 32, then 8, then one at a time (any width).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn float_group<const HALF: bool, const R: usize>(t: &RawTile, x: *const f32, r0: usize) {
        let cols = t.cols;
        let eb = if HALF { 2 } else { 4 };
        let mut a0 = [_mm256_setzero_ps(); R];
        let mut a1 = [_mm256_setzero_ps(); R];
        let mut wp = [core::ptr::null::<u8>(); R];
        for (i, w) in wp.iter_mut().enumerate() {
            *w = t.qs.add((r0 + i) * cols * eb);
        }
        let mut c = 0;
        while c + QK <= cols {
            let x0 = _mm256_loadu_ps(x.add(c));
            let x1 = _mm256_loadu_ps(x.add(c + 8));
            let x2 = _mm256_loadu_ps(x.add(c + 16));
            let x3 = _mm256_loadu_ps(x.add(c + 24));
            for i in 0..R {
                a0[i] = _mm256_fmadd_ps(load_w::<HALF>(wp[i], c), x0, a0[i]);
                a1[i] = _mm256_fmadd_ps(load_w::<HALF>(wp[i], c + 8), x1, a1[i]);
                a0[i] = _mm256_fmadd_ps(load_w::<HALF>(wp[i], c + 16), x2, a0[i]);
                a1[i] = _mm256_fmadd_ps(load_w::<HALF>(wp[i], c + 24), x3, a1[i]);
            }
            c += QK;
        }
        while c + 8 <= cols {
            let x0 = _mm256_loadu_ps(x.add(c));
            for i in 0..R {
                a0[i] = _mm256_fmadd_ps(load_w::<HALF>(wp[i], c), x0, a0[i]);
            }
            c += 8;
        }
        for i in 0..R {
            a0[i] = _mm256_add_ps(a0[i], a1[i]);
        }
        store_rows::<R>(&a0, t.y.add(r0));
        if c < cols {
            for (i, &w) in wp.iter().enumerate() {
                *t.y.add(r0 + i) += float_tail::<HALF>(w, x, c, cols);
            }
        }
    }

    /// `Σ_{e in c..cols} w[e]·x[e]` for the last (< 8) columns of one F16/F32 row.
    ///
    /// # Safety
    /// `w` points at a row of `cols` F16 (`HALF`) or F32 weights and `x` at `cols` floats (the tile
    /// contract checked by `check_tile`); `c <= cols`.
    #[inline]
    pub(in crate::kernels::dot) unsafe fn float_tail<const HALF: bool>(
        w: *const u8,
        x: *const f32,
        c: usize,
        cols: usize,
    ) -> f32 {
        let mut s = 0f32;
        for e in c..cols {
            let wv = if HALF {
                half::f16::from_bits(u16::from_le_bytes([*w.add(2 * e), *w.add(2 * e + 1)]))
                    .to_f32()
            } else {
                f32::from_le_bytes([
                    *w.add(4 * e),
                    *w.add(4 * e + 1),
                    *w.add(4 * e + 2),
                    *w.add(4 * e + 3),
                ])
            };
            s += wv * *x.add(e);
        }
        s
    }
}

/// AVX-512 F (+ BW, AVX2, FMA, F16C): two 16-float registers per 32 columns. Safety contract: as
/// `split::avx512`'s.
#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    use super::avx2::float_tail;
    use crate::kernels::dot::simd::fold512 as fold;
    use crate::kernels::dot::split::avx2::{store_rows, RawTile};
    use crate::quant::QK;
    use core::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    pub(in crate::kernels::dot) unsafe fn rows<const HALF: bool>(t: &RawTile, x: *const f32) {
        let mut r0 = 0;
        while r0 + 4 <= t.rows {
            float_group::<HALF, 4>(t, x, r0);
            r0 += 4;
        }
        match t.rows - r0 {
            1 => float_group::<HALF, 1>(t, x, r0),
            2 => float_group::<HALF, 2>(t, x, r0),
            3 => float_group::<HALF, 3>(t, x, r0),
            _ => {}
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn load_w<const HALF: bool>(p: *const u8, e: usize) -> __m512 {
        if HALF {
            _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * e) as *const __m256i))
        } else {
            _mm512_loadu_ps(p.add(4 * e) as *const f32)
        }
    }

    /// Columns in steps of 32, then 8 (256-bit), then one at a time (any width).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn float_group<const HALF: bool, const R: usize>(t: &RawTile, x: *const f32, r0: usize) {
        let cols = t.cols;
        let eb = if HALF { 2 } else { 4 };
        let mut a0 = [_mm512_setzero_ps(); R];
        let mut a1 = [_mm512_setzero_ps(); R];
        let mut wp = [core::ptr::null::<u8>(); R];
        for (i, w) in wp.iter_mut().enumerate() {
            *w = t.qs.add((r0 + i) * cols * eb);
        }
        let mut c = 0;
        while c + QK <= cols {
            let x0 = _mm512_loadu_ps(x.add(c));
            let x1 = _mm512_loadu_ps(x.add(c + 16));
            for i in 0..R {
                a0[i] = _mm512_fmadd_ps(load_w::<HALF>(wp[i], c), x0, a0[i]);
                a1[i] = _mm512_fmadd_ps(load_w::<HALF>(wp[i], c + 16), x1, a1[i]);
            }
            c += QK;
        }
        let mut folded = [_mm256_setzero_ps(); R];
        for i in 0..R {
            folded[i] = fold(_mm512_add_ps(a0[i], a1[i]));
        }
        while c + 8 <= cols {
            let x0 = _mm256_loadu_ps(x.add(c));
            for i in 0..R {
                let w = if HALF {
                    _mm256_cvtph_ps(_mm_loadu_si128(wp[i].add(2 * c) as *const __m128i))
                } else {
                    _mm256_loadu_ps(wp[i].add(4 * c) as *const f32)
                };
                folded[i] = _mm256_fmadd_ps(w, x0, folded[i]);
            }
            c += 8;
        }
        store_rows::<R>(&folded, t.y.add(r0));
        if c < cols {
            for (i, &w) in wp.iter().enumerate() {
                *t.y.add(r0 + i) += float_tail::<HALF>(w, x, c, cols);
            }
        }
    }
}
