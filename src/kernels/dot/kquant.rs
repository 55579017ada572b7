//! Tile kernels of the interleaved GGUF types (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; see `quant::kquants`):
//! the slice checks and the per-ISA dispatch in front of `kquant_scalar`, `kquant_avx2`,
//! `kquant_avx512` and the batched `kquant_batch`.
//!
//! Activation forms, quantized once per matvec like llama.cpp does (`act_q8`): Q5_0 takes the
//! Q8_0 blocks of [`Q8Act`] (`d`, `qs`), Q5_1 also their `s = d · Σq` (Q8_1); the K-quants take
//! the Q8_K blocks (`act_q8::Q8K`: per 256 values one f32 scale, 256 i8 quants and 16 sums of 16
//! quants). Without an activation (`--act f32`) every type has an f32 path.
//!
//! Dispatch as in `dot`: [`tile_matvec`] asserts the slice lengths, then runs AVX-512 (BW, or
//! VNNI `vpdpbusd`; K-quant integer paths only, the rest runs the AVX2 kernels) → AVX2 → scalar.
//! [`tile_matvec_act`] hands each type the activation form its integer kernel takes. The
//! engine's matvecs do not come through here: `dot::select` calls [`check`] and the kernels.

use super::Tile;
use super::{kquant_scalar as scalar, Isa, Q8Act, Q8KRef, XqBlocks, XqRef};
use crate::quant::kquants::QK_K;
use crate::quant::QK;

/// One tile of any type, with the activation of the whole matvec (`act`, quantized once; the
/// tile covers its columns `c0..c0 + cols`) or none (f32 path). K-quant tiles use `act.k` when it
/// was quantized ([`Q8Act::quantize_k_from`]), else their f32 path.
#[inline]
pub fn tile_matvec_act(
    isa: Isa,
    t: Tile,
    x: &[f32],
    act: Option<&Q8Act>,
    c0: usize,
    y: &mut [f32],
) {
    let Tile {
        quant: q,
        rows,
        cols,
        scales,
        qs,
    } = t;
    if q.is_k() {
        let xk = act.and_then(|a| a.k.slice(c0, cols));
        tile_matvec(isa, Tile::body(q, rows, cols, qs), x, None, xk, y);
    } else {
        let xq = act
            .filter(|_| q.is_blocked())
            .map(|a| a.tile_slice(c0, cols));
        super::tile_matvec(isa, Tile::split(q, rows, cols, scales, qs), x, xq, y);
    }
}

/// Checks the tile contract for an interleaved type; returns which integer path applies.
pub(super) fn check(t: Tile, x: &[f32], xq: XqRef, xk: Option<Q8KRef>, y: &[f32]) -> (bool, bool) {
    let Tile {
        quant: q,
        rows,
        cols,
        qs,
        ..
    } = t;
    assert!(q.is_interleaved(), "{q} is not an interleaved type");
    assert!(
        cols.is_multiple_of(q.block_len()),
        "{q} tile cols {cols} not a multiple of {}",
        q.block_len()
    );
    assert!(y.len() >= rows, "y too short: {} < {rows}", y.len());
    assert!(qs.len() >= q.matrix_bytes(rows, cols), "qs too short");
    let int8 = !q.is_k() && xq.is_some();
    let intk = q.is_k() && xk.is_some();
    if let (true, Some((d, s, xqs))) = (int8, xq) {
        let nb = cols / QK;
        assert!(
            d.len() >= nb && s.len() >= nb && xqs.len() >= cols,
            "xq too short"
        );
    }
    if let (true, Some(k)) = (intk, xk) {
        let nb = cols / QK_K;
        assert!(
            k.d.len() >= nb && k.bsums.len() >= 16 * nb && k.qs.len() >= cols,
            "xk too short"
        );
    }
    if !int8 && !intk {
        assert!(x.len() >= cols, "x too short: {} < {cols}", x.len());
    }
    (int8, intk)
}

/// `y[r] += W_tile[r] · x` for one tile of an interleaved type (`qs` = the GGUF blocks of `rows`
/// rows, row-major). Integer path with `xq` (Q5_0/Q5_1) or `xk` (K-quants), else f32 `x`.
#[inline]
pub fn tile_matvec(isa: Isa, t: Tile, x: &[f32], xq: XqRef, xk: Option<Q8KRef>, y: &mut [f32]) {
    let Tile {
        quant: q,
        rows,
        cols,
        qs,
        ..
    } = t;
    let (int8, intk) = check(Tile::body(q, rows, cols, qs), x, xq, xk, y);
    let xq = if int8 { xq } else { None };
    let xk = if intk { xk } else { None };
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx512 if isa.available() => {
            // SAFETY: AVX-512 F/BW (+ AVX2/FMA/F16C, VNNI when used) detected just above; slice
            // lengths checked by `check`.
            let vnni = isa.has_vnni();
            unsafe { super::kquant_avx512::tile_matvec(t, x, xq, xk, y, vnni) };
            return;
        }
        Isa::Avx2 | Isa::Avx512 if Isa::Avx2.available() => {
            // SAFETY: AVX2/FMA/F16C detected just above; slice lengths checked by `check`.
            unsafe { super::kquant_avx2::tile_matvec(t, x, xq, xk, y) };
            return;
        }
        _ => {}
    }
    let _ = isa;
    scalar::tile_matvec(t, x, xq, xk, y)
}

/// The integer activations of the tokens of one batched tile ([`tile_matmul`]), covering its
/// columns: Q8 blocks (`d`, `s`, quants) for Q5_0/Q5_1, Q8_K blocks for the K-quants.
#[derive(Clone, Copy, Debug)]
pub enum BatchAct<'a> {
    Q8(&'a [XqBlocks<'a>]),
    K(&'a [Q8KRef<'a>]),
}

impl<'a> BatchAct<'a> {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        match self {
            BatchAct::Q8(x) => x.len(),
            BatchAct::K(x) => x.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Token `j`'s activation as [`tile_matvec`] takes it (`xq`, `xk`).
    pub(super) fn token(&self, j: usize) -> (XqRef<'a>, Option<Q8KRef<'a>>) {
        match self {
            BatchAct::Q8(x) => (Some(x[j]), None),
            BatchAct::K(x) => (None, Some(x[j])),
        }
    }
}

/// Whether [`tile_matmul`] on `isa` runs the `vnni` build of `kquant_batch`.
#[cfg(target_arch = "x86_64")]
pub(super) fn batch_vnni(isa: Isa) -> bool {
    isa == Isa::Avx512 && isa.has_vnni() && is_x86_feature_detected!("avx512vl")
}

/// Batched [`tile_matvec`] on the integer path, for prefill: for every token `j` of `acts`,
/// `y[j·rows + r] += W_tile[r] · x_j`, with `acts` in the form of `q` (Q8 blocks for
/// Q5_0/Q5_1, Q8_K for the K-quants). The weights are unpacked once per group of rows for all
/// tokens (`kquant_batch`): its AVX-512 VL + VNNI build when `isa` is AVX-512 and the CPU has
/// them, else its AVX2 build on any non-scalar `isa` the CPU supports. Both are bit-identical
/// to one AVX2 [`tile_matvec`] call per token (what decode runs for these types, see
/// `Isa::for_quant`), except the VNNI build's Q5_0 groups of 8 rows, which sum each row in
/// one lane (within the scalar reference's bound; see `kquant_batch`). On
/// `Isa::Scalar` or without AVX2: one scalar call per token.
pub fn tile_matmul(isa: Isa, t: Tile, acts: BatchAct, y: &mut [f32]) {
    check_batch(t, acts, y);
    let Tile {
        quant: q,
        rows,
        cols,
        qs,
        ..
    } = t;
    let n = acts.len();
    #[cfg(target_arch = "x86_64")]
    {
        if batch_vnni(isa) {
            // SAFETY: AVX-512 F/BW/VL/VNNI (+ AVX2/FMA/F16C) detected by `batch_vnni`; the
            // activation form matches `q` and every token's slices passed `check` above; `y`
            // holds `n · rows` outputs.
            unsafe {
                super::kquant_batch::vnni::tile_matmul(
                    q,
                    rows,
                    cols,
                    qs,
                    acts,
                    y,
                    super::packed_amx::available(),
                )
            };
            return;
        }
        if isa != Isa::Scalar && Isa::Avx2.available() {
            // SAFETY: AVX2/FMA/F16C detected just above; form, slices and `y` checked above.
            unsafe { super::kquant_batch::avx2::tile_matmul(q, rows, cols, qs, acts, y, false) };
            return;
        }
    }
    for j in 0..n {
        let (xq, xk) = acts.token(j);
        let yj = &mut y[j * rows..(j + 1) * rows];
        scalar::tile_matvec(t, &[], xq, xk, yj);
    }
}

/// Checks a batched tile ([`tile_matmul`]) before any SIMD code reads it: room in `y` for every
/// token, the activation form of `q`, and every token's slices against the tile contract.
pub(super) fn check_batch(t: Tile, acts: BatchAct, y: &[f32]) {
    let Tile {
        quant: q,
        rows,
        cols,
        qs,
        ..
    } = t;
    let n = acts.len();
    assert!(y.len() >= n * rows, "y too short for {n} tokens");
    assert!(
        matches!(
            (q.is_k(), acts),
            (true, BatchAct::K(_)) | (false, BatchAct::Q8(_))
        ),
        "{q}: activation form {acts:?} does not match"
    );
    for j in 0..n {
        let (xq, xk) = acts.token(j);
        let (int8, intk) = check(Tile::body(q, rows, cols, qs), &[], xq, xk, &y[j * rows..]);
        assert!(int8 || intk, "{q}: batched tiles take the integer path");
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{acts, random_body_tile, Rng, INTERLEAVED};
    use super::*;
    #[allow(unused_imports)]
    use crate::kernels::dot::Tile;
    #[allow(unused_imports)]
    use crate::quant::QuantType;

    /// The scalar reference against the dequantized weights dotted in f64: the f32 path to float
    /// rounding, the integer paths within the bound of the activation's quantization error
    /// (|x − x̂| ≤ d_x/2 per element, d_x the Q8_0 or Q8_K step of its block).
    #[test]
    fn scalar_reference_matches_dequantized_f64_dot() {
        let mut rng = Rng::new(21);
        for q in INTERLEAVED {
            for _ in 0..60 {
                let rows = 1 + rng.below(6);
                let cols = q.block_len() * (1 + rng.below(if q.is_k() { 3 } else { 12 }));
                let (qs, w) = random_body_tile(&mut rng, q, rows, cols);
                let x: Vec<f32> = (0..cols).map(|_| rng.uniform() * 3.0).collect();
                let a = acts(&x);
                for r in 0..rows {
                    let wr = &w[r * cols..(r + 1) * cols];
                    let exact: f64 = wr.iter().zip(&x).map(|(&w, &x)| w as f64 * x as f64).sum();
                    let l1: f64 = wr
                        .iter()
                        .zip(&x)
                        .map(|(&w, &x)| (w as f64 * x as f64).abs())
                        .sum();
                    let row_qs =
                        &qs[r * q.matrix_bytes(1, cols)..(r + 1) * q.matrix_bytes(1, cols)];
                    let mut y = [0f32];
                    scalar::tile_matvec(Tile::body(q, 1, cols, row_qs), &x, None, None, &mut y);
                    assert!(
                        (y[0] as f64 - exact).abs() <= 1e-5 * l1 + 1e-6,
                        "{q} f32 path row {r}: {} vs {exact}",
                        y[0]
                    );
                    // Integer path: bound from the activation's step per block.
                    let (bound, xq, xk) = if q.is_k() {
                        let b: f64 = wr
                            .chunks_exact(QK_K)
                            .zip(&a.k.d)
                            .map(|(wb, d)| {
                                (d.abs() as f64)
                                    * 0.5
                                    * wb.iter().map(|v| v.abs() as f64).sum::<f64>()
                            })
                            .sum();
                        (b, None, a.k.slice(0, cols))
                    } else {
                        let b: f64 = wr
                            .chunks_exact(QK)
                            .zip(&a.d)
                            .map(|(wb, d)| {
                                (*d as f64) * 0.5 * wb.iter().map(|v| v.abs() as f64).sum::<f64>()
                            })
                            .sum();
                        (b, Some(a.tile_slice(0, cols)), None)
                    };
                    let mut y = [0f32];
                    scalar::tile_matvec(Tile::body(q, 1, cols, row_qs), &x, xq, xk, &mut y);
                    assert!(
                        (y[0] as f64 - exact).abs() <= bound * 1.001 + 1e-5 * l1 + 1e-6,
                        "{q} int path row {r}: {} vs {exact} (bound {bound})",
                        y[0]
                    );
                }
            }
        }
    }

    /// `tile_matvec_act` on a K tile without a quantized Q8_K part takes the f32 path; with it,
    /// the integer path (different rounding, same value within the bound).
    #[test]
    fn act_dispatch_uses_q8k_when_present() {
        let mut rng = Rng::new(5);
        let (qs, _) = random_body_tile(&mut rng, QuantType::Q4_K, 3, 512);
        let x: Vec<f32> = (0..512).map(|_| rng.uniform()).collect();
        let mut a = Q8Act::default();
        a.quantize_from(&x);
        let run = |a: &Q8Act, isa| {
            let mut y = vec![0f32; 3];
            tile_matvec_act(
                isa,
                Tile::split(QuantType::Q4_K, 3, 256, &[], &qs_tile(&qs, 3, 512, 256)),
                &x[256..],
                Some(a),
                256,
                &mut y,
            );
            y
        };
        let f32_path = {
            let mut y = vec![0f32; 3];
            scalar::tile_matvec(
                Tile::body(QuantType::Q4_K, 3, 256, &qs_tile(&qs, 3, 512, 256)),
                &x[256..],
                None,
                None,
                &mut y,
            );
            y
        };
        assert_eq!(run(&a, Isa::Scalar), f32_path);
        a.quantize_k_from(&x);
        let int = run(&a, Isa::Scalar);
        assert_ne!(int, f32_path);
        let mut y = vec![0f32; 3];
        let k = a.k.slice(256, 256).unwrap();
        scalar::tile_matvec(
            Tile::body(QuantType::Q4_K, 3, 256, &qs_tile(&qs, 3, 512, 256)),
            &[],
            None,
            Some(k),
            &mut y,
        );
        assert_eq!(int, y);
        // A fresh Q8_0 quantization drops the stale Q8_K part.
        a.quantize_from(&x);
        assert_eq!(run(&a, Isa::Scalar), f32_path);
    }

    /// Columns `c0..c0 + w` of every row of an interleaved matrix, as a tile.
    fn qs_tile(qs: &[u8], rows: usize, cols: usize, c0: usize) -> Vec<u8> {
        let q = QuantType::Q4_K;
        let rb = q.matrix_bytes(1, cols);
        let (o, w) = (q.matrix_bytes(1, c0), q.matrix_bytes(1, cols - c0));
        (0..rows)
            .flat_map(|r| qs[r * rb + o..r * rb + o + w].to_vec())
            .collect()
    }

    #[test]
    #[should_panic(expected = "qs too short")]
    fn short_tiles_are_rejected_before_simd() {
        let mut y = [0f32; 2];
        tile_matvec(
            Isa::Avx2,
            Tile::body(QuantType::Q6_K, 2, 256, &[0; 419]),
            &[0.0; 256],
            None,
            None,
            &mut y,
        );
    }
}
