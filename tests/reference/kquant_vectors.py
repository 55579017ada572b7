#!/usr/bin/env python3
"""Reference vectors for the GGUF block types cflow stores byte-for-byte (Q5_0, Q5_1, Q4_K, Q5_K,
Q6_K): random blocks (random bytes; the f16 scales set to finite values) dequantized by gguf-py
(`gguf.quants.dequantize`, the numpy port of ggml's dequantize_row_*), written to
tests/fixtures/kquant_vectors.json. tests/kquant_vectors.rs checks `quant::dequantize_row` against
them bit for bit.

Regenerate: python3 -m venv /tmp/kq-venv && /tmp/kq-venv/bin/pip install gguf==0.19.0 &&
/tmp/kq-venv/bin/python tests/reference/kquant_vectors.py
"""
import json
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

# (type, block bytes, offsets of the f16 scales inside a block)
TYPES = [
    ("Q5_0", T.Q5_0, 22, [0]),
    ("Q5_1", T.Q5_1, 24, [0, 2]),
    ("Q4_K", T.Q4_K, 144, [0, 2]),
    ("Q5_K", T.Q5_K, 176, [0, 2]),
    ("Q6_K", T.Q6_K, 210, [208]),
]
N_BLOCKS = 6

rng = np.random.default_rng(19)
out = {"generator": "gguf-py 0.19.0 gguf.quants.dequantize", "types": {}}
for name, qt, bb, f16_at in TYPES:
    raw = rng.integers(0, 256, size=(N_BLOCKS, bb), dtype=np.uint8)
    for b in range(N_BLOCKS):
        for off in f16_at:
            v = np.float16(rng.uniform(-0.1, 0.1) if off != 2 or name != "Q5_1" else rng.uniform(-1, 1))
            raw[b, off:off + 2] = np.frombuffer(v.tobytes(), dtype=np.uint8)
    w = dequantize(raw.reshape(-1), qt).astype(np.float32).reshape(-1)
    out["types"][name] = {
        "blocks_hex": raw.reshape(-1).tobytes().hex(),
        "weights_f32_bits": [int(x) for x in w.view(np.uint32)],
    }
path = os.path.join(os.path.dirname(__file__), "..", "fixtures", "kquant_vectors.json")
with open(path, "w") as f:
    json.dump(out, f, separators=(",", ":"))
print("wrote", os.path.normpath(path))
