#!/usr/bin/env python3
"""PyTorch reference for the pipeline-native architectures, written from the paper's equations.

Source: the paper (../shared/reference/cflow-paper.txt), chapter 4 — eq. 4.1-4.4 (the standard
pre-norm layer), eq. 4.9-4.16 (dense delay, expert delay), §4.2.3 (the CombineStyle variants),
eq. 4.17-4.18 and the merge rule of §4.3.1 (arch1), eq. 4.19-4.21 (arch3), eq. 4.22 (arch5),
§4.4 (the delay-aware driver) — and §3.7-3.8 (attention, RMSNorm). It is written from the paper,
not from docs/SEMANTICS.md or the Rust engine, and shares no code with either.

Where the paper's passages admit two readings, the reading is a switch of `Readings` (one per
passage, each quoted there) and `forward(..., rd)` takes one of two settings:

* CHOSEN (the default; the checkpoints and goldens below are built with it). Each reading is the
  one that makes the paper's other statements hold:
  - eq. 4.11 `f_l = FFN_l(Norm(x_out_{l-Δ}))`: the residual that entered layer l-Δ (x_in_{l-Δ}),
    zero for l < δd (§4.4.2 step 1), because §4.5.1 "its tiles can be fetched across the
    intervening δd + 1 layers ... drops from B_dense to B_dense/(δd + 1)" and Table 4.1's
    4.50 MB need that one-layer-earlier input.
  - the router: eq. 4.13's Norm(x_in) for AsyncExperts; DelayedSum and ParallelSqrt2 route off
    the post-attention residual (§4.2.3: "the router fires off the current post-attention
    normalized residual Norm(x_mid)"; "run in parallel on the same pre-FFN normalized residual").
  - eq. 4.16 `x_out_{l+δe} += e_l`: added to the complete output of layer l+δe (§4.5.1 counts
    "that δe + 1-layer window"); targets past the last layer go to the last layer (§5.14, "the
    clamped last-layer fetch").
  - eq. 4.22: x_block is the block's input, fixed over its iterations.
  - arch1's read-out after the last layer: s_attn (the paper states none; with this script's
    L = 6, merge_interval = 3 the last layer is a merge point, so s_attn = s_ffn there).
* LITERAL: each passage by its letter where CHOSEN departs from it: eq. 4.11 and §4.4.2 step 1
  read x_out_{l-δd} (= x_in_{l-δd+1}); eq. 4.13's Norm(x_in) is the router input of every style
  that has an x_in; §4.4.2 step 3 ("For AsyncExperts: dequeues and injects any expert outputs
  scheduled for layer l before the executor call") injects AsyncExperts' experts into the
  residual entering layer l+δe; eq. 4.16 has no layer past L-1, so such targets are dropped.
  Eq. 4.22's x_block, arch1's merge rule (§4.3.1) and arch3's eq. 4.19-4.21 are already read
  by their letter in CHOSEN and are the same in LITERAL; the other reading of x_block (the
  iteration's input) is the separate switch `fp_anchor = "iteration"`.

CHOSEN is the setting docs/SEMANTICS.md also arrives at (its C1-C16; the C-numbers in
`Readings` are for cross-reference) and the Rust engine implements; the passages above, not that
page, are the source of both settings. literal_vs_chosen.py runs both settings, one switch at a
time, and asserts where they must differ and where they must agree. RMSNorm ε: §3.8's 1e-6, written into config.json.

Builds one tiny checkpoint per architecture in the `PipelineNativeForCausalLM` schema of
docs/FORMAT.md (config.json + model.safetensors, bf16): fixed-seed random init, then a few hundred
Adam steps through this file's own forward pass on the synthetic Markov-chain corpus of
synthetic_corpus.py (why trained: top-1 agreement of quantized imports means something only when
the golden top-1/top-2 margins exceed quantization noise). The goldens are computed in float32 on
exactly the bf16 weights, over a 16-token HELD-OUT sequence, all positions at once with a causal
mask (no KV cache object), and written to goldens.json:

* `logits`: [16][vocab]; `final_norms`: [16], L2 norm of the final hidden state (the vector the
  final norm reads);
* `prefix_norms`: [k][16] for k = 1 .. physical layers: `final_norms` of the model truncated to
  its first k physical layers (every rule applied to the shorter stack);
* `layer_norms`: [effective layers][16], the norm of the layer's output (informative);
* `train_loss` [first, last]; `margins` top-1 minus top-2 per position; `torch` version.

Experts are evaluated densely and weighted by the routing weights (zero for unselected experts):
the same sum as evaluating only the k selected ones.

Usage: python tests/reference/pipeline_native.py [OUT_DIR]   (default tests/reference/hf)
Needs torch (>= 2.0), numpy and safetensors. Deterministic for a given torch version (fixed seeds,
one CPU thread) on one machine, but not across machines: rerun with torch 2.15.0+cu132 on another
x86 VM (2026-12-05), the training reached other bf16 weights than the committed ones (max |Δlogit|
up to 0.73 between the goldens), while the forward pass on the committed weights reproduces the
committed logits to 2.4e-6. To check a change to the forward pass, compare forward() on the
committed weights, not a regeneration.
"""
import json
import math
import os
import sys
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from synthetic_corpus import Corpus, margins, train

SEQ = 16  # golden positions
EPS = 1e-6  # §3.8

BASE = dict(
    vocab_size=128,
    hidden_size=32,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    intermediate_size=64,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    rms_norm_eps=EPS,
    rope_theta=10000.0,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    hidden_act="silu",
)

# name -> (combine_style, δd, δe, physical layers, extra config). Delays as in Table 4.1.
MODELS = {
    "parallel_sqrt2": ("parallel_sqrt2", 0, 0, 4, {}),
    "arch1": ("decoupled_streams", 0, 0, 6, {"merge_interval": 3}),
    "arch2_4_combined": ("delayed_sum", 1, 2, 4, {}),
    "arch2_4_sync": ("delayed_sum", 1, 0, 4, {}),
    "arch3": ("pipeline_registers", 0, 0, 4, {"router_norm": "softmax_all"}),
    "arch4_async_experts": ("async_experts", 0, 2, 4, {}),
    "arch5": ("fixed_point", 0, 0, 2, {"fixed_point_iterations": 3}),
}


# ------------------------------------------------------------------- the contested readings


@dataclass(frozen=True)
class Readings:
    """One switch per passage of chapter 4 that admits two readings. CHOSEN (the default, the
    readings the goldens are built with) and LITERAL (each passage read by its letter) are the
    two settings; the check script literal_vs_chosen.py flips them one at a time. The C-numbers
    are those of docs/SEMANTICS.md, for cross-reference only: each reading is argued from the
    paper's text below and in the module docstring.

    dense_index (C1), for δd >= 1:
      "in"  — eq. 4.11's delayed residual is the one that entered layer l-δd, x_in_{l-δd}
              (§4.5.1: "its tiles can be fetched across the intervening δd + 1 layers ... drops
              from B_dense to B_dense/(δd + 1)"; §4.3.2: "reads the residual from one layer ago").
      "out" — eq. 4.11 as written, "f_l = FFN_l(Norm(x_out_{l-Δ}))", and §4.4.2 step 1
              "Retrieves the delayed residual x_out_{l-δd} ... (or the zero vector for the first
              δd layers)": x_out_{l-δd} = x_in_{l-δd+1}, zero for l < δd. With δd = 0 eq. 4.11
              would read the layer's own output; both readings then use x_in_l.
    router (C2):
      "style" — per §4.2.3 ("different choices of what to route off"): AsyncExperts Norm(x_in),
                DelayedSum / ParallelSqrt2 / sequential / FixedPoint the post-attention residual.
      "x_in"  — eq. 4.13 "router input: r_l = Norm(x_in_l)" for every single-stream style and
                FixedPoint (x_in = the residual the iteration starts from). The two-stream
                styles (arch1, arch3) have no x_in in the paper's notation and keep s_ffn /
                xfm_reg.
    inject (C3):
      "after"  — eq. 4.16 "x_out_{l+δe} += e_l": the complete output of layer l+δe.
      "before" — §4.4.2 step 3, "For AsyncExperts: dequeues and injects any expert outputs
                 scheduled for layer l before the executor call": into the residual entering
                 layer l+δe. Only AsyncExperts (step 4: "For DelayedSum: the executor handles
                 the queue internally", i.e. eq. 4.16).
    past_end (C8), targets l+δe >= L:
      "clamp" — added to the last layer's output (§5.14, "the clamped last-layer fetch").
      "drop"  — eq. 4.16 defines no layer l+δe >= L, so such e_l are never injected.
    fp_anchor (C16), eq. 4.22 "x <- x_block + Attn_B(Norm(x)) + FFN_B(Norm(x + Attn_B(·)))":
      "block"     — x_block is block B's input, held fixed over its iterations (the subscript
                    names a vector other than the iterate x; "Fixed-Point Iteration", §4.3.6).
      "iteration" — x_block is the residual the current iteration starts from, so each pass is
                    a weight-shared pre-norm layer (eq. 4.1-4.4 with x_mid = x + Attn_B):
                    "each iterated 3 times for an effective depth of 6". This is NOT the literal
                    text: LITERAL keeps "block", and the check script exercises this switch on
                    its own.
    Arch1's merge (C10) and arch3's registers (C11) have no switch: the reference already
    implements the letter of §4.3.1's merge rule and of eq. 4.19-4.21; arch1's read-out (not
    stated by the paper) is `arch1_readout`, "s_attn" in both settings.
    """

    dense_index: str = "in"
    router: str = "style"
    inject: str = "after"
    past_end: str = "clamp"
    fp_anchor: str = "block"
    arch1_readout: str = "s_attn"


CHOSEN = Readings()
LITERAL = Readings(dense_index="out", router="x_in", inject="before", past_end="drop")


# ------------------------------------------------------------------------------- the weights


def init_weights(cfg, seed):
    gen = torch.Generator().manual_seed(seed)
    d, hd, V = cfg["hidden_size"], cfg["head_dim"], cfg["vocab_size"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    dff, E, fe = cfg["intermediate_size"], cfg["num_experts"], cfg["moe_intermediate_size"]

    def linear(rows, cols):
        return torch.randn(rows, cols, generator=gen) * cols ** -0.5

    def gain(n):
        return 1.0 + 0.1 * torch.randn(n, generator=gen)

    W = {"model.embed_tokens.weight": torch.randn(V, d, generator=gen)}
    for i in range(cfg["num_hidden_layers"]):
        L = f"model.layers.{i}."
        W[L + "input_layernorm.weight"] = gain(d)
        W[L + "self_attn.q_proj.weight"] = linear(H * hd, d)
        W[L + "self_attn.k_proj.weight"] = linear(KV * hd, d)
        W[L + "self_attn.v_proj.weight"] = linear(KV * hd, d)
        W[L + "self_attn.o_proj.weight"] = linear(d, H * hd)
        W[L + "post_attention_layernorm.weight"] = gain(d)
        W[L + "mlp.gate_proj.weight"] = linear(dff, d)
        W[L + "mlp.up_proj.weight"] = linear(dff, d)
        W[L + "mlp.down_proj.weight"] = linear(d, dff)
        W[L + "moe_norm.weight"] = gain(d)
        W[L + "moe.router.weight"] = linear(E, d)
        for e in range(E):
            X = L + f"moe.experts.{e}."
            W[X + "gate_proj.weight"] = linear(fe, d)
            W[X + "up_proj.weight"] = linear(fe, d)
            W[X + "down_proj.weight"] = linear(d, fe)
    W["model.norm.weight"] = gain(d)
    W["lm_head.weight"] = linear(V, d)
    return W


# ------------------------------------------------------------------- operators (§3.7, §3.8)


class Ops:
    """Attn_l, FFN_l, Router_l, Expert_i of one physical layer; every operator takes the
    un-normalized residual and applies its own learned RMSNorm first (the paper's Norm(·))."""

    def __init__(self, W, cfg, i):
        self.W, self.cfg, self.p = W, cfg, f"model.layers.{i}."

    def w(self, name):
        return self.W[self.p + name]

    def norm(self, x, name):
        # §3.8: RMSNorm(x, w) = x / sqrt(mean(x^2) + ε) ⊙ w
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg["rms_norm_eps"]) * self.w(name)

    def attn(self, x):
        """§3.7.1 over all positions at once (causal): project Norm(x), RoPE split-half (§3.7.2),
        scores q·k/sqrt(d_k), softmax, Σ attn·v, concat heads, W_O."""
        c = self.cfg
        H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        T = x.shape[-2]
        xn = self.norm(x, "input_layernorm.weight")
        q = (xn @ self.w("self_attn.q_proj.weight").T).unflatten(-1, (H, hd)).transpose(-2, -3)
        k = (xn @ self.w("self_attn.k_proj.weight").T).unflatten(-1, (KV, hd)).transpose(-2, -3)
        v = (xn @ self.w("self_attn.v_proj.weight").T).unflatten(-1, (KV, hd)).transpose(-2, -3)
        # φ_i = t · θ^(-2i/d_k), dimension i paired with i + d_k/2.
        i = torch.arange(hd // 2, dtype=torch.float64)
        phi = torch.arange(T, dtype=torch.float64)[:, None] * c["rope_theta"] ** (-2.0 * i / hd)
        cos, sin = torch.cos(phi).float(), torch.sin(phi).float()

        def rope(z):
            lo, hi = z[..., : hd // 2], z[..., hd // 2 :]
            return torch.cat([lo * cos - hi * sin, lo * sin + hi * cos], -1)

        q, k = rope(q), rope(k)
        # GQA: query head h uses KV head floor(h · H_KV / H_Q).
        kv_of = torch.arange(H) * KV // H
        k, v = k[..., kv_of, :, :], v[..., kv_of, :, :]
        s = q @ k.transpose(-1, -2) / math.sqrt(hd)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        a = torch.softmax(s.masked_fill(~causal, float("-inf")), -1) @ v
        return a.transpose(-2, -3).flatten(-2) @ self.w("self_attn.o_proj.weight").T

    @staticmethod
    def swiglu(u, gate, up, down):
        return (F.silu(u @ gate.T) * (u @ up.T)) @ down.T

    def ffn(self, x):
        u = self.norm(x, "post_attention_layernorm.weight")
        return self.swiglu(u, self.w("mlp.gate_proj.weight"), self.w("mlp.up_proj.weight"), self.w("mlp.down_proj.weight"))

    def moe(self, x):
        """Eq. 4.13-4.15: r = Norm(x); top-k experts and weights s_j = Router(r);
        e = Σ_j s_j · Expert_{i_j}(r)."""
        c = self.cfg
        r = self.norm(x, "moe_norm.weight")
        logits = r @ self.w("moe.router.weight").T
        k = c["num_experts_per_tok"]
        # Top-k by logit; equal logits go to the lower expert id.
        top = torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :k]
        if c.get("router_norm", "softmax_topk") == "softmax_all":
            s = torch.softmax(logits, -1).gather(-1, top)
        else:
            s = torch.softmax(logits.gather(-1, top), -1)
        e = torch.zeros_like(x)
        for j in range(c["num_experts"]):
            weight = (s * (top == j)).sum(-1, keepdim=True)
            X = f"moe.experts.{j}."
            e = e + weight * self.swiglu(r, self.w(X + "gate_proj.weight"), self.w(X + "up_proj.weight"), self.w(X + "down_proj.weight"))
        return e


# --------------------------------------------------------------------- the forward passes


class Experts:
    """The expert queue of §4.4.2: e_l is enqueued at layer l and injected into the complete
    output of layer l + δe (eq. 4.16). A target l + δe >= L goes to the last layer
    (Readings.past_end = "clamp") or is dropped ("drop")."""

    def __init__(self, de, n, rd=CHOSEN):
        self.de, self.n, self.rd, self.q = de, n, rd, []  # [(target l + δe, e_l)], routing order

    def put(self, l, e):
        t = l + self.de
        if t >= self.n and self.rd.past_end == "drop":
            return
        self.q.append((t, e))

    def _take(self, hit):
        out, keep = None, []
        for t, e in self.q:
            if hit(t):
                out = e if out is None else out + e
            else:
                keep.append((t, e))
        self.q = keep
        return out

    def due(self, l):
        """The outputs added to the complete output of layer l (eq. 4.16, clamped)."""
        return self._take(lambda t: min(t, self.n - 1) == l)

    def due_before(self, l):
        """§4.4.2 step 3: the outputs scheduled for layer l (l < L), injected before it runs."""
        return self._take(lambda t: t == l)

    def due_past_end(self):
        """Clamped targets (l + δe >= L): added to the last layer's output."""
        return self._take(lambda t: t >= self.n)


def single_stream(ops, cfg, x, n, rd=CHOSEN):
    """ParallelSqrt2, DelayedSum, AsyncExperts (and sequential): one residual x (eq. 4.9-4.16)."""
    style, dd = cfg["combine_style"], cfg["dense_delay"]
    q = Experts(cfg["expert_delay"], n, rd)
    before = rd.inject == "before" and style == "async_experts"  # §4.4.2 step 3
    entered = []  # x_in of every layer so far
    outs = []
    for l in range(n):
        o = ops[l]
        if before:
            # §4.4.2 step 3: the outputs scheduled for layer l join the residual before the
            # executor runs it (with AsyncExperts' δe >= 1 they were routed at an earlier
            # layer; with δe = 0 an output would be due before its own routing and is never
            # injected). Targets past the last layer have no layer to precede:
            # Readings.past_end adds them to the last output ("clamp") or drops them.
            e = q.due_before(l)
            if e is not None:
                x = x + e
        x_in = x
        entered.append(x_in)
        m = o.attn(x_in)  # eq. 4.9
        x_mid = x_in + m  # eq. 4.10
        if rd.dense_index == "out" and dd >= 1:
            # eq. 4.11 / §4.4.2 step 1 as written: x_out_{l-δd} (= x_in_{l-δd+1}), zero for
            # the first δd layers.
            delayed = entered[l - dd + 1] if l >= dd else torch.zeros_like(x)
        else:
            # eq. 4.11: the residual that entered layer l - δd (zero before the first δd layers).
            delayed = entered[l - dd] if l >= dd else torch.zeros_like(x)
        # eq. 4.13 for every style (Readings.router = "x_in"), else §4.2.3's anchor per style.
        r_post = x_in if rd.router == "x_in" else x_mid
        if style == "parallel_sqrt2":
            # §4.2.3: dense FFN and MoE in parallel on the same pre-FFN residual (x_mid), the
            # sum scaled by 1/sqrt(2). No delays.
            x = x_mid + (o.ffn(x_mid) + o.moe(r_post)) / math.sqrt(2.0)
            outs.append(x)
            continue
        if style == "delayed_sum":
            f = o.ffn(delayed)  # eq. 4.11
            q.put(l, o.moe(r_post))  # router off Norm(x_mid) (§4.2.3); LITERAL: Norm(x_in)
        elif style == "async_experts":
            f = o.ffn(delayed)  # δd = 0: Norm(x_in), the same input as the router
            q.put(l, o.moe(x_in))  # eq. 4.13: Norm(x_in)
        elif style == "sequential":
            f = o.ffn(x_mid if dd == 0 else delayed)  # eq. 4.3
            q.put(l, o.moe(r_post))
        else:
            raise ValueError(style)
        x = x_mid + f  # eq. 4.12
        if not before:
            e = q.due(l)
        else:
            e = q.due_past_end() if l == n - 1 else None
        if e is not None:
            x = x + e  # eq. 4.16
        outs.append(x)
    return x, outs


def decoupled_streams(ops, cfg, x, n, rd=CHOSEN):
    """Arch1 (§4.3.1): eq. 4.17-4.18, synchronized every merge_interval layers by
    s_attn = s_ffn = (s_attn + s_ffn)/2. The experts belong to the FFN stream: routed off
    s_ffn,l-1, injected into s_ffn. The paper does not say which stream the final norm reads:
    Readings.arch1_readout ("s_attn", the stream attention reads, or "s_ffn")."""
    mi = cfg.get("merge_interval", 3)
    q = Experts(cfg["expert_delay"], n, rd)
    s_attn, s_ffn = x, x
    outs = []
    for l in range(n):
        o = ops[l]
        s_attn = s_attn + o.attn(s_attn)  # eq. 4.17
        q.put(l, o.moe(s_ffn))
        s_ffn = s_ffn + o.ffn(s_ffn)  # eq. 4.18
        e = q.due(l)
        if e is not None:
            s_ffn = s_ffn + e
        if (l + 1) % mi == 0:
            s_attn = s_ffn = (s_attn + s_ffn) / 2
        outs.append(s_attn)
    if rd.arch1_readout == "s_ffn":
        return s_ffn, outs
    return s_attn, outs


def pipeline_registers(ops, cfg, x, n, rd=CHOSEN):
    """Arch3 (§4.3.4), eq. 4.19-4.21 as written; attn_reg_-1 = xfm_reg_-1 = the embedding. The
    experts are part of f_l (routed off xfm_reg_l-1); the output is xfm_reg ("the complete
    output")."""
    q = Experts(cfg["expert_delay"], n, rd)
    attn_reg, xfm_reg = x, x
    outs = []
    for l in range(n):
        o = ops[l]
        q.put(l, o.moe(xfm_reg))
        f = o.ffn(xfm_reg)  # eq. 4.20
        attn_reg = attn_reg + o.attn(attn_reg)  # eq. 4.19
        xfm_reg = attn_reg + f  # eq. 4.21
        e = q.due(l)
        if e is not None:
            xfm_reg = xfm_reg + e
        outs.append(xfm_reg)
    return xfm_reg, outs


def fixed_point(ops, cfg, x, n_blocks, rd=CHOSEN):
    """Arch5 (§4.3.6), eq. 4.22: for each block B, x_block = the block's input, then for each
    iteration x <- x_block + Attn_B(Norm(x)) + FFN_B(Norm(x + Attn_B(Norm(x)))). Every
    iteration attends over its own keys/values. The experts join the FFN term (routed off
    x + Attn_B; off x itself with Readings.router = "x_in"). Readings.fp_anchor = "iteration"
    reads x_block as the residual the iteration starts from instead."""
    it = cfg.get("fixed_point_iterations", 3)
    q = Experts(cfg["expert_delay"], n_blocks * it, rd)
    outs = []
    for b in range(n_blocks):
        o = ops[b]
        x_block = x
        for i in range(it):
            l = b * it + i
            if rd.fp_anchor == "iteration":
                x_block = x
            a = o.attn(x)
            q.put(l, o.moe(x if rd.router == "x_in" else x + a))
            x = x_block + a + o.ffn(x + a)  # eq. 4.22
            e = q.due(l)
            if e is not None:
                x = x + e
            outs.append(x)
    return x, outs


def forward(W, cfg, tokens, n_layers, rd=CHOSEN):
    """tokens [..., T] -> (final hidden [..., T, d], logits [..., T, V], per-layer outputs) of
    the model truncated to its first `n_layers` physical layers, under the readings `rd`."""
    x = W["model.embed_tokens.weight"][torch.as_tensor(tokens)]
    ops = [Ops(W, cfg, i) for i in range(n_layers)]
    run = {
        "decoupled_streams": decoupled_streams,
        "pipeline_registers": pipeline_registers,
        "fixed_point": fixed_point,
    }.get(cfg["combine_style"], single_stream)
    h, outs = run(ops, cfg, x, n_layers, rd)
    hn = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"]) * W["model.norm.weight"]
    return h, hn @ W["lm_head.weight"].T, outs


# ------------------------------------------------------------------------------- the driver


def fit(W, cfg, corpus, seed):
    params = [W[k].requires_grad_(True) for k in sorted(W)]
    n = cfg["num_hidden_layers"]

    def loss_fn(batch):
        logits = forward(W, cfg, batch, n)[1]
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten())

    loss = train(params, loss_fn, corpus, seed)
    for p in params:
        p.requires_grad_(False)
    return list(loss)


def config_of(name):
    """config.json of the checkpoint `name` (a key of MODELS)."""
    style, dd, de, n, extra = MODELS[name]
    cfg = dict(BASE)
    cfg.update(
        architectures=["PipelineNativeForCausalLM"],
        model_type="pipeline_native",
        variant=name,
        combine_style=style,
        dense_delay=dd,
        expert_delay=de,
        num_hidden_layers=n,
        bos_token_id=1,
        eos_token_id=2,
        **extra,
    )
    return cfg


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf")
    torch.set_num_threads(1)
    corpus = Corpus(BASE["vocab_size"])
    for seed, name in enumerate(MODELS, start=200):
        cfg = config_of(name)
        n = cfg["num_hidden_layers"]
        torch.manual_seed(seed)
        W = init_weights(cfg, seed)
        loss = fit(W, cfg, corpus, seed)
        stored = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in W.items()}
        W = {k: v.float() for k, v in stored.items()}
        tokens = corpus.heldout(SEQ)
        d = os.path.join(out, f"pn_{name}")
        os.makedirs(d, exist_ok=True)
        for fn in os.listdir(d):
            os.remove(os.path.join(d, fn))
        save_file(stored, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(d, "config.json"), "w") as fh:
            json.dump(cfg, fh, indent=1)
        with torch.no_grad():
            h, logits, outs = forward(W, cfg, tokens, n)
            prefix = [forward(W, cfg, tokens, k)[0].norm(dim=-1).tolist() for k in range(1, n + 1)]
        g = {
            "arch": name,
            "tokens": tokens,
            "logits": logits.tolist(),
            "final_norms": h.norm(dim=-1).tolist(),
            "prefix_norms": prefix,
            "layer_norms": [o.norm(dim=-1).tolist() for o in outs],
            "train_loss": loss,
            "margins": margins(logits),
            "torch": torch.__version__,
        }
        with open(os.path.join(d, "goldens.json"), "w") as fh:
            json.dump(g, fh)
        print(f"{name:20} loss {loss[0]:.3f} -> {loss[1]:.3f}  min margin {min(g['margins']):.3f}", flush=True)


if __name__ == "__main__":
    main()
