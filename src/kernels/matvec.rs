//! Matvec drivers over the two weight layouts: `tiled_matvec` (fused multi-output over
//! 128×256 tiles, parallel over output stripes) and `rowmajor_matvec` (the naive baseline: one
//! contiguous row-major matrix, parallel over 128-row chunks, 4 rows per kernel call and the
//! Q8 activation when given: a *blocked* row-major baseline) and `naive_matvec` (the paper's
//! §5.4 naive loop: row by row, the f32 activation, dequantize and dot). All call the same tile
//! kernels.

use super::dot::kquant::tile_matvec_act;
use super::dot::{tile_matvec, Isa, Q8Act};
use super::pool::ThreadPool;
use crate::format::reader::{tile_at, Matrix};
use crate::format::writer::MatrixData;
use crate::format::{TILE_COLS, TILE_ROWS};

/// Shares disjoint `&mut [f32]` output ranges with pool tasks.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32, usize);
// SAFETY: each pool task writes a distinct stripe range of the output (checked by construction:
// task → (matrix, stripe) is a bijection), so concurrent writes never alias.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// Activation as the kernels consume it: f32 values plus an optional Q8 quantization.
pub struct Act<'a> {
    pub x: &'a [f32],
    pub q8: Option<&'a Q8Act>,
}

/// Computes one stripe of `m` into `out` (length = stripe rows): out = W_stripe · x.
#[inline]
pub fn stripe_matvec(isa: Isa, bytes: &[u8], m: &Matrix, s: usize, act: &Act, out: &mut [f32]) {
    out.fill(0.0);
    for c in 0..m.n_col_tiles() {
        let t = tile_at(bytes, m, s, c);
        let c0 = c * TILE_COLS;
        let c1 = c0 + t.cols;
        tile_matvec_act(
            isa,
            m.quant,
            t.rows,
            t.cols,
            t.scales,
            t.qs,
            &act.x[c0..c1],
            act.q8,
            c0,
            out,
        );
    }
}

/// Fused multi-output tiled matvec: for every `(matrix, y)` pair, `y = W · x`, all sharing one
/// activation. Work is spread over all output stripes of all matrices.
pub fn tiled_matvec(
    pool: &ThreadPool,
    isa: Isa,
    bytes: &[u8],
    outs: &mut [(&Matrix, &mut [f32])],
    act: &Act,
) {
    let mut tasks: Vec<(usize, usize)> = Vec::new();
    for (i, (m, y)) in outs.iter().enumerate() {
        assert_eq!(y.len(), m.rows, "output length");
        assert_eq!(act.x.len(), m.cols, "activation length");
        for s in 0..m.n_stripes() {
            tasks.push((i, s));
        }
    }
    let ptrs: Vec<(&Matrix, OutPtr)> = outs
        .iter_mut()
        .map(|(m, y)| (*m, OutPtr(y.as_mut_ptr(), y.len())))
        .collect();
    pool.run(tasks.len(), &|t| {
        let (i, s) = tasks[t];
        let (m, p) = ptrs[i];
        let r0 = s * TILE_ROWS;
        let rows = m.stripe_rows(s);
        debug_assert!(r0 + rows <= p.1);
        // SAFETY: [r0, r0 + rows) is inside the output (rows = stripe rows of a matrix whose
        // output length was asserted above) and distinct tasks own distinct stripes.
        let out = unsafe { std::slice::from_raw_parts_mut(p.0.add(r0), rows) };
        stripe_matvec(isa, bytes, m, s, act, out);
    });
}

/// The row-major baseline: `y = W · x` over a contiguous split-layout matrix.
pub fn rowmajor_matvec(pool: &ThreadPool, isa: Isa, m: &MatrixData, act: &Act, y: &mut [f32]) {
    assert_eq!(y.len(), m.rows);
    assert_eq!(act.x.len(), m.cols);
    let chunks = m.rows.div_ceil(TILE_ROWS);
    let out = OutPtr(y.as_mut_ptr(), y.len());
    let (rsb, rqb) = (m.row_scale_bytes(), m.row_quant_bytes());
    pool.run(chunks, &|t| {
        let r0 = t * TILE_ROWS;
        let rows = (m.rows - r0).min(TILE_ROWS);
        let o = out;
        // SAFETY: chunk t owns rows [r0, r0 + rows) of the output, inside its length.
        let yy = unsafe { std::slice::from_raw_parts_mut(o.0.add(r0), rows) };
        yy.fill(0.0);
        tile_matvec_act(
            isa,
            m.quant,
            rows,
            m.cols,
            &m.scales[r0 * rsb..(r0 + rows) * rsb],
            &m.qs[r0 * rqb..(r0 + rows) * rqb],
            act.x,
            act.q8,
            0,
            yy,
        );
    });
}

/// The paper's naive row-major loop (§5.4 "NaiveMatvec"): for each output row, walk the whole
/// row and the whole f32 activation, dequantizing and dotting block by block. No activation
/// quantization, no row blocking: once the activation is larger than L1-d it is re-read from L2
/// for every row, which is the miss count the paper's 19.3 M decomposes into. Parallel over
/// 128-row chunks; each row is computed in 256-column steps (one kernel call per tile width)
/// so the arithmetic, and therefore the result, is bit-identical to [`tiled_matvec`] with an
/// f32 activation (`Act { q8: None }`); only the order in which memory is touched differs.
pub fn naive_matvec(pool: &ThreadPool, isa: Isa, m: &MatrixData, x: &[f32], y: &mut [f32]) {
    assert_eq!(y.len(), m.rows);
    assert_eq!(x.len(), m.cols);
    let chunks = m.rows.div_ceil(TILE_ROWS);
    let out = OutPtr(y.as_mut_ptr(), y.len());
    let (rsb, rqb) = (m.row_scale_bytes(), m.row_quant_bytes());
    let q = m.quant;
    // Column steps of one tile width, in the units each part of a row is stored in.
    let (sb, qb) = (q.row_scale_bytes(TILE_COLS), q.row_quant_bytes(TILE_COLS));
    pool.run(chunks, &|t| {
        let r0 = t * TILE_ROWS;
        let rows = (m.rows - r0).min(TILE_ROWS);
        let o = out;
        // SAFETY: chunk t owns rows [r0, r0 + rows) of the output, inside its length.
        let yy = unsafe { std::slice::from_raw_parts_mut(o.0.add(r0), rows) };
        for (i, yr) in yy.iter_mut().enumerate() {
            let r = r0 + i;
            let (rs, rq) = (
                &m.scales[r * rsb..(r + 1) * rsb],
                &m.qs[r * rqb..(r + 1) * rqb],
            );
            *yr = 0.0;
            let mut c0 = 0;
            let mut k = 0;
            while c0 < m.cols {
                let cols = (m.cols - c0).min(TILE_COLS);
                let (s0, q0) = (k * sb, k * qb);
                tile_matvec(
                    isa,
                    q,
                    1,
                    cols,
                    &rs[s0.min(rs.len())..],
                    &rq[q0..],
                    &x[c0..c0 + cols],
                    None,
                    std::slice::from_mut(yr),
                );
                c0 += cols;
                k += 1;
            }
        }
    });
}

/// Batched tiled matvec for prefill: for every `(matrix, ys)` pair and every token `b < n`,
/// `ys[b·rows ..][..rows] = W · xs[b·cols ..][..cols]`. Each tile is loaded once and applied to
/// all `n` activations while it is hot in cache, so weight traffic is paid once per batch.
/// `q8`, when given, holds each token's quantized activation.
pub fn tiled_matvec_batch(
    pool: &ThreadPool,
    isa: Isa,
    bytes: &[u8],
    outs: &mut [(&Matrix, &mut [f32])],
    xs: &[f32],
    q8: Option<&[Q8Act]>,
    n: usize,
) {
    let mut tasks: Vec<(usize, usize)> = Vec::new();
    let cols = outs.first().map_or(0, |(m, _)| m.cols);
    assert_eq!(xs.len(), n * cols, "activation length");
    for (i, (m, y)) in outs.iter().enumerate() {
        assert_eq!(m.cols, cols, "matrices of one batch share the input");
        assert_eq!(y.len(), n * m.rows, "output length");
        for s in 0..m.n_stripes() {
            tasks.push((i, s));
        }
    }
    if let Some(q) = q8 {
        assert_eq!(q.len(), n);
    }
    let ptrs: Vec<(&Matrix, OutPtr)> = outs
        .iter_mut()
        .map(|(m, y)| (*m, OutPtr(y.as_mut_ptr(), y.len())))
        .collect();
    pool.run(tasks.len(), &|t| {
        let (i, s) = tasks[t];
        let (m, p) = ptrs[i];
        let r0 = s * TILE_ROWS;
        let rows = m.stripe_rows(s);
        for b in 0..n {
            // SAFETY: rows [r0, r0 + rows) of token b's output lie inside the output (asserted
            // length n · m.rows) and (matrix, stripe) pairs are distinct across tasks.
            let out = unsafe { std::slice::from_raw_parts_mut(p.0.add(b * m.rows + r0), rows) };
            out.fill(0.0);
        }
        for c in 0..m.n_col_tiles() {
            let tile = tile_at(bytes, m, s, c);
            let c0 = c * TILE_COLS;
            let c1 = c0 + tile.cols;
            for b in 0..n {
                // SAFETY: as above.
                let out = unsafe { std::slice::from_raw_parts_mut(p.0.add(b * m.rows + r0), rows) };
                let x = &xs[b * cols + c0..b * cols + c1];
                tile_matvec_act(
                    isa,
                    m.quant,
                    tile.rows,
                    tile.cols,
                    tile.scales,
                    tile.qs,
                    x,
                    q8.map(|q| &q[b]),
                    c0,
                    out,
                );
            }
        }
    });
}
