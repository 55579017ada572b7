//! The views a validated file hands out: a matrix (its stripes and tiles), an expert, a
//! layer, the vocabulary; a tile as plain slices of the mapping; and the in-place repacking.

use crate::format::header::*;
use crate::format::{TILE_COLS, TILE_ROWS};
use crate::quant::QuantType;

/// A validated matrix stored as tiles: the offsets of its output stripes.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    pub kind: EntryKind,
    pub quant: QuantType,
    pub rows: usize,
    pub cols: usize,
    /// Absolute file offset of each stripe's first tile header.
    pub stripes: Vec<usize>,
    /// The tiles are in the repacked layout of `quant::packed` in the bytes this view is read
    /// from (set only on a resident copy, by [`CflowFile::make_resident`]; files never hold it).
    pub packed: bool,
    /// The kernel that runs this matrix's tiles: [`KernelId::UNSET`] until the engine binds one
    /// ([`CflowFile::bind_kernels`]) when the model is opened.
    pub kernel: KernelId,
}

/// Which kernel runs a matrix: an index into `kernels::dot::select`'s table (with the ISA it was
/// chosen for), set when the model is opened ([`CflowFile::bind_kernels`]). Opaque here: only
/// `kernels::dot::select` makes and reads one. [`KernelId::UNSET`] (a matrix built by hand, or
/// one whose layout changed) means the matvec chooses at call time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelId(pub u16);

impl KernelId {
    /// No kernel bound: chosen at call time.
    pub const UNSET: KernelId = KernelId(u16::MAX);
}

impl Default for KernelId {
    fn default() -> Self {
        KernelId::UNSET
    }
}

impl Matrix {
    pub fn n_stripes(&self) -> usize {
        self.stripes.len()
    }
    pub fn stripe_rows(&self, s: usize) -> usize {
        (self.rows - s * TILE_ROWS).min(TILE_ROWS)
    }
    pub fn n_col_tiles(&self) -> usize {
        self.cols.div_ceil(TILE_COLS)
    }
    pub fn tile_cols(&self, c: usize) -> usize {
        (self.cols - c * TILE_COLS).min(TILE_COLS)
    }
    /// Bytes of one stripe (all its tiles, headers included).
    pub fn stripe_bytes(&self, s: usize) -> usize {
        let r = self.stripe_rows(s);
        (0..self.n_col_tiles())
            .map(|c| tile_bytes(self.quant, r, self.tile_cols(c)))
            .sum()
    }
    /// Bytes streamed by one full matvec over this matrix (tile headers included). Every
    /// stripe but the last is full height, so this is one full stripe's bytes times their
    /// count plus the last stripe's (decode reports it per layer and token).
    pub fn bytes(&self) -> usize {
        match self.n_stripes() {
            0 => 0,
            n => (n - 1) * self.stripe_bytes(0) + self.stripe_bytes(n - 1),
        }
    }
    /// Weight bytes without tile headers or scales (the paper's payload convention).
    pub fn payload_bytes(&self) -> f64 {
        self.rows as f64 * self.cols as f64 * self.quant.payload_bits_per_weight() / 8.0
    }
    /// Offset of tile (s, c) relative to nothing: absolute in the file.
    pub fn tile_offset(&self, s: usize, c: usize) -> usize {
        self.stripes[s] + c * tile_bytes(self.quant, self.stripe_rows(s), TILE_COLS)
    }
}

/// A zero-copy view of one tile inside the mapping.
#[derive(Clone, Copy, Debug)]
pub struct MappedTile<'a> {
    pub header: TileHeader,
    pub rows: usize,
    pub cols: usize,
    pub scales: &'a [u8],
    pub qs: &'a [u8],
    /// The whole body (`scales` then `qs`); in the repacked layout when `packed`, where the
    /// split into `scales` and `qs` means nothing.
    pub body: &'a [u8],
    pub packed: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ExpertView {
    pub offset: u64,
    pub len: u64,
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LayerView {
    pub offset: u64,
    pub len: u64,
    pub q: Matrix,
    pub k: Matrix,
    pub v: Matrix,
    pub o: Matrix,
    pub gate: Option<Matrix>,
    pub up: Option<Matrix>,
    pub down: Option<Matrix>,
    pub attn_norm: Vec<f32>,
    pub ffn_norm: Option<Vec<f32>>,
    pub moe_norm: Option<Vec<f32>>,
    /// `moe_norm == ffn_norm`, compared once when the layer is read: the experts' input may
    /// then be the shared expert's (moefy's files). Decode asked this per layer and token, and
    /// the two cold 2 KiB vectors showed in its profile.
    pub moe_norm_is_ffn_norm: bool,
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    /// Q / K RMSNorm weights (`FLAG_QK_NORM`; per head with `FLAG_QK_NORM_PER_HEAD`).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// RMSNorms of the attention and FFN outputs (`FLAG_POST_NORMS`).
    pub post_attn_norm: Option<Vec<f32>>,
    pub post_ffn_norm: Option<Vec<f32>>,
    /// The shared expert's sigmoid gate over the dense FFN (Qwen2-MoE; `EntryKind::SharedGate`).
    pub shared_gate: Option<Vec<f32>>,
    pub router: Option<Vec<f32>>,
    /// A bias per expert added to the router logits (`moefy`; `EntryKind::RouterBias`).
    pub router_bias: Option<Vec<f32>>,
    pub experts: Vec<ExpertView>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct VocabView {
    pub offset: u64,
    pub len: u64,
    pub embedding: Matrix,
    pub lm_head: Option<Matrix>,
    pub final_norm: Vec<f32>,
}

impl LayerView {
    /// The layer's dense (non-expert) matrices: Q, K, V, O and, when present, gate, up, down.
    pub fn dense_matrices(&self) -> impl Iterator<Item = &Matrix> {
        [
            Some(&self.q),
            Some(&self.k),
            Some(&self.v),
            Some(&self.o),
            self.gate.as_ref(),
            self.up.as_ref(),
            self.down.as_ref(),
        ]
        .into_iter()
        .flatten()
    }

    /// [`LayerView::dense_matrices`], mutable (same order).
    pub fn dense_matrices_mut(&mut self) -> impl Iterator<Item = &mut Matrix> {
        let LayerView {
            q,
            k,
            v,
            o,
            gate,
            up,
            down,
            ..
        } = self;
        [
            Some(q),
            Some(k),
            Some(v),
            Some(o),
            gate.as_mut(),
            up.as_mut(),
            down.as_mut(),
        ]
        .into_iter()
        .flatten()
    }
}

/// Repacks every tile of `m` inside `bytes` (`quant::packed`) and marks it, when `repack`
/// includes its type and all of its stripes are whole 16-row groups; else leaves it as it is.
pub(crate) fn repack_matrix(
    bytes: &mut [u8],
    m: &mut Matrix,
    repack: crate::quant::packed::Repack,
) -> bool {
    if m.packed
        || !repack.includes(m.quant)
        || !(0..m.n_stripes()).all(|s| crate::quant::packed::packable(m.quant, m.stripe_rows(s)))
    {
        return m.packed;
    }
    for s in 0..m.n_stripes() {
        for c in 0..m.n_col_tiles() {
            let (rows, cols) = (m.stripe_rows(s), m.tile_cols(c));
            let body = m.tile_offset(s, c) + TileHeader::SIZE;
            let len = m.quant.matrix_bytes(rows, cols);
            crate::quant::packed::pack_tile(m.quant, rows, cols, &mut bytes[body..body + len]);
        }
    }
    m.packed = true;
    // Its kernel was chosen for the file's layout: bind again (`CflowFile::bind_kernels`).
    m.kernel = KernelId::UNSET;
    true
}

/// Zero-copy view of tile (s, c) of a validated matrix inside `bytes`.
pub fn tile_at<'a>(bytes: &'a [u8], m: &Matrix, s: usize, c: usize) -> MappedTile<'a> {
    let off = m.tile_offset(s, c);
    let rows = m.stripe_rows(s);
    let cols = m.tile_cols(c);
    let header = TileHeader::decode(&bytes[off..off + TileHeader::SIZE]).expect("validated");
    let body = off + TileHeader::SIZE;
    let sbytes = rows * m.quant.row_scale_bytes(cols);
    let total = m.quant.matrix_bytes(rows, cols);
    MappedTile {
        header,
        rows,
        cols,
        scales: &bytes[body..body + sbytes],
        qs: &bytes[body + sbytes..body + total],
        body: &bytes[body..body + total],
        packed: m.packed,
    }
}
