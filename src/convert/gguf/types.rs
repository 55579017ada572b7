//! GGML tensor storage types: ids, block sizes, bytes per block, names, and which ones cflow
//! imports.

use std::fmt;

/// GGML tensor storage types (ids as stored in GGUF). Only some are importable by cflow
/// (F32, F16, Q4_0, Q4_1, Q8_0); the others are recognised so that files open and importers can
/// reject them with a clear message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// (type, id, block size in elements, bytes per block, name)
pub(super) const GGML_TYPES: &[(GgmlType, u32, u64, u64, &str)] = &[
    (GgmlType::F32, 0, 1, 4, "F32"),
    (GgmlType::F16, 1, 1, 2, "F16"),
    (GgmlType::Q4_0, 2, 32, 18, "Q4_0"),
    (GgmlType::Q4_1, 3, 32, 20, "Q4_1"),
    (GgmlType::Q5_0, 6, 32, 22, "Q5_0"),
    (GgmlType::Q5_1, 7, 32, 24, "Q5_1"),
    (GgmlType::Q8_0, 8, 32, 34, "Q8_0"),
    (GgmlType::Q8_1, 9, 32, 36, "Q8_1"),
    (GgmlType::Q2_K, 10, 256, 84, "Q2_K"),
    (GgmlType::Q3_K, 11, 256, 110, "Q3_K"),
    (GgmlType::Q4_K, 12, 256, 144, "Q4_K"),
    (GgmlType::Q5_K, 13, 256, 176, "Q5_K"),
    (GgmlType::Q6_K, 14, 256, 210, "Q6_K"),
    (GgmlType::Q8_K, 15, 256, 292, "Q8_K"),
    (GgmlType::IQ2_XXS, 16, 256, 66, "IQ2_XXS"),
    (GgmlType::IQ2_XS, 17, 256, 74, "IQ2_XS"),
    (GgmlType::IQ3_XXS, 18, 256, 98, "IQ3_XXS"),
    (GgmlType::IQ1_S, 19, 256, 50, "IQ1_S"),
    (GgmlType::IQ4_NL, 20, 32, 18, "IQ4_NL"),
    (GgmlType::IQ3_S, 21, 256, 110, "IQ3_S"),
    (GgmlType::IQ2_S, 22, 256, 82, "IQ2_S"),
    (GgmlType::IQ4_XS, 23, 256, 136, "IQ4_XS"),
    (GgmlType::I8, 24, 1, 1, "I8"),
    (GgmlType::I16, 25, 1, 2, "I16"),
    (GgmlType::I32, 26, 1, 4, "I32"),
    (GgmlType::I64, 27, 1, 8, "I64"),
    (GgmlType::F64, 28, 1, 8, "F64"),
    (GgmlType::IQ1_M, 29, 256, 56, "IQ1_M"),
    (GgmlType::BF16, 30, 1, 2, "BF16"),
    (GgmlType::TQ1_0, 34, 256, 54, "TQ1_0"),
    (GgmlType::TQ2_0, 35, 256, 66, "TQ2_0"),
    (GgmlType::MXFP4, 39, 32, 17, "MXFP4"),
];

impl GgmlType {
    fn entry(self) -> &'static (GgmlType, u32, u64, u64, &'static str) {
        // Every variant has exactly one table row (checked by a unit test).
        GGML_TYPES
            .iter()
            .find(|e| e.0 == self)
            .unwrap_or(&GGML_TYPES[0])
    }

    /// Type from its GGUF id, `None` if unknown or removed (4, 5, 31..=33, 36..=38).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GGML_TYPES.iter().find(|e| e.1 == id).map(|e| e.0)
    }

    /// The GGUF type id.
    pub fn id(self) -> u32 {
        self.entry().1
    }

    /// Elements per block.
    pub fn block_size(self) -> u64 {
        self.entry().2
    }

    /// Bytes per block.
    pub fn type_size(self) -> u64 {
        self.entry().3
    }

    /// Canonical name ("Q4_1", ...).
    pub fn name(self) -> &'static str {
        self.entry().4
    }

    /// Whether cflow can import this type without re-quantization.
    pub fn is_importable(self) -> bool {
        matches!(
            self,
            GgmlType::F32 | GgmlType::F16 | GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0
        )
    }

    /// Bytes occupied by `n_elements` of this type (which must be a multiple of the block size),
    /// `None` on overflow or a partial block.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size();
        if !n_elements.is_multiple_of(bs) {
            return None;
        }
        (n_elements / bs).checked_mul(self.type_size())
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
