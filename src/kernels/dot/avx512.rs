//! AVX-512 (F + BW) tile kernels, with a VNNI (`vpdpbusd`) variant of the integer path.
//!
//! Same structure as `avx2.rs` (chunks of 8 blocks, 4 rows sharing activation loads, Q4
//! offset/minimum folded into the accumulator's initial value), but each integer step covers *two*
//! 32-element blocks in one 512-bit register: the 32 packed bytes of two Q4 blocks are spread to
//! `[b0, b0, b1, b1]` (128-bit lanes) with `vpermq`, shifted by `[0, 4, 0, 4]` per lane and masked,
//! which matches the 64 activation bytes of the two blocks. The two per-block scales are spread to
//! `[d0 ×8, d1 ×8]` with one `vpermps`. The f32 path handles one block per step (two registers of
//! 16 floats).
//!
//! The kernels are generated twice by a macro: once for `avx512f,avx512bw` (`vpmaddubsw` +
//! `vpmaddwd`) and once with `avx512vnni` added (`vpdpbusd`), so the non-VNNI code can never pick
//! up VNNI instructions. Selected only by runtime detection (see `mod.rs`).
//!
//! Safety contract of every private `unsafe fn` in this module: it is reached only from this
//! module's public `tile_matvec` (whose caller, `super::tile_matvec`, has detected the CPU
//! features named in its `#[target_feature]` and checked the slice lengths with `check_tile`), and
//! it reads/writes only inside the tile's `scales`, `qs`, activation and `y` ranges derived from
//! those lengths (masked loads for partial block pairs; full-width scale loads only when they stay
//! inside the `scales` slice).

use super::{Tile, XqBlocks, XqRef};
use core::arch::x86_64::*;

use super::avx2::{
    chunk_consts, float_tail, load_scales, quant_bytes, scale_bytes, store_rows, Act, Lanes,
    RawTile, CHUNK, K_Q4_0, K_Q4_1, K_Q8_0, TB,
};
use super::simd::prefetch_ahead;
use crate::quant::{QuantType, QK};

/// `y[r] += W[r]·x` for one tile (AVX-512). Integer path when `xq` is given for a block type;
/// `vnni` selects the `vpdpbusd` variant.
///
/// # Safety
/// The CPU must support AVX-512 F and BW plus AVX2, FMA and F16C (and AVX512-VNNI when `vnni`),
/// and the slices must satisfy the tile contract checked by `super::check_tile`.
pub unsafe fn tile_matvec(t: Tile, x: &[f32], xq: XqRef, y: &mut [f32], vnni: bool) {
    let Tile {
        quant: q,
        rows,
        cols,
        scales,
        qs,
    } = t;
    let t = RawTile::new(rows, cols, scales, qs, y);
    let a = match xq {
        Some(a) if q.is_blocked() => Act::int(a),
        _ => Act::f32(x),
    };
    if vnni {
        // SAFETY: forwarded caller guarantee (features incl. VNNI, validated tile).
        vnni::run(q, &t, a, xq.is_some());
    } else {
        // SAFETY: forwarded caller guarantee (features, validated tile).
        bw::run(q, &t, a, xq.is_some());
    }
}

/// Batched integer tile kernel for Q4_0/Q4_1 (prefill), AVX-512: for every token `j` of `xq`,
/// `y[j·rows + r] += W[r]·x_j`. Each group of 4 rows has its nibbles spread to the 512-bit
/// layout once per column chunk and applied to every token of the batch. Per token the
/// arithmetic is that of this module's [`tile_matvec`] integer path, operation for operation
/// (same integer dots, same scale lanes, same FMA order, same fold and row reduction), so the
/// result is bit-identical to calling it once per token (tested).
///
/// # Safety
/// As [`tile_matvec`] (integer path, `q` Q4_0 or Q4_1) for each token's `xq[j]`, and
/// `y.len() >= xq.len() · rows`.
pub unsafe fn tile_matmul_q4(t: Tile, xq: &[XqBlocks], y: &mut [f32], vnni: bool) {
    let Tile {
        quant: q,
        rows,
        cols,
        scales,
        qs,
    } = t;
    let t = RawTile::new(rows, cols, scales, qs, y);
    let mut acts = [Act::f32(&[]); TB];
    for (tb0, blk) in xq.chunks(TB).enumerate() {
        for (a, x) in acts.iter_mut().zip(blk) {
            *a = Act::int(*x);
        }
        let yb = t.y.add(tb0 * TB * rows);
        if vnni {
            // SAFETY: forwarded caller guarantee (features incl. VNNI, validated tiles).
            vnni::matmul_q4(q, &t, &acts[..blk.len()], yb);
        } else {
            // SAFETY: forwarded caller guarantee (features, validated tiles).
            bw::matmul_q4(q, &t, &acts[..blk.len()], yb);
        }
    }
}

macro_rules! avx512_kernels {
    ($name:ident, $feat:literal, $vnni:literal) => {
        mod $name {
            use super::*;

            const VNNI: bool = $vnni;

            /// Dispatch on the quant type.
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn run(q: QuantType, t: &RawTile, a: Act, int: bool) {
                match (q, int) {
                    (QuantType::F32, _) => float_rows::<false>(t, a.x),
                    (QuantType::F16, _) => float_rows::<true>(t, a.x),
                    (QuantType::Q4_0, true) => blocked::<K_Q4_0, true>(t, a),
                    (QuantType::Q4_1, true) => blocked::<K_Q4_1, true>(t, a),
                    (QuantType::Q8_0, true) => blocked::<K_Q8_0, true>(t, a),
                    (QuantType::Q4_0, false) => blocked::<K_Q4_0, false>(t, a),
                    (QuantType::Q4_1, false) => blocked::<K_Q4_1, false>(t, a),
                    (QuantType::Q8_0, false) => blocked::<K_Q8_0, false>(t, a),
                    // Dispatched to `kquant` before this module is reached.
                    _ => unreachable!("{q} is not a split type"),
                }
            }

            /// Up to [`TB`] tokens of [`tile_matmul_q4`]; `y` = the first token's output rows.
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn matmul_q4(q: QuantType, t: &RawTile, acts: &[Act], y: *mut f32) {
                match q {
                    QuantType::Q4_0 => matmul::<K_Q4_0>(t, acts, y),
                    QuantType::Q4_1 => matmul::<K_Q4_1>(t, acts, y),
                    _ => unreachable!("{q} has no batched AVX-512 kernel"),
                }
            }

            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn matmul<const K: u8>(t: &RawTile, acts: &[Act], y: *mut f32) {
                let mut amv = [_mm256_setzero_ps(); TB];
                let mut csv = [_mm256_setzero_ps(); TB];
                let mut c0 = 0;
                while c0 < t.nb {
                    let cn = CHUNK.min(t.nb - c0);
                    for (j, a) in acts.iter().enumerate() {
                        (amv[j], csv[j]) = chunk_consts::<K, true>(*a, c0, cn);
                    }
                    let ch = (c0, cn, &amv, &csv);
                    let mut r0 = 0;
                    if cn == CHUNK {
                        while r0 + 4 <= t.rows {
                            mm_group::<K, 4, true>(t, acts, r0, ch, y);
                            r0 += 4;
                        }
                    }
                    while r0 + 4 <= t.rows {
                        mm_group::<K, 4, false>(t, acts, r0, ch, y);
                        r0 += 4;
                    }
                    match t.rows - r0 {
                        1 => mm_group::<K, 1, false>(t, acts, r0, ch, y),
                        2 => mm_group::<K, 2, false>(t, acts, r0, ch, y),
                        3 => mm_group::<K, 3, false>(t, acts, r0, ch, y),
                        _ => {}
                    }
                    c0 += cn;
                }
            }

            /// `R` rows from `r0` of the chunk `ch = (c0, cn, amv, csv)` for every token:
            /// the nibbles are spread once, then per token the integer path of [`group`].
            #[inline]
            #[allow(clippy::needless_range_loop)] // parallel per-row arrays in the hot loop
            #[allow(clippy::type_complexity)]
            #[target_feature(enable = $feat)]
            unsafe fn mm_group<const K: u8, const R: usize, const FULL: bool>(
                t: &RawTile,
                acts: &[Act],
                r0: usize,
                ch: (usize, usize, &[__m256; TB], &[__m256; TB]),
                y: *mut f32,
            ) {
                let (c0, cn, amv, csv) = ch;
                let cn = if FULL { CHUNK } else { cn };
                let sb = scale_bytes(K);
                let qb = quant_bytes(K);
                let m4 = _mm512_set1_epi8(0x0F);
                let spread = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3);
                let shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
                let two = _mm512_set1_epi32(2);
                let mut dm = [(_mm256_setzero_ps(), _mm256_setzero_ps()); R];
                let mut u = [[_mm512_setzero_si512(); CHUNK / 2]; R];
                for i in 0..R {
                    let r = r0 + i;
                    let off = (r * t.nb + c0) * sb;
                    dm[i] = load_scales::<K>(t.scales.add(off), cn, t.scales_len - off);
                    let wp = t.qs.add((r * t.nb + c0) * qb);
                    let mut b = 0;
                    while b < cn {
                        let wb = wp.add(b * qb);
                        let w = if b + 1 < cn {
                            _mm256_loadu_si256(wb as *const __m256i)
                        } else {
                            _mm256_zextsi128_si256(_mm_loadu_si128(wb as *const __m128i))
                        };
                        let w = _mm512_permutexvar_epi64(spread, _mm512_castsi256_si512(w));
                        u[i][b / 2] = _mm512_and_si512(_mm512_srlv_epi64(w, shift), m4);
                        b += 2;
                    }
                }
                for (j, a) in acts.iter().enumerate() {
                    let mut acc = [_mm512_setzero_ps(); R];
                    let mut ddz = [_mm512_setzero_ps(); R];
                    for i in 0..R {
                        let (d, m) = dm[i];
                        ddz[i] = _mm512_zextps256_ps512(_mm256_mul_ps(d, amv[j]));
                        let init = if K == K_Q4_0 {
                            _mm256_mul_ps(d, csv[j])
                        } else {
                            _mm256_mul_ps(m, csv[j])
                        };
                        acc[i] = _mm512_zextps256_ps512(init);
                    }
                    let mut sidx =
                        _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
                    let mut b = 0;
                    while b < cn {
                        let xmask: __mmask64 = if b + 1 < cn { !0 } else { 0xFFFF_FFFF };
                        let xv = _mm512_maskz_loadu_epi8(xmask, a.q.add((c0 + b) * QK));
                        for i in 0..R {
                            let p = dot_u8i8(u[i][b / 2], xv);
                            let sc = _mm512_permutexvar_ps(sidx, ddz[i]);
                            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[i]);
                        }
                        sidx = _mm512_add_epi32(sidx, two);
                        b += 2;
                    }
                    let mut folded = [_mm256_setzero_ps(); R];
                    for i in 0..R {
                        folded[i] = fold(acc[i]);
                    }
                    store_rows::<R>(&folded, y.add(j * t.rows + r0));
                }
            }

            /// Folds a 512-bit accumulator to 256 bits (lane-wise sum of the halves).
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn fold(v: __m512) -> __m256 {
                let lo = _mm512_castps512_ps256(v);
                let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
                _mm256_add_ps(lo, hi)
            }

            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn blocked<const K: u8, const INT: bool>(t: &RawTile, a: Act) {
                let mut c0 = 0;
                while c0 < t.nb {
                    let cn = CHUNK.min(t.nb - c0);
                    let (amv, csv) = chunk_consts::<K, INT>(a, c0, cn);
                    let mut r0 = 0;
                    // Compile-time block counts → straight-line code: full chunks, and the
                    // 2-block tail of 576-wide rows (576 = 256 + 256 + 64).
                    if cn == CHUNK {
                        while r0 + 4 <= t.rows {
                            group::<K, INT, 4, CHUNK>(t, a, r0, c0, cn, amv, csv);
                            r0 += 4;
                        }
                    } else if cn == 2 {
                        while r0 + 4 <= t.rows {
                            group::<K, INT, 4, 2>(t, a, r0, c0, cn, amv, csv);
                            r0 += 4;
                        }
                    }
                    while r0 + 4 <= t.rows {
                        group::<K, INT, 4, 0>(t, a, r0, c0, cn, amv, csv);
                        r0 += 4;
                    }
                    match t.rows - r0 {
                        1 => group::<K, INT, 1, 0>(t, a, r0, c0, cn, amv, csv),
                        2 => group::<K, INT, 2, 0>(t, a, r0, c0, cn, amv, csv),
                        3 => group::<K, INT, 3, 0>(t, a, r0, c0, cn, amv, csv),
                        _ => {}
                    }
                    c0 += cn;
                }
            }

            /// Integer dot of unsigned bytes `u` with signed bytes `s`, as 16 i32 partial sums.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_u8i8(u: __m512i, s: __m512i) -> __m512i {
                if VNNI {
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s)
                } else {
                    _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1))
                }
            }

            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn group<const K: u8, const INT: bool, const R: usize, const CN: usize>(
                t: &RawTile,
                a: Act,
                r0: usize,
                c0: usize,
                cn: usize,
                amv: __m256,
                csv: __m256,
            ) {
                let cn = if CN > 0 { CN } else { cn };
                let sb = scale_bytes(K);
                let qb = quant_bytes(K);
                let mut acc = [_mm512_setzero_ps(); R];
                let mut dd = [Lanes([0.0; 8]); R];
                let mut ddz = [_mm512_setzero_ps(); R];
                let mut wp = [core::ptr::null::<u8>(); R];
                for i in 0..R {
                    let r = r0 + i;
                    let off = (r * t.nb + c0) * sb;
                    let (d, m) = load_scales::<K>(t.scales.add(off), cn, t.scales_len - off);
                    let dm = _mm256_mul_ps(d, amv);
                    _mm256_store_ps(dd[i].0.as_mut_ptr(), dm);
                    ddz[i] = _mm512_zextps256_ps512(dm);
                    let init = match K {
                        K_Q4_0 => _mm256_mul_ps(d, csv),
                        K_Q4_1 => _mm256_mul_ps(m, csv),
                        _ => _mm256_setzero_ps(),
                    };
                    acc[i] = _mm512_zextps256_ps512(init);
                    wp[i] = t.qs.add((r * t.nb + c0) * qb);
                }
                // The group's rows are contiguous in the tile (tiles are at most one chunk
                // wide); ask for the lines [`PREFETCH_AHEAD`] bytes on, as the AVX2 kernel does.
                if crate::kernels::prefetch::split() {
                    prefetch_ahead(wp[0], R * cn * qb);
                }
                if INT {
                    let m4 = _mm512_set1_epi8(0x0F);
                    let spread = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3);
                    let shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
                    let two = _mm512_set1_epi32(2);
                    // Scale lane index for the current pair of blocks: [2p ×8, 2p+1 ×8].
                    let mut sidx =
                        _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
                    let mut b = 0;
                    while b < cn {
                        let full = b + 1 < cn;
                        // Activation bytes of blocks b, b+1 (upper half zeroed for a lone block).
                        let xmask: __mmask64 = if full { !0 } else { 0xFFFF_FFFF };
                        let xv = _mm512_maskz_loadu_epi8(xmask, a.q.add((c0 + b) * QK));
                        for i in 0..R {
                            let wb = wp[i].add(b * qb);
                            let p = if K == K_Q8_0 {
                                let w = _mm512_maskz_loadu_epi8(xmask, wb as *const i8);
                                let neg = _mm512_movepi8_mask(w);
                                let sx = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
                                dot_u8i8(_mm512_abs_epi8(w), sx)
                            } else {
                                let w = if full {
                                    _mm256_loadu_si256(wb as *const __m256i)
                                } else {
                                    _mm256_zextsi128_si256(_mm_loadu_si128(wb as *const __m128i))
                                };
                                let w = _mm512_permutexvar_epi64(spread, _mm512_castsi256_si512(w));
                                let u = _mm512_and_si512(_mm512_srlv_epi64(w, shift), m4);
                                dot_u8i8(u, xv)
                            };
                            let sc = _mm512_permutexvar_ps(sidx, ddz[i]);
                            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[i]);
                        }
                        sidx = _mm512_add_epi32(sidx, two);
                        b += 2;
                    }
                } else {
                    let m4 = _mm512_set1_epi32(0x0F);
                    for b in 0..cn {
                        let xp = a.x.add((c0 + b) * QK);
                        let x0 = _mm512_loadu_ps(xp);
                        let x1 = _mm512_loadu_ps(xp.add(16));
                        for i in 0..R {
                            let p = wp[i].add(b * qb);
                            let (e0, e1) = if K == K_Q8_0 {
                                (
                                    _mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i)),
                                    _mm512_cvtepi8_epi32(_mm_loadu_si128(
                                        p.add(16) as *const __m128i
                                    )),
                                )
                            } else {
                                let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
                                (_mm512_and_si512(v, m4), _mm512_srli_epi32::<4>(v))
                            };
                            let s = _mm512_mul_ps(_mm512_cvtepi32_ps(e0), x0);
                            let s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(e1), x1, s);
                            acc[i] = _mm512_fmadd_ps(s, _mm512_set1_ps(dd[i].0[b]), acc[i]);
                        }
                    }
                }
                let mut folded = [_mm256_setzero_ps(); R];
                for i in 0..R {
                    folded[i] = fold(acc[i]);
                }
                store_rows::<R>(&folded, t.y.add(r0));
            }

            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn float_rows<const HALF: bool>(t: &RawTile, x: *const f32) {
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
            #[target_feature(enable = $feat)]
            unsafe fn load_w<const HALF: bool>(p: *const u8, e: usize) -> __m512 {
                if HALF {
                    _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * e) as *const __m256i))
                } else {
                    _mm512_loadu_ps(p.add(4 * e) as *const f32)
                }
            }

            /// Columns in steps of 32, then 8 (256-bit), then one at a time (any width).
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn float_group<const HALF: bool, const R: usize>(
                t: &RawTile,
                x: *const f32,
                r0: usize,
            ) {
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
    };
}

avx512_kernels!(bw, "avx512f,avx512bw,avx2,fma,f16c", false);
avx512_kernels!(vnni, "avx512f,avx512bw,avx512vnni,avx2,fma,f16c", true);

#[cfg(test)]
mod tests {
    use super::super::testutil::check_kernel;
    use super::super::Isa;
    #[allow(unused_imports)]
    use crate::kernels::dot::Tile;
    use crate::quant::QuantType;

    #[test]
    fn avx512_matches_scalar_on_random_tiles() {
        if !Isa::Avx512.available() {
            // Skipped only for what the CPU lacks (is_x86_feature_detected at run time).
            println!("SKIP: this CPU has no AVX-512 F/BW");
            return;
        }
        check_kernel(
            &|t, x, xq, _, y| {
                super::super::check_tile(t, x, xq, y);
                // SAFETY: AVX-512 F/BW detected above; tile checked just above.
                unsafe { super::tile_matvec(t, x, xq, y, false) }
            },
            &QuantType::SPLIT,
            3,
        );
    }

    /// The batched Q4 kernel (prefill) equals this module's per-token kernel bit for bit, with
    /// and without VNNI: full 8-block chunks, the 2-block tail of 576-wide rows, odd block
    /// counts (a lone trailing block), row tails of 1–3, token counts across the 32-token block.
    #[test]
    fn batched_q4_matches_per_token_bit_for_bit() {
        use super::super::check_tile;
        use super::super::testutil::{BatchCase, Rng};
        use crate::quant::QuantType;
        let mut rng = Rng::new(23);
        for vnni in [false, true] {
            if !Isa::Avx512.available() || (vnni && !Isa::Avx512.has_vnni()) {
                println!("SKIP: this CPU lacks AVX-512 F/BW (vnni={vnni})");
                continue;
            }
            for q in [QuantType::Q4_0, QuantType::Q4_1] {
                for (rows, nb, n) in [
                    (128, 8, 32),
                    (128, 2, 33),
                    (37, 18, 5),
                    (5, 3, 1),
                    (3, 7, 40),
                    (1, 1, 3),
                ] {
                    let cols = nb * 32;
                    let c = BatchCase::new(&mut rng, q, rows, cols, n);
                    let (t, y0, xq) = (&c.tile, &c.y0, c.xq());
                    let mut want = y0.clone();
                    for (j, x) in xq.iter().enumerate() {
                        let y = &mut want[j * rows..(j + 1) * rows];
                        check_tile(
                            Tile::split(q, rows, cols, &t.scales, &t.qs),
                            &[],
                            Some(*x),
                            y,
                        );
                        // SAFETY: features detected above; this token's tile checked just above.
                        unsafe {
                            super::tile_matvec(
                                Tile::split(q, rows, cols, &t.scales, &t.qs),
                                &[],
                                Some(*x),
                                y,
                                vnni,
                            )
                        };
                    }
                    let mut got = y0.clone();
                    // SAFETY: features detected above; every token's tile checked above.
                    unsafe {
                        super::tile_matmul_q4(
                            Tile::split(q, rows, cols, &t.scales, &t.qs),
                            &xq,
                            &mut got,
                            vnni,
                        )
                    };
                    assert_eq!(
                        want, got,
                        "{q} vnni={vnni} rows {rows} blocks {nb} tokens {n}"
                    );
                }
            }
        }
    }

    #[test]
    fn avx512_vnni_matches_scalar_on_random_tiles() {
        if !Isa::Avx512.has_vnni() {
            println!("SKIP: this CPU has no AVX-512 F/BW/VNNI");
            return;
        }
        check_kernel(
            &|t, x, xq, _, y| {
                super::super::check_tile(t, x, xq, y);
                // SAFETY: AVX-512 F/BW/VNNI detected above; tile checked just above.
                unsafe { super::tile_matvec(t, x, xq, y, true) }
            },
            &QuantType::SPLIT,
            4,
        );
    }
}
