//! Validating zero-copy `.cflow` reader. `CflowFile::open` maps the file and checks every
//! offset, length, geometry field and tile header against the file size and the header before
//! anything is handed out; afterwards `MappedTile`s are plain slices of the mapping.

use super::content::{self, ContentHash};
use super::error::FormatError;
use super::header::*;
use super::mmap::ModelMap;
use super::writer::{ExpertData, LayerData, MatrixData, VocabData};
use super::{TILE_COLS, TILE_ROWS};
use crate::model::{CombineStyle, ModelConfig, ModelMeta};
use crate::quant::{QuantType, QK};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

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

/// An open, fully validated `.cflow` file.
pub struct CflowFile {
    pub path: PathBuf,
    map: ModelMap,
    pub header: GlobalHeader,
    pub cfg: ModelConfig,
    pub layers: Vec<LayerView>,
    pub vocab: VocabView,
    /// Content hash of the `.cflow` these views represent: recorded in the metadata, else
    /// computed on first use (`content_hash`).
    content: OnceLock<ContentHash>,
    /// The views come from a `.vflow` twin: the content hash (when not recorded) is that of the
    /// `.cflow` the writer would lay out from these views.
    from_twin: bool,
    /// [`CflowFile::make_resident`] repacked at least one matrix.
    repacked: bool,
}

impl std::fmt::Debug for CflowFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CflowFile")
            .field("path", &self.path)
            .finish()
    }
}

/// Upper bounds that keep every size computation far from overflow.
const MAX_DIM: u64 = 1 << 20;
const MAX_LAYERS: u64 = 4096;
const MAX_EXPERTS: u64 = 255;

pub(crate) struct V<'a> {
    pub(crate) file: &'a Path,
    pub(crate) bytes: &'a [u8],
}

impl<'a> V<'a> {
    pub(crate) fn size(&self) -> u64 {
        self.bytes.len() as u64
    }
    pub(crate) fn range(&self, what: &str, off: u64, len: u64) -> Result<&'a [u8], FormatError> {
        let end = off.checked_add(len).ok_or_else(|| FormatError::Overflow {
            file: self.file.into(),
            what: what.into(),
        })?;
        if end > self.size() {
            return Err(FormatError::OutOfBounds {
                file: self.file.into(),
                what: what.into(),
                offset: off,
                len,
                size: self.size(),
            });
        }
        Ok(&self.bytes[off as usize..end as usize])
    }
    pub(crate) fn field(
        &self,
        field: &'static str,
        value: impl ToString,
        why: &str,
    ) -> FormatError {
        FormatError::BadField {
            file: self.file.into(),
            field,
            value: value.to_string(),
            why: why.into(),
        }
    }
    pub(crate) fn mismatch(
        &self,
        what: String,
        expected: impl ToString,
        found: impl ToString,
    ) -> FormatError {
        FormatError::Mismatch {
            file: self.file.into(),
            what,
            expected: expected.to_string(),
            found: found.to_string(),
        }
    }
    fn f32s(&self, what: &str, off: u64, n: u64) -> Result<Vec<f32>, FormatError> {
        let len = n.checked_mul(4).ok_or_else(|| FormatError::Overflow {
            file: self.file.into(),
            what: what.into(),
        })?;
        let b = self.range(what, off, len)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// Validates the header fields and builds the config (metadata parsed separately).
pub(crate) fn config_from_header(
    v: &V,
    h: &GlobalHeader,
    meta: ModelMeta,
) -> Result<ModelConfig, FormatError> {
    let chk = |field: &'static str, val: u64, lo: u64, hi: u64| -> Result<(), FormatError> {
        if val < lo || val > hi {
            Err(v.field(field, val, &format!("must be in [{lo}, {hi}]")))
        } else {
            Ok(())
        }
    };
    chk("n_layers", h.n_layers as u64, 1, MAX_LAYERS)?;
    chk("d_model", h.d_model as u64, 32, MAX_DIM)?;
    chk("n_heads", h.n_heads as u64, 1, 4096)?;
    chk("n_kv_heads", h.n_kv_heads as u64, 1, h.n_heads as u64)?;
    chk("head_dim", h.head_dim as u64, 2, 4096)?;
    chk("d_ff", h.d_ff as u64, 0, MAX_DIM)?;
    chk("vocab", h.vocab as u64, 1, 1 << 24)?;
    chk("n_experts", h.n_experts as u64, 0, MAX_EXPERTS)?;
    chk("top_k", h.top_k as u64, 0, h.n_experts as u64)?;
    chk("expert_ffn", h.expert_ffn as u64, 0, MAX_DIM)?;
    chk("max_ctx", h.max_ctx as u64, 1, 1 << 24)?;
    if !h.n_heads.is_multiple_of(h.n_kv_heads) {
        return Err(v.field("n_kv_heads", h.n_kv_heads, "must divide n_heads"));
    }
    if !h.d_model.is_multiple_of(QK as u32) {
        return Err(v.field("d_model", h.d_model, "must be a multiple of 32"));
    }
    if !h.head_dim.is_multiple_of(2) {
        return Err(v.field("head_dim", h.head_dim, "must be even (RoPE pairs)"));
    }
    let eps = h.rms_eps;
    if !(eps.is_finite() && eps > 0.0 && eps < 1.0) {
        return Err(v.field("rms_eps", eps, "must be in (0, 1)"));
    }
    let theta = h.rope_theta;
    if !crate::model::rope_theta_ok(theta) {
        return Err(v.field("rope_theta", theta, crate::model::ROPE_THETA_RULE));
    }
    let cap = h.final_logit_softcap;
    if !(cap.is_finite() && cap >= 0.0) {
        return Err(v.field("final_logit_softcap", cap, "must be >= 0"));
    }
    if !(meta.clip_qkv.is_finite() && meta.clip_qkv >= 0.0) {
        return Err(FormatError::BadMetadata {
            file: v.file.into(),
            why: format!("clip_qkv {} must be >= 0 (0 = off)", meta.clip_qkv),
        });
    }
    let style = CombineStyle::from_u8(h.combine_style).ok_or_else(|| {
        v.field(
            "combine_style",
            h.combine_style,
            "unknown combine style (0..=6)",
        )
    })?;
    if h.n_experts > 0 && (h.top_k == 0 || h.expert_ffn == 0) {
        return Err(v.field("top_k", h.top_k, "MoE model needs top_k and expert_ffn > 0"));
    }
    if h.dense_delay as u16 >= h.n_layers || h.expert_delay as u16 >= h.n_layers.max(1) + 8 {
        return Err(v.field(
            "dense_delay",
            h.dense_delay,
            "delay must be smaller than n_layers",
        ));
    }
    let cfg = ModelConfig {
        n_layers: h.n_layers as usize,
        d_model: h.d_model as usize,
        n_heads: h.n_heads as usize,
        n_kv_heads: h.n_kv_heads as usize,
        head_dim: h.head_dim as usize,
        d_ff: h.d_ff as usize,
        n_experts: h.n_experts as usize,
        top_k: h.top_k as usize,
        expert_ffn: h.expert_ffn as usize,
        vocab: h.vocab as usize,
        max_ctx: h.max_ctx as usize,
        rms_eps: eps,
        rope_theta: theta,
        dense_delay: h.dense_delay as usize,
        expert_delay: h.expert_delay as usize,
        combine_style: style,
        feature_flags: h.feature_flags,
        final_logit_softcap: cap,
        meta,
    };
    cfg.check_meta().map_err(|p| FormatError::BadMetaField {
        file: v.file.into(),
        field: p.field,
        value: p.value,
        why: p.why,
    })?;
    Ok(cfg)
}

/// Walks a group of matrices stored interleaved by stripe from `start`, validating every tile
/// header; returns the stripe offsets per member and the end offset.
#[allow(clippy::too_many_arguments)]
pub(crate) fn walk_group(
    v: &V,
    what: &str,
    layer: u16,
    expert: u8,
    members: &mut [&mut Matrix],
    start: u64,
    end: u64,
) -> Result<u64, FormatError> {
    let max_stripes = members
        .iter()
        .map(|m| m.rows.div_ceil(TILE_ROWS))
        .max()
        .unwrap_or(0);
    let mut pos = start;
    for s in 0..max_stripes {
        for m in members.iter_mut() {
            if s >= m.rows.div_ceil(TILE_ROWS) {
                continue;
            }
            m.stripes.push(pos as usize);
            let rows = m.stripe_rows(s);
            for c in 0..m.n_col_tiles() {
                let cols = m.tile_cols(c);
                let tw = format!("{what} {:?} stripe {s} tile {c}", m.kind);
                let hb = v.range(&format!("{tw} header"), pos, TileHeader::SIZE as u64)?;
                let th = TileHeader::decode(hb).expect("16 bytes");
                let expect = TileHeader {
                    layer_id: layer,
                    matrix_id: m.kind as u8,
                    expert_id: expert,
                    row_offset: (s * TILE_ROWS) as u32,
                    col_offset: (c * TILE_COLS) as u16,
                    tile_rows: rows as u16,
                    tile_cols: cols as u16,
                    quant_group: m.quant as u16,
                };
                if th != expect {
                    return Err(v.mismatch(
                        format!("{tw} header (offset {pos})"),
                        format!("{expect:?}"),
                        format!("{th:?}"),
                    ));
                }
                let tb = tile_bytes(m.quant, rows, cols) as u64;
                if pos + tb > end {
                    return Err(FormatError::OutOfBounds {
                        file: v.file.into(),
                        what: format!("{tw} data (region ends at {end})"),
                        offset: pos,
                        len: tb,
                        size: v.size(),
                    });
                }
                v.range(&tw, pos, tb)?;
                pos += tb;
            }
        }
    }
    Ok(pos)
}

fn new_matrix(
    v: &V,
    e: &DirEntry,
    kind: EntryKind,
    rows: usize,
    cols: usize,
    what: &str,
) -> Result<Matrix, FormatError> {
    let quant = QuantType::from_u8(e.quant)
        .ok_or_else(|| v.field("dir.quant", e.quant, &format!("{what}: unknown quant type")))?;
    if e.rows as usize != rows || e.cols as usize != cols {
        return Err(v.mismatch(
            format!("{what} {kind:?} dimensions"),
            format!("{rows}×{cols} (from the header)"),
            format!("{}×{}", { e.rows }, { e.cols }),
        ));
    }
    if !cols.is_multiple_of(quant.block_len()) {
        return Err(v.field(
            "dir.cols",
            cols,
            &format!("{what}: not a multiple of {} ({quant})", quant.block_len()),
        ));
    }
    if cols > u16::MAX as usize {
        return Err(v.field("dir.cols", cols, "more than 65535 columns"));
    }
    Ok(Matrix {
        kind,
        quant,
        rows,
        cols,
        stripes: Vec::new(),
        packed: false,
    })
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

/// Parsed directory of a region.
struct Dir {
    entries: Vec<(EntryKind, DirEntry)>,
}

impl Dir {
    fn get(&self, k: EntryKind) -> Option<&DirEntry> {
        self.entries.iter().find(|(kk, _)| *kk == k).map(|(_, e)| e)
    }
}

fn read_dir(v: &V, what: &str, off: u64, len: u64, layer: u32) -> Result<Dir, FormatError> {
    read_dir_in(v, what, off, (off, len), None, layer)
}

/// Reads the directory at `dir_off`; its entries must lie inside `region` (offset, length),
/// except the expert table and expert descriptors, which must lie inside `bank` when given
/// (`.vflow`: the directories of a group share the group's span, experts live in the bank).
fn read_dir_in(
    v: &V,
    what: &str,
    dir_off: u64,
    region: (u64, u64),
    bank: Option<(u64, u64)>,
    layer: u32,
) -> Result<Dir, FormatError> {
    let (off, len) = region;
    let hb = v.range(
        &format!("{what} directory header"),
        dir_off,
        DirHeader::SIZE as u64,
    )?;
    let dh = DirHeader::decode(hb).expect("16 bytes");
    if dh.magic != DIR_MAGIC {
        return Err(v.mismatch(
            format!("{what} directory magic"),
            "LDIR",
            format!("{:?}", dh.magic),
        ));
    }
    if dh.layer != layer {
        return Err(v.mismatch(format!("{what} directory layer index"), layer, dh.layer));
    }
    let n = dh.n_entries as u64;
    if n > 64
        || dir_off < off
        || dir_off - off + DirHeader::SIZE as u64 + n * DirEntry::SIZE as u64 > len
    {
        return Err(v.field(
            "dir.n_entries",
            n,
            &format!("{what}: does not fit its region"),
        ));
    }
    let mut entries = Vec::new();
    for i in 0..n {
        let eb = v.range(
            &format!("{what} directory entry {i}"),
            dir_off + DirHeader::SIZE as u64 + i * DirEntry::SIZE as u64,
            DirEntry::SIZE as u64,
        )?;
        let e = DirEntry::decode(eb).expect("32 bytes");
        let kind = EntryKind::from_u8(e.kind).ok_or_else(|| {
            v.field(
                "dir.kind",
                e.kind,
                &format!("{what} entry {i}: unknown kind"),
            )
        })?;
        let (eo, el) = (e.offset, e.length);
        let end = eo.checked_add(el).ok_or_else(|| FormatError::Overflow {
            file: v.file.into(),
            what: format!("{what} entry {kind:?}"),
        })?;
        let is_expert = matches!(
            kind,
            EntryKind::ExpertTable
                | EntryKind::ExpertGate
                | EntryKind::ExpertUp
                | EntryKind::ExpertDown
        );
        let (off, len) = match bank {
            Some(b) if is_expert => b,
            _ => (off, len),
        };
        if eo < off || end > off + len {
            return Err(FormatError::OutOfBounds {
                file: v.file.into(),
                what: format!("{what} entry {kind:?} (region [{off}, +{len}))"),
                offset: eo,
                len: el,
                size: v.size(),
            });
        }
        if entries.iter().any(|(k, _)| *k == kind) {
            return Err(v.field(
                "dir.kind",
                e.kind,
                &format!("{what}: duplicate entry {kind:?}"),
            ));
        }
        entries.push((kind, e));
    }
    Ok(Dir { entries })
}

fn read_vector(
    v: &V,
    dir: &Dir,
    k: EntryKind,
    n: usize,
    what: &str,
) -> Result<Option<Vec<f32>>, FormatError> {
    let Some(e) = dir.get(k) else { return Ok(None) };
    if e.length != n as u64 * 4 || e.quant != QuantType::F32 as u8 {
        return Err(v.mismatch(format!("{what} {k:?} length"), n * 4, e.length));
    }
    Ok(Some(v.f32s(
        &format!("{what} {k:?}"),
        e.offset,
        n as u64,
    )?))
}

/// Reads and validates the matrices of a group entry set.
fn group(
    v: &V,
    dir: &Dir,
    what: &str,
    layer: u16,
    specs: &[(EntryKind, usize, usize)],
) -> Result<Option<Vec<Matrix>>, FormatError> {
    let first = match dir.get(specs[0].0) {
        Some(e) => *e,
        None => return Ok(None),
    };
    let mut mats = Vec::new();
    for (k, r, c) in specs {
        let e = dir.get(*k).ok_or_else(|| {
            v.mismatch(
                format!("{what} directory"),
                format!("entry {k:?}"),
                "missing",
            )
        })?;
        if e.offset != first.offset || e.length != first.length {
            return Err(v.mismatch(format!("{what} {k:?} group region"), first.offset, e.offset));
        }
        mats.push(new_matrix(v, e, *k, *r, *c, what)?);
    }
    let end = first.offset + first.length;
    let mut refs: Vec<&mut Matrix> = mats.iter_mut().collect();
    let stop = walk_group(v, what, layer, 0xFF, &mut refs, first.offset, end)?;
    if stop != end {
        return Err(v.mismatch(
            format!("{what} {:?} group length", specs[0].0),
            end - first.offset,
            stop - first.offset,
        ));
    }
    Ok(Some(mats))
}

impl CflowFile {
    /// Opens and fully validates a `.cflow` file (a regular file: a FIFO or a device is refused
    /// without blocking on it).
    pub fn open(path: &Path) -> Result<CflowFile, FormatError> {
        let map = ModelMap::open(path)?;
        let size = map.len() as u64;
        if size < GlobalHeader::SIZE as u64 {
            return Err(FormatError::TooSmall {
                file: path.into(),
                size,
                needed: GlobalHeader::SIZE as u64,
            });
        }
        let (header, cfg, layers, vocab) = Self::validate(path, &map)?;
        let mb = &map[header.metadata_offset as usize..][..header.metadata_len as usize];
        let (stored, _) = content::read_from_metadata(path, mb)?;
        if map.check_unchanged().is_err() {
            // Truncated while we validated it: what we read may be zeros.
            return Err(FormatError::Changed {
                file: path.into(),
                why: "it changed while it was being opened".into(),
            });
        }
        Ok(CflowFile::from_parts(
            path, map, header, cfg, layers, vocab, stored, false,
        ))
    }

    /// Assembles a file from views validated against `map` (used by the `.vflow` reader, so the
    /// engine and the fetcher run unchanged on either file). `content` is the recorded content
    /// hash; `from_twin` marks `.vflow` views.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_parts(
        path: &Path,
        map: ModelMap,
        header: GlobalHeader,
        cfg: ModelConfig,
        layers: Vec<LayerView>,
        vocab: VocabView,
        content: Option<ContentHash>,
        from_twin: bool,
    ) -> CflowFile {
        let cell = OnceLock::new();
        if let Some(h) = content {
            let _ = cell.set(h);
        }
        CflowFile {
            path: path.into(),
            map,
            header,
            cfg,
            layers,
            vocab,
            content: cell,
            from_twin,
            repacked: false,
        }
    }

    /// True when the content hash was recorded in the file (false: `content_hash` computes it,
    /// reading every region once).
    pub fn has_recorded_content_hash(&self) -> bool {
        self.content.get().is_some()
    }

    /// The content hash of the model (docs/FORMAT.md, "Content hash"): recorded in the metadata
    /// by the writer; for files written before that, computed here on first use (one pass over
    /// the data). For `.vflow` views it is the source `.cflow`'s.
    pub fn content_hash(&self) -> ContentHash {
        *self.content.get_or_init(|| {
            if self.from_twin {
                self.rebuilt_content_hash()
            } else {
                self.computed_content_hash()
            }
        })
    }

    /// SHA-256 of this file's bytes from layer region 0 to the end of the vocabulary region.
    pub fn computed_content_hash(&self) -> ContentHash {
        let start = self.layers.first().map_or(self.vocab.offset, |l| l.offset) as usize;
        let end = (self.vocab.offset + self.vocab.len) as usize;
        content::hash_bytes(&self.map[start..end])
    }

    /// The content hash of the `.cflow` the writer lays out from these views (regions at the
    /// writer's offsets, zero padding between them): how a `.vflow` without a recorded source
    /// hash is matched to its source.
    pub fn rebuilt_content_hash(&self) -> ContentHash {
        use super::writer::{build_layer_region, build_vocab_region, REGION_ALIGN};
        let n = self.cfg.n_layers;
        let mut pos = ((128 + (n + 1) * 16).div_ceil(REGION_ALIGN) * REGION_ALIGN) as u64;
        let mut h = content::ContentHasher::new();
        let pad_to = |h: &mut content::ContentHasher, pos: &mut u64| {
            let r = (*pos % REGION_ALIGN as u64) as usize;
            if r != 0 {
                h.update(&vec![0u8; REGION_ALIGN - r]);
                *pos += (REGION_ALIGN - r) as u64;
            }
        };
        for i in 0..n {
            pad_to(&mut h, &mut pos);
            let region = build_layer_region(pos, i as u16, &self.layer_data(i));
            h.update(&region);
            pos += region.len() as u64;
        }
        pad_to(&mut h, &mut pos);
        h.update(&build_vocab_region(pos, &self.vocab_data()));
        h.finish()
    }

    /// Unmaps the file's pages from this process ([`ModelMap::release_pages`]).
    pub fn release_pages(&self) {
        self.map.release_pages();
    }

    /// Copies the whole file into private huge-page memory and reads it from there from now on
    /// (see [`ModelMap::make_resident`]): `--weights resident`, and `auto` on dense models.
    /// With `repack`, the copy's Q4_0/Q4_1/Q8_0 matrices that decode multiplies (the layers'
    /// dense matrices, their experts, and the LM head, which may be the tied embedding) whose
    /// stripes are whole 16-row groups are rearranged into the layout of `quant::packed`, tile
    /// by tile, and marked [`Matrix::packed`]. The direct tier still reads experts from the
    /// file, in its tile layout (`engine::weights::relative_experts` views are never packed).
    pub fn make_resident(&mut self, repack: bool) -> Result<(), FormatError> {
        self.release_pages();
        let (layers, vocab) = (&mut self.layers, &mut self.vocab);
        let mut any = false;
        self.map.make_resident(&self.path, |bytes| {
            if !repack {
                return;
            }
            any |= repack_matrix(
                bytes,
                vocab.lm_head.as_mut().unwrap_or(&mut vocab.embedding),
            );
            for l in layers.iter_mut() {
                for m in l.dense_matrices_mut() {
                    any |= repack_matrix(bytes, m);
                }
                for e in l.experts.iter_mut() {
                    for m in [&mut e.gate, &mut e.up, &mut e.down] {
                        any |= repack_matrix(bytes, m);
                    }
                }
            }
        })?;
        self.repacked = any;
        Ok(())
    }

    /// True when the resident copy holds repacked matrices ([`CflowFile::make_resident`]).
    pub fn is_repacked(&self) -> bool {
        self.repacked
    }

    /// The views come from a `.vflow` file (its vertical groups and expert bank).
    pub fn is_vflow_view(&self) -> bool {
        self.from_twin
    }

    /// True when the bytes are a private in-memory copy, not the file's page cache.
    pub fn is_resident(&self) -> bool {
        self.map.is_resident()
    }

    /// Where the weights are read from, as `--weights`, `--json` and the UI name it:
    /// `"resident"` or `"mmap"`.
    pub fn weights_mode(&self) -> &'static str {
        if self.is_resident() {
            "resident"
        } else {
            "mmap"
        }
    }

    /// Fails when the file changed since it was opened (see [`ModelMap::check_unchanged`]): a
    /// page vanished under a read (SIGBUS absorbed), or its size or modification time changed.
    /// The engine calls this before every token.
    pub fn check_unchanged(&self) -> Result<(), FormatError> {
        self.map
            .check_unchanged()
            .map_err(|why| FormatError::Changed {
                file: self.path.clone(),
                why,
            })
    }

    /// True once a read of the mapping hit a vanished page (cheap: one atomic load; the engine
    /// checks it after every layer).
    pub fn changed(&self) -> bool {
        self.map.watch().changed()
    }

    /// The error [`CflowFile::changed`] stands for.
    pub fn changed_error(&self) -> FormatError {
        self.check_unchanged()
            .err()
            .unwrap_or_else(|| FormatError::Changed {
                file: self.path.clone(),
                why: "pages of the mapping vanished while they were read".into(),
            })
    }

    #[allow(clippy::type_complexity)]
    fn validate(
        path: &Path,
        bytes: &[u8],
    ) -> Result<(GlobalHeader, ModelConfig, Vec<LayerView>, VocabView), FormatError> {
        let v = V { file: path, bytes };
        let h = GlobalHeader::decode(bytes).ok_or(FormatError::TooSmall {
            file: path.into(),
            size: bytes.len() as u64,
            needed: 88,
        })?;
        if h.magic != MAGIC {
            return Err(FormatError::BadMagic {
                file: path.into(),
                found: h.magic,
            });
        }
        if h.version != VERSION {
            return Err(FormatError::BadVersion {
                file: path.into(),
                found: h.version,
                expected: VERSION,
            });
        }
        let mb = v.range("metadata", h.metadata_offset, h.metadata_len as u64)?;
        let meta: ModelMeta = serde_json::from_slice(mb).map_err(|e| FormatError::BadMetadata {
            file: path.into(),
            why: e.to_string(),
        })?;
        let cfg = config_from_header(&v, &h, meta)?;
        let nl = cfg.n_layers;
        let tb = v.range("layer table", h.layer_table_offset, (nl as u64 + 1) * 16)?;
        let mut regions: Vec<(u64, u64)> = tb
            .chunks_exact(16)
            .map(|c| {
                (
                    u64::from_le_bytes(c[..8].try_into().expect("8")),
                    u64::from_le_bytes(c[8..].try_into().expect("8")),
                )
            })
            .collect();
        // Regions: inside the file, after the layer table, in order, not overlapping each other or
        // the metadata.
        let table_end = h.layer_table_offset + (nl as u64 + 1) * 16;
        let mut prev_end = table_end.max(GlobalHeader::SIZE as u64);
        let mut prev_name = "layer table".to_string();
        for (i, (o, l)) in regions.iter().enumerate() {
            let name = if i == nl {
                "vocab region".to_string()
            } else {
                format!("layer {i} region")
            };
            v.range(&name, *o, *l)?;
            if *o < prev_end {
                return Err(FormatError::Overlap {
                    file: path.into(),
                    what: name,
                    a_off: *o,
                    a_len: *l,
                    other: prev_name,
                    b_off: 0,
                    b_len: prev_end,
                });
            }
            let (mo, ml) = (h.metadata_offset, h.metadata_len as u64);
            if *o < mo + ml && mo < o + l {
                return Err(FormatError::Overlap {
                    file: path.into(),
                    what: name,
                    a_off: *o,
                    a_len: *l,
                    other: "metadata".into(),
                    b_off: mo,
                    b_len: ml,
                });
            }
            prev_end = o + l;
            prev_name = name;
        }
        let vocab_region = regions.pop().expect("n_layers + 1 entries");
        let mut layers = Vec::with_capacity(nl);
        for (i, (off, len)) in regions.iter().enumerate() {
            layers.push(Self::read_layer(&v, &cfg, i, *off, *len)?);
        }
        let vocab = Self::read_vocab(&v, &cfg, vocab_region.0, vocab_region.1)?;
        Ok((h, cfg, layers, vocab))
    }

    fn read_layer(
        v: &V,
        c: &ModelConfig,
        i: usize,
        off: u64,
        len: u64,
    ) -> Result<LayerView, FormatError> {
        Self::read_layer_in(v, c, i, off, (off, len), None)
    }

    /// Reads layer `i` from the directory at `dir_off`. Its matrices and vectors must lie inside
    /// `region`; the expert table and expert regions inside `bank` when given (`.vflow`), else
    /// inside `region` (`.cflow`). The view's offset/len are the region's.
    pub(crate) fn read_layer_in(
        v: &V,
        c: &ModelConfig,
        i: usize,
        dir_off: u64,
        region: (u64, u64),
        bank: Option<(u64, u64)>,
    ) -> Result<LayerView, FormatError> {
        let (off, len) = region;
        let (xoff, xlen) = bank.unwrap_or(region);
        let what = format!("layer {i}");
        let dir = read_dir_in(v, &what, dir_off, region, bank, i as u32)?;
        let d = c.d_model;
        let li = i as u16;
        let mut qkv = group(
            v,
            &dir,
            &what,
            li,
            &[
                (EntryKind::Q, c.q_dim(), d),
                (EntryKind::K, c.kv_dim(), d),
                (EntryKind::V, c.kv_dim(), d),
            ],
        )?
        .ok_or_else(|| v.mismatch(format!("{what} directory"), "Q/K/V entries", "missing"))?;
        let vm = qkv.pop().expect("3");
        let km = qkv.pop().expect("3");
        let qm = qkv.pop().expect("3");
        let om = group(v, &dir, &what, li, &[(EntryKind::O, d, c.q_dim())])?
            .ok_or_else(|| v.mismatch(format!("{what} directory"), "O entry", "missing"))?
            .pop()
            .expect("1");
        let (mut gate, mut up, mut down) = (None, None, None);
        if c.has_dense() {
            let mut gu = group(
                v,
                &dir,
                &what,
                li,
                &[(EntryKind::Gate, c.d_ff, d), (EntryKind::Up, c.d_ff, d)],
            )?
            .ok_or_else(|| {
                v.mismatch(
                    format!("{what} directory"),
                    "dense gate/up (d_ff > 0)",
                    "missing",
                )
            })?;
            up = gu.pop();
            gate = gu.pop();
            down = group(v, &dir, &what, li, &[(EntryKind::Down, d, c.d_ff)])?
                .ok_or_else(|| v.mismatch(format!("{what} directory"), "dense down", "missing"))?
                .pop();
        } else if dir.get(EntryKind::Gate).is_some() {
            return Err(v.mismatch(
                format!("{what} directory"),
                "no dense FFN (d_ff = 0)",
                "a Gate entry",
            ));
        }
        let attn_norm = read_vector(v, &dir, EntryKind::AttnNorm, d, &what)?
            .ok_or_else(|| v.mismatch(format!("{what} directory"), "AttnNorm entry", "missing"))?;
        let ffn_norm = read_vector(v, &dir, EntryKind::FfnNorm, d, &what)?;
        let moe_norm = read_vector(v, &dir, EntryKind::MoeNorm, d, &what)?;
        let q_bias = read_vector(v, &dir, EntryKind::QBias, c.q_dim(), &what)?;
        let k_bias = read_vector(v, &dir, EntryKind::KBias, c.kv_dim(), &what)?;
        let v_bias = read_vector(v, &dir, EntryKind::VBias, c.kv_dim(), &what)?;
        let (qn_len, kn_len) = c.qk_norm_lens();
        let q_norm = read_vector(v, &dir, EntryKind::QNorm, qn_len, &what)?;
        let k_norm = read_vector(v, &dir, EntryKind::KNorm, kn_len, &what)?;
        let qk_entries = (q_norm.is_some(), k_norm.is_some());
        if qk_entries != (c.qk_norm(), c.qk_norm()) {
            return Err(v.mismatch(
                format!("{what} Q/K norm entries"),
                if c.qk_norm() {
                    "QNorm and KNorm (FLAG_QK_NORM set)"
                } else {
                    "none (FLAG_QK_NORM clear)"
                },
                format!("QNorm {}, KNorm {}", qk_entries.0, qk_entries.1),
            ));
        }
        let post_attn_norm = read_vector(v, &dir, EntryKind::PostAttnNorm, d, &what)?;
        let post_ffn_norm = read_vector(v, &dir, EntryKind::PostFfnNorm, d, &what)?;
        let post = (post_attn_norm.is_some(), post_ffn_norm.is_some());
        if post != (c.post_norms(), c.post_norms()) {
            return Err(v.mismatch(
                format!("{what} post-norm entries"),
                if c.post_norms() {
                    "PostAttnNorm and PostFfnNorm (FLAG_POST_NORMS set)"
                } else {
                    "none (FLAG_POST_NORMS clear)"
                },
                format!("PostAttnNorm {}, PostFfnNorm {}", post.0, post.1),
            ));
        }
        let shared_gate = read_vector(v, &dir, EntryKind::SharedGate, d, &what)?;
        if shared_gate.is_some() && gate.is_none() {
            return Err(v.mismatch(
                format!("{what} directory"),
                "a SharedGate entry only with a dense FFN (the shared expert)",
                "SharedGate without a dense FFN",
            ));
        }
        let router_bias = read_vector(v, &dir, EntryKind::RouterBias, c.n_experts, &what)?;
        if router_bias.is_some() && !c.has_experts() {
            return Err(v.mismatch(
                format!("{what} directory"),
                "no RouterBias entry (no experts)",
                "a RouterBias entry",
            ));
        }
        let mut router = None;
        let mut experts = Vec::new();
        if c.has_experts() {
            let e = dir.get(EntryKind::Router).ok_or_else(|| {
                v.mismatch(format!("{what} directory"), "Router entry", "missing")
            })?;
            if e.rows as usize != c.n_experts
                || e.cols as usize != d
                || e.length != (c.n_experts * d * 4) as u64
            {
                return Err(v.mismatch(
                    format!("{what} router shape"),
                    format!("{}×{d}", c.n_experts),
                    format!("{}×{}", { e.rows }, { e.cols }),
                ));
            }
            router = Some(v.f32s(
                &format!("{what} router"),
                e.offset,
                (c.n_experts * d) as u64,
            )?);
            let t = dir.get(EntryKind::ExpertTable).ok_or_else(|| {
                v.mismatch(format!("{what} directory"), "ExpertTable entry", "missing")
            })?;
            if t.rows as usize != c.n_experts || t.length != (c.n_experts * 16) as u64 {
                return Err(v.mismatch(format!("{what} expert table"), c.n_experts, t.rows));
            }
            let tb = v.range(&format!("{what} expert table"), t.offset, t.length)?;
            let spec = |k: EntryKind, r: usize, cc: usize| -> Result<Matrix, FormatError> {
                let e = dir.get(k).ok_or_else(|| {
                    v.mismatch(
                        format!("{what} directory"),
                        format!("{k:?} entry"),
                        "missing",
                    )
                })?;
                new_matrix(v, e, k, r, cc, &what)
            };
            let g0 = spec(EntryKind::ExpertGate, c.expert_ffn, d)?;
            let u0 = spec(EntryKind::ExpertUp, c.expert_ffn, d)?;
            let d0 = spec(EntryKind::ExpertDown, d, c.expert_ffn)?;
            let mut prev_end = t.offset + t.length;
            for ei in 0..c.n_experts {
                let eo = u64::from_le_bytes(tb[ei * 16..ei * 16 + 8].try_into().expect("8"));
                let el = u64::from_le_bytes(tb[ei * 16 + 8..ei * 16 + 16].try_into().expect("8"));
                let ew = format!("{what} expert {ei}");
                let eend = eo.checked_add(el).ok_or_else(|| FormatError::Overflow {
                    file: v.file.into(),
                    what: ew.clone(),
                })?;
                if eo < prev_end || eend > xoff + xlen {
                    return Err(FormatError::OutOfBounds {
                        file: v.file.into(),
                        what: format!(
                            "{ew} (must follow the previous expert inside [{xoff}, +{xlen}))"
                        ),
                        offset: eo,
                        len: el,
                        size: v.size(),
                    });
                }
                let (mut g, mut u, mut dn) = (g0.clone(), u0.clone(), d0.clone());
                let p = walk_group(v, &ew, li, ei as u8, &mut [&mut g, &mut u], eo, eend)?;
                let p = walk_group(v, &ew, li, ei as u8, &mut [&mut dn], p, eend)?;
                if p != eend {
                    return Err(v.mismatch(format!("{ew} length"), el, p - eo));
                }
                prev_end = eend;
                experts.push(ExpertView {
                    offset: eo,
                    len: el,
                    gate: g,
                    up: u,
                    down: dn,
                });
            }
        } else if dir.get(EntryKind::ExpertTable).is_some() {
            return Err(v.mismatch(
                format!("{what} directory"),
                "no experts (n_experts = 0)",
                "an expert table",
            ));
        }
        Ok(LayerView {
            offset: off,
            len,
            q: qm,
            k: km,
            v: vm,
            o: om,
            gate,
            up,
            down,
            attn_norm,
            ffn_norm,
            moe_norm,
            q_bias,
            k_bias,
            v_bias,
            q_norm,
            k_norm,
            post_attn_norm,
            post_ffn_norm,
            shared_gate,
            router,
            router_bias,
            experts,
        })
    }

    pub(crate) fn read_vocab(
        v: &V,
        c: &ModelConfig,
        off: u64,
        len: u64,
    ) -> Result<VocabView, FormatError> {
        let what = "vocab";
        let dir = read_dir(v, what, off, len, 0xFFFF)?;
        let embedding = group(
            v,
            &dir,
            what,
            0xFFFF,
            &[(EntryKind::Embedding, c.vocab, c.d_model)],
        )?
        .ok_or_else(|| v.mismatch("vocab directory".into(), "Embedding entry", "missing"))?
        .pop()
        .expect("1");
        let lm_head = group(
            v,
            &dir,
            what,
            0xFFFF,
            &[(EntryKind::LmHead, c.vocab, c.d_model)],
        )?
        .and_then(|mut m| m.pop());
        if lm_head.is_some() == c.tied_embeddings() {
            return Err(v.mismatch(
                "vocab LM head".into(),
                if c.tied_embeddings() {
                    "none (tied embeddings flag set)"
                } else {
                    "an LmHead entry"
                },
                if lm_head.is_some() {
                    "present"
                } else {
                    "missing"
                },
            ));
        }
        let final_norm = read_vector(v, &dir, EntryKind::FinalNorm, c.d_model, what)?
            .ok_or_else(|| v.mismatch("vocab directory".into(), "FinalNorm entry", "missing"))?;
        Ok(VocabView {
            offset: off,
            len,
            embedding,
            lm_head,
            final_norm,
        })
    }

    /// The whole mapped file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Zero-copy view of tile (stripe `s`, column tile `c`) of `m`.
    pub fn tile<'a>(&'a self, m: &Matrix, s: usize, c: usize) -> MappedTile<'a> {
        tile_at(&self.map, m, s, c)
    }

    /// The LM head matrix (the embedding when tied).
    pub fn lm_head(&self) -> &Matrix {
        self.vocab.lm_head.as_ref().unwrap_or(&self.vocab.embedding)
    }
}

impl crate::io::prefetch::Mapped for CflowFile {
    fn bytes(&self) -> &[u8] {
        &self.map
    }
}

/// Repacks every tile of `m` inside `bytes` (`quant::packed`) and marks it, when all of its
/// stripes are whole 16-row groups of Q4_0/Q4_1; else leaves it as it is.
pub(crate) fn repack_matrix(bytes: &mut [u8], m: &mut Matrix) -> bool {
    if m.packed
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

impl CflowFile {
    /// Reassembles a tiled matrix into one contiguous split-layout matrix (row-major scales and
    /// quants), e.g. for the row-major baseline layout or for re-writing.
    pub fn matrix_data(&self, m: &Matrix) -> MatrixData {
        let q = m.quant;
        let (rsb, rqb) = (q.row_scale_bytes(m.cols), q.row_quant_bytes(m.cols));
        let mut scales = vec![0u8; m.rows * rsb];
        let mut qs = vec![0u8; m.rows * rqb];
        for s in 0..m.n_stripes() {
            for c in 0..m.n_col_tiles() {
                let t = self.tile(m, s, c);
                let unpacked;
                let (ts, tq) = if t.packed {
                    unpacked = crate::quant::packed::unpack_tile(q, t.rows, t.cols, t.body);
                    (&unpacked.0[..], &unpacked.1[..])
                } else {
                    (t.scales, t.qs)
                };
                let r0 = s * TILE_ROWS;
                let c0 = c * TILE_COLS;
                let (tsb, tqb) = (q.row_scale_bytes(t.cols), q.row_quant_bytes(t.cols));
                let (sc0, qc0) = (q.row_scale_bytes(c0), q.row_quant_bytes(c0));
                for r in 0..t.rows {
                    let dst = (r0 + r) * rsb + sc0;
                    scales[dst..dst + tsb].copy_from_slice(&ts[r * tsb..(r + 1) * tsb]);
                    let dst = (r0 + r) * rqb + qc0;
                    qs[dst..dst + tqb].copy_from_slice(&tq[r * tqb..(r + 1) * tqb]);
                }
            }
        }
        MatrixData {
            quant: q,
            rows: m.rows,
            cols: m.cols,
            scales,
            qs,
        }
    }

    /// Reconstructs the writer input of layer `i` (used for re-writing and format conversion).
    pub fn layer_data(&self, i: usize) -> LayerData {
        let l = &self.layers[i];
        let md = |m: &Matrix| self.matrix_data(m);
        LayerData {
            q: md(&l.q),
            k: md(&l.k),
            v: md(&l.v),
            o: md(&l.o),
            q_bias: l.q_bias.clone(),
            k_bias: l.k_bias.clone(),
            v_bias: l.v_bias.clone(),
            q_norm: l.q_norm.clone(),
            k_norm: l.k_norm.clone(),
            post_attn_norm: l.post_attn_norm.clone(),
            post_ffn_norm: l.post_ffn_norm.clone(),
            shared_gate: l.shared_gate.clone(),
            router_bias: l.router_bias.clone(),
            gate: l.gate.as_ref().map(md),
            up: l.up.as_ref().map(md),
            down: l.down.as_ref().map(md),
            attn_norm: l.attn_norm.clone(),
            ffn_norm: l.ffn_norm.clone(),
            moe_norm: l.moe_norm.clone(),
            router: l.router.clone(),
            experts: l
                .experts
                .iter()
                .map(|e| ExpertData {
                    gate: md(&e.gate),
                    up: md(&e.up),
                    down: md(&e.down),
                })
                .collect(),
        }
    }

    pub fn vocab_data(&self) -> VocabData {
        VocabData {
            embedding: self.matrix_data(&self.vocab.embedding),
            lm_head: self.vocab.lm_head.as_ref().map(|m| self.matrix_data(m)),
            final_norm: self.vocab.final_norm.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::header::tile_bytes;

    /// `Matrix::bytes` (a full stripe times the count, plus the last) equals the sum over every
    /// tile of every stripe, for shapes with a short last stripe and a narrow last tile.
    #[test]
    fn matrix_bytes_equals_the_sum_of_its_tiles() {
        for q in [
            QuantType::Q4_1,
            QuantType::Q8_0,
            QuantType::F16,
            QuantType::Q6_K,
        ] {
            for (rows, cols) in [
                (1usize, 256usize),
                (128, 576),
                (129, 512),
                (576, 1536),
                (49152, 576),
            ] {
                if !cols.is_multiple_of(q.block_len()) {
                    continue;
                }
                let m = Matrix {
                    kind: EntryKind::Down,
                    quant: q,
                    rows,
                    cols,
                    stripes: vec![0; rows.div_ceil(TILE_ROWS)],
                    packed: false,
                };
                let mut want = 0;
                for s in 0..m.n_stripes() {
                    for c in 0..m.n_col_tiles() {
                        want += tile_bytes(q, m.stripe_rows(s), m.tile_cols(c));
                    }
                }
                assert_eq!(m.bytes(), want, "{q} {rows}x{cols}");
            }
        }
    }
}
