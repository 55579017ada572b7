#!/usr/bin/env python3
"""Dumps what a moe_tiny GGUF carries: architecture metadata (expert counts and widths, heads,
RoPE, norm eps, tokenizer model/pre) and every tensor's name, shape (GGUF order, ne0 first) and
type. With --layer N only blk.N and the global tensors are listed; with --types only a
type -> count summary is printed.

Usage: PYTHONPATH=<llama.cpp>/gguf-py python tests/reference/moe_tiny_inspect.py FILE.gguf [--layer 0] [--types]
"""
import argparse
import collections

import gguf


def field_value(f):
    if f.types and f.types[0] == gguf.GGUFValueType.ARRAY:
        return f"[array of {len(f.data)}]"
    v = f.contents()
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--layer", type=int)
    ap.add_argument("--types", action="store_true")
    a = ap.parse_args()
    r = gguf.GGUFReader(a.file)
    arch = r.fields["general.architecture"].contents()
    if a.types:
        c = collections.Counter(t.tensor_type.name for t in r.tensors)
        print(" ".join(f"{k}:{v}" for k, v in sorted(c.items())))
        return
    for name, f in r.fields.items():
        if name.startswith(arch + ".") or name in ("general.architecture", "general.file_type",
                                                     "tokenizer.ggml.model", "tokenizer.ggml.pre",
                                                     "tokenizer.ggml.bos_token_id",
                                                     "tokenizer.ggml.eos_token_id",
                                                     "tokenizer.ggml.add_bos_token"):
            print(f"  {name} = {field_value(f)}")
    for t in r.tensors:
        if a.layer is not None and t.name.startswith("blk.") and not t.name.startswith(f"blk.{a.layer}."):
            continue
        shape = [int(x) for x in t.shape]
        print(f"  {t.name:28s} {str(shape):16s} {t.tensor_type.name}")


if __name__ == "__main__":
    main()
