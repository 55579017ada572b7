//! `ModelConfig`: everything the engine needs to know about a model's geometry and semantics.
//! The fixed-size part lives in the 88-byte `.cflow` header; the rest in the JSON metadata.

use serde::{Deserialize, Serialize};

/// How attention, dense FFN and expert outputs are combined into the residual stream
/// (paper §4.2–4.4, our additions 3–6; exact equations in `docs/SEMANTICS.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[repr(u8)]
pub enum CombineStyle {
    ParallelSqrt2 = 0,
    DelayedSum = 1,
    AsyncExperts = 2,
    Sequential = 3,
    DecoupledStreams = 4,
    PipelineRegisters = 5,
    FixedPoint = 6,
}

impl CombineStyle {
    pub fn from_u8(v: u8) -> Option<CombineStyle> {
        Some(match v {
            0 => CombineStyle::ParallelSqrt2,
            1 => CombineStyle::DelayedSum,
            2 => CombineStyle::AsyncExperts,
            3 => CombineStyle::Sequential,
            4 => CombineStyle::DecoupledStreams,
            5 => CombineStyle::PipelineRegisters,
            6 => CombineStyle::FixedPoint,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            CombineStyle::ParallelSqrt2 => "ParallelSqrt2",
            CombineStyle::DelayedSum => "DelayedSum",
            CombineStyle::AsyncExperts => "AsyncExperts",
            CombineStyle::Sequential => "Sequential",
            CombineStyle::DecoupledStreams => "DecoupledStreams",
            CombineStyle::PipelineRegisters => "PipelineRegisters",
            CombineStyle::FixedPoint => "FixedPoint",
        }
    }
}

/// RoPE pair convention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RopeStyle {
    /// Pairs (i, i + rot/2): HuggingFace `rotate_half`, GGUF NeoX-style.
    #[default]
    SplitHalf,
    /// Pairs (2i, 2i+1): llama.cpp's GGUF llama (Q/K rows permuted by the converter).
    Adjacent,
}

/// Gated FFN activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FfnAct {
    #[default]
    Swiglu,
    Geglu,
}

/// How router logits become expert weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RouterNorm {
    /// Softmax over the top-k logits (Mixtral; our default).
    #[default]
    SoftmaxTopk,
    /// Softmax over all experts, then take the top-k without renormalising (OLMoE).
    SoftmaxAll,
    /// Our extension (`moefy`): the selected experts are summed with weight 1, as the slices of
    /// a dense FFN they were cut from; the router only ranks.
    TopkUnweighted,
}

/// What a RoPE base must satisfy (checked by every importer and at open): with a base <= 1
/// (or NaN/Inf) the rotation frequencies overflow and every logit is NaN.
pub const ROPE_THETA_RULE: &str = "must be finite and > 1";

/// Whether `theta` is a usable RoPE base ([`ROPE_THETA_RULE`]).
pub fn rope_theta_ok(theta: f32) -> bool {
    theta.is_finite() && theta > 1.0
}

/// Feature flag bits of the header.
pub const FLAG_EMBED_SCALE: u32 = 1 << 0;
pub const FLAG_V_NORM: u32 = 1 << 1;
pub const FLAG_TIED_EMBED: u32 = 1 << 2;
/// Our extension: Q/K/V projections have f32 biases (Qwen2).
pub const FLAG_QKV_BIAS: u32 = 1 << 3;
/// Our extension: learned RMSNorms over the whole Q and K projection outputs (before the split
/// into heads and RoPE; OLMoE's `q_norm`/`k_norm`). Every layer then has `QNorm`/`KNorm` entries.
pub const FLAG_QK_NORM: u32 = 1 << 4;
/// Our extension: with `FLAG_QK_NORM`, the `QNorm`/`KNorm` weights have `head_dim` entries and
/// normalize each head on its own, after the split into heads (Gemma 3's `q_norm`/`k_norm`).
pub const FLAG_QK_NORM_PER_HEAD: u32 = 1 << 5;
/// Our extension: every layer has `PostAttnNorm` and `PostFfnNorm` RMSNorms, applied to the
/// attention and FFN outputs before they are added to the residual (Gemma 2/3 "sandwich" norms).
pub const FLAG_POST_NORMS: u32 = 1 << 6;

fn is_off(v: &f32) -> bool {
    *v == 0.0
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// Semantic fields that do not fit in the 88-byte header (stored in the JSON metadata).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelMeta {
    /// Architecture name, e.g. "arch2_4_combined", "llama".
    pub arch: String,
    /// Human name, e.g. "SmolLM2-135M-Instruct".
    pub name: String,
    /// Weights are random (synthetic generator).
    pub synthetic: bool,
    pub rope_style: RopeStyle,
    /// Rotated dimensions per head (partial rotary); 0 = whole head.
    pub rope_dims: u32,
    /// Per-layer RoPE theta overrides (empty = header theta everywhere).
    pub rope_theta_per_layer: Vec<f32>,
    /// Sliding-window size per layer (0 = full attention). Empty = all full.
    pub sliding_window: Vec<u32>,
    /// Attention logit softcap (0 = off).
    pub attn_logit_softcap: f32,
    /// Clamp Q, K and V to [−c, c] after the projections (and Q/K norms), before RoPE
    /// (OLMoE's `clip_qkv`; 0 = off). Omitted from the JSON when off, so files that do not use
    /// it are byte-identical to those written before the field existed.
    #[serde(skip_serializing_if = "is_off")]
    pub clip_qkv: f32,
    /// Attention logits are scaled by 1/√(this) (Gemma's `query_pre_attn_scalar`; 0 = head_dim).
    /// Omitted from the JSON when 0.
    #[serde(skip_serializing_if = "is_off")]
    pub query_pre_attn_scalar: f32,
    pub ffn_act: FfnAct,
    pub router_norm: RouterNorm,
    /// Our extension (`moefy --route-from D`): the router of layer ℓ reads the residual of
    /// layer ℓ−D (clamped at 0) so its experts are known D layers before they run; the experts
    /// still read layer ℓ's own FFN input. 0 = the layer's own input. Omitted from the JSON
    /// when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub route_ahead: u32,
    /// DecoupledStreams: merge the two residual streams every this many layers.
    pub merge_interval: u32,
    /// FixedPoint: iterations per physical block.
    pub fixed_point_iterations: u32,
    pub bos_id: Option<u32>,
    pub eos_ids: Vec<u32>,
    pub add_bos: bool,
    /// A tokenizers-format tokenizer.json, embedded so the file is self-contained. Shared, not
    /// copied, by every clone of the config (Gemma 3's is 14 MB).
    pub tokenizer_json: Option<std::sync::Arc<str>>,
    /// True when a decoding process built its tokenizer from `tokenizer_json` and dropped the
    /// text (`cli::model::open_for_decode`: Gemma 3's is 14 MB); never written to a file.
    #[serde(skip)]
    pub tokenizer_loaded: bool,
    pub chat_template: Option<String>,
    /// Free-form provenance (source file, converter, seed...).
    #[serde(deserialize_with = "super::bounded_json::deserialize")]
    pub provenance: serde_json::Value,
}

impl Default for ModelMeta {
    fn default() -> Self {
        ModelMeta {
            arch: String::new(),
            name: String::new(),
            synthetic: false,
            rope_style: RopeStyle::SplitHalf,
            rope_dims: 0,
            rope_theta_per_layer: Vec::new(),
            sliding_window: Vec::new(),
            attn_logit_softcap: 0.0,
            clip_qkv: 0.0,
            query_pre_attn_scalar: 0.0,
            ffn_act: FfnAct::Swiglu,
            router_norm: RouterNorm::SoftmaxTopk,
            route_ahead: 0,
            merge_interval: 3,
            fixed_point_iterations: 3,
            bos_id: None,
            eos_ids: Vec::new(),
            add_bos: false,
            tokenizer_json: None,
            tokenizer_loaded: false,
            chat_template: None,
            provenance: serde_json::Value::Null,
        }
    }
}

/// Model geometry and semantics.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Physical layers stored in the file (FixedPoint: blocks).
    pub n_layers: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Dense FFN hidden size (0 = no dense FFN).
    pub d_ff: usize,
    /// Experts per MoE layer (0 = dense model).
    pub n_experts: usize,
    pub top_k: usize,
    pub expert_ffn: usize,
    pub vocab: usize,
    pub max_ctx: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    pub dense_delay: usize,
    pub expert_delay: usize,
    pub combine_style: CombineStyle,
    pub feature_flags: u32,
    pub final_logit_softcap: f32,
    pub meta: ModelMeta,
}

impl ModelConfig {
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    pub fn has_dense(&self) -> bool {
        self.d_ff > 0
    }
    pub fn has_experts(&self) -> bool {
        self.n_experts > 0 && self.top_k > 0
    }
    pub fn tied_embeddings(&self) -> bool {
        self.feature_flags & FLAG_TIED_EMBED != 0
    }
    pub fn embed_scale(&self) -> bool {
        self.feature_flags & FLAG_EMBED_SCALE != 0
    }
    pub fn v_norm(&self) -> bool {
        self.feature_flags & FLAG_V_NORM != 0
    }
    pub fn qkv_bias(&self) -> bool {
        self.feature_flags & FLAG_QKV_BIAS != 0
    }
    pub fn qk_norm(&self) -> bool {
        self.feature_flags & FLAG_QK_NORM != 0
    }
    pub fn qk_norm_per_head(&self) -> bool {
        self.feature_flags & FLAG_QK_NORM_PER_HEAD != 0
    }
    pub fn post_norms(&self) -> bool {
        self.feature_flags & FLAG_POST_NORMS != 0
    }
    /// Lengths of the Q and K norm weights (whole projection, or one head with
    /// `FLAG_QK_NORM_PER_HEAD`).
    pub fn qk_norm_lens(&self) -> (usize, usize) {
        if self.qk_norm_per_head() {
            (self.head_dim, self.head_dim)
        } else {
            (self.q_dim(), self.kv_dim())
        }
    }
    /// The attention logit scale: 1/√(query_pre_attn_scalar), default 1/√head_dim.
    pub fn attn_scale(&self) -> f32 {
        let s = self.meta.query_pre_attn_scalar;
        if s > 0.0 {
            1.0 / s.sqrt()
        } else {
            1.0 / (self.head_dim as f32).sqrt()
        }
    }
    /// Number of layer *executions* per token (FixedPoint repeats each block).
    pub fn effective_layers(&self) -> usize {
        if self.combine_style == CombineStyle::FixedPoint {
            self.n_layers * self.meta.fixed_point_iterations.max(1) as usize
        } else {
            self.n_layers
        }
    }
    pub fn rope_dims(&self) -> usize {
        if self.meta.rope_dims == 0 {
            self.head_dim
        } else {
            self.meta.rope_dims as usize
        }
    }
    pub fn rope_theta_for(&self, layer: usize) -> f32 {
        self.meta
            .rope_theta_per_layer
            .get(layer)
            .copied()
            .unwrap_or(self.rope_theta)
    }
    pub fn sliding_window_for(&self, layer: usize) -> usize {
        self.meta.sliding_window.get(layer).copied().unwrap_or(0) as usize
    }
    /// One letter per layer: `L` for a sliding-window (local) layer, `G` for full attention.
    pub fn layer_pattern(&self) -> String {
        (0..self.n_layers)
            .map(|i| {
                if self.sliding_window_for(i) > 0 {
                    'L'
                } else {
                    'G'
                }
            })
            .collect()
    }
}

/// Most layer executions per token (FixedPoint: blocks × iterations); the reader's layer bound.
pub const MAX_EFFECTIVE_LAYERS: usize = 4096;

/// A metadata value the engine cannot run with: the field, the value and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaProblem {
    pub field: &'static str,
    pub value: String,
    pub why: String,
}

impl ModelConfig {
    /// Checks every metadata number that sizes an allocation or indexes an array against the
    /// geometry (the reader calls this at open, the writer before creating a file, so importers
    /// and `gen` are held to the same rules).
    pub fn check_meta(&self) -> Result<(), MetaProblem> {
        let m = &self.meta;
        let bad = |field: &'static str, value: String, why: String| {
            Err(MetaProblem { field, value, why })
        };
        let hd = self.head_dim;
        if m.rope_dims != 0 && (m.rope_dims as usize > hd || !m.rope_dims.is_multiple_of(2)) {
            return bad(
                "rope_dims",
                m.rope_dims.to_string(),
                format!("must be 0 (the whole head) or an even number <= head_dim {hd}"),
            );
        }
        // Per-layer lists are read with `get(layer)`: entries past the last layer are never used
        // (a file truncated to fewer layers keeps them), the used thetas must be usable.
        if let Some((i, t)) = m
            .rope_theta_per_layer
            .iter()
            .take(self.n_layers)
            .enumerate()
            .find(|(_, t)| !rope_theta_ok(**t))
        {
            return bad(
                "rope_theta_per_layer",
                format!("[{i}] = {t}"),
                format!("every theta {ROPE_THETA_RULE}"),
            );
        }
        let cap = m.attn_logit_softcap;
        if !(cap.is_finite() && cap >= 0.0) {
            return bad(
                "attn_logit_softcap",
                cap.to_string(),
                "must be >= 0 (0 = off)".into(),
            );
        }
        let qs = m.query_pre_attn_scalar;
        if !(qs.is_finite() && qs >= 0.0) {
            return bad(
                "query_pre_attn_scalar",
                qs.to_string(),
                "must be >= 0 (0 = head_dim)".into(),
            );
        }
        if self.combine_style == CombineStyle::FixedPoint {
            let it = m.fixed_point_iterations.max(1) as usize;
            if self.n_layers.saturating_mul(it) > MAX_EFFECTIVE_LAYERS {
                return bad(
                    "fixed_point_iterations",
                    m.fixed_point_iterations.to_string(),
                    format!(
                        "{} blocks × {it} iterations exceeds {MAX_EFFECTIVE_LAYERS} layer \
                         executions per token",
                        self.n_layers
                    ),
                );
            }
        }
        if m.route_ahead > 0 {
            let ok = self.has_experts()
                && self.combine_style == CombineStyle::Sequential
                && self.expert_delay == 0
                && (m.route_ahead as usize) < self.n_layers;
            if !ok {
                return bad(
                    "route_ahead",
                    m.route_ahead.to_string(),
                    format!(
                        "needs experts, the Sequential style, expert_delay 0 and fewer than \
                         {} layers",
                        self.n_layers
                    ),
                );
            }
        }
        if let Some(b) = m.bos_id {
            if b as usize >= self.vocab {
                return bad(
                    "bos_id",
                    b.to_string(),
                    format!("must be a token id below vocab {}", self.vocab),
                );
            }
        }
        Ok(())
    }
}
