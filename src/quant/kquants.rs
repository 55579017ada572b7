//! The GGUF block formats Q5_0, Q5_1 and the K-quants Q4_K, Q5_K, Q6_K: byte layouts (identical
//! to ggml's `block_q5_0`, `block_q5_1`, `block_q4_K`, `block_q5_K`, `block_q6_K`), the 6-bit
//! scale/min unpacking, and reference dequantize / quantize of one row of whole blocks.
//!
//! These types are stored in tiles exactly as GGUF stores them (blocks back to back, row-major),
//! so an import copies the bytes. Layouts (little-endian, `f16` = IEEE half):
//! - Q5_0 (32 weights, 22 bytes): `d: f16`, `qh: [u8; 4]` (bit i = 5th bit of weight i),
//!   `qs: [u8; 16]` (weight j in the low nibble of byte j, weight j+16 in the high nibble);
//!   w = d · (q − 16).
//! - Q5_1 (32 weights, 24 bytes): `d: f16`, `m: f16`, `qh`, `qs` as Q5_0; w = d · q + m.
//! - Q4_K (256 weights, 144 bytes): `d: f16`, `dmin: f16`, `scales: [u8; 12]` (eight 6-bit
//!   scales and eight 6-bit mins, packed as [`scale_min_k4`] reads them), `qs: [u8; 128]` (per
//!   64 weights: 32 bytes, weight l in the low nibble of byte l, weight l+32 in the high one);
//!   sub-block j of 32 weights: w = d · sc_j · q − dmin · m_j.
//! - Q5_K (256 weights, 176 bytes): `d`, `dmin`, `scales` as Q4_K, `qh: [u8; 32]`, `qs` as Q4_K;
//!   the 5th bit of weight 64n + l is bit 2n of `qh[l]`, of weight 64n + 32 + l bit 2n + 1.
//! - Q6_K (256 weights, 210 bytes): `ql: [u8; 128]`, `qh: [u8; 64]`, `scales: [i8; 16]` (one per
//!   16 weights), `d: f16` last; w = d · sc_g · (q − 32), q 6 bits (see [`dequantize_row`]).

use super::{f16_at, QuantType, QK};
use half::f16;

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of one block of each type.
pub const Q5_0_BYTES: usize = 22;
pub const Q5_1_BYTES: usize = 24;
pub const Q4_K_BYTES: usize = 144;
pub const Q5_K_BYTES: usize = 176;
pub const Q6_K_BYTES: usize = 210;

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes of a Q4_K/Q5_K block
/// (ggml's `get_scale_min_k4`).
#[inline(always)]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// All eight (scales, mins) of a Q4_K/Q5_K block.
#[inline(always)]
pub fn scales_mins_k4(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        (sc[j], m[j]) = scale_min_k4(j, q);
    }
    (sc, m)
}

/// The 5th bit of weight `i` (0..32) of a Q5_0/Q5_1 block's `qh`.
#[inline(always)]
fn q5_high(qh: u32, i: usize) -> u8 {
    (((qh >> i) & 1) << 4) as u8
}

/// Dequantizes one row of whole `q` blocks (`b` holds `out.len() / block_len` blocks).
pub fn dequantize_row(q: QuantType, b: &[u8], out: &mut [f32]) {
    let bl = q.block_len();
    let bb = q.block_bytes();
    for (blk, o) in b.chunks_exact(bb).zip(out.chunks_exact_mut(bl)) {
        match q {
            QuantType::Q5_0 | QuantType::Q5_1 => {
                let d = f16_at(blk, 0);
                let (m, off) = if q == QuantType::Q5_1 {
                    (f16_at(blk, 2), 4)
                } else {
                    (0.0, 2)
                };
                let qh = u32::from_le_bytes([blk[off], blk[off + 1], blk[off + 2], blk[off + 3]]);
                let qs = &blk[off + 4..off + 20];
                let bias = if q == QuantType::Q5_0 { 16 } else { 0 };
                for j in 0..16 {
                    let x0 = ((qs[j] & 0xF) | q5_high(qh, j)) as i32 - bias;
                    let x1 = ((qs[j] >> 4) | q5_high(qh, j + 16)) as i32 - bias;
                    o[j] = x0 as f32 * d + m;
                    o[j + 16] = x1 as f32 * d + m;
                }
            }
            QuantType::Q4_K | QuantType::Q5_K => {
                let d = f16_at(blk, 0);
                let dmin = f16_at(blk, 2);
                let sc = &blk[4..16];
                let five = q == QuantType::Q5_K;
                let (qh, ql) = if five {
                    (&blk[16..48], &blk[48..176])
                } else {
                    (&blk[0..0], &blk[16..144])
                };
                for n in 0..4 {
                    let (s1, m1) = scale_min_k4(2 * n, sc);
                    let (s2, m2) = scale_min_k4(2 * n + 1, sc);
                    let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
                    let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
                    for l in 0..32 {
                        let byte = ql[32 * n + l];
                        let (mut lo, mut hi) = (byte & 0xF, byte >> 4);
                        if five {
                            lo |= ((qh[l] >> (2 * n)) & 1) << 4;
                            hi |= ((qh[l] >> (2 * n + 1)) & 1) << 4;
                        }
                        o[64 * n + l] = d1 * lo as f32 - m1;
                        o[64 * n + 32 + l] = d2 * hi as f32 - m2;
                    }
                }
            }
            QuantType::Q6_K => {
                let d = f16_at(blk, 208);
                for (k, l) in q6k_levels(blk).iter().enumerate() {
                    o[k] = d * (blk[192 + k / 16] as i8) as f32 * (*l as i32 - 32) as f32;
                }
            }
            _ => unreachable!("{q} is not an interleaved type"),
        }
    }
}

/// `v` as f16, rounded up (towards +inf for positive `v`), so that a scale derived from it covers
/// the range it was computed for.
fn f16_up(v: f32) -> f16 {
    let h = f16::from_f32(v);
    if v > 0.0 && h.to_f32() < v {
        f16::from_bits(h.to_bits() + 1)
    } else {
        h
    }
}

/// Quantizes one row (length a multiple of the block length) to whole `q` blocks appended to
/// `out`. A plain reference quantizer (min/max per sub-block, scales rounded up so every weight is
/// in range): used by tests and by `import --quant` re-quantization; GGUF imports keep the
/// file's blocks. Not byte-identical to llama.cpp's (searching) quantizer.
pub fn quantize_row(q: QuantType, src: &[f32], out: &mut Vec<u8>) {
    let bl = q.block_len();
    assert!(src.len().is_multiple_of(bl), "{q}: partial block");
    for x in src.chunks_exact(bl) {
        match q {
            QuantType::Q5_0 => {
                // ggml: d = max / -16 (max = the value of largest magnitude).
                let max = x
                    .iter()
                    .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                let d = f16::from_f32(max / -16.0);
                let id = if d.to_f32() != 0.0 {
                    1.0 / d.to_f32()
                } else {
                    0.0
                };
                let l: Vec<u8> = x
                    .iter()
                    .map(|v| ((v * id + 16.5).floor()).clamp(0.0, 31.0) as u8)
                    .collect();
                out.extend_from_slice(&d.to_le_bytes());
                push_q5(&l, out);
            }
            QuantType::Q5_1 => {
                let mn = x.iter().fold(f32::INFINITY, |m, &v| m.min(v));
                let mx = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let d = f16_up((mx - mn) / 31.0);
                let m = f16::from_f32(mn);
                let id = if d.to_f32() > 0.0 {
                    1.0 / d.to_f32()
                } else {
                    0.0
                };
                let l: Vec<u8> = x
                    .iter()
                    .map(|v| ((v - m.to_f32()) * id).round().clamp(0.0, 31.0) as u8)
                    .collect();
                out.extend_from_slice(&d.to_le_bytes());
                out.extend_from_slice(&m.to_le_bytes());
                push_q5(&l, out);
            }
            QuantType::Q4_K | QuantType::Q5_K => quantize_k4(q == QuantType::Q5_K, x, out),
            QuantType::Q6_K => quantize_q6_k(x, out),
            _ => unreachable!("{q} is not an interleaved type"),
        }
    }
}

/// Appends `qh` and `qs` of a Q5_0/Q5_1 block from 32 5-bit levels.
fn push_q5(l: &[u8], out: &mut Vec<u8>) {
    let mut qh = 0u32;
    let mut qs = [0u8; 16];
    for j in 0..16 {
        qs[j] = (l[j] & 0xF) | ((l[j + 16] & 0xF) << 4);
        qh |= ((l[j] >> 4) as u32 & 1) << j;
        qh |= ((l[j + 16] >> 4) as u32 & 1) << (j + 16);
    }
    out.extend_from_slice(&qh.to_le_bytes());
    out.extend_from_slice(&qs);
}

/// Q4_K (`five` false) or Q5_K super-block from 256 weights.
fn quantize_k4(five: bool, x: &[f32], out: &mut Vec<u8>) {
    let nmax = if five { 31.0 } else { 15.0 };
    // Per sub-block: the min (as a non-negative offset) and the scale covering [min, max].
    let mut mins = [0f32; 8];
    let mut maxs = [0f32; 8];
    for j in 0..8 {
        let s = &x[32 * j..32 * j + 32];
        mins[j] = -s.iter().fold(0f32, |m, &v| m.min(v));
        maxs[j] = s.iter().fold(0f32, |m, &v| m.max(v));
    }
    let max_min = mins.iter().fold(0f32, |m, &v| m.max(v));
    let dmin = f16_up(max_min / 63.0);
    let mut lm = [0u8; 8];
    let mut scale = [0f32; 8];
    for (j, (l, s)) in lm.iter_mut().zip(scale.iter_mut()).enumerate() {
        if dmin.to_f32() > 0.0 {
            *l = (mins[j] / dmin.to_f32()).ceil().min(63.0) as u8;
        }
        *s = (maxs[j] + dmin.to_f32() * *l as f32) / nmax;
    }
    let max_scale = scale.iter().fold(0f32, |m, &v| m.max(v));
    let d = f16_up(max_scale / 63.0);
    let mut ls = [0u8; 8];
    if d.to_f32() > 0.0 {
        for (l, s) in ls.iter_mut().zip(&scale) {
            *l = (s / d.to_f32()).ceil().min(63.0) as u8;
        }
    }
    let mut sc = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            sc[j] = ls[j];
            sc[j + 4] = lm[j];
        } else {
            sc[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            sc[j - 4] |= (ls[j] >> 4) << 6;
            sc[j] |= (lm[j] >> 4) << 6;
        }
    }
    let mut l = [0u8; QK_K];
    for j in 0..8 {
        let dj = d.to_f32() * ls[j] as f32;
        let mj = dmin.to_f32() * lm[j] as f32;
        let inv = if dj > 0.0 { 1.0 / dj } else { 0.0 };
        for i in 32 * j..32 * j + 32 {
            l[i] = ((x[i] + mj) * inv).round().clamp(0.0, nmax) as u8;
        }
    }
    out.extend_from_slice(&d.to_le_bytes());
    out.extend_from_slice(&dmin.to_le_bytes());
    out.extend_from_slice(&sc);
    if five {
        let mut qh = [0u8; 32];
        for n in 0..4 {
            for i in 0..32 {
                qh[i] |= ((l[64 * n + i] >> 4) & 1) << (2 * n);
                qh[i] |= ((l[64 * n + 32 + i] >> 4) & 1) << (2 * n + 1);
            }
        }
        out.extend_from_slice(&qh);
    }
    for n in 0..4 {
        for i in 0..32 {
            out.push((l[64 * n + i] & 0xF) | ((l[64 * n + 32 + i] & 0xF) << 4));
        }
    }
}

/// Q6_K super-block from 256 weights.
/// The 256 6-bit levels (0..64; the weight is `d · sc · (l − 32)`) of a Q6_K block in weight
/// order: per half `h` of 128 weights, weight `128h + 32n + i` (n = 0..4) has its low 4 bits in
/// `ql[64h + 32(n % 2) + i]` (low nibble for n < 2, high for n ≥ 2) and its high 2 bits in bits
/// `2n, 2n + 1` of `qh[32h + i]`.
pub fn q6k_levels(blk: &[u8]) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    for h in 0..2 {
        let ql = &blk[64 * h..64 * h + 64];
        let qh = &blk[128 + 32 * h..128 + 32 * h + 32];
        let o = &mut l[128 * h..128 * h + 128];
        for i in 0..32 {
            o[i] = (ql[i] & 0xF) | ((qh[i] & 3) << 4);
            o[i + 32] = (ql[i + 32] & 0xF) | (((qh[i] >> 2) & 3) << 4);
            o[i + 64] = (ql[i] >> 4) | (((qh[i] >> 4) & 3) << 4);
            o[i + 96] = (ql[i + 32] >> 4) | (((qh[i] >> 6) & 3) << 4);
        }
    }
    l
}

/// The inverse of [`q6k_levels`]: a Q6_K block's `ql` and `qh` (its first 192 bytes) from its 256
/// levels.
pub fn q6k_pack_levels(l: &[u8; QK_K], out: &mut [u8]) {
    let (ql, qh) = out[..192].split_at_mut(128);
    for h in 0..2 {
        let j = 128 * h;
        for i in 0..32 {
            let (q1, q2, q3, q4) = (l[j + i], l[j + i + 32], l[j + i + 64], l[j + i + 96]);
            ql[64 * h + i] = (q1 & 0xF) | ((q3 & 0xF) << 4);
            ql[64 * h + i + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
            qh[32 * h + i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
}

fn quantize_q6_k(x: &[f32], out: &mut Vec<u8>) {
    let mut s = [0f32; 16];
    for (g, sg) in s.iter_mut().enumerate() {
        *sg = x[16 * g..16 * g + 16]
            .iter()
            .fold(0f32, |m, &v| m.max(v.abs()))
            / 31.0;
    }
    let max_s = s.iter().fold(0f32, |m, &v| m.max(v));
    let d = f16_up(max_s / 127.0);
    let mut sc = [0i8; 16];
    let mut l = [0u8; QK_K];
    for g in 0..16 {
        if d.to_f32() > 0.0 {
            sc[g] = (s[g] / d.to_f32()).ceil().min(127.0) as i8;
        }
        let e = d.to_f32() * sc[g] as f32;
        let inv = if e > 0.0 { 1.0 / e } else { 0.0 };
        for i in 16 * g..16 * g + 16 {
            l[i] = ((x[i] * inv).round().clamp(-32.0, 31.0) + 32.0) as u8;
        }
    }
    let mut qlh = [0u8; 192];
    q6k_pack_levels(&l, &mut qlh);
    out.extend_from_slice(&qlh);
    out.extend(sc.iter().map(|&v| v as u8));
    out.extend_from_slice(&d.to_le_bytes());
}

const _: () = assert!(QK_K.is_multiple_of(QK));

#[cfg(test)]
mod tests {
    use super::*;

    /// A Q4_K block built by hand from ggml's layout decodes to the expected weights: checks the
    /// 6-bit scale/min packing (both halves) and the nibble order.
    #[test]
    fn q4_k_hand_built_block() {
        let mut b = vec![0u8; Q4_K_BYTES];
        b[0..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes()); // d
        b[2..4].copy_from_slice(&f16::from_f32(0.25).to_le_bytes()); // dmin
                                                                     // Sub-block 1: scale 3, min 5 (j < 4: plain 6-bit). Sub-block 6: scale 37 = 0b100101,
                                                                     // min 50 = 0b110010 (j >= 4: low nibbles in byte j+4, top 2 bits in bytes j-4 / j).
        b[4 + 1] = 3;
        b[4 + 5] = 5;
        b[4 + 10] = (37 & 0xF) | ((50 & 0xF) << 4);
        b[4 + 2] |= (37 >> 4) << 6;
        b[4 + 6] |= (50 >> 4) << 6;
        assert_eq!(scale_min_k4(1, &b[4..16]), (3, 5));
        assert_eq!(scale_min_k4(6, &b[4..16]), (37, 50));
        // Weight 32 + 7 (sub-block 1: high nibble of byte 7 of the first 64-group) = 9;
        // weight 192 + 4 (sub-block 6: low nibble of byte 4 of the fourth group) = 11.
        b[16 + 7] = 9 << 4;
        b[16 + 96 + 4] = 11;
        let mut o = vec![0f32; 256];
        dequantize_row(QuantType::Q4_K, &b, &mut o);
        assert_eq!(o[39], 0.5 * 3.0 * 9.0 - 0.25 * 5.0);
        assert_eq!(o[196], 0.5 * 37.0 * 11.0 - 0.25 * 50.0);
        assert_eq!(o[38], -0.25 * 5.0);
        assert_eq!(o[0], 0.0);
    }

    /// Q6_K and Q5_0 hand-built blocks.
    #[test]
    fn q6_k_and_q5_0_hand_built_blocks() {
        let mut b = vec![0u8; Q6_K_BYTES];
        b[208..210].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
        b[192 + 8 + 4] = (-3i8) as u8; // group 12: weights 192..208
                                       // weight 128 + 64 + 5 = 197: high nibble of ql[64 + 5], bits 4..5 of qh[32 + 5].
        b[64 + 5] = 0xA << 4;
        b[128 + 32 + 5] = 0b10 << 4;
        let mut o = vec![0f32; 256];
        dequantize_row(QuantType::Q6_K, &b, &mut o);
        let q = (0xA | (0b10 << 4)) as f32 - 32.0;
        assert_eq!(o[197], 2.0 * -3.0 * q);
        assert_eq!(o[196], 2.0 * -3.0 * -32.0);

        let mut b = vec![0u8; Q5_0_BYTES];
        b[0..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b[2..6].copy_from_slice(&(1u32 << 20).to_le_bytes()); // 5th bit of weight 20
        b[6 + 4] = 0x3 << 4; // weight 20 = high nibble of byte 4
        let mut o = vec![0f32; 32];
        dequantize_row(QuantType::Q5_0, &b, &mut o);
        assert_eq!(o[20], 0.5 * (19.0 - 16.0));
        assert_eq!(o[4], 0.5 * -16.0);
    }
}
