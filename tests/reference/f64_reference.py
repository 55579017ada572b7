#!/usr/bin/env python3
"""Exact float64 reference forward of SmolLM2 (llama architecture) from its GGUF, for parity tests.

Weights are dequantized with gguf-py (`gguf.quants.dequantize`) and the forward pass is computed in
float64 numpy with no activation quantization and an exact KV cache, i.e. the "true" output of the
quantized model. llama.cpp itself deviates from this by up to ~1 logit (Q8 activations, f16 KV
cache, f16 flash attention), so this is the tighter oracle for our engine's numerics.

Usage: python f64_reference.py MODEL.gguf GOLDENS_LLAMACPP.json -o OUT.json [--positions 24]
Takes the first prompts' ids from the llama.cpp goldens so both oracles see identical inputs.
Writes, per prompt: name, ids (the evaluated prefix), top (top-10 [id, logit] per position,
predicting position i+1) and logsumexp.
"""
import argparse
import json

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("goldens")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--positions", type=int, default=24)
    ap.add_argument("--prompts", default="english,code_python,chatml")
    a = ap.parse_args()

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

    def w(name, rows=None):
        t = tensors[name]
        x = dequantize(t.data, t.tensor_type).astype(np.float64)
        return x.reshape(rows, -1) if rows is not None else x.reshape(-1)

    emb = w("token_embd.weight", rows=int(tensors["token_embd.weight"].shape[1]))
    layers = []
    for i in range(n_layers):
        p = f"blk.{i}."
        layers.append({
            "an": w(p + "attn_norm.weight"), "fn": w(p + "ffn_norm.weight"),
            "q": w(p + "attn_q.weight", d), "k": w(p + "attn_k.weight", n_kv * hd),
            "v": w(p + "attn_v.weight", n_kv * hd), "o": w(p + "attn_output.weight", d),
            "g": w(p + "ffn_gate.weight", -1 if False else None).reshape(-1, d),
            "u": w(p + "ffn_up.weight").reshape(-1, d), "dn": w(p + "ffn_down.weight").reshape(d, -1),
        })
    out_norm = w("output_norm.weight")
    head = emb if "output.weight" not in tensors else w("output.weight").reshape(-1, d)

    def rms(x, g):
        return x / np.sqrt((x * x).mean() + eps) * g

    inv = base ** (-np.arange(0, hd, 2) / hd)

    def rope(v, pos):  # GGUF llama: adjacent pairs (the converter permuted Q/K rows)
        ang = pos * inv
        c, s = np.cos(ang), np.sin(ang)
        a, b = v[..., 0::2].copy(), v[..., 1::2].copy()
        out = v.copy()
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
        return out

    g = json.load(open(a.goldens))
    wanted = a.prompts.split(",")
    res = {"generator": "tests/reference/f64_reference.py", "model_sha256": g.get("model_sha256"), "prompts": []}
    for pr in g["prompts"]:
        if pr["name"] not in wanted:
            continue
        ids = pr["ids"][: a.positions]
        kc = [[] for _ in range(n_layers)]
        vc = [[] for _ in range(n_layers)]
        tops, lses = [], []
        for pos, t in enumerate(ids):
            x = emb[t].copy()
            for li, L in enumerate(layers):
                h = rms(x, L["an"])
                q = rope((L["q"] @ h).reshape(n_heads, hd), pos)
                k = rope((L["k"] @ h).reshape(n_kv, hd), pos)
                v = (L["v"] @ h).reshape(n_kv, hd)
                kc[li].append(k)
                vc[li].append(v)
                K = np.stack(kc[li])  # [pos+1, n_kv, hd]
                V = np.stack(vc[li])
                att = np.zeros((n_heads, hd))
                for hh in range(n_heads):
                    s = K[:, hh // group, :] @ q[hh] / np.sqrt(hd)
                    s = np.exp(s - s.max())
                    s /= s.sum()
                    att[hh] = s @ V[:, hh // group, :]
                x = x + L["o"] @ att.reshape(-1)
                h = rms(x, L["fn"])
                gt, up = L["g"] @ h, L["u"] @ h
                x = x + L["dn"] @ (gt / (1 + np.exp(-gt)) * up)
            logits = head @ rms(x, out_norm)
            m = logits.max()
            lses.append(round(float(m + np.log(np.exp(logits - m).sum())), 5))
            top = np.argsort(-logits, kind="stable")[:10]
            tops.append([[int(i), round(float(logits[i]), 5)] for i in top])
        res["prompts"].append({"name": pr["name"], "ids": ids, "top": tops, "logsumexp": lses})
        print(pr["name"], len(ids), "positions")
    json.dump(res, open(a.out, "w"))


if __name__ == "__main__":
    main()
