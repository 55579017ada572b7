#!/usr/bin/env python3
"""Make a Q4_0 GGUF from another GGUF with llama.cpp's own quantizer (llama_model_quantize).

Usage:
    python make_q4_0.py IN.gguf OUT.gguf [--threads 2] [--pure]

Meant for SmolLM2-135M-Instruct.Q4_1.gguf -> SmolLM2-135M-Instruct.Q4_0.gguf, so both engines can be
benchmarked on llama.cpp's fastest CPU path (Q4_0 is repacked to q4_0_8x8 at load for AVX2).
The input is already quantized, so this *requantizes* (Q4_1 -> dequant -> Q4_0): llama.cpp refuses
that unless allow_requantize is set, which this script does. The extra rounding lowers quality a
little; the file is for speed measurements only (parity goldens come from the original Q4_1).

llama.cpp's ftype rules decide per-tensor types: the 2-D weights become Q4_0; the tied token
embedding (also the LM head) gets the "output" type, which for SmolLM2 (row length 576, not a
multiple of 256) falls back to Q8_0. --pure forces Q4_0 for every quantizable tensor instead.
Prints the resulting tensor-type histogram (needs the `gguf` package, present in the anchor venv).
"""
import argparse
import collections
import os
import sys

import llama_cpp as L


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pure", action="store_true", help="Q4_0 for all quantizable tensors, incl. token_embd")
    a = ap.parse_args()
    if os.path.abspath(a.src) == os.path.abspath(a.dst):
        sys.exit("refusing to overwrite the input")

    L.llama_backend_init()
    p = L.llama_model_quantize_default_params()
    p.nthread = a.threads
    p.ftype = L.LLAMA_FTYPE_MOSTLY_Q4_0
    p.allow_requantize = True  # input is Q4_1/Q8_0 already
    p.pure = a.pure
    rc = L.llama_model_quantize(a.src.encode(), a.dst.encode(), p)
    if rc != 0:
        sys.exit(f"llama_model_quantize failed (rc={rc})")
    print(f"wrote {a.dst} ({os.path.getsize(a.dst):,} bytes)")
    try:
        import gguf
    except ImportError:
        return
    r = gguf.GGUFReader(a.dst)
    hist = collections.Counter(t.tensor_type.name for t in r.tensors)
    emb = next(t for t in r.tensors if t.name == "token_embd.weight")
    print("tensor types:", dict(hist), "| token_embd:", emb.tensor_type.name)


if __name__ == "__main__":
    main()
