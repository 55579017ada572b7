//! Batched integer kernels of the interleaved GGUF types, for prefill ([`super::kquant::tile_matmul`]):
//! the activations of up to [`TB`] tokens against one tile whose weights are unpacked once per
//! group of 4 rows. Q5_0 · Q8_0 and Q5_1 · Q8_1 blocks; Q4_K, Q5_K and Q6_K · Q8_K blocks.
//!
//! Reference: the per-token kernel decode runs for these types (`kquant_avx2::tile_matvec`, on
//! AVX2 and AVX-512 machines alike, see `Isa::for_quant`). Per token and row the arithmetic of
//! the row-group kernels here ([`avx2`], and [`vnni`] for all but Q5_0's whole 8-row groups) is
//! that kernel's: the same exact integer sums in the same 8 lanes (the dots never saturate:
//! |pair| ≤ 2 · 63 · 127), then the same float multiplies, FMAs and row reductions in the same
//! order (`kquant_avx2::finish`, `add_rows`). So each token's result is bit-identical to one
//! `kquant_avx2::tile_matvec` call (tested below), which is itself tested against the scalar
//! reference `kquant_scalar` within `dot::testutil::check_one`'s bound (1e-4 of the output's
//! norm + 1e-6). Without AVX2 the batch is one scalar per-token call per token
//! (`kquant::tile_matmul`).
//!
//! The exception, for speed: the [`vnni`] build runs Q5_0 (most of a Q4_K_M file's
//! multiply-adds: its 640- and 576-wide matrices) in whole groups of 8 rows *with the rows in
//! the lanes* (`q5_0_lanes`): each block's levels are transposed once (lane r = 4 bytes of row
//! r), each token's 4-byte activation groups are broadcast to `vpdpbusd`, so a block's exact
//! integer sum of every row lands in its lane, and the float work is one convert and FMA per 8
//! rows instead of per row (1.2–1.4× the row-group kernel in `kquant_matmul_32tok`). The integer
//! sums are the same; the float rounding is the scalar reference's form (one f32 accumulator
//! per row), not the per-token kernel's 8 partial lanes. Tested within the scalar reference's
//! bound above; prefill's logits then differ from token-by-token decode by float rounding only
//! (the parity tests with llama.cpp hold). The same form for Q4_K (sub-block sums per lane,
//! scales by `vpmulld`) was tried and measured no faster than its row-group kernel, so Q4_K
//! stays bit-identical.
//!
//! What batching saves: per row group the levels (nibbles, 5th bits, 6-bit pairs) and the i16
//! sub-block scale vectors are unpacked once for all tokens instead of once per token, and every
//! activation load is shared by the group's rows. A Q5 row group keeps up to [`CH`] blocks (one
//! 256-column tile) unpacked; each token's 8-lane accumulators live on the stack across blocks.
//!
//! On the VNNI build with AMX available (`packed_amx::available`) and at least 8 tokens, the
//! whole 16-row groups of Q5_0, Q4_K and Q6_K go to `kquant_amx` first (Q5_0 and Q6_K
//! bit-identical to the kernels here, Q4_K within the scalar bound); the rest of the rows run
//! below.
//!
//! Two builds of the same code by a macro: [`avx2`] (AVX2 + FMA + F16C; u8 × i8 dots with
//! `vpmaddubsw` + `vpmaddwd`) and [`vnni`] (AVX-512 VL + VNNI added: the lanes kernels above; a
//! Q5 block's dot in the row-group kernel is one 256-bit `vpdpbusd` whose accumulator starts at
//! Q5_0's `−16 · Σ y` per lane). The row-group K-quant kernels keep `vpmaddubsw` + `vpmaddwd` in
//! both builds: there the `vpmaddwd` applies the i16 sub-block scale, which after a `vpdpbusd`
//! would take a `vpmulld` (no fewer operations). 256-bit registers, as the per-token kernels'
//! results are defined by their 8 lanes (and Zen 4 runs 512-bit integer operations as two
//! 256-bit halves).

use super::k4::avx2::scales_mins_u64;
use super::kquant::BatchAct;
use super::kquant_avx2::{add_rows, f16_lanes, finish, Lanes4, Rows};
use super::q5::avx2::q5_bits;
use super::q6_k::avx2::q6k_levels;
use super::simd::{hsum4_i32, hsum4_i32x8};
use super::Q8KRef;
use super::XqBlocks;
use crate::quant::kquants::QK_K;
use crate::quant::{QuantType, QK};
use std::arch::x86_64::*;

/// Tokens per pass over a row group (prefill's batches of 64 or 128 tokens run in passes of this).
pub const TB: usize = 32;
/// Rows per group.
const G: usize = 4;
/// Q5 blocks kept unpacked per pass over a row group (one 256-column tile).
const CH: usize = 8;

/// Runs `$f::<..., R>(r0, args)` over the rows in groups of [`G`] (tails of 1–3 rows).
macro_rules! by_rows {
    (from $start:expr, $rows:expr, $f:ident :: <$($c:literal),*> ($($arg:expr),*)) => {{
        let rows = $rows;
        let mut r0 = $start;
        while r0 + G <= rows {
            $f::<$($c,)* G>(r0, $($arg),*);
            r0 += G;
        }
        match rows - r0 {
            1 => $f::<$($c,)* 1>(r0, $($arg),*),
            2 => $f::<$($c,)* 2>(r0, $($arg),*),
            3 => $f::<$($c,)* 3>(r0, $($arg),*),
            _ => {}
        }
    }};
    ($rows:expr, $f:ident ($($arg:expr),*)) => {
        by_rows!(from 0, $rows, $f::<>($($arg),*))
    };
    ($rows:expr, $f:ident :: <$($c:literal),*> ($($arg:expr),*)) => {
        by_rows!(from 0, $rows, $f::<$($c),*>($($arg),*))
    };
}

macro_rules! batch_kernels {
    ($name:ident, $feat:literal, $vnni:literal) => {
        /// The batched kernels built for this module's CPU features (see the module docs).
        pub mod $name {
            use super::*;

            /// Tokens per run of [`q5_tokens`] (VNNI: 32 vector registers, AVX2: 16).
            const TT: usize = if $vnni { 4 } else { 2 };

            /// For every token `j` of `acts`, `y[j·rows + r] += W[r] · x_j` over one tile of an
            /// interleaved type `q` (`qs` = `rows` rows of GGUF blocks), on the integer path.
            ///
            /// # Safety
            /// The CPU must have the features this module is built for (see the module docs),
            /// `acts` must be the activation form of `q` (Q8 blocks for Q5_0/Q5_1, Q8_K for the
            /// K-quants), each token's activation and `qs` must satisfy the tile contract checked
            /// by `kquant::check` for `(q, rows, cols)`, and `y.len() >= n · rows`.
            #[target_feature(enable = $feat)]
            pub unsafe fn tile_matmul(
                q: QuantType,
                rows: usize,
                cols: usize,
                qs: &[u8],
                acts: BatchAct,
                y: &mut [f32],
                amx: bool,
            ) {
                let t = Rows {
                    qs: qs.as_ptr(),
                    rb: q.matrix_bytes(1, cols),
                    nb: cols / q.block_len(),
                    y: y.as_mut_ptr(),
                };
                match (q, acts) {
                    (QuantType::Q5_0, BatchAct::Q8(x)) => {
                        // Whole groups of 16 rows on AMX (bit-identical to `q5_0_lanes`).
                        let mut ra = 0;
                        if $vnni && amx && x.len() >= crate::kernels::dot::packed::AMX_MIN_TOKENS {
                            ra = crate::kernels::dot::kquant_amx::q5_0(t.qs, t.rb, t.nb, rows, x, t.y, CH);
                        }
                        for (c, x) in x.chunks(TB).enumerate() {
                            let yc = t.y.add(c * TB * rows);
                            let mut r0 = ra;
                            if $vnni {
                                r0 = q5_0_lanes(ra, t, rows, x, yc);
                            }
                            by_rows!(from r0, rows, q5::<false>(t, rows, x, yc));
                        }
                    }
                    (QuantType::Q5_1, BatchAct::Q8(x)) => {
                        for (c, x) in x.chunks(TB).enumerate() {
                            let yc = t.y.add(c * TB * rows);
                            by_rows!(rows, q5::<true>(t, rows, x, yc));
                        }
                    }
                    (QuantType::Q4_K, BatchAct::K(x)) => {
                        let ra = amx_rows(q, t, rows, x, amx);
                        for (c, x) in x.chunks(TB).enumerate() {
                            let yc = t.y.add(c * TB * rows);
                            by_rows!(from ra, rows, k4::<false>(t, rows, x, yc));
                        }
                    }
                    (QuantType::Q5_K, BatchAct::K(x)) => {
                        for (c, x) in x.chunks(TB).enumerate() {
                            let yc = t.y.add(c * TB * rows);
                            by_rows!(rows, k4::<true>(t, rows, x, yc));
                        }
                    }
                    (QuantType::Q6_K, BatchAct::K(x)) => {
                        let ra = amx_rows(q, t, rows, x, amx);
                        for (c, x) in x.chunks(TB).enumerate() {
                            let yc = t.y.add(c * TB * rows);
                            by_rows!(from ra, rows, q6k::<>(t, rows, x, yc));
                        }
                    }
                    _ => unreachable!("{q}: no batched kernel for this activation form"),
                }
            }

            /// VNNI build with `amx`, from [`AMX_MIN_TOKENS`](crate::kernels::dot::packed::AMX_MIN_TOKENS)
            /// tokens: the whole 16-row groups of a Q4_K or Q6_K tile on AMX
            /// (`kquant_amx::kquant`); returns the first row left to the row-group kernels.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn amx_rows(q: QuantType, t: Rows, rows: usize, xk: &[Q8KRef], amx: bool) -> usize {
                if $vnni && amx && xk.len() >= crate::kernels::dot::packed::AMX_MIN_TOKENS {
                    crate::kernels::dot::kquant_amx::kquant(q, t.qs, t.rb, t.nb, rows, xk, t.y)
                } else {
                    0
                }
            }

            /// What a Q5 block's dot starts from, per token and block (shared by the rows):
            /// Q5_0's `16 · y` pair sums (i16, AVX2) or `−16 · Σ y` per 4 bytes (i32, VNNI);
            /// zero for Q5_1.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn q5_base<const ONE: bool>(yv: __m256i) -> __m256i {
                if ONE {
                    _mm256_setzero_si256()
                } else if $vnni {
                    let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(0x10), yv);
                    _mm256_sub_epi32(_mm256_setzero_si256(), s)
                } else {
                    _mm256_maddubs_epi16(_mm256_set1_epi8(0x10), yv)
                }
            }

            /// Σ (q − 16)·y (Q5_0) or Σ q·y (Q5_1) per 4 bytes, as 8 i32 lanes.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn q5_dot<const ONE: bool>(base: __m256i, q: __m256i, yv: __m256i) -> __m256i {
                if $vnni {
                    _mm256_dpbusd_epi32(base, q, yv)
                } else {
                    let s = _mm256_maddubs_epi16(q, yv);
                    let s = if ONE { s } else { _mm256_sub_epi16(s, base) };
                    _mm256_madd_epi16(s, _mm256_set1_epi16(1))
                }
            }

            /// Rows `r0..r0 + R` of Q5_0 · Q8_0 (`ONE` false) or Q5_1 · Q8_1 blocks for the
            /// tokens of `xq` (at most [`TB`]); `y` = the first token's outputs.
            #[inline]
            #[allow(clippy::needless_range_loop)] // parallel per-row arrays
            #[target_feature(enable = $feat)]
            unsafe fn q5<const ONE: bool, const R: usize>(
                r0: usize,
                t: Rows,
                rows: usize,
                xq: &[XqBlocks],
                y: *mut f32,
            ) {
                let bb = if ONE { 24 } else { 22 };
                let off = if ONE { 4 } else { 2 };
                let m4 = _mm256_set1_epi8(0x0F);
                let nib_shift = _mm256_setr_epi64x(0, 0, 4, 4);
                let b16 = _mm256_set1_epi8(0x10);
                let mut acc = [[_mm256_setzero_ps(); R]; TB];
                let mut mins = [_mm_setzero_ps(); TB];
                let mut qv = [[_mm256_setzero_si256(); CH]; R];
                let mut dl = [_mm_setzero_ps(); CH];
                let mut ml = [_mm_setzero_ps(); CH];
                let mut c0 = 0;
                while c0 < t.nb {
                    let cn = CH.min(t.nb - c0);
                    for b in 0..cn {
                        dl[b] = f16_lanes::<R>(t, r0, bb, c0 + b, 0);
                        if ONE {
                            ml[b] = f16_lanes::<R>(t, r0, bb, c0 + b, 2);
                        }
                        for i in 0..R {
                            let p = t.qs.add((r0 + i) * t.rb + (c0 + b) * bb);
                            let bits = q5_bits(p.add(off));
                            let q = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                p.add(off + 4) as *const __m128i
                            ));
                            let nib = _mm256_and_si256(_mm256_srlv_epi64(q, nib_shift), m4);
                            qv[i][b] = _mm256_or_si256(nib, _mm256_and_si256(bits, b16));
                        }
                    }
                    // Tokens in runs of `TT`: `TT · R` independent FMA chains, each weight
                    // vector loaded once per run.
                    let mut j = 0;
                    while j + TT <= xq.len() {
                        q5_tokens::<ONE, R, TT>(
                            &xq[j..j + TT],
                            (c0, cn),
                            &qv,
                            (&dl, &ml),
                            &mut acc[j..],
                            &mut mins[j..],
                        );
                        j += TT;
                    }
                    while j < xq.len() {
                        q5_tokens::<ONE, R, 1>(
                            &xq[j..j + 1],
                            (c0, cn),
                            &qv,
                            (&dl, &ml),
                            &mut acc[j..],
                            &mut mins[j..],
                        );
                        j += 1;
                    }
                    c0 += cn;
                }
                for j in 0..xq.len() {
                    finish::<R>(&acc[j], mins[j], false, y.add(j * rows + r0));
                }
            }

            /// VNNI build only: Q5_0 · Q8_0 with the rows in the lanes, for the whole groups of
            /// 8 rows; returns the first row left to [`q5`]. Per block the 8 rows' levels are
            /// transposed once (lane r of vector k = bytes 4k..4k+4 of row r) and each token's
            /// 4-byte activation groups are broadcast to `vpdpbusd`, so a block's exact integer
            /// sum Σ (q − 16)·y of every row ends in its lane and takes one convert and one FMA
            /// per 8 rows (the per-token kernel: one per row, over 8 partial sums). Not
            /// bit-identical to the per-token kernel: per row `Σ_b (d_w·d_x)_b · S_b` in one
            /// f32 accumulator, the scalar reference's form, within its bound (tested).
            #[allow(clippy::needless_range_loop)] // parallel per-token arrays
            #[target_feature(enable = $feat)]
            unsafe fn q5_0_lanes(
                start: usize,
                t: Rows,
                rows: usize,
                xq: &[XqBlocks],
                y: *mut f32,
            ) -> usize {
                const T: usize = 4;
                let n = xq.len();
                let groups = (rows - start) / 8;
                if !$vnni || groups == 0 {
                    return start;
                }
                let bb = 22;
                let m4 = _mm256_set1_epi8(0x0F);
                let nib_shift = _mm256_setr_epi64x(0, 0, 4, 4);
                let b16 = _mm256_set1_epi8(0x10);
                let mut c0 = 0;
                while c0 < t.nb {
                    let cn = CH.min(t.nb - c0);
                    // −16 · Σ y of every token's blocks of this chunk.
                    let mut off = [[0i32; CH]; TB];
                    for (j, &(_, _, xqs)) in xq.iter().enumerate() {
                        for b in 0..cn {
                            let yb = &xqs[(c0 + b) * QK..(c0 + b + 1) * QK];
                            off[j][b] = -16 * yb.iter().map(|&v| v as i32).sum::<i32>();
                        }
                    }
                    for g in 0..groups {
                        let r0 = start + 8 * g;
                        let mut tv = [[_mm256_setzero_si256(); 8]; CH];
                        let mut dv = [_mm256_setzero_ps(); CH];
                        for b in 0..cn {
                            let mut l = [_mm256_setzero_si256(); 8];
                            let mut h = [0i16; 8];
                            for r in 0..8 {
                                let p = t.qs.add((r0 + r) * t.rb + (c0 + b) * bb);
                                h[r] = p.cast::<i16>().read_unaligned();
                                let bits = q5_bits(p.add(2));
                                let q = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                    p.add(6) as *const __m128i,
                                ));
                                let nib = _mm256_and_si256(_mm256_srlv_epi64(q, nib_shift), m4);
                                l[r] = _mm256_or_si256(nib, _mm256_and_si256(bits, b16));
                            }
                            dv[b] = _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i));
                            tv[b] = transpose8(l);
                        }
                        let mut j = 0;
                        while j < n {
                            let m = T.min(n - j);
                            let mut acc = [_mm256_setzero_ps(); T];
                            for b in 0..cn {
                                let cb = c0 + b;
                                let mut s0 = [_mm256_setzero_si256(); T];
                                let mut s1 = [_mm256_setzero_si256(); T];
                                for u in 0..m {
                                    s0[u] = _mm256_set1_epi32(off[j + u][b]);
                                }
                                for k in 0..4 {
                                    let (w0, w1) = (tv[b][2 * k], tv[b][2 * k + 1]);
                                    for u in 0..m {
                                        let xp = xq[j + u].2.as_ptr().add(cb * QK) as *const i32;
                                        let x0 = _mm256_set1_epi32(xp.add(2 * k).read_unaligned());
                                        let x1 =
                                            _mm256_set1_epi32(xp.add(2 * k + 1).read_unaligned());
                                        s0[u] = _mm256_dpbusd_epi32(s0[u], w0, x0);
                                        s1[u] = _mm256_dpbusd_epi32(s1[u], w1, x1);
                                    }
                                }
                                for u in 0..m {
                                    let dx = _mm256_set1_ps(*xq[j + u].0.as_ptr().add(cb));
                                    let sum = _mm256_cvtepi32_ps(_mm256_add_epi32(s0[u], s1[u]));
                                    acc[u] = _mm256_fmadd_ps(_mm256_mul_ps(dv[b], dx), sum, acc[u]);
                                }
                            }
                            for u in 0..m {
                                let yp = y.add((j + u) * rows + r0);
                                _mm256_storeu_ps(yp, _mm256_add_ps(_mm256_loadu_ps(yp), acc[u]));
                            }
                            j += m;
                        }
                    }
                    c0 += cn;
                }
                start + 8 * groups
            }

            /// The 8 × 8 transpose of 32-bit groups: lane r of result k = group k of `l[r]`.
            #[inline]
            #[target_feature(enable = $feat)]
            pub(in crate::kernels::dot) unsafe fn transpose8(l: [__m256i; 8]) -> [__m256i; 8] {
                let t: [__m256i; 8] = [
                    _mm256_unpacklo_epi32(l[0], l[1]),
                    _mm256_unpackhi_epi32(l[0], l[1]),
                    _mm256_unpacklo_epi32(l[2], l[3]),
                    _mm256_unpackhi_epi32(l[2], l[3]),
                    _mm256_unpacklo_epi32(l[4], l[5]),
                    _mm256_unpackhi_epi32(l[4], l[5]),
                    _mm256_unpacklo_epi32(l[6], l[7]),
                    _mm256_unpackhi_epi32(l[6], l[7]),
                ];
                // u[k] (k < 4): groups k | k + 4 of rows 0..4; u[k + 4]: of rows 4..8.
                let u: [__m256i; 8] = [
                    _mm256_unpacklo_epi64(t[0], t[2]),
                    _mm256_unpackhi_epi64(t[0], t[2]),
                    _mm256_unpacklo_epi64(t[1], t[3]),
                    _mm256_unpackhi_epi64(t[1], t[3]),
                    _mm256_unpacklo_epi64(t[4], t[6]),
                    _mm256_unpackhi_epi64(t[4], t[6]),
                    _mm256_unpacklo_epi64(t[5], t[7]),
                    _mm256_unpackhi_epi64(t[5], t[7]),
                ];
                [
                    _mm256_permute2x128_si256::<0x20>(u[0], u[4]),
                    _mm256_permute2x128_si256::<0x20>(u[1], u[5]),
                    _mm256_permute2x128_si256::<0x20>(u[2], u[6]),
                    _mm256_permute2x128_si256::<0x20>(u[3], u[7]),
                    _mm256_permute2x128_si256::<0x31>(u[0], u[4]),
                    _mm256_permute2x128_si256::<0x31>(u[1], u[5]),
                    _mm256_permute2x128_si256::<0x31>(u[2], u[6]),
                    _mm256_permute2x128_si256::<0x31>(u[3], u[7]),
                ]
            }

            /// Blocks `c0..c0 + cn` of [`q5`]'s row group (levels `qv`, scales `dl` and minimums `ml`
            /// per block of the run) for the `T` tokens of `xq`, accumulated into their `acc`
            /// and `mins`: per token and row the operations of the per-token kernel, in its order.
            #[inline]
            #[allow(clippy::needless_range_loop)]
            #[target_feature(enable = $feat)]
            unsafe fn q5_tokens<const ONE: bool, const R: usize, const T: usize>(
                xq: &[XqBlocks],
                (c0, cn): (usize, usize),
                qv: &[[__m256i; CH]; R],
                (dl, ml): (&[__m128; CH], &[__m128; CH]),
                acc: &mut [[__m256; R]],
                mins: &mut [__m128],
            ) {
                let mut a = [[_mm256_setzero_ps(); R]; T];
                let mut mn = [_mm_setzero_ps(); T];
                for t in 0..T {
                    a[t] = acc[t];
                    mn[t] = mins[t];
                }
                let mut dd = [[0f32; 4]; T];
                for b in 0..cn {
                    let cb = c0 + b;
                    let mut yv = [_mm256_setzero_si256(); T];
                    let mut base = [_mm256_setzero_si256(); T];
                    for t in 0..T {
                        let (xd, xs, xqs) = xq[t];
                        yv[t] = _mm256_loadu_si256(xqs.as_ptr().add(cb * QK) as *const __m256i);
                        let dx = _mm_set1_ps(*xd.as_ptr().add(cb));
                        _mm_storeu_ps(dd[t].as_mut_ptr(), _mm_mul_ps(dl[b], dx));
                        if ONE {
                            let sx = _mm_set1_ps(*xs.as_ptr().add(cb));
                            mn[t] = _mm_add_ps(mn[t], _mm_mul_ps(ml[b], sx));
                        }
                        base[t] = q5_base::<ONE>(yv[t]);
                    }
                    for i in 0..R {
                        let w = qv[i][b];
                        for t in 0..T {
                            let p32 = q5_dot::<ONE>(base[t], w, yv[t]);
                            a[t][i] = _mm256_fmadd_ps(
                                _mm256_broadcast_ss(&dd[t][i]),
                                _mm256_cvtepi32_ps(p32),
                                a[t][i],
                            );
                        }
                    }
                }
                for t in 0..T {
                    acc[t] = a[t];
                    mins[t] = mn[t];
                }
            }

            /// Rows `r0..r0 + R` of Q4_K (`FIVE` false) or Q5_K · Q8_K blocks for the tokens of
            /// `xk` (at most [`TB`]); `y` = the first token's outputs.
            #[inline]
            #[allow(clippy::needless_range_loop)] // parallel per-row arrays
            #[target_feature(enable = $feat)]
            unsafe fn k4<const FIVE: bool, const R: usize>(
                r0: usize,
                t: Rows,
                rows: usize,
                xk: &[Q8KRef],
                y: *mut f32,
            ) {
                let bb = if FIVE { 176 } else { 144 };
                let mut acc = [[_mm256_setzero_ps(); R]; TB];
                let mut mins = [_mm_setzero_ps(); TB];
                // Per row: the levels of sub-blocks 0..8 and their i16 scales in every lane.
                let mut lv = [[_mm256_setzero_si256(); 8]; R];
                let mut sv = [[_mm256_setzero_si256(); 8]; R];
                let mut mn16 = [_mm_setzero_si128(); R];
                let mut dd = Lanes4([0.0; 4]);
                for b in 0..t.nb {
                    for i in 0..R {
                        let blk = t.qs.add((r0 + i) * t.rb + b * bb);
                        let (sc, mn) = scales_mins_u64(blk.add(4));
                        mn16[i] = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
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
                            let (lo, hi) = crate::kernels::dot::k4::avx2::levels(qb, qh, n, FIVE);
                            lv[i][2 * n] = lo;
                            lv[i][2 * n + 1] = hi;
                            let s = |k: usize| {
                                _mm256_shuffle_epi8(
                                    scv,
                                    _mm256_set1_epi16((0x0100 + 0x0202 * k) as i16),
                                )
                            };
                            sv[i][2 * n] = s(2 * n);
                            sv[i][2 * n + 1] = s(2 * n + 1);
                        }
                    }
                    let dl = f16_lanes::<R>(t, r0, bb, b, 0);
                    let dml = f16_lanes::<R>(t, r0, bb, b, 2);
                    for (j, k) in xk.iter().enumerate() {
                        let bs = _mm256_loadu_si256(k.bsums.as_ptr().add(16 * b) as *const __m256i);
                        // Sums of the bsums pairs (2j, 2j+1): the 32 quants of sub-block j.
                        let bsp = _mm_hadd_epi16(
                            _mm256_castsi256_si128(bs),
                            _mm256_extracti128_si256::<1>(bs),
                        );
                        let yd = _mm_set1_ps(*k.d.as_ptr().add(b));
                        let yq = k.qs.as_ptr().add(b * QK_K);
                        let mut summ = [_mm_setzero_si128(); 4];
                        for i in 0..R {
                            summ[i] = _mm_madd_epi16(mn16[i], bsp);
                        }
                        let summ = _mm_cvtepi32_ps(hsum4_i32(summ));
                        mins[j] = _mm_add_ps(mins[j], _mm_mul_ps(_mm_mul_ps(dml, yd), summ));
                        _mm_store_ps(dd.0.as_mut_ptr(), _mm_mul_ps(dl, yd));
                        let mut sumi = [_mm256_setzero_si256(); R];
                        for n in 0..4 {
                            let ylo = _mm256_loadu_si256(yq.add(64 * n) as *const __m256i);
                            let yhi = _mm256_loadu_si256(yq.add(64 * n + 32) as *const __m256i);
                            for i in 0..R {
                                let plo = _mm256_madd_epi16(
                                    _mm256_maddubs_epi16(lv[i][2 * n], ylo),
                                    sv[i][2 * n],
                                );
                                let phi = _mm256_madd_epi16(
                                    _mm256_maddubs_epi16(lv[i][2 * n + 1], yhi),
                                    sv[i][2 * n + 1],
                                );
                                sumi[i] = _mm256_add_epi32(sumi[i], _mm256_add_epi32(plo, phi));
                            }
                        }
                        for i in 0..R {
                            acc[j][i] = _mm256_fmadd_ps(
                                _mm256_broadcast_ss(&dd.0[i]),
                                _mm256_cvtepi32_ps(sumi[i]),
                                acc[j][i],
                            );
                        }
                    }
                }
                for j in 0..xk.len() {
                    finish::<R>(&acc[j], mins[j], true, y.add(j * rows + r0));
                }
            }

            /// Rows `r0..r0 + R` of Q6_K · Q8_K blocks for the tokens of `xk` (at most [`TB`]);
            /// `y` = the first token's outputs. Only each row's integer total per block enters
            /// the float arithmetic, so its sums may run in any order.
            #[inline]
            #[allow(clippy::needless_range_loop)] // parallel per-row arrays
            #[target_feature(enable = $feat)]
            unsafe fn q6k<const R: usize>(
                r0: usize,
                t: Rows,
                rows: usize,
                xk: &[Q8KRef],
                y: *mut f32,
            ) {
                let mut acc = [_mm_setzero_ps(); TB];
                // Per row: the levels of the 8 runs of 32 weights and the i16 scales of their
                // two groups of 16 (low and high 128-bit half), and all 16 scales as i16.
                let mut lv = [[_mm256_setzero_si256(); 8]; R];
                let mut sv = [[_mm256_setzero_si256(); 8]; R];
                let mut sc16 = [_mm256_setzero_si256(); R];
                for b in 0..t.nb {
                    for i in 0..R {
                        let blk = t.qs.add((r0 + i) * t.rb + b * 210);
                        let sc = _mm_loadu_si128(blk.add(192) as *const __m128i);
                        sc16[i] = _mm256_cvtepi8_epi16(sc);
                        for h in 0..2 {
                            let ql0 = _mm256_loadu_si256(blk.add(64 * h) as *const __m256i);
                            let ql1 = _mm256_loadu_si256(blk.add(64 * h + 32) as *const __m256i);
                            let qh = _mm256_loadu_si256(blk.add(128 + 32 * h) as *const __m256i);
                            for (jj, qv) in q6k_levels(ql0, ql1, qh).into_iter().enumerate() {
                                let e = 4 * h + jj;
                                let g = (2 * e) as i64;
                                lv[i][e] = qv;
                                let pick = _mm_set_epi64x(
                                    0x0101_0101_0101_0101 * (g + 1),
                                    0x0101_0101_0101_0101 * g,
                                );
                                sv[i][e] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, pick));
                            }
                        }
                    }
                    let dl = f16_lanes::<R>(t, r0, 210, b, 208);
                    for (j, k) in xk.iter().enumerate() {
                        let bs = _mm256_loadu_si256(k.bsums.as_ptr().add(16 * b) as *const __m256i);
                        let yq = k.qs.as_ptr().add(b * QK_K);
                        let mut tot = [_mm256_setzero_si256(); 4];
                        for i in 0..R {
                            // The −32 offset: −32 · Σ_g sc_g · bsum_g.
                            let corr = _mm256_madd_epi16(sc16[i], bs);
                            tot[i] = _mm256_sub_epi32(
                                _mm256_setzero_si256(),
                                _mm256_slli_epi32::<5>(corr),
                            );
                        }
                        for e in 0..8 {
                            let yv = _mm256_loadu_si256(yq.add(32 * e) as *const __m256i);
                            for i in 0..R {
                                let p =
                                    _mm256_madd_epi16(_mm256_maddubs_epi16(lv[i][e], yv), sv[i][e]);
                                tot[i] = _mm256_add_epi32(tot[i], p);
                            }
                        }
                        let total = _mm_cvtepi32_ps(hsum4_i32x8(tot));
                        let yd = _mm_set1_ps(*k.d.as_ptr().add(b));
                        acc[j] = _mm_add_ps(acc[j], _mm_mul_ps(_mm_mul_ps(dl, yd), total));
                    }
                }
                for j in 0..xk.len() {
                    add_rows::<R>(acc[j], y.add(j * rows + r0));
                }
            }
        }
    };
}

batch_kernels!(avx2, "avx2,fma,f16c", false);
batch_kernels!(vnni, "avx2,fma,f16c,avx512f,avx512vl,avx512vnni", true);

#[cfg(test)]
mod tests {
    use super::super::kquant::{self, BatchAct};
    use super::super::testutil::Rng;
    use super::super::testutil::{acts, assert_near, random_body_tile, INTERLEAVED};
    use super::super::Q8KRef;
    use super::super::{Isa, Q8Act, XqBlocks};
    #[allow(unused_imports)]
    use crate::kernels::dot::Tile;
    use crate::quant::QuantType;

    /// Whether the `vnni` build may run here.
    fn vnni_ok() -> bool {
        Isa::Avx512.has_vnni() && is_x86_feature_detected!("avx512vl")
    }

    /// A random tile of `q` and `n` tokens' activations in every form, with start values of the
    /// `n · rows` outputs (the kernels accumulate).
    struct Case {
        qs: Vec<u8>,
        acts: Vec<Q8Act>,
        y0: Vec<f32>,
    }

    impl Case {
        fn new(rng: &mut Rng, q: QuantType, rows: usize, cols: usize, n: usize) -> Case {
            let (qs, _) = random_body_tile(rng, q, rows, cols);
            let xs: Vec<f32> = (0..n * cols).map(|_| rng.uniform() * 2.0).collect();
            let acts = xs.chunks_exact(cols).map(acts).collect();
            let y0 = (0..n * rows).map(|_| rng.uniform()).collect();
            Case { qs, acts, y0 }
        }
        fn xq(&self) -> Vec<XqBlocks<'_>> {
            self.acts
                .iter()
                .map(|a| a.tile_slice(0, a.qs.len()))
                .collect()
        }
        fn xk(&self) -> Vec<Q8KRef<'_>> {
            self.acts
                .iter()
                .map(|a| a.k.slice(0, a.k.qs.len()).unwrap())
                .collect()
        }
    }

    /// Shapes: row tails of 1–3 and whole groups, one block to more than one tile's worth of
    /// Q5 blocks (20 = Gemma 3's 640 columns), token counts below, at and above [`super::TB`].
    fn shapes(q: QuantType) -> Vec<(usize, usize, usize)> {
        let bl = q.block_len();
        let nbs: &[usize] = if q.is_k() {
            &[1, 2, 3]
        } else {
            &[1, 3, 8, 9, 20]
        };
        let mut v = Vec::new();
        for &nb in nbs {
            for (rows, n) in [
                (1, 1),
                (3, 5),
                (4, 32),
                (7, 33),
                (128, 32),
                (9, 70),
                (2, 2),
                (40, 17),
                (25, 8),
            ] {
                v.push((rows, nb * bl, n));
            }
        }
        v
    }

    /// Each batched build equals one `kquant_avx2::tile_matvec` call per token, bit for bit,
    /// for every interleaved type (but the VNNI build's Q5_0 row groups of 8, see below).
    #[test]
    fn batched_match_per_token_avx2_bit_for_bit() {
        if !Isa::Avx2.available() {
            println!("SKIP: this CPU lacks AVX2/FMA/F16C");
            return;
        }
        let mut rng = Rng::new(41);
        for q in INTERLEAVED {
            for (rows, cols, n) in shapes(q) {
                let c = Case::new(&mut rng, q, rows, cols, n);
                let (xq, xk) = (c.xq(), c.xk_or_empty(q));
                let mut want = c.y0.clone();
                for j in 0..n {
                    let (a, k) = if q.is_k() {
                        (None, Some(xk[j]))
                    } else {
                        (Some(xq[j]), None)
                    };
                    let y = &mut want[j * rows..(j + 1) * rows];
                    // SAFETY: AVX2/FMA/F16C detected above; `random_body_tile` built `rows × cols`
                    // weights of `q` and the activations cover `cols`.
                    unsafe {
                        super::super::kquant_avx2::tile_matvec(
                            Tile::body(q, rows, cols, &c.qs),
                            &[],
                            a,
                            k,
                            y,
                        )
                    };
                }
                let acts = if q.is_k() {
                    BatchAct::K(&xk)
                } else {
                    BatchAct::Q8(&xq)
                };
                let mut vnni_got = None;
                for build in ["avx2", "vnni", "amx"] {
                    if build == "amx" && !(vnni_ok() && super::super::packed_amx::available()) {
                        println!("SKIP: this CPU or process lacks AMX INT8 (the amx run did not)");
                        continue;
                    }
                    if build != "avx2" && !vnni_ok() {
                        println!(
                            "SKIP: this CPU lacks AVX-512 VL/VNNI (the vnni build did not run)"
                        );
                        continue;
                    }
                    let mut got = c.y0.clone();
                    // SAFETY: the build's features were detected above; the tile and the
                    // activations are valid as for the per-token calls.
                    unsafe {
                        if build == "avx2" {
                            super::avx2::tile_matmul(q, rows, cols, &c.qs, acts, &mut got, false)
                        } else {
                            let amx = build == "amx";
                            super::vnni::tile_matmul(q, rows, cols, &c.qs, acts, &mut got, amx)
                        }
                    };
                    // The VNNI build runs Q5_0's whole groups of 8 rows with the rows in the
                    // lanes (`q5_0_lanes`, not bit-identical: checked within the scalar
                    // reference's bound by `dispatch_matches_scalar_reference_within_bound`);
                    // its tail rows are the per-token arithmetic.
                    // AMX (whole groups of 16 rows of Q5_0, at least 8 tokens) is the lanes
                    // kernel's arithmetic: bit-identical to the VNNI build everywhere.
                    if build == "amx" && q == QuantType::Q5_0 {
                        let vg: &Vec<f32> = vnni_got.as_ref().unwrap();
                        assert_eq!(
                            vg.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            "{q} amx vs vnni rows {rows} cols {cols} tokens {n}"
                        );
                    }
                    if build == "vnni" {
                        vnni_got = Some(got.clone());
                    }
                    let lanes = if build != "avx2" && q == QuantType::Q5_0 {
                        rows / 8 * 8
                    } else if build == "amx" && q == QuantType::Q4_K && n >= 8 {
                        // AMX Q4_K sums each row in one lane (`kquant_amx::kquant`): within
                        // the scalar reference's bound, checked by the dispatch test.
                        rows / 16 * 16
                    } else {
                        0
                    };
                    let bits = |v: &[f32]| {
                        v.chunks_exact(rows)
                            .flat_map(|r| r[lanes..].iter().map(|x| x.to_bits()))
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(
                        bits(&want),
                        bits(&got),
                        "{q} {build} rows {rows} cols {cols} tokens {n}"
                    );
                }
            }
        }
    }

    /// The dispatcher on every ISA (scalar: one scalar call per token) against the scalar
    /// per-token reference, within `check_one`'s bound (1e-4 of the product's norm + 1e-6).
    #[test]
    fn dispatch_matches_scalar_reference_within_bound() {
        let mut rng = Rng::new(43);
        for q in INTERLEAVED {
            for (rows, cols, n) in shapes(q) {
                let c = Case::new(&mut rng, q, rows, cols, n);
                let (xq, xk) = (c.xq(), c.xk_or_empty(q));
                let mut want = c.y0.clone();
                for j in 0..n {
                    let (a, k) = if q.is_k() {
                        (None, Some(xk[j]))
                    } else {
                        (Some(xq[j]), None)
                    };
                    let y = &mut want[j * rows..(j + 1) * rows];
                    super::super::kquant_scalar::tile_matvec(
                        Tile::body(q, rows, cols, &c.qs),
                        &[],
                        a,
                        k,
                        y,
                    );
                }
                let acts = if q.is_k() {
                    BatchAct::K(&xk)
                } else {
                    BatchAct::Q8(&xq)
                };
                for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
                    let mut got = c.y0.clone();
                    kquant::tile_matmul(isa, Tile::body(q, rows, cols, &c.qs), acts, &mut got);
                    for j in 0..n {
                        let r = j * rows..(j + 1) * rows;
                        let what = format!("{q} {isa:?} rows {rows} cols {cols} n {n} token {j}");
                        assert_near(&what, &c.y0[r.clone()], &want[r.clone()], &got[r]);
                    }
                    if isa == Isa::Scalar {
                        assert_eq!(want, got, "{q} scalar batch is the per-token loop");
                    }
                }
            }
        }
    }

    impl Case {
        fn xk_or_empty(&self, q: QuantType) -> Vec<Q8KRef<'_>> {
            if q.is_k() {
                self.xk()
            } else {
                Vec::new()
            }
        }
    }
}
