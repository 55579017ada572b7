//! The row-interleaved ("repacked") layout of Q4_0/Q4_1/Q8_0, Q5_0, Q4_K and Q6_K tiles: what the resident
//! copy of a model holds when it is repacked at open (`--repack`, on by default; see
//! docs/FORMAT.md, "Repacked tiles in memory"). Files never hold it: a `.cflow` tile is always
//! in the split layout (Q5_0 and the K-quants: GGUF's blocks, row-major).
//!
//! A tile of `rows × cols` weights (`rows` a multiple of [`PACK_ROWS`]) is rearranged in place,
//! at the same size. The tile becomes a sequence of *records*, group-major: record `(g, b)`
//! covers rows `16g .. 16g + 16` and block `b` (columns `32b .. 32b + 32`), and is
//! [`record_bytes`] long:
//!
//! * the 16 rows' scales `d` as f16 (32 bytes), then for Q4_1 their minima `m` (32 bytes);
//! * for Q5_0, the 5th bits as 8 masks of 64 bits (64 bytes), two per chunk below: mask `2j`
//!   (bytes `8·2j ..`) has bit `4r + p` set when weight `8j + p` of row `r` has its 5th bit,
//!   mask `2j + 1` the same for weight `8j + 4 + p`: a chunk's 64 bytes as one `k` register;
//! * Q4_K records cover one super-block (256 columns): the 16 rows' `d` (32 bytes) and `dmin` (32
//!   bytes), then their 6-bit sub-block scales `sc_j` and mins `m_j` (j = 0..7) as three 64-byte
//!   vectors of one 32-bit lane per row: the low nibbles of `sc_0..sc_7` (bits `4j..4j+4`), those
//!   of `m_0..m_7`, and the high 2 bits (`sc_j` at bits `2j`, `m_j` at `16 + 2j`); then 32 chunks
//!   as below, chunk `c` holding weights `8c .. 8c + 8` (sub-block `c / 4`);
//! * Q6_K records cover one super-block (256 columns): the 16 rows' `d` (32 bytes), then one
//!   208-byte group per sub-block `g` (weights `16g .. 16g + 16`), so that a kernel reads the
//!   record front to back: the two high bits of the group's 6-bit levels as 8 masks of 64 bits
//!   (mask `4h + 2n + e` holds bit `4 + e` of weights `16g + 8h + 4n + p` at bit `4r + p`, as
//!   Q5_0's), the levels' low 4 bits as two chunks as below (chunk `h` holding weights
//!   `16g + 8h .. + 8`), and the 16 rows' signed scales `sc_g` (16 bytes, row `r` at byte `r`).
//!   A weight is `d · sc_g · (l − 32)`;
//! * four chunks of 64 bytes. Chunk `j` gives each row 4 bytes (row `r` at bytes `4r .. 4r + 4`);
//!   byte `p` of them packs the row's weight `8j + p` in its low nibble and weight `8j + 4 + p`
//!   in its high nibble (Q5_0: the low 4 bits of its 5-bit level). Q8_0 has eight chunks: byte
//!   `p` of chunk `j` is weight `4j + p`.
//!
//! So one 512-bit load of a chunk holds 4 weights of each of 16 rows in one 32-bit lane per
//! row: one `vpdpbusd` with the activation bytes `8j .. 8j + 4` broadcast to every lane adds
//! 4 products to all 16 rows' sums, and the sums need no horizontal reduction. The scales of
//! the 16 rows load as one vector.

use super::{QuantType, QK};

/// Rows per record: one 32-bit lane per row in a 512-bit register.
pub const PACK_ROWS: usize = 16;

/// True when a `rows`-row tile of `q` can be repacked: Q4_0, Q4_1, Q8_0, Q5_0, Q4_K or Q6_K with
/// whole 16-row groups. (Which of them a resident copy does repack: [`Repack`].)
pub fn packable(q: QuantType, rows: usize) -> bool {
    matches!(
        q,
        QuantType::Q4_0
            | QuantType::Q4_1
            | QuantType::Q8_0
            | QuantType::Q5_0
            | QuantType::Q4_K
            | QuantType::Q6_K
    ) && rows > 0
        && rows.is_multiple_of(PACK_ROWS)
}

/// The types a resident copy repacks at open. Q4_0/Q4_1/Q8_0 have repacked kernels on every
/// path; Q5_0, Q4_K and Q6_K only AVX-512 VNNI ones (elsewhere their file-layout kernels are the
/// fast ones), so the engine asks for them only where those run
/// (`kernels::dot::packed::repacks_vnni_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Repack {
    pub q4_q8: bool,
    /// Q5_0, Q4_K and Q6_K.
    pub vnni_types: bool,
}

impl Repack {
    /// Whether a matrix of type `q` is repacked (when its rows allow, [`packable`]).
    pub fn includes(self, q: QuantType) -> bool {
        match q {
            QuantType::Q5_0 | QuantType::Q4_K | QuantType::Q6_K => self.vnni_types,
            _ => self.q4_q8,
        }
    }
}

/// `true`: the types every kernel path runs repacked (Q4_0, Q4_1, Q8_0); `false`: none.
impl From<bool> for Repack {
    fn from(on: bool) -> Repack {
        Repack {
            q4_q8: on,
            vnni_types: false,
        }
    }
}

/// Bytes of one record (16 rows × one block) of `q`: the same as the 16 rows' blocks.
pub const fn record_bytes(q: QuantType) -> usize {
    PACK_ROWS * q.block_bytes()
}

/// Bytes before the quant chunks of a record: 32 (`d`), 64 (Q4_1: `d`, `m`), 96 (Q5_0: `d`
/// and the 5th-bit masks), 256 (Q4_K) or 1312 (Q6_K).
pub const fn record_scale_bytes(q: QuantType) -> usize {
    match q {
        QuantType::Q5_0 => 2 * PACK_ROWS + Q5_MASK_BYTES,
        QuantType::Q4_K => 4 * PACK_ROWS + 3 * 64,
        // Its chunks are interleaved with masks and scales (`weight_at`).
        QuantType::Q6_K => 2 * PACK_ROWS,
        _ => PACK_ROWS * q.scale_bytes_per_block(),
    }
}

/// Bytes of a Q5_0 record's 5th-bit masks (8 × 64 bits), after its 16 `d`.
pub const Q5_MASK_BYTES: usize = 64;

/// 64-byte quant chunks per record: 4 for the Q4 types and Q5_0, 8 for Q8_0.
pub const fn record_chunks(q: QuantType) -> usize {
    match q {
        QuantType::Q8_0 => 8,
        QuantType::Q4_K | QuantType::Q6_K => 32,
        _ => 4,
    }
}

/// Offsets in a Q4_K record of its scale vectors: the low nibbles of `sc_j`, of `m_j`, and the
/// high bits of both.
pub const Q4K_SC_LO: usize = 64;
pub const Q4K_M_LO: usize = 128;
pub const Q4K_HI: usize = 192;

/// Bytes of a Q6_K record's group for one sub-block of 16 weights: 8 masks of 64 bits, two
/// 64-byte chunks, 16 scales.
pub const Q6K_GROUP: usize = 8 * 8 + 2 * 64 + PACK_ROWS;
/// Offsets in a Q6_K group of its chunks and its scales (the masks are first).
pub const Q6K_CHUNKS: usize = 64;
pub const Q6K_SC: usize = Q6K_CHUNKS + 2 * 64;

/// Offset in a Q6_K record of the group of sub-block `g`.
pub const fn q6k_group(g: usize) -> usize {
    2 * PACK_ROWS + Q6K_GROUP * g
}

/// The scale `sc_g` of sub-block `g` (weights `16g .. 16g + 16`) of the row at lane `i` of a Q6_K
/// record.
pub fn q6k_scale(rec: &[u8], i: usize, g: usize) -> i8 {
    rec[q6k_group(g) + Q6K_SC + i] as i8
}

/// The byte offset in a Q6_K record and the bit of high bit `e` (0: bit 4, 1: bit 5) of weight
/// `k` of the row at lane `i`.
fn q6k_mask_bit(i: usize, k: usize, e: usize) -> (usize, usize) {
    let mask = 4 * (k % 16 / 8) + 2 * usize::from(k % 8 >= 4) + e;
    let bit = 4 * i + k % 4;
    (q6k_group(k / 16) + 8 * mask + bit / 8, bit % 8)
}

/// The 6-bit level (0..64) of weight `k` (0..256) of the row at lane `i` of a Q6_K record.
pub fn q6k_level(rec: &[u8], i: usize, k: usize) -> u8 {
    let (at, high) = weight_at(QuantType::Q6_K, i, k);
    let mut l = if high { rec[at] >> 4 } else { rec[at] & 0xF };
    for e in 0..2 {
        let (at, bit) = q6k_mask_bit(i, k, e);
        l |= ((rec[at] >> bit) & 1) << (4 + e);
    }
    l
}

/// Lays one row's GGUF Q6_K block into lane `i` of record `rec`.
fn pack_q6k_row(rec: &mut [u8], i: usize, blk: &[u8]) {
    rec[2 * i..2 * i + 2].copy_from_slice(&blk[208..210]);
    for g in 0..16 {
        rec[q6k_group(g) + Q6K_SC + i] = blk[192 + g];
    }
    for (k, l) in super::kquants::q6k_levels(blk).iter().enumerate() {
        let (at, high) = weight_at(QuantType::Q6_K, i, k);
        rec[at] |= (l & 0xF) << (4 * u8::from(high));
        for e in 0..2 {
            let (at, bit) = q6k_mask_bit(i, k, e);
            rec[at] |= ((l >> (4 + e)) & 1) << bit;
        }
    }
}

/// The GGUF Q6_K block of lane `i` of record `rec` (the inverse of [`pack_q6k_row`]).
fn unpack_q6k_row(rec: &[u8], i: usize, blk: &mut [u8]) {
    let mut l = [0u8; 256];
    for (k, v) in l.iter_mut().enumerate() {
        *v = q6k_level(rec, i, k);
    }
    super::kquants::q6k_pack_levels(&l, &mut blk[..192]);
    for g in 0..16 {
        blk[192 + g] = q6k_scale(rec, i, g) as u8;
    }
    blk[208..210].copy_from_slice(&rec[2 * i..2 * i + 2]);
}

/// `(sc_j, m_j)` of the row at lane `i` of a Q4_K record.
pub fn q4k_scale_min(rec: &[u8], i: usize, j: usize) -> (u8, u8) {
    let lane =
        |off: usize| u32::from_le_bytes(rec[off + 4 * i..off + 4 * i + 4].try_into().unwrap());
    let (sl, ml, hi) = (lane(Q4K_SC_LO), lane(Q4K_M_LO), lane(Q4K_HI));
    let sc = ((sl >> (4 * j)) & 0xF) | (((hi >> (2 * j)) & 3) << 4);
    let m = ((ml >> (4 * j)) & 0xF) | (((hi >> (16 + 2 * j)) & 3) << 4);
    (sc as u8, m as u8)
}

/// The 256 levels (0..16) of a GGUF Q4_K block in weight order: its 128 bytes hold, per group
/// `n` of 64 weights, weight `64n + l` in the low nibble of byte `32n + l` and `64n + 32 + l` in
/// the high one.
fn q4k_levels(blk: &[u8]) -> [u8; 256] {
    let mut l = [0u8; 256];
    for n in 0..4 {
        for i in 0..32 {
            let b = blk[16 + 32 * n + i];
            l[64 * n + i] = b & 0xF;
            l[64 * n + 32 + i] = b >> 4;
        }
    }
    l
}

/// Packs a Q4_K block's 16 (scale, min) pairs into its 12 GGUF bytes (the inverse of
/// `kquants::scale_min_k4`).
fn q4k_pack_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4);
    }
    q
}

/// Lays one row's GGUF Q4_K block into lane `i` of record `rec`.
fn pack_q4k_row(rec: &mut [u8], i: usize, blk: &[u8]) {
    rec[2 * i..2 * i + 2].copy_from_slice(&blk[..2]);
    rec[2 * PACK_ROWS + 2 * i..2 * PACK_ROWS + 2 * i + 2].copy_from_slice(&blk[2..4]);
    let (mut sl, mut ml, mut hi) = (0u32, 0u32, 0u32);
    for j in 0..8 {
        let (sc, m) = super::kquants::scale_min_k4(j, &blk[4..16]);
        sl |= u32::from(sc & 0xF) << (4 * j);
        ml |= u32::from(m & 0xF) << (4 * j);
        hi |= u32::from(sc >> 4) << (2 * j) | u32::from(m >> 4) << (16 + 2 * j);
    }
    rec[Q4K_SC_LO + 4 * i..][..4].copy_from_slice(&sl.to_le_bytes());
    rec[Q4K_M_LO + 4 * i..][..4].copy_from_slice(&ml.to_le_bytes());
    rec[Q4K_HI + 4 * i..][..4].copy_from_slice(&hi.to_le_bytes());
    for (k, l) in q4k_levels(blk).iter().enumerate() {
        let (at, high) = weight_at(QuantType::Q4_K, i, k);
        rec[at] |= l << (4 * u8::from(high));
    }
}

/// The GGUF Q4_K block of lane `i` of record `rec` (the inverse of [`pack_q4k_row`]).
fn unpack_q4k_row(rec: &[u8], i: usize, blk: &mut [u8]) {
    blk[..2].copy_from_slice(&rec[2 * i..2 * i + 2]);
    blk[2..4].copy_from_slice(&rec[2 * PACK_ROWS + 2 * i..2 * PACK_ROWS + 2 * i + 2]);
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        (sc[j], m[j]) = q4k_scale_min(rec, i, j);
    }
    blk[4..16].copy_from_slice(&q4k_pack_scales(&sc, &m));
    blk[16..144].fill(0);
    for k in 0..256 {
        let (at, high) = weight_at(QuantType::Q4_K, i, k);
        let l = if high { rec[at] >> 4 } else { rec[at] & 0xF };
        let (n, r) = (k / 64, k % 64);
        blk[16 + 32 * n + r % 32] |= l << (4 * u8::from(r >= 32));
    }
}

/// Offset in a Q5_0 block (GGUF: `d`, `qh`, then 16 nibble bytes) of its nibbles.
const Q5_QS: usize = 6;

/// The 5th bit (0 or 1) of weight `k` of the row at lane `i` of a Q5_0 record.
pub fn q5_bit(rec: &[u8], i: usize, k: usize) -> u8 {
    let mask = 2 * (k / 8) + usize::from(k % 8 >= 4);
    let bit = 4 * i + k % 4;
    (rec[2 * PACK_ROWS + 8 * mask + bit / 8] >> (bit % 8)) & 1
}

/// Weight `k` (0..32) of a split-layout Q4 block's 16 quant bytes (GGUF nibble order: weight
/// `k < 16` in the low nibble of byte `k`, weight `k ≥ 16` in the high nibble of byte `k − 16`).
fn nibble(qb: &[u8], k: usize) -> u8 {
    if k < 16 {
        qb[k] & 0x0F
    } else {
        qb[k - 16] >> 4
    }
}

/// Byte `p` (0..4) of chunk `j` of a record for one row, from its split-layout block: two
/// nibbles (weights `8j + p` and `8j + 4 + p`) for the Q4 types and Q5_0, weight `4j + p` for
/// Q8_0.
fn packed_byte(q: QuantType, qb: &[u8], j: usize, p: usize) -> u8 {
    match q {
        QuantType::Q8_0 => qb[4 * j + p],
        QuantType::Q5_0 => {
            let n = &qb[Q5_QS..];
            nibble(n, 8 * j + p) | (nibble(n, 8 * j + 4 + p) << 4)
        }
        _ => nibble(qb, 8 * j + p) | (nibble(qb, 8 * j + 4 + p) << 4),
    }
}

/// Where weight `k` of a block sits in a record, for the row at lane `i`: the byte offset and,
/// for the Q4 types, whether it is the high nibble.
pub fn weight_at(q: QuantType, i: usize, k: usize) -> (usize, bool) {
    let rsb = record_scale_bytes(q);
    if q == QuantType::Q6_K {
        let at = q6k_group(k / 16) + Q6K_CHUNKS + 64 * (k % 16 / 8) + 4 * i + k % 4;
        return (at, k % 8 >= 4);
    }
    if q == QuantType::Q8_0 {
        (rsb + 64 * (k / 4) + 4 * i + k % 4, false)
    } else {
        (rsb + 64 * (k / 8) + 4 * i + k % 4, k % 8 >= 4)
    }
}

/// Rearranges a split-layout tile body (`scales` of every row, then quants of every row; see
/// the `quant` module docs) into records, in place.
///
/// # Panics
/// When the tile is not [`packable`], `cols` is not a multiple of 32 or `body` is not exactly
/// the tile's size.
pub fn pack_tile(q: QuantType, rows: usize, cols: usize, body: &mut [u8]) {
    check(q, rows, cols, body);
    let split = body.to_vec();
    let (sb, qb) = (q.scale_bytes_per_block(), q.quant_bytes_per_block());
    let nb = cols / q.block_len();
    let (scales, qs) = split.split_at(rows * nb * sb);
    let (rb, rsb) = (record_bytes(q), record_scale_bytes(q));
    for g in 0..rows / PACK_ROWS {
        for b in 0..nb {
            let rec = &mut body[(g * nb + b) * rb..(g * nb + b + 1) * rb];
            rec.fill(0);
            for i in 0..PACK_ROWS {
                let r = g * PACK_ROWS + i;
                let s = &scales[(r * nb + b) * sb..(r * nb + b + 1) * sb];
                // d, then (Q4_1) m: each an f16 of the row's scale entry.
                for (h, pair) in s.chunks_exact(2).enumerate() {
                    rec[h * 2 * PACK_ROWS + 2 * i..][..2].copy_from_slice(pair);
                }
                let blk = &qs[(r * nb + b) * qb..(r * nb + b + 1) * qb];
                match q {
                    QuantType::Q4_K => {
                        pack_q4k_row(rec, i, blk);
                        continue;
                    }
                    QuantType::Q6_K => {
                        pack_q6k_row(rec, i, blk);
                        continue;
                    }
                    _ => {}
                }
                if q == QuantType::Q5_0 {
                    // d from the block; each weight's 5th bit into its chunk's mask.
                    rec[2 * i..2 * i + 2].copy_from_slice(&blk[..2]);
                    let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                    for k in 0..QK {
                        let mask = 2 * (k / 8) + usize::from(k % 8 >= 4);
                        let bit = 4 * i + k % 4;
                        rec[2 * PACK_ROWS + 8 * mask + bit / 8] |=
                            (((qh >> k) & 1) as u8) << (bit % 8);
                    }
                }
                for j in 0..record_chunks(q) {
                    for p in 0..4 {
                        rec[rsb + 64 * j + 4 * i + p] = packed_byte(q, blk, j, p);
                    }
                }
            }
        }
    }
}

/// Row `r` of a repacked tile in the split layout: its scale entries and quant bytes.
pub fn unpack_row(
    q: QuantType,
    rows: usize,
    cols: usize,
    packed: &[u8],
    r: usize,
) -> (Vec<u8>, Vec<u8>) {
    check(q, rows, cols, packed);
    assert!(r < rows, "row {r} of a {rows}-row tile");
    let nb = cols / q.block_len();
    let mut scales = Vec::with_capacity(nb * q.scale_bytes_per_block());
    let mut qs = vec![0u8; nb * q.quant_bytes_per_block()];
    let rb = record_bytes(q);
    let (g, i) = (r / PACK_ROWS, r % PACK_ROWS);
    for b in 0..nb {
        let rec = &packed[(g * nb + b) * rb..(g * nb + b + 1) * rb];
        for h in 0..q.scale_bytes_per_block() / 2 {
            scales.extend_from_slice(&rec[h * 2 * PACK_ROWS + 2 * i..][..2]);
        }
        let blk = &mut qs[b * q.quant_bytes_per_block()..(b + 1) * q.quant_bytes_per_block()];
        match q {
            QuantType::Q4_K => {
                unpack_q4k_row(rec, i, blk);
                continue;
            }
            QuantType::Q6_K => {
                unpack_q6k_row(rec, i, blk);
                continue;
            }
            _ => {}
        }
        let nibbles = if q == QuantType::Q5_0 {
            blk[..2].copy_from_slice(&rec[2 * i..2 * i + 2]);
            let qh = (0..QK).fold(0u32, |h, k| h | (u32::from(q5_bit(rec, i, k)) << k));
            blk[2..Q5_QS].copy_from_slice(&qh.to_le_bytes());
            Q5_QS
        } else {
            0
        };
        for k in 0..QK {
            let (at, hi) = weight_at(q, i, k);
            let byte = rec[at];
            match q {
                QuantType::Q8_0 => blk[k] = byte,
                _ => {
                    let v = if hi { byte >> 4 } else { byte & 0x0F };
                    if k < 16 {
                        blk[nibbles + k] |= v;
                    } else {
                        blk[nibbles + k - 16] |= v << 4;
                    }
                }
            }
        }
    }
    (scales, qs)
}

/// The inverse of [`pack_tile`]: the split layout of a repacked tile, as `(scales, qs)` of every
/// row, row-major.
pub fn unpack_tile(q: QuantType, rows: usize, cols: usize, packed: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let (mut scales, mut qs) = (Vec::new(), Vec::new());
    for r in 0..rows {
        let (s, b) = unpack_row(q, rows, cols, packed, r);
        scales.extend_from_slice(&s);
        qs.extend_from_slice(&b);
    }
    (scales, qs)
}

fn check(q: QuantType, rows: usize, cols: usize, body: &[u8]) {
    assert!(packable(q, rows), "{q} tile of {rows} rows is not packable");
    assert!(
        cols.is_multiple_of(q.block_len()),
        "tile cols {cols} not a multiple of {}",
        q.block_len()
    );
    assert_eq!(body.len(), q.matrix_bytes(rows, cols), "tile body size");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_tile(q: QuantType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut rng = crate::rng::Rng::new(seed);
        let w = rng.fill(rows * cols, 1.0);
        let (mut s, mut qs) = (Vec::new(), Vec::new());
        for r in 0..rows {
            super::super::quantize_row(q, &w[r * cols..(r + 1) * cols], &mut s, &mut qs);
        }
        s.extend_from_slice(&qs);
        s
    }

    #[test]
    fn unpack_inverts_pack_and_pack_moves_every_byte() {
        for q in [
            QuantType::Q4_0,
            QuantType::Q4_1,
            QuantType::Q8_0,
            QuantType::Q5_0,
            QuantType::Q4_K,
            QuantType::Q6_K,
        ] {
            for (rows, cols) in [
                (16usize, 32usize),
                (128, 256),
                (64, 64),
                (48, 96),
                (32, 512),
            ] {
                if !cols.is_multiple_of(q.block_len()) {
                    continue;
                }
                let split = split_tile(q, rows, cols, (rows * cols) as u64);
                let mut body = split.clone();
                pack_tile(q, rows, cols, &mut body);
                assert_ne!(body, split, "{q} {rows}×{cols}: packing changed nothing");
                let (s, qs) = unpack_tile(q, rows, cols, &body);
                assert_eq!([s, qs].concat(), split, "{q} {rows}×{cols}");
            }
        }
    }

    /// The record layout as the module docs state it, checked weight by weight against the
    /// dequantized split tile.
    #[test]
    fn records_hold_the_documented_weights_and_scales() {
        let (rows, cols) = (32, 64);
        for q in [
            QuantType::Q4_0,
            QuantType::Q4_1,
            QuantType::Q8_0,
            QuantType::Q5_0,
        ] {
            let split = split_tile(q, rows, cols, 7);
            let mut body = split.clone();
            pack_tile(q, rows, cols, &mut body);
            let nb = cols / QK;
            let (sb, qb) = (q.scale_bytes_per_block(), q.quant_bytes_per_block());
            let (scales, qs) = split.split_at(rows * nb * sb);
            for r in 0..rows {
                let mut want = vec![0f32; cols];
                super::super::dequantize_row(
                    q,
                    &scales[r * nb * sb..(r + 1) * nb * sb],
                    &qs[r * nb * qb..(r + 1) * nb * qb],
                    &mut want,
                );
                let (g, i) = (r / PACK_ROWS, r % PACK_ROWS);
                for (c, want) in want.iter().enumerate() {
                    let (b, k) = (c / QK, c % QK);
                    let rec = &body[(g * nb + b) * record_bytes(q)..];
                    let d = super::super::f16_at(rec, 2 * i);
                    let got = match q {
                        QuantType::Q8_0 => {
                            let byte = rec[record_scale_bytes(q) + 64 * (k / 4) + 4 * i + k % 4];
                            (byte as i8) as f32 * d
                        }
                        _ => {
                            let byte = rec[record_scale_bytes(q) + 64 * (k / 8) + 4 * i + k % 4];
                            let u = if k % 8 >= 4 { byte >> 4 } else { byte & 0x0F };
                            if q == QuantType::Q5_0 {
                                // The 5th bit from mask 2·(k/8) + (k%8 ≥ 4), bit 4i + k%4.
                                let mask = 2 * (k / 8) + usize::from(k % 8 >= 4);
                                let bit = 4 * i + k % 4;
                                let h = (rec[32 + 8 * mask + bit / 8] >> (bit % 8)) & 1;
                                ((u | h << 4) as i32 - 16) as f32 * d
                            } else if q == QuantType::Q4_0 {
                                (u as i32 - 8) as f32 * d
                            } else {
                                u as f32 * d + super::super::f16_at(rec, 32 + 2 * i)
                            }
                        }
                    };
                    assert_eq!(got, *want, "{q} row {r} col {c}");
                }
            }
        }
    }

    /// Packs a random `rows` × 512 tile of K-quant `q` and checks every weight: `read(record,
    /// row in the group, column in the super-block)` must give what the file's dequantization
    /// gives, within `tol` (relative).
    fn check_k_records(
        q: QuantType,
        seed: u64,
        tol: f32,
        read: impl Fn(&[u8], usize, usize) -> f32,
    ) {
        let (rows, cols) = (32, 512);
        let split = split_tile(q, rows, cols, seed);
        let mut body = split.clone();
        pack_tile(q, rows, cols, &mut body);
        let (nb, bb) = (cols / 256, q.block_bytes());
        for r in 0..rows {
            let mut want = vec![0f32; cols];
            super::super::kquants::dequantize_row(
                q,
                &split[r * nb * bb..(r + 1) * nb * bb],
                &mut want,
            );
            let (g, i) = (r / PACK_ROWS, r % PACK_ROWS);
            for (c, want) in want.iter().enumerate() {
                let (b, k) = (c / 256, c % 256);
                let rec = &body[(g * nb + b) * record_bytes(q)..][..record_bytes(q)];
                let got = read(rec, i, k);
                assert!(
                    (got - want).abs() <= tol * (1.0 + want.abs()),
                    "{q} row {r} col {c}: {got} vs {want}"
                );
            }
        }
    }

    /// A Q4_K record's weights, read as the module docs lay them out, dequantize to the file's.
    #[test]
    fn q4k_records_hold_the_documented_weights() {
        check_k_records(QuantType::Q4_K, 5, 1e-6, |rec, i, k| {
            let (d, dmin) = (
                super::super::f16_at(rec, 2 * i),
                super::super::f16_at(rec, 32 + 2 * i),
            );
            let (sc, m) = q4k_scale_min(rec, i, k / 32);
            let byte = rec[256 + 64 * (k / 8) + 4 * i + k % 4];
            let l = if k % 8 >= 4 { byte >> 4 } else { byte & 0xF };
            d * sc as f32 * l as f32 - dmin * m as f32
        });
    }

    /// A Q6_K record's weights, read as the module docs lay them out (`d · sc_g · (l − 32)`),
    /// dequantize to the file's exactly.
    #[test]
    fn q6k_records_hold_the_documented_weights() {
        check_k_records(QuantType::Q6_K, 9, 0.0, |rec, i, k| {
            let d = super::super::f16_at(rec, 2 * i);
            let grp = &rec[32 + 208 * (k / 16)..][..208];
            let sc = grp[192 + i] as i8;
            let byte = grp[64 + 64 * (k % 16 / 8) + 4 * i + k % 4];
            let lo = if k % 8 >= 4 { byte >> 4 } else { byte & 0xF };
            let mask = |m: usize| {
                let bit = 4 * i + k % 4;
                (grp[8 * m + bit / 8] >> (bit % 8)) & 1
            };
            let m0 = 4 * (k % 16 / 8) + 2 * usize::from(k % 8 >= 4);
            let l = lo | mask(m0) << 4 | mask(m0 + 1) << 5;
            d * sc as f32 * (l as i32 - 32) as f32
        });
    }

    #[test]
    fn only_whole_16_row_tiles_of_the_split_block_types_are_packable() {
        assert!(packable(QuantType::Q4_0, 128));
        assert!(packable(QuantType::Q4_1, 64));
        assert!(!packable(QuantType::Q4_1, 72));
        assert!(!packable(QuantType::Q4_1, 0));
        assert!(packable(QuantType::Q8_0, 128));
        assert!(!packable(QuantType::F16, 128));
        assert!(packable(QuantType::Q5_0, 32));
        assert!(packable(QuantType::Q4_K, 32));
        assert!(packable(QuantType::Q6_K, 32));
        assert!(!packable(QuantType::Q5_K, 32));
        assert!(!packable(QuantType::Q5_1, 32));
    }

    #[test]
    fn repack_true_means_the_types_every_path_runs() {
        let r = Repack::from(true);
        assert!(r.includes(QuantType::Q4_0) && r.includes(QuantType::Q8_0));
        assert!(!r.includes(QuantType::Q5_0));
        assert!(!Repack::from(false).includes(QuantType::Q4_1));
    }
}
