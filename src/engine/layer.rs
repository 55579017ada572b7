//! The per-layer computations shared by decode and prefill: attention of one position, the
//! gated dense FFN, and the LM head (paper §3.7; numerics in `docs/SEMANTICS.md`).

use super::ops::*;
use super::scratch::{DenseScratch, Scratch};
use super::weights::Weights;
use crate::engine::kv::{KvCache, KvLayer};
use crate::format::reader::LayerView;
use crate::kernels::attention;
use crate::kernels::Isa;
use crate::model::{FfnAct, ModelConfig};

/// Biases, Q/K norms (whole projection, or per head), clipping, RoPE and V-norm of one token's
/// Q/K/V at block `p` (the cache rounds K/V to its element type when they are stored). `rope`
/// keeps the RoPE angles between calls.
pub fn qkv_post(
    w: &Weights,
    lv: &LayerView,
    p: usize,
    pos: usize,
    rope: &mut RopeCache,
    [q, k, v]: [&mut [f32]; 3],
) {
    let cfg = w.cfg;
    let hd = cfg.head_dim;
    if let Some(b) = &lv.q_bias {
        add_into(q, b);
    }
    if let Some(b) = &lv.k_bias {
        add_into(k, b);
    }
    if let Some(b) = &lv.v_bias {
        add_into(v, b);
    }
    // OLMoE: RMSNorm over the whole projection (all heads at once), before the split into heads;
    // Gemma 3 (FLAG_QK_NORM_PER_HEAD): over each head.
    let per_head = cfg.qk_norm_per_head();
    for (x, nw) in [(&mut *q, &lv.q_norm), (&mut *k, &lv.k_norm)] {
        if let Some(nw) = nw {
            if per_head {
                for h in x.chunks_exact_mut(hd) {
                    rmsnorm_in_place(h, Some(&nw[..]), cfg.rms_eps);
                }
            } else {
                rmsnorm_in_place(x, Some(&nw[..]), cfg.rms_eps);
            }
        }
    }
    let clip = cfg.meta.clip_qkv;
    if clip > 0.0 {
        for x in q.iter_mut().chain(k.iter_mut()).chain(v.iter_mut()) {
            *x = x.clamp(-clip, clip);
        }
    }
    let rot = cfg.rope_dims();
    let theta = cfg.rope_theta_for(p);
    let style = cfg.meta.rope_style;
    let angles = rope.angles(pos, rot, theta);
    for h in q.chunks_exact_mut(hd).chain(k.chunks_exact_mut(hd)) {
        rope_with(h, angles, style);
    }
    if cfg.v_norm() {
        for h in v.chunks_exact_mut(hd) {
            rmsnorm_in_place(h, None, cfg.rms_eps);
        }
    }
}

/// Multi-head attention of one query (position `pos`) over the cached K/V of step `l`
/// (block `p`).
pub fn attend(
    w: &Weights,
    l: usize,
    p: usize,
    pos: usize,
    kv: &KvCache,
    q: &[f32],
    att: &mut [f32],
) {
    let cfg = w.cfg;
    let win = cfg.sliding_window_for(p);
    let layer = kv.layer(l);
    // Rows are positions from the layer's first kept one ([`KvLayer::base`]).
    let pos = pos - layer.base();
    let sh = attention::AttnShape {
        start: attention::AttnShape::window_start(pos, win),
        ..attn_shape(cfg, pos, layer.cap())
    };
    match layer {
        KvLayer::F32 { k, v, .. } => attention::attend(w.pool, w.isa, &sh, q, k, v, att),
        KvLayer::F16 { k, v, .. } => attention::attend(w.pool, w.isa, &sh, q, k, v, att),
        KvLayer::Bf16 { k, v, .. } => attention::attend(w.pool, w.isa, &sh, q, k, v, att),
    }
}

/// The model's attention geometry for a query at `pos` attending from position 0, over a
/// head-major cache of `cap` rows per KV head ([`KvLayer`]).
fn attn_shape(cfg: &ModelConfig, pos: usize, cap: usize) -> attention::AttnShape {
    attention::AttnShape {
        row_stride: cfg.head_dim,
        head_stride: cap * cfg.head_dim,
        n_heads: cfg.n_heads,
        group: cfg.n_heads / cfg.n_kv_heads,
        head_dim: cfg.head_dim,
        kv_dim: cfg.kv_dim(),
        start: 0,
        pos,
        scale: cfg.attn_scale(),
        cap: cfg.meta.attn_logit_softcap,
    }
}

/// [`attend`] for the queries of positions `rows` (rows of `q` and `att`, in order), all in one
/// pool run (prefill). With AVX-512 the block kernel runs (equal to one `attend` per position to
/// rounding); with `--act q8` (`w.q8`) its BF16 build where the CPU has AVX512-BF16.
pub fn attend_batch(
    w: &Weights,
    l: usize,
    p: usize,
    rows: std::ops::Range<usize>,
    kv: &KvCache,
    q: &[f32],
    att: &mut [f32],
) {
    let cfg = w.cfg;
    let layer = kv.layer(l);
    let (pos0, n) = (rows.start - layer.base(), rows.len());
    let sh = attn_shape(cfg, pos0, layer.cap());
    let b = attention::Batch {
        window: cfg.sliding_window_for(p),
        pos0,
        n,
        bf16: w.q8,
    };
    let (pool, isa) = (w.pool, w.isa);
    match layer {
        KvLayer::F32 { k, v, .. } => {
            attention::attend_batch(pool, isa, &sh, b, q, attention::Kv { k, v }, att)
        }
        KvLayer::F16 { k, v, .. } => {
            attention::attend_batch(pool, isa, &sh, b, q, attention::Kv { k, v }, att)
        }
        KvLayer::Bf16 { k, v, .. } => {
            attention::attend_batch(pool, isa, &sh, b, q, attention::Kv { k, v }, att)
        }
    }
}

/// `s.attn_out = PostNorm(Attn_p(Norm(s.x)))` at step `l` (PostNorm only with
/// `FLAG_POST_NORMS`); stores this position's K/V.
pub fn attention(
    w: &Weights,
    lv: &LayerView,
    l: usize,
    p: usize,
    pos: usize,
    kv: &mut KvCache,
    s: &mut Scratch,
) {
    rmsnorm(&mut s.xb, &s.x, Some(&lv.attn_norm), w.cfg.rms_eps);
    w.mv(
        p,
        None,
        &mut s.xq,
        &s.xb,
        &mut [(&lv.q, &mut s.q), (&lv.k, &mut s.k), (&lv.v, &mut s.v)],
    );
    qkv_post(w, lv, p, pos, &mut s.rope, [&mut s.q, &mut s.k, &mut s.v]);
    kv.store(l, pos, &s.k, &s.v);
    attend(w, l, p, pos, kv, &s.q, &mut s.att);
    w.mv(p, None, &mut s.xq, &s.att, &mut [(&lv.o, &mut s.attn_out)]);
    if let Some(nw) = &lv.post_attn_norm {
        rmsnorm_in_place(&mut s.attn_out, Some(nw), w.cfg.rms_eps);
    }
}

/// g ← act(g) · u (the formulas and their SIMD kernels: `kernels::act`).
pub fn gated(isa: Isa, act: FfnAct, g: &mut [f32], u: &[f32]) {
    match act {
        FfnAct::Swiglu => crate::kernels::act::silu_mul(isa, g, u),
        FfnAct::Geglu => crate::kernels::act::gelu_mul(isa, g, u),
    }
}

/// `ds.out = PostNorm(FFN_p(Norm(src)))`, the gated dense FFN of block `p` (PostNorm only with
/// `FLAG_POST_NORMS`). With a shared-expert gate (Qwen2-MoE) the output is scaled by
/// σ(w_g · Norm(src)) ([`shared_gate_scale`]).
pub fn dense(w: &Weights, lv: &LayerView, p: usize, src: &[f32], ds: &mut DenseScratch) {
    rmsnorm(&mut ds.xb, src, lv.ffn_norm.as_deref(), w.cfg.rms_eps);
    let gate_scale = lv
        .shared_gate
        .as_deref()
        .map(|g| shared_gate_scale(g, &ds.xb));
    let (g, u, dn) = (
        lv.gate.as_ref().expect("dense"),
        lv.up.as_ref().expect("dense"),
        lv.down.as_ref().expect("dense"),
    );
    w.mv(
        p,
        None,
        &mut ds.xq,
        &ds.xb,
        &mut [(g, &mut ds.hb), (u, &mut ds.hb2)],
    );
    gated(w.isa, w.cfg.meta.ffn_act, &mut ds.hb, &ds.hb2);
    w.mv(p, None, &mut ds.xq, &ds.hb, &mut [(dn, &mut ds.out)]);
    dense_finish(w, lv, gate_scale, ds);
}

/// The end of [`dense`] on `ds.out`: the shared-expert gate's scale, then the PostNorm.
pub fn dense_finish(w: &Weights, lv: &LayerView, gate_scale: Option<f32>, ds: &mut DenseScratch) {
    if let Some(k) = gate_scale {
        ds.out.iter_mut().for_each(|v| *v *= k);
    }
    if let Some(nw) = &lv.post_ffn_norm {
        rmsnorm_in_place(&mut ds.out, Some(nw), w.cfg.rms_eps);
    }
}

/// The shared expert's gate (Qwen2-MoE `shared_expert_gate`): σ(w_g · x̂), x̂ the FFN's
/// normalized input (the same input the shared expert and the router read).
pub fn shared_gate_scale(gate: &[f32], xb: &[f32]) -> f32 {
    let z: f32 = gate.iter().zip(xb).map(|(a, b)| a * b).sum();
    1.0 / (1.0 + (-z).exp())
}

/// Bytes of a block's attention weights.
pub fn attn_bytes(lv: &LayerView) -> u64 {
    (lv.q.bytes() + lv.k.bytes() + lv.v.bytes() + lv.o.bytes()) as u64
}

/// Bytes of a block's dense FFN weights (0 without one).
pub fn dense_bytes(lv: &LayerView) -> u64 {
    [&lv.gate, &lv.up, &lv.down]
        .iter()
        .map(|m| m.as_ref().map_or(0, |m| m.bytes()))
        .sum::<usize>() as u64
}

/// `s.logits = softcap(LMHead(Norm(s.x)))`; returns the bytes read.
pub fn lm_head(w: &Weights, s: &mut Scratch) -> u64 {
    let (cfg, file) = (w.cfg, w.file);
    rmsnorm(&mut s.xb, &s.x, Some(&file.vocab.final_norm), cfg.rms_eps);
    let lm = file.lm_head();
    w.mv(
        usize::MAX,
        None,
        &mut s.xq,
        &s.xb,
        &mut [(lm, &mut s.logits)],
    );
    let cap = cfg.final_logit_softcap;
    if cap > 0.0 {
        s.logits
            .iter_mut()
            .for_each(|v| *v = cap * (*v / cap).tanh());
    }
    lm.bytes() as u64
}
