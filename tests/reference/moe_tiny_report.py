#!/usr/bin/env python3
"""Prints the moe_tiny summary tables (markdown) from the committed JSON/GGUF files: per case the
training loss, min golden margin and router near-ties; per case x quant the file size, tensor
types, llama.cpp flash-attention on vs off teacher-forced top-1 agreement, and HF vs llama.cpp
top-1 agreement / max |dlogit| (full vocabulary).

Usage: PYTHONPATH=<llama.cpp>/gguf-py python tests/reference/moe_tiny_report.py [OUT_DIR] [SCRATCH]
"""
import collections
import json
import os
import sys

CASES = ["qwen3", "qwen3moe", "olmoe", "mixtral", "qwen2moe", "qwen3moe_k"]
QUANTS = ["f32", "q8_0", "q4_k_m"]


def types(path):
    try:
        import gguf
    except ImportError:
        return "?"
    r = gguf.GGUFReader(path)
    c = collections.Counter(t.tensor_type.name for t in r.tensors)
    return " ".join(f"{k}×{v}" for k, v in sorted(c.items()))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe_tiny")
    scratch = sys.argv[2] if len(sys.argv) > 2 else None
    print("| case | GGUF arch | train loss | min margin | router near-ties (<1e-4) |")
    print("|---|---|---|---|---|")
    for c in CASES:
        p = os.path.join(out, c, "goldens.json")
        if not os.path.exists(p):
            continue
        g = json.load(open(p))
        ties = g.get("router_near_ties", "–")
        print(f"| {c} | {g['arch']} | {g['train_loss'][0]:.3f} → {g['train_loss'][1]:.3f} | "
              f"{min(g['margins']):.3f} | {ties} |")
    print()
    print("| case | quant | bytes | tensor types | fa on vs off top-1 | fa on vs off max Δ | "
          "HF vs llama.cpp top-1 | HF vs llama.cpp max Δ |")
    print("|---|---|---|---|---|---|---|---|")
    for c in CASES:
        for q in QUANTS:
            m = os.path.join(out, c, f"model-{q}.gguf")
            on = os.path.join(out, c, f"llamacpp_{q}.json")
            off = os.path.join(out, c, f"llamacpp_{q}_fa_off.json")
            if not (os.path.exists(m) and os.path.exists(on) and os.path.exists(off)):
                continue
            a_on = json.load(open(on))
            a_off = json.load(open(off))
            fa = a_off["agreement_with"]
            hf = a_on["agreement_with_hf"]
            print(f"| {c} | {q} | {os.path.getsize(m)} | {types(m)} | {fa['top1_agree']}/{fa['positions']} | "
                  f"{fa['max_abs_dlogit_over_their_topk']:.4f} | {hf['top1_agree']}/{hf['positions']} | "
                  f"{hf['max_abs_dlogit']:.4f} |")
        if scratch and c == "qwen3moe_k":
            p = os.path.join(scratch, c, "llamacpp_f32.json")
            if os.path.exists(p):
                hf = json.load(open(p))["agreement_with_hf"]
                print(f"| {c} | f32 (not committed) | – | F32 | – | – | {hf['top1_agree']}/{hf['positions']} | "
                      f"{hf['max_abs_dlogit']:.4f} |")


if __name__ == "__main__":
    main()
