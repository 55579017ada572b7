//! Block quantization formats (Q4_0, Q4_1, Q8_0, F16, F32): type ids, sizes, and the
//! quantize/dequantize reference routines. Block layouts and nibble order follow GGUF so that
//! GGUF blocks import without re-quantization.
//!
//! Inside a `.cflow` tile a matrix is stored *split*: first the per-block scale entries of every
//! row (row-major), then the packed quants of every row (row-major). See `docs/FORMAT.md`.

mod blocks;

pub use blocks::*;

use serde::{Deserialize, Serialize};

/// Weights per quantization block for the block types.
pub const QK: usize = 32;

/// Storage type of one matrix. The numeric ids are the on-disk values (they equal GGML's type ids).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum QuantType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q8_0 = 8,
}

impl QuantType {
    pub const ALL: [QuantType; 5] = [
        QuantType::F32,
        QuantType::F16,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q8_0,
    ];

    pub fn from_u8(v: u8) -> Option<QuantType> {
        Some(match v {
            0 => QuantType::F32,
            1 => QuantType::F16,
            2 => QuantType::Q4_0,
            3 => QuantType::Q4_1,
            8 => QuantType::Q8_0,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            QuantType::F32 => "F32",
            QuantType::F16 => "F16",
            QuantType::Q4_0 => "Q4_0",
            QuantType::Q4_1 => "Q4_1",
            QuantType::Q8_0 => "Q8_0",
        }
    }

    pub fn parse(s: &str) -> Option<QuantType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "f32" => QuantType::F32,
            "f16" => QuantType::F16,
            "q4_0" | "q4" => QuantType::Q4_0,
            "q4_1" => QuantType::Q4_1,
            "q8_0" | "q8" => QuantType::Q8_0,
            _ => return None,
        })
    }

    /// True for the 32-weight block types (columns must be a multiple of 32).
    pub const fn is_blocked(self) -> bool {
        matches!(self, QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q8_0)
    }

    /// Bytes of scale data per 32-weight block (0 for F16/F32).
    pub const fn scale_bytes_per_block(self) -> usize {
        match self {
            QuantType::Q4_0 | QuantType::Q8_0 => 2,
            QuantType::Q4_1 => 4,
            QuantType::F16 | QuantType::F32 => 0,
        }
    }

    /// Bytes of packed quants per 32-weight block (for F16/F32: 32 elements' worth).
    pub const fn quant_bytes_per_block(self) -> usize {
        match self {
            QuantType::Q4_0 | QuantType::Q4_1 => 16,
            QuantType::Q8_0 => 32,
            QuantType::F16 => 64,
            QuantType::F32 => 128,
        }
    }

    /// Bytes of one GGUF-style interleaved block (scale(s) then quants).
    pub const fn block_bytes(self) -> usize {
        self.scale_bytes_per_block() + self.quant_bytes_per_block()
    }

    /// Bytes needed to store `rows × cols` weights (scales + quants). `cols` must be a multiple of
    /// 32 for the block types (checked by callers).
    pub const fn matrix_bytes(self, rows: usize, cols: usize) -> usize {
        match self {
            QuantType::F32 => rows * cols * 4,
            QuantType::F16 => rows * cols * 2,
            _ => rows * (cols / QK) * self.block_bytes(),
        }
    }

    /// Bytes per weight without scales (the paper's "0.5 byte/param" convention for Q4).
    pub fn payload_bits_per_weight(self) -> f64 {
        match self {
            QuantType::F32 => 32.0,
            QuantType::F16 => 16.0,
            QuantType::Q4_0 | QuantType::Q4_1 => 4.0,
            QuantType::Q8_0 => 8.0,
        }
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
