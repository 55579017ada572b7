#!/usr/bin/env python3
"""Builds the seed inputs of the `hf_import` and `gguf_parse` fuzz targets from real files.

  python3 make_seeds.py hf   [REPO_ROOT]        # corpus/hf_import/seed_<model>
  python3 make_seeds.py gguf GGUF_FILE          # corpus/gguf_parse/seed_smollm2_*

hf: one input per checkpoint under tests/reference/hf/, packed the way fuzz_targets/hf_import.rs
unpacks it (quant byte, then files separated by SEP). Checkpoints over LIMIT bytes (64 KB: small inputs keep
the fuzzer fast) are shrunk into
smaller *valid* checkpoints: layers are dropped from the top (config `num_hidden_layers` follows),
then the experts are cut to top-k (router rows follow), then the vocabulary is cut (embedding / lm_head rows, `vocab_size`), then the dense FFN width
(`intermediate_size`).

gguf: SmolLM2's real header, all of its metadata keys and its full tensor-info table, with the
tokenizer arrays cut to the first VOCAB entries (the full directory is 1.7 MB). Two variants:
`seed_smollm2_directory` keeps the real tensor infos (so parsing stops at "tensor data past the
end": no weights follow), `seed_smollm2_tiny_tensors` keeps names and types but shrinks every
tensor to one block row and appends zero data, so the whole parse, every view and the tokenizer run.
"""
import json
import os
import re
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SEP = b"\0SPLIT\0"
LIMIT = 64_000
QUANT_F32 = 0  # index into QuantType::ALL (F32, F16, Q4_0, Q4_1, Q8_0)


def read_st(path):
    b = open(path, "rb").read()
    n = struct.unpack_from("<Q", b)[0]
    hdr = json.loads(b[8 : 8 + n])
    meta = hdr.pop("__metadata__", None)
    data = b[8 + n :]
    tensors = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0] : v["data_offsets"][1]]) for k, v in hdr.items()}
    return tensors, meta


def write_st(tensors, meta):
    hdr, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dt, shape, raw = tensors[name]
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if meta is not None:
        hdr["__metadata__"] = meta
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def shrink(cfg, tensors):
    """Drops top layers, then cuts the vocabulary, until the checkpoint is small enough."""
    size = lambda: sum(len(t[2]) for t in tensors.values())
    while size() > LIMIT - 4000 and cfg["num_hidden_layers"] > 1 + max(cfg.get("dense_delay", 0), cfg.get("expert_delay", 0)):
        last = cfg["num_hidden_layers"] - 1
        for k in [k for k in tensors if k.startswith(f"model.layers.{last}.")]:
            del tensors[k]
        cfg["num_hidden_layers"] = last
        if "layer_types" in cfg:
            cfg["layer_types"] = cfg["layer_types"][:last]
    # Experts: down to top-k (the router's rows follow).
    ek = "num_local_experts" if "num_local_experts" in cfg else "num_experts"
    if cfg.get(ek, 0) > cfg.get("num_experts_per_tok", 0) > 0 and size() > LIMIT - 4000:
        n = cfg["num_experts_per_tok"]
        for k in list(tensors):
            m = re.search(r"\.experts\.(\d+)\.", k)
            if m and int(m.group(1)) >= n:
                del tensors[k]
            elif k.endswith(("block_sparse_moe.gate.weight", "mlp.gate.weight", "moe.router.weight")):
                dt, shape, raw = tensors[k]
                tensors[k] = (dt, [n, shape[1]], raw[: len(raw) * n // shape[0]])
        cfg[ek] = n
    while size() > LIMIT - 4000 and cfg["vocab_size"] > 16:
        v = cfg["vocab_size"] // 2
        for k in ("model.embed_tokens.weight", "lm_head.weight"):
            if k in tensors:
                dt, shape, raw = tensors[k]
                tensors[k] = (dt, [v] + shape[1:], raw[: len(raw) * v // shape[0]])
        cfg["vocab_size"] = v
    # Dense FFN width (kept a multiple of 32 for the blocked quant types).
    dense = any(k.endswith("mlp.gate_proj.weight") for k in tensors)
    while dense and size() > LIMIT - 4000 and cfg.get("intermediate_size", 0) >= 64 and cfg["intermediate_size"] % 64 == 0:
        f = cfg["intermediate_size"]
        for k in list(tensors):
            dt, shape, raw = tensors[k]
            if k.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
                tensors[k] = (dt, [f // 2, shape[1]], raw[: len(raw) // 2])
            elif k.endswith("mlp.down_proj.weight"):
                row = len(raw) // shape[0]
                cut = b"".join(raw[r * row : r * row + row // 2] for r in range(shape[0]))
                tensors[k] = (dt, [shape[0], f // 2], cut)
        cfg["intermediate_size"] = f // 2
    return cfg, tensors


def hf(root):
    ref = os.path.join(root, "tests", "reference", "hf")
    out = os.path.join(HERE, "corpus", "hf_import")
    os.makedirs(out, exist_ok=True)
    n_seed = 0
    for model in sorted(os.listdir(ref)):
        d = os.path.join(ref, model)
        rd = lambda f: open(os.path.join(d, f), "rb").read() if os.path.isfile(os.path.join(d, f)) else b""
        cfg = json.loads(rd("config.json"))
        parts = [b"", b"", rd("generation_config.json"), rd("tokenizer_config.json"), b""]
        if os.path.isfile(os.path.join(d, "model.safetensors")):
            tensors, meta = read_st(os.path.join(d, "model.safetensors"))
            cfg, tensors = shrink(cfg, tensors)
            parts[1] = write_st(tensors, meta)
        else:
            # Sharded: shrink across shards, keep each tensor in its shard, rewrite the index.
            # The fuzz target names shards model-0000K-of-0000N.safetensors, like the source.
            index = json.loads(rd("model.safetensors.index.json"))
            shards = sorted(f for f in os.listdir(d) if f.startswith("model-") and f.endswith(".safetensors"))
            tensors, where, metas = {}, {}, []
            for f in shards:
                t, m = read_st(os.path.join(d, f))
                tensors.update(t)
                where.update({k: f for k in t})
                metas.append(m)
            cfg, tensors = shrink(cfg, tensors)
            index["weight_map"] = {k: where[k] for k in sorted(tensors)}
            parts[4] = json.dumps(index, indent=1).encode()
            parts += [write_st({k: v for k, v in tensors.items() if where[k] == f}, m) for f, m in zip(shards, metas)]
        parts[0] = json.dumps(cfg, indent=1).encode()
        # Target quant type: every type in turn (the blocked ones need multiples of 32).
        q = n_seed % 5 if cfg["hidden_size"] % 32 == 0 else QUANT_F32
        n_seed += 1
        blob = bytes([q]) + SEP.join(parts)
        assert len(blob) < 100_000, (model, len(blob))
        open(os.path.join(out, f"seed_{model}"), "wb").write(blob)
        print(f"seed_{model}: {len(blob)} bytes, {cfg['num_hidden_layers']} layers, vocab {cfg['vocab_size']}")


# ---------------------------------------------------------------------------------------------
# GGUF

VOCAB = 512
GGML_BLOCK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
              12: (256, 144), 13: (256, 176), 14: (256, 210), 30: (1, 2)}  # type: (block, bytes)
KQUANTS = [12, 13, 14, 6, 7]  # Q4_K, Q5_K, Q6_K, Q5_0, Q5_1
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class R:
    def __init__(self, b):
        self.b, self.p = b, 0

    def u(self, fmt):
        v = struct.unpack_from("<" + fmt, self.b, self.p)[0]
        self.p += struct.calcsize(fmt)
        return v

    def s(self):
        n = self.u("Q")
        v = self.b[self.p : self.p + n]
        self.p += n
        return v

    def val(self, t):
        if t == 8:
            return self.s()
        if t == 9:
            et, n = self.u("I"), self.u("Q")
            return (et, [self.val(et) for _ in range(n)])
        return self.u(SCALAR[t])


def w_s(s):
    return struct.pack("<Q", len(s)) + s


def w_val(t, v):
    if t == 8:
        return w_s(v)
    if t == 9:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(w_val(et, x) for x in items)
    return struct.pack("<" + SCALAR[t], v)


def gguf(path):
    b = open(path, "rb").read(4 << 20)
    r = R(b)
    assert r.b[:4] == b"GGUF"
    r.p = 4
    version, n_t, n_kv = r.u("I"), r.u("Q"), r.u("Q")
    kvs = []
    for _ in range(n_kv):
        k, t = r.s(), r.u("I")
        kvs.append((k, t, r.val(t)))
    infos = []
    for _ in range(n_t):
        name, nd = r.s(), r.u("I")
        dims = [r.u("Q") for _ in range(nd)]
        infos.append((name, dims, r.u("I"), r.u("Q")))
    align = next((v for k, t, v in kvs if k == b"general.alignment"), 32)

    # Cut the vocabulary: first VOCAB tokens/types, merges whose pieces and result stay inside.
    cut = []
    toks = None
    for k, t, v in kvs:
        if k == b"tokenizer.ggml.tokens":
            toks = set(v[1][:VOCAB])
    for k, t, v in kvs:
        if k in (b"tokenizer.ggml.tokens", b"tokenizer.ggml.token_type", b"tokenizer.ggml.scores"):
            v = (v[0], v[1][:VOCAB])
        elif k == b"tokenizer.ggml.merges":
            keep = []
            for m in v[1]:
                a, _, c = m.partition(b" ")
                if a in toks and c in toks and a + c in toks:
                    keep.append(m)
            v = (v[0], keep)
        cut.append((k, t, v))

    def build(kv, tensor_infos, data):
        out = b"GGUF" + struct.pack("<IQQ", version, len(tensor_infos), len(kv))
        for k, t, v in kv:
            out += w_s(k) + struct.pack("<I", t) + w_val(t, v)
        for name, dims, ty, off in tensor_infos:
            out += w_s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", x) for x in dims)
            out += struct.pack("<IQ", ty, off)
        out += b"\0" * (-len(out) % align)
        return out + data

    out = os.path.join(HERE, "corpus", "gguf_parse")
    a = build(cut, infos, b"")
    open(os.path.join(out, "seed_smollm2_directory"), "wb").write(a)
    # Tiny tensors: one block row (first dim = block size), other dims 1, vocab_size = VOCAB.
    tiny, data = [], b""
    for name, dims, ty, _ in infos:
        blk, nbytes = GGML_BLOCK[ty]
        data += b"\0" * (-len(data) % align)
        tiny.append((name, [blk] + [1] * (len(dims) - 1), ty, len(data)))
        data += b"\0" * nbytes
    kv2 = [(k, t, VOCAB if k.endswith(b".vocab_size") else v) for k, t, v in cut]
    b2 = build(kv2, tiny, data)
    open(os.path.join(out, "seed_smollm2_tiny_tensors"), "wb").write(b2)
    print(f"seed_smollm2_directory: {len(a)} bytes; seed_smollm2_tiny_tensors: {len(b2)} bytes "
          f"({len(infos)} tensors, {len(cut)} keys)")

    # K-quant variants (issue 19): every 2-D tensor retyped to Q4_K/Q5_K/Q6_K/Q5_0/Q5_1 in turn,
    # one super-block row of pseudo-random bytes each; and the same with the last tensor cut short
    # (its super-blocks run past the end of the file).
    kq, data, x = [], b"", 19
    for i, (name, dims, ty, _) in enumerate(infos):
        if len(dims) == 2:
            ty = KQUANTS[i % len(KQUANTS)]
        blk, nbytes = GGML_BLOCK[ty]
        data += b"\0" * (-len(data) % align)
        kq.append((name, [256 if blk > 1 else blk] + [1] * (len(dims) - 1), ty, len(data)))
        n = nbytes * (256 // blk if blk > 1 else 1)
        chunk = bytearray()
        for _ in range(n):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            chunk.append((x >> 16) & 0xFF)
        data += bytes(chunk)
    b3 = build(kv2, kq, data)
    open(os.path.join(out, "seed_kquant_tiny_tensors"), "wb").write(b3)
    b4 = b3[: len(b3) - 100]
    open(os.path.join(out, "seed_kquant_truncated"), "wb").write(b4)
    print(f"seed_kquant_tiny_tensors: {len(b3)} bytes; seed_kquant_truncated: {len(b4)} bytes")


if __name__ == "__main__":
    if sys.argv[1] == "hf":
        hf(sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, ".."))
    elif sys.argv[1] == "gguf":
        gguf(sys.argv[2])
    else:
        sys.exit(__doc__)
