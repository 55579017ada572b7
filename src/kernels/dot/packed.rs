//! Tile kernels over the repacked Q4_0/Q4_1/Q8_0, Q5_0, Q4_K and Q6_K layout (`quant::packed`: records
//! of 16 rows × one block), with their scalar reference. Q4_K and Q6_K records take Q8_K activation blocks
//! ([`tile_run_k`]); [`tile_matvec`] and [`tile_run`] the others.
//!
//! Integer path (the Q8 activation): per record, each row's exact integer dot `Σ w·q` over the
//! block (`w` the 4-bit quant `u` or the Q8_0 weight, `q` the activation's i8), then in f32, in
//! this order ([`block_step`]): `acc = fma(dot, d·d_x, acc)`, and for Q4_1 `acc = fma(m, s,
//! acc)`, where `d_x` is the activation block's scale and `s = d_x·Σq` its sum
//! ([`super::Q8Act`]); Q4_0's offset folds into one step, `acc = fma(d, fma(dot, d_x, −8·s),
//! acc)` (one multiply fewer per record and token). A tile's 16-row accumulators start at zero and
//! are added to `y` at the end. Every path below computes exactly this (bit-identical, tested):
//! the integer dot is exact in i32 (and in the AVX2 path's i16 partial sums: at most 16
//! products of 15 × 128 for Q4, 2 of 128 × 127 for Q8_0), and the float steps are the same
//! operations in the same order.
//!
//! * AVX-512 VNNI: one `vpdpbusd` per 64-byte chunk (Q4: per nibble half) adds 4 products to
//!   each of the 16 rows, with the activation's 4 bytes broadcast. Q4's high nibbles are used
//!   in place (`w & 0xF0`, 16 × the nibble) and their sum shifted right by 4 once per block.
//!   Q8_0's weights are signed, so the activation is the unsigned operand, biased by 128 (once
//!   per call), and `128·Σw` (one more `vpdpbusd`) is subtracted.
//! * AVX2 (also AVX-512 without VNNI): the record's two 8-row halves; Q4 with `vpmaddubsw` into
//!   i16 and one `vpmaddwd` per half, Q8_0 with `|w|` and `sign(x, w)` per chunk.
//! * Q5_0 (repacked only where [`repacks_vnni_types`]): per record each row's exact integer dot
//!   `Σ (l − 16)·q` over the block (`l` the 5-bit level), then `acc = fma(dot, d·d_x, acc)`.
//!   AVX-512 VNNI: a chunk's nibbles are split (`w & 0xF`, `(w >> 4) & 0xF`), each half gets its
//!   5th bits as 16 by one byte-masked add (`vpaddb` under the record's 64-bit mask), and the
//!   two `vpdpbusd` start from `−16·Σq` of the block (summed once per call). Other paths run
//!   the scalar reference (the engine does not repack Q5_0 there).
//! * Q4_K (repacked where [`repacks_vnni_types`], as Q5_0), against Q8_K activation blocks
//!   ([`tile_run_k`]): per record and row, each sub-block `j`'s exact integer dot `S_j = Σ l·q`,
//!   then in i32 `T = Σ_j sc_j·S_j` and `M = Σ_j m_j·X_j` (`X_j` the activation's sum over the
//!   sub-block, from its `bsums`), then `acc = fma(T, d·d_x, acc)` and `acc = fma(−M, dmin·d_x,
//!   acc)`. AVX-512 VNNI: the nibbles as for Q4, the 16 rows' `sc_j` and `m_j` taken out of the
//!   record's three scale vectors by shifts, `vpmulld` for the products.
//! * Q6_K (as Q4_K): per record and row, each sub-block `g`'s (16 weights) exact
//!   `S_g = Σ (l − 32)·q = Σ l·q − 32·X_g`, then in i32 `T = Σ_g sc_g·S_g`, then
//!   `acc = fma(T, d·d_x, acc)`. AVX-512 VNNI: a chunk's nibbles split as for Q5_0, bit 4 and
//!   bit 5 added as 16 and 32 under the group's masks, `vpdpbusd` from `−32·X_g`, the 16 rows'
//!   `sc_g` sign-extended from 16 bytes, `vpmulld`; the record is read front to back.
//! * f32 activation (`--act f32`, or no SIMD): scalar only. The engine repacks only when decode
//!   takes the integer path (`EngineArgs::repack`), so this is the fallback, not a fast path.

use super::Q8KRef;
use super::{Isa, XqRef};
use super::{Tile, XqBlocks};
use crate::quant::kquants::QK_K;
use crate::quant::packed::{
    q4k_scale_min, q5_bit, q6k_level, q6k_scale, record_bytes, record_scale_bytes, weight_at,
    PACK_ROWS,
};
use crate::quant::{f16_at, QuantType, QK};

/// `y[r] += W[r]·x` for one repacked tile of `rows` rows (a multiple of 16) and `cols` columns
/// (a multiple of 32). Integer path when `xq` (the Q8 blocks of these columns) is given.
pub fn tile_matvec(isa: Isa, t: Tile, x: &[f32], xq: XqRef, y: &mut [f32]) {
    let Tile {
        quant: q,
        rows,
        cols,
        qs: body,
        ..
    } = t;
    tile_run(Kernel::of(isa), Tile::body(q, rows, cols, body), x, xq, y)
}

/// The kernel [`tile_run`] calls, chosen once ([`Kernel::of`]) rather than per tile: decode over
/// SmolLM2's repacked matrices makes ~5,500 tile calls per token (1,674 stripes of 3 tiles),
/// and asking the CPU's feature cache on each one showed in the profile. Only [`Kernel::of`] makes one, so holding
/// a `Kernel` proves its path runs on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel(Path);

impl Kernel {
    /// The kernel for `isa` on this CPU ([`path`]).
    pub fn of(isa: Isa) -> Kernel {
        Kernel(path(isa))
    }

    pub fn path(self) -> Path {
        self.0
    }

    /// The kernel of `p`, for the table of `dot::select`: an entry holding it is selected only
    /// where [`path`] returns `p` on this CPU, which keeps the promise of [`Kernel::of`].
    pub(super) const fn of_path(p: Path) -> Kernel {
        Kernel(p)
    }
}

/// [`tile_matvec`] with its kernel chosen by the caller.
#[inline]
pub fn tile_run(k: Kernel, t: Tile, x: &[f32], xq: XqRef, y: &mut [f32]) {
    let Tile {
        quant: q,
        rows,
        cols,
        qs: body,
        ..
    } = t;
    assert!(!q.is_k(), "{q} records take Q8_K blocks: tile_run_k");
    let nb = check_records(t, y.len(), 1);
    let Some((d, s, xqs)) = xq else {
        assert!(x.len() >= cols, "x too short: {} < {cols}", x.len());
        return scalar_f32(q, rows, cols, body, x, y);
    };
    assert!(
        d.len() >= nb && s.len() >= nb && xqs.len() >= cols,
        "xq too short"
    );
    match k.0 {
        // SAFETY: a `Kernel` holding `Vnni` comes only from `path`, which returns it when
        // AVX-512 F/BW/VNNI were detected (`has_vnni` checks `available`); the lengths were
        // asserted above.
        #[cfg(target_arch = "x86_64")]
        Path::Vnni => unsafe { avx512::run(q, rows, nb, body, (d, s, xqs), y) },
        // SAFETY: `Avx2` comes only from `path`, after AVX2/FMA/F16C were detected; the
        // lengths were asserted above.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 if q != QuantType::Q5_0 => unsafe {
            avx2::run(q, rows, nb, body, (d, s, xqs), y)
        },
        _ => scalar_int(q, rows, nb, body, (d, s, xqs), y),
    }
}

/// Checks a repacked tile against the kernels' contract before any SIMD code reads it: whole
/// 16-row groups of a repackable type, whole blocks of it, the body's size, and room in `y` for
/// `n` tokens' rows. Returns the blocks per row.
fn check_records(t: Tile, y_len: usize, n: usize) -> usize {
    let Tile {
        quant: q,
        rows,
        cols,
        qs: body,
        ..
    } = t;
    assert!(
        crate::quant::packed::packable(q, rows),
        "{q} tile of {rows} rows is not repacked"
    );
    let bl = q.block_len();
    assert!(
        cols.is_multiple_of(bl),
        "tile cols {cols} not a multiple of {bl}"
    );
    assert!(
        body.len() >= q.matrix_bytes(rows, cols),
        "tile body too short"
    );
    assert!(y_len >= n * rows, "y too short: {y_len} < {}", n * rows);
    cols / bl
}

/// [`tile_run`] for a repacked Q4_K or Q6_K tile: `y[r] += W[r]·x` with the Q8_K blocks `xk` of
/// these columns (integer path), else the f32 `x`.
#[inline]
pub fn tile_run_k(k: Kernel, t: Tile, x: &[f32], xk: Option<Q8KRef>, y: &mut [f32]) {
    let Tile {
        quant: q,
        rows,
        cols,
        qs: body,
        ..
    } = t;
    assert!(q.is_k(), "{q} tile is not a K-quant tile");
    let nb = check_records(t, y.len(), 1);
    let Some(xk) = xk else {
        assert!(x.len() >= cols, "x too short: {} < {cols}", x.len());
        return scalar_f32(q, rows, cols, body, x, y);
    };
    assert!(
        xk.d.len() >= nb && xk.bsums.len() >= 16 * nb && xk.qs.len() >= cols,
        "xk too short"
    );
    match k.0 {
        // SAFETY: a `Kernel` holding `Vnni` comes only from `path`, after AVX-512 F/BW/VNNI were
        // detected; the lengths were asserted above.
        #[cfg(target_arch = "x86_64")]
        Path::Vnni if q == QuantType::Q4_K => unsafe { avx512::run_q4k(rows, nb, body, xk, y) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Path::Vnni => unsafe { avx512::run_k_batch(q, rows, nb, body, &[xk], y) },
        _ if q == QuantType::Q4_K => scalar_int_q4k(rows, nb, body, xk, y),
        _ => scalar_int_q6k(rows, nb, body, xk, y),
    }
}

/// [`tile_run_k`] for a batch of tokens: for every token `j`, `ys[j·rows ..][..rows] += W·x_j`
/// with `x_j`'s Q8_K blocks `xks[j]`. Bit-identical to one [`tile_run_k`] per token. With
/// AVX-512 VNNI each record's levels and scales are unpacked once for up to [`BATCH`] tokens;
/// the other paths run one token at a time.
pub fn tile_run_k_batch(k: Kernel, t: Tile, xks: &[Q8KRef], ys: &mut [f32]) {
    let Tile {
        quant: q,
        rows,
        cols,
        ..
    } = t;
    assert!(q.is_k(), "{q} tile is not a K-quant tile");
    let nb = check_records(t, ys.len(), xks.len());
    for xk in xks {
        assert!(
            xk.d.len() >= nb && xk.bsums.len() >= 16 * nb && xk.qs.len() >= cols,
            "xk too short"
        );
    }
    #[cfg(target_arch = "x86_64")]
    if k.0 == Path::Vnni && xks.len() > 1 {
        // SAFETY: `Vnni` comes only from `path`, after AVX-512 F/BW/VNNI were detected; the
        // tile and every token's lengths were asserted above.
        unsafe { avx512::run_k_batch(q, rows, nb, t.qs, xks, ys) };
        return;
    }
    for (j, xk) in xks.iter().enumerate() {
        tile_run_k(k, t, &[], Some(*xk), &mut ys[j * rows..(j + 1) * rows]);
    }
}

/// Scalar reference of the Q4_K records' integer path (see the module docs).
pub fn scalar_int_q4k(rows: usize, nb: usize, body: &[u8], xk: Q8KRef, y: &mut [f32]) {
    let rb = record_bytes(QuantType::Q4_K);
    for g in 0..rows / PACK_ROWS {
        let mut acc = [0f32; PACK_ROWS];
        for b in 0..nb {
            let rec = &body[(g * nb + b) * rb..(g * nb + b + 1) * rb];
            let xb = &xk.qs[b * QK_K..(b + 1) * QK_K];
            let dx = xk.d[b];
            for (i, a) in acc.iter_mut().enumerate() {
                let (mut t, mut m) = (0i32, 0i32);
                for j in 0..8 {
                    let mut dot = 0i32;
                    for (k, &xv) in xb.iter().enumerate().skip(32 * j).take(32) {
                        let (at, hi) = weight_at(QuantType::Q4_K, i, k);
                        let l = if hi { rec[at] >> 4 } else { rec[at] & 0x0F };
                        dot += l as i32 * xv as i32;
                    }
                    let (sc, mn) = q4k_scale_min(rec, i, j);
                    let xs = xk.bsums[16 * b + 2 * j] as i32 + xk.bsums[16 * b + 2 * j + 1] as i32;
                    t += sc as i32 * dot;
                    m += mn as i32 * xs;
                }
                let (dr, dm) = (f16_at(rec, 2 * i), f16_at(rec, 2 * PACK_ROWS + 2 * i));
                *a = (t as f32).mul_add(dr * dx, *a);
                *a = (-(m as f32)).mul_add(dm * dx, *a);
            }
        }
        for (yr, a) in y[g * PACK_ROWS..(g + 1) * PACK_ROWS].iter_mut().zip(acc) {
            *yr += a;
        }
    }
}

/// Scalar reference of the Q6_K records' integer path (see the module docs).
pub fn scalar_int_q6k(rows: usize, nb: usize, body: &[u8], xk: Q8KRef, y: &mut [f32]) {
    let rb = record_bytes(QuantType::Q6_K);
    for g in 0..rows / PACK_ROWS {
        let mut acc = [0f32; PACK_ROWS];
        for b in 0..nb {
            let rec = &body[(g * nb + b) * rb..(g * nb + b + 1) * rb];
            let xb = &xk.qs[b * QK_K..(b + 1) * QK_K];
            for (i, a) in acc.iter_mut().enumerate() {
                let mut t = 0i32;
                for j in 0..16 {
                    let mut s = -32 * xk.bsums[16 * b + j] as i32;
                    for (k, &xv) in xb.iter().enumerate().skip(16 * j).take(16) {
                        s += q6k_level(rec, i, k) as i32 * xv as i32;
                    }
                    t += q6k_scale(rec, i, j) as i32 * s;
                }
                *a = (t as f32).mul_add(f16_at(rec, 2 * i) * xk.d[b], *a);
            }
        }
        for (yr, a) in y[g * PACK_ROWS..(g + 1) * PACK_ROWS].iter_mut().zip(acc) {
            *yr += a;
        }
    }
}

/// [`tile_run`] for a batch of tokens on the integer path: for every token `j`,
/// `ys[j·rows ..][..rows] += W·x_j` with `x_j`'s Q8 blocks `xqs[j]`. Bit-identical to one
/// [`tile_run`] per token (each token's integer dots are exact and its float steps are the
/// same operations in the same order). With AVX-512 VNNI, each record's weights are loaded
/// and unpacked once for up to [`BATCH`] tokens; the other paths run one token at a time.
pub fn tile_run_batch(k: Kernel, t: Tile, xqs: &[XqBlocks], ys: &mut [f32]) {
    let Tile {
        quant: q,
        rows,
        cols,
        qs: body,
        ..
    } = t;
    let n = xqs.len();
    assert!(!q.is_k(), "{q} records take Q8_K blocks: tile_run_k_batch");
    let nb = check_records(t, ys.len(), n);
    #[cfg(target_arch = "x86_64")]
    if k.0 == Path::Vnni && n > 1 {
        for (d, s, x) in xqs {
            assert!(
                d.len() >= nb && s.len() >= nb && x.len() >= cols,
                "xq too short"
            );
        }
        if n >= AMX_MIN_TOKENS && q != QuantType::Q5_0 && super::packed_amx::available() {
            // SAFETY: AMX was detected and permitted (`available`), AVX-512 with `Vnni`; the
            // lengths were asserted above.
            unsafe { super::packed_amx::run_batch(q, rows, nb, body, xqs, ys) };
            return;
        }
        // SAFETY: `Vnni` comes only from `path`, after AVX-512 F/BW/VNNI were detected; the
        // lengths were asserted above.
        unsafe { avx512::run_batch(q, rows, nb, body, xqs, ys) };
        return;
    }
    for (j, xq) in xqs.iter().enumerate() {
        tile_run(k, t, &[], Some(*xq), &mut ys[j * rows..(j + 1) * rows]);
    }
}

/// Tokens per pass of the batched VNNI kernels: their accumulators, integer sums and a
/// record's unpacked weights fit the 32 vector registers. Q8_0 passes take twice as many (its
/// weights need no unpacking and its weight sums are made once per batch): on SmolLM2 Q6_K,
/// whose 576-column matrices are Q8_0, pp256 ran 1.36× faster than with 4 per pass and the
/// sums made per pass (docs/PERFORMANCE.md); the Q4 kernels lost 2.6 % with 8.
pub const BATCH: usize = 4;

/// From this many tokens a batch runs on AMX where the CPU has it (`packed_amx`; a pass is 16
/// tokens, padded).
pub const AMX_MIN_TOKENS: usize = 8;

/// The integer-path kernel [`tile_matvec`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Vnni,
    Avx2,
    Scalar,
}

impl Path {
    /// Its name in reports (`Isa::kernels_with`).
    pub fn name(self) -> &'static str {
        match self {
            Path::Vnni => "AVX-512 VNNI",
            Path::Avx2 => "AVX2",
            Path::Scalar => "scalar",
        }
    }
}

/// Whether a resident copy for `isa` repacks its Q5_0, Q4_K and Q6_K matrices (`quant::packed::Repack`): where
/// the integer path runs the AVX-512 VNNI kernels, and the CPU has no AMX, whose prompt kernels
/// (`kquant_amx`) read Q5_0 and the K-quants in the file's layout.
pub fn repacks_vnni_types(isa: Isa) -> bool {
    path(isa) == Path::Vnni && !super::packed_amx::available()
}

/// The types a resident copy for `isa` repacks when the integer path runs (`--act q8`): Q4_0,
/// Q4_1 and Q8_0 always, Q5_0/Q4_K/Q6_K where [`repacks_vnni_types`]. What the engine opens a
/// model with (`cli::args`), and what the probes and benchmarks mirror.
pub fn repack_for(isa: Isa) -> crate::quant::packed::Repack {
    crate::quant::packed::Repack {
        q4_q8: true,
        vnni_types: repacks_vnni_types(isa),
    }
}

/// The dispatch of [`tile_matvec`]'s integer path on `isa`: AVX-512 VNNI where the CPU has it,
/// else AVX2 unless `isa` is scalar or the CPU lacks it, else scalar.
pub fn path(isa: Isa) -> Path {
    if cfg!(target_arch = "x86_64") && isa.has_vnni() {
        Path::Vnni
    } else if cfg!(target_arch = "x86_64") && isa != Isa::Scalar && Isa::Avx2.available() {
        Path::Avx2
    } else {
        Path::Scalar
    }
}

/// One record row's float steps for block `b` (module docs): `dot` the row's exact integer
/// dot, `dr` its weight scale, `c` its Q4_1 minimum (unused otherwise), `(dx, sp)` the block's
/// [`block_consts`]. The scalar form of what every kernel below computes.
#[inline(always)]
pub(super) fn block_step(
    q: QuantType,
    acc: f32,
    dot: i32,
    dr: f32,
    c: f32,
    dx: f32,
    sp: f32,
) -> f32 {
    match q {
        QuantType::Q4_0 => dr.mul_add((dot as f32).mul_add(dx, sp), acc),
        QuantType::Q4_1 => c.mul_add(sp, (dot as f32).mul_add(dr * dx, acc)),
        _ => (dot as f32).mul_add(dr * dx, acc),
    }
}

/// The f32-side constants of block `b` for [`block_step`]: `(d_x, s')`, `s'` being `−8·s` for
/// Q4_0 and `s` otherwise.
#[inline(always)]
pub(super) fn block_consts(q: QuantType, d: &[f32], s: &[f32], b: usize) -> (f32, f32) {
    let sp = if q == QuantType::Q4_0 {
        -8.0 * s[b]
    } else {
        s[b]
    };
    (d[b], sp)
}

/// Scalar reference of the integer path (see the module docs for the exact operations).
pub fn scalar_int(q: QuantType, rows: usize, nb: usize, body: &[u8], xq: XqBlocks, y: &mut [f32]) {
    let (d, s, xq) = xq;
    let rb = record_bytes(q);
    for g in 0..rows / PACK_ROWS {
        let mut acc = [0f32; PACK_ROWS];
        for b in 0..nb {
            let rec = &body[(g * nb + b) * rb..(g * nb + b + 1) * rb];
            let xb = &xq[b * QK..(b + 1) * QK];
            let (dx, sp) = block_consts(q, d, s, b);
            for (i, a) in acc.iter_mut().enumerate() {
                let mut dot = 0i32;
                for (k, xk) in xb.iter().enumerate() {
                    let (at, hi) = weight_at(q, i, k);
                    let w = match (q, hi) {
                        (QuantType::Q8_0, _) => (rec[at] as i8) as i32,
                        (_, false) => (rec[at] & 0x0F) as i32,
                        (_, true) => (rec[at] >> 4) as i32,
                    };
                    let w = match q {
                        QuantType::Q5_0 => (w | (q5_bit(rec, i, k) as i32) << 4) - 16,
                        _ => w,
                    };
                    dot += w * *xk as i32;
                }
                let dr = f16_at(rec, 2 * i);
                let c = match q {
                    QuantType::Q4_1 => f16_at(rec, 2 * PACK_ROWS + 2 * i),
                    _ => 0.0,
                };
                *a = block_step(q, *a, dot, dr, c, dx, sp);
            }
        }
        for (yr, a) in y[g * PACK_ROWS..(g + 1) * PACK_ROWS].iter_mut().zip(acc) {
            *yr += a;
        }
    }
}

/// The f32-activation path (scalar): per row and block, the dequantized weights dotted with `x`
/// in column order, the block sums added in block order.
pub fn scalar_f32(q: QuantType, rows: usize, cols: usize, body: &[u8], x: &[f32], y: &mut [f32]) {
    match q {
        QuantType::Q4_K => return scalar_f32_q4k(rows, cols, body, x, y),
        QuantType::Q6_K => return scalar_f32_q6k(rows, cols, body, x, y),
        _ => {}
    }
    let nb = cols / QK;
    let rb = record_bytes(q);
    for g in 0..rows / PACK_ROWS {
        for i in 0..PACK_ROWS {
            let mut acc = 0f32;
            for b in 0..nb {
                let rec = &body[(g * nb + b) * rb..(g * nb + b + 1) * rb];
                let dr = f16_at(rec, 2 * i);
                let mut blk = 0f32;
                for k in 0..QK {
                    let (at, hi) = weight_at(q, i, k);
                    let u = if hi { rec[at] >> 4 } else { rec[at] & 0x0F };
                    let w = match q {
                        QuantType::Q4_0 => (u as i32 - 8) as f32 * dr,
                        QuantType::Q5_0 => ((u | q5_bit(rec, i, k) << 4) as i32 - 16) as f32 * dr,
                        QuantType::Q4_1 => u as f32 * dr + f16_at(rec, 2 * PACK_ROWS + 2 * i),
                        _ => (rec[at] as i8) as f32 * dr,
                    };
                    blk += w * x[b * QK + k];
                }
                acc += blk;
            }
            y[g * PACK_ROWS + i] += acc;
        }
    }
}

/// [`scalar_f32`] of Q6_K records: per row and sub-block, the dequantized weights
/// (`d·sc·(l − 32)`) dotted with `x` in column order, the sub-block sums added in order.
fn scalar_f32_q6k(rows: usize, cols: usize, body: &[u8], x: &[f32], y: &mut [f32]) {
    let nb = cols / QK_K;
    let rb = record_bytes(QuantType::Q6_K);
    for g in 0..rows / PACK_ROWS {
        for i in 0..PACK_ROWS {
            let mut acc = 0f32;
            for b in 0..nb {
                let rec = &body[(g * nb + b) * rb..(g * nb + b + 1) * rb];
                let d = f16_at(rec, 2 * i);
                for j in 0..16 {
                    let e = d * q6k_scale(rec, i, j) as f32;
                    let mut sub = 0f32;
                    for k in 16 * j..16 * j + 16 {
                        sub += e * (q6k_level(rec, i, k) as i32 - 32) as f32 * x[b * QK_K + k];
                    }
                    acc += sub;
                }
            }
            y[g * PACK_ROWS + i] += acc;
        }
    }
}

/// [`scalar_f32`] of Q4_K records: per row and sub-block, the dequantized weights
/// (`d·sc·l − dmin·m`) dotted with `x` in column order, the sub-block sums added in order.
fn scalar_f32_q4k(rows: usize, cols: usize, body: &[u8], x: &[f32], y: &mut [f32]) {
    let nb = cols / QK_K;
    let rb = record_bytes(QuantType::Q4_K);
    for g in 0..rows / PACK_ROWS {
        for i in 0..PACK_ROWS {
            let mut acc = 0f32;
            for b in 0..nb {
                let rec = &body[(g * nb + b) * rb..(g * nb + b + 1) * rb];
                let (d, dmin) = (f16_at(rec, 2 * i), f16_at(rec, 2 * PACK_ROWS + 2 * i));
                for j in 0..8 {
                    let (sc, m) = q4k_scale_min(rec, i, j);
                    let (d1, m1) = (d * sc as f32, dmin * m as f32);
                    let mut blk = 0f32;
                    for k in 32 * j..32 * j + 32 {
                        let (at, hi) = weight_at(QuantType::Q4_K, i, k);
                        let l = if hi { rec[at] >> 4 } else { rec[at] & 0x0F };
                        blk += (d1 * l as f32 - m1) * x[b * QK_K + k];
                    }
                    acc += blk;
                }
            }
            y[g * PACK_ROWS + i] += acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use super::*;
    use core::arch::x86_64::*;

    /// The integer path, 16 rows per register: dispatches to the Q8_0 or Q4 kernel.
    ///
    /// # Safety
    /// AVX-512 F/BW/VNNI and F16C must be available; the slices must satisfy the lengths
    /// asserted by [`super::tile_matvec`] (`rows` a multiple of 16, `nb` blocks).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn run(
        q: QuantType,
        rows: usize,
        nb: usize,
        body: &[u8],
        xq: XqBlocks,
        y: &mut [f32],
    ) {
        let (d, s, xq) = xq;
        match q {
            QuantType::Q8_0 => run_q8(rows, nb, body, d, xq, y),
            QuantType::Q5_0 => {
                let mut stack = [0i32; crate::format::TILE_COLS / QK];
                let mut heap = Vec::new();
                let bias: &mut [i32] = if nb <= stack.len() {
                    &mut stack[..nb]
                } else {
                    heap.resize(nb, 0);
                    &mut heap
                };
                q5_bias(xq, bias);
                run_q5(rows, nb, body, d, bias, xq, y)
            }
            QuantType::Q4_1 => run_q4::<true>(rows, nb, body, d, s, xq, y),
            _ => run_q4::<false>(rows, nb, body, d, s, xq, y),
        }
    }

    /// [`super::tile_run_batch`]'s VNNI path: tokens in passes of up to [`BATCH`] (Q8_0: twice that).
    ///
    /// # Safety
    /// As [`run`], for every token's blocks; `ys` holds `xqs.len() · rows` outputs.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn run_batch(
        q: QuantType,
        rows: usize,
        nb: usize,
        body: &[u8],
        xqs: &[XqBlocks],
        ys: &mut [f32],
    ) {
        // Q8_0, once per call: every record's `128·Σ w` per row, and every token's unsigned
        // activation groups (`per` a token).
        let per = nb * QK / 4;
        let (wsum, xu, most) = if q == QuantType::Q8_0 {
            let mut xu = vec![0u32; xqs.len() * per];
            for (u, (_, _, x)) in xu.chunks_exact_mut(per).zip(xqs) {
                q8_unsigned(&x[..nb * QK], u);
            }
            (q8_weight_sums(rows, nb, body), xu, 2 * BATCH)
        } else {
            (Vec::new(), Vec::new(), BATCH)
        };
        let mut j = 0;
        while j < xqs.len() {
            let t = (xqs.len() - j).min(most);
            let xs = &xqs[j..j + t];
            let y = &mut ys[j * rows..(j + t) * rows];
            match (q, t) {
                (QuantType::Q5_0, _) => {
                    let mut bias = vec![0i32; t * nb];
                    for (i, (_, _, x)) in xs.iter().enumerate() {
                        q5_bias(x, &mut bias[i * nb..(i + 1) * nb]);
                    }
                    match t {
                        4 => run_q5_batch::<4>(rows, nb, body, xs, &bias, y),
                        3 => run_q5_batch::<3>(rows, nb, body, xs, &bias, y),
                        2 => run_q5_batch::<2>(rows, nb, body, xs, &bias, y),
                        _ => run_q5_batch::<1>(rows, nb, body, xs, &bias, y),
                    }
                }
                (QuantType::Q8_0, _) => {
                    let xu = &xu[j * per..(j + t) * per];
                    match t {
                        8 => run_q8_batch::<8>(rows, nb, body, xs, xu, &wsum, y),
                        7 => run_q8_batch::<7>(rows, nb, body, xs, xu, &wsum, y),
                        6 => run_q8_batch::<6>(rows, nb, body, xs, xu, &wsum, y),
                        5 => run_q8_batch::<5>(rows, nb, body, xs, xu, &wsum, y),
                        4 => run_q8_batch::<4>(rows, nb, body, xs, xu, &wsum, y),
                        3 => run_q8_batch::<3>(rows, nb, body, xs, xu, &wsum, y),
                        2 => run_q8_batch::<2>(rows, nb, body, xs, xu, &wsum, y),
                        _ => run_q8_batch::<1>(rows, nb, body, xs, xu, &wsum, y),
                    }
                }
                (QuantType::Q4_1, 4) => run_q4_batch::<true, 4>(rows, nb, body, xs, y),
                (QuantType::Q4_1, 3) => run_q4_batch::<true, 3>(rows, nb, body, xs, y),
                (QuantType::Q4_1, 2) => run_q4_batch::<true, 2>(rows, nb, body, xs, y),
                (QuantType::Q4_1, _) => run_q4_batch::<true, 1>(rows, nb, body, xs, y),
                (_, 4) => run_q4_batch::<false, 4>(rows, nb, body, xs, y),
                (_, 3) => run_q4_batch::<false, 3>(rows, nb, body, xs, y),
                (_, 2) => run_q4_batch::<false, 2>(rows, nb, body, xs, y),
                _ => run_q4_batch::<false, 1>(rows, nb, body, xs, y),
            }
            j += t;
        }
    }

    /// [`run_q4`] for `T` tokens at once: each record's four 64-byte loads are split into low
    /// and high nibbles once, then dotted with every token's activation. Per token the integer
    /// dot is the same exact sum and the float steps are [`run_q4`]'s, in its order.
    ///
    /// # Safety
    /// As [`run_batch`], with `xs.len() == T`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn run_q4_batch<const Q41: bool, const T: usize>(
        rows: usize,
        nb: usize,
        body: &[u8],
        xs: &[XqBlocks],
        y: &mut [f32],
    ) {
        let q = if Q41 {
            QuantType::Q4_1
        } else {
            QuantType::Q4_0
        };
        let (rb, rsb) = (record_bytes(q), record_scale_bytes(q));
        let m4 = _mm512_set1_epi8(0x0F);
        let mh = _mm512_set1_epi8(0xF0u8 as i8);
        let x4: [*const i32; T] = std::array::from_fn(|t| xs[t].2.as_ptr() as *const i32);
        for g in 0..rows / PACK_ROWS {
            let gp = body.as_ptr().add(g * nb * rb);
            let mut acc = [_mm512_setzero_ps(); T];
            for b in 0..nb {
                let rec = gp.add(b * rb);
                let qp = rec.add(rsb);
                let mut wl = [_mm512_setzero_si512(); 4];
                let mut wh = [_mm512_setzero_si512(); 4];
                for j in 0..4 {
                    let w = _mm512_loadu_si512(qp.add(64 * j) as *const _);
                    wl[j] = _mm512_and_si512(w, m4);
                    wh[j] = _mm512_and_si512(w, mh);
                }
                let dr = _mm512_cvtph_ps(_mm256_loadu_si256(rec as *const __m256i));
                let c = if Q41 {
                    _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(2 * PACK_ROWS) as *const __m256i))
                } else {
                    dr
                };
                for t in 0..T {
                    let xb = x4[t].add(b * QK / 4);
                    let mut lo = _mm512_setzero_si512();
                    let mut hi = _mm512_setzero_si512();
                    for j in 0..4 {
                        lo = _mm512_dpbusd_epi32(
                            lo,
                            wl[j],
                            _mm512_set1_epi32(xb.add(2 * j).read_unaligned()),
                        );
                        hi = _mm512_dpbusd_epi32(
                            hi,
                            wh[j],
                            _mm512_set1_epi32(xb.add(2 * j + 1).read_unaligned()),
                        );
                    }
                    let dot = _mm512_add_epi32(lo, _mm512_srai_epi32::<4>(hi));
                    let (d, s, _) = xs[t];
                    let (dx, sp) = block_consts(q, d, s, b);
                    acc[t] = q4_step::<Q41>(acc[t], dot, dr, c, dx, sp);
                }
            }
            add_group(&acc, y, rows, g);
        }
    }

    /// [`super::block_step`] for 16 rows of a Q4_0 (`Q41 = false`) or Q4_1 record.
    ///
    /// # Safety
    /// AVX-512 F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(in crate::kernels::dot) unsafe fn q4_step<const Q41: bool>(
        acc: __m512,
        dot: __m512i,
        dr: __m512,
        c: __m512,
        dx: f32,
        sp: f32,
    ) -> __m512 {
        let dot = _mm512_cvtepi32_ps(dot);
        if Q41 {
            let acc = _mm512_fmadd_ps(dot, _mm512_mul_ps(dr, _mm512_set1_ps(dx)), acc);
            _mm512_fmadd_ps(c, _mm512_set1_ps(sp), acc)
        } else {
            let t = _mm512_fmadd_ps(dot, _mm512_set1_ps(dx), _mm512_set1_ps(sp));
            _mm512_fmadd_ps(dr, t, acc)
        }
    }

    /// Adds a 16-row group's results for every token: `y[t·rows + 16g ..][..16] += acc[t]`.
    ///
    /// # Safety
    /// AVX-512 F; `y` holds `T · rows` values and `16g + 16 <= rows`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn add_group<const T: usize>(acc: &[__m512; T], y: &mut [f32], rows: usize, g: usize) {
        debug_assert!((g + 1) * PACK_ROWS <= rows && T * rows <= y.len());
        for (t, a) in acc.iter().enumerate() {
            let yp = y.as_mut_ptr().add(t * rows + g * PACK_ROWS);
            _mm512_storeu_ps(yp, _mm512_add_ps(_mm512_loadu_ps(yp), *a));
        }
    }

    /// The activation's 4-byte groups with each byte + 128 (xor 0x80): Q8_0's unsigned operand.
    fn q8_unsigned(xq: &[i8], xu: &mut [u32]) {
        for (u, c) in xu.iter_mut().zip(xq.chunks_exact(4)) {
            *u = u32::from_le_bytes([c[0] as u8, c[1] as u8, c[2] as u8, c[3] as u8]) ^ 0x8080_8080;
        }
    }

    /// Every Q8_0 record's `128·Σ w` per row (16 per record, records in body order): the term
    /// [`run_q8`] subtracts, which does not depend on the token.
    ///
    /// # Safety
    /// As [`run_batch`] for a Q8_0 body.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn q8_weight_sums(rows: usize, nb: usize, body: &[u8]) -> Vec<i32> {
        let q = QuantType::Q8_0;
        let (rb, rsb) = (record_bytes(q), record_scale_bytes(q));
        let bias = _mm512_set1_epi8(-128);
        let n = rows / PACK_ROWS * nb;
        let mut out = vec![0i32; n * PACK_ROWS];
        for r in 0..n {
            let qp = body.as_ptr().add(r * rb + rsb);
            let mut s = [_mm512_setzero_si512(); 2];
            for j in 0..8 {
                let w = _mm512_loadu_si512(qp.add(64 * j) as *const _);
                s[j & 1] = _mm512_dpbusd_epi32(s[j & 1], bias, w);
            }
            let s = _mm512_add_epi32(s[0], s[1]);
            _mm512_storeu_si512(out.as_mut_ptr().add(r * PACK_ROWS) as *mut _, s);
        }
        out
    }

    /// [`run_q8`] for `T` tokens at once: each chunk is loaded once, and `128·Σ w`, which does
    /// not depend on the token, is taken from `wsum` ([`q8_weight_sums`], made once per batch)
    /// instead of being summed per token. Per token the integer dot is the same exact sum and
    /// the float steps are [`run_q8`]'s, in its order.
    ///
    /// # Safety
    /// As [`run_batch`], with `xs.len() == T`, `xu` holding each token's [`q8_unsigned`]
    /// groups (`nb · 8` per token, token-major) and `wsum` this body's weight sums.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn run_q8_batch<const T: usize>(
        rows: usize,
        nb: usize,
        body: &[u8],
        xs: &[XqBlocks],
        xu: &[u32],
        wsum: &[i32],
        y: &mut [f32],
    ) {
        let q = QuantType::Q8_0;
        let (rb, rsb) = (record_bytes(q), record_scale_bytes(q));
        let per = nb * QK / 4;
        assert!(
            wsum.len() >= rows / PACK_ROWS * nb * PACK_ROWS,
            "weight sums"
        );
        for g in 0..rows / PACK_ROWS {
            let gp = body.as_ptr().add(g * nb * rb);
            let mut acc = [_mm512_setzero_ps(); T];
            for b in 0..nb {
                let rec = gp.add(b * rb);
                let qp = rec.add(rsb);
                let mut sx = [_mm512_setzero_si512(); T];
                for j in 0..8 {
                    let w = _mm512_loadu_si512(qp.add(64 * j) as *const _);
                    for (t, s) in sx.iter_mut().enumerate() {
                        let u = _mm512_set1_epi32(*xu.get_unchecked(t * per + b * 8 + j) as i32);
                        *s = _mm512_dpbusd_epi32(*s, u, w);
                    }
                }
                let wsum =
                    _mm512_loadu_si512(wsum.as_ptr().add((g * nb + b) * PACK_ROWS) as *const _);
                let dr = _mm512_cvtph_ps(_mm256_loadu_si256(rec as *const __m256i));
                for t in 0..T {
                    let dot = _mm512_sub_epi32(sx[t], wsum);
                    let dd = _mm512_mul_ps(dr, _mm512_set1_ps(xs[t].0[b]));
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), dd, acc[t]);
                }
            }
            add_group(&acc, y, rows, g);
        }
    }

    /// Q8_0 records: `Σ w·x = Σ w·(x + 128) − 128·Σ w`, with `x + 128` (the unsigned operand)
    /// made once per call rather than once per record.
    ///
    /// # Safety
    /// As [`run`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn run_q8(rows: usize, nb: usize, body: &[u8], d: &[f32], xq: &[i8], y: &mut [f32]) {
        let q = QuantType::Q8_0;
        let (rb, rsb) = (record_bytes(q), record_scale_bytes(q));
        // The activation's 4-byte groups with each byte + 128 (xor 0x80), for every block.
        // (On the stack for the file's tiles, at most 256 columns wide.)
        let mut stack = [0u32; crate::format::TILE_COLS / 4];
        let mut heap = Vec::new();
        let xu: &mut [u32] = if nb * QK / 4 <= stack.len() {
            &mut stack[..nb * QK / 4]
        } else {
            heap.resize(nb * QK / 4, 0);
            &mut heap
        };
        q8_unsigned(&xq[..nb * QK], xu);
        let bias = _mm512_set1_epi8(-128);
        let pf = crate::kernels::prefetch::repacked();
        for g in 0..rows / PACK_ROWS {
            let gp = body.as_ptr().add(g * nb * rb);
            let mut acc = _mm512_setzero_ps();
            for b in 0..nb {
                let rec = gp.add(b * rb);
                if pf {
                    crate::kernels::dot::simd::prefetch_ahead(rec, rb);
                }
                let qp = rec.add(rsb);
                let mut i = [_mm512_setzero_si512(); 4];
                for j in 0..8 {
                    let w = _mm512_loadu_si512(qp.add(64 * j) as *const _);
                    let xu = _mm512_set1_epi32(xu[b * 8 + j] as i32);
                    let k = 2 * (j & 1);
                    i[k] = _mm512_dpbusd_epi32(i[k], xu, w);
                    i[k + 1] = _mm512_dpbusd_epi32(i[k + 1], bias, w);
                }
                let dot =
                    _mm512_sub_epi32(_mm512_add_epi32(i[0], i[2]), _mm512_add_epi32(i[1], i[3]));
                let dr = _mm512_cvtph_ps(_mm256_loadu_si256(rec as *const __m256i));
                let dd = _mm512_mul_ps(dr, _mm512_set1_ps(d[b]));
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), dd, acc);
            }
            let yp = y.as_mut_ptr().add(g * PACK_ROWS);
            _mm512_storeu_ps(yp, _mm512_add_ps(_mm512_loadu_ps(yp), acc));
        }
    }

    /// The 16 rows' exact `Σ u·q` over 32 weights held as 4 nibble chunks at `qp` (weights
    /// `8c + p` low, `8c + 4 + p` high), against the 32 activation bytes at `xb`: four independent
    /// sums (low nibbles of chunks 0/2 and 1/3, high nibbles × 16 of chunks 0/2 and 1/3), the
    /// high ones shifted back once.
    ///
    /// # Safety
    /// AVX-512 F/BW/VNNI; `qp` holds 256 readable bytes, `xb` 32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn nibble_dot32(qp: *const u8, xb: *const i32) -> __m512i {
        let m4 = _mm512_set1_epi8(0x0F);
        let mh = _mm512_set1_epi8(0xF0u8 as i8);
        let mut lo = [_mm512_setzero_si512(); 2];
        let mut hi = [_mm512_setzero_si512(); 2];
        for c in 0..4 {
            let w = _mm512_loadu_si512(qp.add(64 * c) as *const _);
            let k = c & 1;
            lo[k] = _mm512_dpbusd_epi32(
                lo[k],
                _mm512_and_si512(w, m4),
                _mm512_set1_epi32(xb.add(2 * c).read_unaligned()),
            );
            hi[k] = _mm512_dpbusd_epi32(
                hi[k],
                _mm512_and_si512(w, mh),
                _mm512_set1_epi32(xb.add(2 * c + 1).read_unaligned()),
            );
        }
        _mm512_add_epi32(
            _mm512_add_epi32(lo[0], lo[1]),
            _mm512_srai_epi32::<4>(_mm512_add_epi32(hi[0], hi[1])),
        )
    }

    /// Q4_K records against Q8_K blocks (see the module docs): per sub-block two `vpdpbusd`
    /// chains (low nibbles; high nibbles in place, × 16), then `sc_j`/`m_j` out of the scale
    /// vectors and the i32 products `T += sc_j·S_j`, `M += m_j·X_j`.
    ///
    /// # Safety
    /// As [`run`], for [`super::tile_run_k`]'s asserted lengths.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn run_q4k(rows: usize, nb: usize, body: &[u8], xk: Q8KRef, y: &mut [f32]) {
        use crate::quant::packed::{Q4K_HI, Q4K_M_LO, Q4K_SC_LO};
        let q = QuantType::Q4_K;
        let (rb, rsb) = (record_bytes(q), record_scale_bytes(q));
        let (f4, f2) = (_mm512_set1_epi32(0xF), _mm512_set1_epi32(3));
        let x4 = xk.qs.as_ptr() as *const i32;
        let pf = crate::kernels::prefetch::repacked();
        for g in 0..rows / PACK_ROWS {
            let gp = body.as_ptr().add(g * nb * rb);
            let mut acc = _mm512_setzero_ps();
            for b in 0..nb {
                let rec = gp.add(b * rb);
                let qp = rec.add(rsb);
                let sl = _mm512_loadu_si512(rec.add(Q4K_SC_LO) as *const _);
                let ml = _mm512_loadu_si512(rec.add(Q4K_M_LO) as *const _);
                let hi2 = _mm512_loadu_si512(rec.add(Q4K_HI) as *const _);
                let mut t = _mm512_setzero_si512();
                let mut m = _mm512_setzero_si512();
                for j in 0..8 {
                    if pf {
                        crate::kernels::dot::simd::prefetch_ahead(qp.add(256 * j), 256);
                    }
                    let dot = nibble_dot32(qp.add(256 * j), x4.add(b * QK_K / 4 + 8 * j));
                    let (s4, s2) = (
                        _mm512_set1_epi32(4 * j as i32),
                        _mm512_set1_epi32(2 * j as i32),
                    );
                    let sc = _mm512_or_si512(
                        _mm512_and_si512(_mm512_srlv_epi32(sl, s4), f4),
                        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srlv_epi32(hi2, s2), f2)),
                    );
                    let mn = _mm512_or_si512(
                        _mm512_and_si512(_mm512_srlv_epi32(ml, s4), f4),
                        _mm512_slli_epi32::<4>(_mm512_and_si512(
                            _mm512_srlv_epi32(hi2, _mm512_set1_epi32(16 + 2 * j as i32)),
                            f2,
                        )),
                    );
                    let xs = *xk.bsums.get_unchecked(16 * b + 2 * j) as i32
                        + *xk.bsums.get_unchecked(16 * b + 2 * j + 1) as i32;
                    t = _mm512_add_epi32(t, _mm512_mullo_epi32(dot, sc));
                    m = _mm512_add_epi32(m, _mm512_mullo_epi32(mn, _mm512_set1_epi32(xs)));
                }
                let dx = _mm512_set1_ps(*xk.d.get_unchecked(b));
                let dr = _mm512_cvtph_ps(_mm256_loadu_si256(rec as *const __m256i));
                let dm =
                    _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(2 * PACK_ROWS) as *const __m256i));
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(dr, dx), acc);
                acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(dm, dx), acc);
            }
            let yp = y.as_mut_ptr().add(g * PACK_ROWS);
            _mm512_storeu_ps(yp, _mm512_add_ps(_mm512_loadu_ps(yp), acc));
        }
    }

    /// [`super::tile_run_k_batch`]'s VNNI path (Q4_K or Q6_K records `q`): tokens in passes of
    /// up to [`BATCH`].
    ///
    /// # Safety
    /// As [`run_q4k`], for every token's blocks; `ys` holds `xks.len() · rows` outputs.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn run_k_batch(
        q: QuantType,
        rows: usize,
        nb: usize,
        body: &[u8],
        xks: &[Q8KRef],
        ys: &mut [f32],
    ) {
        let mut j = 0;
        while j < xks.len() {
            let t = (xks.len() - j).min(BATCH);
            let (xs, y) = (&xks[j..j + t], &mut ys[j * rows..(j + t) * rows]);
            match (q, t) {
                (QuantType::Q6_K, 4) => run_q6k_t::<4>(rows, nb, body, xs, y),
                (QuantType::Q6_K, 3) => run_q6k_t::<3>(rows, nb, body, xs, y),
                (QuantType::Q6_K, 2) => run_q6k_t::<2>(rows, nb, body, xs, y),
                (QuantType::Q6_K, _) => run_q6k_t::<1>(rows, nb, body, xs, y),
                (_, 4) => run_q4k_t::<4>(rows, nb, body, xs, y),
                (_, 3) => run_q4k_t::<3>(rows, nb, body, xs, y),
                (_, 2) => run_q4k_t::<2>(rows, nb, body, xs, y),
                _ => run_q4k_t::<1>(rows, nb, body, xs, y),
            }
            j += t;
        }
    }

    /// [`run_q4k`] for `T` tokens at once: per sub-block the four chunks are split into low and
    /// high nibbles and the 16 rows' `sc_j`, `m_j` taken out once, then dotted with every
    /// token's activation. Per token `T`, `M` are the same exact i32 sums and the float steps
    /// are [`run_q4k`]'s, in its order.
    ///
    /// # Safety
    /// As [`run_q4k_batch`], with `xs.len() == T`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn run_q4k_t<const T: usize>(
        rows: usize,
        nb: usize,
        body: &[u8],
        xs: &[Q8KRef],
        y: &mut [f32],
    ) {
        use crate::quant::packed::{Q4K_HI, Q4K_M_LO, Q4K_SC_LO};
        let q = QuantType::Q4_K;
        let (rb, rsb) = (record_bytes(q), record_scale_bytes(q));
        let (f4, f2) = (_mm512_set1_epi32(0xF), _mm512_set1_epi32(3));
        let m4 = _mm512_set1_epi8(0x0F);
        let mh = _mm512_set1_epi8(0xF0u8 as i8);
        let x4: [*const i32; T] = std::array::from_fn(|t| xs[t].qs.as_ptr() as *const i32);
        for g in 0..rows / PACK_ROWS {
            let gp = body.as_ptr().add(g * nb * rb);
            let mut acc = [_mm512_setzero_ps(); T];
            for b in 0..nb {
                let rec = gp.add(b * rb);
                let qp = rec.add(rsb);
                let sl = _mm512_loadu_si512(rec.add(Q4K_SC_LO) as *const _);
                let ml = _mm512_loadu_si512(rec.add(Q4K_M_LO) as *const _);
                let hi2 = _mm512_loadu_si512(rec.add(Q4K_HI) as *const _);
                let mut ti = [_mm512_setzero_si512(); T];
                let mut mi = [_mm512_setzero_si512(); T];
                for j in 0..8 {
                    let (s4, s2) = (
                        _mm512_set1_epi32(4 * j as i32),
                        _mm512_set1_epi32(2 * j as i32),
                    );
                    let sc = _mm512_or_si512(
                        _mm512_and_si512(_mm512_srlv_epi32(sl, s4), f4),
                        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srlv_epi32(hi2, s2), f2)),
                    );
                    let mn = _mm512_or_si512(
                        _mm512_and_si512(_mm512_srlv_epi32(ml, s4), f4),
                        _mm512_slli_epi32::<4>(_mm512_and_si512(
                            _mm512_srlv_epi32(hi2, _mm512_set1_epi32(16 + 2 * j as i32)),
                            f2,
                        )),
                    );
                    let mut wl = [_mm512_setzero_si512(); 4];
                    let mut wh = [_mm512_setzero_si512(); 4];
                    for c in 0..4 {
                        let w = _mm512_loadu_si512(qp.add(256 * j + 64 * c) as *const _);
                        wl[c] = _mm512_and_si512(w, m4);
                        wh[c] = _mm512_and_si512(w, mh);
                    }
                    for t in 0..T {
                        let xb = x4[t].add(b * QK_K / 4 + 8 * j);
                        let mut lo = _mm512_setzero_si512();
                        let mut hi = _mm512_setzero_si512();
                        for c in 0..4 {
                            lo = _mm512_dpbusd_epi32(
                                lo,
                                wl[c],
                                _mm512_set1_epi32(xb.add(2 * c).read_unaligned()),
                            );
                            hi = _mm512_dpbusd_epi32(
                                hi,
                                wh[c],
                                _mm512_set1_epi32(xb.add(2 * c + 1).read_unaligned()),
                            );
                        }
                        let dot = _mm512_add_epi32(lo, _mm512_srai_epi32::<4>(hi));
                        let bs = xs[t].bsums;
                        let x = *bs.get_unchecked(16 * b + 2 * j) as i32
                            + *bs.get_unchecked(16 * b + 2 * j + 1) as i32;
                        ti[t] = _mm512_add_epi32(ti[t], _mm512_mullo_epi32(dot, sc));
                        mi[t] =
                            _mm512_add_epi32(mi[t], _mm512_mullo_epi32(mn, _mm512_set1_epi32(x)));
                    }
                }
                let dr = _mm512_cvtph_ps(_mm256_loadu_si256(rec as *const __m256i));
                let dm =
                    _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(2 * PACK_ROWS) as *const __m256i));
                for t in 0..T {
                    let dx = _mm512_set1_ps(*xs[t].d.get_unchecked(b));
                    acc[t] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(ti[t]), _mm512_mul_ps(dr, dx), acc[t]);
                    acc[t] =
                        _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi[t]), _mm512_mul_ps(dm, dx), acc[t]);
                }
            }
            add_group(&acc, y, rows, g);
        }
    }

    /// Q6_K records against Q8_K blocks for `T` tokens at once (`T = 1` in decode): per
    /// sub-block `g` of 16 weights, its two chunks' 6-bit levels are made once (the nibbles
    /// split, then 16 and 32 added under the record's bit-4 and bit-5 masks) and the 16 rows'
    /// `sc_g` widened from their 16 bytes; per token, four `vpdpbusd` start from `−32·X_g` (`X_g`
    /// the activation's sum over the sub-block, its `bsums[g]`), so each lane holds its row's
    /// exact `Σ (l − 32)·q`, and `T += sc_g · that` (`vpmulld`). Then `acc = fma(T, d·d_x, acc)`.
    ///
    /// # Safety
    /// As [`run_k_batch`], with `xs.len() == T`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn run_q6k_t<const T: usize>(
        rows: usize,
        nb: usize,
        body: &[u8],
        xs: &[Q8KRef],
        y: &mut [f32],
    ) {
        use crate::quant::packed::{q6k_group, Q6K_CHUNKS, Q6K_SC};
        let rb = record_bytes(QuantType::Q6_K);
        let m4 = _mm512_set1_epi8(0x0F);
        let (c16, c32) = (_mm512_set1_epi8(16), _mm512_set1_epi8(32));
        let x4: [*const i32; T] = std::array::from_fn(|t| xs[t].qs.as_ptr() as *const i32);
        for g in 0..rows / PACK_ROWS {
            let gp = body.as_ptr().add(g * nb * rb);
            let mut acc = [_mm512_setzero_ps(); T];
            for b in 0..nb {
                let rec = gp.add(b * rb);
                let mut ti = [_mm512_setzero_si512(); T];
                for j in 0..16 {
                    let grp = rec.add(q6k_group(j));
                    let mut lv = [_mm512_setzero_si512(); 4];
                    for h in 0..2 {
                        let w = _mm512_loadu_si512(grp.add(Q6K_CHUNKS + 64 * h) as *const _);
                        let lo = _mm512_and_si512(w, m4);
                        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4);
                        let m = (grp as *const u64).add(4 * h);
                        let lo = _mm512_mask_add_epi8(lo, m.read_unaligned(), lo, c16);
                        let lo = _mm512_mask_add_epi8(lo, m.add(1).read_unaligned(), lo, c32);
                        let hi = _mm512_mask_add_epi8(hi, m.add(2).read_unaligned(), hi, c16);
                        let hi = _mm512_mask_add_epi8(hi, m.add(3).read_unaligned(), hi, c32);
                        (lv[2 * h], lv[2 * h + 1]) = (lo, hi);
                    }
                    let sc =
                        _mm512_cvtepi8_epi32(_mm_loadu_si128(grp.add(Q6K_SC) as *const __m128i));
                    for t in 0..T {
                        let xb = x4[t].add(b * QK_K / 4 + 4 * j);
                        let bias = -32 * *xs[t].bsums.get_unchecked(16 * b + j) as i32;
                        let mut s = [_mm512_set1_epi32(bias), _mm512_setzero_si512()];
                        for (k, l) in lv.iter().enumerate() {
                            s[k & 1] = _mm512_dpbusd_epi32(
                                s[k & 1],
                                *l,
                                _mm512_set1_epi32(xb.add(k).read_unaligned()),
                            );
                        }
                        let dot = _mm512_add_epi32(s[0], s[1]);
                        ti[t] = _mm512_add_epi32(ti[t], _mm512_mullo_epi32(dot, sc));
                    }
                }
                let dr = _mm512_cvtph_ps(_mm256_loadu_si256(rec as *const __m256i));
                for t in 0..T {
                    let dx = _mm512_set1_ps(*xs[t].d.get_unchecked(b));
                    acc[t] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(ti[t]), _mm512_mul_ps(dr, dx), acc[t]);
                }
            }
            add_group(&acc, y, rows, g);
        }
    }

    /// `bias[b] = −16 · Σ q` over activation block `b`: where a Q5_0 block's integer sums start.
    /// Inlined into its VNNI callers so that the sums are built with their vector instructions
    /// (out of line it was a baseline-SSE2 loop: 1.6 % of SmolLM2 Q4_K_M decode's samples).
    #[inline(always)]
    fn q5_bias(xq: &[i8], bias: &mut [i32]) {
        for (b, x) in bias.iter_mut().zip(xq.chunks_exact(QK)) {
            *b = -16 * x.iter().map(|&v| v as i32).sum::<i32>();
        }
    }

    /// One chunk of a Q5_0 record as its two halves of 5-bit levels: the low nibbles (weights
    /// `8j + p`) and the high ones (`8j + 4 + p`), each plus 16 where its mask has the bit.
    ///
    /// # Safety
    /// `qp` points at the record's chunk `j` and `mp` at its masks (`quant::packed`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn q5_levels(qp: *const u8, mp: *const u64, j: usize) -> (__m512i, __m512i) {
        let m4 = _mm512_set1_epi8(0x0F);
        let c16 = _mm512_set1_epi8(16);
        let w = _mm512_loadu_si512(qp.add(64 * j) as *const _);
        let lo = _mm512_and_si512(w, m4);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4);
        (
            _mm512_mask_add_epi8(lo, mp.add(2 * j).read_unaligned(), lo, c16),
            _mm512_mask_add_epi8(hi, mp.add(2 * j + 1).read_unaligned(), hi, c16),
        )
    }

    /// Q5_0 records (see the module docs): per chunk two `vpdpbusd` on the 5-bit levels,
    /// starting from the block's `bias` (`−16·Σq`), so each lane's sum is its row's exact
    /// `Σ (l − 16)·q`.
    ///
    /// # Safety
    /// As [`run`]; `bias` holds `nb` entries.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn run_q5(
        rows: usize,
        nb: usize,
        body: &[u8],
        d: &[f32],
        bias: &[i32],
        xq: &[i8],
        y: &mut [f32],
    ) {
        let q = QuantType::Q5_0;
        let (rb, rsb) = (record_bytes(q), record_scale_bytes(q));
        let x4 = xq.as_ptr() as *const i32;
        let pf = crate::kernels::prefetch::repacked();
        for g in 0..rows / PACK_ROWS {
            let gp = body.as_ptr().add(g * nb * rb);
            let mut acc = _mm512_setzero_ps();
            for b in 0..nb {
                let rec = gp.add(b * rb);
                if pf {
                    crate::kernels::dot::simd::prefetch_ahead(rec, rb);
                }
                let (qp, mp) = (rec.add(rsb), rec.add(2 * PACK_ROWS) as *const u64);
                let xb = x4.add(b * QK / 4);
                let mut s = [_mm512_set1_epi32(bias[b]), _mm512_setzero_si512()];
                for j in 0..4 {
                    let (lo, hi) = q5_levels(qp, mp, j);
                    s[0] = _mm512_dpbusd_epi32(
                        s[0],
                        lo,
                        _mm512_set1_epi32(xb.add(2 * j).read_unaligned()),
                    );
                    s[1] = _mm512_dpbusd_epi32(
                        s[1],
                        hi,
                        _mm512_set1_epi32(xb.add(2 * j + 1).read_unaligned()),
                    );
                }
                let dot = _mm512_add_epi32(s[0], s[1]);
                let dr = _mm512_cvtph_ps(_mm256_loadu_si256(rec as *const __m256i));
                let dd = _mm512_mul_ps(dr, _mm512_set1_ps(d[b]));
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), dd, acc);
            }
            let yp = y.as_mut_ptr().add(g * PACK_ROWS);
            _mm512_storeu_ps(yp, _mm512_add_ps(_mm512_loadu_ps(yp), acc));
        }
    }

    /// [`run_q5`] for `T` tokens at once: each record's levels are made once, then dotted with
    /// every token's activation; per token the same exact sums and float steps in its order.
    ///
    /// # Safety
    /// As [`run_batch`], with `xs.len() == T` and `bias` holding `T · nb` entries (token-major).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn run_q5_batch<const T: usize>(
        rows: usize,
        nb: usize,
        body: &[u8],
        xs: &[XqBlocks],
        bias: &[i32],
        y: &mut [f32],
    ) {
        let q = QuantType::Q5_0;
        let (rb, rsb) = (record_bytes(q), record_scale_bytes(q));
        let x4: [*const i32; T] = std::array::from_fn(|t| xs[t].2.as_ptr() as *const i32);
        for g in 0..rows / PACK_ROWS {
            let gp = body.as_ptr().add(g * nb * rb);
            let mut acc = [_mm512_setzero_ps(); T];
            for b in 0..nb {
                let rec = gp.add(b * rb);
                let (qp, mp) = (rec.add(rsb), rec.add(2 * PACK_ROWS) as *const u64);
                let mut lo = [_mm512_setzero_si512(); 4];
                let mut hi = [_mm512_setzero_si512(); 4];
                for j in 0..4 {
                    (lo[j], hi[j]) = q5_levels(qp, mp, j);
                }
                let dr = _mm512_cvtph_ps(_mm256_loadu_si256(rec as *const __m256i));
                for t in 0..T {
                    let xb = x4[t].add(b * QK / 4);
                    let mut s = [_mm512_set1_epi32(bias[t * nb + b]), _mm512_setzero_si512()];
                    for j in 0..4 {
                        s[0] = _mm512_dpbusd_epi32(
                            s[0],
                            lo[j],
                            _mm512_set1_epi32(xb.add(2 * j).read_unaligned()),
                        );
                        s[1] = _mm512_dpbusd_epi32(
                            s[1],
                            hi[j],
                            _mm512_set1_epi32(xb.add(2 * j + 1).read_unaligned()),
                        );
                    }
                    let dot = _mm512_add_epi32(s[0], s[1]);
                    let dd = _mm512_mul_ps(dr, _mm512_set1_ps(xs[t].0[b]));
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), dd, acc[t]);
                }
            }
            add_group(&acc, y, rows, g);
        }
    }

    /// Q4_0 (`Q41 = false`) and Q4_1 records. The high nibbles enter `vpdpbusd` in place
    /// (`w & 0xF0`, 16 × the nibble): their sum is 16 × the nibbles' sum exactly, and one shift
    /// per block recovers it, instead of a shift per load.
    ///
    /// # Safety
    /// As [`run`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn run_q4<const Q41: bool>(
        rows: usize,
        nb: usize,
        body: &[u8],
        d: &[f32],
        s: &[f32],
        xq: &[i8],
        y: &mut [f32],
    ) {
        let q = if Q41 {
            QuantType::Q4_1
        } else {
            QuantType::Q4_0
        };
        let (rb, rsb) = (record_bytes(q), record_scale_bytes(q));
        let x4 = xq.as_ptr() as *const i32;
        let pf = crate::kernels::prefetch::repacked();
        for g in 0..rows / PACK_ROWS {
            let gp = body.as_ptr().add(g * nb * rb);
            let mut acc = _mm512_setzero_ps();
            for b in 0..nb {
                let rec = gp.add(b * rb);
                if pf {
                    crate::kernels::dot::simd::prefetch_ahead(rec, rb);
                }
                let qp = rec.add(rsb);
                let dot = nibble_dot32(qp, x4.add(b * QK / 4));
                let (dx, sp) = block_consts(q, d, s, b);
                let dr = _mm512_cvtph_ps(_mm256_loadu_si256(rec as *const __m256i));
                let c = if Q41 {
                    _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(2 * PACK_ROWS) as *const __m256i))
                } else {
                    dr
                };
                acc = q4_step::<Q41>(acc, dot, dr, c, dx, sp);
            }
            let yp = y.as_mut_ptr().add(g * PACK_ROWS);
            _mm512_storeu_ps(yp, _mm512_add_ps(_mm512_loadu_ps(yp), acc));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use core::arch::x86_64::*;

    /// The integer path, each record as two 8-row halves.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available; the slices must satisfy the lengths asserted by
    /// [`super::tile_matvec`] (`rows` a multiple of 16, `nb` blocks).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn run(
        q: QuantType,
        rows: usize,
        nb: usize,
        body: &[u8],
        xq: XqBlocks,
        y: &mut [f32],
    ) {
        let (d, s, xq) = xq;
        let (rb, rsb) = (record_bytes(q), record_scale_bytes(q));
        let m4 = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let x4 = xq.as_ptr() as *const i32;
        for g in 0..rows / PACK_ROWS {
            let gp = body.as_ptr().add(g * nb * rb);
            let mut acc = [_mm256_setzero_ps(); 2];
            for b in 0..nb {
                let rec = gp.add(b * rb);
                let qp = rec.add(rsb);
                let xb = x4.add(b * QK / 4);
                let (dx, sp) = block_consts(q, d, s, b);
                if q == QuantType::Q8_0 {
                    for (h, a) in acc.iter_mut().enumerate() {
                        // |w|·sign(x, w) pairs: at most 2 · 128 · 127 in i16, widened per chunk.
                        let mut dot = [_mm256_setzero_si256(); 2];
                        for j in 0..8 {
                            let w = _mm256_loadu_si256(qp.add(64 * j + 32 * h) as *const __m256i);
                            let x = _mm256_set1_epi32(xb.add(j).read_unaligned());
                            let p =
                                _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
                            dot[j & 1] = _mm256_add_epi32(dot[j & 1], _mm256_madd_epi16(p, ones));
                        }
                        let dot = _mm256_add_epi32(dot[0], dot[1]);
                        let dr =
                            _mm256_cvtph_ps(_mm_loadu_si128(rec.add(16 * h) as *const __m128i));
                        let dd = _mm256_mul_ps(dr, _mm256_set1_ps(dx));
                        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), dd, *a);
                    }
                    continue;
                }
                for (h, a) in acc.iter_mut().enumerate() {
                    // i16 partial sums: 16 products of at most 15 × 128 each, no saturation.
                    let mut s16 = [_mm256_setzero_si256(); 2];
                    for j in 0..4 {
                        let w = _mm256_loadu_si256(qp.add(64 * j + 32 * h) as *const __m256i);
                        let lo = _mm256_and_si256(w, m4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4);
                        let xl = _mm256_set1_epi32(xb.add(2 * j).read_unaligned());
                        let xh = _mm256_set1_epi32(xb.add(2 * j + 1).read_unaligned());
                        s16[0] = _mm256_add_epi16(s16[0], _mm256_maddubs_epi16(lo, xl));
                        s16[1] = _mm256_add_epi16(s16[1], _mm256_maddubs_epi16(hi, xh));
                    }
                    let dot = _mm256_madd_epi16(_mm256_add_epi16(s16[0], s16[1]), ones);
                    let dr = _mm256_cvtph_ps(_mm_loadu_si128(rec.add(16 * h) as *const __m128i));
                    let c = if q == QuantType::Q4_0 {
                        dr
                    } else {
                        _mm256_cvtph_ps(_mm_loadu_si128(
                            rec.add(2 * PACK_ROWS + 16 * h) as *const __m128i
                        ))
                    };
                    let dot = _mm256_cvtepi32_ps(dot);
                    *a = if q == QuantType::Q4_0 {
                        let t = _mm256_fmadd_ps(dot, _mm256_set1_ps(dx), _mm256_set1_ps(sp));
                        _mm256_fmadd_ps(dr, t, *a)
                    } else {
                        let dd = _mm256_mul_ps(dr, _mm256_set1_ps(dx));
                        _mm256_fmadd_ps(c, _mm256_set1_ps(sp), _mm256_fmadd_ps(dot, dd, *a))
                    };
                }
            }
            for (h, a) in acc.iter().enumerate() {
                let yp = y.as_mut_ptr().add(g * PACK_ROWS + 8 * h);
                _mm256_storeu_ps(yp, _mm256_add_ps(_mm256_loadu_ps(yp), *a));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dot::Q8Act;
    #[allow(unused_imports)]
    use crate::kernels::dot::Tile;
    use crate::quant::packed::pack_tile;

    /// A repacked tile of `rows × cols` random weights and its split twin `(scales, qs)`.
    fn tile(q: QuantType, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let mut rng = crate::rng::Rng::new(seed);
        let w = rng.fill(rows * cols, 1.0);
        let (mut sc, mut qs) = (Vec::new(), Vec::new());
        for r in 0..rows {
            crate::quant::quantize_row(q, &w[r * cols..(r + 1) * cols], &mut sc, &mut qs);
        }
        let mut body = [sc.clone(), qs.clone()].concat();
        pack_tile(q, rows, cols, &mut body);
        (body, sc, qs)
    }

    /// The ISAs this CPU has, for the bit-identity tests (each one it lacks printed as a SKIP).
    fn isas(q: QuantType) -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|isa| {
                let ok = isa.available();
                if !ok {
                    println!("SKIP {q} {isa:?}: this CPU lacks it");
                }
                ok
            })
            .collect()
    }

    /// `got` equals `want` bit for bit.
    fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(got), bits(want), "{what}");
    }

    fn act(cols: usize, seed: u64) -> (Vec<f32>, Q8Act) {
        let mut rng = crate::rng::Rng::new(seed);
        let x = rng.fill(cols, 1.0);
        let mut a = Q8Act::default();
        crate::kernels::dot::act_q8::scalar::quantize_act(&x, &mut a);
        (x, a)
    }

    /// Every ISA this CPU has gives the scalar reference's bits, for both types, several
    /// shapes (one to eight records per group row), and accumulates into `y`.
    #[test]
    fn every_isa_equals_the_scalar_reference_bit_for_bit() {
        for q in [
            QuantType::Q4_0,
            QuantType::Q4_1,
            QuantType::Q8_0,
            QuantType::Q5_0,
        ] {
            for (rows, cols) in [
                (16, 32),
                (128, 256),
                (64, 64),
                (32, 224),
                (48, 96),
                (80, 576),
            ] {
                let (body, _, _) = tile(q, rows, cols, (rows + cols) as u64);
                let (_, a) = act(cols, 3);
                let xq = (&a.d[..], &a.s[..], &a.qs[..]);
                let y0: Vec<f32> = (0..rows).map(|r| r as f32 * 0.25 - 3.0).collect();
                let mut want = y0.clone();
                scalar_int(q, rows, cols / QK, &body, (&a.d, &a.s, &a.qs), &mut want);
                for isa in isas(q) {
                    let mut y = y0.clone();
                    tile_matvec(isa, Tile::body(q, rows, cols, &body), &[], Some(xq), &mut y);
                    let what = format!("{q} {rows}×{cols} {isa:?} (VNNI {})", isa.has_vnni());
                    assert_same_bits(&y, &want, &what);
                }
            }
        }
    }

    /// Q4_K and Q6_K records: every ISA gives the scalar reference's bits ([`scalar_int_q4k`],
    /// [`scalar_int_q6k`]); that reference agrees with the file layout's scalar K-quant kernel to
    /// float rounding, and the f32 path with a float64 dot of the dequantized weights.
    #[test]
    fn k_records_equal_their_reference_and_the_file_layout() {
        for (q, (rows, cols)) in [QuantType::Q4_K, QuantType::Q6_K]
            .into_iter()
            .flat_map(|q| [(16, 256), (128, 256), (48, 512)].map(|s| (q, s)))
        {
            let (body, _, qs) = tile(q, rows, cols, (rows + cols) as u64);
            let (x, mut a) = act(cols, 3);
            a.k.quantize_from(&x);
            let xk = a.k.slice(0, cols).unwrap();
            let t = Tile::body(q, rows, cols, &body);
            let y0: Vec<f32> = (0..rows).map(|r| r as f32 * 0.25 - 3.0).collect();
            let mut want = y0.clone();
            if q == QuantType::Q4_K {
                scalar_int_q4k(rows, cols / QK_K, &body, xk, &mut want);
            } else {
                scalar_int_q6k(rows, cols / QK_K, &body, xk, &mut want);
            }
            for isa in isas(q) {
                let mut y = y0.clone();
                tile_run_k(Kernel::of(isa), t, &[], Some(xk), &mut y);
                assert_same_bits(&y, &want, &format!("{q} {rows}×{cols} {isa:?}"));
            }
            let mut split = vec![0f32; rows];
            super::super::kquant::tile_matvec(
                Isa::Scalar,
                Tile::body(q, rows, cols, &qs),
                &x,
                None,
                Some(xk),
                &mut split,
            );
            let mut got = vec![0f32; rows];
            tile_run_k(Kernel::of(Isa::cached()), t, &[], Some(xk), &mut got);
            let mut f = vec![0f32; rows];
            tile_run_k(Kernel::of(Isa::cached()), t, &x, None, &mut f);
            let bb = q.block_bytes() * cols / QK_K;
            for r in 0..rows {
                let tol = 1e-4 * (1.0 + split[r].abs());
                assert!(
                    (split[r] - got[r]).abs() <= tol,
                    "{q} row {r}: {} vs {}",
                    split[r],
                    got[r]
                );
                let mut w = vec![0f32; cols];
                crate::quant::dequantize_row(q, &[], &qs[r * bb..(r + 1) * bb], &mut w);
                let exact: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                assert!(
                    (f[r] as f64 - exact).abs() <= 1e-4 * (1.0 + exact.abs()),
                    "{q} row {r} f32 path: {} vs {exact}",
                    f[r]
                );
            }
        }
    }

    /// The batched kernel equals one [`tile_run`] per token bit for bit, for every type, ISA,
    /// batch size (whole passes of [`BATCH`] or of AMX's 16 tokens, and remainders) and shape,
    /// accumulating into `ys`.
    #[test]
    fn batch_equals_one_call_per_token_bit_for_bit() {
        for q in [
            QuantType::Q4_0,
            QuantType::Q4_1,
            QuantType::Q8_0,
            QuantType::Q5_0,
        ] {
            for (rows, cols) in [(16, 32), (128, 256), (48, 96), (80, 576)] {
                let (body, _, _) = tile(q, rows, cols, (rows * cols) as u64);
                let acts: Vec<Q8Act> = (0..33).map(|j| act(cols, 7 + j as u64).1).collect();
                for n in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 14, 15, 16, 17, 33] {
                    let xqs: Vec<XqBlocks> = acts[..n]
                        .iter()
                        .map(|a| (&a.d[..], &a.s[..], &a.qs[..]))
                        .collect();
                    batch_equals_per_token(
                        q,
                        (rows, cols),
                        &body,
                        &xqs,
                        |k, t, xq, y| tile_run(k, t, &[], Some(xq), y),
                        tile_run_batch,
                    );
                }
            }
        }
    }

    /// For every ISA this CPU has: `batch` over the tokens `xs` equals `one` per token bit for
    /// bit, both accumulating into the same starting outputs.
    fn batch_equals_per_token<A: Copy>(
        q: QuantType,
        (rows, cols): (usize, usize),
        body: &[u8],
        xs: &[A],
        one: impl Fn(Kernel, Tile, A, &mut [f32]),
        batch: impl Fn(Kernel, Tile, &[A], &mut [f32]),
    ) {
        let n = xs.len();
        let y0: Vec<f32> = (0..n * rows).map(|r| r as f32 * 0.125 - 1.0).collect();
        for isa in isas(q) {
            let k = Kernel::of(isa);
            let t = Tile::body(q, rows, cols, body);
            let mut want = y0.clone();
            for (j, x) in xs.iter().enumerate() {
                one(k, t, *x, &mut want[j * rows..(j + 1) * rows]);
            }
            let mut got = y0.clone();
            batch(k, t, xs, &mut got);
            assert_same_bits(
                &got,
                &want,
                &format!("{q} {rows}×{cols} n={n} {:?}", k.path()),
            );
        }
    }

    /// The batched Q4_K and Q6_K kernels equal one [`tile_run_k`] per token bit for bit, for
    /// every ISA, batch size (whole passes of [`BATCH`] and remainders) and shape, accumulating
    /// into `ys`.
    #[test]
    fn k_batch_equals_one_call_per_token_bit_for_bit() {
        for (q, (rows, cols)) in [QuantType::Q4_K, QuantType::Q6_K]
            .into_iter()
            .flat_map(|q| [(16, 256), (48, 512), (80, 768)].map(|s| (q, s)))
        {
            let (body, _, _) = tile(q, rows, cols, (rows * cols) as u64);
            let acts: Vec<Q8Act> = (0..9)
                .map(|j| {
                    let (x, mut a) = act(cols, 11 + j as u64);
                    a.k.quantize_from(&x);
                    a
                })
                .collect();
            for n in [1usize, 2, 3, 4, 5, 8, 9] {
                let xks: Vec<Q8KRef> = acts[..n]
                    .iter()
                    .map(|a| a.k.slice(0, cols).unwrap())
                    .collect();
                batch_equals_per_token(
                    q,
                    (rows, cols),
                    &body,
                    &xks,
                    |k, t, xk, y| tile_run_k(k, t, &[], Some(xk), y),
                    tile_run_k_batch,
                );
            }
        }
    }

    /// The integer path against the split-layout kernels' scalar reference on the same weights
    /// and activation (another summation order: equal to float rounding), and the f32 path
    /// against a float64 dot of the dequantized weights.
    #[test]
    fn both_paths_agree_with_the_split_layout_and_with_float64() {
        for q in [
            QuantType::Q4_0,
            QuantType::Q4_1,
            QuantType::Q8_0,
            QuantType::Q5_0,
        ] {
            let (rows, cols) = (64, 256);
            let (body, sc, qs) = tile(q, rows, cols, 11);
            let (x, a) = act(cols, 5);
            let xq = (&a.d[..], &a.s[..], &a.qs[..]);
            let mut split = vec![0f32; rows];
            if q == QuantType::Q5_0 {
                super::super::kquant::tile_matvec(
                    Isa::Scalar,
                    Tile::body(q, rows, cols, &qs),
                    &x,
                    Some(xq),
                    None,
                    &mut split,
                );
            } else {
                super::super::split::scalar::tile_matvec(
                    Tile::split(q, rows, cols, &sc, &qs),
                    &x,
                    Some(xq),
                    &mut split,
                );
            }
            let mut packed = vec![0f32; rows];
            tile_matvec(
                Isa::cached(),
                Tile::body(q, rows, cols, &body),
                &x,
                Some(xq),
                &mut packed,
            );
            let mut f = vec![0f32; rows];
            tile_matvec(
                Isa::cached(),
                Tile::body(q, rows, cols, &body),
                &x,
                None,
                &mut f,
            );
            let (sb, qb) = (q.row_scale_bytes(cols), q.row_quant_bytes(cols));
            for r in 0..rows {
                let tol = 1e-4 * (1.0 + split[r].abs());
                assert!(
                    (split[r] - packed[r]).abs() <= tol,
                    "{q} row {r}: {} vs {}",
                    split[r],
                    packed[r]
                );
                let mut w = vec![0f32; cols];
                crate::quant::dequantize_row(
                    q,
                    &sc[r * sb..(r + 1) * sb],
                    &qs[r * qb..(r + 1) * qb],
                    &mut w,
                );
                let exact: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                assert!(
                    (f[r] as f64 - exact).abs() <= 1e-4 * (1.0 + exact.abs()),
                    "{q} row {r} f32 path"
                );
            }
        }
    }
}
