//! Scalar reference kernels: the ground truth every SIMD path is tested against.

use super::{Tile, XqRef};
use crate::quant::{f16_at, QuantType, QK};

/// Scalar `y[r] += W[r]·x` over one tile; integer path when `xq` is given for block types.
pub fn tile_matvec(t: Tile, x: &[f32], xq: XqRef, y: &mut [f32]) {
    let Tile {
        quant: q,
        rows,
        cols,
        scales,
        qs,
    } = t;
    let nb = cols / QK;
    let sb = q.scale_bytes_per_block();
    let qb = q.quant_bytes_per_block();
    for (r, yr) in y.iter_mut().enumerate().take(rows) {
        let mut acc = 0f32;
        match q {
            QuantType::F32 => {
                let row = &qs[r * cols * 4..(r + 1) * cols * 4];
                for (wb, xc) in row.chunks_exact(4).zip(&x[..cols]) {
                    let w = f32::from_le_bytes([wb[0], wb[1], wb[2], wb[3]]);
                    acc += w * xc;
                }
            }
            QuantType::F16 => {
                let row = &qs[r * cols * 2..(r + 1) * cols * 2];
                for (c, xc) in x[..cols].iter().enumerate() {
                    acc += f16_at(row, 2 * c) * xc;
                }
            }
            _ => {
                let rs = &scales[r * nb * sb..(r + 1) * nb * sb];
                let rq = &qs[r * nb * qb..(r + 1) * nb * qb];
                for b in 0..nb {
                    let bq = &rq[b * qb..(b + 1) * qb];
                    if let Some((xd, xs, xqs)) = xq {
                        let xb = &xqs[b * QK..(b + 1) * QK];
                        acc += dot_block_int(q, rs, b, bq, xd[b], xs[b], xb);
                    } else {
                        let xb = &x[b * QK..(b + 1) * QK];
                        acc += dot_block_f32(q, rs, b, bq, xb);
                    }
                }
            }
        }
        *yr += acc;
    }
}

#[inline]
fn dot_block_f32(q: QuantType, rs: &[u8], b: usize, bq: &[u8], xb: &[f32]) -> f32 {
    match q {
        QuantType::Q4_0 => {
            let d = f16_at(rs, 2 * b);
            let mut s = 0f32;
            for j in 0..16 {
                s += ((bq[j] & 0x0F) as i32 - 8) as f32 * xb[j];
                s += ((bq[j] >> 4) as i32 - 8) as f32 * xb[j + 16];
            }
            s * d
        }
        QuantType::Q4_1 => {
            let d = f16_at(rs, 4 * b);
            let m = f16_at(rs, 4 * b + 2);
            let (mut s, mut sx) = (0f32, 0f32);
            for j in 0..16 {
                s += (bq[j] & 0x0F) as f32 * xb[j];
                s += (bq[j] >> 4) as f32 * xb[j + 16];
                sx += xb[j] + xb[j + 16];
            }
            s * d + m * sx
        }
        QuantType::Q8_0 => {
            let d = f16_at(rs, 2 * b);
            let mut s = 0f32;
            for j in 0..QK {
                s += (bq[j] as i8) as f32 * xb[j];
            }
            s * d
        }
        _ => unreachable!("not a block type"),
    }
}

#[inline]
fn dot_block_int(q: QuantType, rs: &[u8], b: usize, bq: &[u8], xd: f32, xs: f32, xb: &[i8]) -> f32 {
    match q {
        QuantType::Q4_0 => {
            let d = f16_at(rs, 2 * b);
            let mut s = 0i32;
            for j in 0..16 {
                s += ((bq[j] & 0x0F) as i32 - 8) * xb[j] as i32;
                s += ((bq[j] >> 4) as i32 - 8) * xb[j + 16] as i32;
            }
            s as f32 * d * xd
        }
        QuantType::Q4_1 => {
            let d = f16_at(rs, 4 * b);
            let m = f16_at(rs, 4 * b + 2);
            let mut s = 0i32;
            for j in 0..16 {
                s += (bq[j] & 0x0F) as i32 * xb[j] as i32;
                s += (bq[j] >> 4) as i32 * xb[j + 16] as i32;
            }
            s as f32 * d * xd + m * xs
        }
        QuantType::Q8_0 => {
            let d = f16_at(rs, 2 * b);
            let mut s = 0i32;
            for j in 0..QK {
                s += (bq[j] as i8) as i32 * xb[j] as i32;
            }
            s as f32 * d * xd
        }
        _ => unreachable!("not a block type"),
    }
}
