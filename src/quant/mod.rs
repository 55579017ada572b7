//! Block quantization formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants Q4_K, Q5_K, Q6_K,
//! F16, F32): type ids, sizes, bits per weight, and the quantize/dequantize reference routines.
//! Block layouts and nibble order follow GGUF so that GGUF blocks import without re-quantization.
//!
//! Inside a `.cflow` tile a Q4_0/Q4_1/Q8_0 matrix is stored *split*: first the per-block scale
//! entries of every row (row-major), then the packed quants of every row (row-major). The newer
//! types ([`QuantType::is_interleaved`]: Q5_0, Q5_1 and the K-quants) are stored as GGUF's blocks
//! unchanged, row-major (their scale region is empty). See `docs/FORMAT.md`.

mod blocks;
pub mod kquants;
pub mod packed;

pub use blocks::*;

use serde::{Deserialize, Serialize};

/// Weights per quantization block for the block types.
pub const QK: usize = 32;

/// Storage type of one matrix. The numeric ids are the on-disk values (they equal GGML's type ids).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
#[allow(non_camel_case_types)]
pub enum QuantType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
}

impl QuantType {
    /// Every type, in id order.
    pub const ALL: [QuantType; 10] = [
        QuantType::F32,
        QuantType::F16,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Q4_K,
        QuantType::Q5_K,
        QuantType::Q6_K,
    ];

    /// The types of the split layout (F32, F16, Q4_0, Q4_1, Q8_0), which the kernels in
    /// `kernels::dot::split` handles; the others go to `kernels::dot::kquant`.
    pub const SPLIT: [QuantType; 5] = [
        QuantType::F32,
        QuantType::F16,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q8_0,
    ];

    pub fn from_u8(v: u8) -> Option<QuantType> {
        QuantType::ALL.into_iter().find(|q| *q as u8 == v)
    }

    pub fn name(self) -> &'static str {
        match self {
            QuantType::F32 => "F32",
            QuantType::F16 => "F16",
            QuantType::Q4_0 => "Q4_0",
            QuantType::Q4_1 => "Q4_1",
            QuantType::Q5_0 => "Q5_0",
            QuantType::Q5_1 => "Q5_1",
            QuantType::Q8_0 => "Q8_0",
            QuantType::Q4_K => "Q4_K",
            QuantType::Q5_K => "Q5_K",
            QuantType::Q6_K => "Q6_K",
        }
    }

    pub fn parse(s: &str) -> Option<QuantType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "q4" => QuantType::Q4_0,
            "q8" => QuantType::Q8_0,
            l => {
                return QuantType::ALL
                    .into_iter()
                    .find(|q| q.name().eq_ignore_ascii_case(l))
            }
        })
    }

    /// True for the quantized block types (columns must be a multiple of [`QuantType::block_len`]).
    pub const fn is_blocked(self) -> bool {
        !matches!(self, QuantType::F32 | QuantType::F16)
    }

    /// True for the K-quants (256-weight super-blocks; their integer path takes a Q8_K
    /// activation, `kernels::dot::act_q8::Q8K`).
    pub const fn is_k(self) -> bool {
        matches!(self, QuantType::Q4_K | QuantType::Q5_K | QuantType::Q6_K)
    }

    /// True for the types stored as GGUF's blocks unchanged (scale region empty): Q5_0, Q5_1 and
    /// the K-quants. Q4_0, Q4_1 and Q8_0 are split into scales and quants.
    pub const fn is_interleaved(self) -> bool {
        matches!(
            self,
            QuantType::Q5_0 | QuantType::Q5_1 | QuantType::Q4_K | QuantType::Q5_K | QuantType::Q6_K
        )
    }

    /// Weights per block: 1 for F16/F32, 32 for Q4_0..Q8_0, 256 for the K-quants.
    pub const fn block_len(self) -> usize {
        match self {
            QuantType::F32 | QuantType::F16 => 1,
            QuantType::Q4_K | QuantType::Q5_K | QuantType::Q6_K => kquants::QK_K,
            _ => QK,
        }
    }

    /// Bytes of the split-off scale data per block (0 for F16/F32 and the interleaved types).
    pub const fn scale_bytes_per_block(self) -> usize {
        match self {
            QuantType::Q4_0 | QuantType::Q8_0 => 2,
            QuantType::Q4_1 => 4,
            _ => 0,
        }
    }

    /// Bytes of the quant part per block of [`QuantType::block_len`] weights (for F16/F32: 32
    /// elements' worth; for the interleaved types: the whole GGUF block).
    pub const fn quant_bytes_per_block(self) -> usize {
        match self {
            QuantType::Q4_0 | QuantType::Q4_1 => 16,
            QuantType::Q8_0 => 32,
            QuantType::F16 => 64,
            QuantType::F32 => 128,
            QuantType::Q5_0 => kquants::Q5_0_BYTES,
            QuantType::Q5_1 => kquants::Q5_1_BYTES,
            QuantType::Q4_K => kquants::Q4_K_BYTES,
            QuantType::Q5_K => kquants::Q5_K_BYTES,
            QuantType::Q6_K => kquants::Q6_K_BYTES,
        }
    }

    /// Bytes of one GGUF block (scale(s) then quants for the split types).
    pub const fn block_bytes(self) -> usize {
        self.scale_bytes_per_block() + self.quant_bytes_per_block()
    }

    /// Bytes needed to store `rows × cols` weights (scales + quants). `cols` must be a multiple of
    /// [`QuantType::block_len`] (checked by callers).
    pub const fn matrix_bytes(self, rows: usize, cols: usize) -> usize {
        match self {
            QuantType::F32 => rows * cols * 4,
            QuantType::F16 => rows * cols * 2,
            _ => rows * (cols / self.block_len()) * self.block_bytes(),
        }
    }

    /// Scale bytes of one row of `cols` weights in the tile layout (0 unless split).
    pub const fn row_scale_bytes(self, cols: usize) -> usize {
        (cols / self.block_len()) * self.scale_bytes_per_block()
    }

    /// Quant bytes of one row of `cols` weights in the tile layout (everything for F16/F32 and
    /// the interleaved types).
    pub const fn row_quant_bytes(self, cols: usize) -> usize {
        self.matrix_bytes(1, cols) - self.row_scale_bytes(cols)
    }

    /// Nominal bits per weight of the payload convention. Q4_0/Q4_1/Q8_0 follow the paper
    /// ("0.5 byte/param" for Q4: the quants without their block scales). The newer types count
    /// their GGUF bits per weight, scales included, as llama.cpp quotes them (Q5_0 5.5, Q5_1 6,
    /// Q4_K 4.5, Q5_K 5.5, Q6_K 6.5625): their scales are part of the block format. The stored
    /// bytes (`with_scales`) always come from [`QuantType::matrix_bytes`].
    pub fn payload_bits_per_weight(self) -> f64 {
        match self {
            QuantType::F32 => 32.0,
            QuantType::F16 => 16.0,
            QuantType::Q4_0 | QuantType::Q4_1 => 4.0,
            QuantType::Q8_0 => 8.0,
            _ => self.stored_bits_per_weight(),
        }
    }

    /// Bits per weight as stored (scales included): `8 · block_bytes / block_len`.
    pub fn stored_bits_per_weight(self) -> f64 {
        8.0 * self.matrix_bytes(1, self.block_len()) as f64 / self.block_len() as f64
    }
}

impl std::fmt::Display for QuantType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

// On-disk block sizes (GGUF): checked at compile time.
const _: () = assert!(QuantType::Q4_0.matrix_bytes(1, 32) == 18);
const _: () = assert!(QuantType::Q4_1.matrix_bytes(1, 32) == 20);
const _: () = assert!(QuantType::Q8_0.matrix_bytes(1, 32) == 34);
const _: () = assert!(QuantType::Q5_0.matrix_bytes(1, 32) == 22);
const _: () = assert!(QuantType::Q5_1.matrix_bytes(1, 32) == 24);
const _: () = assert!(QuantType::Q4_K.matrix_bytes(1, 256) == 144);
const _: () = assert!(QuantType::Q5_K.matrix_bytes(1, 256) == 176);
const _: () = assert!(QuantType::Q6_K.matrix_bytes(1, 256) == 210);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_names_and_bits_per_weight() {
        for q in QuantType::ALL {
            assert_eq!(QuantType::from_u8(q as u8), Some(q));
            assert_eq!(QuantType::parse(q.name()), Some(q));
            assert_eq!(QuantType::parse(&q.name().to_lowercase()), Some(q));
        }
        assert_eq!(QuantType::from_u8(4), None);
        let bpw = |q: QuantType| q.payload_bits_per_weight();
        assert_eq!(bpw(QuantType::Q4_K), 4.5);
        assert_eq!(bpw(QuantType::Q5_K), 5.5);
        assert_eq!(bpw(QuantType::Q6_K), 6.5625);
        assert_eq!(bpw(QuantType::Q5_0), 5.5);
        assert_eq!(bpw(QuantType::Q5_1), 6.0);
        assert_eq!(bpw(QuantType::Q4_0), 4.0);
        assert_eq!(QuantType::Q4_0.stored_bits_per_weight(), 4.5);
        assert_eq!(QuantType::Q6_K.row_quant_bytes(512), 420);
        assert_eq!(QuantType::Q4_1.row_scale_bytes(64), 8);
        assert_eq!(QuantType::Q4_1.row_quant_bytes(64), 32);
    }
}
