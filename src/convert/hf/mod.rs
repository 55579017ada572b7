//! HuggingFace safetensors directory → `.cflow` import.
//!
//! Reads `config.json`, `model.safetensors` (or the shards listed in
//! `model.safetensors.index.json`, or every `*.safetensors` when there is no index),
//! `tokenizer.json`, `tokenizer_config.json` and `generation_config.json`. Shards are
//! memory-mapped and converted one tensor at a time (bf16/f16/f32 → f32 → the target quant
//! type), one layer is held in memory at a time, and the output is written atomically
//! (`CflowWriter` writes a temporary file and renames it).
//!
//! Architectures: Llama, Mistral (sliding window), Qwen2 (Q/K/V bias), Mixtral (softmax over
//! the top-k router logits), OLMoE (whole-projection Q/K RMSNorm → `FLAG_QK_NORM`, softmax over
//! all experts then top-k, optional `clip_qkv`) and our `PipelineNativeForCausalLM` (delays,
//! combine style, MoE; the `config.json` schema and tensor names are in `docs/FORMAT.md`). HF
//! rotary embeddings are split-half (`rotate_half`), which is `RopeStyle::SplitHalf`: no Q/K row
//! permutation is needed.

mod config;
mod family;
mod files;
mod tokenizer;
mod weights;

use config::*;
use family::*;
use files::*;
use tokenizer::*;
use weights::*;

use crate::format::{CflowWriter, ExpertData, FormatError, LayerData, MatrixData, VocabData};
use crate::model::ModelConfig;
use crate::quant::QuantType;
use std::path::{Path, PathBuf};

/// The `architectures` values this importer accepts.
pub const SUPPORTED: [&str; 6] = [
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "MixtralForCausalLM",
    "OlmoeForCausalLM",
    "PipelineNativeForCausalLM",
];

/// Default context when the config's `max_position_embeddings` is larger (the KV cache is
/// allocated for `max_ctx`); `--max-ctx` overrides.
pub const DEFAULT_MAX_CTX: usize = 8192;

#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("{file}: {source}")]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}: invalid JSON: {source}")]
    Json {
        file: PathBuf,
        source: serde_json::Error,
    },
    #[error("{dir}: not a HuggingFace model directory: {what} (need config.json and model.safetensors, or model.safetensors.index.json with its shards)")]
    MissingFile { dir: PathBuf, what: String },
    #[error("{file}: {why}")]
    Config { file: PathBuf, why: String },
    #[error("{file}: unsupported architecture `{arch}` (supported: {})", SUPPORTED.join(", "))]
    Arch { file: PathBuf, arch: String },
    #[error("{file}: {arch}: {why} (supported: {})", SUPPORTED.join(", "))]
    Unsupported {
        file: PathBuf,
        arch: String,
        why: String,
    },
    #[error("{file}: corrupt safetensors file: {why}")]
    Safetensors { file: PathBuf, why: String },
    #[error("missing tensor `{tensor}` (looked in {files})")]
    Missing { tensor: String, files: String },
    #[error("{file}: tensor `{tensor}`: {why}")]
    Tensor {
        file: PathBuf,
        tensor: String,
        why: String,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    NonFinite(#[from] crate::convert::validate::NonFiniteTensor),
}

/// Size caps for the small files an import reads whole (`config.json`, `generation_config.json`,
/// `chat_template.jinja`; `tokenizer_config.json` and the shard index can legitimately list
/// many tokens / tensors; `tokenizer.json` holds a whole vocabulary).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
pub const MAX_TEMPLATE_FILE_BYTES: u64 = 1 << 20;
pub const MAX_TOKENIZER_CONFIG_BYTES: u64 = 16 << 20;
pub const MAX_INDEX_BYTES: u64 = 16 << 20;
pub const MAX_TOKENIZER_JSON_BYTES: u64 = 64 << 20;

// ---------------------------------------------------------------------------------------------
// Import

fn experts(
    w: &Weights,
    names: &MoeNames,
    c: &ModelConfig,
    q: QuantType,
) -> Result<Vec<ExpertData>, HfError> {
    let (e_n, f, d) = (c.n_experts, c.expert_ffn, c.d_model);
    let per = |k: usize, e: usize| names.per_expert[k].replace("{e}", &e.to_string());
    if w.has(&per(0, 0)) {
        return (0..e_n)
            .map(|e| {
                Ok(ExpertData {
                    gate: w.matrix(&per(0, e), f, d, q)?,
                    up: w.matrix(&per(1, e), f, d, q)?,
                    down: w.matrix(&per(2, e), d, f, q)?,
                })
            })
            .collect();
    }
    if !w.has(&names.fused_gate_up) {
        return Err(w.missing(&per(0, 0)));
    }
    // Stacked layout: gate_up_proj [E, 2F, d] (gate rows first), down_proj [E, d, F].
    let gu = w.shaped(&names.fused_gate_up, &[e_n, 2 * f, d])?;
    let dn = w.shaped(&names.fused_down, &[e_n, d, f])?;
    Ok((0..e_n)
        .map(|e| {
            let g0 = e * 2 * f * d;
            ExpertData {
                gate: MatrixData::quantize(q, f, d, &gu[g0..g0 + f * d]),
                up: MatrixData::quantize(q, f, d, &gu[g0 + f * d..g0 + 2 * f * d]),
                down: MatrixData::quantize(q, d, f, &dn[e * d * f..(e + 1) * d * f]),
            }
        })
        .collect())
}

/// Imports the HuggingFace model directory `dir` into `out` (.cflow), quantizing every matrix
/// to `quant`. `max_ctx` overrides the stored context (default: `max_position_embeddings`,
/// capped at [`DEFAULT_MAX_CTX`]). `progress(done, total)` after each layer.
pub fn import_hf(
    dir: &Path,
    out: &Path,
    quant: QuantType,
    max_ctx: Option<usize>,
    mut progress: impl FnMut(usize, usize),
) -> Result<ModelConfig, HfError> {
    if !dir.is_dir() {
        return Err(HfError::MissingFile {
            dir: dir.to_path_buf(),
            what: "not a directory".into(),
        });
    }
    if !dir.join("config.json").is_file() {
        return Err(HfError::MissingFile {
            dir: dir.to_path_buf(),
            what: "no config.json".into(),
        });
    }
    let w = Weights::open(dir)?;
    let Plan {
        fam,
        mut cfg,
        dense,
        tied,
    } = plan(dir, &w, max_ctx, quant)?;
    load_tokenizer(dir, &mut cfg.meta, cfg.vocab)?;
    let (d, qd, kvd) = (cfg.d_model, cfg.q_dim(), cfg.kv_dim());
    let q = quant;
    let mut wr = CflowWriter::create_for(out, &cfg, &[dir])?;
    let total = cfg.n_layers + 1;
    for i in 0..cfg.n_layers {
        let p = |s: &str| format!("model.layers.{i}.{s}");
        let bias = |s: &str, n: usize| -> Result<Option<Vec<f32>>, HfError> {
            if cfg.qkv_bias() {
                w.vector(&p(s), n).map(Some)
            } else if w.has(&p(s)) {
                Err(HfError::Config {
                    file: dir.join("config.json"),
                    why: format!(
                        "checkpoint has `{}` but the config declares no Q/K/V bias",
                        p(s)
                    ),
                })
            } else {
                Ok(None)
            }
        };
        if w.has(&p("self_attn.o_proj.bias")) {
            return Err(HfError::Unsupported {
                file: dir.join("config.json"),
                arch: cfg.meta.arch.clone(),
                why: "o_proj.bias cannot be stored in .cflow".into(),
            });
        }
        let mut l = LayerData {
            q: w.matrix(&p("self_attn.q_proj.weight"), qd, d, q)?,
            k: w.matrix(&p("self_attn.k_proj.weight"), kvd, d, q)?,
            v: w.matrix(&p("self_attn.v_proj.weight"), kvd, d, q)?,
            o: w.matrix(&p("self_attn.o_proj.weight"), d, qd, q)?,
            q_bias: bias("self_attn.q_proj.bias", qd)?,
            k_bias: bias("self_attn.k_proj.bias", kvd)?,
            v_bias: bias("self_attn.v_proj.bias", kvd)?,
            q_norm: None,
            k_norm: None,
            post_attn_norm: None,
            post_ffn_norm: None,
            shared_gate: None,
            router_bias: None,
            gate: None,
            up: None,
            down: None,
            attn_norm: w.vector(&p("input_layernorm.weight"), d)?,
            ffn_norm: None,
            moe_norm: None,
            router: None,
            experts: Vec::new(),
        };
        if cfg.qk_norm() {
            l.q_norm = Some(w.vector(&p("self_attn.q_norm.weight"), qd)?);
            l.k_norm = Some(w.vector(&p("self_attn.k_norm.weight"), kvd)?);
        }
        if dense {
            l.ffn_norm = Some(w.vector(&p("post_attention_layernorm.weight"), d)?);
            l.gate = Some(w.matrix(&p("mlp.gate_proj.weight"), cfg.d_ff, d, q)?);
            l.up = Some(w.matrix(&p("mlp.up_proj.weight"), cfg.d_ff, d, q)?);
            l.down = Some(w.matrix(&p("mlp.down_proj.weight"), d, cfg.d_ff, q)?);
        }
        if cfg.has_experts() {
            let names = moe_names(fam, i);
            let mut router = names.router.clone();
            if fam == Family::Mixtral && !w.has(&router) && w.has(&p("mlp.gate.weight")) {
                router = p("mlp.gate.weight");
            }
            l.moe_norm = Some(match fam {
                Family::PipelineNative => w.vector(&p("moe_norm.weight"), d)?,
                _ => w.vector(&p("post_attention_layernorm.weight"), d)?,
            });
            l.router = Some(w.shaped(&router, &[cfg.n_experts, d])?);
            l.experts = experts(&w, &names, &cfg, q)?;
        }
        wr.write_layer(&l)?;
        progress(i + 1, total);
    }
    let embedding = w.matrix("model.embed_tokens.weight", cfg.vocab, d, q)?;
    let lm_head = if tied {
        None
    } else {
        Some(w.matrix("lm_head.weight", cfg.vocab, d, q)?)
    };
    let final_norm = w.vector("model.norm.weight", d)?;
    // A shard truncated while mapped reads as zeros (`format::sigbus`): write nothing then.
    if let Some(s) = w.shards.iter().find(|s| s.map.changed()) {
        return Err(HfError::Io {
            file: s.path.clone(),
            source: std::io::Error::other("truncated while it was being imported"),
        });
    }
    wr.finish(
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
