//! The validating cursor over the mapped bytes ([`V`]): every read is bounds-checked and every
//! error names the file and the field; and the model configuration read from the header.

use crate::format::error::FormatError;
use crate::format::header::*;
use crate::model::{CombineStyle, ModelConfig, ModelMeta};
use crate::quant::QK;
use std::path::Path;

/// Upper bounds that keep every size computation far from overflow.
pub(super) const MAX_DIM: u64 = 1 << 20;
pub(super) const MAX_LAYERS: u64 = 4096;
pub(super) const MAX_EXPERTS: u64 = 255;

pub(crate) struct V<'a> {
    pub(crate) file: &'a Path,
    pub(crate) bytes: &'a [u8],
}

impl<'a> V<'a> {
    pub(crate) fn size(&self) -> u64 {
        self.bytes.len() as u64
    }
    pub(crate) fn range(&self, what: &str, off: u64, len: u64) -> Result<&'a [u8], FormatError> {
        let end = off.checked_add(len).ok_or_else(|| FormatError::Overflow {
            file: self.file.into(),
            what: what.into(),
        })?;
        if end > self.size() {
            return Err(FormatError::OutOfBounds {
                file: self.file.into(),
                what: what.into(),
                offset: off,
                len,
                size: self.size(),
            });
        }
        Ok(&self.bytes[off as usize..end as usize])
    }
    pub(crate) fn field(
        &self,
        field: &'static str,
        value: impl ToString,
        why: &str,
    ) -> FormatError {
        FormatError::BadField {
            file: self.file.into(),
            field,
            value: value.to_string(),
            why: why.into(),
        }
    }
    pub(crate) fn mismatch(
        &self,
        what: String,
        expected: impl ToString,
        found: impl ToString,
    ) -> FormatError {
        FormatError::Mismatch {
            file: self.file.into(),
            what,
            expected: expected.to_string(),
            found: found.to_string(),
        }
    }
    pub(super) fn f32s(&self, what: &str, off: u64, n: u64) -> Result<Vec<f32>, FormatError> {
        let len = n.checked_mul(4).ok_or_else(|| FormatError::Overflow {
            file: self.file.into(),
            what: what.into(),
        })?;
        let b = self.range(what, off, len)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// Validates the header fields and builds the config (metadata parsed separately).
pub(crate) fn config_from_header(
    v: &V,
    h: &GlobalHeader,
    meta: ModelMeta,
) -> Result<ModelConfig, FormatError> {
    let chk = |field: &'static str, val: u64, lo: u64, hi: u64| -> Result<(), FormatError> {
        if val < lo || val > hi {
            Err(v.field(field, val, &format!("must be in [{lo}, {hi}]")))
        } else {
            Ok(())
        }
    };
    chk("n_layers", h.n_layers as u64, 1, MAX_LAYERS)?;
    chk("d_model", h.d_model as u64, 32, MAX_DIM)?;
    chk("n_heads", h.n_heads as u64, 1, 4096)?;
    chk("n_kv_heads", h.n_kv_heads as u64, 1, h.n_heads as u64)?;
    chk("head_dim", h.head_dim as u64, 2, 4096)?;
    chk("d_ff", h.d_ff as u64, 0, MAX_DIM)?;
    chk("vocab", h.vocab as u64, 1, 1 << 24)?;
    chk("n_experts", h.n_experts as u64, 0, MAX_EXPERTS)?;
    chk("top_k", h.top_k as u64, 0, h.n_experts as u64)?;
    chk("expert_ffn", h.expert_ffn as u64, 0, MAX_DIM)?;
    chk("max_ctx", h.max_ctx as u64, 1, 1 << 24)?;
    if !h.n_heads.is_multiple_of(h.n_kv_heads) {
        return Err(v.field("n_kv_heads", h.n_kv_heads, "must divide n_heads"));
    }
    if !h.d_model.is_multiple_of(QK as u32) {
        return Err(v.field("d_model", h.d_model, "must be a multiple of 32"));
    }
    if !h.head_dim.is_multiple_of(2) {
        return Err(v.field("head_dim", h.head_dim, "must be even (RoPE pairs)"));
    }
    let eps = h.rms_eps;
    if !(eps.is_finite() && eps > 0.0 && eps < 1.0) {
        return Err(v.field("rms_eps", eps, "must be in (0, 1)"));
    }
    let theta = h.rope_theta;
    if !crate::model::rope_theta_ok(theta) {
        return Err(v.field("rope_theta", theta, crate::model::ROPE_THETA_RULE));
    }
    let cap = h.final_logit_softcap;
    if !(cap.is_finite() && cap >= 0.0) {
        return Err(v.field("final_logit_softcap", cap, "must be >= 0"));
    }
    if !(meta.clip_qkv.is_finite() && meta.clip_qkv >= 0.0) {
        return Err(FormatError::BadMetadata {
            file: v.file.into(),
            why: format!("clip_qkv {} must be >= 0 (0 = off)", meta.clip_qkv),
        });
    }
    let style = CombineStyle::from_u8(h.combine_style).ok_or_else(|| {
        v.field(
            "combine_style",
            h.combine_style,
            "unknown combine style (0..=6)",
        )
    })?;
    if h.n_experts > 0 && (h.top_k == 0 || h.expert_ffn == 0) {
        return Err(v.field("top_k", h.top_k, "MoE model needs top_k and expert_ffn > 0"));
    }
    if h.dense_delay as u16 >= h.n_layers || h.expert_delay as u16 >= h.n_layers.max(1) + 8 {
        return Err(v.field(
            "dense_delay",
            h.dense_delay,
            "delay must be smaller than n_layers",
        ));
    }
    let cfg = ModelConfig {
        n_layers: h.n_layers as usize,
        d_model: h.d_model as usize,
        n_heads: h.n_heads as usize,
        n_kv_heads: h.n_kv_heads as usize,
        head_dim: h.head_dim as usize,
        d_ff: h.d_ff as usize,
        n_experts: h.n_experts as usize,
        top_k: h.top_k as usize,
        expert_ffn: h.expert_ffn as usize,
        vocab: h.vocab as usize,
        max_ctx: h.max_ctx as usize,
        rms_eps: eps,
        rope_theta: theta,
        dense_delay: h.dense_delay as usize,
        expert_delay: h.expert_delay as usize,
        combine_style: style,
        feature_flags: h.feature_flags,
        final_logit_softcap: cap,
        meta,
    };
    cfg.check_meta().map_err(|p| FormatError::BadMetaField {
        file: v.file.into(),
        field: p.field,
        value: p.value,
        why: p.why,
    })?;
    Ok(cfg)
}
