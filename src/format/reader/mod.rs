//! Validating zero-copy `.cflow` reader. `CflowFile::open` maps the file and checks every
//! offset, length, geometry field and tile header against the file size and the header before
//! anything is handed out; afterwards `MappedTile`s are plain slices of the mapping.
//!
//! The parts: `views` (what a file hands out: matrices, experts, layers, tiles), `validate` (the
//! bounds-checked cursor and the header's configuration), `directory` (the layers' groups and
//! stripe offsets), `layer` (one layer's directory into a view), this file (`CflowFile`: open,
//! check, resident copy), `owned` (row-major copies out of the mapping).

mod directory;
mod layer;
mod owned;
mod validate;
mod views;

pub(crate) use directory::*;
pub(crate) use validate::*;
pub use views::*;

use super::content::{self, ContentHash};
use super::error::FormatError;
use super::header::*;
use super::mmap::ModelMap;
use crate::model::{ModelConfig, ModelMeta};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// What validating a model's bytes yields: its header, configuration and views (a `.cflow`'s
/// own, or a `.vflow`'s, whose views point into the twin).
pub(crate) struct Parts {
    pub(crate) header: GlobalHeader,
    pub(crate) cfg: ModelConfig,
    pub(crate) layers: Vec<LayerView>,
    pub(crate) vocab: VocabView,
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
        let parts = Self::validate(path, &map)?;
        let h = &parts.header;
        let mb = &map[h.metadata_offset as usize..][..h.metadata_len as usize];
        let (stored, _) = content::read_from_metadata(path, mb)?;
        if map.check_unchanged().is_err() {
            // Truncated while we validated it: what we read may be zeros.
            return Err(FormatError::Changed {
                file: path.into(),
                why: "it changed while it was being opened".into(),
            });
        }
        Ok(CflowFile::from_parts(path, map, parts, stored, false))
    }

    /// Assembles a file from views validated against `map` (used by the `.vflow` reader, so the
    /// engine and the fetcher run unchanged on either file). `content` is the recorded content
    /// hash; `from_twin` marks `.vflow` views.
    pub(crate) fn from_parts(
        path: &Path,
        map: ModelMap,
        parts: Parts,
        content: Option<ContentHash>,
        from_twin: bool,
    ) -> CflowFile {
        let Parts {
            header,
            cfg,
            layers,
            vocab,
        } = parts;
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
    /// With `repack`, the copy's matrices of the types it names (`quant::packed::Repack`:
    /// Q4_0/Q4_1/Q8_0, and Q5_0/Q4_K/Q6_K where their repacked kernels run) that decode multiplies (the layers'
    /// dense matrices, their experts, and the LM head, which may be the tied embedding) whose
    /// stripes are whole 16-row groups are rearranged into the layout of `quant::packed`, tile
    /// by tile, and marked [`Matrix::packed`]. The direct tier still reads experts from the
    /// file, in its tile layout (`engine::weights::relative_experts` views are never packed).
    pub fn make_resident(
        &mut self,
        repack: impl Into<crate::quant::packed::Repack>,
    ) -> Result<(), FormatError> {
        let repack = repack.into();
        self.release_pages();
        let (layers, vocab) = (&mut self.layers, &mut self.vocab);
        let mut any = false;
        self.map.make_resident(&self.path, |bytes| {
            if repack == crate::quant::packed::Repack::default() {
                return;
            }
            any |= repack_matrix(
                bytes,
                vocab.lm_head.as_mut().unwrap_or(&mut vocab.embedding),
                repack,
            );
            for l in layers.iter_mut() {
                for m in l.dense_matrices_mut() {
                    any |= repack_matrix(bytes, m, repack);
                }
                for e in l.experts.iter_mut() {
                    for m in [&mut e.gate, &mut e.up, &mut e.down] {
                        any |= repack_matrix(bytes, m, repack);
                    }
                }
            }
        })?;
        self.repacked = any;
        Ok(())
    }

    /// Sets every matrix's [`Matrix::kernel`] to `f(matrix)`: the embedding, the LM head, the
    /// layers' dense matrices and their experts. The engine calls it when it opens the model,
    /// after [`CflowFile::make_resident`] (whose repacking changes which kernel a matrix needs),
    /// with `kernels::dot::select` (`format` does not know the kernels).
    pub fn bind_kernels(&mut self, f: impl Fn(&Matrix) -> KernelId) {
        let bind = |m: &mut Matrix| m.kernel = f(m);
        bind(&mut self.vocab.embedding);
        if let Some(m) = self.vocab.lm_head.as_mut() {
            bind(m);
        }
        for l in self.layers.iter_mut() {
            for m in l.dense_matrices_mut() {
                bind(m);
            }
            for e in l.experts.iter_mut() {
                for m in [&mut e.gate, &mut e.up, &mut e.down] {
                    bind(m);
                }
            }
        }
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
    fn validate(path: &Path, bytes: &[u8]) -> Result<Parts, FormatError> {
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
        Ok(Parts {
            header: h,
            cfg,
            layers,
            vocab,
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::header::tile_bytes;
    use crate::format::TILE_ROWS;
    use crate::quant::QuantType;

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
                    kernel: crate::format::reader::KernelId::UNSET,
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
