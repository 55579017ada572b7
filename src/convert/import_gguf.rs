//! GGUF → `.cflow` import for the architectures of `gguf_arch` (llama/Mixtral, mistral, qwen2,
//! qwen3, qwen3moe, olmoe, qwen2moe, gemma3; layer pattern of gemma3 in `gguf_gemma3`). Stacked
//! 3-D expert tensors (`ffn_*_exps`: n_expert × rows × cols) are split into per-expert tiles,
//! their blocks copied as they are. `keep` copies
//! Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K/F16/F32 blocks into tiles without re-quantizing
//! (Q4_0/Q4_1/Q8_0 blocks are split into their scale(s) and quants, the other block types copied
//! byte for byte); other targets dequantize and re-quantize, which loses precision (the CLI
//! warns). The tokenizer and chat template travel in the metadata.

use super::gguf::{GgmlType, GgufError, GgufFile, GgufValue};
use super::gguf_arch::{arch_spec, supported_list, Moe, QkNorm};
use super::gguf_tokenizer::{tokenizer_from_gguf, TokenizerBuildError};
use crate::format::{CflowWriter, ExpertData, FormatError, LayerData, MatrixData, VocabData};
use crate::model::{
    CombineStyle, FfnAct, ModelConfig, ModelMeta, FLAG_EMBED_SCALE, FLAG_POST_NORMS, FLAG_QKV_BIAS,
    FLAG_QK_NORM, FLAG_QK_NORM_PER_HEAD, FLAG_TIED_EMBED,
};
use crate::quant::{dequantize_row, split_blocks, QuantType};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerBuildError),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    NonFinite(#[from] super::validate::NonFiniteTensor),
    #[error("{file}: unsupported architecture `{arch}` (supported: {supported})")]
    Arch {
        file: String,
        arch: String,
        supported: String,
    },
    #[error("{file}: tensor `{tensor}` has type {ty}, which cannot be imported with --quant keep (importable: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) — {why}")]
    Type {
        file: String,
        tensor: String,
        ty: String,
        why: String,
    },
    #[error("{file}: tensor `{tensor}`: {why}")]
    Shape {
        file: String,
        tensor: String,
        why: String,
    },
    #[error("{file}: missing tensor `{tensor}`")]
    Missing { file: String, tensor: String },
    /// A metadata number the model cannot be built with (checked before anything is written).
    #[error("{file}: metadata key `{key}` = {value}: {why}")]
    BadKey {
        file: String,
        key: String,
        value: String,
        why: String,
    },
    /// The GGUF was truncated or rewritten while it was being imported.
    #[error("{file}: the input changed while it was being imported (pages vanished under the mapping); nothing was written")]
    InputChanged { file: String },
}

/// Largest dimension, layer count, expert count, vocabulary and context the `.cflow` reader
/// accepts (`format::reader::config_from_header`).
const MAX_DIM: u64 = 1 << 20;
const MAX_LAYERS: u64 = 4096;
const MAX_EXPERTS: u64 = 255;
const MAX_VOCAB: u64 = 1 << 24;
const MAX_CTX: u64 = 1 << 24;

/// Target weight type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantTarget {
    Keep,
    To(QuantType),
}

impl QuantTarget {
    pub fn parse(s: &str) -> Option<QuantTarget> {
        if s == "keep" {
            Some(QuantTarget::Keep)
        } else {
            QuantType::parse(s).map(QuantTarget::To)
        }
    }
}

fn our_type(t: GgmlType) -> Option<QuantType> {
    match t {
        GgmlType::F32 => Some(QuantType::F32),
        GgmlType::F16 => Some(QuantType::F16),
        GgmlType::Q4_0 => Some(QuantType::Q4_0),
        GgmlType::Q4_1 => Some(QuantType::Q4_1),
        GgmlType::Q5_0 => Some(QuantType::Q5_0),
        GgmlType::Q5_1 => Some(QuantType::Q5_1),
        GgmlType::Q8_0 => Some(QuantType::Q8_0),
        GgmlType::Q4_K => Some(QuantType::Q4_K),
        GgmlType::Q5_K => Some(QuantType::Q5_K),
        GgmlType::Q6_K => Some(QuantType::Q6_K),
        _ => None,
    }
}

struct Imp<'a> {
    g: &'a GgufFile,
    file: String,
    target: QuantTarget,
}

impl Imp<'_> {
    fn missing(&self, t: &str) -> ImportError {
        ImportError::Missing {
            file: self.file.clone(),
            tensor: t.into(),
        }
    }

    /// A 2-D weight `rows × cols` (GGUF dims [cols, rows]) as split-layout matrix data.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<MatrixData, ImportError> {
        let t = self.g.tensor(name).map_err(|_| self.missing(name))?;
        if t.dims.len() != 2 || t.dims[0] as usize != cols || t.dims[1] as usize != rows {
            return Err(ImportError::Shape {
                file: self.file.clone(),
                tensor: name.into(),
                why: format!("dims {:?}, expected [{cols}, {rows}]", t.dims),
            });
        }
        self.rows_of(name, t.ggml_type, t.data, rows, cols)
    }

    fn rows_of(
        &self,
        name: &str,
        ty: GgmlType,
        data: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<MatrixData, ImportError> {
        let src = our_type(ty);
        let target = match (self.target, src) {
            (QuantTarget::Keep, Some(s)) => s,
            (QuantTarget::Keep, None) => {
                return Err(ImportError::Type {
                    file: self.file.clone(),
                    tensor: name.into(),
                    ty: ty.name().into(),
                    why: "no reader for this block format".into(),
                })
            }
            (QuantTarget::To(q), _) => q,
        };
        let src = src.ok_or_else(|| ImportError::Type {
            file: self.file.clone(),
            tensor: name.into(),
            ty: ty.name().into(),
            why: "cannot dequantize this type".into(),
        })?;
        for q in [src, target] {
            if !cols.is_multiple_of(q.block_len()) {
                return Err(ImportError::Shape {
                    file: self.file.clone(),
                    tensor: name.into(),
                    why: format!(
                        "{cols} columns is not a multiple of {} ({q} blocks)",
                        q.block_len()
                    ),
                });
            }
        }
        let row_bytes = src.matrix_bytes(1, cols);
        if data.len() != row_bytes * rows {
            return Err(ImportError::Shape {
                file: self.file.clone(),
                tensor: name.into(),
                why: format!("{} data bytes, expected {}", data.len(), row_bytes * rows),
            });
        }
        super::validate::gguf_data(&self.file, name, src, data, cols)?;
        let mut m = MatrixData {
            quant: target,
            rows,
            cols,
            scales: Vec::new(),
            qs: Vec::new(),
        };
        if src == target {
            for r in 0..rows {
                split_blocks(
                    src,
                    &data[r * row_bytes..(r + 1) * row_bytes],
                    &mut m.scales,
                    &mut m.qs,
                );
            }
        } else {
            let mut row = vec![0f32; cols];
            let (sb, qb) = (src.row_scale_bytes(cols), src.row_quant_bytes(cols));
            for r in 0..rows {
                let (mut sc, mut qs) = (Vec::with_capacity(sb), Vec::with_capacity(qb));
                split_blocks(
                    src,
                    &data[r * row_bytes..(r + 1) * row_bytes],
                    &mut sc,
                    &mut qs,
                );
                dequantize_row(src, &sc, &qs, &mut row);
                crate::quant::quantize_row(target, &row, &mut m.scales, &mut m.qs);
            }
        }
        super::validate::matrix(&self.file, name, &m)?;
        Ok(m)
    }

    fn vector(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>, ImportError> {
        let Ok(t) = self.g.tensor(name) else {
            return Ok(None);
        };
        if t.dims.iter().product::<u64>() != n as u64 {
            return Err(ImportError::Shape {
                file: self.file.clone(),
                tensor: name.into(),
                why: format!("dims {:?}, expected {n} elements", t.dims),
            });
        }
        let src = our_type(t.ggml_type).ok_or_else(|| ImportError::Type {
            file: self.file.clone(),
            tensor: name.into(),
            ty: t.ggml_type.name().into(),
            why: "vectors must be F32 or F16".into(),
        })?;
        if !n.is_multiple_of(src.block_len()) {
            return Err(ImportError::Shape {
                file: self.file.clone(),
                tensor: name.into(),
                why: "partial block".into(),
            });
        }
        let mut out = vec![0f32; n];
        let (mut sc, mut qs) = (Vec::new(), Vec::new());
        split_blocks(src, t.data, &mut sc, &mut qs);
        dequantize_row(src, &sc, &qs, &mut out);
        super::validate::vector(&self.file, name, &out)?;
        Ok(Some(out))
    }
}

/// Imports `src` (GGUF) into `out` (.cflow). `progress(done, total)` after each layer.
pub fn import_gguf(
    src: &Path,
    out: &Path,
    target: QuantTarget,
    max_ctx: Option<usize>,
    mut progress: impl FnMut(usize, usize),
) -> Result<ModelConfig, ImportError> {
    let g = GgufFile::open(src)?;
    let file = src.display().to_string();
    let arch = g.get_str("general.architecture")?.to_string();
    let Some(spec) = arch_spec(&arch) else {
        return Err(ImportError::Arch {
            file,
            arch,
            supported: supported_list(),
        });
    };
    let (rope_style, qkv_bias) = (spec.rope, spec.qkv_bias);
    let k = |s: &str| format!("{arch}.{s}");
    let n_layers = g.get_u32(&k("block_count"))? as usize;
    let d = g.get_u32(&k("embedding_length"))? as usize;
    let d_ff = g.get_u32(&k("feed_forward_length"))? as usize;
    let n_heads = g.get_u32(&k("attention.head_count"))? as usize;
    let n_kv = g
        .opt_u32(&k("attention.head_count_kv"))?
        .unwrap_or(n_heads as u32) as usize;
    let eps = g.get_f32(&k("attention.layer_norm_rms_epsilon"))?;
    let theta = g.opt_f32(&k("rope.freq_base"))?.unwrap_or(10000.0);
    let ctx = g.opt_u32(&k("context_length"))?.unwrap_or(2048) as usize;
    let n_experts = g.opt_u32(&k("expert_count"))?.unwrap_or(0) as usize;
    let top_k = g.opt_u32(&k("expert_used_count"))?.unwrap_or(0) as usize;
    if spec.moe == Moe::Never && n_experts > 0 {
        return Err(bad_key_early(
            &file,
            k("expert_count"),
            n_experts.to_string(),
            format!("`{arch}` is a dense architecture; its graph has no experts"),
        ));
    }
    if spec.moe == Moe::Always && n_experts == 0 {
        return Err(bad_key_early(
            &file,
            k("expert_count"),
            "0 (or absent)".into(),
            format!("`{arch}` is a mixture-of-experts architecture: it needs at least one expert"),
        ));
    }
    check_unsupported_keys(&g, &file, &arch)?;
    let shape_err = |why: String| ImportError::Shape {
        file: file.clone(),
        tensor: "(header)".into(),
        why,
    };
    let key_len = g.opt_u32(&k("attention.key_length"))?;
    let val_len = g.opt_u32(&k("attention.value_length"))?;
    if n_layers == 0
        || d == 0
        || n_heads == 0
        || n_kv == 0
        || (key_len.is_none() && !d.is_multiple_of(n_heads))
        || !n_heads.is_multiple_of(n_kv)
    {
        return Err(shape_err(format!(
            "inconsistent geometry: layers {n_layers}, d {d}, heads {n_heads}/{n_kv}"
        )));
    }
    // Gemma 3: head_dim (key_length 256) is not d / heads (160).
    let head_dim = key_len.map_or(d / n_heads, |v| v as usize);
    if val_len.is_some_and(|v| v as usize != head_dim) {
        return Err(bad_key_early(
            &file,
            k("attention.value_length"),
            format!("{val_len:?}"),
            format!("must equal the key length {head_dim}"),
        ));
    }
    let rope_dims = g
        .opt_u32(&k("rope.dimension_count"))?
        .unwrap_or(head_dim as u32);
    let bad_key = |key: String, value: String, why: String| ImportError::BadKey {
        file: file.clone(),
        key,
        value,
        why,
    };
    let range = |key: &str, v: u64, lo: u64, hi: u64| {
        if v < lo || v > hi {
            Err(bad_key(
                k(key),
                v.to_string(),
                format!("must be in [{lo}, {hi}]"),
            ))
        } else {
            Ok(())
        }
    };
    range("block_count", n_layers as u64, 1, MAX_LAYERS)?;
    range("embedding_length", d as u64, 32, MAX_DIM)?;
    if !d.is_multiple_of(32) {
        return Err(bad_key(
            k("embedding_length"),
            d.to_string(),
            "must be a multiple of 32".into(),
        ));
    }
    range("attention.head_count", n_heads as u64, 1, 4096)?;
    if head_dim == 0 || head_dim > 4096 || !head_dim.is_multiple_of(2) {
        return Err(bad_key(
            k("attention.head_count"),
            n_heads.to_string(),
            format!("gives head_dim {head_dim}, which must be even and <= 4096"),
        ));
    }
    if rope_dims as usize > head_dim || !rope_dims.is_multiple_of(2) {
        return Err(bad_key(
            k("rope.dimension_count"),
            rope_dims.to_string(),
            format!("must be an even number <= head_dim {head_dim}"),
        ));
    }
    range("feed_forward_length", d_ff as u64, 0, MAX_DIM)?;
    range("expert_count", n_experts as u64, 0, MAX_EXPERTS)?;
    if n_experts > 0 {
        range("expert_used_count", top_k as u64, 1, n_experts as u64)?;
    } else if top_k > 0 {
        return Err(bad_key(
            k("expert_used_count"),
            top_k.to_string(),
            "set without experts (expert_count 0)".into(),
        ));
    }
    if max_ctx.is_none() {
        range("context_length", ctx as u64, 1, MAX_CTX)?;
    }
    if !(eps.is_finite() && eps > 0.0 && eps < 1.0) {
        return Err(bad_key(
            k("attention.layer_norm_rms_epsilon"),
            eps.to_string(),
            "must be in (0, 1)".into(),
        ));
    }
    if !crate::model::rope_theta_ok(theta) {
        return Err(bad_key(
            k("rope.freq_base"),
            theta.to_string(),
            crate::model::ROPE_THETA_RULE.into(),
        ));
    }
    let emb = g
        .tensor("token_embd.weight")
        .map_err(|_| ImportError::Missing {
            file: file.clone(),
            tensor: "token_embd.weight".into(),
        })?;
    if emb.dims.len() != 2 || emb.dims[0] as usize != d {
        return Err(shape_err(format!("token_embd dims {:?}", emb.dims)));
    }
    let vocab = emb.dims[1] as usize;
    if vocab as u64 > MAX_VOCAB {
        return Err(shape_err(format!(
            "token_embd has {vocab} rows; at most {MAX_VOCAB} tokens are supported"
        )));
    }
    let tied = g.tensor("output.weight").is_err();
    let gemma3 = spec.gemma3;
    let g3 = if gemma3 {
        Some(super::gguf_gemma3::layers(&g, n_layers, d, n_heads, theta)?)
    } else {
        None
    };
    let tok = tokenizer_from_gguf(&g)?;
    let moe = n_experts > 0;
    let expert_ffn = if moe {
        uniform_u32(&g, &file, &k("expert_feed_forward_length"))?.unwrap_or(d_ff as u32) as usize
    } else {
        0
    };
    // The shared expert (Qwen2-MoE) is the dense FFN of a MoE layer, scaled by its gate.
    let shared_ffn = if moe && spec.shared_expert {
        let v = g
            .opt_u32(&k("expert_shared_feed_forward_length"))?
            .unwrap_or(d_ff as u32) as usize;
        range("expert_shared_feed_forward_length", v as u64, 1, MAX_DIM)?;
        v
    } else {
        0
    };
    if moe {
        range("expert_feed_forward_length", expert_ffn as u64, 1, MAX_DIM)?;
    } else if d_ff == 0 {
        return Err(bad_key(
            k("feed_forward_length"),
            "0".into(),
            "a dense model needs a feed-forward size".into(),
        ));
    }
    // Block types quantize 32 columns at a time: refuse before writing anything.
    if let QuantTarget::To(q) = target {
        if q.is_blocked() {
            let widths = [
                ("embedding_length", d),
                ("feed_forward_length", if moe { 0 } else { d_ff }),
                ("expert_feed_forward_length", expert_ffn),
                ("expert_shared_feed_forward_length", shared_ffn),
            ];
            if let Some((key, n)) = widths.iter().find(|(_, n)| !n.is_multiple_of(32)) {
                return Err(bad_key(
                    k(key),
                    n.to_string(),
                    format!("not a multiple of 32, which {q} needs; use --quant f16 or f32"),
                ));
            }
        }
    }
    let meta = ModelMeta {
        arch: arch.clone(),
        name: g.opt_str("general.name")?.unwrap_or("imported").to_string(),
        synthetic: false,
        rope_style,
        rope_dims: if rope_dims as usize == head_dim {
            0
        } else {
            rope_dims
        },
        rope_theta_per_layer: g3.as_ref().map_or(Vec::new(), |x| x.rope_theta.clone()),
        sliding_window: g3.as_ref().map_or(Vec::new(), |x| x.sliding_window.clone()),
        query_pre_attn_scalar: g3.as_ref().map_or(0.0, |x| x.query_pre_attn_scalar),
        ffn_act: if gemma3 {
            FfnAct::Geglu
        } else {
            FfnAct::Swiglu
        },
        router_norm: spec.router,
        bos_id: tok.special.bos,
        eos_ids: tok.special.eog.clone(),
        add_bos: tok.special.add_bos,
        tokenizer_json: Some(std::sync::Arc::from(tok.json.as_str())),
        chat_template: tok.chat_template.clone(),
        provenance: serde_json::json!({
            "source": src.file_name().map(|s| s.to_string_lossy().to_string()),
            "converter": "cflow-tui import",
            "quant": format!("{target:?}"),
            "gguf_version": g.version(),
            // The GGUF's own name for its mix of types (`Q4_K_M`): kept types only.
            "file_type": matches!(target, QuantTarget::Keep)
                .then(|| g.opt_u32("general.file_type").ok().flatten())
                .flatten()
                .and_then(crate::format::quant_mix::gguf_file_type_name),
        }),
        ..Default::default()
    };
    let cfg = ModelConfig {
        n_layers,
        d_model: d,
        n_heads,
        n_kv_heads: n_kv,
        head_dim,
        d_ff: if moe { shared_ffn } else { d_ff },
        n_experts,
        top_k,
        expert_ffn,
        vocab,
        max_ctx: max_ctx.unwrap_or(ctx),
        rms_eps: eps,
        rope_theta: theta,
        dense_delay: 0,
        expert_delay: 0,
        combine_style: CombineStyle::Sequential,
        feature_flags: if tied { FLAG_TIED_EMBED } else { 0 }
            | if qkv_bias { FLAG_QKV_BIAS } else { 0 }
            | if gemma3 {
                FLAG_EMBED_SCALE | FLAG_POST_NORMS
            } else {
                0
            }
            | match spec.qk_norm {
                QkNorm::None => 0,
                QkNorm::Whole => FLAG_QK_NORM,
                QkNorm::PerHead => FLAG_QK_NORM | FLAG_QK_NORM_PER_HEAD,
            },
        final_logit_softcap: g3.as_ref().map_or(0.0, |x| x.final_logit_softcap),
        meta,
    };
    let imp = Imp {
        g: &g,
        file: file.clone(),
        target,
    };
    let mut w = CflowWriter::create_for(out, &cfg, &[src])?;
    let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
    let total = n_layers + 1;
    for i in 0..n_layers {
        let p = |s: &str| format!("blk.{i}.{s}");
        let req = |name: String, n: usize| -> Result<Vec<f32>, ImportError> {
            imp.vector(&name, n)?.ok_or_else(|| imp.missing(&name))
        };
        let mut l = LayerData {
            q: imp.matrix(&p("attn_q.weight"), qd, d)?,
            k: imp.matrix(&p("attn_k.weight"), kvd, d)?,
            v: imp.matrix(&p("attn_v.weight"), kvd, d)?,
            o: imp.matrix(&p("attn_output.weight"), d, qd)?,
            q_bias: imp.vector(&p("attn_q.bias"), qd)?,
            k_bias: imp.vector(&p("attn_k.bias"), kvd)?,
            v_bias: imp.vector(&p("attn_v.bias"), kvd)?,
            q_norm: None,
            k_norm: None,
            post_attn_norm: None,
            post_ffn_norm: None,
            shared_gate: None,
            router_bias: None,
            gate: None,
            up: None,
            down: None,
            attn_norm: req(p("attn_norm.weight"), d)?,
            ffn_norm: None,
            moe_norm: None,
            router: None,
            experts: Vec::new(),
        };
        if cfg.qk_norm() {
            let (qn, kn) = cfg.qk_norm_lens();
            l.q_norm = Some(req(p("attn_q_norm.weight"), qn)?);
            l.k_norm = Some(req(p("attn_k_norm.weight"), kn)?);
        }
        if gemma3 {
            l.post_attn_norm = Some(req(p("post_attention_norm.weight"), d)?);
            l.post_ffn_norm = Some(req(p("post_ffw_norm.weight"), d)?);
        }
        let ffn_norm = req(p("ffn_norm.weight"), d)?;
        if moe {
            if shared_ffn > 0 {
                // One norm feeds the router, the routed and the shared experts.
                l.ffn_norm = Some(ffn_norm.clone());
                l.gate = Some(imp.matrix(&p("ffn_gate_shexp.weight"), shared_ffn, d)?);
                l.up = Some(imp.matrix(&p("ffn_up_shexp.weight"), shared_ffn, d)?);
                l.down = Some(imp.matrix(&p("ffn_down_shexp.weight"), d, shared_ffn)?);
                l.shared_gate = Some(req(p("ffn_gate_inp_shexp.weight"), d)?);
            }
            l.moe_norm = Some(ffn_norm);
            l.router = Some(req(p("ffn_gate_inp.weight"), n_experts * d)?);
            for e in 0..n_experts {
                l.experts.push(ExpertData {
                    gate: expert_slice(
                        &imp,
                        &p("ffn_gate_exps.weight"),
                        e,
                        n_experts,
                        expert_ffn,
                        d,
                    )?,
                    up: expert_slice(&imp, &p("ffn_up_exps.weight"), e, n_experts, expert_ffn, d)?,
                    down: expert_slice(
                        &imp,
                        &p("ffn_down_exps.weight"),
                        e,
                        n_experts,
                        d,
                        expert_ffn,
                    )?,
                });
            }
        } else {
            l.ffn_norm = Some(ffn_norm);
            l.gate = Some(imp.matrix(&p("ffn_gate.weight"), d_ff, d)?);
            l.up = Some(imp.matrix(&p("ffn_up.weight"), d_ff, d)?);
            l.down = Some(imp.matrix(&p("ffn_down.weight"), d, d_ff)?);
        }
        if qkv_bias && (l.q_bias.is_none() || l.k_bias.is_none() || l.v_bias.is_none()) {
            return Err(imp.missing(&p("attn_q.bias / attn_k.bias / attn_v.bias")));
        }
        w.write_layer(&l)?;
        progress(i + 1, total);
    }
    let embedding = imp.matrix("token_embd.weight", vocab, d)?;
    let lm_head = if tied {
        None
    } else {
        Some(imp.matrix("output.weight", vocab, d)?)
    };
    let final_norm = imp
        .vector("output_norm.weight", d)?
        .ok_or_else(|| imp.missing("output_norm.weight"))?;
    if g.input_changed() {
        return Err(ImportError::InputChanged { file });
    }
    let mut cfg = cfg;
    if !qkv_bias {
        cfg.feature_flags &= !FLAG_QKV_BIAS;
    }
    w.finish(
        &VocabData {
            embedding,
            lm_head,
            final_norm,
        },
        &cfg.meta,
    )?;
    progress(total, total);
    Ok(cfg)
}

/// A u32 key that may also be a per-layer array (llama.cpp's `get_key_or_arr`): every entry
/// must be equal, since every layer of a `.cflow` has the same geometry.
fn uniform_u32(g: &GgufFile, file: &str, key: &str) -> Result<Option<u32>, ImportError> {
    match g.get(key) {
        None => Ok(None),
        Some(GgufValue::Array(_)) => {
            let v = g.get_int_array(key)?;
            let first = v.first().copied().unwrap_or(-1);
            if v.iter().any(|&x| x != first) || u32::try_from(first).is_err() {
                return Err(bad_key_early(
                    file,
                    key.to_string(),
                    format!("{v:?}"),
                    "per-layer values must all be equal (one geometry for every layer)".into(),
                ));
            }
            Ok(Some(first as u32))
        }
        Some(_) => Ok(g.opt_u32(key)?),
    }
}

/// Keys whose non-default values change the graph in ways we do not run: refused by name
/// rather than silently ignored.
fn check_unsupported_keys(g: &GgufFile, file: &str, arch: &str) -> Result<(), ImportError> {
    let k = |s: &str| format!("{arch}.{s}");
    if let Some(t) = g.opt_str(&k("rope.scaling.type"))? {
        let factor = g.opt_f32(&k("rope.scaling.factor"))?.unwrap_or(1.0);
        if t != "none" && !(t == "linear" && factor == 1.0) {
            return Err(bad_key_early(
                file,
                k("rope.scaling.type"),
                format!("{t} (factor {factor})"),
                "RoPE scaling is not supported (only none)".into(),
            ));
        }
    }
    if let Some(s) = g.opt_f32(&k("expert_weights_scale"))? {
        if s != 0.0 && s != 1.0 {
            return Err(bad_key_early(
                file,
                k("expert_weights_scale"),
                s.to_string(),
                "scaled expert weights are not supported (only 1)".into(),
            ));
        }
    }
    for key in ["expert_shared_count", "leading_dense_block_count"] {
        if let Some(n) = g.opt_u32(&k(key))? {
            if n > 0 && !(key == "expert_shared_count" && arch == "qwen2moe" && n == 1) {
                return Err(bad_key_early(
                    file,
                    k(key),
                    n.to_string(),
                    format!("not supported for `{arch}`"),
                ));
            }
        }
    }
    Ok(())
}

/// A bad metadata key found before the key-range helpers exist.
fn bad_key_early(file: &str, key: String, value: String, why: String) -> ImportError {
    ImportError::BadKey {
        file: file.to_string(),
        key,
        value,
        why,
    }
}

/// Expert `e` of a stacked 3-D expert tensor (GGUF dims [cols, rows, n_experts]).
fn expert_slice(
    imp: &Imp,
    name: &str,
    e: usize,
    n: usize,
    rows: usize,
    cols: usize,
) -> Result<MatrixData, ImportError> {
    let t = imp.g.tensor(name).map_err(|_| imp.missing(name))?;
    if t.dims != [cols as u64, rows as u64, n as u64] {
        return Err(ImportError::Shape {
            file: imp.file.clone(),
            tensor: name.into(),
            why: format!("dims {:?}, expected [{cols}, {rows}, {n}]", t.dims),
        });
    }
    let per = t.data.len() / n;
    imp.rows_of(
        name,
        t.ggml_type,
        &t.data[e * per..(e + 1) * per],
        rows,
        cols,
    )
}
