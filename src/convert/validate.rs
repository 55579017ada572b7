//! Finite-value checks on imported weights: every block scale (and min) of a quantized matrix,
//! every element of an F16/F32 matrix, every norm weight. A single NaN or ±Inf there makes every
//! logit NaN at run time, so the importers refuse it before writing, naming the tensor, the row
//! and the block.
//!
//! The checks read the split layout of [`MatrixData`] (`docs/FORMAT.md`): Q4_0/Q4_1/Q8_0 keep
//! their f16 scales (and Q4_1's min) in `scales`; the interleaved types (Q5_0, Q5_1, Q4_K, Q5_K,
//! Q6_K) keep GGUF's whole blocks in `qs`, where the f16 fields sit at fixed offsets.

use crate::format::MatrixData;
use crate::quant::{f16_at, QuantType};

/// A non-finite value in an imported tensor.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{file}: tensor `{tensor}`: {field} of row {row}, block {block} is {value} (a non-finite weight or block scale would make every logit NaN)")]
pub struct NonFiniteTensor {
    pub file: String,
    pub tensor: String,
    pub row: usize,
    /// Block index within the row (for F16/F32 and vectors: the element index).
    pub block: usize,
    /// Which field: `scale d`, `min m`, `super-block scale dmin`, `weight`.
    pub field: &'static str,
    pub value: f32,
}

/// The f16 fields of one block of `q`: (byte offset inside the block, field name). Empty for
/// F16/F32 (every element is checked instead).
fn scale_fields(q: QuantType) -> &'static [(usize, &'static str)] {
    match q {
        QuantType::F32 | QuantType::F16 => &[],
        QuantType::Q4_0 | QuantType::Q8_0 | QuantType::Q5_0 => &[(0, "scale d")],
        QuantType::Q4_1 | QuantType::Q5_1 => &[(0, "scale d"), (2, "min m")],
        QuantType::Q4_K | QuantType::Q5_K => &[(0, "scale d"), (2, "super-block min dmin")],
        QuantType::Q6_K => &[(208, "scale d")],
    }
}

type Bad = (usize, usize, &'static str, f32);

/// The first non-finite value of the blocks in `region` (each `stride` bytes, the f16 fields
/// at the offsets of [`scale_fields`]; for F16/F32 every element), `cols` weights per row.
fn first_bad_in(q: QuantType, region: &[u8], stride: usize, cols: usize) -> Option<Bad> {
    match q {
        QuantType::F32 => region.chunks_exact(4).enumerate().find_map(|(i, c)| {
            let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            (!v.is_finite()).then_some((i / cols, i % cols, "weight", v))
        }),
        QuantType::F16 => region.chunks_exact(2).enumerate().find_map(|(i, c)| {
            let v = f16_at(c, 0);
            (!v.is_finite()).then_some((i / cols, i % cols, "weight", v))
        }),
        _ => {
            let nb = (cols / q.block_len()).max(1);
            region
                .chunks_exact(stride)
                .enumerate()
                .find_map(|(i, blk)| {
                    scale_fields(q).iter().find_map(|&(off, field)| {
                        let v = f16_at(blk, off);
                        (!v.is_finite()).then_some((i / nb, i % nb, field, v))
                    })
                })
        }
    }
}

/// The first non-finite value of `m`: (row, block, field, value).
fn first_bad(m: &MatrixData) -> Option<Bad> {
    let q = m.quant;
    // Split types: the scale entries, row-major; interleaved types: whole blocks in qs. A split
    // scale entry starts with the same fields, at the same offsets, as the GGUF block.
    let (region, stride) = if q.is_interleaved() || !q.is_blocked() {
        (&m.qs, q.block_bytes())
    } else {
        (&m.scales, q.scale_bytes_per_block())
    };
    first_bad_in(q, region, stride, m.cols)
}

fn error(file: &str, tensor: &str, bad: Option<Bad>) -> Result<(), NonFiniteTensor> {
    match bad {
        None => Ok(()),
        Some((row, block, field, value)) => Err(NonFiniteTensor {
            file: file.into(),
            tensor: tensor.into(),
            row,
            block,
            field,
            value,
        }),
    }
}

/// Checks GGUF tensor data of type `q` (whole interleaved blocks, `cols` weights per row)
/// before it is converted: re-quantization would hide a NaN (a NaN weight quantizes to 0).
pub fn gguf_data(
    file: &str,
    tensor: &str,
    q: QuantType,
    data: &[u8],
    cols: usize,
) -> Result<(), NonFiniteTensor> {
    error(file, tensor, first_bad_in(q, data, q.block_bytes(), cols))
}

/// Checks every block scale (and min) of a quantized matrix, or every weight of an F16/F32
/// one. `file` and `tensor` name it in the error.
pub fn matrix(file: &str, tensor: &str, m: &MatrixData) -> Result<(), NonFiniteTensor> {
    error(file, tensor, first_bad(m))
}

/// Checks a norm weight (or any other f32 vector) element by element.
pub fn vector(file: &str, tensor: &str, v: &[f32]) -> Result<(), NonFiniteTensor> {
    let bad = v.iter().position(|x| !x.is_finite());
    error(file, tensor, bad.map(|i| (0, i, "weight", v[i])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    fn poison(m: &mut MatrixData, row: usize, block: usize, field: usize, v: f32) {
        let q = m.quant;
        let nb = m.cols / q.block_len();
        let bits = f16::from_f32(v).to_le_bytes();
        let (region, stride) = if q.is_interleaved() {
            (&mut m.qs, q.block_bytes())
        } else {
            (&mut m.scales, q.scale_bytes_per_block())
        };
        let at = (row * nb + block) * stride + scale_fields(q)[field].0;
        region[at..at + 2].copy_from_slice(&bits);
    }

    #[test]
    fn every_scale_field_of_every_block_type_is_checked() {
        let (rows, cols) = (3, 512);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7) % 13) as f32 - 6.0)
            .collect();
        for q in QuantType::ALL.into_iter().filter(|q| q.is_blocked()) {
            let clean = MatrixData::quantize(q, rows, cols, &w);
            assert_eq!(matrix("f", "t", &clean), Ok(()), "{q}");
            for (fi, &(_, name)) in scale_fields(q).iter().enumerate() {
                for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                    let mut m = clean.clone();
                    let nb = cols / q.block_len();
                    poison(&mut m, 2, nb - 1, fi, bad);
                    let e = matrix("model.gguf", "blk.0.attn_q.weight", &m).unwrap_err();
                    assert_eq!((e.row, e.block, e.field), (2, nb - 1, name), "{q}");
                    let s = e.to_string();
                    assert!(
                        s.contains("model.gguf") && s.contains("blk.0.attn_q.weight"),
                        "{s}"
                    );
                }
            }
        }
    }

    #[test]
    fn float_matrices_and_vectors_are_checked_element_by_element() {
        for q in [QuantType::F32, QuantType::F16] {
            let mut w = vec![0.5f32; 4 * 8];
            assert_eq!(matrix("f", "t", &MatrixData::quantize(q, 4, 8, &w)), Ok(()));
            w[3 * 8 + 5] = f32::NAN;
            let e = matrix("f", "t", &MatrixData::quantize(q, 4, 8, &w)).unwrap_err();
            assert_eq!((e.row, e.block, e.field), (3, 5, "weight"));
        }
        assert_eq!(vector("f", "n", &[1.0, 2.0]), Ok(()));
        let e = vector("f", "output_norm.weight", &[1.0, f32::INFINITY]).unwrap_err();
        assert_eq!(e.block, 1);
        assert!(e.to_string().contains("output_norm.weight"));
    }
}
