//! The scalar tile loop of the interleaved types (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): per row and
//! block, the type's reference dot (`q5::scalar`, `k4::scalar`, `q6_k::scalar`, each beside the
//! type's SIMD kernels) or, on the f32 path, the dequantized block dotted with `x`. The ground
//! truth the SIMD kernels are tested against (the Q8_K quantizer's is `act_q8::scalar`). The integer paths
//! follow ggml's `vec_dot_*` reference arithmetic (integer sums per sub-block, scaled once per
//! block); the f32 paths dot the dequantized weights.

use super::k4::scalar as k4;
use super::q5::scalar::dot_q5_q8;
use super::q6_k::scalar as q6_k;
use super::Q8KRef;
use super::Tile;
use super::XqRef;
use crate::quant::kquants::{dequantize_row, QK_K};
use crate::quant::{QuantType, QK};

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

/// K-quant block `b` · Q8_K block `b` (the types' own files: `k4`, `q6_k`).
#[inline]
fn dot_k_q8k(q: QuantType, blk: &[u8], k: Q8KRef, b: usize) -> f32 {
    match q {
        QuantType::Q4_K | QuantType::Q5_K => k4::dot_q8k(q == QuantType::Q5_K, blk, k, b),
        QuantType::Q6_K => q6_k::dot_q8k(blk, k, b),
        _ => unreachable!("{q} is not a K-quant"),
    }
}
