#!/usr/bin/env python3
"""make_qwen3moe_30b.py - a synthetic `qwen3moe` GGUF at the Qwen3-30B-A3B geometry.

48 layers, d 2048, 32 query heads and 4 KV heads of 128, 128 experts top-8 with expert FFN 768,
vocabulary 151,936, untied output. Every matrix is Q4_0 with valid blocks: random nibbles and a
per-tensor scale chosen so that a row's dot product with a unit-RMS input has about unit size
(nibble 0 is mapped to 8, so q - 8 is symmetric in -7..7 with std ~4.18, and d = 1 / (4.18 sqrt(cols))), with the gains of
`gain()` that keep each token's identity in the residual stream; norms are 1.
The routers (F32, as real Qwen3 MoE files store them) are random N(0, 1/d): the routing is
close to uniform, the worst case for any expert cache. Its text is noise: the file measures
bytes and time, not quality.

Deterministic: every tensor's bytes come from numpy's PCG64 seeded with (SEED, tensor index),
so the same command gives a byte-identical file (about 17 GB; sha256 printed at the end with
--sha256). Streams one tensor at a time (peak memory ~0.3 GB).

Usage: python3 benches/make_qwen3moe_30b.py OUT.gguf [--layers N] [--experts E] [--sha256]
       (--layers/--experts shrink it for a quick check; the defaults are the real geometry)
Needs numpy (any Python with it, e.g. the venv of ../shared/bench/setup.sh).
"""

import argparse
import hashlib
import os
import struct
import sys

import numpy as np

SEED = 303
ALIGN = 32
Q4_0, F32 = 2, 0  # ggml type ids
# GGUF metadata value types
T_U32, T_I32, T_F32, T_STR, T_ARR = 4, 5, 6, 8, 9


def s_str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key: str, typ: int, val) -> bytes:
    out = s_str(key) + struct.pack("<I", typ)
    if typ == T_U32:
        return out + struct.pack("<I", val)
    if typ == T_I32:
        return out + struct.pack("<i", val)
    if typ == T_F32:
        return out + struct.pack("<f", val)
    if typ == T_STR:
        return out + s_str(val)
    raise ValueError(typ)


def kv_arr(key: str, elem: int, vals) -> bytes:
    out = s_str(key) + struct.pack("<IIQ", T_ARR, elem, len(vals))
    if elem == T_STR:
        return out + b"".join(s_str(v) for v in vals)
    if elem == T_I32:
        return out + np.asarray(vals, dtype="<i4").tobytes()
    raise ValueError(elem)


def byte_tokens():
    """GPT-2's printable stand-ins for the 256 bytes (a public, fixed mapping)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    m = dict(zip(bs, cs))
    return [chr(m[b]) for b in range(256)]


def tensor_bytes(ttype: int, dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n * 4 if ttype == F32 else n // 32 * 18


def q4_0(rng, n_weights: int, cols: int, gain: float = 1.0) -> bytes:
    """Random Q4_0 blocks with one finite scale: weights of std gain / sqrt(cols)."""
    nb = n_weights // 32
    blocks = np.frombuffer(rng.bytes(nb * 18), dtype=np.uint8).reshape(nb, 18).copy()
    # Zero-mean weights: a nibble q stands for q - 8, so uniform nibbles have mean -0.5, a
    # common-mode component that every layer adds along the same direction until it drowns the
    # token. Nibble 0 (-8) becomes 8 (0): the values are then symmetric about 0.
    q = blocks[:, 2:]
    lo, hi = q & 0x0F, q >> 4
    lo[lo == 0] = 8
    hi[hi == 0] = 8
    blocks[:, 2:] = lo | (hi << 4)
    d = np.float16(gain / (4.18 * np.sqrt(cols)))
    blocks[:, 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    return blocks.tobytes()


def gain(name: str, cols: int) -> float:
    """Scales that keep the token in the residual stream, so that routing follows the token:
    embedding rows of unit-size elements (norm ~sqrt(d)), and the attention output and expert
    down projections 1/8 of unit gain, so that 48 layers of additions do not wash the token out.
    With unit gains everywhere the residual converges to one direction and every token routes
    to the same few experts (measured: 8 distinct experts per layer over 13 random tokens)."""
    if name == "token_embd.weight":
        return float(np.sqrt(cols))
    if name.endswith(("attn_output.weight", "ffn_down_exps.weight")):
        return 0.125
    return 1.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--sha256", action="store_true", help="print the file's sha256 at the end")
    a = ap.parse_args()
    L, E, V = a.layers, a.experts, a.vocab
    d, heads, kv_heads, hd, eff, top_k = 2048, 32, 4, 128, 768, 8
    q, kvd = heads * hd, kv_heads * hd

    # (name, type, dims with ne0 = the row length first, kind)
    tensors = [("token_embd.weight", Q4_0, [d, V])]
    for l in range(L):
        p = f"blk.{l}."
        tensors += [
            (p + "attn_norm.weight", F32, [d]),
            (p + "attn_q.weight", Q4_0, [d, q]),
            (p + "attn_k.weight", Q4_0, [d, kvd]),
            (p + "attn_v.weight", Q4_0, [d, kvd]),
            (p + "attn_output.weight", Q4_0, [q, d]),
            (p + "attn_q_norm.weight", F32, [hd]),
            (p + "attn_k_norm.weight", F32, [hd]),
            (p + "ffn_norm.weight", F32, [d]),
            (p + "ffn_gate_inp.weight", F32, [d, E]),
            (p + "ffn_gate_exps.weight", Q4_0, [d, eff, E]),
            (p + "ffn_up_exps.weight", Q4_0, [d, eff, E]),
            (p + "ffn_down_exps.weight", Q4_0, [eff, d, E]),
        ]
    tensors += [("output_norm.weight", F32, [d]), ("output.weight", Q4_0, [d, V])]

    # The 256 byte tokens, the one merge's result, fillers, and three specials last.
    toks = byte_tokens() + ["Ġt"] + [f"<t{i}>" for i in range(257, V - 3)] + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    meta = [
        kv("general.architecture", T_STR, "qwen3moe"),
        kv("general.name", T_STR, "synthetic qwen3moe 30B-A3B geometry (random weights)"),
        kv("general.alignment", T_U32, ALIGN),
        kv("qwen3moe.block_count", T_U32, L),
        kv("qwen3moe.context_length", T_U32, 40960),
        kv("qwen3moe.embedding_length", T_U32, d),
        kv("qwen3moe.feed_forward_length", T_U32, 6144),
        kv("qwen3moe.expert_feed_forward_length", T_U32, eff),
        kv("qwen3moe.attention.head_count", T_U32, heads),
        kv("qwen3moe.attention.head_count_kv", T_U32, kv_heads),
        kv("qwen3moe.attention.key_length", T_U32, hd),
        kv("qwen3moe.attention.value_length", T_U32, hd),
        kv("qwen3moe.rope.freq_base", T_F32, 1_000_000.0),
        kv("qwen3moe.attention.layer_norm_rms_epsilon", T_F32, 1e-6),
        kv("qwen3moe.expert_count", T_U32, E),
        kv("qwen3moe.expert_used_count", T_U32, top_k),
        kv("tokenizer.ggml.model", T_STR, "gpt2"),
        kv("tokenizer.ggml.pre", T_STR, "qwen2"),
        kv_arr("tokenizer.ggml.tokens", T_STR, toks),
        kv_arr("tokenizer.ggml.token_type", T_I32, [1] * (V - 3) + [3, 3, 3]),
        kv_arr("tokenizer.ggml.merges", T_STR, ["Ġ t"]),
        kv("tokenizer.ggml.eos_token_id", T_U32, V - 1),
        kv("tokenizer.ggml.bos_token_id", T_U32, V - 3),
        kv("tokenizer.ggml.padding_token_id", T_U32, V - 3),
    ]
    infos = []
    off = 0
    for name, tt, dims in tensors:
        infos.append(s_str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", tt, off))
        off += tensor_bytes(tt, dims)
        off += (-off) % ALIGN
    total = off
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)) + b"".join(meta) + b"".join(infos)
    head += b"\0" * ((-len(head)) % ALIGN)
    size = len(head) + total
    free = os.statvfs(os.path.dirname(os.path.abspath(a.out)) or ".")
    if free.f_bavail * free.f_frsize < size + (1 << 30):
        sys.exit(f"{a.out}: needs {size / 2**30:.1f} GiB and 1 GiB spare; the disk has {free.f_bavail * free.f_frsize / 2**30:.1f} GiB free")
    tmp = a.out + ".part"
    h = hashlib.sha256() if a.sha256 else None
    done = 0
    with open(tmp, "wb") as f:
        f.write(head)
        if h:
            h.update(head)
        for i, (name, tt, dims) in enumerate(tensors):
            rng = np.random.Generator(np.random.PCG64([SEED, i]))
            n = 1
            for x in dims:
                n *= x
            if tt == F32:
                if name.endswith("ffn_gate_inp.weight"):
                    buf = (rng.standard_normal(n, dtype=np.float32) / np.float32(np.sqrt(d))).astype("<f4").tobytes()
                else:
                    buf = np.ones(n, dtype="<f4").tobytes()
            else:
                buf = q4_0(rng, n, dims[0], gain(name, dims[0]))
            buf += b"\0" * ((-len(buf)) % ALIGN)
            f.write(buf)
            if h:
                h.update(buf)
            done += len(buf)
            print(f"\r{done / 2**30:6.2f} / {total / 2**30:.2f} GiB  {name:<32}", end="", file=sys.stderr, flush=True)
    os.replace(tmp, a.out)
    print(file=sys.stderr)
    print(f"{a.out}: {size} bytes, {len(tensors)} tensors, {L} layers x {E} experts")
    if h:
        print(f"sha256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
