#!/usr/bin/env python3
"""Independent PyTorch reference for every combine style of docs/SEMANTICS.md.

Builds one tiny random checkpoint per pipeline-native architecture in the
`PipelineNativeForCausalLM` schema of docs/FORMAT.md (config.json + model.safetensors,
bf16 weights), runs the reference forward pass in float32 over a fixed 16-token sequence
(layer-major: every position of a layer before the next layer; causal attention over the
sequence, so no KV cache object) and writes goldens.json:

* `logits`: [16][vocab]
* `final_norms`: [16] — L2 norm of the final hidden state (before the final norm)
* `prefix_norms`: [k][16] for k = 1 .. n_layers physical layers: the final-hidden norms of the
  model truncated to its first k physical layers (every scheduler rule — delays, clamped
  injection, register flush, last merge — applied to the shorter stack). For Sequential models
  this is exactly the per-layer residual norm.
* `layer_norms`: [effective layers][16] — the residual `x` after each effective layer of the
  full model (informative; DecoupledStreams: the attention stream).

This file shares no code with the Rust engine or tests/engine_styles.rs.
Usage: python tests/reference/pipeline_native.py [OUT_DIR]   (default tests/reference/hf)
"""
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file

TOKENS = [1, 5, 17, 42, 99, 3, 64, 127, 8, 8, 23, 77, 101, 2, 56, 31]

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
    # bf16 is what we store; the reference runs on exactly those values in f32.
    return {k: v.to(torch.bfloat16) for k, v in w.items()}


# ----------------------------------------------------------------------------- building blocks


def rms(x, w, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


def rope_split_half(x, theta):
    # x: [T, heads, hd]; pairs (i, i + hd/2), angle pos * theta^(-2i/hd)
    T, _, hd = x.shape
    half = hd // 2
    inv = theta ** (-torch.arange(0, half, dtype=torch.float64) * 2.0 / hd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    c, s = ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def attention(x, W, p, cfg):
    T = x.shape[0]
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    pre = f"model.layers.{p}."
    xn = rms(x, W[pre + "input_layernorm.weight"], cfg["rms_norm_eps"])
    q = (xn @ W[pre + "self_attn.q_proj.weight"].T).view(T, H, hd)
    k = (xn @ W[pre + "self_attn.k_proj.weight"].T).view(T, KV, hd)
    v = (xn @ W[pre + "self_attn.v_proj.weight"].T).view(T, KV, hd)
    q, k = rope_split_half(q, cfg["rope_theta"]), rope_split_half(k, cfg["rope_theta"])
    rep = H // KV
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("thd,uhd->htu", q, k) / math.sqrt(hd)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(-1)
    out = torch.einsum("htu,uhd->thd", probs, v).reshape(T, H * hd)
    return out @ W[pre + "self_attn.o_proj.weight"].T


def gated_ffn(u, g, up, down):
    return (torch.nn.functional.silu(u @ g.T) * (u @ up.T)) @ down.T


def dense(src, W, p, cfg):
    pre = f"model.layers.{p}."
    u = rms(src, W[pre + "post_attention_layernorm.weight"], cfg["rms_norm_eps"])
    return gated_ffn(u, W[pre + "mlp.gate_proj.weight"], W[pre + "mlp.up_proj.weight"], W[pre + "mlp.down_proj.weight"])


def route(src, W, p, cfg):
    """Returns (u, idx [T,k], weights [T,k]); top-k by logit, ties to the lower expert id."""
    pre = f"model.layers.{p}."
    u = rms(src, W[pre + "moe_norm.weight"], cfg["rms_norm_eps"])
    logits = u @ W[pre + "moe.router.weight"].T
    k = cfg["num_experts_per_tok"]
    idx = torch.sort(-logits, dim=-1, stable=True).indices[:, :k]
    if cfg.get("router_norm", "softmax_topk") == "softmax_all":
        wts = logits.softmax(-1).gather(-1, idx)
    else:
        wts = logits.gather(-1, idx).softmax(-1)
    return u, idx, wts


def run_experts(u, idx, wts, W, p, cfg):
    pre = f"model.layers.{p}.moe.experts."
    out = torch.zeros_like(u)
    for t in range(u.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            q = f"{pre}{e}."
            y = gated_ffn(u[t : t + 1], W[q + "gate_proj.weight"], W[q + "up_proj.weight"], W[q + "down_proj.weight"])
            out[t] += wts[t, j] * y[0]
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
    x = W["model.embed_tokens.weight"][torch.tensor(tokens)].clone()
    T, d = x.shape
    zeros = torch.zeros(T, d)
    f = x.clone()  # DecoupledStreams FFN stream
    base = x.clone()
    r = torch.zeros(T, d)  # PipelineRegisters register
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


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "hf")
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
        Wb = make_weights(cfg, seed)
        W = {k: v.float() for k, v in Wb.items()}
        d = os.path.join(out, f"pn_{variant}")
        os.makedirs(d, exist_ok=True)
        for fn in os.listdir(d):
            os.remove(os.path.join(d, fn))
        save_file(Wb, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(d, "config.json"), "w") as fh:
            json.dump(cfg, fh, indent=1)
        with torch.no_grad():
            x, logits, layer_norms = forward(W, cfg, TOKENS, L)
            prefix = [forward(W, cfg, TOKENS, k)[0].norm(dim=-1).tolist() for k in range(1, L + 1)]
        g = {
            "arch": variant,
            "tokens": TOKENS,
            "logits": logits.tolist(),
            "final_norms": x.norm(dim=-1).tolist(),
            "prefix_norms": prefix,
            "layer_norms": layer_norms,
        }
        with open(os.path.join(d, "goldens.json"), "w") as fh:
            json.dump(g, fh)
        print(variant, style, "top1", logits.argmax(-1).tolist())


if __name__ == "__main__":
    main()
