//! Where a token's weights come from: the active mapped file (`.cflow` or its `.vflow` twin) or
//! the in-memory row-major baseline copy, and the matvec over them ([`Weights::mv`]). Also the
//! embedding lookup, expert views relative to their region (for staging slots), and the byte
//! spans handed to the prefetch thread.

use crate::format::reader::{ExpertView, Matrix};
use crate::format::{CflowFile, MatrixData};
use crate::kernels::matvec::{rowmajor_matvec, tiled_matvec, tiled_matvec_acts, Act};
use crate::kernels::pool::ThreadPool;
use crate::kernels::{Isa, Q8Act};
use crate::model::ModelConfig;
use crate::quant::QuantType;
use std::collections::HashMap;

/// Row-major copies of every matrix, keyed by (layer, kind, expert); the LM head is layer
/// `usize::MAX`, a matrix outside the routed experts has no expert (`None`).
pub type RowMajorWeights = HashMap<(usize, u8, Option<u8>), MatrixData>;

/// The weights and kernels one stream of a token uses. `Sync` parts are shared between the
/// streams of the vertical schedule; each stream brings its own `pool`.
pub struct Weights<'a> {
    pub file: &'a CflowFile,
    pub cfg: &'a ModelConfig,
    pub pool: &'a ThreadPool,
    pub isa: Isa,
    /// Quantize activations to Q8 for blocked weight types.
    pub q8: bool,
    pub rowmajor: Option<&'a RowMajorWeights>,
    /// Replace the routers' selection by the oracle's ([`super::options::EngineOptions::oracle_router`]).
    pub oracle: bool,
}

impl Weights<'_> {
    /// `outs[i].1 = outs[i].0 · x` for matrices of one layer sharing one input.
    pub fn mv(
        &self,
        layer: usize,
        expert: Option<u8>,
        xq: &mut Q8Act,
        x: &[f32],
        outs: &mut [(&Matrix, &mut [f32])],
    ) {
        self.mv_in(self.file.bytes(), layer, expert, xq, x, outs)
    }

    /// As `mv`, with the tiles read from `bytes` (the mapping, or a staging slot holding one
    /// expert region with region-relative stripe offsets).
    pub fn mv_in(
        &self,
        bytes: &[u8],
        layer: usize,
        expert: Option<u8>,
        xq: &mut Q8Act,
        x: &[f32],
        outs: &mut [(&Matrix, &mut [f32])],
    ) {
        let use_q8 = self.q8_for(x, outs.iter().map(|(m, _)| m.quant));
        if use_q8 {
            xq.quantize_for(x, outs.iter().map(|(m, _)| m.quant));
        }
        let act = Act {
            x,
            q8: if use_q8 { Some(&*xq) } else { None },
        };
        match self.rowmajor {
            Some(rm) => {
                for (m, y) in outs.iter_mut() {
                    let md = &rm[&(layer, m.kind as u8, expert)];
                    rowmajor_matvec(self.pool, self.isa, md, &act, y);
                }
            }
            None => tiled_matvec(self.pool, self.isa, bytes, outs, &act),
        }
    }

    /// Several matvecs of one layer in one pool run: output `i` is matrix `outs[i].0` of expert
    /// `experts[i]` of `layer` (`at`: the row-major copy's key) on activation `xs[i]`, or on
    /// `xs[0]` when only one is given; `xqs[j]` receives the Q8 copy of `xs[j]`; `group` as in
    /// [`tiled_matvec_acts`]. Each output's arithmetic is that of [`Weights::mv_in`] on its own
    /// (a stripe is computed whole by one task).
    pub fn mv_each(
        &self,
        bytes: &[u8],
        (layer, experts): (usize, &[Option<u8>]),
        group: usize,
        xqs: &mut [Q8Act],
        xs: &[&[f32]],
        outs: &mut [(&Matrix, &mut [f32])],
    ) {
        assert!(
            xs.len() == 1 || xs.len() == outs.len(),
            "one input, or one per output"
        );
        assert_eq!(experts.len(), outs.len(), "one expert id per output");
        assert!(xqs.len() >= xs.len(), "one Q8 buffer per input");
        let which = |i: usize| if xs.len() == 1 { 0 } else { i };
        let mut q8 = [false; 32];
        let mut q8_heap = Vec::new();
        let q8: &mut [bool] = if xs.len() <= q8.len() {
            &mut q8[..xs.len()]
        } else {
            q8_heap.resize(xs.len(), false);
            &mut q8_heap
        };
        for (j, (x, xq)) in xs.iter().zip(xqs.iter_mut()).enumerate() {
            let users = || outs.iter().enumerate().filter(move |(i, _)| which(*i) == j);
            if self.q8_for(x, users().map(|(_, (m, _))| m.quant)) {
                xq.quantize_for(x, users().map(|(_, (m, _))| m.quant));
                q8[j] = true;
            }
        }
        let acts: Vec<Act> = xs
            .iter()
            .zip(xqs.iter())
            .zip(q8.iter())
            .map(|((x, xq), &q)| Act {
                x,
                q8: if q { Some(xq) } else { None },
            })
            .collect();
        match self.rowmajor {
            Some(rm) => {
                for (i, (m, y)) in outs.iter_mut().enumerate() {
                    let md = &rm[&(layer, m.kind as u8, experts[i])];
                    rowmajor_matvec(self.pool, self.isa, md, &acts[which(i)], y);
                }
            }
            None => tiled_matvec_acts(self.pool, self.isa, bytes, outs, &acts, group),
        }
    }

    /// Whether matvecs of input `x` into matrices of types `quants` take the Q8 activation:
    /// Q8 is on, some matrix is blocked, and `x` is whole blocks.
    pub fn q8_for(&self, x: &[f32], quants: impl IntoIterator<Item = QuantType>) -> bool {
        self.q8 && x.len().is_multiple_of(32) && quants.into_iter().any(|q| q.is_blocked())
    }

    /// The same weights with the matvecs split over `pool`.
    pub fn with_pool<'b>(&'b self, pool: &'b ThreadPool) -> Weights<'b> {
        Weights {
            file: self.file,
            cfg: self.cfg,
            pool,
            isa: self.isa,
            q8: self.q8,
            rowmajor: self.rowmajor,
            oracle: self.oracle,
        }
    }
}

/// Whether matvecs use Q8 activations: requested, and an integer kernel exists (any ISA but
/// scalar, or forced with `CFLOW_FORCE_INT`).
pub fn use_q8(int_act: bool, force_int: bool, isa: Isa) -> bool {
    int_act && (isa != Isa::Scalar || force_int)
}

/// A token's input to the first layer (decode and prefill): embedding row `token`, times √d on
/// a model that scales its embeddings (Gemma).
pub fn embed_input(file: &CflowFile, cfg: &ModelConfig, token: u32, out: &mut [f32]) {
    embed(file, token, out);
    if cfg.embed_scale() {
        let k = (cfg.d_model as f32).sqrt();
        out.iter_mut().for_each(|v| *v *= k);
    }
}

/// Dequantizes embedding row `token` into `out`.
pub fn embed(file: &CflowFile, token: u32, out: &mut [f32]) {
    let m = &file.vocab.embedding;
    let t = token as usize;
    let s = t / crate::format::TILE_ROWS;
    let r = t % crate::format::TILE_ROWS;
    for c in 0..m.n_col_tiles() {
        let tile = file.tile(m, s, c);
        let q = m.quant;
        let c0 = c * crate::format::TILE_COLS;
        if tile.packed {
            let (sc, qs) = crate::quant::packed::unpack_row(q, tile.rows, tile.cols, tile.body, r);
            crate::quant::dequantize_row(q, &sc, &qs, &mut out[c0..c0 + tile.cols]);
            continue;
        }
        let (sb, qb) = (q.row_scale_bytes(tile.cols), q.row_quant_bytes(tile.cols));
        crate::quant::dequantize_row(
            q,
            &tile.scales[r * sb..(r + 1) * sb],
            &tile.qs[r * qb..(r + 1) * qb],
            &mut out[c0..c0 + tile.cols],
        );
    }
}

/// Row-major copies of every matrix of `f` (the naive baseline layout).
pub fn build_rowmajor(f: &CflowFile) -> RowMajorWeights {
    let mut rm = HashMap::new();
    for (li, l) in f.layers.iter().enumerate() {
        for m in l.dense_matrices() {
            rm.insert((li, m.kind as u8, None), f.matrix_data(m));
        }
        for (ei, e) in l.experts.iter().enumerate() {
            for m in [&e.gate, &e.up, &e.down] {
                rm.insert((li, m.kind as u8, Some(ei as u8)), f.matrix_data(m));
            }
        }
    }
    let lm = f.lm_head();
    rm.insert((usize::MAX, lm.kind as u8, None), f.matrix_data(lm));
    rm
}

/// `e` with every stripe offset made relative to the start of its region, each matrix bound to
/// its kernel on `isa`.
fn relative_expert(e: &ExpertView, isa: Isa) -> ExpertView {
    let rel = |m: &Matrix| Matrix {
        stripes: m.stripes.iter().map(|&o| o - e.offset as usize).collect(),
        // A region read from the file is in the file's tile layout, even when the resident
        // copy's expert is repacked (`CflowFile::make_resident`): its kernel is the layout's.
        packed: false,
        kernel: crate::kernels::dot::select::select(m.quant, false, isa),
        ..m.clone()
    };
    ExpertView {
        offset: 0,
        len: e.len,
        gate: rel(&e.gate),
        up: rel(&e.up),
        down: rel(&e.down),
    }
}

/// Expert views with stripe offsets relative to their region start, per physical layer, their
/// matrices bound to their kernels on `isa`.
pub fn relative_experts(f: &CflowFile, isa: Isa) -> Vec<Vec<ExpertView>> {
    f.layers
        .iter()
        .map(|l| l.experts.iter().map(|e| relative_expert(e, isa)).collect())
        .collect()
}

/// Byte span [start, end) covering the tiles of `ms`.
pub fn span(ms: &[Option<&Matrix>]) -> Option<(usize, usize)> {
    let mut r: Option<(usize, usize)> = None;
    for m in ms.iter().flatten() {
        for (s, &o) in m.stripes.iter().enumerate() {
            let e = o + m.stripe_bytes(s);
            r = Some(match r {
                None => (o, e),
                Some((a, b)) => (a.min(o), b.max(e)),
            });
        }
    }
    r
}
