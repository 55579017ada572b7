//! `.cflow` v5 writer. Builds each layer region in memory (directory + tiles in consumption
//! order), streams regions to the output, then writes the layer table, metadata and header.
//! The output is a [`crate::output::Output`]: for a regular or new file a temporary file renamed
//! into place at the end (a failed write leaves nothing behind); a device or FIFO is spooled and
//! copied; an input of the conversion is refused before anything is written.

use super::content::{append_to_metadata, ContentHasher, CONTENT_HASH_KEY};
use super::error::FormatError;
use super::header::*;
use super::{TILE_COLS, TILE_ROWS};
use crate::model::{ModelConfig, ModelMeta};
use crate::output::Output;
use crate::quant::{dequantize_row, quantize_row, QuantType};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Alignment of layer regions and expert regions (direct I/O friendly).
pub const REGION_ALIGN: usize = 4096;
/// Alignment of matrices and vectors inside a region.
pub const ITEM_ALIGN: usize = 64;

/// A whole matrix in the split layout: `scales` = every row's block-scale entries (row-major),
/// `qs` = every row's packed quants (row-major).
#[derive(Clone, Debug, PartialEq)]
pub struct MatrixData {
    pub quant: QuantType,
    pub rows: usize,
    pub cols: usize,
    pub scales: Vec<u8>,
    pub qs: Vec<u8>,
}

impl MatrixData {
    /// Quantizes a row-major f32 matrix.
    pub fn quantize(quant: QuantType, rows: usize, cols: usize, w: &[f32]) -> MatrixData {
        assert_eq!(w.len(), rows * cols);
        assert!(
            cols.is_multiple_of(quant.block_len()),
            "cols must be a multiple of {}",
            quant.block_len()
        );
        let mut scales = Vec::with_capacity(rows * quant.row_scale_bytes(cols));
        let mut qs = Vec::with_capacity(quant.matrix_bytes(rows, cols));
        for r in 0..rows {
            quantize_row(quant, &w[r * cols..(r + 1) * cols], &mut scales, &mut qs);
        }
        MatrixData {
            quant,
            rows,
            cols,
            scales,
            qs,
        }
    }

    pub fn row_scale_bytes(&self) -> usize {
        self.quant.row_scale_bytes(self.cols)
    }
    pub fn row_quant_bytes(&self) -> usize {
        self.quant.row_quant_bytes(self.cols)
    }
    pub fn row_scales(&self, r: usize) -> &[u8] {
        let n = self.row_scale_bytes();
        &self.scales[r * n..(r + 1) * n]
    }
    pub fn row_qs(&self, r: usize) -> &[u8] {
        let n = self.row_quant_bytes();
        &self.qs[r * n..(r + 1) * n]
    }
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for r in 0..self.rows {
            dequantize_row(
                self.quant,
                self.row_scales(r),
                self.row_qs(r),
                &mut out[r * self.cols..(r + 1) * self.cols],
            );
        }
        out
    }
    /// Bytes of weights (scales + quants), i.e. what one full matvec streams.
    pub fn bytes(&self) -> usize {
        self.scales.len() + self.qs.len()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ExpertData {
    pub gate: MatrixData,
    pub up: MatrixData,
    pub down: MatrixData,
}

/// Everything stored for one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerData {
    pub q: MatrixData,
    pub k: MatrixData,
    pub v: MatrixData,
    pub o: MatrixData,
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    /// RMSNorm weights over the whole Q / K projection outputs (`q_dim` / `kv_dim`; `head_dim`
    /// each with `FLAG_QK_NORM_PER_HEAD`); present exactly when the config has `FLAG_QK_NORM`.
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// RMSNorm weights of the attention / FFN outputs (`d_model`); present exactly when the
    /// config has `FLAG_POST_NORMS`.
    pub post_attn_norm: Option<Vec<f32>>,
    pub post_ffn_norm: Option<Vec<f32>>,
    /// The shared expert's sigmoid gate (`d_model`; Qwen2-MoE): the dense FFN's output is scaled
    /// by σ(w · x̂). Only with a dense FFN.
    pub shared_gate: Option<Vec<f32>>,
    /// A bias per expert added to the router logits (`n_experts`; `moefy`).
    pub router_bias: Option<Vec<f32>>,
    pub gate: Option<MatrixData>,
    pub up: Option<MatrixData>,
    pub down: Option<MatrixData>,
    pub attn_norm: Vec<f32>,
    pub ffn_norm: Option<Vec<f32>>,
    pub moe_norm: Option<Vec<f32>>,
    /// Router weights, `n_experts × d_model` row-major f32.
    pub router: Option<Vec<f32>>,
    pub experts: Vec<ExpertData>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct VocabData {
    pub embedding: MatrixData,
    /// None when embeddings are tied (the LM head is the embedding matrix).
    pub lm_head: Option<MatrixData>,
    pub final_norm: Vec<f32>,
}

fn pad_to(buf: &mut Vec<u8>, align: usize) {
    let r = buf.len() % align;
    if r != 0 {
        buf.resize(buf.len() + align - r, 0);
    }
}

/// Bytes of a matrix stored as tiles.
pub fn tiled_matrix_bytes(q: QuantType, rows: usize, cols: usize) -> usize {
    let full_cols = cols / TILE_COLS;
    let rem_cols = cols % TILE_COLS;
    let n_stripes = rows.div_ceil(TILE_ROWS);
    let n_tiles_per_stripe = full_cols + usize::from(rem_cols > 0);
    q.matrix_bytes(rows, cols) + n_stripes * n_tiles_per_stripe * TileHeader::SIZE
}

/// Appends the stripes of `mats` interleaved round-robin by stripe index (`ids` = matrix ids for
/// the tile headers).
fn write_group(buf: &mut Vec<u8>, layer: u16, expert: Option<u8>, mats: &[(&MatrixData, u8)]) {
    let max_stripes = mats
        .iter()
        .map(|(m, _)| m.rows.div_ceil(TILE_ROWS))
        .max()
        .unwrap_or(0);
    for s in 0..max_stripes {
        for (m, id) in mats {
            if s < m.rows.div_ceil(TILE_ROWS) {
                write_stripe(buf, layer, expert, *id, m, s);
            }
        }
    }
}

fn write_stripe(
    buf: &mut Vec<u8>,
    layer: u16,
    expert: Option<u8>,
    id: u8,
    m: &MatrixData,
    s: usize,
) {
    let r0 = s * TILE_ROWS;
    let r1 = (r0 + TILE_ROWS).min(m.rows);
    let q = m.quant;
    let mut c0 = 0;
    while c0 < m.cols {
        let c1 = (c0 + TILE_COLS).min(m.cols);
        let h = TileHeader {
            layer_id: layer,
            matrix_id: id,
            expert_id: TileHeader::expert_byte(expert),
            row_offset: r0 as u32,
            col_offset: c0 as u16,
            tile_rows: (r1 - r0) as u16,
            tile_cols: (c1 - c0) as u16,
            quant_group: q as u16,
        };
        buf.extend_from_slice(&h.encode());
        if q.is_blocked() {
            let sb = q.scale_bytes_per_block();
            let qb = q.quant_bytes_per_block();
            let (b0, b1) = (c0 / q.block_len(), c1 / q.block_len());
            for r in r0..r1 {
                buf.extend_from_slice(&m.row_scales(r)[b0 * sb..b1 * sb]);
            }
            for r in r0..r1 {
                buf.extend_from_slice(&m.row_qs(r)[b0 * qb..b1 * qb]);
            }
        } else {
            let es = q.matrix_bytes(1, 1);
            for r in r0..r1 {
                buf.extend_from_slice(&m.row_qs(r)[c0 * es..c1 * es]);
            }
        }
        c0 = c1;
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Collects directory entries while a region is laid out.
struct RegionBuilder {
    base: u64,
    buf: Vec<u8>,
    entries: Vec<DirEntry>,
}

impl RegionBuilder {
    fn new(base: u64, n_entries: usize) -> Self {
        let mut buf = vec![0u8; DirHeader::SIZE + n_entries * DirEntry::SIZE];
        pad_to(&mut buf, ITEM_ALIGN);
        RegionBuilder {
            base,
            buf,
            entries: Vec::new(),
        }
    }
    fn abs(&self) -> u64 {
        self.base + self.buf.len() as u64
    }
    fn group(&mut self, layer: u16, mats: &[(&MatrixData, EntryKind)], group: u8) {
        pad_to(&mut self.buf, ITEM_ALIGN);
        let start = self.abs();
        let ids: Vec<(&MatrixData, u8)> = mats.iter().map(|(m, k)| (*m, *k as u8)).collect();
        write_group(&mut self.buf, layer, None, &ids);
        let len = self.abs() - start;
        for (m, k) in mats {
            self.entries.push(DirEntry {
                kind: *k as u8,
                quant: m.quant as u8,
                group,
                rows: m.rows as u32,
                cols: m.cols as u32,
                offset: start,
                length: len,
                ..Default::default()
            });
        }
    }
    fn vector(&mut self, kind: EntryKind, v: &[f32]) {
        pad_to(&mut self.buf, ITEM_ALIGN);
        let start = self.abs();
        self.buf.extend_from_slice(&f32_bytes(v));
        self.entries.push(DirEntry {
            kind: kind as u8,
            quant: QuantType::F32 as u8,
            rows: 1,
            cols: v.len() as u32,
            offset: start,
            length: (v.len() * 4) as u64,
            ..Default::default()
        });
    }
    fn finish(mut self, layer: u32) -> Vec<u8> {
        let h = DirHeader {
            magic: DIR_MAGIC,
            layer,
            n_entries: self.entries.len() as u32,
            reserved: 0,
        };
        self.buf[..DirHeader::SIZE].copy_from_slice(&h.encode());
        for (i, e) in self.entries.iter().enumerate() {
            let o = DirHeader::SIZE + i * DirEntry::SIZE;
            self.buf[o..o + DirEntry::SIZE].copy_from_slice(&e.encode());
        }
        self.buf
    }
}

fn layer_entry_count(l: &LayerData) -> usize {
    let mut n = 4 + 1; // q k v o attn_norm
    n += l.q_bias.is_some() as usize + l.k_bias.is_some() as usize + l.v_bias.is_some() as usize;
    n += l.q_norm.is_some() as usize + l.k_norm.is_some() as usize;
    n += l.post_attn_norm.is_some() as usize + l.post_ffn_norm.is_some() as usize;
    n += l.shared_gate.is_some() as usize + l.router_bias.is_some() as usize;
    n += l.gate.is_some() as usize * 3 + l.ffn_norm.is_some() as usize;
    n += l.moe_norm.is_some() as usize + l.router.is_some() as usize;
    if !l.experts.is_empty() {
        n += 4; // table + gate/up/down descriptors
    }
    n
}

/// Lays out one layer region (directory first, then data in consumption order) at `base`.
pub fn build_layer_region(base: u64, layer: u16, l: &LayerData) -> Vec<u8> {
    let mut rb = RegionBuilder::new(base, layer_entry_count(l));
    rb.group(
        layer,
        &[
            (&l.q, EntryKind::Q),
            (&l.k, EntryKind::K),
            (&l.v, EntryKind::V),
        ],
        1,
    );
    rb.group(layer, &[(&l.o, EntryKind::O)], 0);
    if let (Some(g), Some(u), Some(d)) = (&l.gate, &l.up, &l.down) {
        rb.group(layer, &[(g, EntryKind::Gate), (u, EntryKind::Up)], 2);
        rb.group(layer, &[(d, EntryKind::Down)], 0);
    }
    rb.vector(EntryKind::AttnNorm, &l.attn_norm);
    if let Some(v) = &l.ffn_norm {
        rb.vector(EntryKind::FfnNorm, v);
    }
    if let Some(v) = &l.moe_norm {
        rb.vector(EntryKind::MoeNorm, v);
    }
    if let Some(v) = &l.q_bias {
        rb.vector(EntryKind::QBias, v);
    }
    if let Some(v) = &l.k_bias {
        rb.vector(EntryKind::KBias, v);
    }
    if let Some(v) = &l.v_bias {
        rb.vector(EntryKind::VBias, v);
    }
    if let Some(v) = &l.q_norm {
        rb.vector(EntryKind::QNorm, v);
    }
    if let Some(v) = &l.k_norm {
        rb.vector(EntryKind::KNorm, v);
    }
    if let Some(v) = &l.post_attn_norm {
        rb.vector(EntryKind::PostAttnNorm, v);
    }
    if let Some(v) = &l.post_ffn_norm {
        rb.vector(EntryKind::PostFfnNorm, v);
    }
    if let Some(v) = &l.shared_gate {
        rb.vector(EntryKind::SharedGate, v);
    }
    if let Some(v) = &l.router_bias {
        rb.vector(EntryKind::RouterBias, v);
    }
    if let Some(r) = &l.router {
        rb.vector(EntryKind::Router, r);
        let e = rb.entries.last_mut().expect("just pushed");
        e.rows = l.experts.len() as u32;
        e.cols = (r.len() / l.experts.len().max(1)) as u32;
    }
    if !l.experts.is_empty() {
        let n = l.experts.len();
        pad_to(&mut rb.buf, ITEM_ALIGN);
        let table_rel = rb.buf.len();
        let table_abs = rb.abs();
        rb.buf.resize(table_rel + n * 16, 0);
        let mut table = Vec::with_capacity(n);
        for (ei, ex) in l.experts.iter().enumerate() {
            // Expert regions start on REGION_ALIGN boundaries (file offsets) for direct I/O.
            let rem = (rb.abs() as usize) % REGION_ALIGN;
            if rem != 0 {
                rb.buf.resize(rb.buf.len() + REGION_ALIGN - rem, 0);
            }
            let start = rb.abs();
            write_group(
                &mut rb.buf,
                layer,
                Some(ei as u8),
                &[
                    (&ex.gate, EntryKind::ExpertGate as u8),
                    (&ex.up, EntryKind::ExpertUp as u8),
                ],
            );
            write_group(
                &mut rb.buf,
                layer,
                Some(ei as u8),
                &[(&ex.down, EntryKind::ExpertDown as u8)],
            );
            table.push((start, rb.abs() - start));
        }
        for (i, (o, len)) in table.iter().enumerate() {
            let p = table_rel + i * 16;
            rb.buf[p..p + 8].copy_from_slice(&o.to_le_bytes());
            rb.buf[p + 8..p + 16].copy_from_slice(&len.to_le_bytes());
        }
        rb.entries.push(DirEntry {
            kind: EntryKind::ExpertTable as u8,
            quant: 0,
            rows: n as u32,
            cols: 2,
            offset: table_abs,
            length: (n * 16) as u64,
            ..Default::default()
        });
        let ex = &l.experts[0];
        for (m, k, g) in [
            (&ex.gate, EntryKind::ExpertGate, 3u8),
            (&ex.up, EntryKind::ExpertUp, 3),
            (&ex.down, EntryKind::ExpertDown, 0),
        ] {
            rb.entries.push(DirEntry {
                kind: k as u8,
                quant: m.quant as u8,
                group: g,
                rows: m.rows as u32,
                cols: m.cols as u32,
                offset: table_abs,
                length: 0,
                ..Default::default()
            });
        }
    }
    rb.finish(layer as u32)
}

/// Lays out the vocabulary region at `base`.
pub fn build_vocab_region(base: u64, v: &VocabData) -> Vec<u8> {
    let n = 2 + v.lm_head.is_some() as usize;
    let mut rb = RegionBuilder::new(base, n);
    rb.group(0xFFFF, &[(&v.embedding, EntryKind::Embedding)], 0);
    if let Some(h) = &v.lm_head {
        rb.group(0xFFFF, &[(h, EntryKind::LmHead)], 0);
    }
    rb.vector(EntryKind::FinalNorm, &v.final_norm);
    rb.finish(0xFFFF)
}

/// Builds the 88-byte header for a config (offsets filled by the writer).
pub fn header_for(cfg: &ModelConfig) -> GlobalHeader {
    GlobalHeader {
        magic: MAGIC,
        version: VERSION,
        feature_flags: cfg.feature_flags,
        n_layers: cfg.n_layers as u16,
        n_heads: cfg.n_heads as u16,
        n_kv_heads: cfg.n_kv_heads as u16,
        head_dim: cfg.head_dim as u16,
        d_model: cfg.d_model as u32,
        d_ff: cfg.d_ff as u32,
        vocab: cfg.vocab as u32,
        n_experts: cfg.n_experts as u16,
        top_k: cfg.top_k as u16,
        expert_ffn: cfg.expert_ffn as u32,
        max_ctx: cfg.max_ctx as u32,
        rms_eps: cfg.rms_eps,
        rope_theta: cfg.rope_theta,
        layer_table_offset: 0,
        metadata_offset: 0,
        metadata_len: 0,
        dense_delay: cfg.dense_delay as u8,
        expert_delay: cfg.expert_delay as u8,
        combine_style: cfg.combine_style as u8,
        reserved0: 0,
        final_logit_softcap: cfg.final_logit_softcap,
        reserved1: 0,
    }
}

/// Refuses, before anything is written, a configuration the reader would reject or that does not
/// fit the header's fields, so no writer (`gen`, the importers) can produce a file that
/// `CflowFile::open` then refuses.
fn check_config(path: &Path, cfg: &ModelConfig) -> Result<(), FormatError> {
    let v = super::reader::V {
        file: path,
        bytes: &[],
    };
    let back = super::reader::config_from_header(&v, &header_for(cfg), cfg.meta.clone())?;
    if back != *cfg {
        return Err(FormatError::Invalid(format!(
            "{}: the model configuration does not fit the .cflow header (a dimension or delay \
             exceeds its field)",
            path.display()
        )));
    }
    Ok(())
}

/// Streaming `.cflow` writer: `create`, then `write_layer` for every layer in order, then
/// `finish` with the vocabulary.
pub struct CflowWriter {
    path: PathBuf,
    out: Option<Output>,
    cfg: ModelConfig,
    pos: u64,
    table: Vec<(u64, u64)>,
    /// Hash of every byte from layer region 0 on (`format::content`); taken before the metadata.
    content: Option<ContentHasher>,
}

impl CflowWriter {
    pub fn create(path: &Path, cfg: &ModelConfig) -> Result<CflowWriter, FormatError> {
        Self::create_for(path, cfg, &[])
    }

    /// [`CflowWriter::create`], refusing a `path` that is the same file as one of `inputs`
    /// (the files being converted) before anything is opened for writing.
    pub fn create_for(
        path: &Path,
        cfg: &ModelConfig,
        inputs: &[&Path],
    ) -> Result<CflowWriter, FormatError> {
        check_config(path, cfg)?;
        let out = Output::create_seekable(path, inputs)?;
        let mut w = CflowWriter {
            path: path.to_path_buf(),
            out: Some(out),
            cfg: cfg.clone(),
            pos: 0,
            table: Vec::new(),
            content: None,
        };
        // Header + layer table are written at the end; reserve their space now.
        let table_len = (cfg.n_layers + 1) * 16;
        let reserve = (128 + table_len).div_ceil(REGION_ALIGN) * REGION_ALIGN;
        w.write_all(&vec![0u8; reserve])?;
        Ok(w)
    }

    fn write_all(&mut self, b: &[u8]) -> Result<(), FormatError> {
        let f = self
            .out
            .as_mut()
            .expect("writer used after finish")
            .file_mut();
        f.write_all(b).map_err(|e| FormatError::Write {
            file: self.path.clone(),
            err: e,
        })?;
        if let Some(h) = self.content.as_mut() {
            h.update(b);
        }
        self.pos += b.len() as u64;
        Ok(())
    }

    /// The metadata JSON with the content hash of everything written since layer region 0
    /// appended (`"content_hash"`); hashing stops here.
    fn meta_json(&mut self, meta: &ModelMeta) -> Result<Vec<u8>, FormatError> {
        let json = serde_json::to_vec(meta).map_err(|e| FormatError::Invalid(e.to_string()))?;
        let h = self.content.take().unwrap_or_default().finish();
        Ok(append_to_metadata(json, CONTENT_HASH_KEY, &h))
    }

    fn align(&mut self) -> Result<(), FormatError> {
        let r = (self.pos as usize) % REGION_ALIGN;
        if r != 0 {
            self.write_all(&vec![0u8; REGION_ALIGN - r])?;
        }
        Ok(())
    }

    /// Appends the next layer (layers must come in order 0, 1, ...).
    pub fn write_layer(&mut self, l: &LayerData) -> Result<(), FormatError> {
        check_layer(&self.cfg, self.table.len(), l)?;
        if self.table.is_empty() {
            // Layer region 0 starts here (the reserved header space is aligned).
            self.align()?;
            self.content = Some(ContentHasher::new());
        }
        self.align()?;
        let base = self.pos;
        let region = build_layer_region(base, self.table.len() as u16, l);
        self.write_all(&region)?;
        self.table.push((base, region.len() as u64));
        Ok(())
    }

    /// Writes the vocabulary region, metadata, layer table and header, then renames into place.
    pub fn finish(mut self, v: &VocabData, meta: &ModelMeta) -> Result<(), FormatError> {
        if self.table.len() != self.cfg.n_layers {
            return Err(FormatError::Invalid(format!(
                "wrote {} layers, header says {}",
                self.table.len(),
                self.cfg.n_layers
            )));
        }
        check_vocab(&self.cfg, v)?;
        self.align()?;
        let base = self.pos;
        let region = build_vocab_region(base, v);
        self.write_all(&region)?;
        self.table.push((base, region.len() as u64));
        let meta_json = self.meta_json(meta)?;
        let meta_off = self.pos;
        self.write_all(&meta_json)?;
        let mut h = header_for(&self.cfg);
        h.layer_table_offset = 128;
        h.metadata_offset = meta_off;
        h.metadata_len = meta_json.len() as u32;
        let mut head = vec![0u8; 128];
        head[..88].copy_from_slice(&h.encode());
        for (o, l) in &self.table {
            head.extend_from_slice(&o.to_le_bytes());
            head.extend_from_slice(&l.to_le_bytes());
        }
        let path = self.path.clone();
        let werr = |e| FormatError::Write {
            file: path.clone(),
            err: e,
        };
        // Unfinished (error or abandoned): dropping `out` removes the temporary file.
        let mut out = self.out.take().expect("finish once");
        let f = out.file_mut();
        f.seek(SeekFrom::Start(0)).map_err(werr)?;
        f.write_all(&head).map_err(werr)?;
        out.commit()?;
        Ok(())
    }
}

fn want(what: &str, m: &MatrixData, rows: usize, cols: usize) -> Result<(), FormatError> {
    if m.rows != rows || m.cols != cols {
        return Err(FormatError::Invalid(format!(
            "{what}: {}×{} but the config wants {rows}×{cols}",
            m.rows, m.cols
        )));
    }
    if !cols.is_multiple_of(m.quant.block_len()) {
        return Err(FormatError::Invalid(format!(
            "{what}: {cols} columns is not a multiple of {} ({})",
            m.quant.block_len(),
            m.quant
        )));
    }
    if cols > u16::MAX as usize {
        return Err(FormatError::Invalid(format!(
            "{what}: {cols} columns > 65535"
        )));
    }
    if m.scales.len() + m.qs.len() != m.quant.matrix_bytes(rows, cols) {
        return Err(FormatError::Invalid(format!(
            "{what}: data length mismatch"
        )));
    }
    Ok(())
}

fn check_layer(c: &ModelConfig, i: usize, l: &LayerData) -> Result<(), FormatError> {
    let d = c.d_model;
    let p = |s: &str| format!("layer {i} {s}");
    want(&p("q"), &l.q, c.q_dim(), d)?;
    want(&p("k"), &l.k, c.kv_dim(), d)?;
    want(&p("v"), &l.v, c.kv_dim(), d)?;
    want(&p("o"), &l.o, d, c.q_dim())?;
    if c.has_dense() {
        match (&l.gate, &l.up, &l.down) {
            (Some(g), Some(u), Some(dn)) => {
                want(&p("gate"), g, c.d_ff, d)?;
                want(&p("up"), u, c.d_ff, d)?;
                want(&p("down"), dn, d, c.d_ff)?;
            }
            _ => return Err(FormatError::Invalid(p("dense FFN missing"))),
        }
    }
    if c.has_experts() {
        if l.experts.len() != c.n_experts {
            return Err(FormatError::Invalid(p("expert count mismatch")));
        }
        for (e, ex) in l.experts.iter().enumerate() {
            want(&p(&format!("expert {e} gate")), &ex.gate, c.expert_ffn, d)?;
            want(&p(&format!("expert {e} up")), &ex.up, c.expert_ffn, d)?;
            want(&p(&format!("expert {e} down")), &ex.down, d, c.expert_ffn)?;
            if ex.gate.quant != l.experts[0].gate.quant
                || ex.up.quant != l.experts[0].up.quant
                || ex.down.quant != l.experts[0].down.quant
            {
                return Err(FormatError::Invalid(p("experts must share quant types")));
            }
        }
        if l.router.as_ref().map(|r| r.len()) != Some(c.n_experts * d) {
            return Err(FormatError::Invalid(p("router missing or wrong size")));
        }
    }
    if l.attn_norm.len() != d {
        return Err(FormatError::Invalid(p("attn_norm length")));
    }
    match (&l.q_norm, &l.k_norm, c.qk_norm()) {
        (None, None, false) => {}
        (Some(qn), Some(kn), true) => {
            let (ql, kl) = c.qk_norm_lens();
            if qn.len() != ql || kn.len() != kl {
                return Err(FormatError::Invalid(p(&format!(
                    "q_norm/k_norm lengths {}/{}, the config wants {ql}/{kl}",
                    qn.len(),
                    kn.len(),
                ))));
            }
        }
        _ => {
            return Err(FormatError::Invalid(p(
                "q_norm and k_norm must both be present exactly when FLAG_QK_NORM is set",
            )))
        }
    }
    match (&l.post_attn_norm, &l.post_ffn_norm, c.post_norms()) {
        (None, None, false) => {}
        (Some(a), Some(f), true) if a.len() == d && f.len() == d => {}
        _ => {
            return Err(FormatError::Invalid(p(
                "post_attn_norm and post_ffn_norm (d_model each) must both be present exactly \
                 when FLAG_POST_NORMS is set",
            )))
        }
    }
    if let Some(b) = &l.router_bias {
        if b.len() != c.n_experts || l.router.is_none() {
            return Err(FormatError::Invalid(p(
                "router_bias (n_experts) is only allowed with a router",
            )));
        }
    }
    match (&l.shared_gate, &l.gate) {
        (None, _) => {}
        (Some(g), Some(_)) if g.len() == d => {}
        _ => {
            return Err(FormatError::Invalid(p(
                "shared_gate (d_model) is only allowed with a dense FFN (the shared expert)",
            )))
        }
    }
    Ok(())
}

fn check_vocab(c: &ModelConfig, v: &VocabData) -> Result<(), FormatError> {
    want("embedding", &v.embedding, c.vocab, c.d_model)?;
    match (&v.lm_head, c.tied_embeddings()) {
        (None, true) => {}
        (Some(h), false) => want("lm_head", h, c.vocab, c.d_model)?,
        _ => {
            return Err(FormatError::Invalid(
                "lm_head presence contradicts the tied-embeddings flag".into(),
            ))
        }
    }
    if v.final_norm.len() != c.d_model {
        return Err(FormatError::Invalid("final_norm length".into()));
    }
    Ok(())
}
