//! Intel AMX INT8 for the batched prefill of Q5_0 tiles, the bulk of a Q4_K_M file's
//! multiply-adds (its 576- and 640-wide matrices cannot hold 256-blocks): `kquant_batch`'s VNNI
//! build hands it the whole groups of 16 rows when the CPU and the kernel allow AMX
//! (`packed_amx::available`, `CFLOW_AMX=0` turns it off).
//!
//! Per 16-row group each block's levels are unpacked once for all tokens into AMX's "B" layout
//! (row k of the 8 × 64-byte operand: bytes 4k..4k+3 of each of the 16 rows), as signed
//! `q − 16`; up to 16 tokens' Q8_0 blocks are the "A" operand, and one `TDPBSSD` gives the exact
//! integer sum `S = Σ (q − 16)·y` of each token with each row. The float steps are those of
//! `kquant_batch`'s `q5_0_lanes` (rows in the lanes), per chunk of its `CH` blocks:
//! `acc = fma(d_w·d_x, S, acc)` over the chunk's blocks in order, then `y += acc`. The integer
//! sum is the same exact value, so every output is bit-identical to `q5_0_lanes` (tested in
//! `kquant_batch`), which is tested against the scalar reference within its bound.

use super::kquant_batch::vnni::transpose8;
use super::packed_amx::{block_dots, configure, two_block_dots, two_dots, TOKENS};
use super::q5::avx2::q5_bits;
use super::Q8KRef;
use super::XqBlocks;
use crate::quant::kquants::QK_K;
use crate::quant::{QuantType, QK};
use std::arch::x86_64::*;

/// Rows per group (the tile product's columns).
const GROUP: usize = 16;
/// Bytes of a Q5_0 block: f16 scale, 32 fifth bits, 16 bytes of nibbles.
const BLOCK: usize = 22;

/// Per-thread buffers of [`q5_0`] and [`kquant`] (an allocation per call showed in
/// `packed_amx`'s profile).
#[derive(Default)]
struct Scratch {
    /// Every pass's 16 tokens × `cols` activation quants, padded with zero tokens.
    a: Vec<__m512i>,
    /// The group's unpacked levels, one 512-byte B operand per block or sub-block (Q6_K: two
    /// per run of 32, the other half of each zero).
    w: Vec<__m512i>,
    /// One pass's dots: per block or sub-block 16 tokens × 16 rows of i32.
    dots: Vec<__m512i>,
    /// Each token's per-block activation scales (`d_x`, Q8_K's `d_y`), token-major, zero for
    /// the padding tokens.
    dx: Vec<f32>,
    /// Q5_0: the group's 16 row scales `d_w` per block.
    dw: Vec<__m512>,
    /// Q4_K: each token's sub-block sums of quants in pairs (2p, 2p + 1) as i16 halves of an
    /// i32, token-major, 4 per superblock.
    bsp: Vec<i32>,
    /// K-quants: the group's per-superblock row constants: the sub-block scales (i32 lanes),
    /// Q4_K's minimums in i16 pairs, then `d` and (Q4_K) `dmin` as f32 lanes.
    consts: Vec<__m512i>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

impl Scratch {
    /// Lays out `toks` (each token's `cols` quants and `nb` block scales) as whole passes of
    /// [`TOKENS`] tokens: the quants token-major in `a`, the scales in `dx`; only the padding
    /// tokens are zeroed. Returns `a` as bytes.
    fn tokens<'t>(
        &mut self,
        toks: impl ExactSizeIterator<Item = (&'t [i8], &'t [f32])>,
        cols: usize,
        nb: usize,
    ) -> &mut [i8] {
        let n = toks.len();
        let len = n.div_ceil(TOKENS) * TOKENS;
        // SAFETY: an all-zero bit pattern is a valid `__m512i`.
        self.a
            .resize(len * cols / 64, unsafe { std::mem::zeroed() });
        self.dx.resize(len * nb, 0.0);
        // SAFETY: `a` holds len · cols bytes (cols is a multiple of 32 and len of 16).
        let a =
            unsafe { std::slice::from_raw_parts_mut(self.a.as_mut_ptr() as *mut i8, len * cols) };
        for (t, (x, d)) in toks.enumerate() {
            a[t * cols..(t + 1) * cols].copy_from_slice(&x[..cols]);
            self.dx[t * nb..(t + 1) * nb].copy_from_slice(&d[..nb]);
        }
        a[n * cols..].fill(0);
        self.dx[n * nb..len * nb].fill(0.0);
        a
    }
}

/// Byte offsets of a group's 16 rows at stride `rb`, for gathering one dword of each.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn row_offsets(rb: usize) -> __m512i {
    _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(rb as i32),
    )
}

/// Rows `0..rows / 16 · 16` of Q5_0 · Q8_0 for the tokens of `xq`: `y[j·rows + r] += W[r] · x_j`,
/// the float steps per chunk of `ch` blocks (see the module docs). `qs` = rows of `nb` GGUF
/// blocks at stride `rb`. Returns the first row not done.
///
/// # Safety
/// `packed_amx::available()` returned true; AVX-512 F/BW/VL, AVX2, FMA and F16C are available;
/// `qs` holds `rows` rows of `nb` blocks at stride `rb`; every token's blocks hold `nb` blocks;
/// `y` holds `xq.len() · rows` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn q5_0(
    qs: *const u8,
    rb: usize,
    nb: usize,
    rows: usize,
    xq: &[XqBlocks],
    y: *mut f32,
    ch: usize,
) -> usize {
    let groups = rows / GROUP;
    if groups == 0 || xq.is_empty() {
        return 0;
    }
    configure();
    let cols = nb * QK;
    let n = xq.len();
    let passes = n.div_ceil(TOKENS);
    SCRATCH.with_borrow_mut(|sc| {
        let a: &[i8] = sc.tokens(xq.iter().map(|&(d, _, x)| (x, d)), cols, nb);
        let a = a.as_ptr();
        sc.w.resize(nb * 8, _mm512_setzero_si512());
        sc.dots.resize(nb * TOKENS, _mm512_setzero_si512());
        sc.dw.resize(nb, _mm512_setzero_ps());
        let m4 = _mm256_set1_epi8(0x0F);
        let b16 = _mm256_set1_epi8(0x10);
        let nib_shift = _mm256_setr_epi64x(0, 0, 4, 4);
        // Byte offsets of the group's 16 rows, for gathering their block scales.
        let row_off = row_offsets(rb);
        for g in 0..groups {
            let r0 = g * GROUP;
            let wp = sc.w.as_mut_ptr() as *mut u8;
            for (b, dwb) in sc.dw.iter_mut().enumerate() {
                let mut l = [_mm256_setzero_si256(); GROUP];
                for (r, l) in l.iter_mut().enumerate() {
                    let p = qs.add((r0 + r) * rb + b * BLOCK);
                    let bits = q5_bits(p.add(2));
                    let q =
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(6) as *const __m128i));
                    let nib = _mm256_and_si256(_mm256_srlv_epi64(q, nib_shift), m4);
                    let lv = _mm256_or_si256(nib, _mm256_and_si256(bits, b16));
                    *l = _mm256_sub_epi8(lv, b16);
                }
                // The 16 rows' f16 scales: 4 bytes gathered at each block's start (the scale
                // and two bytes of the block's fifth bits), narrowed to 16 bits.
                let g =
                    _mm512_i32gather_epi32::<1>(row_off, qs.add(r0 * rb + b * BLOCK) as *const i32);
                *dwb = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
                let lo = transpose8([l[0], l[1], l[2], l[3], l[4], l[5], l[6], l[7]]);
                let hi = transpose8([l[8], l[9], l[10], l[11], l[12], l[13], l[14], l[15]]);
                for k in 0..8 {
                    let row = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo[k]), hi[k]);
                    _mm512_store_si512(wp.add(512 * b + 64 * k) as *mut _, row);
                }
            }
            for p in 0..passes {
                let ap = a.add(p * TOKENS * cols);
                let out = sc.dots.as_mut_ptr() as *mut i32;
                let mut b = 0;
                while b < nb {
                    let (ab, o) = (ap.add(b * QK), out.add(b * TOKENS * GROUP));
                    if b + 1 < nb {
                        two_block_dots::<true>(ab, cols, wp.add(512 * b), 512, o);
                        b += 2;
                    } else {
                        block_dots::<true>(ab, cols, wp.add(512 * b), o);
                        b += 1;
                    }
                }
                // Four tokens at a time (padding tokens' dots and scales are zero; their
                // outputs are dropped).
                let nt = TOKENS.min(n - p * TOKENS);
                let (dots, dw) = (sc.dots.as_ptr(), sc.dw.as_ptr());
                let dx = sc.dx.as_ptr().add(p * TOKENS * nb);
                let mut c0 = 0;
                while c0 < nb {
                    let c1 = nb.min(c0 + ch);
                    for t in (0..nt).step_by(4) {
                        let mut acc = [_mm512_setzero_ps(); 4];
                        for b in c0..c1 {
                            let dwb = *dw.add(b);
                            for (u, acc) in acc.iter_mut().enumerate() {
                                let s = _mm512_cvtepi32_ps(*dots.add(b * TOKENS + t + u));
                                let dd =
                                    _mm512_mul_ps(dwb, _mm512_set1_ps(*dx.add((t + u) * nb + b)));
                                *acc = _mm512_fmadd_ps(dd, s, *acc);
                            }
                        }
                        for (u, acc) in acc.iter().enumerate().take(nt - t) {
                            let yp = y.add((p * TOKENS + t + u) * rows + r0);
                            _mm512_storeu_ps(yp, _mm512_add_ps(_mm512_loadu_ps(yp), *acc));
                        }
                    }
                    c0 = c1;
                }
            }
        }
    });
    groups * GROUP
}

/// Rows `0..rows / 16 · 16` of Q4_K or Q6_K · Q8_K for the tokens of `xk`:
/// `y[j·rows + r] += W[r] · x_j`. Returns the first row not done (0 for other types).
///
/// Per 16-row group each superblock's levels are gathered straight into AMX's B layout (one
/// 16-lane gather of dword k of each row is B row k), once for all tokens. Q4_K: per sub-block
/// of 32 one `TDPBSUD` (signed activations × unsigned nibbles) gives `S_j`; per token and row
/// the exact `Σ_j sc_j·S_j` and `Σ_j m_j·bsum_j`, then `acc += (d·d_y)·Σ`, `mn += (dmin·d_y)·Σm`
/// over the tile's superblocks and `y += acc − mn` (the scalar reference's form, not the
/// per-token kernel's 8 partial lanes: within its bound, tested). Q6_K: per sub-block of 16 a
/// `TDPBSSD` of the run's 32 activations with a B operand whose other half is zero gives the
/// exact `Σ (q − 32)·y`; per token and row the exact total `Σ_s sc_s·S_s`, then
/// `acc = acc + (d·d_y)·total` and `y += acc`, `kquant_batch`'s `q6k` arithmetic, so
/// bit-identical to it (tested).
///
/// # Safety
/// As [`q5_0`], with `qs` rows of `nb` superblocks of `q` and every token's Q8_K blocks
/// covering `nb` superblocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn kquant(
    q: QuantType,
    qs: *const u8,
    rb: usize,
    nb: usize,
    rows: usize,
    xk: &[Q8KRef],
    y: *mut f32,
) -> usize {
    let six = match q {
        QuantType::Q4_K => false,
        QuantType::Q6_K => true,
        _ => return 0,
    };
    let groups = rows / GROUP;
    if groups == 0 || xk.is_empty() {
        return 0;
    }
    configure();
    let cols = nb * QK_K;
    let n = xk.len();
    let passes = n.div_ceil(TOKENS);
    let (bb, nsub) = if six { (210, 16) } else { (144, 8) };
    // Per superblock: sub-block scales, then Q4_K's 4 minimum pairs, then d (and dmin).
    let nconst = if six { 16 + 1 } else { 8 + 4 + 2 };
    SCRATCH.with_borrow_mut(|sc| {
        let a: &[i8] = sc.tokens(xk.iter().map(|k| (k.qs, k.d)), cols, nb);
        let a = a.as_ptr();
        if !six {
            sc.bsp.resize(passes * TOKENS * nb * 4, 0);
            for (t, k) in xk.iter().enumerate() {
                for (j, p) in sc.bsp[t * nb * 4..(t + 1) * nb * 4].iter_mut().enumerate() {
                    let s = |u: usize| k.bsums[4 * j + u] as i32;
                    let (lo, hi) = (s(0) + s(1), s(2) + s(3));
                    *p = (lo & 0xFFFF) | (hi << 16);
                }
            }
            sc.bsp[n * nb * 4..].fill(0);
        }
        // The B operands; Q6_K's zero halves are never written, so zero them for this call.
        let wsub = if six { 2 * 8 } else { 8 };
        if six {
            sc.w.clear();
        }
        sc.w.resize(nb * wsub * 8, _mm512_setzero_si512());
        sc.dots.resize(nb * nsub * TOKENS, _mm512_setzero_si512());
        sc.consts.resize(nb * nconst, _mm512_setzero_si512());
        let row_off = row_offsets(rb);
        let byte = |v: __m512i, i: u32| {
            _mm512_and_si512(
                _mm512_srlv_epi32(v, _mm512_set1_epi32(8 * i as i32)),
                _mm512_set1_epi32(0xFF),
            )
        };
        for g in 0..groups {
            let r0 = g * GROUP;
            let wp = sc.w.as_mut_ptr() as *mut u8;
            for b in 0..nb {
                let base = qs.add(r0 * rb + b * bb);
                let gat =
                    |off: usize| _mm512_i32gather_epi32::<1>(row_off, base.add(off) as *const i32);
                let cst = sc.consts.as_mut_ptr().add(b * nconst);
                let m4 = _mm512_set1_epi8(0x0F);
                if six {
                    let (m3, m30, b32) = (
                        _mm512_set1_epi8(3),
                        _mm512_set1_epi8(0x30),
                        _mm512_set1_epi8(32),
                    );
                    for h in 0..2 {
                        for k in 0..8 {
                            let g0 = gat(64 * h + 4 * k);
                            let g1 = gat(64 * h + 32 + 4 * k);
                            let gh = gat(128 + 32 * h + 4 * k);
                            let runs = [
                                _mm512_or_si512(
                                    _mm512_and_si512(g0, m4),
                                    _mm512_slli_epi32::<4>(_mm512_and_si512(gh, m3)),
                                ),
                                _mm512_or_si512(
                                    _mm512_and_si512(g1, m4),
                                    _mm512_and_si512(_mm512_slli_epi32::<2>(gh), m30),
                                ),
                                _mm512_or_si512(
                                    _mm512_and_si512(_mm512_srli_epi32::<4>(g0), m4),
                                    _mm512_and_si512(gh, m30),
                                ),
                                _mm512_or_si512(
                                    _mm512_and_si512(_mm512_srli_epi32::<4>(g1), m4),
                                    _mm512_and_si512(_mm512_srli_epi32::<2>(gh), m30),
                                ),
                            ];
                            for (jj, lv) in runs.into_iter().enumerate() {
                                let e = 4 * h + jj;
                                // Row k < 4: sub-block 2e (its B operand's rows 0..4); else
                                // 2e + 1 (rows 4..8 of the second operand).
                                let half = usize::from(k >= 4);
                                let o = wp.add(((b * 8 + e) * 2 + half) * 512 + 64 * k);
                                _mm512_store_si512(o as *mut _, _mm512_sub_epi8(lv, b32));
                            }
                        }
                    }
                    for m in 0..4 {
                        let v = gat(192 + 4 * m);
                        for i in 0..4 {
                            let s = _mm512_srai_epi32::<24>(_mm512_sllv_epi32(
                                v,
                                _mm512_set1_epi32(24 - 8 * i as i32),
                            ));
                            *cst.add(4 * m + i) = s;
                        }
                    }
                    // d: the high half of the dword ending at byte 210 (inside the block).
                    let d =
                        _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(gat(206))));
                    *cst.add(16) = _mm512_castps_si512(d);
                } else {
                    for n4 in 0..4 {
                        for k in 0..8 {
                            let v = gat(16 + 32 * n4 + 4 * k);
                            let o = wp.add((b * 8 + 2 * n4) * 512 + 64 * k);
                            _mm512_store_si512(o as *mut _, _mm512_and_si512(v, m4));
                            let hi = _mm512_and_si512(_mm512_srli_epi32::<4>(v), m4);
                            _mm512_store_si512(o.add(512) as *mut _, hi);
                        }
                    }
                    let (u0, u1, u2) = (gat(4), gat(8), gat(12));
                    let (m6, m4d, m2) = (
                        _mm512_set1_epi32(0x3F3F_3F3F),
                        _mm512_set1_epi32(0x0F0F_0F0F),
                        _mm512_set1_epi32(0x0303_0303),
                    );
                    let sc_lo = _mm512_and_si512(u0, m6);
                    let sc_hi = _mm512_or_si512(
                        _mm512_and_si512(u2, m4d),
                        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u0), m2)),
                    );
                    let mn_lo = _mm512_and_si512(u1, m6);
                    let mn_hi = _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi32::<4>(u2), m4d),
                        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u1), m2)),
                    );
                    for i in 0..4 {
                        *cst.add(i) = byte(sc_lo, i as u32);
                        *cst.add(4 + i) = byte(sc_hi, i as u32);
                    }
                    let mn = |j: usize| byte(if j < 4 { mn_lo } else { mn_hi }, (j % 4) as u32);
                    for p in 0..4 {
                        *cst.add(8 + p) =
                            _mm512_or_si512(mn(2 * p), _mm512_slli_epi32::<16>(mn(2 * p + 1)));
                    }
                    let dd = gat(0);
                    *cst.add(12) = _mm512_castps_si512(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
                    *cst.add(13) = _mm512_castps_si512(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(
                        _mm512_srli_epi32::<16>(dd),
                    )));
                }
            }
            for p in 0..passes {
                let ap = a.add(p * TOKENS * cols);
                let dots = sc.dots.as_mut_ptr() as *mut i32;
                let dot = |b: usize, s: usize| dots.add((b * nsub + s) * TOKENS * GROUP);
                for b in 0..nb {
                    let ab = ap.add(b * QK_K);
                    if six {
                        for e in 0..8 {
                            let w = wp.add((b * 8 + e) * 2 * 512);
                            let ae = ab.add(32 * e);
                            two_dots::<true>(
                                [ae, ae],
                                cols,
                                [w, w.add(512)],
                                [dot(b, 2 * e), dot(b, 2 * e + 1)],
                            );
                        }
                    } else {
                        for j in (0..8).step_by(2) {
                            let w = wp.add((b * 8 + j) * 512);
                            let aj = ab.add(32 * j);
                            two_dots::<false>(
                                [aj, aj.add(32)],
                                cols,
                                [w, w.add(512)],
                                [dot(b, j), dot(b, j + 1)],
                            );
                        }
                    }
                }
                let nt = TOKENS.min(n - p * TOKENS);
                let dots = sc.dots.as_ptr();
                let cst = sc.consts.as_ptr();
                let dy = sc.dx.as_ptr().add(p * TOKENS * nb);
                let bsp = sc.bsp.as_ptr().add(p * TOKENS * nb * 4);
                for t in 0..nt {
                    let mut acc = _mm512_setzero_ps();
                    let mut mn = _mm512_setzero_ps();
                    for b in 0..nb {
                        let c = cst.add(b * nconst);
                        let db = dots.add(b * nsub * TOKENS + t);
                        let mut tot = _mm512_mullo_epi32(*c, *db);
                        for s in 1..nsub {
                            tot = _mm512_add_epi32(
                                tot,
                                _mm512_mullo_epi32(*c.add(s), *db.add(s * TOKENS)),
                            );
                        }
                        let yd = _mm512_set1_ps(*dy.add(t * nb + b));
                        if six {
                            let d = _mm512_castsi512_ps(*c.add(16));
                            acc = _mm512_add_ps(
                                acc,
                                _mm512_mul_ps(_mm512_mul_ps(d, yd), _mm512_cvtepi32_ps(tot)),
                            );
                        } else {
                            let (d, dmin) = (
                                _mm512_castsi512_ps(*c.add(12)),
                                _mm512_castsi512_ps(*c.add(13)),
                            );
                            acc =
                                _mm512_fmadd_ps(_mm512_mul_ps(d, yd), _mm512_cvtepi32_ps(tot), acc);
                            let bp = bsp.add((t * nb + b) * 4);
                            let mut ms = _mm512_madd_epi16(*c.add(8), _mm512_set1_epi32(*bp));
                            for u in 1..4 {
                                ms = _mm512_add_epi32(
                                    ms,
                                    _mm512_madd_epi16(*c.add(8 + u), _mm512_set1_epi32(*bp.add(u))),
                                );
                            }
                            mn = _mm512_fmadd_ps(
                                _mm512_mul_ps(dmin, yd),
                                _mm512_cvtepi32_ps(ms),
                                mn,
                            );
                        }
                    }
                    let yp = y.add((p * TOKENS + t) * rows + r0);
                    let v = if six { acc } else { _mm512_sub_ps(acc, mn) };
                    _mm512_storeu_ps(yp, _mm512_add_ps(_mm512_loadu_ps(yp), v));
                }
            }
        }
    });
    groups * GROUP
}
