//! On-disk formats: `.cflow` v5 (headers, tile headers, layer directories, expert offset tables,
//! writer, validating zero-copy mmap reader). Layout reference: `docs/FORMAT.md`.
//!
//! All `unsafe` in this module is confined to turning validated byte ranges of the mapped file
//! into views; every offset and length is checked against the file size first.

pub mod error;
pub mod header;
pub mod reader;
pub mod writer;

pub use error::FormatError;
pub use header::*;
pub use reader::{CflowFile, MappedTile, Matrix};
pub use writer::{CflowWriter, ExpertData, LayerData, MatrixData, VocabData};

/// Tile geometry (paper §3.1–3.2).
pub const TILE_ROWS: usize = 128;
pub const TILE_COLS: usize = 256;
