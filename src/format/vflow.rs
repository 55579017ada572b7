//! `.vflow` (paper §3.4): the vertical-group layout. The layers are cut into groups of `G`
//! consecutive layers; each group's non-expert weights form one sequential span (the attention
//! tiles of every layer of the group, then their dense tiles, then the small f32 vectors), and
//! all experts live in a random-access bank with an O(1) `(layer, expert)` → region table.
//! Layout reference: `docs/FORMAT.md` (section `.vflow`).
//!
//! The file is self-contained: it embeds a copy of the source `.cflow` global header and its
//! metadata (config, tokenizer, chat template), and records the source's content hash
//! (`source_content_hash` in that metadata, `format::content`) so a twin is matched to its
//! `.cflow` by the weights themselves. Inside, every tile keeps its 16-byte tile header and every
//! layer keeps a `.cflow` layer directory, so the reader validates with the same code as
//! `reader.rs` and hands out an ordinary [`CflowFile`] whose views point into the `.vflow` map:
//! the engine and the expert fetcher run unchanged on it.

use super::content::{self, SOURCE_HASH_KEY};
use super::error::FormatError;
use super::header::*;
use super::mmap::ModelMap;
use super::reader::{config_from_header, CflowFile, LayerView, Matrix, V};
use super::writer::{build_vocab_region, ITEM_ALIGN, REGION_ALIGN};
use crate::model::ModelMeta;
use crate::output::Output;
use crate::quant::QuantType;
use std::io::Write;
use std::path::{Path, PathBuf};

pub const VFLOW_MAGIC: [u8; 8] = *b"VFLOW\0\0\0";
pub const VFLOW_VERSION: u32 = 1;
/// Offset of the embedded `.cflow` global header.
const MODEL_HEADER_AT: u64 = 128;
/// Bytes of one group-table entry.
pub const GROUP_ENTRY_SIZE: usize = 24;
/// `first_layer` of the group-table entry that describes the vocabulary region.
pub const VOCAB_GROUP: u32 = 0xFFFF;
/// Default layers per vertical group.
pub const DEFAULT_GROUP_SIZE: usize = 2;

/// The 64-byte `.vflow` header at offset 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VflowHeader {
    pub magic: [u8; 8],
    pub version: u32,
    /// Layers per vertical group (the last group may be shorter).
    pub group_size: u16,
    pub n_groups: u16,
    pub n_layers: u16,
    /// Experts per layer (0 = dense).
    pub n_experts: u16,
    pub reserved: u32,
    /// Embedded copy of the source `.cflow` global header (88 bytes); its `metadata_offset` /
    /// `metadata_len` point at the embedded metadata JSON in this file.
    pub model_header_offset: u64,
    /// `(n_groups + 1)` entries of [`GroupEntry`]; the last one is the vocabulary region.
    pub group_table_offset: u64,
    /// Start of the sequential streaming region (the first group's span).
    pub seq_offset: u64,
    /// The expert bank: `n_layers × n_experts` `{u64 offset, u64 length}` indexed by
    /// `layer * n_experts + expert`, followed by the expert regions (4096-aligned).
    pub expert_bank_offset: u64,
    /// `file_hash` of the `.cflow` this file was converted from.
    pub source_hash: u64,
}

impl VflowHeader {
    pub const SIZE: usize = 64;

    pub fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(&self.magic);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..14].copy_from_slice(&self.group_size.to_le_bytes());
        b[14..16].copy_from_slice(&self.n_groups.to_le_bytes());
        b[16..18].copy_from_slice(&self.n_layers.to_le_bytes());
        b[18..20].copy_from_slice(&self.n_experts.to_le_bytes());
        b[20..24].copy_from_slice(&self.reserved.to_le_bytes());
        b[24..32].copy_from_slice(&self.model_header_offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.group_table_offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.seq_offset.to_le_bytes());
        b[48..56].copy_from_slice(&self.expert_bank_offset.to_le_bytes());
        b[56..64].copy_from_slice(&self.source_hash.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<VflowHeader> {
        let mut r = Rd::new(b.get(..Self::SIZE)?);
        Some(VflowHeader {
            magic: r.bytes()?,
            version: r.u32()?,
            group_size: r.u16()?,
            n_groups: r.u16()?,
            n_layers: r.u16()?,
            n_experts: r.u16()?,
            reserved: r.u32()?,
            model_header_offset: r.u64()?,
            group_table_offset: r.u64()?,
            seq_offset: r.u64()?,
            expert_bank_offset: r.u64()?,
            source_hash: r.u64()?,
        })
    }
}

/// One group-table entry (24 bytes): the layers of a group and its sequential span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupEntry {
    /// First layer of the group (`VOCAB_GROUP` for the vocabulary entry).
    pub first_layer: u32,
    pub n_layers: u32,
    pub offset: u64,
    pub len: u64,
}

impl GroupEntry {
    fn encode(&self) -> [u8; GROUP_ENTRY_SIZE] {
        let mut b = [0u8; GROUP_ENTRY_SIZE];
        b[0..4].copy_from_slice(&self.first_layer.to_le_bytes());
        b[4..8].copy_from_slice(&self.n_layers.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }
    fn decode(b: &[u8]) -> Option<GroupEntry> {
        let mut r = Rd::new(b.get(..GROUP_ENTRY_SIZE)?);
        Some(GroupEntry {
            first_layer: r.u32()?,
            n_layers: r.u32()?,
            offset: r.u64()?,
            len: r.u64()?,
        })
    }
}

/// An open, fully validated `.vflow` file: its own tables plus `CflowFile`-shaped views.
pub struct VflowFile {
    pub header: VflowHeader,
    /// The groups, then the vocabulary entry.
    pub groups: Vec<GroupEntry>,
    /// The views (every offset is inside the `.vflow` mapping).
    pub file: CflowFile,
}

impl std::fmt::Debug for VflowFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VflowFile")
            .field("path", &self.file.path)
            .field("header", &self.header)
            .finish()
    }
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

impl VflowFile {
    /// Opens and fully validates a `.vflow` file (a regular file: a FIFO or a device is refused
    /// without blocking on it).
    pub fn open(path: &Path) -> Result<VflowFile, FormatError> {
        let map = ModelMap::open(path)?;
        let size = map.len() as u64;
        if size < VflowHeader::SIZE as u64 {
            return Err(FormatError::TooSmall {
                file: path.into(),
                size,
                needed: VflowHeader::SIZE as u64,
            });
        }
        let (header, groups, parts) = validate(path, &map)?;
        let h = &parts.header;
        let mb = &map[h.metadata_offset as usize..][..h.metadata_len as usize];
        let (_, source) = content::read_from_metadata(path, mb)?;
        if map.check_unchanged().is_err() {
            return Err(FormatError::Changed {
                file: path.into(),
                why: "it changed while it was being opened".into(),
            });
        }
        Ok(VflowFile {
            header,
            groups,
            file: CflowFile::from_parts(path, map, parts, source, true),
        })
    }

    /// True when the twin records its source's content hash (written by this version); false
    /// for older twins, whose source hash [`CflowFile::content_hash`] recomputes from the views.
    pub fn has_recorded_source_hash(&self) -> bool {
        self.file.has_recorded_content_hash()
    }

    /// O(1) lookup of expert `e` of layer `l` in the bank table: `(offset, length)` of its region.
    pub fn expert_region(&self, l: usize, e: usize) -> Option<(u64, u64)> {
        let ne = self.header.n_experts as usize;
        if l >= self.header.n_layers as usize || e >= ne {
            return None;
        }
        let at = self.header.expert_bank_offset as usize + (l * ne + e) * 16;
        let b = self.file.bytes().get(at..at + 16)?;
        Some((
            u64::from_le_bytes(b[..8].try_into().ok()?),
            u64::from_le_bytes(b[8..].try_into().ok()?),
        ))
    }

    /// The views, shareable with an engine.
    pub fn into_file(self) -> CflowFile {
        self.file
    }
}

/// Opens a `.vflow` and returns only its `CflowFile`-shaped views.
pub fn open_views(path: &Path) -> Result<CflowFile, FormatError> {
    VflowFile::open(path).map(VflowFile::into_file)
}

/// True when `v` was converted from `c`: same configuration and `v`'s source content hash is
/// `c`'s content hash (so the weights are the same, not only the header and directories).
pub fn is_twin_of(v: &VflowFile, c: &CflowFile) -> bool {
    check_twin(v, c).is_ok()
}

/// [`is_twin_of`], saying why not. Files without a recorded hash are hashed here (a pass over
/// the data; see [`CflowFile::has_recorded_content_hash`]).
pub fn check_twin(v: &VflowFile, c: &CflowFile) -> Result<(), String> {
    if v.file.cfg != c.cfg {
        return Err(format!(
            "{} is not a twin of {}: the model configuration differs",
            v.file.path.display(),
            c.path.display()
        ));
    }
    let (vh, ch) = (v.file.content_hash(), c.content_hash());
    if vh != ch {
        return Err(format!(
            "stale twin: {} was converted from a model with content hash {}, but {} has {} \
             (reconvert it with `convert {} --to vflow`)",
            v.file.path.display(),
            vh.short(),
            c.path.display(),
            ch.short(),
            c.path.display()
        ));
    }
    Ok(())
}

type Validated = (VflowHeader, Vec<GroupEntry>, super::reader::Parts);

fn validate(path: &Path, bytes: &[u8]) -> Result<Validated, FormatError> {
    let v = V { file: path, bytes };
    let vh = VflowHeader::decode(bytes).ok_or(FormatError::TooSmall {
        file: path.into(),
        size: bytes.len() as u64,
        needed: VflowHeader::SIZE as u64,
    })?;
    if vh.magic != VFLOW_MAGIC {
        return Err(v.mismatch(
            "magic (not a .vflow file)".into(),
            "\"VFLOW\\0\\0\\0\"",
            format!("{:?}", vh.magic),
        ));
    }
    if vh.version != VFLOW_VERSION {
        return Err(FormatError::BadVersion {
            file: path.into(),
            found: vh.version,
            expected: VFLOW_VERSION,
        });
    }
    // Embedded model header and metadata.
    let hb = v.range(
        "embedded .cflow header",
        vh.model_header_offset,
        GlobalHeader::SIZE as u64,
    )?;
    if vh.model_header_offset < VflowHeader::SIZE as u64 {
        return Err(overlap(
            path,
            "embedded .cflow header",
            vh.model_header_offset,
            GlobalHeader::SIZE as u64,
            "vflow header",
            0,
            VflowHeader::SIZE as u64,
        ));
    }
    let h = GlobalHeader::decode(hb).expect("88 bytes");
    if h.magic != MAGIC {
        return Err(v.mismatch(
            "embedded .cflow header magic".into(),
            "\"CFLOW\\0\\0\\0\"",
            format!("{:?}", h.magic),
        ));
    }
    if h.version != VERSION {
        return Err(FormatError::BadVersion {
            file: path.into(),
            found: h.version,
            expected: VERSION,
        });
    }
    let mut prev = (
        "embedded .cflow header".to_string(),
        vh.model_header_offset + GlobalHeader::SIZE as u64,
    );
    let (mo, ml) = (h.metadata_offset, h.metadata_len as u64);
    let mb = v.range("metadata", mo, ml)?;
    order(path, &mut prev, "metadata", mo, ml)?;
    let meta: ModelMeta = serde_json::from_slice(mb).map_err(|e| FormatError::BadMetadata {
        file: path.into(),
        why: e.to_string(),
    })?;
    let cfg = config_from_header(&v, &h, meta)?;
    let nl = cfg.n_layers;
    let ne = cfg.n_experts;
    if vh.n_layers as usize != nl {
        return Err(v.mismatch("vflow n_layers".into(), nl, vh.n_layers));
    }
    if vh.n_experts as usize != ne {
        return Err(v.mismatch("vflow n_experts".into(), ne, vh.n_experts));
    }
    let g = vh.group_size as usize;
    if g == 0 {
        return Err(v.field("group_size", g, "must be at least 1"));
    }
    let ng = nl.div_ceil(g);
    if vh.n_groups as usize != ng {
        return Err(v.mismatch(
            format!("n_groups ({nl} layers / group size {g})"),
            ng,
            vh.n_groups,
        ));
    }
    // Group table.
    let gt_len = (ng as u64 + 1) * GROUP_ENTRY_SIZE as u64;
    let gtb = v.range("group table", vh.group_table_offset, gt_len)?;
    order(
        path,
        &mut prev,
        "group table",
        vh.group_table_offset,
        gt_len,
    )?;
    let groups: Vec<GroupEntry> = gtb
        .chunks_exact(GROUP_ENTRY_SIZE)
        .map(|c| GroupEntry::decode(c).expect("24 bytes"))
        .collect();
    if vh.seq_offset < prev.1 {
        return Err(overlap(
            path,
            "sequential region",
            vh.seq_offset,
            0,
            &prev.0,
            0,
            prev.1,
        ));
    }
    prev = ("sequential region start".to_string(), vh.seq_offset);
    for (gi, ge) in groups[..ng].iter().enumerate() {
        let what = format!("group {gi}");
        let first = gi * g;
        let n = g.min(nl - first);
        if ge.first_layer as usize != first || ge.n_layers as usize != n {
            return Err(v.mismatch(
                format!("{what} layer range"),
                format!("layers {first}..{}", first + n),
                format!("first {} count {}", ge.first_layer, ge.n_layers),
            ));
        }
        v.range(&what, ge.offset, ge.len)?;
        order(path, &mut prev, &what, ge.offset, ge.len)?;
    }
    if groups[0].offset != vh.seq_offset {
        return Err(v.mismatch(
            "group 0 offset (sequential region start)".into(),
            vh.seq_offset,
            groups[0].offset,
        ));
    }
    // Expert bank: the table, then the regions, up to the vocabulary region.
    let table_len = (nl as u64) * (ne as u64) * 16;
    v.range("expert bank table", vh.expert_bank_offset, table_len)?;
    order(
        path,
        &mut prev,
        "expert bank table",
        vh.expert_bank_offset,
        table_len,
    )?;
    let vg = groups[ng];
    if vg.first_layer != VOCAB_GROUP || vg.n_layers != 0 {
        return Err(v.mismatch(
            "group table vocab entry".into(),
            format!("first {VOCAB_GROUP} count 0"),
            format!("first {} count {}", vg.first_layer, vg.n_layers),
        ));
    }
    v.range("vocab region", vg.offset, vg.len)?;
    order(path, &mut prev, "vocab region", vg.offset, vg.len)?;
    let bank = (vh.expert_bank_offset, vg.offset - vh.expert_bank_offset);
    // Layers: the directories of a group open its span, one after another in layer order.
    let mut layers = Vec::with_capacity(nl);
    for ge in &groups[..ng] {
        let mut dir_off = ge.offset;
        for l in ge.first_layer as usize..(ge.first_layer + ge.n_layers) as usize {
            let region = (ge.offset, ge.len);
            let lv = CflowFile::read_layer_in(&v, &cfg, l, dir_off, region, Some(bank))?;
            let dh = DirHeader::decode(&bytes[dir_off as usize..]).expect("validated");
            dir_off = align_up(
                dir_off + (DirHeader::SIZE + dh.n_entries as usize * DirEntry::SIZE) as u64,
                ITEM_ALIGN as u64,
            );
            layers.push(lv);
        }
    }
    // Expert regions: 4096-aligned, in (layer, expert) order, never overlapping.
    let mut prev_end = vh.expert_bank_offset + table_len;
    for (l, lv) in layers.iter().enumerate() {
        for (e, ex) in lv.experts.iter().enumerate() {
            if !ex.offset.is_multiple_of(REGION_ALIGN as u64) {
                return Err(v.field(
                    "expert region offset",
                    ex.offset,
                    &format!("layer {l} expert {e}: not 4096-aligned"),
                ));
            }
            if ex.offset < prev_end {
                return Err(overlap(
                    path,
                    &format!("layer {l} expert {e} region"),
                    ex.offset,
                    ex.len,
                    "the previous expert region",
                    0,
                    prev_end,
                ));
            }
            prev_end = ex.offset + ex.len;
        }
    }
    let vocab = CflowFile::read_vocab(&v, &cfg, vg.offset, vg.len)?;
    Ok((
        vh,
        groups,
        super::reader::Parts {
            header: h,
            cfg,
            layers,
            vocab,
        },
    ))
}

/// Requires `[off, +len)` to start at or after the end of the previous section.
fn order(
    path: &Path,
    prev: &mut (String, u64),
    what: &str,
    off: u64,
    len: u64,
) -> Result<(), FormatError> {
    if off < prev.1 {
        return Err(overlap(path, what, off, len, &prev.0, 0, prev.1));
    }
    // Every length was range-checked against the file before, so this cannot overflow.
    *prev = (what.to_string(), off + len);
    Ok(())
}

fn overlap(
    path: &Path,
    what: &str,
    a_off: u64,
    a_len: u64,
    other: &str,
    b_off: u64,
    b_len: u64,
) -> FormatError {
    FormatError::Overlap {
        file: path.into(),
        what: what.into(),
        a_off,
        a_len,
        other: other.into(),
        b_off,
        b_len,
    }
}

// ---------------------------------------------------------------------------------------------
// Writer (conversion from a validated `.cflow`).

/// Byte span `[start, end)` of a group of matrices stored interleaved (validated contiguous).
fn span(ms: &[&Matrix]) -> (usize, usize) {
    let mut a = usize::MAX;
    let mut b = 0;
    for m in ms {
        for (s, &o) in m.stripes.iter().enumerate() {
            a = a.min(o);
            b = b.max(o + m.stripe_bytes(s));
        }
    }
    (a, b)
}

fn pad(buf: &mut Vec<u8>, base: u64, align: usize) {
    let r = ((base + buf.len() as u64) % align as u64) as usize;
    if r != 0 {
        buf.resize(buf.len() + align - r, 0);
    }
}

fn entry(kind: EntryKind, quant: u8, group: u8, rows: usize, cols: usize) -> DirEntry {
    DirEntry {
        kind: kind as u8,
        quant,
        group,
        rows: rows as u32,
        cols: cols as u32,
        ..Default::default()
    }
}

/// Builds the span of one group at `base` (4096-aligned): the layer directories, then the
/// attention tiles (Q/K/V fused, O) of every layer, then the dense tiles (gate/up fused, down)
/// of every layer, then the f32 vectors and routers. Tile bytes are copied verbatim from `src`.
/// `bank_table` is the offset of the expert bank table (the experts' directory entries point at
/// their layer's slice of it).
fn build_group(
    src: &CflowFile,
    layers: std::ops::Range<usize>,
    base: u64,
    bank_table: u64,
) -> Vec<u8> {
    let b = src.bytes();
    let ne = src.cfg.n_experts;
    let mut dirs: Vec<Vec<DirEntry>> = vec![Vec::new(); layers.len()];
    let mut buf = Vec::new();
    // Reserve the directories.
    let n_entries = |lv: &LayerView| {
        let mut n = 5; // q k v o attn_norm
        n += [
            &lv.q_bias,
            &lv.k_bias,
            &lv.v_bias,
            &lv.q_norm,
            &lv.k_norm,
            &lv.post_attn_norm,
            &lv.post_ffn_norm,
            &lv.shared_gate,
            &lv.router_bias,
            &lv.ffn_norm,
            &lv.moe_norm,
        ]
        .iter()
        .filter(|x| x.is_some())
        .count();
        n += lv.gate.is_some() as usize * 3 + lv.router.is_some() as usize;
        if !lv.experts.is_empty() {
            n += 4; // table, gate/up/down descriptors
        }
        n
    };
    let mut dir_at = Vec::new();
    for l in layers.clone() {
        pad(&mut buf, base, ITEM_ALIGN);
        dir_at.push(buf.len());
        let n = n_entries(&src.layers[l]);
        buf.resize(buf.len() + DirHeader::SIZE + n * DirEntry::SIZE, 0);
    }
    let copy = |buf: &mut Vec<u8>, ms: &[&Matrix], group: u8, out: &mut Vec<DirEntry>| {
        pad(buf, base, ITEM_ALIGN);
        let (a, e) = span(ms);
        let at = base + buf.len() as u64;
        buf.extend_from_slice(&b[a..e]);
        for m in ms {
            let mut d = entry(m.kind, m.quant as u8, group, m.rows, m.cols);
            d.offset = at;
            d.length = (e - a) as u64;
            out.push(d);
        }
    };
    // Attention of every layer of the group.
    for (j, l) in layers.clone().enumerate() {
        let lv = &src.layers[l];
        copy(&mut buf, &[&lv.q, &lv.k, &lv.v], 1, &mut dirs[j]);
        copy(&mut buf, &[&lv.o], 0, &mut dirs[j]);
    }
    // Dense FFN of every layer.
    for (j, l) in layers.clone().enumerate() {
        let lv = &src.layers[l];
        if let (Some(g), Some(u), Some(d)) = (&lv.gate, &lv.up, &lv.down) {
            copy(&mut buf, &[g, u], 2, &mut dirs[j]);
            copy(&mut buf, &[d], 0, &mut dirs[j]);
        }
    }
    // Vectors and routers.
    for (j, l) in layers.clone().enumerate() {
        let lv = &src.layers[l];
        let vecs = [
            (EntryKind::AttnNorm, Some(&lv.attn_norm)),
            (EntryKind::FfnNorm, lv.ffn_norm.as_ref()),
            (EntryKind::MoeNorm, lv.moe_norm.as_ref()),
            (EntryKind::QBias, lv.q_bias.as_ref()),
            (EntryKind::KBias, lv.k_bias.as_ref()),
            (EntryKind::VBias, lv.v_bias.as_ref()),
            (EntryKind::QNorm, lv.q_norm.as_ref()),
            (EntryKind::KNorm, lv.k_norm.as_ref()),
            (EntryKind::PostAttnNorm, lv.post_attn_norm.as_ref()),
            (EntryKind::PostFfnNorm, lv.post_ffn_norm.as_ref()),
            (EntryKind::SharedGate, lv.shared_gate.as_ref()),
            (EntryKind::RouterBias, lv.router_bias.as_ref()),
            (EntryKind::Router, lv.router.as_ref()),
        ];
        for (k, x) in vecs {
            let Some(x) = x else { continue };
            pad(&mut buf, base, ITEM_ALIGN);
            let mut d = entry(k, QuantType::F32 as u8, 0, 1, x.len());
            if k == EntryKind::Router {
                d.rows = ne as u32;
                d.cols = (x.len() / ne.max(1)) as u32;
            }
            d.offset = base + buf.len() as u64;
            d.length = (x.len() * 4) as u64;
            buf.extend(x.iter().flat_map(|f| f.to_le_bytes()));
            dirs[j].push(d);
        }
        if let Some(ex) = lv.experts.first() {
            let t = bank_table + (l * ne * 16) as u64;
            let mut d = entry(EntryKind::ExpertTable, 0, 0, ne, 2);
            d.offset = t;
            d.length = (ne * 16) as u64;
            dirs[j].push(d);
            for (m, g) in [(&ex.gate, 3u8), (&ex.up, 3), (&ex.down, 0)] {
                let mut d = entry(m.kind, m.quant as u8, g, m.rows, m.cols);
                d.offset = t;
                dirs[j].push(d);
            }
        }
    }
    for (j, l) in layers.enumerate() {
        let h = DirHeader {
            magic: DIR_MAGIC,
            layer: l as u32,
            n_entries: dirs[j].len() as u32,
            reserved: 0,
        };
        let at = dir_at[j];
        buf[at..at + DirHeader::SIZE].copy_from_slice(&h.encode());
        for (i, e) in dirs[j].iter().enumerate() {
            let o = at + DirHeader::SIZE + i * DirEntry::SIZE;
            buf[o..o + DirEntry::SIZE].copy_from_slice(&e.encode());
        }
    }
    buf
}

/// Writes `src` as a `.vflow` with `group_size` layers per vertical group to `out` (through a
/// [`crate::output::Output`]: a temporary file renamed into place, so a failed conversion leaves
/// nothing behind; `out` being the source file itself is refused before anything is written).
pub fn convert(src: &CflowFile, out: &Path, group_size: usize) -> Result<(), FormatError> {
    let c = &src.cfg;
    let nl = c.n_layers;
    let ne = c.n_experts;
    if group_size == 0 || group_size > nl.max(1) {
        return Err(FormatError::Invalid(format!(
            "group size {group_size}: must be between 1 and n_layers ({nl})"
        )));
    }
    let ng = nl.div_ceil(group_size);
    let ranges: Vec<std::ops::Range<usize>> = (0..ng)
        .map(|g| g * group_size..((g + 1) * group_size).min(nl))
        .collect();
    // Fixed part: header, embedded model header + metadata, group table.
    let meta = serde_json::to_vec(&c.meta).map_err(|e| FormatError::Invalid(e.to_string()))?;
    // The twin records its source's content hash (computed here for sources written before it
    // was recorded), so `check_twin` compares the weights, not only the header.
    let meta = content::append_to_metadata(meta, SOURCE_HASH_KEY, &src.content_hash());
    let meta_off = align_up(MODEL_HEADER_AT + GlobalHeader::SIZE as u64, 64);
    let gt_off = align_up(meta_off + meta.len() as u64, 64);
    let gt_len = ((ng + 1) * GROUP_ENTRY_SIZE) as u64;
    let seq_off = align_up(gt_off + gt_len, REGION_ALIGN as u64);
    // Group spans do not depend on their base (4096-aligned) or the bank offset: size them first.
    let mut pos = seq_off;
    let mut groups = Vec::with_capacity(ng + 1);
    for (gi, r) in ranges.iter().enumerate() {
        let len = build_group(src, r.clone(), 0, 0).len() as u64;
        groups.push(GroupEntry {
            first_layer: (gi * group_size) as u32,
            n_layers: r.len() as u32,
            offset: pos,
            len,
        });
        pos = align_up(pos + len, REGION_ALIGN as u64);
    }
    let bank_off = pos;
    let table_len = (nl * ne * 16) as u64;
    let mut table = Vec::with_capacity(nl * ne * 16);
    pos = bank_off + table_len;
    for lv in &src.layers {
        for ex in &lv.experts {
            pos = align_up(pos, REGION_ALIGN as u64);
            table.extend_from_slice(&pos.to_le_bytes());
            table.extend_from_slice(&ex.len.to_le_bytes());
            pos += ex.len;
        }
    }
    let vocab_off = align_up(pos, REGION_ALIGN as u64);
    let vocab = build_vocab_region(vocab_off, &src.vocab_data());
    groups.push(GroupEntry {
        first_layer: VOCAB_GROUP,
        n_layers: 0,
        offset: vocab_off,
        len: vocab.len() as u64,
    });
    let vh = VflowHeader {
        magic: VFLOW_MAGIC,
        version: VFLOW_VERSION,
        group_size: group_size as u16,
        n_groups: ng as u16,
        n_layers: nl as u16,
        n_experts: ne as u16,
        reserved: 0,
        model_header_offset: MODEL_HEADER_AT,
        group_table_offset: gt_off,
        seq_offset: seq_off,
        expert_bank_offset: bank_off,
        source_hash: super::file_hash_u64(src),
    };
    let mut h = src.header;
    h.layer_table_offset = gt_off;
    h.metadata_offset = meta_off;
    h.metadata_len = meta.len() as u32;

    let mut w = TmpWriter::create(out, &[&src.path])?;
    let mut head = vec![0u8; seq_off as usize];
    head[..64].copy_from_slice(&vh.encode());
    let mh = MODEL_HEADER_AT as usize;
    head[mh..mh + GlobalHeader::SIZE].copy_from_slice(&h.encode());
    head[meta_off as usize..meta_off as usize + meta.len()].copy_from_slice(&meta);
    for (i, ge) in groups.iter().enumerate() {
        let o = gt_off as usize + i * GROUP_ENTRY_SIZE;
        head[o..o + GROUP_ENTRY_SIZE].copy_from_slice(&ge.encode());
    }
    w.write_at(0, &head)?;
    for (r, ge) in ranges.iter().zip(&groups) {
        let span = build_group(src, r.clone(), ge.offset, bank_off);
        debug_assert_eq!(span.len() as u64, ge.len);
        w.write_at(ge.offset, &span)?;
    }
    w.write_at(bank_off, &table)?;
    let b = src.bytes();
    let mut k = 0;
    for lv in &src.layers {
        for ex in &lv.experts {
            let at = u64::from_le_bytes(table[k * 16..k * 16 + 8].try_into().expect("8"));
            w.write_at(at, &b[ex.offset as usize..(ex.offset + ex.len) as usize])?;
            k += 1;
        }
    }
    w.write_at(vocab_off, &vocab)?;
    w.finish()
}

/// Sequential writer into an [`Output`] (a temporary file renamed into place by `finish`, or a
/// device/FIFO written directly), zero-filling gaps.
struct TmpWriter {
    path: PathBuf,
    out: Option<Output>,
    pos: u64,
}

impl TmpWriter {
    fn create(path: &Path, inputs: &[&Path]) -> Result<TmpWriter, FormatError> {
        Ok(TmpWriter {
            path: path.into(),
            out: Some(Output::create(path, inputs)?),
            pos: 0,
        })
    }
    /// Writes `b` at `at` (never before the current end).
    fn write_at(&mut self, at: u64, b: &[u8]) -> Result<(), FormatError> {
        if at < self.pos {
            return Err(FormatError::Invalid(format!(
                "vflow writer: section at {at} before the current end {}",
                self.pos
            )));
        }
        let gap = (at - self.pos) as usize;
        let path = self.path.clone();
        let werr = |e| FormatError::Write {
            file: path.clone(),
            err: e,
        };
        let f = self
            .out
            .as_mut()
            .expect("writer used after finish")
            .file_mut();
        f.write_all(&vec![0u8; gap]).map_err(werr)?;
        f.write_all(b).map_err(werr)?;
        self.pos = at + b.len() as u64;
        Ok(())
    }
    fn finish(mut self) -> Result<(), FormatError> {
        // Unfinished (error or abandoned): dropping `out` removes the temporary file.
        self.out.take().expect("finish once").commit()?;
        Ok(())
    }
}
