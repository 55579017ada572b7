#!/usr/bin/env python3
"""Float64 forward of a llama GGUF's dequantized weights on the tokens of a reference-logits
file, written in the same format: the exact output of the quantized model (no activation
quantization, exact KV), the oracle of issue 18's KLD table.

Usage (gguf-py and numpy; the venv of shared/bench/setup.sh has both):
  /tmp/anchor/venv/bin/python tests/reference/f64_logits.py MODEL.gguf --tokens-from REF.logits \
      -o f64.logits [--chunks N]

Each chunk of REF's chunk length is one batched causal forward from position 0 (as
`cflow-tui perplexity` evaluates it); the architecture is tests/reference/f64_reference.py's
(RMSNorm, GGUF-adjacent-pair RoPE, GQA, SwiGLU, tied or separate LM head), batched over the chunk.
Cost: ~2 × 135 M multiply-adds per token on SmolLM2 in float64 (minutes per 512-token chunk on
a loaded machine), so `--chunks` selects a prefix for the float64 check of the f32 reference.
"""
import argparse
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import logits_file as lf  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens-from", required=True)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--chunks", type=int, default=None)
    a = ap.parse_args()

    h = lf.read_header(a.tokens_from)
    chunks = lf.chunks(h["tokens"], h["n_ctx"], a.chunks)
    tokens = [t for c in chunks for t in c]

    r = GGUFReader(a.model)
    tensors = {t.name: t for t in r.tensors}

    def field(key):
        f = r.fields[key]
        return f.parts[f.data[0]].tolist()[0]

    d = int(field("llama.embedding_length"))
    n_layers = int(field("llama.block_count"))
    n_heads = int(field("llama.attention.head_count"))
    n_kv = int(field("llama.attention.head_count_kv"))
    eps = float(field("llama.attention.layer_norm_rms_epsilon"))
    base = float(field("llama.rope.freq_base"))
    hd = d // n_heads
    group = n_heads // n_kv

    def w(name, cols=None):
        t = tensors[name]
        x = dequantize(t.data, t.tensor_type).astype(np.float64)
        return x.reshape(-1, cols) if cols is not None else x.reshape(-1)

    emb = w("token_embd.weight", d)
    n_vocab = emb.shape[0]
    if n_vocab != h["n_vocab"]:
        sys.exit(f"vocab {n_vocab} != the reference's {h['n_vocab']}")
    layers = []
    for i in range(n_layers):
        p = f"blk.{i}."
        layers.append({
            "an": w(p + "attn_norm.weight"), "fn": w(p + "ffn_norm.weight"),
            "q": w(p + "attn_q.weight", d), "k": w(p + "attn_k.weight", d),
            "v": w(p + "attn_v.weight", d), "o": w(p + "attn_output.weight", n_heads * hd),
            "g": w(p + "ffn_gate.weight", d), "u": w(p + "ffn_up.weight", d),
            "dn": w(p + "ffn_down.weight"),
        })
        L = layers[-1]
        L["dn"] = L["dn"].reshape(d, -1)
    out_norm = w("output_norm.weight")
    head = emb if "output.weight" not in tensors else w("output.weight", d)

    def rms(x, g):
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g

    inv = base ** (-np.arange(0, hd, 2) / hd)

    def rope(v, pos):  # v [T, H, hd]; GGUF llama: adjacent pairs
        ang = pos[:, None, None] * inv[None, None, :]
        c, s = np.cos(ang), np.sin(ang)
        a_, b_ = v[..., 0::2], v[..., 1::2]
        out = np.empty_like(v)
        out[..., 0::2] = a_ * c - b_ * s
        out[..., 1::2] = a_ * s + b_ * c
        return out

    label = f"float64 numpy forward of the dequantized {os.path.basename(a.model)} (tests/reference/f64_logits.py)"
    wr = lf.Writer(a.out, n_vocab, h["n_ctx"], tokens, label)
    try:
        for ci, ch in enumerate(chunks):
            T = len(ch)
            pos = np.arange(T, dtype=np.float64)
            mask = np.triu(np.full((T, T), -np.inf), 1)
            x = emb[np.asarray(ch)]
            for L in layers:
                hh = rms(x, L["an"])
                q = rope((hh @ L["q"].T).reshape(T, n_heads, hd), pos)
                k = rope((hh @ L["k"].T).reshape(T, n_kv, hd), pos)
                v = (hh @ L["v"].T).reshape(T, n_kv, hd)
                att = np.empty((T, n_heads, hd))
                for j in range(n_heads):
                    s = q[:, j, :] @ k[:, j // group, :].T / np.sqrt(hd) + mask
                    s = np.exp(s - s.max(axis=1, keepdims=True))
                    s /= s.sum(axis=1, keepdims=True)
                    att[:, j, :] = s @ v[:, j // group, :]
                x = x + att.reshape(T, -1) @ L["o"].T
                hh = rms(x, L["fn"])
                gt, up = hh @ L["g"].T, hh @ L["u"].T
                x = x + (gt / (1 + np.exp(-gt)) * up) @ L["dn"].T
            lp = lf.log_softmax(rms(x, out_norm) @ head.T)
            for i in range(T - 1):
                wr.push(lp[i], ch[i + 1])
            print(f"chunk {ci + 1}/{len(chunks)}", file=sys.stderr, flush=True)
        wr.finish()
    except BaseException:
        wr.abort()
        raise
    print(f"wrote {wr.written} positions to {a.out}")


if __name__ == "__main__":
    main()
