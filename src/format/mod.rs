//! On-disk formats: `.cflow` v5 and `.vflow` (headers, tile headers, layer directories, expert offset tables,
//! writer, validating zero-copy mmap reader). Layout reference: `docs/FORMAT.md`.
//!
//! All `unsafe` in this module is confined to mapping files (`mmap`: every offset and length is
//! checked against the file size before a view is handed out) and to the SIGBUS handler that
//! keeps a file truncated while mapped from killing the process (`sigbus`).

pub mod content;
pub mod error;
pub mod header;
pub mod mmap;
pub mod quant_mix;
pub mod reader;
pub mod sigbus;
pub mod vflow;
pub mod writer;

pub use error::FormatError;
pub use header::*;
pub use reader::{CflowFile, MappedTile, Matrix};
pub use writer::{CflowWriter, ExpertData, LayerData, MatrixData, VocabData};

/// Tile geometry (paper §3.1–3.2).
pub const TILE_ROWS: usize = 128;
pub const TILE_COLS: usize = 256;

/// A short hex hash (FNV-1a 64) of the header, layer table and every directory: identifies a
/// model file in traces without reading the weights.
pub fn file_hash(f: &CflowFile) -> String {
    format!("{:016x}", file_hash_u64(f))
}

/// [`file_hash`] as a number (recorded in a `.vflow` header; twins are matched by content hash,
/// `format::content`).
pub fn file_hash_u64(f: &CflowFile) -> u64 {
    let b = f.bytes();
    let mut h: u64 = crate::util::FNV_OFFSET;
    let mut eat = |s: &[u8]| h = crate::util::fnv1a_from(h, s);
    let n = f.cfg.n_layers;
    eat(&b[..(128 + (n + 1) * 16).min(b.len())]);
    for l in &f.layers {
        let o = l.offset as usize;
        eat(&b[o..o + header::DirHeader::SIZE]);
    }
    h
}
