//! The `gemma3` architecture of a GGUF file, as llama.cpp reads it (`src/models/gemma3.cpp`):
//! interleaved sliding-window ("local") and full ("global") attention layers, a RoPE base per
//! kind, per-head Q/K RMSNorms, post-attention and post-FFN RMSNorms, GeGLU (tanh GELU), the
//! embedding scaled by √d and an attention scale of 1/√head_dim (1/√(d/heads) for the 27B).
//!
//! Owns: turning the `gemma3.*` metadata into the per-layer window and theta lists of
//! [`crate::model::ModelMeta`]. The norm weights are used as stored: llama.cpp's converter has
//! already written Gemma's `1 + w` (every norm value minus one is an exact bf16 number in the
//! Gemma 3 270M file, the values themselves are not).

use super::gguf::{GgufFile, GgufValue};
use super::import_gguf::ImportError;

/// llama.cpp's default: every 6th layer (5, 11, 17, …) is global.
pub const DEFAULT_PATTERN: u32 = 6;
/// llama.cpp's default RoPE base of the sliding-window layers.
pub const DEFAULT_THETA_SWA: f32 = 10_000.0;

/// What `gemma3.*` metadata says beyond the llama geometry.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma3Layers {
    /// Sliding window per layer (0 = global); empty when the file has no window.
    pub sliding_window: Vec<u32>,
    /// RoPE base per layer.
    pub rope_theta: Vec<f32>,
    /// `query_pre_attn_scalar` (0 = head_dim).
    pub query_pre_attn_scalar: f32,
    /// `final_logit_softcapping` (0 = off).
    pub final_logit_softcap: f32,
}

/// Reads the layer pattern of a `gemma3` file with `n_layers` layers, global RoPE base `theta`.
pub fn layers(
    g: &GgufFile,
    n_layers: usize,
    d: usize,
    n_heads: usize,
    theta: f32,
) -> Result<Gemma3Layers, ImportError> {
    let file = g.name().to_string();
    let bad = |key: &str, value: String, why: &str| ImportError::BadKey {
        file: file.clone(),
        key: key.into(),
        value,
        why: why.into(),
    };
    let swa = g.opt_u32("gemma3.attention.sliding_window")?.unwrap_or(0);
    let theta_swa = g
        .opt_f32("gemma3.rope.freq_base_swa")?
        .unwrap_or(DEFAULT_THETA_SWA);
    if !(theta_swa.is_finite() && theta_swa > 0.0) {
        return Err(bad(
            "gemma3.rope.freq_base_swa",
            theta_swa.to_string(),
            "must be positive",
        ));
    }
    let pk = "gemma3.attention.sliding_window_pattern";
    let is_swa: Vec<bool> = if swa == 0 {
        vec![false; n_layers]
    } else {
        match g.get(pk) {
            Some(GgufValue::Array(a)) => {
                if a.values.len() != n_layers {
                    return Err(bad(
                        pk,
                        format!("{} entries", a.values.len()),
                        &format!("must have one entry per layer ({n_layers})"),
                    ));
                }
                a.values
                    .iter()
                    .map(|v| match v {
                        GgufValue::Bool(b) => Some(*b),
                        v => v.as_int().and_then(|i| match i {
                            0 => Some(false),
                            1 => Some(true),
                            _ => None,
                        }),
                    })
                    .collect::<Option<Vec<bool>>>()
                    .ok_or_else(|| bad(pk, "non-boolean entry".into(), "must be booleans"))?
            }
            Some(_) => {
                let n = g.get_u32(pk)?;
                // llama.cpp's set_swa_pattern (dense_first = false): n = 0 means all local.
                (0..n_layers as u32)
                    .map(|il| n == 0 || il % n < n - 1)
                    .collect()
            }
            None => (0..n_layers as u32)
                .map(|il| il % DEFAULT_PATTERN < DEFAULT_PATTERN - 1)
                .collect(),
        }
    };
    let final_logit_softcap = g.opt_f32("gemma3.final_logit_softcapping")?.unwrap_or(0.0);
    if !(final_logit_softcap.is_finite() && final_logit_softcap >= 0.0) {
        return Err(bad(
            "gemma3.final_logit_softcapping",
            final_logit_softcap.to_string(),
            "must be >= 0",
        ));
    }
    Ok(Gemma3Layers {
        sliding_window: if swa == 0 {
            Vec::new()
        } else {
            is_swa.iter().map(|&s| if s { swa } else { 0 }).collect()
        },
        rope_theta: is_swa
            .iter()
            .map(|&s| if s { theta_swa } else { theta })
            .collect(),
        // llama.cpp: the 27B (62 layers) scales by 1/√(d/heads), the others by 1/√head_dim.
        query_pre_attn_scalar: if n_layers == 62 {
            (d / n_heads) as f32
        } else {
            0.0
        },
        final_logit_softcap,
    })
}
