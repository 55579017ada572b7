//! One weight tile as every kernel reads it: its quant type, its shape and its bytes, passed as
//! one value instead of five arguments.

use crate::quant::QuantType;

/// A tile of `rows` × `cols` weights of type `quant`. For the split layout of the blocked and
/// float types, `scales` holds the per-row block scales and `qs` the quants; for K-quant tiles
/// (scales inside each super-block) and repacked tiles (one interleaved body), `scales` is
/// empty and `qs` holds the whole body.
#[derive(Clone, Copy, Debug)]
pub struct Tile<'a> {
    pub quant: QuantType,
    pub rows: usize,
    pub cols: usize,
    pub scales: &'a [u8],
    pub qs: &'a [u8],
}

impl<'a> Tile<'a> {
    /// A split-layout tile (scales, then quants).
    pub fn split(
        quant: QuantType,
        rows: usize,
        cols: usize,
        scales: &'a [u8],
        qs: &'a [u8],
    ) -> Self {
        Tile {
            quant,
            rows,
            cols,
            scales,
            qs,
        }
    }

    /// A tile stored as one body (K-quant super-blocks, or a repacked tile).
    pub fn body(quant: QuantType, rows: usize, cols: usize, body: &'a [u8]) -> Self {
        Tile {
            quant,
            rows,
            cols,
            scales: &[],
            qs: body,
        }
    }
}
