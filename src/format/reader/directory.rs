//! The directories: each layer's groups of matrices and experts walked and checked against the
//! header's geometry, every matrix's stripe offsets, and the norm vectors.

use super::*;
use crate::format::error::FormatError;
use crate::format::header::*;
use crate::format::{TILE_COLS, TILE_ROWS};
use crate::quant::QuantType;

/// Walks a group of matrices stored interleaved by stripe from `start`, validating every tile
/// header; returns the stripe offsets per member and the end offset.
pub(crate) fn walk_group(
    v: &V,
    what: &str,
    layer: u16,
    expert: Option<u8>,
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
                    expert_id: TileHeader::expert_byte(expert),
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

pub(super) fn new_matrix(
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
        kernel: crate::format::reader::KernelId::UNSET,
    })
}

/// Parsed directory of a region.
pub(super) struct Dir {
    pub(super) entries: Vec<(EntryKind, DirEntry)>,
}

impl Dir {
    pub(super) fn get(&self, k: EntryKind) -> Option<&DirEntry> {
        self.entries.iter().find(|(kk, _)| *kk == k).map(|(_, e)| e)
    }
}

pub(super) fn read_dir(
    v: &V,
    what: &str,
    off: u64,
    len: u64,
    layer: u32,
) -> Result<Dir, FormatError> {
    read_dir_in(v, what, off, (off, len), None, layer)
}

/// Reads the directory at `dir_off`; its entries must lie inside `region` (offset, length),
/// except the expert table and expert descriptors, which must lie inside `bank` when given
/// (`.vflow`: the directories of a group share the group's span, experts live in the bank).
pub(super) fn read_dir_in(
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

pub(super) fn read_vector(
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
pub(super) fn group(
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
    let stop = walk_group(v, what, layer, None, &mut refs, first.offset, end)?;
    if stop != end {
        return Err(v.mismatch(
            format!("{what} {:?} group length", specs[0].0),
            end - first.offset,
            stop - first.offset,
        ));
    }
    Ok(Some(mats))
}
