//! The per-token working memory of the decode loop, allocated once per engine. Shapes are in
//! model dimensions: d = `d_model`, q = `q_dim`, kv = `kv_dim`, ff = `d_ff`, eff = `expert_ffn`,
//! V = `vocab`. The dense FFN and the experts keep their buffers in their own structs so that
//! the vertical schedule can hand a second set to the core that runs them.

use super::ops::RopeCache;
use crate::kernels::Q8Act;
use crate::model::ModelConfig;

/// Buffers of the attention and the residual streams (main core).
#[derive(Default)]
pub struct Scratch {
    /// [d] the residual stream x (DecoupledStreams: s_attn; PipelineRegisters: attn_reg).
    pub x: Vec<f32>,
    /// [d] x_mid = x + Attn(Norm(x)), the post-attention residual.
    pub xa: Vec<f32>,
    /// [d] the normalized input of the attention and of the LM head.
    pub xb: Vec<f32>,
    /// [q] queries after RoPE.
    pub q: Vec<f32>,
    /// [kv] this position's key (stored into the KV cache).
    pub k: Vec<f32>,
    /// [kv] this position's value.
    pub v: Vec<f32>,
    /// [q] attention output per head, before the output projection.
    pub att: Vec<f32>,
    /// [d] Attn(Norm(x)) after the output projection.
    pub attn_out: Vec<f32>,
    /// [d] the second stream: DecoupledStreams `s_ffn` (eq. 4.18), PipelineRegisters `xfm_reg`
    /// (eq. 4.21).
    pub sf: Vec<f32>,
    /// [d] FixedPoint `x_block`: the input of the current block, fixed across its iterations
    /// (eq. 4.22).
    pub base: Vec<f32>,
    /// [V] logits of the last step.
    pub logits: Vec<f32>,
    /// Q8 copy of the current matvec input.
    pub xq: Q8Act,
    /// RoPE angles of the current position (computed once per token and base).
    pub rope: RopeCache,
    /// The dense FFN's buffers (main core under the sequential schedule).
    pub dense: DenseScratch,
    /// Per layer, what its dense FFN saw at the last step (`Engine::set_ffn_capture`).
    pub capture: Option<Vec<super::capture::FfnCapture>>,
    /// The experts' buffers (main core under the sequential schedule).
    pub experts: ExpertScratch,
}

/// Buffers of one dense FFN evaluation.
#[derive(Default)]
pub struct DenseScratch {
    /// [d] Norm(input).
    pub xb: Vec<f32>,
    /// [ff] gate projection, then act(gate) · up.
    pub hb: Vec<f32>,
    /// [ff] up projection.
    pub hb2: Vec<f32>,
    /// [d] the FFN output f_ℓ.
    pub out: Vec<f32>,
    /// Q8 copy of the current matvec input.
    pub xq: Q8Act,
}

/// Buffers of one routed expert evaluation.
#[derive(Default)]
pub struct ExpertScratch {
    /// [eff] gate projection, then act(gate) · up.
    pub eh: Vec<f32>,
    /// [eff] up projection.
    pub eh2: Vec<f32>,
    /// [d] one expert's output.
    pub eo: Vec<f32>,
    /// [d] Σ_k w_k · expert_k, the routed output e_ℓ.
    pub acc: Vec<f32>,
    /// Q8 copy of the current matvec input.
    pub xq: Q8Act,
    /// The fused evaluation of all selected experts (`moe::run_experts`): one slot per
    /// selected expert, grown on first use.
    pub slots: Vec<ExpertSlot>,
    /// Q8 copies of the slots' hidden activations (the down projections' inputs).
    pub slot_xq: Vec<Q8Act>,
    /// [d] a router's input `N_m(x)` while route-ahead selects (reused, not allocated per layer).
    pub router_in: Vec<f32>,
    /// A route-ahead selection made as a task of this step's fused FFN run (`moe::RouteAhead`):
    /// (the layer it selects for, its selection), taken by the step's `route_ahead`.
    pub ahead: Option<(usize, Vec<(usize, f32)>)>,
}

/// Buffers of one selected expert in the fused evaluation.
#[derive(Default)]
pub struct ExpertSlot {
    /// [eff] gate projection, then act(gate) · up.
    pub h: Vec<f32>,
    /// [eff] up projection.
    pub h2: Vec<f32>,
    /// [d] the expert's output.
    pub o: Vec<f32>,
}

impl ExpertScratch {
    /// Makes sure there are `k` slots for experts of hidden width `eff` and model width `d`.
    pub fn ensure_slots(&mut self, k: usize, eff: usize, d: usize) {
        while self.slots.len() < k {
            self.slots.push(ExpertSlot {
                h: vec![0.0; eff],
                h2: vec![0.0; eff],
                o: vec![0.0; d],
            });
            self.slot_xq.push(Q8Act::default());
        }
    }
}

impl DenseScratch {
    pub fn new(cfg: &ModelConfig) -> DenseScratch {
        let d = cfg.d_model;
        DenseScratch {
            xb: vec![0.0; d],
            hb: vec![0.0; cfg.d_ff],
            hb2: vec![0.0; cfg.d_ff],
            out: vec![0.0; d],
            xq: Q8Act::default(),
        }
    }
}

impl ExpertScratch {
    pub fn new(cfg: &ModelConfig) -> ExpertScratch {
        let d = cfg.d_model;
        ExpertScratch {
            eh: vec![0.0; cfg.expert_ffn],
            eh2: vec![0.0; cfg.expert_ffn],
            eo: vec![0.0; d],
            acc: vec![0.0; d],
            xq: Q8Act::default(),
            slots: Vec::new(),
            slot_xq: Vec::new(),
            router_in: vec![0.0; d],
            ahead: None,
        }
    }
}

impl Scratch {
    pub fn new(cfg: &ModelConfig) -> Scratch {
        let d = cfg.d_model;
        Scratch {
            x: vec![0.0; d],
            xa: vec![0.0; d],
            xb: vec![0.0; d],
            q: vec![0.0; cfg.q_dim()],
            k: vec![0.0; cfg.kv_dim()],
            v: vec![0.0; cfg.kv_dim()],
            att: vec![0.0; cfg.q_dim()],
            attn_out: vec![0.0; d],
            sf: vec![0.0; d],
            base: vec![0.0; d],
            logits: vec![0.0; cfg.vocab],
            xq: Q8Act::default(),
            rope: RopeCache::default(),
            dense: DenseScratch::new(cfg),
            capture: None,
            experts: ExpertScratch::new(cfg),
        }
    }
}

/// The working memory of batched prefill (`Engine::forward_batch`): one row per token of the
/// batch. Kept by the engine between batches so that a prompt's chunks reuse it (allocating
/// ~1 MB per chunk cost page zeroing and allocator time, ~10% of SmolLM2's prefill).
#[derive(Default)]
pub struct BatchScratch {
    /// [n·d] residual stream, [n·d] normalized input, [n·d] projection output.
    pub x: Vec<f32>,
    pub xb: Vec<f32>,
    pub o: Vec<f32>,
    /// [n·q] queries, [n·kv] keys and values, [n·q] attention output.
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub att: Vec<f32>,
    /// [n·ff] gate (then the gated activation) and up projections.
    pub g: Vec<f32>,
    pub u: Vec<f32>,
    /// Q8 copies of the current batched matvec input, one per token.
    pub xq: Vec<Q8Act>,
    /// RoPE frequencies per base (the angles change with every position of the batch).
    pub rope: RopeCache,
}

/// The most bytes of f32 batch buffers ([`BatchScratch::f32_bytes_per_token`] × tokens) that
/// [`BatchScratch::tokens_per_batch`] allows.
pub const BATCH_BUFFER_BUDGET: usize = 4 << 20;

impl BatchScratch {
    /// Floats per token of each f32 buffer, in the order x, xb, o, q, k, v, att, g, u.
    fn widths(cfg: &ModelConfig) -> [usize; 9] {
        let (d, qd, kvd, ff) = (cfg.d_model, cfg.q_dim(), cfg.kv_dim(), cfg.d_ff);
        [d, d, d, qd, kvd, kvd, qd, ff, ff]
    }

    /// Bytes of the f32 buffers [`Self::resize`] holds per token of `cfg`.
    pub fn f32_bytes_per_token(cfg: &ModelConfig) -> usize {
        4 * Self::widths(cfg).iter().sum::<usize>()
    }

    /// Tokens per prefill batch: 128, or 64 when 128 tokens' f32 buffers would pass
    /// [`BATCH_BUFFER_BUDGET`]. Each batch streams every weight once per thread's token range,
    /// so a larger batch reads fewer weight bytes per token and pays the per-batch serial work
    /// less often. Intel guest, AMX kernels (1c51db1), pp256 at 1 / 2 threads, two alternating
    /// runs: SmolLM2 Q4_0 1100–1104 / 1613–1623 tok/s at 64 and 1104–1158 / 1737–1758 at 128;
    /// Q6_K 916–924 / 1379–1400 and 974–976 / 1545–1554. Gemma 3 (34 KiB of buffers per
    /// token, 4.4 MiB at 128) peaked at 384,880 KiB with 128 against llama.cpp's 386,544 and
    /// 380,076 KiB with 64 (`cflow-tui run -c 4096`, 4,080-token prompt), so it keeps 64.
    pub fn tokens_per_batch(cfg: &ModelConfig) -> usize {
        if 128 * Self::f32_bytes_per_token(cfg) <= BATCH_BUFFER_BUDGET {
            128
        } else {
            64
        }
    }

    /// Sizes every buffer for `n` tokens of `cfg` (contents unspecified; capacity is kept).
    pub fn resize(&mut self, cfg: &ModelConfig, n: usize) {
        let bufs = [
            &mut self.x,
            &mut self.xb,
            &mut self.o,
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.att,
            &mut self.g,
            &mut self.u,
        ];
        for (b, w) in bufs.into_iter().zip(Self::widths(cfg)) {
            b.resize(n * w, 0.0);
        }
    }
}
