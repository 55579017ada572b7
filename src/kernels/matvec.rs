//! Matvec drivers over the two weight layouts: `tiled_matvec` (fused multi-output over
//! 128×256 tiles, parallel over output stripes) and `rowmajor_matvec` (the naive baseline: one
//! contiguous row-major matrix, parallel over 128-row chunks, 4 rows per kernel call and the
//! Q8 activation when given: a *blocked* row-major baseline) and `naive_matvec` (the paper's
//! §5.4 naive loop: row by row, the f32 activation, dequantize and dot). All call the same tile
//! kernels. A matrix marked [`Matrix::packed`] (a resident copy's repacked tiles) runs the
//! kernels of `dot::packed` instead, in decode and in prefill.
//!
//! Which kernel runs a matrix was chosen once, when the model was opened, and is bound on it
//! ([`Matrix::kernel`], `dot::select`); the drivers look it up once per stripe and call it for
//! every tile of the stripe.

use super::dot::select::{self, Batch, Bufs, MatKernel};
use super::dot::{Isa, Q8Act};
use super::pool::ThreadPool;
use crate::format::header::{tile_bytes, TileHeader};
use crate::format::reader::{tile_at, MappedTile, Matrix};
use crate::format::writer::MatrixData;
use crate::format::{TILE_COLS, TILE_ROWS};
use crate::kernels::dot::Tile;
use crate::quant::packed::PACK_ROWS;

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
    stripe_with(select::kernel(m, isa), bytes, m, s, act, out);
}

/// [`stripe_matvec`] with `m`'s kernel `k` looked up.
#[inline]
fn stripe_with(k: &MatKernel, bytes: &[u8], m: &Matrix, s: usize, act: &Act, out: &mut [f32]) {
    if m.packed {
        packed_stripe_matvec(k, bytes, m, s, act, out);
    } else {
        rows_with(k, bytes, m, s, 0, act, out);
    }
}

/// Rows `r0 .. r0 + out.len()` of stripe `s` of `m` into `out`. Inside a tile the scales and
/// quants are row-major, so a row range is one contiguous piece of each; every row's arithmetic
/// is the same as in the whole-stripe call (the kernels never mix rows).
#[inline]
pub fn stripe_rows_matvec(
    isa: Isa,
    bytes: &[u8],
    m: &Matrix,
    s: usize,
    r0: usize,
    act: &Act,
    out: &mut [f32],
) {
    rows_with(select::kernel(m, isa), bytes, m, s, r0, act, out);
}

/// [`stripe_rows_matvec`] with `m`'s kernel `k` looked up.
#[inline]
fn rows_with(
    k: &MatKernel,
    bytes: &[u8],
    m: &Matrix,
    s: usize,
    r0: usize,
    act: &Act,
    out: &mut [f32],
) {
    let rows = out.len();
    out.fill(0.0);
    if m.packed {
        for c in 0..m.n_col_tiles() {
            let t = tile_at(bytes, m, s, c);
            packed_rows_matvec(k, m, &t, r0, act, c * TILE_COLS, out);
        }
        return;
    }
    for c in 0..m.n_col_tiles() {
        let t = tile_at(bytes, m, s, c);
        debug_assert!(r0 + rows <= t.rows);
        let (rsb, rqb) = row_bytes(m, t.cols);
        let c0 = c * TILE_COLS;
        let c1 = c0 + t.cols;
        (k.matvec)(
            Tile::split(
                m.quant,
                rows,
                t.cols,
                &t.scales[r0 * rsb..(r0 + rows) * rsb],
                &t.qs[r0 * rqb..(r0 + rows) * rqb],
            ),
            &act.x[c0..c1],
            act.q8,
            c0,
            out,
        );
    }
}

/// Rows `r0 .. r0 + out.len()` (whole 16-row groups) of a repacked tile `t` of `m` whose first
/// column is `c0`, accumulated into `out`, with kernel `k`.
fn packed_rows_matvec(
    k: &MatKernel,
    m: &Matrix,
    t: &MappedTile,
    r0: usize,
    act: &Act,
    c0: usize,
    out: &mut [f32],
) {
    let rows = out.len();
    assert!(
        r0.is_multiple_of(PACK_ROWS) && r0 + rows <= t.rows,
        "rows {r0}..{} of a repacked {}-row tile",
        r0 + rows,
        t.rows
    );
    let group = m.quant.matrix_bytes(PACK_ROWS, t.cols);
    let body = &t.body[r0 / PACK_ROWS * group..(r0 + rows) / PACK_ROWS * group];
    let x = &act.x[c0..c0 + t.cols];
    (k.matvec)(Tile::body(m.quant, rows, t.cols, body), x, act.q8, c0, out);
}

/// Stripe `s` of a repacked matrix into `out` (all its rows), as [`stripe_matvec`] computes it
/// with the same kernels in the same order, but without per-tile bookkeeping: a stripe's tiles
/// lie one after another (header, body), every one but the last `TILE_COLS` wide, so each body
/// is found from the stripe's offset by arithmetic (the headers were validated at open), and
/// the kernel was chosen when the model was opened. The per-tile header decode, slicing and
/// CPU-feature checks took ~4 % of decode's samples on SmolLM2.
fn packed_stripe_matvec(
    k: &MatKernel,
    bytes: &[u8],
    m: &Matrix,
    s: usize,
    act: &Act,
    out: &mut [f32],
) {
    let rows = out.len();
    debug_assert_eq!(rows, m.stripe_rows(s));
    let full = tile_bytes(m.quant, rows, TILE_COLS);
    out.fill(0.0);
    for c in 0..m.n_col_tiles() {
        let cols = m.tile_cols(c);
        let c0 = c * TILE_COLS;
        let body = m.stripes[s] + c * full + TileHeader::SIZE;
        let body = &bytes[body..body + m.quant.matrix_bytes(rows, cols)];
        let x = &act.x[c0..c0 + cols];
        (k.matvec)(Tile::body(m.quant, rows, cols, body), x, act.q8, c0, out);
    }
}

/// Scale and quant bytes of one row of a `cols`-wide tile of `m`.
fn row_bytes(m: &Matrix, cols: usize) -> (usize, usize) {
    (m.quant.row_scale_bytes(cols), m.quant.row_quant_bytes(cols))
}

/// Fused multi-output tiled matvec: for every `(matrix, y)` pair, `y = W · x`, all sharing one
/// activation. Work is spread over all output stripes of all matrices, one pool task per
/// whole stripe. (Splitting small matvecs into 32- or 64-row parts to balance 2 threads was
/// measured slower on SmolLM2 at 2 threads, 10.1 vs 8.65 ms/token, 6 of 6 alternating pairs:
/// docs/PERFORMANCE.md, "Measured dead ends"; over repacked tiles too, 154–170 against 266–305
/// tok/s, since each part reads a piece of every tile of its stripe rather than one run. Guided
/// claims, long runs first and single stripes last, made no difference: "Where the two-thread
/// time goes".)
pub fn tiled_matvec(
    pool: &ThreadPool,
    isa: Isa,
    bytes: &[u8],
    outs: &mut [(&Matrix, &mut [f32])],
    act: &Act,
) {
    let n = outs.len();
    tiled_matvec_acts(pool, isa, bytes, outs, std::slice::from_ref(act), n);
}

/// [`tiled_matvec`] with one activation per output (`acts.len() == outs.len()`), or one shared
/// by all (`acts.len() == 1`): several matvecs, each on its own input, in one pool run instead
/// of one run each. `group`: how many consecutive
/// outputs the writer stored interleaved stripe by stripe (an expert's gate and up: 2; separate
/// regions: 1); tasks run group after group, round-robin inside a group, so each claim streams
/// one region of the file in order.
#[allow(clippy::needless_range_loop)] // a task index picks an entry of `order` or of the table
pub fn tiled_matvec_acts(
    pool: &ThreadPool,
    isa: Isa,
    bytes: &[u8],
    outs: &mut [(&Matrix, &mut [f32])],
    acts: &[Act],
    group: usize,
) {
    let group = group.clamp(1, outs.len().max(1));
    assert!(
        acts.len() == 1 || acts.len() == outs.len(),
        "one activation, or one per output"
    );
    let act_of = |i: usize| &acts[if acts.len() == 1 { 0 } else { i }];
    // Task t is stripe t − first[i] of output i, where first[i] counts the stripes of the outputs
    // before i. A decode step makes ~150 of these calls, so the table lives on the stack for
    // the usual handful of outputs (a heap table only past MAX_OUTS).
    let mut n_tasks = 0;
    for (i, (m, y)) in outs.iter().enumerate() {
        assert_eq!(y.len(), m.rows, "output length");
        assert_eq!(act_of(i).x.len(), m.cols, "activation length");
        n_tasks += m.n_stripes();
        // A small matrix's stripe offsets (a selected expert's) are usually cold after the
        // previous layer's weights streamed through the cache: asked for here, their misses
        // overlap instead of stalling one task each.
        super::prefetch::to_l2(&m.stripes);
    }
    let mut stack: [Option<(usize, &Matrix, OutPtr)>; MAX_OUTS] = [None; MAX_OUTS];
    let mut heap = Vec::new();
    let n_outs = outs.len();
    let table: &[Option<(usize, &Matrix, OutPtr)>] = {
        let mut first = 0;
        let mut entries = outs.iter_mut().map(|(m, y)| {
            let e = Some((first, &**m, OutPtr(y.as_mut_ptr(), y.len())));
            first += m.n_stripes();
            e
        });
        if n_outs <= MAX_OUTS {
            for (slot, e) in stack.iter_mut().zip(&mut entries) {
                *slot = e;
            }
            &stack[..n_outs]
        } else {
            heap.extend(entries);
            &heap
        }
    };
    let ptrs = |t: usize| {
        let i = table.partition_point(|e| e.is_some_and(|(f, _, _)| f <= t)) - 1;
        let (f, m, p) = table[i].expect("filled");
        (t - f, m, p, i)
    };
    // The stripes of a small multi-output call (Q/K/V, gate/up) run in the order the writer
    // stores a group of matrices: round-robin by stripe index (q 0, k 0, v 0, q 1, …; gate 0,
    // up 0, gate 1, …), so a claim of consecutive tasks is one contiguous range of the file and
    // each thread's prefetches run ahead into its own next stripe. For matrices stored apart
    // the order only changes which thread computes which stripe.
    let mut order = [(0u8, 0u8); ORDERED_MAX];
    let ordered = n_outs > 1 && n_tasks <= ORDERED_MAX;
    if ordered {
        let stripes = |i: usize| table[i].expect("filled").1.n_stripes();
        let mut k = 0;
        for g0 in (0..n_outs).step_by(group) {
            let g = g0..(g0 + group).min(n_outs);
            let most = g.clone().map(stripes).max().unwrap_or(0);
            for s in 0..most {
                for i in g.clone().filter(|&i| s < stripes(i)) {
                    order[k] = (i as u8, s as u8);
                    k += 1;
                }
            }
        }
    }
    let run = stripes_per_claim(n_tasks, pool.threads());
    pool.run(n_tasks.div_ceil(run), &|g| {
        for t in g * run..((g + 1) * run).min(n_tasks) {
            let (s, m, p, i) = if ordered {
                let (i, s) = order[t];
                let (_, m, p) = table[i as usize].expect("filled");
                (s as usize, m, p, i as usize)
            } else {
                ptrs(t)
            };
            let act = act_of(i);
            let r0 = s * TILE_ROWS;
            let rows = m.stripe_rows(s);
            debug_assert!(r0 + rows <= p.1);
            // SAFETY: [r0, r0 + rows) is inside the output (rows = stripe rows of a matrix
            // whose output length was asserted above) and distinct tasks own distinct stripes.
            let out = unsafe { std::slice::from_raw_parts_mut(p.0.add(r0), rows) };
            stripe_with(select::kernel(m, isa), bytes, m, s, act, out);
        }
    });
}

/// [`tiled_matvec`] on the calling thread alone, for use inside a pool task: every
/// `(matrix, y)` pair gets `y = W · x`, stripe by stripe in the writer's group order (stripe 0 of
/// every output, then stripe 1, …: an expert's interleaved gate and up are then read front to
/// back). The same kernel per stripe as the pooled drivers, so the same bits.
pub fn serial_matvec(isa: Isa, bytes: &[u8], outs: &mut [(&Matrix, &mut [f32])], act: &Act) {
    let most = outs.iter().map(|(m, _)| m.n_stripes()).max().unwrap_or(0);
    for (m, y) in outs.iter() {
        assert_eq!(y.len(), m.rows, "output length");
        assert_eq!(act.x.len(), m.cols, "activation length");
    }
    for s in 0..most {
        for (m, y) in outs.iter_mut().filter(|(m, _)| s < m.n_stripes()) {
            let r0 = s * TILE_ROWS;
            let rows = m.stripe_rows(s);
            stripe_with(
                select::kernel(m, isa),
                bytes,
                m,
                s,
                act,
                &mut y[r0..r0 + rows],
            );
        }
    }
}

/// Outputs of one fused matvec whose stripe table lives on the stack.
const MAX_OUTS: usize = 16;

/// Stripes of a multi-output matvec that run in the writer's group order (the order table is on
/// the stack; a stripe index fits in a byte).
const ORDERED_MAX: usize = 64;

/// Consecutive stripes per pool claim for a matvec of `n` stripes on `threads` threads. Each
/// thread should stream long contiguous ranges of the file (its hardware and software prefetches
/// then run ahead into its own next stripes, not into another thread's), yet claim often enough
/// that a late thread does not leave the others waiting: about 16 claims per thread for large
/// matvecs (an LM head of thousands of stripes), about 2 per thread (at most 12 stripes each)
/// for small ones. SmolLM2's 24-stripe gate/up pair on 2 threads: 6 stripes per claim; its
/// 5-stripe projections: 1.
fn stripes_per_claim(n: usize, threads: usize) -> usize {
    if threads <= 1 {
        return 1;
    }
    let large = n / (threads * 16);
    let small = (n / (threads * 2)).min(12);
    large.max(small).max(1)
}

/// The row-major baseline: `y = W · x` over a contiguous split-layout matrix.
pub fn rowmajor_matvec(pool: &ThreadPool, isa: Isa, m: &MatrixData, act: &Act, y: &mut [f32]) {
    assert_eq!(y.len(), m.rows);
    assert_eq!(act.x.len(), m.cols);
    let chunks = m.rows.div_ceil(TILE_ROWS);
    let k = select::entry(select::select(m.quant, false, isa));
    let out = OutPtr(y.as_mut_ptr(), y.len());
    let (rsb, rqb) = (m.row_scale_bytes(), m.row_quant_bytes());
    pool.run(chunks, &|t| {
        let r0 = t * TILE_ROWS;
        let rows = (m.rows - r0).min(TILE_ROWS);
        let o = out;
        // SAFETY: chunk t owns rows [r0, r0 + rows) of the output, inside its length.
        let yy = unsafe { std::slice::from_raw_parts_mut(o.0.add(r0), rows) };
        yy.fill(0.0);
        (k.matvec)(
            Tile::split(
                m.quant,
                rows,
                m.cols,
                &m.scales[r0 * rsb..(r0 + rows) * rsb],
                &m.qs[r0 * rqb..(r0 + rows) * rqb],
            ),
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
    let kernel = select::entry(select::select(m.quant, false, isa));
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
                (kernel.matvec)(
                    Tile::split(q, 1, cols, &rs[s0.min(rs.len())..], &rq[q0..]),
                    &x[c0..c0 + cols],
                    None,
                    c0,
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
/// all `n` activations while it is hot in cache (the `matmul` of the matrix's kernel,
/// `dot::select`), so weight traffic is paid once per batch. `q8`, when given, holds each
/// token's quantized activation. Per token the
/// result is bit-identical to [`tiled_matvec`] on the same ISA, except for Q5_0 on the integer
/// path with AVX-512 VNNI, whose batched kernel sums each row in one lane
/// (`dot::kquant_batch`): the same value within the kernels' bound.
///
/// A task is one stripe for a range of the batch's tokens. When the batch has fewer than
/// [`STRIPES_PER_THREAD`] stripes per thread (SmolLM2's 576-row matrices are 4.5 stripes), the
/// tokens are split in parts so that the threads get even shares: each part unpacks its tiles
/// again, which costs little next to the compute of 16 or more tokens, and every token's
/// arithmetic is unchanged.
pub fn tiled_matvec_batch(
    pool: &ThreadPool,
    isa: Isa,
    bytes: &[u8],
    outs: &mut [(&Matrix, &mut [f32])],
    xs: &[f32],
    q8: Option<&[Q8Act]>,
    n: usize,
) {
    let cols = outs.first().map_or(0, |(m, _)| m.cols);
    assert_eq!(xs.len(), n * cols, "activation length");
    let stripes: usize = outs.iter().map(|(m, _)| m.n_stripes()).sum();
    let parts = token_parts(stripes, pool.threads(), n);
    let mut tasks: Vec<(usize, usize, usize, usize)> = Vec::new();
    for (i, (m, y)) in outs.iter().enumerate() {
        assert_eq!(m.cols, cols, "matrices of one batch share the input");
        assert_eq!(y.len(), n * m.rows, "output length");
        for s in 0..m.n_stripes() {
            for p in 0..parts {
                tasks.push((i, s, p * n / parts, (p + 1) * n / parts));
            }
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
        let (i, s, b0, b1) = tasks[t];
        let (m, p) = ptrs[i];
        let k = select::kernel(m, isa);
        let r0 = s * TILE_ROWS;
        let rows = m.stripe_rows(s);
        let nt = b1 - b0;
        // The stripe's outputs for tokens b0..b1, token-major, accumulated over the column tiles.
        let mut acc = vec![0f32; nt * rows];
        let mut bufs = Bufs::default();
        for c in 0..m.n_col_tiles() {
            let tile = tile_at(bytes, m, s, c);
            let t = if m.packed {
                Tile::body(m.quant, rows, tile.cols, tile.body)
            } else {
                Tile::split(m.quant, tile.rows, tile.cols, tile.scales, tile.qs)
            };
            let batch = Batch {
                xs,
                cols,
                q8,
                b0,
                b1,
                c0: c * TILE_COLS,
            };
            (k.matmul)(t, &batch, &mut bufs, &mut acc);
        }
        for b in b0..b1 {
            let j = b - b0;
            // SAFETY: rows [r0, r0 + rows) of token b's output lie inside the output (asserted
            // length n · m.rows), and the (matrix, stripe, token range) of each task is distinct.
            let out = unsafe { std::slice::from_raw_parts_mut(p.0.add(b * m.rows + r0), rows) };
            out.copy_from_slice(&acc[j * rows..(j + 1) * rows]);
        }
    });
}

/// Below this many stripes per thread, [`tiled_matvec_batch`] splits the tokens.
const STRIPES_PER_THREAD: usize = 8;

/// How many token ranges [`tiled_matvec_batch`] cuts a batch of `n` tokens into: 1 when there
/// are enough stripes to share out or one thread, else up to `threads`, keeping ≥ 8 tokens each.
fn token_parts(stripes: usize, threads: usize, n: usize) -> usize {
    if threads <= 1 || stripes >= STRIPES_PER_THREAD * threads {
        1
    } else {
        threads.min(n / 8).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::bench_layout::tile;
    use crate::format::EntryKind;
    #[allow(unused_imports)]
    use crate::kernels::dot::Tile;
    use crate::quant::QuantType;

    fn matrix(q: QuantType, rows: usize, cols: usize, buf: &mut Vec<u8>) -> Matrix {
        let mut rng = crate::rng::Rng::new(rows as u64 * 7 + cols as u64);
        let w = rng.fill(rows * cols, 1.0 / (cols as f32).sqrt());
        tile(
            &MatrixData::quantize(q, rows, cols, &w),
            EntryKind::Down,
            buf,
        )
    }

    /// A test activation of `n` values in [−1, 1), `x_i = ((i·a mod m) − ⌊m/2⌋) / ⌊m/2⌋`, and its
    /// Q8 quantization.
    fn ramp(n: usize, a: usize, m: usize) -> (Vec<f32>, Q8Act) {
        let h = (m / 2) as f32;
        let x: Vec<f32> = (0..n).map(|i| ((i * a % m) as f32 - h) / h).collect();
        let mut xq = Q8Act::default();
        xq.quantize_from(&x);
        (x, xq)
    }

    /// `W · x` stripe by stripe through `stripe_rows_matvec`, tile by tile via `tile_at` (the
    /// path without `packed_stripe_matvec`'s offset arithmetic): what every fused call must
    /// equal.
    fn per_stripe(isa: Isa, buf: &[u8], m: &Matrix, act: &Act) -> Vec<f32> {
        let mut y = vec![0f32; m.rows];
        for s in 0..m.n_stripes() {
            let r0 = s * TILE_ROWS;
            stripe_rows_matvec(isa, buf, m, s, 0, act, &mut y[r0..r0 + m.stripe_rows(s)]);
        }
        y
    }

    /// SmolLM2's shapes (576 = 256 + 256 + 64 columns; 576 rows = 4.5 stripes): on 1–3
    /// threads the fused matvec equals per-stripe calls bit for bit.
    #[test]
    fn fused_matvec_equals_stripe_calls_bit_for_bit_on_any_thread_count() {
        let isa = Isa::cached();
        for q in [QuantType::Q4_1, QuantType::Q4_0, QuantType::Q8_0] {
            let mut buf = Vec::new();
            let a = matrix(q, 576, 576, &mut buf);
            let b = matrix(q, 200, 576, &mut buf);
            let (x, xq) = ramp(576, 37, 101);
            for q8 in [None, Some(&xq)] {
                let act = Act { x: &x, q8 };
                let want = (
                    per_stripe(isa, &buf, &a, &act),
                    per_stripe(isa, &buf, &b, &act),
                );
                for threads in [1, 2, 3] {
                    let pool = ThreadPool::new(threads);
                    let (mut ya, mut yb) = (vec![0f32; 576], vec![0f32; 200]);
                    tiled_matvec(&pool, isa, &buf, &mut [(&a, &mut ya), (&b, &mut yb)], &act);
                    assert_eq!((ya, yb), want, "{q} q8={} threads {threads}", q8.is_some());
                }
            }
        }
    }

    /// One activation per output (the experts' down projections): ten 576×160 matrices on
    /// ten different inputs, more outputs than the stack table holds, equal per-stripe calls
    /// on each input bit for bit on 1–3 threads; a mismatched activation count is refused.
    #[test]
    fn per_output_activations_equal_separate_calls() {
        let isa = Isa::cached();
        for q in [QuantType::Q4_1, QuantType::Q8_0] {
            let mut buf = Vec::new();
            let ms: Vec<Matrix> = (0..10).map(|_| matrix(q, 576, 160, &mut buf)).collect();
            let inputs: Vec<(Vec<f32>, Q8Act)> =
                (0..10).map(|i| ramp(160, 7 + 2 * i, 97)).collect();
            let acts: Vec<Act> = inputs
                .iter()
                .map(|(x, xq)| Act { x, q8: Some(xq) })
                .collect();
            let want: Vec<Vec<f32>> = ms
                .iter()
                .zip(&acts)
                .map(|(m, a)| per_stripe(isa, &buf, m, a))
                .collect();
            for threads in [1, 2, 3] {
                let pool = ThreadPool::new(threads);
                let mut ys = vec![vec![0f32; 576]; 10];
                let mut outs: Vec<(&Matrix, &mut [f32])> = ms
                    .iter()
                    .zip(ys.iter_mut())
                    .map(|(m, y)| (m, &mut y[..]))
                    .collect();
                tiled_matvec_acts(&pool, isa, &buf, &mut outs, &acts, 1 + threads % 2);
                assert_eq!(ys, want, "{q} threads {threads}");
            }
            let pool = ThreadPool::new(1);
            let mut ys = vec![vec![0f32; 576]; 3];
            let mut outs: Vec<(&Matrix, &mut [f32])> = ms
                .iter()
                .zip(ys.iter_mut())
                .map(|(m, y)| (m, &mut y[..]))
                .collect();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                tiled_matvec_acts(&pool, isa, &buf, &mut outs, &acts[..2], 1)
            }));
            assert!(r.is_err(), "2 activations for 3 outputs must be refused");
        }
    }

    /// Repacked matrices (`quant::packed`): SmolLM2's shapes and a tall one with a 48-row last
    /// stripe, fused with a matrix left in the file's layout, on 1–4 threads, equal the
    /// per-stripe calls bit for bit, and no row is skipped (outputs start as NaN).
    #[test]
    fn repacked_matrices_equal_stripe_calls_bit_for_bit_on_any_thread_count() {
        let isa = Isa::cached();
        for q in [QuantType::Q4_1, QuantType::Q4_0, QuantType::Q8_0] {
            let mut buf = Vec::new();
            let mut a = matrix(q, 576, 576, &mut buf);
            let mut b = matrix(q, 192, 576, &mut buf);
            let mut c = matrix(q, 5 * TILE_ROWS + 48, 576, &mut buf);
            let split = matrix(q, 200, 576, &mut buf);
            for m in [&mut a, &mut b, &mut c] {
                assert!(crate::format::reader::repack_matrix(
                    &mut buf,
                    m,
                    true.into()
                ));
            }
            let (x, xq) = ramp(576, 37, 101);
            // The Q8 activation (decode's integer path) and the f32 one (the scalar fallback).
            for q8 in [Some(&xq), None] {
                let act = Act { x: &x, q8 };
                repacked_case(isa, &buf, q, [&a, &b, &c, &split], &act);
            }
        }
    }

    /// One activation of [`repacked_matrices_equal_stripe_calls_bit_for_bit_on_any_thread_count`]:
    /// `mats` fused, on 1–4 threads, and `mats[2]` alone, then [`serial_matvec`], against the
    /// per-tile path.
    fn repacked_case(isa: Isa, buf: &[u8], q: QuantType, mats: [&Matrix; 4], act: &Act) {
        let (c, q8) = (mats[2], act.q8.is_some());
        let want: Vec<Vec<f32>> = mats.iter().map(|m| per_stripe(isa, buf, m, act)).collect();
        // Every matrix in one call of `f`, the outputs starting as NaN.
        type Outs<'a, 'b> = [(&'a Matrix, &'b mut [f32])];
        let all = |f: &dyn Fn(&mut Outs)| {
            let mut ys: Vec<Vec<f32>> = mats.iter().map(|m| vec![f32::NAN; m.rows]).collect();
            let mut outs: Vec<(&Matrix, &mut [f32])> = mats
                .iter()
                .zip(ys.iter_mut())
                .map(|(m, y)| (*m, y.as_mut_slice()))
                .collect();
            f(&mut outs);
            ys
        };
        for threads in [1, 2, 3, 4] {
            let pool = ThreadPool::new(threads);
            let ys = all(&|outs| tiled_matvec(&pool, isa, buf, outs, act));
            assert_eq!(ys, want, "{q} q8={q8} threads {threads}");
            let (mut y1, w1) = (vec![f32::NAN; c.rows], &want[2]);
            tiled_matvec(&pool, isa, buf, &mut [(c, &mut y1)], act);
            assert_eq!(&y1, w1, "{q} q8={q8} threads {threads}, alone");
        }
        // `stripe_matvec` (the one-stripe entry point) takes the same path as the fused call.
        for (m, w) in mats.iter().zip(&want) {
            let mut y = vec![f32::NAN; m.rows];
            for s in 0..m.n_stripes() {
                let r0 = s * TILE_ROWS;
                stripe_matvec(isa, buf, m, s, act, &mut y[r0..r0 + m.stripe_rows(s)]);
            }
            assert_eq!(&y, w, "{q} q8={q8} stripe_matvec");
        }
        // `serial_matvec` (a pool task's own matvec) too, every matrix in one call.
        let ys = all(&|outs| serial_matvec(isa, buf, outs, act));
        assert_eq!(ys, want, "{q} q8={q8} serial_matvec");
    }

    /// A matvec of many stripes (claimed in runs of consecutive stripes, see
    /// `stripes_per_claim`) fused with a small one: every stripe is computed exactly once and
    /// equals the per-stripe call bit for bit, on 1–4 threads (outputs start as NaN, so a
    /// skipped stripe shows).
    #[test]
    fn many_stripe_matvec_claims_runs_and_stays_bit_identical() {
        let isa = Isa::cached();
        let q = QuantType::Q8_0;
        let mut buf = Vec::new();
        let tall = matrix(q, 131 * TILE_ROWS - 5, 64, &mut buf);
        let small = matrix(q, 200, 64, &mut buf);
        let (x, xq) = ramp(64, 29, 61);
        let act = Act {
            x: &x,
            q8: Some(&xq),
        };
        let want = (
            per_stripe(isa, &buf, &tall, &act),
            per_stripe(isa, &buf, &small, &act),
        );
        for threads in [1, 2, 3, 4] {
            let pool = ThreadPool::new(threads);
            let mut ys = (vec![f32::NAN; tall.rows], vec![f32::NAN; small.rows]);
            tiled_matvec(
                &pool,
                isa,
                &buf,
                &mut [(&small, &mut ys.1), (&tall, &mut ys.0)],
                &act,
            );
            assert_eq!(ys, want, "threads {threads}");
        }
        assert_eq!(stripes_per_claim(2048, 2), 64);
        assert_eq!(stripes_per_claim(2048, 1), 1);
        assert_eq!(stripes_per_claim(384, 2), 12);
        assert_eq!(stripes_per_claim(24, 2), 6);
        assert_eq!(stripes_per_claim(9, 2), 2);
        assert_eq!(stripes_per_claim(5, 2), 1);
        assert_eq!(stripes_per_claim(37, 2), 9);
    }

    /// More outputs than the stack table holds (the heap path), of unequal stripe counts (the
    /// group order skips outputs that ran out): every output equals its per-stripe calls, and
    /// no stripe is skipped (outputs start as NaN), on 1–3 threads.
    #[test]
    fn more_outputs_than_the_stack_table_stay_bit_identical() {
        let isa = Isa::cached();
        let q = QuantType::Q4_1;
        let mut buf = Vec::new();
        let rows = [
            130, 64, 300, 8, 256, 129, 40, 520, 96, 200, 33, 128, 7, 384, 90, 1, 260, 72,
        ];
        let mats: Vec<Matrix> = rows.iter().map(|&r| matrix(q, r, 64, &mut buf)).collect();
        assert!(mats.len() > MAX_OUTS);
        let (x, xq) = ramp(64, 13, 29);
        let act = Act {
            x: &x,
            q8: Some(&xq),
        };
        let want: Vec<Vec<f32>> = mats
            .iter()
            .map(|m| per_stripe(isa, &buf, m, &act))
            .collect();
        for n_outs in [3, MAX_OUTS, mats.len()] {
            for threads in [1, 2, 3] {
                let pool = ThreadPool::new(threads);
                let mut ys: Vec<Vec<f32>> = mats[..n_outs]
                    .iter()
                    .map(|m| vec![f32::NAN; m.rows])
                    .collect();
                let mut outs: Vec<(&Matrix, &mut [f32])> = mats
                    .iter()
                    .zip(ys.iter_mut())
                    .map(|(m, y)| (m, &mut y[..]))
                    .collect();
                tiled_matvec(&pool, isa, &buf, &mut outs, &act);
                assert_eq!(ys, want[..n_outs], "outputs {n_outs} threads {threads}");
            }
        }
    }

    /// Tokens are split only when the stripes cannot be shared out evenly, never below 8 tokens
    /// a part (the 300-row, 3-stripe matrix below takes the split path for n = 32 and 35).
    #[test]
    fn tokens_are_split_only_for_few_stripes() {
        assert_eq!(token_parts(3, 2, 32), 2);
        assert_eq!(token_parts(3, 2, 35), 2);
        assert_eq!(token_parts(9, 2, 32), 2);
        assert_eq!(token_parts(16, 2, 32), 1);
        assert_eq!(token_parts(3, 1, 32), 1);
        assert_eq!(token_parts(3, 2, 15), 1);
        assert_eq!(token_parts(3, 4, 32), 4);
        assert_eq!(token_parts(3, 8, 20), 2);
    }

    /// The batched prefill matvec equals the per-token matvec bit for bit, per token, on every
    /// ISA and both activation paths (so prefill in batches stays the decode's numerics): the
    /// split types and the interleaved ones a Q4_K_M file mixes (Q5_0 on 576 columns, the
    /// K-quants on 768 = 3 tiles), whose batched integer kernels run on the ISA asked for.
    #[test]
    fn batch_equals_per_token_bit_for_bit() {
        let pool = ThreadPool::new(2);
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
            for q in [
                QuantType::Q4_1,
                QuantType::Q4_0,
                QuantType::Q8_0,
                QuantType::Q5_0,
                QuantType::Q4_K,
                QuantType::Q6_K,
            ] {
                let cols = if q.is_k() { 768 } else { 576 };
                let mut buf = Vec::new();
                let m = matrix(q, 300, cols, &mut buf);
                for n in [1usize, 3, 32, 35] {
                    let xs: Vec<f32> = (0..n * cols)
                        .map(|i| ((i * 53 % 211) as f32 - 105.0) / 60.0)
                        .collect();
                    let acts: Vec<Q8Act> = xs
                        .chunks_exact(cols)
                        .map(|x| {
                            let mut a = Q8Act::default();
                            a.quantize_for(x, [q]);
                            a
                        })
                        .collect();
                    for int in [false, true] {
                        let q8 = int.then_some(&acts[..]);
                        let mut got = vec![0f32; n * 300];
                        tiled_matvec_batch(&pool, isa, &buf, &mut [(&m, &mut got)], &xs, q8, n);
                        for b in 0..n {
                            let act = Act {
                                x: &xs[b * cols..(b + 1) * cols],
                                q8: q8.map(|a| &a[b]),
                            };
                            let mut want = vec![0f32; 300];
                            tiled_matvec(&pool, isa, &buf, &mut [(&m, &mut want)], &act);
                            let got = &got[b * 300..(b + 1) * 300];
                            // Q4_K on AMX (from 8 tokens) sums each row in one lane too
                            // (`kquant_amx::kquant`).
                            let amx_k = q == QuantType::Q4_K
                                && n >= crate::kernels::dot::packed::AMX_MIN_TOKENS
                                && crate::kernels::dot::packed_amx::available();
                            let lanes = q == QuantType::Q5_0 || amx_k;
                            if int && lanes && isa == Isa::Avx512 && isa.has_vnni() {
                                // Q5_0's VNNI batch sums each block in one lane per row
                                // (`kquant_batch::q5_0_lanes`): the same value within the
                                // kernels' bound, 1e-4 of the output's norm.
                                let norm = want.iter().map(|v| v * v).sum::<f32>().sqrt();
                                for (g, w) in got.iter().zip(&want) {
                                    assert!((g - w).abs() <= 1e-4 * norm + 1e-6, "{q} token {b}");
                                }
                                continue;
                            }
                            assert_eq!(got, &want[..], "{q} {isa:?} int={int} n={n} token {b}");
                        }
                    }
                }
            }
        }
    }
}
