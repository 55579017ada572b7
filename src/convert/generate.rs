//! Deterministic synthetic model generator (`cflow-tui gen`): the paper's candidate
//! architectures (arch1 … arch5) plus plain Llama and Mixtral shapes, with random weights from a
//! seeded generator, so the same seed always gives byte-identical files.

use crate::format::{CflowWriter, ExpertData, FormatError, LayerData, MatrixData, VocabData};
use crate::model::{CombineStyle, ModelConfig, ModelMeta, RopeStyle, FLAG_TIED_EMBED};
use crate::quant::QuantType;
use crate::rng::Rng;
use std::path::Path;

/// The architectures `gen` knows.
pub const ARCHS: [&str; 9] = [
    "parallel_sqrt2",
    "arch1",
    "arch2_4_combined",
    "arch2_4_sync",
    "arch3",
    "arch4_async_experts",
    "arch5",
    "llama",
    "mixtral",
];

/// What to generate. `None` geometry fields take the paper's nominal values.
#[derive(Clone, Debug)]
pub struct GenSpec {
    pub arch: String,
    pub seed: u64,
    pub layers: Option<usize>,
    pub hidden: Option<usize>,
    pub heads: Option<usize>,
    pub kv_heads: Option<usize>,
    pub ffn: Option<usize>,
    pub experts: Option<usize>,
    pub top_k: Option<usize>,
    pub expert_ffn: Option<usize>,
    pub vocab: Option<usize>,
    pub ctx: Option<usize>,
    pub quant: QuantType,
    pub tied: bool,
    pub tokenizer_json: Option<String>,
    /// Chat template stored in the metadata (none: chat uses ChatML).
    pub chat_template: Option<String>,
}

impl GenSpec {
    pub fn new(arch: &str) -> GenSpec {
        GenSpec {
            arch: arch.to_string(),
            seed: 0,
            layers: None,
            hidden: None,
            heads: None,
            kv_heads: None,
            ffn: None,
            experts: None,
            top_k: None,
            expert_ffn: None,
            vocab: None,
            ctx: None,
            quant: QuantType::Q4_0,
            tied: false,
            tokenizer_json: None,
            chat_template: None,
        }
    }

    /// The model configuration this spec produces (validates the combination).
    pub fn config(&self) -> Result<ModelConfig, String> {
        // (style, dense delay, expert delay, MoE?, dense?)
        let (style, dd, de, moe, dense) = match self.arch.as_str() {
            "parallel_sqrt2" => (CombineStyle::ParallelSqrt2, 0, 0, true, true),
            "arch1" => (CombineStyle::DecoupledStreams, 0, 0, true, true),
            "arch2_4_combined" => (CombineStyle::DelayedSum, 1, 2, true, true),
            "arch2_4_sync" => (CombineStyle::DelayedSum, 1, 0, true, true),
            "arch3" => (CombineStyle::PipelineRegisters, 0, 0, true, true),
            "arch4_async_experts" => (CombineStyle::AsyncExperts, 0, 2, true, true),
            "arch5" => (CombineStyle::FixedPoint, 0, 0, true, true),
            "llama" => (CombineStyle::Sequential, 0, 0, false, true),
            "mixtral" => (CombineStyle::Sequential, 0, 0, true, false),
            other => {
                return Err(format!(
                    "unknown arch `{other}`; known: {}",
                    ARCHS.join(", ")
                ))
            }
        };
        let d = self.hidden.unwrap_or(512);
        let heads = self.heads.unwrap_or(8);
        let kv = self.kv_heads.unwrap_or(heads);
        let default_layers = if style == CombineStyle::FixedPoint {
            2
        } else {
            6
        };
        let n_layers = self.layers.unwrap_or(default_layers);
        let experts = if moe { self.experts.unwrap_or(8) } else { 0 };
        let top_k = if moe { self.top_k.unwrap_or(2) } else { 0 };
        let d_ff = if dense { self.ffn.unwrap_or(4 * d) } else { 0 };
        let expert_ffn = if moe { self.expert_ffn.unwrap_or(d) } else { 0 };
        if d == 0 || !d.is_multiple_of(32) || heads == 0 || !d.is_multiple_of(heads) {
            return Err(format!(
                "--hidden {d} must be a positive multiple of 32 and of --heads {heads}"
            ));
        }
        if kv == 0 || !heads.is_multiple_of(kv) {
            return Err(format!("--kv-heads {kv} must divide --heads {heads}"));
        }
        if !(d / heads).is_multiple_of(2) {
            return Err("head dimension must be even".into());
        }
        if d_ff % 32 != 0 || expert_ffn % 32 != 0 {
            return Err("--ffn and --expert-ffn must be multiples of 32".into());
        }
        let bl = self.quant.block_len();
        if [d, d_ff, expert_ffn].iter().any(|n| !n.is_multiple_of(bl)) {
            return Err(format!(
                "--hidden, --ffn and --expert-ffn must be multiples of {bl} for {}",
                self.quant
            ));
        }
        if top_k > experts || experts > 255 {
            return Err(format!(
                "--top-k {top_k} must be <= --experts {experts} <= 255"
            ));
        }
        if n_layers == 0 || n_layers > 4096 {
            return Err("--layers must be in 1..=4096".into());
        }
        if dd >= n_layers {
            return Err(format!("{}: needs more than {dd} layers", self.arch));
        }
        let meta = ModelMeta {
            arch: self.arch.clone(),
            name: self.arch.clone(),
            synthetic: true,
            rope_style: RopeStyle::SplitHalf,
            eos_ids: if self.tokenizer_json.is_some() {
                vec![50256]
            } else {
                vec![]
            },
            tokenizer_json: self.tokenizer_json.as_deref().map(std::sync::Arc::from),
            chat_template: self.chat_template.clone(),
            provenance: serde_json::json!({"generator": "cflow-tui gen", "seed": self.seed}),
            ..Default::default()
        };
        Ok(ModelConfig {
            n_layers,
            d_model: d,
            n_heads: heads,
            n_kv_heads: kv,
            head_dim: d / heads,
            d_ff,
            n_experts: experts,
            top_k,
            expert_ffn,
            vocab: self.vocab.unwrap_or(50257),
            max_ctx: self.ctx.unwrap_or(2048),
            rms_eps: 1e-5,
            rope_theta: 10000.0,
            dense_delay: dd,
            expert_delay: de,
            combine_style: style,
            feature_flags: if self.tied { FLAG_TIED_EMBED } else { 0 },
            final_logit_softcap: 0.0,
            meta,
        })
    }
}

fn mat(rng: &mut Rng, q: QuantType, rows: usize, cols: usize) -> MatrixData {
    let w = rng.fill(rows * cols, 1.0 / (cols as f32).sqrt());
    MatrixData::quantize(q, rows, cols, &w)
}

/// Builds the data of one layer (deterministic given the generator state).
pub fn gen_layer(rng: &mut Rng, c: &ModelConfig, q: QuantType) -> LayerData {
    let d = c.d_model;
    let norm = |rng: &mut Rng| -> Vec<f32> { rng.fill(d, 0.05).iter().map(|v| 1.0 + v).collect() };
    let attn_norm = norm(rng);
    let qm = mat(rng, q, c.q_dim(), d);
    let km = mat(rng, q, c.kv_dim(), d);
    let vm = mat(rng, q, c.kv_dim(), d);
    let om = mat(rng, q, d, c.q_dim());
    let (mut gate, mut up, mut down, mut ffn_norm) = (None, None, None, None);
    if c.has_dense() {
        ffn_norm = Some(norm(rng));
        gate = Some(mat(rng, q, c.d_ff, d));
        up = Some(mat(rng, q, c.d_ff, d));
        down = Some(mat(rng, q, d, c.d_ff));
    }
    let (mut router, mut moe_norm, mut experts) = (None, None, Vec::new());
    if c.has_experts() {
        moe_norm = Some(norm(rng));
        router = Some(rng.fill(c.n_experts * d, 1.0 / (d as f32).sqrt()));
        for _ in 0..c.n_experts {
            experts.push(ExpertData {
                gate: mat(rng, q, c.expert_ffn, d),
                up: mat(rng, q, c.expert_ffn, d),
                down: mat(rng, q, d, c.expert_ffn),
            });
        }
    }
    LayerData {
        q: qm,
        k: km,
        v: vm,
        o: om,
        q_bias: None,
        k_bias: None,
        v_bias: None,
        q_norm: None,
        k_norm: None,
        post_attn_norm: None,
        post_ffn_norm: None,
        shared_gate: None,
        router_bias: None,
        gate,
        up,
        down,
        attn_norm,
        ffn_norm,
        moe_norm,
        router,
        experts,
    }
}

/// Builds the vocabulary data.
pub fn gen_vocab(rng: &mut Rng, c: &ModelConfig, q: QuantType) -> VocabData {
    let embedding = mat(rng, q, c.vocab, c.d_model);
    let lm_head = if c.tied_embeddings() {
        None
    } else {
        Some(mat(rng, q, c.vocab, c.d_model))
    };
    VocabData {
        embedding,
        lm_head,
        final_norm: vec![1.0; c.d_model],
    }
}

/// Generates the model described by `spec` into `out`; `progress(done, total)` after each layer.
pub fn generate(
    spec: &GenSpec,
    out: &Path,
    mut progress: impl FnMut(usize, usize),
) -> Result<ModelConfig, FormatError> {
    let cfg = spec.config().map_err(FormatError::Invalid)?;
    let mut rng = Rng::new(spec.seed);
    let mut w = CflowWriter::create(out, &cfg)?;
    let total = cfg.n_layers + 1;
    for i in 0..cfg.n_layers {
        let l = gen_layer(&mut rng, &cfg, spec.quant);
        w.write_layer(&l)?;
        progress(i + 1, total);
    }
    let v = gen_vocab(&mut rng, &cfg, spec.quant);
    w.finish(&v, &cfg.meta)?;
    progress(total, total);
    Ok(cfg)
}
