//! Owned copies out of the mapping: a tiled matrix reassembled row-major, and whole layers and
//! the vocabulary (for the row-major baseline and for re-writing).

use super::*;
use crate::format::writer::{ExpertData, LayerData, MatrixData, VocabData};
use crate::format::{TILE_COLS, TILE_ROWS};

impl CflowFile {
    /// Reassembles a tiled matrix into one contiguous split-layout matrix (row-major scales and
    /// quants), e.g. for the row-major baseline layout or for re-writing.
    pub fn matrix_data(&self, m: &Matrix) -> MatrixData {
        let q = m.quant;
        let (rsb, rqb) = (q.row_scale_bytes(m.cols), q.row_quant_bytes(m.cols));
        let mut scales = vec![0u8; m.rows * rsb];
        let mut qs = vec![0u8; m.rows * rqb];
        for s in 0..m.n_stripes() {
            for c in 0..m.n_col_tiles() {
                let t = self.tile(m, s, c);
                let unpacked;
                let (ts, tq) = if t.packed {
                    unpacked = crate::quant::packed::unpack_tile(q, t.rows, t.cols, t.body);
                    (&unpacked.0[..], &unpacked.1[..])
                } else {
                    (t.scales, t.qs)
                };
                let r0 = s * TILE_ROWS;
                let c0 = c * TILE_COLS;
                let (tsb, tqb) = (q.row_scale_bytes(t.cols), q.row_quant_bytes(t.cols));
                let (sc0, qc0) = (q.row_scale_bytes(c0), q.row_quant_bytes(c0));
                for r in 0..t.rows {
                    let dst = (r0 + r) * rsb + sc0;
                    scales[dst..dst + tsb].copy_from_slice(&ts[r * tsb..(r + 1) * tsb]);
                    let dst = (r0 + r) * rqb + qc0;
                    qs[dst..dst + tqb].copy_from_slice(&tq[r * tqb..(r + 1) * tqb]);
                }
            }
        }
        MatrixData {
            quant: q,
            rows: m.rows,
            cols: m.cols,
            scales,
            qs,
        }
    }

    /// Reconstructs the writer input of layer `i` (used for re-writing and format conversion).
    pub fn layer_data(&self, i: usize) -> LayerData {
        let l = &self.layers[i];
        let md = |m: &Matrix| self.matrix_data(m);
        LayerData {
            q: md(&l.q),
            k: md(&l.k),
            v: md(&l.v),
            o: md(&l.o),
            q_bias: l.q_bias.clone(),
            k_bias: l.k_bias.clone(),
            v_bias: l.v_bias.clone(),
            q_norm: l.q_norm.clone(),
            k_norm: l.k_norm.clone(),
            post_attn_norm: l.post_attn_norm.clone(),
            post_ffn_norm: l.post_ffn_norm.clone(),
            shared_gate: l.shared_gate.clone(),
            router_bias: l.router_bias.clone(),
            gate: l.gate.as_ref().map(md),
            up: l.up.as_ref().map(md),
            down: l.down.as_ref().map(md),
            attn_norm: l.attn_norm.clone(),
            ffn_norm: l.ffn_norm.clone(),
            moe_norm: l.moe_norm.clone(),
            router: l.router.clone(),
            experts: l
                .experts
                .iter()
                .map(|e| ExpertData {
                    gate: md(&e.gate),
                    up: md(&e.up),
                    down: md(&e.down),
                })
                .collect(),
        }
    }

    pub fn vocab_data(&self) -> VocabData {
        VocabData {
            embedding: self.matrix_data(&self.vocab.embedding),
            lm_head: self.vocab.lm_head.as_ref().map(|m| self.matrix_data(m)),
            final_norm: self.vocab.final_norm.clone(),
        }
    }
}
