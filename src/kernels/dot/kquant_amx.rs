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

use super::kquant_avx2::q5_bits;
use super::kquant_batch::vnni::transpose8;
use super::packed_amx::{block_dots, configure, two_block_dots, TOKENS};
use super::XqBlocks;
use crate::quant::QK;
use std::arch::x86_64::*;

/// Rows per group (the tile product's columns).
const GROUP: usize = 16;
/// Bytes of a Q5_0 block: f16 scale, 32 fifth bits, 16 bytes of nibbles.
const BLOCK: usize = 22;

/// Per-thread buffers of [`q5_0`] (an allocation per call showed in `packed_amx`'s profile).
#[derive(Default)]
struct Scratch {
    /// Every pass's 16 tokens × `cols` activation bytes, padded with zero tokens.
    a: Vec<__m512i>,
    /// The group's unpacked blocks, 512 bytes each.
    w: Vec<__m512i>,
    /// One pass's dots: per block 16 tokens × 16 rows of i32.
    dots: Vec<__m512i>,
    /// Each token's block scales `d_x`, token-major, zero for the padding tokens.
    dx: Vec<f32>,
    /// The group's 16 row scales `d_w` per block.
    dw: Vec<__m512>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
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
        sc.a.clear();
        sc.a.resize(passes * TOKENS * cols / 64, _mm512_setzero_si512());
        sc.w.resize(nb * 8, _mm512_setzero_si512());
        sc.dots.resize(nb * TOKENS, _mm512_setzero_si512());
        sc.dw.resize(nb, _mm512_setzero_ps());
        sc.dx.clear();
        sc.dx.resize(passes * TOKENS * nb, 0.0);
        for (t, (d, _, _)) in xq.iter().enumerate() {
            sc.dx[t * nb..(t + 1) * nb].copy_from_slice(&d[..nb]);
        }
        // SAFETY: `a` holds passes · 16 · cols bytes (cols is a multiple of 32, so of 64 when
        // multiplied by 16 tokens).
        let a =
            std::slice::from_raw_parts_mut(sc.a.as_mut_ptr() as *mut i8, passes * TOKENS * cols);
        for (t, (_, _, x)) in xq.iter().enumerate() {
            a[t * cols..(t + 1) * cols].copy_from_slice(&x[..cols]);
        }
        let m4 = _mm256_set1_epi8(0x0F);
        let b16 = _mm256_set1_epi8(0x10);
        let nib_shift = _mm256_setr_epi64x(0, 0, 4, 4);
        // Byte offsets of the group's 16 rows, for gathering their block scales.
        let row_off = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(rb as i32),
        );
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
                let ap = a.as_ptr().add(p * TOKENS * cols);
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
