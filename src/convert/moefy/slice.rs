//! Cutting a dense FFN's matrices into experts: rows of `W_gate`/`W_up` (one row per unit) are
//! copied byte for byte; columns of `W_down` are gathered row by row, dequantized and
//! re-quantized to the same type (exact for F32/F16; block types get the re-quantization's
//! rounding, measured in docs/MOE.md).

use crate::format::MatrixData;
use crate::quant::{dequantize_row, quantize_row};

/// Row `r` of `m`, as its (scale bytes, quant bytes).
fn row(m: &MatrixData, r: usize) -> (&[u8], &[u8]) {
    let (sb, qb) = (
        m.quant.row_scale_bytes(m.cols),
        m.quant.row_quant_bytes(m.cols),
    );
    (&m.scales[r * sb..(r + 1) * sb], &m.qs[r * qb..(r + 1) * qb])
}

/// Row `r` of `m` dequantized.
pub fn row_f32(m: &MatrixData, r: usize) -> Vec<f32> {
    let (s, q) = row(m, r);
    let mut out = vec![0f32; m.cols];
    dequantize_row(m.quant, s, q, &mut out);
    out
}

/// The rows `rows` of `m`, in that order, copied byte for byte.
pub fn rows_subset(m: &MatrixData, rows: &[usize]) -> MatrixData {
    let mut out = MatrixData {
        quant: m.quant,
        rows: rows.len(),
        cols: m.cols,
        scales: Vec::new(),
        qs: Vec::new(),
    };
    for &r in rows {
        let (s, q) = row(m, r);
        out.scales.extend_from_slice(s);
        out.qs.extend_from_slice(q);
    }
    out
}

/// The columns `cols` of `m`, in that order, re-quantized to `m`'s type.
pub fn cols_subset(m: &MatrixData, cols: &[usize]) -> Result<MatrixData, String> {
    if !cols.len().is_multiple_of(m.quant.block_len()) {
        return Err(format!(
            "{} columns is not a multiple of {} ({} blocks)",
            cols.len(),
            m.quant.block_len(),
            m.quant
        ));
    }
    let mut out = MatrixData {
        quant: m.quant,
        rows: m.rows,
        cols: cols.len(),
        scales: Vec::new(),
        qs: Vec::new(),
    };
    let mut g = vec![0f32; cols.len()];
    for r in 0..m.rows {
        let full = row_f32(m, r);
        for (o, &c) in g.iter_mut().zip(cols) {
            *o = full[c];
        }
        quantize_row(m.quant, &g, &mut out.scales, &mut out.qs);
    }
    Ok(out)
}

/// ‖column c‖₂ of `m` for every column (how strongly each FFN unit writes to the residual).
pub fn col_norms(m: &MatrixData) -> Vec<f32> {
    let mut acc = vec![0f64; m.cols];
    for r in 0..m.rows {
        for (a, v) in acc.iter_mut().zip(row_f32(m, r)) {
            *a += (v as f64) * (v as f64);
        }
    }
    acc.into_iter().map(|a| a.sqrt() as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::QuantType;

    #[test]
    fn f32_slices_are_exact_and_q8_rows_are_byte_copies() {
        let (rows, cols) = (4, 64);
        let w: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let m = MatrixData::quantize(QuantType::F32, rows, cols, &w);
        let sub = rows_subset(&m, &[2, 0]);
        assert_eq!(row_f32(&sub, 0), w[2 * cols..3 * cols].to_vec());
        let picks: Vec<usize> = (0..32).map(|i| i * 2).collect();
        let c = cols_subset(&m, &picks).unwrap();
        assert_eq!(c.cols, 32);
        assert_eq!(row_f32(&c, 1)[3], w[cols + 6]);
        let q = MatrixData::quantize(QuantType::Q8_0, rows, cols, &w);
        let qs = rows_subset(&q, &[3]);
        let (s3, q3) = row(&q, 3);
        assert_eq!((qs.scales.as_slice(), qs.qs.as_slice()), (s3, q3));
        assert!(cols_subset(&q, &[1, 2, 3]).is_err());
        let n = col_norms(&m);
        let want: f32 = (0..rows)
            .map(|r| w[r * cols] * w[r * cols])
            .sum::<f32>()
            .sqrt();
        assert!((n[0] - want).abs() < 1e-6);
    }
}
