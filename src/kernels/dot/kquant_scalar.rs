//! Scalar reference kernels of the interleaved types (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): the ground
//! truth the SIMD kernels are tested against (the Q8_K quantizer's is `act_q8::scalar`). The integer paths
//! follow ggml's `vec_dot_*` reference arithmetic (integer sums per sub-block, scaled once per
//! block); the f32 paths dot the dequantized weights.

use super::Q8KRef;
use super::Tile;
use super::XqRef;
use crate::quant::kquants::{dequantize_row, scales_mins_k4, QK_K};
use crate::quant::{f16_at, QuantType, QK};

/// Scalar `y[r] += W[r]·x` over one interleaved tile (contract: `kquant::tile_matvec`).
pub fn tile_matvec(t: Tile, x: &[f32], xq: XqRef, xk: Option<Q8KRef>, y: &mut [f32]) {
    let Tile {
        quant: q,
        rows,
        cols,
        qs,
        ..
    } = t;
    let rb = q.matrix_bytes(1, cols);
    let (bl, bb) = (q.block_len(), q.block_bytes());
    let mut w = [0f32; QK_K];
    for (r, yr) in y.iter_mut().enumerate().take(rows) {
        let row = &qs[r * rb..(r + 1) * rb];
        let mut acc = 0f32;
        for (b, blk) in row.chunks_exact(bb).enumerate() {
            acc += match (xq, xk) {
                (Some((d, s, xqs)), _) => dot_q5_q8(q, blk, d[b], s[b], &xqs[b * QK..(b + 1) * QK]),
                (_, Some(k)) => dot_k_q8k(q, blk, k, b),
                _ => {
                    let w = &mut w[..bl];
                    dequantize_row(q, blk, w);
                    w.iter()
                        .zip(&x[b * bl..(b + 1) * bl])
                        .map(|(w, x)| w * x)
                        .sum()
                }
            };
        }
        *yr += acc;
    }
}

/// The 32 5-bit levels of a Q5_0/Q5_1 block (unsigned, 0..32) and the offset of `qh`.
#[inline]
pub fn q5_levels(q: QuantType, blk: &[u8]) -> [u8; 32] {
    let off = if q == QuantType::Q5_1 { 4 } else { 2 };
    let qh = u32::from_le_bytes([blk[off], blk[off + 1], blk[off + 2], blk[off + 3]]);
    let qs = &blk[off + 4..off + 20];
    let mut l = [0u8; 32];
    for j in 0..16 {
        l[j] = (qs[j] & 0xF) | ((((qh >> j) & 1) as u8) << 4);
        l[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    l
}

/// Q5_0 · Q8_0 (d_w·d_x·Σ(q−16)·x_q) or Q5_1 · Q8_1 (d_w·d_x·Σq·x_q + m·s_x).
#[inline]
fn dot_q5_q8(q: QuantType, blk: &[u8], xd: f32, xs: f32, xb: &[i8]) -> f32 {
    let l = q5_levels(q, blk);
    let d = f16_at(blk, 0);
    if q == QuantType::Q5_0 {
        let s: i32 = l
            .iter()
            .zip(xb)
            .map(|(&l, &x)| (l as i32 - 16) * x as i32)
            .sum();
        s as f32 * d * xd
    } else {
        let m = f16_at(blk, 2);
        let s: i32 = l.iter().zip(xb).map(|(&l, &x)| l as i32 * x as i32).sum();
        s as f32 * d * xd + m * xs
    }
}

/// The 256 levels of a Q4_K/Q5_K block (unsigned) in weight order.
#[inline]
pub fn k4_levels(five: bool, blk: &[u8]) -> [u8; QK_K] {
    let (qh, ql) = if five {
        (&blk[16..48], &blk[48..176])
    } else {
        (&blk[0..0], &blk[16..144])
    };
    let mut l = [0u8; QK_K];
    for n in 0..4 {
        for i in 0..32 {
            let b = ql[32 * n + i];
            let (mut lo, mut hi) = (b & 0xF, b >> 4);
            if five {
                lo |= ((qh[i] >> (2 * n)) & 1) << 4;
                hi |= ((qh[i] >> (2 * n + 1)) & 1) << 4;
            }
            l[64 * n + i] = lo;
            l[64 * n + 32 + i] = hi;
        }
    }
    l
}

/// The 256 levels of a Q6_K block (signed, q − 32) in weight order.
#[inline]
pub fn q6k_levels(blk: &[u8]) -> [i8; QK_K] {
    crate::quant::kquants::q6k_levels(blk).map(|l| l as i8 - 32)
}

/// K-quant block `b` · Q8_K block `b`.
#[inline]
fn dot_k_q8k(q: QuantType, blk: &[u8], k: Q8KRef, b: usize) -> f32 {
    let yq = &k.qs[b * QK_K..(b + 1) * QK_K];
    let bs = &k.bsums[16 * b..16 * (b + 1)];
    let yd = k.d[b];
    match q {
        QuantType::Q4_K | QuantType::Q5_K => {
            let l = k4_levels(q == QuantType::Q5_K, blk);
            let (sc, mn) = scales_mins_k4(&blk[4..16]);
            let mut sumi = 0i32;
            let mut summ = 0i32;
            for j in 0..8 {
                let s: i32 = (32 * j..32 * j + 32)
                    .map(|i| l[i] as i32 * yq[i] as i32)
                    .sum();
                sumi += sc[j] as i32 * s;
                summ += mn[j] as i32 * (bs[2 * j] as i32 + bs[2 * j + 1] as i32);
            }
            f16_at(blk, 0) * yd * sumi as f32 - f16_at(blk, 2) * yd * summ as f32
        }
        QuantType::Q6_K => {
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
        _ => unreachable!("{q} is not a K-quant"),
    }
}
