#!/usr/bin/env python3
"""Exact float64 forward of a `gemma3` GGUF (llama.cpp's graph, src/models/gemma3.cpp), for parity
tests of our gemma3 import and engine.

Weights are dequantized with gguf-py (`gguf.quants.dequantize`, every type incl. the K-quants) and
the forward is computed in float64 numpy with no activation quantization and an exact KV cache:
the "true" output of the quantized model. What it implements, as llama.cpp does:
  x = embed(ids) * sqrt(d)
  per layer l (sliding window on the layers the pattern marks local, default every 6th global;
  RoPE base `rope.freq_base` on global layers, `rope.freq_base_swa` (default 1e4) on local ones):
    h = RMSNorm(x) * attn_norm                          (the GGUF stores Gemma's 1 + w)
    q, k, v = h Wq, h Wk, h Wv; q, k: per-head RMSNorm * q_norm / k_norm, then NeoX RoPE
    a = softmax(q k^T / sqrt(head_dim) + causal/window mask) v;   o = a Wo
    x = x + RMSNorm(o) * post_attention_norm
    h = RMSNorm(x) * ffn_norm;  f = (gelu_tanh(h Wg) * h Wu) Wd
    x = x + RMSNorm(f) * post_ffw_norm
  logits = (RMSNorm(x) * output_norm) E^T   (tied; `output.weight` when present; final softcap
  only when `gemma3.final_logit_softcapping` is set)

Usage as a module: `forward(path, ids) -> np.ndarray [len(ids), vocab]` (float64).
As a script: python gemma3_f64_reference.py MODEL.gguf IDS_JSON -o OUT.json [--top 10]
    [--positions 24] [--prompts capital,story,...]
  IDS_JSON: a JSON file {"prompts": [{"name": ..., "ids": [...]}, ...]} (e.g. the llama.cpp
  goldens, so both oracles see the same ids); writes per prompt the evaluated prefix `ids`, the
  top-k [id, logit] per position (predicting position i+1) and the logsumexp.
Needs numpy and gguf-py (pip install gguf, or PYTHONPATH=<llama.cpp>/gguf-py).
"""
import argparse
import json
import math

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


class Gemma3:
    def __init__(self, path):
        r = GGUFReader(path)
        self.tensors = {t.name: t for t in r.tensors}

        def field(key, default=None):
            if key not in r.fields:
                return default
            f = r.fields[key]
            return f.parts[f.data[0]].tolist()[0]

        self.d = int(field("gemma3.embedding_length"))
        self.n_layers = int(field("gemma3.block_count"))
        self.n_heads = int(field("gemma3.attention.head_count"))
        self.n_kv = int(field("gemma3.attention.head_count_kv"))
        self.hd = int(field("gemma3.attention.key_length", self.d // self.n_heads))
        self.eps = float(field("gemma3.attention.layer_norm_rms_epsilon"))
        self.base = float(field("gemma3.rope.freq_base", 10000.0))
        self.base_swa = float(field("gemma3.rope.freq_base_swa", 10000.0))
        self.swa = int(field("gemma3.attention.sliding_window", 0))
        self.softcap = float(field("gemma3.final_logit_softcapping", 0.0))
        n_pattern = int(field("gemma3.attention.sliding_window_pattern", 6))
        self.is_swa = [
            self.swa > 0 and (n_pattern == 0 or il % n_pattern < n_pattern - 1)
            for il in range(self.n_layers)
        ]
        # llama.cpp: the 27B (62 layers) scales by 1/sqrt(d/heads), the others by 1/sqrt(head_dim).
        self.scale = 1.0 / math.sqrt(self.d // self.n_heads if self.n_layers == 62 else self.hd)
        self.emb_t = self.tensors["token_embd.weight"]
        self.vocab = int(self.emb_t.shape[1])
        self.layers = []
        for i in range(self.n_layers):
            p = f"blk.{i}."
            self.layers.append({
                k: self.w(p + n)
                for k, n in [
                    ("an", "attn_norm.weight"), ("qn", "attn_q_norm.weight"),
                    ("kn", "attn_k_norm.weight"), ("pan", "post_attention_norm.weight"),
                    ("fn", "ffn_norm.weight"), ("pfn", "post_ffw_norm.weight"),
                    ("q", "attn_q.weight"), ("k", "attn_k.weight"), ("v", "attn_v.weight"),
                    ("o", "attn_output.weight"), ("g", "ffn_gate.weight"),
                    ("u", "ffn_up.weight"), ("dn", "ffn_down.weight"),
                ]
            })
        self.out_norm = self.w("output_norm.weight")
        self.head_name = "output.weight" if "output.weight" in self.tensors else "token_embd.weight"

    def w(self, name):
        t = self.tensors[name]
        x = dequantize(t.data, t.tensor_type).astype(np.float64)
        shape = [int(s) for s in t.shape]
        return x.reshape(shape[::-1]) if len(shape) == 2 else x.reshape(-1)

    def rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos, base):
        # NeoX: pairs (i, i + hd/2).  x: [T, H, hd]
        half = self.hd // 2
        inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / self.hd)
        ang = pos[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)

    def embed_rows(self, ids):
        t = self.emb_t
        row_bytes = t.data.shape[-1] if t.data.ndim == 2 else None
        if row_bytes is None:
            return self.w("token_embd.weight")[ids]
        return np.stack([
            dequantize(t.data[i:i + 1], t.tensor_type).astype(np.float64).reshape(-1) for i in ids
        ])

    def head(self, x):
        """x [T, d] -> logits [T, vocab], the LM head dequantized in chunks of rows."""
        t = self.tensors[self.head_name]
        out = np.empty((x.shape[0], self.vocab))
        step = 8192
        for r0 in range(0, self.vocab, step):
            r1 = min(self.vocab, r0 + step)
            wr = dequantize(t.data[r0:r1], t.tensor_type).astype(np.float64).reshape(r1 - r0, -1)
            out[:, r0:r1] = x @ wr.T
        return out

    def forward(self, ids):
        ids = list(ids)
        T, d, H, KV, hd = len(ids), self.d, self.n_heads, self.n_kv, self.hd
        group = H // KV
        x = self.embed_rows(ids) * math.sqrt(d)
        pos = np.arange(T, dtype=np.float64)
        ii, jj = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
        for il, L in enumerate(self.layers):
            h = self.rms(x, L["an"])
            q = (h @ L["q"].T).reshape(T, H, hd)
            k = (h @ L["k"].T).reshape(T, KV, hd)
            v = (h @ L["v"].T).reshape(T, KV, hd)
            q = self.rms(q, L["qn"])
            k = self.rms(k, L["kn"])
            base = self.base_swa if self.is_swa[il] else self.base
            q = self.rope(q, pos, base) * self.scale
            k = self.rope(k, pos, base)
            masked = jj > ii
            if self.is_swa[il]:
                masked = masked | (ii - jj >= self.swa)
            att = np.empty((T, H, hd))
            for hh in range(H):
                kh = hh // group
                s = q[:, hh, :] @ k[:, kh, :].T
                s = np.where(masked, -np.inf, s)
                s = s - s.max(-1, keepdims=True)
                p = np.exp(s)
                p /= p.sum(-1, keepdims=True)
                att[:, hh, :] = p @ v[:, kh, :]
            o = att.reshape(T, H * hd) @ L["o"].T
            x = x + self.rms(o, L["pan"])
            h = self.rms(x, L["fn"])
            g = h @ L["g"].T
            g = 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3)))
            f = (g * (h @ L["u"].T)) @ L["dn"].T
            x = x + self.rms(f, L["pfn"])
        logits = self.head(self.rms(x, self.out_norm))
        if self.softcap > 0:
            logits = self.softcap * np.tanh(logits / self.softcap)
        return logits


def forward(path, ids):
    return Gemma3(path).forward(ids)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("ids")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--positions", type=int, default=0, help="first N ids only (0 = all)")
    ap.add_argument("--prompts", default="", help="comma-separated names (default: all)")
    a = ap.parse_args()
    m = Gemma3(a.model)
    prompts = json.load(open(a.ids))["prompts"]
    if a.prompts:
        keep = a.prompts.split(",")
        prompts = [p for p in prompts if p["name"] in keep]
    out = {"model": a.model.rsplit("/", 1)[-1], "generator": "tests/reference/gemma3_f64_reference.py",
           "prompts": []}
    for p in prompts:
        ids = p["ids"][: a.positions] if a.positions else p["ids"]
        lg = m.forward(ids)
        top, lse = [], []
        for row in lg:
            idx = np.argsort(-row)[: a.top]
            top.append([[int(i), float(row[i])] for i in idx])
            mx = row.max()
            lse.append(float(mx + np.log(np.exp(row - mx).sum())))
        out["prompts"].append({"name": p["name"], "ids": ids, "top": top, "logsumexp": lse})
    with open(a.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
