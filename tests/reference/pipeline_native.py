#!/usr/bin/env python3
"""Independent PyTorch reference for every combine style of docs/SEMANTICS.md.

Builds one tiny checkpoint per pipeline-native architecture in the `PipelineNativeForCausalLM`
schema of docs/FORMAT.md (config.json + model.safetensors, bf16 weights): fixed-seed random
init, then a few hundred Adam steps of training (through this file's own forward pass) on the
synthetic Markov-chain corpus of synthetic_corpus.py — why: top-1 agreement of quantized imports
is only meaningful when the golden top-1/top-2 margins exceed quantization noise, as in trained
models; random-init models have near-ties. The weights are then rounded to bf16, and the
reference forward pass runs in float32 over a 16-token HELD-OUT sequence of the corpus (not a
training sequence; layer-major: every position of a layer before the next layer; causal
attention over the sequence, so no KV cache object) and writes goldens.json:

* `logits`: [16][vocab]
* `final_norms`: [16] — L2 norm of the final hidden state (before the final norm)
* `prefix_norms`: [k][16] for k = 1 .. n_layers physical layers: the final-hidden norms of the
  model truncated to its first k physical layers (every scheduler rule — delays, clamped
  injection, register flush, last merge — applied to the shorter stack). For Sequential models
  this is exactly the per-layer residual norm.
* `layer_norms`: [effective layers][16] — the residual `x` after each effective layer of the
  full model (informative; DecoupledStreams: the attention stream).
* `train_loss`: [first step, last step]; `margins`: golden top-1 minus top-2 logit per position.

The forward pass takes a leading batch dimension (training) or none (goldens). Experts are
evaluated densely and weighted by the routing weights, which are zero for unselected experts —
the same sum as evaluating only the selected ones.

This file shares no code with the Rust engine or tests/engine_styles.rs.
Usage: python tests/reference/pipeline_native.py [OUT_DIR]   (default tests/reference/hf)
Deterministic for a given torch version (fixed seeds, one CPU thread); about a minute on a CPU.
"""
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file
from synthetic_corpus import Corpus, margins, train

SEQ = 16  # golden positions

GEOM = dict(
    vocab_size=128,
    hidden_size=32,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    intermediate_size=64,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    hidden_act="silu",
)

# variant: (combine_style, dense_delay, expert_delay, physical layers, extra)
ARCHS = {
    "parallel_sqrt2": ("parallel_sqrt2", 0, 0, 4, {}),
    "arch1": ("decoupled_streams", 0, 0, 4, {"merge_interval": 3}),
    "arch2_4_combined": ("delayed_sum", 1, 2, 4, {}),
    "arch2_4_sync": ("delayed_sum", 1, 0, 4, {}),
    "arch3": ("pipeline_registers", 0, 0, 4, {"router_norm": "softmax_all"}),
    "arch4_async_experts": ("async_experts", 0, 2, 4, {}),
    "arch5": ("fixed_point", 0, 0, 2, {"fixed_point_iterations": 3}),
}


def make_weights(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    d, hd = cfg["hidden_size"], cfg["head_dim"]
    qd, kvd = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    f, E, fe = cfg["intermediate_size"], cfg["num_experts"], cfg["moe_intermediate_size"]
    V = cfg["vocab_size"]

    def lin(o, i):
        return torch.randn(o, i, generator=g) / math.sqrt(i)

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    w = {"model.embed_tokens.weight": torch.randn(V, d, generator=g)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(d)
        w[p + "self_attn.q_proj.weight"] = lin(qd, d)
        w[p + "self_attn.k_proj.weight"] = lin(kvd, d)
        w[p + "self_attn.v_proj.weight"] = lin(kvd, d)
        w[p + "self_attn.o_proj.weight"] = lin(d, qd)
        if f > 0:
            w[p + "post_attention_layernorm.weight"] = norm(d)
            w[p + "mlp.gate_proj.weight"] = lin(f, d)
            w[p + "mlp.up_proj.weight"] = lin(f, d)
            w[p + "mlp.down_proj.weight"] = lin(d, f)
        if E > 0:
            w[p + "moe_norm.weight"] = norm(d)
            w[p + "moe.router.weight"] = lin(E, d)
            for e in range(E):
                q = p + f"moe.experts.{e}."
                w[q + "gate_proj.weight"] = lin(fe, d)
                w[q + "up_proj.weight"] = lin(fe, d)
                w[q + "down_proj.weight"] = lin(d, fe)
    w["model.norm.weight"] = norm(d)
    w["lm_head.weight"] = lin(V, d)
    return w


# ----------------------------------------------------------------------------- building blocks


def rms(x, w, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


def rope_split_half(x, theta):
    # x: [..., T, heads, hd]; pairs (i, i + hd/2), angle pos * theta^(-2i/hd)
    T, _, hd = x.shape[-3:]
    half = hd // 2
    inv = theta ** (-torch.arange(0, half, dtype=torch.float64) * 2.0 / hd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    c, s = ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def attention(x, W, p, cfg):
    lead, T = x.shape[:-2], x.shape[-2]
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    pre = f"model.layers.{p}."
    xn = rms(x, W[pre + "input_layernorm.weight"], cfg["rms_norm_eps"])
    q = (xn @ W[pre + "self_attn.q_proj.weight"].T).view(*lead, T, H, hd)
    k = (xn @ W[pre + "self_attn.k_proj.weight"].T).view(*lead, T, KV, hd)
    v = (xn @ W[pre + "self_attn.v_proj.weight"].T).view(*lead, T, KV, hd)
    q, k = rope_split_half(q, cfg["rope_theta"]), rope_split_half(k, cfg["rope_theta"])
    rep = H // KV
    k, v = k.repeat_interleave(rep, dim=-2), v.repeat_interleave(rep, dim=-2)
    scores = torch.einsum("...thd,...uhd->...htu", q, k) / math.sqrt(hd)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(-1)
    out = torch.einsum("...htu,...uhd->...thd", probs, v).reshape(*lead, T, H * hd)
    return out @ W[pre + "self_attn.o_proj.weight"].T


def gated_ffn(u, g, up, down):
    return (torch.nn.functional.silu(u @ g.T) * (u @ up.T)) @ down.T


def dense(src, W, p, cfg):
    pre = f"model.layers.{p}."
    u = rms(src, W[pre + "post_attention_layernorm.weight"], cfg["rms_norm_eps"])
    return gated_ffn(u, W[pre + "mlp.gate_proj.weight"], W[pre + "mlp.up_proj.weight"], W[pre + "mlp.down_proj.weight"])


def route(src, W, p, cfg):
    """Returns (u, idx [..., k], weights [..., k]); top-k by logit, ties to the lower expert id."""
    pre = f"model.layers.{p}."
    u = rms(src, W[pre + "moe_norm.weight"], cfg["rms_norm_eps"])
    logits = u @ W[pre + "moe.router.weight"].T
    k = cfg["num_experts_per_tok"]
    idx = torch.sort(-logits, dim=-1, stable=True).indices[..., :k]
    if cfg.get("router_norm", "softmax_topk") == "softmax_all":
        wts = logits.softmax(-1).gather(-1, idx)
    else:
        wts = logits.gather(-1, idx).softmax(-1)
    return u, idx, wts


def run_experts(u, idx, wts, W, p, cfg):
    """Σ over the selected experts of weight × expert(u), per position."""
    pre = f"model.layers.{p}.moe.experts."
    out = torch.zeros_like(u)
    for e in range(cfg["num_experts"]):
        w_e = (wts * (idx == e)).sum(-1, keepdim=True)  # 0 where e is not selected
        q = f"{pre}{e}."
        y = gated_ffn(u, W[q + "gate_proj.weight"], W[q + "up_proj.weight"], W[q + "down_proj.weight"])
        out = out + w_e * y
    return out


# ----------------------------------------------------------------------------- the scheduler


def forward(W, cfg, tokens, n_phys):
    style = cfg["combine_style"]
    iters = cfg.get("fixed_point_iterations", 3) if style == "fixed_point" else 1
    Le = n_phys * iters
    dd, de = cfg["dense_delay"], cfg["expert_delay"]
    has_dense = cfg["intermediate_size"] > 0
    has_exp = cfg["num_experts"] > 0
    s = 1.0 / math.sqrt(2.0) if style == "parallel_sqrt2" and has_dense and has_exp else 1.0
    x = W["model.embed_tokens.weight"][torch.as_tensor(tokens)].clone()
    zeros = torch.zeros_like(x)
    f = x.clone()  # DecoupledStreams FFN stream
    base = x.clone()
    r = torch.zeros_like(x)  # PipelineRegisters register
    hist = []  # residual entering each effective layer (FFN stream for DecoupledStreams)
    pending = [[] for _ in range(Le)]
    layer_norms = []
    for l in range(Le):
        p = l // iters
        hist.append(f.clone() if style == "decoupled_streams" else x.clone())
        A = attention(x, W, p, cfg)
        a = x + A
        if has_dense:
            if dd > 0:
                D = hist[l - dd] if l >= dd else zeros
            elif style == "delayed_sum":
                D = x
            elif style == "decoupled_streams":
                D = f
            else:
                D = a
            F = dense(D, W, p, cfg)
        else:
            F = zeros
        if has_exp:
            src = x if style == "async_experts" else f if style == "decoupled_streams" else a
            u, idx, wts = route(src, W, p, cfg)
            pending[min(l + de, Le - 1)].append((p, u, idx, wts))
        if style == "decoupled_streams":
            x = x + A
            f = f + F
        elif style == "pipeline_registers":
            x = a + r
            r = F
        else:
            x = a + s * F
        for (q, u, idx, wts) in pending[l]:
            y = run_experts(u, idx, wts, W, q, cfg)
            if style == "decoupled_streams":
                f = f + s * y
            elif style == "pipeline_registers":
                r = r + s * y
            else:
                x = x + s * y
        if style == "decoupled_streams":
            mi = cfg.get("merge_interval", 3)
            if (l + 1) % mi == 0 or l + 1 == Le:
                m = base + (x - base) + (f - base)
                x, f, base = m.clone(), m.clone(), m.clone()
        layer_norms.append(x.norm(dim=-1).tolist())
    if style == "pipeline_registers":
        x = x + r
    h = rms(x, W["model.norm.weight"], cfg["rms_norm_eps"])
    logits = h @ W["lm_head.weight"].T
    return x, logits, layer_norms


def fit(W, cfg, corpus, seed):
    """Trains the f32 weights `W` in place; returns [first loss, last loss]."""
    params = [W[k].requires_grad_(True) for k in sorted(W)]
    L = cfg["num_hidden_layers"]

    def loss_fn(x):
        _, logits, _ = forward(W, cfg, x, L)
        V = logits.shape[-1]
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1))

    loss = train(params, loss_fn, corpus, seed)
    for p in params:
        p.requires_grad_(False)
    return list(loss)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "hf")
    torch.set_num_threads(1)
    corpus = Corpus(GEOM["vocab_size"])
    for seed, (variant, (style, dd, de, L, extra)) in enumerate(ARCHS.items(), start=100):
        cfg = dict(GEOM)
        cfg.update(
            architectures=["PipelineNativeForCausalLM"],
            model_type="pipeline_native",
            variant=variant,
            combine_style=style,
            dense_delay=dd,
            expert_delay=de,
            num_hidden_layers=L,
            bos_token_id=1,
            eos_token_id=2,
        )
        cfg.update(extra)
        W = make_weights(cfg, seed)
        loss = fit(W, cfg, corpus, seed)
        # bf16 is what we store; the reference runs on exactly those values in f32.
        Wb = {k: v.detach().to(torch.bfloat16) for k, v in W.items()}
        W = {k: v.float() for k, v in Wb.items()}
        tokens = corpus.heldout(SEQ)
        d = os.path.join(out, f"pn_{variant}")
        os.makedirs(d, exist_ok=True)
        for fn in os.listdir(d):
            os.remove(os.path.join(d, fn))
        save_file(Wb, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(d, "config.json"), "w") as fh:
            json.dump(cfg, fh, indent=1)
        with torch.no_grad():
            x, logits, layer_norms = forward(W, cfg, tokens, L)
            prefix = [forward(W, cfg, tokens, k)[0].norm(dim=-1).tolist() for k in range(1, L + 1)]
        g = {
            "arch": variant,
            "tokens": tokens,
            "logits": logits.tolist(),
            "final_norms": x.norm(dim=-1).tolist(),
            "prefix_norms": prefix,
            "layer_norms": layer_norms,
            "train_loss": loss,
            "margins": margins(logits),
        }
        with open(os.path.join(d, "goldens.json"), "w") as fh:
            json.dump(g, fh)
        print(f"{variant:20} loss {loss[0]:.3f} -> {loss[1]:.3f}  min margin {min(g['margins']):.3f}")


if __name__ == "__main__":
    main()
