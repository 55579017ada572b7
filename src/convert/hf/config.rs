//! `config.json` read field by field, each error naming the file and the key; and the
//! [`Plan`]: everything decided from it before any tensor is read.

use super::*;
use crate::model::{
    CombineStyle, FfnAct, ModelConfig, ModelMeta, RopeStyle, RouterNorm, FLAG_QKV_BIAS,
    FLAG_QK_NORM, FLAG_TIED_EMBED,
};
use crate::quant::QuantType;
use serde_json::Value;
use std::path::Path;

// ---------------------------------------------------------------------------------------------
// config.json

pub(super) struct Cfg<'a> {
    pub(super) v: &'a Value,
    pub(super) file: &'a Path,
}

impl Cfg<'_> {
    pub(super) fn err(&self, why: String) -> HfError {
        HfError::Config {
            file: self.file.to_path_buf(),
            why,
        }
    }
    pub(super) fn usize_opt(&self, k: &str) -> Result<Option<usize>, HfError> {
        match self.v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| self.err(format!("`{k}` must be a non-negative integer, got {x}"))),
        }
    }
    pub(super) fn usize(&self, k: &str) -> Result<usize, HfError> {
        self.usize_opt(k)?
            .ok_or_else(|| self.err(format!("missing `{k}`")))
    }
    pub(super) fn f32_opt(&self, k: &str) -> Result<Option<f32>, HfError> {
        match self.v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_f64()
                .map(|n| Some(n as f32))
                .ok_or_else(|| self.err(format!("`{k}` must be a number, got {x}"))),
        }
    }
    pub(super) fn bool_opt(&self, k: &str) -> Result<Option<bool>, HfError> {
        match self.v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(format!("`{k}` must be true or false, got {x}"))),
        }
    }
    pub(super) fn str_opt(&self, k: &str) -> Result<Option<&str>, HfError> {
        match self.v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(format!("`{k}` must be a string, got {x}"))),
        }
    }
    /// `bos_token_id` / `eos_token_id`: an integer or a list of integers.
    pub(super) fn ids(&self, k: &str) -> Vec<u32> {
        match self.v.get(k) {
            Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|x| x.as_u64().map(|n| n as u32))
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Everything decided from config.json before any tensor is read.
pub(super) struct Plan {
    pub(super) fam: Family,
    pub(super) cfg: ModelConfig,
    /// Dense FFN present.
    pub(super) dense: bool,
    /// Tied embeddings decided by the config (or by a missing `lm_head.weight`).
    pub(super) tied: bool,
}

pub(super) fn plan(
    dir: &Path,
    w: &Weights,
    max_ctx: Option<usize>,
    q: QuantType,
) -> Result<Plan, HfError> {
    let cfg_path = dir.join("config.json");
    if !cfg_path.is_file() {
        return Err(HfError::MissingFile {
            dir: dir.to_path_buf(),
            what: "no config.json".into(),
        });
    }
    let v = read_json(&cfg_path, MAX_CONFIG_BYTES)?;
    let c = Cfg {
        v: &v,
        file: &cfg_path,
    };
    let arch = match v.get("architectures").and_then(Value::as_array) {
        Some(a) if !a.is_empty() => a[0].as_str().unwrap_or("").to_string(),
        _ => {
            return Err(c.err(format!(
                "no `architectures` list (supported: {})",
                SUPPORTED.join(", ")
            )))
        }
    };
    let unsupported = |why: String| HfError::Unsupported {
        file: cfg_path.clone(),
        arch: arch.clone(),
        why,
    };
    let fam = match arch.as_str() {
        "LlamaForCausalLM" => Family::Llama,
        "MistralForCausalLM" => Family::Mistral,
        "Qwen2ForCausalLM" => Family::Qwen2,
        "MixtralForCausalLM" => Family::Mixtral,
        "OlmoeForCausalLM" => Family::Olmoe,
        "PipelineNativeForCausalLM" => Family::PipelineNative,
        _ => {
            return Err(HfError::Arch {
                file: cfg_path.clone(),
                arch,
            })
        }
    };

    let d = c.usize("hidden_size")?;
    let n_layers = c.usize("num_hidden_layers")?;
    let n_heads = c.usize("num_attention_heads")?;
    let n_kv = c.usize_opt("num_key_value_heads")?.unwrap_or(n_heads);
    if n_heads == 0 || n_kv == 0 || !n_heads.is_multiple_of(n_kv) {
        return Err(c.err(format!(
            "num_key_value_heads {n_kv} must divide num_attention_heads {n_heads}"
        )));
    }
    let head_dim = match c.usize_opt("head_dim")? {
        Some(h) => h,
        None if d.is_multiple_of(n_heads) => d / n_heads,
        None => {
            return Err(c.err(format!(
                "hidden_size {d} is not a multiple of {n_heads} heads"
            )))
        }
    };
    let vocab = c.usize("vocab_size")?;
    let eps = c.f32_opt("rms_norm_eps")?.unwrap_or(1e-6);
    // rope_theta: top level, or inside `rope_parameters` (newer transformers).
    let rp = v.get("rope_parameters").filter(|x| x.is_object());
    let theta = match (
        c.f32_opt("rope_theta")?,
        rp.and_then(|r| r.get("rope_theta")),
    ) {
        (Some(t), _) => t,
        (None, Some(t)) => t.as_f64().unwrap_or(10000.0) as f32,
        _ => 10000.0,
    };
    if !crate::model::rope_theta_ok(theta) {
        return Err(c.err(format!(
            "rope_theta = {theta}: {}",
            crate::model::ROPE_THETA_RULE
        )));
    }
    for key in ["rope_scaling", "rope_parameters"] {
        if let Some(rs) = v.get(key).filter(|x| x.is_object()) {
            let ty = rs
                .get("rope_type")
                .or_else(|| rs.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("default");
            if ty != "default" {
                return Err(unsupported(format!(
                    "{key}.rope_type `{ty}` (RoPE scaling) is not supported; only plain RoPE"
                )));
            }
        }
    }
    let rope_dims = match c.f32_opt("partial_rotary_factor")? {
        Some(f) if f > 0.0 && f < 1.0 => {
            let r = (head_dim as f32 * f) as u32;
            if !r.is_multiple_of(2) {
                return Err(c.err(format!("partial rotary dims {r} must be even")));
            }
            r
        }
        _ => 0,
    };
    let ffn_act = match c.str_opt("hidden_act")?.unwrap_or("silu") {
        "silu" | "swish" => FfnAct::Swiglu,
        "gelu_pytorch_tanh" | "gelu_new" | "gelu_tanh" => FfnAct::Geglu,
        other => {
            return Err(unsupported(format!(
                "hidden_act `{other}` (supported: silu, gelu_pytorch_tanh)"
            )))
        }
    };
    if c.bool_opt("mlp_bias")?.unwrap_or(false) {
        return Err(unsupported("mlp_bias = true (FFN biases)".into()));
    }
    let attention_bias = c.bool_opt("attention_bias")?.unwrap_or(false);
    let qkv_bias = match fam {
        Family::Qwen2 => true,
        Family::PipelineNative => attention_bias,
        _ if attention_bias => {
            return Err(unsupported(
                "attention_bias = true puts a bias on o_proj too, which .cflow cannot store \
                 (Q/K/V biases only)"
                    .into(),
            ))
        }
        _ => false,
    };

    // MoE and dense geometry: the family decides.
    let Ffn {
        dense,
        d_ff,
        n_experts,
        mut top_k,
        mut expert_ffn,
        router_norm,
        style,
        dd,
        de,
        merge_interval,
        fp_iters,
        arch_name,
        clip_qkv,
    } = match fam {
        Family::Mixtral => mixtral_ffn(&c)?,
        Family::Olmoe => olmoe_ffn(&c)?,
        Family::PipelineNative => pipeline_native_ffn(&c)?,
        Family::Llama | Family::Mistral | Family::Qwen2 => Ffn::dense(&c, fam)?,
    };
    if n_experts == 0 {
        if !dense {
            return Err(c.err("neither a dense FFN nor experts".into()));
        }
        // A dense model: MoE keys without experts (`num_experts_per_tok`, an expert width) mean
        // nothing; the file format stores top-k 0 and no expert width then.
        top_k = 0;
        expert_ffn = 0;
    }
    if n_experts > 0 && (top_k == 0 || top_k > n_experts || n_experts > 255) {
        return Err(c.err(format!(
            "top-k {top_k} must be in 1..={n_experts} and experts <= 255"
        )));
    }
    let eff_layers = if style == CombineStyle::FixedPoint {
        n_layers.saturating_mul(fp_iters as usize)
    } else {
        n_layers
    };
    if n_layers == 0 || n_layers > 4096 || dd >= eff_layers.max(1) {
        return Err(c.err(format!(
            "num_hidden_layers {n_layers} must be in 1..=4096 and exceed dense_delay {dd}"
        )));
    }
    if d == 0 || vocab == 0 || head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(c.err(format!(
            "bad geometry: hidden_size {d}, vocab_size {vocab}, head_dim {head_dim} (must be even)"
        )));
    }
    if dense && d_ff == 0 {
        return Err(c.err("intermediate_size must be > 0".into()));
    }
    if q.is_blocked() {
        for (what, n) in [
            ("hidden_size", d),
            (
                "num_attention_heads × head_dim",
                n_heads.saturating_mul(head_dim),
            ),
            ("intermediate_size", d_ff),
            ("expert intermediate size", expert_ffn),
        ] {
            if !n.is_multiple_of(q.block_len()) {
                return Err(c.err(format!(
                    "{what} = {n} is not a multiple of {}, which {q} needs; use --quant f16 or f32",
                    q.block_len()
                )));
            }
        }
    }
    for (what, n) in [
        ("hidden_size", d),
        ("q dim", n_heads.saturating_mul(head_dim)),
        ("intermediate size", d_ff.max(expert_ffn)),
    ] {
        if n > u16::MAX as usize {
            return Err(c.err(format!("{what} {n} exceeds 65535 columns")));
        }
    }

    let sliding = sliding_windows(&c, fam, n_layers)?;

    // Tied embeddings: the config says so, or the checkpoint has no lm_head.
    let tie_cfg = c.bool_opt("tie_word_embeddings")?;
    let tied = match tie_cfg {
        Some(true) => true,
        Some(false) => false,
        None => !w.has("lm_head.weight"),
    };
    let ctx_cfg = c.usize_opt("max_position_embeddings")?.unwrap_or(4096);
    let max_ctx = max_ctx.unwrap_or(ctx_cfg.min(DEFAULT_MAX_CTX)).max(1);

    let mut eos = c.ids("eos_token_id");
    let bos = c.ids("bos_token_id").first().copied();
    if let Some(g) = read_json_opt(&dir.join("generation_config.json"), MAX_CONFIG_BYTES)? {
        let gc = Cfg {
            v: &g,
            file: &cfg_path,
        };
        for id in gc.ids("eos_token_id") {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
    let final_softcap = c.f32_opt("final_logit_softcapping")?.unwrap_or(0.0);
    let attn_softcap = c.f32_opt("attn_logit_softcapping")?.unwrap_or(0.0);
    let meta = ModelMeta {
        arch: arch_name,
        name: dir
            .file_name()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_else(|| "imported".into()),
        synthetic: false,
        rope_style: RopeStyle::SplitHalf,
        rope_dims,
        sliding_window: sliding,
        attn_logit_softcap: attn_softcap,
        clip_qkv,
        ffn_act,
        router_norm,
        merge_interval,
        fixed_point_iterations: fp_iters,
        bos_id: bos,
        eos_ids: eos,
        add_bos: false,
        tokenizer_json: None,
        chat_template: None,
        provenance: serde_json::json!({
            "source": dir.file_name().map(|s| s.to_string_lossy().to_string()),
            "architecture": arch,
            "converter": "cflow-tui import (HF safetensors)",
            "quant": q.name(),
        }),
        ..Default::default()
    };
    let cfg = ModelConfig {
        n_layers,
        d_model: d,
        n_heads,
        n_kv_heads: n_kv,
        head_dim,
        d_ff: if dense { d_ff } else { 0 },
        n_experts,
        top_k,
        expert_ffn,
        vocab,
        max_ctx,
        rms_eps: eps,
        rope_theta: theta,
        dense_delay: dd,
        expert_delay: de,
        combine_style: style,
        feature_flags: if tied { FLAG_TIED_EMBED } else { 0 }
            | if qkv_bias { FLAG_QKV_BIAS } else { 0 }
            | if fam == Family::Olmoe {
                FLAG_QK_NORM
            } else {
                0
            },
        final_logit_softcap: final_softcap,
        meta,
    };
    Ok(Plan {
        fam,
        cfg,
        dense,
        tied,
    })
}

/// The FFN of a config: dense, routed experts or both, and (pipeline-native) the combine style,
/// delays and the variant name.
struct Ffn {
    dense: bool,
    d_ff: usize,
    n_experts: usize,
    top_k: usize,
    expert_ffn: usize,
    router_norm: RouterNorm,
    style: CombineStyle,
    dd: usize,
    de: usize,
    merge_interval: u32,
    fp_iters: u32,
    arch_name: String,
    clip_qkv: f32,
}

impl Ffn {
    /// A dense FFN of `intermediate_size` (Llama, Mistral, Qwen2).
    fn dense(c: &Cfg, fam: Family) -> Result<Ffn, HfError> {
        Ok(Ffn {
            dense: true,
            d_ff: c.usize_opt("intermediate_size")?.unwrap_or(0),
            n_experts: 0,
            top_k: 0,
            expert_ffn: 0,
            router_norm: RouterNorm::SoftmaxTopk,
            style: CombineStyle::Sequential,
            dd: 0,
            de: 0,
            merge_interval: 3,
            fp_iters: 3,
            arch_name: fam.arch_name().to_string(),
            clip_qkv: 0.0,
        })
    }
}

/// Mixtral: every layer is MoE (`num_local_experts`, top `num_experts_per_tok`);
/// `intermediate_size` is the expert hidden size; softmax over the top-k logits.
fn mixtral_ffn(c: &Cfg) -> Result<Ffn, HfError> {
    let base = Ffn::dense(c, Family::Mixtral)?;
    Ok(Ffn {
        dense: false,
        n_experts: c.usize("num_local_experts")?,
        top_k: c.usize("num_experts_per_tok")?,
        expert_ffn: base.d_ff,
        d_ff: 0,
        ..base
    })
}

/// OLMoE: every layer is MoE; `intermediate_size` is the expert hidden size. The router takes a
/// softmax over all experts, then the top-k: without `norm_topk_prob` the selected
/// probabilities are used as they are (SoftmaxAll); renormalising them over the top-k equals a
/// softmax over the top-k logits (SoftmaxTopk). Optional `clip_qkv`.
fn olmoe_ffn(c: &Cfg) -> Result<Ffn, HfError> {
    let base = Ffn::dense(c, Family::Olmoe)?;
    let n_experts = c
        .usize_opt("num_experts")?
        .or(c.usize_opt("num_local_experts")?)
        .ok_or_else(|| c.err("missing `num_experts`".into()))?;
    let top_k = c.usize("num_experts_per_tok")?;
    let router_norm = if c.bool_opt("norm_topk_prob")?.unwrap_or(false) {
        RouterNorm::SoftmaxTopk
    } else {
        RouterNorm::SoftmaxAll
    };
    let mut clip_qkv = 0.0;
    if let Some(cl) = c.f32_opt("clip_qkv")? {
        if !(cl.is_finite() && cl > 0.0) {
            return Err(c.err(format!("clip_qkv {cl} must be > 0 (or null)")));
        }
        clip_qkv = cl;
    }
    Ok(Ffn {
        dense: false,
        n_experts,
        top_k,
        expert_ffn: base.d_ff,
        d_ff: 0,
        router_norm,
        clip_qkv,
        ..base
    })
}

/// Our `PipelineNativeForCausalLM` (docs/FORMAT.md): combine style, delays, an optional dense
/// FFN and optional experts, the router normalization and the variant name.
fn pipeline_native_ffn(c: &Cfg) -> Result<Ffn, HfError> {
    let base = Ffn::dense(c, Family::PipelineNative)?;
    let s = c
        .str_opt("combine_style")?
        .ok_or_else(|| c.err("missing `combine_style`".into()))?;
    let style = parse_style(s).ok_or_else(|| {
        c.err(format!(
            "combine_style `{s}` (expected parallel_sqrt2, delayed_sum, async_experts, \
             sequential, decoupled_streams, pipeline_registers or fixed_point)"
        ))
    })?;
    let dd = c.usize_opt("dense_delay")?.unwrap_or(0);
    let de = c.usize_opt("expert_delay")?.unwrap_or(0);
    let n_experts = c.usize_opt("num_experts")?.unwrap_or(0);
    let top_k = c.usize_opt("num_experts_per_tok")?.unwrap_or(0);
    let expert_ffn = c.usize_opt("moe_intermediate_size")?.unwrap_or(0);
    let dense = base.d_ff > 0;
    let router_norm = match c.str_opt("router_norm")?.unwrap_or("softmax_topk") {
        "softmax_topk" => RouterNorm::SoftmaxTopk,
        "softmax_all" => RouterNorm::SoftmaxAll,
        other => {
            return Err(c.err(format!(
                "router_norm `{other}` (expected softmax_topk or softmax_all)"
            )))
        }
    };
    let small = |k: &str, n: usize| {
        u32::try_from(n).map_err(|_| c.err(format!("`{k}` = {n} is out of range")))
    };
    let merge_interval = small(
        "merge_interval",
        c.usize_opt("merge_interval")?.unwrap_or(3),
    )?;
    let fp_iters = small(
        "fixed_point_iterations",
        c.usize_opt("fixed_point_iterations")?.unwrap_or(3),
    )?;
    if merge_interval == 0 || fp_iters == 0 {
        return Err(c.err("merge_interval and fixed_point_iterations must be >= 1".into()));
    }
    if dd > 255 || de > 255 {
        return Err(c.err("dense_delay and expert_delay must be <= 255".into()));
    }
    let arch_name = match c.str_opt("variant")? {
        Some(a) => a.to_string(),
        None => base.arch_name.clone(),
    };
    if n_experts > 0 && (top_k == 0 || expert_ffn == 0) {
        return Err(
            c.err("num_experts > 0 needs num_experts_per_tok and moe_intermediate_size".into())
        );
    }
    if !dense && n_experts == 0 {
        return Err(c.err("neither a dense FFN nor experts".into()));
    }
    Ok(Ffn {
        dense,
        n_experts,
        top_k,
        expert_ffn,
        router_norm,
        style,
        dd,
        de,
        merge_interval,
        fp_iters,
        arch_name,
        ..base
    })
}

/// Each layer's sliding window (0: full attention; empty: none slides): `layer_types` when
/// present; else Mistral, Mixtral and pipeline-native everywhere, Qwen2 from
/// `max_window_layers` on when `use_sliding_window`.
fn sliding_windows(c: &Cfg, fam: Family, n_layers: usize) -> Result<Vec<u32>, HfError> {
    let v = c.v;
    let window = c
        .usize_opt("sliding_window")?
        .unwrap_or(0)
        .min(u32::MAX as usize) as u32;
    let mut sliding = Vec::new();
    if let Some(lt) = v.get("layer_types").and_then(Value::as_array) {
        if lt.len() != n_layers {
            return Err(c.err(format!("layer_types has {} entries", lt.len())));
        }
        for t in lt {
            sliding.push(match t.as_str() {
                Some("full_attention") => 0,
                Some("sliding_attention") => window,
                other => return Err(c.err(format!("layer_types entry {other:?}"))),
            });
        }
    } else {
        match fam {
            Family::Mistral | Family::Mixtral | Family::PipelineNative => {
                sliding = vec![window; n_layers]
            }
            Family::Qwen2 => {
                if c.bool_opt("use_sliding_window")?.unwrap_or(false) {
                    let from = c.usize_opt("max_window_layers")?.unwrap_or(n_layers);
                    sliding = (0..n_layers)
                        .map(|i| if i >= from { window } else { 0 })
                        .collect();
                }
            }
            Family::Llama | Family::Olmoe => {}
        }
    }
    if sliding.iter().all(|&w| w == 0) {
        sliding.clear();
    }
    Ok(sliding)
}
