//! Reference (scalar) quantize / dequantize of rows in the split layout, and conversion between
//! GGUF's interleaved blocks and the split layout used inside tiles.

use super::{QuantType, QK};
use half::f16;

fn put_f16(out: &mut Vec<u8>, v: f32) {
    out.extend_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// Reads the little-endian f16 at byte offset `i` of `b` as f32.
#[inline(always)]
pub fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Quantizes one row (`src.len()` weights) and appends its scale entries to `scales` and its
/// packed quants to `qs`. For F16/F32 everything goes to `qs`.
pub fn quantize_row(q: QuantType, src: &[f32], scales: &mut Vec<u8>, qs: &mut Vec<u8>) {
    match q {
        _ if q.is_interleaved() => super::kquants::quantize_row(q, src, qs),
        QuantType::F32 => {
            for v in src {
                qs.extend_from_slice(&v.to_le_bytes());
            }
        }
        QuantType::F16 => {
            for v in src {
                put_f16(qs, *v);
            }
        }
        QuantType::Q4_0 => {
            assert!(src.len().is_multiple_of(QK));
            for blk in src.chunks_exact(QK) {
                // Paper §3.10.3: s = max|w| / 7, q = round(w / s) + 8 clipped to [0, 15].
                let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                let s = amax / 7.0;
                // Store the scale as f16 and quantize against the stored value, so that
                // dequantization is exact w.r.t. what was written.
                let s16 = f16::from_f32(s).to_f32();
                let inv = if s16 > 0.0 { 1.0 / s16 } else { 0.0 };
                put_f16(scales, s);
                let mut b = [0u8; 16];
                for j in 0..16 {
                    let q0 = ((blk[j] * inv).round() + 8.0).clamp(0.0, 15.0) as u8;
                    let q1 = ((blk[j + 16] * inv).round() + 8.0).clamp(0.0, 15.0) as u8;
                    b[j] = q0 | (q1 << 4);
                }
                qs.extend_from_slice(&b);
            }
        }
        QuantType::Q4_1 => {
            assert!(src.len().is_multiple_of(QK));
            for blk in src.chunks_exact(QK) {
                let mn = blk.iter().fold(f32::INFINITY, |m, v| m.min(*v));
                let mx = blk.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
                let d = (mx - mn) / 15.0;
                let d16 = f16::from_f32(d).to_f32();
                let m16 = f16::from_f32(mn).to_f32();
                let inv = if d16 > 0.0 { 1.0 / d16 } else { 0.0 };
                put_f16(scales, d);
                put_f16(scales, mn);
                let mut b = [0u8; 16];
                for j in 0..16 {
                    let q0 = ((blk[j] - m16) * inv).round().clamp(0.0, 15.0) as u8;
                    let q1 = ((blk[j + 16] - m16) * inv).round().clamp(0.0, 15.0) as u8;
                    b[j] = q0 | (q1 << 4);
                }
                qs.extend_from_slice(&b);
            }
        }
        QuantType::Q8_0 => {
            assert!(src.len().is_multiple_of(QK));
            for blk in src.chunks_exact(QK) {
                let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let d16 = f16::from_f32(d).to_f32();
                let inv = if d16 > 0.0 { 1.0 / d16 } else { 0.0 };
                put_f16(scales, d);
                for v in blk {
                    qs.push(((v * inv).round().clamp(-127.0, 127.0) as i8) as u8);
                }
            }
        }
        _ => unreachable!("interleaved types handled above"),
    }
}

/// Dequantizes one row from its scale entries and packed quants into `out`.
pub fn dequantize_row(q: QuantType, scales: &[u8], qs: &[u8], out: &mut [f32]) {
    let n = out.len();
    match q {
        _ if q.is_interleaved() => super::kquants::dequantize_row(q, qs, out),
        QuantType::F32 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = f32::from_le_bytes([qs[4 * i], qs[4 * i + 1], qs[4 * i + 2], qs[4 * i + 3]]);
            }
        }
        QuantType::F16 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = f16_at(qs, 2 * i);
            }
        }
        QuantType::Q4_0 => {
            for b in 0..n / QK {
                let d = f16_at(scales, 2 * b);
                let qb = &qs[16 * b..16 * b + 16];
                for j in 0..16 {
                    out[b * QK + j] = ((qb[j] & 0x0F) as i32 - 8) as f32 * d;
                    out[b * QK + j + 16] = ((qb[j] >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        QuantType::Q4_1 => {
            for b in 0..n / QK {
                let d = f16_at(scales, 4 * b);
                let m = f16_at(scales, 4 * b + 2);
                let qb = &qs[16 * b..16 * b + 16];
                for j in 0..16 {
                    out[b * QK + j] = (qb[j] & 0x0F) as f32 * d + m;
                    out[b * QK + j + 16] = (qb[j] >> 4) as f32 * d + m;
                }
            }
        }
        QuantType::Q8_0 => {
            for b in 0..n / QK {
                let d = f16_at(scales, 2 * b);
                for j in 0..QK {
                    out[b * QK + j] = (qs[b * QK + j] as i8) as f32 * d;
                }
            }
        }
        _ => unreachable!("interleaved types handled above"),
    }
}

/// Splits GGUF interleaved blocks of one row (`[scale(s) | quants]` per block) into the split
/// layout: scale entries appended to `scales`, quants to `qs`. F16/F32 rows go to `qs` unchanged.
pub fn split_blocks(q: QuantType, interleaved: &[u8], scales: &mut Vec<u8>, qs: &mut Vec<u8>) {
    let sb = q.scale_bytes_per_block();
    if sb == 0 {
        qs.extend_from_slice(interleaved);
        return;
    }
    for blk in interleaved.chunks_exact(q.block_bytes()) {
        scales.extend_from_slice(&blk[..sb]);
        qs.extend_from_slice(&blk[sb..]);
    }
}

/// Inverse of [`split_blocks`]: rebuilds GGUF interleaved blocks from a row's split parts.
pub fn join_blocks(q: QuantType, scales: &[u8], qs: &[u8], out: &mut Vec<u8>) {
    let sb = q.scale_bytes_per_block();
    if sb == 0 {
        out.extend_from_slice(qs);
        return;
    }
    let qb = q.quant_bytes_per_block();
    for (s, d) in scales.chunks_exact(sb).zip(qs.chunks_exact(qb)) {
        out.extend_from_slice(s);
        out.extend_from_slice(d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` values uniform in [-1, 1).
    fn rng_row(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = crate::rng::Rng::new(seed);
        (0..n).map(|_| rng.uniform()).collect()
    }

    #[test]
    fn roundtrip_error_bounded_for_every_type() {
        let src = rng_row(256, 7);
        for q in QuantType::ALL {
            let (mut sc, mut qs) = (Vec::new(), Vec::new());
            quantize_row(q, &src, &mut sc, &mut qs);
            assert_eq!(sc.len() + qs.len(), q.matrix_bytes(1, 256), "{q}");
            let mut out = vec![0.0; 256];
            dequantize_row(q, &sc, &qs, &mut out);
            let tol = match q {
                QuantType::F32 => 0.0,
                QuantType::F16 => 1e-3,
                QuantType::Q8_0 => 1.0 / 127.0,
                QuantType::Q4_0 => 1.0 / 7.0 * 0.51 + 1e-3,
                QuantType::Q4_1 => 2.0 / 15.0 * 0.51 + 1e-3,
                // ggml's d = max/−16 leaves the opposite end one step short.
                QuantType::Q5_0 => 1.0 / 16.0 * 1.01 + 1e-3,
                QuantType::Q5_1 => 2.0 / 31.0 * 0.51 + 1e-3,
                // Sub-block scales are themselves quantized (6-bit / 8-bit): allow their step.
                QuantType::Q4_K => 2.0 / 15.0 * 0.6 + 0.02,
                QuantType::Q5_K => 2.0 / 31.0 * 0.6 + 0.02,
                QuantType::Q6_K => 1.0 / 31.0 * 0.6 + 0.01,
            };
            for (a, b) in src.iter().zip(&out) {
                assert!((a - b).abs() <= tol, "{q}: {a} vs {b}");
            }
            // Re-quantizing the dequantized values is a fixed point (byte-exact).
            let (mut sc2, mut qs2) = (Vec::new(), Vec::new());
            quantize_row(q, &out, &mut sc2, &mut qs2);
            let mut out2 = vec![0.0; 256];
            dequantize_row(q, &sc2, &qs2, &mut out2);
            for (a, b) in out.iter().zip(&out2) {
                assert!((a - b).abs() <= 1e-3 * a.abs().max(1e-3), "{q}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn q4_0_follows_paper_rule_and_ggml_nibble_order() {
        let mut src = vec![0.0f32; 32];
        src[0] = 7.0; // → q = 15, s = 1
        src[16] = -7.0; // → q = 1
        src[1] = 1.0; // → q = 9
        let (mut sc, mut qs) = (Vec::new(), Vec::new());
        quantize_row(QuantType::Q4_0, &src, &mut sc, &mut qs);
        assert_eq!(f16_at(&sc, 0), 1.0);
        assert_eq!(qs[0], 15 | (1 << 4));
        assert_eq!(qs[1], 9 | (8 << 4));
    }

    #[test]
    fn split_join_roundtrip() {
        let src = rng_row(512, 3);
        for q in QuantType::ALL {
            let (mut sc, mut qs) = (Vec::new(), Vec::new());
            quantize_row(q, &src, &mut sc, &mut qs);
            let mut inter = Vec::new();
            join_blocks(q, &sc, &qs, &mut inter);
            let (mut sc2, mut qs2) = (Vec::new(), Vec::new());
            split_blocks(q, &inter, &mut sc2, &mut qs2);
            assert_eq!((sc, qs), (sc2, qs2));
        }
    }
}
